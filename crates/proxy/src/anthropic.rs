//! Anthropic Messages requests (`POST /v1/messages`, `/v1/messages/count_tokens`): the request
//! types, the parser over raw bytes, and the conversion to internal messages.
//!
//! Normalisation that makes Claude Code's turn-to-turn re-sends comparable: `cache_control`
//! is dropped everywhere; `system` and message `content` given as a string or as a list of
//! text blocks give the same result; `is_error: false` equals an absent `is_error`.
//! Accepted beyond the public API because Claude Code sends it: `role: "system"` messages
//! inside `messages` (mid-conversation system prompts).

use serde::Serialize;
use serde_json::Value;

use crate::answer_format::AnswerFormat;
use crate::api_error::ApiError;
use crate::messages::{
    Api, ChatRequest, Message, Reasoning, ReasoningRequest, Role, SamplingParams, Tool, ToolCall,
    ToolChoice, TEXT_PART_SEPARATOR,
};
use crate::reader::{body_object, classify_fields, Node, Read, ToolNames};

const API: Api = Api::Anthropic;

const KNOWN_FIELDS: &[&str] = &[
    "model",
    "max_tokens",
    "messages",
    "system",
    "tools",
    "tool_choice",
    "stream",
    "temperature",
    "top_p",
    "top_k",
    "stop_sequences",
    "metadata",
    "thinking",
    "output_config",
    "output_format",
];
/// Fields the proxy accepts and does not act on (Claude Code sends most of them every turn).
const IGNORED_FIELDS: &[&str] = &[
    "context_management",
    "service_tier",
    "container",
    "mcp_servers",
    "betas",
    "inference_geo",
];

/// A text block with `cache_control` (and `citations`) dropped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TextBlock {
    pub text: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum InputRole {
    User,
    Assistant,
    /// Claude Code's mid-conversation system messages.
    System,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    Text {
        text: String,
    },
    Thinking {
        thinking: String,
        signature: String,
    },
    RedactedThinking {
        data: String,
    },
    ToolUse {
        id: String,
        name: String,
        /// Always a JSON object.
        input: Value,
    },
    ToolResult {
        tool_use_id: String,
        /// A string `content` becomes one block.
        content: Vec<ResultPart>,
        is_error: bool,
    },
    /// A system message's `tool_addition` / `tool_removal` (Claude Code's
    /// `mid-conversation-tool-changes` beta): the tool by name (`tool_reference`) or, for an
    /// addition, by its whole definition (`tool_definition`).
    ToolChange {
        removed: bool,
        name: String,
        /// The `tool_definition`'s `definition` object, when given in full.
        definition: Option<Value>,
    },
}

