//! Request content a text-only model cannot read, shown to it as text.
//!
//! A harness sends images, audio and binary files in ordinary turns: Claude Code's `Read` of a
//! PNG answers with an `image` block inside the `tool_result`, Codex's `view_image` with an
//! `input_image` in the `function_call_output`. Refusing the request would end the whole
//! execution over one tool call, so by default each such part becomes a short placeholder
//! that says what was left out ([`placeholder`]); `gyre proxy --media reject` refuses them
//! instead (400, naming the part: [`first_media_part`]). The placeholder depends only on the
//! part's bytes, so the next turn, which repeats the part, renders the same text and extends
//! the tree.
//!
//! Parts that carry text (an Anthropic `document` with a text source, a `search_result`, the
//! results of a server-side tool) are rendered as that text; they are not media.

use serde_json::Value;

use crate::messages::Api;

/// How a request's media parts are treated (`gyre proxy --media`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MediaPolicy {
    /// Each becomes a text placeholder naming what was left out.
    #[default]
    Placeholder,
    /// The request is refused with a 400 naming the first one.
    Reject,
}

/// Whether `kind` (a content part's `type`) is media in `api`'s vocabulary. An Anthropic
/// `document` is media unless its source is text ([`anthropic_document_text`]).
pub fn is_media(api: Api, kind: &str, part: &Value) -> bool {
    match api {
        Api::Anthropic => {
            kind == "image" || (kind == "document" && anthropic_document_text(part).is_none())
        }
        Api::OpenAiChat => matches!(kind, "image_url" | "input_audio" | "file"),
        Api::OpenAiResponses => matches!(kind, "input_image" | "input_file" | "input_audio"),
    }
}

/// The text shown to the model in place of media part `part` (of type `kind`), e.g.
/// `[image (image/png, 24 KB) omitted: this model reads text only]`.
pub fn placeholder(kind: &str, part: &Value) -> String {
    let noun = match kind {
        "image" | "image_url" | "input_image" => "image",
        "input_audio" => "audio",
        "document" => "document",
        _ => "file",
    };
    let mut details: Vec<String> = Vec::new();
    let name = ["filename", "title"]
        .iter()
        .find_map(|key| part.get(key).and_then(Value::as_str))
        .or_else(|| part.pointer("/file/filename").and_then(Value::as_str));
    if let Some(name) = name {
        details.push(name.to_string());
    }
    // The encoded payload: an Anthropic source, a data URL, or OpenAI's base64 fields.
    let source = part.get("source");
    let url = [
        "/source/url",
        "/image_url/url",
        "/image_url",
        "/file_data",
        "/file/file_data",
    ]
    .iter()
    .find_map(|pointer| part.pointer(pointer).and_then(Value::as_str));
    let (media_type, data) = match (source, url) {
        (Some(source), _) if source.get("data").is_some() => (
            source
                .get("media_type")
                .and_then(Value::as_str)
                .map(str::to_string),
            source.get("data").and_then(Value::as_str),
        ),
        (_, Some(url)) if url.starts_with("data:") => {
            let (head, payload) = url.split_once(',').unwrap_or((url, ""));
            let media_type = head["data:".len()..]
                .split(';')
                .next()
                .filter(|media_type| !media_type.is_empty())
                .map(str::to_string);
            (media_type, Some(payload))
        }
        (_, Some(url)) => {
            details.push(url.chars().take(200).collect());
            (None, None)
        }
        _ => {
            let audio = part.get("input_audio");
            (
                audio
                    .and_then(|audio| audio.get("format"))
                    .and_then(Value::as_str)
                    .map(|format| format!("audio/{format}")),
                audio
                    .and_then(|audio| audio.get("data"))
                    .and_then(Value::as_str),
            )
        }
    };
    if let Some(media_type) = media_type {
        details.push(media_type);
    }
    if let Some(data) = data {
        let padding = data.bytes().rev().take_while(|byte| *byte == b'=').count();
        let bytes = (data.len() / 4 * 3).saturating_sub(padding);
        details.push(if bytes < 1024 {
            format!("{bytes} bytes")
        } else {
            format!("{} KB", bytes / 1024)
        });
    }
    if details.is_empty() {
        format!("[{noun} omitted: this model reads text only]")
    } else {
        format!(
            "[{noun} ({}) omitted: this model reads text only]",
            details.join(", ")
        )
    }
}

