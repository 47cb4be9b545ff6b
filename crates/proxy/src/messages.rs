//! The internal chat representation: what every API's request becomes and what the chat
//! template sees.
//!
//! It follows the HF transformers message convention (`role`, `content`, `reasoning_content`,
//! `tool_calls[].function.{name, arguments}`, `tool_call_id`) so real model templates render
//! it, and keeps what the proxy needs to restore sampled tokens: tool-call ids, the raw
//! argument text and the reasoning handle (Anthropic thinking `signature`, OpenAI Responses
//! `encrypted_content`).

use serde_json::{json, Map, Value};

use crate::template::ToolArgumentsForm;

/// Text parts of one message are joined with this separator (as vLLM does when it flattens
/// OpenAI content parts for a text-only chat template), so `"x"` and `[{"type":"text",
/// "text":"x"}]` are the same message.
pub const TEXT_PART_SEPARATOR: &str = "\n";

/// Which public API a request came in on (it decides the error and response shapes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Api {
    /// Anthropic Messages (`/v1/messages`).
    Anthropic,
    /// OpenAI Chat Completions (`/v1/chat/completions`).
    OpenAiChat,
    /// OpenAI Responses (`/v1/responses`).
    OpenAiResponses,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// Also OpenAI's `developer` and Claude Code's mid-conversation `system` messages.
    System,
    User,
    Assistant,
    /// A tool result (Anthropic `tool_result` blocks become one message each).
    Tool,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// One tool call of an assistant message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    /// Anthropic `tool_use.id`, OpenAI `tool_calls[].id` or Responses `call_id`: the id tool
    /// results pair with and the key of the proxy's tool-call payload cache.
    pub id: String,
    pub name: String,
    /// The arguments as JSON text. From OpenAI requests: the string the harness sent (which is
    /// what the model produced). From Anthropic requests: `input` re-serialised compactly in
    /// the harness's key order, because Claude Code re-orders and re-escapes it; the server
    /// replaces it with the cached generated text by `id`.
    pub arguments: String,
}

/// One reasoning (thinking) block of an assistant message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reasoning {
    pub text: String,
    /// Opaque round-trip handle: Anthropic `signature` (or `redacted_thinking.data`), OpenAI
    /// Responses `encrypted_content`. The proxy mints it and resolves it to the exact tokens.
    pub handle: Option<String>,
    /// An Anthropic `redacted_thinking` block: no text, only the handle.
    pub redacted: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub role: Role,
    /// Text parts joined with [`TEXT_PART_SEPARATOR`]; empty when there is no text.
    pub content: String,
    pub reasoning: Vec<Reasoning>,
    pub tool_calls: Vec<ToolCall>,
    /// For `Role::Tool`: the tool call this result answers.
    pub tool_call_id: Option<String>,
    /// For `Role::Tool`: the called tool's name, looked up from the call when the API omits it.
    pub tool_name: Option<String>,
    /// For `Role::Tool`: Anthropic `is_error` (`false` and absent are the same).
    pub is_error: bool,
}

