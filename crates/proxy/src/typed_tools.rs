//! The Responses API's client-run tools that a request names by `type` alone and whose calls
//! are items of their own type:
//!
//! - `local_shell` (Codex's, for its codex-mini models): a `local_shell_call` with an `exec`
//!   action, answered by a `local_shell_call_output`;
//! - `shell` (GPT-5.1's; the OpenAI Agents SDK's `ShellTool`): a `shell_call` with an
//!   `action` of commands, answered by a `shell_call_output` of stdout / stderr / outcome
//!   chunks;
//! - `apply_patch` (GPT-5.1's; the Agents SDK's `ApplyPatchTool`): an `apply_patch_call` with
//!   one file `operation`, answered by an `apply_patch_call_output` with a status.
//!
//! Our policy was not trained on their interfaces, so each is shown to the model as an
//! ordinary function of the tool's name, with the parameters the harness accepts, in our own
//! words. The model's call of it goes out as the tool's item, whose fields the call's
//! arguments make; history's items of that type render back as that function's call and its
//! output (as text), so a conversation's tokens are reused across turns like a function
//! call's (the payload cache restores the exact call text by call id).
//!
//! A `shell` tool whose `environment` is a hosted container runs at OpenAI, not in the
//! harness: the request parser lists it with the other hosted tools, not shown.
//!
//! Pure: names, schemas and JSON in, JSON and text out.

use serde::Serialize;
use serde_json::{json, Map, Value};

use crate::reader::{Node, Read};

/// One of the typed client-run tools.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TypedTool {
    LocalShell,
    Shell,
    ApplyPatch,
}

impl TypedTool {
    pub const ALL: [TypedTool; 3] = [
        TypedTool::LocalShell,
        TypedTool::Shell,
        TypedTool::ApplyPatch,
    ];

    /// The tool's `type` in a request, which is also the function name the model sees.
    pub fn name(self) -> &'static str {
        match self {
            TypedTool::LocalShell => "local_shell",
            TypedTool::Shell => "shell",
            TypedTool::ApplyPatch => "apply_patch",
        }
    }

    /// The `type` of a call item of this tool.
    pub fn call_type(self) -> &'static str {
        match self {
            TypedTool::LocalShell => "local_shell_call",
            TypedTool::Shell => "shell_call",
            TypedTool::ApplyPatch => "apply_patch_call",
        }
    }

    /// The prefix of a call item's `id`.
    pub fn id_prefix(self) -> &'static str {
        match self {
            TypedTool::LocalShell => "lsh",
            TypedTool::Shell => "sh",
            TypedTool::ApplyPatch => "apc",
        }
    }

    /// The description shown to the model.
    pub fn description(self) -> &'static str {
        match self {
            TypedTool::LocalShell => "Runs a command on the user's machine and returns its output.",
            TypedTool::Shell => {
                "Runs shell commands, one after another, on the user's machine and returns each \
                 one's standard output, standard error and exit code."
            }
            TypedTool::ApplyPatch => {
                "Creates, updates or deletes one file. `diff` is a V4A diff: for create_file, \
                 every line of the new file prefixed with `+`; for update_file, hunks that \
                 start with `@@` (optionally followed by a line of context to find the place) \
                 and lines prefixed with ` ` (kept), `-` (removed) or `+` (added); none for \
                 delete_file."
            }
        }
    }

    /// The parameters (a JSON schema) shown to the model.
    pub fn parameters(self) -> Value {
        match self {
            TypedTool::LocalShell => json!({
                "type": "object",
                "properties": {
                    "command": {
                        "type": "array",
                        "items": {"type": "string"},
                        "description": "The program and its arguments, e.g. [\"bash\", \"-lc\", \"ls\"]."
                    },
                    "working_directory": {"type": "string", "description": "Where to run it."},
                    "timeout_ms": {"type": "integer", "description": "Give up after this long."},
                    "env": {
                        "type": "object",
                        "additionalProperties": {"type": "string"},
                        "description": "Environment variables to set."
                    }
                },
                "required": ["command"]
            }),
            TypedTool::Shell => json!({
                "type": "object",
                "properties": {
                    "commands": {
                        "type": "array",
                        "items": {"type": "string"},
                        "description": "Shell command lines to run in order, e.g. [\"ls -la\", \"cat README.md\"]."
                    },
                    "timeout_ms": {"type": "integer", "description": "Stop the commands after this many milliseconds."},
                    "max_output_length": {"type": "integer", "description": "Keep at most this many characters of each command's output."}
                },
                "required": ["commands"]
            }),
            TypedTool::ApplyPatch => json!({
                "type": "object",
                "properties": {
                    "type": {"type": "string", "enum": ["create_file", "update_file", "delete_file"]},
                    "path": {"type": "string", "description": "The file, relative to the workspace."},
                    "diff": {"type": "string", "description": "The V4A diff (not for delete_file)."}
                },
                "required": ["type", "path"]
            }),
        }
    }

    /// The field of a call item that the model's `arguments` make, with its value: `action`
    /// for the shells, `operation` for `apply_patch`. Arguments that are not a JSON object (a
    /// model that wrote something else) make an empty one, which the harness then refuses to
    /// run as it would the hosted model's malformed call.
    pub fn call_field(self, arguments: &str) -> (&'static str, Value) {
        let mut fields = match serde_json::from_str::<Value>(arguments) {
            Ok(Value::Object(fields)) => fields,
            _ => Map::new(),
        };
        match self {
            TypedTool::LocalShell => {
                // The `exec` action: the fields the model gave, `type` and `env` always there.
                fields.insert("type".into(), Value::from("exec"));
                fields.entry("env").or_insert_with(|| json!({}));
                ("action", Value::Object(fields))
            }
            TypedTool::Shell => {
                let mut action = Map::new();
                action.insert(
                    "commands".into(),
                    fields.remove("commands").unwrap_or_else(|| json!([])),
                );
                for key in ["timeout_ms", "max_output_length"] {
                    action.insert(key.into(), fields.remove(key).unwrap_or(Value::Null));
                }
                ("action", Value::Object(action))
            }
            TypedTool::ApplyPatch => ("operation", Value::Object(fields)),
        }
    }
}

