//! `gyre replay` and `gyre audit` as processes: a clean log verifies end to end (with the
//! controller re-run at every decision), a flipped byte is reported at the first bad record while
//! everything before it still replays, `--at` dumps an earlier state, and audit bundles verify
//! offline and refuse tampering.

use crate::support::gyre;

use serde_json::Value;

/// A small E0 run (B = 8, N = 4, 6 steps) written as an event log.
fn small_log(dir: &std::path::Path) -> std::path::PathBuf {
    let (code, toml, stderr) = gyre(&[
        "simulate",
        "--preset",
        "table2",
        "--row",
        "E0",
        "--b",
        "8",
        "--n",
        "4",
        "--print-config",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let config = dir.join("small.toml");
    std::fs::write(&config, toml.replace("steps = 12", "steps = 6")).expect("write config");
    let log = dir.join("small.log");
    let (code, _, stderr) = gyre(&[
        "simulate",
        "--config",
        config.to_str().expect("utf-8"),
        "--log",
        log.to_str().expect("utf-8"),
    ]);
    assert_eq!(code, 0, "{stderr}");
    log
}

fn replay_json(args: &[&str]) -> (i32, Value) {
    let (code, stdout, stderr) = gyre(args);
    let report =
        serde_json::from_str(&stdout).unwrap_or_else(|error| panic!("{error}: {stdout} {stderr}"));
    (code, report)
}

#[test]
fn clean_log_replays_with_recompute() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = small_log(dir.path());
    let (code, report) = replay_json(&[
        "replay",
        log.to_str().expect("utf-8"),
        "--recompute",
        "--json",
    ]);
    assert_eq!(code, 0, "{report}");
    assert!(report["problem"].is_null());
    assert!(report["digests_verified"].as_u64() > Some(0));
    assert!(report["decisions_recomputed"].as_u64() > Some(100));
    assert_eq!(report["steps"].as_array().map(Vec::len), Some(6));
    assert_eq!(report["groups_consumed"], 6 * 8);
    assert!(report["events_by_kind"]["transition_completed"].as_u64() > Some(0));

    let (code, early) = replay_json(&[
        "replay",
        log.to_str().expect("utf-8"),
        "--at",
        "40",
        "--json",
    ]);
    assert_eq!(code, 0);
    assert_eq!(early["final_state"]["entry"], 40);
    assert_ne!(
        early["final_state"]["digest"],
        report["final_state"]["digest"]
    );
}

#[test]
fn flipped_byte_is_reported_and_the_prefix_still_replays() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = small_log(dir.path());
    let mut bytes = std::fs::read(&log).expect("read log");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    let damaged = dir.path().join("damaged.log");
    std::fs::write(&damaged, &bytes).expect("write damaged log");
    let (code, report) = replay_json(&["replay", damaged.to_str().expect("utf-8"), "--json"]);
    assert_eq!(code, 2, "a damaged log must fail");
    let problem = &report["problem"];
    assert_eq!(problem["kind"], "damaged_record", "{problem}");
    let message = problem["message"].as_str().expect("message");
    assert!(
        message.contains("damaged.log") && message.contains("offset"),
        "{message}"
    );
    let entries = report["entries"].as_u64().expect("entries");
    assert!(entries > 0, "the records before the damage replay");
    assert_eq!(report["final_state"]["entry"], entries);
}

