//! Chat-template rendering with minijinja, configured to match Python jinja2 as HF
//! transformers' `apply_chat_template` uses it, byte for byte.
//!
//! transformers compiles the template in `ImmutableSandboxedEnvironment(trim_blocks=True,
//! lstrip_blocks=True, extensions=[AssistantTracker, loopcontrols])`, replaces `tojson` with
//! `json.dumps(ensure_ascii=False, …)`, adds the globals `raise_exception` and `strftime_now`,
//! and renders with `messages`, `tools`, `add_generation_prompt`, the tokenizer's special
//! tokens (`bos_token`, `eos_token`, …) and any extra keyword arguments. This module does the
//! same with these minijinja settings:
//! - trim_blocks + lstrip_blocks, no trailing newline kept (jinja2's default);
//! - maps keep insertion order (minijinja's `preserve_order`);
//! - Python string/dict/list methods via `minijinja_contrib::pycompat`;
//! - `{{ value }}` and the `string` filter print with Python's `str()` (`None`, `True`, `1.0`,
//!   `{'a': 1}`), see [`python`];
//! - `{% generation %}…{% endgeneration %}` (transformers' `AssistantTracker`) renders its body;
//! - `\r\n` and `\r` in the source become `\n`, as jinja2's lexer does.
//!
//! Known differences left: the `~` operator uses minijinja's own text for non-strings
//! (`true`, not `True`); Python `%` string formatting is not available.

mod continuation;
pub mod python;
pub mod strftime;

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind, State};
use serde_json::Map;

use crate::messages::{Message, Tool};
use crate::ProxyError;
pub use continuation::continue_final_message;
use python::DumpsOptions;
pub use strftime::CivilDateTime;

const TEMPLATE_NAME: &str = "chat_template";
/// The context variable that carries the render's date to `strftime_now`.
const NOW_VARIABLE: &str = "__gyre_strftime_now";

/// How tool-call arguments reach the template.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ToolArgumentsForm {
    /// The raw JSON text the model produced (or the harness sent): the template prints it as
    /// is, so a re-rendered tool call is byte-identical to the generated one.
    #[default]
    RawText,
    /// A parsed JSON object (key order kept), as HF templates that `| tojson` arguments
    /// expect (Qwen 2.5/3, Llama 3.x). Text that is not valid JSON stays a string.
    Object,
}

/// The tokenizer's special tokens as transformers passes them to the template
/// (`special_tokens_map`); absent ones are left undefined.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub unk_token: Option<String>,
    pub sep_token: Option<String>,
    pub pad_token: Option<String>,
    pub cls_token: Option<String>,
    pub mask_token: Option<String>,
    pub additional_special_tokens: Vec<String>,
}

impl SpecialTokens {
    /// ChatML's, as SmolLM2's `tokenizer_config.json` names them: `<|im_start|>` begins a
    /// turn, `<|im_end|>` ends one (and pads), `<|endoftext|>` is the unknown token. A GGUF
    /// carries the template but not these names.
    pub fn chatml() -> Self {
        SpecialTokens {
            bos_token: Some("<|im_start|>".into()),
            eos_token: Some("<|im_end|>".into()),
            unk_token: Some("<|endoftext|>".into()),
            pad_token: Some("<|im_end|>".into()),
            ..SpecialTokens::default()
        }
    }
}

/// Everything one rendering needs besides the template itself.
#[derive(Clone, Copy, Debug)]
pub struct RenderInput<'a> {
    pub messages: &'a [Message],
    /// Empty means `tools` is `None` in the template (no tool section).
    pub tools: &'a [Tool],
    pub add_generation_prompt: bool,
    /// What `strftime_now` sees as "now".
    pub now: CivilDateTime,
    /// Extra template variables (`enable_thinking`, …); they override nothing built in.
    pub extra: Option<&'a Map<String, serde_json::Value>>,
}

/// A compiled chat template.
pub struct ChatTemplate {
    environment: Environment<'static>,
    special_tokens: SpecialTokens,
    tool_arguments: ToolArgumentsForm,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("ChatTemplate")
            .field("special_tokens", &self.special_tokens)
            .field("tool_arguments", &self.tool_arguments)
            .finish_non_exhaustive()
    }
}

/// jinja2's lexer turns every `\r\n` and `\r` of template text and string literals into
/// `\n` (its `newline_sequence`); templates saved with Windows line endings exist on the Hub.
fn normalize_newlines(source: &str) -> String {
    source.replace("\r\n", "\n").replace('\r', "\n")
}

