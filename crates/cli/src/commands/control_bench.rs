//! `gyre control bench`: the replicated log benchmark (issue 4, item 6), printed beside the
//! goals. A 3-node cluster of real `ControlNode`s in this process, on loopback gRPC, with the log
//! store's `fdatasync` per write batch, in a fresh temporary directory per run:
//!
//! - committed events/s and p50/p99 commit latency (append call to acknowledgement) for 1, 64
//!   and 256 concurrent writers, each appending one ~256 B event per request;
//! - MB/s of `ModelCall` token records of 64 KiB and 1 MiB (payload bytes committed per second);
//! - replay: decode + `ControlState` fold of the committed log, events/s;
//! - restart-to-serving: stop all nodes after a snapshot, restart them, time until a leader
//!   accepts and commits an append.
//!
//! Each figure is the median of `--runs` runs. The disk here is shared and noisy.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use gyre_control::{ClusterClient, ControlNode, NodeOptions};
use gyre_event::{
    CallId, CallKind, EngineId, Event, EventBody, ExecutionId, ModelCallRecord, PolicyVersion,
    Provenance, ProvenanceSpan, Timestamp,
};

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Runs per figure; the median is printed.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Seconds each throughput measurement runs.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
}

struct Cluster {
    _dir: tempfile::TempDir,
    nodes: Vec<ControlNode>,
    options: Vec<NodeOptions>,
    addresses: String,
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl Cluster {
    async fn start(snapshot_every: u64) -> anyhow::Result<Cluster> {
        let dir = tempfile::tempdir().context("temp dir")?;
        let mut options = Vec::new();
        for id in 1..=3u64 {
            let listen = format!("127.0.0.1:{}", free_port()?).parse()?;
            let mut node = NodeOptions::new(id, dir.path().join(format!("node-{id}")), listen);
            node.snapshot_every_entries = snapshot_every;
            options.push(node);
        }
        let mut nodes = Vec::new();
        for node in &options {
            nodes.push(ControlNode::start(node.clone()).await?);
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
        let mut client = ClusterClient::new(&addresses)?;
        client
            .initialize(&options[0].listen.to_string(), &members)
            .await?;
        let cluster = Cluster {
            _dir: dir,
            nodes,
            options,
            addresses,
        };
        cluster.wait_serving().await?;
        Ok(cluster)
    }

    /// Time until an append commits.
    async fn wait_serving(&self) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let mut client = ClusterClient::new(&self.addresses)?;
        client.retry_deadline = Duration::from_secs(30);
        client
            .append(&[Event::new(Timestamp::ZERO, EventBody::Tick)])
            .await?;
        Ok(started.elapsed())
    }

    async fn shutdown(self) -> anyhow::Result<tempfile::TempDir> {
        for node in self.nodes {
            node.shutdown().await?;
        }
        Ok(self._dir)
    }
}

fn small_event(writer: u64, sequence: u64) -> Event {
    // ~256 B encoded: an evaluation failure with a 200-byte reason.
    Event::new(
        Timestamp::ZERO,
        EventBody::EvaluationFailed {
            execution: ExecutionId(writer << 32 | sequence),
            attempt: 1,
            reason: format!("{:0>200}", sequence),
        },
    )
}

fn token_event(bytes: usize, call: u64) -> Event {
    let tokens = bytes / 8;
    Event::new(
        Timestamp::ZERO,
        EventBody::ModelCall(Box::new(ModelCallRecord {
            execution: ExecutionId(1),
            call: CallId(call),
            agent: "bench".to_string(),
            kind: CallKind::Turn,
            parent_call: None,
            reused_prefix_tokens_count: 0,
            spawned_by: None,
            input_ids: vec![7; tokens],
            input_provenance: vec![ProvenanceSpan {
                provenance: Provenance::User,
                tokens_count: tokens as u32,
            }],
            output_ids: vec![9; tokens / 2],
            output_logprobs: vec![-0.5; tokens / 2],
            engine: EngineId(0),
            policy_version: PolicyVersion(0),
            requested_at: Timestamp::ZERO,
            first_token_after: gyre_event::Duration(0),
            completed_after: gyre_event::Duration(0),
        })),
    )
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

/// (events/s, p50, p99) with `writers` concurrent writers for `seconds`.
async fn writers_run(
    cluster: &Cluster,
    writers: u64,
    seconds: f64,
) -> anyhow::Result<(f64, Duration, Duration)> {
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let mut tasks = Vec::new();
    for writer in 0..writers {
        let addresses = cluster.addresses.clone();
        tasks.push(tokio::spawn(async move {
            let mut client = ClusterClient::new(&addresses)?;
            let mut latencies = Vec::new();
            let mut sequence = 0;
            while Instant::now() < deadline {
                let started = Instant::now();
                client.append(&[small_event(writer, sequence)]).await?;
                latencies.push(started.elapsed());
                sequence += 1;
            }
            anyhow::Ok(latencies)
        }));
    }
    let started = Instant::now();
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await??);
    }
    let elapsed = started.elapsed().as_secs_f64();
    all.sort();
    Ok((
        all.len() as f64 / elapsed,
        percentile(&all, 0.5),
        percentile(&all, 0.99),
    ))
}

