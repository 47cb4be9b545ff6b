//! Snapshot files: immutable, checksummed, the last two kept.
//!
//! ```text
//! file   = magic "GYRE-SNP" (8), format_version u32 = 1, header_len u32, header (JSON),
//!          header_crc u32 (crc32c of every byte before it), body
//! header = { last_log_id, last_membership, snapshot_id, body_len, body_crc32c,
//!            digest (hex of the projection's digest after restoring the body) }
//! ```
//! Files are `snapshots/snap-<seq as 20 digits>.snap`, `seq` increasing with creation; each is
//! written as `.tmp`, fsync'd, renamed, and the directory fsync'd. The digest in the header
//! lets a restore check that `restore(body)` rebuilt the state that was saved.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::error::RaftStoreError;
use super::meta::write_file_atomically;
use super::types::{LogId, SnapshotMeta, StoredMembership};
use crate::file::read_u32;

pub const SNAPSHOT_MAGIC: [u8; 8] = *b"GYRE-SNP";
pub const SNAPSHOT_FORMAT_VERSION: u32 = 1;
/// Snapshots kept on disk; older ones are deleted after a new one is durable.
pub const SNAPSHOTS_KEPT: usize = 2;

/// openraft's snapshot data: a handle on a complete snapshot file.
///
/// A sender streams the file's bytes ([`SnapshotFile::read_bytes`]); a receiver writes them
/// to a file of its own ([`SnapshotFile::write_received`]) and passes that handle to
/// `Raft::install_full_snapshot`, which copies it into the node's snapshot directory after
/// checking it.
#[derive(Clone, Debug)]
pub struct SnapshotFile {
    pub path: PathBuf,
    /// Held on a received snapshot for its drop, which settles it (see [`InstallGate`]).
    _pending: Option<Arc<PendingInstall>>,
}

impl PartialEq for SnapshotFile {
    fn eq(&self, other: &Self) -> bool {
        self.path == other.path
    }
}

impl Eq for SnapshotFile {}

impl SnapshotFile {
    /// A handle on a complete snapshot file of this node's.
    pub fn at(path: PathBuf) -> Self {
        SnapshotFile {
            path,
            _pending: None,
        }
    }

    /// A handle on a received snapshot's file, pending at `gate` until it is dropped.
    pub fn received(path: PathBuf, gate: &Arc<InstallGate>) -> Self {
        SnapshotFile {
            _pending: Some(Arc::new(gate.enter(path.clone()))),
            path,
        }
    }

    pub fn read_bytes(&self) -> Result<Vec<u8>, RaftStoreError> {
        fs::read(&self.path).map_err(RaftStoreError::io(&self.path, "read snapshot"))
    }

    /// Writes received snapshot bytes to `path` (durably) and returns a handle on it, pending
    /// at `gate` (the state machine's, [`StateMachineStore::install_gate`]) until openraft
    /// installs it or lets it go.
    ///
    /// [`StateMachineStore::install_gate`]: super::StateMachineStore::install_gate
    pub fn write_received(
        path: impl Into<PathBuf>,
        bytes: &[u8],
        gate: &Arc<InstallGate>,
    ) -> Result<Self, RaftStoreError> {
        let path = path.into();
        write_file_atomically(&path, bytes)?;
        Ok(SnapshotFile::received(path, gate))
    }
}

/// Received snapshots not yet settled (stored durably by an install, or let go by openraft)
/// and the newest snapshot stored durably. openraft 0.9 queues the log purge that follows an
/// install without waiting for the install, so a purge up to an entry no stored snapshot covers
/// waits here while a received one is pending ([`InstallGate::settled`]): a crash between the
/// two must not leave the log purged past the newest snapshot on disk. A purge behind a stored
/// snapshot (the usual one, after a build) never waits, so one cannot hold openraft's core
/// while an install waits behind it.
#[derive(Debug)]
pub struct InstallGate {
    state: tokio::sync::watch::Sender<GateState>,
}

#[derive(Clone, Copy, Debug, Default)]
struct GateState {
    pending: usize,
    stored: Option<LogId>,
}

impl InstallGate {
    pub fn new() -> Arc<InstallGate> {
        Arc::new(InstallGate {
            state: tokio::sync::watch::Sender::new(GateState::default()),
        })
    }

    fn enter(self: &Arc<Self>, path: PathBuf) -> PendingInstall {
        self.state.send_modify(|state| state.pending += 1);
        PendingInstall {
            gate: self.clone(),
            path,
        }
    }

    /// A snapshot up to `last_log_id` is stored durably.
    pub fn stored(&self, last_log_id: Option<LogId>) {
        self.state
            .send_modify(|state| state.stored = state.stored.max(last_log_id));
    }

    /// Received snapshots not yet settled.
    pub fn pending(&self) -> usize {
        self.state.borrow().pending
    }

