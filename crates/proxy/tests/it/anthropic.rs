//! Anthropic Messages requests: Claude Code's shapes, the normalisation its re-sends need, and
//! rejections in Anthropic's error format naming the field.

use gyre_proxy::anthropic::{parse, parse_count_tokens, parse_count_tokens_with};
use gyre_proxy::media::MediaPolicy;
use gyre_proxy::messages::{ReasoningRequest, Role, ToolChoice};
use gyre_proxy::{ApiError, ChatRequest};
use serde_json::{json, Value};

fn parse_json(body: &Value) -> Result<ChatRequest, ApiError> {
    parse(body.to_string().as_bytes())
}

/// A first turn shaped like Claude Code 2.1.332's (research report §1.5).
fn claude_code_first_turn() -> Value {
    json!({
        "model": "claude-opus-5-5",
        "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "<system-reminder>attribution</system-reminder>"},
                {"type": "text", "text": "Create hello.txt", "cache_control": {"type": "ephemeral"}},
            ]},
            {"role": "system", "content": [
                {"type": "text", "text": "Environment: cwd=/w", "cache_control": {"type": "ephemeral"}},
            ], "output_config": {"effort": "medium"}},
        ],
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332.e48;"},
            {"type": "text", "text": "You are a Claude agent.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "Main prompt.", "cache_control": {"type": "ephemeral"}},
        ],
        "tools": [
            {"name": "Bash", "description": "Run a command", "input_schema": {
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "type": "object",
                "properties": {"command": {"type": "string"}, "description": {"type": "string"}},
                "required": ["command"], "additionalProperties": false}},
            {"name": "DeferredToolPlaceholder", "description": "d", "defer_loading": true,
             "input_schema": {"type": "object"}},
            {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
        ],
        "metadata": {"user_id": "{\"device_id\":\"d\",\"session_id\":\"s\"}"},
        "max_tokens": 128000,
        "thinking": {"type": "adaptive", "display": "updates"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "medium"},
        "stream": true,
        "some_future_field": 1,
    })
}

#[test]
fn claude_code_first_turn_converts() {
    let chat = parse_json(&claude_code_first_turn()).expect("parses");
    let roles: Vec<Role> = chat.messages.iter().map(|message| message.role).collect();
    assert_eq!(roles, [Role::System, Role::User, Role::System]);
    assert_eq!(
        chat.messages[0].content,
        "x-anthropic-billing-header: cc_version=2.1.332.e48;\nYou are a Claude agent.\nMain prompt."
    );
    assert_eq!(
        chat.messages[1].content,
        "<system-reminder>attribution</system-reminder>\nCreate hello.txt"
    );
    assert_eq!(chat.messages[2].content, "Environment: cwd=/w");
    assert_eq!(chat.tools.len(), 1);
    assert_eq!(chat.tools[0].name, "Bash");
    assert_eq!(
        chat.tools[0].parameters.to_string(),
        r#"{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object","properties":{"command":{"type":"string"},"description":{"type":"string"}},"required":["command"],"additionalProperties":false}"#,
        "schema key order is kept"
    );
    assert_eq!(
        chat.omitted_tools,
        ["DeferredToolPlaceholder", "web_search"]
    );
    assert_eq!(chat.reasoning, ReasoningRequest::Adaptive { effort: None });
    assert_eq!(chat.sampling.max_tokens, Some(128000));
    assert!(chat.stream);
    assert_eq!(
        chat.user.as_deref(),
        Some("{\"device_id\":\"d\",\"session_id\":\"s\"}")
    );
    // `output_config` is read (its `format`; this one only sets `effort`).
    assert_eq!(chat.ignored_fields, ["context_management"]);
    assert_eq!(chat.answer_format, None);
    assert_eq!(chat.unknown_fields, ["some_future_field"]);
}

