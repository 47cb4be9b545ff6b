//! Anthropic's client-side built-in tools: a request lists them by `type` and `name` only
//! (`{"type": "bash_20250124", "name": "bash"}`), without an `input_schema`, because Claude
//! was trained on their interface. Our policy was not, so the proxy shows the model each one
//! as an ordinary function with the parameters the harness will accept, in our own words:
//!
//! - `bash_*` (`bash`): `command`, or `restart`;
//! - `text_editor_*` (`str_replace_editor`, `str_replace_based_edit_tool`): `view`, `create`,
//!   `str_replace`, `insert` (`new_str` after `insert_line`), and `undo_edit` in the versions
//!   before `text_editor_20250429`, which dropped it;
//! - `memory_*` (`memory`): the editor's commands over `/memories`, `insert` taking
//!   `insert_text`, plus `delete` and `rename`.
//!
//! The model's calls come back as `tool_use` blocks with that name and input, which the
//! harness runs as it would Claude's. Server tools (`web_search_…`, `web_fetch_…`,
//! `code_execution_…`) run at Anthropic, not in the harness, and the computer-use tools need
//! screenshots a text model cannot read: those stay listed by name only.
//!
//! Pure: a type name in, a description and a JSON schema out.

use serde_json::{json, Value};

/// The first text editor version without `undo_edit`.
const EDITOR_WITHOUT_UNDO: &str = "20250429";

/// The description and input schema to show for the built-in tool of type `kind`, or `None`
/// when `kind` is not a client-side built-in tool the proxy knows.
pub fn client_tool(kind: &str) -> Option<(&'static str, Value)> {
    if let Some(version) = kind.strip_prefix("bash_") {
        return dated(version).then(bash);
    }
    if let Some(version) = kind.strip_prefix("text_editor_") {
        return dated(version).then(|| text_editor(version < EDITOR_WITHOUT_UNDO));
    }
    if let Some(version) = kind.strip_prefix("memory_") {
        return dated(version).then(memory);
    }
    None
}

/// A tool type's version suffix: eight digits, `YYYYMMDD`.
fn dated(version: &str) -> bool {
    version.len() == 8 && version.bytes().all(|byte| byte.is_ascii_digit())
}

fn bash() -> (&'static str, Value) {
    (
        "Run a command in a persistent bash shell. The working directory, environment \
         variables and background processes carry over from one call to the next. Give \
         `command` to run it; give `restart: true` (and no command) to start a fresh shell.",
        json!({
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "The bash command to run."},
                "restart": {
                    "type": "boolean",
                    "description": "Start a fresh shell instead of running a command."
                }
            }
        }),
    )
}

fn text_editor(with_undo: bool) -> (&'static str, Value) {
    let mut commands = vec!["view", "create", "str_replace", "insert"];
    if with_undo {
        commands.push("undo_edit");
    }
    let description = if with_undo {
        "View, create and edit text files. `view`: a file with line numbers (only the lines in \
         `view_range` [first, last] when given; last -1 means the end) or a directory's \
         listing. `create`: write `file_text` to a new file at `path`. `str_replace`: replace \
         `old_str`, which must occur exactly once in the file, with `new_str`. `insert`: insert \
         `new_str` after line `insert_line` (0 inserts at the top). `undo_edit`: revert the \
         last edit made to `path`. Paths are absolute."
    } else {
        "View, create and edit text files. `view`: a file with line numbers (only the lines in \
         `view_range` [first, last] when given; last -1 means the end) or a directory's \
         listing. `create`: write `file_text` to a new file at `path`. `str_replace`: replace \
         `old_str`, which must occur exactly once in the file, with `new_str`. `insert`: insert \
         `new_str` after line `insert_line` (0 inserts at the top). Paths are absolute."
    };
    (
        description,
        json!({
            "type": "object",
            "properties": {
                "command": {"type": "string", "enum": commands},
                "path": {"type": "string", "description": "Absolute path of the file or directory."},
                "file_text": {"type": "string", "description": "`create`: the new file's content."},
                "old_str": {
                    "type": "string",
                    "description": "`str_replace`: the exact text to replace."
                },
                "new_str": {
                    "type": "string",
                    "description": "`str_replace`: the replacement; `insert`: the text to insert."
                },
                "insert_line": {
                    "type": "integer",
                    "description": "`insert`: the line after which the text goes (0: the top)."
                },
                "view_range": view_range()
            },
            "required": ["command", "path"]
        }),
    )
}

/// The `view_range` parameter the editor and the memory tool share.
fn view_range() -> Value {
    json!({
        "type": "array",
        "items": {"type": "integer"},
        "minItems": 2,
        "maxItems": 2,
        "description": "`view`: the first and last line to show (last -1: the end)."
    })
}

fn memory() -> (&'static str, Value) {
    (
        "Read and write your memory: files under /memories that persist from one conversation \
         to the next. `view`: a directory's listing or a file with line numbers (`view_range` \
         [first, last] for some of its lines). `create`: write `file_text` to `path`. \
         `str_replace`: replace `old_str`, which must occur exactly once, with `new_str`. \
         `insert`: insert `insert_text` at line `insert_line`. `delete`: remove `path`. \
         `rename`: move `old_path` to `new_path`.",
        json!({
            "type": "object",
            "properties": {
                "command": {
                    "type": "string",
                    "enum": ["view", "create", "str_replace", "insert", "delete", "rename"]
                },
                "path": {"type": "string", "description": "A path under /memories."},
                "file_text": {"type": "string", "description": "`create`: the file's content."},
                "old_str": {"type": "string", "description": "`str_replace`: the text to replace."},
                "new_str": {"type": "string", "description": "`str_replace`: the replacement."},
                "insert_line": {"type": "integer", "description": "`insert`: the line number."},
                "insert_text": {"type": "string", "description": "`insert`: the text to insert."},
                "view_range": view_range(),
                "old_path": {"type": "string", "description": "`rename`: the current path."},
                "new_path": {"type": "string", "description": "`rename`: the new path."}
            },
            "required": ["command"]
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commands(kind: &str) -> Vec<String> {
        let (_, schema) = client_tool(kind).expect("known");
        schema["properties"]["command"]["enum"]
            .as_array()
            .expect("enum")
            .iter()
            .map(|command| command.as_str().expect("text").to_string())
            .collect()
    }

    #[test]
    fn each_client_built_in_tool_gets_a_schema() {
        assert!(client_tool("bash_20241022").is_some());
        assert!(client_tool("bash_20250124").is_some());
        assert!(commands("text_editor_20250124").contains(&"undo_edit".to_string()));
        assert!(!commands("text_editor_20250429").contains(&"undo_edit".to_string()));
        assert!(!commands("text_editor_20250728").contains(&"undo_edit".to_string()));
        assert!(commands("memory_20250818").contains(&"rename".to_string()));
        // A later dated version of a known tool gets the newest interface.
        assert!(!commands("text_editor_20260101").contains(&"undo_edit".to_string()));
    }

    #[test]
    fn server_and_unknown_tools_get_none() {
        for kind in [
            "web_search_20250305",
            "web_fetch_20250910",
            "code_execution_20250825",
            "computer_20250124",
            "custom",
            "bash",
            "bash_latest",
            "text_editor_2025",
        ] {
            assert!(client_tool(kind).is_none(), "{kind}");
        }
    }
}