/// The text of an Anthropic `document` whose source is text (`{"type": "text", "data"}` or
/// `{"type": "content", "content": [text blocks]}`), headed by its title; `None` for binary
/// sources (PDF, URL, file id).
pub fn anthropic_document_text(part: &Value) -> Option<String> {
    let source = part.get("source")?;
    let body = match source.get("type").and_then(Value::as_str)? {
        "text" => source.get("data")?.as_str()?.to_string(),
        "content" => match source.get("content")? {
            Value::String(text) => text.clone(),
            Value::Array(blocks) => blocks
                .iter()
                .map(|block| match block.get("text").and_then(Value::as_str) {
                    Some(text) => text.to_string(),
                    None => placeholder(
                        block.get("type").and_then(Value::as_str).unwrap_or("file"),
                        block,
                    ),
                })
                .collect::<Vec<_>>()
                .join("\n"),
            _ => return None,
        },
        _ => return None,
    };
    Some(match part.get("title").and_then(Value::as_str) {
        Some(title) => format!("{title}\n{body}"),
        None => body,
    })
}

/// An Anthropic `search_result` block as text: title, source, then its text blocks.
pub fn anthropic_search_result_text(part: &Value) -> String {
    let mut text = String::new();
    if let Some(title) = part.get("title").and_then(Value::as_str) {
        text.push_str(title);
    }
    if let Some(source) = part.get("source").and_then(Value::as_str) {
        text.push_str(&format!(" ({source})"));
    }
    if let Some(Value::Array(blocks)) = part.get("content") {
        for block in blocks {
            if let Some(body) = block.get("text").and_then(Value::as_str) {
                text.push('\n');
                text.push_str(body);
            }
        }
    }
    text
}

/// A server-side tool's call or result block in an assistant message (`server_tool_use`,
/// `web_search_tool_result`, `web_fetch_tool_result`, `mcp_tool_use`, …): the server ran it,
/// so it is history the model reads, shown as text. `None` when `kind` is not one.
pub fn anthropic_server_block_text(kind: &str, part: &Value) -> Option<String> {
    let compact = |value: Option<&Value>| {
        value
            .map(|value| serde_json::to_string(value).unwrap_or_default())
            .unwrap_or_default()
    };
    match kind {
        "server_tool_use" | "mcp_tool_use" => {
            let name = part.get("name").and_then(Value::as_str).unwrap_or(kind);
            Some(format!("[{name}: {}]", compact(part.get("input"))))
        }
        "web_search_tool_result" => {
            let content = part.get("content");
            Some(match content {
                Some(Value::Array(results)) => {
                    let mut text = String::from("[web_search results]");
                    for result in results {
                        let title = result.get("title").and_then(Value::as_str).unwrap_or("");
                        let url = result.get("url").and_then(Value::as_str).unwrap_or("");
                        text.push_str(&format!("\n- {title} ({url})"));
                    }
                    text
                }
                Some(error) => format!(
                    "[web_search error: {}]",
                    error
                        .get("error_code")
                        .and_then(Value::as_str)
                        .unwrap_or("unknown")
                ),
                None => "[web_search results]".to_string(),
            })
        }
        kind if kind.ends_with("_tool_result") && kind != "tool_result" => {
            let content = part
                .get("content")
                .map(|content| without_media(Api::Anthropic, content));
            Some(format!("[{kind}: {}]", compact(content.as_ref())))
        }
        _ => None,
    }
}

/// The keys under which a part nests other parts (a tool result's `content`, a Responses
/// output or reasoning summary, a document's `source`); tool inputs and arguments are the
/// model's own JSON and are never searched.
const NESTING_KEYS: [&str; 4] = ["content", "output", "summary", "source"];

