//! `gyre proxy` over HTTP with requests the harness tests do not make.
//!
//! Media in a real harness request: Claude Code 2.1.332 reading a PNG with its `Read` tool
//! sends the image inside the `tool_result` (captured with the research tools' fake server,
//! `tests/it/data/claude_code_reads_a_png.json`). By default the call is answered, the image
//! shown to the model as a placeholder naming it; with `--media reject` it is refused with a
//! 400 in Anthropic's format that names the part, and nothing is recorded.

use crate::support::{gyre, http, ProxyProcess};

fn post_capture(media: &str) -> (u16, String, std::path::PathBuf, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("tito.log");
    let mut proxy = ProxyProcess::start(&[
        "--listen",
        "127.0.0.1:0",
        "--engine",
        "deterministic",
        "--open",
        "1",
        "--media",
        media,
        "--log",
        log.to_str().expect("utf-8"),
    ]);
    let opened = proxy.next_json();
    let token = opened["token"].as_str().expect("token").to_string();
    let body = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/it/data/claude_code_reads_a_png.json"),
    )
    .expect("the captured body");
    let (status, answer) = http(
        &proxy.address,
        "POST",
        "/v1/messages?beta=true",
        &[("x-api-key", &token), ("content-type", "application/json")],
        &body,
    );
    (status, answer, log, dir)
}

#[test]
fn a_png_read_by_claude_code_is_answered_with_a_placeholder() {
    let (status, answer, log, _dir) = post_capture("placeholder");
    assert_eq!(status, 200, "{answer}");
    assert!(
        answer.contains("event: message_stop"),
        "a whole stream: {answer}"
    );
    let (code, stdout, stderr) = gyre(&["replay", log.to_str().expect("utf-8"), "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("JSON report");
    assert_eq!(
        report["model_calls"]["calls"], 1,
        "the call is recorded: {stdout}"
    );
}

#[test]
fn with_media_reject_the_png_is_refused_by_its_path() {
    let (status, answer, log, _dir) = post_capture("reject");
    assert_eq!(status, 400, "{answer}");
    let (code, stdout, stderr) = gyre(&["replay", log.to_str().expect("utf-8"), "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("JSON report");
    assert_eq!(
        report["model_calls"]["calls"], 0,
        "nothing recorded: {stdout}"
    );
    let error: serde_json::Value = serde_json::from_str(&answer).expect("JSON error");
    assert_eq!(error["type"], "error");
    let message = error["error"]["message"].as_str().expect("message");
    assert!(
        message.starts_with("messages[5].content[1].content[0]: `image` content is not supported"),
        "{message}"
    );
}

/// `gyre proxy` on a deterministic engine, recording to an event file in `dir`, with `extra`
/// flags.
fn deterministic_proxy(dir: &std::path::Path, extra: &[&str]) -> ProxyProcess {
    let log = dir.join("tito.log");
    let mut args = vec![
        "--listen",
        "127.0.0.1:0",
        "--engine",
        "deterministic",
        "--log",
        log.to_str().expect("utf-8"),
    ];
    args.extend_from_slice(extra);
    ProxyProcess::start(&args)
}

/// A route the proxy does not serve answers 404 in the error shape its client reads: OpenAI's
/// for an OpenAI path (Codex's `/v1/responses/compact`, `/v1/models`), Anthropic's for a
/// client that sends `anthropic-version`.
#[test]
fn unknown_routes_answer_in_the_clients_error_shape() {
    let dir = tempfile::tempdir().expect("tempdir");
    let proxy = deterministic_proxy(dir.path(), &[]);
    let (status, body) = http(&proxy.address, "POST", "/v1/responses/compact", &[], "{}");
    assert_eq!(status, 404, "{body}");
    let error: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(error["error"]["code"], "not_found", "{body}");
    assert!(
        error["error"].get("param").is_some(),
        "OpenAI's shape: {body}"
    );
    assert!(
        error["error"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("POST /v1/responses/compact")),
        "{body}"
    );
    let (status, body) = http(
        &proxy.address,
        "GET",
        "/v1/models",
        &[("anthropic-version", "2023-06-01")],
        "",
    );
    assert_eq!(status, 404, "{body}");
    let error: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(error["type"], "error", "Anthropic's shape: {body}");
}

/// A client that opens a connection and stops inside its request headers is disconnected after
/// `--header-read-timeout-s` (a vanished or hostile harness does not hold connections), while
/// other clients are served throughout.
#[test]
fn a_client_stuck_in_its_headers_is_disconnected() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().expect("tempdir");
    let proxy = deterministic_proxy(dir.path(), &["--header-read-timeout-s", "1"]);
    let mut stuck = std::net::TcpStream::connect(&proxy.address).expect("proxy accepts");
    stuck
        .write_all(b"POST /v1/messages HTTP/1.1\r\nhost: proxy\r\ncontent-type: applica")
        .expect("write");
    let started = std::time::Instant::now();
    let (status, body) = http(&proxy.address, "GET", "/health", &[], "");
    assert_eq!(status, 200, "{body}");
    // Bounded: the read ends when the proxy closes the connection, long before this.
    stuck
        .set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .expect("timeout");
    let mut answer = Vec::new();
    let read = stuck.read_to_end(&mut answer);
    match read {
        Ok(_) => {}
        Err(error) if error.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(error) => panic!("the connection did not end: {error}"),
    }
    let text = String::from_utf8_lossy(&answer);
    assert!(
        answer.is_empty() || text.starts_with("HTTP/1.1 408"),
        "closed, or told it timed out: {text}"
    );
    let waited = started.elapsed();
    assert!(
        waited < std::time::Duration::from_secs(20),
        "closed after {waited:?}, not at the timeout"
    );
}
