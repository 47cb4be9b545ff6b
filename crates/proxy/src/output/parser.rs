//! The streaming output parser: generated text in (any chunking), [`OutputEvent`]s out.
//!
//! Text that could be the start of a tag (`<thi`) is held back until the next chunk decides.
//! Tool calls are buffered whole and emitted at their end tag (an end tag inside one of the
//! call's JSON strings is text of the call); a call whose body is not
//! `{"name": string, "arguments": object}` is passed through as text, tags included, as vLLM's
//! Hermes parser does. A call the output stops inside (the token limit, a stop sequence; no
//! end tag and no end of turn) is still a call once its name is written: its arguments are
//! what was written of them, closed into an object (`partial_json`), the shape the real APIs
//! give a tool call cut by `max_tokens`; [`OutputParser::cut_tool_call`] says so. How the text is chunked changes only how deltas are split, never the
//! blocks they add up to (a property test checks it).

use std::collections::BTreeMap;

use serde_json::value::RawValue;

use super::{OutputBlock, OutputEvent, OutputFormat};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Text,
    Reasoning,
    ToolCall,
    /// An end-of-turn marker was seen; the rest is ignored.
    Ended,
}

#[derive(Debug)]
pub struct OutputParser {
    format: OutputFormat,
    state: State,
    /// Input not yet classified (may end in a partial tag).
    buffer: String,
    /// The body of the tool call being read.
    tool_body: String,
    /// With `trim_whitespace`: whether the open block emitted anything, and the whitespace
    /// held back at its end.
    block_started: bool,
    pending_whitespace: String,
    tool_calls_count: usize,
    /// The last call was cut by the end of the output (see the module docs).
    cut_tool_call: bool,
}

impl OutputParser {
    pub fn new(format: OutputFormat) -> Self {
        let state = if format.reasoning_open_at_start && format.reasoning_tags.is_some() {
            State::Reasoning
        } else {
            State::Text
        };
        Self {
            format,
            state,
            buffer: String::new(),
            tool_body: String::new(),
            block_started: false,
            pending_whitespace: String::new(),
            tool_calls_count: 0,
            cut_tool_call: false,
        }
    }

    /// Whether an end-of-turn marker was seen.
    pub fn ended(&self) -> bool {
        self.state == State::Ended
    }

    /// Tool calls emitted so far.
    pub fn tool_calls_count(&self) -> usize {
        self.tool_calls_count
    }

    /// Whether the output ended inside a tool call that was emitted with the arguments written
    /// so far (never a finished turn's call: the stop reason must not say `tool_use`).
    pub fn cut_tool_call(&self) -> bool {
        self.cut_tool_call
    }

    /// The markers that end the current state, with what each one does.
    fn markers(&self) -> Vec<(String, Marker)> {
        let mut markers = Vec::new();
        match self.state {
            State::Text => {
                if let Some((start, _)) = &self.format.reasoning_tags {
                    markers.push((start.clone(), Marker::ReasoningStart));
                }
                if let Some(tool_call) = &self.format.tool_call {
                    markers.push((tool_call.start.clone(), Marker::ToolCallStart));
                }
            }
            State::Reasoning => {
                if let Some((_, end)) = &self.format.reasoning_tags {
                    markers.push((end.clone(), Marker::ReasoningEnd));
                }
            }
            State::ToolCall => {
                if let Some(tool_call) = &self.format.tool_call {
                    markers.push((tool_call.end.clone(), Marker::ToolCallEnd));
                }
            }
            State::Ended => return markers,
        }
        for end in &self.format.end_of_turn {
            markers.push((end.clone(), Marker::EndOfTurn));
        }
        markers.retain(|(text, _)| !text.is_empty());
        markers
    }

    /// Feeds generated text; returns the events it completes.
    pub fn push(&mut self, text: &str) -> Vec<OutputEvent> {
        let mut events = Vec::new();
        if self.state == State::Ended {
            return events;
        }
        self.buffer.push_str(text);
        loop {
            let markers = self.markers();
            let found = markers
                .iter()
                .filter_map(|(marker, kind)| {
                    self.buffer
                        .find(marker.as_str())
                        .map(|position| (position, marker.len(), *kind))
                })
                // Earliest; at equal positions the longer marker.
                .min_by_key(|(position, length, _)| (*position, usize::MAX - length));
            match found {
                Some((position, length, kind)) => {
                    let before = self.buffer[..position].to_string();
                    let marker = self.buffer[position..position + length].to_string();
                    self.buffer.drain(..position + length);
                    self.content(&before, &mut events);
                    self.transition(kind, &marker, &mut events);
                    if self.state == State::Ended {
                        self.buffer.clear();
                        return events;
                    }
                }
                None => {
                    let held = held_back_len(&self.buffer, &markers);
                    let safe = self.buffer.len() - held;
                    let ready = self.buffer[..safe].to_string();
                    self.buffer.drain(..safe);
                    self.content(&ready, &mut events);
                    return events;
                }
            }
        }
    }

