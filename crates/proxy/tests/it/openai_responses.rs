//! OpenAI Responses requests as Codex sends them: instructions, developer messages, reasoning
//! items with `encrypted_content`, function calls and their outputs, grouped into turns.

use gyre_proxy::messages::{ReasoningRequest, Role, ToolChoice};
use gyre_proxy::openai_responses::parse;
use gyre_proxy::ApiError;
use serde_json::{json, Value};

#[test]
fn a_codex_turn_converts() {
    let arguments = r#"{"command": ["bash", "-lc", "ls -la"], "workdir":"/w"}"#;
    let body = json!({
        "model": "gpt-x",
        "instructions": "You are Codex.",
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "<permissions>"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "env"}, {"type": "input_text", "text": "list files"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Fake reasoning step 0"}], "encrypted_content": "ENC_0"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "I'll list the files.", "annotations": []}]},
            {"type": "function_call", "id": "fc_1", "call_id": "call_a", "name": "shell", "arguments": arguments},
            {"type": "function_call_output", "call_id": "call_a", "output": "a.txt"},
            {"type": "reasoning", "id": "rs_2", "summary": [], "content": [{"type": "reasoning_text", "text": "two calls"}], "encrypted_content": "ENC_1"},
            {"type": "function_call", "call_id": "call_b", "name": "shell", "arguments": "{}"},
            {"type": "function_call", "call_id": "call_c", "name": "shell", "arguments": "{\"x\":1}"},
            {"type": "function_call_output", "call_id": "call_c", "output": [{"type": "input_text", "text": "c out"}]},
            {"type": "function_call_output", "call_id": "call_b", "output": "b out"},
            {"role": "user", "content": "thanks"},
        ],
        "tools": [
            {"type": "function", "name": "shell", "description": "Run", "strict": false,
             "parameters": {"type": "object", "properties": {"command": {"type": "array", "items": {"type": "string"}}}}},
            {"type": "web_search"},
        ],
        "tool_choice": "auto", "parallel_tool_calls": true,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": false, "stream": true, "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "thread-1",
    });
    let chat = parse(body.to_string().as_bytes()).expect("parses");
    let roles: Vec<Role> = chat.messages.iter().map(|message| message.role).collect();
    assert_eq!(
        roles,
        [
            Role::System,
            Role::System,
            Role::User,
            Role::Assistant,
            Role::Tool,
            Role::Assistant,
            Role::Tool,
            Role::Tool,
            Role::User
        ]
    );
    assert_eq!(chat.messages[0].content, "You are Codex.");
    assert_eq!(chat.messages[2].content, "env\nlist files");
    let first = &chat.messages[3];
    assert_eq!(first.reasoning[0].text, "Fake reasoning step 0");
    assert_eq!(first.reasoning[0].handle.as_deref(), Some("ENC_0"));
    assert_eq!(first.content, "I'll list the files.");
    assert_eq!(first.tool_calls[0].id, "call_a");
    assert_eq!(first.tool_calls[0].arguments, arguments);
    let second = &chat.messages[5];
    assert_eq!(second.reasoning[0].text, "two calls");
    assert_eq!(second.tool_calls.len(), 2);
    assert_eq!(chat.messages[6].tool_call_id.as_deref(), Some("call_c"));
    assert_eq!(chat.messages[6].content, "c out");
    assert_eq!(chat.messages[7].tool_name.as_deref(), Some("shell"));
    assert_eq!(chat.omitted_tools, ["web_search"]);
    assert_eq!(chat.tool_choice, ToolChoice::Auto);
    assert_eq!(
        chat.reasoning,
        ReasoningRequest::Adaptive {
            effort: Some("medium".into())
        }
    );
    assert_eq!(chat.user.as_deref(), Some("thread-1"));
    assert_eq!(chat.ignored_fields, ["store", "include"]);
}

