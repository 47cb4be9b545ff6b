//! `gyre bench proxy`: what the proxy costs, beside its anchors, in one run.
//!
//! - **Added latency**: the same fake SGLang engine (the protocol fake in `gyre-proxy`, backed by
//!   a deterministic engine answering `--answer-tokens` tokens at once) is called directly
//!   (its `/generate` with `input_ids`, through the proxy's own SGLang client) and through the
//!   proxy (`POST /v1/messages` over loopback HTTP, non-streaming, TITO record committed to an
//!   event file with fdatasync before the answer). C concurrent executions each make calls whose
//!   contexts grow from 1K to 128K tokens (doubling). p50/p99 of both, and their differences.
//!   Also per call: call i of the proxied phase minus call i of the direct phase (same
//!   execution, same turn, same context), p50 and p99 of those differences.
//! - **Throughput** at the highest concurrency: calls/s through the proxy over calls/s direct.
//! - **CPU**: process CPU seconds of the proxied run minus the direct run, per call (the client
//!   and the engine run in both, so the difference is the proxy's work), and calls/s per core.
//! - **Tokenization work** over a 636-call execution (contexts growing to ~165K tokens): tokens
//!   the proxy encodes (incremental, `Session::prepare`) against re-rendering and re-tokenizing
//!   every request, and the CPU time of both.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use gyre_proxy::engine::fake::{FakeOptions, FakeServer};
use gyre_proxy::engine::{
    collect, DeterministicEngine, DeterministicOptions, EngineRequest, SglangConfig, SglangEngine,
    TokenEngine,
};
use gyre_proxy::output::OutputFormat;
use gyre_proxy::server::session::{Sampled, Session};
use gyre_proxy::server::{self, AppState, ControlSink, FileSink, RecordSink, ServerConfig};
use gyre_proxy::template::CivilDateTime;
use gyre_proxy::{ChatModel, ChatRequest, Message, Role, ToolArgumentsForm};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[path = "proxy_bench_anchors.rs"]
mod anchors;

/// Arguments of `gyre bench proxy`.
#[derive(Args, Debug)]
#[command(allow_negative_numbers = true)]
pub struct ProxyBenchArgs {
    /// Concurrent executions measured.
    #[arg(
        long,
        value_delimiter = ',',
        default_values_t = [1usize, 64, 384],
        value_parser = super::values::at_least_one_usize(),
    )]
    concurrency: Vec<usize>,
    /// Largest context, tokens (at least the first context: 1024, or `--step`).
    #[arg(
        long,
        default_value_t = 131_072,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=CONTEXT_TOKENS_LIMIT),
    )]
    context_max: usize,
    /// Context growth per call, tokens; 0 doubles from 1K (every call then brings as many new
    /// tokens as it reuses).
    #[arg(long, default_value_t = 0)]
    step: usize,
    /// Tokens each engine answer has.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..))]
    answer_tokens: u32,
    /// Decode time the fake engine spends per output token, milliseconds (0: it answers as
    /// fast as it is read). A real engine decoding a batch of long-context sequences runs at
    /// tens of milliseconds per token per sequence; with 0 the "engine's throughput" is only
    /// the fake's HTTP handling, the harshest possible anchor.
    #[arg(long, default_value_t = 0.0, value_parser = super::values::non_negative)]
    decode_ms_per_token: f64,
    /// A Python venv prepared with `scripts/anchors.sh install DIR`: also measures LiteLLM's
    /// proxy and SGLang's `smg` gateway (pinned in that script) in front of an OpenAI-compatible
    /// engine, beside Gyre, at concurrency 1, calls interleaved.
    #[arg(long, value_name = "VENV_DIR", value_parser = anchors::venv)]
    anchors: Option<std::path::PathBuf>,
    /// Passes over the context ladder in the anchors comparison.
    #[arg(long, default_value_t = 5)]
    anchor_repeats: usize,
    /// Passes per concurrency: each pass runs the direct phase, then the proxied phase with new
    /// executions; latencies and CPU are pooled over the passes. More passes give the tail
    /// percentiles more calls and spread the host's drift over both phases.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
    passes: u32,
    /// Where the proxy commits each TITO record before answering: `file`, a local event file
    /// (one `fdatasync` per group of records), or `cluster`, a 3-node control quorum started
    /// on loopback in this process (the record is committed on a Raft majority, every replica
    /// folds it), as a deployment with `gyre proxy --cluster` does.
    #[arg(long, value_enum, default_value_t = SinkKind::File)]
    sink: SinkKind,
    /// Calls in the tokenization-work execution (0 skips that part).
    #[arg(long, default_value_t = 636)]
    execution_calls: usize,
    /// Also measures Anthropic Message Threads at concurrency 1: an execution that sends each
    /// turn as a `continue` (only the new turn; the proxy expands it from the thread it holds
    /// and commits the turn with the call's record) against one re-sending the whole
    /// conversation, over the same context ladder, calls interleaved, `--passes` times.
    #[arg(long)]
    threads: bool,
}

