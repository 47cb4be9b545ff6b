//! Strict stream clients (oracles): each validates one API's event sequence the way a picky
//! client would and reassembles the non-streaming body from it. Property tests drive the
//! incremental builders with arbitrary piece sequences and require (1) a well-formed stream and
//! (2) a reassembled body equal to the builder's own non-streaming body. Each oracle has a test
//! showing it rejects a malformed stream (Claude Code falls back to `stream:false` on one).

use gyre_proxy::output::anthropic::AnthropicResponse;
use gyre_proxy::output::openai_chat::ChatCompletionResponse;
use gyre_proxy::output::openai_responses::ResponsesResponse;
use gyre_proxy::output::sse::SseEvent;
use gyre_proxy::output::{ResponseMeta, StopReason, StreamItem, Usage};
use proptest::prelude::*;
use serde_json::{json, Value};

fn data(event: &SseEvent) -> Result<Value, String> {
    event
        .json()
        .ok_or_else(|| format!("data is not JSON: {}", event.data))
}

/// Anthropic: message_start first; blocks started in index order; deltas only for the open
/// block and of its type; exactly one ping; message_delta then message_stop last.
pub fn anthropic_client(events: &[SseEvent]) -> Result<Value, String> {
    let mut message: Option<Value> = None;
    let mut open: Option<(usize, Value, String)> = None;
    let mut pings = 0;
    let mut stopped = false;
    let mut delta_seen = false;
    for event in events {
        let name = event
            .event
            .as_deref()
            .ok_or("an Anthropic event has a name")?;
        let payload = data(event)?;
        if payload["type"] != name {
            return Err(format!("event {name} carries type {}", payload["type"]));
        }
        if stopped {
            return Err(format!("{name} after message_stop"));
        }
        match name {
            "message_start" => {
                if message.is_some() {
                    return Err("second message_start".into());
                }
                message = Some(payload["message"].clone());
            }
            "ping" => pings += 1,
            "content_block_start" => {
                let message = message.as_mut().ok_or("block before message_start")?;
                if open.is_some() {
                    return Err("block started while another is open".into());
                }
                let index = message["content"].as_array().map_or(0, Vec::len);
                if payload["index"] != index {
                    return Err(format!(
                        "block index {} but expected {index}",
                        payload["index"]
                    ));
                }
                open = Some((index, payload["content_block"].clone(), String::new()));
            }
            "content_block_delta" => {
                let (index, block, partial_json) =
                    open.as_mut().ok_or("delta for an unstarted block")?;
                if payload["index"] != *index {
                    return Err("delta for a block that is not open".into());
                }
                let delta = &payload["delta"];
                match (block["type"].as_str(), delta["type"].as_str()) {
                    (Some("text"), Some("text_delta")) => {
                        let text = format!(
                            "{}{}",
                            block["text"].as_str().unwrap_or_default(),
                            delta["text"].as_str().ok_or("text_delta without text")?
                        );
                        block["text"] = Value::from(text);
                    }
                    (Some("thinking"), Some("thinking_delta")) => {
                        let text = format!(
                            "{}{}",
                            block["thinking"].as_str().unwrap_or_default(),
                            delta["thinking"].as_str().ok_or("no thinking")?
                        );
                        block["thinking"] = Value::from(text);
                    }
                    (Some("thinking"), Some("signature_delta")) => {
                        block["signature"] = delta["signature"].clone();
                    }
                    (Some("tool_use"), Some("input_json_delta")) => {
                        partial_json
                            .push_str(delta["partial_json"].as_str().ok_or("no partial_json")?);
                    }
                    (block_type, delta_type) => {
                        return Err(format!("{delta_type:?} delta in a {block_type:?} block"))
                    }
                }
            }
            "content_block_stop" => {
                let (index, mut block, partial_json) = open.take().ok_or("stop without a block")?;
                if payload["index"] != index {
                    return Err("stop for a block that is not open".into());
                }
                if block["type"] == "tool_use" {
                    block["input"] = serde_json::from_str(&partial_json)
                        .map_err(|error| format!("tool input is not JSON: {error}"))?;
                }
                let message = message.as_mut().ok_or("no message")?;
                message["content"]
                    .as_array_mut()
                    .ok_or("content is a list")?
                    .push(block);
            }
            "message_delta" => {
                if open.is_some() {
                    return Err("message_delta with an open block".into());
                }
                let message = message.as_mut().ok_or("no message")?;
                message["stop_reason"] = payload["delta"]["stop_reason"].clone();
                message["stop_sequence"] = payload["delta"]["stop_sequence"].clone();
                message["usage"] = payload["usage"].clone();
                delta_seen = true;
            }
            "message_stop" => {
                if !delta_seen {
                    return Err("message_stop before message_delta".into());
                }
                stopped = true;
            }
            other => return Err(format!("unknown event {other}")),
        }
    }
    if !stopped {
        return Err("no message_stop".into());
    }
    if pings != 1 {
        return Err(format!("{pings} pings"));
    }
    message.ok_or_else(|| "no message".into())
}

