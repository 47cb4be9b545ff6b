//! OpenAI Responses responses: the `response` JSON and its named SSE events, every one with a
//! `sequence_number`, no `[DONE]`:
//! `response.created`, `response.in_progress`, then per output item
//! `response.output_item.added` → (reasoning: `response.reasoning_summary_part.added`,
//! `response.reasoning_summary_text.delta`…, `….done`, `response.reasoning_summary_part.done`)
//! | (message: `response.content_part.added`, `response.output_text.delta`…,
//! `response.output_text.done`, `response.content_part.done`) | (function call:
//! `response.function_call_arguments.delta`, `response.function_call_arguments.done`; for a
//! freeform tool `response.custom_tool_call_input.delta` / `.done`) →
//! `response.output_item.done`, and finally `response.completed` (or `response.incomplete`
//! when the token limit cut the output). This is the sequence Codex accepted from the
//! research fake server.
//!
//! Reasoning is shown as a summary and its handle goes out as `encrypted_content`, which
//! Codex echoes back verbatim. Item ids derive from the response id (`rs_<id>_<index>`,
//! `msg_<id>_<index>`, `fc_<id>_<index>`, `ctc_<id>_<index>`).

use serde_json::{json, Value};

use super::sse::SseEvent;
use super::{id_suffix, ResponseBlock, ResponseMeta, StopReason, StreamItem, Usage};
use crate::typed_tools::{TypedTool, TypedTools};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OpenItem {
    Reasoning,
    Message,
}

#[derive(Clone, Debug)]
pub struct ResponsesResponse {
    meta: ResponseMeta,
    sequence_number: u64,
    /// Finished output items.
    output: Vec<Value>,
    open: Option<OpenItem>,
    open_text: String,
    /// Tools that take plain text: a call of one goes out as a `custom_tool_call`.
    freeform_tools: Vec<String>,
    /// The harness's tool-search tools: a call of one goes out as a `tool_search_call`.
    search_tools: Vec<String>,
    /// The request's typed client-run tools: a call of one goes out as an item of the tool's
    /// own type (`local_shell_call`, `shell_call`, `apply_patch_call`).
    typed_tools: TypedTools,
    /// The request's settings, echoed in every `response` object.
    settings: Option<std::sync::Arc<serde_json::Map<String, Value>>>,
    /// `completed_at`, once the server stamped it.
    completed_unix_s: Option<u64>,
    /// The answer was cut by the token limit: the item open at the end is `incomplete`.
    cut: bool,
    /// A compaction answer (`crate::compaction`): its text, gathered silently, goes out at
    /// the end as one `compaction` item.
    compaction: Option<String>,
}

fn usage_json(usage: &Usage) -> Value {
    json!({
        "input_tokens": usage.input_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_input_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.input_tokens + usage.output_tokens,
    })
}

/// A call item: `function_call` with its `arguments`, or, for a freeform tool,
/// `custom_tool_call` with its `input` text. A call of a namespaced tool, which the model sees
/// and calls by its qualified name `<namespace>.<function>`, goes out as `namespace` and `name`.
fn call_item(id: &str, status: &str, call_id: &str, name: &str, payload: CallPayload) -> Value {
    let separator = crate::openai_responses::NAMESPACE_SEPARATOR;
    let (namespace, name) = match name.split_once(separator) {
        Some((namespace, member)) if !namespace.is_empty() && !member.is_empty() => {
            (Some(namespace), member)
        }
        _ => (None, name),
    };
    let mut item = serde_json::Map::new();
    item.insert("id".into(), Value::from(id));
    item.insert("type".into(), Value::from(payload.item_type()));
    item.insert("status".into(), Value::from(status));
    item.insert("call_id".into(), Value::from(call_id));
    if let CallPayload::Search(arguments) = payload {
        // Codex's own shape: the arguments as an object, no name.
        item.insert("execution".into(), Value::from("client"));
        let arguments = serde_json::from_str::<Value>(arguments)
            .ok()
            .filter(Value::is_object)
            .unwrap_or_else(|| json!({}));
        item.insert("arguments".into(), arguments);
        return Value::Object(item);
    }
    if let CallPayload::Typed(tool, arguments) = payload {
        // The tool's own field (`action`, `operation`), made of the arguments the model gave.
        let (field, value) = tool.call_field(arguments);
        item.insert(field.into(), value);
        return Value::Object(item);
    }
    if let Some(namespace) = namespace {
        item.insert("namespace".into(), Value::from(namespace));
    }
    item.insert("name".into(), Value::from(name));
    match payload {
        CallPayload::Arguments(arguments)
        | CallPayload::Search(arguments)
        | CallPayload::Typed(_, arguments) => item.insert("arguments".into(), arguments.into()),
        CallPayload::Input(input) => item.insert("input".into(), input.into()),
    };
    Value::Object(item)
}

