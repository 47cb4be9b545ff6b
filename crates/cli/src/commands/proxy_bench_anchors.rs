//! The anchors of `gyre bench proxy`: LiteLLM's proxy and SGLang's `smg` gateway (both pinned
//! in `scripts/anchors.sh`, installed into a venv by `scripts/anchors.sh install DIR`) in
//! front of an OpenAI-compatible engine, measured in the same run as Gyre's proxy.
//!
//! Neither gateway speaks SGLang's token-in `/generate`, so they get an OpenAI Chat
//! Completions engine of their own: a small in-process server that parses each body as JSON
//! and answers a fixed completion (what a backend costs cancels out: each gateway is compared
//! with calling its own backend directly). Gyre is compared with calling the fake SGLang
//! engine directly, as in the main table. All five targets are called in turn for every call of
//! the context ladder, at concurrency 1, so machine noise hits them alike.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use gyre_proxy::engine::{collect, EngineRequest, SglangEngine, TokenEngine};
use gyre_proxy::server::AppState;

use super::{percentile, request_body, KeepAlive};

/// The OpenAI Chat Completions body of the same conversation the Anthropic body carries.
fn chat_body(contexts: &[usize], upto: usize, salt: usize, max_tokens: u32) -> String {
    let mut messages = vec![serde_json::json!({
        "role": "system", "content": "You are the benchmark agent."
    })];
    messages.extend(super::conversation(contexts, upto, salt));
    serde_json::json!({
        "model": "gyre-test",
        "max_tokens": max_tokens,
        "messages": messages,
    })
    .to_string()
}

/// A minimal OpenAI-compatible engine: parses the body, answers `words` words.
async fn chat_backend(words: u32) -> anyhow::Result<SocketAddr> {
    let answer: String = vec!["ok"; words.max(1) as usize].join(" ");
    let completions = move |body: Bytes| {
        let answer = answer.clone();
        async move {
            let Ok(request) = serde_json::from_slice::<serde_json::Value>(&body) else {
                return (StatusCode::BAD_REQUEST, "body is not JSON").into_response();
            };
            if !request.get("messages").is_some_and(|m| m.is_array()) {
                return (StatusCode::BAD_REQUEST, "messages: Field required").into_response();
            }
            axum::Json(serde_json::json!({
                "id": "chatcmpl-anchor",
                "object": "chat.completion",
                "created": 0,
                "model": "gyre-test",
                "choices": [{
                    "index": 0,
                    "message": {"role": "assistant", "content": answer},
                    "finish_reason": "stop",
                }],
                "usage": {"prompt_tokens": 1, "completion_tokens": words, "total_tokens": words + 1},
            }))
            .into_response()
        }
    };
    let models = || async {
        axum::Json(serde_json::json!({
            "object": "list",
            "data": [{"id": "gyre-test", "object": "model", "created": 0, "owned_by": "gyre"}],
        }))
    };
    let router = axum::Router::new()
        .route("/v1/chat/completions", axum::routing::post(completions))
        .route("/v1/models", axum::routing::get(models));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let listener =
        axum::serve::ListenerExt::tap_io(listener, |stream: &mut tokio::net::TcpStream| {
            let _ = stream.set_nodelay(true);
        });
    // Task "anchor-backend": lives as long as the benchmark's runtime.
    tokio::spawn(async move { axum::serve(listener, router).await });
    Ok(address)
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// A gateway process, killed when dropped.
struct Gateway {
    name: String,
    address: SocketAddr,
    _child: tokio::process::Child,
}

/// Starts `anchors.sh KIND VENV BACKEND PORT` and waits until `ready_path` answers 200.
async fn start_gateway(
    script: &Path,
    kind: &str,
    venv: &Path,
    backend: SocketAddr,
    ready_path: &str,
) -> anyhow::Result<Gateway> {
    let port = free_port()?;
    let log = std::env::temp_dir().join(format!("gyre-anchor-{kind}-{port}.log"));
    let mut child = tokio::process::Command::new("bash")
        .arg(script)
        .arg(kind)
        .arg(venv)
        .arg(format!("http://{backend}/v1"))
        .arg(port.to_string())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log)?)
        .stderr(std::fs::File::create(&log)?)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {kind} with {}", script.display()))?;
    let address: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        if let Some(status) = child.try_wait()? {
            anyhow::bail!(
                "{kind} exited with {status} before it was ready; its output is in {}",
                log.display()
            );
        }
        if let Ok(200) = KeepAlive::new(address)
            .call(&format!("GET {ready_path}"), "", "")
            .await
        {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{kind} was not ready after 180 s; its output is in {}",
            log.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(Gateway {
        name: kind.to_string(),
        address,
        _child: child,
    })
}

/// `NAME_VERSION=x.y.z` from the script, for the table's labels.
fn pinned(script_text: &str, variable: &str) -> String {
    script_text
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{variable}=")))
        .unwrap_or("?")
        .trim()
        .to_string()
}

