//! The log writer: one thread that owns the segment files and the meta file.
//!
//! Every write-IO of the log store goes through its command queue, in order (openraft requires
//! vote and log writes to be serialised). Consecutive appends that are queued together form one
//! group: their records are written, then the active segment gets **one `fdatasync`**, then
//! every group member's `LogFlushed` is called. A segment that fills up is synced before the
//! next one is created, so a rollover adds a sync; `WriterStats` counts the two apart.
//!
//! The queue is unbounded, but its depth is bounded by the protocol: openraft 0.9 awaits each
//! append's flush before it submits the next, and awaits every truncate, purge and vote.
//!
//! With `preallocate` (the default) a new segment is allocated to `segment_bytes` when it is
//! created (`fallocate`; the space reads as zeros): appends then need no block allocation and
//! no size change, which is journal work every group's `fdatasync` would otherwise commit.
//! A closed segment is trimmed to its records, so only the active segment has a zero tail;
//! truncation inside it writes zeros over the cut records instead of shrinking the file.
//!
//! With `archive` a purge moves whole segments to `<dir>/archive/` instead of deleting them
//! (a rename: no copy), when what it removes is this node's committed log (the purge point is
//! in the log, so openraft has already cut any conflicting suffix). A purge past the end of
//! the log (a received snapshot) deletes: those entries may never have been committed.

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use openraft::EntryPayload;
use tokio::sync::{oneshot, watch};

use crate::file::{chain_hash, ChainHash, FRAME_HEADER_LEN, GENESIS_HASH};

use super::error::RaftStoreError;
use super::index::{LogIndex, Place, SegmentFile, Slot};
use super::meta::{read_meta, sync_directory, write_meta, Meta};
use super::record::encode_payload;
use super::segment::{
    append_frame, parse_segment_file_name, read_segment_header, scan_segment, segment_file_name,
    SegmentHeader, FLAG_DETACHED, SEGMENT_HEADER_LEN,
};
use super::types::{Entry, LogFlushed, LogId, Vote};

/// How often, at most, a changed committed log id is written to the meta file. Committed is
/// advisory (a stale value only means less is re-applied at restart), so it rides along.
const COMMITTED_PERSIST_INTERVAL: Duration = Duration::from_millis(100);
/// Commands drained into one group at most.
const GROUP_COMMANDS_MAX: usize = 4096;
/// Payload bytes of written entries kept in memory for the reads that follow a write
/// (replication to followers, apply); the oldest are dropped first.
const WRITTEN_CACHE_BYTES: u64 = 32 << 20;

/// Who to tell when an append is durable.
pub(crate) enum Completion {
    Raft(LogFlushed),
    Callback(Box<dyn FnOnce(std::io::Result<()>) + Send>),
}

impl Completion {
    fn complete(self, result: std::io::Result<()>) {
        match self {
            Completion::Raft(flushed) => flushed.log_io_completed(result),
            Completion::Callback(callback) => callback(result),
        }
    }
}

pub(crate) enum Command {
    Append {
        entries: Vec<Arc<Entry>>,
        callback: Completion,
    },
    Truncate {
        index: u64,
        done: oneshot::Sender<Result<(), RaftStoreError>>,
    },
    Purge {
        upto: LogId,
        done: oneshot::Sender<Result<(), RaftStoreError>>,
    },
    SaveVote {
        vote: Vote,
        done: oneshot::Sender<Result<(), RaftStoreError>>,
    },
}

/// Counters kept by the writer, for tests and benchmarks.
#[derive(Debug, Default)]
pub(crate) struct WriterStats {
    pub groups: AtomicU64,
    pub group_syncs: AtomicU64,
    pub rollover_syncs: AtomicU64,
    pub meta_writes: AtomicU64,
    pub records: AtomicU64,
    pub bytes: AtomicU64,
    pub segments_created: AtomicU64,
    pub segments_preallocated: AtomicU64,
    pub segments_deleted: AtomicU64,
    pub segments_archived: AtomicU64,
    /// Bytes in `archive/` (what recovery found there, plus what this run moved there).
    pub archive_bytes: AtomicU64,
    /// Segment files in `archive/`, counted the same way.
    pub archive_segments: AtomicU64,
    /// Archived segments deleted to keep the archive within its size limit (at open and
    /// since).
    pub archive_segments_deleted: AtomicU64,
}

/// A copy of the writer's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogStats {
    /// Groups of appends made durable (each with records costs exactly one `group_syncs`).
    pub groups: u64,
    /// `fdatasync` calls that completed a group.
    pub group_syncs: u64,
    /// `fdatasync` calls on a full segment before moving to the next.
    pub rollover_syncs: u64,
    /// Meta file replacements (vote, purge, committed).
    pub meta_writes: u64,
    pub records: u64,
    pub bytes: u64,
    pub segments_created: u64,
    /// Of `segments_created`, those allocated to full size when created.
    pub segments_preallocated: u64,
    pub segments_deleted: u64,
    /// Segments a purge moved to `archive/`.
    pub segments_archived: u64,
    /// Bytes and segment files in `archive/` (found at open, plus moved since).
    pub archive_bytes: u64,
    pub archive_segments: u64,
    /// Archived segments deleted to keep the archive within its size limit.
    pub archive_segments_deleted: u64,
}

