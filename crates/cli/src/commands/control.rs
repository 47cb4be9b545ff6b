//! `gyre control init | run | status | bench`: the control quorum (docs/control.md).
//!
//! - `run --id N --data-dir DIR --listen ADDR --peers 1=ADDR,...`: one node; prints
//!   `serving node N on ADDR` once listening, exits 3 if the node halts (a storage failure or a
//!   projection digest mismatch: [`NodeHalted`]), 0 on Ctrl-C / SIGTERM, 2 on any other error.
//! - `init --nodes 1=ADDR,2=ADDR,3=ADDR`: forms the cluster through the lowest id, then waits for
//!   a leader.
//! - `status --cluster ADDRS`: leader, term, commit and applied index, digest per node.
//! - `bench`: the replicated log benchmark (`control_bench`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use gyre_control::{parse_nodes, ClusterClient, ControlNode, NodeOptions};

#[path = "control_bench.rs"]
mod control_bench;
pub use control_bench::BenchArgs as LogBenchArgs;
pub(crate) use control_bench::Cluster as LoopbackCluster;

#[derive(Args, Debug)]
pub struct ControlArgs {
    #[command(subcommand)]
    command: ControlCommand,
}

#[derive(Subcommand, Debug)]
enum ControlCommand {
    /// Form a new cluster: initialise membership through the node with the lowest id.
    Init {
        /// Every voter, `1=host:port,2=host:port,3=host:port`.
        #[arg(long)]
        nodes: String,
        /// Seconds to keep trying while nodes are still starting, and then to wait for a
        /// leader.
        #[arg(long, default_value_t = 60)]
        timeout_secs: u64,
    },
    /// Run one control node.
    ///
    /// Settings come from flags or from `--config FILE` (TOML; keys are the flags' names, e.g.
    /// `id = 1`, `data_dir = "/var/lib/gyre/control"`, `[peers] 1 = "gyre-control-1:7000"`);
    /// a flag on the command line replaces the file's value. `deploy/config/` has examples.
    Run(RunArgs),
    /// Print every node's view: leader, term, commit / applied index, digest, membership.
    Status {
        /// Node addresses, `host:port,host:port,...` (every node is asked).
        #[arg(long)]
        cluster: String,
        /// One JSON object per node instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Benchmark the replicated log on a 3-node loopback cluster (fdatasync on).
    Bench(control_bench::BenchArgs),
    /// Soak: heavy writes while snapshots and log purges run every few dozen entries and nodes
    /// restart in turn (leader included); then every acknowledged record must be on every node
    /// and the digests must agree. Exits non-zero otherwise.
    Soak(control_bench::SoakArgs),
}

/// Arguments of `gyre control run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// TOML file of settings (keys: the flags below, `_` or `-`); flags given here win.
    #[arg(long)]
    config: Option<PathBuf>,
    /// This node's id: a positive integer, unique in the cluster and fixed for its data dir.
    #[arg(long)]
    id: u64,
    /// Where this node keeps its log segments, metadata and snapshots (created if missing).
    #[arg(long)]
    data_dir: PathBuf,
    /// Address to serve the Raft and Control gRPC services on: an IP and port, e.g.
    /// `0.0.0.0:7000` for every interface.
    #[arg(long)]
    listen: SocketAddr,
    /// The cluster, `1=host:port,2=host:port,3=host:port`, as the nodes reach each other (host
    /// names allowed). This node's entry must use the listen port, and its listen IP unless
    /// that is unspecified (`0.0.0.0`).
    #[arg(long)]
    peers: String,
    /// Build a snapshot after this many entries.
    #[arg(long, default_value_t = 20_000)]
    snapshot_every: u64,
    /// Entries kept in the log behind a snapshot, so `gyre log tail --from` and
    /// `gyre log export` reach that far back.
    #[arg(long, default_value_t = 1_000_000)]
    entries_kept_behind_snapshot: u64,
    /// What a purge behind a snapshot does with the log segments it removes: `true` moves them
    /// to `DATA_DIR/archive/` (a rename), so the node keeps its whole committed log for
    /// `gyre replay DATA_DIR`, `gyre log export` and audits of any execution of the run, while
    /// a restart still reads only the live log; `false` deletes them. The archive grows with
    /// the run: put the data dir on a disk sized for the whole log.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "true|false")]
    archive_purged: bool,
    /// Keep the archive within this size: once a purge takes it past, its oldest segments are
    /// deleted (each logged as a warning; `gyre control status` counts them), so a long run
    /// cannot fill the disk the live log needs. Export what you must keep first
    /// (`gyre log export`). A number of bytes or a size such as `500GiB` or `2TB`; `0`, the
    /// default, keeps the whole run.
    #[arg(long, default_value = "0", value_parser = super::values::byte_size, value_name = "SIZE")]
    archive_max_size: super::values::ByteSize,
    /// Leader heartbeat interval, ms.
    #[arg(long, default_value_t = 100)]
    heartbeat_ms: u64,
    /// A follower that hears no leader for a random time between these two bounds (ms)
    /// starts an election. The lower bound must be at least 3 heartbeats.
    #[arg(long, default_value_t = 600)]
    election_timeout_min_ms: u64,
    /// Upper bound of the election timeout, ms.
    #[arg(long, default_value_t = 1200)]
    election_timeout_max_ms: u64,
    /// Check the settings and print them as the node would use them, then exit without
    /// starting (for deployment scripts: `ExecStartPre`, CI).
    #[arg(long)]
    check: bool,
}