/// `value` with every media part inside it (at any depth, through [`NESTING_KEYS`]) replaced
/// by its placeholder string: server-side tools' results hold fetched documents and images.
pub fn without_media(api: Api, value: &Value) -> Value {
    match value {
        Value::Object(members) => {
            let kind = members.get("type").and_then(Value::as_str).unwrap_or("");
            if is_media(api, kind, value) {
                return Value::String(placeholder(kind, value));
            }
            Value::Object(
                members
                    .iter()
                    .map(|(key, member)| {
                        let member = if NESTING_KEYS.contains(&key.as_str()) {
                            without_media(api, member)
                        } else {
                            member.clone()
                        };
                        (key.clone(), member)
                    })
                    .collect(),
            )
        }
        Value::Array(items) => {
            Value::Array(items.iter().map(|item| without_media(api, item)).collect())
        }
        other => other.clone(),
    }
}

/// The first media part at or under `value` (through [`NESTING_KEYS`]), with its path.
fn find_media(api: Api, value: &Value, path: String) -> Option<(String, String)> {
    match value {
        Value::Object(members) => {
            let kind = members.get("type").and_then(Value::as_str).unwrap_or("");
            if is_media(api, kind, value) {
                return Some((path, kind.to_string()));
            }
            NESTING_KEYS.iter().find_map(|key| {
                members
                    .get(*key)
                    .and_then(|member| find_media(api, member, format!("{path}.{key}")))
            })
        }
        Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(at, item)| find_media(api, item, format!("{path}[{at}]"))),
        _ => None,
    }
}

/// The first media part of a request body (its path and type), for `--media reject`.
/// The 400 for a media part at `path` when the proxy runs with `--media reject`.
pub fn rejected(api: Api, path: String, kind: &str) -> crate::api_error::ApiError {
    crate::api_error::ApiError::invalid_field(
        api,
        path,
        format!(
            "`{kind}` content is not supported: this model takes text only \
             (the proxy runs with --media reject)"
        ),
    )
}