#[test]
fn audit_bundle_verifies_and_refuses_tampering() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = small_log(dir.path());
    let bundle = dir.path().join("bundle.json");
    let (code, _, stderr) = gyre(&[
        "audit",
        log.to_str().expect("utf-8"),
        "--execution",
        "e5",
        "--out",
        bundle.to_str().expect("utf-8"),
    ]);
    assert_eq!(code, 0, "{stderr}");
    let text = std::fs::read_to_string(&bundle).expect("bundle");
    let mut value: Value = serde_json::from_str(&text).expect("bundle is JSON");
    let head = value["head"].as_str().expect("head").to_string();
    assert!(
        value["facts"]["consumed_by"]["step"].is_u64(),
        "the group was consumed: {}",
        value["facts"]["consumed_by"]
    );
    assert!(value["facts"]["advantage"].is_f64() || value["facts"]["excluded"].is_object());
    let (code, stdout, stderr) = gyre(&[
        "audit",
        "verify",
        bundle.to_str().expect("utf-8"),
        "--head",
        &head,
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.starts_with("ok:"));
    assert!(stdout.contains("partial:"), "only cited entries: {stdout}");

    // Built with --complete: every entry from the group's dispatch through the step that
    // consumed it, so nothing can have been left out.
    let complete = dir.path().join("complete.json");
    let (code, _, stderr) = gyre(&[
        "audit",
        log.to_str().expect("utf-8"),
        "--execution",
        "e5",
        "--out",
        complete.to_str().expect("utf-8"),
        "--complete",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let verify_complete = |path: &std::path::Path| {
        gyre(&[
            "audit",
            "verify",
            path.to_str().expect("utf-8"),
            "--head",
            &head,
            "--require-complete",
        ])
    };
    let (code, stdout, stderr) = verify_complete(&complete);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("complete:"), "{stdout}");
    assert!(stdout.contains("consumed the group"), "{stdout}");
    let (code, _, stderr) = verify_complete(&bundle);
    assert_eq!(code, 2, "a bundle of cited entries only is partial");
    assert!(stderr.contains("partial"), "{stderr}");
    // Leaving out the step that consumed the group (and the fact it supports) is seen.
    let mut cut: Value =
        serde_json::from_str(&std::fs::read_to_string(&complete).expect("bundle")).expect("json");
    let step = cut["facts"]["consumed_by"]["entry"]
        .as_u64()
        .expect("consumed");
    cut["payloads"]
        .as_object_mut()
        .expect("payloads")
        .remove(&step.to_string());
    cut["facts"]["consumed_by"] = Value::Null;
    let cut_path = dir.path().join("cut.json");
    std::fs::write(&cut_path, serde_json::to_string(&cut).expect("json")).expect("write");
    let (code, _, stderr) = verify_complete(&cut_path);
    assert_eq!(code, 2, "a left-out entry is found: {stderr}");

    // A different trusted head: the bundle does not belong to that log.
    let wrong = format!(
        "{}{}",
        if head.starts_with('0') { "1" } else { "0" },
        &head[1..]
    );
    let (code, _, stderr) = gyre(&[
        "audit",
        "verify",
        bundle.to_str().expect("utf-8"),
        "--head",
        &wrong,
    ]);
    assert_eq!(code, 2);
    assert!(stderr.contains("trusted head"), "{stderr}");

    // A rewritten fact no longer matches the cited entries.
    value["facts"]["closed"]["status"] = Value::String("failed".into());
    let forged = dir.path().join("forged.json");
    std::fs::write(&forged, serde_json::to_string(&value).expect("json")).expect("write forged");
    let (code, _, stderr) = gyre(&[
        "audit",
        "verify",
        forged.to_str().expect("utf-8"),
        "--head",
        &head,
    ]);
    assert_eq!(code, 2);
    assert!(stderr.contains("facts differ"), "{stderr}");
}

/// A control node's data directory replays in place: every node of a soaked cluster (snapshots
/// and purges under writes, restarts, small segments so purges remove whole segments) rebuilds
/// the digest the cluster agreed on. Without an archive replay must start from the newest
/// snapshot; with one (purged segments moved to `archive/`, the default) a node that kept its
/// whole log replays it from entry 1. A flipped byte in a node's segment is named with the
/// segment and offset.
#[test]
fn node_data_dirs_replay_to_the_cluster_digest() {
    data_dirs_replay_to_the_cluster_digest(false);
    data_dirs_replay_to_the_cluster_digest(true);
}

fn data_dirs_replay_to_the_cluster_digest(archive: bool) {
    let dir = tempfile::tempdir().expect("tempdir");
    let keep = dir.path().join("cluster");
    let (code, stdout, stderr) = gyre(&[
        "control",
        "soak",
        "--archive-purged",
        if archive { "true" } else { "false" },
        "--seconds",
        "2",
        "--restart-every",
        "1",
        "--segment-bytes",
        "65536",
        // Small, so that a purged first segment does not depend on how many entries a loaded
        // host commits in two seconds.
        "--snapshot-every",
        "16",
        "--keep-behind-snapshot",
        "4",
        "--keep-data",
        keep.to_str().expect("utf-8"),
    ]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    // "node 1: applied N, ..., digest HEX, acknowledged records missing 0"
    let digest = stdout
        .lines()
        .find(|line| line.starts_with("node 1:"))
        .and_then(|line| line.split("digest ").nth(1))
        .and_then(|rest| rest.split(',').next())
        .expect("the soak prints node 1's digest")
        .to_string();
    let mut whole = 0;
    for node in 1..=3 {
        let path = keep.join(format!("node-{node}"));
        let (code, report) = replay_json(&["replay", path.to_str().expect("utf-8"), "--json"]);
        assert_eq!(code, 0, "{report}");
        assert!(report["problem"].is_null(), "{report}");
        assert_eq!(
            report["final_state"]["digest"],
            digest.as_str(),
            "node {node}"
        );
        if archive {
            // A node restarted behind the others may have received a snapshot (its log then
            // restarts there); the others hold their whole log.
            whole += usize::from(report["started_from_snapshot"].is_null());
        } else {
            assert!(
                report["started_from_snapshot"].as_u64() > Some(1),
                "the purged log starts from a snapshot: {}",
                report["started_from_snapshot"]
            );
        }
        assert!(report["entries"].as_u64() >= report["started_from_snapshot"].as_u64());
        // `--at` stops the fold early: the reading thread must stop too, and the state is the
        // one at that entry.
        let start = report["started_from_snapshot"].as_u64().unwrap_or(0);
        if report["entries"].as_u64() > Some(start + 1) {
            let at = (start + 1).to_string();
            let (code, early) = replay_json(&[
                "replay",
                path.to_str().expect("utf-8"),
                "--at",
                &at,
                "--json",
            ]);
            assert_eq!(code, 0, "{early}");
            assert_eq!(early["entries"].as_u64(), Some(start + 1), "{early}");
            assert_eq!(early["final_state"]["entry"].as_u64(), Some(start + 1));
        }
    }

    if archive {
        assert!(whole >= 1, "some node replays its whole log from entry 1");
        return;
    }
    let segment = std::fs::read_dir(keep.join("node-3/log"))
        .expect("segments")
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .find(|path| path.extension().is_some_and(|ext| ext == "seg"))
        .expect("a segment");
    let mut bytes = std::fs::read(&segment).expect("read segment");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(&segment, &bytes).expect("write segment");
    let path = keep.join("node-3");
    let (code, report) = replay_json(&["replay", path.to_str().expect("utf-8"), "--json"]);
    assert_eq!(code, 2, "a damaged segment must fail: {report}");
    let message = report["problem"]["message"].as_str().expect("message");
    assert!(
        message.contains(".seg") && message.contains("offset"),
        "{message}"
    );
}

/// A directory that is not a node's data directory is refused with a reason.
#[test]
fn a_plain_directory_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (code, _, stderr) = gyre(&["replay", dir.path().to_str().expect("utf-8")]);
    assert_ne!(code, 0);
    assert!(stderr.contains("no log/ directory"), "{stderr}");
}

/// A proxy's own event file (`gyre proxy --log`) holds model calls and no scheduler events:
/// `gyre replay` verifies it and `gyre audit` bundles an execution's calls (`started: null`),
/// and the bundle verifies against the file's head.
#[test]
fn a_proxy_event_file_replays_and_audits() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("proxy.log");
    let log_arg = log.to_str().expect("utf-8");
    let mut proxy = crate::support::ProxyProcess::start(&[
        "--listen",
        "127.0.0.1:0",
        "--engine",
        "deterministic",
        "--open",
        "1",
        "--log",
        log_arg,
    ]);
    let opened = proxy.next_json();
    let address = proxy.address.clone();
    let token = opened["token"].as_str().unwrap();
    // The last question is asked twice (after its answer arrived): sampled anew, and the
    // post-mortem counts the repeated prompt.
    for text in ["hello", "and again", "and again"] {
        let body = serde_json::json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": text}]});
        let (status, answer) = crate::support::http(
            &address,
            "POST",
            "/v1/messages",
            &[("x-api-key", token), ("content-type", "application/json")],
            &body.to_string(),
        );
        assert_eq!(status, 200, "{answer}");
    }
    proxy.kill();

    let path = log.to_str().expect("utf-8");
    let (code, stdout, stderr) = gyre(&["replay", path]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("model_call                           3"),
        "{stdout}"
    );
    assert!(
        stdout.contains("model calls: 3 in 1 executions (1 agents): 2 roots, 0 branches"),
        "two separate conversations are two roots: {stdout}"
    );
    assert!(
        stdout.contains("prompts sampled more than once: 1"),
        "{stdout}"
    );
    let bundle = dir.path().join("bundle.json");
    let bundle_path = bundle.to_str().expect("utf-8");
    let (code, _, stderr) = gyre(&["audit", path, "--execution", "1", "--out", bundle_path]);
    assert_eq!(code, 0, "{stderr}");
    let value: Value = serde_json::from_str(&std::fs::read_to_string(&bundle).unwrap()).unwrap();
    assert!(value["facts"]["started"].is_null());
    assert_eq!(
        value["facts"]["model_calls"].as_array().map(Vec::len),
        Some(3)
    );
    let head = value["head"].as_str().unwrap().to_string();
    let (code, stdout, stderr) = gyre(&["audit", "verify", bundle_path, "--head", &head]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.starts_with("ok:"), "{stdout}");
    // An execution with neither a start nor a call is still an error naming it.
    let (code, _, stderr) = gyre(&["audit", path, "--execution", "9", "--out", bundle_path]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("execution e9 never started and made no model call"),
        "{stderr}"
    );
}