#[test]
fn a_string_input_is_one_user_message() {
    let chat =
        parse(br#"{"model": "m", "input": "hello", "max_output_tokens": 16}"#).expect("parses");
    assert_eq!(chat.messages.len(), 1);
    assert_eq!(chat.messages[0].role, Role::User);
    assert_eq!(chat.sampling.max_tokens, Some(16));
}

fn rejection(body: &Value) -> ApiError {
    parse(body.to_string().as_bytes()).expect_err("rejected")
}

#[test]
fn bad_requests_name_the_field() {
    let cases = [
        (json!({"model": "m"}), "input: field required"),
        (json!({"model": "m", "input": 3}), "input: expected an array, got a number"),
        (json!({"model": "m", "input": "x", "max_output_tokens": 0}), "max_output_tokens: must be at least 16, got 0"),
        (json!({"model": "m", "input": "x", "max_output_tokens": 15}), "max_output_tokens: must be at least 16, got 15"),
        (json!({"model": "m", "input": "x", "previous_response_id": "resp_1"}), "previous_response_id: is resolved by the server before this parser; send the whole conversation in `input` here"),
        (json!({"model": "m", "input": [{"type": "function_call_output", "call_id": "call_z", "output": "o"}]}), "input[0].call_id: no function_call with call_id `call_z` earlier in the input"),
        (json!({"model": "m", "input": [{"role": "user", "content": [{"type": "input_video", "video_url": "u"}]}]}), "input[0].content[0]: unsupported content part type `input_video`"),
        (json!({"model": "m", "input": [{"type": "item_reference", "id": "msg_1"}]}), "input[0]: an item_reference is resolved against the execution's stored responses before parsing; this one could not be"),
        (json!({"model": "m", "input": [{"content": "x"}]}), "input[0].type: field required"),
        (json!({"model": "m", "input": [{"type": "message", "role": "tool", "content": "x"}]}), "input[0].role: unknown role `tool`, expected user, assistant, system or developer"),
        (json!({"model": "m", "input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {"a": 1}}]}), "input[0].arguments: expected a string, got an object"),
        (json!({"model": "m", "input": [{"type": "image_generation_call"}]}), "input[0]: unsupported input item type `image_generation_call`"),
        (json!({"model": "m", "input": [{"type": "local_shell_call"}]}), "input[0].call_id: field required"),
        (json!({"model": "m", "input": [{"type": "shell_call", "call_id": "c"}]}), "input[0].action: field required"),
        (json!({"model": "m", "input": [{"type": "shell_call_output", "call_id": "c", "output": "done"}]}), "input[0].output: expected an array, got a string"),
        (json!({"model": "m", "input": [{"type": "apply_patch_call", "call_id": "c", "status": "completed"}]}), "input[0].operation: field required"),
        (json!({"model": "m", "input": [{"type": "apply_patch_call_output", "call_id": "c"}]}), "input[0].status: field required"),
        (json!({"model": "m", "input": []}), "input: at least one input item is required"),
        (json!({"model": "m", "input": "x", "background": true}), "background: background responses are not served: this proxy answers a request while its connection is open (leave `background` out or false)"),
        (json!({"model": "m", "input": "x", "tools": [{"type": "function", "name": "f", "parameters": {}}], "tool_choice": {"type": "function", "name": "g"}}), "tool_choice.name: names tool `g`, which is not among the request's tools"),
        (json!({"model": "m", "input": "x", "tool_choice": "required"}), "tool_choice: requires a tool call, but the request lists no tools"),
        (json!({"model": "m", "input": [
            {"role": "user", "content": "x"},
            {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "o"},
            {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{\"b\":2}"},
        ]}), "input: tool call id `call_1` appears on more than one tool call; tool call ids must be unique"),
    ];
    for (body, message) in cases {
        let error = rejection(&body);
        assert_eq!(error.status(), 400);
        assert_eq!(error.message, message);
        let shape: Value = serde_json::from_str(&error.body()).expect("JSON");
        assert_eq!(shape["error"]["type"], "invalid_request_error");
        assert_eq!(shape["error"]["message"], message);
    }
}

/// Codex groups its sub-agent tools in a `namespace`: each member is shown to the model as
/// `<namespace>.<function>`, a call in the history that carries `namespace` reads back under
/// that qualified name, and the answer's call goes out with `namespace` and `name` again.
#[test]
fn namespace_tools_are_shown_and_called_by_qualified_name() {
    let body = json!({
        "model": "m",
        "input": [
            {"role": "user", "content": "delegate"},
            {"type": "function_call", "call_id": "call_1", "namespace": "multi_agent_v1", "name": "spawn_agent", "arguments": "{\"message\":\"go\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "{\"agent_id\":\"a1\"}"},
        ],
        "tools": [
            {"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
            {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.", "tools": [
                {"type": "function", "name": "spawn_agent", "description": "Spawn.", "parameters": {"type": "object"}},
                {"type": "function", "name": "wait_agent", "parameters": {"type": "object"}},
            ]},
            {"type": "web_search"},
        ],
    });
    let chat = parse(body.to_string().as_bytes()).expect("parses");
    let names: Vec<&str> = chat.tools.iter().map(|tool| tool.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "exec_command",
            "multi_agent_v1.spawn_agent",
            "multi_agent_v1.wait_agent"
        ]
    );
    assert_eq!(chat.tools[1].description.as_deref(), Some("Spawn."));
    assert_eq!(chat.omitted_tools, ["web_search"]);
    let call = &chat.messages[1].tool_calls[0];
    assert_eq!(call.name, "multi_agent_v1.spawn_agent");
    assert_eq!(
        chat.messages[2].tool_name.as_deref(),
        Some("multi_agent_v1.spawn_agent")
    );

    let meta = gyre_proxy::output::ResponseMeta {
        id: "resp_1".into(),
        model: "m".into(),
        created_unix_s: 0,
    };
    let blocks = [
        gyre_proxy::output::ResponseBlock::ToolCall {
            id: "call_2".into(),
            name: "multi_agent_v1.wait_agent".into(),
            arguments: "{}".into(),
        },
        gyre_proxy::output::ResponseBlock::ToolCall {
            id: "call_3".into(),
            name: "exec_command".into(),
            arguments: "{}".into(),
        },
    ];
    let usage = gyre_proxy::output::Usage {
        input_tokens: 1,
        cached_input_tokens: 0,
        output_tokens: 1,
        reasoning_tokens: 0,
    };
    let response = gyre_proxy::output::openai_responses::response_json(
        &meta,
        &blocks,
        &gyre_proxy::output::StopReason::ToolUse,
        &usage,
    );
    let output = &response["output"];
    assert_eq!(output[0]["namespace"], "multi_agent_v1");
    assert_eq!(output[0]["name"], "wait_agent");
    assert_eq!(output[1]["name"], "exec_command");
    assert!(output[1].get("namespace").is_none());
}

#[test]
fn malformed_namespaces_are_refused_by_field() {
    let cases = [
        (
            json!({"model": "m", "input": "x", "tools": [{"type": "namespace", "name": "ns"}]}),
            "tools[0].tools: field required",
        ),
        (
            json!({"model": "m", "input": "x", "tools": [{"type": "namespace", "name": "a.b", "tools": []}]}),
            "tools[0].name: namespace name `a.b` is empty or contains `.`",
        ),
        (
            json!({"model": "m", "input": "x", "tools": [{"type": "namespace", "name": "ns", "tools": [{"type": "namespace", "name": "inner", "tools": []}]}]}),
            "tools[0].tools[0]: a namespace cannot contain another namespace",
        ),
        (
            json!({"model": "m", "input": "x", "tools": [{"type": "function", "name": "a.b"}]}),
            "tools[0].name: function name `a.b` contains `.`",
        ),
    ];
    for (body, message) in cases {
        let error = rejection(&body);
        assert_eq!(error.status(), 400);
        assert_eq!(error.message, message);
    }
}

/// GPT-5.1's typed client-run tools (the OpenAI Agents SDK's `ShellTool` and
/// `ApplyPatchTool`): a request's `shell` (run locally) and `apply_patch` are shown to the model
/// as functions of those names, a hosted-container `shell` is not, a `tool_choice` of either
/// type names its function, and history's calls and outputs pair like a function call's, the
/// outputs as text the model can read.
#[test]
fn shell_and_apply_patch_tools_and_their_history_are_read() {
    let body = json!({"model": "m",
        "tools": [{"type": "shell", "environment": {"type": "local"}}, {"type": "apply_patch"}],
        "tool_choice": {"type": "apply_patch"},
        "input": [
        {"role": "user", "content": "fix it"},
        {"type": "shell_call", "id": "sh_1", "call_id": "call_s", "status": "completed",
         "action": {"commands": ["ls", "cat a.txt"], "timeout_ms": 1000, "max_output_length": null},
         "environment": {"type": "local"}},
        {"type": "shell_call_output", "call_id": "call_s", "status": "completed", "max_output_length": 4096,
         "output": [{"stdout": "a.txt\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}},
                    {"stdout": "", "stderr": "cat: a.txt: denied\n", "outcome": {"type": "exit", "exit_code": 1}},
                    {"stdout": "partial", "stderr": "", "outcome": {"type": "timeout"}}]},
        {"type": "apply_patch_call", "id": "apc_1", "call_id": "call_p", "status": "completed",
         "operation": {"type": "create_file", "path": "b.txt", "diff": "+hello\n"}},
        {"type": "apply_patch_call_output", "call_id": "call_p", "status": "failed", "output": "exists"},
        {"type": "apply_patch_call", "call_id": "call_d", "status": "completed",
         "operation": {"type": "delete_file", "path": "c.txt"}},
        {"type": "apply_patch_call_output", "call_id": "call_d", "status": "completed"}
    ]});
    let chat = parse(body.to_string().as_bytes()).expect("accepted");
    let names: Vec<&str> = chat.tools.iter().map(|tool| tool.name.as_str()).collect();
    assert_eq!(names, ["shell", "apply_patch"]);
    assert!(chat.omitted_tools.is_empty());
    assert_eq!(chat.tool_choice, ToolChoice::Tool("apply_patch".into()));
    let shell = &chat.messages[1].tool_calls[0];
    assert_eq!(shell.name, "shell");
    assert_eq!(
        serde_json::from_str::<Value>(&shell.arguments).expect("arguments"),
        json!({"commands": ["ls", "cat a.txt"], "timeout_ms": 1000})
    );
    assert_eq!(
        chat.messages[2].content,
        "a.txt\n[exit code 0]\n[stderr]\ncat: a.txt: denied\n[exit code 1]\npartial\n[timed out]"
    );
    assert_eq!(chat.messages[2].tool_call_id.as_deref(), Some("call_s"));
    let patch = &chat.messages[3].tool_calls[0];
    assert_eq!(patch.name, "apply_patch");
    assert_eq!(
        serde_json::from_str::<Value>(&patch.arguments).expect("arguments"),
        json!({"type": "create_file", "path": "b.txt", "diff": "+hello\n"})
    );
    assert_eq!(chat.messages[4].content, "[failed] exists");
    assert_eq!(chat.messages[6].content, "[completed]");

    // What a harness echoes is read, never refused: the Agents SDK's default exit outcome
    // (`exit_code` null), and this proxy's own items of calls the model wrote loosely (a
    // string timeout, a number among the commands, an operation of an unknown type without a
    // diff), which the harness ran or refused and sends back as they are.
    let body = json!({"model": "m", "input": [
        {"role": "user", "content": "go"},
        {"type": "shell_call", "call_id": "call_s", "status": "completed",
         "action": {"commands": ["ls", 7], "timeout_ms": "5000", "max_output_length": null}},
        {"type": "shell_call_output", "call_id": "call_s", "status": "completed",
         "output": [{"stdout": "a\n", "stderr": null, "outcome": {"type": "exit", "exit_code": null}},
                    {"stdout": "", "stderr": "", "outcome": null}]},
        {"type": "apply_patch_call", "call_id": "call_p", "status": "completed",
         "operation": {"type": "rename_file", "path": "a"}},
        {"type": "apply_patch_call_output", "call_id": "call_p", "status": "failed", "output": "unknown operation"}
    ]});
    let chat = parse(body.to_string().as_bytes()).expect("accepted");
    assert_eq!(
        serde_json::from_str::<Value>(&chat.messages[1].tool_calls[0].arguments).expect("json"),
        json!({"commands": ["ls", 7], "timeout_ms": "5000"})
    );
    assert_eq!(chat.messages[2].content, "a\n[exited]");
    assert_eq!(
        serde_json::from_str::<Value>(&chat.messages[3].tool_calls[0].arguments).expect("json"),
        json!({"type": "rename_file", "path": "a"})
    );
    assert_eq!(chat.messages[4].content, "[failed] unknown operation");

    // A shell in a hosted container runs at OpenAI: listed, not shown.
    let body = json!({"model": "m", "input": "x",
        "tools": [{"type": "shell", "environment": {"type": "container_auto"}}]});
    let chat = parse(body.to_string().as_bytes()).expect("accepted");
    assert!(chat.tools.is_empty());
    assert_eq!(chat.omitted_tools, ["shell"]);
}

/// Items Codex echoes from tools the model cannot have used here (a server-side web search,
/// the `local_shell` tool) and media in a tool's output are read, not refused: a search as the
/// assistant's text, a shell call and its output paired like a function call's, an image as a
/// placeholder naming it.
#[test]
fn searches_shell_calls_and_images_in_history_are_read() {
    let body = json!({"model": "m", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "list and search"}]},
        {"type": "local_shell_call", "id": "lsc_1", "call_id": "call_ls1", "status": "completed", "action": {"type": "exec", "command": ["ls"], "env": {}}},
        {"type": "local_shell_call_output", "id": "call_ls1", "output": "a\nb\n"},
        {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search", "query": "gyre"}},
        {"type": "function_call", "call_id": "call_v", "name": "view_image", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_v", "output": [{"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}]}
    ]});
    let chat = parse(body.to_string().as_bytes()).expect("accepted");
    let shell = &chat.messages[1];
    assert_eq!(shell.tool_calls[0].name, "local_shell");
    assert_eq!(chat.messages[2].content, "a\nb\n");
    assert_eq!(chat.messages[2].tool_call_id.as_deref(), Some("call_ls1"));
    assert!(
        chat.messages
            .iter()
            .any(|message| message.content.starts_with("[web_search: {")
                && message.content.contains(r#""query":"gyre""#)),
        "{:?}",
        chat.messages
    );
    assert_eq!(
        chat.messages.last().expect("the output").content,
        "[image (image/png, 8 bytes) omitted: this model reads text only]"
    );
}

/// Codex's freeform `apply_patch` (a `custom` tool with a Lark grammar): the model sees a
/// function taking one string, `input`, described with the grammar; history's
/// `custom_tool_call` renders as that function's call; the model's call of it goes back as a
/// `custom_tool_call` item carrying the text, streamed as `custom_tool_call_input` events.
#[test]
fn freeform_tools_are_shown_as_one_string_and_answered_as_custom_calls() {
    let patch = "*** Begin Patch\n*** Add File: a.txt\n+caf\u{e9} \"quoted\"\n*** End Patch\n";
    let body = json!({
        "model": "gpt-5.5", "stream": true,
        "tools": [{"type": "custom", "name": "apply_patch", "description": "Edit files.",
                   "format": {"type": "grammar", "syntax": "lark", "definition": "start: begin_patch hunk+ end_patch"}}],
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Add a.txt."}]},
            {"type": "custom_tool_call", "call_id": "call_1", "name": "apply_patch", "input": patch},
            {"type": "custom_tool_call_output", "call_id": "call_1", "output": "Success."}
        ]
    });
    let chat = parse(body.to_string().as_bytes()).expect("parses");
    assert_eq!(chat.freeform_tools, ["apply_patch"]);
    let tool = &chat.tools[0];
    assert_eq!(tool.name, "apply_patch");
    assert_eq!(tool.parameters["required"], json!(["input"]));
    let described = tool.parameters["properties"]["input"]["description"]
        .as_str()
        .expect("a description");
    assert!(
        described.contains("lark grammar:\nstart: begin_patch hunk+ end_patch"),
        "{described}"
    );
    let call = &chat.messages[1].tool_calls[0];
    let arguments: Value = serde_json::from_str(&call.arguments).expect("JSON arguments");
    assert_eq!(arguments, json!({"input": patch}));
    assert_eq!(chat.messages[2].content, "Success.");

    use gyre_proxy::output::openai_responses::ResponsesResponse;
    use gyre_proxy::output::{ResponseMeta, StreamItem};
    let meta = ResponseMeta {
        id: "resp_1".into(),
        model: "gpt-5.5".into(),
        created_unix_s: 0,
    };
    let mut response = ResponsesResponse::new(meta).with_freeform_tools(chat.freeform_tools);
    let mut events = response.start();
    let generated = serde_json::to_string(&json!({"input": patch})).expect("json");
    events.extend(response.push(StreamItem::ToolCall {
        id: "call_2",
        name: "apply_patch",
        arguments: &generated,
    }));
    events.extend(response.push(StreamItem::ToolCall {
        id: "call_3",
        name: "exec_command",
        arguments: "{}",
    }));
    let names: Vec<&str> = events.iter().filter_map(|e| e.event.as_deref()).collect();
    assert!(
        names.contains(&"response.custom_tool_call_input.delta"),
        "{names:?}"
    );
    let done = events
        .iter()
        .find(|e| e.event.as_deref() == Some("response.custom_tool_call_input.done"))
        .expect("an input done event");
    let done: Value = serde_json::from_str(&done.data).expect("json");
    assert_eq!(done["input"], patch);
    let usage = gyre_proxy::output::Usage {
        input_tokens: 1,
        cached_input_tokens: 0,
        output_tokens: 1,
        reasoning_tokens: 0,
    };
    let whole = response.response_json(&gyre_proxy::output::StopReason::ToolUse, &usage);
    let output = &whole["output"];
    assert_eq!(output[0]["type"], "custom_tool_call");
    assert_eq!(output[0]["name"], "apply_patch");
    assert_eq!(output[0]["call_id"], "call_2");
    assert_eq!(output[0]["input"], patch);
    assert!(output[0].get("arguments").is_none());
    assert_eq!(output[1]["type"], "function_call");
    assert_eq!(output[1]["arguments"], "{}");
}

/// Codex's "responses lite" models send no `tools`: an `additional_tools` input item lists
/// them (here a `functions` namespace with a freeform `exec`). They are the request's tools.
#[test]
fn additional_tools_items_are_the_requests_tools() {
    let body = json!({
        "model": "gpt-6.2-sol",
        "input": [
            {"type": "additional_tools", "id": "at_1", "role": "developer", "tools": [
                {"type": "namespace", "name": "functions", "description": "", "tools": [
                    {"type": "custom", "name": "exec", "description": "Run JavaScript."},
                    {"type": "function", "name": "wait", "parameters": {"type": "object", "properties": {}}}
                ]},
                {"type": "web_search"}
            ]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi."}]}
        ]
    });
    let chat = parse(body.to_string().as_bytes()).expect("parses");
    let names: Vec<&str> = chat.tools.iter().map(|tool| tool.name.as_str()).collect();
    assert_eq!(names, ["functions.exec", "functions.wait"]);
    assert_eq!(chat.freeform_tools, ["functions.exec"]);
    assert_eq!(chat.omitted_tools, ["web_search"]);
    assert_eq!(chat.messages.len(), 1, "the tools item is not a message");
    assert_eq!(chat.messages[0].content, "Hi.");
    let broken = json!({"model": "m", "input": [{"type": "additional_tools"}]});
    let error = parse(broken.to_string().as_bytes()).expect_err("refused");
    assert_eq!(error.message, "input[0].tools: field required");
}

/// Codex's `tool_search` (a harness-run tool that loads deferred tools, e.g. an MCP server's):
/// shown to the model as a function; the model's call goes out as a `tool_search_call` with
/// its arguments as an object; history's call and its `tool_search_output` render as a call
/// and a result listing the loaded tools under qualified names.
#[test]
fn tool_search_is_a_function_whose_output_lists_the_loaded_tools() {
    let search = json!({"type": "tool_search", "execution": "client", "description": "Find tools.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}});
    let body = json!({
        "model": "gpt-5.5",
        "tools": [search, {"type": "tool_search", "execution": "server"}],
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "tool_search_call", "id": "ts_1", "call_id": "call_1", "status": "completed",
             "execution": "client", "arguments": {"query": "weather"}},
            {"type": "tool_search_output", "id": "tso_1", "call_id": "call_1", "status": "completed",
             "execution": "client", "tools": [{"type": "namespace", "name": "mcp__wx", "description": "MCP.",
                "tools": [{"type": "function", "name": "lookup_weather", "description": "Look up \u{fc}.",
                           "defer_loading": true, "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
                          {"type": "custom", "name": "raw", "description": "Raw text."}]}]}
        ]
    });
    let chat = parse(body.to_string().as_bytes()).expect("parses");
    assert_eq!(chat.search_tools, ["tool_search"]);
    assert_eq!(chat.tools.len(), 1, "the server-run search is not shown");
    assert_eq!(chat.tools[0].name, "tool_search");
    assert_eq!(chat.tools[0].parameters["required"], json!(["query"]));
    assert_eq!(chat.omitted_tools, ["tool_search"]);
    assert_eq!(
        chat.freeform_tools,
        ["mcp__wx.raw"],
        "a loaded freeform tool is freeform"
    );
    let call = &chat.messages[1].tool_calls[0];
    assert_eq!(
        (call.id.as_str(), call.name.as_str()),
        ("call_1", "tool_search")
    );
    assert_eq!(call.arguments, r#"{"query":"weather"}"#);
    let result = &chat.messages[2];
    assert_eq!(result.tool_name.as_deref(), Some("tool_search"));
    assert!(
        result.content.starts_with(
            r#"{"type":"function","function":{"name":"mcp__wx.lookup_weather","description":"Look up ü.","parameters":{"#
        ),
        "{}",
        result.content
    );
    assert!(
        result.content.contains(r#""name":"mcp__wx.raw""#),
        "{}",
        result.content
    );

    use gyre_proxy::output::openai_responses::ResponsesResponse;
    use gyre_proxy::output::{ResponseMeta, StreamItem};
    let meta = ResponseMeta {
        id: "resp_1".into(),
        model: "gpt-5.5".into(),
        created_unix_s: 0,
    };
    let mut response = ResponsesResponse::new(meta).with_search_tools(chat.search_tools);
    let events = response.push(StreamItem::ToolCall {
        id: "call_2",
        name: "tool_search",
        arguments: r#"{"query": "spawn sub agent", "limit": 4}"#,
    });
    let names: Vec<&str> = events.iter().filter_map(|e| e.event.as_deref()).collect();
    assert_eq!(
        names,
        ["response.output_item.added", "response.output_item.done"]
    );
    let done: Value = serde_json::from_str(&events[1].data).expect("json");
    assert_eq!(
        done["item"],
        json!({"id": done["item"]["id"], "type": "tool_search_call", "status": "completed",
               "call_id": "call_2", "execution": "client",
               "arguments": {"query": "spawn sub agent", "limit": 4}})
    );
}

/// The `response` object echoes the request's settings (the OpenAI SDK's
/// `get_final_response().tools` reads them), `usage.input_tokens_details` carries both counts
/// the SDK requires, and an answer the token limit cut ends with its open message item
/// `incomplete`, in the stream and in the body.
#[test]
fn the_response_echoes_the_requests_settings_and_marks_a_cut_message_incomplete() {
    use gyre_proxy::output::openai_responses::ResponsesResponse;
    use gyre_proxy::output::{ResponseMeta, StopReason, StreamItem, Usage};
    let tool = json!({"type": "function", "name": "get_weather", "description": "Weather.",
                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}});
    let body = json!({
        "model": "gpt-5.5", "stream": true, "instructions": "Be brief.",
        "tools": [tool], "tool_choice": "required", "parallel_tool_calls": false,
        "temperature": 0.2, "max_output_tokens": 64, "metadata": {"run": "42"},
        "input": "Weather in Paris?"
    });
    let chat = parse(body.to_string().as_bytes()).expect("parses");
    let meta = ResponseMeta {
        id: "resp_1".into(),
        model: "gpt-5.5".into(),
        created_unix_s: 7,
    };
    let mut response = ResponsesResponse::new(meta).with_settings(chat.response_settings);
    let start = response.start();
    let created: Value = serde_json::from_str(&start[0].data).expect("json");
    let echoed = &created["response"];
    assert_eq!(echoed["tools"], json!([tool]));
    assert_eq!(echoed["tool_choice"], "required");
    assert_eq!(echoed["parallel_tool_calls"], false);
    assert_eq!(echoed["instructions"], "Be brief.");
    assert_eq!(echoed["temperature"], 0.2);
    assert_eq!(echoed["top_p"], 1.0, "the default of a setting left out");
    assert_eq!(echoed["max_output_tokens"], 64);
    assert_eq!(echoed["metadata"], json!({"run": "42"}));
    assert_eq!(echoed["completed_at"], Value::Null);
    let mut events = response.push(StreamItem::TextDelta("It is sun"));
    response.set_completed_at(9);
    let usage = Usage {
        input_tokens: 5,
        cached_input_tokens: 2,
        output_tokens: 64,
        reasoning_tokens: 0,
    };
    let body = response.response_json(&StopReason::MaxTokens, &usage);
    events.extend(response.finish(&StopReason::MaxTokens, &usage));
    let last: Value = serde_json::from_str(&events.last().expect("events").data).expect("json");
    assert_eq!(last["type"], "response.incomplete");
    for (what, object) in [("stream", &last["response"]), ("body", &body)] {
        assert_eq!(object["status"], "incomplete", "{what}");
        assert_eq!(
            object["output"][0]["status"], "incomplete",
            "{what}: {object}"
        );
        assert_eq!(object["tools"], json!([tool]), "{what}");
        // Only a completed response has a completion time.
        assert_eq!(object["completed_at"], Value::Null, "{what}");
        assert_eq!(
            object["usage"]["input_tokens_details"],
            json!({"cached_tokens": 2, "cache_write_tokens": 0}),
            "{what}"
        );
    }
    let item_done = events
        .iter()
        .find(|e| e.event.as_deref() == Some("response.output_item.done"))
        .expect("the message item closes");
    let item_done: Value = serde_json::from_str(&item_done.data).expect("json");
    assert_eq!(item_done["item"]["status"], "incomplete");

    let meta = ResponseMeta {
        id: "resp_2".into(),
        model: "gpt-5.5".into(),
        created_unix_s: 7,
    };
    let mut response = ResponsesResponse::new(meta);
    response.push(StreamItem::TextDelta("Sunny."));
    response.set_completed_at(9);
    let body = response.response_json(&StopReason::EndTurn, &usage);
    let events = response.finish(&StopReason::EndTurn, &usage);
    let last: Value = serde_json::from_str(&events.last().expect("events").data).expect("json");
    for (what, object) in [("stream", &last["response"]), ("body", &body)] {
        assert_eq!(object["status"], "completed", "{what}");
        assert_eq!(object["completed_at"], 9, "{what}");
    }
}

/// Items of Codex's newer history: a message between agents of one session, a settings
/// change kept in history (skipped: the request's own fields apply), a compaction under its
/// newer name, and a sealed tool output.
#[test]
fn codex_agent_messages_settings_records_and_sealed_outputs_are_read() {
    let body = json!({
        "model": "m",
        "input": [
            {"role": "user", "content": "delegate"},
            {"type": "configuration_update", "reasoning": {"effort": "medium"}},
            {"type": "function_call", "call_id": "call_1", "name": "wait", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1",
             "output": [{"type": "encrypted_content", "encrypted_content": "opaque"}]},
            {"type": "agent_message", "author": "/root/worker", "recipient": "/root",
             "content": [{"type": "input_text", "text": "done"}]},
        ],
    });
    let chat = parse(body.to_string().as_bytes()).expect("parses");
    let texts: Vec<(Role, &str)> = chat
        .messages
        .iter()
        .map(|message| (message.role, message.content.as_str()))
        .collect();
    assert_eq!(
        texts,
        [
            (Role::User, "delegate"),
            (Role::Assistant, ""),
            (Role::Tool, "[encrypted content omitted]"),
            (Role::User, "[message from agent /root/worker]\ndone"),
        ]
    );
}

/// `conversation` names a conversation the server would hold; this proxy holds none, so the
/// model would answer without it: refused naming the field. A `generate` that is not a boolean
/// is refused too (only `false`, the warm-up, changes anything).
#[test]
fn conversation_objects_and_non_boolean_generate_are_refused() {
    for value in [json!("conv_123"), json!({"id": "conv_123"})] {
        let error = rejection(&json!({"model": "m", "input": "hi", "conversation": value}));
        assert_eq!(error.status(), 400);
        assert_eq!(error.param.as_deref(), Some("conversation"));
        assert!(
            error
                .message
                .starts_with("conversation: not supported by this proxy"),
            "{}",
            error.message
        );
    }
    let error = rejection(&json!({"model": "m", "input": "hi", "generate": "no"}));
    assert_eq!(error.param.as_deref(), Some("generate"));
    assert_eq!(error.message, "generate: expected a boolean, got a string");
    for generate in [json!(false), json!(true), Value::Null] {
        let request = parse(
            json!({"model": "m", "input": "hi", "generate": generate})
                .to_string()
                .as_bytes(),
        )
        .expect("a boolean is read");
        assert!(!request.unknown_fields.contains(&"generate".to_string()));
    }
}

/// Two tools of one (qualified) name make a call by that name ambiguous; a tool without a
/// name cannot be called. Refused naming the second one's name.
#[test]
fn duplicate_or_empty_tool_names_are_refused() {
    let function =
        |name: &str| json!({"type": "function", "name": name, "parameters": {"type": "object"}});
    let body = |tools: Value| json!({"model": "m", "input": "hi", "tools": tools});
    let error = rejection(&body(json!([function("shell"), function("shell")])));
    assert_eq!(error.param.as_deref(), Some("tools[1].name"));
    assert_eq!(
        error.message,
        "tools[1].name: tool name `shell` is used twice (first at `tools[0].name`); tool names must be unique"
    );
    let freeform = json!({"type": "custom", "name": "shell"});
    let error = rejection(&body(json!([function("shell"), freeform])));
    assert_eq!(error.param.as_deref(), Some("tools[1].name"));
    let namespace = |names: &[&str]| {
        json!({"type": "namespace", "name": "multi_agent_v1",
               "tools": names.iter().map(|name| function(name)).collect::<Vec<_>>()})
    };
    let error = rejection(&body(json!([namespace(&["spawn_agent", "spawn_agent"])])));
    assert_eq!(error.param.as_deref(), Some("tools[0].tools[1].name"));
    assert!(
        error
            .message
            .contains("`multi_agent_v1.spawn_agent` is used twice"),
        "{}",
        error.message
    );
    let error = rejection(&body(json!([function("")])));
    assert_eq!(
        error.message,
        "tools[0].name: a tool name must not be empty"
    );
    // The same function name in and out of a namespace is two tools.
    parse(
        body(json!([
            function("spawn_agent"),
            namespace(&["spawn_agent"])
        ]))
        .to_string()
        .as_bytes(),
    )
    .expect("distinct qualified names");
}
