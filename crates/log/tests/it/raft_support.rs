//! Shared pieces of the Raft storage tests: a small projection, entry builders, and an
//! in-process router network that calls the target `Raft` directly.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gyre_event::{EngineId, Event, EventBody, Timestamp};
use gyre_log::raft::openraft::error::{
    Fatal, RPCError, RaftError, RemoteError, ReplicationClosed, StreamingError, Unreachable,
};
use gyre_log::raft::openraft::network::RPCOption;
use gyre_log::raft::openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use gyre_log::raft::openraft::{EntryPayload, RaftNetwork, RaftNetworkFactory};
use gyre_log::raft::{
    log_id, Entry, EventBatchBytes, LogStore, Node, NodeId, Projection, Raft, Snapshot, TypeConfig,
    Vote,
};
use sha2::{Digest, Sha256};

/// Counts batches and events, remembers every marker (the engine id of `EngineReady` events)
/// and hash-chains every batch it folds, so two replicas agree only if they folded the same
/// batches in the same order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CountingProjection {
    pub batches: u64,
    pub events: u64,
    pub last_index: u64,
    pub chain: [u8; 32],
    pub markers: BTreeSet<u64>,
}

impl Projection for CountingProjection {
    fn apply_events(
        &mut self,
        index: u64,
        _batch: &[u8],
        events: Vec<Event>,
    ) -> Result<(), String> {
        if index <= self.last_index && self.batches > 0 {
            return Err(format!(
                "index {index} applied twice (last {})",
                self.last_index
            ));
        }
        let mut hasher = Sha256::new();
        hasher.update(self.chain);
        hasher.update(index.to_le_bytes());
        hasher.update(gyre_log::encode_batch(&events));
        self.chain = hasher.finalize().into();
        self.batches += 1;
        self.events += events.len() as u64;
        self.last_index = index;
        for event in events {
            if let EventBody::EngineReady { engine } = event.body {
                self.markers.insert(u64::from(engine.0));
            }
        }
        Ok(())
    }

    fn snapshot_body(&self) -> Vec<u8> {
        let mut body = Vec::new();
        body.extend_from_slice(&self.batches.to_le_bytes());
        body.extend_from_slice(&self.events.to_le_bytes());
        body.extend_from_slice(&self.last_index.to_le_bytes());
        body.extend_from_slice(&self.chain);
        for marker in &self.markers {
            body.extend_from_slice(&marker.to_le_bytes());
        }
        body
    }

    fn restore(body: &[u8]) -> Result<Self, String> {
        if body.len() < 56 || !(body.len() - 56).is_multiple_of(8) {
            return Err(format!("body of {} bytes has the wrong length", body.len()));
        }
        let u64_at = |at: usize| u64::from_le_bytes(body[at..at + 8].try_into().expect("8 bytes"));
        let mut chain = [0u8; 32];
        chain.copy_from_slice(&body[24..56]);
        Ok(CountingProjection {
            batches: u64_at(0),
            events: u64_at(8),
            last_index: u64_at(16),
            chain,
            markers: (56..body.len()).step_by(8).map(u64_at).collect(),
        })
    }

    fn digest(&self) -> [u8; 32] {
        Sha256::digest(self.snapshot_body()).into()
    }

    fn empty() -> Self {
        CountingProjection::default()
    }
}

/// `count` small events; the first is an `EngineReady` carrying `marker`.
pub fn events(marker: u64, count: usize) -> Vec<Event> {
    (0..count)
        .map(|position| Event {
            at: Timestamp(marker * 1_000 + position as u64),
            body: if position == 0 {
                EventBody::EngineReady {
                    engine: EngineId(u32::try_from(marker).expect("markers are small")),
                }
            } else {
                EventBody::Tick
            },
        })
        .collect()
}

pub fn batch(marker: u64, count: usize) -> EventBatchBytes {
    EventBatchBytes::encode(&events(marker, count))
}

pub fn normal(term: u64, index: u64, batch: EventBatchBytes) -> Entry {
    Entry {
        log_id: log_id(term, 1, index),
        payload: EntryPayload::Normal(batch),
    }
}

pub fn blank(term: u64, index: u64) -> Entry {
    Entry {
        log_id: log_id(term, 1, index),
        payload: EntryPayload::Blank,
    }
}