/// A directory captured by the research tools' fake servers (one `NNNN-METHOD-path.json` per
/// request) replays through a proxy started with `--auto-open`: its model-API calls are sent
/// in order as one execution, the rest skipped, and every answer is whole.
#[test]
fn a_research_capture_directory_replays_through_a_proxy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let captured = dir.path().join("cc_log");
    std::fs::create_dir(&captured).expect("capture dir");
    let write = |name: &str, value: Value| {
        std::fs::write(captured.join(name), value.to_string()).expect("write");
    };
    let question = serde_json::json!({"role": "user", "content": "Say hi."});
    write(
        "0001-HEAD-api_hello.json",
        serde_json::json!({"n": 1, "method": "HEAD", "path": "/api/hello", "headers": {}, "body": null, "body_raw": ""}),
    );
    write(
        "0002-POST-v1_messages.json",
        serde_json::json!({"n": 2, "method": "POST", "path": "/v1/messages?beta=true",
            "headers": {"Host": "127.0.0.1:9", "X-Api-Key": "<redacted>", "Anthropic-Version": "2023-06-01"},
            "body": {"model": "claude-sonnet", "max_tokens": 16, "stream": true, "messages": [question]},
            "body_raw": null}),
    );
    write(
        "0003-POST-v1_messages.json",
        serde_json::json!({"n": 3, "method": "POST", "path": "/v1/messages?beta=true",
            "headers": {"X-Api-Key": "<redacted>"},
            "body": {"model": "claude-sonnet", "max_tokens": 16, "messages": [
                question, {"role": "assistant", "content": "Hi."}, {"role": "user", "content": "Again."}]},
            "body_raw": null}),
    );
    let log = dir.path().join("proxy.log");
    let mut proxy = crate::support::ProxyProcess::start(&[
        "--listen",
        "127.0.0.1:0",
        "--engine",
        "deterministic",
        "--auto-open",
        "--log",
        log.to_str().expect("utf-8"),
    ]);
    let url = proxy.url();
    let (code, stdout, stderr) = gyre(&[
        "capture",
        "replay",
        captured.to_str().expect("utf-8"),
        "--url",
        &url,
    ]);
    proxy.kill();
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let answers: Vec<Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect();
    assert_eq!(
        answers.len(),
        2,
        "the two model calls, not the preflight: {stdout}"
    );
    for answer in &answers {
        assert_eq!(answer["status"], 200, "{answer}");
        assert_eq!(answer["complete"], true, "{answer}");
    }
    assert_eq!(
        (answers[0]["seq"].as_u64(), answers[1]["seq"].as_u64()),
        (Some(2), Some(3))
    );
}