/// `gyre bench log`: the same benchmark as `gyre control bench`.
pub fn bench_log(args: LogBenchArgs) -> anyhow::Result<()> {
    run(ControlArgs {
        command: ControlCommand::Bench(args),
    })
}

pub fn run(args: ControlArgs) -> anyhow::Result<()> {
    let threads = match &args.command {
        ControlCommand::Bench(_) | ControlCommand::Soak(_) => 4,
        _ => 2,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        match args.command {
            ControlCommand::Init {
                nodes,
                timeout_secs,
            } => init(&nodes, Duration::from_secs(timeout_secs)).await,
            ControlCommand::Run(args) => run_node(args).await,
            ControlCommand::Status { cluster, json } => status(&cluster, json).await,
            ControlCommand::Bench(args) => control_bench::run(args).await,
            ControlCommand::Soak(args) => control_bench::soak(args).await,
        }
    })
}

async fn init(nodes: &str, timeout: Duration) -> anyhow::Result<()> {
    let nodes = parse_nodes(nodes).context("--nodes")?;
    let (first, address) = nodes.iter().next().context("--nodes: at least one node")?;
    let all: Vec<&str> = nodes.values().map(String::as_str).collect();
    let mut client = ClusterClient::new(&all.join(","))?;
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match client.initialize(address, &nodes).await {
            Ok(_) => break,
            Err(error)
                if tokio::time::Instant::now() < deadline
                    && error.to_string().contains("reach") =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => {
                // Forming the cluster twice (a re-run deployment script, a restarted init job)
                // is fine when the membership is the one asked for.
                if let Ok(status) = client.status_of(address).await {
                    if !status.members.is_empty() {
                        let current: BTreeMap<u64, String> = status
                            .members
                            .iter()
                            .map(|member| (member.id, member.address.clone()))
                            .collect();
                        if current == nodes {
                            outln!(
                                "cluster already initialised: {} voters, leader {}",
                                nodes.len(),
                                status.leader_id
                            );
                            return Ok(());
                        }
                        bail!(
                            "node {first} at {address} already belongs to a cluster with other members: {}",
                            current
                                .iter()
                                .map(|(id, address)| format!("{id}={address}"))
                                .collect::<Vec<_>>()
                                .join(",")
                        );
                    }
                }
                return Err(error)
                    .with_context(|| format!("initialising through node {first} at {address}"));
            }
        }
    }
    loop {
        let status = client.status_of(address).await;
        if let Ok(status) = &status {
            if status.leader_id != 0 {
                outln!(
                    "cluster initialised: {} voters, leader {} at {}",
                    nodes.len(),
                    status.leader_id,
                    status.leader_address
                );
                return Ok(());
            }
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "membership written but no leader was elected within {} s (are all nodes running?)",
                timeout.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn run_node(args: RunArgs) -> anyhow::Result<()> {
    super::log_to_stderr("warn,gyre_control=info");
    let options = node_options(&args)?;
    if !args.check {
        // Many proxies and cell workers connect to each node; the soft default (often 1024)
        // is far below what they and the log's segments need.
        crate::open_files::raise_limit();
    }
    if args.check {
        outln!(
            "{}",
            serde_json::json!({
                "id": options.id,
                "data_dir": options.data_dir,
                "listen": options.listen.to_string(),
                "peers": parse_nodes(&args.peers)?,
                "snapshot_every": options.snapshot_every_entries,
                "entries_kept_behind_snapshot": options.entries_kept_behind_snapshot,
                "archive_purged": options.log.archive,
                "archive_max_bytes": options.log.archive_bytes_max,
                "heartbeat_ms": options.heartbeat_ms,
                "election_timeout_min_ms": options.election_timeout_ms_min,
                "election_timeout_max_ms": options.election_timeout_ms_max,
            })
        );
        return Ok(());
    }
    let id = options.id;
    let data_dir = options.data_dir.clone();
    std::fs::create_dir_all(&data_dir)
        .with_context(|| format!("creating {}", data_dir.display()))?;
    let node = ControlNode::start(options).await?;
    outln!("serving node {id} on {}", node.address);
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    let halted = tokio::select! {
        reason = node.halted() => Some(reason),
        _ = tokio::signal::ctrl_c() => None,
        _ = terminate.recv() => None,
    };
    node.shutdown().await?;
    match halted {
        Some(reason) => Err(NodeHalted { id, reason }.into()),
        None => Ok(()),
    }
}

/// A node stopped itself on a storage failure or a projection digest mismatch: `main` exits
/// with [`NodeHalted::EXIT_CODE`] so a supervisor can tell it from an ordinary startup error
/// (a port in use) and not restart it blindly.
#[derive(Debug)]
pub struct NodeHalted {
    id: u64,
    reason: String,
}

impl NodeHalted {
    pub const EXIT_CODE: u8 = 3;

    #[cfg(test)]
    pub fn new(id: u64, reason: String) -> NodeHalted {
        NodeHalted { id, reason }
    }
}

impl std::fmt::Display for NodeHalted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "node {} halted: {}", self.id, self.reason)
    }
}

