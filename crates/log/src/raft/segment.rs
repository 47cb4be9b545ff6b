//! Log segment files: a header, then records framed like the event file's.
//!
//! ```text
//! segment = header record*            file name: <first_index as 20 digits>.seg
//! header  = magic "GYRE-SEG" (8 bytes)
//!           format_version u32 = 1
//!           flags u32                 bit 0: chain detached (base_hash unknown, see below)
//!           first_index u64           index of the first record (0 is allowed: openraft's first)
//!           base_hash [32]            chain value before the first record
//!           header_crc u32            crc32c of the 56 bytes above
//! record  = len u32, crc32c(index ‖ term ‖ payload) u32, index u64, term u64, payload
//! ```
//! The payload is a Raft entry (see `record`). Each record's chain hash is the event file's
//! ([`crate::file::chain_hash`] of the previous hash, index, term and payload); a segment's
//! `base_hash` is the hash of the record before its first one, so segments chain into one log.
//! A node that installed a snapshot past the end of its log cannot know the hash of the entry
//! before its next record; that segment starts a detached chain (flag bit 0, zero base).
//!
//! **Preallocated segments** (see `writer`): a segment is allocated to its full size when it is
//! created, so the bytes after the last record read as zeros. The scan tells three endings
//! apart:
//! - *zero tail*: zeros from a record boundary to the end of the file, which is unused space,
//!   not damage;
//! - *torn*: a write interrupted by a crash. Either the file ends inside a record, or a record
//!   fails its checksum while one of its 512-byte sectors (aligned in the file) is all zeros, or
//!   it is zeros from a sector boundary inside it to its end, sectors the crash kept from
//!   reaching the disk, and only zeros follow it (etcd's WAL uses the same rule);
//! - anything else is corruption, refused with the segment, offset and index. Recovery
//!   (`Writer::recover`) also refuses a "torn" record that is not its segment's first and
//!   whose length runs past the end of a file at least `segment_bytes` long: the writer never
//!   appends such a record, so its length field is damaged.

use std::fs::File;
use std::io::{BufReader, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::file::{
    chain_hash, read_u32, read_u64, record_crc, ChainHash, FRAME_HEADER_LEN, PAYLOAD_MAX_BYTES,
};

use super::error::RaftStoreError;
use super::record::split_payload;

pub const SEGMENT_MAGIC: [u8; 8] = *b"GYRE-SEG";
pub const SEGMENT_FORMAT_VERSION: u32 = 1;
pub const SEGMENT_HEADER_LEN: u64 = 60;
/// Header flag: the chain before this segment is unknown.
pub const FLAG_DETACHED: u32 = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentHeader {
    pub flags: u32,
    pub first_index: u64,
    pub base_hash: ChainHash,
}

impl SegmentHeader {
    pub fn encode(&self) -> [u8; SEGMENT_HEADER_LEN as usize] {
        let mut bytes = [0u8; SEGMENT_HEADER_LEN as usize];
        bytes[0..8].copy_from_slice(&SEGMENT_MAGIC);
        bytes[8..12].copy_from_slice(&SEGMENT_FORMAT_VERSION.to_le_bytes());
        bytes[12..16].copy_from_slice(&self.flags.to_le_bytes());
        bytes[16..24].copy_from_slice(&self.first_index.to_le_bytes());
        bytes[24..56].copy_from_slice(&self.base_hash);
        let crc = crc32c::crc32c(&bytes[0..56]);
        bytes[56..60].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    pub fn decode(bytes: &[u8; SEGMENT_HEADER_LEN as usize]) -> Result<Self, String> {
        if bytes[0..8] != SEGMENT_MAGIC {
            return Err(format!(
                "not a Gyre log segment: magic {:02x?}",
                &bytes[0..8]
            ));
        }
        let stored = read_u32(&bytes[56..60]);
        let computed = crc32c::crc32c(&bytes[0..56]);
        if stored != computed {
            return Err(format!(
                "header checksum mismatch (stored {stored:#010x}, computed {computed:#010x})"
            ));
        }
        let version = read_u32(&bytes[8..12]);
        if version != SEGMENT_FORMAT_VERSION {
            return Err(format!(
                "segment format version {version} is not readable by this build \
                 (it reads {SEGMENT_FORMAT_VERSION})"
            ));
        }
        let flags = read_u32(&bytes[12..16]);
        if flags & !FLAG_DETACHED != 0 {
            return Err(format!("unknown header flags {flags:#x}"));
        }
        let mut base_hash = [0u8; 32];
        base_hash.copy_from_slice(&bytes[24..56]);
        Ok(SegmentHeader {
            flags,
            first_index: read_u64(&bytes[16..24]),
            base_hash,
        })
    }

    pub fn detached(&self) -> bool {
        self.flags & FLAG_DETACHED != 0
    }
}

/// The file name of the segment whose first record is `first_index`.
pub fn segment_file_name(first_index: u64) -> String {
    format!("{first_index:020}.seg")
}

/// The first index a segment file name claims, if it is one.
pub fn parse_segment_file_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".seg")?;
    if digits.len() != 20 || !digits.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// One verified record of a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScannedRecord {
    pub index: u64,
    pub term: u64,
    /// The node that proposed the entry (from the payload header).
    pub leader_node_id: u64,
    /// Byte offset of the record's frame.
    pub offset: u64,
    pub payload_len: u32,
    /// Chain value after this record.
    pub hash: ChainHash,
}

