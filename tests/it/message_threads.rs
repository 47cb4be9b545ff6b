//! Anthropic Message Threads through the proxy (see `gyre_proxy::message_threads`).

use serde_json::json;

/// Anthropic Message Threads: a `create` is served and its answer held; a `continue` sends
/// only the new turn and is answered as the whole conversation would be (the call extends the
/// tree whole, streamed or not); a response is continued once (`thread_already_continued`), an
/// id the execution does not hold is `thread_not_found` (404), and neither samples or records
/// anything.
#[test]
fn a_continue_is_served_as_the_whole_conversation_and_continued_once() {
    let runtime = crate::support::runtime();
    let engine = crate::in_process::scripted(concat!(
        r#"{"agent": "main", "blocks": [{"type": "tool_use", "name": "Bash", "input": {"command": "echo a"}}]}"#,
        "\n",
        r#"{"agent": "main", "blocks": [{"type": "tool_use", "name": "Bash", "input": {"command": "echo b"}}]}"#,
        "\n",
        r#"{"agent": "main", "blocks": [{"type": "text", "text": "Done."}]}"#,
    ));
    let proxy = crate::in_process::proxy(&runtime, engine);
    let tools = json!([{"name": "Bash", "description": "Runs a command.",
                        "input_schema": {"type": "object",
                                         "properties": {"command": {"type": "string"}}}}]);
    let ask = json!({"role": "user", "content": "Run them."});
    let (status, first) = proxy.post(
        "/v1/messages",
        &json!({"model": "m", "max_tokens": 256, "system": "Be brief.", "tools": tools,
                "messages": [ask], "thread": {"type": "create"}}),
    );
    assert_eq!(status, 200, "{first}");
    let result = |answer: &serde_json::Value, output: &str| {
        json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": answer["content"][0]["id"], "content": output}]})
    };
    // The new turn only: no system, no tools, no history.
    let continue_from = |answer: &serde_json::Value, output: &str, stream: bool| {
        json!({"model": "m", "max_tokens": 256, "stream": stream,
               "messages": [result(answer, output)],
               "thread": {"type": "continue", "previous_message_id": answer["id"]}})
    };
    let (status, second) = proxy.post("/v1/messages", &continue_from(&first, "a", false));
    assert_eq!(status, 200, "{second}");
    assert_eq!(
        second["content"][0]["input"]["command"], "echo b",
        "{second}"
    );
    // Continued once: the same continue again is refused, sampling nothing.
    let (status, again) = proxy.post("/v1/messages", &continue_from(&first, "a", false));
    assert_eq!(status, 400, "{again}");
    assert_eq!(
        again["error"]["details"]["error_code"], "thread_already_continued",
        "{again}"
    );
    let mut unknown = continue_from(&first, "a", false);
    unknown["thread"]["previous_message_id"] = json!("msg_unknown");
    let (status, lost) = proxy.post("/v1/messages", &unknown);
    assert_eq!(status, 404, "{lost}");
    assert_eq!(lost["error"]["type"], "not_found_error", "{lost}");
    assert_eq!(
        lost["error"]["details"]["error_code"], "thread_not_found",
        "{lost}"
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
    assert_eq!(proxy.sink.records().len(), 2, "no refused request sampled");
    // A streamed continue from the second answer.
    let (status, third) = proxy.post_raw("/v1/messages", &continue_from(&second, "b", true));
    assert_eq!(status, 200, "{third}");
    assert!(third.contains("message_stop"), "{third}");
    assert!(third.contains("\"stop_reason\":\"end_turn\""), "{third}");
    let records = proxy.sink.records();
    assert_eq!(records.len(), 3);
    assert_eq!(records[0].parent_call, None);
    for pair in records.windows(2) {
        assert_eq!(pair[1].parent_call, Some(pair[0].call));
        assert_eq!(
            pair[1].reused_prefix_tokens_count,
            pair[0].reused_prefix_tokens_count
                + (pair[0].input_ids.len() + pair[0].output_ids.len()) as u64,
            "each continue extends the whole conversation before it"
        );
    }
}
