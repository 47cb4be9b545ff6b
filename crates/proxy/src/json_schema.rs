//! A structural check of the JSON Schema an answer format carries, before any engine sees it.
//!
//! An engine compiles the schema into a grammar (SGLang and vLLM through xgrammar or outlines)
//! and refuses one it cannot read, after the proxy accepted the call: the harness then got a
//! failure that names no field, or the call went to another engine to fail again. This check
//! refuses, with the field's path, what no engine can compile: a keyword whose value has the
//! wrong JSON type (`"type": 5`, `"required": "name"`, `"minLength": -1`), an unknown type
//! name, a `$ref` into the schema that points nowhere, and nesting deeper than
//! [`SCHEMA_DEPTH_MAX`]. Keywords it does not know are left to the engine (vocabularies
//! differ); `pattern` is checked to be a string, not compiled (engines' regex dialects differ).
//!
//! Pure: a JSON value in, an error naming the field out.

use serde_json::Value;

use crate::reader::{Child, Node, Read};

/// Deepest nesting of subschemas accepted (an agent's output schema nests a few levels; the
/// bound keeps a hostile one from recursing without end).
pub const SCHEMA_DEPTH_MAX: usize = 64;

const TYPE_NAMES: [&str; 7] = [
    "null", "boolean", "object", "array", "number", "integer", "string",
];

/// Keywords whose value is one subschema.
const ONE_SCHEMA: [&str; 11] = [
    "additionalProperties",
    "unevaluatedProperties",
    "additionalItems",
    "unevaluatedItems",
    "contains",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
    "contentSchema",
];

/// Keywords whose value maps names to subschemas.
const SCHEMA_MAPS: [&str; 5] = [
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
];

/// Keywords whose value is a non-empty array of subschemas.
const SCHEMA_LISTS: [&str; 4] = ["allOf", "anyOf", "oneOf", "prefixItems"];

/// Keywords whose value is a count.
const COUNTS: [&str; 8] = [
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "minContains",
    "maxContains",
];

/// Keywords whose value is a number.
const NUMBERS: [&str; 4] = ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"];

/// Keywords whose value is a string.
const STRINGS: [&str; 5] = ["pattern", "format", "$id", "$anchor", "$schema"];

/// Checks the schema at `node` (the whole answer-format schema: `$ref`s resolve against it).
pub(crate) fn check(node: Node<'_>) -> Read<()> {
    node.object()?;
    check_at(node, node.value, 0)
}

fn check_at(node: Node<'_>, root: &Value, depth: usize) -> Read<()> {
    if depth > SCHEMA_DEPTH_MAX {
        return Err(node.error(format!(
            "the schema nests deeper than {SCHEMA_DEPTH_MAX} levels"
        )));
    }
    match node.value {
        Value::Bool(_) => return Ok(()),
        Value::Object(_) => {}
        _ => return Err(node.error("expected a schema (an object or a boolean)")),
    }
    let sub = |child: &Child<'_>| check_at(child.node(), root, depth + 1);
    if let Some(types) = node.get("type")? {
        check_type(types.node())?;
    }
    for key in ONE_SCHEMA {
        if let Some(child) = node.get(key)? {
            sub(&child)?;
        }
    }
    for key in SCHEMA_MAPS {
        if let Some(child) = node.get(key)? {
            let map = child.node().object()?;
            for name in map.keys() {
                if let Some(schema) = child.node().get(name)? {
                    sub(&schema)?;
                }
            }
        }
    }
    for key in SCHEMA_LISTS {
        if let Some(child) = node.get(key)? {
            let list = child.node().array()?;
            if list.is_empty() {
                return Err(child.node().error("expected at least one schema"));
            }
            for schema in &list {
                sub(schema)?;
            }
        }
    }
    // `items`: one schema, or (draft 7) a list of schemas by position.
    if let Some(items) = node.get("items")? {
        if items.value.is_array() {
            for schema in &items.node().array()? {
                sub(schema)?;
            }
        } else {
            sub(&items)?;
        }
    }
    if let Some(required) = node.get("required")? {
        for name in &required.node().array()? {
            name.node().str()?;
        }
    }
    if let Some(values) = node.get("enum")? {
        if values.node().array()?.is_empty() {
            return Err(values.node().error("expected at least one value"));
        }
    }
    for key in COUNTS {
        if let Some(count) = node.get(key)? {
            if count.value.as_u64().is_none() {
                return Err(count.node().error(format!(
                    "expected a non-negative integer, got {}",
                    count.value
                )));
            }
        }
    }
    for key in NUMBERS {
        if let Some(number) = node.get(key)? {
            number.node().f64()?;
        }
    }
    if let Some(step) = node.get("multipleOf")? {
        if step.node().f64()? <= 0.0 {
            return Err(step.node().error("expected a number greater than 0"));
        }
    }
    for key in STRINGS {
        if let Some(text) = node.get(key)? {
            text.node().str()?;
        }
    }
    if let Some(reference) = node.get("$ref")? {
        let target = reference.node().str()?;
        // A pointer into this schema (percent-encoded ones are left to the engine).
        if let Some(pointer) = target.strip_prefix('#') {
            if pointer.starts_with('/') && !pointer.contains('%') && root.pointer(pointer).is_none()
            {
                return Err(reference
                    .node()
                    .error(format!("`{target}` points at nothing in this schema")));
            }
        }
    }
    Ok(())
}

