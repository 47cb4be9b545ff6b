//! Anthropic Messages responses: the non-streaming message JSON and the SSE sequence
//! `message_start`, then per block `content_block_start` (the first one followed by `ping`),
//! deltas (`thinking_delta` … `signature_delta`, `text_delta`, `input_json_delta` starting with
//! an empty `partial_json`), `content_block_stop`, then `message_delta` (stop reason, cumulative
//! usage) and `message_stop` — the order the API documents and Claude Code accepts.

use serde_json::{json, Value};

use super::sse::SseEvent;
use super::{arguments_object, ResponseBlock, ResponseMeta, StopReason, StreamItem, Usage};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OpenBlock {
    Thinking,
    Text,
}

/// Builds one response as pieces arrive; `events_*` methods give the SSE events to send, and
/// [`AnthropicResponse::message_json`] the non-streaming body.
#[derive(Clone, Debug)]
pub struct AnthropicResponse {
    meta: ResponseMeta,
    usage_at_start: Usage,
    /// The finished content blocks, in API shape.
    content: Vec<Value>,
    open: Option<OpenBlock>,
    open_text: String,
    pinged: bool,
}

fn usage_json(usage: &Usage) -> Value {
    json!({
        "input_tokens": usage.input_tokens.saturating_sub(usage.cached_input_tokens),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": usage.cached_input_tokens,
        "output_tokens": usage.output_tokens,
    })
}

impl AnthropicResponse {
    /// `usage` at start: the prompt counts (output 0), as `message_start` reports them.
    pub fn new(meta: ResponseMeta, usage_at_start: Usage) -> Self {
        Self {
            meta,
            usage_at_start,
            content: Vec::new(),
            open: None,
            open_text: String::new(),
            pinged: false,
        }
    }

    /// `message_start`.
    pub fn start(&mut self) -> Vec<SseEvent> {
        vec![SseEvent::named(
            "message_start",
            json!({
                "type": "message_start",
                "message": {
                    "id": self.meta.id,
                    "type": "message",
                    "role": "assistant",
                    "model": self.meta.model,
                    "content": [],
                    "stop_reason": null,
                    "stop_sequence": null,
                    "usage": usage_json(&Usage { output_tokens: 0, ..self.usage_at_start }),
                },
            }),
        )]
    }

    fn index(&self) -> usize {
        self.content.len()
    }

    fn block_start(&mut self, block: Value, events: &mut Vec<SseEvent>) {
        events.push(SseEvent::named(
            "content_block_start",
            json!({"type": "content_block_start", "index": self.index(), "content_block": block}),
        ));
        if !self.pinged {
            self.pinged = true;
            events.push(SseEvent::named("ping", json!({"type": "ping"})));
        }
    }

    fn delta(&self, delta: Value) -> SseEvent {
        SseEvent::named(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": self.index(), "delta": delta}),
        )
    }

    fn block_stop(&mut self, block: Value, events: &mut Vec<SseEvent>) {
        events.push(SseEvent::named(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": self.index()}),
        ));
        self.content.push(block);
    }

    /// Closes an open text block (thinking blocks close only with their signature).
    fn close_text(&mut self, events: &mut Vec<SseEvent>) {
        if self.open == Some(OpenBlock::Text) {
            self.open = None;
            let text = std::mem::take(&mut self.open_text);
            self.block_stop(json!({"type": "text", "text": text}), events);
        }
    }