impl WriterStats {
    pub fn snapshot(&self) -> LogStats {
        let load = |counter: &AtomicU64| counter.load(Ordering::Acquire);
        LogStats {
            groups: load(&self.groups),
            group_syncs: load(&self.group_syncs),
            rollover_syncs: load(&self.rollover_syncs),
            meta_writes: load(&self.meta_writes),
            records: load(&self.records),
            bytes: load(&self.bytes),
            segments_created: load(&self.segments_created),
            segments_preallocated: load(&self.segments_preallocated),
            segments_deleted: load(&self.segments_deleted),
            segments_archived: load(&self.segments_archived),
            archive_bytes: load(&self.archive_bytes),
            archive_segments: load(&self.archive_segments),
            archive_segments_deleted: load(&self.archive_segments_deleted),
        }
    }
}

/// State shared by the log store, its readers and the writer.
#[derive(Debug)]
pub(crate) struct Shared {
    pub index: RwLock<LogIndex>,
    pub vote: Mutex<Option<Vote>>,
    pub committed: Mutex<Option<LogId>>,
    pub stats: WriterStats,
    /// Held by a test to stop the writer between receiving a command and draining the queue.
    pub pause: Mutex<()>,
    /// Set when the writer has failed; every later write is refused with this message.
    pub failed: Mutex<Option<String>>,
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One segment as the writer knows it.
struct WriterSegment {
    first_index: u64,
    /// The index the next record in this segment would carry.
    next_index: u64,
    len: u64,
    /// Length of the file: more than `len` when the file is preallocated (zeros after `len`).
    capacity: u64,
    read: Arc<SegmentFile>,
    write: Option<File>,
    dirty: bool,
    /// Its header says the chain before it is unknown: the log restarted here (behind a
    /// received snapshot), so the segments before it are not this log's past.
    detached: bool,
}

impl WriterSegment {
    fn preallocated(&self) -> bool {
        self.capacity > self.len
    }

