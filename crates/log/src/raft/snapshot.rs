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
use super::meta::{sync_directory, write_parts_atomically};
use super::types::{LogId, SnapshotMeta, StoredMembership};
use crate::file::read_u32;

pub const SNAPSHOT_MAGIC: [u8; 8] = *b"GYRE-SNP";
pub const SNAPSHOT_FORMAT_VERSION: u32 = 1;
/// Snapshots kept on disk; older ones are deleted after a new one is durable.
pub const SNAPSHOTS_KEPT: usize = 2;

/// openraft's snapshot data: a handle on a complete snapshot file.
///
/// A sender streams the file's bytes a chunk at a time ([`SnapshotFile::chunks`]); a receiver
/// writes each chunk to a file of its own as it arrives ([`ReceivingSnapshot`]) and passes
/// that handle to `Raft::install_full_snapshot`, which checks it and moves it into the node's
/// snapshot directory. Neither side holds the whole snapshot in memory for the transfer (the
/// install reads it once, to restore the state from it).
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

    /// The file's bytes in chunks of at most `chunk_bytes` (at least 1), read as they are
    /// asked for: the whole file is never in memory.
    pub fn chunks(
        &self,
        chunk_bytes: usize,
    ) -> Result<impl Iterator<Item = Result<Vec<u8>, RaftStoreError>>, RaftStoreError> {
        use std::io::Read;
        let path = self.path.clone();
        let mut file = fs::File::open(&path).map_err(RaftStoreError::io(&path, "open snapshot"))?;
        let chunk_bytes = chunk_bytes.max(1);
        let mut done = false;
        Ok(std::iter::from_fn(move || {
            if done {
                return None;
            }
            let mut chunk = Vec::with_capacity(chunk_bytes);
            match (&mut file).take(chunk_bytes as u64).read_to_end(&mut chunk) {
                Ok(0) => {
                    done = true;
                    None
                }
                Ok(_) => Some(Ok(chunk)),
                Err(error) => {
                    done = true;
                    Some(Err(RaftStoreError::io(&path, "read snapshot")(error)))
                }
            }
        }))
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
        let mut receiving = ReceivingSnapshot::create(path, gate)?;
        receiving.write(bytes)?;
        receiving.finish()
    }
}

/// A snapshot being received: each chunk is written to the file as it arrives, and the file is
/// made durable once the last one is in ([`ReceivingSnapshot::finish`]). Pending at the
/// install gate from the start, so a transfer cut short leaves no file behind (the handle's
/// drop removes it).
#[derive(Debug)]
pub struct ReceivingSnapshot {
    file: fs::File,
    handle: SnapshotFile,
    bytes: u64,
    /// The file's head, gathered until it is whole (see `head_bytes_wanted`).
    head: Vec<u8>,
    /// Length and running checksum of what came after the head.
    body_len: u64,
    body_crc: u32,
}

impl ReceivingSnapshot {
    /// Creates the file at `path` (truncating one there), pending at `gate`.
    pub fn create(
        path: impl Into<PathBuf>,
        gate: &Arc<InstallGate>,
    ) -> Result<Self, RaftStoreError> {
        let path = path.into();
        let handle = SnapshotFile::received(path.clone(), gate);
        let file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(RaftStoreError::io(&path, "create received snapshot"))?;
        Ok(ReceivingSnapshot {
            file,
            handle,
            bytes: 0,
            head: Vec::new(),
            body_len: 0,
            body_crc: 0,
        })
    }

    /// Appends the next chunk.
    pub fn write(&mut self, chunk: &[u8]) -> Result<(), RaftStoreError> {
        use std::io::Write;
        self.file.write_all(chunk).map_err(RaftStoreError::io(
            &self.handle.path,
            "write received snapshot",
        ))?;
        self.bytes += chunk.len() as u64;
        let mut rest = chunk;
        while let Some(wanted) = head_bytes_wanted(&self.head) {
            if rest.is_empty() {
                return Ok(());
            }
            let take = (wanted - self.head.len()).min(rest.len());
            self.head.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
        }
        self.body_len += rest.len() as u64;
        self.body_crc = crc32c::crc32c_append(self.body_crc, rest);
        Ok(())
    }