/// Chat Completions: unnamed chunks of one id; the role first; tool-call deltas by index with
/// id/name only on the first; one finish chunk; optional usage chunk; `[DONE]` last.
pub fn openai_chat_client(events: &[SseEvent], include_usage: bool) -> Result<Value, String> {
    let (done, chunks) = events.split_last().ok_or("empty stream")?;
    if done.data != "[DONE]" || done.event.is_some() {
        return Err("the stream does not end with data: [DONE]".into());
    }
    let mut content = String::new();
    let mut reasoning = String::new();
    let mut tool_calls: Vec<Value> = Vec::new();
    let mut finish_reason = Value::Null;
    let mut usage = Value::Null;
    for (position, event) in chunks.iter().enumerate() {
        if event.event.is_some() {
            return Err("a Chat Completions event has a name".into());
        }
        let chunk = data(event)?;
        if chunk["object"] != "chat.completion.chunk" {
            return Err("not a chunk".into());
        }
        if include_usage != chunk.get("usage").is_some() {
            return Err("usage field presence does not follow include_usage".into());
        }
        let choices = chunk["choices"].as_array().ok_or("no choices")?;
        if choices.is_empty() {
            if !include_usage || position + 1 != chunks.len() || finish_reason.is_null() {
                return Err("an empty-choices chunk that is not the final usage chunk".into());
            }
            usage = chunk["usage"].clone();
            continue;
        }
        if !finish_reason.is_null() {
            return Err("a choice chunk after the finish chunk".into());
        }
        let delta = &choices[0]["delta"];
        if (position == 0) != delta.get("role").is_some() {
            return Err("the role comes in the first chunk only".into());
        }
        if let Some(text) = delta["content"].as_str() {
            content.push_str(text);
        }
        if let Some(text) = delta["reasoning_content"].as_str() {
            reasoning.push_str(text);
        }
        if let Some(calls) = delta["tool_calls"].as_array() {
            for call in calls {
                let index = call["index"].as_u64().ok_or("tool call without index")? as usize;
                if index == tool_calls.len() {
                    if call["id"].is_null() || call["function"]["name"].is_null() {
                        return Err("a new tool call without id or name".into());
                    }
                    tool_calls.push(json!({
                        "id": call["id"], "type": "function",
                        "function": {"name": call["function"]["name"], "arguments": ""},
                    }));
                } else if index + 1 != tool_calls.len() || call.get("id").is_some() {
                    return Err("tool call deltas out of order".into());
                }
                let arguments = format!(
                    "{}{}",
                    tool_calls[index]["function"]["arguments"]
                        .as_str()
                        .unwrap_or_default(),
                    call["function"]["arguments"].as_str().unwrap_or_default()
                );
                tool_calls[index]["function"]["arguments"] = Value::from(arguments);
            }
        }
        finish_reason = choices[0]["finish_reason"].clone();
    }
    if finish_reason.is_null() {
        return Err("no finish_reason".into());
    }
    let mut message = json!({
        "role": "assistant",
        "content": if content.is_empty() && !tool_calls.is_empty() { Value::Null } else { Value::from(content) },
    });
    if !reasoning.is_empty() {
        message["reasoning_content"] = Value::from(reasoning);
    }
    if !tool_calls.is_empty() {
        message["tool_calls"] = Value::Array(tool_calls);
    }
    Ok(json!({"message": message, "finish_reason": finish_reason, "usage": usage}))
}

