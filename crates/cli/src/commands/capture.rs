//! `gyre capture replay FILE --url URL`: send the requests of a capture file
//! (`gyre proxy --capture FILE`) to a proxy, in order, exactly as the harness sent them.
//! `FILE` may also be a directory of one harness run captured by the research tools' fake
//! servers (`../shared/research/harness-tools`: one `NNNN-METHOD-path.json` per request with
//! `n`, `method`, `path`, `headers`, `body` / `body_raw`): its model-API POSTs are replayed in
//! `n` order as one execution (the body as recorded, re-serialised in its key order).
//!
//! Each captured execution gets its own credential (`<token>-e<execution>`), so the target
//! proxy must run with `--auto-open`; sub-agent headers and every other header are sent as
//! captured (credentials were never captured). Prints one JSON line per request (`seq`,
//! `execution`, `status`, `complete`) and exits 2 if any request got an error status or a
//! stream that did not finish with its API's end event. Use it to try a harness's traffic on
//! another proxy build, model directory or engine.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use serde_json::Value;

#[derive(Args, Debug)]
pub struct CaptureArgs {
    #[command(subcommand)]
    command: CaptureCommand,
}

#[derive(Subcommand, Debug)]
enum CaptureCommand {
    /// Send a capture's requests to a proxy (started with `--auto-open`), one at a time.
    #[command(allow_negative_numbers = true)]
    Replay {
        /// The capture file (JSON lines written by `gyre proxy --capture`), or a directory of
        /// one run captured by the research tools' fake servers (`NNNN-METHOD-path.json`).
        file: PathBuf,
        /// The proxy, `http://host:port`.
        #[arg(long)]
        url: String,
        /// Credential prefix: execution E of the capture is sent as `<token>-eE`.
        #[arg(long, default_value = "replay")]
        token: String,
        /// Seconds to wait for one answer.
        #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
        timeout_secs: u64,
    },
}

/// Headers not replayed: the connection's own, and encodings this client does not decode.
const HOP_HEADERS: [&str; 6] = [
    "host",
    "content-length",
    "connection",
    "transfer-encoding",
    "accept-encoding",
    "keep-alive",
];

pub fn run(args: CaptureArgs) -> anyhow::Result<()> {
    match args.command {
        CaptureCommand::Replay {
            file,
            url,
            token,
            timeout_secs,
        } => replay(&file, &url, &token, Duration::from_secs(timeout_secs)),
    }
}

fn replay(file: &std::path::Path, url: &str, token: &str, timeout: Duration) -> anyhow::Result<()> {
    let authority = url
        .strip_prefix("http://")
        .with_context(|| format!("--url {url:?}: expected http://host:port"))?
        .trim_end_matches('/');
    if authority.is_empty() || authority.contains('/') {
        bail!("--url {url:?}: expected http://host:port");
    }
    let requests = if file.is_dir() {
        read_directory(file)?
    } else {
        read_lines(file)?
    };
    if requests.is_empty() {
        bail!("{}: no model-API requests to replay", file.display());
    }
    let (mut sent, mut failed) = (0usize, 0usize);
    for request in requests {
        let credential = format!("{token}-e{}", request.execution);
        let (status, body) = send(authority, &request, &credential, timeout)
            .with_context(|| format!("request seq {} to {url}", request.seq))?;
        let complete = finished(&request, status, &body);
        sent += 1;
        if !complete {
            failed += 1;
        }
        let mut report = serde_json::json!({
            "seq": request.seq,
            "execution": request.execution,
            "path": request.path,
            "status": status,
            "complete": complete,
            "bytes": body.len(),
        });
        if !complete {
            let text = String::from_utf8_lossy(&body);
            let tail: String = text
                .chars()
                .rev()
                .take(400)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            report["answer_tail"] = Value::String(tail);
        }
        outln!("{report}");
    }
    eprintln!(
        "replayed {sent} requests: {} complete, {failed} failed",
        sent - failed
    );
    if failed > 0 {
        bail!("{failed} of {sent} replayed requests failed");
    }
    Ok(())
}

/// The requests of a `gyre proxy --capture` file, in order.
fn read_lines(file: &std::path::Path) -> anyhow::Result<Vec<Captured>> {
    let reader = BufReader::new(
        std::fs::File::open(file).with_context(|| format!("opening {}", file.display()))?,
    );
    let mut requests = Vec::new();
    for (number, line) in reader.lines().enumerate() {
        let line = line.with_context(|| format!("reading {}", file.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let captured: Value = serde_json::from_str(&line)
            .with_context(|| format!("{} line {}: not JSON", file.display(), number + 1))?;
        requests.push(
            Captured::from_json(&captured)
                .with_context(|| format!("{} line {}", file.display(), number + 1))?,
        );
    }
    Ok(requests)
}

/// The model-API POSTs of a research-tools capture directory (`NNNN-METHOD-path.json`), in
/// `n` order, as execution 1. Other requests (`HEAD /api/hello`, telemetry) are skipped.
fn read_directory(directory: &std::path::Path) -> anyhow::Result<Vec<Captured>> {
    let mut requests = Vec::new();
    let entries =
        std::fs::read_dir(directory).with_context(|| format!("listing {}", directory.display()))?;
    for entry in entries {
        let path = entry?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let numbered = name
            .split('-')
            .next()
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        if !numbered || !name.ends_with(".json") || name.ends_with(".response.json") {
            continue;
        }
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let value: Value =
            serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))?;
        if let Some(request) =
            Captured::from_research_json(&value).with_context(|| format!("{}", path.display()))?
        {
            requests.push(request);
        }
    }
    requests.sort_by_key(|request| request.seq);
    Ok(requests)
}

