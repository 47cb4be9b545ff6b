//! A proxy killed with SIGKILL and started again on the same event file: its harnesses keep
//! their credentials, and their next calls extend the trees recorded before the crash (the
//! session is rebuilt from the log: tree, call numbering, each agent's last context as
//! tokens, the exact tool-call text and reasoning behind the ids it handed out). Closed
//! credentials stay closed, and new executions never reuse an id the log holds.

use serde_json::{json, Value};

use crate::support::{gyre, http, ProxyProcess};

/// `gyre proxy` with the scripted engine, recording to `sink`, opening `open` executions.
struct Proxy(ProxyProcess);

impl Proxy {
    fn start(sink: &[String], script: &std::path::Path, open: usize) -> Proxy {
        let open = open.to_string();
        let mut args = vec![
            "--listen",
            "127.0.0.1:0",
            "--engine",
            "scripted",
            "--script",
            script.to_str().expect("utf-8"),
            "--open",
            &open,
        ];
        args.extend(sink.iter().map(String::as_str));
        Proxy(ProxyProcess::start(&args))
    }

    fn next(&mut self) -> Value {
        self.0.next_json()
    }

    fn post(&self, path: &str, token: &str, body: &Value) -> (u16, Value) {
        let (status, text) = http(
            &self.0.address,
            "POST",
            path,
            &[("x-api-key", token), ("content-type", "application/json")],
            &body.to_string(),
        );
        let value = serde_json::from_str(&text).unwrap_or_else(|_| json!({ "raw": text }));
        (status, value)
    }

    fn kill(mut self) {
        self.0.kill();
    }
}

#[test]
fn a_killed_proxy_restarts_and_its_executions_continue_their_trees() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("proxy.log");
    let sink = vec!["--log".to_string(), log.display().to_string()];
    restart_scenario(
        dir.path(),
        &sink,
        || {},
        || {
            let (code, stdout, stderr) = gyre(&["replay", log.to_str().expect("utf-8")]);
            assert_eq!(code, 0, "{stderr}");
            assert!(
                stdout.contains("model calls: 2 in 1 executions (1 agents): 1 roots, 0 branches"),
                "the call after the restart extends the one before it: {stdout}"
            );
        },
    );
}

/// Recording to a three-node control quorum (`--cluster`, `--credentials`) that snapshots
/// every few entries and keeps none behind: while the proxy is down the log is purged past its
/// execution's first call, and the restarted proxy rebuilds the session from the projection's
/// tree (`ReadExecution`) on a node that applied everything committed.
#[test]
fn a_killed_proxy_on_a_quorum_restarts_after_the_log_was_purged() {
    use gyre_event::{CallId, EventBody};
    let runtime = crate::support::runtime();
    let cluster = runtime.block_on(crate::support::InProcessCluster::start_with(|options| {
        options.snapshot_every_entries = 4;
        options.entries_kept_behind_snapshot = 0;
    }));
    let dir = tempfile::tempdir().expect("tempdir");
    let credentials = dir.path().join("proxy.credentials");
    let sink = vec![
        "--cluster".to_string(),
        cluster.addresses.join(","),
        "--credentials".to_string(),
        credentials.display().to_string(),
    ];
    let purge = || runtime.block_on(purge_committed(&cluster));
    let check = || {
        runtime.block_on(async {
            // Node 1 may be the follower the acknowledging quorum did not wait for.
            cluster.every_node_applied().await;
            let mut client = cluster.client.clone();
            let (events, closed) = client
                .read_execution(&cluster.addresses[0], 1)
                .await
                .expect("the tree reads");
            assert!(!closed, "the scheduler never closed it");
            let records: Vec<_> = events
                .into_iter()
                .map(|event| match event.body {
                    EventBody::ModelCall(record) => record,
                    other => panic!("a model call, not {other:?}"),
                })
                .collect();
            assert_eq!(records.len(), 2);
            assert_eq!(
                records[1].parent_call,
                Some(CallId(0)),
                "the call after the restart extends the one before it"
            );
            let first = &records[0];
            assert_eq!(
                records[1].reused_prefix_tokens_count,
                (first.input_ids.len() + first.output_ids.len()) as u64,
                "the whole first call is reused"
            );
        });
    };
    restart_scenario(dir.path(), &sink, purge, check);
    runtime.block_on(cluster.shutdown());
}