/// The largest `--context-max`, tokens: each call's prompt is built in memory.
const CONTEXT_TOKENS_LIMIT: u64 = 1 << 24;

/// Where `gyre bench proxy` commits records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SinkKind {
    File,
    Cluster,
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize].as_secs_f64() * 1e3
}

/// Process CPU seconds (user + system) so far, at the clock's nanosecond resolution
/// (`/proc/self/stat` counts 10 ms ticks: a short run's share rounded to nothing).
fn cpu_seconds() -> f64 {
    let spent = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    spent.tv_sec as f64 + spent.tv_nsec as f64 * 1e-9
}

/// Filler text of about `tokens` tokens for the test tokenizer.
fn filler(tokens: usize, salt: usize) -> String {
    let mut text = String::new();
    let mut i = 0;
    while text.len() < tokens * 3 {
        text.push_str(&format!(
            "line {salt}.{i}: the tool printed some output here\n"
        ));
        i += 1;
    }
    text
}

/// The benchmark conversation up to call `upto`: one user message of filler per call (as many
/// tokens as the context grew), each answered "ok" but the last.
fn conversation(contexts: &[usize], upto: usize, salt: usize) -> Vec<serde_json::Value> {
    let mut messages = Vec::new();
    let mut previous = 0usize;
    for (turn, tokens) in contexts.iter().take(upto + 1).enumerate() {
        messages.push(serde_json::json!({
            "role": "user",
            "content": filler(tokens.saturating_sub(previous), salt * 100 + turn),
        }));
        if turn < upto {
            messages.push(serde_json::json!({"role": "assistant", "content": "ok"}));
        }
        previous = *tokens;
    }
    messages
}

fn request_body(contexts: &[usize], upto: usize, salt: usize, max_tokens: u32) -> String {
    serde_json::json!({
        "model": "gyre-test",
        "max_tokens": max_tokens,
        "system": "You are the benchmark agent.",
        "messages": conversation(contexts, upto, salt),
    })
    .to_string()
}

/// A harness-like HTTP/1.1 client: one kept-alive connection, as the real CLIs keep theirs
/// (a connection per call would charge every proxied call a TCP handshake and a new server
/// task that the direct engine client, which pools its connections, never pays).
pub(crate) struct KeepAlive {
    address: std::net::SocketAddr,
    stream: Option<tokio::io::BufReader<tokio::net::TcpStream>>,
}

impl KeepAlive {
    pub(crate) fn new(address: std::net::SocketAddr) -> Self {
        Self {
            address,
            stream: None,
        }
    }

    /// One request (`GET` when `path` starts with "GET ", else `POST` of `body`); `headers`
    /// are extra header lines, each ending in CRLF. Reads the whole answer; returns its status.
    /// A kept connection the server has closed meanwhile is replaced once.
    pub(crate) async fn call(
        &mut self,
        path: &str,
        headers: &str,
        body: &str,
    ) -> anyhow::Result<u16> {
        Ok(self.call_for_body(path, headers, body).await?.0)
    }

    /// [`KeepAlive::call`], returning the answer's body too (a chunked one with its chunk
    /// framing: the caller reads what it needs from it).
    pub(crate) async fn call_for_body(
        &mut self,
        path: &str,
        headers: &str,
        body: &str,
    ) -> anyhow::Result<(u16, Vec<u8>)> {
        if self.stream.is_some() {
            if let Ok(answer) = self.exchange(path, headers, body).await {
                return Ok(answer);
            }
            self.stream = None;
        }
        self.exchange(path, headers, body).await
    }