fn turn_with_history(first_send: bool) -> Value {
    // The same history as Claude Code sends it on two consecutive turns: cache_control moves,
    // content switches between list and string, `is_error: false` appears or not.
    let cache = |on: bool| {
        if on {
            json!({"type": "ephemeral"})
        } else {
            Value::Null
        }
    };
    let text = |text: &str, cached: bool| {
        let mut block = json!({"type": "text", "text": text});
        if cached {
            block["cache_control"] = cache(true);
        }
        block
    };
    let system = if first_send {
        json!([text("Sys A", false), text("Sys B", true)])
    } else {
        json!("Sys A\nSys B")
    };
    let mid_system = if first_send {
        json!([text("Mid", true)])
    } else {
        json!("Mid")
    };
    let mut result = json!({"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"});
    if first_send {
        result["is_error"] = json!(false);
        result["cache_control"] = cache(true);
    }
    json!({
        "model": "m", "max_tokens": 10, "system": system,
        "messages": [
            {"role": "user", "content": if first_send { json!([text("Go", true)]) } else { json!("Go") }},
            {"role": "system", "content": mid_system},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "plan", "signature": "SIG"},
                {"type": "text", "text": "Running.\n"},
                {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls", "description": "List"}},
            ]},
            {"role": "user", "content": [result, text("<system-reminder>r</system-reminder>", !first_send)]},
        ],
    })
}

#[test]
fn re_sent_history_normalises_to_the_same_messages() {
    let first = parse_json(&turn_with_history(true)).expect("parses");
    let second = parse_json(&turn_with_history(false)).expect("parses");
    assert_eq!(first.messages, second.messages);
    let assistant = &first.messages[3];
    assert_eq!(assistant.role, Role::Assistant);
    assert_eq!(assistant.content, "Running.\n");
    assert_eq!(assistant.reasoning[0].text, "plan");
    assert_eq!(assistant.reasoning[0].handle.as_deref(), Some("SIG"));
    assert_eq!(assistant.tool_calls[0].id, "toolu_1");
    assert_eq!(
        assistant.tool_calls[0].arguments,
        r#"{"command":"ls","description":"List"}"#
    );
    let result = &first.messages[4];
    assert_eq!(result.role, Role::Tool);
    assert_eq!(result.tool_call_id.as_deref(), Some("toolu_1"));
    assert_eq!(result.tool_name.as_deref(), Some("Bash"));
    assert!(!result.is_error);
    assert_eq!(first.messages[5].role, Role::User);
    assert_eq!(
        first.messages[5].content,
        "<system-reminder>r</system-reminder>"
    );
}

#[test]
fn parallel_tool_results_keep_request_order_and_error_flags() {
    let body = json!({
        "model": "m", "max_tokens": 10,
        "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "a", "name": "Bash", "input": {}},
                {"type": "tool_use", "id": "b", "name": "Read", "input": {"file_path": "x"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "b", "content": [{"type": "text", "text": "r1"}, {"type": "text", "text": "r2"}]},
                {"type": "tool_result", "tool_use_id": "a", "content": "boom", "is_error": true},
            ]},
            {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "opaque"}, {"type": "text", "text": "done"}]},
        ],
        "tools": [{"name": "Bash", "input_schema": {"type": "object"}},
                  {"name": "Read", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
        "stop_sequences": ["END"], "temperature": 0.5, "top_k": 5,
    });
    let chat = parse_json(&body).expect("parses");
    let results: Vec<(&str, &str, bool)> = chat.messages[2..4]
        .iter()
        .map(|message| {
            (
                message.tool_call_id.as_deref().unwrap_or_default(),
                message.content.as_str(),
                message.is_error,
            )
        })
        .collect();
    assert_eq!(results, [("b", "r1\nr2", false), ("a", "boom", true)]);
    assert_eq!(chat.messages[1].tool_calls[0].arguments, "{}");
    assert_eq!(
        chat.messages.len(),
        5,
        "no empty user message after tool results"
    );
    assert!(chat.messages[4].reasoning[0].redacted);
    assert_eq!(chat.messages[4].reasoning_content(), None);
    assert_eq!(chat.tool_choice, ToolChoice::Required);
    assert_eq!(chat.parallel_tool_calls, Some(false));
    assert_eq!(chat.sampling.stop, ["END"]);
    assert_eq!(chat.sampling.temperature, Some(0.5));
    assert_eq!(chat.sampling.top_k, Some(5));
    assert!(
        chat.ends_with_assistant(),
        "a trailing assistant message is a prefill"
    );
}