/// Two executions; one call, one close; SIGKILL; `between()`; restart; the first call re-sent
/// gets its committed answer; the open execution's next call extends its tree, the closed one
/// stays closed; `check_tree()`.
fn restart_scenario(
    dir: &std::path::Path,
    sink: &[String],
    between: impl FnOnce(),
    check_tree: impl FnOnce(),
) {
    let before = dir.join("before.jsonl");
    let after = dir.join("after.jsonl");
    std::fs::write(
        &before,
        json!({"agent": "main", "blocks": [
            {"type": "thinking", "thinking": "Probe first, then answer."},
            {"type": "tool_use", "name": "probe", "input": {"zeta": 1, "alpha": "x\u{e9}"}}
        ]})
        .to_string()
            + "\n",
    )
    .expect("script");
    std::fs::write(
        &after,
        json!({"agent": "main", "blocks": [{"type": "text", "text": "The probe said ok."}]})
            .to_string()
            + "\n",
    )
    .expect("script");

    let mut proxy = Proxy::start(sink, &before, 2);
    let first = proxy.next();
    let closed = proxy.next();
    let token = first["token"].as_str().expect("token").to_string();
    let closed_token = closed["token"].as_str().expect("token").to_string();
    assert_eq!(
        (first["execution"].as_u64(), closed["execution"].as_u64()),
        (Some(1), Some(2))
    );

    let tools = json!([{"name": "probe", "description": "Probes.", "input_schema": {"type": "object", "properties": {"alpha": {"type": "string"}, "zeta": {"type": "number"}}}}]);
    let question = json!({"role": "user", "content": "Probe, then tell me what it said."});
    let (status, answer) = proxy.post(
        "/v1/messages",
        &token,
        &json!({"model": "m", "max_tokens": 256, "tools": tools, "messages": [question]}),
    );
    assert_eq!(status, 200, "{answer}");
    let content = answer["content"]
        .as_array()
        .expect("content blocks")
        .clone();
    let thinking = content
        .iter()
        .find(|block| block["type"] == "thinking")
        .expect("a thinking block");
    let tool_use = content
        .iter()
        .find(|block| block["type"] == "tool_use")
        .expect("a tool_use block");
    let first_input_tokens = answer["usage"]["input_tokens"].as_u64().expect("usage");
    let (status, body) = proxy.post(
        &format!("/admin/executions/{closed_token}/close"),
        "",
        &json!({}),
    );
    assert_eq!(status, 200, "{body}");
    proxy.kill();
    between();

    let mut proxy = Proxy::start(sink, &after, 0);
    let recovered = proxy.next();
    assert_eq!(
        recovered["recovered"]["executions_resumed"], 1,
        "{recovered}"
    );
    assert_eq!(recovered["recovered"]["calls_recovered"], 1, "{recovered}");
    assert_eq!(recovered["recovered"]["credentials_open"], 1, "{recovered}");
    assert_eq!(
        recovered["recovered"]["credentials_closed"], 1,
        "{recovered}"
    );
    assert_eq!(recovered["recovered"]["next_execution"], 3, "{recovered}");

    // A harness that never received the first answer (the crash came after its record was
    // committed) re-sends the same body: it gets that answer, with the same thinking handle and
    // tool-call id, and nothing new is recorded (the close below counts 2 calls).
    let (status, re_sent) = proxy.post(
        "/v1/messages",
        &token,
        &json!({"model": "m", "max_tokens": 256, "tools": tools, "messages": [question]}),
    );
    assert_eq!(status, 200, "{re_sent}");
    assert_eq!(
        re_sent["content"],
        Value::Array(content.clone()),
        "the committed answer again"
    );

    // The harness re-sends the history the way Claude Code does: the tool input's keys in
    // another order and its escape normalised, the thinking block with its signature.
    let id = tool_use["id"].as_str().expect("id");
    let history = json!([
        question,
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": thinking["thinking"], "signature": thinking["signature"]},
            {"type": "tool_use", "id": id, "name": "probe", "input": {"alpha": "x\u{e9}", "zeta": 1}}
        ]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": "ok"}]}
    ]);
    let (status, answer) = proxy.post(
        "/v1/messages",
        &token,
        &json!({"model": "m", "max_tokens": 256, "tools": tools, "messages": history}),
    );
    assert_eq!(status, 200, "{answer}");
    let cached = answer["usage"]["cache_read_input_tokens"]
        .as_u64()
        .expect("cached tokens");
    assert!(
        cached > first_input_tokens,
        "the second call reuses the whole first call from the tree: {cached} cached, the first prompt was {first_input_tokens}: {answer}"
    );

    let (status, refused) = proxy.post(
        "/v1/messages",
        &closed_token,
        &json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(status, 401, "{refused}");
    assert_eq!(
        refused["error"]["type"], "authentication_error",
        "{refused}"
    );
    assert!(refused.to_string().contains("closed"), "{refused}");

    let (status, opened) = proxy.post("/admin/executions", "", &json!({}));
    assert_eq!(status, 200, "{opened}");
    assert_eq!(
        opened["execution"], 3,
        "a new execution after every id issued: {opened}"
    );
    // An id is opened once, whoever names it: one issued before the restart, one opened now.
    for taken in [1, 3] {
        let (status, refused) = proxy.post("/admin/executions", "", &json!({ "execution": taken }));
        assert_eq!(status, 409, "execution {taken} again: {refused}");
        assert!(
            refused["error"]
                .as_str()
                .is_some_and(|message| message.contains(&format!("execution {taken} "))),
            "{refused}"
        );
    }
    // The numbering steps over an id opened by name.
    let (status, named) = proxy.post("/admin/executions", "", &json!({"execution": 5}));
    assert_eq!(
        (status, named["execution"].as_u64()),
        (200, Some(5)),
        "{named}"
    );
    let numbered: Vec<_> = (0..2)
        .map(|_| proxy.post("/admin/executions", "", &json!({})).1["execution"].as_u64())
        .collect();
    assert_eq!(numbered, [Some(4), Some(6)]);

    let (status, closing) = proxy.post(&format!("/admin/executions/{token}/close"), "", &json!({}));
    assert_eq!(status, 200, "{closing}");
    assert_eq!(closing["calls"], 2, "{closing}");
    assert_eq!(
        closing["sampled_divergences"], 0,
        "the re-sent output matched the recorded tokens exactly: {closing}"
    );
    proxy.kill();

    check_tree();
}