    async fn exchange(
        &mut self,
        path: &str,
        headers: &str,
        body: &str,
    ) -> anyhow::Result<(u16, Vec<u8>)> {
        use tokio::io::AsyncBufReadExt;
        let mut stream = match self.stream.take() {
            Some(stream) => stream,
            None => {
                let stream = tokio::net::TcpStream::connect(self.address).await?;
                stream.set_nodelay(true)?;
                tokio::io::BufReader::with_capacity(64 * 1024, stream)
            }
        };
        let (method, path) = path.split_once(' ').unwrap_or(("POST", path));
        let head = format!(
            "{method} {path} HTTP/1.1\r\nhost: {}\r\n{headers}content-type: application/json\r\ncontent-length: {}\r\n\r\n",
            self.address,
            body.len()
        );
        stream.get_mut().write_all(head.as_bytes()).await?;
        stream.get_mut().write_all(body.as_bytes()).await?;
        let mut line = String::new();
        stream.read_line(&mut line).await?;
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|code| code.parse().ok())
            .with_context(|| format!("bad response head {line:?}"))?;
        let mut length: Option<usize> = None;
        let mut chunked = false;
        let mut close = false;
        loop {
            line.clear();
            anyhow::ensure!(
                stream.read_line(&mut line).await? > 0,
                "connection closed in headers"
            );
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                let value = value.trim();
                match name.trim().to_ascii_lowercase().as_str() {
                    "content-length" => length = value.parse().ok(),
                    "transfer-encoding" => chunked = value.eq_ignore_ascii_case("chunked"),
                    "connection" => close = value.eq_ignore_ascii_case("close"),
                    _ => {}
                }
            }
        }
        let mut answer = Vec::new();
        if chunked {
            let mut chunk = Vec::new();
            loop {
                line.clear();
                stream.read_line(&mut line).await?;
                let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                    .with_context(|| format!("bad chunk size {line:?}"))?;
                chunk.resize(size + 2, 0);
                stream.read_exact(&mut chunk).await?;
                answer.extend_from_slice(&chunk[..size]);
                if size == 0 {
                    break;
                }
            }
        } else if let Some(length) = length {
            answer.resize(length, 0);
            stream.read_exact(&mut answer).await?;
        } else {
            stream.read_to_end(&mut answer).await?;
            close = true;
        }
        if !close {
            self.stream = Some(stream);
        }
        Ok((status, answer))
    }
}

#[derive(Default)]
struct Phase {
    latencies: Vec<Duration>,
    calls: usize,
    seconds: f64,
    calls_per_second: f64,
    cpu: f64,
}

impl Phase {
    /// Waits for one pass's client tasks and adds their calls, wall time and process CPU.
    async fn add_pass(
        &mut self,
        tasks: Vec<tokio::task::JoinHandle<anyhow::Result<Vec<Duration>>>>,
        started: Instant,
        cpu_before: f64,
    ) -> anyhow::Result<()> {
        for task in tasks {
            let latencies = task.await??;
            self.calls += latencies.len();
            self.latencies.extend(latencies);
        }
        self.seconds += started.elapsed().as_secs_f64();
        self.cpu += cpu_seconds() - cpu_before;
        Ok(())
    }
}

/// The contexts of one execution, tokens: doubling from 1K when `step` is 0, else growing by
/// `step`, up to `context_max`.
fn context_ladder(step: usize, context_max: usize) -> Vec<usize> {
    let mut contexts = Vec::new();
    let mut size = if step == 0 { 1024usize } else { step };
    while size <= context_max {
        contexts.push(size);
        size = if step == 0 {
            size.saturating_mul(2)
        } else {
            size.saturating_add(step)
        };
        if contexts.last() == Some(&size) {
            break;
        }
    }
    contexts
}

pub fn run(args: ProxyBenchArgs) -> anyhow::Result<()> {
    // Checked before anything starts: an empty ladder would measure nothing.
    let first = if args.step == 0 { 1024 } else { args.step };
    anyhow::ensure!(
        args.context_max >= first,
        "--context-max {} is below the first context ({first} tokens{})",
        args.context_max,
        if args.step == 0 { "" } else { ", --step" }
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async_run(args))
}