/// Appends and waits until the entries are durable.
pub async fn append_durable(store: &mut LogStore, entries: Vec<Entry>) {
    let (done, durable) = tokio::sync::oneshot::channel();
    store
        .append_then(entries, move |result| {
            let _ = done.send(result);
        })
        .expect("append is accepted");
    durable
        .await
        .expect("the writer answers")
        .expect("the append is durable");
}

/// Drops a log store and waits until its writer thread has exited.
pub async fn close(store: LogStore) {
    let handle = store.handle();
    drop(store);
    handle.writer_exited().await;
}

pub fn segment_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir.join("log"))
        .expect("log dir exists")
        .map(|entry| entry.expect("dir entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "seg"))
        .collect();
    files.sort();
    files
}

/// Faults a router applies to messages, drawn from a seeded generator.
#[derive(Debug, Default)]
pub struct Faults {
    pub rng_state: u64,
    /// Per mille of messages dropped.
    pub drop_per_mille: u64,
    /// Most milliseconds a message is held back.
    pub delay_ms_max: u64,
    /// Nodes cut off from everyone.
    pub isolated: BTreeSet<NodeId>,
}

impl Faults {
    /// splitmix64: small, seedable, good enough for fault draws.
    fn next(&mut self) -> u64 {
        self.rng_state = self.rng_state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng_state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Routes RPCs between in-process nodes by calling the target's `Raft` directly.
#[derive(Clone, Default)]
pub struct Router {
    pub nodes: Arc<Mutex<BTreeMap<NodeId, Raft>>>,
    pub faults: Arc<Mutex<Faults>>,
}

impl Router {
    pub fn insert(&self, id: NodeId, raft: Raft) {
        self.nodes.lock().expect("router lock").insert(id, raft);
    }

    pub fn remove(&self, id: NodeId) {
        self.nodes.lock().expect("router lock").remove(&id);
    }

    /// The target, unless it is gone or a fault drops this message; waits out a drawn delay.
    async fn deliver(&self, from: NodeId, to: NodeId) -> Result<Raft, Unreachable> {
        let (delay_ms, dropped) = {
            let mut faults = self.faults.lock().expect("faults lock");
            let cut = faults.isolated.contains(&from) || faults.isolated.contains(&to);
            let dropped =
                cut || (faults.drop_per_mille > 0 && faults.next() % 1000 < faults.drop_per_mille);
            let delay_ms = if faults.delay_ms_max > 0 {
                faults.next() % (faults.delay_ms_max + 1)
            } else {
                0
            };
            (delay_ms, dropped)
        };
        if delay_ms > 0 {
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        }
        let unreachable =
            || Unreachable::new(&std::io::Error::other(format!("{from} -> {to} cut")));
        if dropped {
            return Err(unreachable());
        }
        self.nodes
            .lock()
            .expect("router lock")
            .get(&to)
            .cloned()
            .ok_or_else(unreachable)
    }

    pub fn factory(&self, from: NodeId) -> RouterFactory {
        RouterFactory {
            from,
            router: self.clone(),
        }
    }
}

pub struct RouterFactory {
    from: NodeId,
    router: Router,
}

pub struct RouterNetwork {
    from: NodeId,
    target: NodeId,
    router: Router,
}

impl RaftNetworkFactory<TypeConfig> for RouterFactory {
    type Network = RouterNetwork;

    async fn new_client(&mut self, target: NodeId, _node: &Node) -> Self::Network {
        RouterNetwork {
            from: self.from,
            target,
            router: self.router.clone(),
        }
    }
}

type RpcError<E = RaftError<NodeId>> = RPCError<NodeId, Node, E>;

impl RaftNetwork<TypeConfig> for RouterNetwork {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RpcError> {
        let raft = self.router.deliver(self.from, self.target).await?;
        raft.append_entries(rpc)
            .await
            .map_err(|error| RPCError::RemoteError(RemoteError::new(self.target, error)))
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RpcError> {
        let raft = self.router.deliver(self.from, self.target).await?;
        raft.vote(rpc)
            .await
            .map_err(|error| RPCError::RemoteError(RemoteError::new(self.target, error)))
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        _cancel: impl std::future::Future<Output = ReplicationClosed> + Send + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<NodeId>, StreamingError<TypeConfig, Fatal<NodeId>>> {
        let raft = self.router.deliver(self.from, self.target).await?;
        raft.install_full_snapshot(vote, snapshot)
            .await
            .map_err(|error| StreamingError::RemoteError(RemoteError::new(self.target, error)))
    }
}