/// One HTTP/1.1 request that may fail (the proxy may be down): (status, body) or the error.
fn try_http(address: &str, path: &str, token: &str, body: &str) -> std::io::Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address)?;
    stream.set_read_timeout(Some(std::time::Duration::from_secs(30)))?;
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nhost: {address}\r\nconnection: close\r\nx-api-key: {token}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP response: {response:?}")))?;
    let body = response
        .split_once("\r\n\r\n")
        .map_or("", |(_, body)| body)
        .to_string();
    Ok((status, body))
}

/// Eight harnesses hold growing conversations while the proxy is killed with SIGKILL three
/// times and restarted on the same port and event file. A harness retries a call whose
/// connection failed with the identical body, as Claude Code does. Every call a harness got an
/// answer for is in the log exactly once (a re-sent call whose record was committed before the
/// crash gets that answer), the log replays (hash chain, trees), and each restart resumes
/// every execution.
#[test]
fn a_proxy_killed_repeatedly_under_load_loses_no_answered_call() {
    use std::sync::{Arc, Condvar, Mutex};
    const HARNESSES: usize = 8;
    const TURNS: usize = 12;
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("proxy.log");
    let log_arg = log.to_str().expect("utf-8").to_string();
    let mut proxy = ProxyProcess::start(&[
        "--listen",
        "127.0.0.1:0",
        "--engine",
        "deterministic",
        "--answer-tokens",
        "24",
        "--open",
        &HARNESSES.to_string(),
        "--log",
        &log_arg,
    ]);
    let address = proxy.address.clone();
    let tokens: Vec<(u64, String)> = (0..HARNESSES)
        .map(|_| {
            let opened = proxy.next_json();
            (
                opened["execution"].as_u64().expect("execution"),
                opened["token"].as_str().expect("token").to_string(),
            )
        })
        .collect();
    // Answers received so far, and a signal for the killer.
    let answered = Arc::new((Mutex::new(0usize), Condvar::new()));
    let harnesses: Vec<_> = tokens
        .iter()
        .map(|(execution, token)| {
            let (address, token, answered) = (address.clone(), token.clone(), answered.clone());
            let execution = *execution;
            std::thread::spawn(move || {
                let mut messages: Vec<Value> = Vec::new();
                let mut retries = 0usize;
                for turn in 0..TURNS {
                    messages.push(
                        json!({"role": "user", "content": format!("turn {turn} of {execution}")}),
                    );
                    let body =
                        json!({"model": "m", "max_tokens": 24, "messages": messages}).to_string();
                    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
                    let answer = loop {
                        match try_http(&address, "/v1/messages", &token, &body) {
                            Ok((200, text)) => break text,
                            Ok((status, text)) if status >= 500 => {
                                assert!(std::time::Instant::now() < deadline, "{status}: {text}");
                            }
                            Ok((status, text)) => panic!("execution {execution}: {status}: {text}"),
                            Err(error) => {
                                assert!(std::time::Instant::now() < deadline, "{error}");
                            }
                        }
                        retries += 1;
                        // Pacing between retries while the proxy restarts, as harnesses back off.
                        std::thread::sleep(std::time::Duration::from_millis(20));
                    };
                    let answer: Value = serde_json::from_str(&answer).expect("a JSON answer");
                    let text = answer["content"][0]["text"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string();
                    messages.push(json!({"role": "assistant", "content": text}));
                    let (count, signal) = &*answered;
                    *count.lock().expect("count") += 1;
                    signal.notify_all();
                }
                (execution, retries)
            })
        })
        .collect();
    let total = HARNESSES * TURNS;
    for kill_after in [total / 8, total / 2, total * 3 / 4] {
        let (count, signal) = &*answered;
        // Bounded: if the harness threads stall or panic (their panics surface only at `join`),
        // the test fails with the count reached instead of waiting for ever.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(600);
        let mut guard = count.lock().expect("count");
        while *guard < kill_after {
            assert!(
                std::time::Instant::now() < deadline,
                "the harnesses stalled at {} of {kill_after} answers",
                *guard
            );
            guard = signal
                .wait_timeout(guard, std::time::Duration::from_secs(1))
                .expect("count")
                .0;
        }
        drop(guard);
        proxy.kill();
        let before = records_by_execution(&log);
        proxy = ProxyProcess::start(&[
            "--listen",
            &address,
            "--engine",
            "deterministic",
            "--answer-tokens",
            "24",
            "--log",
            &log_arg,
        ]);
        let recovered = proxy.next_json();
        let calls: usize = before.values().sum();
        assert_eq!(
            recovered["recovered"]["calls_recovered"].as_u64(),
            Some(calls as u64),
            "every record in the file is folded back: {recovered}"
        );
    }
    let mut retried = 0;
    for harness in harnesses {
        let (_, retries) = harness.join().expect("a harness finished its conversation");
        retried += retries;
    }
    proxy.kill();
    let recorded = records_by_execution(&log);
    for (execution, _) in &tokens {
        // Exactly one record per answer: a call re-sent after its record was committed is
        // answered from the record, not sampled again.
        let calls = recorded.get(execution).copied().unwrap_or(0);
        assert_eq!(
            calls, TURNS,
            "execution {execution}: {TURNS} answers, {calls} records"
        );
    }
    let (code, stdout, stderr) = gyre(&["replay", &log_arg]);
    assert_eq!(code, 0, "the log replays after three crashes: {stderr}");
    assert!(
        stdout.contains(&format!("in {HARNESSES} executions")),
        "{stdout}"
    );
    assert!(
        stdout.contains("prompts sampled more than once: 0"),
        "no retry across the crashes left a second sample: {stdout}"
    );
    eprintln!("{retried} calls were retried across the three crashes");
}

/// Model-call records per execution in an event file.
fn records_by_execution(log: &std::path::Path) -> std::collections::BTreeMap<u64, usize> {
    let mut counts = std::collections::BTreeMap::new();
    for (_, events) in gyre_log::EventFileReader::read_all_events(log).expect("the log reads") {
        for event in events {
            if let gyre_event::EventBody::ModelCall(record) = event.body {
                if record.kind != gyre_event::CallKind::Aborted {
                    *counts.entry(record.execution.get()).or_insert(0) += 1;
                }
            }
        }
    }
    counts
}

/// A stop sequence cuts the answer; the proxy is killed and restarted; the harness sends the
/// cut text back with its next question: that call extends every token the model sampled (the
/// record keeps its stop sequences, so the rebuilt context is cut where the harness's text
/// ends), on an event file and on a quorum (rebuilt from the projection's tree).
#[test]
fn a_stopped_answer_is_extended_after_a_restart_from_a_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("proxy.log");
    stopped_restart_scenario(
        dir.path(),
        &["--log".to_string(), log.display().to_string()],
    );
}