async fn async_run(args: ProxyBenchArgs) -> anyhow::Result<()> {
    let model = Arc::new(gyre_proxy::test_model::model(ToolArgumentsForm::RawText)?);
    let format = OutputFormat::test_model();
    let end = model.token_id("<|im_end|>").context("end token")?;
    let backing: Arc<dyn TokenEngine> = Arc::new(DeterministicEngine::new(DeterministicOptions {
        name: "deterministic".into(),
        output_tokens: args.answer_tokens,
        end_token_id: Some(end),
        playback: gyre_proxy::engine::PlaybackOptions {
            // Four tokens per streamed event, as SGLang's default stream interval batches them.
            chunk_tokens: 4,
            chunk_interval_us: (args.decode_ms_per_token * 4e3).round() as u64,
            ..gyre_proxy::engine::PlaybackOptions::default()
        },
        ..DeterministicOptions::default()
    }));
    let fake = FakeServer::sglang(backing, FakeOptions::default()).await?;
    let direct = SglangEngine::new(&fake.url(), SglangConfig::default())?;
    let dir = tempfile::tempdir()?;
    let log_path = dir.path().join("tito.log");
    let mut cluster = None;
    let sink: Arc<dyn RecordSink> = match args.sink {
        SinkKind::File => Arc::new(FileSink::open(&log_path).map_err(anyhow::Error::msg)?),
        SinkKind::Cluster => {
            // The nodes' default snapshot interval (a deployment's).
            let started = super::control::LoopbackCluster::start(20_000).await?;
            let sink = ControlSink::new(&started.addresses).map_err(anyhow::Error::msg)?;
            outln!(
                "records commit to a 3-node control cluster at {}",
                started.addresses
            );
            cluster = Some(started);
            Arc::new(sink)
        }
    };
    let proxied_engine: Arc<dyn TokenEngine> =
        Arc::new(SglangEngine::new(&fake.url(), SglangConfig::default())?);
    // Credentials are kept, so the end of the run can measure a restart.
    let config = ServerConfig {
        credentials: Some(dir.path().join("proxy.credentials")),
        ..ServerConfig::default()
    };
    let state = AppState::new(
        config.clone(),
        model.clone(),
        format.clone(),
        vec![proxied_engine.clone()],
        sink.clone(),
    )
    .map_err(anyhow::Error::msg)?;
    let (address, _server) = server::serve(
        state.clone(),
        "127.0.0.1:0".parse()?,
        std::future::pending::<()>(),
    )
    .await?;

    let contexts = context_ladder(args.step, args.context_max);
    outln!(
        "contexts per execution: {} calls, {} .. {} tokens; answers {} tokens, decoded at {} ms/token; {} pass(es)",
        contexts.len(),
        contexts.first().copied().unwrap_or(0),
        contexts.last().copied().unwrap_or(0),
        args.answer_tokens,
        args.decode_ms_per_token,
        args.passes
    );
    outln!(
        "{:>6} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "conc",
        "direct p50",
        "direct p99",
        "proxy p50",
        "proxy p99",
        "added p50",
        "added p99",
        "tput ratio"
    );
    for &concurrency in &args.concurrency {
        // Inputs are built before the clock starts, so neither phase times its client's work.
        let prompts: Vec<Vec<Vec<u32>>> = (0..concurrency)
            .map(|_| {
                contexts
                    .iter()
                    .enumerate()
                    .map(|(turn, tokens)| {
                        (0..*tokens as u32)
                            .map(|i| 9 + (i * 7 + turn as u32) % 2000)
                            .collect()
                    })
                    .collect()
            })
            .collect();
        let bodies: Vec<Vec<String>> = (0..concurrency)
            .map(|execution| {
                (0..contexts.len())
                    .map(|turn| request_body(&contexts, turn, execution, args.answer_tokens))
                    .collect()
            })
            .collect();
        let prompts: Vec<Arc<Vec<Vec<u32>>>> = prompts.into_iter().map(Arc::new).collect();
        let bodies: Vec<Arc<Vec<String>>> = bodies.into_iter().map(Arc::new).collect();
        let mut direct_phase = Phase::default();
        let mut proxy_phase = Phase::default();
        let stages_before = state.metrics.stage_totals();
        state.metrics.keep_samples();
        for pass in 0..args.passes {
            // Direct: the same engine, the same prompt lengths, through the SGLang client.
            let started = Instant::now();
            let cpu_before = cpu_seconds();
            let mut tasks = Vec::new();
            for (execution, prompts) in prompts.iter().enumerate() {
                let direct = direct.clone();
                let prompts = prompts.clone();
                let answer_tokens = args.answer_tokens;
                tasks.push(tokio::spawn(async move {
                    let mut latencies = Vec::new();
                    for (turn, ids) in prompts.iter().enumerate() {
                        let request = EngineRequest::new(
                            format!("d-{pass}-{execution}-{turn}"),
                            ids.clone(),
                            answer_tokens,
                        );
                        let call = Instant::now();
                        let stream = direct.generate(request).await?;
                        let collected = collect(stream).await;
                        anyhow::ensure!(collected.finish().is_some(), "direct call did not finish");
                        latencies.push(call.elapsed());
                    }
                    anyhow::Ok(latencies)
                }));
            }
            direct_phase.add_pass(tasks, started, cpu_before).await?;

            // Proxied: one execution per client task, its conversation growing call by call.
            let started = Instant::now();
            let cpu_before = cpu_seconds();
            let mut tasks = Vec::new();
            for bodies in &bodies {
                let (_, token) = state.open_execution(None, None).expect("open");
                let bodies = bodies.clone();
                tasks.push(tokio::spawn(async move {
                    let mut latencies = Vec::new();
                    let mut client = KeepAlive::new(address);
                    let key = format!("x-api-key: {token}\r\n");
                    for body in bodies.iter() {
                        let call = Instant::now();
                        let status = client.call("/v1/messages", &key, body).await?;
                        anyhow::ensure!(status == 200, "proxied call answered {status}");
                        latencies.push(call.elapsed());
                    }
                    anyhow::Ok(latencies)
                }));
            }
            proxy_phase.add_pass(tasks, started, cpu_before).await?;
        }
        direct_phase.calls_per_second = direct_phase.calls as f64 / direct_phase.seconds.max(1e-9);
        proxy_phase.calls_per_second = proxy_phase.calls as f64 / proxy_phase.seconds.max(1e-9);

        // Both phases hold their calls in the same order (pass, execution, turn): call i of one
        // has the same context as call i of the other, so their difference is that call's
        // added latency.
        let mut per_call: Vec<f64> = proxy_phase
            .latencies
            .iter()
            .zip(&direct_phase.latencies)
            .map(|(proxied, direct)| (proxied.as_secs_f64() - direct.as_secs_f64()) * 1e3)
            .collect();
        per_call.sort_by(f64::total_cmp);
        let per_call_at = |p: f64| {
            per_call
                .get(((per_call.len().max(1) - 1) as f64 * p).round() as usize)
                .copied()
                .unwrap_or(0.0)
        };
        direct_phase.latencies.sort();
        proxy_phase.latencies.sort();
        let (d50, d99) = (
            percentile(&direct_phase.latencies, 0.5),
            percentile(&direct_phase.latencies, 0.99),
        );
        let (p50, p99) = (
            percentile(&proxy_phase.latencies, 0.5),
            percentile(&proxy_phase.latencies, 0.99),
        );
        outln!(
            "{concurrency:>6} {d50:>8.2}ms {d99:>8.2}ms {p50:>8.2}ms {p99:>8.2}ms {:>8.2}ms {:>8.2}ms {:>10.2}",
            p50 - d50,
            p99 - d99,
            proxy_phase.calls_per_second / direct_phase.calls_per_second.max(1e-9)
        );
        outln!(
            "       added per call (proxied minus direct, same context): p50 {:.2} ms, p99 {:.2} ms",
            per_call_at(0.5),
            per_call_at(0.99)
        );
        let calls = proxy_phase.latencies.len().max(1) as f64;
        let proxy_cpu = (proxy_phase.cpu - direct_phase.cpu).max(0.0) / calls;
        // The direct run's CPU can exceed the proxied run's on a noisy host: no rate then.
        let per_core = if proxy_cpu > 0.0 {
            format!("{:.0}", 1.0 / proxy_cpu)
        } else {
            "- (no CPU measured above the direct run's)".to_string()
        };
        outln!(
            "       CPU per call: proxied run {:.2} ms, direct run {:.2} ms, proxy's share {:.2} ms => {per_core} calls/s per core",
            proxy_phase.cpu / calls * 1e3,
            direct_phase.cpu / calls * 1e3,
            proxy_cpu * 1e3,
        );
        // Where the proxied calls' time went, from the proxy's own stage histograms.
        let stages: Vec<String> = state
            .metrics
            .stage_totals()
            .iter()
            .zip(&stages_before)
            .map(|((stage, sum, count), (_, sum_before, count_before))| {
                let calls = (count - count_before).max(1) as f64;
                format!("{stage} {:.2}", (sum - sum_before) / calls * 1e3)
            })
            .collect();
        outln!("       mean ms per call by stage: {}", stages.join(", "));
        // The tail by stage: which step the slow calls spend their time in.
        let tails: Vec<String> = state
            .metrics
            .stage_samples()
            .into_iter()
            .map(|(stage, mut samples)| {
                samples.sort_by(f64::total_cmp);
                let at = |p: f64| {
                    samples
                        .get(((samples.len().max(1) - 1) as f64 * p).round() as usize)
                        .map_or(0.0, |seconds| seconds * 1e3)
                };
                format!("{stage} {:.2} / {:.2}", at(0.5), at(0.99))
            })
            .collect();
        outln!("       p50 / p99 ms by stage: {}", tails.join(", "));
    }

    if args.threads {
        threads_comparison(&state, address, &contexts, args.answer_tokens, args.passes).await?;
    }
    if let Some(venv) = &args.anchors {
        anchors::run(
            venv,
            args.anchor_repeats,
            &contexts,
            args.answer_tokens,
            &direct,
            &state,
            address,
        )
        .await?;
    }
    // A restart: a new proxy rebuilds every execution of the run from the sink (the event
    // file, or each tree from a node's projection) before it serves.
    let restarted = AppState::new(config, model.clone(), format, vec![proxied_engine], sink)
        .map_err(anyhow::Error::msg)?;
    let started = Instant::now();
    let recovery = match &cluster {
        None => super::proxy::recover(&restarted, Some(&log_path), None).await?,
        Some(cluster) => {
            super::proxy::recover(&restarted, None, Some(cluster.addresses.as_str())).await?
        }
    };
    let seconds = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        recovery.executions_lost.is_empty(),
        "executions could not be rebuilt: {:?}",
        recovery.executions_lost
    );
    outln!(
        "restart: {} executions ({} calls) rebuilt from the {} in {:.2} s before serving ({:.0} calls/s)",
        recovery.executions_resumed,
        recovery.calls_recovered,
        if cluster.is_some() { "quorum's projection" } else { "event file" },
        seconds,
        recovery.calls_recovered as f64 / seconds.max(1e-9)
    );
    if args.execution_calls > 0 {
        tokenization_work(&model, args.execution_calls)?;
    }
    if let Some(cluster) = cluster {
        cluster.shutdown().await?;
    }
    Ok(())
}

