//! The append-only event file: CRC-framed, hash-chained records, one `EventBatch` each.
//!
//! ```text
//! file   = header record*
//! header = magic "GYRE-EVF" (8 bytes)
//!          format_version u32 = 1
//!          flags u32 = 0 (reserved)
//!          first_index u64          index of the first record (1 unless the file starts mid-log)
//!          base_hash [32]           chain value before the first record (all zero from index 1)
//!          header_crc u32           crc32c of the 56 bytes above
//! record = len u32                  payload length in bytes
//!          crc u32                  crc32c(index ‖ term ‖ payload)
//!          index u64                consecutive, starting at first_index
//!          term u64                 Raft term (0 for files no Raft node wrote, e.g. the simulator)
//!          payload [len]            one encoded EventBatch (see `codec`)
//! ```
//! All integers are little-endian. The record framing is the Raft log segment's (issue 4), so
//! the same scanner serves both.
//!
//! **Hash chain.** Each record's chain hash is `h_i = SHA-256(h_{i-1} ‖ index ‖ term ‖ SHA-256(payload))`
//! (index and term as u64 LE) with `h_{first-1} = base_hash`. It is not stored in the record: the
//! writer returns it from every append and the reader recomputes it for every record it yields.
//! The CRC catches accidents; the chain makes tampering evident: whoever holds a trusted head
//! hash (printed by the exporter, quoted in an audit bundle, or recorded in a later
//! `ProjectionDigest`) can verify every byte before it, and a forger who rewrites one record must
//! rewrite every hash after it, which the trusted head exposes.
//!
//! **Damage.** The reader yields every good record, then at most one error, then stops:
//! - a record shorter than its frame says, or a zero-filled tail (a size extension whose data
//!   never reached the disk), is [`FileError::Torn`] with the byte offset to truncate to;
//! - a CRC mismatch, a length over [`PAYLOAD_MAX_BYTES`], or an index out of sequence is an error
//!   naming the file, byte offset and record index. A CRC mismatch in the final record is *not*
//!   treated as torn: a record whose bytes are all present was written whole, so a mismatch means
//!   the bytes changed afterwards, and silently truncating would lose data someone may have been
//!   told was durable. (A flipped length bit that points past the end of the file is the one case
//!   that reads as torn; lengths above `PAYLOAD_MAX_BYTES` are refused outright.)

mod error;
mod reader;
mod writer;

use sha2::{Digest, Sha256};

pub use error::FileError;
pub use reader::{EventFileReader, FileRecord};
pub use writer::{AppendedRecord, EventFileWriter, Recovered};

/// A SHA-256 chain value.
pub type ChainHash = [u8; 32];

/// The chain value before record 1 of a log.
pub const GENESIS_HASH: ChainHash = [0; 32];

pub const FILE_MAGIC: [u8; 8] = *b"GYRE-EVF";
pub const FILE_FORMAT_VERSION: u32 = 1;
/// Bytes in the file header, its CRC included.
pub const FILE_HEADER_LEN: u64 = 60;
/// Bytes in a record's frame before the payload: len, crc, index, term.
pub const FRAME_HEADER_LEN: u64 = 24;
/// The largest payload a writer accepts and a reader believes. A TITO-heavy batch is a few MiB;
/// a length beyond this is corruption, not a record.
pub const PAYLOAD_MAX_BYTES: u32 = 256 << 20;

/// The file header: where the file sits in its log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileHeader {
    pub format_version: u32,
    pub first_index: u64,
    pub base_hash: ChainHash,
}