    /// The segment's write handle, taken (opened if it has none; `why` names the operation).
    fn take_write(&mut self, why: &'static str) -> Result<File, RaftStoreError> {
        match self.write.take() {
            Some(file) => Ok(file),
            None => OpenOptions::new()
                .write(true)
                .open(&self.read.path)
                .map_err(RaftStoreError::io(&self.read.path, why)),
        }
    }
}

/// A record written in the current group: its index, the entry, the segment it is in, its
/// offset there and its payload length (slots are filled from it once the group is synced).
type Written = (u64, Arc<Entry>, Arc<SegmentFile>, u64, u32);

/// A written record waiting for its chain hash: its index and term, and where its payload
/// sits in the group's frame buffer.
struct Unhashed {
    index: u64,
    term: u64,
    payload: std::ops::Range<usize>,
}

/// Where one record not yet purged sits, and its chain value.
#[derive(Clone, Copy)]
struct RecordPosition {
    offset: u64,
    hash: ChainHash,
}

pub(crate) struct Writer {
    root: PathBuf,
    log_dir: PathBuf,
    segment_bytes: u64,
    /// Whether new segments are allocated to `segment_bytes` when created (turned off if the
    /// file system cannot).
    preallocate: bool,
    /// Move purged segments to `archive/` instead of deleting them.
    archive: bool,
    /// Keep `archive/` within this many bytes (0: no limit), deleting its oldest segments.
    pub(crate) archive_bytes_max: u64,
    shared: Arc<Shared>,
    segments: Vec<WriterSegment>,
    /// Positions of records `records_first ..`.
    records: VecDeque<RecordPosition>,
    records_first: u64,
    /// Chain value before `records_first` (None: unknown, the log resumed after a snapshot).
    base_hash: Option<ChainHash>,
    meta: Meta,
    last_meta_write: Instant,
    /// This group's record frames, kept until their chain hashes are computed (cleared at the
    /// end of each group; `settle_hashes` itself never drops them, so a settle in the middle of
    /// `write_entry` keeps the frame being written).
    frames: Vec<u8>,
    /// Records written in this group whose chain hash is not computed yet, in log order. The
    /// chain is not stored in the records, so it is computed after the group's `fdatasync`
    /// has been acknowledged, off the commit path (SHA-256 of a multi-megabyte token entry
    /// takes milliseconds); anything that reads a chain value settles these first.
    unhashed: Vec<Unhashed>,
    callbacks: Vec<Completion>,
    written: Vec<Written>,
    /// Entries whose slots keep a cached copy, oldest first, with their payload lengths.
    cached: VecDeque<(u64, u32)>,
    cached_bytes: u64,
    failed: Option<String>,
}

/// What recovery hands to the log store.
pub(crate) struct Recovered {
    pub writer: Writer,
    pub index: LogIndex,
    pub meta: Meta,
}

impl Writer {
    /// Opens the log under `root`: reads the meta file, scans every segment, truncates a torn
    /// tail of the last segment, refuses any other damage, and rebuilds the index.
    pub fn recover(
        root: &Path,
        segment_bytes: u64,
        preallocate: bool,
        archive: bool,
    ) -> Result<Recovered, RaftStoreError> {
        let log_dir = root.join("log");
        fs::create_dir_all(&log_dir).map_err(RaftStoreError::io(&log_dir, "create log dir"))?;
        let mut meta = read_meta(root)?;
        let purged = meta.last_purged.map(|log_id| log_id.index);

        let mut files = Vec::new();
        for dir_entry in
            fs::read_dir(&log_dir).map_err(RaftStoreError::io(&log_dir, "list log dir"))?
        {
            let dir_entry = dir_entry.map_err(RaftStoreError::io(&log_dir, "list log dir"))?;
            let name = dir_entry.file_name();
            let name = name.to_string_lossy();
            let path = dir_entry.path();
            if name.ends_with(".tmp") {
                // A segment whose creation did not finish: it never held a record.
                fs::remove_file(&path).map_err(RaftStoreError::io(&path, "remove temp file"))?;
            } else if let Some(first_index) = parse_segment_file_name(&name) {
                files.push((first_index, path));
            }
        }
        files.sort();

        // Segments wholly at or below the purge point are leftovers of an interrupted purge.
        let mut leftovers = Vec::new();
        while files.len() > 1 {
            let next_first = files[1].0;
            match purged {
                Some(purged) if next_first <= purged + 1 => leftovers.push(files.remove(0).1),
                _ => break,
            }
        }
        if !leftovers.is_empty() {
            // A leftover is this node's committed log (archived) when the purge was inside the
            // log (its chain value is known) and the segment after it continues its chain; a
            // segment after a restart of the log behind a received snapshot (detached) does
            // not, and what came before it is deleted, as the purge would have.
            for (position, path) in leftovers.iter().enumerate() {
                let next = leftovers
                    .get(position + 1)
                    .or(files.first().map(|(_, path)| path));
                let continued = match next {
                    Some(next) => !read_segment_header(next)?.detached(),
                    None => false,
                };
                if archive && continued && meta.last_purged_hash.is_some() {
                    archive_segment(root, path)?;
                } else {
                    fs::remove_file(path)
                        .map_err(RaftStoreError::io(path, "remove purged segment"))?;
                }
            }
            sync_directory(&log_dir)?;
        }

        let mut index = LogIndex {
            last_purged: meta.last_purged,
            first: purged.map_or(0, |purged| purged + 1),
            slots: VecDeque::new(),
        };
        let mut records = VecDeque::new();
        let mut records_first = index.first;
        let mut base_hash = if purged.is_some() {
            meta.last_purged_hash
        } else {
            Some(GENESIS_HASH)
        };
        let mut segments = Vec::new();
        let mut previous: Option<(PathBuf, u64, ChainHash)> = None;
        let file_count = files.len();
        for (position, (first_index, path)) in files.into_iter().enumerate() {
            let is_last = position + 1 == file_count;
            let read = SegmentFile::open(path.clone())?;
            let mut scanned = Vec::new();
            let scan = scan_segment(&path, |record, _payload| {
                scanned.push(*record);
                Ok(())
            })?;
            if scan.header.first_index != first_index {
                return Err(RaftStoreError::BadSegment {
                    segment: path,
                    detail: format!(
                        "header says first index {}, file name says {first_index}",
                        scan.header.first_index
                    ),
                });
            }
            if let Some((previous_path, previous_next, previous_head)) = &previous {
                if first_index != *previous_next {
                    return Err(RaftStoreError::BadLog {
                        dir: log_dir,
                        detail: format!(
                            "segment {} starts at index {first_index} but {} ends before \
                             index {previous_next}: the log has a hole or an overlap",
                            path.display(),
                            previous_path.display()
                        ),
                    });
                }
                if !scan.header.detached() && scan.header.base_hash != *previous_head {
                    return Err(RaftStoreError::BadLog {
                        dir: log_dir,
                        detail: format!(
                            "segment {} does not continue the hash chain of {}: \
                             base {} but the previous head is {}",
                            path.display(),
                            previous_path.display(),
                            crate::file::hex(&scan.header.base_hash),
                            crate::file::hex(previous_head)
                        ),
                    });
                }
            }
            let mut len = scan.end_offset;
            let mut capacity = scan.file_len;
            // The writer starts a new segment before a record that would end past
            // `segment_bytes`, unless the record is the segment's first: a later record that
            // claims to run past the end of a file at least that long has a damaged length
            // field, not a cut write, and cutting the log there would drop what follows it.
            if scan.torn
                && scan.torn_past_end
                && scan.next_index > scan.header.first_index
                && scan.file_len >= segment_bytes
            {
                return Err(RaftStoreError::CorruptRecord {
                    segment: path,
                    offset: scan.end_offset,
                    index: scan.next_index,
                    detail: format!(
                        "the record's length runs past the end of the {}-byte segment, which \
                         no append writes: its length field is damaged",
                        scan.file_len
                    ),
                });
            }
            if scan.torn {
                if !is_last {
                    return Err(RaftStoreError::CorruptRecord {
                        segment: path,
                        offset: scan.end_offset,
                        index: scan.next_index,
                        detail: "incomplete record at the end of a segment that is not the \
                                 last one"
                            .to_string(),
                    });
                }
                tracing::warn!(
                    segment = %path.display(),
                    offset = scan.end_offset,
                    index = scan.next_index,
                    "truncating torn tail of the log"
                );
                let file = OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .map_err(RaftStoreError::io(&path, "open to truncate torn tail"))?;
                file.set_len(scan.end_offset)
                    .map_err(RaftStoreError::io(&path, "truncate torn tail"))?;
                file.sync_all()
                    .map_err(RaftStoreError::io(&path, "sync truncation"))?;
                len = scan.end_offset;
                capacity = len;
            }
            // Index the records above the purge point.
            let mut chain_before = if scan.header.detached() {
                None
            } else {
                Some(scan.header.base_hash)
            };
            for record in &scanned {
                if purged.is_some_and(|purged| record.index <= purged) {
                    chain_before = Some(record.hash);
                    continue;
                }
                if index.slots.is_empty() {
                    if let Some(purged) = purged {
                        if record.index != purged + 1 {
                            return Err(RaftStoreError::BadLog {
                                dir: log_dir,
                                detail: format!(
                                    "entries after the purge point {purged} start at {} \
                                     (segment {}): the log has a hole",
                                    record.index,
                                    path.display()
                                ),
                            });
                        }
                    }
                    records_first = record.index;
                    base_hash = chain_before.or(base_hash.filter(|_| purged.is_some()));
                    index.first = record.index;
                }
                index.slots.push_back(Slot {
                    log_id: super::types::log_id(record.term, record.leader_node_id, record.index),
                    place: Place::Disk {
                        segment: read.clone(),
                        offset: record.offset,
                        payload_len: record.payload_len,
                        cached: None,
                    },
                    payload_len: record.payload_len,
                });
                records.push_back(RecordPosition {
                    offset: record.offset,
                    hash: record.hash,
                });
                chain_before = Some(record.hash);
            }
            if index.slots.is_empty() && purged.is_some() {
                // Every record so far is purged; remember the chain value after them.
                if let Some(last) = scanned.last() {
                    if purged == Some(last.index) {
                        base_hash = Some(last.hash);
                    }
                }
            }
            previous = Some((path.clone(), scan.next_index, scan.head_hash));
            segments.push(WriterSegment {
                first_index,
                next_index: scan.next_index,
                len,
                capacity,
                read,
                write: None,
                dirty: false,
                detached: scan.header.detached(),
            });
        }
        if let (Some(purged), None) = (purged, meta.last_purged_hash) {
            // A purge past the end of the log (after a received snapshot) that a crash cut
            // short: the segment it left holds only entries it purged, none of them known to
            // be committed here. Finish the purge: delete it.
            let mut dropped = false;
            for segment in segments
                .iter()
                .filter(|segment| segment.next_index <= purged + 1)
            {
                fs::remove_file(&segment.read.path).map_err(RaftStoreError::io(
                    &segment.read.path,
                    "remove purged segment",
                ))?;
                dropped = true;
            }
            if dropped {
                segments.retain(|segment| segment.next_index > purged + 1);
                sync_directory(&log_dir)?;
            }
        }
        if purged.is_none() && index.slots.is_empty() {
            // A log that never held a record (or only torn ones).
            if let Some(segment) = segments.first() {
                records_first = segment.first_index;
                index.first = segment.first_index;
            }
        }

        // Committed is written lazily and never ahead of what was flushed, but a torn tail can
        // still leave it past the end; clamp it to the log.
        if let (Some(committed), Some(last)) = (meta.committed, index.last_log_id()) {
            if committed.index > last.index {
                meta.committed = Some(last);
            }
        } else if index.last_log_id().is_none() {
            meta.committed = None;
        }

        let shared_placeholder = Arc::new(Shared {
            index: RwLock::new(LogIndex::default()),
            vote: Mutex::new(None),
            committed: Mutex::new(None),
            stats: WriterStats::default(),
            pause: Mutex::new(()),
            failed: Mutex::new(None),
        });
        let writer = Writer {
            root: root.to_path_buf(),
            log_dir,
            segment_bytes,
            preallocate,
            archive,
            archive_bytes_max: 0,
            shared: shared_placeholder,
            segments,
            records,
            records_first,
            base_hash,
            meta: meta.clone(),
            last_meta_write: Instant::now(),
            frames: Vec::new(),
            unhashed: Vec::new(),
            callbacks: Vec::new(),
            written: Vec::new(),
            cached: VecDeque::new(),
            cached_bytes: 0,
            failed: None,
        };
        Ok(Recovered {
            writer,
            index,
            meta,
        })
    }

