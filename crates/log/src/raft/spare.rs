//! Pre-zeroed spare segment files, prepared off the writer thread.
//!
//! Why: an `fdatasync` after an append that grows a file must also commit the new file size
//! and the new block allocation through the file system's journal; an append into blocks that
//! already exist (written with zeros and synced) only flushes the data. On this project's ext4
//! VM disk a ~23 KB append then syncs in ~145 µs instead of ~200–300 µs, and the leader's
//! openraft core waits for that sync before it replicates (docs/benchmarks.md, "Session 5").
//! etcd's WAL and RocksDB's recycled logs preallocate for the same reason.
//!
//! A [`SparePreparer`] owns one thread that, on request, creates
//! `spare-<pid>-<n>.seg.tmp` in the log directory, fills it with zeros up to the segment size
//! and syncs it (data and size). The writer takes a ready spare when it
//! starts a segment: it writes the segment header into the spare, syncs it, renames it to the
//! segment's name and syncs the directory, so after a crash a segment file either does not
//! exist or has its header (recovery deletes leftover `.tmp` files). Preparation failing (a full
//! disk) is not an error of the log: the writer logs it and grows segments as before.
//!
//! What zero-filled segments change for readers is described in `segment`: the space after the
//! last record reads as zeros, which recovery tells apart from a torn write.

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Zeros are written in chunks of this size; the stop flag is checked between chunks.
const FILL_CHUNK_BYTES: usize = 1 << 20;
/// The fill is paced to at most this rate and synced every [`FILL_SYNC_BYTES`], so that it
/// never floods the disk queue the log's own `fdatasync`s wait in: one 64 MiB burst measurably
/// raised the 256-writer commit p99 of `gyre bench log`. A segment of small groups takes seconds
/// to fill, so the spare is still ready in time; when it is not, the writer grows a segment and
/// moves to the spare once it is.
const FILL_BYTES_PER_SECOND: u64 = 32 << 20;
const FILL_SYNC_BYTES: u64 = 4 << 20;

/// Spare names are unique within the process, so a preparer of a closed store that is still
/// finishing can never touch a file a newer store of the same directory uses.
static SPARE_COUNTER: AtomicU64 = AtomicU64::new(0);

pub(crate) struct SparePreparer {
    requests: Option<mpsc::Sender<PathBuf>>,
    results: mpsc::Receiver<Result<PathBuf, String>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    log_dir: PathBuf,
    /// A request is out and its result not yet received.
    pending: bool,
    /// A spare that is filled and synced, not yet taken.
    ready: Option<PathBuf>,
    /// Length of every spare: the segment size.
    bytes: u64,
}

impl SparePreparer {
    /// Starts the preparing thread for spares of `bytes` bytes in `log_dir`; spares are made
    /// on [`SparePreparer::request`].
    pub fn start(log_dir: &Path, bytes: u64) -> std::io::Result<Self> {
        let (requests, incoming) = mpsc::channel::<PathBuf>();
        let (done, results) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = stop.clone();
        let thread = std::thread::Builder::new()
            .name("gyre-log-spare".to_string())
            .spawn(move || {
                while let Ok(path) = incoming.recv() {
                    let result = fill(&path, bytes, &thread_stop, &incoming).map(|()| path.clone());
                    if result.is_err() {
                        // Whatever was made of it is of no use; a failed removal only leaves a
                        // `.tmp` file that the next recovery deletes.
                        let _ = fs::remove_file(&path);
                    }
                    if thread_stop.load(Ordering::Acquire) || done.send(result).is_err() {
                        return;
                    }
                }
            })?;
        Ok(SparePreparer {
            requests: Some(requests),
            results,
            stop,
            thread: Some(thread),
            log_dir: log_dir.to_path_buf(),
            pending: false,
            ready: None,
            bytes,
        })
    }

    /// The size every spare has.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Asks for the next spare unless one is ready or being prepared.
    pub fn request(&mut self) {
        if self.pending || self.ready.is_some() {
            return;
        }
        let Some(requests) = &self.requests else {
            return;
        };
        let name = format!(
            "spare-{}-{}.seg.tmp",
            std::process::id(),
            SPARE_COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        if requests.send(self.log_dir.join(name)).is_ok() {
            self.pending = true;
        } else {
            tracing::warn!("spare segment thread is gone; segments grow as they are written");
            self.requests = None;
        }
    }

    /// Whether a spare is ready to take (collects a finished preparation).
    pub fn is_ready(&mut self) -> bool {
        if self.pending {
            match self.results.try_recv() {
                Ok(Ok(path)) => {
                    self.pending = false;
                    self.ready = Some(path);
                }
                Ok(Err(error)) => {
                    self.pending = false;
                    tracing::warn!(
                        error = %error,
                        "preparing a zero-filled spare segment failed; the next segment grows as it is written"
                    );
                }
                Err(mpsc::TryRecvError::Empty) => {}
                Err(mpsc::TryRecvError::Disconnected) => {
                    self.pending = false;
                    self.requests = None;
                }
            }
        }
        self.ready.is_some()
    }

    /// Takes the ready spare, if there is one.
    pub fn take(&mut self) -> Option<PathBuf> {
        if self.is_ready() {
            self.ready.take()
        } else {
            None
        }
    }
}

impl Drop for SparePreparer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.requests = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        if let Some(path) = self.ready.take() {
            let _ = fs::remove_file(path);
        }
    }
}

/// Creates `path` (it must not exist), writes `bytes` zeros, paced, and syncs it. Stops early
/// when `stop` is set or `requests` is closed (the pause waits on it, so closing ends it).
fn fill(
    path: &Path,
    bytes: u64,
    stop: &AtomicBool,
    requests: &mpsc::Receiver<PathBuf>,
) -> Result<(), String> {
    let describe =
        |what: &str, error: std::io::Error| format!("{what} {}: {error}", path.display());
    let file: File = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|error| describe("create", error))?;
    let zeros = vec![0u8; FILL_CHUNK_BYTES];
    let started = Instant::now();
    let mut at = 0u64;
    while at < bytes {
        if stop.load(Ordering::Acquire) {
            return Err("stopped".to_string());
        }
        let len = (bytes - at).min(FILL_CHUNK_BYTES as u64) as usize;
        file.write_all_at(&zeros[..len], at)
            .map_err(|error| describe("zero-fill", error))?;
        at += len as u64;
        if at.is_multiple_of(FILL_SYNC_BYTES) {
            file.sync_data().map_err(|error| describe("sync", error))?;
        }
        let due = Duration::from_secs_f64(at as f64 / FILL_BYTES_PER_SECOND as f64);
        if let Some(ahead) = due.checked_sub(started.elapsed()) {
            match requests.recv_timeout(ahead) {
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                // Closed (the writer is gone), or a request while one is pending (never sent).
                _ => return Err("stopped".to_string()),
            }
        }
    }
    // Size and blocks must be durable before the writer relies on them; the directory entry
    // need not be: the writer renames the spare and syncs the directory then.
    file.sync_all().map_err(|error| describe("sync", error))
}
