//! Multi-process test of the control quorum (issue 4, item 5): three `gyre control run`
//! processes on loopback, a writer appending while the leader and a follower are SIGKILLed
//! (`Child::kill`) and restarted, repeatedly. Afterwards every acknowledged event is in the log
//! (`gyre log tail` from 0) at the sequence it was acknowledged with, and every node reports the
//! same digest at the same applied index. All waits poll with bounded deadlines.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gyre_control::{ClusterClient, Sequence};
use gyre_event::{Event, EventBody, ExecutionId, Timestamp};

const BOUND: Duration = Duration::from_secs(20);

fn gyre() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gyre"))
}

/// `gyre log append --cluster CLUSTER` with `lines` on its stdin, run to its end.
fn log_append(cluster: &str, lines: &str) -> std::process::Output {
    gyre()
        .args(["log", "append", "--cluster", cluster])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(lines.as_bytes())?;
            child.wait_with_output()
        })
        .expect("append runs")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind an ephemeral port")
        .local_addr()
        .expect("local address")
        .port()
}

struct Cluster {
    dir: PathBuf,
    addresses: BTreeMap<u64, String>,
    children: BTreeMap<u64, Child>,
}

impl Cluster {
    fn peers(&self) -> String {
        self.addresses
            .iter()
            .map(|(id, a)| format!("{id}={a}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn cluster(&self) -> String {
        self.addresses
            .values()
            .cloned()
            .collect::<Vec<_>>()
            .join(",")
    }

    fn start(&mut self, id: u64) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("node-{id}.stderr")))
            .expect("stderr file");
        let child = gyre()
            .args(["control", "run", "--id", &id.to_string()])
            .arg("--data-dir")
            .arg(self.dir.join(format!("node-{id}")))
            .args([
                "--listen",
                &self.addresses[&id],
                "--peers",
                &self.peers(),
                "--snapshot-every",
                "200",
            ])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("gyre control run starts");
        self.children.insert(id, child);
    }

    fn kill(&mut self, id: u64) {
        if let Some(mut child) = self.children.remove(&id) {
            child.kill().expect("SIGKILL");
            child.wait().expect("reaped");
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for child in self.children.values_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn stderr_of(dir: &Path) -> String {
    (1..=3)
        .map(|id| {
            let text =
                std::fs::read_to_string(dir.join(format!("node-{id}.stderr"))).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(15).collect();
            format!(
                "--- node {id} ---\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn marker_event(marker: u64) -> Event {
    Event::new(
        Timestamp::ZERO,
        EventBody::EvaluationFailed {
            execution: ExecutionId(marker),
            attempt: 1,
            reason: format!("writer-{marker}"),
        },
    )
}

/// The leader as all reachable nodes agree, polled until `BOUND`.
fn wait_leader(runtime: &tokio::runtime::Runtime, cluster: &Cluster, dir: &Path) -> u64 {
    let started = Instant::now();
    loop {
        let statuses = runtime.block_on(async {
            let mut client = ClusterClient::new(&cluster.cluster()).expect("client");
            client.status_all().await
        });
        let leaders: Vec<u64> = statuses
            .iter()
            .filter_map(|(_, s)| s.as_ref().ok())
            .filter(|s| s.server_state == "Leader")
            .map(|s| s.node_id)
            .collect();
        if leaders.len() == 1 && cluster.children.contains_key(&leaders[0]) {
            return leaders[0];
        }
        assert!(
            started.elapsed() < BOUND,
            "no leader within {BOUND:?}\n{}",
            stderr_of(dir)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn wait_progress(acked: &Mutex<Vec<(Sequence, u64)>>, more: usize, dir: &Path) {
    let target = acked.lock().expect("acked").len() + more;
    let started = Instant::now();
    while acked.lock().expect("acked").len() < target {
        assert!(
            started.elapsed() < BOUND,
            "writer made no progress within {BOUND:?}\n{}",
            stderr_of(dir)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn kill_leader_and_follower_under_writes_loses_nothing_acknowledged() {
    let temp = tempfile::tempdir().expect("temp dir");
    let dir = temp.path().to_path_buf();
    let mut cluster = Cluster {
        dir: dir.clone(),
        addresses: (1..=3)
            .map(|id| (id, format!("127.0.0.1:{}", free_port())))
            .collect(),
        children: BTreeMap::new(),
    };
    for id in 1..=3 {
        cluster.start(id);
    }
    let init = gyre()
        .args(["control", "init", "--nodes", &cluster.peers()])
        .output()
        .expect("init runs");
    assert!(
        init.status.success(),
        "init failed: {}\n{}",
        String::from_utf8_lossy(&init.stderr),
        stderr_of(&dir)
    );

    let runtime = crate::support::runtime();
    let acked: Arc<Mutex<Vec<(Sequence, u64)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let acked = acked.clone();
        let stop = stop.clone();
        let addresses = cluster.cluster();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                let mut client = ClusterClient::new(&addresses).expect("client");
                client.retry_deadline = Duration::from_secs(2);
                let mut marker = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let events: Vec<Event> = (0..4).map(|k| marker_event(marker + k)).collect();
                    if let Ok((sequences, _)) = client.append(&events).await {
                        let mut acked = acked.lock().expect("acked");
                        for (k, sequence) in sequences.into_iter().enumerate() {
                            acked.push((sequence, marker + k as u64));
                        }
                    }
                    marker += 4;
                }
            })
        })
    };

    wait_progress(&acked, 40, &dir);
    for _round in 0..3 {
        let leader = wait_leader(&runtime, &cluster, &dir);
        cluster.kill(leader);
        wait_progress(&acked, 40, &dir);
        cluster.start(leader);
        wait_progress(&acked, 20, &dir);
        let leader = wait_leader(&runtime, &cluster, &dir);
        let follower = (1..=3).find(|id| *id != leader).expect("a follower");
        cluster.kill(follower);
        wait_progress(&acked, 40, &dir);
        cluster.start(follower);
        wait_progress(&acked, 20, &dir);
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().expect("writer thread");
    let acked = acked.lock().expect("acked").clone();

    // Equal digests at equal applied index on every node (the leader's idle ticks keep moving
    // the index, so poll until one round of status calls sees all three at one index).
    let started = Instant::now();
    loop {
        let statuses = runtime.block_on(async {
            let mut client = ClusterClient::new(&cluster.cluster()).expect("client");
            client.status_all().await
        });
        let ok: Vec<_> = statuses.into_iter().filter_map(|(_, s)| s.ok()).collect();
        for status in &ok {
            assert!(
                status.fatal.is_empty(),
                "node {} halted: {}",
                status.node_id,
                status.fatal
            );
        }
        if ok.len() == 3
            && ok
                .iter()
                .all(|s| s.last_applied_index == ok[0].last_applied_index)
        {
            for status in &ok {
                assert_eq!(
                    status.digest_hex, ok[0].digest_hex,
                    "digests differ at index {}",
                    ok[0].last_applied_index
                );
            }
            break;
        }
        assert!(
            started.elapsed() < BOUND,
            "nodes never reached one applied index\n{}",
            stderr_of(&dir)
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // Every acknowledged event is in the log at its acknowledged sequence.
    let tail = gyre()
        .args([
            "log",
            "tail",
            "--cluster",
            &cluster.cluster(),
            "--from",
            "0",
        ])
        .output()
        .expect("tail runs");
    assert!(
        tail.status.success(),
        "tail failed: {}",
        String::from_utf8_lossy(&tail.stderr)
    );
    let mut in_log = BTreeMap::new();
    for line in String::from_utf8_lossy(&tail.stdout).lines() {
        let value: serde_json::Value = serde_json::from_str(line).expect("tail prints JSON lines");
        if let Some(reason) = value["reason"].as_str() {
            if let Some(marker) = reason.strip_prefix("writer-") {
                let seq = value["seq"].as_str().expect("seq").to_string();
                in_log.insert(marker.parse::<u64>().expect("marker"), seq);
            }
        }
    }
    assert!(
        acked.len() >= 200,
        "only {} events acknowledged",
        acked.len()
    );
    for (sequence, marker) in &acked {
        assert_eq!(
            in_log.get(marker),
            Some(&sequence.to_string()),
            "acknowledged event {marker} at {sequence} is missing"
        );
    }

    // The operator path: append a JSON line, see its sequence; export a node's log to a file.
    let mut append = gyre()
        .args(["log", "append", "--cluster", &cluster.cluster()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("append runs");
    {
        use std::io::Write;
        let mut stdin = append.stdin.take().expect("stdin");
        writeln!(stdin, r#"{{"kind":"tick"}}"#).expect("write");
    }
    let appended = append.wait_with_output().expect("append finishes");
    assert!(appended.status.success());
    let printed = String::from_utf8_lossy(&appended.stdout);
    let sequence: Sequence = printed
        .trim()
        .parse()
        .expect("append prints INDEX.POSITION");
    assert!(sequence.index > 0);

    let bad = log_append(&cluster.cluster(), "{\"kind\":\"no_such_kind\"}\n");
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("stdin line 1"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );

    // A digest from a client would halt every replica (each compares it with its own
    // projection): refused, and the quorum keeps serving.
    let digest = log_append(
        &cluster.cluster(),
        &format!(
            "{{\"kind\":\"projection_digest\",\"upto\":1,\"hash\":\"{}\"}}\n",
            "ab".repeat(32)
        ),
    );
    assert!(!digest.status.success());
    let said = String::from_utf8_lossy(&digest.stderr);
    assert!(
        said.contains("`projection_digest` events are written by the leader only"),
        "{said}"
    );

    let out = dir.join("export.log");
    let export = gyre()
        .args(["log", "export", "--node", &cluster.addresses[&1]])
        .arg("--out")
        .arg(&out)
        .output()
        .expect("export runs");
    assert!(
        export.status.success(),
        "export failed: {}",
        String::from_utf8_lossy(&export.stderr)
    );
    let records = gyre_log::EventFileReader::read_all_events(&out).expect("the export reads back");
    let markers_in_file = records
        .iter()
        .flat_map(|(_, events)| events)
        .filter(|event| matches!(&event.body, EventBody::EvaluationFailed { reason, .. } if reason.starts_with("writer-")))
        .count();
    assert!(
        markers_in_file >= acked.len(),
        "export holds {markers_in_file} writer events, {} were acknowledged",
        acked.len()
    );
    for (sequence, _) in &acked {
        assert!(
            records.iter().any(|(index, _)| *index == sequence.index),
            "entry {} missing from the export",
            sequence.index
        );
    }
}

/// A bad node list or address list on the command line is named by its flag, and not called
/// a "bad request" (no node refused anything).
#[test]
fn bad_node_lists_are_named_by_their_flag() {
    for (args, wanted) in [
        (
            &["control", "init", "--nodes", "garbage"][..],
            "error: --nodes: \"garbage\" is not ID=HOST:PORT",
        ),
        (
            &["control", "status", "--cluster", ""][..],
            "error: --cluster: no node addresses given",
        ),
        (
            &["log", "tail", "--cluster", ""][..],
            "error: --cluster: no node addresses given",
        ),
    ] {
        let output = gyre().args(args).output().expect("gyre runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.trim(), wanted, "{args:?}");
    }
}
