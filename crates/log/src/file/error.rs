//! Errors of the event file: each names the file, and where it is about a record, the byte
//! offset and index of that record.

use std::path::PathBuf;

use crate::codec::CodecError;

#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("{}: {action}: {source}", path.display())]
    Io {
        path: PathBuf,
        action: &'static str,
        source: std::io::Error,
    },
    #[error("{}: bad file header: {detail}", path.display())]
    BadHeader { path: PathBuf, detail: String },
    /// The last record is incomplete (a write interrupted by a crash). Everything before
    /// `offset` is intact; truncating the file to `offset` recovers it.
    #[error(
        "{}: torn tail at byte offset {offset} (record {index} is incomplete); \
         truncate to {offset} bytes to recover",
        path.display()
    )]
    Torn {
        path: PathBuf,
        offset: u64,
        index: u64,
    },
    #[error(
        "{}: record {index} at byte offset {offset} is corrupt: checksum mismatch \
         (stored {stored:#010x}, computed {computed:#010x})",
        path.display()
    )]
    BadChecksum {
        path: PathBuf,
        offset: u64,
        index: u64,
        stored: u32,
        computed: u32,
    },
    #[error("{}: record {index} at byte offset {offset} is corrupt: {detail}", path.display())]
    BadFrame {
        path: PathBuf,
        offset: u64,
        index: u64,
        detail: String,
    },
    #[error("{}: record {index} at byte offset {offset}: {source}", path.display())]
    Codec {
        path: PathBuf,
        offset: u64,
        index: u64,
        source: CodecError,
    },
    #[error(
        "{}: payload of {len} bytes exceeds the record limit of {max} bytes",
        path.display()
    )]
    PayloadTooLarge { path: PathBuf, len: usize, max: u32 },
    /// A write or sync failed earlier; the file's tail is unknown, so the writer refuses more.
    #[error(
        "{}: writer is unusable after an earlier failed write or sync; reopen the file \
         with EventFileWriter::open_append to recover",
        path.display()
    )]
    Poisoned { path: PathBuf },
}
