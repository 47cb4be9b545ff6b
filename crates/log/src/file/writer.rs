//! Writing an event file: append framed records, make them durable with `sync`.

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use gyre_event::Event;

use super::{
    chain_hash, record_crc, ChainHash, EventFileReader, FileError, FileHeader, FILE_FORMAT_VERSION,
    FILE_HEADER_LEN, FRAME_HEADER_LEN, GENESIS_HASH, PAYLOAD_MAX_BYTES,
};
use crate::codec::encode_batch;

/// Where one appended record landed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppendedRecord {
    pub index: u64,
    /// Byte offset of the record's frame.
    pub offset: u64,
    /// The chain value after this record: the file's head hash until the next append.
    pub hash: ChainHash,
}

/// What `open_append` found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Recovered {
    /// Intact records in the file.
    pub records_count: u64,
    /// Set when an incomplete last record was cut off: the offset the file was truncated to.
    pub truncated_torn_tail_at: Option<u64>,
}

/// Space reserved past the end of the file at a time (`fallocate` with `KEEP_SIZE`), so that an
/// append lands in blocks already allocated: its `fdatasync` then commits the new size only, not
/// a block allocation as well (on this repository's ext4 host: p99 292 → 195 µs for 6 KB appends,
/// docs/benchmarks.md). The size stays the records' end, so readers see no difference.
const RESERVE_BYTES: u64 = 8 << 20;

/// Appends records to an event file. Nothing is durable until [`EventFileWriter::sync`]
/// returns; one `sync` per group of appends is the intended rhythm (group commit).
#[derive(Debug)]
pub struct EventFileWriter {
    path: PathBuf,
    file: File,
    next_index: u64,
    term: u64,
    head: ChainHash,
    len: u64,
    /// A write or sync failed: the file's tail is unknown, so no further append is allowed.
    poisoned: bool,
    frame: Vec<u8>,
    /// Where the space reserved past the end ends; `None` once the file system refused to
    /// reserve (then appends allocate as they go, as before).
    reserved_to: Option<u64>,
}

impl EventFileWriter {
    /// Creates a new file for a log that starts at index 1. Fails if the file exists.
    pub fn create(path: impl AsRef<Path>) -> Result<Self, FileError> {
        Self::create_at(path, 1, GENESIS_HASH)
    }

    /// Creates a new file whose first record will be `first_index`, continuing a chain whose
    /// value before that record is `base_hash` (an export that starts after a purge).
    pub fn create_at(
        path: impl AsRef<Path>,
        first_index: u64,
        base_hash: ChainHash,
    ) -> Result<Self, FileError> {
        let path = path.as_ref().to_path_buf();
        if first_index == 0 {
            return Err(FileError::BadHeader {
                path,
                detail: "first_index must be ≥ 1".to_string(),
            });
        }
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(io(&path, "create"))?;
        lock_for_writing(&file, &path)?;
        let header = FileHeader {
            format_version: FILE_FORMAT_VERSION,
            first_index,
            base_hash,
        };
        file.write_all(&header.encode())
            .map_err(io(&path, "write header"))?;
        file.sync_all().map_err(io(&path, "sync header"))?;
        super::sync_parent_directory(&path).map_err(io(&path, "sync directory"))?;
        Ok(EventFileWriter {
            path,
            file,
            next_index: first_index,
            term: 0,
            head: base_hash,
            len: FILE_HEADER_LEN,
            poisoned: false,
            frame: Vec::new(),
            reserved_to: Some(FILE_HEADER_LEN),
        })
    }