#[test]
fn a_stopped_answer_is_extended_after_a_restart_from_a_quorum() {
    let runtime = crate::support::runtime();
    let cluster = runtime.block_on(crate::support::InProcessCluster::start());
    let dir = tempfile::tempdir().expect("tempdir");
    let credentials = dir.path().join("proxy.credentials");
    stopped_restart_scenario(
        dir.path(),
        &[
            "--cluster".to_string(),
            cluster.addresses.join(","),
            "--credentials".to_string(),
            credentials.display().to_string(),
        ],
    );
    runtime.block_on(cluster.shutdown());
}

fn stopped_restart_scenario(dir: &std::path::Path, sink: &[String]) {
    let before = dir.join("before.jsonl");
    let after = dir.join("after.jsonl");
    let line = |text: &str| {
        json!({"agent": "main", "blocks": [{"type": "text", "text": text}]}).to_string() + "\n"
    };
    std::fs::write(&before, line("Looking around.\nObservation: nothing here")).expect("script");
    std::fs::write(&after, line("Done.")).expect("script");
    let stops = json!(["\nObservation:"]);
    let question = json!({"role": "user", "content": "Look around, then report."});

    let mut proxy = Proxy::start(sink, &before, 1);
    let token = proxy.next()["token"].as_str().expect("token").to_string();
    let (status, answer) = proxy.post(
        "/v1/messages",
        &token,
        &json!({"model": "m", "max_tokens": 64, "stop_sequences": stops, "messages": [question]}),
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["stop_reason"], "stop_sequence", "{answer}");
    assert_eq!(answer["content"][0]["text"], "Looking around.", "{answer}");
    let prompt = answer["usage"]["input_tokens"].as_u64().expect("usage");
    let sampled = answer["usage"]["output_tokens"].as_u64().expect("usage");
    proxy.kill();

    let mut proxy = Proxy::start(sink, &after, 0);
    let recovered = proxy.next();
    assert_eq!(recovered["recovered"]["calls_recovered"], 1, "{recovered}");
    let history = json!([
        question,
        {"role": "assistant", "content": [{"type": "text", "text": "Looking around."}]},
        {"role": "user", "content": "Go on."}
    ]);
    let (status, answer) = proxy.post(
        "/v1/messages",
        &token,
        &json!({"model": "m", "max_tokens": 64, "stop_sequences": stops, "messages": history}),
    );
    assert_eq!(status, 200, "{answer}");
    let cached = answer["usage"]["cache_read_input_tokens"]
        .as_u64()
        .expect("cached tokens");
    assert!(
        cached >= prompt + sampled,
        "the call after the restart reuses the first prompt ({prompt}) and every sampled token \
         ({sampled}), past the cut included: {cached} cached: {answer}"
    );
    let (status, closing) = proxy.post(&format!("/admin/executions/{token}/close"), "", &json!({}));
    assert_eq!(status, 200, "{closing}");
    assert_eq!(closing["calls"], 2, "{closing}");
    assert_eq!(closing["sampled_divergences"], 0, "{closing}");
    proxy.kill();
}

