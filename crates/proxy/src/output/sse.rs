//! Server-sent events: `event: <name>\ndata: <json>\n\n`, or `data: <json>\n\n` without a
//! name (OpenAI Chat Completions), and the Chat stream's `data: [DONE]` terminator.

use serde_json::Value;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` line; `None` for unnamed events.
    pub event: Option<String>,
    /// The `data:` payload (compact JSON, never containing a newline, or `[DONE]`).
    pub data: String,
}

impl SseEvent {
    pub fn named(event: &str, data: Value) -> Self {
        Self {
            event: Some(event.to_string()),
            data: data.to_string(),
        }
    }

    pub fn unnamed(data: Value) -> Self {
        Self {
            event: None,
            data: data.to_string(),
        }
    }

    /// `data: [DONE]`, the end of an OpenAI Chat Completions stream.
    pub fn done() -> Self {
        Self {
            event: None,
            data: "[DONE]".to_string(),
        }
    }

    /// The wire text of the event, blank line included.
    pub fn to_wire(&self) -> String {
        match &self.event {
            Some(event) => format!("event: {event}\ndata: {}\n\n", self.data),
            None => format!("data: {}\n\n", self.data),
        }
    }

    /// The payload as JSON (`None` for `[DONE]`).
    pub fn json(&self) -> Option<Value> {
        serde_json::from_str(&self.data).ok()
    }
}

/// The wire text of several events.
pub fn to_wire(events: &[SseEvent]) -> String {
    events.iter().map(SseEvent::to_wire).collect()
}
