//! Response builders: exact wire snapshots of each API's stream and body for one answer, and
//! property tests that a client reassembling any stream gets exactly the non-streaming body.

use expect_test::{expect, Expect};
use gyre_proxy::output::sse::{to_wire, SseEvent};
use gyre_proxy::output::{
    anthropic, openai_chat, openai_responses, ResponseBlock, ResponseMeta, StopReason, Usage,
};

fn meta(id: &str) -> ResponseMeta {
    ResponseMeta {
        id: id.into(),
        model: "test-model".into(),
        created_unix_s: 1_796_212_800,
    }
}

fn usage() -> Usage {
    Usage {
        input_tokens: 120,
        cached_input_tokens: 100,
        output_tokens: 17,
        reasoning_tokens: 3,
    }
}

fn answer() -> Vec<ResponseBlock> {
    vec![
        ResponseBlock::Reasoning {
            text: "Plan.".into(),
            handle: "gyre-sig-1".into(),
        },
        ResponseBlock::Text("Listing.".into()),
        ResponseBlock::ToolCall {
            id: "toolu_1".into(),
            name: "Bash".into(),
            arguments: r#"{"command": "ls",  "x":"caf\u00e9"}"#.into(),
        },
    ]
}

fn check(events: &[SseEvent], expected: Expect) {
    expected.assert_eq(&to_wire(events));
}

#[test]
fn anthropic_stream_wire() {
    let events =
        anthropic::stream_events(&meta("msg_1"), &answer(), &StopReason::ToolUse, &usage());
    check(
        &events,
        expect![[r#"
            event: message_start
            data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"test-model","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":20,"cache_creation_input_tokens":0,"cache_read_input_tokens":100,"output_tokens":0}}}

            event: content_block_start
            data: {"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}

            event: ping
            data: {"type":"ping"}

            event: content_block_delta
            data: {"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Plan."}}

            event: content_block_delta
            data: {"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"gyre-sig-1"}}

            event: content_block_stop
            data: {"type":"content_block_stop","index":0}

            event: content_block_start
            data: {"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}

            event: content_block_delta
            data: {"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Listing."}}

            event: content_block_stop
            data: {"type":"content_block_stop","index":1}

            event: content_block_start
            data: {"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_1","name":"Bash","input":{}}}

            event: content_block_delta
            data: {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":""}}

            event: content_block_delta
            data: {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"command\": \"ls\",  \"x\":\"caf\\u00e9\"}"}}

            event: content_block_stop
            data: {"type":"content_block_stop","index":2}

            event: message_delta
            data: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"input_tokens":20,"cache_creation_input_tokens":0,"cache_read_input_tokens":100,"output_tokens":17}}

            event: message_stop
            data: {"type":"message_stop"}

        "#]],
    );
}

