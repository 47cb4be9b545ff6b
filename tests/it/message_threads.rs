//! Anthropic Message Threads through the proxy (see `gyre_proxy::message_threads`).

use std::sync::Arc;

use gyre_proxy::engine::{Script, ScriptedEngine, ScriptedOptions, TokenEngine};
use gyre_proxy::output::OutputFormat;
use serde_json::json;

use crate::in_process::model;

/// Anthropic Message Threads: a `continue` is answered as the API answers one whose thread it
/// lost (404 `not_found_error`, `error.details.error_code: thread_not_found`, the signal the
/// SDKs and Claude Code replay the whole conversation on), nothing is sampled or recorded, and
/// the whole conversation sent again under `create` is served and extends the tree.
#[test]
fn a_message_threads_continue_is_a_lost_thread_and_the_replay_extends_the_tree() {
    let runtime = crate::support::runtime();
    let script = Script::parse(
        concat!(
            r#"{"agent": "main", "blocks": [{"type": "tool_use", "name": "Bash", "input": {"command": "echo a"}}]}"#,
            "\n",
            r#"{"agent": "main", "blocks": [{"type": "text", "text": "Done."}]}"#,
        ),
        None,
    )
    .expect("script");
    let engine: Arc<dyn TokenEngine> = Arc::new(
        ScriptedEngine::new(
            &script,
            &model(),
            &OutputFormat::test_model(),
            ScriptedOptions::default(),
        )
        .expect("engine"),
    );
    let proxy = crate::in_process::proxy(&runtime, engine);
    let tools = json!([{"name": "Bash", "description": "Runs a command.",
                        "input_schema": {"type": "object",
                                         "properties": {"command": {"type": "string"}}}}]);
    let ask = json!({"role": "user", "content": "Run it."});
    let (status, first) = proxy.post(
        "/v1/messages",
        &json!({"model": "m", "max_tokens": 256, "tools": tools, "messages": [ask],
                "thread": {"type": "create"}}),
    );
    assert_eq!(status, 200, "{first}");
    let call = first["content"][0].clone();
    let result = json!({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": call["id"], "content": "a"}]});
    let (status, lost) = proxy.post(
        "/v1/messages",
        &json!({"model": "m", "max_tokens": 256, "messages": [result],
                "thread": {"type": "continue", "previous_message_id": first["id"]}}),
    );
    assert_eq!(status, 404, "{lost}");
    assert_eq!(lost["type"], "error", "{lost}");
    assert_eq!(lost["error"]["type"], "not_found_error", "{lost}");
    assert_eq!(
        lost["error"]["details"]["error_code"], "thread_not_found",
        "{lost}"
    );
    assert_eq!(
        proxy.sink.records().len(),
        1,
        "the continue sampled nothing"
    );
    let (status, bad) = proxy.post(
        "/v1/messages",
        &json!({"model": "m", "max_tokens": 256, "messages": [ask],
                "thread": {"type": "resume"}}),
    );
    assert_eq!(status, 400, "{bad}");
    assert!(
        bad["error"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("thread")),
        "{bad}"
    );
    // The turn sent again whole, under a new thread.
    let (status, second) = proxy.post(
        "/v1/messages",
        &json!({"model": "m", "max_tokens": 256, "tools": tools,
                "messages": [ask, {"role": "assistant", "content": [call]}, result],
                "thread": {"type": "create"}}),
    );
    assert_eq!(status, 200, "{second}");
    assert_eq!(second["content"][0]["text"], "Done.", "{second}");
    let records = proxy.sink.records();
    assert_eq!(records.len(), 2);
    assert_eq!(records[1].parent_call, Some(records[0].call));
    assert_eq!(
        records[1].reused_prefix_tokens_count,
        (records[0].input_ids.len() + records[0].output_ids.len()) as u64
    );
}
