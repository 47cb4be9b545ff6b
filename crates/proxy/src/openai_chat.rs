//! OpenAI Chat Completions requests (`POST /v1/chat/completions`): the request types, the
//! parser over raw bytes and the conversion to internal messages.
//!
//! Accepted extensions of vLLM/SGLang: assistant `reasoning_content` (or `reasoning`) in the
//! history, `top_k`. Tool-call `arguments` are strings and are kept byte for byte.

use serde::Serialize;
use serde_json::Value;

use crate::answer_format::AnswerFormat;
use crate::api_error::ApiError;
use crate::messages::{
    Api, ChatRequest, Message, Reasoning, ReasoningRequest, Role, SamplingParams, Tool, ToolCall,
    ToolChoice, TEXT_PART_SEPARATOR,
};
use crate::reader::{body_object, classify_fields, refuse_unsupported, Node, Read, ToolNames};

const API: Api = Api::OpenAiChat;

/// The most stop sequences OpenAI's Chat Completions takes.
const CHAT_STOP_SEQUENCES_MAX: usize = 4;

const KNOWN_FIELDS: &[&str] = &[
    "model",
    "messages",
    "tools",
    "tool_choice",
    "stream",
    "stream_options",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "stop",
    "n",
    "seed",
    "parallel_tool_calls",
    "user",
    "reasoning_effort",
    "logprobs",
    "top_logprobs",
    "response_format",
];
const IGNORED_FIELDS: &[&str] = &[
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
    "metadata",
    "store",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
    "modalities",
    "verbosity",
];
/// Members refused by name (see `reader::refuse_unsupported`): the pre-`tools` form of
/// function calling, which ignored would have the model answer without the functions.
const UNSUPPORTED_FIELDS: &[(&str, &str)] = &[
    (
        "functions",
        "the legacy function list; send the functions as `tools` of type `function`",
    ),
    (
        "function_call",
        "the legacy function choice; send `tool_choice` with `tools` instead",
    ),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ChatRole {
    System,
    Developer,
    User,
    Assistant,
    Tool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ChatToolCall {
    pub id: String,
    pub name: String,
    /// The `function.arguments` string, untouched.
    pub arguments: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ChatMessage {
    pub role: ChatRole,
    /// Text parts (a string `content` is one part; `null` is none).
    pub content: Vec<String>,
    pub reasoning_content: Option<String>,
    pub tool_calls: Vec<ChatToolCall>,
    pub tool_call_id: Option<String>,
    pub name: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FunctionTool {
    pub name: String,
    pub description: Option<String>,
    pub parameters: Option<Value>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ChatCompletionRequest {
    pub model: String,
    pub messages: Vec<ChatMessage>,
    pub tools: Vec<FunctionTool>,
    /// Tools the model is not shown (types other than `function` and `custom`), by type.
    pub other_tools: Vec<String>,
    /// The names of freeform `custom` tools among `tools`: shown to the model as a function
    /// taking one string, `input`, and answered as `type: "custom"` tool calls.
    pub freeform_tools: Vec<String>,
    pub tool_choice: Option<ToolChoice>,
    pub stream: bool,
    pub include_usage: bool,
    /// `max_completion_tokens`, else the deprecated `max_tokens`.
    pub max_tokens: Option<u32>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<u32>,
    pub stop: Vec<String>,
    pub seed: Option<i64>,
    pub parallel_tool_calls: Option<bool>,
    pub user: Option<String>,
    pub reasoning_effort: Option<String>,
    /// `logprobs`: each sampled token's behaviour log-prob in the answer.
    pub logprobs: bool,
    /// `response_format` (`text` is `None`).
    pub answer_format: Option<AnswerFormat>,
    pub ignored_fields: Vec<String>,
    pub unknown_fields: Vec<String>,
}

/// Parses and converts a `/v1/chat/completions` body.
pub fn parse(body: &[u8]) -> Result<ChatRequest, ApiError> {
    parse_request(body)?.to_chat()
}

pub fn parse_request(body: &[u8]) -> Result<ChatCompletionRequest, ApiError> {
    read_value(&body_object(API, body)?)
}

/// Reads a body already parsed into a JSON value.
pub(crate) fn read_value(value: &Value) -> Result<ChatCompletionRequest, ApiError> {
    read_request(Node::root(value, API))
}

fn read_request(root: Node<'_>) -> Read<ChatCompletionRequest> {
    let object = root.object()?;
    let (ignored_fields, unknown_fields) = classify_fields(object, KNOWN_FIELDS, IGNORED_FIELDS);
    refuse_unsupported(root, UNSUPPORTED_FIELDS)?;
    let model = root.required_str("model")?.to_string();
    let messages_child = root.required("messages")?;
    let messages = messages_child
        .node()
        .array()?
        .iter()
        .map(|child| read_message(child.node()))
        .collect::<Read<Vec<_>>>()?;
    if messages.is_empty() {
        return Err(messages_child
            .node()
            .error("at least one message is required"));
    }
    let mut tools = Vec::new();
    let mut other_tools = Vec::new();
    let mut freeform_tools = Vec::new();
    let mut names = ToolNames::default();
    if let Some(child) = root.get("tools")? {
        for tool in child.node().array()? {
            let node = tool.node();
            let kind = node.type_tag()?;
            if kind == "function" {
                let function = node.required("function")?;
                let function = function.node();
                let parameters = match function.get("parameters")? {
                    None => None,
                    Some(child) => {
                        child.node().object()?;
                        Some(child.value.clone())
                    }
                };
                let name = function.required_str("name")?;
                names.add(function.required("name")?.node(), name)?;
                tools.push(FunctionTool {
                    name: name.to_string(),
                    description: function.optional_str("description")?.map(str::to_string),
                    parameters,
                });
            } else if kind == "custom" {
                // A freeform tool (GPT-5's plain-text tools): the model sees a function with
                // one string parameter, as in the Responses API (`openai_responses::read_tool`).
                let custom = node.required("custom")?;
                let custom = custom.node();
                let name = custom.required_str("name")?;
                names.add(custom.required("name")?.node(), name)?;
                let mut input = String::from("The tool's whole input, as plain text (not JSON).");
                if let Some(format) = custom.get("format")? {
                    let format = format.node();
                    format.object()?;
                    if let Some(grammar) = format.get("grammar")? {
                        let grammar = grammar.node();
                        grammar.object()?;
                        let definition = grammar.required_str("definition")?;
                        let syntax = grammar.optional_str("syntax")?.unwrap_or("grammar");
                        input.push_str(&format!(
                            " It must match this {syntax} grammar:\n{definition}"
                        ));
                    }
                }
                freeform_tools.push(name.to_string());
                tools.push(FunctionTool {
                    name: name.to_string(),
                    description: custom.optional_str("description")?.map(str::to_string),
                    parameters: Some(serde_json::json!({
                        "type": "object",
                        "properties": {"input": {"type": "string", "description": input}},
                        "required": ["input"],
                        "additionalProperties": false,
                    })),
                });
            } else {
                other_tools.push(kind.to_string());
            }
        }
    }
    let tool_choice = root
        .get("tool_choice")?
        .map(|child| read_tool_choice(child.node()))
        .transpose()?;
    if let Some(n) = root.get("n")? {
        if n.node().u32()? != 1 {
            return Err(n.node().error("only n = 1 is supported"));
        }
    }
    let include_usage = match root.get("stream_options")? {
        None => false,
        Some(child) => child
            .node()
            .optional_bool("include_usage")?
            .unwrap_or(false),
    };
    // The engines return the sampled token's log-prob only, not the alternatives.
    if let Some(top) = root.get("top_logprobs")? {
        if top.node().value.as_u64() != Some(0) && !top.node().value.is_null() {
            return Err(top.node().error(
                "is not supported: the engines return each sampled token's log-prob, not the \
                 most likely alternatives; send `logprobs: true` without it",
            ));
        }
    }
    let max_tokens = match root.optional_token_limit("max_completion_tokens")? {
        Some(max_tokens) => Some(max_tokens),
        None => root.optional_token_limit("max_tokens")?,
    };
    Ok(ChatCompletionRequest {
        model,
        messages,
        tools,
        other_tools,
        freeform_tools,
        tool_choice,
        stream: root.optional_bool("stream")?.unwrap_or(false),
        include_usage,
        max_tokens,
        temperature: root.optional_f64("temperature")?,
        top_p: root.optional_f64("top_p")?,
        top_k: root.optional_top_k("top_k")?,
        stop: read_stop(root)?,
        seed: root.optional_i64("seed")?,
        parallel_tool_calls: root.optional_bool("parallel_tool_calls")?,
        user: root.optional_str("user")?.map(str::to_string),
        reasoning_effort: root.optional_str("reasoning_effort")?.map(str::to_string),
        logprobs: root.optional_bool("logprobs")?.unwrap_or(false),
        answer_format: match root.get("response_format")? {
            None => None,
            Some(child) => crate::answer_format::read_chat(child.node())?,
        },
        ignored_fields,
        unknown_fields,
    })
}

/// `string | null | [content part]`: the text parts.
fn read_content(node: Node<'_>, allow_refusal: bool) -> Read<Vec<String>> {
    if let Some(text) = node.value.as_str() {
        return Ok(vec![text.to_string()]);
    }
    node.array()?
        .iter()
        .map(|child| {
            let part = child.node();
            match part.type_tag()? {
                "text" => Ok(part.required_str("text")?.to_string()),
                "refusal" if allow_refusal => Ok(part.required_str("refusal")?.to_string()),
                kind @ ("image_url" | "input_audio" | "file") => {
                    part.object()?;
                    Ok(crate::media::placeholder(kind, part.value))
                }
                other => Err(part.error(format!("unsupported content part type `{other}`"))),
            }
        })
        .collect()
}

fn read_message(node: Node<'_>) -> Read<ChatMessage> {
    let role_child = node.required("role")?;
    let role = match role_child.node().str()? {
        "system" => ChatRole::System,
        "developer" => ChatRole::Developer,
        "user" => ChatRole::User,
        "assistant" => ChatRole::Assistant,
        "tool" => ChatRole::Tool,
        other => {
            return Err(role_child.node().error(format!(
                "unsupported role `{other}`, expected system, developer, user, assistant or tool"
            )))
        }
    };
    let content = match node.get("content")? {
        None if role == ChatRole::Assistant => Vec::new(),
        None => {
            return Err(ApiError::invalid_field(
                API,
                format!("{}.content", node.path),
                "field required",
            ))
        }
        Some(child) => read_content(child.node(), role == ChatRole::Assistant)?,
    };
    let mut tool_calls = Vec::new();
    let mut reasoning_content = None;
    if role == ChatRole::Assistant {
        if let Some(child) = node.get("tool_calls")? {
            for call in child.node().array()? {
                let call = call.node();
                let kind = call.optional_str("type")?.unwrap_or("function");
                match kind {
                    "function" => {
                        let function = call.required("function")?;
                        let function = function.node();
                        tool_calls.push(ChatToolCall {
                            id: call.required_str("id")?.to_string(),
                            name: function.required_str("name")?.to_string(),
                            arguments: function.required_str("arguments")?.to_string(),
                        });
                    }
                    // A freeform call renders as the `{"input": …}` call the model wrote.
                    "custom" => {
                        let custom = call.required("custom")?;
                        let custom = custom.node();
                        tool_calls.push(ChatToolCall {
                            id: call.required_str("id")?.to_string(),
                            name: custom.required_str("name")?.to_string(),
                            arguments: crate::openai_responses::freeform_arguments(
                                custom.required_str("input")?,
                            ),
                        });
                    }
                    other => {
                        return Err(call.error(format!(
                            "unsupported tool call type `{other}`, expected `function` or `custom`"
                        )))
                    }
                }
            }
        }
        reasoning_content = match node.optional_str("reasoning_content")? {
            Some(text) => Some(text.to_string()),
            None => node.optional_str("reasoning")?.map(str::to_string),
        };
    }
    let tool_call_id = if role == ChatRole::Tool {
        Some(node.required_str("tool_call_id")?.to_string())
    } else {
        None
    };
    Ok(ChatMessage {
        role,
        content,
        reasoning_content,
        tool_calls,
        tool_call_id,
        name: node.optional_str("name")?.map(str::to_string),
    })
}

fn read_tool_choice(node: Node<'_>) -> Read<ToolChoice> {
    if let Some(text) = node.value.as_str() {
        return match text {
            "auto" => Ok(ToolChoice::Auto),
            "none" => Ok(ToolChoice::None),
            "required" => Ok(ToolChoice::Required),
            other => Err(node.error(format!(
                "unknown tool_choice `{other}`, expected auto, none or required"
            ))),
        };
    }
    match node.type_tag()? {
        "function" => {
            let function = node.required("function")?;
            Ok(ToolChoice::Tool(
                function.node().required_str("name")?.to_string(),
            ))
        }
        "custom" => {
            let custom = node.required("custom")?;
            Ok(ToolChoice::Tool(
                custom.node().required_str("name")?.to_string(),
            ))
        }
        "allowed_tools" => Ok(ToolChoice::Auto),
        other => Err(node.error(format!("unknown tool_choice type `{other}`"))),
    }
}

impl ChatCompletionRequest {
    /// Converts to internal messages. Fails when a `tool` message's `tool_call_id` matches no
    /// tool call of an earlier assistant message.
    pub fn to_chat(&self) -> Result<ChatRequest, ApiError> {
        let mut chat = ChatRequest::new(API, self.model.clone());
        let mut calls: std::collections::HashMap<String, String> = std::collections::HashMap::new();
        for (index, message) in self.messages.iter().enumerate() {
            let text = message.content.join(TEXT_PART_SEPARATOR);
            let converted = match message.role {
                ChatRole::System | ChatRole::Developer => Message::new(Role::System, text),
                ChatRole::User => Message::new(Role::User, text),
                ChatRole::Assistant => {
                    let mut assistant = Message::new(Role::Assistant, text);
                    if let Some(reasoning) = &message.reasoning_content {
                        assistant.reasoning.push(Reasoning {
                            text: reasoning.clone(),
                            handle: None,
                            redacted: false,
                        });
                    }
                    for call in &message.tool_calls {
                        calls.entry(call.id.clone()).or_insert(call.name.clone());
                        assistant.tool_calls.push(ToolCall {
                            id: call.id.clone(),
                            name: call.name.clone(),
                            arguments: call.arguments.clone(),
                        });
                    }
                    assistant
                }
                ChatRole::Tool => {
                    let id = message.tool_call_id.clone().unwrap_or_default();
                    let Some(name) = calls.get(id.as_str()) else {
                        return Err(ApiError::invalid_field(
                            API,
                            format!("messages[{index}].tool_call_id"),
                            format!("no tool call with id `{id}` in an earlier assistant message"),
                        ));
                    };
                    Message::tool_result(
                        id.clone(),
                        Some(message.name.clone().unwrap_or_else(|| name.clone())),
                        text,
                        false,
                    )
                }
            };
            chat.messages.push(converted);
        }
        chat.tools = self
            .tools
            .iter()
            .map(|tool| Tool {
                name: tool.name.clone(),
                description: tool.description.clone(),
                parameters: tool.parameters.clone().unwrap_or(Value::Null),
            })
            .collect();
        chat.omitted_tools = self.other_tools.clone();
        chat.freeform_tools = self.freeform_tools.clone();
        chat.tool_choice = self.tool_choice.clone().unwrap_or_default();
        chat.parallel_tool_calls = self.parallel_tool_calls;
        chat.reasoning = match self.reasoning_effort.as_deref() {
            None => ReasoningRequest::Unspecified,
            Some("none") => ReasoningRequest::Disabled,
            Some(effort) => ReasoningRequest::Adaptive {
                effort: Some(effort.to_string()),
            },
        };
        chat.sampling = SamplingParams {
            max_tokens: self.max_tokens,
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            stop: self.stop.clone(),
            seed: self.seed,
        };
        chat.stream = self.stream;
        chat.stream_include_usage = self.include_usage;
        chat.logprobs = self.logprobs;
        chat.answer_format = self.answer_format.clone();
        chat.user = self.user.clone();
        chat.ignored_fields = self.ignored_fields.clone();
        chat.unknown_fields = self.unknown_fields.clone();
        crate::messages::check_tools(&chat, "tool_choice.function.name", "messages")?;
        Ok(chat)
    }
}

/// `stop`: a string or an array of strings (see [`Node::stop_sequences`]), at most
/// [`CHAT_STOP_SEQUENCES_MAX`] of them, as OpenAI's API refuses more.
fn read_stop(root: Node<'_>) -> Read<Vec<String>> {
    let stop = root.stop_sequences("stop")?;
    if stop.len() > CHAT_STOP_SEQUENCES_MAX {
        return Err(ApiError::invalid_field(
            API,
            "stop",
            format!(
                "at most {CHAT_STOP_SEQUENCES_MAX} stop sequences, got {}",
                stop.len()
            ),
        ));
    }
    Ok(stop)
}
