//! Model output → API responses: the generated text is split into reasoning, text and tool
//! calls by a streaming parser ([`OutputParser`]) configured by the model's [`OutputFormat`],
//! and the response builders ([`anthropic`], [`openai_chat`], [`openai_responses`]) turn those
//! pieces into each API's JSON and SSE shapes, incrementally or in one shot.

pub mod anthropic;
pub mod openai_chat;
pub mod openai_responses;
mod parser;
pub mod partial_json;
pub mod sse;
pub mod stop;

pub use parser::{parse_output, OutputParser};
pub use stop::StopStrings;

/// How a model writes reasoning and tool calls. Add a constructor per model family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputFormat {
    /// `(start, end)` tags around reasoning, e.g. `("<think>", "</think>")`.
    pub reasoning_tags: Option<(String, String)>,
    /// The generation prompt already opened the reasoning tag (Qwen3-thinking style), so the
    /// output starts inside reasoning.
    pub reasoning_open_at_start: bool,
    pub tool_call: Option<ToolCallFormat>,
    /// Texts that end the turn (`<|im_end|>`); the parser ignores everything from the first one.
    pub end_of_turn: Vec<String>,
    /// Strip whitespace around reasoning and text blocks (templates that pad them with
    /// newlines, e.g. Qwen's `<think>\n…\n</think>\n\n`). Off: blocks keep every byte.
    pub trim_whitespace: bool,
}

/// A tool call written as `{start}{"name": …, "arguments": {…}}{end}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCallFormat {
    pub start: String,
    pub end: String,
    pub name_key: String,
    pub arguments_key: String,
}

impl ToolCallFormat {
    /// Hermes / Qwen style `<tool_call>{"name": …, "arguments": …}</tool_call>`.
    pub fn hermes() -> Self {
        Self {
            start: "<tool_call>".into(),
            end: "</tool_call>".into(),
            name_key: "name".into(),
            arguments_key: "arguments".into(),
        }
    }
}

impl OutputFormat {
    /// Plain text ended by `<|im_end|>` (SmolLM2-Instruct: no reasoning, no tool syntax).
    pub fn chatml_plain() -> Self {
        Self {
            reasoning_tags: None,
            reasoning_open_at_start: false,
            tool_call: None,
            end_of_turn: vec!["<|im_end|>".into()],
            trim_whitespace: false,
        }
    }

    /// The repository's test model (`assets/test-model`): `<think>…</think>`, then text, then
    /// `<tool_call>{"name": …, "arguments": …}</tool_call>` calls, all without padding, then
    /// `<|im_end|>`.
    pub fn test_model() -> Self {
        Self {
            reasoning_tags: Some(("<think>".into(), "</think>".into())),
            reasoning_open_at_start: false,
            tool_call: Some(ToolCallFormat::hermes()),
            end_of_turn: vec!["<|im_end|>".into(), "<|endoftext|>".into()],
            trim_whitespace: false,
        }
    }

    /// Qwen 2.5 / Qwen3 style: padded `<think>` blocks and one tool call per
    /// `<tool_call>\n…\n</tool_call>`.
    pub fn qwen() -> Self {
        Self {
            reasoning_tags: Some(("<think>".into(), "</think>".into())),
            reasoning_open_at_start: false,
            tool_call: Some(ToolCallFormat::hermes()),
            end_of_turn: vec!["<|im_end|>".into(), "<|endoftext|>".into()],
            trim_whitespace: true,
        }
    }
}

/// A piece of parsed output, in generation order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OutputEvent {
    ReasoningDelta(String),
    /// The reasoning block closed (its end tag, or the output ended inside it).
    ReasoningEnd,
    TextDelta(String),
    /// A complete tool call. `arguments` is the JSON text exactly as generated.
    ToolCall {
        name: String,
        arguments: String,
    },
}

/// A complete block of parsed output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OutputBlock {
    Reasoning(String),
    Text(String),
    ToolCall { name: String, arguments: String },
}

/// Why the engine stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EngineFinish {
    /// An end-of-turn / EOS token.
    EndOfTurn,
    /// The token limit.
    Length,
    /// One of the request's stop sequences.
    StopSequence(String),
}

