//! `LogStore`: openraft's `RaftLogStorage` over segment files, and `LogReader` for replication.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use openraft::storage::{LogState, RaftLogStorage};
use openraft::{ErrorSubject, ErrorVerb, OptionalSend, RaftLogReader};
use tokio::sync::{oneshot, watch};

use super::error::RaftStoreError;
use super::index::{Place, Slot};
use super::record::payload_len_hint;
use super::snapshot::InstallGate;
use super::types::{Entry, LogFlushed, LogId, StorageError, TypeConfig, Vote};
use super::writer::{lock, read_slot, Command, Completion, LogStats, Shared, Writer, WriterStats};

/// Sizes of the log store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogStoreOptions {
    /// A segment is closed and a new one started once it would grow past this.
    pub segment_bytes: u64,
    /// `limited_get_log_entries` (what replication sends in one AppendEntries) stops once this
    /// many payload bytes are collected; it always returns at least one entry.
    pub read_batch_bytes_max: u64,
    /// ... or this many entries.
    pub read_batch_entries_max: u64,
    /// Allocate each new segment to `segment_bytes` when it is created (`fallocate`), so that
    /// appends need no block allocation or size change and a group's `fdatasync` has less
    /// journal work. Off: segments grow with each write.
    pub preallocate: bool,
    /// Move purged segments to `<dir>/archive/` instead of deleting them, so the whole
    /// committed log stays readable (`gyre replay DIR`, `ExportLog`, audits) while restarts
    /// scan only what is behind the last snapshot. Disk use grows with the log.
    pub archive: bool,
    /// Keep the archive within this many bytes: once a purge takes it past, its oldest
    /// segments are deleted (each logged as a warning), so a long run cannot fill the disk
    /// the live log needs. 0: no limit.
    pub archive_bytes_max: u64,
}

impl Default for LogStoreOptions {
    fn default() -> Self {
        LogStoreOptions {
            segment_bytes: 64 << 20,
            read_batch_bytes_max: 8 << 20,
            read_batch_entries_max: 300,
            preallocate: true,
            archive: false,
            archive_bytes_max: 0,
        }
    }
}

/// The durable Raft log of one node, in `<dir>/log/*.seg` plus `<dir>/meta`.
pub struct LogStore {
    dir: PathBuf,
    shared: Arc<Shared>,
    commands: mpsc::Sender<Command>,
    exited: watch::Receiver<bool>,
    options: LogStoreOptions,
    /// The state machine's received snapshots not yet settled: a purge waits for them.
    installs: Option<Arc<InstallGate>>,
}

/// How long a purge waits for a received snapshot to settle before it leaves the log as it is
/// (keeping entries is always safe; openraft asks again after the next snapshot).
const PURGE_WAITS_FOR_INSTALL: std::time::Duration = std::time::Duration::from_secs(60);

/// Reads entries for replication; cheap to clone.
#[derive(Clone)]
pub struct LogReader {
    shared: Arc<Shared>,
    options: LogStoreOptions,
}

/// Observes a log store after it was handed to `Raft::new`: counters, the writer's exit, and
/// (for tests) a pause of the writer.
#[derive(Clone)]
pub struct LogStoreHandle {
    shared: Arc<Shared>,
    exited: watch::Receiver<bool>,
    options: LogStoreOptions,
}

/// While held, the writer stops after taking one command off its queue, so that everything
/// queued meanwhile joins that command's group. Tests use it to build a group deterministically.
pub struct WriterPause<'a> {
    _guard: MutexGuard<'a, ()>,
}

