//! [`ControlNode`]: one control quorum member — its Raft, storage, gRPC server, proposer and
//! controller loop — and the handles that own them.
//!
//! Tasks (each owned by the node; all end at [`ControlNode::shutdown`]):
//! - "grpc-server": tonic serving the `Raft` and `Control` services on the listen address;
//! - "proposer": the single batching proposer (`proposer`);
//! - "controller": the leader's decision / tick loop (`controller`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use gyre_log::raft::openraft::{Config, SnapshotPolicy};
use gyre_log::raft::{start_node, LogStoreOptions, NodeId, RaftNode};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::control_service::ControlService;
use crate::controller::{ControllerLoop, ControllerOptions};
use crate::error::ControlError;
use crate::network::{self, Network};
use crate::projection::ControlProjection;
use crate::proposer::{Proposer, ProposerOptions};
use crate::raft_service::RaftService;

#[derive(Clone, Debug)]
pub struct NodeOptions {
    pub id: NodeId,
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    pub heartbeat_ms: u64,
    pub election_timeout_ms_min: u64,
    pub election_timeout_ms_max: u64,
    /// Build a snapshot after this many entries since the last one.
    pub snapshot_every_entries: u64,
    /// Entries kept in the log behind a snapshot (so `Subscribe` / `ExportLog` reach far back).
    pub entries_kept_behind_snapshot: u64,
    pub log: LogStoreOptions,
    pub proposer: ProposerOptions,
    pub controller: ControllerOptions,
    /// Data bytes per chunk when this node sends a snapshot to a peer
    /// ([`crate::network::SNAPSHOT_CHUNK_BYTES`]; tests use small ones to send many).
    pub snapshot_chunk_bytes: usize,
}

impl NodeOptions {
    pub fn new(id: NodeId, data_dir: PathBuf, listen: SocketAddr) -> Self {
        NodeOptions {
            id,
            data_dir,
            listen,
            heartbeat_ms: 100,
            election_timeout_ms_min: 600,
            election_timeout_ms_max: 1200,
            snapshot_every_entries: 20_000,
            entries_kept_behind_snapshot: 1_000_000,
            // A control node keeps its whole committed log: purged segments go to `archive/`.
            log: LogStoreOptions {
                archive: true,
                ..LogStoreOptions::default()
            },
            proposer: ProposerOptions::default(),
            controller: ControllerOptions::default(),
            snapshot_chunk_bytes: crate::network::SNAPSHOT_CHUNK_BYTES,
        }
    }

    fn raft_config(&self) -> Result<Arc<Config>, ControlError> {
        let config = Config {
            cluster_name: "gyre-control".to_string(),
            heartbeat_interval: self.heartbeat_ms,
            election_timeout_min: self.election_timeout_ms_min,
            election_timeout_max: self.election_timeout_ms_max,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(self.snapshot_every_entries),
            max_in_snapshot_log_to_keep: self.entries_kept_behind_snapshot,
            install_snapshot_timeout: 120_000,
            ..Config::default()
        }
        .validate()
        .map_err(|error| ControlError::BadRequest(format!("raft config: {error}")))?;
        Ok(Arc::new(config))
    }
}