/// `--threads`: per pass, two new executions walk the context ladder, calls interleaved: one
/// re-sends the whole conversation each turn, the other sends only the new turn as a Message
/// Threads `continue` of its previous answer. Prints both latencies and their ratio.
async fn threads_comparison(
    state: &Arc<AppState>,
    address: std::net::SocketAddr,
    contexts: &[usize],
    answer_tokens: u32,
    passes: u32,
) -> anyhow::Result<()> {
    let mut whole = Vec::new();
    let mut continued = Vec::new();
    for pass in 0..passes as usize {
        let (_, stateless_token) = state.open_execution(None, None).expect("open");
        let (_, thread_token) = state.open_execution(None, None).expect("open");
        let mut stateless = KeepAlive::new(address);
        let mut threaded = KeepAlive::new(address);
        let stateless_key = format!("x-api-key: {stateless_token}\r\n");
        let thread_key = format!("x-api-key: {thread_token}\r\n");
        // Salts apart from the main phases' executions: no tree shares their text.
        let salt = 1_000 + pass;
        let mut previous_id: Option<String> = None;
        for turn in 0..contexts.len() {
            let body = request_body(contexts, turn, salt, answer_tokens);
            let call = Instant::now();
            let status = stateless
                .call("/v1/messages", &stateless_key, &body)
                .await?;
            anyhow::ensure!(status == 200, "a whole re-send answered {status}");
            whole.push(call.elapsed());
            let mut request: serde_json::Value = serde_json::from_str(&body)?;
            match &previous_id {
                None => request["thread"] = serde_json::json!({"type": "create"}),
                Some(id) => {
                    // The new turn alone: the last user message.
                    let messages = request["messages"].as_array().context("messages")?;
                    let new_turn = messages.last().context("a turn")?.clone();
                    request = serde_json::json!({
                        "model": request["model"],
                        "max_tokens": answer_tokens,
                        "messages": [new_turn],
                        "thread": {"type": "continue", "previous_message_id": id},
                    });
                }
            }
            let body = request.to_string();
            let call = Instant::now();
            let (status, answer) = threaded
                .call_for_body("/v1/messages", &thread_key, &body)
                .await?;
            continued.push(call.elapsed());
            anyhow::ensure!(
                status == 200,
                "a thread continue answered {status}: {}",
                String::from_utf8_lossy(&answer)
            );
            let answer: serde_json::Value = serde_json::from_slice(&answer)?;
            previous_id = Some(answer["id"].as_str().context("an answer id")?.to_string());
        }
    }
    whole.sort();
    continued.sort();
    let (w50, w99) = (percentile(&whole, 0.5), percentile(&whole, 0.99));
    let (c50, c99) = (percentile(&continued, 0.5), percentile(&continued, 0.99));
    outln!(
        "message threads, concurrency 1, {} calls each: whole re-send p50 {w50:.2} / p99 {w99:.2} ms, thread continue p50 {c50:.2} / p99 {c99:.2} ms (continue / re-send: p50 {:.2}, p99 {:.2})",
        whole.len(),
        c50 / w50.max(1e-9),
        c99 / w99.max(1e-9)
    );
    Ok(())
}