    /// The output ended (any reason): flushes held text, closes an open reasoning block, and
    /// emits a tool call it ended inside as a cut call once the call's name is written (as
    /// text otherwise).
    pub fn finish(&mut self) -> Vec<OutputEvent> {
        let mut events = Vec::new();
        let rest = std::mem::take(&mut self.buffer);
        match self.state {
            State::Ended => {}
            State::Text => self.emit_text(&rest, &mut events),
            State::Reasoning => {
                self.emit_reasoning(&rest, &mut events);
                self.close_block();
                events.push(OutputEvent::ReasoningEnd);
            }
            State::ToolCall => {
                let body = format!("{}{rest}", std::mem::take(&mut self.tool_body));
                let call = parse_tool_call(&body, &self.format)
                    .or_else(|| parse_cut_tool_call(&body, &self.format));
                match call {
                    Some((name, arguments)) => {
                        self.tool_calls_count += 1;
                        self.cut_tool_call = true;
                        events.push(OutputEvent::ToolCall { name, arguments });
                    }
                    None => {
                        let start = self.tool_call_start();
                        self.emit_text(&format!("{start}{body}"), &mut events);
                    }
                }
            }
        }
        self.state = State::Ended;
        events
    }

    fn content(&mut self, text: &str, events: &mut Vec<OutputEvent>) {
        match self.state {
            State::Text => self.emit_text(text, events),
            State::Reasoning => self.emit_reasoning(text, events),
            State::ToolCall => self.tool_body.push_str(text),
            State::Ended => {}
        }
    }

    fn transition(&mut self, marker: Marker, marker_text: &str, events: &mut Vec<OutputEvent>) {
        match marker {
            Marker::ReasoningStart => {
                self.close_block();
                self.state = State::Reasoning;
            }
            Marker::ReasoningEnd => {
                self.close_block();
                events.push(OutputEvent::ReasoningEnd);
                self.state = State::Text;
            }
            Marker::ToolCallStart => {
                self.close_block();
                self.state = State::ToolCall;
            }
            Marker::ToolCallEnd => {
                // The end tag inside a JSON string (a call writing a file that holds the tag)
                // is the call's text, not its end.
                if ends_inside_json_string(&self.tool_body) {
                    self.tool_body.push_str(marker_text);
                    return;
                }
                let body = std::mem::take(&mut self.tool_body);
                match parse_tool_call(&body, &self.format) {
                    Some((name, arguments)) => {
                        self.tool_calls_count += 1;
                        events.push(OutputEvent::ToolCall { name, arguments });
                    }
                    None => {
                        let start = self.tool_call_start();
                        self.state = State::Text;
                        self.emit_text(&format!("{start}{body}{marker_text}"), events);
                    }
                }
                self.state = State::Text;
            }
            Marker::EndOfTurn => {
                match self.state {
                    State::Reasoning => {
                        self.close_block();
                        events.push(OutputEvent::ReasoningEnd);
                    }
                    State::ToolCall => {
                        let start = self.tool_call_start();
                        let raw = format!("{start}{}", std::mem::take(&mut self.tool_body));
                        self.state = State::Text;
                        self.emit_text(&raw, events);
                    }
                    State::Text | State::Ended => {}
                }
                self.state = State::Ended;
            }
        }
    }

    /// The format's tool-call start tag (empty without tool calls).
    fn tool_call_start(&self) -> String {
        self.format
            .tool_call
            .as_ref()
            .map(|tool_call| tool_call.start.clone())
            .unwrap_or_default()
    }

    fn close_block(&mut self) {
        self.block_started = false;
        self.pending_whitespace.clear();
    }

    fn emit_text(&mut self, text: &str, events: &mut Vec<OutputEvent>) {
        if let Some(text) = self.trimmed(text) {
            events.push(OutputEvent::TextDelta(text));
        }
    }

    fn emit_reasoning(&mut self, text: &str, events: &mut Vec<OutputEvent>) {
        if let Some(text) = self.trimmed(text) {
            events.push(OutputEvent::ReasoningDelta(text));
        }
    }

