//! The ids and handles the proxy mints for a call's output: tool-call ids (`toolu_…`,
//! `call_…`) and reasoning handles (Anthropic `signature`, Responses `encrypted_content`).
//!
//! They are derived from what the execution's trajectory tree keeps of the call (execution,
//! agent, prompt length, the output tokens up to the end of the tool call or reasoning block)
//! and their position in the output, never drawn at random: a proxy that restarts re-parses
//! each recorded output and mints the same ids, so the exact tool-call text and reasoning
//! tokens a harness refers to by id are restored after the restart exactly as before it (see
//! `Session::recover_record`). Two answers that agree up to a tool call give it the same id,
//! with the same text. Pure: no clock, no RNG.

use gyre_event::ExecutionId;
use sha2::{Digest, Sha256};

use crate::messages::Api;

const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/// Mints one call's ids in output order.
#[derive(Clone, Debug)]
pub struct OutputIds {
    seed: [u8; 32],
    tool_calls: u32,
    reasonings: u32,
}

impl OutputIds {
    /// `context_tokens`: the prompt's length in tokens (reused prefix + new input).
    pub fn new(execution: ExecutionId, agent: &str, context_tokens: u64) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(b"gyre output ids v2\0");
        hasher.update(execution.get().to_le_bytes());
        hasher.update((agent.len() as u64).to_le_bytes());
        hasher.update(agent.as_bytes());
        hasher.update(context_tokens.to_le_bytes());
        OutputIds {
            seed: hasher.finalize().into(),
            tool_calls: 0,
            reasonings: 0,
        }
    }

    fn derive(&self, what: &[u8], ordinal: u32, output: &[u32], length: usize) -> String {
        let mut hasher = Sha256::new();
        hasher.update(self.seed);
        hasher.update(what);
        hasher.update(ordinal.to_le_bytes());
        hasher.update((output.len() as u64).to_le_bytes());
        for id in output {
            hasher.update(id.to_le_bytes());
        }
        let digest = hasher.finalize();
        // 32 bytes → `length` (≤ 32) alphanumerics; the slight modulo bias is irrelevant for ids.
        digest
            .iter()
            .take(length)
            .map(|byte| ALPHABET[*byte as usize % ALPHABET.len()] as char)
            .collect()
    }

    /// The next tool call's id without its API prefix. `output`: the tokens sampled so far
    /// (up to the one that completed the call).
    pub fn next_tool_call_suffix(&mut self, output: &[u32]) -> String {
        let suffix = self.derive(b"tool", self.tool_calls, output, 24);
        self.tool_calls += 1;
        suffix
    }

    /// The next tool call's id in `api`'s form.
    pub fn next_tool_call(&mut self, api: Api, output: &[u32]) -> String {
        let suffix = self.next_tool_call_suffix(output);
        format!("{}{suffix}", tool_call_prefix(api))
    }

    /// The next reasoning block's handle. `output`: the tokens sampled so far.
    pub fn next_reasoning(&mut self, output: &[u32]) -> String {
        let handle = format!(
            "gyre-r1-{}",
            self.derive(b"reasoning", self.reasonings, output, 32)
        );
        self.reasonings += 1;
        handle
    }
}

/// The prefix each API's tool-call ids carry.
pub fn tool_call_prefix(api: Api) -> &'static str {
    match api {
        Api::Anthropic => "toolu_",
        Api::OpenAiChat | Api::OpenAiResponses => "call_",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_depend_on_the_record_and_the_position_only() {
        let make = || OutputIds::new(ExecutionId(7), "main", 456);
        let (mut a, mut b) = (make(), make());
        let first = a.next_tool_call(Api::Anthropic, &[1, 2]);
        assert_eq!(first, b.next_tool_call(Api::Anthropic, &[1, 2]));
        assert!(
            first.starts_with("toolu_") && first.len() == 6 + 24,
            "{first}"
        );
        let second = a.next_tool_call(Api::OpenAiChat, &[1, 2]);
        assert_ne!(second[5..], first[6..], "the second call gets another id");
        assert_eq!(a.next_reasoning(&[1]), b.next_reasoning(&[1]));
        let other = OutputIds::new(ExecutionId(7), "sub:x", 456).next_reasoning(&[1]);
        assert_ne!(
            other,
            make().next_reasoning(&[1]),
            "another agent, other handles"
        );
        let resampled = make().next_tool_call(Api::Anthropic, &[1, 3]);
        assert_ne!(
            resampled, first,
            "another answer to the same prompt, another id"
        );
    }
}