/// Tokens encoded and CPU for one long execution: incremental vs re-render + re-tokenize.
fn tokenization_work(model: &ChatModel, calls: usize) -> anyhow::Result<()> {
    let now = CivilDateTime::from_unix_seconds(1_780_000_000);
    let mut session = Session::new(gyre_event::ExecutionId(1), model);
    let mut request = ChatRequest::new(gyre_proxy::Api::Anthropic, "gyre-test");
    request
        .messages
        .push(Message::new(Role::System, filler(4000, 0)));
    let mut incremental_seconds = 0.0;
    let mut full_seconds = 0.0;
    let mut full_tokens = 0u64;
    let mut last_context = 0usize;
    for call in 0..calls {
        request
            .messages
            .push(Message::new(Role::User, filler(250, call + 1)));
        let started = Instant::now();
        let prepared = session.prepare(model, &request, None, now)?;
        incremental_seconds += started.elapsed().as_secs_f64();
        last_context = prepared.context_ids.len();
        // The anchor: render the whole request and tokenize all of it.
        let started = Instant::now();
        let text = model.render(&gyre_proxy::RenderInput {
            messages: &request.messages,
            tools: &request.tools,
            add_generation_prompt: true,
            now,
            extra: None,
        })?;
        full_tokens += model.encode(&text)?.len() as u64;
        full_seconds += started.elapsed().as_secs_f64();
        // The model answers "ok" + end of turn; the history then carries it.
        let answer = "ok<|im_end|>";
        let ids = model.encode(answer)?;
        let mut ends = Vec::new();
        let mut text_so_far = String::new();
        for id in &ids {
            text_so_far.push_str(&model.decode(&[*id])?);
            ends.push(text_so_far.len() as u32);
        }
        let sampled = Sampled {
            output_logprobs: vec![-0.5; ids.len()],
            output_ids: ids,
            output_ends: ends,
            output_text: answer.to_string(),
            ..Sampled::default()
        };
        let record = session.finish_call(prepared, sampled)?;
        session.record_committed(&record);
        request
            .messages
            .push(Message::new(Role::Assistant, "ok".to_string()));
    }
    outln!(
        "tokenization over a {calls}-call execution (final context {last_context} tokens): incremental {} tokens in {:.2} s (render included); re-render + re-tokenize {} tokens in {:.2} s; {:.0}x fewer tokens, {:.1}x less CPU (goal >= 50x)",
        session.tokens_encoded,
        incremental_seconds,
        full_tokens,
        full_seconds,
        full_tokens as f64 / session.tokens_encoded.max(1) as f64,
        full_seconds / incremental_seconds.max(1e-9)
    );
    Ok(())
}
