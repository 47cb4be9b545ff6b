//! OpenAI Chat Completions requests: tool calls kept byte for byte, content parts, vLLM's
//! reasoning extension, and rejections in OpenAI's error format naming the field.

use gyre_proxy::messages::{ReasoningRequest, Role, ToolChoice};
use gyre_proxy::openai_chat::parse;
use gyre_proxy::ApiError;
use serde_json::{json, Value};

#[test]
fn an_agent_conversation_converts() {
    let raw_arguments = r#"{"cmd": "echo caf\u00e9 > hello.txt",  "workdir":"/w"}"#;
    let body = json!({
        "model": "m",
        "messages": [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": null, "reasoning_content": "think",
             "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "exec_command", "arguments": raw_arguments}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "done"},
            {"role": "assistant", "content": [{"type": "text", "text": "ok"}, {"type": "refusal", "refusal": "no"}]},
        ],
        "tools": [
            {"type": "function", "function": {"name": "exec_command", "description": "Run", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}},
            {"type": "custom", "custom": {"name": "apply_patch"}},
        ],
        "tool_choice": {"type": "function", "function": {"name": "exec_command"}},
        "stream": true, "stream_options": {"include_usage": true},
        "max_tokens": 10, "max_completion_tokens": 20, "stop": "END", "seed": 7,
        "reasoning_effort": "high", "logprobs": true, "mystery": [],
    });
    let chat = parse(body.to_string().as_bytes()).expect("parses");
    let roles: Vec<Role> = chat.messages.iter().map(|message| message.role).collect();
    assert_eq!(
        roles,
        [
            Role::System,
            Role::User,
            Role::Assistant,
            Role::Tool,
            Role::Assistant
        ]
    );
    assert_eq!(chat.messages[1].content, "a\nb");
    assert_eq!(chat.messages[2].content, "");
    assert_eq!(
        chat.messages[2].reasoning_content().as_deref(),
        Some("think")
    );
    assert_eq!(chat.messages[2].tool_calls[0].arguments, raw_arguments);
    assert_eq!(chat.messages[3].tool_name.as_deref(), Some("exec_command"));
    assert_eq!(chat.messages[4].content, "ok\nno");
    // A freeform `custom` tool is shown to the model as a function of one string, `input`.
    assert_eq!(chat.tools.len(), 2);
    assert_eq!(chat.tools[1].name, "apply_patch");
    assert_eq!(chat.tools[1].parameters["required"], json!(["input"]));
    assert_eq!(chat.freeform_tools, ["apply_patch"]);
    assert!(chat.omitted_tools.is_empty());
    assert_eq!(chat.tool_choice, ToolChoice::Tool("exec_command".into()));
    assert!(chat.stream && chat.stream_include_usage);
    assert_eq!(
        chat.sampling.max_tokens,
        Some(20),
        "max_completion_tokens wins"
    );
    assert_eq!(chat.sampling.stop, ["END"]);
    assert_eq!(chat.sampling.seed, Some(7));
    assert_eq!(
        chat.reasoning,
        ReasoningRequest::Adaptive {
            effort: Some("high".into())
        }
    );
    assert!(chat.logprobs, "logprobs is read, not ignored");
    assert!(chat.ignored_fields.is_empty(), "{:?}", chat.ignored_fields);
    assert_eq!(chat.unknown_fields, ["mystery"]);
}

fn rejection(body: &Value) -> ApiError {
    parse(body.to_string().as_bytes()).expect_err("rejected")
}

#[test]
fn bad_requests_name_the_field() {
    let user = json!({"role": "user", "content": "x"});
    let cases = [
        (json!({"messages": [user]}), "model: field required", "model"),
        (json!({"model": "m", "messages": vec![1; 100_001]}), "messages: an array of 100001 elements; at most 100000 are read", "messages"),
        (json!({"model": "m", "messages": []}), "messages: at least one message is required", "messages"),
        (json!({"model": "m", "messages": [{"role": "user"}]}), "messages[0].content: field required", "messages[0].content"),
        (json!({"model": "m", "messages": [{"role": "function", "content": "x"}]}), "messages[0].role: unsupported role `function`, expected system, developer, user, assistant or tool", "messages[0].role"),
        (json!({"model": "m", "messages": [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": "u"}}]}]}), "messages[0].content[0]: unsupported content part type `video_url`", "messages[0].content[0]"),
        (json!({"model": "m", "messages": [user, {"role": "tool", "tool_call_id": "call_9", "content": "r"}]}), "messages[1].tool_call_id: no tool call with id `call_9` in an earlier assistant message", "messages[1].tool_call_id"),
        (json!({"model": "m", "messages": [user, {"role": "tool", "content": "r"}]}), "messages[1].tool_call_id: field required", "messages[1].tool_call_id"),
        (json!({"model": "m", "messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": {}}}]}]}), "messages[0].tool_calls[0].function.arguments: expected a string, got an object", "messages[0].tool_calls[0].function.arguments"),
        (json!({"model": "m", "messages": [user], "n": 2}), "n: only n = 1 is supported", "n"),
        (json!({"model": "m", "messages": [user], "stop": ["a", "b", "c", "d", "e"]}), "stop: at most 4 stop sequences, got 5", "stop"),
        (json!({"model": "m", "messages": [user], "max_tokens": 0}), "max_tokens: must be at least 1", "max_tokens"),
        (json!({"model": "m", "messages": [user], "max_completion_tokens": 0}), "max_completion_tokens: must be at least 1", "max_completion_tokens"),
        (json!({"model": "m", "messages": [user], "tool_choice": "sometimes"}), "tool_choice: unknown tool_choice `sometimes`, expected auto, none or required", "tool_choice"),
        (json!({"model": "m", "messages": [user], "stop": [1]}), "stop[0]: expected a string, got a number", "stop[0]"),
        (json!({"model": "m", "messages": [user], "temperature": "hot"}), "temperature: expected a number, got a string", "temperature"),
        (json!({"model": "m", "messages": [user], "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}}), "tool_choice.function.name: names tool `g`, which is not among the request's tools", "tool_choice.function.name"),
        (json!({"model": "m", "messages": [user], "tool_choice": "required"}), "tool_choice: requires a tool call, but the request lists no tools", "tool_choice"),
        (json!({"model": "m", "messages": [user, {"role": "assistant", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{\"x\":1}"}},
        ]}]}), "messages: tool call id `c` appears on more than one tool call; tool call ids must be unique", "messages"),
    ];
    for (body, message, param) in cases {
        let error = rejection(&body);
        assert_eq!(error.status(), 400);
        assert_eq!(error.message, message);
        assert_eq!(error.param.as_deref(), Some(param));
    }
}

