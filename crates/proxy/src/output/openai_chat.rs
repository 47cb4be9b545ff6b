//! OpenAI Chat Completions responses: the `chat.completion` JSON and the `chat.completion.chunk`
//! stream (unnamed `data:` events) ending in `data: [DONE]`.
//!
//! The first chunk carries `role: "assistant"`; reasoning goes out as `reasoning_content`
//! deltas (the vLLM/SGLang extension); each tool call is one chunk with `index`, `id`, `type`
//! and `name` (empty `arguments`) followed by one chunk with the exact argument text; the last
//! choice chunk has the `finish_reason`; with `stream_options.include_usage` every chunk has
//! `usage: null` and a final chunk has `choices: []` and the usage.

use serde_json::{json, Value};

use super::sse::SseEvent;
use super::{ResponseBlock, ResponseMeta, StopReason, StreamItem, Usage};

#[derive(Clone, Debug)]
pub struct ChatCompletionResponse {
    meta: ResponseMeta,
    include_usage: bool,
    content: String,
    reasoning: String,
    tool_calls: Vec<Value>,
    /// `logprobs.content`, when the request asked for log-probs (set before the end).
    logprobs: Option<Vec<Value>>,
    /// The request's freeform (`custom`) tools: their calls go out as `type: "custom"`.
    freeform_tools: Vec<String>,
}

/// One `logprobs.content` entry: the token's text (lossy where it holds part of a character),
/// its exact bytes and its log-prob; no alternatives.
pub fn logprob_entry(bytes: &[u8], logprob: f32) -> Value {
    json!({
        "token": String::from_utf8_lossy(bytes),
        "logprob": logprob,
        "bytes": bytes,
        "top_logprobs": [],
    })
}

fn usage_json(usage: &Usage) -> Value {
    json!({
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.input_tokens + usage.output_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_input_tokens},
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
    })
}

impl ChatCompletionResponse {
    pub fn new(meta: ResponseMeta, include_usage: bool) -> Self {
        Self {
            meta,
            include_usage,
            content: String::new(),
            reasoning: String::new(),
            tool_calls: Vec::new(),
            logprobs: None,
            freeform_tools: Vec::new(),
        }
    }

    /// Names the request's freeform (`custom`) tools: a call of one goes out as
    /// `{"type": "custom", "custom": {"name", "input"}}`, `input` being the text the model
    /// wrote as the function's one string argument.
    pub fn with_freeform_tools(mut self, names: Vec<String>) -> Self {
        self.freeform_tools = names;
        self
    }

    /// The answer's tokens for `logprobs.content` (every sampled token, reasoning and
    /// tool-call text included, as the model wrote them): in the body, or on the stream's
    /// finish chunk.
    pub fn set_logprobs(&mut self, content: Vec<Value>) {
        self.logprobs = Some(content);
    }

    fn logprobs_json(&self) -> Value {
        match &self.logprobs {
            Some(content) => json!({"content": content, "refusal": null}),
            None => Value::Null,
        }
    }

    fn chunk(&self, delta: Value, finish_reason: Option<&str>) -> SseEvent {
        self.chunk_with(delta, finish_reason, Value::Null)
    }

