//! `gyre proxy --capture FILE`: every authenticated model-API request, as the harness sent it,
//! appended to a JSON-lines file, so a harness's traffic can be replayed against another proxy
//! build or engine (`gyre capture replay`) when a new CLI version misbehaves.
//!
//! One line per request, written before the request is parsed (so requests the proxy refuses
//! are captured too): `{"seq", "execution", "agent", "api", "method", "path", "headers",
//! "body"}`. `body` is the exact body text (`body_base64` instead when it is not UTF-8).
//! Credentials are never written: `x-api-key`, `authorization`, `cookie` and
//! `proxy-authorization` become `<redacted>`, and a path credential (`/x/<token>/...`) becomes
//! `/x/<redacted>/...`. The file is flushed per line, not synced: it is a debugging aid, not a
//! record (the TITO records on the log are those).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use axum::http::HeaderMap;
use serde_json::{json, Map, Value};

use crate::Api;

/// Headers whose values are credentials.
const SECRET_HEADERS: [&str; 4] = [
    "x-api-key",
    "authorization",
    "cookie",
    "proxy-authorization",
];

/// The capture file of a running proxy.
pub struct Capture {
    file: Mutex<BufWriter<File>>,
    seq: AtomicU64,
}

/// What a request's line needs besides its body, taken on the async side (cheap).
#[derive(Clone)]
pub struct CaptureHead {
    path: String,
    headers: Map<String, Value>,
}

impl Capture {
    /// Opens `path` for appending (created if missing).
    pub fn open(path: &Path) -> Result<Capture, String> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|error| format!("capture file {}: {error}", path.display()))?;
        Ok(Capture {
            file: Mutex::new(BufWriter::new(file)),
            seq: AtomicU64::new(0),
        })
    }

    /// The request line's path (credential removed) and headers (secrets redacted;
    /// `content-encoding` left out, the captured body being the decoded one).
    pub fn head(path_and_query: &str, headers: &HeaderMap) -> CaptureHead {
        let path = match path_and_query.strip_prefix("/x/") {
            Some(rest) => match rest.split_once('/') {
                Some((_, tail)) => format!("/x/<redacted>/{tail}"),
                None => "/x/<redacted>".to_string(),
            },
            None => path_and_query.to_string(),
        };
        let mut map = Map::new();
        for (name, value) in headers {
            let name = name.as_str();
            // The body is captured as the proxy read it, after undoing any content coding.
            if name == "content-encoding" {
                continue;
            }
            let value = if SECRET_HEADERS.contains(&name) {
                "<redacted>".to_string()
            } else {
                String::from_utf8_lossy(value.as_bytes()).into_owned()
            };
            map.insert(name.to_string(), Value::String(value));
        }
        CaptureHead { path, headers: map }
    }

    /// Adds a header of the proxy's own to a captured request (`x-gyre-…`): what the body
    /// alone no longer shows, such as the stored response a chained request continued.
    pub fn note(head: &mut CaptureHead, name: &str, value: &str) {
        head.headers
            .insert(name.to_string(), Value::String(value.to_string()));
    }

    /// Appends one request. A failed write is logged, never fails the call.
    pub fn write(
        &self,
        head: CaptureHead,
        api: Api,
        execution: u64,
        agent: Option<&str>,
        body: &[u8],
    ) {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let mut line = json!({
            "seq": seq,
            "execution": execution,
            "agent": agent.unwrap_or("main"),
            "api": api_name(api),
            "method": "POST",
            "path": head.path,
            "headers": head.headers,
        });
        match std::str::from_utf8(body) {
            Ok(text) => line["body"] = Value::String(text.to_string()),
            Err(_) => line["body_base64"] = Value::String(base64(body)),
        }
        let mut text = line.to_string();
        text.push('\n');
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(error) = file.write_all(text.as_bytes()).and_then(|()| file.flush()) {
            tracing::warn!(%error, "writing the capture file");
        }
    }
}

fn api_name(api: Api) -> &'static str {
    match api {
        Api::Anthropic => "anthropic",
        Api::OpenAiChat => "openai_chat",
        Api::OpenAiResponses => "openai_responses",
    }
}

/// Standard base64 with padding.
pub fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> shift) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn secrets_never_reach_the_file() {
        let mut headers = HeaderMap::new();
        headers.insert("x-api-key", HeaderValue::from_static("gx-secret"));
        headers.insert(
            "authorization",
            HeaderValue::from_static("Bearer gx-secret"),
        );
        headers.insert("anthropic-beta", HeaderValue::from_static("a,b"));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("capture.jsonl");
        let capture = Capture::open(&path).unwrap();
        let head = Capture::head("/x/gx-secret/v1/messages?beta=true", &headers);
        capture.write(head, Api::Anthropic, 7, None, br#"{"model":"m"}"#);
        let head = Capture::head("/v1/responses", &HeaderMap::new());
        capture.write(head, Api::OpenAiResponses, 8, Some("sub:1"), &[0xff, 0x00]);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains("gx-secret"), "{text}");
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines[0]["path"], "/x/<redacted>/v1/messages?beta=true");
        assert_eq!(lines[0]["headers"]["x-api-key"], "<redacted>");
        assert_eq!(lines[0]["headers"]["anthropic-beta"], "a,b");
        assert_eq!(lines[0]["body"], r#"{"model":"m"}"#);
        assert_eq!(
            (lines[0]["seq"].as_u64(), lines[1]["seq"].as_u64()),
            (Some(0), Some(1))
        );
        assert_eq!(lines[1]["agent"], "sub:1");
        assert_eq!(lines[1]["body_base64"], "/wA=");
    }

    #[test]
    fn base64_matches_the_standard() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    }
}