/// A group whose members started in different entries, a member evaluated on two artifacts
/// before its close and on a third after it, a refused second start and a start only the
/// whole state refuses (listed in the bundle, skipped by the facts): the bundle's rewards
/// and advantage are the scoring projection's (the highest artifact version at the close is
/// designated and stays frozen; the refused start changes nothing), every member's start is
/// cited, and the genuine bundle verifies.
#[test]
fn audit_facts_are_the_scoring_projections_and_a_genuine_bundle_verifies() {
    use gyre_event::{
        CloseStatus, DispatchedGroup, Event, EventBody, ExecutionId, GroupId, PolicyVersion,
        QueryId, Timestamp,
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("scoring.log");
    let at = |seconds: u64| Timestamp(seconds * 1_000_000_000);
    let start = |execution: u64, group: u64| EventBody::ExecutionStarted {
        execution: ExecutionId(execution),
        group: GroupId(group),
        engine: gyre_event::EngineId(0),
    };
    let close = |execution: u64| EventBody::ExecutionClosed {
        execution: ExecutionId(execution),
        status: CloseStatus::Completed,
    };
    let requested =
        |execution: u64, attempt: u32, artifact_version: u64| EventBody::EvaluationRequested {
            execution: ExecutionId(execution),
            attempt,
            artifact_version,
            branch_ref: format!("b{execution}"),
        };
    let completed = |execution: u64, attempt: u32, artifact_version: u64, score: f64| {
        EventBody::EvaluationCompleted {
            execution: ExecutionId(execution),
            attempt,
            score,
            valid: true,
            evaluated_state_ref: format!("s{execution}.{attempt}"),
            artifact_version,
            branch_ref: format!("b{execution}"),
            evaluator: "test".into(),
        }
    };
    // A run the whole state accepts: (φ + μ)·B = 2 groups of N = 2 owed, one rollout engine.
    let config = gyre_event::RunConfig {
        run_seed: 1,
        mode: gyre_event::SchedulingMode::Elastic,
        streaming: false,
        phi: 0.0,
        mu: 2,
        n: 2,
        b: 1,
        steps: 4,
        rho_min: 0.0,
        tau: gyre_event::Duration::from_secs(0),
        j_max: 1,
        async_training_cells: 1,
    };
    let engine = gyre_event::EngineId(0);
    let entries: Vec<Vec<EventBody>> = vec![
        vec![
            EventBody::RunStarted(config),
            EventBody::StandalonePoolRegistered {
                engine,
                rollout_capacity: 4,
                nodes: 1,
            },
            EventBody::EngineReady { engine },
            EventBody::GroupsDispatched {
                groups: vec![
                    DispatchedGroup {
                        group: GroupId(0),
                        query: QueryId(0),
                    },
                    DispatchedGroup {
                        group: GroupId(1),
                        query: QueryId(1),
                    },
                ],
                executions_per_group: 2,
                policy_version: PolicyVersion(0),
            },
        ],
        vec![start(0, 0)],
        // e0's artifacts are evaluated while it runs; at its close the highest version (0.9)
        // is designated.
        vec![
            requested(0, 0, 1),
            completed(0, 0, 1, 0.1),
            requested(0, 1, 2),
            completed(0, 1, 2, 0.9),
            close(0),
            start(1, 0),
        ],
        // Refused by the projection: e1 already started (in g0). And a start the scoring
        // projection alone would take (a new member of g0, which then never closes) but the
        // whole state refuses (execution ids start in order: e2 is next).
        vec![start(1, 1), start(7, 0)],
        // A later artifact's evaluation after the designation is kept, but replaces nothing.
        vec![requested(0, 2, 3), completed(0, 2, 3, 0.2)],
        vec![close(1), requested(1, 0, 1), completed(1, 0, 1, 0.5)],
    ];
    let mut writer = gyre_log::EventFileWriter::create(&path).expect("event file");
    for (number, bodies) in entries.into_iter().enumerate() {
        let events: Vec<Event> = bodies
            .into_iter()
            .map(|body| Event::new(at(number as u64 + 1), body))
            .collect();
        writer.append_batch(&events).expect("appended");
    }
    writer.sync().expect("synced");
    for (execution, reward, sign) in [("e0", 0.9, 1.0), ("e1", 0.5, -1.0)] {
        let bundle = dir.path().join(format!("{execution}.json"));
        let (code, _, stderr) = gyre(&[
            "audit",
            path.to_str().expect("utf-8"),
            "--execution",
            execution,
            "--out",
            bundle.to_str().expect("utf-8"),
        ]);
        assert_eq!(code, 0, "{stderr}");
        let value: Value =
            serde_json::from_str(&std::fs::read_to_string(&bundle).expect("bundle")).expect("json");
        let facts = &value["facts"];
        assert_eq!(facts["group"], "g0", "{facts}");
        assert_eq!(facts["designated_result"]["score"], reward, "{facts}");
        // Frozen by e0's close (entry 3) and e1's completion (entry 6).
        let frozen_in = if execution == "e0" { 3 } else { 6 };
        assert_eq!(
            facts["designated_result"]["frozen_in"], frozen_in,
            "{facts}"
        );
        assert_eq!(
            facts["group_rewards"],
            serde_json::json!([["e0", 0.9], ["e1", 0.5]]),
            "the highest artifact version at the close is designated, and stays"
        );
        let advantage = facts["advantage"].as_f64().expect("the group is ready");
        assert!((advantage - sign).abs() < 1e-3, "{advantage}");
        let payloads = value["payloads"].as_object().expect("payloads");
        assert!(
            payloads.contains_key("2") && payloads.contains_key("3"),
            "both members' starts are cited: {:?}",
            payloads.keys().collect::<Vec<_>>()
        );
        // The start only the whole state refused (e7 in g0) is in both bundles; e1's bundle
        // also lists e1's own refused second start.
        let refused = if execution == "e0" {
            serde_json::json!([[4, 1]])
        } else {
            serde_json::json!([[4, 0], [4, 1]])
        };
        assert_eq!(value["state_refused"], refused, "{execution}");
        let head = value["head"].as_str().expect("head").to_string();
        let (code, stdout, stderr) = gyre(&[
            "audit",
            "verify",
            bundle.to_str().expect("utf-8"),
            "--head",
            &head,
        ]);
        assert_eq!(code, 0, "{execution}: {stderr}");
        assert!(stdout.starts_with("ok:"), "{stdout}");
        let taken = format!(
            "taken from the bundle: {} event(s)",
            refused.as_array().map_or(0, Vec::len)
        );
        assert!(stdout.contains(&taken), "{stdout}");
    }
    // A bundle that claims a refusal where the group has no event is refused.
    let bundle = dir.path().join("e0.json");
    let mut forged: Value =
        serde_json::from_str(&std::fs::read_to_string(&bundle).expect("bundle")).expect("json");
    forged["state_refused"] = serde_json::json!([[4, 1], [2, 5]]);
    let forged_path = dir.path().join("forged.json");
    std::fs::write(&forged_path, forged.to_string()).expect("write");
    let head = forged["head"].as_str().expect("head").to_string();
    let (code, _, stderr) = gyre(&[
        "audit",
        "verify",
        forged_path.to_str().expect("utf-8"),
        "--head",
        &head,
    ]);
    assert_ne!(code, 0);
    assert!(stderr.contains("as refused by the whole state"), "{stderr}");
    // A head that is not hex is refused, never a crash.
    let bundle = dir.path().join("e0.json");
    let (code, _, stderr) = gyre(&[
        "audit",
        "verify",
        bundle.to_str().expect("utf-8"),
        "--head",
        "aéb",
    ]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("not a hex digit"), "{stderr}");
}

/// An event every replica refused (a client's `engine_ready` for an engine that does not
/// exist) is folded as the same no-op: replay goes on past it, verifies the digest after it
/// and lists it. A file that starts past entry 1 (an export of a purged log) is replayed as
/// partial: the chain is verified, digests are not, and `--at` before its start is refused.
#[test]
fn refused_events_are_listed_and_a_partial_file_says_so() {
    use gyre_event::{Event, EventBody, Timestamp};
    let dir = tempfile::tempdir().expect("tempdir");
    let tick = |seconds: u64| Event::new(Timestamp(seconds * 1_000_000_000), EventBody::Tick);
    let refused = Event::new(
        Timestamp(2_000_000_000),
        EventBody::EngineReady {
            engine: gyre_event::EngineId(5),
        },
    );
    let digest_of = |events: &[Event]| {
        let mut state = gyre_state::ControlState::new();
        for event in events {
            let _ = state.apply(event);
        }
        state.digest()
    };
    let entries = vec![
        vec![tick(1)],
        vec![refused.clone(), tick(2)],
        vec![Event::new(
            Timestamp(3_000_000_000),
            EventBody::ProjectionDigest {
                upto: gyre_event::LogIndex(2),
                hash: digest_of(&[tick(1), refused, tick(2)]),
                // Not stated, as in a log written before rules were recorded: still checked.
                rules: 0,
            },
        )],
        vec![tick(4)],
    ];
    let whole = dir.path().join("whole.log");
    let mut writer = gyre_log::EventFileWriter::create(&whole).expect("event file");
    for events in &entries {
        writer.append_batch(events).expect("appended");
    }
    writer.sync().expect("synced");
    let (code, report) = replay_json(&["replay", whole.to_str().expect("utf-8"), "--json"]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["events_refused"], 1, "{report}");
    assert_eq!(report["refused"][0]["entry"], 2);
    assert_eq!(report["refused"][0]["kind"], "engine_ready");
    assert_eq!(
        report["digests_verified"], 1,
        "the digest after the refusal"
    );
    assert_eq!(report["entries"], 4);
    assert!(report["partial_from"].is_null());

    // Entries 3 and 4 alone, chained on from entry 2's hash.
    let partial = dir.path().join("partial.log");
    let mut writer = gyre_log::EventFileWriter::create_at(&partial, 3, [7u8; 32]).expect("file");
    for events in &entries[2..] {
        writer.append_batch(events).expect("appended");
    }
    writer.sync().expect("synced");
    let (code, report) = replay_json(&["replay", partial.to_str().expect("utf-8"), "--json"]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["partial_from"], 3, "{report}");
    assert_eq!(report["entries_read"], 2);
    assert_eq!(report["digests_unchecked"], 1);
    assert_eq!(report["digests_verified"], 0);
    let (code, report) = replay_json(&[
        "replay",
        partial.to_str().expect("utf-8"),
        "--at",
        "2",
        "--json",
    ]);
    assert_eq!(code, 2, "{report}");
    assert_eq!(report["problem"]["kind"], "index_out_of_range", "{report}");
}

/// Events about the execution that no replica applied are never facts: a start the whole state
/// refused (in another group, so the verifier would otherwise pick that group) and a model call
/// after the close (records are frozen there) are listed in `state_refused`, carried, and left
/// out of the facts; the genuine bundle verifies.
#[test]
fn audit_lists_what_the_whole_state_refused_about_the_execution() {
    use gyre_event::{
        CallId, CallKind, CloseStatus, DispatchedGroup, Duration, EngineId, Event, EventBody,
        ExecutionId, GroupId, ModelCallRecord, PolicyVersion, QueryId, RunConfig, SchedulingMode,
        Timestamp,
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("refusals.log");
    let config = RunConfig {
        run_seed: 1,
        mode: SchedulingMode::Elastic,
        streaming: true,
        phi: 0.0,
        mu: 1,
        n: 1,
        b: 2,
        steps: 1,
        rho_min: 0.0,
        tau: Duration::from_secs(0),
        j_max: 1,
        async_training_cells: 0,
    };
    let engine = EngineId(0);
    let start = |execution: u64, group: u64| EventBody::ExecutionStarted {
        execution: ExecutionId(execution),
        group: GroupId(group),
        engine,
    };
    let late_call = ModelCallRecord {
        execution: ExecutionId(0),
        call: CallId(1),
        agent: "main".to_string(),
        kind: CallKind::Turn,
        parent_call: None,
        reused_prefix_tokens_count: 0,
        spawned_by: None,
        input_ids: vec![1, 2],
        input_provenance: vec![],
        output_ids: vec![10],
        output_logprobs: vec![-0.5],
        engine,
        policy_version: PolicyVersion(0),
        requested_at: Timestamp(0),
        first_token_after: Duration(0),
        completed_after: Duration(0),
        stop_sequences: Vec::new(),
        output_constraint: None,
        sampling: gyre_event::SamplingSettings::POLICY,
    };
    let entries: Vec<Vec<EventBody>> = vec![
        vec![
            EventBody::RunStarted(config),
            EventBody::StandalonePoolRegistered {
                engine,
                rollout_capacity: 4,
                nodes: 1,
            },
            EventBody::EngineReady { engine },
            EventBody::GroupsDispatched {
                groups: vec![
                    DispatchedGroup {
                        group: GroupId(0),
                        query: QueryId(0),
                    },
                    DispatchedGroup {
                        group: GroupId(1),
                        query: QueryId(1),
                    },
                ],
                executions_per_group: 1,
                policy_version: PolicyVersion(0),
            },
        ],
        // g1 is not at the front of the start queue: refused; then the start that counts.
        vec![start(0, 1), start(0, 0)],
        vec![EventBody::ExecutionClosed {
            execution: ExecutionId(0),
            status: CloseStatus::Completed,
        }],
        vec![EventBody::ModelCall(Box::new(late_call))],
    ];
    let mut writer = gyre_log::EventFileWriter::create(&path).expect("event file");
    for (number, bodies) in entries.into_iter().enumerate() {
        let at = Timestamp((number as u64 + 1) * 1_000_000_000);
        let events: Vec<Event> = bodies.into_iter().map(|b| Event::new(at, b)).collect();
        writer.append_batch(&events).expect("appended");
    }
    writer.sync().expect("synced");
    let bundle = dir.path().join("e0.json");
    let (code, _, stderr) = gyre(&[
        "audit",
        path.to_str().expect("utf-8"),
        "--execution",
        "e0",
        "--out",
        bundle.to_str().expect("utf-8"),
        "--complete",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let value: Value =
        serde_json::from_str(&std::fs::read_to_string(&bundle).expect("bundle")).expect("json");
    assert_eq!(value["facts"]["group"], "g0", "{value}");
    assert_eq!(value["facts"]["model_calls"], serde_json::json!([]));
    assert_eq!(value["state_refused"], serde_json::json!([[2, 0], [4, 0]]));
    let head = value["head"].as_str().expect("head").to_string();
    let (code, stdout, stderr) = gyre(&[
        "audit",
        "verify",
        bundle.to_str().expect("utf-8"),
        "--head",
        &head,
    ]);
    assert_eq!(code, 0, "a genuine bundle verifies: {stdout} {stderr}");
    assert!(
        stdout.contains("taken from the bundle: 2 event(s)"),
        "{stdout}"
    );
}

/// Digest checkpoints state the fold rules their writer folded by. A log whose checkpoints
/// state this build's rules verifies and the report names them; one written by a build of
/// other rules stops at its first checkpoint with both versions named (not a bare digest
/// mismatch), exit 2, everything before it still replayed.
#[test]
fn a_checkpoint_of_other_fold_rules_is_named_not_compared() {
    use gyre_event::{Event, EventBody, Timestamp};
    let dir = tempfile::tempdir().expect("tempdir");
    let tick = |seconds: u64| Event::new(Timestamp(seconds * 1_000_000_000), EventBody::Tick);
    let mut state = gyre_state::ControlState::new();
    state.apply(&tick(1)).expect("a tick folds");
    let hash = state.digest();
    let write = |name: &str, rules: u32| {
        let path = dir.path().join(name);
        let mut writer = gyre_log::EventFileWriter::create(&path).expect("event file");
        writer.append_batch(&[tick(1)]).expect("appended");
        writer
            .append_batch(&[Event::new(
                Timestamp(2_000_000_000),
                EventBody::ProjectionDigest {
                    upto: gyre_event::LogIndex(1),
                    hash,
                    rules,
                },
            )])
            .expect("appended");
        writer.append_batch(&[tick(3)]).expect("appended");
        writer.sync().expect("synced");
        path
    };
    let ours = write("ours.log", gyre_state::FOLD_RULES);
    let (code, report) = replay_json(&["replay", ours.to_str().expect("utf-8"), "--json"]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["digests_verified"], 1, "{report}");
    assert_eq!(report["fold_rules"], gyre_state::FOLD_RULES, "{report}");

    let other = gyre_state::FOLD_RULES + 1;
    let theirs = write("theirs.log", other);
    let (code, report) = replay_json(&["replay", theirs.to_str().expect("utf-8"), "--json"]);
    assert_eq!(code, 2, "{report}");
    assert_eq!(report["problem"]["kind"], "fold_rules_mismatch", "{report}");
    assert_eq!(report["problem"]["entry"], 2, "{report}");
    let message = report["problem"]["message"].as_str().expect("message");
    assert!(
        message.contains(&format!("rules {other}"))
            && message.contains(&format!("rules {}", gyre_state::FOLD_RULES)),
        "{message}"
    );
    assert_eq!(report["fold_rules"], other, "{report}");
    assert_eq!(
        report["entries"], 1,
        "everything before the checkpoint replayed"
    );

    // A partial export's checkpoints are not compared at all: one of other rules is noted and
    // counted unchecked, not a failure.
    let partial = dir.path().join("partial.log");
    let mut writer = gyre_log::EventFileWriter::create_at(&partial, 2, [7u8; 32]).expect("file");
    writer
        .append_batch(&[Event::new(
            Timestamp(2_000_000_000),
            EventBody::ProjectionDigest {
                upto: gyre_event::LogIndex(1),
                hash,
                rules: other,
            },
        )])
        .expect("appended");
    writer.sync().expect("synced");
    let (code, report) = replay_json(&["replay", partial.to_str().expect("utf-8"), "--json"]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["digests_unchecked"], 1, "{report}");
    assert_eq!(report["fold_rules"], other, "{report}");

    let unstated = write("unstated.log", 0);
    let (code, report) = replay_json(&["replay", unstated.to_str().expect("utf-8"), "--json"]);
    assert_eq!(code, 0, "{report}");
    assert!(report["fold_rules"].is_null(), "{report}");
}