impl Message {
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            reasoning: Vec::new(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            tool_name: None,
            is_error: false,
        }
    }

    pub fn tool_result(
        tool_call_id: impl Into<String>,
        tool_name: Option<String>,
        content: impl Into<String>,
        is_error: bool,
    ) -> Self {
        Self {
            tool_call_id: Some(tool_call_id.into()),
            tool_name,
            is_error,
            ..Self::new(Role::Tool, content)
        }
    }

    /// The reasoning text the template sees: the non-redacted blocks joined with
    /// [`TEXT_PART_SEPARATOR`]; `None` when there are none.
    pub fn reasoning_content(&self) -> Option<String> {
        let texts: Vec<&str> = self
            .reasoning
            .iter()
            .filter(|reasoning| !reasoning.redacted)
            .map(|reasoning| reasoning.text.as_str())
            .collect();
        if texts.is_empty() {
            None
        } else {
            Some(texts.join(TEXT_PART_SEPARATOR))
        }
    }

    /// The HF-convention dict the chat template receives, as the template engine's value (built
    /// directly, not through a `serde_json` tree: at 128K tokens that detour took ~180 µs, more
    /// than half the render). Keys appear only when they apply: `reasoning_content` when there
    /// is reasoning, `tool_calls` (`{id, type: "function", function: {name, arguments}}`) when
    /// there are calls, `tool_call_id` / `name` on tool results. `content` is always a string.
    pub fn template_value(&self, arguments_form: ToolArgumentsForm) -> minijinja::Value {
        use minijinja::Value as Jinja;
        let mut view: Vec<(&'static str, Jinja)> = Vec::with_capacity(6);
        view.push(("role", Jinja::from(self.role.as_str())));
        view.push(("content", Jinja::from(self.content.as_str())));
        if let Some(reasoning) = self.reasoning_content() {
            view.push(("reasoning_content", Jinja::from(reasoning)));
        }
        if !self.tool_calls.is_empty() {
            let calls: Vec<Jinja> = self
                .tool_calls
                .iter()
                .map(|call| {
                    let arguments = match arguments_form {
                        ToolArgumentsForm::RawText => Jinja::from(call.arguments.as_str()),
                        ToolArgumentsForm::Object => {
                            match serde_json::from_str::<Value>(&call.arguments) {
                                Ok(parsed) => Jinja::from(minijinja::value::Serde(&parsed)),
                                Err(_) => Jinja::from(call.arguments.as_str()),
                            }
                        }
                    };
                    let function = Jinja::from_pairs([
                        ("name", Jinja::from(call.name.as_str())),
                        ("arguments", arguments),
                    ]);
                    Jinja::from_pairs([
                        ("id", Jinja::from(call.id.as_str())),
                        ("type", Jinja::from("function")),
                        ("function", function),
                    ])
                })
                .collect();
            view.push(("tool_calls", Jinja::from(calls)));
        }
        if let Some(id) = &self.tool_call_id {
            view.push(("tool_call_id", Jinja::from(id.as_str())));
        }
        if let Some(name) = &self.tool_name {
            view.push(("name", Jinja::from(name.as_str())));
        }
        Jinja::from_pairs(view)
    }
}

/// A function tool the model may call.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    /// JSON Schema of the arguments, key order as sent.
    pub parameters: Value,
}

impl Tool {
    /// `{"type": "function", "function": {"name", "description", "parameters"}}`, the shape HF
    /// templates iterate over.
    pub fn template_view(&self) -> Value {
        let mut function = Map::new();
        function.insert("name".into(), Value::from(self.name.clone()));
        if let Some(description) = &self.description {
            function.insert("description".into(), Value::from(description.clone()));
        }
        function.insert("parameters".into(), self.parameters.clone());
        json!({"type": "function", "function": Value::Object(function)})
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Default, serde::Serialize)]
pub enum ToolChoice {
    #[default]
    Auto,
    None,
    /// Anthropic `any`, OpenAI `required`.
    Required,
    /// This tool, by name.
    Tool(String),
}

/// Why a request's tools or tool calls cannot be served ([`ChatRequest::tool_problem`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolProblem {
    /// `tool_choice` names a tool the request does not list: the model would be made to call
    /// a tool the harness cannot run.
    UnknownChoice(String),
    /// `tool_choice` requires a tool call, but the request lists no tool.
    RequiredWithoutTools,
    /// Two tool calls of the history share an id: results cannot be paired with their calls,
    /// and the proxy's payload cache (keyed by call id) would give the second call the
    /// first one's arguments.
    DuplicateCallId(String),
}