/// What scanning a segment found.
#[derive(Clone, Debug)]
pub struct SegmentScan {
    pub path: PathBuf,
    pub header: SegmentHeader,
    /// Offset just past the last good record.
    pub end_offset: u64,
    pub file_len: u64,
    /// The file continues past `end_offset` with an incomplete record: a write interrupted by
    /// a crash. Everything before `end_offset` is intact.
    pub torn: bool,
    /// Torn because the record at `end_offset` declares more bytes than the file holds (a
    /// write the crash cut short, or a damaged length field: see `Writer::recover`).
    pub torn_past_end: bool,
    /// The file continues past `end_offset` with zeros only: preallocated space (or a tail the
    /// file system extended whose data never arrived, which is the same thing to a reader).
    pub zero_tail: bool,
    /// The index the next record would carry.
    pub next_index: u64,
    /// Chain value after the last good record (the base hash if none).
    pub head_hash: ChainHash,
}

/// The header of the segment at `path`.
pub fn read_segment_header(path: &Path) -> Result<SegmentHeader, RaftStoreError> {
    let mut bytes = [0u8; SEGMENT_HEADER_LEN as usize];
    File::open(path)
        .and_then(|file| file.read_exact_at(&mut bytes, 0))
        .map_err(RaftStoreError::io(path, "read segment header"))?;
    SegmentHeader::decode(&bytes).map_err(|detail| RaftStoreError::BadSegment {
        segment: path.to_path_buf(),
        detail,
    })
}

/// Reads and verifies every record of the segment at `path`, calling `on_record` with each
/// record and its payload. A zero tail ends the scan with `zero_tail`, a torn write with
/// `torn` (see the module docs); any other damage (checksum, frame, index sequence, payload
/// header) is an error naming the segment, offset and index.
pub fn scan_segment(
    path: &Path,
    mut on_record: impl FnMut(&ScannedRecord, &[u8]) -> Result<(), RaftStoreError>,
) -> Result<SegmentScan, RaftStoreError> {
    let file = File::open(path).map_err(RaftStoreError::io(path, "open segment"))?;
    let file_len = file
        .metadata()
        .map_err(RaftStoreError::io(path, "read segment metadata"))?
        .len();
    let bad_segment = |detail: String| RaftStoreError::BadSegment {
        segment: path.to_path_buf(),
        detail,
    };
    if file_len < SEGMENT_HEADER_LEN {
        return Err(bad_segment(format!(
            "file is {file_len} bytes, shorter than the {SEGMENT_HEADER_LEN}-byte header"
        )));
    }
    let mut reader = BufReader::with_capacity(1 << 20, file);
    let mut header_bytes = [0u8; SEGMENT_HEADER_LEN as usize];
    reader
        .read_exact(&mut header_bytes)
        .map_err(RaftStoreError::io(path, "read segment header"))?;
    let header = SegmentHeader::decode(&header_bytes).map_err(bad_segment)?;

    let mut offset = SEGMENT_HEADER_LEN;
    let mut next_index = header.first_index;
    let mut head = header.base_hash;
    let mut payload = Vec::new();
    let corrupt = |offset: u64, index: u64, detail: String| RaftStoreError::CorruptRecord {
        segment: path.to_path_buf(),
        offset,
        index,
        detail,
    };
    let mut torn = false;
    let mut torn_past_end = false;
    let mut zero_tail = false;
    while offset < file_len {
        let remaining = file_len - offset;
        if remaining < FRAME_HEADER_LEN {
            // Too short for a frame: an append that did not finish.
            torn = true;
            break;
        }
        let mut frame = [0u8; FRAME_HEADER_LEN as usize];
        reader
            .read_exact(&mut frame)
            .map_err(RaftStoreError::io(path, "read record frame"))?;
        if frame.iter().all(|byte| *byte == 0) && rest_is_zero(&mut reader, path)? {
            zero_tail = true;
            break;
        }
        let len = read_u32(&frame[0..4]);
        let stored_crc = read_u32(&frame[4..8]);
        let index = read_u64(&frame[8..16]);
        let term = read_u64(&frame[16..24]);
        if len > PAYLOAD_MAX_BYTES {
            return Err(corrupt(
                offset,
                next_index,
                format!("declared length {len} exceeds the limit of {PAYLOAD_MAX_BYTES} bytes"),
            ));
        }
        if FRAME_HEADER_LEN + u64::from(len) > remaining {
            torn = true;
            torn_past_end = true;
            break;
        }
        payload.resize(len as usize, 0);
        reader
            .read_exact(&mut payload)
            .map_err(RaftStoreError::io(path, "read record payload"))?;
        let computed_crc = record_crc(index, term, &payload);
        if computed_crc != stored_crc {
            if has_zero_sector(offset, &frame, &payload) && rest_is_zero(&mut reader, path)? {
                torn = true;
                break;
            }
            return Err(corrupt(
                offset,
                next_index,
                format!(
                    "checksum mismatch (stored {stored_crc:#010x}, computed {computed_crc:#010x})"
                ),
            ));
        }
        if index != next_index {
            return Err(corrupt(
                offset,
                next_index,
                format!("index out of sequence: expected {next_index}, found {index}"),
            ));
        }
        let (_, leader_node_id, _) =
            split_payload(&payload).map_err(|detail| corrupt(offset, index, detail))?;
        head = chain_hash(&head, index, term, &payload);
        let record = ScannedRecord {
            index,
            term,
            leader_node_id,
            offset,
            payload_len: len,
            hash: head,
        };
        on_record(&record, &payload)?;
        offset += FRAME_HEADER_LEN + u64::from(len);
        next_index = index + 1;
    }
    Ok(SegmentScan {
        path: path.to_path_buf(),
        header,
        end_offset: offset,
        file_len,
        torn,
        torn_past_end,
        zero_tail,
        next_index,
        head_hash: head,
    })
}