/// Which typed tools a request lists (each shown to the model as a function of its name).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TypedTools {
    local_shell: bool,
    shell: bool,
    apply_patch: bool,
}

impl TypedTools {
    fn flag(&mut self, tool: TypedTool) -> &mut bool {
        match tool {
            TypedTool::LocalShell => &mut self.local_shell,
            TypedTool::Shell => &mut self.shell,
            TypedTool::ApplyPatch => &mut self.apply_patch,
        }
    }

    /// Notes that the request lists `tool`.
    pub fn add(&mut self, tool: TypedTool) {
        *self.flag(tool) = true;
    }

    pub fn contains(mut self, tool: TypedTool) -> bool {
        *self.flag(tool)
    }

    /// The typed tool a call of the function `name` is a call of, if the request lists it.
    pub fn called(self, name: &str) -> Option<TypedTool> {
        TypedTool::ALL
            .into_iter()
            .find(|tool| tool.name() == name && self.contains(*tool))
    }
}

/// The arguments a history `shell_call` renders with: its `action`'s `commands`,
/// `timeout_ms` and `max_output_length` (those given, not null), as the model writes them.
/// Values are taken as they are, never refused: the item may be this proxy's own output of a
/// call the model wrote loosely (`"timeout_ms": "5000"`), which the harness ran and echoes.
/// An `action` that is not an object renders as its JSON.
pub(crate) fn shell_call_arguments(node: Node<'_>) -> Read<String> {
    let action = node.required("action")?;
    let Some(given) = action.value.as_object() else {
        return Ok(action.value.to_string());
    };
    let mut fields = Map::new();
    for key in ["commands", "timeout_ms", "max_output_length"] {
        if let Some(value) = given.get(key).filter(|value| !value.is_null()) {
            fields.insert(key.into(), value.clone());
        }
    }
    Ok(Value::Object(fields).to_string())
}

/// The arguments a history `apply_patch_call` renders with: its `operation` as it is (the
/// model's own arguments when the item is this proxy's output; never refused, for the same
/// reason as [`shell_call_arguments`]).
pub(crate) fn apply_patch_arguments(node: Node<'_>) -> Read<String> {
    Ok(node.required("operation")?.value.to_string())
}