#[test]
fn count_tokens_needs_no_max_tokens() {
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "foo"}]});
    let request = parse_count_tokens(body.to_string().as_bytes()).expect("parses");
    assert_eq!(request.max_tokens, None);
    let error = parse_json(&body).expect_err("/v1/messages needs max_tokens");
    assert_eq!(error.message, "max_tokens: field required");
}

#[test]
fn count_tokens_follows_the_media_policy() {
    let body = json!({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    ]}]})
    .to_string();
    let counted = parse_count_tokens_with(body.as_bytes(), MediaPolicy::Placeholder)
        .expect("a placeholder is counted")
        .to_chat()
        .expect("converts");
    assert!(counted.messages[0].content.contains("[image (image/png"));
    let error = parse_count_tokens_with(body.as_bytes(), MediaPolicy::Reject)
        .expect_err("refused under --media reject");
    assert!(
        error
            .message
            .starts_with("messages[0].content[1]: `image` content is not supported"),
        "{}",
        error.message
    );
}

fn rejection(body: &[u8]) -> ApiError {
    parse(body).expect_err("rejected")
}

fn base_with(message_content: Value) -> Value {
    json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": message_content}]})
}

#[test]
fn bad_requests_name_the_field() {
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"".to_vec(), "request body is empty"),
        (b"{\"model\":".to_vec(), "request body is not valid JSON: EOF while parsing a value at line 1 column 9"),
        (b"[1]".to_vec(), "request body must be a JSON object, got an array"),
        (json!({"max_tokens": 1, "messages": []}).to_string().into_bytes(), "model: field required"),
        (json!({"model": 3, "max_tokens": 1, "messages": []}).to_string().into_bytes(), "model: expected a string, got a number"),
        (json!({"model": "m", "max_tokens": 0, "messages": []}).to_string().into_bytes(), "max_tokens: must be at least 1"),
        (json!({"model": "m", "max_tokens": 0, "messages": [{"role": "user", "content": "x"}], "safeguards": [{"type": "auto_mode", "classifier_context": "c"}]}).to_string().into_bytes(), "safeguards: server-side safeguard classifiers are not available to this caller: the proxy serves the policy model only"),
        (json!({"model": "m", "max_tokens": -1, "messages": []}).to_string().into_bytes(), "max_tokens: expected an integer from 0 to 4294967295, got -1"),
        (json!({"model": "m", "max_tokens": 1.5, "messages": []}).to_string().into_bytes(), "max_tokens: expected an integer, got a number"),
        (json!({"model": "m", "max_tokens": 1, "messages": []}).to_string().into_bytes(), "messages: at least one message is required"),
        (json!({"model": "m", "max_tokens": 1, "messages": {}}).to_string().into_bytes(), "messages: expected an array, got an object"),
        (json!({"model": "m", "max_tokens": 1, "messages": [{"role": "bot", "content": "x"}]}).to_string().into_bytes(), "messages[0].role: unknown role `bot`, expected `user`, `assistant` or `system`"),
        (base_with(json!([{"type": "text", "text": "a"}, {"type": "video", "source": {}}])).to_string().into_bytes(), "messages[0].content[1]: unsupported content block type `video`"),
        (base_with(json!([{"type": "tool_use", "id": "x", "name": "n", "input": {}}])).to_string().into_bytes(), "messages[0].content[0]: a `tool_use` block cannot appear in a user message"),
        (base_with(json!([{"type": "thinking", "thinking": "t"}])).to_string().into_bytes(), "messages[0].content[0]: a `thinking` block cannot appear in a user message"),
        (base_with(json!([{"type": "text"}])).to_string().into_bytes(), "messages[0].content[0].text: field required"),
        (base_with(json!([{"text": "x"}])).to_string().into_bytes(), "messages[0].content[0].type: field required"),
        (base_with(json!([{"type": "bogus"}])).to_string().into_bytes(), "messages[0].content[0]: unsupported content block type `bogus`"),
        (base_with(json!([{"type": "tool_result", "tool_use_id": "nope", "content": "x"}])).to_string().into_bytes(), "messages[0].content[0].tool_use_id: no tool_use block with id `nope` in an earlier assistant message"),
        (base_with(json!([{"type": "tool_result", "tool_use_id": "x", "content": [{"type": "video"}]}])).to_string().into_bytes(), "messages[0].content[0].content[0]: unsupported content block type `video`"),
        (json!({"model": "m", "max_tokens": 1, "system": [{"type": "image"}], "messages": [{"role": "user", "content": "x"}]}).to_string().into_bytes(), "system[0]: image content is not supported: this model takes text only"),
        (json!({"model": "m", "max_tokens": 1, "stream": "yes", "messages": [{"role": "user", "content": "x"}]}).to_string().into_bytes(), "stream: expected a boolean, got a string"),
        (json!({"model": "m", "max_tokens": 1, "tools": [{"name": "t"}], "messages": [{"role": "user", "content": "x"}]}).to_string().into_bytes(), "tools[0].input_schema: field required"),
        (json!({"model": "m", "max_tokens": 1, "tools": [{"name": "Bash", "input_schema": {"type": "object"}}, {"type": "mcp_toolset", "mcp_server_name": "wx"}], "messages": [{"role": "user", "content": "x"}]}).to_string().into_bytes(), "tools[1].type: `mcp_toolset` tools are not supported by this proxy: MCP servers are not reachable through it (run the MCP server in the harness and list its tools as client tools)"),
        (json!({"model": "m", "max_tokens": 1, "tool_choice": {"type": "sometimes"}, "messages": [{"role": "user", "content": "x"}]}).to_string().into_bytes(), "tool_choice.type: unknown tool_choice type `sometimes`"),
        (json!({"model": "m", "max_tokens": 1, "thinking": {"type": "enabled", "budget_tokens": "lots"}, "messages": [{"role": "user", "content": "x"}]}).to_string().into_bytes(), "thinking.budget_tokens: expected an integer, got a string"),
        (json!({"model": "m", "max_tokens": 1, "messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "x", "name": "n", "input": [1]}]}]}).to_string().into_bytes(), "messages[0].content[0].input: expected an object, got an array"),
        (json!({"model": "m", "max_tokens": 1, "tools": [{"name": "Bash", "input_schema": {"type": "object"}}], "tool_choice": {"type": "tool", "name": "Edit"}, "messages": [{"role": "user", "content": "x"}]}).to_string().into_bytes(), "tool_choice.name: names tool `Edit`, which is not among the request's tools"),
        (json!({"model": "m", "max_tokens": 1, "tool_choice": {"type": "any"}, "messages": [{"role": "user", "content": "x"}]}).to_string().into_bytes(), "tool_choice: requires a tool call, but the request lists no tools"),
        (json!({"model": "m", "max_tokens": 1, "messages": [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "n", "input": {"a": 1}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "n", "input": {"a": 2}}]},
        ]}).to_string().into_bytes(), "messages: tool call id `toolu_1` appears on more than one tool call; tool call ids must be unique"),
    ];
    for (body, wanted) in cases {
        let error = rejection(&body);
        assert_eq!(error.status(), 400, "{wanted}");
        assert_eq!(error.message, wanted);
    }
}

