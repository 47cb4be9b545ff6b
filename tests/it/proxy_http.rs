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

/// Over `--max-connections`, a new connection is answered "overloaded" in its API's error
/// shape with `retry-after` and closed (a client opening connections without end cannot take
/// every descriptor); once a served connection closes, new ones are served again.
#[test]
fn connections_over_the_cap_are_answered_overloaded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let proxy = deterministic_proxy(dir.path(), &["--max-connections", "2"]);
    let first = std::net::TcpStream::connect(&proxy.address).expect("proxy accepts");
    let second = std::net::TcpStream::connect(&proxy.address).expect("proxy accepts");
    let (status, body) = http(
        &proxy.address,
        "POST",
        "/v1/messages",
        &[
            ("anthropic-version", "2023-06-01"),
            ("content-type", "application/json"),
        ],
        r#"{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}"#,
    );
    assert_eq!(status, 529, "{body}");
    let error: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(error["type"], "error", "{body}");
    assert_eq!(error["error"]["type"], "overloaded_error", "{body}");
    assert!(
        error["error"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("--max-connections")),
        "{body}"
    );
    let (status, body) = http(&proxy.address, "POST", "/v1/responses", &[], "{}");
    assert_eq!(status, 503, "OpenAI's overloaded status: {body}");
    let error: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert!(
        error["error"].get("param").is_some(),
        "OpenAI's shape: {body}"
    );
    // The answer carries retry-after and closes the connection.
    let raw = raw_exchange(
        &proxy.address,
        "GET /health HTTP/1.1\r\nhost: proxy\r\n\r\n",
    );
    assert!(
        raw.starts_with("HTTP/1.1 529"),
        "Anthropic's shape by default: {raw}"
    );
    let head = raw
        .split("\r\n\r\n")
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase();
    assert!(head.contains("retry-after: 1"), "{raw}");
    assert!(head.contains("connection: close"), "{raw}");
    // A served connection closes: its slot serves the next client (polled; the proxy sees the
    // close asynchronously).
    drop(first);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let (status, body) = http(&proxy.address, "GET", "/metrics", &[], "");
        if status == 200 {
            let refused: u64 = body
                .lines()
                .find_map(|line| line.strip_prefix("gyre_proxy_connections_refused_total "))
                .and_then(|value| value.parse().ok())
                .unwrap_or_else(|| panic!("the refusals counted: {body}"));
            assert!(
                refused >= 3,
                "three refused at least (and any polls): {body}"
            );
            assert!(body.contains("gyre_proxy_connections_open "), "{body}");
            break;
        }
        assert_eq!(status, 529, "{body}");
        assert!(
            std::time::Instant::now() < deadline,
            "the slot was never freed"
        );
        std::thread::yield_now();
    }
    drop(second);
}

/// Every answer, an error included, carries a request id under both APIs' header names, one
/// per request.
#[test]
fn answers_carry_a_request_id() {
    let dir = tempfile::tempdir().expect("tempdir");
    let proxy = deterministic_proxy(dir.path(), &[]);
    let ids: Vec<String> = (0..2)
        .map(|_| {
            let raw = raw_exchange(
                &proxy.address,
                "POST /v1/messages HTTP/1.1\r\nhost: proxy\r\nconnection: close\r\ncontent-length: 2\r\n\r\n{}",
            );
            assert!(raw.starts_with("HTTP/1.1 401"), "{raw}");
            let head = raw.split("\r\n\r\n").next().unwrap_or_default().to_ascii_lowercase();
            let header = |name: &str| {
                head.lines()
                    .find_map(|line| line.strip_prefix(name))
                    .map(str::to_string)
                    .unwrap_or_else(|| panic!("no {name} in {head}"))
            };
            let id = header("request-id: ");
            assert_eq!(header("x-request-id: "), id);
            assert!(id.starts_with("req_") && id.len() == 28, "{id}");
            id
        })
        .collect();
    assert_ne!(ids[0], ids[1]);
}