/// The API-neutral stop reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
    EndTurn,
    ToolUse,
    MaxTokens,
    StopSequence(String),
}

impl StopReason {
    /// A finished turn with tool calls is `ToolUse`; limits and stop sequences win over calls.
    pub fn from_finish(finish: &EngineFinish, has_tool_calls: bool) -> Self {
        match finish {
            EngineFinish::EndOfTurn if has_tool_calls => StopReason::ToolUse,
            EngineFinish::EndOfTurn => StopReason::EndTurn,
            EngineFinish::Length => StopReason::MaxTokens,
            EngineFinish::StopSequence(sequence) => StopReason::StopSequence(sequence.clone()),
        }
    }

    /// Anthropic `stop_reason`.
    pub fn anthropic(&self) -> &'static str {
        match self {
            StopReason::EndTurn => "end_turn",
            StopReason::ToolUse => "tool_use",
            StopReason::MaxTokens => "max_tokens",
            StopReason::StopSequence(_) => "stop_sequence",
        }
    }

    /// OpenAI Chat `finish_reason`.
    pub fn openai_chat(&self) -> &'static str {
        match self {
            StopReason::EndTurn | StopReason::StopSequence(_) => "stop",
            StopReason::ToolUse => "tool_calls",
            StopReason::MaxTokens => "length",
        }
    }

    fn stop_sequence(&self) -> Option<&str> {
        match self {
            StopReason::StopSequence(sequence) => Some(sequence),
            _ => None,
        }
    }
}

/// Token counts for the response's `usage`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Usage {
    /// All prompt tokens, including the cached ones.
    pub input_tokens: u64,
    /// Prompt tokens reused from the execution's tree (reported as cache reads).
    pub cached_input_tokens: u64,
    pub output_tokens: u64,
    /// Output tokens inside reasoning.
    pub reasoning_tokens: u64,
}

/// Identity of one response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResponseMeta {
    /// `msg_…` (Anthropic), `chatcmpl-…` (Chat), `resp_…` (Responses); minted by the server.
    pub id: String,
    /// The model name as the harness sent it.
    pub model: String,
    /// `created` / `created_at`, stamped by the server.
    pub created_unix_s: u64,
}

/// One piece of the answer as the server hands it to a builder: the parser's events with the
/// ids and handles the server minted (tool-call id; reasoning signature / encrypted content).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamItem<'a> {
    ReasoningDelta(&'a str),
    ReasoningEnd {
        handle: &'a str,
    },
    TextDelta(&'a str),
    ToolCall {
        id: &'a str,
        name: &'a str,
        arguments: &'a str,
    },
}

/// A complete block of the answer, for the one-shot builders.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResponseBlock {
    Reasoning {
        text: String,
        handle: String,
    },
    Text(String),
    ToolCall {
        id: String,
        name: String,
        arguments: String,
    },
}

impl ResponseBlock {
    /// The block as the stream items that produce it.
    pub fn stream_items(&self) -> Vec<StreamItem<'_>> {
        match self {
            ResponseBlock::Reasoning { text, handle } => {
                let mut items = Vec::new();
                if !text.is_empty() {
                    items.push(StreamItem::ReasoningDelta(text));
                }
                items.push(StreamItem::ReasoningEnd { handle });
                items
            }
            ResponseBlock::Text(text) => vec![StreamItem::TextDelta(text)],
            ResponseBlock::ToolCall {
                id,
                name,
                arguments,
            } => vec![StreamItem::ToolCall {
                id,
                name,
                arguments,
            }],
        }
    }
}

/// Parses tool-call arguments text for APIs that want an object (Anthropic `input`); text that
/// is not a JSON object becomes `{}` (the parser only emits calls whose arguments are objects).
pub(crate) fn arguments_object(arguments: &str) -> serde_json::Value {
    match serde_json::from_str::<serde_json::Value>(arguments) {
        Ok(value @ serde_json::Value::Object(_)) => value,
        _ => serde_json::Value::Object(serde_json::Map::new()),
    }
}

/// Strips a `resp_` / `msg_` / `chatcmpl-` style prefix for deriving item ids.
pub(crate) fn id_suffix(id: &str) -> &str {
    id.split_once(['_', '-']).map_or(id, |(_, rest)| rest)
}