/// A final assistant message is a prefill the model continues: as Anthropic's API, its text
/// may not end in white space; an empty one pre-fills nothing (a new turn); one that calls a
/// tool is history. A user message must have content.
#[test]
fn a_final_assistant_message_is_a_prefill_with_the_apis_rules() {
    let with = |messages: Value| json!({"model": "m", "max_tokens": 5, "messages": messages});
    let user = json!({"role": "user", "content": "What is six times seven?"});
    for (body, wanted) in [
        (
            with(json!([user, {"role": "assistant", "content": "The answer is "}])),
            "messages[1].content: final assistant content cannot end with trailing whitespace",
        ),
        (
            with(json!([user, {"role": "assistant", "content": [
                {"type": "text", "text": "The answer is\n"}, {"type": "text", "text": ""},
            ]}])),
            "messages[1].content: final assistant content cannot end with trailing whitespace",
        ),
        (
            with(json!([{"role": "user", "content": ""}])),
            "messages[0].content: a user message must have non-empty content",
        ),
        (
            with(
                json!([user, {"role": "assistant", "content": "42."}, {"role": "user", "content": []}]),
            ),
            "messages[2].content: a user message must have non-empty content",
        ),
    ] {
        let error = parse_json(&body).expect_err(wanted);
        assert_eq!(error.status(), 400, "{wanted}");
        assert_eq!(error.message, wanted);
        assert_eq!(
            error.body_json()["error"]["type"],
            "invalid_request_error",
            "{wanted}"
        );
    }
    let prefill = parse_json(&with(
        json!([user, {"role": "assistant", "content": "The answer is"}]),
    ))
    .expect("parses");
    assert!(prefill.continues_final_message());
    // White space inside the prefill, and a trailing one before a tool call, are fine.
    let calling = parse_json(&with(json!([user, {"role": "assistant", "content": [
        {"type": "text", "text": "Let me run it. "},
        {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {}},
    ]}])))
    .expect("parses");
    assert!(!calling.continues_final_message(), "a tool call is history");
    for empty in [json!(""), json!([])] {
        let request = parse_json(&with(
            json!([user, {"role": "assistant", "content": empty}]),
        ))
        .expect("an empty final assistant message is accepted");
        assert_eq!(request.messages.len(), 1, "it pre-fills nothing: {empty}");
        assert!(!request.continues_final_message());
    }
}