/// Size of the sectors a torn write leaves unwritten as a whole.
const SECTOR_BYTES: u64 = 512;

/// Whether the record at file offset `offset` (its `frame` then `payload`) has sectors a crash
/// kept from the disk: a whole 512-byte sector, aligned in the file, of zeros, or zeros from a
/// sector boundary inside it to its end. The second is the common torn append: the record ends
/// less than a sector past the last page that reached the disk.
fn has_zero_sector(offset: u64, frame: &[u8], payload: &[u8]) -> bool {
    let record_len = frame.len() as u64 + payload.len() as u64;
    let last_non_zero = payload
        .iter()
        .rposition(|byte| *byte != 0)
        .map(|at| frame.len() + at)
        .or_else(|| frame.iter().rposition(|byte| *byte != 0));
    if let Some(last) = last_non_zero {
        let zeros_from = (offset + last as u64 + 1).div_ceil(SECTOR_BYTES) * SECTOR_BYTES;
        if zeros_from < offset + record_len {
            return true;
        }
    }
    let byte_at = |at: u64| -> u8 {
        let at = (at - offset) as usize;
        if at < frame.len() {
            frame[at]
        } else {
            payload[at - frame.len()]
        }
    };
    let mut sector = offset.div_ceil(SECTOR_BYTES) * SECTOR_BYTES;
    while sector + SECTOR_BYTES <= offset + record_len {
        if (sector..sector + SECTOR_BYTES).all(|at| byte_at(at) == 0) {
            return true;
        }
        sector += SECTOR_BYTES;
    }
    false
}

/// Allocates `file` to `len` bytes with `fallocate`: the size is extended and the new space
/// reads as zeros, so appends into it need no block allocation or size change. `Ok(false)`
/// when the file system does not support it.
pub fn allocate(file: &File, len: u64) -> std::io::Result<bool> {
    match rustix::fs::fallocate(file, rustix::fs::FallocateFlags::empty(), 0, len) {
        Ok(()) => Ok(true),
        Err(errno) if errno == rustix::io::Errno::OPNOTSUPP => Ok(false),
        Err(errno) => Err(errno.into()),
    }
}

/// Whether every byte left in `reader` is zero.
fn rest_is_zero(reader: &mut impl Read, path: &Path) -> Result<bool, RaftStoreError> {
    // A preallocated segment's tail is most of the file: check it a MiB at a time, OR-ing the
    // bytes (which vectorises) rather than stopping at the first non-zero one.
    let mut chunk = vec![0u8; 1 << 20];
    loop {
        let read = reader
            .read(&mut chunk)
            .map_err(RaftStoreError::io(path, "read segment tail"))?;
        if read == 0 {
            return Ok(true);
        }
        if chunk[..read].iter().fold(0u8, |any, byte| any | byte) != 0 {
            return Ok(false);
        }
    }
}

/// Appends the frame of one record (`[len][crc][index][term]`, then the payload) to `out`.
/// `encode_payload` appends the payload. Returns the payload length.
pub fn append_frame(
    out: &mut Vec<u8>,
    index: u64,
    term: u64,
    encode_payload: impl FnOnce(&mut Vec<u8>),
) -> Result<u32, usize> {
    let start = out.len();
    out.extend_from_slice(&[0u8; FRAME_HEADER_LEN as usize]);
    encode_payload(out);
    let payload_len = out.len() - start - FRAME_HEADER_LEN as usize;
    let len = match u32::try_from(payload_len) {
        Ok(len) if len <= PAYLOAD_MAX_BYTES => len,
        _ => {
            out.truncate(start);
            return Err(payload_len);
        }
    };
    let payload_start = start + FRAME_HEADER_LEN as usize;
    let crc = record_crc(index, term, &out[payload_start..]);
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    out[start + 8..start + 16].copy_from_slice(&index.to_le_bytes());
    out[start + 16..start + 24].copy_from_slice(&term.to_le_bytes());
    Ok(len)
}