impl ToolProblem {
    /// The problem in words, for an error whose `param` names the field (`choice_field` is
    /// where the API keeps the chosen tool's name).
    pub fn message(&self) -> String {
        match self {
            ToolProblem::UnknownChoice(name) => {
                format!("names tool `{name}`, which is not among the request's tools")
            }
            ToolProblem::RequiredWithoutTools => {
                "requires a tool call, but the request lists no tools".to_string()
            }
            ToolProblem::DuplicateCallId(id) => format!(
                "tool call id `{id}` appears on more than one tool call; tool call ids must be unique"
            ),
        }
    }
}

/// Fails with the request's [`ToolProblem`], if any, as an invalid-request error of its API:
/// `choice_field` is where the API names the chosen tool (`tool_choice.name`), `history_field`
/// where it keeps the conversation (`messages`, `input`).
pub(crate) fn check_tools(
    chat: &ChatRequest,
    choice_field: &str,
    history_field: &str,
) -> Result<(), crate::ApiError> {
    let Some(problem) = chat.tool_problem() else {
        return Ok(());
    };
    let field = match problem {
        ToolProblem::UnknownChoice(_) => choice_field,
        ToolProblem::RequiredWithoutTools => "tool_choice",
        ToolProblem::DuplicateCallId(_) => history_field,
    };
    Err(crate::ApiError::invalid_field(
        chat.api,
        field,
        problem.message(),
    ))
}

/// The harness's reasoning request (Anthropic `thinking`, OpenAI `reasoning`/`reasoning_effort`).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum ReasoningRequest {
    #[default]
    Unspecified,
    Disabled,
    Enabled {
        budget_tokens: Option<u32>,
    },
    /// Anthropic `adaptive` or an OpenAI effort level.
    Adaptive {
        effort: Option<String>,
    },
}

#[derive(Clone, Debug, PartialEq, Default)]
pub struct SamplingParams {
    /// Anthropic `max_tokens`, OpenAI `max_completion_tokens` / `max_tokens`,
    /// Responses `max_output_tokens`.
    pub max_tokens: Option<u32>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<u32>,
    pub stop: Vec<String>,
    pub seed: Option<i64>,
}

/// A parsed request of any API, in the internal representation.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatRequest {
    pub api: Api,
    pub model: String,
    pub messages: Vec<Message>,
    /// Tools rendered into the prompt (deferred and hosted tools excluded).
    pub tools: Vec<Tool>,
    /// Names of tools the request lists but the prompt does not show: Anthropic
    /// `defer_loading` tools, hosted/server tools (`web_search`, …).
    pub omitted_tools: Vec<String>,
    /// Tools among `tools` that take plain text (OpenAI Responses `custom` tools): their calls
    /// go back as `custom_tool_call` items.
    pub freeform_tools: Vec<String>,
    /// Harness-run tool-search tools among `tools` (Codex's `tool_search`): their calls go
    /// back as `tool_search_call` items.
    pub search_tools: Vec<String>,
    /// The Responses API's typed client-run tools among `tools` (`local_shell`, `shell`,
    /// `apply_patch`, as functions of those names): their calls go back as items of the tool's
    /// own type (see `crate::typed_tools`).
    pub typed_tools: crate::typed_tools::TypedTools,
    pub tool_choice: ToolChoice,
    pub parallel_tool_calls: Option<bool>,
    pub reasoning: ReasoningRequest,
    pub sampling: SamplingParams,
    pub stream: bool,
    /// OpenAI `stream_options.include_usage`.
    pub stream_include_usage: bool,
    /// Anthropic `metadata.user_id`, OpenAI `user` / `prompt_cache_key` (session hints).
    pub user: Option<String>,
    /// Top-level fields the parser knows and deliberately ignores (`context_management`,
    /// `store`, …).
    pub ignored_fields: Vec<String>,
    /// Top-level fields the parser does not know; tolerated.
    pub unknown_fields: Vec<String>,
    /// The harness said, outside the body, that this call is a context compaction (Codex's
    /// `x-codex-turn-metadata` header with `request_kind: "compaction"`). The body's own
    /// compaction instructions are recognised as well; this holds when their wording changes.
    pub harness_compaction: bool,
    /// OpenAI Responses: the input ends with a `compaction_trigger`, so the answer's text goes
    /// out as one `compaction` item (see `crate::compaction`).
    pub remote_compaction: bool,
    /// OpenAI Responses: the request's settings its `response` object echoes (`tools`,
    /// `tool_choice`, `instructions`, `temperature`, …, with the API's defaults for those left
    /// out).
    pub response_settings: Option<std::sync::Arc<serde_json::Map<String, serde_json::Value>>>,
    /// OpenAI Chat `logprobs`: the answer lists every sampled token with its behaviour
    /// log-prob.
    pub logprobs: bool,
    /// The format the answer must take (OpenAI `response_format` / `text.format`, Anthropic
    /// `output_config.format`); `None`: plain text.
    pub answer_format: Option<crate::answer_format::AnswerFormat>,
    /// An Anthropic request with a Message Threads `thread`: what its answer is held as when
    /// it ends (see [`crate::message_threads`]).
    pub thread_hold: Option<std::sync::Arc<crate::message_threads::ThreadHold>>,
}