#[test]
fn a_later_tool_result_for_an_unknown_id_points_at_its_block() {
    let body = json!({
        "model": "m", "max_tokens": 5,
        "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}]},
            {"role": "user", "content": [
                {"type": "text", "text": "more"},
                {"type": "tool_result", "tool_use_id": "toolu_9", "content": "?"},
            ]},
        ],
    });
    let error = parse_json(&body).expect_err("rejected");
    assert_eq!(
        error.param.as_deref(),
        Some("messages[3].content[1].tool_use_id")
    );
}

#[test]
fn errors_render_in_anthropic_shape() {
    let error = rejection(b"nope");
    assert_eq!(error.status(), 400);
    let body: Value = serde_json::from_str(&error.body()).expect("JSON");
    assert_eq!(
        body,
        json!({"type": "error", "error": {"type": "invalid_request_error", "message": "request body is not valid JSON: expected ident at line 1 column 2"}})
    );
}

/// Claude Code's `ToolSearch` answers with `tool_reference` blocks naming deferred tools (the
/// Anthropic API expands them into definitions). The proxy renders each as the tool's
/// definition in the function form the template shows tools in, beside the result's text, so
/// the model sees the schema it may now call; the deferred tool stays out of the prompt's tool
/// list (the prompt's prefix never changes). A reference to a tool the request does not define
/// is refused, naming the block.
#[test]
fn tool_references_render_as_the_deferred_tools_definitions() {
    let body = |tool_name: &str| {
        json!({
            "model": "m", "max_tokens": 5,
            "tools": [
                {"name": "ToolSearch", "description": "Find tools", "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}}},
                {"name": "WebFetch", "description": "Fetch a URL", "defer_loading": true,
                 "input_schema": {"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]}},
            ],
            "messages": [
                {"role": "user", "content": "fetch it"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "ToolSearch", "input": {"query": "select:WebFetch"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [
                    {"type": "text", "text": "Found 1 tool"},
                    {"type": "tool_reference", "tool_name": tool_name},
                ]}]},
            ],
        })
    };
    let chat = parse_json(&body("WebFetch")).expect("parses");
    let names: Vec<&str> = chat.tools.iter().map(|tool| tool.name.as_str()).collect();
    assert_eq!(names, ["ToolSearch"]);
    assert_eq!(chat.omitted_tools, ["WebFetch"]);
    let result = chat.messages.last().expect("the tool result");
    assert_eq!(result.role, Role::Tool);
    assert_eq!(
        result.content,
        "Found 1 tool\n{\"type\":\"function\",\"function\":{\"name\":\"WebFetch\",\"description\":\"Fetch a URL\",\"parameters\":{\"type\":\"object\",\"properties\":{\"url\":{\"type\":\"string\"}},\"required\":[\"url\"]}}}"
    );
    let error = parse_json(&body("Nowhere")).expect_err("refused");
    assert_eq!(
        error.param.as_deref(),
        Some("messages[2].content[0].content[1].tool_name")
    );
    assert!(
        error.body().contains("`Nowhere` is not a client tool"),
        "{}",
        error.body()
    );
}

/// A tool output that a JavaScript harness cut by UTF-16 units can end in half an emoji, which
/// `JSON.stringify` writes as a lone surrogate escape. The request is answered (the half reads
/// as U+FFFD), not refused as invalid JSON: one truncated `Bash` output must not end a run.
#[test]
fn a_tool_output_cut_inside_an_emoji_is_accepted() {
    let body = r#"{"model":"m","max_tokens":5,"messages":[
        {"role":"user","content":"run it"},
        {"role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"Bash","input":{"command":"cat log"}}]},
        {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"done \ud83d"}]}
    ]}"#;
    let chat = parse(body.as_bytes()).expect("accepted");
    let result = chat.messages.last().expect("the tool result");
    assert_eq!(result.content, "done \u{fffd}");
}

