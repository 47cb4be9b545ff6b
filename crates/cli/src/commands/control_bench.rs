//! `gyre control bench`: the replicated log benchmark (issue 4, item 6), printed beside the
//! goals. A 3-node cluster of real `ControlNode`s in this process, on loopback gRPC, with the log
//! store's `fdatasync` per write batch, in a fresh temporary directory per run:
//!
//! - committed events/s and p50/p99 commit latency (append call to acknowledgement) for 1, 64
//!   and 256 concurrent writers, each appending one ~256 B event (a small TITO record that
//!   extends its execution's tree) at a time and waiting for it. The writers are tasks of one
//!   process sharing a `Producer` (how the proxy and cell workers write: one connection, appends
//!   coalesced into requests). A second 256-writer row gives every writer its own connection and
//!   one event per request, the worst case;
//! - MB/s of `ModelCall` token records of 64 KiB and 1 MiB (encoded bytes committed per second,
//!   8 writers, each record a new root so the projection folds it);
//! - for each writer phase, the process's CPU time per committed event and the cores it kept
//!   busy (three nodes and the writers share this process): CPU per event is steadier than
//!   events/s on a shared host, and cores busy shows how far a phase is from CPU-bound;
//! - every benchmark event must be folded: a refusal fails the benchmark;
//! - replay: decode (on its own thread, as `gyre replay` does) + `ControlState` fold of the
//!   committed log, events/s;
//! - restart-to-serving: stop all nodes after a snapshot, restart them, time until a leader
//!   accepts and commits an append.
//!
//! Each figure is the median of `--runs` runs. The disk here is shared and noisy.

use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use gyre_control::{ClusterClient, ControlNode, NodeOptions, Producer, ProducerOptions};
use gyre_event::{Event, EventBody, Timestamp};

#[derive(Args, Debug)]
#[command(allow_negative_numbers = true)]
pub struct BenchArgs {
    /// Runs per figure; the median is printed.
    #[arg(long, default_value_t = 3, value_parser = crate::commands::values::at_least_one_usize())]
    runs: usize,
    /// Seconds each throughput measurement runs.
    #[arg(long, default_value_t = 3.0, value_parser = crate::commands::values::positive_seconds)]
    seconds: f64,
    /// Writer counts measured (each writer waits for its append before the next).
    #[arg(
        long,
        value_delimiter = ',',
        default_values_t = [1u64, 64, 256, 2048],
        value_parser = clap::value_parser!(u64).range(1..=WRITERS_MAX),
    )]
    writers: Vec<u64>,
    /// Only these parts, comma-separated (all when not given).
    #[arg(long, value_delimiter = ',', value_enum)]
    only: Vec<Part>,
}

/// The most writers a phase runs: each is a task with its own in-flight append.
const WRITERS_MAX: u64 = 65_536;

/// The parts of `gyre control bench` that `--only` selects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Part {
    /// The writer counts of `--writers`, sharing one producer.
    Writers,
    /// 256 writers, each with its own connection and one event per request.
    Direct,
    /// 256 writers appending `Tick`s (no fold).
    Ticks,
    /// 64 KiB and 1 MiB token records.
    Tokens,
    /// Decode + fold of a committed control workload.
    Replay,
    /// Restart-to-serving with a snapshot.
    Restart,
    /// A follower that was down while the others purged their logs catches up from a
    /// snapshot sent over the network: time, and the process's peak memory growth meanwhile.
    CatchUp,
}