/// The `--anchors` value parser: a venv prepared by `scripts/anchors.sh install DIR`, checked
/// while the arguments are parsed, before anything is measured.
pub(super) fn venv(text: &str) -> Result<std::path::PathBuf, String> {
    let venv = std::path::PathBuf::from(text);
    if venv.join("bin/python").exists() {
        Ok(venv)
    } else {
        Err(format!(
            "{text} is not a venv; run `bash scripts/anchors.sh install {text}` first"
        ))
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) async fn run(
    venv: &Path,
    repeats: usize,
    contexts: &[usize],
    answer_tokens: u32,
    direct: &SglangEngine,
    state: &Arc<AppState>,
    proxy: SocketAddr,
) -> anyhow::Result<()> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/anchors.sh");
    let script_text = std::fs::read_to_string(&script)
        .with_context(|| format!("reading {}", script.display()))?;
    let backend = chat_backend(answer_tokens).await?;
    outln!("anchors: starting LiteLLM and smg (scripts/anchors.sh) in front of an OpenAI-compatible engine ...");
    let litellm = start_gateway(&script, "litellm", venv, backend, "/health/readiness").await?;
    let smg = start_gateway(&script, "smg", venv, backend, "/readiness").await?;
    let bearer = "authorization: Bearer sk-gyre-anchor\r\n";

    // latencies[target][turn]
    const TARGETS: usize = 5;
    let mut latencies: Vec<Vec<Vec<Duration>>> = vec![vec![Vec::new(); contexts.len()]; TARGETS];
    let mut clients: Vec<KeepAlive> = [proxy, backend, litellm.address, smg.address]
        .into_iter()
        .map(KeepAlive::new)
        .collect();
    for repeat in 0..repeats {
        let (_, token) = state.open_execution(None, None).expect("open");
        for (turn, tokens) in contexts.iter().enumerate() {
            let salt = 10_000 + repeat;
            let messages = request_body(contexts, turn, salt, answer_tokens);
            let chat = chat_body(contexts, turn, salt, answer_tokens);
            let ids: Vec<u32> = (0..*tokens as u32)
                .map(|i| 9 + (i * 7 + turn as u32) % 2000)
                .collect();
            // 0: SGLang /generate directly.
            let started = Instant::now();
            let request = EngineRequest::new(format!("a-{repeat}-{turn}"), ids, answer_tokens);
            let collected = collect(direct.generate(request).await?).await;
            anyhow::ensure!(collected.finish().is_some(), "direct call did not finish");
            latencies[0][turn].push(started.elapsed());
            // 1: Gyre's proxy.
            let started = Instant::now();
            let status = clients[0]
                .call(
                    "/v1/messages",
                    &format!("x-api-key: {token}\r\n"),
                    &messages,
                )
                .await?;
            anyhow::ensure!(status == 200, "gyre proxy answered {status}");
            latencies[1][turn].push(started.elapsed());
            // 2..4: the chat engine directly, through LiteLLM, through smg.
            for (target, name) in [
                (2, "the chat engine"),
                (3, litellm.name.as_str()),
                (4, smg.name.as_str()),
            ] {
                let started = Instant::now();
                let status = clients[target - 1]
                    .call("/v1/chat/completions", bearer, &chat)
                    .await?;
                anyhow::ensure!(status == 200, "{name} answered {status}");
                latencies[target][turn].push(started.elapsed());
            }
        }
    }
    let labels = [
        "SGLang /generate, direct".to_string(),
        "gyre proxy /v1/messages".to_string(),
        "chat engine, direct".to_string(),
        format!("LiteLLM {}", pinned(&script_text, "LITELLM_VERSION")),
        format!("smg {}", pinned(&script_text, "SMG_VERSION")),
    ];
    let last = contexts.len() - 1;
    let median_at = |target: usize, turn: usize| {
        let mut values = latencies[target][turn].clone();
        values.sort();
        percentile(&values, 0.5)
    };
    let all = |target: usize| {
        let mut values: Vec<Duration> = latencies[target].iter().flatten().copied().collect();
        values.sort();
        (percentile(&values, 0.5), percentile(&values, 0.99))
    };
    outln!(
        "anchors at concurrency 1, {repeats} passes over {} contexts ({} .. {} tokens), calls interleaved:",
        contexts.len(),
        contexts[0],
        contexts[last]
    );
    outln!(
        "  {:<26} {:>9} {:>9} {:>12} {:>16} {:>16} {:>16}",
        "target",
        "p50",
        "p99",
        "p50 at max",
        "added p50 (all)",
        "added p50 at max",
        "added p99/call"
    );
    for (target, label) in labels.iter().enumerate() {
        let (p50, p99) = all(target);
        let at_max = median_at(target, last);
        let anchor = match target {
            1 => Some(0),
            3 | 4 => Some(2),
            _ => None,
        };
        let added = anchor.map(|anchor| {
            // The median over the ladder of per-context differences of medians.
            let mut differences: Vec<f64> = (0..contexts.len())
                .map(|turn| median_at(target, turn) - median_at(anchor, turn))
                .collect();
            differences.sort_by(f64::total_cmp);
            // Each call against the anchor call made right before it for the same context.
            let mut per_call: Vec<f64> = latencies[target]
                .iter()
                .zip(&latencies[anchor])
                .flat_map(|(calls, anchor_calls)| {
                    calls.iter().zip(anchor_calls).map(|(call, anchor_call)| {
                        (call.as_secs_f64() - anchor_call.as_secs_f64()) * 1e3
                    })
                })
                .collect();
            per_call.sort_by(f64::total_cmp);
            let p99_per_call = per_call[((per_call.len() - 1) as f64 * 0.99).round() as usize];
            (
                differences[differences.len() / 2],
                at_max - median_at(anchor, last),
                p99_per_call,
            )
        });
        let (added_all, added_max, added_p99) = match added {
            Some((all, max, p99)) => (
                format!("{all:.2}ms"),
                format!("{max:.2}ms"),
                format!("{p99:.2}ms"),
            ),
            None => ("-".to_string(), "-".to_string(), "-".to_string()),
        };
        outln!(
            "  {:<26} {:>7.2}ms {:>7.2}ms {:>10.2}ms {:>16} {:>16} {:>16}",
            label,
            p50,
            p99,
            at_max,
            added_all,
            added_max,
            added_p99
        );
    }
    Ok(())
}