/// Whether `path` is one of the model APIs the proxy serves.
fn model_api(path: &str) -> bool {
    let path = path.split('?').next().unwrap_or_default();
    [
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/chat/completions",
        "/v1/responses",
    ]
    .iter()
    .any(|api| path.ends_with(api))
}

struct Captured {
    seq: u64,
    execution: u64,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    stream: bool,
}

impl Captured {
    fn from_json(value: &Value) -> anyhow::Result<Captured> {
        let field = |name: &str| value.get(name).with_context(|| format!("no `{name}`"));
        let path = field("path")?.as_str().context("`path` is not a string")?;
        let body = match (value.get("body"), value.get("body_base64")) {
            (Some(Value::String(text)), _) => text.as_bytes().to_vec(),
            (_, Some(Value::String(_))) => {
                bail!("a body that is not UTF-8 (`body_base64`) cannot be a model-API request")
            }
            _ => bail!("no `body`"),
        };
        let stream = serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|parsed| parsed.get("stream").and_then(Value::as_bool))
            .unwrap_or(false);
        let headers = field("headers")?
            .as_object()
            .context("`headers` is not an object")?
            .iter()
            .filter_map(|(name, value)| {
                Some((name.to_ascii_lowercase(), value.as_str()?.to_string()))
            })
            .filter(|(name, _)| !HOP_HEADERS.contains(&name.as_str()))
            .collect();
        Ok(Captured {
            seq: field("seq")?.as_u64().context("`seq` is not a number")?,
            execution: field("execution")?
                .as_u64()
                .context("`execution` is not a number")?,
            path: path.to_string(),
            headers,
            body,
            stream,
        })
    }
}

impl Captured {
    /// A research-tools record (`n`, `method`, `path`, `headers`, `body` or `body_raw`);
    /// `None` for what is not a model-API POST.
    fn from_research_json(value: &Value) -> anyhow::Result<Option<Captured>> {
        let field = |name: &str| value.get(name).with_context(|| format!("no `{name}`"));
        let method = field("method")?
            .as_str()
            .context("`method` is not a string")?;
        let path = field("path")?.as_str().context("`path` is not a string")?;
        if method != "POST" || !model_api(path) {
            return Ok(None);
        }
        let body = match (value.get("body"), value.get("body_raw")) {
            (Some(body), _) if !body.is_null() => serde_json::to_vec(body)?,
            (_, Some(Value::String(raw))) => raw.as_bytes().to_vec(),
            _ => bail!("no `body` and no `body_raw`"),
        };
        let record = serde_json::json!({
            "seq": field("n")?.as_u64().context("`n` is not a number")?,
            "execution": 1,
            "path": path,
            "headers": field("headers")?,
            "body": String::from_utf8(body).context("a body that is not UTF-8")?,
        });
        Captured::from_json(&record).map(Some)
    }
}