    /// Opens an existing file to append to it. A torn tail is truncated (and reported); any
    /// other damage is refused with the reader's error.
    pub fn open_append(path: impl AsRef<Path>) -> Result<(Self, Recovered), FileError> {
        let path = path.as_ref().to_path_buf();
        // Locked before the file is read: a writer that still has it (a sink being replaced)
        // finishes first, so what is read below is where this writer goes on.
        let mut file = OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(io(&path, "open for appending"))?;
        lock_for_writing(&file, &path)?;
        let mut reader = EventFileReader::open(&path)?;
        let mut records_count = 0u64;
        let mut truncated_torn_tail_at = None;
        let mut last_term = 0;
        for record in reader.by_ref() {
            match record {
                Ok(record) => {
                    records_count += 1;
                    last_term = record.term;
                }
                Err(FileError::Torn { offset, .. }) => truncated_torn_tail_at = Some(offset),
                Err(error) => return Err(error),
            }
        }
        let (len, next_index, head) = (reader.offset(), reader.next_index(), reader.head_hash());
        drop(reader);
        if truncated_torn_tail_at.is_some() {
            file.set_len(len).map_err(io(&path, "truncate torn tail"))?;
            file.sync_all().map_err(io(&path, "sync truncation"))?;
        } else {
            // Space a writer that did not end cleanly reserved past the end.
            give_back_reserved(&file, len);
        }
        file.seek(SeekFrom::Start(len))
            .map_err(io(&path, "seek to end"))?;
        let writer = EventFileWriter {
            path,
            file,
            next_index,
            term: last_term,
            head,
            len,
            poisoned: false,
            frame: Vec::new(),
            reserved_to: Some(len),
        };
        Ok((
            writer,
            Recovered {
                records_count,
                truncated_torn_tail_at,
            },
        ))
    }

    /// The Raft term stamped on the following records (0 for files no Raft node writes).
    pub fn set_term(&mut self, term: u64) {
        self.term = term;
    }

    /// Encodes `events` as one batch and appends it as one record.
    pub fn append_batch(&mut self, events: &[Event]) -> Result<AppendedRecord, FileError> {
        self.append_payload(&encode_batch(events))
    }

    /// Appends one record holding `payload` (an encoded `EventBatch`).
    pub fn append_payload(&mut self, payload: &[u8]) -> Result<AppendedRecord, FileError> {
        if self.poisoned {
            return Err(FileError::Poisoned {
                path: self.path.clone(),
            });
        }
        let len = match u32::try_from(payload.len()) {
            Ok(len) if len <= PAYLOAD_MAX_BYTES => len,
            _ => {
                return Err(FileError::PayloadTooLarge {
                    path: self.path.clone(),
                    len: payload.len(),
                    max: PAYLOAD_MAX_BYTES,
                })
            }
        };
        let index = self.next_index;
        let term = self.term;
        self.frame.clear();
        self.frame.extend_from_slice(&len.to_le_bytes());
        self.frame
            .extend_from_slice(&record_crc(index, term, payload).to_le_bytes());
        self.frame.extend_from_slice(&index.to_le_bytes());
        self.frame.extend_from_slice(&term.to_le_bytes());
        self.frame.extend_from_slice(payload);
        self.reserve(self.frame.len() as u64);
        if let Err(source) = self.file.write_all(&self.frame) {
            self.poisoned = true;
            return Err(FileError::Io {
                path: self.path.clone(),
                action: "append record",
                source,
            });
        }
        let offset = self.len;
        self.len += FRAME_HEADER_LEN + u64::from(len);
        self.head = chain_hash(&self.head, index, term, payload);
        self.next_index = index + 1;
        Ok(AppendedRecord {
            index,
            offset,
            hash: self.head,
        })
    }

    /// Reserves space past the end for the next `bytes` (and [`RESERVE_BYTES`] more) when what
    /// is reserved falls short. Best effort: a file system that cannot reserve is not asked
    /// again, and any other failure leaves the append to allocate, as it would without this.
    fn reserve(&mut self, bytes: u64) {
        let Some(reserved_to) = self.reserved_to else {
            return;
        };
        if self.len + bytes <= reserved_to {
            return;
        }
        let length = bytes + RESERVE_BYTES;
        match reserve_past_end(&self.file, self.len, length) {
            Ok(()) => self.reserved_to = Some(self.len + length),
            Err(errno) => {
                // Not supported, or refused (no space, a quota): appends allocate as they go,
                // and the file system is not asked again.
                tracing::debug!(path = %self.path.display(), %errno, "not reserving space past the end");
                self.reserved_to = None;
            }
        }
    }