#[test]
fn errors_render_in_openai_shape() {
    let error = rejection(&json!({"model": "m", "messages": [{"role": "user", "content": 5}]}));
    let body: Value = serde_json::from_str(&error.body()).expect("JSON");
    assert_eq!(
        body,
        json!({"error": {
            "message": "messages[0].content: expected an array, got a number",
            "type": "invalid_request_error",
            "param": "messages[0].content",
            "code": null,
        }})
    );
    let error = parse(b"{").expect_err("rejected");
    let body: Value = serde_json::from_str(&error.body()).expect("JSON");
    assert_eq!(body["error"]["param"], Value::Null);
}

/// vLLM and SGLang read `top_k` -1 or 0 as "no cut", and RL clients pass those through: they
/// parse as no `top_k`; other negatives are refused by name.
#[test]
fn top_k_off_values_read_as_no_cut() {
    let user = json!({"role": "user", "content": "x"});
    for off in [-1, 0] {
        let chat = parse(
            json!({"model": "m", "messages": [user], "top_k": off})
                .to_string()
                .as_bytes(),
        )
        .expect("parses");
        assert_eq!(chat.sampling.top_k, None, "{off}");
    }
    let chat = parse(
        json!({"model": "m", "messages": [user], "top_k": 40})
            .to_string()
            .as_bytes(),
    )
    .expect("parses");
    assert_eq!(chat.sampling.top_k, Some(40));
    let error = rejection(&json!({"model": "m", "messages": [user], "top_k": -2}));
    assert_eq!(error.param.as_deref(), Some("top_k"));
    assert_eq!(
        error.message,
        "top_k: must be at least 1, or -1 / 0 for no top-k cut"
    );
    let responses = gyre_proxy::openai_responses::parse(
        json!({"model": "m", "input": "x", "top_k": -1})
            .to_string()
            .as_bytes(),
    )
    .expect("parses");
    assert_eq!(responses.sampling.top_k, None);
}

/// The legacy `functions` / `function_call` members would be dropped silently (the model would
/// answer without the tools they list): refused naming the field instead.
#[test]
fn legacy_functions_are_refused_as_not_supported() {
    for (field, value) in [
        (
            "functions",
            json!([{"name": "f", "parameters": {"type": "object"}}]),
        ),
        ("function_call", json!("auto")),
    ] {
        let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
        body[field] = value;
        let error = rejection(&body);
        assert_eq!(error.status(), 400, "{field}");
        assert_eq!(error.param.as_deref(), Some(field));
        assert!(
            error
                .message
                .starts_with(&format!("{field}: not supported by this proxy")),
            "{}",
            error.message
        );
    }
    // `null` is absent, as for every optional member.
    let body =
        json!({"model": "m", "functions": null, "messages": [{"role": "user", "content": "x"}]});
    parse(body.to_string().as_bytes()).expect("null is absent");
}

/// Two tools of one name make a call by that name ambiguous; a tool without a name cannot be
/// called. Both are refused naming the second tool's name.
#[test]
fn duplicate_or_empty_tool_names_are_refused() {
    let tool = |name: &str| json!({"type": "function", "function": {"name": name, "parameters": {"type": "object"}}});
    let body = |tools: Value| json!({"model": "m", "tools": tools, "messages": [{"role": "user", "content": "x"}]});
    let error = rejection(&body(json!([tool("exec"), tool("exec")])));
    assert_eq!(error.param.as_deref(), Some("tools[1].function.name"));
    assert_eq!(
        error.message,
        "tools[1].function.name: tool name `exec` is used twice (first at `tools[0].function.name`); tool names must be unique"
    );
    let error = rejection(&body(json!([tool("")])));
    assert_eq!(
        error.message,
        "tools[0].function.name: a tool name must not be empty"
    );
    parse(
        body(json!([tool("exec"), tool("mcp__fs__read")]))
            .to_string()
            .as_bytes(),
    )
    .expect("distinct names");
}
