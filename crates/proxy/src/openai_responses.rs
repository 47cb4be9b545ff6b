//! OpenAI Responses requests (`POST /v1/responses`, what the Codex CLI speaks): the request
//! types, the parser over raw bytes and the conversion to internal messages.
//!
//! This parser reads whole conversations: the server resolves `previous_response_id` and
//! `item_reference`s before it (`stored_responses`: the request becomes the one a stateless
//! client would send), and a body that still holds either is rejected. Consecutive assistant-side items
//! (reasoning, assistant message, function calls) of one response become one internal
//! assistant message; a reasoning item after text or calls, or a message after calls, starts
//! a new one. Function-call `arguments` strings are kept byte for byte; reasoning items keep
//! `encrypted_content` as their handle.

use serde::Serialize;
use serde_json::{json, Value};

use crate::answer_format::AnswerFormat;
use crate::api_error::ApiError;
use crate::messages::{
    Api, ChatRequest, Message, Reasoning, ReasoningRequest, Role, SamplingParams, Tool, ToolCall,
    ToolChoice, TEXT_PART_SEPARATOR,
};
use crate::reader::{body_object, classify_fields, refuse_unsupported, Node, Read, ToolNames};
use crate::typed_tools::{TypedTool, TypedTools};

const API: Api = Api::OpenAiResponses;

/// The smallest `max_output_tokens` OpenAI's Responses API takes.
const MAX_OUTPUT_TOKENS_MIN: u32 = 16;

const KNOWN_FIELDS: &[&str] = &[
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "stream",
    "max_output_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "parallel_tool_calls",
    "reasoning",
    "previous_response_id",
    "prompt_cache_key",
    "user",
    "text",
    "generate",
];
/// Members refused by name (see `reader::refuse_unsupported`).
const UNSUPPORTED_FIELDS: &[(&str, &str)] = &[(
    "conversation",
    "it holds no server-side conversations; send the whole conversation in `input`, or \
     continue a response with `previous_response_id`",
)];
const IGNORED_FIELDS: &[&str] = &[
    "store",
    "include",
    "metadata",
    "truncation",
    "service_tier",
    "safety_identifier",
    "background",
    "stream_options",
    "top_logprobs",
    "max_tool_calls",
    "prompt",
    "client_metadata",
];