/// A Responses client that chains with `previous_response_id` (the OpenAI Agents SDK, …)
/// continues after its proxy was killed: the answers it may name were committed to the log
/// as `ResponseStored` events before it got them, and the restarted proxy rebuilds them, so
/// the next call extends the tree with the whole conversation reused. An event file and a
/// quorum (whose log was purged behind a snapshot: the projection keeps the records).
#[test]
fn a_chaining_responses_client_continues_after_a_restart_from_a_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("proxy.log");
    chained_restart_scenario(
        dir.path(),
        &["--log".to_string(), log.display().to_string()],
        || {},
    );
    // The file holds the root (committed before it was handed over: it opened the
    // conversation), its continuation, the call after the restart and the branch.
    let stored = stored_links(&log);
    assert_eq!(stored.len(), 4, "{stored:?}");
    assert_eq!(stored[0].1, None, "the root first: {stored:?}");
    assert_eq!(stored[1].1.as_ref(), Some(&stored[0].0), "{stored:?}");
    assert_eq!(stored[2].1.as_ref(), Some(&stored[1].0), "{stored:?}");
    assert_eq!(
        stored[3].1.as_ref(),
        Some(&stored[0].0),
        "the branch: {stored:?}"
    );
    assert_eq!(
        stored_with_their_call(&log),
        [true; 4],
        "each stored response is committed in its call's batch"
    );
}

#[test]
fn a_chaining_responses_client_continues_after_a_restart_from_a_quorum() {
    on_a_purged_quorum(|dir, sink, purge| chained_restart_scenario(dir, sink, purge));
}

/// The `(id, previous id)` of each `ResponseStored` event in the event file `log`, in order.
fn stored_links(log: &std::path::Path) -> Vec<(String, Option<String>)> {
    gyre_log::EventFileReader::open(log)
        .expect("open")
        .flat_map(|record| {
            record
                .expect("record")
                .decode_events_in(log)
                .expect("events")
        })
        .filter_map(|event| match event.body {
            gyre_event::EventBody::ResponseStored(record) => {
                Some((record.response_id, record.previous_response_id))
            }
            _ => None,
        })
        .collect()
}

/// For each record (one batch, one `fdatasync`) of the event file `log` that holds stored
/// turns: whether it holds a call's record too, i.e. the turn cost no sync of its own.
fn stored_with_their_call(log: &std::path::Path) -> Vec<bool> {
    gyre_log::EventFileReader::open(log)
        .expect("open")
        .filter_map(|record| {
            let events = record
                .expect("record")
                .decode_events_in(log)
                .expect("events");
            let is = |want: fn(&gyre_event::EventBody) -> bool| {
                events.iter().any(|event| want(&event.body))
            };
            is(|body| matches!(body, gyre_event::EventBody::ResponseStored(_)))
                .then(|| is(|body| matches!(body, gyre_event::EventBody::ModelCall(_))))
        })
        .collect()
}