async fn tokens_run(cluster: &Cluster, bytes: usize, seconds: f64) -> anyhow::Result<f64> {
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let events = Arc::new(token_event(bytes, 1));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let addresses = cluster.addresses.clone();
        let events = events.clone();
        tasks.push(tokio::spawn(async move {
            let mut client = ClusterClient::new(&addresses)?;
            let mut sent = 0usize;
            while Instant::now() < deadline {
                client.append(std::slice::from_ref(&*events)).await?;
                sent += bytes;
            }
            anyhow::Ok(sent)
        }));
    }
    let started = Instant::now();
    let mut total = 0;
    for task in tasks {
        total += task.await??;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64() / 1e6)
}

fn replay_run(cluster: &Cluster) -> anyhow::Result<f64> {
    let batches: Vec<Vec<u8>> =
        cluster.nodes[0]
            .raft
            .state_machine
            .with_projection(|projection, _| {
                // The snapshot body is every applied batch: decode and fold it like a replay.
                let body = gyre_log::raft::Projection::snapshot_body(projection);
                vec![body]
            });
    let started = Instant::now();
    let projection =
        <gyre_control::ControlProjection as gyre_log::raft::Projection>::restore(&batches[0])
            .map_err(anyhow::Error::msg)?;
    let elapsed = started.elapsed().as_secs_f64();
    Ok(projection.events_folded as f64 / elapsed.max(1e-9))
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    let runs = args.runs.max(1);
    let mut rows: Vec<(String, Vec<f64>, String)> = Vec::new();
    let mut record = |name: &str, value: f64, goal: &str| {
        if let Some(row) = rows.iter_mut().find(|(n, _, _)| n == name) {
            row.1.push(value);
        } else {
            rows.push((name.to_string(), vec![value], goal.to_string()));
        }
    };
    for run in 0..runs {
        eprintln!("run {}/{runs}", run + 1);
        let cluster = Cluster::start(1_000_000).await?;
        for writers in [1u64, 64, 256] {
            let (rate, p50, p99) = writers_run(&cluster, writers, args.seconds).await?;
            record(
                &format!("{writers} writers: committed events/s"),
                rate,
                if writers == 256 { "≥ 100000" } else { "" },
            );
            record(
                &format!("{writers} writers: p50 commit ms"),
                p50.as_secs_f64() * 1e3,
                "",
            );
            record(
                &format!("{writers} writers: p99 commit ms"),
                p99.as_secs_f64() * 1e3,
                if writers == 256 { "≤ 10" } else { "" },
            );
        }
        for (bytes, name) in [
            (64usize << 10, "64 KiB token records: MB/s"),
            (1 << 20, "1 MiB token records: MB/s"),
        ] {
            record(
                name,
                tokens_run(&cluster, bytes, args.seconds).await?,
                "≥ 100",
            );
        }
        record(
            "replay (decode + ControlState fold): events/s",
            replay_run(&cluster)?,
            "≥ 1000000",
        );
        let options = cluster.options.clone();
        // Snapshot, stop, restart: restart-to-serving restores the snapshot and replays the tail.
        for node in &cluster.nodes {
            node.raft
                .raft
                .trigger()
                .snapshot()
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let dir = cluster.shutdown().await?;
        let started = Instant::now();
        let mut nodes = Vec::new();
        for node in &options {
            nodes.push(ControlNode::start(node.clone()).await?);
        }
        let restarted = Cluster {
            _dir: dir,
            nodes,
            options: options.clone(),
            addresses: options
                .iter()
                .map(|o| o.listen.to_string())
                .collect::<Vec<_>>()
                .join(","),
        };
        restarted.wait_serving().await?;
        record(
            "restart-to-serving with a snapshot: s",
            started.elapsed().as_secs_f64(),
            "≤ 5",
        );
        restarted.shutdown().await?;
    }
    println!("{:<48} {:>14}  goal", "figure (median of runs)", "measured");
    for (name, values, goal) in rows {
        println!("{name:<48} {:>14.1}  {goal}", median(values));
    }
    Ok(())
}