/// Media a text-only model cannot read becomes a placeholder naming it (Claude Code sends an
/// image when it reads a PNG); documents with a text source, search results and a server-side
/// search's blocks become their text. Nothing here is refused.
#[test]
fn media_documents_and_server_tool_blocks_are_shown_as_text() {
    let body = json!({"model": "m", "max_tokens": 5, "messages": [
        {"role": "user", "content": [
            {"type": "text", "text": "look"},
            {"type": "document", "title": "notes", "source": {"type": "text", "media_type": "text/plain", "data": "Plain text doc"}},
            {"type": "search_result", "source": "https://x.example", "title": "X", "content": [{"type": "text", "text": "result text"}]}
        ]},
        {"role": "assistant", "content": [
            {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "gyre"}},
            {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": [{"type": "web_search_result", "url": "https://a.example", "title": "A", "encrypted_content": "E"}]},
            {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "a.png"}}
        ]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
        ]}]}
    ]});
    let chat = parse_json(&body).expect("accepted");
    let user = &chat.messages[0].content;
    assert!(user.contains("notes\nPlain text doc"), "{user}");
    assert!(
        user.contains("X (https://x.example)\nresult text"),
        "{user}"
    );
    let assistant = &chat.messages[1].content;
    assert!(
        assistant.contains(r#"[web_search: {"query":"gyre"}]"#),
        "{assistant}"
    );
    assert!(
        assistant.contains("[web_search results]\n- A (https://a.example)"),
        "{assistant}"
    );
    assert_eq!(
        chat.messages[1].tool_calls.len(),
        1,
        "the client tool call stays a call"
    );
    assert_eq!(
        chat.messages[2].content,
        "[image (image/png, 8 bytes) omitted: this model reads text only]"
    );
}

