//! The openraft type configuration for Gyre's log, and the aliases the rest of `raft` uses.
//!
//! This file and `mod.rs` are the only places that name openraft's generic types directly; the
//! 0.10 port (where `StorageError` becomes `io::Error` and `LogFlushed` becomes `IOFlushed`)
//! starts here.

use std::fmt;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::snapshot::SnapshotFile;

/// One Raft entry's application data: one encoded `EventBatch` (see [`crate::codec`]).
///
/// The bytes are stored verbatim in the log segment, so what the leader proposed is exactly
/// what every replica decodes and what an exported log carries.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventBatchBytes(pub Bytes);

impl EventBatchBytes {
    /// Encodes `events` as one batch.
    pub fn encode(events: &[gyre_event::Event]) -> Self {
        EventBatchBytes(Bytes::from(crate::codec::encode_batch(events)))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for EventBatchBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EventBatchBytes({} bytes)", self.0.len())
    }
}

impl From<Vec<u8>> for EventBatchBytes {
    fn from(bytes: Vec<u8>) -> Self {
        EventBatchBytes(Bytes::from(bytes))
    }
}

/// What applying one committed entry produced; `client_write` returns it to the proposer.
///
/// An event's sequence number is `(index, position in batch)`; `events` is the batch length
/// (0 for blank and membership entries).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    pub index: u64,
    pub events: u32,
    /// The projection refused the batch (deterministically, on every replica); the entry stays
    /// in the log as a recorded no-op. `None` when it was folded.
    pub rejected: Option<String>,
}

openraft::declare_raft_types!(
    /// Gyre's Raft types: node ids are `u64`, nodes carry an address, entries carry one
    /// `EventBatch`, snapshots are immutable files.
    pub TypeConfig:
        D = EventBatchBytes,
        R = Applied,
        NodeId = u64,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = SnapshotFile,
        AsyncRuntime = openraft::TokioRuntime,
);

/// A Raft node id.
pub type NodeId = u64;
pub type Node = openraft::BasicNode;
pub type LogId = openraft::LogId<NodeId>;
pub type Vote = openraft::Vote<NodeId>;
pub type Entry = openraft::Entry<TypeConfig>;
pub type Membership = openraft::Membership<NodeId, Node>;
pub type StoredMembership = openraft::StoredMembership<NodeId, Node>;
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, Node>;
pub type Snapshot = openraft::Snapshot<TypeConfig>;
pub type StorageError = openraft::StorageError<NodeId>;
pub type LogFlushed = openraft::storage::LogFlushed<TypeConfig>;
/// A running Raft node over Gyre's log.
pub type Raft = openraft::Raft<TypeConfig>;

/// Builds a log id (term, leader node, index).
pub fn log_id(term: u64, leader_node_id: NodeId, index: u64) -> LogId {
    openraft::LogId::new(
        openraft::CommittedLeaderId::new(term, leader_node_id),
        index,
    )
}