impl std::error::Error for NodeHalted {}

/// The node's options from its arguments, every cross-field rule checked with the fields named.
fn node_options(args: &RunArgs) -> anyhow::Result<NodeOptions> {
    if args.id == 0 {
        bail!("field `id`: 0 is reserved; node ids start at 1");
    }
    let peers = parse_nodes(&args.peers).context("field `peers`")?;
    check_own_address(args.id, args.listen, &peers)?;
    if args.heartbeat_ms == 0 {
        bail!("field `heartbeat_ms` must be at least 1");
    }
    if args.election_timeout_min_ms < 3 * args.heartbeat_ms {
        bail!(
            "field `election_timeout_min_ms` ({}) must be at least 3 heartbeats (`heartbeat_ms` {}): \
             followers would start elections between a live leader's heartbeats",
            args.election_timeout_min_ms,
            args.heartbeat_ms
        );
    }
    if args.election_timeout_max_ms <= args.election_timeout_min_ms {
        bail!(
            "field `election_timeout_max_ms` ({}) must exceed `election_timeout_min_ms` ({}): \
             the spread is what keeps candidates from splitting the vote forever",
            args.election_timeout_max_ms,
            args.election_timeout_min_ms
        );
    }
    if args.snapshot_every == 0 {
        bail!("field `snapshot_every` must be at least 1");
    }
    let mut options = NodeOptions::new(args.id, args.data_dir.clone(), args.listen);
    options.snapshot_every_entries = args.snapshot_every;
    options.entries_kept_behind_snapshot = args.entries_kept_behind_snapshot;
    options.log.archive = args.archive_purged;
    options.log.archive_bytes_max = args.archive_max_size.0;
    options.heartbeat_ms = args.heartbeat_ms;
    options.election_timeout_ms_min = args.election_timeout_min_ms;
    options.election_timeout_ms_max = args.election_timeout_max_ms;
    Ok(options)
}

/// This node's entry in `peers` must be where it listens: the same port, and the same IP
/// unless it listens on every interface (then the entry may be any host name or IP).
fn check_own_address(
    id: u64,
    listen: SocketAddr,
    peers: &BTreeMap<u64, String>,
) -> anyhow::Result<()> {
    for (peer, address) in peers {
        let port = address
            .rsplit_once(':')
            .and_then(|(host, port)| (!host.is_empty()).then_some(port))
            .and_then(|port| port.parse::<u16>().ok())
            .filter(|port| *port != 0);
        if port.is_none() {
            bail!("field `peers`: node {peer}'s address {address:?} is not HOST:PORT");
        }
    }
    let Some(address) = peers.get(&id) else {
        bail!("field `peers` does not list this node (field `id` = {id})");
    };
    let port = address.rsplit_once(':').map(|(_, port)| port);
    if port != Some(listen.port().to_string().as_str()) {
        bail!("field `peers` lists node {id} at {address} but field `listen` is {listen}: the ports differ");
    }
    if let Ok(exact) = address.parse::<SocketAddr>() {
        if !listen.ip().is_unspecified() && exact != listen {
            bail!("field `peers` lists node {id} at {address} but field `listen` is {listen}");
        }
    }
    Ok(())
}