/// Why `background: true` is refused, over HTTP and the WebSocket alike.
pub(crate) const BACKGROUND_REFUSED: &str = "background responses are not served: this proxy answers a request while its connection is open (leave `background` out or false)";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemRole {
    User,
    Assistant,
    System,
    Developer,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum InputItem {
    Message {
        role: ItemRole,
        /// Text parts (`input_text`, `output_text`, `refusal`); a string is one part.
        content: Vec<String>,
    },
    FunctionCall {
        call_id: String,
        name: String,
        /// The raw `arguments` string.
        arguments: String,
    },
    FunctionCallOutput {
        call_id: String,
        output: String,
    },
    /// A freeform (`custom`) tool call: `input` is plain text, kept as the arguments.
    CustomToolCall {
        call_id: String,
        name: String,
        input: String,
    },
    CustomToolCallOutput {
        call_id: String,
        output: String,
    },
    /// A call of the harness's `tool_search` tool: its `arguments` object as JSON text.
    ToolSearchCall {
        call_id: String,
        arguments: String,
    },
    /// The tools a `tool_search` call loaded, as the text the model reads, and the freeform
    /// ones among them (their calls go out as `custom_tool_call`).
    ToolSearchOutput {
        call_id: String,
        output: String,
        freeform: Vec<String>,
    },
    Reasoning {
        id: Option<String>,
        /// `content[].reasoning_text` if present, else the `summary[].summary_text` texts.
        text: String,
        encrypted_content: Option<String>,
    },
    /// `compaction_trigger`: compact the conversation now (see `crate::compaction`).
    CompactionTrigger,
    /// `compaction`: the summary an earlier compaction answered, in place of the history.
    Compaction {
        summary: String,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ResponsesRequest {
    pub model: String,
    pub instructions: Option<String>,
    pub input: Vec<InputItem>,
    pub tools: Vec<Tool>,
    /// Hosted and other tools the model is not shown (`web_search`, …), by name or type.
    pub other_tools: Vec<String>,
    /// The (qualified) names of freeform `custom` tools among `tools`: shown to the model as a
    /// function taking one string, `input`, and answered as `custom_tool_call` items.
    pub freeform_tools: Vec<String>,
    /// The names of client-executed `tool_search` tools among `tools`: their calls go out as
    /// `tool_search_call` items.
    pub search_tools: Vec<String>,
    /// The typed client-run tools among `tools` (`local_shell`, `shell`, `apply_patch`, each a
    /// function of that name): their calls go out as items of the tool's own type (see
    /// `crate::typed_tools`).
    pub typed_tools: TypedTools,
    pub tool_choice: Option<ToolChoice>,
    pub stream: bool,
    pub max_output_tokens: Option<u32>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<u32>,
    pub seed: Option<i64>,
    pub parallel_tool_calls: Option<bool>,
    pub reasoning_effort: Option<String>,
    /// `prompt_cache_key`, else `user`.
    pub user: Option<String>,
    /// `text.format` (`text` is `None`).
    pub answer_format: Option<AnswerFormat>,
    pub ignored_fields: Vec<String>,
    pub unknown_fields: Vec<String>,
    /// The settings the `response` object echoes (see [`echoed_settings`]).
    pub settings: std::sync::Arc<serde_json::Map<String, Value>>,
}

/// The request's settings as its `response` object echoes them: each as the request sent it,
/// or the API's default when it is absent or null (`tools` `[]`, `tool_choice` `"auto"`,
/// `temperature` and `top_p` 1, `store` true, …). `previous_response_id` is null here: the
/// server resolved it before this parse and sets it on the settings of a chained request.
pub fn echoed_settings(body: &Value) -> serde_json::Map<String, Value> {
    let field = |name: &str, default: Value| {
        body.get(name)
            .filter(|value| !value.is_null())
            .cloned()
            .unwrap_or(default)
    };
    let mut settings = serde_json::Map::new();
    for (name, default) in [
        ("instructions", Value::Null),
        ("max_output_tokens", Value::Null),
        ("max_tool_calls", Value::Null),
        ("metadata", json!({})),
        ("parallel_tool_calls", Value::Bool(true)),
        ("previous_response_id", Value::Null),
        ("prompt_cache_key", Value::Null),
        ("reasoning", json!({"effort": null, "summary": null})),
        ("service_tier", json!("default")),
        ("store", Value::Bool(true)),
        ("temperature", json!(1.0)),
        ("text", json!({"format": {"type": "text"}})),
        ("tool_choice", json!("auto")),
        ("tools", json!([])),
        ("top_logprobs", json!(0)),
        ("top_p", json!(1.0)),
        ("truncation", json!("disabled")),
        ("user", Value::Null),
    ] {
        let value = if name == "previous_response_id" {
            Value::Null
        } else {
            field(name, default)
        };
        settings.insert(name.to_string(), value);
    }
    settings
}

/// Parses and converts a `/v1/responses` body.
pub fn parse(body: &[u8]) -> Result<ChatRequest, ApiError> {
    parse_request(body)?.to_chat()
}

pub fn parse_request(body: &[u8]) -> Result<ResponsesRequest, ApiError> {
    read_value(&body_object(API, body)?)
}

/// Reads a body already parsed into a JSON value.
pub(crate) fn read_value(value: &Value) -> Result<ResponsesRequest, ApiError> {
    read_request(Node::root(value, API))
}

fn read_request(root: Node<'_>) -> Read<ResponsesRequest> {
    let object = root.object()?;
    let (ignored_fields, unknown_fields) = classify_fields(object, KNOWN_FIELDS, IGNORED_FIELDS);
    refuse_unsupported(root, UNSUPPORTED_FIELDS)?;
    // `"generate": false` is a warm-up the server answers without sampling; read here so that
    // any other value than a boolean is refused, not taken for `true`.
    root.optional_bool("generate")?;
    if let Some(child) = root.get("previous_response_id")? {
        return Err(child.node().error(
            "is resolved by the server before this parser; send the whole conversation in `input` here",
        ));
    }
    if root.optional_bool("background")? == Some(true) {
        let child = root.required("background")?;
        return Err(child.node().error(BACKGROUND_REFUSED));
    }
    let model = root.required_str("model")?.to_string();
    let input_child = root.required("input")?;
    let input_node = input_child.node();
    let mut tools = Tools::named_once();
    if let Some(child) = root.get("tools")? {
        for tool in child.node().array()? {
            read_tool(tool.node(), None, &mut tools)?;
        }
    }
    let input = match input_node.value.as_str() {
        Some(text) => vec![InputItem::Message {
            role: ItemRole::User,
            content: vec![text.to_string()],
        }],
        None => {
            let mut items = Vec::new();
            for child in input_node.array()? {
                let node = child.node();
                // Codex's "responses lite" models list their tools in an input item instead
                // of `tools`; they are the request's tools all the same (the template shows
                // every tool in one place).
                // Codex's record of a settings change (reasoning effort, model) kept in its
                // history: the request's own fields say what applies now.
                if node.value.get("type").and_then(Value::as_str) == Some("configuration_update") {
                    continue;
                }
                // Each such item's names are checked among themselves: how the lite models'
                // items repeat across a conversation's history is not known here.
                if node.value.get("type").and_then(Value::as_str) == Some("additional_tools") {
                    let mut listed = Tools::named_once();
                    for tool in node.required("tools")?.node().array()? {
                        read_tool(tool.node(), None, &mut listed)?;
                    }
                    tools.append(listed);
                    continue;
                }
                items.push(read_item(node)?);
            }
            if items.is_empty() {
                return Err(input_node.error("at least one input item is required"));
            }
            items
        }
    };
    let Tools {
        functions: tools,
        other: other_tools,
        freeform: freeform_tools,
        search: search_tools,
        typed: typed_tools,
        names: _,
    } = tools;
    let tool_choice = root
        .get("tool_choice")?
        .map(|child| read_tool_choice(child.node()))
        .transpose()?;
    let reasoning_effort = match root.get("reasoning")? {
        None => None,
        Some(child) => child.node().optional_str("effort")?.map(str::to_string),
    };
    let user = match root.optional_str("prompt_cache_key")? {
        Some(key) => Some(key.to_string()),
        None => root.optional_str("user")?.map(str::to_string),
    };
    Ok(ResponsesRequest {
        model,
        instructions: root.optional_str("instructions")?.map(str::to_string),
        input,
        tools,
        other_tools,
        freeform_tools,
        search_tools,
        typed_tools,
        tool_choice,
        stream: root.optional_bool("stream")?.unwrap_or(false),
        max_output_tokens: read_max_output_tokens(root)?,
        temperature: root.optional_f64("temperature")?,
        top_p: root.optional_f64("top_p")?,
        top_k: root.optional_top_k("top_k")?,
        seed: root.optional_i64("seed")?,
        parallel_tool_calls: root.optional_bool("parallel_tool_calls")?,
        reasoning_effort,
        user,
        answer_format: match root.get("text")? {
            None => None,
            Some(child) => crate::answer_format::read_responses_text(child.node())?,
        },
        ignored_fields,
        unknown_fields,
        settings: std::sync::Arc::new(echoed_settings(root.value)),
    })
}

/// One entry of `tools`. A function is rendered for the model; a `namespace` (Codex groups its
/// sub-agent tools as `multi_agent_v1`) contributes its functions under qualified names,
/// `<namespace>.<function>`: function and namespace names cannot contain a dot, so the name a
/// call comes back with splits unambiguously into the `namespace` and `name` fields of the
/// `function_call` item (see `output/openai_responses.rs`). Hosted and other tools are named in
/// `other_tools` and not rendered.
///
/// A freeform `custom` tool (Codex's `apply_patch`, the lite models' `exec`) takes plain text,
/// not JSON. The model sees it as a function with one string parameter, `input`, whose
/// description carries the tool's input grammar when it has one; its calls go back to the
/// harness as `custom_tool_call` items carrying that string, and history's `custom_tool_call`
/// items render as the same `{"input": …}` call, so a turn renders as it was sampled.
fn read_tool(node: Node<'_>, namespace: Option<&str>, tools: &mut Tools) -> Read<()> {
    let kind = node.type_tag()?;
    let qualify = |name: &str| match namespace {
        Some(namespace) => format!("{namespace}{NAMESPACE_SEPARATOR}{name}"),
        None => name.to_string(),
    };
    match kind {
        "function" => {
            let parameters = optional_parameters(node)?;
            let name = tool_name(node, "function")?;
            tools.name_once(node.required("name")?.node(), &qualify(&name))?;
            tools.functions.push(Tool {
                name: qualify(&name),
                description: node.optional_str("description")?.map(str::to_string),
                parameters,
            });
        }
        "custom" => {
            let name = tool_name(node, "tool")?;
            let mut input = String::from("The tool's whole input, as plain text (not JSON).");
            if let Some(format) = node.get("format")? {
                let format = format.node();
                format.object()?;
                if let Some(definition) = format.optional_str("definition")? {
                    let syntax = format.optional_str("syntax")?.unwrap_or("grammar");
                    input.push_str(&format!(
                        " It must match this {syntax} grammar:\n{definition}"
                    ));
                }
            }
            let qualified = qualify(&name);
            tools.name_once(node.required("name")?.node(), &qualified)?;
            tools.freeform.push(qualified.clone());
            tools.functions.push(Tool {
                name: qualified,
                description: node.optional_str("description")?.map(str::to_string),
                parameters: serde_json::json!({
                    "type": "object",
                    "properties": {"input": {"type": "string", "description": input}},
                    "required": ["input"],
                    "additionalProperties": false,
                }),
            });
        }
        "namespace" if namespace.is_none() => {
            let name_child = node.required("name")?;
            let name = name_child.node().str()?;
            if name.is_empty() || name.contains(NAMESPACE_SEPARATOR) {
                return Err(name_child
                    .node()
                    .error(format!("namespace name `{name}` is empty or contains `.`")));
            }
            for member in node.required("tools")?.node().array()? {
                read_tool(member.node(), Some(name), tools)?;
            }
        }
        // Codex's deferred-tool search, run by the harness: the model sees and calls it as a
        // function; the tools it loads come back in a `tool_search_output` item.
        "tool_search" if node.optional_str("execution")? == Some("client") => {
            let name = qualify(node.optional_str("name")?.unwrap_or(kind));
            match node.get("name")? {
                Some(given) if given.node().str()?.is_empty() => {
                    return Err(given.node().error("a tool name must not be empty"));
                }
                Some(given) => tools.name_once(given.node(), &name)?,
                None => tools.name_once(node, &name)?,
            }
            let parameters = optional_parameters(node)?;
            tools.search.push(name.clone());
            tools.functions.push(Tool {
                name,
                description: node.optional_str("description")?.map(str::to_string),
                parameters,
            });
        }
        // The typed client-run tools (see `crate::typed_tools`): the model sees a function of
        // the tool's name; a `shell` in a hosted container runs at OpenAI, not in the harness.
        "local_shell" | "shell" | "apply_patch" if namespace.is_none() && !hosted_shell(node)? => {
            let tool = TypedTool::ALL
                .into_iter()
                .find(|tool| tool.name() == kind)
                .expect("matched by name");
            tools.name_once(node, tool.name())?;
            tools.typed.add(tool);
            tools.functions.push(Tool {
                name: tool.name().into(),
                description: Some(tool.description().into()),
                parameters: tool.parameters(),
            });
        }
        "namespace" => return Err(node.error("a namespace cannot contain another namespace")),
        _ => {
            let name = node.optional_str("name")?.unwrap_or(kind);
            tools.other.push(qualify(name));
        }
    }
    Ok(())
}

/// A tool's `parameters` schema (an object), or null without one.
fn optional_parameters(node: Node<'_>) -> Read<Value> {
    match node.get("parameters")? {
        None => Ok(Value::Null),
        Some(child) => {
            child.node().object()?;
            Ok(child.value.clone())
        }
    }
}

/// A tool's `name`, which may not be empty or contain the namespace separator (`what`: the
/// kind of tool, for the error).
fn tool_name(node: Node<'_>, what: &str) -> Read<String> {
    let child = node.required("name")?;
    let name = child.node().str()?;
    if name.is_empty() {
        return Err(child.node().error("a tool name must not be empty"));
    }
    if name.contains(NAMESPACE_SEPARATOR) {
        return Err(child
            .node()
            .error(format!("{what} name `{name}` contains `.`")));
    }
    Ok(name.to_string())
}

/// The tools of a request as `read_tool` sorts them.
#[derive(Default)]
struct Tools {
    /// Shown to the model: functions and freeform tools.
    functions: Vec<Tool>,
    other: Vec<String>,
    freeform: Vec<String>,
    search: Vec<String>,
    /// The typed client-run tools among `functions`.
    typed: TypedTools,
    /// The names of the tools the model is shown, each non-empty and used once, when the
    /// list is one the model calls tools from (not a `tool_search_output`'s report).
    names: Option<ToolNames>,
}

impl Tools {
    /// A list the model calls its tools from: names non-empty and used once.
    fn named_once() -> Self {
        Tools {
            names: Some(ToolNames::default()),
            ..Tools::default()
        }
    }

    /// Notes the name (qualified) of a tool shown to the model, read at `node`.
    fn name_once(&mut self, node: Node<'_>, name: &str) -> Read<()> {
        match &mut self.names {
            Some(names) => names.add(node, name),
            None => Ok(()),
        }
    }

    /// Adds another list's tools after these.
    fn append(&mut self, other: Tools) {
        self.functions.extend(other.functions);
        self.other.extend(other.other);
        self.freeform.extend(other.freeform);
        self.search.extend(other.search);
    }
}

/// The tools a `tool_search_output` loaded, as the model reads them: each function's definition
/// (`{"type": "function", "function": {"name", "description", "parameters"}}`, compact JSON,
/// under its qualified name), as Anthropic `tool_reference` results render.
fn loaded_tools_text(tools: &[Tool]) -> String {
    tools
        .iter()
        .map(|tool| {
            let mut function = serde_json::Map::new();
            function.insert("name".into(), Value::String(tool.name.clone()));
            if let Some(description) = &tool.description {
                function.insert("description".into(), Value::String(description.clone()));
            }
            if !tool.parameters.is_null() {
                function.insert("parameters".into(), tool.parameters.clone());
            }
            serde_json::json!({"type": "function", "function": function}).to_string()
        })
        .collect::<Vec<_>>()
        .join(TEXT_PART_SEPARATOR)
}

/// A freeform call's `input` as the arguments of the function the model sees.
pub(crate) fn freeform_arguments(input: &str) -> String {
    serde_json::json!({ "input": input }).to_string()
}

/// The text a freeform call carries, from the arguments the model produced: the `input`
/// string; nothing for an object without one (a call cut before its input began); else (a
/// model that wrote something else) the arguments themselves.
pub(crate) fn freeform_input(arguments: &str) -> String {
    match serde_json::from_str::<Value>(arguments) {
        Ok(Value::Object(fields)) => match fields.get("input") {
            Some(Value::String(input)) => input.clone(),
            None => String::new(),
            Some(_) => arguments.to_string(),
        },
        _ => arguments.to_string(),
    }
}

/// A `shell` tool whose `environment` is a hosted container (`container_auto`,
/// `container_reference`): it runs at OpenAI, so the model is not shown it here. Without an
/// environment, or with `local`, the harness runs it.
fn hosted_shell(node: Node<'_>) -> Read<bool> {
    if node.type_tag()? != "shell" {
        return Ok(false);
    }
    match node.get("environment")? {
        None => Ok(false),
        Some(child) if child.value.is_null() => Ok(false),
        Some(child) => Ok(child.node().type_tag()? != "local"),
    }
}

/// Between a namespace and a function name in the names the model sees and calls.
pub(crate) const NAMESPACE_SEPARATOR: char = '.';

/// A call item's name as the model produced it: `<namespace>.<name>` when it carries a
/// `namespace`.
fn qualified_call_name(node: Node<'_>) -> Read<String> {
    let name = node.required_str("name")?;
    Ok(match node.optional_str("namespace")? {
        Some(namespace) => format!("{namespace}{NAMESPACE_SEPARATOR}{name}"),
        None => name.to_string(),
    })
}

/// `string | [part]` text of a message or a tool output.
fn read_text_parts(node: Node<'_>) -> Read<Vec<String>> {
    if let Some(text) = node.value.as_str() {
        return Ok(vec![text.to_string()]);
    }
    node.array()?
        .iter()
        .map(|child| {
            let part = child.node();
            match part.type_tag()? {
                "input_text" | "output_text" | "text" | "summary_text" | "reasoning_text" => {
                    Ok(part.required_str("text")?.to_string())
                }
                "refusal" => Ok(part.required_str("refusal")?.to_string()),
                // Codex's opaque tool output (a sub-agent's sealed result): nothing the model
                // can read, shown as such.
                "encrypted_content" => {
                    part.object()?;
                    Ok("[encrypted content omitted]".to_string())
                }
                kind @ ("input_image" | "input_file" | "input_audio") => {
                    part.object()?;
                    Ok(crate::media::placeholder(kind, part.value))
                }
                other => Err(part.error(format!("unsupported content part type `{other}`"))),
            }
        })
        .collect()
}

fn read_item(node: Node<'_>) -> Read<InputItem> {
    node.object()?;
    let kind = match node.optional_str("type")? {
        Some(kind) => kind,
        None if node.get("role")?.is_some() => "message",
        None => {
            return Err(ApiError::invalid_field(
                API,
                format!("{}.type", node.path),
                "field required",
            ))
        }
    };
    Ok(match kind {
        "message" => {
            let role_child = node.required("role")?;
            let role = match role_child.node().str()? {
                "user" => ItemRole::User,
                "assistant" => ItemRole::Assistant,
                "system" => ItemRole::System,
                "developer" => ItemRole::Developer,
                other => {
                    return Err(role_child.node().error(format!(
                        "unknown role `{other}`, expected user, assistant, system or developer"
                    )))
                }
            };
            let content = read_text_parts(node.required("content")?.node())?;
            InputItem::Message { role, content }
        }
        "function_call" => InputItem::FunctionCall {
            call_id: node.required_str("call_id")?.to_string(),
            name: qualified_call_name(node)?,
            arguments: node.required_str("arguments")?.to_string(),
        },
        "function_call_output" => InputItem::FunctionCallOutput {
            call_id: node.required_str("call_id")?.to_string(),
            output: read_text_parts(node.required("output")?.node())?.join(TEXT_PART_SEPARATOR),
        },
        "custom_tool_call" => InputItem::CustomToolCall {
            call_id: node.required_str("call_id")?.to_string(),
            name: qualified_call_name(node)?,
            input: node.required_str("input")?.to_string(),
        },
        "custom_tool_call_output" => InputItem::CustomToolCallOutput {
            call_id: node.required_str("call_id")?.to_string(),
            output: read_text_parts(node.required("output")?.node())?.join(TEXT_PART_SEPARATOR),
        },
        "reasoning" => {
            let content = match node.get("content")? {
                None => Vec::new(),
                Some(child) => read_text_parts(child.node())?,
            };
            let text = if content.is_empty() {
                match node.get("summary")? {
                    None => Vec::new(),
                    Some(child) => read_text_parts(child.node())?,
                }
            } else {
                content
            };
            InputItem::Reasoning {
                id: node.optional_str("id")?.map(str::to_string),
                text: text.join(TEXT_PART_SEPARATOR),
                encrypted_content: node.optional_str("encrypted_content")?.map(str::to_string),
            }
        }
        // A search the server ran: history the model reads, as an assistant's text.
        "web_search_call" => InputItem::Message {
            role: ItemRole::Assistant,
            content: vec![format!(
                "[web_search: {}]",
                node.get("action")?
                    .map(|action| serde_json::to_string(action.value).unwrap_or_default())
                    .unwrap_or_default()
            )],
        },
        // The `local_shell` tool's call and output pair like a function call's.
        "local_shell_call" => InputItem::FunctionCall {
            call_id: node.required_str("call_id")?.to_string(),
            name: TypedTool::LocalShell.name().to_string(),
            arguments: serde_json::to_string(node.required("action")?.value).unwrap_or_default(),
        },
        // The `shell` and `apply_patch` tools' calls and outputs pair like a function call's,
        // the outputs as the text `crate::typed_tools` makes of them.
        "shell_call" => InputItem::FunctionCall {
            call_id: node.required_str("call_id")?.to_string(),
            name: TypedTool::Shell.name().to_string(),
            arguments: crate::typed_tools::shell_call_arguments(node)?,
        },
        "shell_call_output" => InputItem::FunctionCallOutput {
            call_id: node.required_str("call_id")?.to_string(),
            output: crate::typed_tools::shell_output_text(node)?,
        },
        "apply_patch_call" => InputItem::FunctionCall {
            call_id: node.required_str("call_id")?.to_string(),
            name: TypedTool::ApplyPatch.name().to_string(),
            arguments: crate::typed_tools::apply_patch_arguments(node)?,
        },
        "apply_patch_call_output" => InputItem::FunctionCallOutput {
            call_id: node.required_str("call_id")?.to_string(),
            output: crate::typed_tools::apply_patch_output_text(node)?,
        },
        // OpenAI's type names the call by `id`; `call_id` is accepted too.
        "local_shell_call_output" => InputItem::FunctionCallOutput {
            call_id: match node.optional_str("call_id")? {
                Some(call_id) => call_id.to_string(),
                None => node.required_str("id")?.to_string(),
            },
            output: read_text_parts(node.required("output")?.node())?.join(TEXT_PART_SEPARATOR),
        },
        "tool_search_call" => {
            let arguments = node.required("arguments")?;
            let arguments = match arguments.value.as_str() {
                Some(text) => text.to_string(),
                None => {
                    arguments.node().object()?;
                    arguments.value.to_string()
                }
            };
            InputItem::ToolSearchCall {
                call_id: node.required_str("call_id")?.to_string(),
                arguments,
            }
        }
        "tool_search_output" => {
            let mut loaded = Tools::default();
            if let Some(child) = node.get("tools")? {
                for tool in child.node().array()? {
                    read_tool(tool.node(), None, &mut loaded)?;
                }
            }
            InputItem::ToolSearchOutput {
                call_id: node.required_str("call_id")?.to_string(),
                output: loaded_tools_text(&loaded.functions),
                freeform: loaded.freeform,
            }
        }
        "compaction_trigger" => InputItem::CompactionTrigger,
        // Codex's message between agents of one session (`multi_agent_v1`): what the other
        // agent said, as a user turn naming its author.
        "agent_message" => {
            let mut content = Vec::new();
            if let Some(author) = node.optional_str("author")? {
                content.push(format!("[message from agent {author}]"));
            }
            content.extend(read_text_parts(node.required("content")?.node())?);
            InputItem::Message {
                role: ItemRole::User,
                content,
            }
        }
        "compaction" | "context_compaction" => {
            let handle = node.required("encrypted_content")?;
            let summary = crate::compaction::summary(handle.node().str()?)
                .map_err(|problem| handle.node().error(problem))?;
            InputItem::Compaction { summary }
        }
        "item_reference" => {
            return Err(node.error(
                "an item_reference is resolved against the execution's stored responses before \
                 parsing; this one could not be",
            ))
        }
        other => return Err(node.error(format!("unsupported input item type `{other}`"))),
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
        "function" | "custom" => Ok(ToolChoice::Tool(qualified_call_name(node)?)),
        // The typed tools are functions of their type's name for the model.
        kind @ ("shell" | "apply_patch") => Ok(ToolChoice::Tool(kind.to_string())),
        _ => Ok(ToolChoice::Auto),
    }
}

/// Where the assistant message being assembled stands.
/// A call item of history: on the open assistant message, or a new one.
fn push_call(messages: &mut Vec<Message>, call_id: &str, name: &str, arguments: String) {
    let call = ToolCall {
        id: call_id.to_string(),
        name: name.to_string(),
        arguments,
    };
    match last_assistant(messages) {
        Some(message) => message.tool_calls.push(call),
        None => {
            let mut message = Message::new(Role::Assistant, "");
            message.tool_calls.push(call);
            messages.push(message);
        }
    }
}

fn last_assistant(messages: &mut [Message]) -> Option<&mut Message> {
    messages
        .last_mut()
        .filter(|message| message.role == Role::Assistant)
}

impl ResponsesRequest {
    /// Converts to internal messages. Fails when a `function_call_output` names a `call_id`
    /// that no earlier `function_call` holds.
    pub fn to_chat(&self) -> Result<ChatRequest, ApiError> {
        let mut chat = ChatRequest::new(API, self.model.clone());
        if let Some(instructions) = &self.instructions {
            chat.messages
                .push(Message::new(Role::System, instructions.clone()));
        }
        let mut calls: std::collections::HashMap<String, String> = std::collections::HashMap::new();
        let mut loaded_freeform: Vec<String> = Vec::new();
        for (index, item) in self.input.iter().enumerate() {
            match item {
                InputItem::Message { role, content } => {
                    let text = content.join(TEXT_PART_SEPARATOR);
                    match role {
                        ItemRole::Assistant => match last_assistant(&mut chat.messages) {
                            Some(message)
                                if message.tool_calls.is_empty() && message.content.is_empty() =>
                            {
                                message.content = text
                            }
                            _ => chat.messages.push(Message::new(Role::Assistant, text)),
                        },
                        ItemRole::User => chat.messages.push(Message::new(Role::User, text)),
                        ItemRole::System | ItemRole::Developer => {
                            chat.messages.push(Message::new(Role::System, text))
                        }
                    }
                }
                InputItem::Reasoning {
                    text,
                    encrypted_content,
                    ..
                } => {
                    let reasoning = Reasoning {
                        text: text.clone(),
                        handle: encrypted_content.clone(),
                        redacted: false,
                    };
                    match last_assistant(&mut chat.messages) {
                        Some(message)
                            if message.tool_calls.is_empty() && message.content.is_empty() =>
                        {
                            message.reasoning.push(reasoning)
                        }
                        _ => {
                            let mut message = Message::new(Role::Assistant, "");
                            message.reasoning.push(reasoning);
                            chat.messages.push(message);
                        }
                    }
                }
                InputItem::CompactionTrigger => {
                    if index + 1 != self.input.len() {
                        return Err(ApiError::invalid_field(
                            API,
                            format!("input[{index}]"),
                            "a compaction_trigger must be the last input item",
                        ));
                    }
                    chat.messages
                        .push(Message::new(Role::User, crate::compaction::INSTRUCTION));
                    chat.remote_compaction = true;
                    chat.harness_compaction = true;
                }
                InputItem::Compaction { summary } => chat.messages.push(Message::new(
                    Role::User,
                    format!("{}{summary}", crate::compaction::SUMMARY_PREFIX),
                )),
                InputItem::FunctionCall {
                    call_id,
                    name,
                    arguments,
                } => {
                    calls.entry(call_id.clone()).or_insert(name.clone());
                    push_call(&mut chat.messages, call_id, name, arguments.clone());
                }
                InputItem::CustomToolCall {
                    call_id,
                    name,
                    input,
                } => {
                    calls.entry(call_id.clone()).or_insert(name.clone());
                    push_call(&mut chat.messages, call_id, name, freeform_arguments(input));
                }
                InputItem::ToolSearchCall { call_id, arguments } => {
                    let name = self
                        .search_tools
                        .first()
                        .map_or("tool_search", String::as_str);
                    calls.entry(call_id.clone()).or_insert(name.to_string());
                    push_call(&mut chat.messages, call_id, name, arguments.clone());
                }
                InputItem::FunctionCallOutput { call_id, output }
                | InputItem::CustomToolCallOutput { call_id, output }
                | InputItem::ToolSearchOutput {
                    call_id, output, ..
                } => {
                    if let InputItem::ToolSearchOutput { freeform, .. } = item {
                        loaded_freeform.extend(freeform.iter().cloned());
                    }
                    let Some(name) = calls.get(call_id.as_str()) else {
                        return Err(ApiError::invalid_field(
                            API,
                            format!("input[{index}].call_id"),
                            format!(
                                "no function_call with call_id `{call_id}` earlier in the input"
                            ),
                        ));
                    };
                    chat.messages.push(Message::tool_result(
                        call_id.clone(),
                        Some(name.clone()),
                        output.clone(),
                        false,
                    ));
                }
            }
        }
        chat.tools = self.tools.clone();
        chat.omitted_tools = self.other_tools.clone();
        chat.freeform_tools = self.freeform_tools.clone();
        chat.freeform_tools.extend(loaded_freeform);
        chat.search_tools = self.search_tools.clone();
        chat.typed_tools = self.typed_tools;
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
            max_tokens: self.max_output_tokens,
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            stop: Vec::new(),
            seed: self.seed,
        };
        chat.stream = self.stream;
        chat.user = self.user.clone();
        chat.answer_format = self.answer_format.clone();
        chat.ignored_fields = self.ignored_fields.clone();
        chat.unknown_fields = self.unknown_fields.clone();
        chat.response_settings = Some(self.settings.clone());
        crate::messages::check_tools(&chat, "tool_choice.name", "input")?;
        Ok(chat)
    }
}

/// `max_output_tokens`: an integer of at least [`MAX_OUTPUT_TOKENS_MIN`], as OpenAI's API
/// refuses less.
fn read_max_output_tokens(root: Node<'_>) -> Read<Option<u32>> {
    let Some(child) = root.get("max_output_tokens")? else {
        return Ok(None);
    };
    let limit = child.node().u32()?;
    if limit < MAX_OUTPUT_TOKENS_MIN {
        return Err(child.node().error(format!(
            "must be at least {MAX_OUTPUT_TOKENS_MIN}, got {limit}"
        )));
    }
    Ok(Some(limit))
}