    fn chunk_with(&self, delta: Value, finish_reason: Option<&str>, logprobs: Value) -> SseEvent {
        let mut chunk = json!({
            "id": self.meta.id,
            "object": "chat.completion.chunk",
            "created": self.meta.created_unix_s,
            "model": self.meta.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}],
        });
        if self.include_usage {
            chunk["usage"] = Value::Null;
        }
        SseEvent::unnamed(chunk)
    }

    /// The first chunk: the assistant role.
    pub fn start(&mut self) -> Vec<SseEvent> {
        vec![self.chunk(json!({"role": "assistant", "content": ""}), None)]
    }

    pub fn push(&mut self, item: StreamItem<'_>) -> Vec<SseEvent> {
        match item {
            StreamItem::ReasoningDelta(text) if !text.is_empty() => {
                self.reasoning.push_str(text);
                vec![self.chunk(json!({"reasoning_content": text}), None)]
            }
            StreamItem::TextDelta(text) if !text.is_empty() => {
                self.content.push_str(text);
                vec![self.chunk(json!({"content": text}), None)]
            }
            StreamItem::ReasoningDelta(_)
            | StreamItem::TextDelta(_)
            | StreamItem::ReasoningEnd { .. } => Vec::new(),
            StreamItem::ToolCall {
                id,
                name,
                arguments,
            } => {
                let index = self.tool_calls.len();
                if self.freeform_tools.iter().any(|tool| tool == name) {
                    let input = crate::openai_responses::freeform_input(arguments);
                    let custom = json!({"name": name, "input": input});
                    self.tool_calls
                        .push(json!({"id": id, "type": "custom", "custom": custom}));
                    return vec![self.chunk(
                        json!({"tool_calls": [{
                            "index": index, "id": id, "type": "custom", "custom": custom,
                        }]}),
                        None,
                    )];
                }
                self.tool_calls.push(json!({
                    "id": id,
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }));
                let mut events = vec![self.chunk(
                    json!({"tool_calls": [{
                        "index": index, "id": id, "type": "function",
                        "function": {"name": name, "arguments": ""},
                    }]}),
                    None,
                )];
                if !arguments.is_empty() {
                    events.push(self.chunk(
                        json!({"tool_calls": [{"index": index, "function": {"arguments": arguments}}]}),
                        None,
                    ));
                }
                events
            }
        }
    }

    /// The finish chunk, the usage chunk if asked for, and `[DONE]`.
    pub fn finish(&mut self, stop: &StopReason, usage: &Usage) -> Vec<SseEvent> {
        let mut events =
            vec![self.chunk_with(json!({}), Some(stop.openai_chat()), self.logprobs_json())];
        if self.include_usage {
            events.push(SseEvent::unnamed(json!({
                "id": self.meta.id,
                "object": "chat.completion.chunk",
                "created": self.meta.created_unix_s,
                "model": self.meta.model,
                "choices": [],
                "usage": usage_json(usage),
            })));
        }
        events.push(SseEvent::done());
        events
    }

    /// The non-streaming `chat.completion` body.
    pub fn completion_json(&self, stop: &StopReason, usage: &Usage) -> Value {
        let mut message = json!({
            "role": "assistant",
            "content": if self.content.is_empty() && !self.tool_calls.is_empty() {
                Value::Null
            } else {
                Value::from(self.content.clone())
            },
        });
        if !self.reasoning.is_empty() {
            message["reasoning_content"] = Value::from(self.reasoning.clone());
        }
        if !self.tool_calls.is_empty() {
            message["tool_calls"] = Value::Array(self.tool_calls.clone());
        }
        json!({
            "id": self.meta.id,
            "object": "chat.completion",
            "created": self.meta.created_unix_s,
            "model": self.meta.model,
            "choices": [{
                "index": 0,
                "message": message,
                "logprobs": self.logprobs_json(),
                "finish_reason": stop.openai_chat(),
            }],
            "usage": usage_json(usage),
        })
    }
}

/// One-shot: the non-streaming body.
pub fn completion_json(
    meta: &ResponseMeta,
    blocks: &[ResponseBlock],
    stop: &StopReason,
    usage: &Usage,
) -> Value {
    let mut response = ChatCompletionResponse::new(meta.clone(), false);
    for block in blocks {
        for item in block.stream_items() {
            response.push(item);
        }
    }
    response.completion_json(stop, usage)
}

/// One-shot: the whole chunk stream, `[DONE]` included.
pub fn stream_events(
    meta: &ResponseMeta,
    blocks: &[ResponseBlock],
    stop: &StopReason,
    usage: &Usage,
    include_usage: bool,
) -> Vec<SseEvent> {
    let mut response = ChatCompletionResponse::new(meta.clone(), include_usage);
    let mut events = response.start();
    for block in blocks {
        for item in block.stream_items() {
            events.extend(response.push(item));
        }
    }
    events.extend(response.finish(stop, usage));
    events
}