    /// Makes every appended record durable (`fdatasync`). After a failure the writer is
    /// poisoned: the kernel may have dropped the dirty pages, so retrying could lie.
    pub fn sync(&mut self) -> Result<(), FileError> {
        if self.poisoned {
            return Err(FileError::Poisoned {
                path: self.path.clone(),
            });
        }
        self.file.sync_data().map_err(|source| {
            self.poisoned = true;
            FileError::Io {
                path: self.path.clone(),
                action: "sync",
                source,
            }
        })
    }

    /// The index the next append will get.
    pub fn next_index(&self) -> u64 {
        self.next_index
    }

    /// The chain value after the last record (the header's base hash for an empty file).
    pub fn head_hash(&self) -> ChainHash {
        self.head
    }

    /// Bytes written so far, header included.
    pub fn len_bytes(&self) -> u64 {
        self.len
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn reserve_past_end(file: &File, offset: u64, length: u64) -> rustix::io::Result<()> {
    rustix::fs::fallocate(file, rustix::fs::FallocateFlags::KEEP_SIZE, offset, length)
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn reserve_past_end(_file: &File, _offset: u64, _length: u64) -> rustix::io::Result<()> {
    Err(rustix::io::Errno::NOSYS)
}

/// How long a writer waits for another one to let go of the file.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Takes the file's exclusive lock (`flock`) for as long as `file` is open: one writer per
/// event file, across threads and processes. Another writer's hold is waited out for
/// [`LOCK_WAIT`] (a sink being replaced lets go within moments), then refused naming the file.
#[cfg(unix)]
fn lock_for_writing(file: &File, path: &Path) -> Result<(), FileError> {
    use rustix::fs::{flock, FlockOperation};
    let started = std::time::Instant::now();
    loop {
        match flock(file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(()),
            Err(errno) if errno == rustix::io::Errno::WOULDBLOCK => {
                if started.elapsed() > LOCK_WAIT {
                    return Err(FileError::Io {
                        path: path.to_path_buf(),
                        action: "lock for writing (another writer has the file open)",
                        source: std::io::Error::from(errno),
                    });
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            // A file system without locks: one writer per file is then the caller's to keep.
            Err(errno)
                if errno == rustix::io::Errno::NOLCK || errno == rustix::io::Errno::OPNOTSUPP =>
            {
                return Ok(())
            }
            Err(errno) => {
                return Err(FileError::Io {
                    path: path.to_path_buf(),
                    action: "lock for writing",
                    source: std::io::Error::from(errno),
                })
            }
        }
    }
}

#[cfg(not(unix))]
fn lock_for_writing(_file: &File, _path: &Path) -> Result<(), FileError> {
    Ok(())
}

/// Gives back the space reserved past `len` (setting the size the file has frees the blocks
/// beyond it), only when `len` is still the file's size. The writer holds the file's lock, so
/// no other writer appends meanwhile.
fn give_back_reserved(file: &File, len: u64) {
    if file.metadata().is_ok_and(|metadata| metadata.len() == len) {
        let _ = file.set_len(len);
    }
}

impl Drop for EventFileWriter {
    /// Gives back the space reserved past the end. Nothing is lost if this fails or is skipped
    /// (the size is unchanged either way; the next `open_append` gives it back).
    fn drop(&mut self) {
        if self
            .reserved_to
            .is_some_and(|reserved_to| reserved_to > self.len)
            && !self.poisoned
        {
            give_back_reserved(&self.file, self.len);
        }
    }
}

fn io(path: &Path, action: &'static str) -> impl FnOnce(std::io::Error) -> FileError {
    let path = path.to_path_buf();
    move |source| FileError::Io {
        path,
        action,
        source,
    }
}