async fn status(cluster: &str, json: bool) -> anyhow::Result<()> {
    let mut client = ClusterClient::new(cluster).context("--cluster")?;
    let mut reachable = 0;
    for (address, status) in client.status_all().await {
        match status {
            Ok(status) => {
                reachable += 1;
                if json {
                    let members: Vec<_> = status
                        .members
                        .iter()
                        .map(|m| serde_json::json!({"id": m.id, "address": m.address, "voter": m.voter}))
                        .collect();
                    outln!(
                        "{}",
                        serde_json::json!({
                            "address": address, "node": status.node_id, "state": status.server_state,
                            "leader": status.leader_id, "leader_address": status.leader_address,
                            "term": status.term, "commit_index": status.commit_index,
                            "last_applied": status.last_applied_index, "last_log_index": status.last_log_index,
                            "digest": status.digest_hex, "events_applied": status.events_applied,
                            "purged_index": status.purged_index,
                            "archive_bytes": status.archive_bytes,
                            "archive_segments": status.archive_segments,
                            "archive_segments_deleted": status.archive_segments_deleted,
                            "members": members, "fatal": status.fatal,
                        })
                    );
                } else {
                    outln!(
                        "{address}  node {} {:<9} leader {} term {} commit {} applied {} log {} events {} digest {}{}{}",
                        status.node_id,
                        status.server_state,
                        status.leader_id,
                        status.term,
                        status.commit_index,
                        status.last_applied_index,
                        status.last_log_index,
                        status.events_applied,
                        &status.digest_hex[..status.digest_hex.len().min(16)],
                        if status.archive_segments == 0 {
                            String::new()
                        } else {
                            format!(
                                "  archive {:.1} MiB in {} segments{}",
                                status.archive_bytes as f64 / (1u64 << 20) as f64,
                                status.archive_segments,
                                if status.archive_segments_deleted == 0 {
                                    String::new()
                                } else {
                                    format!(
                                        " ({} oldest deleted to stay within its size limit)",
                                        status.archive_segments_deleted
                                    )
                                }
                            )
                        },
                        if status.fatal.is_empty() { String::new() } else { format!("  HALTED: {}", status.fatal) }
                    );
                }
            }
            Err(error) => {
                if json {
                    outln!(
                        "{}",
                        serde_json::json!({"address": address, "error": error.to_string()})
                    );
                } else {
                    outln!("{address}  unreachable: {error}");
                }
            }
        }
    }
    if reachable == 0 {
        bail!("no node of {cluster} answered");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peers(text: &str) -> BTreeMap<u64, String> {
        parse_nodes(text).unwrap()
    }

    #[test]
    fn own_address_rules() {
        let listen: SocketAddr = "127.0.0.1:7001".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:7001".parse().unwrap();
        let ok = |id, listen, text: &str| check_own_address(id, listen, &peers(text));
        let error = |id, listen, text: &str| ok(id, listen, text).unwrap_err().to_string();
        ok(1, listen, "1=127.0.0.1:7001,2=127.0.0.1:7002").unwrap();
        ok(
            1,
            any,
            "1=gyre-control-1.gyre:7001,2=gyre-control-2.gyre:7001",
        )
        .unwrap();
        ok(1, any, "1=10.0.0.5:7001").unwrap();
        ok(1, listen, "1=localhost:7001").unwrap();
        assert_eq!(
            error(3, listen, "1=127.0.0.1:7001"),
            "field `peers` does not list this node (field `id` = 3)"
        );
        assert_eq!(
            error(1, listen, "1=127.0.0.1:7002"),
            "field `peers` lists node 1 at 127.0.0.1:7002 but field `listen` is 127.0.0.1:7001: the ports differ"
        );
        assert_eq!(
            error(1, listen, "1=10.0.0.5:7001"),
            "field `peers` lists node 1 at 10.0.0.5:7001 but field `listen` is 127.0.0.1:7001"
        );
        assert_eq!(
            error(1, listen, "1=127.0.0.1:7001,2=gyre-2"),
            "field `peers`: node 2's address \"gyre-2\" is not HOST:PORT"
        );
        assert_eq!(
            error(1, listen, "1=127.0.0.1:7001,2=:7002"),
            "field `peers`: node 2's address \":7002\" is not HOST:PORT"
        );
    }
}