    /// Bytes written so far.
    pub fn len(&self) -> u64 {
        self.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// Checks what arrived is a whole, intact snapshot file (its head, and its body's length
    /// and checksum against the header, computed as the chunks were written), makes the file
    /// durable (its data and its directory entry) and returns the handle to install. A stream
    /// cut short or damaged is refused here, so openraft is never handed a file its install
    /// would fail on (a failed install stops the node).
    pub fn finish(self) -> Result<SnapshotFile, RaftStoreError> {
        let (header, _) = decode_head(&self.handle.path, &self.head)?;
        check_body(&self.handle.path, &header, self.body_len, self.body_crc)?;
        self.file.sync_all().map_err(RaftStoreError::io(
            &self.handle.path,
            "sync received snapshot",
        ))?;
        sync_directory(super::meta::parent_of(&self.handle.path))?;
        Ok(self.handle)
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
    let mut bytes = encode_snapshot_head(header);
    bytes.extend_from_slice(body);
    bytes
}

/// The bytes of a snapshot file before its body (magic, version, header, header checksum).
pub fn encode_snapshot_head(header: &SnapshotHeader) -> Vec<u8> {
    let header_json = serde_json::to_vec(header).expect("a snapshot header always serialises");
    let mut bytes = Vec::with_capacity(20 + header_json.len());
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
    bytes
}

/// Parses and checks a snapshot file's bytes; returns the header and the body.
pub fn decode_snapshot<'a>(
    path: &Path,
    bytes: &'a [u8],
) -> Result<(SnapshotHeader, &'a [u8]), RaftStoreError> {
    let (header, head_len) = decode_head(path, bytes)?;
    let body = &bytes[head_len..];
    check_body(path, &header, body.len() as u64, crc32c::crc32c(body))?;
    Ok((header, body))
}

/// How many leading bytes of a snapshot file hold its head, as far as `head` (its first
/// bytes) tells: 16 (magic, version, header length) until those are there, then the whole
/// head. `None` once `head` holds that much, or when its header length is one no snapshot has
/// (`decode_head` refuses it then; nothing more is buffered).
fn head_bytes_wanted(head: &[u8]) -> Option<usize> {
    if head.len() < 16 {
        return Some(16);
    }
    let header_len = read_u32(&head[12..16]) as usize;
    let wanted = 20usize.saturating_add(header_len);
    (header_len <= SNAPSHOT_HEADER_BYTES_MAX && head.len() < wanted).then_some(wanted)
}

/// The largest header (JSON) a snapshot file may have.
const SNAPSHOT_HEADER_BYTES_MAX: usize = 1 << 20;

/// Parses and checks the head of a snapshot file (magic, version, header, header checksum);
/// returns the header and the head's length (where the body begins).
fn decode_head(path: &Path, bytes: &[u8]) -> Result<(SnapshotHeader, usize), RaftStoreError> {
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
    if header_len > SNAPSHOT_HEADER_BYTES_MAX {
        return Err(bad(format!(
            "header length {header_len} is over the {SNAPSHOT_HEADER_BYTES_MAX}-byte limit"
        )));
    }
    let header_end = 16 + header_len;
    if bytes.len() < header_end + 4 {
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
    Ok((header, header_end + 4))
}

/// Checks a body's length and checksum against its header.
fn check_body(
    path: &Path,
    header: &SnapshotHeader,
    body_len: u64,
    body_crc: u32,
) -> Result<(), RaftStoreError> {
    let bad = |detail: String| RaftStoreError::BadSnapshot {
        path: path.to_path_buf(),
        detail,
    };
    if body_len != header.body_len {
        return Err(bad(format!(
            "body is {body_len} bytes, header says {}",
            header.body_len
        )));
    }
    if body_crc != header.body_crc32c {
        return Err(bad(format!(
            "body checksum mismatch (stored {:#010x}, computed {body_crc:#010x})",
            header.body_crc32c
        )));
    }
    Ok(())
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
        parts: &[&[u8]],
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
        let path = self.store(meta.clone(), parts)?;
        Ok((meta, path))
    }

    /// Stores a complete snapshot file (the concatenation of `parts`) durably, makes it
    /// current, and keeps the last two.
    pub fn store(
        &mut self,
        meta: SnapshotMeta,
        parts: &[&[u8]],
    ) -> Result<PathBuf, RaftStoreError> {
        let path = self.next_path();
        write_parts_atomically(&path, parts)?;
        self.current = Some((meta, path.clone()));
        self.prune()?;
        Ok(path)
    }

    /// Stores a received snapshot file, already durable and in this directory (an
    /// [`SnapshotDir::incoming_path`] file), by renaming it into place: it is not written a
    /// second time. Makes it current and keeps the last two.
    pub fn store_received(
        &mut self,
        meta: SnapshotMeta,
        received: &Path,
    ) -> Result<PathBuf, RaftStoreError> {
        let path = self.next_path();
        fs::rename(received, &path).map_err(RaftStoreError::io(&path, "rename into place"))?;
        sync_directory(&self.dir)?;
        self.current = Some((meta, path.clone()));
        self.prune()?;
        Ok(path)
    }

    fn next_path(&mut self) -> PathBuf {
        let path = self.dir.join(format!("snap-{:020}.snap", self.next_seq));
        self.next_seq += 1;
        path
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

    /// A snapshot sent a chunk at a time and received a chunk at a time arrives whole: the
    /// chunks of any size concatenate to the file, the received file equals it, and it is
    /// renamed into the snapshot directory as the current snapshot, leaving no `incoming-`
    /// file. A transfer cut short (the handle dropped before `finish`) leaves nothing and
    /// leaves the install gate.
    #[test]
    fn a_snapshot_streams_in_chunks_and_is_renamed_into_place() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut snapshots, _) = SnapshotDir::open(dir.path().join("s")).expect("opens");
        let body: Vec<u8> = (0..10_000u32).map(|n| (n * 7 % 251) as u8).collect();
        let header = SnapshotHeader {
            last_log_id: meta(5).last_log_id,
            last_membership: StoredMembership::default(),
            snapshot_id: "1-5".into(),
            body_len: body.len() as u64,
            body_crc32c: crc32c::crc32c(&body),
            digest: String::new(),
        };
        let head = encode_snapshot_head(&header);
        let bytes = encode_snapshot(&header, &body);
        let sent = snapshots.store(meta(5), &[&head, &body]).expect("stores");
        let sent = SnapshotFile::at(sent);
        for chunk_bytes in [1, 7, 4096, 10_000, 1 << 20] {
            let chunks: Vec<Vec<u8>> = sent
                .chunks(chunk_bytes)
                .expect("opens")
                .collect::<Result<_, _>>()
                .expect("reads");
            assert!(chunks.iter().all(|chunk| chunk.len() <= chunk_bytes));
            assert_eq!(chunks.len(), bytes.len().div_ceil(chunk_bytes));
            assert_eq!(chunks.concat(), bytes, "chunks of {chunk_bytes}");
        }

        let gate = InstallGate::new();
        let incoming = snapshots.incoming_path();
        let mut receiving = ReceivingSnapshot::create(&incoming, &gate).expect("creates");
        assert_eq!(gate.pending(), 1);
        for chunk in sent.chunks(999).expect("opens") {
            receiving.write(&chunk.expect("reads")).expect("writes");
        }
        assert_eq!(receiving.len(), bytes.len() as u64);
        let received = receiving.finish().expect("durable");
        assert_eq!(fs::read(&received.path).expect("reads"), bytes);
        let stored = snapshots
            .store_received(meta(9), &received.path)
            .expect("renamed");
        assert_eq!(fs::read(&stored).expect("reads"), bytes);
        assert_eq!(snapshots.current, Some((meta(9), stored)));
        drop(received);
        assert_eq!(gate.pending(), 0, "the install settled");
        let names: Vec<String> = fs::read_dir(dir.path().join("s"))
            .expect("lists")
            .map(|entry| {
                entry
                    .expect("entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        assert!(
            names.iter().all(|name| name.starts_with("snap-")),
            "{names:?}"
        );

        let cut = snapshots.incoming_path();
        let mut receiving = ReceivingSnapshot::create(&cut, &gate).expect("creates");
        receiving.write(&bytes[..10]).expect("writes");
        assert!(cut.exists());
        drop(receiving);
        assert!(!cut.exists(), "a transfer cut short leaves no file");
        assert_eq!(gate.pending(), 0);

        // A stream that ends early, or a flipped bit anywhere, is refused when it ends: never
        // handed to an install (which would stop the node), and no file is left.
        let mut flipped = bytes.clone();
        flipped[bytes.len() - 3] ^= 1;
        let mut flipped_head = bytes.clone();
        flipped_head[20] ^= 1;
        for (what, arrived, needle) in [
            ("cut in the body", &bytes[..bytes.len() - 1], "body is"),
            ("cut in the head", &bytes[..12], "too short"),
            ("only the head", &bytes[..head.len()], "body is 0 bytes"),
            ("nothing", &bytes[..0], "too short"),
            ("a flipped body bit", &flipped[..], "body checksum"),
            ("a flipped header bit", &flipped_head[..], "header checksum"),
        ] {
            let path = snapshots.incoming_path();
            let mut receiving = ReceivingSnapshot::create(&path, &gate).expect("creates");
            for chunk in arrived.chunks(333) {
                receiving.write(chunk).expect("writes");
            }
            let error = receiving.finish().expect_err(what).to_string();
            assert!(error.contains(needle), "{what}: {error}");
            assert!(!path.exists(), "{what}: no file left");
            assert_eq!(gate.pending(), 0, "{what}");
        }
    }

    /// openraft builds a snapshot in a task of its own, so an install of a newer snapshot can
    /// land while a build copies older state, and the log before the installed one may then
    /// be purged. The stale build is neither written nor made current.
    #[test]
    fn a_build_older_than_the_current_snapshot_steps_aside() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut snapshots, _) = SnapshotDir::open(dir.path().join("s")).expect("opens");
        snapshots.store(meta(10), &[b"installed"]).expect("stores");
        let (current, path) = snapshots
            .store_built(meta(3), &[b"stale"])
            .expect("answers");
        assert_eq!(current, meta(10));
        assert_eq!(fs::read(&path).expect("reads"), b"installed");
        assert_eq!(
            fs::read_dir(dir.path().join("s")).expect("lists").count(),
            1
        );
        let (current, path) = snapshots
            .store_built(meta(12), &[b"newer"])
            .expect("stores");
        assert_eq!(current, meta(12));
        assert_eq!(fs::read(&path).expect("reads"), b"newer");
    }
}
