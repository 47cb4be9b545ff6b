//! The real harness CLIs through `gyre proxy` with the scripted engine: Claude Code
//! (`@anthropic-ai/claude-code`, pinned in `.ci/run`) runs a multi-turn task with parallel tool
//! calls, a sub-agent and a forced auto-compaction, and the recorded TITO trees must show every
//! turn extending the previous one (no re-encoding of history), the sub-agent as its own root and
//! the compaction as a branch followed by a new root.
//!
//! Each run's traffic is also captured (`gyre proxy --capture`) and replayed through a second
//! proxy with another engine (`gyre capture replay`), so every history carries answers that
//! proxy never gave, as with traffic captured elsewhere: every request must be answered in
//! full and the trees must still extend. And Claude Code continues a conversation after its
//! proxy was killed and restarted (`claude --continue`), extending the tree.
//!
//! The CLIs come from npm: `GYRE_CLAUDE_BIN` (and `GYRE_CODEX_BIN`) point at them; `.ci/run`
//! installs them and sets `GYRE_HARNESS_REQUIRED=1`, under which a missing CLI fails the test
//! instead of passing by. The OpenAI Agents SDK (PyPI `openai-agents`), a Responses client
//! that chains with `previous_response_id`, runs from the Python `GYRE_AGENTS_PYTHON` names
//! (a venv `.ci/run` installs it into). opencode (`opencode-ai`, `GYRE_OPENCODE_BIN`) runs a
//! sub-agent and parallel tools over Messages and over Responses.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use gyre_event::{CallKind, EventBody, ModelCallRecord};

use crate::support::ProxyProcess;

/// How long one run of a harness CLI may take: far above a healthy run (seconds), far below
/// the CLIs' own retry budgets (Claude Code waits 10 min per request, then retries).
const HARNESS_RUN_LIMIT: std::time::Duration = std::time::Duration::from_secs(600);

fn harness_bin(variable: &str) -> Option<PathBuf> {
    let required = std::env::var("GYRE_HARNESS_REQUIRED").is_ok_and(|value| value == "1");
    match std::env::var_os(variable).map(PathBuf::from) {
        Some(path) if path.exists() => Some(path),
        other => {
            assert!(
                !required,
                "GYRE_HARNESS_REQUIRED=1 but {variable} ({other:?}) is not an installed CLI"
            );
            eprintln!("{variable} not set: this test needs the CLI from npm (see .ci/run)");
            None
        }
    }
}

/// A running `gyre proxy` and the first execution's credential.
struct Proxy {
    process: ProxyProcess,
    anthropic_base_url: String,
    openai_base_url: String,
    token: String,
}

fn utf8(path: &Path) -> &str {
    path.to_str().expect("temporary paths are UTF-8")
}

fn start_proxy(script: &Path, log: &Path, capture: &Path) -> Proxy {
    let mut process = ProxyProcess::start(&[
        "--listen",
        "127.0.0.1:0",
        "--open",
        "1",
        "--script",
        utf8(script),
        "--log",
        utf8(log),
        "--capture",
        utf8(capture),
    ]);
    let credential = process.next_json();
    let text = |key: &str| credential[key].as_str().expect(key).to_string();
    Proxy {
        anthropic_base_url: text("anthropic_base_url"),
        openai_base_url: text("openai_base_url"),
        token: text("token"),
        process,
    }
}

/// Claude Code in a scratch HOME, pointed at `proxy`'s first execution.
fn claude_command(claude: &Path, work: &Path, home: &Path, proxy: &Proxy) -> Command {
    let mut command = Command::new(claude);
    command
        .current_dir(work)
        .env("HOME", home)
        .env("IS_SANDBOX", "1")
        .env("ANTHROPIC_BASE_URL", &proxy.anthropic_base_url)
        .env("ANTHROPIC_API_KEY", &proxy.token)
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("DISABLE_TELEMETRY", "1")
        .env("CLAUDE_CODE_ATTRIBUTION_HEADER", "0");
    command
}

/// Runs Claude Code to its end; its stdout (a failed run fails the test, showing its output).
fn claude_stdout(mut command: Command) -> String {
    let output = crate::support::output_within(&mut command, HARNESS_RUN_LIMIT);
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "claude exited {:?}\nstdout tail: {}\nstderr: {}",
        output.status,
        &stdout[stdout.len().saturating_sub(3000)..],
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// `gyre_proxy_body_elements_total` from the proxy's `/metrics`: conversation elements
/// (parsed, taken over from the agent's previous body).
fn body_elements(proxy: &Proxy) -> (u64, u64) {
    let authority = proxy
        .anthropic_base_url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .expect("host:port")
        .to_string();
    let mut stream = std::net::TcpStream::connect(&authority).expect("the proxy accepts");
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n"
    )
    .expect("request written");
    let mut text = String::new();
    stream.read_to_string(&mut text).expect("metrics read");
    let counter = |how: &str| {
        let name = format!("gyre_proxy_body_elements_total{{how=\"{how}\"}} ");
        text.lines()
            .find_map(|line| line.strip_prefix(&name))
            .and_then(|value| value.trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("{name}missing from /metrics:\n{text}"))
    };
    (counter("parsed"), counter("reused"))
}

/// The model-call records of a proxy's event file, in commit order.
pub(crate) fn records(log: &Path) -> Vec<ModelCallRecord> {
    gyre_log::EventFileReader::read_all_events(log)
        .expect("the proxy's event file reads back")
        .into_iter()
        .flat_map(|(_, events)| events)
        .filter_map(|event| match event.body {
            EventBody::ModelCall(record) => Some(*record),
            _ => None,
        })
        .collect()
}

/// Replays a capture of proxy A through a fresh proxy B with a different engine (`gyre capture
/// replay`): every assistant turn in B's histories is one B never produced (foreign thinking
/// signatures, tool ids and text), as with traffic captured elsewhere. Every request must be
/// answered in full; returns B's records.
fn replay_through_another_proxy(capture: &Path, dir: &Path) -> Vec<ModelCallRecord> {
    let log = dir.join("replayed.log");
    let mut second = ProxyProcess::start(&[
        "--listen",
        "127.0.0.1:0",
        "--engine",
        "deterministic",
        "--auto-open",
        "--log",
        utf8(&log),
    ]);
    let url = second.url();
    let output = Command::new(env!("CARGO_BIN_EXE_gyre"))
        .args(["capture", "replay"])
        .arg(capture)
        .args(["--url", &url])
        .output()
        .expect("gyre capture replay runs");
    second.kill();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "replaying the capture failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let captured = std::fs::read_to_string(capture)
        .expect("capture file")
        .lines()
        .count();
    assert!(
        captured >= 3,
        "the capture holds the harness's requests ({captured})"
    );
    assert_eq!(
        stdout.lines().count(),
        captured,
        "one report per captured request"
    );
    let replayed = records(&log);
    assert_eq!(
        replayed.len(),
        captured,
        "each replayed request recorded once"
    );
    replayed
}

/// In a replay through another engine, each turn's history carries an answer the replaying
/// proxy did not give: the turn must still extend the previous one up to that one's prompt.
fn assert_turns_extend_previous_prompts(records: &[&ModelCallRecord]) {
    for pair in records.windows(2) {
        let (previous, next) = (pair[0], pair[1]);
        let prompt_end = previous.reused_prefix_tokens_count + previous.input_ids.len() as u64;
        assert_eq!(
            next.parent_call,
            Some(previous.call),
            "call {} hangs from the previous turn",
            next.call
        );
        assert!(
            next.reused_prefix_tokens_count + 4 >= prompt_end,
            "call {} reuses the previous prompt (reused {}, prompt {prompt_end})",
            next.call,
            next.reused_prefix_tokens_count
        );
    }
}

/// Each call hangs from the one before it and reuses that call's whole context: its prompt and
/// every token it sampled (nothing of a turn re-encoded).
fn assert_each_turn_extends_the_whole_previous(records: &[ModelCallRecord]) {
    for pair in records.windows(2) {
        assert_eq!(
            pair[1].parent_call,
            Some(pair[0].call),
            "each turn hangs from the previous"
        );
        assert_eq!(
            pair[1].reused_prefix_tokens_count,
            path_end(&pair[0]),
            "each turn reuses the whole previous context"
        );
    }
}

/// A scripted engine's script of these lines, in `dir`.
fn script_of(dir: &Path, lines: &[serde_json::Value]) -> PathBuf {
    let script = dir.join("script.jsonl");
    let text: String = lines.iter().map(|line| format!("{line}\n")).collect();
    std::fs::write(&script, text).expect("script");
    script
}

fn path_end(record: &ModelCallRecord) -> u64 {
    record.reused_prefix_tokens_count + (record.input_ids.len() + record.output_ids.len()) as u64
}