    /// Feeds one piece; returns the events to send now.
    pub fn push(&mut self, item: StreamItem<'_>) -> Vec<SseEvent> {
        let mut events = Vec::new();
        match item {
            StreamItem::ReasoningDelta(text) => {
                if self.open != Some(OpenBlock::Thinking) {
                    self.close_text(&mut events);
                    self.open = Some(OpenBlock::Thinking);
                    self.block_start(
                        json!({"type": "thinking", "thinking": "", "signature": ""}),
                        &mut events,
                    );
                }
                if !text.is_empty() {
                    self.open_text.push_str(text);
                    events.push(self.delta(json!({"type": "thinking_delta", "thinking": text})));
                }
            }
            StreamItem::ReasoningEnd { handle } => {
                if self.open != Some(OpenBlock::Thinking) {
                    self.close_text(&mut events);
                    self.block_start(
                        json!({"type": "thinking", "thinking": "", "signature": ""}),
                        &mut events,
                    );
                }
                self.open = None;
                events.push(self.delta(json!({"type": "signature_delta", "signature": handle})));
                let thinking = std::mem::take(&mut self.open_text);
                self.block_stop(
                    json!({"type": "thinking", "thinking": thinking, "signature": handle}),
                    &mut events,
                );
            }
            StreamItem::TextDelta(text) => {
                if text.is_empty() {
                    return events;
                }
                if self.open == Some(OpenBlock::Thinking) {
                    // Reasoning must be closed with its handle first; the server always sends
                    // ReasoningEnd. Close it unsigned rather than emit a malformed stream.
                    events.extend(self.push(StreamItem::ReasoningEnd { handle: "" }));
                }
                if self.open != Some(OpenBlock::Text) {
                    self.open = Some(OpenBlock::Text);
                    self.block_start(json!({"type": "text", "text": ""}), &mut events);
                }
                self.open_text.push_str(text);
                events.push(self.delta(json!({"type": "text_delta", "text": text})));
            }
            StreamItem::ToolCall {
                id,
                name,
                arguments,
            } => {
                if self.open == Some(OpenBlock::Thinking) {
                    events.extend(self.push(StreamItem::ReasoningEnd { handle: "" }));
                }
                self.close_text(&mut events);
                self.block_start(
                    json!({"type": "tool_use", "id": id, "name": name, "input": {}}),
                    &mut events,
                );
                events.push(self.delta(json!({"type": "input_json_delta", "partial_json": ""})));
                if !arguments.is_empty() {
                    events.push(
                        self.delta(json!({"type": "input_json_delta", "partial_json": arguments})),
                    );
                }
                self.block_stop(
                    json!({"type": "tool_use", "id": id, "name": name, "input": arguments_object(arguments)}),
                    &mut events,
                );
            }
        }
        events
    }

    /// Closes open blocks; `message_delta` and `message_stop`.
    pub fn finish(&mut self, stop: &StopReason, usage: &Usage) -> Vec<SseEvent> {
        let mut events = Vec::new();
        if self.open == Some(OpenBlock::Thinking) {
            events.extend(self.push(StreamItem::ReasoningEnd { handle: "" }));
        }
        self.close_text(&mut events);
        if !self.pinged {
            self.pinged = true;
            events.push(SseEvent::named("ping", json!({"type": "ping"})));
        }
        events.push(SseEvent::named(
            "message_delta",
            json!({
                "type": "message_delta",
                "delta": {"stop_reason": stop.anthropic(), "stop_sequence": stop.stop_sequence()},
                "usage": usage_json(usage),
            }),
        ));
        events.push(SseEvent::named(
            "message_stop",
            json!({"type": "message_stop"}),
        ));
        events
    }

    /// The non-streaming message, from the pieces pushed so far (open blocks included).
    pub fn message_json(&self, stop: &StopReason, usage: &Usage) -> Value {
        let mut content = self.content.clone();
        match self.open {
            Some(OpenBlock::Text) => {
                content.push(json!({"type": "text", "text": self.open_text}));
            }
            Some(OpenBlock::Thinking) => {
                content
                    .push(json!({"type": "thinking", "thinking": self.open_text, "signature": ""}));
            }
            None => {}
        }
        json!({
            "id": self.meta.id,
            "type": "message",
            "role": "assistant",
            "model": self.meta.model,
            "content": content,
            "stop_reason": stop.anthropic(),
            "stop_sequence": stop.stop_sequence(),
            "usage": usage_json(usage),
        })
    }
}

/// One-shot: the non-streaming message body.
pub fn message_json(
    meta: &ResponseMeta,
    blocks: &[ResponseBlock],
    stop: &StopReason,
    usage: &Usage,
) -> Value {
    let mut response = AnthropicResponse::new(meta.clone(), *usage);
    for block in blocks {
        for item in block.stream_items() {
            response.push(item);
        }
    }
    response.message_json(stop, usage)
}

/// One-shot: the whole SSE sequence.
pub fn stream_events(
    meta: &ResponseMeta,
    blocks: &[ResponseBlock],
    stop: &StopReason,
    usage: &Usage,
) -> Vec<SseEvent> {
    let mut response = AnthropicResponse::new(meta.clone(), *usage);
    let mut events = response.start();
    for block in blocks {
        for item in block.stream_items() {
            events.extend(response.push(item));
        }
    }
    events.extend(response.finish(stop, usage));
    events
}