/// A 3-node control cluster on loopback in this process, in a temporary directory.
pub(crate) struct Cluster {
    _dir: tempfile::TempDir,
    nodes: Vec<ControlNode>,
    options: Vec<NodeOptions>,
    /// The nodes' addresses, comma-separated (what `--cluster` takes).
    pub(crate) addresses: String,
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl Cluster {
    pub(crate) async fn start(snapshot_every: u64) -> anyhow::Result<Cluster> {
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

    pub(crate) async fn shutdown(self) -> anyhow::Result<tempfile::TempDir> {
        for node in self.nodes {
            node.shutdown().await?;
        }
        Ok(self._dir)
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Bytes of the newest file in `dir` (0 if none).
fn dir_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|entry| entry.metadata().ok())
                .max_by_key(|metadata| metadata.modified().ok())
                .map_or(0, |metadata| metadata.len())
        })
        .unwrap_or(0)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

/// CPU time this process has used so far (all threads: the three nodes and the writers).
fn process_cpu_seconds() -> f64 {
    let spent = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    spent.tv_sec as f64 + spent.tv_nsec as f64 * 1e-9
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// What one writer phase measured.
struct WritersFigures {
    rate: f64,
    p50: Duration,
    p99: Duration,
    /// CPU of the whole process (three nodes and the writers) per committed event, in µs: steadier
    /// than events/s on this shared host, so A/B comparisons can use it too.
    cpu_us_per_event: f64,
    /// The process's CPU time over wall time: how far from CPU-bound the phase ran.
    cores_busy: f64,
}

/// The figures of `writers` concurrent writers for `seconds`. With `shared`, the
/// writers are tasks of one process sharing a [`Producer`] (one connection; how the proxy and
/// cell workers write); without, each writer has its own connection and sends one event per
/// request. With `ticks`, each event is a `Tick` (~16 B encoded, nothing to fold) instead of a record:
/// the same path with the per-event decode and fold taken out.
async fn writers_run(
    cluster: &Cluster,
    writers: u64,
    seconds: f64,
    shared: bool,
    ticks: bool,
    epoch: u64,
) -> anyhow::Result<WritersFigures> {
    let cpu_before = process_cpu_seconds();
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let producer = Producer::new(
        ClusterClient::new(&cluster.addresses)?,
        ProducerOptions::default(),
    );
    let mut tasks = Vec::new();
    for writer in 0..writers {
        let addresses = cluster.addresses.clone();
        let producer = producer.clone();
        let writer = epoch << 16 | writer;
        tasks.push(tokio::spawn(async move {
            let mut client = ClusterClient::new(&addresses)?;
            let mut latencies = Vec::new();
            let mut sequence = 0;
            while Instant::now() < deadline {
                let started = Instant::now();
                let event = if ticks {
                    Event::new(Timestamp::ZERO, EventBody::Tick)
                } else {
                    gyre_control::workload::small_event(writer, sequence)
                };
                let (_, refused) = if shared {
                    producer.append(vec![event]).await?
                } else {
                    client.append(&[event]).await?
                };
                if let Some(reason) = refused.iter().find(|reason| !reason.is_empty()) {
                    anyhow::bail!("the projection refused a benchmark event: {reason}");
                }
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
    let cpu = process_cpu_seconds() - cpu_before;
    all.sort();
    Ok(WritersFigures {
        rate: all.len() as f64 / elapsed,
        p50: percentile(&all, 0.5),
        p99: percentile(&all, 0.99),
        cpu_us_per_event: cpu * 1e6 / (all.len().max(1) as f64),
        cores_busy: cpu / elapsed.max(1e-9),
    })
}

async fn tokens_run(
    cluster: &Cluster,
    bytes: usize,
    seconds: f64,
    epoch: u64,
) -> anyhow::Result<f64> {
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let mut tasks = Vec::new();
    for writer in 0..8u64 {
        let addresses = cluster.addresses.clone();
        let writer = epoch << 16 | writer;
        tasks.push(tokio::spawn(async move {
            let mut client = ClusterClient::new(&addresses)?;
            let mut sent = 0usize;
            let mut call = 0;
            while Instant::now() < deadline {
                let event = gyre_control::workload::token_event(bytes, writer, call);
                let encoded = gyre_log::encode_batch(std::slice::from_ref(&event));
                let size = encoded.len();
                let (_, refused) = client.append_encoded(encoded).await?;
                if let Some(reason) = refused.iter().find(|reason| !reason.is_empty()) {
                    anyhow::bail!("the projection refused a token record: {reason}");
                }
                sent += size;
                call += 1;
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

/// Replay: read node 1's committed entries from its log store (disk), then time decoding them
/// and folding them into a fresh projection, as a restart without a snapshot does.
async fn replay_run(cluster: &Cluster) -> anyhow::Result<f64> {
    use gyre_log::raft::openraft::{EntryPayload, RaftLogReader};
    let node = &cluster.nodes[0].raft;
    let last = node
        .state_machine
        .with_projection(|_, applied| applied.map_or(0, |log_id| log_id.index));
    let mut reader = node.log.reader();
    let mut batches = Vec::new();
    let mut next = 1;
    while next <= last {
        let end = (next + 4096).min(last + 1);
        let entries = reader
            .try_get_log_entries(next..end)
            .await
            .map_err(|error| anyhow::anyhow!("reading entries {next}..{end}: {error}"))?;
        if entries.is_empty() {
            anyhow::bail!("node 1 no longer holds entry {next} (purged)");
        }
        for entry in entries {
            next = entry.log_id.index + 1;
            if let EntryPayload::Normal(batch) = entry.payload {
                batches.push((entry.log_id.index, batch.0));
            }
        }
    }
    // As `gyre replay` does: one thread decodes, this one folds in log order.
    let started = Instant::now();
    let mut projection = gyre_control::ControlProjection::new();
    let (decoded, ()) = crate::commands::pipeline::ahead(
        |send| -> anyhow::Result<()> {
            for (index, batch) in &batches {
                if !send((*index, batch, gyre_log::decode_batch(batch)?)) {
                    break;
                }
            }
            Ok(())
        },
        |entries| {
            for (index, batch, events) in entries {
                // Refusals repeat those of the first fold; the figure counts every event.
                let _ =
                    gyre_log::raft::Projection::apply_events(&mut projection, index, batch, events);
            }
        },
    );
    let elapsed = started.elapsed().as_secs_f64();
    decoded?;
    Ok(projection.events_folded as f64 / elapsed.max(1e-9))
}

/// The anchor for the latency figures: this disk's `fdatasync` latency (p50, p99 in ms) for
/// 4 KiB appends to a file in the benchmark's temporary directory. A commit needs the leader's
/// and a follower's sync, so its floor is about two of these.
fn disk_sync_probe() -> anyhow::Result<(f64, f64)> {
    use std::io::Write;
    let dir = tempfile::tempdir().context("temp dir")?;
    let mut file = std::fs::File::create(dir.path().join("probe"))?;
    let block = [7u8; 4096];
    let mut samples = Vec::new();
    for _ in 0..200 {
        file.write_all(&block)?;
        let started = Instant::now();
        file.sync_data()?;
        samples.push(started.elapsed());
    }
    samples.sort();
    Ok((
        percentile(&samples, 0.5).as_secs_f64() * 1e3,
        percentile(&samples, 0.99).as_secs_f64() * 1e3,
    ))
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    let runs = args.runs;
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
        let (sync_p50, sync_p99) = disk_sync_probe()?;
        record("anchor: disk fdatasync p50 ms (4 KiB append)", sync_p50, "");
        record("anchor: disk fdatasync p99 ms", sync_p99, "");
        let cluster = Cluster::start(1_000_000).await?;
        let mut epoch = 0;
        let part = |name: Part| args.only.is_empty() || args.only.contains(&name);
        for writers in args.writers.iter().copied().filter(|_| part(Part::Writers)) {
            epoch += 1;
            eprintln!("  {writers} writers");
            let figures = writers_run(&cluster, writers, args.seconds, true, false, epoch).await?;
            record(
                &format!("{writers} writers: committed events/s"),
                figures.rate,
                if writers == 256 { "≥ 100000" } else { "" },
            );
            record(
                &format!("{writers} writers: p50 commit ms"),
                figures.p50.as_secs_f64() * 1e3,
                "",
            );
            record(
                &format!("{writers} writers: p99 commit ms"),
                figures.p99.as_secs_f64() * 1e3,
                if writers == 256 { "≤ 10" } else { "" },
            );
            record(
                &format!("{writers} writers: CPU µs per event (process)"),
                figures.cpu_us_per_event,
                "",
            );
            record(
                &format!("{writers} writers: cores busy (of {})", cores()),
                figures.cores_busy,
                "",
            );
        }
        // 256 writers with their own connections (one event per request), then 256 sharing a
        // producer but appending `Tick`s: the same path without per-event decode and fold.
        for (name, shared, ticks, title, short) in [
            (
                Part::Direct,
                false,
                false,
                "256 writers, own connection, 1 event/request",
                "",
            ),
            (
                Part::Ticks,
                true,
                true,
                "256 writers, Tick events (~16 B, no fold)",
                "Tick ",
            ),
        ] {
            if !part(name) {
                continue;
            }
            eprintln!("  {title}");
            epoch += 1;
            let figures = writers_run(&cluster, 256, args.seconds, shared, ticks, epoch).await?;
            record(&format!("{title}: events/s"), figures.rate, "");
            record(
                &format!("  … {short}p50 commit ms"),
                figures.p50.as_secs_f64() * 1e3,
                "",
            );
            record(
                &format!("  … {short}p99 commit ms"),
                figures.p99.as_secs_f64() * 1e3,
                "",
            );
            record(
                &format!("  … {short}CPU µs per event (process)"),
                figures.cpu_us_per_event,
                "",
            );
        }
        for (bytes, name) in [
            (64usize << 10, "64 KiB token records: MB/s"),
            (1 << 20, "1 MiB token records: MB/s"),
        ]
        .into_iter()
        .filter(|_| part(Part::Tokens))
        {
            eprintln!("  {name}");
            record(
                name,
                tokens_run(&cluster, bytes, args.seconds, {
                    epoch += 1;
                    epoch
                })
                .await?,
                "≥ 100",
            );
        }
        cluster.shutdown().await?;
        if part(Part::CatchUp) {
            eprintln!("  a follower catching up from a snapshot");
            epoch += 1;
            let figures = catch_up_run(args.seconds, epoch).await?;
            record("catch-up: snapshot file MB", figures.snapshot_mb, "");
            record("catch-up from a snapshot: s", figures.seconds, "");
            record(
                "catch-up: peak memory growth MB",
                figures.peak_growth_mb,
                "",
            );
        }
        if !part(Part::Restart) && !part(Part::Replay) {
            continue;
        }
        // Replay and restart on their own cluster holding a control workload (the token phases above leave
        // gigabytes of token records in the state; restart time grows with the state, see
        // docs/benchmarks.md): 64 writers for the measurement time, then a snapshot on every
        // node, then stop all three and time until an append commits again.
        eprintln!("  control workload for replay and restart");
        let cluster = Cluster::start(1_000_000).await?;
        epoch += 1;
        writers_run(&cluster, 64, args.seconds, true, false, epoch).await?;
        eprintln!("  replay");
        record(
            "replay (decode + ControlState fold): events/s",
            replay_run(&cluster).await?,
            "≥ 1000000",
        );
        let options = cluster.options.clone();
        let mut snapshot_bytes = 0u64;
        for node in &cluster.nodes {
            snapshot_now(node).await?;
            snapshot_bytes = snapshot_bytes.max(dir_bytes(&node.raft.dir.join("snapshots")));
        }
        record("restart: snapshot file MB", snapshot_bytes as f64 / 1e6, "");
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
    outln!("{:<48} {:>14}  goal", "figure (median of runs)", "measured");
    for (name, values, goal) in rows {
        // Sub-millisecond anchors need two decimals; everything else reads best with one.
        let value = median(values);
        if name.starts_with("anchor") {
            outln!("{name:<48} {value:>14.2}  {goal}");
        } else {
            outln!("{name:<48} {value:>14.1}  {goal}");
        }
    }
    Ok(())
}

/// What [`catch_up_run`] measured.
struct CatchUp {
    snapshot_mb: f64,
    seconds: f64,
    /// The process's peak resident memory during the catch-up minus its resident memory
    /// before (NaN where the kernel cannot reset the peak).
    peak_growth_mb: f64,
}

/// A follower behind a purge catching up: 64 writers fill a cluster's state for `seconds`, a
/// follower stops, the other two snapshot and purge their logs past everything it holds, and
/// the follower restarts: the leader must send it the snapshot. Timed from the restart until
/// it has installed a snapshot past its own log and applied what the live nodes had; the
/// peak memory is the
/// whole process's (all three nodes run in it), reset just before the restart.
async fn catch_up_run(seconds: f64, epoch: u64) -> anyhow::Result<CatchUp> {
    use gyre_log::raft::openraft::ServerState;
    let mut cluster = Cluster::start(1_000_000).await?;
    writers_run(&cluster, 64, seconds, true, false, epoch).await?;
    let down = cluster
        .nodes
        .iter()
        .position(|node| node.raft.raft.metrics().borrow().state != ServerState::Leader)
        .context("no follower")?;
    let follower = cluster.nodes.remove(down);
    // What the follower holds: the snapshot it installs must be past it.
    let behind = follower
        .raft
        .raft
        .metrics()
        .borrow()
        .last_log_index
        .unwrap_or(0);
    follower.shutdown().await?;
    let mut client = ClusterClient::new(&cluster.addresses)?;
    client.retry_deadline = Duration::from_secs(30);
    client
        .append(&[Event::new(Timestamp::ZERO, EventBody::Tick)])
        .await?;
    let mut target = 0;
    for node in &cluster.nodes {
        let applied = snapshot_now(node).await?;
        target = target.max(applied);
        let mut metrics = node.raft.raft.metrics();
        node.raft
            .raft
            .trigger()
            .purge_log(applied)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        tokio::time::timeout(Duration::from_secs(60), async {
            while metrics.borrow().purged.map_or(0, |id| id.index) < applied {
                if metrics.changed().await.is_err() {
                    break;
                }
            }
        })
        .await
        .context("log not purged within 60 s")?;
    }
    let before_kib = proc_status_kib("VmRSS");
    // Writing 5 resets the peak resident size the kernel reports as VmHWM.
    let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    let options = cluster.options[down].clone();
    let started = Instant::now();
    let node = ControlNode::start(options.clone()).await?;
    let mut metrics = node.raft.raft.metrics();
    tokio::time::timeout(Duration::from_secs(300), async {
        loop {
            let (snapshot, applied) = {
                let now = metrics.borrow();
                (
                    now.snapshot.map_or(0, |id| id.index),
                    now.last_applied.map_or(0, |id| id.index),
                )
            };
            if snapshot > behind && applied >= target {
                break;
            }
            if metrics.changed().await.is_err() {
                break;
            }
        }
    })
    .await
    .context("the follower did not catch up within 300 s")?;
    let seconds = started.elapsed().as_secs_f64();
    let peak_kib = proc_status_kib("VmHWM");
    let figures = CatchUp {
        snapshot_mb: dir_bytes(&options.data_dir.join("snapshots")) as f64 / 1e6,
        seconds,
        peak_growth_mb: if reset {
            peak_kib.saturating_sub(before_kib) as f64 * 1024.0 / 1e6
        } else {
            f64::NAN
        },
    };
    cluster.nodes.push(node);
    cluster.shutdown().await?;
    Ok(figures)
}

/// Has `node` build a snapshot of everything it applied, and waits (up to 120 s) until it
/// has; returns the applied index it covers.
async fn snapshot_now(node: &ControlNode) -> anyhow::Result<u64> {
    let applied = node
        .raft
        .state_machine
        .with_projection(|_, applied| applied.map_or(0, |log_id| log_id.index));
    node.raft
        .raft
        .trigger()
        .snapshot()
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut metrics = node.raft.raft.metrics();
    tokio::time::timeout(Duration::from_secs(120), async {
        while metrics.borrow().snapshot.map_or(0, |id| id.index) < applied {
            if metrics.changed().await.is_err() {
                break;
            }
        }
    })
    .await
    .context("snapshot not built within 120 s")?;
    Ok(applied)
}

/// A `kB` field of `/proc/self/status` (0 where it cannot be read).
fn proc_status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status.lines().find_map(|line| {
                let rest = line.strip_prefix(field)?.strip_prefix(':')?;
                rest.trim().trim_end_matches("kB").trim().parse().ok()
            })
        })
        .unwrap_or(0)
}

/// Arguments of `gyre control soak`.
#[derive(Args, Debug)]
#[command(allow_negative_numbers = true)]
pub struct SoakArgs {
    /// How long writers run.
    #[arg(long, default_value_t = 60.0, value_parser = crate::commands::values::positive_seconds)]
    seconds: f64,
    /// Concurrent writers (tasks sharing one `Producer`), each one execution's TITO stream.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=WRITERS_MAX))]
    writers: u64,
    /// Snapshot after this many entries (small, so snapshots and purges run all the time).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
    snapshot_every: u64,
    /// Entries kept in the log behind a snapshot (small, so purges follow every snapshot).
    #[arg(long, default_value_t = 16)]
    keep_behind_snapshot: u64,
    /// Stop and restart one node (round robin, leader included) this often; 0 = never.
    #[arg(long, default_value_t = 5.0, value_parser = crate::commands::values::non_negative_seconds)]
    restart_every: f64,
    /// Keep the three nodes' data directories here (`DIR/node-1` ..) instead of a temporary
    /// directory, e.g. for `gyre replay DIR/node-1` afterwards. DIR must not exist yet.
    #[arg(long, value_name = "DIR")]
    keep_data: Option<std::path::PathBuf>,
    /// Log segment size, bytes: small segments make purges delete whole segments, so a node's
    /// log then starts after entry 1 and restarts (and `gyre replay`) begin from a snapshot.
    #[arg(long, default_value_t = 64 << 20)]
    segment_bytes: u64,
    /// Purged segments go to each node's `archive/` (`true`, as `gyre control run` does) or
    /// are deleted (`false`).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "true|false")]
    archive_purged: bool,
    /// Keep each node's archive within this size (as `gyre control run --archive-max-size`):
    /// a small one makes the purges delete archived segments while the writers run and nodes
    /// restart. `0`: no limit.
    #[arg(long, default_value = "0", value_parser = crate::commands::values::byte_size, value_name = "SIZE")]
    archive_max_size: crate::commands::values::ByteSize,
}

/// One writer of the soak: appends its execution's records in order, retrying an append until
/// it is acknowledged. A retry of a record that did commit comes back refused as a duplicate
/// call, which counts as acknowledged (the record id makes the append idempotent).
async fn soak_writer(
    producer: Producer,
    writer: u64,
    deadline: Instant,
) -> anyhow::Result<(u64, Duration, u64)> {
    let mut sequence = 0u64;
    let mut worst = Duration::ZERO;
    let mut retries = 0u64;
    while Instant::now() < deadline {
        let started = Instant::now();
        loop {
            match producer
                .append(vec![gyre_control::workload::small_event(writer, sequence)])
                .await
            {
                Ok((_, refused)) => match refused.first().map(String::as_str) {
                    None | Some("") => break,
                    // Each sequence is appended once by this writer: "already recorded" means an
                    // earlier attempt committed (the client retries internally when a node
                    // stops or a connection drops, so this writer may not have seen an error).
                    Some(reason) if gyre_trajectory::is_duplicate_call_refusal(reason) => break,
                    Some(reason) => {
                        anyhow::bail!("writer {writer}: record {sequence} refused: {reason}")
                    }
                },
                Err(error) => {
                    retries += 1;
                    if started.elapsed() > Duration::from_secs(60) {
                        anyhow::bail!(
                            "writer {writer}: record {sequence} not acknowledged after 60 s: {error}"
                        );
                    }
                }
            }
        }
        worst = worst.max(started.elapsed());
        sequence += 1;
    }
    Ok((sequence, worst, retries))
}

/// `gyre control soak`: snapshots and purges under heavy writes while nodes restart, then
/// checks that every acknowledged record is in every node's projection and digests agree.
pub async fn soak(args: SoakArgs) -> anyhow::Result<()> {
    let temporary = tempfile::tempdir().context("temp dir")?;
    let root = match &args.keep_data {
        Some(dir) => {
            anyhow::ensure!(
                !dir.exists(),
                "--keep-data {}: it exists already (the soak starts from empty nodes)",
                dir.display()
            );
            dir.clone()
        }
        None => temporary.path().to_path_buf(),
    };
    let mut options = Vec::new();
    for id in 1..=3u64 {
        let listen = format!("127.0.0.1:{}", free_port()?).parse()?;
        let mut node = NodeOptions::new(id, root.join(format!("node-{id}")), listen);
        node.log.segment_bytes = args.segment_bytes.max(4096);
        node.log.archive = args.archive_purged;
        node.log.archive_bytes_max = args.archive_max_size.0;
        node.snapshot_every_entries = args.snapshot_every.max(1);
        node.entries_kept_behind_snapshot = args.keep_behind_snapshot;
        // No idle `Tick`s: the digests are compared (and printed for replay to check) after the
        // writers stop, and a Tick committed between one node's reading and another's, or
        // while the nodes shut down one by one, would make equal logs look different.
        node.controller.idle_tick = Duration::from_secs(86_400);
        options.push(node);
    }
    let mut nodes: Vec<Option<ControlNode>> = Vec::new();
    for node in &options {
        nodes.push(Some(ControlNode::start(node.clone()).await?));
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
    client.retry_deadline = Duration::from_secs(30);
    client
        .append(&[Event::new(Timestamp::ZERO, EventBody::Tick)])
        .await?;

    let bar = indicatif::ProgressBar::new(args.seconds.ceil() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("soak {bar:40} {pos}/{len} s {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(args.seconds);
    let mut producer_client = ClusterClient::new(&addresses)?;
    producer_client.retry_deadline = Duration::from_secs(30);
    let producer = Producer::new(producer_client, ProducerOptions::default());
    let writers: Vec<_> = (0..args.writers)
        .map(|writer| tokio::spawn(soak_writer(producer.clone(), writer, deadline)))
        .collect();
    drop(producer);

    let mut restarts = 0u64;
    let mut next_restart = started + Duration::from_secs_f64(args.restart_every.max(0.0));
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
        bar.set_position(started.elapsed().as_secs());
        if args.restart_every > 0.0 && Instant::now() >= next_restart {
            let slot = (restarts % 3) as usize;
            if let Some(node) = nodes[slot].take() {
                node.shutdown().await?;
            }
            nodes[slot] = Some(ControlNode::start(options[slot].clone()).await?);
            restarts += 1;
            bar.set_message(format!("{restarts} restarts"));
            next_restart = Instant::now() + Duration::from_secs_f64(args.restart_every);
        }
    }
    let mut acknowledged = 0u64;
    let mut worst = Duration::ZERO;
    let mut retries = 0u64;
    let mut counts = Vec::new();
    for writer in writers {
        let (count, slowest, retried) = writer.await??;
        acknowledged += count;
        worst = worst.max(slowest);
        retries += retried;
        counts.push(count);
    }
    let elapsed = started.elapsed().as_secs_f64();
    bar.finish_and_clear();

    // Let every node apply the leader's last entry: a final append commits on a quorum, then
    // wait until all three have applied it.
    let (sequences, _) = client
        .append(&[Event::new(Timestamp::ZERO, EventBody::Tick)])
        .await?;
    let last = sequences.first().map_or(0, |sequence| sequence.index);
    let nodes: Vec<ControlNode> = nodes.into_iter().flatten().collect();
    for node in &nodes {
        let mut metrics = node.raft.raft.metrics();
        tokio::time::timeout(Duration::from_secs(60), async {
            while metrics.borrow().last_applied.map_or(0, |id| id.index) < last {
                if metrics.changed().await.is_err() {
                    break;
                }
            }
        })
        .await
        .with_context(|| format!("node {} did not apply entry {last} within 60 s", node.id))?;
    }
    let mut digests = Vec::new();
    let mut missing = 0u64;
    for node in &nodes {
        let metrics = node.raft.raft.metrics().borrow().clone();
        let (digest, absent) = node.raft.state_machine.with_projection(|projection, _| {
            let trees = &projection.state.trajectories.trees;
            let mut absent = 0u64;
            for (writer, count) in counts.iter().enumerate() {
                for sequence in 0..*count {
                    let Event {
                        body: EventBody::ModelCall(record),
                        ..
                    } = gyre_control::workload::small_event(writer as u64, sequence)
                    else {
                        continue;
                    };
                    let present = trees
                        .get(&record.execution)
                        .and_then(|tree| tree.node_of_call(record.call))
                        .is_some();
                    if !present {
                        absent += 1;
                    }
                }
            }
            (projection.state.digest(), absent)
        });
        missing += absent;
        let log = node.raft.log.stats();
        outln!(
            "node {}: applied {}, snapshot at {}, log purged through {}, archive {:.1} MiB in {} segments ({} deleted at its size limit), digest {}, acknowledged records missing {}",
            node.id,
            metrics.last_applied.map_or(0, |id| id.index),
            metrics.snapshot.map_or(0, |id| id.index),
            metrics.purged.map_or(0, |id| id.index),
            log.archive_bytes as f64 / (1u64 << 20) as f64,
            log.archive_segments,
            log.archive_segments_deleted,
            gyre_log::file::hex(&digest),
            absent
        );
        if args.archive_max_size.0 > 0 && log.archive_bytes > args.archive_max_size.0 {
            anyhow::bail!(
                "node {}: its archive holds {} bytes, over the {}-byte limit",
                node.id,
                log.archive_bytes,
                args.archive_max_size.0
            );
        }
        digests.push(digest);
    }
    outln!(
        "{acknowledged} records acknowledged in {elapsed:.1} s ({:.0}/s) by {} writers; {restarts} node restarts; {retries} retried appends; slowest acknowledgement {:.0} ms",
        acknowledged as f64 / elapsed,
        args.writers,
        worst.as_secs_f64() * 1e3
    );
    for node in nodes {
        node.shutdown().await?;
    }
    if missing > 0 {
        anyhow::bail!("{missing} acknowledged records are missing from a node's projection");
    }
    if digests.windows(2).any(|pair| pair[0] != pair[1]) {
        anyhow::bail!("the nodes' projection digests differ at the same applied index");
    }
    outln!("soak passed: every acknowledged record is on every node; digests equal");
    Ok(())
}