    pub fn attach(&mut self, shared: Arc<Shared>) {
        self.shared = shared;
    }

    /// The writer thread's loop. Returns when every sender is gone.
    pub fn run(mut self, commands: Receiver<Command>, exited: watch::Sender<bool>) {
        loop {
            let first = match commands.recv_timeout(COMMITTED_PERSIST_INTERVAL) {
                Ok(command) => command,
                Err(RecvTimeoutError::Timeout) => {
                    self.persist_committed(true);
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => break,
            };
            let shared = self.shared.clone();
            let pause = lock(&shared.pause);
            let mut group = vec![first];
            while group.len() < GROUP_COMMANDS_MAX {
                match commands.try_recv() {
                    Ok(command) => group.push(command),
                    Err(_) => break,
                }
            }
            drop(pause);
            for command in group {
                self.handle(command);
            }
            self.flush_group();
            self.persist_committed(false);
        }
        self.flush_group();
        self.persist_committed(true);
        // Receivers learn of the exit from the value or from the sender being dropped.
        let _ = exited.send(true);
    }

    fn handle(&mut self, command: Command) {
        match command {
            Command::Append { entries, callback } => {
                if let Some(failed) = &self.failed {
                    callback.complete(Err(std::io::Error::other(failed.clone())));
                    return;
                }
                for entry in entries {
                    if let Err(error) = self.write_entry(entry) {
                        self.fail(&error);
                        callback.complete(Err(error.to_io_error()));
                        return;
                    }
                }
                self.callbacks.push(callback);
            }
            Command::Truncate { index, done } => {
                self.flush_group();
                let result = self.check_failed().and_then(|()| self.truncate(index));
                self.reply(done, result);
            }
            Command::Purge { upto, done } => {
                self.flush_group();
                let result = self.check_failed().and_then(|()| self.purge(upto));
                self.reply(done, result);
            }
            Command::SaveVote { vote, done } => {
                self.flush_group();
                let result = self.check_failed().and_then(|()| {
                    self.meta.vote = Some(vote);
                    self.write_meta()
                });
                self.reply(done, result);
            }
        }
    }

    fn reply(
        &mut self,
        done: oneshot::Sender<Result<(), RaftStoreError>>,
        result: Result<(), RaftStoreError>,
    ) {
        if let Err(error) = &result {
            self.fail(error);
        }
        // The caller may have given up waiting; nothing to do then.
        let _ = done.send(result);
    }

    fn check_failed(&self) -> Result<(), RaftStoreError> {
        match &self.failed {
            Some(detail) => Err(RaftStoreError::WriterGone {
                detail: detail.clone(),
            }),
            None => Ok(()),
        }
    }

    /// After a failed write or sync the state of the files is unknown (the kernel may have
    /// dropped dirty pages), so the writer refuses everything after it.
    fn fail(&mut self, error: &RaftStoreError) {
        if self.failed.is_none() {
            tracing::error!(error = %error, "log writer failed; refusing further writes");
            let detail = error.to_string();
            *lock(&self.shared.failed) = Some(detail.clone());
            self.failed = Some(detail);
        }
    }

    /// The chain value before `index`, if this writer knows it.
    fn chain_before(&mut self, index: u64) -> Option<ChainHash> {
        self.settle_hashes();
        let end = self.records_first + self.records.len() as u64;
        if index != end {
            return None;
        }
        match self.records.back() {
            Some(position) => Some(position.hash),
            None => self.base_hash,
        }
    }

    fn write_entry(&mut self, entry: Arc<Entry>) -> Result<(), RaftStoreError> {
        let index = entry.log_id.index;
        let term = entry.log_id.leader_id.term;
        if self.unhashed.is_empty() {
            // Nothing waits for these bytes (a settle ran mid-group).
            self.frames.clear();
        }
        let frame_start = self.frames.len();
        let payload_len = append_frame(&mut self.frames, index, term, |out| {
            encode_payload(&entry, out)
        })
        .map_err(|len| RaftStoreError::BadEntry {
            index,
            detail: format!(
                "payload of {len} bytes exceeds the record limit of {} bytes",
                crate::file::PAYLOAD_MAX_BYTES
            ),
        })?;
        let frame_len = (self.frames.len() - frame_start) as u64;
        let end = self.records_first + self.records.len() as u64;
        if index >= self.records_first && index < end {
            // An append over existing entries replaces them, as a conflict truncation would.
            if let Err(error) = self.truncate(index) {
                self.frames.truncate(frame_start);
                return Err(error);
            }
        }
        let needs_new_segment = match self.segments.last() {
            None => true,
            Some(active) => {
                active.next_index != index
                    || (active.next_index > active.first_index
                        && active.len + frame_len > self.segment_bytes)
            }
        };
        let previous_hash = self.chain_before(index);
        if self.records_first + self.records.len() as u64 != index {
            // The log restarts here (a fresh log, or after a snapshot install past its end).
            self.records.clear();
            self.records_first = index;
            self.base_hash = previous_hash;
        }
        if needs_new_segment {
            self.start_segment(index, previous_hash)?;
        }
        let active = self
            .segments
            .last_mut()
            .expect("a segment was just ensured");
        if active.write.is_none() {
            let path = active.read.path.clone();
            active.write = Some(
                OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .map_err(RaftStoreError::io(&path, "open segment for writing"))?,
            );
        }
        let offset = active.len;
        active
            .write
            .as_ref()
            .expect("opened above")
            .write_all_at(&self.frames[frame_start..], offset)
            .map_err(RaftStoreError::io(&active.read.path, "append record"))?;
        active.len += frame_len;
        active.capacity = active.capacity.max(active.len);
        active.next_index = index + 1;
        active.dirty = true;
        // The chain value is computed after the group is acknowledged (`settle_hashes`).
        self.records.push_back(RecordPosition {
            offset,
            hash: GENESIS_HASH,
        });
        self.unhashed.push(Unhashed {
            index,
            term,
            payload: frame_start + FRAME_HEADER_LEN as usize..self.frames.len(),
        });
        let segment = active.read.clone();
        self.written
            .push((index, entry, segment, offset, payload_len));
        self.shared.stats.records.fetch_add(1, Ordering::AcqRel);
        self.shared
            .stats
            .bytes
            .fetch_add(frame_len, Ordering::AcqRel);
        Ok(())
    }

    /// Creates the segment whose first record is `first_index`, syncing the one before it.
    fn start_segment(
        &mut self,
        first_index: u64,
        base_hash: Option<ChainHash>,
    ) -> Result<(), RaftStoreError> {
        if let Some(active) = self.segments.last_mut() {
            if active.preallocated() {
                // Trim the zero tail: only the active segment may have one.
                let path = active.read.path.clone();
                let file = active.take_write("open segment to trim")?;
                file.set_len(active.len)
                    .map_err(RaftStoreError::io(&path, "trim closed segment"))?;
                file.sync_all()
                    .map_err(RaftStoreError::io(&path, "sync closed segment"))?;
                active.capacity = active.len;
                active.dirty = false;
                self.shared
                    .stats
                    .rollover_syncs
                    .fetch_add(1, Ordering::AcqRel);
            } else if active.dirty {
                active
                    .write
                    .as_ref()
                    .expect("a dirty segment has a write handle")
                    .sync_data()
                    .map_err(RaftStoreError::io(&active.read.path, "sync full segment"))?;
                active.dirty = false;
                self.shared
                    .stats
                    .rollover_syncs
                    .fetch_add(1, Ordering::AcqRel);
            }
            active.write = None;
        }
        // A segment that starts at the same index is being replaced (a restarted log).
        self.segments
            .retain(|segment| segment.first_index != first_index);
        let header = SegmentHeader {
            flags: if base_hash.is_some() {
                0
            } else {
                FLAG_DETACHED
            },
            first_index,
            base_hash: base_hash.unwrap_or(GENESIS_HASH),
        };
        let path = self.log_dir.join(segment_file_name(first_index));
        let allocate = self
            .preallocate
            .then_some(self.segment_bytes)
            .filter(|bytes| *bytes > SEGMENT_HEADER_LEN);
        let capacity = match create_segment(&path, &header, allocate)? {
            Some(capacity) => {
                self.shared
                    .stats
                    .segments_preallocated
                    .fetch_add(1, Ordering::AcqRel);
                capacity
            }
            None => {
                if allocate.is_some() {
                    tracing::warn!(
                        dir = %self.log_dir.display(),
                        "the file system cannot preallocate; log segments grow as they are written"
                    );
                    self.preallocate = false;
                }
                SEGMENT_HEADER_LEN
            }
        };
        let write = OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(RaftStoreError::io(&path, "open new segment"))?;
        let read = SegmentFile::open(path)?;
        self.segments.push(WriterSegment {
            first_index,
            next_index: first_index,
            len: SEGMENT_HEADER_LEN,
            capacity,
            read,
            write: Some(write),
            dirty: false,
            detached: base_hash.is_none(),
        });
        self.shared
            .stats
            .segments_created
            .fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// Makes the group durable with one `fdatasync`, then publishes and acknowledges it.
    fn flush_group(&mut self) {
        if self.written.is_empty() && self.callbacks.is_empty() {
            return;
        }
        let mut result = Ok(());
        if let Some(active) = self.segments.last_mut() {
            if active.dirty {
                result = active
                    .write
                    .as_ref()
                    .expect("a dirty segment has a write handle")
                    .sync_data()
                    .map_err(RaftStoreError::io(&active.read.path, "sync log"));
                active.dirty = false;
                self.shared.stats.group_syncs.fetch_add(1, Ordering::AcqRel);
            }
        }
        if !self.written.is_empty() {
            self.shared.stats.groups.fetch_add(1, Ordering::AcqRel);
        }
        if let Err(error) = &result {
            self.fail(error);
        }
        // Written entries are readable from their files now; keep the newest in memory too
        // (within `WRITTEN_CACHE_BYTES`) for the reads that follow.
        {
            let mut index = self
                .shared
                .index
                .write()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            for (entry_index, entry, segment, offset, payload_len) in self.written.drain(..) {
                if let Some(slot) = index
                    .get(entry_index)
                    .filter(|slot| matches!(&slot.place, Place::Pending(pending) if Arc::ptr_eq(pending, &entry)))
                    .cloned()
                {
                    let position = usize::try_from(entry_index - index.first)
                        .expect("the slot was just found");
                    index.slots[position] = Slot {
                        place: Place::Disk {
                            segment,
                            offset,
                            payload_len,
                            cached: Some(entry),
                        },
                        ..slot
                    };
                    self.cached.push_back((entry_index, payload_len));
                    self.cached_bytes += u64::from(payload_len);
                }
            }
            while self.cached_bytes > WRITTEN_CACHE_BYTES {
                let Some((entry_index, payload_len)) = self.cached.pop_front() else {
                    break;
                };
                self.cached_bytes -= u64::from(payload_len);
                // The slot may be gone (purged) or replaced (truncated, then appended again);
                // dropping a newer entry's copy only costs that entry a read from its file.
                if entry_index >= index.first {
                    let position = usize::try_from(entry_index - index.first).unwrap_or(usize::MAX);
                    if let Some(Slot {
                        place: Place::Disk { cached, .. },
                        ..
                    }) = index.slots.get_mut(position)
                    {
                        *cached = None;
                    }
                }
            }
        }
        for callback in self.callbacks.drain(..) {
            match &result {
                Ok(()) => callback.complete(Ok(())),
                Err(error) => callback.complete(Err(error.to_io_error())),
            }
        }
        self.settle_hashes();
        self.frames.clear();
    }

    /// Computes the chain hashes of the records written since the last settle, in order.
    fn settle_hashes(&mut self) {
        for pending in self.unhashed.drain(..) {
            let Some(position) = pending
                .index
                .checked_sub(self.records_first)
                .and_then(|position| usize::try_from(position).ok())
                .filter(|position| *position < self.records.len())
            else {
                // Truncated or purged before its hash was needed (both settle first, so this
                // does not happen; skipping keeps a later record's hash from shifting).
                continue;
            };
            let previous = match position {
                0 => self.base_hash.unwrap_or(GENESIS_HASH),
                _ => self.records[position - 1].hash,
            };
            self.records[position].hash = chain_hash(
                &previous,
                pending.index,
                pending.term,
                &self.frames[pending.payload],
            );
        }
    }

    fn truncate(&mut self, index: u64) -> Result<(), RaftStoreError> {
        self.settle_hashes();
        let end = self.records_first + self.records.len() as u64;
        if index >= end {
            return Ok(());
        }
        let mut cut_offset = None;
        if index >= self.records_first {
            let keep = usize::try_from(index - self.records_first).expect("within the log");
            cut_offset = Some(self.records[keep].offset);
            self.records.truncate(keep);
        } else {
            self.records.clear();
            self.records_first = index;
        }
        let mut deleted = false;
        while let Some(last) = self.segments.last() {
            if last.first_index < index {
                break;
            }
            let path = last.read.path.clone();
            fs::remove_file(&path)
                .map_err(RaftStoreError::io(&path, "delete truncated segment"))?;
            self.segments.pop();
            deleted = true;
            self.shared
                .stats
                .segments_deleted
                .fetch_add(1, Ordering::AcqRel);
        }
        if deleted {
            sync_directory(&self.log_dir)?;
        }
        if let (Some(last), Some(offset)) = (self.segments.last_mut(), cut_offset) {
            if last.next_index > index {
                let path = last.read.path.clone();
                let file = last.take_write("open segment to truncate")?;
                if last.preallocated() {
                    // Preallocated: zeros over the cut records keep the blocks (a record left
                    // behind the new end would otherwise read as part of the log).
                    write_zeros(&file, offset, last.len)
                        .map_err(RaftStoreError::io(&path, "zero truncated records"))?;
                    file.sync_data()
                        .map_err(RaftStoreError::io(&path, "sync truncated segment"))?;
                } else {
                    file.set_len(offset)
                        .map_err(RaftStoreError::io(&path, "truncate segment"))?;
                    file.sync_data()
                        .map_err(RaftStoreError::io(&path, "sync truncated segment"))?;
                    last.capacity = offset;
                }
                last.write = Some(file);
                last.len = offset;
                last.next_index = index;
                last.dirty = false;
            }
        }
        Ok(())
    }

    fn purge(&mut self, upto: LogId) -> Result<(), RaftStoreError> {
        self.settle_hashes();
        if self
            .meta
            .last_purged
            .is_some_and(|purged| purged.index >= upto.index)
        {
            return Ok(());
        }
        let end = self.records_first + self.records.len() as u64;
        let purged_hash = if upto.index >= self.records_first && upto.index < end {
            let position = usize::try_from(upto.index - self.records_first).expect("within");
            Some(self.records[position].hash)
        } else if upto.index + 1 == self.records_first {
            self.base_hash
        } else {
            None
        };
        // The meta file first: after a crash, recovery finishes deleting what it says is purged.
        self.meta.last_purged = Some(upto);
        self.meta.last_purged_hash = purged_hash;
        self.write_meta()?;
        if upto.index >= end {
            self.records.clear();
            self.records_first = upto.index + 1;
        } else {
            while self.records_first <= upto.index {
                self.records.pop_front();
                self.records_first += 1;
            }
        }
        self.base_hash = purged_hash;
        let mut removed = false;
        let mut archived = false;
        if upto.index >= end {
            // Past the end of the log (a received snapshot): none of what the segments hold is
            // known to be committed here. Every one goes; the next append starts a detached
            // segment.
            for segment in std::mem::take(&mut self.segments) {
                self.delete_purged(&segment)?;
                removed = true;
            }
        }
        while self.segments.len() > 1 && self.segments[0].next_index <= upto.index + 1 {
            let segment = self.segments.remove(0);
            // Within the log, the purged entries are this node's committed log (openraft cut
            // any conflicting suffix before), archived when the segment after continues their
            // chain; one before a restart of the log (a detached segment) is not its past.
            let continued = self
                .segments
                .first()
                .is_some_and(|next| !next.detached && next.first_index == segment.next_index);
            if self.archive && continued {
                archive_segment(&self.root, &segment.read.path)?;
                let stats = &self.shared.stats;
                stats.segments_archived.fetch_add(1, Ordering::AcqRel);
                stats.archive_segments.fetch_add(1, Ordering::AcqRel);
                stats.archive_bytes.fetch_add(segment.len, Ordering::AcqRel);
                archived = true;
            } else {
                self.delete_purged(&segment)?;
            }
            removed = true;
        }
        if removed {
            sync_directory(&self.log_dir)?;
        }
        if archived {
            // Best effort: the purge is done and durable; an archive that cannot be trimmed
            // now (a permission, a disk error) is retried at the next purge, never a reason
            // to stop the log.
            if let Err(error) = self.trim_archive() {
                tracing::warn!(%error, "the archive could not be trimmed to its size limit");
            }
        }
        Ok(())
    }

    /// Keeps the archive within `archive_bytes_max` (see [`super::archive::trim_archive`]).
    fn trim_archive(&self) -> Result<(), RaftStoreError> {
        let stats = &self.shared.stats;
        if self.archive_bytes_max == 0
            || stats.archive_bytes.load(Ordering::Acquire) <= self.archive_bytes_max
        {
            return Ok(());
        }
        let trimmed = super::archive::trim_archive(&self.root, self.archive_bytes_max)?;
        stats.archive_bytes.store(trimmed.bytes, Ordering::Release);
        stats
            .archive_segments
            .store(trimmed.segments, Ordering::Release);
        stats
            .archive_segments_deleted
            .fetch_add(trimmed.deleted_segments, Ordering::AcqRel);
        Ok(())
    }

    /// Deletes a segment a purge removed from the log.
    fn delete_purged(&self, segment: &WriterSegment) -> Result<(), RaftStoreError> {
        fs::remove_file(&segment.read.path).map_err(RaftStoreError::io(
            &segment.read.path,
            "delete purged segment",
        ))?;
        self.shared
            .stats
            .segments_deleted
            .fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    fn write_meta(&mut self) -> Result<(), RaftStoreError> {
        let flushed_end = self.records_first + self.records.len() as u64;
        let committed = *lock(&self.shared.committed);
        // Never record a committed id past what this log has flushed.
        self.meta.committed = match (committed, self.meta.committed) {
            (Some(new), _) if new.index < flushed_end => Some(new),
            (_, old) => old,
        };
        write_meta(&self.root, &self.meta)?;
        self.last_meta_write = Instant::now();
        self.shared.stats.meta_writes.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// Writes the meta file if the committed id changed and it is due (or `force`).
    fn persist_committed(&mut self, force: bool) {
        if self.failed.is_some() {
            return;
        }
        let committed = *lock(&self.shared.committed);
        let flushed_end = self.records_first + self.records.len() as u64;
        let changed = committed != self.meta.committed
            && committed.is_some_and(|committed| committed.index < flushed_end);
        if !changed || (!force && self.last_meta_write.elapsed() < COMMITTED_PERSIST_INTERVAL) {
            return;
        }
        if let Err(error) = self.write_meta() {
            self.fail(&error);
        }
    }
}

/// Rebuilds an entry for a slot, reading it from its segment if it was written.
pub(crate) fn read_slot(index: u64, slot: &Slot) -> Result<Entry, RaftStoreError> {
    match &slot.place {
        Place::Pending(entry) => Ok(Entry {
            log_id: entry.log_id,
            payload: match &entry.payload {
                EntryPayload::Blank => EntryPayload::Blank,
                EntryPayload::Normal(batch) => EntryPayload::Normal(batch.clone()),
                EntryPayload::Membership(membership) => {
                    EntryPayload::Membership(membership.clone())
                }
            },
        }),
        Place::Disk {
            cached: Some(entry),
            ..
        } => Ok(Entry {
            log_id: entry.log_id,
            payload: entry.payload.clone(),
        }),
        Place::Disk {
            segment,
            offset,
            payload_len,
            cached: None,
        } => segment.read_entry(index, *offset, *payload_len),
    }
}

/// Creates the segment file at `path` holding `header` so that after a crash `path` either does
/// not exist or has its header: `<path>.tmp`, header, allocation, fsync, rename, fsync of the
/// directory (recovery deletes leftover `.tmp` files). With `allocate`, the file is first
/// allocated to that many bytes (`fallocate`, the space reading as zeros); returns the file's
/// length then, or `None` when it was not allocated because the file system does not support it.
fn create_segment(
    path: &Path,
    header: &SegmentHeader,
    allocate: Option<u64>,
) -> Result<Option<u64>, RaftStoreError> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)
        .map_err(RaftStoreError::io(&tmp, "create segment"))?;
    let mut allocated = None;
    if let Some(bytes) = allocate {
        if super::segment::allocate(&file, bytes)
            .map_err(RaftStoreError::io(&tmp, "allocate segment"))?
        {
            allocated = Some(bytes);
        }
    }
    file.write_all_at(&header.encode(), 0)
        .map_err(RaftStoreError::io(&tmp, "write segment header"))?;
    file.sync_all()
        .map_err(RaftStoreError::io(&tmp, "sync new segment"))?;
    fs::rename(&tmp, path).map_err(RaftStoreError::io(path, "rename segment into place"))?;
    sync_directory(super::meta::parent_of(path))?;
    Ok(allocated)
}

/// Moves the closed segment at `path` into `<root>/archive/` (created if missing), durably:
/// the archive directory is synced before the caller syncs the log directory, so after a
/// crash the segment is in one of the two, and recovery finishes the move.
fn archive_segment(root: &Path, path: &Path) -> Result<(), RaftStoreError> {
    let archive_dir = root.join(super::archive::ARCHIVE_DIR);
    if !archive_dir.is_dir() {
        fs::create_dir_all(&archive_dir)
            .map_err(RaftStoreError::io(&archive_dir, "create archive dir"))?;
        sync_directory(root)?;
    }
    let name = path.file_name().unwrap_or_default();
    let target = archive_dir.join(name);
    fs::rename(path, &target)
        .map_err(RaftStoreError::io(path, "move purged segment to archive"))?;
    sync_directory(&archive_dir)
}

/// Writes zeros over `from..to` of `file`.
fn write_zeros(file: &File, from: u64, to: u64) -> std::io::Result<()> {
    let zeros = vec![0u8; (to.saturating_sub(from)).min(1 << 20) as usize];
    let mut at = from;
    while at < to {
        let len = (to - at).min(zeros.len() as u64) as usize;
        file.write_all_at(&zeros[..len], at)?;
        at += len as u64;
    }
    Ok(())
}