/// Claude Code's `mid-conversation-tool-changes` beta: a system message adds a tool (by
/// reference to a deferred one, or by its whole definition) or removes one. The model reads
/// each change; a `tool_reference` to a tool the history removed (and the request no longer
/// lists) reads as gone rather than failing the request.
#[test]
fn mid_conversation_tool_changes_render_as_system_text() {
    let body = json!({
        "model": "m", "max_tokens": 5,
        "tools": [
            {"name": "ToolSearch", "input_schema": {"type": "object"}},
            {"name": "WebFetch", "description": "Fetch a URL", "defer_loading": true,
             "input_schema": {"type": "object", "properties": {"url": {"type": "string"}}}},
        ],
        "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "ToolSearch", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [
                {"type": "tool_reference", "tool_name": "Gone"},
            ]}]},
            {"role": "system", "content": [
                {"type": "tool_removal", "tool": {"type": "tool_reference", "name": "Gone"}},
                {"type": "tool_addition", "tool": {"type": "tool_reference", "name": "WebFetch"}, "cache_control": {"type": "ephemeral"}},
                {"type": "tool_addition", "tool": {"type": "tool_definition", "definition": {
                    "name": "Lint", "description": "Lint a file", "input_schema": {"type": "object"}}}},
            ]},
            {"role": "user", "content": "now fetch"},
        ],
    });
    let chat = parse_json(&body).expect("parses");
    assert_eq!(
        chat.messages[2].content,
        "[tool `Gone` is no longer available]"
    );
    assert_eq!(chat.messages[3].role, Role::System);
    assert_eq!(
        chat.messages[3].content,
        "Tool removed: `Gone` is no longer available.\n\
         Tool added: {\"type\":\"function\",\"function\":{\"name\":\"WebFetch\",\"description\":\"Fetch a URL\",\"parameters\":{\"type\":\"object\",\"properties\":{\"url\":{\"type\":\"string\"}}}}}\n\
         Tool added: {\"type\":\"function\",\"function\":{\"name\":\"Lint\",\"description\":\"Lint a file\",\"parameters\":{\"type\":\"object\"}}}"
    );
    // Tool changes belong in system messages only, and name a tool.
    let mut misplaced = body.clone();
    misplaced["messages"][4] = json!({"role": "user", "content": [
        {"type": "tool_removal", "tool": {"type": "tool_reference", "name": "Gone"}}]});
    let error = parse_json(&misplaced).expect_err("refused");
    assert_eq!(error.param.as_deref(), Some("messages[4].content[0]"));
    let mut nameless = body.clone();
    nameless["messages"][3]["content"][0] =
        json!({"type": "tool_removal", "tool": {"type": "tool_reference"}});
    let error = parse_json(&nameless).expect_err("refused");
    assert_eq!(
        error.param.as_deref(),
        Some("messages[3].content[0].tool.name")
    );
}

/// A tool is shown in full the first time the history references it and by name after that,
/// so a body of many references to one large schema cannot multiply it in the prompt.
#[test]
fn repeated_tool_references_show_the_definition_once() {
    let schema = json!({"type": "object", "description": "x".repeat(10_000)});
    let references: Vec<Value> = (0..1_000)
        .map(|_| json!({"type": "tool_reference", "tool_name": "Big"}))
        .collect();
    let body = json!({
        "model": "m", "max_tokens": 5,
        "tools": [{"name": "Big", "defer_loading": true, "input_schema": schema}],
        "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Big", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": references}]},
        ],
    });
    let chat = parse_json(&body).expect("parses");
    let result = &chat.messages[2].content;
    assert!(result.len() < 10_000 + 1_000 * 60, "{} bytes", result.len());
    let by_name = "{\"type\":\"function\",\"function\":{\"name\":\"Big\"}}";
    assert_eq!(result.matches(by_name).count(), 999);
    assert!(
        result.starts_with("{\"type\":\"function\",\"function\":{\"name\":\"Big\",\"parameters\":")
    );
}

/// Anthropic's client-side built-in tools come with a type and a name only; the model is shown
/// each with the parameters the harness runs, and its calls are ordinary `tool_use` blocks
/// re-sent in the history. Server tools stay listed by name.
#[test]
fn built_in_client_tools_are_shown_with_their_parameters() {
    let body = json!({
        "model": "m",
        "max_tokens": 1024,
        "tools": [
            {"type": "bash_20250124", "name": "bash"},
            {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool",
             "max_characters": 10000},
            {"type": "text_editor_20250124", "name": "str_replace_editor",
             "description": "The harness's own words."},
            {"type": "memory_20250818", "name": "memory"},
            {"type": "web_search_20250305", "name": "web_search"},
            {"type": "computer_20250124", "name": "computer", "display_width_px": 1024,
             "display_height_px": 768},
        ],
        "messages": [
            {"role": "user", "content": "Fix the typo in /w/a.txt"},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_1", "name": "str_replace_based_edit_tool",
                 "input": {"command": "view", "path": "/w/a.txt"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "1\thelo"},
            ]},
        ],
    });
    let chat = parse_json(&body).expect("parses");
    let names: Vec<&str> = chat.tools.iter().map(|tool| tool.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "bash",
            "str_replace_based_edit_tool",
            "str_replace_editor",
            "memory"
        ]
    );
    assert_eq!(chat.omitted_tools, ["web_search", "computer"]);
    let bash = &chat.tools[0];
    assert!(bash.parameters["properties"]["command"].is_object());
    assert!(bash
        .description
        .as_deref()
        .is_some_and(|text| text.contains("persistent bash shell")));
    let editor = &chat.tools[1];
    assert_eq!(
        editor.parameters["properties"]["command"]["enum"],
        json!(["view", "create", "str_replace", "insert"])
    );
    assert_eq!(editor.parameters["required"], json!(["command", "path"]));
    let older = &chat.tools[2];
    assert_eq!(
        older.description.as_deref(),
        Some("The harness's own words.")
    );
    assert!(older.parameters["properties"]["command"]["enum"]
        .as_array()
        .expect("enum")
        .contains(&json!("undo_edit")));
    assert!(chat.tools[3].parameters["properties"]["insert_text"].is_object());
    // The editor call in the history renders as a call of that function.
    let calls: Vec<_> = chat
        .messages
        .iter()
        .flat_map(|message| message.tool_calls.iter())
        .collect();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].name, "str_replace_based_edit_tool");
    // A tool choice may name a built-in tool.
    let mut forced = body.clone();
    forced["tool_choice"] = json!({"type": "tool", "name": "bash"});
    let chat = parse_json(&forced).expect("parses");
    assert_eq!(chat.tool_choice, ToolChoice::Tool("bash".into()));
}