/// Rewrites transformers' `{% generation %}` / `{% endgeneration %}` block tags (which only mark
/// assistant spans) into `{% if true %}` / `{% endif %}`: same output, same whitespace control.
fn rewrite_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        let Some(end) = tag.find("%}") else {
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..end];
        let (left, body) = match inner.strip_prefix(['-', '+']) {
            Some(body) => (&inner[..1], body),
            None => ("", inner),
        };
        let (body, right) = match body.strip_suffix(['-', '+']) {
            Some(stripped) => (stripped, &body[body.len() - 1..]),
            None => (body, ""),
        };
        let replacement = match body.trim() {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match replacement {
            Some(keyword) => out.push_str(&format!("{{%{left} {keyword} {right}%}}")),
            None => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

fn optional_argument(
    value: Option<Value>,
    kwargs: &Kwargs,
    name: &str,
) -> Result<Option<Value>, Error> {
    let keyword: Option<Value> = kwargs.get(name)?;
    if value.is_some() && keyword.is_some() {
        return Err(Error::new(
            ErrorKind::TooManyArguments,
            format!("tojson() got multiple values for argument '{name}'"),
        ));
    }
    Ok(value.or(keyword).filter(|value| !value.is_none()))
}

/// HF's `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
/// (`sort_keys` only as a keyword: minijinja functions take at most five arguments.)
fn tojson(
    value: &Value,
    ensure_ascii: Option<Value>,
    indent: Option<Value>,
    separators: Option<Value>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    let ensure_ascii = optional_argument(ensure_ascii, &kwargs, "ensure_ascii")?;
    let indent = optional_argument(indent, &kwargs, "indent")?;
    let separators = optional_argument(separators, &kwargs, "separators")?;
    let sort_keys = optional_argument(None, &kwargs, "sort_keys")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(indent) => match indent.as_str() {
            Some(text) => Some(text.to_string()),
            None => {
                let width = i64::try_from(indent.clone()).map_err(|_| {
                    Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: indent must be an int or str",
                    )
                })?;
                Some(" ".repeat(width.clamp(0, 64) as usize))
            }
        },
    };
    let separators = match separators {
        None => None,
        Some(pair) => {
            let items: Vec<Value> = pair.try_iter()?.collect();
            match items.as_slice() {
                [item, key] if item.as_str().is_some() && key.as_str().is_some() => Some((
                    item.as_str().unwrap_or_default().to_string(),
                    key.as_str().unwrap_or_default().to_string(),
                )),
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be a pair of strings",
                    ))
                }
            }
        }
    };
    let options = DumpsOptions {
        ensure_ascii: ensure_ascii.is_some_and(|value| value.is_true()),
        indent,
        separators,
        sort_keys: sort_keys.is_some_and(|value| value.is_true()),
    };
    python::dumps(value, &options).map(Value::from)
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

fn strftime_now(state: &State, format: String) -> Result<Value, Error> {
    let now = state
        .lookup(NOW_VARIABLE)
        .ok_or_else(|| Error::new(ErrorKind::InvalidOperation, "strftime_now: no date"))?;
    let field = |name: &str| -> Result<i64, Error> { i64::try_from(now.get_attr(name)?) };
    let civil = CivilDateTime {
        year: field("year")? as i32,
        month: field("month")? as u32,
        day: field("day")? as u32,
        hour: field("hour")? as u32,
        minute: field("minute")? as u32,
        second: field("second")? as u32,
    };
    Ok(Value::from(civil.strftime(&format)))
}