#[test]
fn claude_code_turns_extend_the_tree_with_a_sub_agent_root_and_a_compaction_branch() {
    let Some(claude) = harness_bin("GYRE_CLAUDE_BIN") else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/it/data/claude_code_script.jsonl");
    let log = dir.path().join("tito.log");
    let capture = dir.path().join("capture.jsonl");
    let proxy = start_proxy(&script, &log, &capture);
    let work = dir.path().join("work");
    let home = dir.path().join("home");
    std::fs::create_dir_all(&work).expect("work dir");
    std::fs::create_dir_all(&home).expect("home dir");
    let mut command = claude_command(&claude, &work, &home, &proxy);
    command.args([
        "-p",
        "Create hello.txt, list the directory, then ask a sub-agent to check cwd",
        "--dangerously-skip-permissions",
        "--model",
        "gyre-test",
        "--autocompact",
        "100000",
        "--output-format",
        "stream-json",
        "--verbose",
    ]);
    let stdout = claude_stdout(command);
    assert!(
        stdout.contains("\"compact_result\":\"success\""),
        "no successful auto-compaction"
    );
    assert!(
        stdout.contains("\"result\":\"All done.\""),
        "the task did not finish"
    );
    assert_eq!(
        std::fs::read_to_string(work.join("hello.txt"))
            .expect("hello.txt written by the Write tool"),
        "café / line1\nline2\n"
    );

    let records = records(&log);
    let by_call: BTreeMap<u64, &ModelCallRecord> = records
        .iter()
        .map(|record| (record.call.get(), record))
        .collect();
    let main: Vec<&ModelCallRecord> = records.iter().filter(|r| r.agent == "main").collect();
    let sub: Vec<&ModelCallRecord> = records
        .iter()
        .filter(|r| r.agent.starts_with("sub:"))
        .collect();
    assert_eq!(
        records.len(),
        main.len() + sub.len(),
        "only main and sub-agent calls"
    );
    assert_eq!(sub.len(), 2, "two sub-agent calls");

    // Main agent up to the compaction: each turn extends the previous one completely.
    let summary_at = main
        .iter()
        .position(|record| record.kind == CallKind::Summary)
        .expect("a compaction (summary) call was recorded");
    assert!(summary_at >= 4, "compaction came after the tool turns");
    for pair in main[..summary_at].windows(2) {
        let (previous, next) = (pair[0], pair[1]);
        assert_eq!(
            next.parent_call,
            Some(previous.call),
            "call {} hangs from the previous turn",
            next.call
        );
        assert_eq!(
            next.reused_prefix_tokens_count,
            path_end(previous),
            "call {} reuses the whole previous context (prompt and sampled tokens)",
            next.call
        );
    }
    // The compaction request is a branch: Claude Code summarises the history the last turn saw
    // (its prompt, not its answer), so it shares that prompt up to the generation prompt.
    let summary = main[summary_at];
    let before = main[summary_at - 1];
    let prompt_end = before.reused_prefix_tokens_count + before.input_ids.len() as u64;
    assert_eq!(summary.parent_call, Some(before.call));
    assert!(
        summary.reused_prefix_tokens_count > before.reused_prefix_tokens_count
            && summary.reused_prefix_tokens_count <= prompt_end
            && prompt_end - summary.reused_prefix_tokens_count <= 4,
        "the compaction branch shares the last prompt (reused {}, prompt {prompt_end})",
        summary.reused_prefix_tokens_count
    );
    // After it, the conversation restarts from the summary: a new root (it shares only the
    // system prompt and tools with the tree).
    let after = main
        .get(summary_at + 1)
        .expect("a call after the compaction");
    assert_eq!(after.kind, CallKind::Turn);
    assert_eq!(
        after.parent_call, None,
        "the post-compaction call is a new root"
    );

    // The sub-agent: its own root, spawned by a main call, then extending itself.
    assert_eq!(sub[0].parent_call, None, "the sub-agent is a separate root");
    let spawner = sub[0]
        .spawned_by
        .expect("the sub-agent records who spawned it");
    assert!(by_call.contains_key(&spawner.get()));
    assert_eq!(sub[1].parent_call, Some(sub[0].call));
    assert_eq!(sub[1].reused_prefix_tokens_count, path_end(sub[0]));

    // Only sampled tokens are outputs; every record has exact behaviour log-probs.
    for record in &records {
        assert_eq!(record.output_ids.len(), record.output_logprobs.len());
        assert!(record
            .output_logprobs
            .iter()
            .all(|lp| lp.is_finite() && *lp <= 0.0));
    }
    // Claude Code re-sends the conversation with `cache_control` moved, yet each body starts
    // with the previous body's bytes: those messages are taken over, not parsed again (in a
    // conversation this short, first bodies and moved markers are about half the messages).
    let (parsed, reused) = body_elements(&proxy);
    assert!(
        reused > 0 && reused * 3 >= parsed,
        "messages reused {reused}, parsed {parsed}: bodies are parsed incrementally"
    );
    drop(proxy);

    // The same traffic through another proxy and engine, as captured elsewhere.
    let replayed = replay_through_another_proxy(&capture, dir.path());
    let main: Vec<&ModelCallRecord> = replayed.iter().filter(|r| r.agent == "main").collect();
    let summary_at = main
        .iter()
        .position(|record| record.kind == CallKind::Summary)
        .expect("the replayed compaction is a summary call");
    assert_turns_extend_previous_prompts(&main[..=summary_at]);
    assert_eq!(
        main[summary_at + 1].parent_call,
        None,
        "a new root after the compaction"
    );
    let sub: Vec<&ModelCallRecord> = replayed
        .iter()
        .filter(|r| r.agent.starts_with("sub:"))
        .collect();
    assert_eq!(sub.len(), 2);
    assert_eq!(sub[0].parent_call, None);
    assert!(sub[0].spawned_by.is_some());
    assert_turns_extend_previous_prompts(&sub);
}

/// Runs `codex exec --json PROMPT` in `dir/work` with a scratch `CODEX_HOME` whose config points
/// the model provider at `proxy` (plus `extra_config` lines); its stdout, after asserting it
/// exited 0.
fn codex_exec(codex: &Path, proxy: &Proxy, dir: &Path, extra_config: &str, prompt: &str) -> String {
    codex_exec_as(codex, proxy, dir, "gyre-test", extra_config, prompt)
}

/// `codex_exec` with Codex told the model is `model`: Codex picks its tools by the model's
/// name (`gpt-5.5` gets the freeform `apply_patch`).
fn codex_exec_as(
    codex: &Path,
    proxy: &Proxy,
    dir: &Path,
    model: &str,
    extra_config: &str,
    prompt: &str,
) -> String {
    let config = format!(
        "model = \"{model}\"\nmodel_provider = \"gyre\"\n{extra_config}[model_providers.gyre]\nname = \"gyre\"\nbase_url = \"{}\"\nenv_key = \"GYRE_EXECUTION_KEY\"\nwire_api = \"responses\"\n",
        proxy.openai_base_url
    );
    codex_run(codex, proxy, dir, &config, prompt)
}

/// Runs `codex exec --json PROMPT` in `dir/work` with a scratch `CODEX_HOME` holding `config`;
/// its stdout, after asserting it exited 0.
fn codex_run(codex: &Path, proxy: &Proxy, dir: &Path, config: &str, prompt: &str) -> String {
    codex_run_with(codex, proxy, dir, config, &[], prompt)
}