fn check_type(node: Node<'_>) -> Read<()> {
    let known = |name: &str| TYPE_NAMES.contains(&name);
    match node.value {
        Value::String(name) if known(name) => Ok(()),
        Value::String(name) => Err(node.error(format!(
            "unknown type `{name}`, expected one of {}",
            TYPE_NAMES.join(", ")
        ))),
        Value::Array(_) => {
            let names = node.array()?;
            if names.is_empty() {
                return Err(node.error("expected at least one type"));
            }
            for name in &names {
                check_type(name.node())?;
                if name.value.is_array() {
                    return Err(name.node().error("expected a type name"));
                }
            }
            Ok(())
        }
        _ => Err(node.error(format!(
            "expected a type name or a list of them, got {}",
            crate::reader::kind_name(node.value)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::messages::Api;

    fn problem(schema: Value) -> Option<String> {
        check(Node::root(&schema, Api::OpenAiChat))
            .err()
            .map(|error| error.body())
    }

    #[test]
    fn schemas_agents_send_pass() {
        for schema in [
            json!({}),
            json!({"type": "object", "properties": {"answer": {"type": "string"},
                   "files": {"type": "array", "items": {"type": "string"}},
                   "score": {"type": ["number", "null"], "minimum": 0, "maximum": 1}},
                   "required": ["answer", "files"], "additionalProperties": false}),
            json!({"$defs": {"step": {"type": "object", "properties": {"n": {"type": "integer"}}}},
                   "type": "array", "items": {"$ref": "#/$defs/step"}, "minItems": 1}),
            json!({"anyOf": [{"type": "string", "pattern": "^[a-z]+$"}, {"enum": [1, 2]}],
                   "x-vendor-extension": {"anything": [1]}}),
            json!({"type": "array", "prefixItems": [{"type": "string"}], "items": false}),
        ] {
            assert_eq!(problem(schema.clone()), None, "{schema}");
        }
    }

    #[test]
    fn what_no_engine_can_compile_is_refused_naming_the_field() {
        for (schema, path, words) in [
            (json!({"type": 5}), "type", "expected a type name"),
            (json!({"type": "text"}), "type", "unknown type `text`"),
            (json!({"type": []}), "type", "at least one type"),
            (
                json!({"properties": {"a": {"type": "strin"}}}),
                "properties.a.type",
                "unknown type `strin`",
            ),
            (
                json!({"properties": []}),
                "properties",
                "expected an object",
            ),
            (json!({"required": "a"}), "required", "expected an array"),
            (json!({"required": [1]}), "required[0]", "expected a string"),
            (
                json!({"minLength": -1}),
                "minLength",
                "non-negative integer",
            ),
            (json!({"maxItems": 1.5}), "maxItems", "non-negative integer"),
            (json!({"multipleOf": 0}), "multipleOf", "greater than 0"),
            (json!({"anyOf": []}), "anyOf", "at least one schema"),
            (json!({"anyOf": [3]}), "anyOf[0]", "an object or a boolean"),
            (
                json!({"items": "string"}),
                "items",
                "an object or a boolean",
            ),
            (json!({"enum": []}), "enum", "at least one value"),
            (json!({"pattern": 3}), "pattern", "expected a string"),
            (
                json!({"items": {"$ref": "#/$defs/missing"}}),
                "items.$ref",
                "points at nothing",
            ),
        ] {
            let body = problem(schema.clone()).unwrap_or_else(|| panic!("{schema} passed"));
            assert!(body.contains(path), "{body} names {path}");
            assert!(body.contains(words), "{body} says {words}");
        }
    }

    #[test]
    fn nesting_is_bounded() {
        let mut schema = json!({"type": "string"});
        for _ in 0..(SCHEMA_DEPTH_MAX + 1) {
            schema = json!({"type": "array", "items": schema});
        }
        let body = problem(schema).expect("refused");
        assert!(body.contains("deeper than 64"), "{body}");
    }
}
