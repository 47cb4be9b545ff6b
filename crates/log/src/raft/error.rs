//! Errors of the Raft storage: each names the file it is about, and for a log record the
//! segment, byte offset and index, so an operator can find the damage.

use std::path::PathBuf;

use openraft::{AnyError, ErrorSubject, ErrorVerb, StorageIOError};

use super::types::StorageError;
use crate::codec::CodecError;

#[derive(Debug, thiserror::Error)]
pub enum RaftStoreError {
    #[error("{}: {action}: {source}", path.display())]
    Io {
        path: PathBuf,
        action: &'static str,
        source: std::io::Error,
    },
    /// A record in the middle of the log is damaged. The node refuses to start rather than
    /// lose or invent entries; restore the segment from a replica or remove this node's data
    /// and let it rejoin from a snapshot.
    #[error(
        "log segment {}: record {index} at byte offset {offset} is corrupt: {detail}",
        segment.display()
    )]
    CorruptRecord {
        segment: PathBuf,
        offset: u64,
        index: u64,
        detail: String,
    },
    #[error("log segment {}: {detail}", segment.display())]
    BadSegment { segment: PathBuf, detail: String },
    #[error("log directory {}: {detail}", dir.display())]
    BadLog { dir: PathBuf, detail: String },
    #[error("meta file {}: {detail}", path.display())]
    BadMeta { path: PathBuf, detail: String },
    #[error("snapshot {}: {detail}", path.display())]
    BadSnapshot { path: PathBuf, detail: String },
    #[error("entry {index}: its event batch does not decode: {source}")]
    Decode { index: u64, source: CodecError },
    #[error("entry {index}: {detail}")]
    BadEntry { index: u64, detail: String },
    #[error("the log writer failed earlier or has stopped; the log store is unusable: {detail}")]
    WriterGone { detail: String },
    #[error("raft: {detail}")]
    Raft { detail: String },
    /// Entries a read of the segment files had reached were deleted from the archive (its
    /// size limit) while it ran.
    #[error(
        "entries {next} to {} were deleted from the archive (its size limit) while this read ran; the files now begin at entry {first}",
        first - 1
    )]
    Trimmed { next: u64, first: u64 },
}

impl RaftStoreError {
    pub(crate) fn io(
        path: impl Into<PathBuf>,
        action: &'static str,
    ) -> impl FnOnce(std::io::Error) -> RaftStoreError {
        let path = path.into();
        move |source| RaftStoreError::Io {
            path,
            action,
            source,
        }
    }

    /// Converts into openraft's error for the given subject and verb.
    pub(crate) fn into_storage(self, subject: ErrorSubject<u64>, verb: ErrorVerb) -> StorageError {
        StorageIOError::new(subject, verb, AnyError::new(&self)).into()
    }

    pub(crate) fn into_log_write(self) -> StorageError {
        self.into_storage(ErrorSubject::Logs, ErrorVerb::Write)
    }

    /// An `io::Error` carrying this error's message, for `LogFlushed::log_io_completed`.
    pub(crate) fn to_io_error(&self) -> std::io::Error {
        std::io::Error::other(self.to_string())
    }
}