impl ChatTemplate {
    /// Compiles `source` (the `chat_template` string of `tokenizer_config.json`).
    pub fn new(
        source: &str,
        special_tokens: SpecialTokens,
        tool_arguments: ToolArgumentsForm,
    ) -> Result<Self, ProxyError> {
        let mut environment = Environment::new();
        environment.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .keep_trailing_newline(false)
                .build()
                .map_err(|error| ProxyError::Template {
                    message: error.to_string(),
                })?,
        );
        // jinja2's default `Undefined` prints as "" and iterates as empty; so does Lenient.
        environment.set_undefined_behavior(minijinja::UndefinedBehavior::Lenient);
        environment.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
        environment
            .set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        environment.set_formatter(|out, _state, value| {
            // Python's str() of a string is the string: written as is, without a copy.
            let written = match value.as_str() {
                Some(text) => out.write_str(text),
                None => out.write_str(&python::python_str(value)),
            };
            written.map_err(|_| Error::new(ErrorKind::WriteFailure, "write failed"))
        });
        environment.add_filter("tojson", tojson);
        environment.add_filter("string", |value: &Value| python::python_str(value));
        environment.add_function("raise_exception", raise_exception);
        environment.add_function("strftime_now", strftime_now);
        environment
            .add_template_owned(
                TEMPLATE_NAME,
                rewrite_generation_tags(&normalize_newlines(source)),
            )
            .map_err(|error| ProxyError::Template {
                message: format!("chat template does not compile: {error:#}"),
            })?;
        Ok(Self {
            environment,
            special_tokens,
            tool_arguments,
        })
    }

    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.special_tokens
    }

    pub fn tool_arguments(&self) -> ToolArgumentsForm {
        self.tool_arguments
    }

    /// Renders the prompt text.
    ///
    /// The context is built straight as template values ([`Message::template_value`]);
    /// `tests/it/template_values.rs` checks it against the same dicts written as JSON through
    /// [`ChatTemplate::render_context`].
    pub fn render(&self, input: &RenderInput<'_>) -> Result<String, ProxyError> {
        let mut context: Vec<(Value, Value)> = Vec::with_capacity(16);
        if let Some(extra) = input.extra {
            for (key, value) in extra {
                context.push((
                    Value::from(key.as_str()),
                    Value::from(minijinja::value::Serde(value)),
                ));
            }
        }
        let tokens = &self.special_tokens;
        for (name, token) in [
            ("bos_token", &tokens.bos_token),
            ("eos_token", &tokens.eos_token),
            ("unk_token", &tokens.unk_token),
            ("sep_token", &tokens.sep_token),
            ("pad_token", &tokens.pad_token),
            ("cls_token", &tokens.cls_token),
            ("mask_token", &tokens.mask_token),
        ] {
            if let Some(token) = token {
                context.push((Value::from(name), Value::from(token.as_str())));
            }
        }
        if !tokens.additional_special_tokens.is_empty() {
            let list: Vec<Value> = tokens
                .additional_special_tokens
                .iter()
                .map(|token| Value::from(token.as_str()))
                .collect();
            context.push((Value::from("additional_special_tokens"), Value::from(list)));
        }
        let messages: Vec<Value> = input
            .messages
            .iter()
            .map(|message| message.template_value(self.tool_arguments))
            .collect();
        context.push((Value::from("messages"), Value::from(messages)));
        let tools = if input.tools.is_empty() {
            Value::from(())
        } else {
            Value::from(
                input
                    .tools
                    .iter()
                    .map(|tool| Value::from(minijinja::value::Serde(tool.template_view())))
                    .collect::<Vec<Value>>(),
            )
        };
        context.push((Value::from("tools"), tools));
        context.push((
            Value::from("add_generation_prompt"),
            Value::from(input.add_generation_prompt),
        ));
        context.push((Value::from(NOW_VARIABLE), now_value(input.now)));
        self.render_value(Value::from_pairs(context))
    }

    /// Renders with a raw context: every variable the template sees (the jinja2 comparison
    /// tests use it). `now` is what `strftime_now` formats.
    pub fn render_context(
        &self,
        context: Map<String, serde_json::Value>,
        now: CivilDateTime,
    ) -> Result<String, ProxyError> {
        let mut pairs: Vec<(Value, Value)> = context
            .iter()
            .map(|(key, value)| {
                (
                    Value::from(key.as_str()),
                    Value::from(minijinja::value::Serde(value)),
                )
            })
            .collect();
        pairs.push((Value::from(NOW_VARIABLE), now_value(now)));
        self.render_value(Value::from_pairs(pairs))
    }

    fn render_value(&self, context: Value) -> Result<String, ProxyError> {
        let template = self
            .environment
            .get_template(TEMPLATE_NAME)
            .expect("the template was added in new()");
        template
            .render(context)
            .map_err(|error| ProxyError::Template {
                message: template_error_message(&error),
            })
    }
}

/// What `strftime_now` reads: the render's civil date and time.
fn now_value(now: CivilDateTime) -> Value {
    Value::from_pairs([
        ("year", Value::from(i64::from(now.year))),
        ("month", Value::from(now.month)),
        ("day", Value::from(now.day)),
        ("hour", Value::from(now.hour)),
        ("minute", Value::from(now.minute)),
        ("second", Value::from(now.second)),
    ])
}

fn template_error_message(error: &Error) -> String {
    match error.kind() {
        // raise_exception(message): the template's own words.
        ErrorKind::InvalidOperation => match error.detail() {
            Some(detail) => detail.to_string(),
            None => error.to_string(),
        },
        _ => format!("{error:#}"),
    }
}