#[test]
fn anthropic_message_body() {
    let body = anthropic::message_json(&meta("msg_1"), &answer(), &StopReason::ToolUse, &usage());
    expect![[r#"{"id":"msg_1","type":"message","role":"assistant","model":"test-model","content":[{"type":"thinking","thinking":"Plan.","signature":"gyre-sig-1"},{"type":"text","text":"Listing."},{"type":"tool_use","id":"toolu_1","name":"Bash","input":{"command":"ls","x":"café"}}],"stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":20,"cache_creation_input_tokens":0,"cache_read_input_tokens":100,"output_tokens":17}}"#]]
        .assert_eq(&body.to_string());
}

#[test]
fn openai_chat_stream_wire_and_body() {
    let events = openai_chat::stream_events(
        &meta("chatcmpl-1"),
        &answer(),
        &StopReason::ToolUse,
        &usage(),
        true,
    );
    check(
        &events,
        expect![[r#"
            data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1796212800,"model":"test-model","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"usage":null}

            data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1796212800,"model":"test-model","choices":[{"index":0,"delta":{"reasoning_content":"Plan."},"logprobs":null,"finish_reason":null}],"usage":null}

            data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1796212800,"model":"test-model","choices":[{"index":0,"delta":{"content":"Listing."},"logprobs":null,"finish_reason":null}],"usage":null}

            data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1796212800,"model":"test-model","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"toolu_1","type":"function","function":{"name":"Bash","arguments":""}}]},"logprobs":null,"finish_reason":null}],"usage":null}

            data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1796212800,"model":"test-model","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"command\": \"ls\",  \"x\":\"caf\\u00e9\"}"}}]},"logprobs":null,"finish_reason":null}],"usage":null}

            data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1796212800,"model":"test-model","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"tool_calls"}],"usage":null}

            data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1796212800,"model":"test-model","choices":[],"usage":{"prompt_tokens":120,"completion_tokens":17,"total_tokens":137,"prompt_tokens_details":{"cached_tokens":100},"completion_tokens_details":{"reasoning_tokens":3}}}

            data: [DONE]

        "#]],
    );
    let body = openai_chat::completion_json(
        &meta("chatcmpl-1"),
        &answer(),
        &StopReason::ToolUse,
        &usage(),
    );
    expect![[r#"{"id":"chatcmpl-1","object":"chat.completion","created":1796212800,"model":"test-model","choices":[{"index":0,"message":{"role":"assistant","content":"Listing.","reasoning_content":"Plan.","tool_calls":[{"id":"toolu_1","type":"function","function":{"name":"Bash","arguments":"{\"command\": \"ls\",  \"x\":\"caf\\u00e9\"}"}}]},"logprobs":null,"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":120,"completion_tokens":17,"total_tokens":137,"prompt_tokens_details":{"cached_tokens":100},"completion_tokens_details":{"reasoning_tokens":3}}}"#]]
        .assert_eq(&body.to_string());
}

#[test]
fn openai_responses_stream_wire() {
    let events =
        openai_responses::stream_events(&meta("resp_1"), &answer(), &StopReason::ToolUse, &usage());
    check(
        &events,
        expect![[r#"
            event: response.created
            data: {"type":"response.created","response":{"id":"resp_1","object":"response","created_at":1796212800,"status":"in_progress","completed_at":null,"error":null,"incomplete_details":null,"model":"test-model","output":[],"parallel_tool_calls":true,"tool_choice":"auto","tools":[],"usage":null},"sequence_number":0}

            event: response.in_progress
            data: {"type":"response.in_progress","response":{"id":"resp_1","object":"response","created_at":1796212800,"status":"in_progress","completed_at":null,"error":null,"incomplete_details":null,"model":"test-model","output":[],"parallel_tool_calls":true,"tool_choice":"auto","tools":[],"usage":null},"sequence_number":1}

            event: response.output_item.added
            data: {"type":"response.output_item.added","output_index":0,"item":{"id":"rs_1_0","type":"reasoning","summary":[]},"sequence_number":2}

            event: response.reasoning_summary_part.added
            data: {"type":"response.reasoning_summary_part.added","item_id":"rs_1_0","output_index":0,"summary_index":0,"part":{"type":"summary_text","text":""},"sequence_number":3}

            event: response.reasoning_summary_text.delta
            data: {"type":"response.reasoning_summary_text.delta","item_id":"rs_1_0","output_index":0,"summary_index":0,"delta":"Plan.","sequence_number":4}

            event: response.reasoning_summary_text.done
            data: {"type":"response.reasoning_summary_text.done","item_id":"rs_1_0","output_index":0,"summary_index":0,"text":"Plan.","sequence_number":5}

            event: response.reasoning_summary_part.done
            data: {"type":"response.reasoning_summary_part.done","item_id":"rs_1_0","output_index":0,"summary_index":0,"part":{"type":"summary_text","text":"Plan."},"sequence_number":6}

            event: response.output_item.done
            data: {"type":"response.output_item.done","output_index":0,"item":{"id":"rs_1_0","type":"reasoning","summary":[{"type":"summary_text","text":"Plan."}],"encrypted_content":"gyre-sig-1"},"sequence_number":7}

            event: response.output_item.added
            data: {"type":"response.output_item.added","output_index":1,"item":{"id":"msg_1_1","type":"message","status":"in_progress","role":"assistant","content":[]},"sequence_number":8}

            event: response.content_part.added
            data: {"type":"response.content_part.added","item_id":"msg_1_1","output_index":1,"content_index":0,"part":{"type":"output_text","text":"","annotations":[]},"sequence_number":9}

            event: response.output_text.delta
            data: {"type":"response.output_text.delta","item_id":"msg_1_1","output_index":1,"content_index":0,"delta":"Listing.","logprobs":[],"sequence_number":10}

            event: response.output_text.done
            data: {"type":"response.output_text.done","item_id":"msg_1_1","output_index":1,"content_index":0,"text":"Listing.","logprobs":[],"sequence_number":11}

            event: response.content_part.done
            data: {"type":"response.content_part.done","item_id":"msg_1_1","output_index":1,"content_index":0,"part":{"type":"output_text","text":"Listing.","annotations":[]},"sequence_number":12}

            event: response.output_item.done
            data: {"type":"response.output_item.done","output_index":1,"item":{"id":"msg_1_1","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Listing.","annotations":[]}]},"sequence_number":13}

            event: response.output_item.added
            data: {"type":"response.output_item.added","output_index":2,"item":{"id":"fc_1_2","type":"function_call","status":"in_progress","call_id":"toolu_1","name":"Bash","arguments":""},"sequence_number":14}

            event: response.function_call_arguments.delta
            data: {"type":"response.function_call_arguments.delta","item_id":"fc_1_2","output_index":2,"delta":"{\"command\": \"ls\",  \"x\":\"caf\\u00e9\"}","sequence_number":15}

            event: response.function_call_arguments.done
            data: {"type":"response.function_call_arguments.done","item_id":"fc_1_2","output_index":2,"arguments":"{\"command\": \"ls\",  \"x\":\"caf\\u00e9\"}","sequence_number":16}

            event: response.output_item.done
            data: {"type":"response.output_item.done","output_index":2,"item":{"id":"fc_1_2","type":"function_call","status":"completed","call_id":"toolu_1","name":"Bash","arguments":"{\"command\": \"ls\",  \"x\":\"caf\\u00e9\"}"},"sequence_number":17}

            event: response.completed
            data: {"type":"response.completed","response":{"id":"resp_1","object":"response","created_at":1796212800,"status":"completed","completed_at":null,"error":null,"incomplete_details":null,"model":"test-model","output":[{"id":"rs_1_0","type":"reasoning","summary":[{"type":"summary_text","text":"Plan."}],"encrypted_content":"gyre-sig-1"},{"id":"msg_1_1","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Listing.","annotations":[]}]},{"id":"fc_1_2","type":"function_call","status":"completed","call_id":"toolu_1","name":"Bash","arguments":"{\"command\": \"ls\",  \"x\":\"caf\\u00e9\"}"}],"parallel_tool_calls":true,"tool_choice":"auto","tools":[],"usage":{"input_tokens":120,"input_tokens_details":{"cached_tokens":100,"cache_write_tokens":0},"output_tokens":17,"output_tokens_details":{"reasoning_tokens":3},"total_tokens":137}},"sequence_number":18}

        "#]],
    );
}