/// Responses: named events, `type` equal to the name, `sequence_number` 0, 1, 2, …; items
/// added and done in output order with nothing interleaved; deltas for the open item only;
/// a terminal `response.completed` / `response.incomplete` whose output equals the items done.
pub fn openai_responses_client(events: &[SseEvent]) -> Result<Value, String> {
    let mut items: Vec<Value> = Vec::new();
    let mut open: Option<(u64, Value, String)> = None;
    let mut terminal: Option<Value> = None;
    for (position, event) in events.iter().enumerate() {
        let name = event
            .event
            .as_deref()
            .ok_or("a Responses event has a name")?;
        let payload = data(event)?;
        if payload["type"] != name {
            return Err(format!("event {name} carries type {}", payload["type"]));
        }
        if payload["sequence_number"] != position as u64 {
            return Err(format!(
                "sequence_number {} at position {position}",
                payload["sequence_number"]
            ));
        }
        if terminal.is_some() {
            return Err("event after the terminal event".into());
        }
        if position < 2 {
            let wanted = ["response.created", "response.in_progress"][position];
            if name != wanted {
                return Err(format!("{name} where {wanted} belongs"));
            }
            continue;
        }
        let output_index = payload["output_index"].as_u64();
        match name {
            "response.output_item.added" => {
                if open.is_some() || output_index != Some(items.len() as u64) {
                    return Err("item added out of order".into());
                }
                open = Some((items.len() as u64, payload["item"].clone(), String::new()));
            }
            "response.output_text.delta"
            | "response.reasoning_summary_text.delta"
            | "response.function_call_arguments.delta" => {
                let (index, item, text) = open.as_mut().ok_or("delta without an open item")?;
                if output_index != Some(*index) || payload["item_id"] != item["id"] {
                    return Err("delta for an item that is not open".into());
                }
                let kind = match name {
                    "response.output_text.delta" => "message",
                    "response.reasoning_summary_text.delta" => "reasoning",
                    _ => "function_call",
                };
                if item["type"] != kind {
                    return Err(format!("{name} in a {} item", item["type"]));
                }
                text.push_str(payload["delta"].as_str().ok_or("delta without text")?);
            }
            "response.content_part.added"
            | "response.content_part.done"
            | "response.output_text.done"
            | "response.reasoning_summary_part.added"
            | "response.reasoning_summary_part.done"
            | "response.reasoning_summary_text.done"
            | "response.function_call_arguments.done" => {
                let (index, item, text) = open.as_ref().ok_or("part event without an open item")?;
                if output_index != Some(*index) || payload["item_id"] != item["id"] {
                    return Err("part event for an item that is not open".into());
                }
                for key in ["text", "arguments"] {
                    if let Some(full) = payload[key].as_str() {
                        if full != text {
                            return Err(format!("{name} {key} differs from the deltas"));
                        }
                    }
                }
            }
            "response.output_item.done" => {
                let (index, added, text) = open.take().ok_or("done without an open item")?;
                let item = payload["item"].clone();
                if output_index != Some(index) || item["id"] != added["id"] {
                    return Err("done for an item that is not open".into());
                }
                let streamed = match item["type"].as_str() {
                    Some("message") => &item["content"][0]["text"],
                    Some("reasoning") => &item["summary"][0]["text"],
                    Some("function_call") => &item["arguments"],
                    _ => return Err("unknown item type".into()),
                };
                if streamed.as_str() != Some(text.as_str()) {
                    return Err("the done item differs from its deltas".into());
                }
                items.push(item);
            }
            "response.completed" | "response.incomplete" => {
                if open.is_some() {
                    return Err("terminal event with an open item".into());
                }
                let response = payload["response"].clone();
                if response["output"] != Value::Array(items.clone()) {
                    return Err("the final output differs from the items done".into());
                }
                terminal = Some(response);
            }
            other => return Err(format!("unknown event {other}")),
        }
    }
    terminal.ok_or_else(|| "no terminal event".into())
}

fn meta() -> ResponseMeta {
    ResponseMeta {
        id: "resp_9".into(),
        model: "m".into(),
        created_unix_s: 7,
    }
}

/// Owned stream items, as a strategy can produce them.
#[derive(Clone, Debug)]
enum Piece {
    Reasoning(String),
    ReasoningEnd(String),
    Text(String),
    Call(String, String, String),
}

impl Piece {
    fn item(&self) -> StreamItem<'_> {
        match self {
            Piece::Reasoning(text) => StreamItem::ReasoningDelta(text),
            Piece::ReasoningEnd(handle) => StreamItem::ReasoningEnd { handle },
            Piece::Text(text) => StreamItem::TextDelta(text),
            Piece::Call(id, name, arguments) => StreamItem::ToolCall {
                id,
                name,
                arguments,
            },
        }
    }
}