impl LogStore {
    /// Opens (or creates) the log in `dir`, recovering it: a torn tail of the last segment is
    /// truncated; any other damage is an error naming the segment and offset.
    pub fn open(dir: impl AsRef<Path>, options: LogStoreOptions) -> Result<Self, RaftStoreError> {
        let dir = dir.as_ref().to_path_buf();
        std::fs::create_dir_all(&dir).map_err(RaftStoreError::io(&dir, "create data dir"))?;
        let recovered = Writer::recover(
            &dir,
            options.segment_bytes,
            options.preallocate,
            options.archive,
        )?;
        let stats = WriterStats::default();
        // What earlier runs archived (after recovery, which may have finished a move), within
        // the size limit (which may have been lowered since).
        // Trimming is best effort here too: a node must start even when its archive cannot
        // be trimmed (the next purge tries again).
        let trimmed = match options.archive_bytes_max {
            0 => None,
            max => match super::archive::trim_archive(&dir, max) {
                Ok(trimmed) => Some(trimmed),
                Err(error) => {
                    tracing::warn!(%error, "the archive could not be trimmed to its size limit");
                    None
                }
            },
        };
        let (archive_bytes, archive_segments) = match trimmed {
            Some(trimmed) => {
                stats.archive_segments_deleted.store(
                    trimmed.deleted_segments,
                    std::sync::atomic::Ordering::Release,
                );
                (trimmed.bytes, trimmed.segments)
            }
            None => super::archive::archive_size(&dir)?,
        };
        stats
            .archive_bytes
            .store(archive_bytes, std::sync::atomic::Ordering::Release);
        stats
            .archive_segments
            .store(archive_segments, std::sync::atomic::Ordering::Release);
        let shared = Arc::new(Shared {
            index: RwLock::new(recovered.index),
            vote: Mutex::new(recovered.meta.vote),
            committed: Mutex::new(recovered.meta.committed),
            stats,
            pause: Mutex::new(()),
            failed: Mutex::new(None),
        });
        let mut writer = recovered.writer;
        writer.archive_bytes_max = options.archive_bytes_max;
        writer.attach(shared.clone());
        let (commands, receiver) = mpsc::channel();
        let (exit_sender, exited) = watch::channel(false);
        std::thread::Builder::new()
            .name("gyre-log-writer".to_string())
            .spawn(move || writer.run(receiver, exit_sender))
            .map_err(RaftStoreError::io(&dir, "spawn log writer thread"))?;
        Ok(LogStore {
            dir,
            shared,
            commands,
            exited,
            options,
            installs: None,
        })
    }

    /// Makes every purge wait until the snapshots `gate` counts have settled
    /// ([`StateMachineStore::install_gate`]; `open_storage` does this). openraft 0.9 queues the
    /// purge after an install without waiting for the install to be durable.
    ///
    /// [`StateMachineStore::install_gate`]: super::StateMachineStore::install_gate
    pub fn wait_for_installs(&mut self, gate: Arc<InstallGate>) {
        self.installs = Some(gate);
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn handle(&self) -> LogStoreHandle {
        LogStoreHandle {
            shared: self.shared.clone(),
            exited: self.exited.clone(),
            options: self.options,
        }
    }

    pub fn reader(&self) -> LogReader {
        LogReader {
            shared: self.shared.clone(),
            options: self.options,
        }
    }

    pub fn stats(&self) -> LogStats {
        self.shared.stats.snapshot()
    }

    /// Appends `entries` (readable when this returns) and calls `done` once they are durable:
    /// `append` without openraft's callback type, for tools, benchmarks and tests. Appends
    /// queued before the writer gets to them share one `fdatasync`.
    pub fn append_then(
        &mut self,
        entries: Vec<Entry>,
        done: impl FnOnce(std::io::Result<()>) + Send + 'static,
    ) -> Result<(), RaftStoreError> {
        self.enqueue_append(entries, Completion::Callback(Box::new(done)))
    }

    fn enqueue_append(
        &mut self,
        entries: Vec<Entry>,
        callback: Completion,
    ) -> Result<(), RaftStoreError> {
        let entries: Vec<Arc<Entry>> = entries.into_iter().map(Arc::new).collect();
        {
            let mut index = self
                .shared
                .index
                .write()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            // The batch itself must be consecutive; check it before changing anything.
            for pair in entries.windows(2) {
                let (previous, next) = (pair[0].log_id.index, pair[1].log_id.index);
                if next != previous + 1 {
                    return Err(RaftStoreError::BadEntry {
                        index: next,
                        detail: format!(
                            "entries of one append are not consecutive: {previous} then {next}"
                        ),
                    });
                }
            }
            if let Some(first) = entries.first() {
                if let Some(warning) = index.make_room(first.log_id.index) {
                    tracing::warn!(detail = %warning, "append does not continue the log");
                }
            }
            for entry in &entries {
                index.push(Slot {
                    log_id: entry.log_id,
                    place: Place::Pending(entry.clone()),
                    payload_len: u32::try_from(payload_len_hint(entry)).unwrap_or(u32::MAX),
                });
            }
        }
        self.send(Command::Append { entries, callback })
    }

    fn send(&self, command: Command) -> Result<(), RaftStoreError> {
        if let Some(detail) = lock(&self.shared.failed).clone() {
            return Err(RaftStoreError::WriterGone { detail });
        }
        self.commands
            .send(command)
            .map_err(|_| RaftStoreError::WriterGone {
                detail: "the writer thread has exited".to_string(),
            })
    }

    async fn request(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<(), RaftStoreError>>) -> Command,
    ) -> Result<(), RaftStoreError> {
        let (done, wait) = oneshot::channel();
        self.send(make(done))?;
        wait.await.map_err(|_| RaftStoreError::WriterGone {
            detail: "the writer thread dropped a request".to_string(),
        })?
    }
}

impl LogStoreHandle {
    pub fn stats(&self) -> LogStats {
        self.shared.stats.snapshot()
    }