    /// Waits until a stored snapshot covers `upto` or no received snapshot is pending, for at
    /// most `within`; false on timeout.
    pub async fn settled(&self, upto: LogId, within: std::time::Duration) -> bool {
        let mut state = self.state.subscribe();
        let settled = tokio::time::timeout(
            within,
            state.wait_for(|state| state.pending == 0 || state.stored >= Some(upto)),
        )
        .await
        .is_ok_and(|waited| waited.is_ok());
        settled
    }
}

/// One received snapshot's place at the gate; leaves it when the last handle drops. A received
/// file that is still there then was never installed (an install removes it once stored): it is
/// removed too, rather than left until the next restart.
#[derive(Debug)]
struct PendingInstall {
    gate: Arc<InstallGate>,
    path: PathBuf,
}

impl Drop for PendingInstall {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
        self.gate
            .state
            .send_modify(|state| state.pending = state.pending.saturating_sub(1));
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotHeader {
    pub last_log_id: Option<LogId>,
    pub last_membership: StoredMembership,
    pub snapshot_id: String,
    pub body_len: u64,
    pub body_crc32c: u32,
    /// Hex of the projection digest of this state.
    pub digest: String,
}

impl SnapshotHeader {
    pub fn meta(&self) -> SnapshotMeta {
        SnapshotMeta {
            last_log_id: self.last_log_id,
            last_membership: self.last_membership.clone(),
            snapshot_id: self.snapshot_id.clone(),
        }
    }
}

/// Encodes a whole snapshot file.
pub fn encode_snapshot(header: &SnapshotHeader, body: &[u8]) -> Vec<u8> {
    let header_json = serde_json::to_vec(header).expect("a snapshot header always serialises");
    let mut bytes = Vec::with_capacity(20 + header_json.len() + body.len());
    bytes.extend_from_slice(&SNAPSHOT_MAGIC);
    bytes.extend_from_slice(&SNAPSHOT_FORMAT_VERSION.to_le_bytes());
    bytes.extend_from_slice(
        &u32::try_from(header_json.len())
            .expect("a snapshot header is small")
            .to_le_bytes(),
    );
    bytes.extend_from_slice(&header_json);
    let crc = crc32c::crc32c(&bytes);
    bytes.extend_from_slice(&crc.to_le_bytes());
    bytes.extend_from_slice(body);
    bytes
}

/// Parses and checks a snapshot file's bytes; returns the header and the body.
pub fn decode_snapshot<'a>(
    path: &Path,
    bytes: &'a [u8],
) -> Result<(SnapshotHeader, &'a [u8]), RaftStoreError> {
    let bad = |detail: String| RaftStoreError::BadSnapshot {
        path: path.to_path_buf(),
        detail,
    };
    if bytes.len() < 20 || bytes[0..8] != SNAPSHOT_MAGIC {
        return Err(bad("not a Gyre snapshot (bad magic or too short)".into()));
    }
    let version = read_u32(&bytes[8..12]);
    if version != SNAPSHOT_FORMAT_VERSION {
        return Err(bad(format!(
            "snapshot format version {version} is not readable by this build \
             (it reads {SNAPSHOT_FORMAT_VERSION})"
        )));
    }
    let header_len = read_u32(&bytes[12..16]) as usize;
    let header_end = 16usize.saturating_add(header_len);
    if bytes.len() < header_end.saturating_add(4) {
        return Err(bad(format!(
            "file is {} bytes, too short for its {header_len}-byte header",
            bytes.len()
        )));
    }
    let stored_crc = read_u32(&bytes[header_end..header_end + 4]);
    let computed_crc = crc32c::crc32c(&bytes[..header_end]);
    if stored_crc != computed_crc {
        return Err(bad(format!(
            "header checksum mismatch (stored {stored_crc:#010x}, computed {computed_crc:#010x})"
        )));
    }
    let header: SnapshotHeader = serde_json::from_slice(&bytes[16..header_end])
        .map_err(|error| bad(format!("header does not parse: {error}")))?;
    let body = &bytes[header_end + 4..];
    if body.len() as u64 != header.body_len {
        return Err(bad(format!(
            "body is {} bytes, header says {}",
            body.len(),
            header.body_len
        )));
    }
    let body_crc = crc32c::crc32c(body);
    if body_crc != header.body_crc32c {
        return Err(bad(format!(
            "body checksum mismatch (stored {:#010x}, computed {body_crc:#010x})",
            header.body_crc32c
        )));
    }
    Ok((header, body))
}

/// The snapshot directory of one node.
#[derive(Debug)]
pub(crate) struct SnapshotDir {
    pub dir: PathBuf,
    next_seq: u64,
    /// The newest usable snapshot.
    pub current: Option<(SnapshotMeta, PathBuf)>,
}

fn parse_snapshot_file_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("snap-")?.strip_suffix(".snap")?;
    if digits.len() != 20 || !digits.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

