//! Typed reading of a JSON request body that names the offending field path in every error
//! (`messages[3].content[1].tool_use_id: expected a string, got a number`).
//!
//! The request parsers go through these helpers instead of serde derives so that every
//! rejection carries the exact path, tagged unions ("string or list of blocks", "block by
//! `type`") get specific messages, and nothing can panic on hostile input. `null` counts as
//! absent for optional fields, as the official SDKs send it.

use serde_json::{Map, Value};

use crate::api_error::ApiError;
use crate::messages::Api;

pub(crate) type Read<T> = Result<T, ApiError>;

/// Parses the body bytes into a top-level JSON object.
pub(crate) fn body_object(api: Api, bytes: &[u8]) -> Read<Value> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::invalid_field(api, "", "request body is empty"));
    }
    let cleaned = crate::body::lone_surrogates_replaced(bytes);
    // serde_json bounds nesting at 128 levels, so hostile depth is an error, not a crash.
    let value: Value =
        serde_json::from_slice(cleaned.as_deref().unwrap_or(bytes)).map_err(|error| {
            ApiError::invalid_field(api, "", format!("request body is not valid JSON: {error}"))
        })?;
    if !value.is_object() {
        return Err(ApiError::invalid_field(
            api,
            "",
            format!(
                "request body must be a JSON object, got {}",
                kind_name(&value)
            ),
        ));
    }
    Ok(value)
}

pub(crate) fn kind_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A JSON value and where it sits in the request.
#[derive(Clone, Copy)]
pub(crate) struct Node<'a> {
    pub value: &'a Value,
    pub path: &'a str,
    pub api: Api,
}

/// An owned path plus its value, for children (paths are built as the reader descends).
pub(crate) struct Child<'a> {
    pub value: &'a Value,
    pub path: String,
    pub api: Api,
}

impl<'a> Child<'a> {
    pub fn node(&self) -> Node<'_> {
        Node {
            value: self.value,
            path: &self.path,
            api: self.api,
        }
    }
}

/// The most elements any array of a request may hold. A long agent conversation has a few
/// thousand messages; each element read costs its path and a handle (~80 bytes) beside its
/// parsed value, so a 32 MiB body of `[1,1,1,…]` would otherwise cost gigabytes to refuse.
pub(crate) const ARRAY_ELEMENTS_MAX: usize = 100_000;

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

impl<'a> Node<'a> {
    pub fn root(value: &'a Value, api: Api) -> Self {
        Node {
            value,
            path: "",
            api,
        }
    }

    pub fn error(&self, problem: impl AsRef<str>) -> ApiError {
        ApiError::invalid_field(self.api, self.path, problem)
    }

    fn expected(&self, what: &str) -> ApiError {
        self.error(format!("expected {what}, got {}", kind_name(self.value)))
    }

