//! gyre-proxy: the pure core of the black-box model proxy.
//!
//! The proxy stands in for a model API in front of unmodified harnesses (Claude Code speaks
//! Anthropic Messages, Codex speaks OpenAI Responses, others OpenAI Chat Completions). This
//! crate holds everything that does not touch a socket:
//! - [`model_dir`]: a model's tokenizer and chat template, loaded from a directory;
//! - [`template`]: chat-template rendering matching HF transformers' jinja2 byte for byte;
//! - [`messages`]: the internal chat representation every request becomes;
//! - [`anthropic`], [`openai_chat`], [`openai_responses`]: request parsers over raw bytes
//!   that reject bad input as [`ApiError`] values in the API's own error shape;
//! - [`output`]: generated text → reasoning / text / tool calls, and the response builders
//!   (JSON and the exact SSE sequences) for the three APIs;
//! - [`test_model`]: how the repository's test tokenizer is trained.
//!
//! Architecture invariant: no IO except reading a model directory, no clock (the date for
//! `strftime_now` and response timestamps are inputs), no randomness (ids are inputs).

pub mod answer_format;
pub mod anthropic;
pub mod api_error;
pub mod body;
pub mod builtin_tools;
pub mod compaction;
pub mod content_encoding;
pub mod engine;
mod error;
pub mod fast_bpe;
mod json_schema;
pub mod long_runs;
pub mod media;
pub mod message_threads;
pub mod messages;
pub mod model_dir;
pub mod openai_chat;
pub mod openai_responses;
pub mod output;
mod reader;
#[cfg(feature = "server")]
pub mod server;
pub mod stored_responses;
pub mod template;
pub mod test_model;
pub mod typed_tools;

pub use api_error::{ApiError, ApiErrorKind};
pub use error::ProxyError;
pub use messages::{Api, ChatRequest, Message, Role, Tool, ToolCall};
pub use model_dir::{ChatModel, TextStream};
pub use template::{ChatTemplate, CivilDateTime, RenderInput, SpecialTokens, ToolArgumentsForm};

/// Parses a request body for `api`.
pub fn parse_request(api: Api, body: &[u8]) -> Result<ChatRequest, ApiError> {
    match api {
        Api::Anthropic => anthropic::parse(body),
        Api::OpenAiChat => openai_chat::parse(body),
        Api::OpenAiResponses => openai_responses::parse(body),
    }
}

/// Reads a request for `api` from a body already parsed by [`body::parse_body`] (the server's
/// path: it parses each body against the same agent's previous one).
pub fn read_parsed_request(api: Api, body: &body::ParsedBody) -> Result<ChatRequest, ApiError> {
    let value = body.value();
    match api {
        Api::Anthropic => anthropic::read_value(value)?.to_chat(),
        Api::OpenAiChat => openai_chat::read_value(value)?.to_chat(),
        Api::OpenAiResponses => openai_responses::read_value(value)?.to_chat(),
    }
}