impl ChatRequest {
    pub fn new(api: Api, model: impl Into<String>) -> Self {
        Self {
            api,
            model: model.into(),
            messages: Vec::new(),
            tools: Vec::new(),
            omitted_tools: Vec::new(),
            freeform_tools: Vec::new(),
            search_tools: Vec::new(),
            typed_tools: crate::typed_tools::TypedTools::default(),
            tool_choice: ToolChoice::Auto,
            parallel_tool_calls: None,
            reasoning: ReasoningRequest::Unspecified,
            sampling: SamplingParams::default(),
            stream: false,
            stream_include_usage: false,
            user: None,
            ignored_fields: Vec::new(),
            unknown_fields: Vec::new(),
            harness_compaction: false,
            remote_compaction: false,
            response_settings: None,
            logprobs: false,
            answer_format: None,
            thread_hold: None,
        }
    }

    /// What no API accepts in a request's tools and tool calls, whatever its parser read:
    /// the caller reports it in its API's error format, naming its own field.
    pub fn tool_problem(&self) -> Option<ToolProblem> {
        let listed = |name: &str| {
            self.tools.iter().any(|tool| tool.name == name)
                || self.omitted_tools.iter().any(|tool| tool == name)
        };
        match &self.tool_choice {
            ToolChoice::Tool(name) if !listed(name) => {
                return Some(ToolProblem::UnknownChoice(name.clone()))
            }
            ToolChoice::Required if self.tools.is_empty() && self.omitted_tools.is_empty() => {
                return Some(ToolProblem::RequiredWithoutTools)
            }
            _ => {}
        }
        let mut seen = std::collections::HashSet::new();
        self.messages
            .iter()
            .flat_map(|message| &message.tool_calls)
            .filter(|call| !call.id.is_empty())
            .find(|call| !seen.insert(call.id.as_str()))
            .map(|call| ToolProblem::DuplicateCallId(call.id.clone()))
    }

    /// Whether the last message is an assistant message.
    pub fn ends_with_assistant(&self) -> bool {
        self.messages
            .last()
            .is_some_and(|message| message.role == Role::Assistant)
    }

    /// Whether the harness pre-filled the start of the answer: an Anthropic request whose last
    /// message is an assistant message without tool calls. The model continues that message
    /// instead of opening a new turn, and the answer is the continuation only. In the OpenAI
    /// APIs a final assistant message is history like any other, and so is an Anthropic one
    /// that calls tools (its text cannot be continued past the calls).
    pub fn continues_final_message(&self) -> bool {
        self.api == Api::Anthropic
            && self.messages.last().is_some_and(|message| {
                message.role == Role::Assistant && message.tool_calls.is_empty()
            })
    }
}