/// Anthropic's `stop_sequences` is an array of strings: a bare string is refused naming the
/// field (OpenAI Chat's `stop` takes one string, Anthropic's API does not), and the count
/// route reads the field the same way.
#[test]
fn stop_sequences_as_a_bare_string_are_refused() {
    let mut body = base_with(json!("x"));
    body["stop_sequences"] = json!("END");
    for error in [
        parse_json(&body).expect_err("refused"),
        parse_count_tokens(body.to_string().as_bytes()).expect_err("refused"),
    ] {
        assert_eq!(error.status(), 400);
        assert_eq!(error.param.as_deref(), Some("stop_sequences"));
        assert_eq!(
            error.message,
            "stop_sequences: expected an array of strings, got a string"
        );
    }
    body["stop_sequences"] = json!(["END"]);
    let request = parse_json(&body).expect("an array is read");
    assert_eq!(request.sampling.stop, ["END"]);
    let chat = gyre_proxy::openai_chat::parse(
        json!({"model": "m", "stop": "END", "messages": [{"role": "user", "content": "x"}]})
            .to_string()
            .as_bytes(),
    )
    .expect("Chat's `stop` takes a string");
    assert_eq!(chat.sampling.stop, ["END"]);
}

/// A call names its tool by name alone: two tools of one name make it ambiguous, and a tool
/// without a name cannot be called. Both are refused naming the field; namespaced-looking
/// names (real CLIs send `mcp__server__tool`) are fine.
#[test]
fn duplicate_or_empty_tool_names_are_refused() {
    let tool = |name: &str| json!({"name": name, "input_schema": {"type": "object"}});
    let mut body = base_with(json!("x"));
    body["tools"] = json!([tool("Bash"), tool("mcp__files__read"), tool("Bash")]);
    let error = parse_json(&body).expect_err("refused");
    assert_eq!(error.param.as_deref(), Some("tools[2].name"));
    assert_eq!(
        error.message,
        "tools[2].name: tool name `Bash` is used twice (first at `tools[0].name`); tool names must be unique"
    );
    body["tools"] = json!([tool("Bash"), tool("")]);
    let error = parse_json(&body).expect_err("refused");
    assert_eq!(
        error.message,
        "tools[1].name: a tool name must not be empty"
    );
    // A server tool with a client tool's name is as ambiguous.
    body["tools"] =
        json!([tool("web_search"), {"type": "web_search_20250305", "name": "web_search"}]);
    let error = parse_json(&body).expect_err("refused");
    assert_eq!(error.param.as_deref(), Some("tools[1].name"));
    body["tools"] = json!([tool("Bash"), tool("mcp__files__read"), tool("Read")]);
    assert_eq!(parse_json(&body).expect("distinct names").tools.len(), 3);
}