/// [`codex_run`] with more `codex exec` options before the prompt.
fn codex_run_with(
    codex: &Path,
    proxy: &Proxy,
    dir: &Path,
    config: &str,
    options: &[&str],
    prompt: &str,
) -> String {
    let work = dir.join("work");
    let codex_home = dir.join("codex-home");
    std::fs::create_dir_all(&work).expect("work dir");
    std::fs::create_dir_all(&codex_home).expect("codex home");
    std::fs::write(codex_home.join("config.toml"), config).expect("codex config");
    let output = crate::support::output_within(
        Command::new(codex)
            .current_dir(&work)
            .env("CODEX_HOME", &codex_home)
            .env("GYRE_EXECUTION_KEY", &proxy.token)
            .args([
                "exec",
                "--skip-git-repo-check",
                "--dangerously-bypass-approvals-and-sandbox",
                "--json",
            ])
            .args(options)
            .arg(prompt)
            .stdin(Stdio::null()),
        HARNESS_RUN_LIMIT,
    );
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "codex exited {:?}\nstdout: {stdout}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

#[test]
fn codex_turns_extend_the_tree_through_the_responses_api() {
    let Some(codex) = harness_bin("GYRE_CODEX_BIN") else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/it/data/codex_script.jsonl");
    let log = dir.path().join("tito.log");
    let capture = dir.path().join("capture.jsonl");
    let proxy = start_proxy(&script, &log, &capture);
    let work = dir.path().join("work");
    let stdout = codex_exec(
        &codex,
        &proxy,
        dir.path(),
        "",
        "Create hello.txt and list the directory",
    );
    assert!(
        stdout.contains("\"text\":\"All done.\""),
        "the task did not finish: {stdout}"
    );
    assert_eq!(
        std::fs::read_to_string(work.join("hello.txt"))
            .expect("hello.txt written by the shell tool"),
        "café\n"
    );
    let records = records(&log);
    assert_eq!(records.len(), 3, "three model calls");
    assert_eq!(records[0].parent_call, None);
    // Reasoning is restored from its handle, so nothing of a turn is re-encoded.
    assert_each_turn_extends_the_whole_previous(&records);
    // Codex re-sends `input` with the previous items' bytes first.
    let (parsed, reused) = body_elements(&proxy);
    assert!(
        reused > 0,
        "input items reused {reused}, parsed {parsed}: bodies are parsed incrementally"
    );
    drop(proxy);

    // The same traffic through another proxy and engine: reasoning items whose
    // `encrypted_content` that proxy never issued, and function calls it did not make.
    let replayed = replay_through_another_proxy(&capture, dir.path());
    assert_eq!(replayed[0].parent_call, None);
    let all: Vec<&ModelCallRecord> = replayed.iter().collect();
    assert_turns_extend_previous_prompts(&all);
}

/// `codex exec --output-schema` (an evaluator's structured verdict) asks for the format in
/// `text.format`: the record keeps the schema Codex sent and says it was not enforced (Codex
/// offers tools, so the format is the final answer's, and the scripted engine has no grammar).
#[test]
fn codex_exec_with_an_output_schema_records_the_format_it_asked_for() {
    let Some(codex) = harness_bin("GYRE_CODEX_BIN") else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let verdict = r#"{"verdict":"pass","score":0.75}"#;
    let script = script_of(
        dir.path(),
        &[serde_json::json!({"agent": "main", "blocks": [{"type": "text", "text": verdict}]})],
    );
    let schema_file = dir.path().join("schema.json");
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "verdict": {"type": "string", "enum": ["pass", "fail"]},
            "score": {"type": "number"}
        },
        "required": ["verdict", "score"],
        "additionalProperties": false
    });
    std::fs::write(&schema_file, schema.to_string()).expect("schema file");
    let log = dir.path().join("tito.log");
    let capture = dir.path().join("capture.jsonl");
    let proxy = start_proxy(&script, &log, &capture);
    let config = format!(
        "model = \"gyre-test\"\nmodel_provider = \"gyre\"\n[model_providers.gyre]\nname = \"gyre\"\nbase_url = \"{}\"\nenv_key = \"GYRE_EXECUTION_KEY\"\nwire_api = \"responses\"\n",
        proxy.openai_base_url
    );
    let stdout = codex_run_with(
        &codex,
        &proxy,
        dir.path(),
        &config,
        &["--output-schema", utf8(&schema_file)],
        "Grade the repository.",
    );
    let escaped = serde_json::to_string(verdict).expect("a JSON string");
    assert!(
        stdout.contains(&escaped[1..escaped.len() - 1]),
        "Codex printed the verdict: {stdout}"
    );
    let records = records(&log);
    assert_eq!(records.len(), 1, "one model call");
    let constraint = records[0]
        .output_constraint
        .clone()
        .expect("the record keeps the format Codex asked for");
    assert!(
        !constraint.enforced,
        "tools were offered and the scripted engine has no grammar"
    );
    let recorded: serde_json::Value = serde_json::from_str(
        constraint
            .schema
            .as_deref()
            .expect("a schema, not any object"),
    )
    .expect("the recorded schema is JSON");
    assert_eq!(
        recorded["properties"]["verdict"]["enum"], schema["properties"]["verdict"]["enum"],
        "the schema Codex sent: {recorded}"
    );
    // The post-mortem counts it.
    let (code, report, stderr) = crate::support::gyre(&["replay", utf8(&log), "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&report).expect("JSON report");
    assert_eq!(report["model_calls"]["formatted"], 1, "{report}");
    assert_eq!(report["model_calls"]["formatted_enforced"], 0, "{report}");
    // The scripted engine has no grammar: no output was sampled under one.
    assert_eq!(
        report["model_calls"]["constrained_output_tokens"], 0,
        "{report}"
    );
}

/// Codex offers `gpt-5.5` its `apply_patch` as a freeform (`custom`) tool with a Lark grammar.
/// The policy's call of it (a patch adding a file whose text holds the tool-call end tag) must
/// reach Codex as a `custom_tool_call` Codex applies (a `function_call` it aborts as an
/// "incompatible payload"), and the next turn, with the call and its output in history, must
/// extend the first with the whole first context reused.
#[test]
fn codex_applies_a_patch_through_its_freeform_tool() {
    let Some(codex) = harness_bin("GYRE_CODEX_BIN") else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let patch =
        "*** Begin Patch\n*** Add File: hello.txt\n+caf\u{e9} </tool_call>\n*** End Patch\n";
    let script = script_of(
        dir.path(),
        &[
            serde_json::json!({"agent": "main", "blocks": [
                {"type": "text", "text": "Patching."},
                {"type": "tool_use", "name": "apply_patch", "input": {"input": patch}}]}),
            serde_json::json!({"agent": "main", "blocks": [{"type": "text", "text": "Patched."}]}),
        ],
    );
    let log = dir.path().join("tito.log");
    let capture = dir.path().join("capture.jsonl");
    let proxy = start_proxy(&script, &log, &capture);
    let stdout = codex_exec_as(
        &codex,
        &proxy,
        dir.path(),
        "gpt-5.5",
        "",
        "Create hello.txt",
    );
    assert!(
        stdout.contains("\"type\":\"file_change\"") && stdout.contains("\"text\":\"Patched.\""),
        "the patch was not applied: {stdout}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("work/hello.txt"))
            .expect("hello.txt written by apply_patch"),
        "caf\u{e9} </tool_call>\n"
    );
    let records = records(&log);
    assert_eq!(records.len(), 2, "two model calls");
    // The sampled patch call included.
    assert_each_turn_extends_the_whole_previous(&records);
}

/// Codex gives `gpt-5.5` its MCP tools only behind `tool_search`, a tool Codex runs itself.
/// The policy searches (a `tool_search_call` back to Codex, which answers with a
/// `tool_search_output` listing the MCP server's tools), calls the tool it found under its
/// qualified name (a `function_call` with `namespace: "mcp__wx"`), and Codex runs it on the MCP
/// server (`tests/it/data/mcp_weather.py`). Every turn extends the previous one whole.
#[test]
fn codex_finds_and_calls_an_mcp_tool_through_tool_search() {
    let Some(codex) = harness_bin("GYRE_CODEX_BIN") else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let script = script_of(
        dir.path(),
        &[
            serde_json::json!({"agent": "main", "blocks": [
                {"type": "text", "text": "Searching."},
                {"type": "tool_use", "name": "tool_search", "input": {"query": "weather"}}]}),
            serde_json::json!({"agent": "main", "blocks": [
                {"type": "tool_use", "name": "mcp__wx.lookup_weather", "input": {"city": "Z\u{fc}rich", "days": 2}}]}),
            serde_json::json!({"agent": "main", "blocks": [{"type": "text", "text": "It is sunny."}]}),
        ],
    );
    let server = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/it/data/mcp_weather.py");
    let log = dir.path().join("tito.log");
    let capture = dir.path().join("capture.jsonl");
    let proxy = start_proxy(&script, &log, &capture);
    let stdout = codex_exec_as(
        &codex,
        &proxy,
        dir.path(),
        "gpt-5.5",
        &format!(
            "[mcp_servers.wx]\ncommand = \"python3\"\nargs = [{}]\n",
            serde_json::Value::from(utf8(&server))
        ),
        "What is the weather in Zurich?",
    );
    assert!(
        stdout.contains("\"type\":\"mcp_tool_call\"")
            && stdout.contains("Sunny, 21 C in Z\u{fc}rich")
            && stdout.contains("\"text\":\"It is sunny.\""),
        "the MCP tool was not found and called: {stdout}"
    );
    let records = records(&log);
    assert_eq!(records.len(), 3, "three model calls");
    assert_each_turn_extends_the_whole_previous(&records);
}

/// The real Codex CLI through `/v1/responses` with two parallel shell calls, a sub-agent spawned
/// through Codex's `multi_agent_v1` namespace tool (shown to the model as
/// `multi_agent_v1.spawn_agent`, sent back as a `function_call` with `namespace`), and a forced
/// auto-compaction (`model_auto_compact_token_limit` 20000: the calls before the listings end
/// near 15.8K tokens; three parallel listings, each cut by Codex to ~10 KB, take its estimate
/// of the next context past the limit). Every main turn up to the compaction extends the previous one; the sub-agent (its
/// own `thread-id`, `x-openai-subagent`) is its own agent and root; the compaction request is
/// recorded as a summary (Codex sends it without tools, so its prompt parts from the
/// conversation's inside the system part and it is a root); the conversation after it restarts
/// from the original request and never hangs from the summary.
#[test]
fn codex_runs_parallel_tools_a_sub_agent_and_a_compaction() {
    let Some(codex) = harness_bin("GYRE_CODEX_BIN") else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/it/data/codex_sub_agent_compaction_script.jsonl");
    let log = dir.path().join("tito.log");
    let capture = dir.path().join("capture.jsonl");
    let proxy = start_proxy(&script, &log, &capture);
    let work = dir.path().join("work");
    let stdout = codex_exec(
        &codex,
        &proxy,
        dir.path(),
        "model_auto_compact_token_limit = 20000\n",
        "Write a.txt and b.txt, have a sub-agent write c.txt, then print a long listing",
    );
    assert!(
        stdout.contains("\"text\":\"All done.\""),
        "the task did not finish: {stdout}"
    );
    assert!(
        stdout.contains("\"tool\":\"spawn_agent\""),
        "Codex ran the namespaced spawn_agent call: {stdout}"
    );
    let read = |name: &str| std::fs::read_to_string(work.join(name)).expect(name);
    assert_eq!(read("a.txt"), "one\n");
    assert_eq!(read("b.txt"), "café\n");
    assert_eq!(
        read("c.txt"),
        "three\n",
        "written by the sub-agent's shell call"
    );

    let records = records(&log);
    let main: Vec<&ModelCallRecord> = records.iter().filter(|r| r.agent == "main").collect();
    let sub: Vec<&ModelCallRecord> = records.iter().filter(|r| r.agent != "main").collect();
    // The main agent up to the compaction: every turn extends the previous one completely (the
    // parallel calls' outputs and the spawn_agent output included).
    let summary_at = main
        .iter()
        .position(|r| r.kind == CallKind::Summary)
        .expect("the compaction request was recorded as a summary");
    assert!(summary_at >= 4, "the compaction came after the tool turns");
    assert_eq!(main[0].parent_call, None);
    for pair in main[..summary_at].windows(2) {
        assert_eq!(
            pair[1].parent_call,
            Some(pair[0].call),
            "call {}",
            pair[1].call
        );
        assert_eq!(
            pair[1].reused_prefix_tokens_count,
            path_end(pair[0]),
            "call {} reuses the whole previous context",
            pair[1].call
        );
    }
    // Codex drops the tools from its compaction request: a summary root.
    assert_eq!(main[summary_at].parent_call, None);
    // After the compaction the conversation restarts from the original request (a branch inside
    // the first call's prompt), never from the summary.
    let after = main
        .get(summary_at + 1)
        .expect("a call after the compaction");
    assert_eq!(after.kind, CallKind::Turn);
    let first_prompt_end = main[0].reused_prefix_tokens_count + main[0].input_ids.len() as u64;
    assert!(
        after.parent_call.is_none() || after.parent_call == Some(main[0].call),
        "the post-compaction call hangs from {:?}",
        after.parent_call
    );
    assert!(after.reused_prefix_tokens_count <= first_prompt_end);
    // The sub-agent: its own agent, its own root, spawned by a main call, turns extending.
    assert!(
        sub.len() >= 2,
        "the sub-agent made its calls: {}",
        sub.len()
    );
    assert!(sub
        .iter()
        .all(|r| r.agent == sub[0].agent && r.agent.starts_with("sub:")));
    assert_eq!(sub[0].parent_call, None);
    assert_eq!(
        sub[0].spawned_by,
        Some(main[1].call),
        "spawned by the call that called spawn_agent"
    );
    for pair in sub.windows(2) {
        assert_eq!(pair[1].parent_call, Some(pair[0].call));
        assert_eq!(pair[1].reused_prefix_tokens_count, path_end(pair[0]));
    }
    drop(proxy);
    // The namespaced call went out with its namespace and came back in the history with it.
    let captured = std::fs::read_to_string(&capture).expect("capture");
    // Codex also marks its compaction call outside the body (what `compaction_requested` reads).
    assert!(
        captured.contains(r#"\"request_kind\":\"compaction\""#),
        "the compaction call's x-codex-turn-metadata says request_kind compaction"
    );
    assert!(
        captured.contains(r#"\"namespace\":\"multi_agent_v1\""#),
        "the history echoes the call's namespace"
    );
}

/// Codex pointed at OpenAI's own provider (`openai_base_url`, no custom provider) talks to the
/// proxy over the Responses WebSocket: a `"generate": false` warm-up opens each conversation,
/// every later turn sends only its new items with `previous_response_id`, and its compaction is
/// the server-side kind (a `compaction_trigger` item answered by a `compaction` item that the
/// next request sends back in place of the history). The run must finish; the warm-ups must not
/// be recorded; the tree must look as it does over HTTP.
#[test]
fn codex_over_its_websocket_chains_turns_and_compacts_on_the_server() {
    let Some(codex) = harness_bin("GYRE_CODEX_BIN") else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/it/data/codex_sub_agent_compaction_script.jsonl");
    let log = dir.path().join("tito.log");
    let capture = dir.path().join("capture.jsonl");
    let proxy = start_proxy(&script, &log, &capture);
    let work = dir.path().join("work");
    let config = format!(
        "model = \"gyre-test\"\nmodel_auto_compact_token_limit = 20000\nopenai_base_url = \"{}\"\n",
        proxy.openai_base_url
    );
    let stdout = codex_run(
        &codex,
        &proxy,
        dir.path(),
        &config,
        "Write a.txt and b.txt, have a sub-agent write c.txt, then print a long listing",
    );
    assert!(
        stdout.contains("\"text\":\"All done.\""),
        "the task did not finish: {stdout}"
    );
    assert!(
        !stdout.contains("Falling back from WebSockets"),
        "Codex stayed on the WebSocket: {stdout}"
    );
    let read = |name: &str| std::fs::read_to_string(work.join(name)).expect(name);
    assert_eq!(read("a.txt"), "one\n");
    assert_eq!(read("b.txt"), "café\n");
    assert_eq!(read("c.txt"), "three\n");
    drop(proxy);

    let captured = std::fs::read_to_string(&capture).expect("capture");
    let requests: Vec<serde_json::Value> = captured
        .lines()
        .map(|line| serde_json::from_str(line).expect("capture line"))
        .collect();
    let body = |request: &serde_json::Value| -> serde_json::Value {
        match &request["body"] {
            serde_json::Value::String(text) => serde_json::from_str(text).expect("body"),
            other => other.clone(),
        }
    };
    let warmups = requests
        .iter()
        .filter(|request| body(request)["generate"] == serde_json::json!(false))
        .count();
    assert!(
        warmups >= 2,
        "a warm-up per conversation (main and sub-agent): {warmups}"
    );
    let chained = captured.matches("x-gyre-previous-response-id").count();
    assert!(
        chained >= 4,
        "turns continue the previous response over the socket: {chained}"
    );
    let last_types = |request: &serde_json::Value| -> Vec<String> {
        body(request)["input"]
            .as_array()
            .expect("input")
            .iter()
            .map(|item| item["type"].as_str().unwrap_or("message").to_string())
            .collect()
    };
    let trigger_at = requests
        .iter()
        .position(|request| {
            last_types(request).last().map(String::as_str) == Some("compaction_trigger")
        })
        .expect("Codex asked the server to compact");
    let after = &requests[trigger_at + 1];
    assert!(
        last_types(after).iter().any(|kind| kind == "compaction")
            && body(after).to_string().contains("gyre-compaction-v1."),
        "the next request carries the compaction item the proxy answered"
    );

    let records = records(&log);
    assert_eq!(
        records.len(),
        requests.len() - warmups,
        "every call but the warm-ups is recorded"
    );
    let main: Vec<&ModelCallRecord> = records.iter().filter(|r| r.agent == "main").collect();
    let sub: Vec<&ModelCallRecord> = records.iter().filter(|r| r.agent != "main").collect();
    let summary_at = main
        .iter()
        .position(|r| r.kind == CallKind::Summary)
        .expect("the compaction call was recorded as a summary");
    assert!(summary_at >= 4, "the compaction came after the tool turns");
    assert_eq!(main[0].parent_call, None);
    // Every main turn, the compaction call included, extends the previous context completely:
    // the socket's chained requests expand to the same conversation a stateless client sends.
    for pair in main[..=summary_at].windows(2) {
        assert_eq!(
            pair[1].parent_call,
            Some(pair[0].call),
            "call {}",
            pair[1].call
        );
        assert_eq!(
            pair[1].reused_prefix_tokens_count,
            path_end(pair[0]),
            "call {} reuses the whole previous context",
            pair[1].call
        );
    }
    // After the compaction the conversation restarts from the summary: not an extension of
    // the compaction call.
    let next = main
        .get(summary_at + 1)
        .expect("a call after the compaction");
    assert_eq!(next.kind, CallKind::Turn);
    assert!(next.reused_prefix_tokens_count < path_end(main[summary_at]));
    assert!(
        sub.len() >= 2,
        "the sub-agent made its calls: {}",
        sub.len()
    );
    assert_eq!(sub[0].parent_call, None);
    for pair in sub.windows(2) {
        assert_eq!(pair[1].parent_call, Some(pair[0].call));
        assert_eq!(pair[1].reused_prefix_tokens_count, path_end(pair[0]));
    }
}

/// Claude Code finishes a task through proxy A, A is killed with SIGKILL, proxy B starts on the
/// same port and event file, and `claude --continue` carries on the conversation: B accepts the
/// credential A issued and resolves the thinking signature and tool-use id A minted to the
/// exact tokens A sampled (Claude Code re-sends the tool input with its keys reordered), so the
/// first call after the crash extends the tree recorded before it.
#[test]
fn claude_code_continues_its_conversation_after_the_proxy_is_killed() {
    let Some(claude) = harness_bin("GYRE_CLAUDE_BIN") else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let before = dir.path().join("before.jsonl");
    let after = dir.path().join("after.jsonl");
    let line = |blocks: serde_json::Value| {
        serde_json::json!({"agent": "main", "blocks": blocks}).to_string() + "\n"
    };
    std::fs::write(
        &before,
        line(serde_json::json!([
            {"type": "thinking", "thinking": "Write the file, then say so."},
            {"type": "tool_use", "name": "Write", "input": {"file_path": "note.txt", "content": "über\n"}}
        ])) + &line(serde_json::json!([{"type": "text", "text": "Wrote note.txt."}])),
    )
    .expect("script");
    std::fs::write(
        &after,
        line(serde_json::json!([
            {"type": "tool_use", "name": "Bash", "input": {"command": "cat note.txt", "description": "Show the note"}}
        ])) + &line(serde_json::json!([{"type": "text", "text": "All done."}])),
    )
    .expect("script");
    let log = dir.path().join("tito.log");
    let work = dir.path().join("work");
    let home = dir.path().join("home");
    std::fs::create_dir_all(&work).expect("work dir");
    std::fs::create_dir_all(&home).expect("home dir");
    let run = |proxy: &Proxy, args: &[&str], result: &str| {
        let mut command = claude_command(&claude, &work, &home, proxy);
        command.args(args).args([
            "--dangerously-skip-permissions",
            "--model",
            "gyre-test",
            "--output-format",
            "stream-json",
            "--verbose",
        ]);
        let stdout = claude_stdout(command);
        assert!(
            stdout.contains(&format!("\"result\":\"{result}\"")),
            "the task did not end with {result:?}: {}",
            &stdout[stdout.len().saturating_sub(3000)..]
        );
    };

    let capture = dir.path().join("capture.jsonl");
    let mut proxy = start_proxy(&before, &log, &capture);
    run(&proxy, &["-p", "Write note.txt"], "Wrote note.txt.");
    let before_crash = records(&log);
    assert_eq!(before_crash.len(), 2, "two calls before the crash");
    proxy.process.kill();

    let port = proxy
        .process
        .address
        .rsplit(':')
        .next()
        .expect("a port")
        .to_string();
    let listen = format!("127.0.0.1:{port}");
    let mut restarted = ProxyProcess::start(&[
        "--listen",
        &listen,
        "--script",
        utf8(&after),
        "--log",
        utf8(&log),
    ]);
    assert_eq!(
        restarted.address, listen,
        "the same port as before the crash"
    );
    let recovered = restarted.next_json();
    assert_eq!(
        recovered["recovered"]["executions_resumed"], 1,
        "{recovered}"
    );
    assert_eq!(recovered["recovered"]["calls_recovered"], 2, "{recovered}");
    proxy.process = restarted;
    run(&proxy, &["--continue", "-p", "Now show it"], "All done.");

    let records = records(&log);
    assert_eq!(records.len(), 4, "two calls after the restart");
    let last_before = &before_crash[1];
    let first_after = &records[2];
    assert_eq!(
        first_after.parent_call,
        Some(last_before.call),
        "the first call after the crash extends the last one before it"
    );
    assert_eq!(
        first_after.reused_prefix_tokens_count,
        path_end(last_before),
        "it reuses the whole conversation before the crash, thinking and tool call included"
    );
}

/// What a run of an Agents SDK driver left: its stdout, the requests the proxy captured (each
/// with its body parsed), and the TITO records.
struct AgentsRun {
    stdout: String,
    captured: Vec<serde_json::Value>,
    records: Vec<ModelCallRecord>,
}

/// A request the capture holds, its body parsed (the capture keeps a body as a string).
fn captured_body(record: &serde_json::Value) -> serde_json::Value {
    match &record["body"] {
        serde_json::Value::String(text) => serde_json::from_str(text).expect("body JSON"),
        other => other.clone(),
    }
}

/// Runs the Agents SDK driver `tests/it/data/<driver>` with `python` against a proxy scripted
/// with `lines`: the driver gets the proxy's base URL, its credential and then `extra`, and
/// must exit 0.
fn run_agents_driver(
    python: &Path,
    dir: &Path,
    driver: &str,
    lines: &[serde_json::Value],
    extra: &[&Path],
) -> AgentsRun {
    let script = script_of(dir, lines);
    let log = dir.join("tito.log");
    let capture = dir.join("capture.jsonl");
    let proxy = start_proxy(&script, &log, &capture);
    let driver = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/it/data")
        .join(driver);
    let mut command = Command::new(python);
    command
        .arg(&driver)
        .arg(&proxy.openai_base_url)
        .arg(&proxy.token)
        .args(extra)
        .env("OPENAI_AGENTS_DISABLE_TRACING", "1");
    let output = crate::support::output_within(&mut command, HARNESS_RUN_LIMIT);
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "the Agents SDK run failed ({:?})\nstdout: {stdout}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    drop(proxy);
    let captured = std::fs::read_to_string(&capture)
        .expect("capture")
        .lines()
        .map(|line| serde_json::from_str(line).expect("a capture record"))
        .collect();
    AgentsRun {
        stdout,
        captured,
        records: records(&log),
    }
}

/// The OpenAI Agents SDK (`openai-agents`, pinned in `.ci/run`), a Responses client that
/// chains with `previous_response_id` instead of re-sending the conversation: a run with a
/// function tool (the SDK sends the tool's output alone, naming the response that called it)
/// and a second run continuing the first. Both finish, the requests after the first name the
/// response they continue, and every call extends the previous one with its whole context
/// reused: one root, nothing re-encoded.
#[test]
fn openai_agents_sdk_chains_responses_with_previous_response_id() {
    let Some(python) = harness_bin("GYRE_AGENTS_PYTHON") else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let run = run_agents_driver(
        &python,
        dir.path(),
        "openai_agents_chain.py",
        &[
            serde_json::json!({"agent": "main", "blocks": [
                {"type": "thinking", "thinking": "The weather tool knows."},
                {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}}]}),
            serde_json::json!({"agent": "main", "blocks": [{"type": "text", "text": "It is sunny in Paris."}]}),
            serde_json::json!({"agent": "main", "blocks": [{"type": "text", "text": "You are welcome."}]}),
        ],
        &[],
    );
    let stdout = &run.stdout;
    assert!(stdout.contains("FIRST: It is sunny in Paris."), "{stdout}");
    assert!(stdout.contains("SECOND: You are welcome."), "{stdout}");
    let captured = &run.captured;
    assert_eq!(captured.len(), 3, "three model calls");
    // A chained request is captured expanded (as a stateless client sends it, so the
    // capture replays anywhere), noting the response it continued.
    let continued = |record: &serde_json::Value| {
        record["headers"]["x-gyre-previous-response-id"]
            .as_str()
            .map(str::to_string)
    };
    assert_eq!(continued(&captured[0]), None);
    for (n, record) in captured.iter().enumerate().skip(1) {
        assert!(
            continued(record).is_some_and(|id| id.starts_with("resp_")),
            "the SDK chains: {record}"
        );
        let body = captured_body(record);
        assert!(body.get("previous_response_id").is_none(), "{body}");
        assert!(
            body["input"].as_array().map(Vec::len) > Some(n),
            "the whole conversation so far: {body}"
        );
    }
    assert_eq!(run.records.len(), 3, "three model calls");
    assert_eq!(run.records[0].parent_call, None);
    assert_each_turn_extends_the_whole_previous(&run.records);
}

/// The OpenAI Agents SDK's typed client-run tools, `ShellTool` and `ApplyPatchTool` (the
/// Responses API's `shell` and `apply_patch`, GPT-5.1's): the model's calls reach the SDK as
/// `shell_call` and `apply_patch_call` items it runs (a real shell command, a file created
/// and then updated with the SDK's own V4A diff code), the SDK sends its
/// `shell_call_output` and `apply_patch_call_output` items back in the whole conversation,
/// and every call extends the previous one with its whole context reused: one root, nothing
/// re-encoded.
#[test]
fn openai_agents_sdk_runs_the_shell_and_apply_patch_tools() {
    let Some(python) = harness_bin("GYRE_AGENTS_PYTHON") else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let workdir = dir.path().join("repo");
    std::fs::create_dir(&workdir).expect("workdir");
    std::fs::write(workdir.join("a.txt"), "hello\n").expect("a.txt");
    let run = run_agents_driver(
        &python,
        dir.path(),
        "openai_agents_tools.py",
        &[
            serde_json::json!({"agent": "main", "blocks": [
                {"type": "thinking", "thinking": "Read the greeting first."},
                {"type": "tool_use", "id": "t1", "name": "shell", "input": {"commands": ["cat a.txt"]}}]}),
            serde_json::json!({"agent": "main", "blocks": [
                {"type": "tool_use", "id": "t2", "name": "apply_patch",
                 "input": {"type": "create_file", "path": "b.txt", "diff": "+hello\n"}}]}),
            serde_json::json!({"agent": "main", "blocks": [
                {"type": "tool_use", "id": "t3", "name": "apply_patch",
                 "input": {"type": "update_file", "path": "b.txt", "diff": "@@\n-hello\n+Hello\n"}}]}),
            serde_json::json!({"agent": "main", "blocks": [{"type": "text", "text": "Done."}]}),
        ],
        &[&workdir],
    );
    for line in [
        "SHELL: cat a.txt",
        "CREATE: b.txt",
        "UPDATE: b.txt",
        "FINAL: Done.",
    ] {
        assert!(run.stdout.contains(line), "{line}: {}", run.stdout);
    }
    // (The SDK's V4A code writes a created file without its last newline.)
    assert_eq!(
        std::fs::read_to_string(workdir.join("b.txt"))
            .expect("b.txt")
            .trim_end(),
        "Hello",
        "the SDK applied both patches"
    );
    assert_eq!(run.captured.len(), 4, "four model calls");
    let first = captured_body(&run.captured[0]);
    let tool_types: Vec<&str> = first["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|tool| tool["type"].as_str())
        .collect();
    assert_eq!(tool_types, ["shell", "apply_patch"], "{first}");
    // The SDK's own output items come back: the command's stdout and exit, each patch's status.
    let last = captured_body(&run.captured[3]);
    let items = last["input"].as_array().expect("input");
    let of_type = |kind: &str| -> Vec<&serde_json::Value> {
        items.iter().filter(|item| item["type"] == kind).collect()
    };
    let shell_outputs = of_type("shell_call_output");
    assert_eq!(shell_outputs.len(), 1, "{last}");
    assert_eq!(shell_outputs[0]["output"][0]["stdout"], "hello\n", "{last}");
    // The SDK's default outcome: an exit without a code, read as such (not a 400).
    assert_eq!(
        shell_outputs[0]["output"][0]["outcome"],
        serde_json::json!({"type": "exit", "exit_code": null}),
        "{last}"
    );
    assert_eq!(of_type("apply_patch_call").len(), 2, "{last}");
    let patch_outputs = of_type("apply_patch_call_output");
    assert_eq!(patch_outputs.len(), 2, "{last}");
    assert!(
        patch_outputs
            .iter()
            .all(|item| item["status"] == "completed"),
        "{last}"
    );
    assert_eq!(run.records.len(), 4, "four model calls");
    assert_eq!(run.records[0].parent_call, None);
    assert_each_turn_extends_the_whole_previous(&run.records);
}

/// The Agents SDK on its Chat Completions model (`OpenAIChatCompletionsModel`) and the OpenAI
/// SDK's own Chat streaming helper, through `/v1/chat/completions` (driver
/// `tests/it/data/openai_agents_chat.py`): a streamed run whose answer calls two function
/// tools in parallel after reasoning, a run with a structured `output_type`, and
/// `client.chat.completions.stream` with a strict tool whose arguments it parses. Every
/// client finishes with what the script answered; the SDK sends the tool-calling answer back
/// without its `reasoning_content`, and the proxy still extends it: the second call reuses the
/// first's whole context, the two other conversations are roots of their own.
#[test]
fn openai_agents_sdk_runs_over_chat_completions() {
    let Some(python) = harness_bin("GYRE_AGENTS_PYTHON") else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let run = run_agents_driver(
        &python,
        dir.path(),
        "openai_agents_chat.py",
        &[
            serde_json::json!({"agent": "main", "blocks": [
                {"type": "thinking", "thinking": "Both tools know."},
                {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "t2", "name": "get_time", "input": {"city": "Paris"}}]}),
            serde_json::json!({"agent": "main", "blocks": [
                {"type": "text", "text": "Sunny, and it is noon."}]}),
            serde_json::json!({"agent": "main", "blocks": [
                {"type": "text", "text": "{\"city\": \"Rome\", \"sunny\": true}"}]}),
            serde_json::json!({"agent": "main", "blocks": [
                {"type": "tool_use", "id": "t3", "name": "lookup", "input": {"city": "Oslo"}}]}),
        ],
        &[],
    );
    for line in [
        "TOOL: get_weather Paris",
        "TOOL: get_time Paris",
        "STREAMED TEXT: Sunny, and it is noon.",
        "STREAMED FINAL: Sunny, and it is noon.",
        "STRUCTURED: Forecast city=Rome sunny=True",
        "HELPER: finish=tool_calls call=lookup parsed=Lookup(Oslo)",
    ] {
        assert!(run.stdout.contains(line), "{line}: {}", run.stdout);
    }
    assert_eq!(run.captured.len(), 4, "four model calls");
    let bodies: Vec<serde_json::Value> = run.captured.iter().map(captured_body).collect();
    assert_eq!(bodies[0]["stream"], true, "{}", bodies[0]);
    assert_eq!(
        bodies[2]["response_format"]["type"], "json_schema",
        "{}",
        bodies[2]
    );
    // The tool-calling answer as the SDK sends it back: both calls, no reasoning.
    let answer = &bodies[1]["messages"][2];
    assert_eq!(answer["role"], "assistant", "{answer}");
    assert_eq!(
        answer["tool_calls"].as_array().map(Vec::len),
        Some(2),
        "{answer}"
    );
    assert!(answer.get("reasoning_content").is_none(), "{answer}");
    assert_eq!(run.records.len(), 4, "four model calls");
    let (c0, c1) = (&run.records[0], &run.records[1]);
    assert_eq!(c0.parent_call, None);
    assert_eq!(c1.parent_call, Some(c0.call));
    assert_eq!(
        c1.reused_prefix_tokens_count,
        (c0.input_ids.len() + c0.output_ids.len()) as u64,
        "the second call extends the first's whole context, its reasoning included"
    );
    assert_eq!(
        run.records[2].parent_call, None,
        "a conversation of its own"
    );
    assert_eq!(
        run.records[3].parent_call, None,
        "a conversation of its own"
    );
}

/// LiteLLM's SDK (`litellm.completion`, pinned in `scripts/anchors.sh`), the model client of
/// SWE-agent, mini-swe-agent and OpenHands, as a harness's client (driver
/// `tests/it/data/litellm_client.py`): a tool loop through `/v1/chat/completions`, one through
/// `/v1/messages` with extended thinking, and the same streamed, each sending LiteLLM's own
/// answer message back. Each loop's second call extends its first whole (LiteLLM sends the
/// reasoning back, as `reasoning_content` or as signed `thinking` blocks) — except where
/// LiteLLM itself edits the answer: the streamed tool call comes back with a text block LiteLLM
/// inserts for the empty content its chunk builder made, so that call hangs from the answer's
/// prompt and encodes the answer again, as `gyre replay` then counts.
#[test]
fn litellm_sdk_drives_tool_loops_through_chat_and_messages() {
    let Some(python) = harness_bin("GYRE_LITELLM_PYTHON") else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let tool_call = |city: &str| {
        serde_json::json!({"agent": "main", "blocks": [
            {"type": "thinking", "thinking": "The weather tool knows."},
            {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": city}}]})
    };
    let answer = |text: &str| serde_json::json!({"agent": "main", "blocks": [{"type": "text", "text": text}]});
    let run = run_agents_driver(
        &python,
        dir.path(),
        "litellm_client.py",
        &[
            tool_call("Paris"),
            answer("Sunny."),
            tool_call("Oslo"),
            answer("Rainy."),
            tool_call("Rome"),
            answer("Warm."),
        ],
        &[],
    );
    for line in [
        "chat: finish=tool_calls content=None reasoning='The weather tool knows.'",
        "chat: finish=stop content='Sunny.'",
        "messages: finish=tool_calls content=None reasoning='The weather tool knows.'",
        "messages: finish=stop content='Rainy.'",
        "messages-streamed: finish=tool_calls",
        "messages-streamed: finish=stop content='Warm.'",
    ] {
        assert!(run.stdout.contains(line), "{line}: {}", run.stdout);
    }
    assert_eq!(run.captured.len(), 6, "six model calls");
    let bodies: Vec<serde_json::Value> = run.captured.iter().map(captured_body).collect();
    // What LiteLLM sends back: the reasoning in each API's form.
    assert_eq!(
        bodies[1]["messages"][1]["reasoning_content"], "The weather tool knows.",
        "{}",
        bodies[1]
    );
    assert_eq!(
        bodies[3]["messages"][1]["content"][0]["type"], "thinking",
        "{}",
        bodies[3]
    );
    assert_eq!(bodies[4]["stream"], true, "{}", bodies[4]);
    let records = &run.records;
    assert_eq!(records.len(), 6, "six model calls");
    // A call's whole context: what it reused, its new input and its answer.
    let whole = |record: &ModelCallRecord| {
        record.reused_prefix_tokens_count
            + (record.input_ids.len() + record.output_ids.len()) as u64
    };
    for pair in [0, 2] {
        let (call, next) = (&records[pair], &records[pair + 1]);
        assert_eq!(next.parent_call, Some(call.call), "call {}", pair + 1);
        assert_eq!(
            next.reused_prefix_tokens_count,
            whole(call),
            "call {} extends call {} whole",
            pair + 1,
            pair
        );
    }
    // The streamed answer as LiteLLM sends it back: a text block of its own before the call.
    let streamed_back = &bodies[5]["messages"][1]["content"];
    let kinds: Vec<&str> = streamed_back
        .as_array()
        .expect("content blocks")
        .iter()
        .filter_map(|block| block["type"].as_str())
        .collect();
    assert_eq!(kinds, ["thinking", "text", "tool_use"], "{streamed_back}");
    assert!(
        records[5].reused_prefix_tokens_count < whole(&records[4]),
        "LiteLLM's edit makes the last call encode the answer again"
    );
}

/// Claude Code with Message Threads on (`CLAUDE_CODE_TETHER_LIVE=1`, its "tether"): the first
/// request of a conversation asks the server to hold it (`thread: create`) and each later one
/// sends only the new turn (`thread: continue`). The proxy holds the thread and serves each
/// continue as the whole conversation: the run ends as scripted with one request per turn
/// (none refused and sent again), the capture keeps each continue expanded (no `thread`,
/// naming the response it continued), and every call extends the one before it whole.
#[test]
fn claude_code_with_message_threads_continues_each_turn_on_the_proxy() {
    let Some(claude) = harness_bin("GYRE_CLAUDE_BIN") else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let script = script_of(
        dir.path(),
        &[
            serde_json::json!({"agent": "main", "blocks": [
                {"type": "tool_use", "name": "Bash", "input": {"command": "echo one", "description": "First"}}]}),
            serde_json::json!({"agent": "main", "blocks": [
                {"type": "tool_use", "name": "Bash", "input": {"command": "echo two", "description": "Second"}}]}),
            serde_json::json!({"agent": "main", "blocks": [{"type": "text", "text": "Both ran."}]}),
        ],
    );
    let log = dir.path().join("tito.log");
    let capture = dir.path().join("capture.jsonl");
    let work = dir.path().join("work");
    let home = dir.path().join("home");
    std::fs::create_dir_all(&work).expect("work dir");
    std::fs::create_dir_all(&home).expect("home dir");
    let proxy = start_proxy(&script, &log, &capture);
    let mut command = claude_command(&claude, &work, &home, &proxy);
    command.env("CLAUDE_CODE_TETHER_LIVE", "1").args([
        "-p",
        "Run the two commands.",
        "--dangerously-skip-permissions",
        "--model",
        "gyre-test",
        "--output-format",
        "stream-json",
        "--verbose",
    ]);
    let stdout = claude_stdout(command);
    assert!(
        stdout.contains("\"result\":\"Both ran.\""),
        "{}",
        &stdout[stdout.len().saturating_sub(3000)..]
    );
    drop(proxy);
    let captured: Vec<serde_json::Value> = std::fs::read_to_string(&capture)
        .expect("capture")
        .lines()
        .map(|line| serde_json::from_str(line).expect("a capture record"))
        .collect();
    // The main conversation's requests (Claude Code's side calls carry no thread).
    let main: Vec<&serde_json::Value> = captured
        .iter()
        .filter(|record| {
            captured_body(record).get("thread").is_some()
                || record["headers"]["x-gyre-previous-message-id"].is_string()
        })
        .collect();
    assert_eq!(main.len(), 3, "one request per turn");
    assert_eq!(
        captured_body(main[0])["thread"]["type"],
        "create",
        "{}",
        main[0]
    );
    let messages = |record: &serde_json::Value| {
        captured_body(record)["messages"]
            .as_array()
            .map_or(0, Vec::len)
    };
    for pair in main.windows(2) {
        assert!(
            pair[1]["headers"]["x-gyre-previous-message-id"].is_string(),
            "a continue, captured expanded: {}",
            pair[1]
        );
        assert!(captured_body(pair[1]).get("thread").is_none());
        assert_eq!(
            messages(pair[1]),
            messages(pair[0]) + 2,
            "the whole conversation: the answer and the tool result added"
        );
    }
    let records = records(&log);
    assert_eq!(records.len(), 3, "three model calls");
    assert_eq!(records[0].parent_call, None);
    assert_each_turn_extends_the_whole_previous(&records);
}

/// Runs opencode's `command` to its end and stops `proxy`: the run must exit 0 having said
/// "All done here." (the script's last line).
fn opencode_to_its_end(mut command: Command, proxy: &mut Proxy, provider: &str) {
    let output = crate::support::output_within(&mut command, HARNESS_RUN_LIMIT);
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    proxy.process.kill();
    assert!(
        output.status.success() && stdout.contains("All done here."),
        "{provider}: opencode exited {:?}\nstdout: {stdout}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
}

/// opencode's work tree and HOME under `dir`. Its project is the git work tree it runs in;
/// outside one, every path asks for a permission `opencode run` refuses.
fn opencode_dirs(dir: &Path) -> (PathBuf, PathBuf) {
    let (work, home) = (dir.join("work"), dir.join("home"));
    std::fs::create_dir_all(&work).expect("work dir");
    std::fs::create_dir_all(&home).expect("home dir");
    let git = Command::new("git")
        .args(["init", "-q"])
        .current_dir(&work)
        .status()
        .expect("git runs");
    assert!(git.success(), "git init");
    (work, home)
}

/// opencode's config at `config`: `provider` (`anthropic`: Messages, else `openai`: Responses)
/// pointed at `proxy`'s execution; `limit`, the model's context and output window in tokens
/// (opencode compacts a session whose last call came near the context's end; the input
/// limit is set to their difference too, as its bundled model list gives `gpt-5` one of its
/// own that would otherwise stand).
fn write_opencode_config(config: &Path, provider: &str, proxy: &Proxy, limit: Option<(u32, u32)>) {
    let (base_url, model_id) = match provider {
        "anthropic" => (
            format!("{}/v1", proxy.anthropic_base_url),
            "claude-sonnet-4-5",
        ),
        _ => (proxy.openai_base_url.clone(), "gpt-5"),
    };
    let mut settings = serde_json::json!({
        "$schema": "https://opencode.ai/config.json",
        "provider": {provider: {"options": {"baseURL": base_url, "apiKey": proxy.token}}},
        "model": format!("{provider}/{model_id}"),
        "small_model": format!("{provider}/{model_id}"),
        "autoupdate": false,
        "share": "disabled",
    });
    if let Some((context, output)) = limit {
        settings["provider"][provider]["models"] = serde_json::json!({model_id: {"limit": {
            "context": context, "input": context - output, "output": output}}});
    }
    std::fs::write(config, settings.to_string()).expect("opencode.json");
}

/// `opencode run PROMPT` in `work` with a scratch `home`. A title is given, so opencode asks
/// no model for one and the script's order is the run's.
fn opencode_run(opencode: &Path, work: &Path, home: &Path, config: &Path, prompt: &str) -> Command {
    let mut command = Command::new(opencode);
    command
        .current_dir(work)
        // opencode takes its project directory from `PWD`, which a child inherits unchanged
        // from this process.
        .env("PWD", work)
        .env("HOME", home)
        .env_remove("XDG_CONFIG_HOME")
        .env_remove("XDG_DATA_HOME")
        .env_remove("XDG_CACHE_HOME")
        .env_remove("XDG_STATE_HOME")
        .env("OPENCODE_CONFIG", config)
        // Nothing but the model calls: no model list, plugins or language servers fetched.
        .env("OPENCODE_DISABLE_MODELS_FETCH", "1")
        .env("OPENCODE_DISABLE_DEFAULT_PLUGINS", "1")
        .env("OPENCODE_DISABLE_LSP_DOWNLOAD", "1")
        .env("OPENCODE_DISABLE_CLAUDE_CODE", "1")
        .env("OPENCODE_DISABLE_AUTOUPDATE", "1")
        .args(["run", "--title", "gyre harness test", prompt]);
    command
}

/// opencode (`opencode-ai`, pinned in `.ci/run`), an open-source coding agent built on the
/// Vercel AI SDK, through the proxy twice: with its Anthropic provider (`/v1/messages`,
/// extended thinking) and with its OpenAI provider (`/v1/responses`, `store: false` with
/// encrypted reasoning). Each run delegates to a sub-agent (its `task` tool), which writes a
/// file with `bash`; the main agent then calls two tools in parallel and ends. The run exits 0
/// having done the work, the sub-agent's calls are their own agent (opencode marks them with
/// `x-parent-session-id`) and their own root, and each agent's every call extends its previous
/// one whole (nothing of a turn encoded again).
#[test]
fn opencode_runs_a_sub_agent_and_parallel_tools_over_messages_and_responses() {
    let Some(opencode) = harness_bin("GYRE_OPENCODE_BIN") else {
        return;
    };
    for provider in ["anthropic", "openai"] {
        let dir = tempfile::tempdir().expect("temp dir");
        let (work, home) = opencode_dirs(dir.path());
        let config = work.join("opencode.json");
        let line = |agent: &str, blocks: serde_json::Value| serde_json::json!({"agent": agent, "blocks": blocks});
        let script = script_of(
            dir.path(),
            &[
                line(
                    "main",
                    serde_json::json!([
                        {"type": "thinking", "thinking": "A sub-agent can write it."},
                        {"type": "tool_use", "name": "task", "input": {
                            "description": "Write the file",
                            "prompt": "Write hello.txt with bash.",
                            "subagent_type": "general"}}]),
                ),
                line(
                    "sub",
                    serde_json::json!([{"type": "tool_use", "name": "bash", "input": {
                        "command": "echo hello > hello.txt", "description": "Write hello.txt"}}]),
                ),
                line(
                    "sub",
                    serde_json::json!([{"type": "text", "text": "Wrote hello.txt."}]),
                ),
                line(
                    "main",
                    serde_json::json!([
                        {"type": "text", "text": "Checking it."},
                        {"type": "tool_use", "name": "bash", "input": {
                            "command": "cat hello.txt", "description": "Show hello.txt"}},
                        {"type": "tool_use", "name": "read", "input": {
                            "filePath": utf8(&config)}}]),
                ),
                line(
                    "main",
                    serde_json::json!([{"type": "text", "text": "All done here."}]),
                ),
            ],
        );
        let log = dir.path().join("tito.log");
        let capture = dir.path().join("capture.jsonl");
        let mut proxy = start_proxy(&script, &log, &capture);
        write_opencode_config(&config, provider, &proxy, None);
        opencode_to_its_end(
            opencode_run(&opencode, &work, &home, &config, "Write hello.txt."),
            &mut proxy,
            provider,
        );
        assert_eq!(
            std::fs::read_to_string(work.join("hello.txt"))
                .ok()
                .as_deref(),
            Some("hello\n"),
            "{provider}: the sub-agent's bash call ran"
        );
        let records = records(&log);
        let agents: Vec<&str> = records.iter().map(|r| r.agent.as_str()).collect();
        assert_eq!(agents.len(), 5, "{provider}: {agents:?}");
        let sub = agents[1];
        assert!(sub.starts_with("sub:ses_"), "{provider}: {agents:?}");
        assert_eq!(
            agents,
            ["main", sub, sub, "main", "main"],
            "{provider}: the sub-agent's calls are its own"
        );
        let of = |agent: &str| -> Vec<ModelCallRecord> {
            records
                .iter()
                .filter(|r| r.agent == agent)
                .cloned()
                .collect()
        };
        for calls in [of("main"), of(sub)] {
            assert_eq!(
                calls[0].parent_call, None,
                "{provider}: each agent its own root"
            );
            assert_each_turn_extends_the_whole_previous(&calls);
        }
        // The last call answers both parallel tool calls.
        let last = std::fs::read_to_string(&capture)
            .expect("capture")
            .lines()
            .last()
            .map(|line| serde_json::from_str::<serde_json::Value>(line).expect("JSON line"))
            .expect("captured calls");
        let body: serde_json::Value =
            serde_json::from_str(last["body"].as_str().expect("body")).expect("JSON body");
        let text = body.to_string();
        let results = text.matches(match provider {
            "anthropic" => "\"tool_result\"",
            _ => "\"function_call_output\"",
        });
        assert_eq!(
            results.count(),
            3,
            "{provider}: the task's result and both parallel ones: {body}"
        );
    }
}

/// opencode's auto-compaction through the proxy (its model's context limit set low): a tool
/// result fills the context, opencode sends its summarization agent the conversation as text,
/// then goes on from the summary. The summary call is recorded as a summary (a role class of
/// its own, not a trainable main turn) on a root of its own; the conversation after it starts
/// a new root, and each call within a conversation extends the previous one whole. Over
/// Messages and over Responses.
#[test]
fn opencode_auto_compaction_is_a_summary_call_and_a_new_conversation() {
    let Some(opencode) = harness_bin("GYRE_OPENCODE_BIN") else {
        return;
    };
    for provider in ["anthropic", "openai"] {
        let dir = tempfile::tempdir().expect("temp dir");
        let (work, home) = opencode_dirs(dir.path());
        let config = work.join("opencode.json");
        let line =
            |blocks: serde_json::Value| serde_json::json!({"agent": "main", "blocks": blocks});
        let bash = |command: &str| {
            line(serde_json::json!([{"type": "tool_use", "name": "bash",
                "input": {"command": command, "description": "Run it"}}]))
        };
        let text = |text: &str| line(serde_json::json!([{"type": "text", "text": text}]));
        let script = script_of(
            dir.path(),
            &[
                // ~9K tokens of output: the context passes the limit below.
                bash("seq 1 4000"),
                text("Counted to 4000."),
                // The summarization agent's answer.
                text(
                    "## Objective\n- Count, then write two.txt.\n\n## Next Move\n1. Write two.txt",
                ),
                bash("echo two > two.txt"),
                text("All done here."),
            ],
        );
        let log = dir.path().join("tito.log");
        let capture = dir.path().join("capture.jsonl");
        let mut proxy = start_proxy(&script, &log, &capture);
        // The first call is ~12K tokens of system prompt and tools; the tool result takes the
        // second past 18K (the context less the output), the summary brings it back under.
        write_opencode_config(&config, provider, &proxy, Some((20_000, 2_000)));
        opencode_to_its_end(
            opencode_run(
                &opencode,
                &work,
                &home,
                &config,
                "Count, then write two.txt.",
            ),
            &mut proxy,
            provider,
        );
        assert_eq!(
            std::fs::read_to_string(work.join("two.txt"))
                .ok()
                .as_deref(),
            Some("two\n"),
            "{provider}: the call after the compaction ran its tool"
        );
        let records = records(&log);
        let kinds: Vec<CallKind> = records.iter().map(|r| r.kind).collect();
        assert_eq!(
            kinds,
            [
                CallKind::Turn,
                CallKind::Turn,
                CallKind::Summary,
                CallKind::Turn,
                CallKind::Turn
            ],
            "{provider}: the summarization call is a summary"
        );
        assert!(
            records.iter().all(|r| r.agent == "main"),
            "{provider}: one agent"
        );
        let roots: Vec<usize> = records
            .iter()
            .enumerate()
            .filter(|(_, r)| r.parent_call.is_none())
            .map(|(at, _)| at)
            .collect();
        assert_eq!(
            roots,
            [0, 2, 3],
            "{provider}: the conversation, the summary and the conversation after it"
        );
        assert_each_turn_extends_the_whole_previous(&records[..2]);
        assert_each_turn_extends_the_whole_previous(&records[3..]);
    }
}