    pub fn reader(&self) -> LogReader {
        LogReader {
            shared: self.shared.clone(),
            options: self.options,
        }
    }

    /// Pauses the writer (see [`WriterPause`]).
    pub fn pause_writer(&self) -> WriterPause<'_> {
        WriterPause {
            _guard: lock(&self.shared.pause),
        }
    }

    /// Resolves once the writer thread has flushed and exited (after the `LogStore` is dropped,
    /// e.g. when its `Raft` shut down). Reopening the directory before that would race it.
    pub async fn writer_exited(&self) {
        let mut exited = self.exited.clone();
        while !*exited.borrow_and_update() {
            if exited.changed().await.is_err() {
                return;
            }
        }
    }

    /// The last log id (or the last purged one) and the vote, for status displays.
    pub fn last_log_id(&self) -> Option<LogId> {
        read_index(&self.shared).last_log_id()
    }
}

fn read_index(shared: &Shared) -> std::sync::RwLockReadGuard<'_, super::index::LogIndex> {
    shared
        .index
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl LogReader {
    /// Entries in `[start, end)` that exist, stopping early at the byte or count budget when
    /// `limited` (always at least one entry if any exists).
    #[allow(clippy::result_large_err)] // openraft's `StorageError`, as its traits return it
    fn read_range(&self, start: u64, end: u64, limited: bool) -> Result<Vec<Entry>, StorageError> {
        let slots: Vec<(u64, Slot)> = {
            let index = read_index(&self.shared);
            let start = start.max(index.first);
            let end = end.min(index.end());
            let mut slots = Vec::new();
            let mut bytes = 0u64;
            for entry_index in start..end {
                let Some(slot) = index.get(entry_index) else {
                    break;
                };
                if limited
                    && !slots.is_empty()
                    && (bytes + u64::from(slot.payload_len) > self.options.read_batch_bytes_max
                        || slots.len() as u64 >= self.options.read_batch_entries_max)
                {
                    break;
                }
                bytes += u64::from(slot.payload_len);
                slots.push((entry_index, slot.clone()));
            }
            slots
        };
        slots
            .iter()
            .map(|(entry_index, slot)| {
                read_slot(*entry_index, slot).map_err(|error| {
                    error.into_storage(ErrorSubject::LogIndex(*entry_index), ErrorVerb::Read)
                })
            })
            .collect()
    }
}

fn range_to_bounds(range: &impl RangeBounds<u64>) -> (u64, u64) {
    let start = match range.start_bound() {
        Bound::Included(start) => *start,
        Bound::Excluded(start) => start.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(end) => end.saturating_add(1),
        Bound::Excluded(end) => *end,
        Bound::Unbounded => u64::MAX,
    };
    (start, end)
}

impl RaftLogReader<TypeConfig> for LogReader {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let (start, end) = range_to_bounds(&range);
        self.read_range(start, end, false)
    }

    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> Result<Vec<Entry>, StorageError> {
        self.read_range(start, end, true)
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        self.reader().try_get_log_entries(range).await
    }

    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> Result<Vec<Entry>, StorageError> {
        self.reader().limited_get_log_entries(start, end).await
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogReader;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let index = read_index(&self.shared);
        Ok(LogState {
            last_purged_log_id: index.last_purged,
            last_log_id: index.last_log_id(),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.reader()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        let vote = *vote;
        self.request(|done| Command::SaveVote { vote, done })
            .await
            .map_err(|error| error.into_storage(ErrorSubject::Vote, ErrorVerb::Write))?;
        *lock(&self.shared.vote) = Some(vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        Ok(*lock(&self.shared.vote))
    }

    /// Committed is recorded at once in memory and written to the meta file lazily (at most
    /// every 100 ms, and with every vote or purge): a stale value only means a restart
    /// re-applies less before the leader tells it the rest.
    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        *lock(&self.shared.committed) = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(*lock(&self.shared.committed))
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        self.enqueue_append(entries.into_iter().collect(), Completion::Raft(callback))
            .map_err(RaftStoreError::into_log_write)
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.shared
            .index
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .truncate_from(log_id.index);
        let index = log_id.index;
        self.request(|done| Command::Truncate { index, done })
            .await
            .map_err(RaftStoreError::into_log_write)
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        if let Some(gate) = &self.installs {
            if !gate.settled(log_id, PURGE_WAITS_FOR_INSTALL).await {
                tracing::warn!(
                    upto = %log_id,
                    pending = gate.pending(),
                    "a received snapshot has not settled; the log is not purged this time"
                );
                return Ok(());
            }
        }
        self.shared
            .index
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .purge_upto(log_id);
        self.request(|done| Command::Purge { upto: log_id, done })
            .await
            .map_err(|error| error.into_storage(ErrorSubject::Logs, ErrorVerb::Delete))
    }
}