    pub fn object(&self) -> Read<&'a Map<String, Value>> {
        self.value
            .as_object()
            .ok_or_else(|| self.expected("an object"))
    }

    pub fn array(&self) -> Read<Vec<Child<'a>>> {
        let items = self
            .value
            .as_array()
            .ok_or_else(|| self.expected("an array"))?;
        if items.len() > ARRAY_ELEMENTS_MAX {
            return Err(self.error(format!(
                "an array of {} elements; at most {ARRAY_ELEMENTS_MAX} are read",
                items.len()
            )));
        }
        Ok(items
            .iter()
            .enumerate()
            .map(|(index, value)| Child {
                value,
                path: format!("{}[{index}]", self.path),
                api: self.api,
            })
            .collect())
    }

    pub fn str(&self) -> Read<&'a str> {
        self.value.as_str().ok_or_else(|| self.expected("a string"))
    }

    pub fn bool(&self) -> Read<bool> {
        self.value
            .as_bool()
            .ok_or_else(|| self.expected("a boolean"))
    }

    pub fn f64(&self) -> Read<f64> {
        self.value
            .as_f64()
            .filter(|number| number.is_finite())
            .ok_or_else(|| self.expected("a number"))
    }

    pub fn i64(&self) -> Read<i64> {
        if let Some(integer) = self.value.as_i64() {
            return Ok(integer);
        }
        match self.value.as_f64() {
            Some(float) if float.fract() == 0.0 && float.abs() < 9.0e15 => Ok(float as i64),
            _ => Err(self.expected("an integer")),
        }
    }

    pub fn u32(&self) -> Read<u32> {
        let integer = self.i64()?;
        u32::try_from(integer).map_err(|_| {
            self.error(format!(
                "expected an integer from 0 to {}, got {integer}",
                u32::MAX
            ))
        })
    }

    /// The member `key`, absent or `null` → `None`.
    pub fn get(&self, key: &str) -> Read<Option<Child<'a>>> {
        let object = self.object()?;
        Ok(object
            .get(key)
            .filter(|value| !value.is_null())
            .map(|value| Child {
                value,
                path: join(self.path, key),
                api: self.api,
            }))
    }

    pub fn required(&self, key: &str) -> Read<Child<'a>> {
        self.get(key)?.ok_or_else(|| {
            ApiError::invalid_field(self.api, join(self.path, key), "field required")
        })
    }

    pub fn required_str(&self, key: &str) -> Read<&'a str> {
        let child = self.required(key)?;
        let value = child.value;
        value
            .as_str()
            .ok_or_else(|| child.node().expected("a string"))
    }

    pub fn optional_str(&self, key: &str) -> Read<Option<&'a str>> {
        match self.get(key)? {
            None => Ok(None),
            Some(child) => {
                let value = child.value;
                value
                    .as_str()
                    .map(Some)
                    .ok_or_else(|| child.node().expected("a string"))
            }
        }
    }

    pub fn optional_bool(&self, key: &str) -> Read<Option<bool>> {
        self.get(key)?.map(|child| child.node().bool()).transpose()
    }

    pub fn optional_f64(&self, key: &str) -> Read<Option<f64>> {
        self.get(key)?.map(|child| child.node().f64()).transpose()
    }

    pub fn optional_i64(&self, key: &str) -> Read<Option<i64>> {
        self.get(key)?.map(|child| child.node().i64()).transpose()
    }

    /// An optional count that must be at least 1 when given (`top_k`).
    pub fn optional_positive_u32(&self, key: &str) -> Read<Option<u32>> {
        let Some(child) = self.get(key)? else {
            return Ok(None);
        };
        match child.node().u32()? {
            0 => Err(child.node().error("must be at least 1")),
            value => Ok(Some(value)),
        }
    }

    /// An optional `top_k` as vLLM and SGLang read it in the OpenAI APIs: at least 1 cuts,
    /// and `-1` or `0` mean no cut (what RL clients pass through), read as absent.
    pub fn optional_top_k(&self, key: &str) -> Read<Option<u32>> {
        let Some(child) = self.get(key)? else {
            return Ok(None);
        };
        match child.node().i64()? {
            -1 | 0 => Ok(None),
            value if value >= 1 => u32::try_from(value)
                .map(Some)
                .map_err(|_| child.node().error("must be at most 4294967295")),
            _ => Err(child
                .node()
                .error("must be at least 1, or -1 / 0 for no top-k cut")),
        }
    }

    pub fn optional_u32(&self, key: &str) -> Read<Option<u32>> {
        self.get(key)?.map(|child| child.node().u32()).transpose()
    }

    /// An optional token limit: an integer, at least 1 (a limit of 0 cannot be sampled
    /// under; the APIs refuse it).
    pub fn optional_token_limit(&self, key: &str) -> Read<Option<u32>> {
        let Some(child) = self.get(key)? else {
            return Ok(None);
        };
        match child.node().u32()? {
            0 => Err(child.node().error("must be at least 1")),
            limit => Ok(Some(limit)),
        }
    }

    /// The `type` member of a tagged object.
    pub fn type_tag(&self) -> Read<&'a str> {
        self.required_str("type")
    }

    /// A stop-sequence list (a string or an array of strings, as OpenAI Chat's `stop`): each
    /// non-empty, within [`crate::output::stop::STOP_SEQUENCE_BYTES_MAX`] bytes, at most
    /// [`crate::output::stop::STOP_SEQUENCES_MAX`] of them.
    pub fn stop_sequences(&self, key: &str) -> Read<Vec<String>> {
        self.stop_sequence_list(key, true)
    }

    /// A stop-sequence list that must be an array of strings (Anthropic's `stop_sequences`,
    /// which the API refuses as a bare string), held to the same bounds as
    /// [`Node::stop_sequences`].
    pub fn stop_sequence_array(&self, key: &str) -> Read<Vec<String>> {
        self.stop_sequence_list(key, false)
    }

    fn stop_sequence_list(&self, key: &str, string_allowed: bool) -> Read<Vec<String>> {
        use crate::output::stop::{STOP_SEQUENCES_MAX, STOP_SEQUENCE_BYTES_MAX};
        let Some(child) = self.get(key)? else {
            return Ok(Vec::new());
        };
        let items = match child.value.as_str() {
            Some(_) if !string_allowed => {
                return Err(child.node().expected("an array of strings"));
            }
            Some(_) => vec![Child {
                value: child.value,
                path: child.path.clone(),
                api: child.api,
            }],
            None => child.node().array()?,
        };
        if items.len() > STOP_SEQUENCES_MAX {
            return Err(child.node().error(format!(
                "at most {STOP_SEQUENCES_MAX} stop sequences, got {}",
                items.len()
            )));
        }
        items
            .iter()
            .map(|item| {
                let text = item.node().str()?;
                if text.is_empty() {
                    return Err(item.node().error("a stop sequence must not be empty"));
                }
                if text.len() > STOP_SEQUENCE_BYTES_MAX {
                    return Err(item.node().error(format!(
                        "a stop sequence may be at most {STOP_SEQUENCE_BYTES_MAX} bytes, got {}",
                        text.len()
                    )));
                }
                Ok(text.to_string())
            })
            .collect()
    }
}