/// One HTTP/1.1 request on its own connection; the answer's status and body (de-chunked).
fn send(
    authority: &str,
    request: &Captured,
    credential: &str,
    timeout: Duration,
) -> anyhow::Result<(u16, Vec<u8>)> {
    let path = match request.path.strip_prefix("/x/<redacted>") {
        Some(tail) => format!("/x/{credential}{tail}"),
        None => request.path.clone(),
    };
    let mut stream =
        TcpStream::connect(authority).with_context(|| format!("connecting to {authority}"))?;
    stream.set_read_timeout(Some(timeout))?;
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nhost: {authority}\r\nconnection: close\r\ncontent-length: {}\r\n",
        request.body.len()
    );
    for (name, value) in &request.headers {
        let value = match name.as_str() {
            "x-api-key" => credential.to_string(),
            "authorization" => format!("Bearer {credential}"),
            _ => value.clone(),
        };
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    if !request
        .headers
        .iter()
        .any(|(name, _)| name == "x-api-key" || name == "authorization")
    {
        head.push_str(&format!("x-api-key: {credential}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(&request.body)?;
    let mut answer = Vec::new();
    stream
        .read_to_end(&mut answer)
        .context("reading the answer")?;
    let split = answer
        .windows(4)
        .position(|window| window == b"\r\n\r\n")
        .context("an answer without a header end")?;
    let header = String::from_utf8_lossy(&answer[..split]).to_ascii_lowercase();
    let status: u16 = header
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .context("an answer without a status")?;
    let body = answer[split + 4..].to_vec();
    let body = if header.contains("transfer-encoding: chunked") {
        dechunk(&body).context("a malformed chunked answer")?
    } else {
        body
    };
    Ok((status, body))
}

fn dechunk(mut bytes: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let end = bytes.windows(2).position(|window| window == b"\r\n")?;
        let size_text = std::str::from_utf8(&bytes[..end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        bytes = &bytes[end + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(bytes.get(..size)?);
        bytes = bytes.get(size + 2..)?;
    }
}

/// Whether an answer is a whole one: a 2xx status, and for a stream its API's end event with
/// no error event before it.
fn finished(request: &Captured, status: u16, body: &[u8]) -> bool {
    if !(200..300).contains(&status) {
        return false;
    }
    let text = String::from_utf8_lossy(body);
    if !request.stream {
        return serde_json::from_str::<Value>(&text).is_ok();
    }
    if text.contains("event: error") {
        return false;
    }
    let path = request.path.split('?').next().unwrap_or_default();
    if path.ends_with("/messages") {
        text.contains("event: message_stop")
    } else if path.ends_with("/chat/completions") {
        text.contains("data: [DONE]")
    } else if path.ends_with("/responses") {
        text.contains("response.completed")
    } else {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_research_capture_directory_reads_its_model_calls_in_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let write = |name: &str, value: Value| {
            std::fs::write(dir.path().join(name), value.to_string()).expect("write");
        };
        write(
            "0002-POST-v1_messages.json",
            serde_json::json!({"n": 2, "method": "POST", "path": "/v1/messages?beta=true",
                "headers": {"Host": "h", "X-Api-Key": "<redacted>", "X-Claude-Code-Agent-Id": "a1"},
                "body": {"model": "m", "stream": true, "messages": []}, "body_raw": null}),
        );
        write(
            "0001-HEAD-api_hello.json",
            serde_json::json!({"n": 1, "method": "HEAD", "path": "/api/hello", "headers": {}, "body": null, "body_raw": ""}),
        );
        write(
            "0003-POST-v1_messages.json",
            serde_json::json!({"n": 3, "method": "POST", "path": "/v1/messages", "headers": {},
                "body": null, "body_raw": "{not json"}),
        );
        write(
            "0002-POST-v1_messages.response.json",
            serde_json::json!({"blocks": []}),
        );
        write("index.jsonl", serde_json::json!({"n": 1}));
        let requests = read_directory(dir.path()).expect("reads");
        let seqs: Vec<u64> = requests.iter().map(|request| request.seq).collect();
        assert_eq!(seqs, [2, 3], "only the model-API POSTs, in order");
        assert!(requests[0].stream);
        assert_eq!(
            String::from_utf8_lossy(&requests[0].body),
            r#"{"model":"m","stream":true,"messages":[]}"#,
            "the body in its recorded key order"
        );
        assert_eq!(
            requests[0].headers,
            [
                ("x-api-key".to_string(), "<redacted>".to_string()),
                ("x-claude-code-agent-id".to_string(), "a1".to_string())
            ],
            "names lowercased, hop headers dropped"
        );
        assert_eq!(
            requests[1].body, b"{not json",
            "a body that did not parse is sent raw"
        );
    }

    #[test]
    fn dechunks_and_refuses_truncation() {
        assert_eq!(
            dechunk(b"3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n").unwrap(),
            b"abcde"
        );
        assert_eq!(dechunk(b"3\r\nab"), None);
        assert_eq!(dechunk(b"zz\r\n"), None);
    }

    #[test]
    fn a_stream_is_finished_only_by_its_end_event() {
        let request = |path: &str, stream: bool| Captured {
            seq: 0,
            execution: 1,
            path: path.to_string(),
            headers: Vec::new(),
            body: Vec::new(),
            stream,
        };
        let messages = request("/x/<redacted>/v1/messages?beta=true", true);
        assert!(finished(
            &messages,
            200,
            b"event: message_stop\ndata: {}\n\n"
        ));
        assert!(!finished(&messages, 200, b"event: content_block_delta\n"));
        assert!(!finished(
            &messages,
            200,
            b"event: error\n\nevent: message_stop\n"
        ));
        assert!(!finished(&messages, 529, b"event: message_stop\n"));
        assert!(finished(
            &request("/v1/chat/completions", true),
            200,
            b"data: [DONE]\n\n"
        ));
        assert!(finished(
            &request("/v1/responses", true),
            200,
            b"event: response.completed\n"
        ));
        assert!(finished(
            &request("/v1/messages", false),
            200,
            b"{\"id\":\"m\"}"
        ));
        assert!(!finished(&request("/v1/messages", false), 200, b"{\"id\""));
    }
}
