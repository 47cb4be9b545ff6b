//! The Responses API's server-side compaction, as Codex uses it over its WebSocket transport
//! (`responses_compaction_v2`): a request whose input ends with a `{"type":
//! "compaction_trigger"}` item asks the model to compact the conversation, and the answer is
//! one `{"type": "compaction", "encrypted_content": …}` output item that the harness puts in
//! place of the history in its next requests.
//!
//! Here the trigger becomes a user message asking the model for a summary (our wording, below),
//! the call is recorded as a `Summary` call like any harness compaction, and the model's text is
//! handed back inside the compaction item's `encrypted_content`, encoded (not encrypted: the
//! text is the model's own output and the harness may read it) so that the handle needs no
//! state on the proxy and resolves after a restart. A later `compaction` input item renders as
//! a user message holding that summary, which starts the conversation's next root.

use base64::Engine as _;

/// What the model is asked when the harness triggers a compaction.
pub const INSTRUCTION: &str = "Context checkpoint. Write a summary of this conversation that \
lets you continue the task without it: the task and its constraints, what has been done and \
found (files, commands and their results), the current state, and what remains to be done. \
The summary replaces the conversation.";

/// How a summary reads when the conversation continues from it.
pub const SUMMARY_PREFIX: &str = "Summary of the conversation so far:\n\n";

const HANDLE_PREFIX: &str = "gyre-compaction-v1.";

/// The `encrypted_content` of the compaction item holding `summary`.
pub fn handle(summary: &str) -> String {
    let mut handle = String::from(HANDLE_PREFIX);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode_string(summary, &mut handle);
    handle
}

/// The summary a compaction item's `encrypted_content` holds, or why it holds none.
pub fn summary(handle: &str) -> Result<String, &'static str> {
    let encoded = handle
        .strip_prefix(HANDLE_PREFIX)
        .ok_or("not a compaction this proxy produced (its handles start `gyre-compaction-v1.`)")?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(encoded)
        .map_err(|_| "the compaction handle is damaged (not base64url)")?;
    String::from_utf8(bytes).map_err(|_| "the compaction handle is damaged (not UTF-8 text)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_gives_back_its_summary() {
        for text in [
            "",
            "done: wrote a.txt",
            "café ✓\n\"quoted\"",
            &"x".repeat(10_000),
        ] {
            assert_eq!(summary(&handle(text)).unwrap(), text);
        }
    }

    #[test]
    fn foreign_or_damaged_handles_are_refused() {
        assert!(summary("gAAAAABencrypted-by-someone-else").is_err());
        assert!(summary("gyre-compaction-v1.***").is_err());
        let not_utf8 = format!(
            "{HANDLE_PREFIX}{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode([0xff, 0xfe])
        );
        assert!(summary(&not_utf8).unwrap_err().contains("UTF-8"));
    }
}