/// Refuses the first of `fields` the request holds (`null` counts as absent): members whose
/// meaning this proxy cannot serve (state held by the API's server, a legacy form of tools)
/// and which, ignored, would have the model answer a different question than the one asked.
/// Each comes with why it is refused.
pub(crate) fn refuse_unsupported(root: Node<'_>, fields: &[(&str, &str)]) -> Read<()> {
    for (field, why) in fields {
        if let Some(child) = root.get(field)? {
            return Err(child
                .node()
                .error(format!("not supported by this proxy: {why}")));
        }
    }
    Ok(())
}

/// The names of a request's tools as they are read: a call names its tool by name alone, so
/// each must be non-empty and used once. Names are compared as the model calls them
/// (qualified, where the API groups tools under a namespace); no pattern is imposed beyond
/// that (real CLIs send names like `mcp__server__tool`).
#[derive(Default)]
pub(crate) struct ToolNames {
    /// Each name and the path it was first read at.
    first_at: std::collections::BTreeMap<String, String>,
}

impl ToolNames {
    /// `name`, read at `node` (the name's own field, or the tool when its name is implied).
    pub fn add(&mut self, node: Node<'_>, name: &str) -> Read<()> {
        if name.is_empty() {
            return Err(node.error("a tool name must not be empty"));
        }
        if let Some(first) = self.first_at.get(name) {
            return Err(node.error(format!(
                "tool name `{name}` is used twice (first at `{first}`); tool names must be unique"
            )));
        }
        self.first_at
            .insert(name.to_string(), node.path.to_string());
        Ok(())
    }
}

/// Top-level keys of `object` that are in neither list, in request order.
pub(crate) fn classify_fields(
    object: &Map<String, Value>,
    known: &[&str],
    ignored: &[&str],
) -> (Vec<String>, Vec<String>) {
    let mut ignored_present = Vec::new();
    let mut unknown = Vec::new();
    for key in object.keys() {
        if known.contains(&key.as_str()) {
            continue;
        }
        if ignored.contains(&key.as_str()) {
            ignored_present.push(key.clone());
        } else {
            unknown.push(key.clone());
        }
    }
    (ignored_present, unknown)
}