/// Runs a restart `scenario` (its directory, the proxy's sink flags, what to do between the
/// two proxies) against an in-process quorum that snapshots every 4 entries, its committed log
/// purged behind the snapshot between the two proxies.
fn on_a_purged_quorum(scenario: impl FnOnce(&std::path::Path, &[String], &dyn Fn())) {
    let runtime = crate::support::runtime();
    let cluster = runtime.block_on(crate::support::InProcessCluster::start_with(|options| {
        options.snapshot_every_entries = 4;
        options.entries_kept_behind_snapshot = 0;
    }));
    let dir = tempfile::tempdir().expect("tempdir");
    let credentials = dir.path().join("proxy.credentials");
    let purge = || runtime.block_on(purge_committed(&cluster));
    scenario(
        dir.path(),
        &[
            "--cluster".to_string(),
            cluster.addresses.join(","),
            "--credentials".to_string(),
            credentials.display().to_string(),
        ],
        &purge,
    );
    runtime.block_on(cluster.shutdown());
}

/// The scripts of a restart scenario's two proxies, in `dir`: before the restart a thinking
/// `ls` call then "Two files."; after it, a text answer of each of `after`.
fn restart_scripts(
    dir: &std::path::Path,
    after: &[&str],
) -> (std::path::PathBuf, std::path::PathBuf) {
    let text = |text: &str| json!({"agent": "main", "blocks": [{"type": "text", "text": text}]});
    let lines = |lines: Vec<Value>| {
        lines
            .iter()
            .map(|line| format!("{line}\n"))
            .collect::<String>()
    };
    let before = dir.join("before.jsonl");
    std::fs::write(
        &before,
        lines(vec![
            json!({"agent": "main", "blocks": [
                {"type": "thinking", "thinking": "List first."},
                {"type": "tool_use", "name": "ls", "input": {"path": "."}}]}),
            text("Two files."),
        ]),
    )
    .expect("script");
    let after_path = dir.join("after.jsonl");
    std::fs::write(
        &after_path,
        lines(after.iter().map(|answer| text(answer)).collect()),
    )
    .expect("script");
    (before, after_path)
}

