//! Anthropic Message Threads (`thread`, beta `message-threads-2026-08-12`): a request may ask
//! the server to hold its conversation (`{"type": "create"}`) and a later one continue from a
//! response (`{"type": "continue", "previous_message_id": …}`) sending only the new turn's
//! messages. Claude Code does so when `CLAUDE_CODE_TETHER_LIVE` is set, and the Anthropic
//! SDKs' tool runners by default.
//!
//! The proxy holds no thread state: a `create` is answered as the stateless request it also is
//! (its `messages` are the whole conversation), and a `continue` gets the API's own
//! `thread_not_found` (404, `error.details.error_code`), the answer the API gives when it has
//! lost a thread. Both clients recover from it the way the API tells them to, by sending the
//! turn again with the whole conversation under a new `create` (Claude Code's "tether replay";
//! the SDK's thread state, which after a second loss in a row stops threading). So every call
//! the model sees is a whole conversation, as from a stateless client, and its tree extends
//! as usual; a continue costs one round trip and no model call.
//!
//! Pure: request bytes in, a verdict out.

use serde_json::Value;

use crate::{Api, ApiError, ApiErrorKind};

/// What a request's `thread` asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ThreadParam {
    /// Hold this conversation under the response's id.
    Create,
    /// Continue from the response `previous_message_id`, with only the new messages.
    Continue { previous_message_id: String },
}

/// The `thread` a Messages body asks for: `None` when it names none (absent or null); a 400
/// naming the field when it is malformed. Only a body that mentions the key is parsed.
pub fn thread_param(body: &[u8]) -> Result<Option<ThreadParam>, ApiError> {
    if memchr::memmem::find(body, b"\"thread\"").is_none() {
        return Ok(None);
    }
    #[derive(serde::Deserialize)]
    struct Head {
        #[serde(default)]
        thread: Option<Value>,
    }
    // A body that is not an object is named by the ordinary parse.
    let Ok(Head { thread }) = serde_json::from_slice::<Head>(body) else {
        return Ok(None);
    };
    let thread = match thread {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(thread)) => thread,
        Some(_) => return Err(invalid("must be an object with a `type`")),
    };
    match thread.get("type").and_then(Value::as_str) {
        Some("create") => Ok(Some(ThreadParam::Create)),
        Some("continue") => match thread.get("previous_message_id") {
            Some(Value::String(id)) if !id.is_empty() => Ok(Some(ThreadParam::Continue {
                previous_message_id: id.clone(),
            })),
            _ => Err(ApiError::invalid_field(
                Api::Anthropic,
                "thread.previous_message_id",
                "a `continue` names the response it continues by its id (a string)",
            )),
        },
        Some(other) => Err(invalid(&format!(
            "unknown type `{}`, expected `create` or `continue`",
            other.chars().take(64).collect::<String>()
        ))),
        None => Err(invalid("must have a `type`: `create` or `continue`")),
    }
}

fn invalid(problem: &str) -> ApiError {
    ApiError::invalid_field(Api::Anthropic, "thread", problem)
}

/// The API's answer to a `continue` from a thread it does not hold: a 404 whose
/// `error.details.error_code` is `thread_not_found`, on which clients send the turn again with
/// the whole conversation under a new `create`.
pub fn thread_not_found(previous_message_id: &str) -> ApiError {
    let shown: String = previous_message_id.chars().take(100).collect();
    let mut error = ApiError::new(
        Api::Anthropic,
        ApiErrorKind::NotFound,
        format!(
            "No usable Thread state was found for previous_message_id `{shown}`: this proxy \
             holds no thread state (it records every call from the whole conversation). \
             Replay the full conversation with `thread: {{\"type\": \"create\"}}`."
        ),
    );
    error.code = Some("thread_not_found");
    error
}

/// The verdict on a Messages body: `Err` for a `continue` (see the module documentation) or a
/// malformed `thread`; `Ok` otherwise.
pub fn check(body: &[u8]) -> Result<(), ApiError> {
    match thread_param(body)? {
        Some(ThreadParam::Continue {
            previous_message_id,
        }) => Err(thread_not_found(&previous_message_id)),
        Some(ThreadParam::Create) | None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_create_or_no_thread_is_served_and_a_continue_is_not_found() {
        assert_eq!(
            thread_param(br#"{"model":"m","messages":[]}"#).unwrap(),
            None
        );
        assert_eq!(thread_param(br#"{"thread":null}"#).unwrap(), None);
        // The word in a message is not the field.
        assert_eq!(
            thread_param(br#"{"messages":[{"role":"user","content":"\"thread\""}]}"#).unwrap(),
            None
        );
        assert!(check(br#"{"thread":{"type":"create"},"messages":[]}"#).is_ok());
        let error =
            check(br#"{"thread":{"type":"continue","previous_message_id":"msg_1"},"messages":[]}"#)
                .unwrap_err();
        assert_eq!(error.status(), 404);
        let body = error.body_json();
        assert_eq!(body["type"], "error");
        assert_eq!(body["error"]["type"], "not_found_error");
        assert_eq!(body["error"]["details"]["error_code"], "thread_not_found");
        assert!(
            body["error"]["message"].as_str().unwrap().contains("msg_1"),
            "{body}"
        );
    }

    #[test]
    fn a_malformed_thread_is_a_400_naming_the_field() {
        for (body, param) in [
            (&br#"{"thread":"create"}"#[..], "thread"),
            (br#"{"thread":{}}"#, "thread"),
            (br#"{"thread":{"type":"fork"}}"#, "thread"),
            (
                br#"{"thread":{"type":"continue"}}"#,
                "thread.previous_message_id",
            ),
            (
                br#"{"thread":{"type":"continue","previous_message_id":7}}"#,
                "thread.previous_message_id",
            ),
        ] {
            let error = check(body).unwrap_err();
            assert_eq!(error.status(), 400, "{}", String::from_utf8_lossy(body));
            assert_eq!(error.param.as_deref(), Some(param));
            assert!(error.body_json()["error"].get("details").is_none());
        }
    }
}