/// Sends `request` as is on a fresh connection and reads until the proxy closes it.
fn raw_exchange(address: &str, request: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).expect("proxy accepts");
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .expect("timeout");
    stream.write_all(request.as_bytes()).expect("write");
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer).into_owned()
}

/// A route the proxy does not serve answers 404 in the error shape its client reads: OpenAI's
/// for an OpenAI path (Codex's `/v1/responses/compact`, `/v1/embeddings`), Anthropic's for a
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
        "/v1/files",
        &[("anthropic-version", "2023-06-01")],
        "",
    );
    assert_eq!(status, 404, "{body}");
    let error: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(error["type"], "error", "Anthropic's shape: {body}");
    // A path of neither API: a bearer token without `x-api-key` is an OpenAI SDK.
    let (status, body) = http(
        &proxy.address,
        "POST",
        "/v1/nope",
        &[("authorization", "Bearer gx-unknown")],
        "{}",
    );
    assert_eq!(status, 404, "{body}");
    let error: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert!(
        error["error"].get("param").is_some(),
        "OpenAI's shape: {body}"
    );
    // A served route called with another method: 405 in the API's shape, not an empty body.
    let (status, body) = http(
        &proxy.address,
        "GET",
        "/v1/messages",
        &[("anthropic-version", "2023-06-01")],
        "",
    );
    assert_eq!(status, 405, "{body}");
    let error: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(error["type"], "error", "Anthropic's shape: {body}");
    assert!(
        error["error"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("/v1/messages does not take GET")),
        "{body}"
    );
    let (status, body) = http(&proxy.address, "DELETE", "/v1/chat/completions", &[], "");
    assert_eq!(status, 405, "{body}");
    let error: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(error["error"]["code"], "method_not_allowed", "{body}");
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

/// Posts `body` as raw bytes on a fresh connection: (status, lowercased head, body text).
fn post_bytes(
    address: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).expect("proxy accepts");
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .expect("timeout");
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nhost: proxy\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    let mut bytes = request.into_bytes();
    bytes.extend_from_slice(body);
    stream.write_all(&bytes).expect("write");
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("an HTTP response: {answer}"));
    (status, head.to_ascii_lowercase(), body.to_string())
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(bytes).expect("gzip");
    encoder.finish().expect("gzip")
}