    /// What to emit of `text` for the open block (`None`: nothing yet).
    fn trimmed(&mut self, text: &str) -> Option<String> {
        if !self.format.trim_whitespace {
            return (!text.is_empty()).then(|| text.to_string());
        }
        let text = if self.block_started {
            text
        } else {
            text.trim_start()
        };
        let core = text.trim_end();
        if core.is_empty() {
            if self.block_started {
                self.pending_whitespace.push_str(text);
            }
            return None;
        }
        let out = format!("{}{core}", std::mem::take(&mut self.pending_whitespace));
        self.pending_whitespace = text[core.len()..].to_string();
        self.block_started = true;
        Some(out)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Marker {
    ReasoningStart,
    ReasoningEnd,
    ToolCallStart,
    ToolCallEnd,
    EndOfTurn,
}

/// How many bytes at the end of `buffer` could be the start of a marker.
fn held_back_len(buffer: &str, markers: &[(String, Marker)]) -> usize {
    let bytes = buffer.as_bytes();
    let mut held = 0;
    for (marker, _) in markers {
        let marker = marker.as_bytes();
        let longest = marker.len().saturating_sub(1).min(bytes.len());
        for length in (held + 1..=longest).rev() {
            if bytes.ends_with(&marker[..length]) && buffer.is_char_boundary(bytes.len() - length) {
                held = length;
                break;
            }
        }
    }
    held
}

/// Whether `body`, read as the start of a JSON text, ends inside a string literal.
fn ends_inside_json_string(body: &str) -> bool {
    let mut inside = false;
    let mut escaped = false;
    for byte in body.bytes() {
        if escaped {
            escaped = false;
        } else if inside && byte == b'\\' {
            escaped = true;
        } else if byte == b'"' {
            inside = !inside;
        }
    }
    inside
}

/// `{"name": "...", "arguments": {...}}` → (name, arguments text exactly as written).
fn parse_tool_call(body: &str, format: &OutputFormat) -> Option<(String, String)> {
    let tool_call = format.tool_call.as_ref()?;
    let fields: BTreeMap<String, &RawValue> = serde_json::from_str(body.trim()).ok()?;
    let name: String = serde_json::from_str(fields.get(&tool_call.name_key)?.get()).ok()?;
    let arguments = fields.get(&tool_call.arguments_key)?.get();
    if !arguments.starts_with('{') {
        return None;
    }
    Some((name, arguments.to_string()))
}

/// A call body the output stopped inside, `{"name": "<complete>", "arguments": {<cut>` (name
/// first, as the format writes it) → (name, the arguments closed into an object: `{}` when
/// they had not begun). `None` when the name is not complete or the body has another shape.
fn parse_cut_tool_call(body: &str, format: &OutputFormat) -> Option<(String, String)> {
    let tool_call = format.tool_call.as_ref()?;
    let mut rest = body.trim_start().strip_prefix('{')?;
    let (key, after) = json_string(rest)?;
    if key != tool_call.name_key {
        return None;
    }
    rest = after.trim_start().strip_prefix(':')?;
    let (name, after) = json_string(rest)?;
    let empty = || Some((name.clone(), "{}".to_string()));
    let Some(after) = after.trim_start().strip_prefix(',') else {
        return after
            .trim()
            .is_empty()
            .then(|| (name.clone(), "{}".to_string()));
    };
    let after = after.trim_start();
    if after.is_empty() {
        return empty();
    }
    let Some((key, after)) = json_string(after) else {
        // The key itself was cut.
        return after
            .starts_with('"')
            .then(|| (name.clone(), "{}".to_string()));
    };
    if key != tool_call.arguments_key {
        return None;
    }
    let after = after.trim_start();
    if after.is_empty() {
        return empty();
    }
    let value = after.strip_prefix(':')?.trim_start();
    if value.is_empty() {
        return empty();
    }
    let arguments = super::partial_json::close_partial_object(value)?;
    Some((name, arguments))
}

/// The complete JSON string literal at the start of `text` (after white space), decoded, and
/// the text after it; `None` if there is none or it is not closed.
fn json_string(text: &str) -> Option<(String, &str)> {
    let text = text.trim_start();
    let bytes = text.as_bytes();
    if bytes.first() != Some(&b'"') {
        return None;
    }
    let mut at = 1;
    while at < bytes.len() {
        match bytes[at] {
            b'\\' => at += 2,
            b'"' => {
                let literal = &text[..=at];
                let decoded: String = serde_json::from_str(literal).ok()?;
                return Some((decoded, &text[at + 1..]));
            }
            _ => at += 1,
        }
    }
    None
}

/// Parses a whole output into blocks (consecutive deltas of one kind merged).
pub fn parse_output(format: &OutputFormat, text: &str) -> Vec<OutputBlock> {
    let mut parser = OutputParser::new(format.clone());
    let mut events = parser.push(text);
    events.extend(parser.finish());
    let mut blocks: Vec<OutputBlock> = Vec::new();
    let mut reasoning_open = false;
    for event in events {
        match event {
            OutputEvent::ReasoningDelta(delta) => match blocks.last_mut() {
                Some(OutputBlock::Reasoning(text)) if reasoning_open => text.push_str(&delta),
                _ => {
                    blocks.push(OutputBlock::Reasoning(delta));
                    reasoning_open = true;
                }
            },
            OutputEvent::ReasoningEnd => {
                if !reasoning_open {
                    blocks.push(OutputBlock::Reasoning(String::new()));
                }
                reasoning_open = false;
            }
            OutputEvent::TextDelta(delta) => match blocks.last_mut() {
                Some(OutputBlock::Text(text)) => text.push_str(&delta),
                _ => blocks.push(OutputBlock::Text(delta)),
            },
            OutputEvent::ToolCall { name, arguments } => {
                blocks.push(OutputBlock::ToolCall { name, arguments })
            }
        }
    }
    blocks
}