/// A text field of an output chunk: empty when absent or null, the JSON of anything but a
/// string.
fn chunk_text(chunk: Node<'_>, key: &str) -> Read<String> {
    Ok(match chunk.get(key)? {
        None => String::new(),
        Some(child) => match child.value {
            Value::Null => String::new(),
            Value::String(text) => text.clone(),
            other => other.to_string(),
        },
    })
}

/// The text a `shell_call_output` shows the model: each chunk's stdout, its stderr after a
/// `[stderr]` line, and how it ended: `[exit code N]`, `[exited]` (an exit without a code,
/// which the Agents SDK sends by default), `[timed out]`, or the outcome's JSON for another.
pub(crate) fn shell_output_text(node: Node<'_>) -> Read<String> {
    let mut text = String::new();
    for chunk in node.required("output")?.node().array()? {
        let chunk = chunk.node();
        chunk.object()?;
        let stdout = chunk_text(chunk, "stdout")?;
        let stderr = chunk_text(chunk, "stderr")?;
        let ended = match chunk.get("outcome")?.map(|child| child.value) {
            None | Some(Value::Null) => None,
            Some(outcome) => Some(
                match (
                    outcome.get("type").and_then(Value::as_str),
                    outcome.get("exit_code"),
                ) {
                    (Some("exit"), Some(Value::Number(code))) => format!("[exit code {code}]"),
                    (Some("exit"), _) => "[exited]".to_string(),
                    (Some("timeout"), _) => "[timed out]".to_string(),
                    _ => format!("[outcome {outcome}]"),
                },
            ),
        };
        let mut piece = stdout;
        if !stderr.is_empty() {
            if !piece.is_empty() && !piece.ends_with('\n') {
                piece.push('\n');
            }
            piece.push_str("[stderr]\n");
            piece.push_str(&stderr);
        }
        if let Some(ended) = ended {
            if !piece.is_empty() && !piece.ends_with('\n') {
                piece.push('\n');
            }
            piece.push_str(&ended);
        }
        // Chunks on lines of their own; one that says nothing adds nothing.
        if !piece.is_empty() {
            if !text.is_empty() {
                text.push('\n');
            }
            text.push_str(&piece);
        }
    }
    Ok(text)
}

/// The text an `apply_patch_call_output` shows the model: its `output`, after `[failed]`
/// when the operation failed (`[<status>]` for a status other than completed); `[completed]`
/// or `[failed]` alone without one.
pub(crate) fn apply_patch_output_text(node: Node<'_>) -> Read<String> {
    let status = node.required_str("status")?;
    let output = chunk_text(node, "output")?;
    Ok(match (status, output.is_empty()) {
        ("completed", true) => "[completed]".to_string(),
        ("completed", false) => output,
        (other, true) => format!("[{other}]"),
        (other, false) => format!("[{other}] {output}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_fields_are_made_from_the_arguments() {
        assert_eq!(
            TypedTool::Shell.call_field(r#"{"commands":["ls"],"timeout_ms":5}"#),
            (
                "action",
                json!({"commands": ["ls"], "timeout_ms": 5, "max_output_length": null})
            )
        );
        assert_eq!(
            TypedTool::ApplyPatch.call_field(r#"{"type":"delete_file","path":"a"}"#),
            ("operation", json!({"type": "delete_file", "path": "a"}))
        );
        assert_eq!(
            TypedTool::LocalShell.call_field(r#"{"command":["ls"]}"#),
            (
                "action",
                json!({"type": "exec", "command": ["ls"], "env": {}})
            )
        );
        // A model that wrote no object gets an empty action, never a panic.
        assert_eq!(
            TypedTool::Shell.call_field("not json"),
            (
                "action",
                json!({"commands": [], "timeout_ms": null, "max_output_length": null})
            )
        );
    }

    #[test]
    fn only_listed_tools_are_called_as_typed() {
        let mut tools = TypedTools::default();
        assert_eq!(tools.called("shell"), None);
        tools.add(TypedTool::Shell);
        assert_eq!(tools.called("shell"), Some(TypedTool::Shell));
        assert_eq!(tools.called("apply_patch"), None);
        assert_eq!(tools.called("exec"), None);
    }
}