fn chained_restart_scenario(dir: &std::path::Path, sink: &[String], between: impl FnOnce()) {
    let (before, after) = restart_scripts(dir, &["You are welcome.", "Nothing there."]);
    let tools = json!([{"type": "function", "name": "ls", "description": "Lists files.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}]);

    let mut proxy = Proxy::start(sink, &before, 1);
    let token = proxy.next()["token"].as_str().expect("token").to_string();
    let (status, first) = proxy.post(
        "/v1/responses",
        &token,
        &json!({"model": "m", "instructions": "Be brief.", "tools": tools,
                "input": "What is here?"}),
    );
    assert_eq!(status, 200, "{first}");
    let call = first["output"]
        .as_array()
        .expect("output")
        .iter()
        .find(|item| item["type"] == "function_call")
        .expect("a function call")
        .clone();
    let (status, second) = proxy.post(
        "/v1/responses",
        &token,
        &json!({"model": "m", "instructions": "Be brief.", "tools": tools,
                "previous_response_id": first["id"],
                "input": [{"type": "function_call_output", "call_id": call["call_id"],
                           "output": "a.txt b.txt"}]}),
    );
    assert_eq!(status, 200, "{second}");
    assert_eq!(second["output"][0]["content"][0]["text"], "Two files.");
    let context = second["usage"]["input_tokens"].as_u64().expect("usage")
        + second["usage"]["output_tokens"].as_u64().expect("usage");
    proxy.kill();
    between();

    let mut proxy = Proxy::start(sink, &after, 0);
    let recovered = proxy.next();
    assert_eq!(recovered["recovered"]["calls_recovered"], 2, "{recovered}");
    assert_eq!(
        recovered["recovered"]["responses_recovered"], 2,
        "{recovered}"
    );
    let (status, third) = proxy.post(
        "/v1/responses",
        &token,
        &json!({"model": "m", "instructions": "Be brief.", "tools": tools,
                "previous_response_id": second["id"], "input": "Thanks."}),
    );
    assert_eq!(status, 200, "{third}");
    assert_eq!(third["previous_response_id"], second["id"], "{third}");
    assert_eq!(
        third["output"][0]["content"][0]["text"], "You are welcome.",
        "{third}"
    );
    let cached = third["usage"]["input_tokens_details"]["cached_tokens"]
        .as_u64()
        .expect("cached tokens");
    assert!(
        cached >= context,
        "the call after the restart reuses the whole conversation before it ({context} \
         tokens): {cached} cached: {third}"
    );
    // The first answer, which a client could also continue (a branch), resolves too.
    let (status, branch) = proxy.post(
        "/v1/responses",
        &token,
        &json!({"model": "m", "instructions": "Be brief.", "tools": tools,
                "previous_response_id": first["id"],
                "input": [{"type": "function_call_output", "call_id": call["call_id"],
                           "output": "nothing"}]}),
    );
    assert_eq!(status, 200, "{branch}");
    assert_eq!(
        branch["output"][0]["content"][0]["text"], "Nothing there.",
        "{branch}"
    );
    let (status, closing) = proxy.post(&format!("/admin/executions/{token}/close"), "", &json!({}));
    assert_eq!(status, 200, "{closing}");
    assert_eq!(closing["sampled_divergences"], 0, "{closing}");
    proxy.kill();
}

/// A proxy killed right after a chaining client's first answer (the OpenAI Agents SDK's
/// first turn): that answer opened a conversation, so it was committed before the client got
/// its id, and the client's first `previous_response_id` resolves after the restart instead of
/// a `previous_response_not_found` that would end its run. A client re-sending whole
/// conversations writes one stored response for its first request and none after.
#[test]
fn a_chaining_client_continues_its_first_answer_after_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("proxy.log");
    let sink = ["--log".to_string(), log.display().to_string()];
    let script = dir.path().join("script.jsonl");
    let text = |text: &str| json!({"agent": "main", "blocks": [{"type": "text", "text": text}]});
    std::fs::write(
        &script,
        [
            text("Two files."),
            text("Re-sent."),
            text("Again."),
            text("Welcome."),
        ]
        .iter()
        .map(|line| format!("{line}\n"))
        .collect::<String>(),
    )
    .expect("script");
    let mut proxy = Proxy::start(&sink, &script, 3);
    let token = proxy.next()["token"].as_str().expect("token").to_string();
    let resender = proxy.next()["token"].as_str().expect("token").to_string();
    let warmed = proxy.next()["token"].as_str().expect("token").to_string();
    // A warm-up (`"generate": false`) opens a conversation too: a client may chain on it.
    let (status, warmup) = proxy.post(
        "/v1/responses",
        &warmed,
        &json!({"model": "m", "generate": false, "input": "Hi."}),
    );
    assert_eq!(status, 200, "{warmup}");
    assert_eq!(warmup["output"], json!([]), "{warmup}");
    let (status, first) = proxy.post(
        "/v1/responses",
        &token,
        &json!({"model": "m", "instructions": "Be brief.", "input": "What is here?"}),
    );
    assert_eq!(status, 200, "{first}");
    // Another execution's client re-sends its whole conversation each call.
    let mut input = vec![json!({"role": "user", "content": "Hello?"})];
    for _ in 0..2 {
        let (status, answer) = proxy.post(
            "/v1/responses",
            &resender,
            &json!({"model": "m", "input": input}),
        );
        assert_eq!(status, 200, "{answer}");
        input.extend(answer["output"].as_array().expect("output").iter().cloned());
        input.push(json!({"role": "user", "content": "And?"}));
    }
    proxy.kill();

    let script = dir.path().join("after.jsonl");
    std::fs::write(
        &script,
        format!("{}\n{}\n", text("Welcome."), text("Hello.")),
    )
    .expect("script");
    let mut proxy = Proxy::start(&sink, &script, 0);
    let recovered = proxy.next();
    assert_eq!(
        recovered["recovered"]["responses_recovered"], 3,
        "the first answer of each conversation, the warm-up's included: {recovered}"
    );
    let (status, second) = proxy.post(
        "/v1/responses",
        &token,
        &json!({"model": "m", "instructions": "Be brief.",
                "previous_response_id": first["id"], "input": "Thanks."}),
    );
    assert_eq!(
        status, 200,
        "the first answer resolves after the restart: {second}"
    );
    assert_eq!(second["previous_response_id"], first["id"], "{second}");
    assert!(
        second["usage"]["input_tokens_details"]["cached_tokens"]
            .as_u64()
            .expect("cached tokens")
            > 0,
        "the call extends the first: {second}"
    );
    let (status, chained) = proxy.post(
        "/v1/responses",
        &warmed,
        &json!({"model": "m", "previous_response_id": warmup["id"], "input": []}),
    );
    assert_eq!(
        status, 200,
        "the warm-up resolves after the restart: {chained}"
    );
    assert_eq!(chained["previous_response_id"], warmup["id"], "{chained}");
    proxy.kill();
}

/// Purges every node's log up to the highest commit index any node reports (snapshot first).
async fn purge_committed(cluster: &crate::support::InProcessCluster) {
    let mut client = cluster.client.clone();
    let commit = client
        .status_all()
        .await
        .into_iter()
        .filter_map(|(_, reply)| reply.ok())
        .map(|reply| reply.commit_index)
        .max()
        .expect("a node answers");
    cluster.purge_past(commit).await;
}

/// An Anthropic Message Threads client (Claude Code with `CLAUDE_CODE_TETHER_LIVE`, the SDKs'
/// tool runners) continues its thread after the proxy was killed: each thread turn was
/// committed before its id was handed over (only what it adds to the thread), the restarted
/// proxy holds the thread again, and the continue is served as the whole conversation — every
/// token before it reused. A response continued before the restart stays continued.
#[test]
fn a_message_threads_client_continues_after_a_restart_from_a_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("proxy.log");
    thread_restart_scenario(
        dir.path(),
        &["--log".to_string(), log.display().to_string()],
        || {},
    );
    let stored = stored_links(&log);
    assert_eq!(stored.len(), 3, "a create and two continues: {stored:?}");
    assert!(
        stored.iter().all(|(id, _)| id.starts_with("msg_")),
        "{stored:?}"
    );
    assert_eq!(stored[0].1, None, "{stored:?}");
    assert_eq!(stored[1].1.as_ref(), Some(&stored[0].0), "{stored:?}");
    assert_eq!(stored[2].1.as_ref(), Some(&stored[1].0), "{stored:?}");
    assert_eq!(
        stored_with_their_call(&log),
        [true; 3],
        "each turn is committed in its call's batch"
    );
}

#[test]
fn a_message_threads_client_continues_after_a_restart_from_a_quorum() {
    on_a_purged_quorum(|dir, sink, purge| thread_restart_scenario(dir, sink, purge));
}

fn thread_restart_scenario(dir: &std::path::Path, sink: &[String], between: impl FnOnce()) {
    let (before, after) = restart_scripts(dir, &["You are welcome."]);
    let tools = json!([{"name": "ls", "description": "Lists files.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}]);
    let continue_from = |answer: &Value, messages: Value| {
        json!({"model": "m", "max_tokens": 256, "messages": messages,
               "thread": {"type": "continue", "previous_message_id": answer["id"]}})
    };

    let mut proxy = Proxy::start(sink, &before, 1);
    let token = proxy.next()["token"].as_str().expect("token").to_string();
    let (status, first) = proxy.post(
        "/v1/messages",
        &token,
        &json!({"model": "m", "max_tokens": 256, "system": "Be brief.", "tools": tools,
                "messages": [{"role": "user", "content": "What is here?"}],
                "thread": {"type": "create"}}),
    );
    assert_eq!(status, 200, "{first}");
    let tool_use = first["content"]
        .as_array()
        .expect("content")
        .iter()
        .find(|block| block["type"] == "tool_use")
        .expect("a tool call")
        .clone();
    let result = json!([{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": tool_use["id"], "content": "a.txt b.txt"}]}]);
    let (status, second) = proxy.post("/v1/messages", &token, &continue_from(&first, result));
    assert_eq!(status, 200, "{second}");
    assert_eq!(second["content"][0]["text"], "Two files.", "{second}");
    let usage = &second["usage"];
    let context = ["input_tokens", "cache_read_input_tokens", "output_tokens"]
        .iter()
        .map(|field| usage[field].as_u64().expect("usage"))
        .sum::<u64>();
    proxy.kill();
    between();

    let mut proxy = Proxy::start(sink, &after, 0);
    let recovered = proxy.next();
    assert_eq!(recovered["recovered"]["calls_recovered"], 2, "{recovered}");
    let thanks = json!([{"role": "user", "content": "Thanks."}]);
    // Continued before the restart: still continued.
    let (status, again) = proxy.post(
        "/v1/messages",
        &token,
        &continue_from(&first, thanks.clone()),
    );
    assert_eq!(status, 400, "{again}");
    assert_eq!(
        again["error"]["details"]["error_code"], "thread_already_continued",
        "{again}"
    );
    let (status, third) = proxy.post("/v1/messages", &token, &continue_from(&second, thanks));
    assert_eq!(status, 200, "{third}");
    assert_eq!(third["content"][0]["text"], "You are welcome.", "{third}");
    let cached = third["usage"]["cache_read_input_tokens"]
        .as_u64()
        .expect("cached tokens");
    assert!(
        cached >= context,
        "the continue after the restart reuses the whole conversation before it ({context} \
         tokens): {cached} cached: {third}"
    );
    let (status, closing) = proxy.post(&format!("/admin/executions/{token}/close"), "", &json!({}));
    assert_eq!(status, 200, "{closing}");
    assert_eq!(closing["sampled_divergences"], 0, "{closing}");
    proxy.kill();
}