pub struct ControlNode {
    pub id: NodeId,
    pub address: SocketAddr,
    pub raft: RaftNode<ControlProjection>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<(&'static str, JoinHandle<()>)>,
    fatal: Arc<Mutex<Option<String>>>,
}

impl ControlNode {
    /// Opens the node's storage, starts Raft and binds the gRPC server. A fresh data directory
    /// is an uninitialised node; `Control.Initialize` on one node forms the cluster.
    pub async fn start(options: NodeOptions) -> Result<ControlNode, ControlError> {
        let config = options.raft_config()?;
        let listener =
            crate::listen::bind_listener(options.listen).map_err(|error| ControlError::Listen {
                address: options.listen.to_string(),
                error,
            })?;
        let address = listener.local_addr()?;
        let node = start_node::<ControlProjection, _>(
            options.id,
            &options.data_dir,
            config,
            Network::with_snapshot_chunk_bytes(options.snapshot_chunk_bytes),
            options.log,
        )
        .await?;
        let (shutdown, shutdown_seen) = watch::channel(false);
        let (jobs, job_queue) = mpsc::channel(options.proposer.queue_max);
        let fatal = Arc::new(Mutex::new(None));
        let mut tasks = Vec::new();

        let raft_for_address = node.raft.clone();
        let leader_address = Arc::new(move |leader: NodeId| {
            raft_for_address
                .metrics()
                .borrow()
                .membership_config
                .membership()
                .get_node(&leader)
                .map(|node| node.addr.clone())
        });
        let proposer = Proposer {
            raft: node.raft.clone(),
            state_machine: node.state_machine.clone(),
            log: node.log.clone(),
            leader_address,
            options: options.proposer,
        };
        tasks.push(("proposer", tokio::spawn(proposer.run(job_queue))));

        let controller = ControllerLoop {
            id: options.id,
            raft: node.raft.clone(),
            state_machine: node.state_machine.clone(),
            jobs: jobs.clone(),
            options: options.controller,
        };
        tasks.push((
            "controller",
            tokio::spawn(controller.run(shutdown_seen.clone())),
        ));

        let raft_service = RaftService::new(
            node.raft.clone(),
            options.data_dir.clone(),
            node.state_machine.install_gate(),
        );
        let control_service = ControlService {
            id: options.id,
            raft: node.raft.clone(),
            state_machine: node.state_machine.clone(),
            log: node.log.clone(),
            data_dir: options.data_dir.clone(),
            jobs,
            leader_channels: Arc::default(),
            fatal: fatal.clone(),
        };
        let mut stop = shutdown_seen.clone();
        let server = tonic::transport::Server::builder()
            .tcp_nodelay(true)
            .initial_stream_window_size(network::STREAM_WINDOW_BYTES)
            .initial_connection_window_size(network::CONNECTION_WINDOW_BYTES)
            .max_frame_size(network::FRAME_BYTES_MAX)
            .add_service(raft_service.server())
            .add_service(control_service.server())
            // Accepted sockets get TCP_NODELAY here (the builder's flag only covers sockets
            // tonic binds itself): without it Nagle plus delayed ACKs add ~40 ms to replies.
            .serve_with_incoming_shutdown(
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
                async move {
                    let _ = stop.wait_for(|stopped| *stopped).await;
                },
            );
        let server_fatal = fatal.clone();
        tasks.push((
            "grpc-server",
            tokio::spawn(async move {
                if let Err(error) = server.await {
                    tracing::error!(%error, "grpc server stopped");
                    *server_fatal.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some(format!("grpc server: {error}"));
                }
            }),
        ));
        tracing::info!(id = options.id, %address, "control node serving");
        Ok(ControlNode {
            id: options.id,
            address,
            raft: node,
            shutdown,
            tasks,
            fatal,
        })
    }

    /// Resolves when the node can no longer serve: Raft stopped with a fatal error (a storage
    /// failure or a projection digest mismatch) or the server failed. Returns why.
    pub async fn halted(&self) -> String {
        let mut metrics = self.raft.raft.metrics();
        loop {
            if let Err(fatal) = &metrics.borrow().running_state {
                return fatal.to_string();
            }
            if let Some(reason) = self.fatal.lock().unwrap_or_else(|p| p.into_inner()).clone() {
                return reason;
            }
            if metrics.changed().await.is_err() {
                return "raft stopped".to_string();
            }
        }
    }

    /// Stops accepting requests, stops Raft and the log writer, then ends every task.
    ///
    /// Raft stops before the tasks are awaited: a write in flight may wait for a quorum that is
    /// gone (the other nodes stopped first), and only Raft's shutdown fails it. Such a write
    /// was never acknowledged, so nothing acknowledged is lost. The server gets
    /// `SERVER_DRAIN` to finish its requests (a `Subscribe` stream follows the log forever),
    /// then it is aborted.
    pub async fn shutdown(self) -> Result<(), ControlError> {
        const SERVER_DRAIN: std::time::Duration = std::time::Duration::from_secs(5);
        let _ = self.shutdown.send(true);
        let stopped = self.raft.shutdown().await;
        for (name, mut task) in self.tasks {
            if name == "grpc-server" {
                if tokio::time::timeout(SERVER_DRAIN, &mut task).await.is_ok() {
                    continue;
                }
                tracing::warn!("requests still open after {SERVER_DRAIN:?}; closing them");
                task.abort();
            } else if name == "proposer" {
                // The proposer ends when its last sender (held by the services) is dropped; the
                // server is stopping, so aborting loses no acknowledged write.
                task.abort();
            }
            let _ = task.await;
        }
        stopped?;
        Ok(())
    }
}

/// Parses `1=host:port,2=host:port`.
pub fn parse_nodes(text: &str) -> Result<BTreeMap<NodeId, String>, ControlError> {
    let mut nodes = BTreeMap::new();
    for part in text
        .split(',')
        .map(str::trim)
        .filter(|part| !part.is_empty())
    {
        let (id, address) = part
            .split_once('=')
            .ok_or_else(|| ControlError::Invalid(format!("{part:?} is not ID=HOST:PORT")))?;
        let id: NodeId = id.trim().parse().map_err(|_| {
            ControlError::Invalid(format!("node id {id:?} is not a positive integer"))
        })?;
        if id == 0 {
            return Err(ControlError::Invalid(
                "node id 0 is reserved; ids start at 1".to_string(),
            ));
        }
        if nodes.insert(id, address.trim().to_string()).is_some() {
            return Err(ControlError::Invalid(format!("node {id} is listed twice")));
        }
    }
    if nodes.is_empty() {
        return Err(ControlError::Invalid(
            "no nodes given (expected 1=HOST:PORT,...)".to_string(),
        ));
    }
    Ok(nodes)
}