#[derive(Clone, Copy)]
enum CallPayload<'a> {
    Arguments(&'a str),
    Input(&'a str),
    /// A `tool_search` call's arguments (sent as an object).
    Search(&'a str),
    /// A typed tool's call's arguments (sent as the item's own field, see `crate::typed_tools`).
    Typed(TypedTool, &'a str),
}

impl<'a> CallPayload<'a> {
    fn item_type(self) -> &'static str {
        match self {
            CallPayload::Arguments(_) => "function_call",
            CallPayload::Input(_) => "custom_tool_call",
            CallPayload::Search(_) => "tool_search_call",
            CallPayload::Typed(tool, _) => tool.call_type(),
        }
    }

    /// The SSE event names of this kind of call's text: (delta, done), and the `done` field;
    /// none for a `tool_search` call, which goes out whole in its `output_item` events.
    fn events(self) -> Option<(&'static str, &'static str, &'static str)> {
        Some(match self {
            CallPayload::Arguments(_) => (
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "arguments",
            ),
            CallPayload::Input(_) => (
                "response.custom_tool_call_input.delta",
                "response.custom_tool_call_input.done",
                "input",
            ),
            CallPayload::Search(_) | CallPayload::Typed(..) => return None,
        })
    }

    fn text(self) -> &'a str {
        match self {
            CallPayload::Arguments(text)
            | CallPayload::Input(text)
            | CallPayload::Search(text)
            | CallPayload::Typed(_, text) => text,
        }
    }

    fn empty(self) -> Self {
        match self {
            CallPayload::Arguments(_) => CallPayload::Arguments(""),
            CallPayload::Input(_) => CallPayload::Input(""),
            CallPayload::Search(_) | CallPayload::Typed(..) => self,
        }
    }
}

impl ResponsesResponse {
    pub fn new(meta: ResponseMeta) -> Self {
        Self {
            meta,
            sequence_number: 0,
            output: Vec::new(),
            open: None,
            open_text: String::new(),
            freeform_tools: Vec::new(),
            search_tools: Vec::new(),
            typed_tools: TypedTools::default(),
            settings: None,
            completed_unix_s: None,
            cut: false,
            compaction: None,
        }
    }

    /// Answers a `compaction_trigger`: the text becomes one `compaction` item (no message
    /// events; a tool call the model makes instead is not handed over).
    pub fn with_compaction(mut self, compaction: bool) -> Self {
        self.compaction = compaction.then(String::new);
        self
    }

    /// The `compaction` item holding the text gathered so far.
    fn compaction_item(&self) -> Option<Value> {
        let text = self.compaction.as_deref()?;
        Some(json!({
            "id": self.item_id("cmp"),
            "type": "compaction",
            "encrypted_content": crate::compaction::handle(text),
        }))
    }

    /// Closes the compaction item: `output_item.added` and `output_item.done`, as the API
    /// sends a compaction (it has no deltas).
    fn close_compaction(&mut self, events: &mut Vec<SseEvent>) {
        let Some(item) = self.compaction_item() else {
            return;
        };
        let index = self.output_index();
        events.push(self.event(
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        ));
        events.push(self.event(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        ));
        self.output.push(item);
        self.compaction = None;
    }

    /// The request's settings (`ChatRequest::response_settings`), echoed in every `response`
    /// object as the API does.
    pub fn with_settings(
        mut self,
        settings: Option<std::sync::Arc<serde_json::Map<String, Value>>>,
    ) -> Self {
        self.settings = settings;
        self
    }

    /// Stamps `completed_at` of the final `response` object.
    pub fn set_completed_at(&mut self, unix_s: u64) {
        self.completed_unix_s = Some(unix_s);
    }

    /// Names the request's freeform (`custom`) tools: their calls go out as
    /// `custom_tool_call` items with the `input` text.
    pub fn with_freeform_tools(mut self, names: Vec<String>) -> Self {
        self.freeform_tools = names;
        self
    }

    /// Names the request's harness-run tool-search tools: their calls go out as
    /// `tool_search_call` items with the arguments as an object.
    pub fn with_search_tools(mut self, names: Vec<String>) -> Self {
        self.search_tools = names;
        self
    }

    /// The request's typed client-run tools: a call of one goes out as an item of the tool's
    /// own type whose `action` / `operation` the call's arguments make.
    pub fn with_typed_tools(mut self, typed_tools: TypedTools) -> Self {
        self.typed_tools = typed_tools;
        self
    }

    /// The response's id (`resp_…`).
    pub fn id(&self) -> &str {
        &self.meta.id
    }

    /// The output items closed so far (all of them after [`Self::finish`]).
    pub fn output(&self) -> &[Value] {
        &self.output
    }

    /// The next sequence number (for an `error` event the server sends mid-stream).
    pub fn sequence_number(&self) -> u64 {
        self.sequence_number
    }

    /// A named event whose payload is `{"type": name, …fields, "sequence_number": n}`.
    fn event(&mut self, name: &str, fields: Value) -> SseEvent {
        let mut data = serde_json::Map::new();
        data.insert("type".into(), Value::from(name));
        if let Value::Object(fields) = fields {
            data.extend(fields);
        }
        data.insert("sequence_number".into(), Value::from(self.sequence_number));
        self.sequence_number += 1;
        SseEvent::named(name, Value::Object(data))
    }

    fn response_object(&self, status: &str, output: Vec<Value>, usage: Option<&Usage>) -> Value {
        let mut object = serde_json::Map::new();
        object.insert("id".into(), Value::from(self.meta.id.as_str()));
        object.insert("object".into(), Value::from("response"));
        object.insert("created_at".into(), Value::from(self.meta.created_unix_s));
        object.insert("status".into(), Value::from(status));
        // Only a completed response has a completion time (not an incomplete one).
        let completed_at = match (status, self.completed_unix_s) {
            ("completed", Some(at)) => Value::from(at),
            _ => Value::Null,
        };
        object.insert("completed_at".into(), completed_at);
        object.insert("error".into(), Value::Null);
        object.insert("incomplete_details".into(), Value::Null);
        object.insert("model".into(), Value::from(self.meta.model.as_str()));
        object.insert("output".into(), Value::Array(output));
        match &self.settings {
            Some(settings) => object.extend(
                settings
                    .iter()
                    .map(|(name, value)| (name.clone(), value.clone())),
            ),
            None => {
                object.insert("parallel_tool_calls".into(), Value::Bool(true));
                object.insert("tool_choice".into(), Value::from("auto"));
                object.insert("tools".into(), json!([]));
            }
        }
        object.insert("usage".into(), usage.map_or(Value::Null, usage_json));
        Value::Object(object)
    }

    fn item_id(&self, prefix: &str) -> String {
        format!(
            "{prefix}_{}_{}",
            id_suffix(&self.meta.id),
            self.output.len()
        )
    }

    fn output_index(&self) -> usize {
        self.output.len()
    }

    pub fn start(&mut self) -> Vec<SseEvent> {
        let created = self.response_object("in_progress", Vec::new(), None);
        let in_progress = created.clone();
        vec![
            self.event("response.created", json!({"response": created})),
            self.event("response.in_progress", json!({"response": in_progress})),
        ]
    }

    fn open_reasoning(&mut self, events: &mut Vec<SseEvent>) {
        self.close_message(events);
        self.open = Some(OpenItem::Reasoning);
        let id = self.item_id("rs");
        let index = self.output_index();
        events.push(self.event(
            "response.output_item.added",
            json!({"output_index": index, "item": {"id": id, "type": "reasoning", "summary": []}}),
        ));
        events.push(self.event(
            "response.reasoning_summary_part.added",
            json!({"item_id": id, "output_index": index, "summary_index": 0,
                   "part": {"type": "summary_text", "text": ""}}),
        ));
    }

    fn close_reasoning(&mut self, handle: &str, events: &mut Vec<SseEvent>) {
        if self.open != Some(OpenItem::Reasoning) {
            return;
        }
        self.open = None;
        let id = self.item_id("rs");
        let index = self.output_index();
        let text = std::mem::take(&mut self.open_text);
        events.push(self.event(
            "response.reasoning_summary_text.done",
            json!({"item_id": id, "output_index": index, "summary_index": 0, "text": text}),
        ));
        events.push(self.event(
            "response.reasoning_summary_part.done",
            json!({"item_id": id, "output_index": index, "summary_index": 0,
                   "part": {"type": "summary_text", "text": text}}),
        ));
        let item = json!({
            "id": id,
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": text}],
            "encrypted_content": handle,
        });
        events.push(self.event(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        ));
        self.output.push(item);
    }

    fn open_message(&mut self, events: &mut Vec<SseEvent>) {
        self.open = Some(OpenItem::Message);
        let id = self.item_id("msg");
        let index = self.output_index();
        events.push(self.event(
            "response.output_item.added",
            json!({"output_index": index, "item": {
                "id": id, "type": "message", "status": "in_progress", "role": "assistant", "content": [],
            }}),
        ));
        events.push(self.event(
            "response.content_part.added",
            json!({"item_id": id, "output_index": index, "content_index": 0,
                   "part": {"type": "output_text", "text": "", "annotations": []}}),
        ));
    }

    /// A finished message item; the one still open when the token limit cut the answer is
    /// `incomplete`.
    fn message_item(&self, id: &str, text: &str) -> Value {
        json!({
            "id": id,
            "type": "message",
            "status": if self.cut { "incomplete" } else { "completed" },
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        })
    }

    fn close_message(&mut self, events: &mut Vec<SseEvent>) {
        if self.open != Some(OpenItem::Message) {
            return;
        }
        self.open = None;
        let id = self.item_id("msg");
        let index = self.output_index();
        let text = std::mem::take(&mut self.open_text);
        events.push(self.event(
            "response.output_text.done",
            json!({"item_id": id, "output_index": index, "content_index": 0, "text": text, "logprobs": []}),
        ));
        events.push(self.event(
            "response.content_part.done",
            json!({"item_id": id, "output_index": index, "content_index": 0,
                   "part": {"type": "output_text", "text": text, "annotations": []}}),
        ));
        let item = self.message_item(&id, &text);
        events.push(self.event(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        ));
        self.output.push(item);
    }

    pub fn push(&mut self, item: StreamItem<'_>) -> Vec<SseEvent> {
        let mut events = Vec::new();
        match item {
            StreamItem::ReasoningDelta(text) => {
                if self.open != Some(OpenItem::Reasoning) {
                    self.open_reasoning(&mut events);
                }
                if !text.is_empty() {
                    self.open_text.push_str(text);
                    let id = self.item_id("rs");
                    let index = self.output_index();
                    events.push(self.event(
                        "response.reasoning_summary_text.delta",
                        json!({"item_id": id, "output_index": index, "summary_index": 0, "delta": text}),
                    ));
                }
            }
            StreamItem::ReasoningEnd { handle } => {
                if self.open != Some(OpenItem::Reasoning) {
                    self.open_reasoning(&mut events);
                }
                self.close_reasoning(handle, &mut events);
            }
            StreamItem::TextDelta(text) => {
                if text.is_empty() {
                    return events;
                }
                if let Some(summary) = self.compaction.as_mut() {
                    summary.push_str(text);
                    return events;
                }
                self.close_reasoning("", &mut events);
                if self.open != Some(OpenItem::Message) {
                    self.open_message(&mut events);
                }
                self.open_text.push_str(text);
                let id = self.item_id("msg");
                let index = self.output_index();
                events.push(self.event(
                    "response.output_text.delta",
                    json!({"item_id": id, "output_index": index, "content_index": 0,
                           "delta": text, "logprobs": []}),
                ));
            }
            StreamItem::ToolCall { .. } if self.compaction.is_some() => {}
            StreamItem::ToolCall {
                id: call_id,
                name,
                arguments,
            } => {
                self.close_reasoning("", &mut events);
                self.close_message(&mut events);
                let index = self.output_index();
                let input;
                let (id, payload) = if self.freeform_tools.iter().any(|tool| tool == name) {
                    input = crate::openai_responses::freeform_input(arguments);
                    (self.item_id("ctc"), CallPayload::Input(&input))
                } else if self.search_tools.iter().any(|tool| tool == name) {
                    (self.item_id("ts"), CallPayload::Search(arguments))
                } else if let Some(tool) = self.typed_tools.called(name) {
                    (
                        self.item_id(tool.id_prefix()),
                        CallPayload::Typed(tool, arguments),
                    )
                } else {
                    (self.item_id("fc"), CallPayload::Arguments(arguments))
                };
                let added = call_item(&id, "in_progress", call_id, name, payload.empty());
                events.push(self.event(
                    "response.output_item.added",
                    json!({"output_index": index, "item": added}),
                ));
                if let Some((delta_event, done_event, done_field)) = payload.events() {
                    if !payload.text().is_empty() {
                        events.push(self.event(
                            delta_event,
                            json!({"item_id": id, "output_index": index, "delta": payload.text()}),
                        ));
                    }
                    events.push(self.event(
                        done_event,
                        json!({"item_id": id, "output_index": index, done_field: payload.text()}),
                    ));
                }
                let item = call_item(&id, "completed", call_id, name, payload);
                events.push(self.event(
                    "response.output_item.done",
                    json!({"output_index": index, "item": item}),
                ));
                self.output.push(item);
            }
        }
        events
    }

    fn final_object(&self, output: Vec<Value>, stop: &StopReason, usage: &Usage) -> Value {
        let incomplete = *stop == StopReason::MaxTokens;
        let mut response = self.response_object(
            if incomplete {
                "incomplete"
            } else {
                "completed"
            },
            output,
            Some(usage),
        );
        if incomplete {
            response["incomplete_details"] = json!({"reason": "max_output_tokens"});
        }
        response
    }

    /// Closes open items; `response.completed` or `response.incomplete`.
    pub fn finish(&mut self, stop: &StopReason, usage: &Usage) -> Vec<SseEvent> {
        let mut events = Vec::new();
        self.cut = *stop == StopReason::MaxTokens;
        self.close_reasoning("", &mut events);
        self.close_message(&mut events);
        self.close_compaction(&mut events);
        let response = self.final_object(self.output.clone(), stop, usage);
        let name = if *stop == StopReason::MaxTokens {
            "response.incomplete"
        } else {
            "response.completed"
        };
        events.push(self.event(name, json!({"response": response})));
        events
    }

    /// The non-streaming `response` body, from the pieces pushed so far.
    pub fn response_json(&self, stop: &StopReason, usage: &Usage) -> Value {
        let mut output = self.output.clone();
        match self.open {
            Some(OpenItem::Message) => {
                let mut item = self.message_item(&self.item_id("msg"), &self.open_text);
                if *stop == StopReason::MaxTokens {
                    item["status"] = Value::from("incomplete");
                }
                output.push(item)
            }
            Some(OpenItem::Reasoning) => output.push(json!({
                "id": self.item_id("rs"),
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": self.open_text}],
                "encrypted_content": "",
            })),
            None => {}
        }
        output.extend(self.compaction_item());
        self.final_object(output, stop, usage)
    }
}

/// One-shot: the non-streaming body.
pub fn response_json(
    meta: &ResponseMeta,
    blocks: &[ResponseBlock],
    stop: &StopReason,
    usage: &Usage,
) -> Value {
    let mut response = ResponsesResponse::new(meta.clone());
    for block in blocks {
        for item in block.stream_items() {
            response.push(item);
        }
    }
    response.response_json(stop, usage)
}

/// One-shot: the whole event sequence.
pub fn stream_events(
    meta: &ResponseMeta,
    blocks: &[ResponseBlock],
    stop: &StopReason,
    usage: &Usage,
) -> Vec<SseEvent> {
    let mut response = ResponsesResponse::new(meta.clone());
    let mut events = response.start();
    for block in blocks {
        for item in block.stream_items() {
            events.extend(response.push(item));
        }
    }
    events.extend(response.finish(stop, usage));
    events
}