fn pieces() -> impl Strategy<Value = Vec<Piece>> {
    let text = "[a-zé \n\"<>{}]{0,6}";
    let arguments = prop_oneof![
        Just("{}".to_string()),
        Just(r#"{"a": 1,  "b":"caf\u00e9"}"#.to_string()),
        Just("{\n  \"cmd\": [\"ls\", \"-la\"]\n}".to_string()),
    ];
    let piece = prop_oneof![
        text.prop_map(Piece::Reasoning),
        "[A-Za-z0-9=]{0,8}".prop_map(Piece::ReasoningEnd),
        text.prop_map(Piece::Text),
        ("[a-z0-9_]{1,8}", "[A-Za-z]{1,6}", arguments)
            .prop_map(|(id, name, arguments)| Piece::Call(id, name, arguments)),
    ];
    proptest::collection::vec(piece, 0..10)
}

fn stop_reason() -> impl Strategy<Value = StopReason> {
    prop_oneof![
        Just(StopReason::EndTurn),
        Just(StopReason::ToolUse),
        Just(StopReason::MaxTokens),
        "[A-Z]{1,3}".prop_map(StopReason::StopSequence),
    ]
}

const USAGE: Usage = Usage {
    input_tokens: 50,
    cached_input_tokens: 10,
    output_tokens: 9,
    reasoning_tokens: 2,
};

proptest! {
    #[test]
    fn anthropic_streams_reassemble_to_the_message(pieces in pieces(), stop in stop_reason()) {
        let mut response = AnthropicResponse::new(meta(), USAGE);
        let mut events = response.start();
        for piece in &pieces {
            events.extend(response.push(piece.item()));
        }
        let body = response.message_json(&stop, &USAGE);
        events.extend(response.finish(&stop, &USAGE));
        let reassembled = anthropic_client(&events).map_err(TestCaseError::fail)?;
        prop_assert_eq!(reassembled, body);
    }

    #[test]
    fn chat_streams_reassemble_to_the_completion(
        pieces in pieces(),
        stop in stop_reason(),
        include_usage in any::<bool>(),
    ) {
        let mut response = ChatCompletionResponse::new(meta(), include_usage);
        let mut events = response.start();
        for piece in &pieces {
            events.extend(response.push(piece.item()));
        }
        let body = response.completion_json(&stop, &USAGE);
        events.extend(response.finish(&stop, &USAGE));
        let reassembled = openai_chat_client(&events, include_usage).map_err(TestCaseError::fail)?;
        prop_assert_eq!(&reassembled["message"], &body["choices"][0]["message"]);
        prop_assert_eq!(&reassembled["finish_reason"], &body["choices"][0]["finish_reason"]);
        if include_usage {
            prop_assert_eq!(&reassembled["usage"], &body["usage"]);
        }
    }

    #[test]
    fn responses_streams_reassemble_to_the_response(pieces in pieces(), stop in stop_reason()) {
        let mut response = ResponsesResponse::new(meta());
        let mut events = response.start();
        for piece in &pieces {
            events.extend(response.push(piece.item()));
        }
        events.extend(response.finish(&stop, &USAGE));
        let reassembled = openai_responses_client(&events).map_err(TestCaseError::fail)?;
        // The non-streaming body of a finished response is its terminal response object.
        prop_assert_eq!(&reassembled, &response.response_json(&stop, &USAGE));
        prop_assert_eq!(reassembled["status"] == "incomplete", stop == StopReason::MaxTokens);
    }
}

#[test]
fn the_anthropic_client_rejects_a_delta_for_an_unstarted_block() {
    // The research fake's `malformed` scenario, which makes Claude Code retry without streaming.
    let mut response = AnthropicResponse::new(meta(), USAGE);
    let mut events = response.start();
    events.push(SseEvent::named(
        "content_block_delta",
        json!({"type": "content_block_delta", "index": 7, "delta": {"type": "text_delta", "text": "orphan"}}),
    ));
    events.extend(response.finish(&StopReason::EndTurn, &USAGE));
    assert_eq!(
        anthropic_client(&events).expect_err("malformed"),
        "delta for an unstarted block"
    );
}

#[test]
fn the_chat_client_rejects_a_stream_without_done() {
    let mut response = ChatCompletionResponse::new(meta(), false);
    let mut events = response.start();
    events.extend(response.finish(&StopReason::EndTurn, &USAGE));
    events.pop();
    assert!(openai_chat_client(&events, false).is_err());
}

#[test]
fn the_responses_client_rejects_a_sequence_gap() {
    let mut response = ResponsesResponse::new(meta());
    let mut events = response.start();
    events.extend(response.push(StreamItem::TextDelta("hi")));
    events.remove(3);
    events.extend(response.finish(&StopReason::EndTurn, &USAGE));
    assert!(openai_responses_client(&events)
        .expect_err("a gap")
        .starts_with("sequence_number"));
}
