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

/// An in-process cluster of three nodes with 16 KiB segments that snapshot every 16 entries and
/// keep 32 behind, so purges remove whole segments all the time; `archive` as given.
async fn purging_cluster(root: &Path, archive: bool) -> (Vec<gyre_control::ControlNode>, String) {
    let mut options = Vec::new();
    for id in 1..=3u64 {
        let listen = format!("127.0.0.1:{}", free_port())
            .parse()
            .expect("address");
        let mut node = gyre_control::NodeOptions::new(id, root.join(format!("node-{id}")), listen);
        node.log.segment_bytes = 16 << 10;
        node.log.archive = archive;
        node.snapshot_every_entries = 16;
        node.entries_kept_behind_snapshot = 32;
        options.push(node);
    }
    let mut nodes = Vec::new();
    for node in &options {
        nodes.push(
            gyre_control::ControlNode::start(node.clone())
                .await
                .expect("node starts"),
        );
    }
    let members = options
        .iter()
        .map(|o| (o.id, o.listen.to_string()))
        .collect();
    let addresses = options
        .iter()
        .map(|o| o.listen.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let mut client = ClusterClient::new(&addresses).expect("client");
    client.retry_deadline = BOUND;
    client
        .initialize(&options[0].listen.to_string(), &members)
        .await
        .expect("cluster initialises");
    (nodes, addresses)
}

/// Appends 400 entries of marker events, one request each, and waits until every node has
/// purged past entry 100. Returns the markers appended.
async fn write_until_purged(addresses: &str) -> u64 {
    let mut client = ClusterClient::new(addresses).expect("client");
    client.retry_deadline = BOUND;
    let mut markers = 0;
    for _ in 0..400 {
        let events: Vec<Event> = (0..3).map(|k| marker_event(markers + k)).collect();
        client.append(&events).await.expect("append commits");
        markers += 3;
    }
    let deadline = Instant::now() + BOUND;
    loop {
        let statuses = client.status_all().await;
        let purged: Vec<u64> = statuses
            .iter()
            .map(|(_, status)| status.as_ref().map_or(0, |status| status.purged_index))
            .collect();
        if purged.iter().all(|purged| *purged > 100) {
            return markers;
        }
        assert!(
            Instant::now() < deadline,
            "the nodes did not purge past entry 100: {purged:?}"
        );
        // Purges follow snapshots, which follow applies: give the nodes a moment (polling with
        // a deadline, not synchronising on time).
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Entry indexes and writer markers of an export of `node` from entry 1.
async fn export_markers(addresses: &str, node: &str) -> (Vec<u64>, Vec<u64>) {
    let mut client = ClusterClient::new(addresses).expect("client");
    let mut stream = client.export(node, 1).await.expect("export starts");
    let (mut indexes, mut markers) = (Vec::new(), Vec::new());
    while let Some(entry) = stream.message().await.expect("export streams") {
        indexes.push(entry.index);
        for event in gyre_log::decode_batch(&entry.batch).expect("batch decodes") {
            if let EventBody::EvaluationFailed { reason, .. } = &event.body {
                if let Some(marker) = reason.strip_prefix("writer-") {
                    markers.push(marker.parse().expect("marker number"));
                }
            }
        }
    }
    (indexes, markers)
}

/// With `archive_purged` (the default of `gyre control run`) a purge moves whole segments to
/// `archive/`, and `ExportLog` from entry 1 streams the whole committed log, purged entries
/// included: no gap, every marker once. (A follower that fell behind and received a snapshot
/// restarts its log there; its export is the gap-free log from that point.) Without the archive
/// the export starts where the purge left the log. `gyre replay` of the data directory of a
/// node whose export is whole starts at entry 1, not from a snapshot.
#[test]
fn purged_segments_are_archived_and_exported() {
    let runtime = crate::support::runtime();
    for archive in [true, false] {
        let temp = tempfile::tempdir().expect("temp dir");
        let root = temp.path().to_path_buf();
        let (nodes, addresses) = runtime.block_on(purging_cluster(&root, archive));
        let written = runtime.block_on(write_until_purged(&addresses));
        let mut whole = Vec::new();
        for (position, address) in addresses.split(',').enumerate() {
            let (indexes, markers) = runtime.block_on(export_markers(&addresses, address));
            assert!(
                indexes.windows(2).all(|pair| pair[1] == pair[0] + 1),
                "archive {archive}, node {address}: the export has no gap"
            );
            if archive {
                let first = *markers.first().expect("markers exported");
                assert_eq!(
                    markers,
                    (first..written).collect::<Vec<_>>(),
                    "node {address}: every marker from its first once, in order"
                );
                if indexes.first() == Some(&1) {
                    assert_eq!(first, 0);
                    whole.push(position as u64 + 1);
                }
            } else {
                assert!(
                    indexes.first() > Some(&1),
                    "node {address}: without an archive the export starts past the purge"
                );
            }
        }
        // `Subscribe` (what `gyre log tail --from` reads) from a purged entry, mid-batch: with
        // the archive it streams from there; without, the node says the entry is purged.
        let tailed = runtime.block_on(async {
            let mut client = ClusterClient::new(&addresses).expect("client");
            client.retry_deadline = BOUND;
            let from = Sequence {
                index: 5,
                position: 1,
            };
            let mut stream = match client.subscribe(from, true).await {
                Ok(stream) => stream,
                Err(error) => return Err(error.to_string()),
            };
            let mut entries = Vec::new();
            loop {
                match stream.message().await {
                    Ok(Some(entry)) => entries.push(entry),
                    Ok(None) => return Ok(entries),
                    Err(status) => return Err(status.message().to_string()),
                }
            }
        });
        if archive {
            let entries = tailed.expect("a tail from a purged entry streams");
            assert_eq!(entries[0].index, 5);
            assert_eq!(entries[0].first_position, 1, "the tail starts mid-batch");
            assert!(
                entries.windows(2).all(|pair| pair[1].index > pair[0].index),
                "in order"
            );
            let markers = entries
                .iter()
                .flat_map(|entry| gyre_log::decode_batch(&entry.batch).expect("decodes"))
                .filter(|event| matches!(event.body, EventBody::EvaluationFailed { .. }))
                .count() as u64;
            // Entry 5 is the fourth request's (1 is the initial membership, 2 the leader's
            // blank, 3 the Tick-free first write...): whatever it is, everything after its
            // first event is there once.
            assert!(
                markers + 12 >= written && markers <= written,
                "{markers} of {written}"
            );
        } else {
            match tailed {
                Err(error) => assert!(error.contains("purged"), "{error}"),
                Ok(entries) => panic!(
                    "without an archive entry 5 is gone, but {} entries from {:?} came",
                    entries.len(),
                    entries.first().map(|entry| entry.index)
                ),
            }
        }
        // `Status` says how much the archive holds (what the disk keeps beyond the live log).
        let statuses = runtime.block_on(async {
            let mut client = ClusterClient::new(&addresses).expect("client");
            client.status_all().await
        });
        for (address, status) in statuses {
            let status = status.expect("status");
            if archive {
                assert!(
                    status.archive_segments > 0 && status.archive_bytes > 0,
                    "{address}: {status:?}"
                );
            } else {
                assert_eq!((status.archive_segments, status.archive_bytes), (0, 0));
            }
        }
        for node in nodes {
            runtime.block_on(node.shutdown()).expect("node stops");
        }
        let archived = |id: u64| {
            std::fs::read_dir(root.join(format!("node-{id}/archive")))
                .map(|listing| listing.count())
                .unwrap_or(0)
        };
        if archive {
            assert!((1..=3).all(|id| archived(id) > 0), "every node archived");
            // At least the leader's export is whole (committing needs it), and its data
            // directory replays from entry 1.
            let node = *whole.first().expect("some node exports the whole log");
            let data = root.join(format!("node-{node}"));
            let output = gyre()
                .args(["replay", data.to_str().expect("utf-8"), "--json"])
                .output()
                .expect("replay runs");
            let report: serde_json::Value =
                serde_json::from_slice(&output.stdout).expect("replay prints JSON");
            assert_eq!(output.status.code(), Some(0), "{report}");
            assert!(report["started_from_snapshot"].is_null(), "{report}");
            assert!(report["problem"].is_null(), "{report}");
        } else {
            assert!((1..=3).all(|id| archived(id) == 0), "nothing archived");
        }
    }
}

/// A follower that was down while the others snapshotted and purged their logs past its last
/// entry catches up from a snapshot the leader streams over `FullSnapshot` (here in chunks of
/// 16 bytes, so many of them: the sender reads the file a chunk at a time and the receiver
/// writes each as it arrives). Afterwards it holds the leader's snapshot as a file of its own
/// (renamed into place, no `incoming-` file left), applies what follows, and every node
/// reports the same digest at the same applied index.
#[test]
fn a_follower_behind_a_purge_catches_up_from_a_streamed_snapshot() {
    use gyre_log::raft::openraft::ServerState;
    let runtime = crate::support::runtime();
    runtime.block_on(async {
        let mut cluster = crate::support::InProcessCluster::start_with(|options| {
            options.snapshot_every_entries = 4;
            options.entries_kept_behind_snapshot = 0;
            options.snapshot_chunk_bytes = 16;
        })
        .await;
        let leader = cluster.leader_id().await;
        let down = cluster
            .nodes
            .iter()
            .position(|node| node.id != leader)
            .expect("a follower");
        let follower = cluster.nodes.remove(down);
        let follower_id = follower.id;
        let behind = follower
            .raft
            .raft
            .metrics()
            .borrow()
            .last_log_index
            .unwrap_or(0);
        follower.shutdown().await.expect("the follower stops");

        // The two left commit on, snapshot, and purge past everything the follower holds.
        let mut client = cluster.client.clone();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            client
                .append(&[Event::new(Timestamp::ZERO, EventBody::Tick)])
                .await
                .expect("two of three commit");
            let purged = cluster
                .nodes
                .iter()
                .map(|node| {
                    node.raft
                        .raft
                        .metrics()
                        .borrow()
                        .purged
                        .map_or(0, |id| id.index)
                })
                .min()
                .unwrap_or(0);
            if purged > behind + 4 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the live nodes did not purge past {behind}"
            );
        }

        let options = cluster.options[down].clone();
        let snapshots = options.data_dir.join("snapshots");
        let restarted = gyre_control::ControlNode::start(options)
            .await
            .expect("the follower restarts");
        let mut metrics = restarted.raft.raft.metrics();
        tokio::time::timeout(Duration::from_secs(60), async {
            while metrics.borrow().snapshot.map_or(0, |id| id.index) <= behind + 4 {
                metrics.changed().await.expect("metrics");
            }
        })
        .await
        .expect("the follower installs a snapshot past the purge");
        assert_eq!(
            restarted.raft.raft.metrics().borrow().state,
            ServerState::Follower
        );
        cluster.nodes.push(restarted);
        cluster.every_node_applied().await;

        let names: Vec<String> = std::fs::read_dir(&snapshots)
            .expect("snapshot dir")
            .map(|entry| {
                entry
                    .expect("entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        let stored: Vec<u64> = names
            .iter()
            .filter(|name| name.starts_with("snap-"))
            .map(|name| std::fs::metadata(snapshots.join(name)).expect("size").len())
            .collect();
        assert!(
            !stored.is_empty(),
            "the installed snapshot is stored: {names:?}"
        );
        assert!(
            stored.iter().all(|bytes| *bytes > 8 * 16),
            "each snapshot took many 16-byte chunks: {stored:?}"
        );
        assert!(
            !names.iter().any(|name| name.starts_with("incoming-")),
            "no received file is left: {names:?}"
        );
        let statuses = client.status_all().await;
        let mut views = Vec::new();
        for (address, status) in statuses {
            let status = status.unwrap_or_else(|error| panic!("{address}: {error}"));
            views.push((status.node_id, status.last_applied_index, status.digest_hex));
        }
        let (_, applied, digest) = views[0].clone();
        assert!(
            views
                .iter()
                .all(|(_, index, hex)| *index == applied && *hex == digest),
            "equal digests at equal index (follower {follower_id}): {views:?}"
        );
        cluster.shutdown().await;
    });
}