/// One block of a `tool_result`'s content.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResultPart {
    Text {
        text: String,
    },
    /// Claude Code's `ToolSearch` answers with references to deferred tools, which the
    /// Anthropic API expands into their definitions. Rendered as the named tool's definition
    /// (the request's `tools` entry, deferred or not) in the function form the chat template
    /// shows tools in, so the model learns the schema it may now call.
    ToolReference {
        tool_name: String,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct InputMessage {
    pub role: InputRole,
    /// A string `content` becomes one text block.
    pub content: Vec<ContentBlock>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ToolDefinition {
    pub name: String,
    pub description: Option<String>,
    /// `None` for server tools (`web_search_…`), which have a `type` instead; a client-side
    /// built-in tool's is the one `crate::builtin_tools` gives.
    pub input_schema: Option<Value>,
    /// `type`: absent or `custom` for client tools.
    pub kind: Option<String>,
    pub defer_loading: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToolChoiceParam {
    Auto {
        disable_parallel_tool_use: bool,
    },
    Any {
        disable_parallel_tool_use: bool,
    },
    Tool {
        name: String,
        disable_parallel_tool_use: bool,
    },
    None,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ThinkingConfig {
    Enabled { budget_tokens: Option<u32> },
    Disabled,
    Adaptive { display: Option<String> },
}

/// A parsed Messages request.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MessagesRequest {
    pub model: String,
    /// Required by `/v1/messages`, absent from `count_tokens`.
    pub max_tokens: Option<u32>,
    /// A string `system` becomes one block; absent is empty.
    pub system: Vec<TextBlock>,
    pub messages: Vec<InputMessage>,
    pub tools: Vec<ToolDefinition>,
    pub tool_choice: Option<ToolChoiceParam>,
    pub stream: bool,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<u32>,
    pub stop_sequences: Vec<String>,
    /// `metadata.user_id` (Claude Code puts a JSON string with its session id here).
    pub user_id: Option<String>,
    pub thinking: Option<ThinkingConfig>,
    /// `output_config.format`, else the beta's `output_format`.
    pub answer_format: Option<AnswerFormat>,
    pub ignored_fields: Vec<String>,
    pub unknown_fields: Vec<String>,
}

/// Parses and converts a `/v1/messages` body.
pub fn parse(body: &[u8]) -> Result<ChatRequest, ApiError> {
    parse_request(body)?.to_chat()
}

/// Parses a `/v1/messages` body (`max_tokens` required).
pub fn parse_request(body: &[u8]) -> Result<MessagesRequest, ApiError> {
    read_value(&body_object(API, body)?)
}

/// Reads a `/v1/messages` body already parsed into a JSON value.
pub(crate) fn read_value(value: &Value) -> Result<MessagesRequest, ApiError> {
    read_request(Node::root(value, API), true)
}

/// Parses a `/v1/messages/count_tokens` body (no `max_tokens`).
pub fn parse_count_tokens(body: &[u8]) -> Result<MessagesRequest, ApiError> {
    parse_count_tokens_with(body, crate::media::MediaPolicy::Placeholder)
}

/// [`parse_count_tokens`] under a media policy: with `Reject`, a request holding an image or a
/// binary document is refused by its path, as the model call itself would be.
pub fn parse_count_tokens_with(
    body: &[u8],
    media: crate::media::MediaPolicy,
) -> Result<MessagesRequest, ApiError> {
    let value = body_object(API, body)?;
    if media == crate::media::MediaPolicy::Reject {
        if let Some((path, kind)) = crate::media::first_media_part(API, &value) {
            return Err(crate::media::rejected(API, path, &kind));
        }
    }
    read_request(Node::root(&value, API), false)
}

fn read_request(root: Node<'_>, max_tokens_required: bool) -> Read<MessagesRequest> {
    let object = root.object()?;
    let (ignored_fields, unknown_fields) = classify_fields(object, KNOWN_FIELDS, IGNORED_FIELDS);
    let model = root.required_str("model")?.to_string();
    if let Some(child) = root.get("safeguards")? {
        // Claude Code's auto mode asks Anthropic's servers to run a safeguard classifier over
        // the conversation (`max_tokens: 0`, no answer wanted). There is no such classifier
        // behind the proxy. The message's wording is the one the CLI reads as "not served
        // here": it then stops asking for an hour instead of asking again on every tool use.
        return Err(child.node().error(
            "server-side safeguard classifiers are not available to this caller: the proxy \
             serves the policy model only",
        ));
    }
    let max_tokens = if max_tokens_required {
        let child = root.required("max_tokens")?;
        let max_tokens = child.node().u32()?;
        if max_tokens == 0 {
            return Err(child.node().error("must be at least 1"));
        }
        Some(max_tokens)
    } else {
        root.optional_u32("max_tokens")?
    };
    let system = match root.get("system")? {
        None => Vec::new(),
        Some(child) => read_text_blocks(child.node())?,
    };
    let messages_child = root.required("messages")?;
    let message_nodes = messages_child.node().array()?;
    let messages = message_nodes
        .iter()
        .map(|child| read_message(child.node()))
        .collect::<Read<Vec<_>>>()?;
    let (Some(last), Some(last_node)) = (messages.last(), message_nodes.last()) else {
        return Err(messages_child
            .node()
            .error("at least one message is required"));
    };
    if last.role == InputRole::Assistant {
        check_prefill(last, last_node.node())?;
    }
    let tools = match root.get("tools")? {
        None => Vec::new(),
        Some(child) => {
            // A call names its tool by name alone, server tools' included.
            let mut names = ToolNames::default();
            child
                .node()
                .array()?
                .iter()
                .map(|tool| {
                    let definition = read_tool(tool.node())?;
                    names.add(tool.node().required("name")?.node(), &definition.name)?;
                    Ok(definition)
                })
                .collect::<Read<Vec<_>>>()?
        }
    };
    let tool_choice = root
        .get("tool_choice")?
        .map(|child| read_tool_choice(child.node()))
        .transpose()?;
    let thinking = root
        .get("thinking")?
        .map(|child| read_thinking(child.node()))
        .transpose()?;
    let mut answer_format = match root.get("output_config")? {
        None => None,
        Some(child) => crate::answer_format::read_anthropic_config(child.node())?,
    };
    if let Some(child) = root.get("output_format")? {
        let format = crate::answer_format::read_anthropic_format(child.node())?;
        answer_format = answer_format.or(format);
    }
    let user_id = match root.get("metadata")? {
        None => None,
        Some(child) => child.node().optional_str("user_id")?.map(str::to_string),
    };
    Ok(MessagesRequest {
        model,
        max_tokens,
        system,
        messages,
        tools,
        tool_choice,
        stream: root.optional_bool("stream")?.unwrap_or(false),
        temperature: root.optional_f64("temperature")?,
        top_p: root.optional_f64("top_p")?,
        top_k: root.optional_positive_u32("top_k")?,
        stop_sequences: root.stop_sequence_array("stop_sequences")?,
        user_id,
        thinking,
        answer_format,
        ignored_fields,
        unknown_fields,
    })
}

/// An `image`, `document` or `search_result` block as the text the model is shown (see
/// [`crate::media`]).
fn read_text_like(node: Node<'_>, kind: &str) -> Read<String> {
    node.object()?;
    Ok(match kind {
        "search_result" => crate::media::anthropic_search_result_text(node.value),
        "document" => match crate::media::anthropic_document_text(node.value) {
            Some(text) => text,
            None => crate::media::placeholder(kind, node.value),
        },
        _ => crate::media::placeholder(kind, node.value),
    })
}

fn unsupported_block(node: Node<'_>, kind: &str) -> ApiError {
    match kind {
        "image" | "document" => node.error(format!(
            "{kind} content is not supported: this model takes text only"
        )),
        _ => node.error(format!("unsupported content block type `{kind}`")),
    }
}

/// `string | [text block]` (system, tool_result content, system-role message content).
fn read_text_blocks(node: Node<'_>) -> Read<Vec<TextBlock>> {
    if let Some(text) = node.value.as_str() {
        return Ok(vec![TextBlock {
            text: text.to_string(),
        }]);
    }
    node.array()?
        .iter()
        .map(|child| {
            let block = child.node();
            let kind = block.type_tag()?;
            if kind != "text" {
                return Err(unsupported_block(block, kind));
            }
            Ok(TextBlock {
                text: block.required_str("text")?.to_string(),
            })
        })
        .collect()
}

/// A `tool_result`'s `content`: a string, or text and `tool_reference` blocks.
fn read_tool_change(node: Node<'_>, removed: bool) -> Read<ContentBlock> {
    let tool_child = node.required("tool")?;
    let tool = tool_child.node();
    match tool.type_tag()? {
        "tool_reference" => Ok(ContentBlock::ToolChange {
            removed,
            name: tool.required_str("name")?.to_string(),
            definition: None,
        }),
        "tool_definition" if !removed => {
            let definition_child = tool.required("definition")?;
            let definition = definition_child.node();
            definition.object()?;
            Ok(ContentBlock::ToolChange {
                removed,
                name: definition.required_str("name")?.to_string(),
                definition: Some(definition.value.clone()),
            })
        }
        other => Err(tool.error(format!(
            "unsupported tool type `{other}` in a `{}` block, expected {}",
            if removed {
                "tool_removal"
            } else {
                "tool_addition"
            },
            if removed {
                "tool_reference"
            } else {
                "tool_reference or tool_definition"
            }
        ))),
    }
}

fn read_result_parts(node: Node<'_>) -> Read<Vec<ResultPart>> {
    if let Some(text) = node.value.as_str() {
        return Ok(vec![ResultPart::Text {
            text: text.to_string(),
        }]);
    }
    node.array()?
        .iter()
        .map(|child| {
            let block = child.node();
            match block.type_tag()? {
                "text" => Ok(ResultPart::Text {
                    text: block.required_str("text")?.to_string(),
                }),
                "tool_reference" => Ok(ResultPart::ToolReference {
                    tool_name: block.required_str("tool_name")?.to_string(),
                }),
                kind @ ("image" | "document" | "search_result") => Ok(ResultPart::Text {
                    text: read_text_like(block, kind)?,
                }),
                kind => Err(unsupported_block(block, kind)),
            }
        })
        .collect()
}

fn read_message(node: Node<'_>) -> Read<InputMessage> {
    let role_child = node.required("role")?;
    let role = match role_child.node().str()? {
        "user" => InputRole::User,
        "assistant" => InputRole::Assistant,
        "system" => InputRole::System,
        other => {
            return Err(role_child.node().error(format!(
                "unknown role `{other}`, expected `user`, `assistant` or `system`"
            )))
        }
    };
    let content_child = node.required("content")?;
    let content_node = content_child.node();
    // As Anthropic's API: every message but a final assistant one (an empty prefill) has
    // content; a user turn with none asks nothing.
    let empty = match content_node.value {
        Value::String(text) => text.is_empty(),
        Value::Array(blocks) => blocks.is_empty(),
        _ => false,
    };
    if empty && role == InputRole::User {
        return Err(content_node.error("a user message must have non-empty content"));
    }
    if let Some(text) = content_node.value.as_str() {
        return Ok(InputMessage {
            role,
            content: vec![ContentBlock::Text {
                text: text.to_string(),
            }],
        });
    }
    let content = content_node
        .array()?
        .iter()
        .map(|child| read_block(child.node(), role))
        .collect::<Read<Vec<_>>>()?;
    Ok(InputMessage { role, content })
}

/// A final assistant message without `tool_use` is the start of the answer, which the model
/// continues (see [`ChatRequest::continues_final_message`]): as in Anthropic's API, its text
/// may not end in white space.
fn check_prefill(message: &InputMessage, node: Node<'_>) -> Read<()> {
    if message
        .content
        .iter()
        .any(|block| matches!(block, ContentBlock::ToolUse { .. }))
    {
        return Ok(());
    }
    let text_end = message.content.iter().rev().find_map(|block| match block {
        ContentBlock::Text { text } if !text.is_empty() => Some(text),
        _ => None,
    });
    if text_end.is_some_and(|text| text.ends_with(char::is_whitespace)) {
        return Err(node
            .required("content")?
            .node()
            .error("final assistant content cannot end with trailing whitespace"));
    }
    Ok(())
}

fn read_block(node: Node<'_>, role: InputRole) -> Read<ContentBlock> {
    let kind = node.type_tag()?;
    // Media, documents, search results and server-side tools' blocks are shown as text.
    let as_text = match (role, kind) {
        (InputRole::User, "image" | "document" | "search_result") => {
            Some(read_text_like(node, kind)?)
        }
        (InputRole::Assistant, _) => crate::media::anthropic_server_block_text(kind, node.value),
        _ => None,
    };
    if let Some(text) = as_text {
        return Ok(ContentBlock::Text { text });
    }
    if role == InputRole::System && matches!(kind, "tool_addition" | "tool_removal") {
        return read_tool_change(node, kind == "tool_removal");
    }
    let allowed = match role {
        InputRole::User => matches!(kind, "text" | "tool_result"),
        InputRole::Assistant => {
            matches!(kind, "text" | "thinking" | "redacted_thinking" | "tool_use")
        }
        InputRole::System => kind == "text",
    };
    let known = matches!(
        kind,
        "text" | "thinking" | "redacted_thinking" | "tool_use" | "tool_result"
    );
    if !known {
        return Err(unsupported_block(node, kind));
    }
    if !allowed {
        let role_name = match role {
            InputRole::User => "user",
            InputRole::Assistant => "assistant",
            InputRole::System => "system",
        };
        return Err(node.error(format!(
            "a `{kind}` block cannot appear in a {role_name} message"
        )));
    }
    Ok(match kind {
        "text" => ContentBlock::Text {
            text: node.required_str("text")?.to_string(),
        },
        "thinking" => ContentBlock::Thinking {
            thinking: node.required_str("thinking")?.to_string(),
            signature: node
                .optional_str("signature")?
                .unwrap_or_default()
                .to_string(),
        },
        "redacted_thinking" => ContentBlock::RedactedThinking {
            data: node.required_str("data")?.to_string(),
        },
        "tool_use" => {
            let input = node.required("input")?;
            input.node().object()?;
            ContentBlock::ToolUse {
                id: node.required_str("id")?.to_string(),
                name: node.required_str("name")?.to_string(),
                input: input.value.clone(),
            }
        }
        _ => {
            let content = match node.get("content")? {
                None => Vec::new(),
                Some(child) => read_result_parts(child.node())?,
            };
            ContentBlock::ToolResult {
                tool_use_id: node.required_str("tool_use_id")?.to_string(),
                content,
                is_error: node.optional_bool("is_error")?.unwrap_or(false),
            }
        }
    })
}

fn read_tool(node: Node<'_>) -> Read<ToolDefinition> {
    let kind = node.optional_str("type")?.map(str::to_string);
    if kind.as_deref() == Some("mcp_toolset") {
        // The API runs the tools of an MCP server it connects to (`mcp_servers`); no MCP
        // server is reachable through the proxy, and listing no tools would leave the model
        // unaware of them.
        return Err(node.required("type")?.node().error(
            "`mcp_toolset` tools are not supported by this proxy: MCP servers are not reachable \
             through it (run the MCP server in the harness and list its tools as client tools)",
        ));
    }
    let client_tool = matches!(kind.as_deref(), None | Some("custom"));
    let input_schema = match node.get("input_schema")? {
        Some(child) => {
            child.node().object()?;
            Some(child.value.clone())
        }
        None if client_tool => {
            return Err(ApiError::invalid_field(
                API,
                format!("{}.input_schema", node.path),
                "field required",
            ))
        }
        None => None,
    };
    let mut description = node.optional_str("description")?.map(str::to_string);
    // A client-side built-in tool (`bash_…`, `text_editor_…`, `memory_…`) is shown to the
    // model with the interface the harness runs (see `crate::builtin_tools`).
    let input_schema = match (input_schema, kind.as_deref()) {
        (None, Some(kind)) => match crate::builtin_tools::client_tool(kind) {
            Some((shown, schema)) => {
                description.get_or_insert_with(|| shown.to_string());
                Some(schema)
            }
            None => None,
        },
        (input_schema, _) => input_schema,
    };
    Ok(ToolDefinition {
        name: node.required_str("name")?.to_string(),
        description,
        input_schema,
        kind,
        defer_loading: node.optional_bool("defer_loading")?.unwrap_or(false),
    })
}

fn read_tool_choice(node: Node<'_>) -> Read<ToolChoiceParam> {
    let disable_parallel_tool_use = node
        .optional_bool("disable_parallel_tool_use")?
        .unwrap_or(false);
    Ok(match node.type_tag()? {
        "auto" => ToolChoiceParam::Auto {
            disable_parallel_tool_use,
        },
        "any" => ToolChoiceParam::Any {
            disable_parallel_tool_use,
        },
        "tool" => ToolChoiceParam::Tool {
            name: node.required_str("name")?.to_string(),
            disable_parallel_tool_use,
        },
        "none" => ToolChoiceParam::None,
        other => {
            return Err(ApiError::invalid_field(
                API,
                format!("{}.type", node.path),
                format!("unknown tool_choice type `{other}`"),
            ))
        }
    })
}

fn read_thinking(node: Node<'_>) -> Read<ThinkingConfig> {
    Ok(match node.type_tag()? {
        "enabled" => ThinkingConfig::Enabled {
            budget_tokens: node.optional_u32("budget_tokens")?,
        },
        "disabled" => ThinkingConfig::Disabled,
        // Newer modes (`between_tools`, …) leave when and how much to think to the model, as
        // adaptive does: refusing one would end the harness's run over a setting the policy
        // does not read anyway.
        _ => ThinkingConfig::Adaptive {
            display: node.optional_str("display")?.map(str::to_string),
        },
    })
}

/// For requests built in code rather than parsed (the parser rejects these earlier).
fn misplaced(message_index: usize, kind: &str, role: &str) -> ApiError {
    ApiError::invalid_field(
        API,
        format!("messages[{message_index}].content"),
        format!("a `{kind}` block cannot appear in a {role} message"),
    )
}

fn join_text(blocks: &[TextBlock]) -> String {
    blocks
        .iter()
        .map(|block| block.text.as_str())
        .collect::<Vec<_>>()
        .join(TEXT_PART_SEPARATOR)
}

/// Shows the tool definitions a history references (a `tool_reference` in a `tool_result`, a
/// `tool_addition` in a system message) as the function form the template shows tools in:
/// `{"type": "function", "function": {"name", "description", "parameters"}}`, compact JSON,
/// keys in that order. A tool is shown in full the first time the request references it and
/// by name after that (`{"type": "function", "function": {"name"}}`), so a body of many
/// references to one large schema cannot multiply it: the definitions shown add at most the
/// size of the request's own tools. The rule depends only on the history before a reference,
/// so a re-sent history renders as it did.
struct ToolShower<'a> {
    tools: &'a [ToolDefinition],
    /// Tools a `tool_removal` names anywhere in the history: an older reference to one of
    /// them may remain after the harness dropped it from `tools`.
    removed: std::collections::HashSet<&'a str>,
    shown: std::collections::HashSet<String>,
}

impl<'a> ToolShower<'a> {
    fn new(tools: &'a [ToolDefinition], messages: &'a [InputMessage]) -> Self {
        let removed = messages
            .iter()
            .filter(|message| message.role == InputRole::System)
            .flat_map(|message| &message.content)
            .filter_map(|block| match block {
                ContentBlock::ToolChange {
                    removed: true,
                    name,
                    ..
                } => Some(name.as_str()),
                _ => None,
            })
            .collect();
        ToolShower {
            tools,
            removed,
            shown: std::collections::HashSet::new(),
        }
    }

    /// `name`'s definition from the request's client tools, or `None` when it has none.
    fn reference(&mut self, name: &str) -> Option<String> {
        let tool = self
            .tools
            .iter()
            .find(|tool| tool.name == name && tool.input_schema.is_some())?;
        Some(self.show(
            &tool.name,
            tool.description.as_deref(),
            tool.input_schema.as_ref(),
        ))
    }

    fn show(&mut self, name: &str, description: Option<&str>, schema: Option<&Value>) -> String {
        let mut function = serde_json::Map::new();
        function.insert("name".into(), Value::String(name.to_string()));
        if self.shown.insert(name.to_string()) {
            if let Some(description) = description {
                function.insert("description".into(), Value::String(description.to_string()));
            }
            if let Some(schema) = schema {
                function.insert("parameters".into(), schema.clone());
            }
        }
        let mut definition = serde_json::Map::new();
        definition.insert("type".into(), Value::String("function".into()));
        definition.insert("function".into(), Value::Object(function));
        Value::Object(definition).to_string()
    }

    /// A `tool_result`'s content as one text: text blocks as they are, each `tool_reference`
    /// as the referenced tool's definition. `at` names the content for errors; a reference to
    /// a tool the request does not define is refused, unless the history removes that tool
    /// (then it reads `[tool `name` is no longer available]`).
    fn join_result(&mut self, parts: &[ResultPart], at: &str) -> Read<String> {
        let mut texts = Vec::with_capacity(parts.len());
        for (index, part) in parts.iter().enumerate() {
            match part {
                ResultPart::Text { text } => texts.push(text.clone()),
                ResultPart::ToolReference { tool_name } => match self.reference(tool_name) {
                    Some(shown) => texts.push(shown),
                    None if self.removed.contains(tool_name.as_str()) => {
                        texts.push(format!("[tool `{tool_name}` is no longer available]"))
                    }
                    None => {
                        return Err(ApiError::invalid_field(
                            API,
                            format!("{at}[{index}].tool_name"),
                            format!("`{tool_name}` is not a client tool in this request's `tools`"),
                        ))
                    }
                },
            }
        }
        Ok(texts.join(TEXT_PART_SEPARATOR))
    }

    /// A system message's `tool_addition` / `tool_removal` as text the model reads.
    fn tool_change(&mut self, removed: bool, name: &str, definition: Option<&Value>) -> String {
        if removed {
            return format!("Tool removed: `{name}` is no longer available.");
        }
        let shown = match definition {
            Some(definition) => Some(self.show(
                name,
                definition.get("description").and_then(Value::as_str),
                definition.get("input_schema"),
            )),
            None => self.reference(name),
        };
        match shown {
            Some(shown) => format!("Tool added: {shown}"),
            None => format!("Tool added: `{name}`."),
        }
    }
}

impl MessagesRequest {
    /// Converts to internal messages. Each `tool_result` becomes its own `tool` message, in
    /// request order (parallel results arrive in completion order); text blocks around them
    /// become user messages. Fails when a `tool_result` names a `tool_use` id that no earlier
    /// assistant message holds.
    pub fn to_chat(&self) -> Result<ChatRequest, ApiError> {
        let mut chat = ChatRequest::new(API, self.model.clone());
        if !self.system.is_empty() {
            chat.messages
                .push(Message::new(Role::System, join_text(&self.system)));
        }
        // Tool-use ids seen so far, with their tool names.
        let mut calls: std::collections::HashMap<String, String> = std::collections::HashMap::new();
        let mut shower = ToolShower::new(&self.tools, &self.messages);
        for (message_index, message) in self.messages.iter().enumerate() {
            match message.role {
                InputRole::System => {
                    let texts: Vec<String> = message
                        .content
                        .iter()
                        .filter_map(|block| match block {
                            ContentBlock::Text { text } => Some(text.clone()),
                            ContentBlock::ToolChange {
                                removed,
                                name,
                                definition,
                            } => Some(shower.tool_change(*removed, name, definition.as_ref())),
                            _ => None,
                        })
                        .collect();
                    chat.messages
                        .push(Message::new(Role::System, texts.join(TEXT_PART_SEPARATOR)));
                }
                InputRole::Assistant => {
                    let mut assistant = Message::new(Role::Assistant, "");
                    let mut texts: Vec<&str> = Vec::new();
                    for block in &message.content {
                        match block {
                            ContentBlock::Text { text } => texts.push(text),
                            ContentBlock::Thinking {
                                thinking,
                                signature,
                            } => assistant.reasoning.push(Reasoning {
                                text: thinking.clone(),
                                handle: (!signature.is_empty()).then(|| signature.clone()),
                                redacted: false,
                            }),
                            ContentBlock::RedactedThinking { data } => {
                                assistant.reasoning.push(Reasoning {
                                    text: String::new(),
                                    handle: Some(data.clone()),
                                    redacted: true,
                                })
                            }
                            ContentBlock::ToolUse { id, name, input } => {
                                calls.entry(id.clone()).or_insert(name.clone());
                                assistant.tool_calls.push(ToolCall {
                                    id: id.clone(),
                                    name: name.clone(),
                                    arguments: input.to_string(),
                                });
                            }
                            ContentBlock::ToolResult { .. } => {
                                return Err(misplaced(message_index, "tool_result", "assistant"))
                            }
                            ContentBlock::ToolChange { .. } => {
                                return Err(misplaced(message_index, "tool_addition", "assistant"))
                            }
                        }
                    }
                    assistant.content = texts.join(TEXT_PART_SEPARATOR);
                    chat.messages.push(assistant);
                }
                InputRole::User => {
                    // Borrowed until joined: one copy of each text into its message.
                    let mut pending: Vec<&str> = Vec::new();
                    let mut emitted = false;
                    for (block_index, block) in message.content.iter().enumerate() {
                        match block {
                            ContentBlock::Text { text } => pending.push(text),
                            ContentBlock::ToolResult {
                                tool_use_id,
                                content,
                                is_error,
                            } => {
                                if !pending.is_empty() {
                                    chat.messages.push(Message::new(
                                        Role::User,
                                        pending.join(TEXT_PART_SEPARATOR),
                                    ));
                                    pending.clear();
                                }
                                let Some(name) = calls.get(tool_use_id.as_str()) else {
                                    return Err(ApiError::invalid_field(
                                        API,
                                        format!(
                                            "messages[{message_index}].content[{block_index}].tool_use_id"
                                        ),
                                        format!(
                                            "no tool_use block with id `{tool_use_id}` in an earlier assistant message"
                                        ),
                                    ));
                                };
                                let text = shower.join_result(
                                    content,
                                    &format!(
                                        "messages[{message_index}].content[{block_index}].content"
                                    ),
                                )?;
                                chat.messages.push(Message::tool_result(
                                    tool_use_id.clone(),
                                    Some(name.clone()),
                                    text,
                                    *is_error,
                                ));
                                emitted = true;
                            }
                            ContentBlock::Thinking { .. } => {
                                return Err(misplaced(message_index, "thinking", "user"))
                            }
                            ContentBlock::RedactedThinking { .. } => {
                                return Err(misplaced(message_index, "redacted_thinking", "user"))
                            }
                            ContentBlock::ToolUse { .. } => {
                                return Err(misplaced(message_index, "tool_use", "user"))
                            }
                            ContentBlock::ToolChange { .. } => {
                                return Err(misplaced(message_index, "tool_addition", "user"))
                            }
                        }
                    }
                    if !pending.is_empty() || !emitted {
                        chat.messages
                            .push(Message::new(Role::User, pending.join(TEXT_PART_SEPARATOR)));
                    }
                }
            }
        }
        // An empty final assistant message pre-fills nothing: the answer is a new turn.
        if self.messages.last().map(|message| message.role) == Some(InputRole::Assistant)
            && chat.messages.last().is_some_and(|message| {
                message.content.is_empty()
                    && message.reasoning.is_empty()
                    && message.tool_calls.is_empty()
            })
        {
            chat.messages.pop();
        }
        for tool in &self.tools {
            match &tool.input_schema {
                Some(schema) if !tool.defer_loading => chat.tools.push(Tool {
                    name: tool.name.clone(),
                    description: tool.description.clone(),
                    parameters: schema.clone(),
                }),
                _ => chat.omitted_tools.push(tool.name.clone()),
            }
        }
        let mut parallel = None;
        chat.tool_choice = match &self.tool_choice {
            None => ToolChoice::Auto,
            Some(ToolChoiceParam::Auto {
                disable_parallel_tool_use,
            }) => {
                parallel = Some(!disable_parallel_tool_use);
                ToolChoice::Auto
            }
            Some(ToolChoiceParam::Any {
                disable_parallel_tool_use,
            }) => {
                parallel = Some(!disable_parallel_tool_use);
                ToolChoice::Required
            }
            Some(ToolChoiceParam::Tool {
                name,
                disable_parallel_tool_use,
            }) => {
                parallel = Some(!disable_parallel_tool_use);
                ToolChoice::Tool(name.clone())
            }
            Some(ToolChoiceParam::None) => ToolChoice::None,
        };
        chat.parallel_tool_calls = parallel;
        chat.reasoning = match &self.thinking {
            None => ReasoningRequest::Unspecified,
            Some(ThinkingConfig::Disabled) => ReasoningRequest::Disabled,
            Some(ThinkingConfig::Enabled { budget_tokens }) => ReasoningRequest::Enabled {
                budget_tokens: *budget_tokens,
            },
            Some(ThinkingConfig::Adaptive { .. }) => ReasoningRequest::Adaptive { effort: None },
        };
        chat.sampling = SamplingParams {
            max_tokens: self.max_tokens,
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            stop: self.stop_sequences.clone(),
            seed: None,
        };
        chat.stream = self.stream;
        chat.answer_format = self.answer_format.clone();
        chat.user = self.user_id.clone();
        chat.ignored_fields = self.ignored_fields.clone();
        chat.unknown_fields = self.unknown_fields.clone();
        crate::messages::check_tools(&chat, "tool_choice.name", "messages")?;
        Ok(chat)
    }
}