impl SnapshotDir {
    /// Opens `dir`, removing unfinished files; returns the snapshot files newest first.
    pub fn open(dir: PathBuf) -> Result<(Self, Vec<PathBuf>), RaftStoreError> {
        fs::create_dir_all(&dir).map_err(RaftStoreError::io(&dir, "create snapshot dir"))?;
        let mut files = Vec::new();
        for dir_entry in fs::read_dir(&dir).map_err(RaftStoreError::io(&dir, "list snapshots"))? {
            let dir_entry = dir_entry.map_err(RaftStoreError::io(&dir, "list snapshots"))?;
            let name = dir_entry.file_name();
            let name = name.to_string_lossy();
            if name.ends_with(".tmp") || name.starts_with("incoming-") {
                let path = dir_entry.path();
                fs::remove_file(&path).map_err(RaftStoreError::io(&path, "remove unfinished"))?;
            } else if let Some(seq) = parse_snapshot_file_name(&name) {
                files.push((seq, dir_entry.path()));
            }
        }
        files.sort();
        let next_seq = files.last().map_or(1, |(seq, _)| seq + 1);
        let newest_first = files.into_iter().rev().map(|(_, path)| path).collect();
        Ok((
            SnapshotDir {
                dir,
                next_seq,
                current: None,
            },
            newest_first,
        ))
    }

    pub fn next_snapshot_id(&self, last_log_id: Option<LogId>) -> String {
        match last_log_id {
            Some(log_id) => format!(
                "{}-{}-{}",
                log_id.leader_id.term, log_id.index, self.next_seq
            ),
            None => format!("none-{}", self.next_seq),
        }
    }

    /// A fresh path for an incoming snapshot (removed at the next open if never installed).
    pub fn incoming_path(&mut self) -> PathBuf {
        let path = self.dir.join(format!("incoming-{:020}", self.next_seq));
        self.next_seq += 1;
        path
    }

    /// Stores a snapshot this node built, unless it is older than the current one: openraft
    /// builds in a task of its own, so an install of a newer snapshot (after which the log
    /// before it may be purged) can land while a build copies older state. The stale build is
    /// dropped and the current snapshot returned in its place.
    pub fn store_built(
        &mut self,
        meta: SnapshotMeta,
        bytes: &[u8],
    ) -> Result<(SnapshotMeta, PathBuf), RaftStoreError> {
        if let Some((current, path)) = &self.current {
            if current.last_log_id > meta.last_log_id {
                tracing::info!(
                    built = ?meta.last_log_id,
                    current = ?current.last_log_id,
                    "a snapshot built before a newer one was installed is dropped"
                );
                return Ok((current.clone(), path.clone()));
            }
        }
        let path = self.store(meta.clone(), bytes)?;
        Ok((meta, path))
    }

    /// Stores a complete snapshot file durably, makes it current, and keeps the last two.
    pub fn store(&mut self, meta: SnapshotMeta, bytes: &[u8]) -> Result<PathBuf, RaftStoreError> {
        let path = self.dir.join(format!("snap-{:020}.snap", self.next_seq));
        self.next_seq += 1;
        write_file_atomically(&path, bytes)?;
        self.current = Some((meta, path.clone()));
        self.prune()?;
        Ok(path)
    }

    fn prune(&self) -> Result<(), RaftStoreError> {
        let mut files = Vec::new();
        for dir_entry in
            fs::read_dir(&self.dir).map_err(RaftStoreError::io(&self.dir, "list snapshots"))?
        {
            let dir_entry = dir_entry.map_err(RaftStoreError::io(&self.dir, "list snapshots"))?;
            if let Some(seq) = parse_snapshot_file_name(&dir_entry.file_name().to_string_lossy()) {
                files.push((seq, dir_entry.path()));
            }
        }
        files.sort();
        let excess = files.len().saturating_sub(SNAPSHOTS_KEPT);
        for (_, path) in files.into_iter().take(excess) {
            fs::remove_file(&path).map_err(RaftStoreError::io(&path, "delete old snapshot"))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::types::log_id;

    fn meta(index: u64) -> SnapshotMeta {
        SnapshotMeta {
            last_log_id: Some(log_id(1, 1, index)),
            last_membership: StoredMembership::default(),
            snapshot_id: format!("1-{index}"),
        }
    }

    /// openraft builds a snapshot in a task of its own, so an install of a newer snapshot can
    /// land while a build copies older state, and the log before the installed one may then
    /// be purged. The stale build is neither written nor made current.
    #[test]
    fn a_build_older_than_the_current_snapshot_steps_aside() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut snapshots, _) = SnapshotDir::open(dir.path().join("s")).expect("opens");
        snapshots.store(meta(10), b"installed").expect("stores");
        let (current, path) = snapshots.store_built(meta(3), b"stale").expect("answers");
        assert_eq!(current, meta(10));
        assert_eq!(fs::read(&path).expect("reads"), b"installed");
        assert_eq!(
            fs::read_dir(dir.path().join("s")).expect("lists").count(),
            1
        );
        let (current, path) = snapshots.store_built(meta(12), b"newer").expect("stores");
        assert_eq!(current, meta(12));
        assert_eq!(fs::read(&path).expect("reads"), b"newer");
    }
}
