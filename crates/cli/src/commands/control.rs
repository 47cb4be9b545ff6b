//! `gyre control init | run | status | bench`: the control quorum (docs/control.md).
//!
//! - `run --id N --data-dir DIR --listen ADDR --peers 1=ADDR,...`: one node; prints
//!   `serving node N on ADDR` once listening, exits 2 if the node halts (a storage failure or a
//!   projection digest mismatch), 0 on Ctrl-C / SIGTERM.
//! - `init --nodes 1=ADDR,2=ADDR,3=ADDR`: forms the cluster through the lowest id, then waits for
//!   a leader.
//! - `status --cluster ADDRS`: leader, term, commit and applied index, digest per node.
//! - `bench`: the replicated log benchmark (`control_bench`).

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
    },
    /// Run one control node.
    Run {
        #[arg(long)]
        id: u64,
        #[arg(long)]
        data_dir: PathBuf,
        /// Address to serve the Raft and Control gRPC services on (also the peers' view of it).
        #[arg(long)]
        listen: SocketAddr,
        /// The cluster, `1=host:port,...`; must list this node at its listen address.
        #[arg(long)]
        peers: String,
        /// Build a snapshot after this many entries.
        #[arg(long, default_value_t = 20_000)]
        snapshot_every: u64,
    },
    /// Print every node's view: leader, term, commit / applied index, digest, membership.
    Status {
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
            ControlCommand::Init { nodes } => init(&nodes).await,
            ControlCommand::Run {
                id,
                data_dir,
                listen,
                peers,
                snapshot_every,
            } => run_node(id, data_dir, listen, &peers, snapshot_every).await,
            ControlCommand::Status { cluster, json } => status(&cluster, json).await,
            ControlCommand::Bench(args) => control_bench::run(args).await,
            ControlCommand::Soak(args) => control_bench::soak(args).await,
        }
    })
}

async fn init(nodes: &str) -> anyhow::Result<()> {
    let nodes = parse_nodes(nodes)?;
    let (first, address) = nodes.iter().next().context("at least one node")?;
    let all: Vec<&str> = nodes.values().map(String::as_str).collect();
    let mut client = ClusterClient::new(&all.join(","))?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
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
                return Err(error)
                    .with_context(|| format!("initialising through node {first} at {address}"))
            }
        }
    }
    loop {
        let status = client.status_of(address).await;
        if let Ok(status) = &status {
            if status.leader_id != 0 {
                println!(
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
                "membership written but no leader was elected within 20 s (are all nodes running?)"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn run_node(
    id: u64,
    data_dir: PathBuf,
    listen: SocketAddr,
    peers: &str,
    snapshot_every: u64,
) -> anyhow::Result<()> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,gyre_control=info")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let peers = parse_nodes(peers)?;
    match peers.get(&id) {
        None => bail!("--peers does not list this node (id {id})"),
        Some(address) if address.parse::<SocketAddr>().ok() != Some(listen) => {
            bail!("--peers lists node {id} at {address} but --listen is {listen}")
        }
        Some(_) => {}
    }
    std::fs::create_dir_all(&data_dir)
        .with_context(|| format!("creating {}", data_dir.display()))?;
    let mut options = NodeOptions::new(id, data_dir, listen);
    options.snapshot_every_entries = snapshot_every.max(1);
    let node = ControlNode::start(options).await?;
    println!("serving node {id} on {}", node.address);
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    let halted = tokio::select! {
        reason = node.halted() => Some(reason),
        _ = tokio::signal::ctrl_c() => None,
        _ = terminate.recv() => None,
    };
    node.shutdown().await?;
    match halted {
        Some(reason) => bail!("node {id} halted: {reason}"),
        None => Ok(()),
    }
}

async fn status(cluster: &str, json: bool) -> anyhow::Result<()> {
    let mut client = ClusterClient::new(cluster)?;
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
                    println!(
                        "{}",
                        serde_json::json!({
                            "address": address, "node": status.node_id, "state": status.server_state,
                            "leader": status.leader_id, "leader_address": status.leader_address,
                            "term": status.term, "commit_index": status.commit_index,
                            "last_applied": status.last_applied_index, "last_log_index": status.last_log_index,
                            "digest": status.digest_hex, "events_applied": status.events_applied,
                            "members": members, "fatal": status.fatal,
                        })
                    );
                } else {
                    println!(
                        "{address}  node {} {:<9} leader {} term {} commit {} applied {} log {} events {} digest {}{}",
                        status.node_id,
                        status.server_state,
                        status.leader_id,
                        status.term,
                        status.commit_index,
                        status.last_applied_index,
                        status.last_log_index,
                        status.events_applied,
                        &status.digest_hex[..status.digest_hex.len().min(16)],
                        if status.fatal.is_empty() { String::new() } else { format!("  HALTED: {}", status.fatal) }
                    );
                }
            }
            Err(error) => {
                if json {
                    println!(
                        "{}",
                        serde_json::json!({"address": address, "error": error.to_string()})
                    );
                } else {
                    println!("{address}  unreachable: {error}");
                }
            }
        }
    }
    if reachable == 0 {
        bail!("no node of {cluster} answered");
    }
    Ok(())
}