/// A body the client compressed (`Content-Encoding: gzip`, `zstd`) is decoded and served like
/// a plain one, and captured decoded; a coding the proxy does not know is a 415 naming it
/// with `accept-encoding`; a body that inflates past `--body-limit` is a 413 (the compressed
/// bytes were far under it); bytes that are not the claimed coding are a 400 naming it; none
/// of the refused calls is recorded.
#[test]
fn compressed_request_bodies_are_decoded_within_the_body_limit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let capture = dir.path().join("capture.jsonl");
    let mut proxy = deterministic_proxy(
        dir.path(),
        &[
            "--open",
            "1",
            "--body-limit",
            "1048576",
            "--capture",
            capture.to_str().expect("utf-8"),
        ],
    );
    let opened = proxy.next_json();
    let token = opened["token"].as_str().expect("token").to_string();
    let messages = |text: &str| {
        serde_json::json!({
            "model": "gyre", "max_tokens": 16,
            "messages": [{"role": "user", "content": text}],
        })
        .to_string()
    };
    let anthropic = |coding: &str, body: &[u8]| {
        post_bytes(
            &proxy.address,
            "/v1/messages",
            &[
                ("x-api-key", &token),
                ("content-type", "application/json"),
                ("content-encoding", coding),
            ],
            body,
        )
    };

    let (status, _, answer) = anthropic("gzip", &gzip(messages("hello").as_bytes()));
    assert_eq!(status, 200, "{answer}");
    let answer: serde_json::Value = serde_json::from_str(&answer).expect("a Messages answer");
    assert_eq!(answer["type"], "message", "{answer}");

    let plain = messages("hello again");
    let zstd = ruzstd::encoding::compress_to_vec(
        plain.as_bytes(),
        ruzstd::encoding::CompressionLevel::Fastest,
    );
    let (status, _, answer) = anthropic("zstd", &zstd);
    assert_eq!(status, 200, "{answer}");

    // The OpenAI APIs read the same way (bearer credential, OpenAI's shape).
    let chat = serde_json::json!({
        "model": "gyre", "max_tokens": 16,
        "messages": [{"role": "user", "content": "hi"}],
    })
    .to_string();
    let bearer = format!("Bearer {token}");
    let (status, _, answer) = post_bytes(
        &proxy.address,
        "/v1/chat/completions",
        &[
            ("authorization", &bearer),
            ("content-type", "application/json"),
            ("content-encoding", "gzip"),
        ],
        &gzip(chat.as_bytes()),
    );
    assert_eq!(status, 200, "{answer}");
    let (status, head, answer) = post_bytes(
        &proxy.address,
        "/v1/chat/completions",
        &[
            ("authorization", &bearer),
            ("content-type", "application/json"),
            ("content-encoding", "lzma"),
        ],
        chat.as_bytes(),
    );
    assert_eq!(status, 415, "{answer}");
    let error: serde_json::Value = serde_json::from_str(&answer).expect("JSON error");
    assert_eq!(
        error["error"]["code"], "unsupported_content_encoding",
        "{answer}"
    );
    assert!(
        head.contains("accept-encoding: gzip, deflate, br, zstd"),
        "{head}"
    );

    let (status, head, answer) = anthropic("compress", plain.as_bytes());
    assert_eq!(status, 415, "{answer}");
    assert!(
        head.contains("accept-encoding: gzip, deflate, br, zstd"),
        "{head}"
    );
    let error: serde_json::Value = serde_json::from_str(&answer).expect("JSON error");
    assert_eq!(error["type"], "error");
    assert_eq!(error["error"]["type"], "invalid_request_error");
    assert!(
        error["error"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("\"compress\" is not supported")),
        "{answer}"
    );

    // 4 MiB of JSON whitespace gzips to a few KiB: refused once 1 MiB is decoded.
    let mut bomb = messages("bomb").into_bytes();
    bomb.extend(std::iter::repeat_n(b' ', 4 << 20));
    let bomb = gzip(&bomb);
    assert!(bomb.len() < 64 << 10, "{}", bomb.len());
    let (status, _, answer) = anthropic("gzip", &bomb);
    assert_eq!(status, 413, "{answer}");
    let error: serde_json::Value = serde_json::from_str(&answer).expect("JSON error");
    assert_eq!(error["error"]["type"], "request_too_large", "{answer}");

    let (status, _, answer) = anthropic("gzip", plain.as_bytes());
    assert_eq!(status, 400, "{answer}");
    assert!(answer.contains("not valid gzip"), "{answer}");

    // The capture holds the decoded bodies and no content-encoding.
    drop(proxy);
    let captured = std::fs::read_to_string(&capture).expect("capture file");
    let records: Vec<serde_json::Value> = captured
        .lines()
        .map(|line| serde_json::from_str(line).expect("a capture record"))
        .collect();
    assert!(records.len() >= 3, "{captured}");
    assert!(!captured.contains("content-encoding"), "{captured}");
    assert!(
        captured.contains("hello again"),
        "the zstd body, decoded: {captured}"
    );

    let log = dir.path().join("tito.log");
    let (code, stdout, stderr) = gyre(&["replay", log.to_str().expect("utf-8"), "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("JSON report");
    assert_eq!(
        report["model_calls"]["calls"], 3,
        "the three served calls, nothing refused: {stdout}"
    );
}

/// The Responses WebSocket without a harness: `response.create` messages are served in order on
/// one socket, each answer's events arrive as text messages ending in `response.completed`, a
/// bad message gets an `error` event and the socket stays open, a warm-up is answered without a
/// record, a turn chains on the previous answer even with `store: false`, and a compaction
/// trigger is answered by a `compaction` item whose handle the next request can send back.
#[test]
fn the_responses_websocket_serves_messages_in_order_and_refuses_bad_ones_on_the_socket() {
    use tungstenite::{client::IntoClientRequest, Message};

    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("tito.log");
    let mut proxy = ProxyProcess::start(&[
        "--listen",
        "127.0.0.1:0",
        "--engine",
        "deterministic",
        "--open",
        "1",
        "--log",
        log.to_str().expect("utf-8"),
        "--body-limit",
        "65536",
    ]);
    let token = proxy.next_json()["token"]
        .as_str()
        .expect("token")
        .to_string();

    // A plain GET says what the path serves, in OpenAI's error shape.
    let (status, answer) = http(&proxy.address, "GET", "/v1/responses", &[], "");
    assert_eq!(status, 400, "{answer}");
    assert!(answer.contains("websocket_upgrade_required"), "{answer}");
    // A bad credential is refused at the handshake.
    match tungstenite::connect(format!("ws://{}/x/gx-unknown/v1/responses", proxy.address)) {
        Err(tungstenite::Error::Http(response)) => assert_eq!(response.status(), 401),
        other => panic!("a bad credential opened a socket: {:?}", other.map(|_| ())),
    }
    // The credential as the API key, as OpenAI's clients send it.
    let mut request = format!("ws://{}/v1/responses", proxy.address)
        .into_client_request()
        .expect("request");
    request.headers_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("header"),
    );
    let (mut socket, _) = tungstenite::connect(request).expect("the socket opens");
    let mut send = |event: serde_json::Value| {
        socket.send(Message::text(event.to_string())).expect("sent");
        // Every event of one answer, up to its last (`response.completed` or `error`).
        let mut events = Vec::new();
        loop {
            let message = socket.read().expect("an event");
            let Message::Text(text) = message else {
                continue;
            };
            let event: serde_json::Value = serde_json::from_str(&text).expect("JSON event");
            let kind = event["type"].as_str().expect("type").to_string();
            events.push(event);
            if kind == "response.completed" || kind == "error" {
                return events;
            }
        }
    };
    let error_of = |events: &[serde_json::Value]| -> serde_json::Value {
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(events[0]["type"], "error");
        events[0].clone()
    };
    let completed = |events: &[serde_json::Value]| -> serde_json::Value {
        assert_eq!(events[0]["type"], "response.created", "{events:?}");
        let last = events.last().expect("events");
        assert_eq!(last["type"], "response.completed", "{events:?}");
        last["response"].clone()
    };

    let error = error_of(&send(serde_json::json!("not an object")));
    assert_eq!(error["status"], 400);
    assert!(
        error["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("not a JSON object")),
        "{error}"
    );
    let error = error_of(&send(serde_json::json!({"type": "response.steer"})));
    assert_eq!(error["error"]["param"], "type", "{error}");

    // A `stream_id` lane is echoed in every event of the answer, a refusal's included.
    let laned = send(serde_json::json!({
        "type": "response.create", "stream_id": "lane-a", "model": "m", "generate": false,
        "input": "hi",
    }));
    assert!(
        laned.iter().all(|event| event["stream_id"] == "lane-a"),
        "{laned:?}"
    );
    let error = error_of(&send(serde_json::json!({
        "type": "response.create", "stream_id": "lane-b", "background": true, "model": "m",
    })));
    assert_eq!(error["stream_id"], "lane-b", "{error}");
    assert_eq!(error["error"]["param"], "background", "{error}");

    // A warm-up: an empty completed response, nothing sampled.
    let warmup = completed(&send(serde_json::json!({
        "type": "response.create", "model": "m", "generate": false, "store": false,
        "input": [{"role": "user", "content": "hello"}],
    })));
    assert_eq!(warmup["output"], serde_json::json!([]), "{warmup}");
    // A turn chained on the warm-up, then one chained on that turn, both with store:false.
    let first = completed(&send(serde_json::json!({
        "type": "response.create", "model": "m", "store": false,
        "previous_response_id": warmup["id"], "input": [],
    })));
    assert!(!first["output"].as_array().expect("output").is_empty());
    let second = completed(&send(serde_json::json!({
        "type": "response.create", "model": "m", "store": false,
        "previous_response_id": first["id"],
        "input": [{"role": "user", "content": "go on"}],
    })));
    // An item_reference resolves to the stored item it names.
    let referenced = first["output"][0]["id"]
        .as_str()
        .expect("an output item id");
    completed(&send(serde_json::json!({
        "type": "response.create", "model": "m", "store": false,
        "input": [
            {"role": "user", "content": "hello"},
            {"type": "item_reference", "id": referenced},
            {"role": "user", "content": "and now?"},
        ],
    })));
    let error = error_of(&send(serde_json::json!({
        "type": "response.create", "model": "m",
        "input": [{"type": "item_reference", "id": "msg_never_issued"}],
    })));
    assert_eq!(error["error"]["param"], "input[0].id", "{error}");
    let error = error_of(&send(serde_json::json!({
        "type": "response.create", "model": "m", "previous_response_id": "resp_unknown",
        "input": [],
    })));
    assert_eq!(error["status"], 400);
    assert_eq!(
        error["error"]["code"], "previous_response_not_found",
        "{error}"
    );

    // Server-side compaction: the trigger's answer is one compaction item.
    let compacted = completed(&send(serde_json::json!({
        "type": "response.create", "model": "m", "store": false,
        "previous_response_id": second["id"],
        "input": [{"type": "compaction_trigger"}],
    })));
    let output = compacted["output"].as_array().expect("output");
    let item = output
        .iter()
        .find(|item| item["type"] == "compaction")
        .unwrap_or_else(|| panic!("a compaction item: {compacted}"));
    assert!(
        output.iter().all(|item| item["type"] != "message"),
        "the summary goes out inside the compaction item only: {compacted}"
    );
    let handle = item["encrypted_content"].as_str().expect("handle");
    assert!(handle.starts_with("gyre-compaction-v1."), "{handle}");
    // The harness continues from the compaction, a fresh conversation.
    completed(&send(serde_json::json!({
        "type": "response.create", "model": "m", "store": false,
        "input": [
            {"role": "user", "content": "hello"},
            {"type": "compaction", "encrypted_content": handle},
            {"role": "user", "content": "continue"},
        ],
    })));
    let error = error_of(&send(serde_json::json!({
        "type": "response.create", "model": "m",
        "input": [{"type": "compaction", "encrypted_content": "gAAAA-not-ours"}],
    })));
    assert_eq!(
        error["error"]["param"], "input[0].encrypted_content",
        "{error}"
    );
    let error = error_of(&send(serde_json::json!({
        "type": "response.create", "model": "m",
        "input": [{"type": "compaction_trigger"}, {"role": "user", "content": "x"}],
    })));
    assert!(
        error["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("must be the last input item")),
        "{error}"
    );
    // A close is answered with a close (the handshake completes; nothing is dropped).
    socket.close(None).expect("closed");
    let answered = loop {
        match socket.read() {
            Ok(Message::Close(_)) => break true,
            Ok(_) => continue,
            Err(tungstenite::Error::ConnectionClosed) => break true,
            Err(error) => panic!("the proxy dropped the socket without a close frame: {error}"),
        }
    };
    assert!(answered);
    // A message over --body-limit closes the socket with 1009 (message too big).
    let mut request = format!("ws://{}/v1/responses", proxy.address)
        .into_client_request()
        .expect("request");
    request.headers_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("header"),
    );
    let (mut socket, _) = tungstenite::connect(request).expect("the socket opens");
    socket
        .send(Message::text("x".repeat(100_000)))
        .expect("sent");
    let frame = loop {
        match socket
            .read()
            .expect("a close frame, not a dropped connection")
        {
            Message::Close(frame) => break frame.expect("a close code"),
            _ => continue,
        }
    };
    assert_eq!(u16::from(frame.code), 1009, "closed as too big: {frame:?}");
    drop(proxy);

    // Recorded: the two turns, the one with an item_reference, the compaction (a summary) and
    // the turn after it; not the warm-ups and not the refusals.
    let (code, stdout, stderr) = gyre(&["replay", log.to_str().expect("utf-8"), "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("JSON report");
    assert_eq!(report["model_calls"]["calls"], 5, "{stdout}");
}

/// An upgraded socket no longer counts as one of the accept loop's connections, so sockets
/// have their own cap, the same `--max-connections`: one more is refused at the handshake, in
/// OpenAI's error shape, and a socket closed makes room.
#[test]
fn responses_websockets_beyond_max_connections_are_refused_at_the_handshake() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("tito.log");
    let mut proxy = ProxyProcess::start(&[
        "--log",
        log.to_str().expect("utf-8"),
        "--listen",
        "127.0.0.1:0",
        "--engine",
        "deterministic",
        "--open",
        "1",
        "--max-connections",
        "2",
    ]);
    let token = proxy.next_json()["token"]
        .as_str()
        .expect("token")
        .to_string();
    let url = format!("ws://{}/x/{token}/v1/responses", proxy.address);
    let open = || {
        let (mut socket, _) = tungstenite::connect(&url).expect("the socket opens");
        // One served message: the socket's task runs (and counts) before the next handshake.
        socket
            .send(tungstenite::Message::text(r#"{"type":"response.steer"}"#))
            .expect("sent");
        let reply = socket.read().expect("the refusal of the unknown event");
        assert!(reply.to_text().expect("text").contains("\"error\""));
        socket
    };
    let first = open();
    let _second = open();
    match tungstenite::connect(&url) {
        Err(tungstenite::Error::Http(response)) => {
            assert!(response.status().is_server_error(), "{}", response.status());
            let body = String::from_utf8_lossy(response.body().as_deref().unwrap_or_default())
                .into_owned();
            assert!(body.contains("--max-connections"), "{body}");
        }
        other => panic!("a third socket opened: {:?}", other.map(|_| ())),
    }
    drop(first);
    // The closed socket's task ends once it reads the close: retry until it has.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match tungstenite::connect(&url) {
            Ok(_) => break,
            Err(error) => assert!(
                std::time::Instant::now() < deadline,
                "no room after a socket closed: {error}"
            ),
        }
        std::thread::yield_now();
    }
}

/// The proxy's log lines reach stderr: one listening on every address without an admin token
/// warns that anyone who can connect may open, close and reroute executions; on loopback it
/// does not.
#[test]
fn open_admin_routes_on_a_public_address_are_warned_about() {
    use std::io::{BufRead, Read};
    let stderr_of = |listen: &str| -> String {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("tito.log");
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_gyre"))
            .args([
                "proxy",
                "--listen",
                listen,
                "--engine",
                "deterministic",
                "--log",
            ])
            .arg(&log)
            .env_remove("RUST_LOG")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("gyre proxy starts");
        let mut first = String::new();
        std::io::BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut first)
            .expect("a line");
        assert!(first.contains("listening"), "{first}");
        // Everything logged before serving is on stderr by now; end the process to read it.
        child.kill().expect("kill");
        let mut stderr = String::new();
        child
            .stderr
            .take()
            .expect("stderr")
            .read_to_string(&mut stderr)
            .expect("stderr");
        let _ = child.wait();
        stderr
    };
    let public = stderr_of("0.0.0.0:0");
    assert!(
        public.contains("WARN") && public.contains("--admin-token-file"),
        "{public}"
    );
    assert!(
        !public.contains('\u{1b}'),
        "no colour codes in a pipe: {public}"
    );
    let loopback = stderr_of("127.0.0.1:0");
    assert!(!loopback.contains("--admin-token-file"), "{loopback}");
}