impl FileHeader {
    pub(crate) fn encode(&self) -> [u8; FILE_HEADER_LEN as usize] {
        let mut bytes = [0u8; FILE_HEADER_LEN as usize];
        bytes[0..8].copy_from_slice(&FILE_MAGIC);
        bytes[8..12].copy_from_slice(&self.format_version.to_le_bytes());
        // 12..16: flags, zero.
        bytes[16..24].copy_from_slice(&self.first_index.to_le_bytes());
        bytes[24..56].copy_from_slice(&self.base_hash);
        let crc = crc32c::crc32c(&bytes[0..56]);
        bytes[56..60].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// Parses a header, or says what is wrong with it.
    pub(crate) fn decode(bytes: &[u8; FILE_HEADER_LEN as usize]) -> Result<Self, String> {
        if bytes[0..8] != FILE_MAGIC {
            return Err(format!(
                "not a Gyre event file: magic {:02x?}, expected {:?}",
                &bytes[0..8],
                std::str::from_utf8(&FILE_MAGIC).expect("the magic is ASCII")
            ));
        }
        let stored_crc = read_u32(&bytes[56..60]);
        let computed_crc = crc32c::crc32c(&bytes[0..56]);
        if stored_crc != computed_crc {
            return Err(format!(
                "header checksum mismatch (stored {stored_crc:#010x}, computed {computed_crc:#010x})"
            ));
        }
        let format_version = read_u32(&bytes[8..12]);
        if format_version != FILE_FORMAT_VERSION {
            return Err(format!(
                "file format version {format_version} is not readable by this build \
                 (it reads {FILE_FORMAT_VERSION})"
            ));
        }
        let flags = read_u32(&bytes[12..16]);
        if flags != 0 {
            return Err(format!("unknown header flags {flags:#x}"));
        }
        let first_index = read_u64(&bytes[16..24]);
        if first_index == 0 {
            return Err("first_index is 0; log indexes start at 1".to_string());
        }
        let mut base_hash = [0u8; 32];
        base_hash.copy_from_slice(&bytes[24..56]);
        Ok(FileHeader {
            format_version,
            first_index,
            base_hash,
        })
    }
}

/// crc32c over `index ‖ term ‖ payload`, as stored in a record's frame.
pub fn record_crc(index: u64, term: u64, payload: &[u8]) -> u32 {
    let crc = crc32c::crc32c(&index.to_le_bytes());
    let crc = crc32c::crc32c_append(crc, &term.to_le_bytes());
    crc32c::crc32c_append(crc, payload)
}

/// SHA-256 of a record's payload.
pub fn payload_digest(payload: &[u8]) -> ChainHash {
    Sha256::digest(payload).into()
}

/// The next chain value: `SHA-256(previous ‖ index ‖ term ‖ SHA-256(payload))`.
///
/// The chain covers the payload through its digest so that an audit bundle can prove an entry is
/// chained to the log head while carrying only the digests of the entries it does not include.
pub fn chain_hash(previous: &ChainHash, index: u64, term: u64, payload: &[u8]) -> ChainHash {
    chain_hash_of_digest(previous, index, term, &payload_digest(payload))
}

/// The chain step from a payload digest (what `gyre audit verify` recomputes).
pub fn chain_hash_of_digest(
    previous: &ChainHash,
    index: u64,
    term: u64,
    digest: &ChainHash,
) -> ChainHash {
    let mut hasher = Sha256::new();
    hasher.update(previous);
    hasher.update(index.to_le_bytes());
    hasher.update(term.to_le_bytes());
    hasher.update(digest);
    hasher.finalize().into()
}

/// Lowercase hex, for messages and for printing a head hash.
/// Makes the directory entry of `path` durable (a file created there, or renamed onto it): an
/// fsync of its parent directory, `.` for a bare file name.
pub fn sync_parent_directory(path: &std::path::Path) -> std::io::Result<()> {
    let parent = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => std::path::Path::new("."),
    };
    std::fs::File::open(parent).and_then(|directory| directory.sync_all())
}

pub fn hex(hash: &ChainHash) -> String {
    hash.iter().map(|byte| format!("{byte:02x}")).collect()
}

pub(crate) fn read_u32(bytes: &[u8]) -> u32 {
    u32::from_le_bytes(bytes.try_into().expect("callers pass exactly 4 bytes"))
}

pub(crate) fn read_u64(bytes: &[u8]) -> u64 {
    u64::from_le_bytes(bytes.try_into().expect("callers pass exactly 8 bytes"))
}
