//! The Raft-replicated log: openraft 0.9.25 storage over Gyre's own segment files.
//!
//! This module is the thin adapter between openraft and the rest of Gyre; the 0.10 port stays
//! inside it. Pieces:
//!
//! - `types`: [`TypeConfig`] — an entry's data is one encoded `EventBatch`
//!   ([`EventBatchBytes`]), `apply` answers [`Applied`], node ids are `u64`, snapshots are
//!   files ([`SnapshotFile`]).
//! - `log_store` ([`LogStore`]): `RaftLogStorage` + `RaftLogReader` over segments of
//!   `segment_bytes` (64 MiB by default) in `<dir>/log/`. Records are framed like the event
//!   file (`[len][crc32c(index‖term‖payload)][index][term][payload]`) and hash-chained
//!   across segments. Appends are readable as soon as `append` returns; one writer thread
//!   (`writer`) makes each group of queued appends durable with exactly one `fdatasync`
//!   before calling their `LogFlushed`. Vote, committed and last purged live in `<dir>/meta`
//!   (tmp, fsync, rename, fsync dir). Purge deletes whole segments (or moves them to
//!   `<dir>/archive/`: `archive`); truncate cuts the
//!   containing segment (zeroing the cut records in a preallocated one). Reads for
//!   replication are bounded by bytes and count.
//!   New segments are allocated to `segment_bytes` up front (`fallocate`), so a group's
//!   `fdatasync` has no block allocation or size change to commit.
//! - Recovery (`LogStore::open`): every segment is scanned; a zero tail is unused space; a
//!   torn tail of the last segment is truncated; a bad checksum, a broken frame, a hole or a
//!   broken chain anywhere else is an error naming the segment file and byte offset.
//! - `state_machine` ([`StateMachineStore`]): `RaftStateMachine` folding committed batches
//!   into a [`Projection`], one [`Applied`] per entry; snapshots are immutable files
//!   (`snapshot`), the last two kept; [`open_storage`] restores the newest good one before
//!   `Raft::new`, and openraft replays the log suffix.
//! - `node`: [`start_node`] / [`RaftNode::shutdown`].
//!
//! Leader ids: openraft's default ("advanced") mode lets two leaders share a term, so a log
//! id is (term, node, index). The record frame stores the term; the proposing node id sits in
//! the payload header (see `record`).

pub mod archive;
mod error;
mod index;
mod log_store;
mod meta;
mod node;
pub mod record;
pub mod segment;
pub mod snapshot;
mod state_machine;
mod types;
mod writer;

pub use error::RaftStoreError;
pub use log_store::{LogReader, LogStore, LogStoreHandle, LogStoreOptions, WriterPause};
pub use meta::{read_meta, Meta};
pub use node::{open_storage, start_node, RaftNode};
pub use snapshot::{InstallGate, ReceivingSnapshot, SnapshotFile, SnapshotHeader, SNAPSHOTS_KEPT};
pub use state_machine::{Projection, SnapshotBuilder, StateMachineStore};
pub use types::{
    log_id, Applied, Entry, EventBatchBytes, LogId, Membership, Node, NodeId, Raft, Snapshot,
    SnapshotMeta, StorageError, StoredMembership, TypeConfig, Vote,
};
pub use writer::LogStats;

/// openraft itself, so users of this module name the same version.
pub use openraft;
