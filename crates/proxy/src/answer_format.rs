//! Structured answers: the JSON format a request asks its answer to take — OpenAI Chat
//! `response_format`, OpenAI Responses `text.format` (Codex's `--output-schema`), Anthropic
//! `output_config.format` (and the beta's top-level `output_format`).
//!
//! The proxy holds the engine to the format with the engine's own grammar (SGLang
//! `sampling_params.json_schema`, vLLM `sampling_params.structured_outputs`) when the answer
//! must be that JSON: when the request offers no tool the model could call instead (a grammar
//! over the whole output would forbid the call, while the API lets a model call tools and
//! answer in the format at the end). The prompt is not changed; the record says which format
//! was asked for and whether sampling was held to it (`gyre_event::OutputConstraint`).
//!
//! Pure: request JSON in, values out.

use std::sync::Arc;

use gyre_event::{OutputConstraint, OUTPUT_SCHEMA_BYTES_MAX};

use crate::engine::JsonConstraint;
use crate::reader::{Node, Read};

/// The format a request asked its answer to take (absent: plain text).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AnswerFormat {
    /// Any JSON object (`json_object`).
    JsonObject,
    /// JSON matching a schema (`json_schema`).
    JsonSchema {
        /// OpenAI's `name` for the format (Anthropic has none).
        name: Option<String>,
        /// The schema as JSON text, members in the request's order.
        #[serde(serialize_with = "text")]
        schema: Arc<str>,
        /// OpenAI `strict`.
        strict: bool,
    },
}

fn text<S: serde::Serializer>(text: &Arc<str>, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(text)
}

impl AnswerFormat {
    /// What an engine's grammar enforces.
    pub fn engine_constraint(&self) -> JsonConstraint {
        match self {
            AnswerFormat::JsonObject => JsonConstraint::Object,
            AnswerFormat::JsonSchema { schema, .. } => JsonConstraint::Schema(schema.clone()),
        }
    }

    /// The record's account of it: the engine's grammar held the first `constrained_tokens`
    /// of the call's `outputs` sampled tokens (all of them: enforced).
    pub fn record(&self, constrained_tokens: u32, outputs: u32) -> OutputConstraint {
        OutputConstraint {
            schema: match self {
                AnswerFormat::JsonObject => None,
                AnswerFormat::JsonSchema { schema, .. } => Some(schema.to_string()),
            },
            enforced: outputs > 0 && constrained_tokens == outputs,
            constrained_tokens,
        }
    }
}

/// OpenAI Chat `response_format`: `{"type": "text" | "json_object"}` or `{"type":
/// "json_schema", "json_schema": {"name", "schema"?, "strict"?, "description"?}}`.
pub(crate) fn read_chat(node: Node<'_>) -> Read<Option<AnswerFormat>> {
    match node.type_tag()? {
        "json_schema" => {
            let definition = node.required("json_schema")?;
            read_openai_schema(definition.node()).map(Some)
        }
        other => read_plain(node, other),
    }
}

/// OpenAI Responses `text`: its `format` (`verbosity` and other members do not constrain).
pub(crate) fn read_responses_text(node: Node<'_>) -> Read<Option<AnswerFormat>> {
    node.object()?;
    let Some(format) = node.get("format")? else {
        return Ok(None);
    };
    let format = format.node();
    match format.type_tag()? {
        "json_schema" => read_openai_schema(format).map(Some),
        other => read_plain(format, other),
    }
}

/// Anthropic `output_config`: its `format` (`effort` does not constrain).
pub(crate) fn read_anthropic_config(node: Node<'_>) -> Read<Option<AnswerFormat>> {
    node.object()?;
    match node.get("format")? {
        None => Ok(None),
        Some(format) => read_anthropic_format(format.node()),
    }
}

/// An Anthropic format (`output_config.format`, or the beta's top-level `output_format`):
/// `{"type": "json_schema", "schema": {…}}`.
pub(crate) fn read_anthropic_format(node: Node<'_>) -> Read<Option<AnswerFormat>> {
    match node.type_tag()? {
        "json_schema" => {
            let schema = node.required("schema")?;
            Ok(Some(AnswerFormat::JsonSchema {
                name: None,
                schema: read_schema(schema.node())?,
                strict: true,
            }))
        }
        other => Err(node.error(format!(
            "unknown format type `{other}`, expected json_schema"
        ))),
    }
}