pub fn first_media_part(api: Api, body: &Value) -> Option<(String, String)> {
    let key = crate::body::conversation_key(api);
    body.get(key)
        .and_then(|conversation| find_media(api, conversation, key.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn placeholders_name_what_was_left_out() {
        let png = json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}});
        assert_eq!(
            placeholder("image", &png),
            "[image (image/png, 8 bytes) omitted: this model reads text only]"
        );
        let data_url = json!({"type": "input_image", "image_url": format!("data:image/jpeg;base64,{}", "A".repeat(4096))});
        assert_eq!(
            placeholder("input_image", &data_url),
            "[image (image/jpeg, 3 KB) omitted: this model reads text only]"
        );
        let chat =
            json!({"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}});
        assert_eq!(
            placeholder("image_url", &chat),
            "[image (https://example.com/cat.png) omitted: this model reads text only]"
        );
        let file = json!({"type": "input_file", "filename": "a.pdf", "file_data": "data:application/pdf;base64,aGk="});
        assert_eq!(
            placeholder("input_file", &file),
            "[file (a.pdf, application/pdf, 2 bytes) omitted: this model reads text only]"
        );
        let audio =
            json!({"type": "input_audio", "input_audio": {"format": "wav", "data": "AAAA"}});
        assert_eq!(
            placeholder("input_audio", &audio),
            "[audio (audio/wav, 3 bytes) omitted: this model reads text only]"
        );
        assert_eq!(
            placeholder("file", &json!({"type": "file", "file": {"file_id": "f"}})),
            "[file omitted: this model reads text only]"
        );
    }

    #[test]
    fn text_documents_are_text_not_media() {
        let text = json!({"type": "document", "title": "doc", "source": {"type": "text", "media_type": "text/plain", "data": "Plain"}});
        assert_eq!(
            anthropic_document_text(&text).as_deref(),
            Some("doc\nPlain")
        );
        assert!(!is_media(Api::Anthropic, "document", &text));
        let pdf = json!({"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBE"}});
        assert!(is_media(Api::Anthropic, "document", &pdf));
    }

    #[test]
    fn the_first_media_part_is_found_inside_tool_results() {
        let body = json!({"messages": [
            {"role": "user", "content": "hi"},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
                {"type": "text", "text": "x"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}
            ]}]}
        ]});
        assert_eq!(
            first_media_part(Api::Anthropic, &body),
            Some(("messages[1].content[0].content[1]".into(), "image".into()))
        );
        let responses = json!({"input": [
            {"type": "function_call_output", "call_id": "c", "output": [{"type": "input_image", "image_url": "data:image/png;base64,"}]}
        ]});
        assert_eq!(
            first_media_part(Api::OpenAiResponses, &responses),
            Some(("input[0].output[0]".into(), "input_image".into()))
        );
        assert_eq!(
            first_media_part(Api::OpenAiChat, &json!({"messages": []})),
            None
        );
    }

    #[test]
    fn media_nested_in_server_results_documents_and_summaries_is_found_and_replaced() {
        let fetched = json!({"type": "web_fetch_tool_result", "tool_use_id": "s", "content": {
            "type": "web_fetch_result", "url": "https://a.example/a.pdf",
            "content": {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0xLjQK"}}
        }});
        let text =
            anthropic_server_block_text("web_fetch_tool_result", &fetched).expect("a server block");
        assert!(
            !text.contains("JVBERi0x"),
            "no base64 in the prompt: {text}"
        );
        assert!(
            text.contains("[document (application/pdf, 9 bytes) omitted"),
            "{text}"
        );
        let body = json!({"messages": [{"role": "assistant", "content": [fetched]}]});
        assert_eq!(
            first_media_part(Api::Anthropic, &body),
            Some((
                "messages[0].content[0].content.content".into(),
                "document".into()
            ))
        );
        let document = json!({"type": "document", "source": {"type": "content", "content": [
            {"type": "text", "text": "before"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
        ]}});
        assert_eq!(
            anthropic_document_text(&document).as_deref(),
            Some("before\n[image (image/png, 8 bytes) omitted: this model reads text only]")
        );
        let body = json!({"messages": [{"role": "user", "content": [document]}]});
        assert_eq!(
            first_media_part(Api::Anthropic, &body),
            Some((
                "messages[0].content[0].source.content[1]".into(),
                "image".into()
            ))
        );
        let reasoning = json!({"input": [{"type": "reasoning", "summary": [{"type": "input_image", "image_url": "data:image/png;base64,"}]}]});
        assert_eq!(
            first_media_part(Api::OpenAiResponses, &reasoning),
            Some(("input[0].summary[0]".into(), "input_image".into()))
        );
        let tool_input = json!({"messages": [{"role": "assistant", "content": [
            {"type": "tool_use", "id": "t", "name": "draw", "input": {"type": "image"}}
        ]}]});
        assert_eq!(
            first_media_part(Api::Anthropic, &tool_input),
            None,
            "tool inputs are the model's JSON"
        );
    }

    #[test]
    fn server_tool_blocks_read_as_text() {
        let call = json!({"type": "server_tool_use", "id": "s", "name": "web_search", "input": {"query": "gyre"}});
        assert_eq!(
            anthropic_server_block_text("server_tool_use", &call).as_deref(),
            Some(r#"[web_search: {"query":"gyre"}]"#)
        );
        let results = json!({"type": "web_search_tool_result", "tool_use_id": "s", "content": [
            {"type": "web_search_result", "url": "https://a.example", "title": "A", "encrypted_content": "E"}
        ]});
        assert_eq!(
            anthropic_server_block_text("web_search_tool_result", &results).as_deref(),
            Some("[web_search results]\n- A (https://a.example)")
        );
        let error = json!({"type": "web_search_tool_result", "content": {"type": "web_search_tool_result_error", "error_code": "max_uses_exceeded"}});
        assert_eq!(
            anthropic_server_block_text("web_search_tool_result", &error).as_deref(),
            Some("[web_search error: max_uses_exceeded]")
        );
        assert_eq!(anthropic_server_block_text("tool_result", &json!({})), None);
    }
}