fn read_plain(node: Node<'_>, kind: &str) -> Read<Option<AnswerFormat>> {
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(Some(AnswerFormat::JsonObject)),
        other => Err(node.error(format!(
            "unknown format type `{other}`, expected text, json_object or json_schema"
        ))),
    }
}

/// `{"name", "schema"?, "strict"?, "description"?}`; without a schema the answer is any JSON
/// object.
fn read_openai_schema(node: Node<'_>) -> Read<AnswerFormat> {
    node.object()?;
    let name = node.required_str("name")?;
    let valid_name = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-');
    if !valid_name {
        let child = node.required("name")?;
        return Err(child
            .node()
            .error("must be 1 to 64 characters of a-z, A-Z, 0-9, _ or -"));
    }
    node.optional_str("description")?;
    let strict = node.optional_bool("strict")?.unwrap_or(false);
    match node.get("schema")? {
        None => Ok(AnswerFormat::JsonObject),
        Some(schema) => Ok(AnswerFormat::JsonSchema {
            name: Some(name.to_string()),
            schema: read_schema(schema.node())?,
            strict,
        }),
    }
}

/// A JSON Schema: an object that passes [`crate::json_schema::check`], at most
/// [`OUTPUT_SCHEMA_BYTES_MAX`] bytes as JSON text.
fn read_schema(node: Node<'_>) -> Read<Arc<str>> {
    node.object()?;
    let text = serde_json::to_string(node.value)
        .map_err(|error| node.error(format!("cannot be written as JSON: {error}")))?;
    if text.len() > OUTPUT_SCHEMA_BYTES_MAX {
        return Err(node.error(format!(
            "is {} bytes as JSON; at most {OUTPUT_SCHEMA_BYTES_MAX} are accepted",
            text.len()
        )));
    }
    crate::json_schema::check(node)?;
    Ok(text.into())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::messages::Api;

    fn chat(value: serde_json::Value) -> Read<Option<AnswerFormat>> {
        read_chat(Node {
            value: &value,
            path: "response_format",
            api: Api::OpenAiChat,
        })
    }

    fn responses(value: serde_json::Value) -> Read<Option<AnswerFormat>> {
        read_responses_text(Node {
            value: &value,
            path: "text",
            api: Api::OpenAiResponses,
        })
    }

    fn anthropic(value: serde_json::Value, config: bool) -> Read<Option<AnswerFormat>> {
        let node = Node {
            value: &value,
            path: if config {
                "output_config"
            } else {
                "output_format"
            },
            api: Api::Anthropic,
        };
        if config {
            read_anthropic_config(node)
        } else {
            read_anthropic_format(node)
        }
    }

    fn problem(result: Read<Option<AnswerFormat>>) -> String {
        result.expect_err("refused").body()
    }

    #[test]
    fn each_api_reads_its_formats() {
        assert_eq!(chat(json!({"type": "text"})).unwrap(), None);
        assert_eq!(
            chat(json!({"type": "json_object"})).unwrap(),
            Some(AnswerFormat::JsonObject)
        );
        // Key order is kept: the record holds the schema as the client wrote it.
        let schema = json!({"type": "object", "properties": {"b": {"type": "string"}, "a": {"type": "integer"}}, "required": ["b", "a"]});
        let want = Some(AnswerFormat::JsonSchema {
            name: Some("answer".into()),
            schema: r#"{"type":"object","properties":{"b":{"type":"string"},"a":{"type":"integer"}},"required":["b","a"]}"#.into(),
            strict: true,
        });
        assert_eq!(
            chat(json!({"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": true}})).unwrap(),
            want
        );
        assert_eq!(
            responses(json!({"format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": true}, "verbosity": "low"})).unwrap(),
            want
        );
        assert_eq!(responses(json!({"verbosity": "low"})).unwrap(), None);
        assert_eq!(
            responses(json!({"format": {"type": "json_object"}})).unwrap(),
            Some(AnswerFormat::JsonObject)
        );
        let anthropic_want = Some(AnswerFormat::JsonSchema {
            name: None,
            schema: r#"{"type":"object"}"#.into(),
            strict: true,
        });
        assert_eq!(
            anthropic(json!({"format": {"type": "json_schema", "schema": {"type": "object"}}, "effort": "high"}), true).unwrap(),
            anthropic_want
        );
        assert_eq!(anthropic(json!({"effort": "high"}), true).unwrap(), None);
        assert_eq!(
            anthropic(
                json!({"type": "json_schema", "schema": {"type": "object"}}),
                false
            )
            .unwrap(),
            anthropic_want
        );
        // A json_schema format without a schema asks for any JSON object.
        assert_eq!(
            chat(json!({"type": "json_schema", "json_schema": {"name": "any"}})).unwrap(),
            Some(AnswerFormat::JsonObject)
        );
    }

    #[test]
    fn bad_formats_are_refused_naming_the_field() {
        for (result, path, words) in [
            (chat(json!("json")), "response_format", "expected an object"),
            (
                chat(json!({"type": "yaml"})),
                "response_format",
                "unknown format type `yaml`",
            ),
            (
                chat(json!({"type": "json_schema"})),
                "response_format.json_schema",
                "field required",
            ),
            (
                chat(json!({"type": "json_schema", "json_schema": {"schema": {}}})),
                "response_format.json_schema.name",
                "field required",
            ),
            (
                chat(json!({"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}})),
                "response_format.json_schema.name",
                "1 to 64 characters",
            ),
            (
                chat(json!({"type": "json_schema", "json_schema": {"name": "a", "schema": "{}"}})),
                "response_format.json_schema.schema",
                "expected an object",
            ),
            (
                chat(
                    json!({"type": "json_schema", "json_schema": {"name": "a", "schema": {}, "strict": "yes"}}),
                ),
                "response_format.json_schema.strict",
                "expected a boolean",
            ),
            (
                responses(json!({"format": {"type": "json_schema", "schema": {}}})),
                "text.format.name",
                "field required",
            ),
            (
                responses(json!({"format": []})),
                "text.format",
                "expected an object",
            ),
            (
                anthropic(json!({"format": {"type": "json_object"}}), true),
                "output_config.format",
                "unknown format type `json_object`",
            ),
            (
                anthropic(json!({"type": "json_schema"}), false),
                "output_format.schema",
                "field required",
            ),
        ] {
            let body = problem(result);
            assert!(body.contains(path), "{body} names {path}");
            assert!(body.contains(words), "{body} says {words}");
        }
        let huge = json!({"type": "object", "description": "x".repeat(OUTPUT_SCHEMA_BYTES_MAX)});
        let body = problem(chat(
            json!({"type": "json_schema", "json_schema": {"name": "a", "schema": huge}}),
        ));
        assert!(body.contains("at most 262144"), "{body}");
    }

    #[test]
    fn the_engine_and_the_record_get_the_schema_text() {
        let format = AnswerFormat::JsonSchema {
            name: Some("a".into()),
            schema: r#"{"type":"object"}"#.into(),
            strict: false,
        };
        assert_eq!(
            format.engine_constraint(),
            JsonConstraint::Schema(r#"{"type":"object"}"#.into())
        );
        assert_eq!(
            format.record(5, 5),
            OutputConstraint {
                schema: Some(r#"{"type":"object"}"#.into()),
                enforced: true,
                constrained_tokens: 5,
            }
        );
        // A failover continued the first 3 constrained tokens without the grammar.
        let partial = format.record(3, 8);
        assert!(!partial.enforced);
        assert_eq!(partial.constrained_tokens, 3);
        // Nothing sampled: nothing was held to the format.
        assert!(!format.record(0, 0).enforced);
        assert_eq!(
            AnswerFormat::JsonObject.engine_constraint(),
            JsonConstraint::Object
        );
        assert_eq!(AnswerFormat::JsonObject.record(0, 4).schema, None);
    }
}
