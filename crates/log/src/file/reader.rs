//! Reading an event file: every good record in order, then at most one error.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use gyre_event::Event;

use super::{
    chain_hash, read_u32, read_u64, record_crc, ChainHash, FileError, FileHeader, FILE_HEADER_LEN,
    FRAME_HEADER_LEN, PAYLOAD_MAX_BYTES,
};
use crate::codec::decode_batch;

/// One verified record: its CRC matched, its index was the next one, and `hash` is its chain
/// value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileRecord {
    pub index: u64,
    pub term: u64,
    /// Byte offset of the record's frame in the file.
    pub offset: u64,
    /// `SHA-256(previous hash ‖ index ‖ term ‖ SHA-256(payload))`.
    pub hash: ChainHash,
    /// One encoded `EventBatch`.
    pub payload: Vec<u8>,
}

/// Iterates the records of an event file, verifying CRCs, index order and the hash chain.
///
/// Yields `Ok` records in order; on the first damaged record it yields one `Err` (naming the
/// file, byte offset and record index) and then ends. Records appended after `open` are not
/// seen: the reader stops at the length the file had when it was opened.
pub struct EventFileReader {
    path: PathBuf,
    reader: BufReader<File>,
    header: FileHeader,
    file_len: u64,
    offset: u64,
    next_index: u64,
    head: ChainHash,
    finished: bool,
}

impl EventFileReader {
    pub fn open(path: impl AsRef<Path>) -> Result<Self, FileError> {
        let path = path.as_ref().to_path_buf();
        let io = |action| {
            let path = path.clone();
            move |source| FileError::Io {
                path,
                action,
                source,
            }
        };
        let file = File::open(&path).map_err(io("open for reading"))?;
        let file_len = file.metadata().map_err(io("read metadata"))?.len();
        if file_len < FILE_HEADER_LEN {
            return Err(FileError::BadHeader {
                path,
                detail: format!(
                    "file is {file_len} bytes, shorter than the {FILE_HEADER_LEN}-byte header"
                ),
            });
        }
        let mut reader = BufReader::with_capacity(1 << 20, file);
        let mut header_bytes = [0u8; FILE_HEADER_LEN as usize];
        reader
            .read_exact(&mut header_bytes)
            .map_err(io("read header"))?;
        let header = FileHeader::decode(&header_bytes).map_err(|detail| FileError::BadHeader {
            path: path.clone(),
            detail,
        })?;
        Ok(EventFileReader {
            path,
            reader,
            file_len,
            offset: FILE_HEADER_LEN,
            next_index: header.first_index,
            head: header.base_hash,
            header,
            finished: false,
        })
    }

    pub fn header(&self) -> &FileHeader {
        &self.header
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The chain value after the last record yielded so far (the header's `base_hash` before
    /// any). After the iterator ends without error this is the file's head hash.
    pub fn head_hash(&self) -> ChainHash {
        self.head
    }

    /// The index the next record must carry.
    pub fn next_index(&self) -> u64 {
        self.next_index
    }

    /// Byte offset just past the last record yielded so far.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Reads every record and decodes its batch; stops at the first error of either kind.
    pub fn read_all_events(path: impl AsRef<Path>) -> Result<Vec<(u64, Vec<Event>)>, FileError> {
        let reader = EventFileReader::open(path)?;
        let path = reader.path.clone();
        reader
            .map(|record| {
                let record = record?;
                let events = record.decode_events_in(&path)?;
                Ok((record.index, events))
            })
            .collect()
    }

    /// The events of the one record whose frame starts at byte `offset` of `path` (an offset a
    /// writer's [`super::AppendedRecord`] or a reader's [`FileRecord`] gave), its CRC checked:
    /// random access for an index kept beside the file. The hash chain is not walked (that
    /// needs every record before it), so this is a read-back, not a verification.
    pub fn events_at(path: impl AsRef<Path>, offset: u64) -> Result<Vec<Event>, FileError> {
        use std::io::{Seek, SeekFrom};
        let path = path.as_ref();
        let io = |action| {
            move |source| FileError::Io {
                path: path.to_path_buf(),
                action,
                source,
            }
        };
        let mut file = File::open(path).map_err(io("open for reading"))?;
        let file_len = file.metadata().map_err(io("read metadata"))?.len();
        let bad = |detail: String| FileError::BadFrame {
            path: path.to_path_buf(),
            offset,
            index: 0,
            detail,
        };
        if offset < FILE_HEADER_LEN || offset.saturating_add(FRAME_HEADER_LEN) > file_len {
            return Err(bad(format!(
                "no record frame fits at offset {offset} of a {file_len}-byte file"
            )));
        }
        file.seek(SeekFrom::Start(offset))
            .map_err(io("seek to a record"))?;
        let mut frame = [0u8; FRAME_HEADER_LEN as usize];
        file.read_exact(&mut frame)
            .map_err(io("read record frame"))?;
        let len = read_u32(&frame[0..4]);
        let stored_crc = read_u32(&frame[4..8]);
        let index = read_u64(&frame[8..16]);
        let term = read_u64(&frame[16..24]);
        if len > PAYLOAD_MAX_BYTES || offset + FRAME_HEADER_LEN + u64::from(len) > file_len {
            return Err(bad(format!(
                "declared length {len} does not fit in the file"
            )));
        }
        let mut payload = vec![0u8; len as usize];
        file.read_exact(&mut payload)
            .map_err(io("read record payload"))?;
        let computed = record_crc(index, term, &payload);
        if computed != stored_crc {
            return Err(FileError::BadChecksum {
                path: path.to_path_buf(),
                offset,
                index,
                stored: stored_crc,
                computed,
            });
        }
        decode_batch(&payload).map_err(|source| FileError::Codec {
            path: path.to_path_buf(),
            offset,
            index,
            source,
        })
    }

    fn io(&self, action: &'static str, source: std::io::Error) -> FileError {
        FileError::Io {
            path: self.path.clone(),
            action,
            source,
        }
    }

    fn torn(&self, index: u64) -> FileError {
        FileError::Torn {
            path: self.path.clone(),
            offset: self.offset,
            index,
        }
    }

    fn bad_frame(&self, index: u64, detail: String) -> FileError {
        FileError::BadFrame {
            path: self.path.clone(),
            offset: self.offset,
            index,
            detail,
        }
    }

    /// Whether every byte not yet read is zero (a tail the file system extended but never
    /// filled). Consumes the reader; only called on the way to an error.
    fn rest_is_zero(&mut self) -> Result<bool, FileError> {
        let mut chunk = vec![0u8; 64 << 10];
        loop {
            let read = self
                .reader
                .read(&mut chunk)
                .map_err(|source| self.io("read tail", source))?;
            if read == 0 {
                return Ok(true);
            }
            if chunk[..read].iter().any(|byte| *byte != 0) {
                return Ok(false);
            }
        }
    }

    fn read_record(&mut self) -> Result<FileRecord, FileError> {
        let expected_index = self.next_index;
        let remaining = self.file_len - self.offset;
        if remaining < FRAME_HEADER_LEN {
            return Err(self.torn(expected_index));
        }
        let mut frame = [0u8; FRAME_HEADER_LEN as usize];
        self.reader
            .read_exact(&mut frame)
            .map_err(|source| self.io("read record frame", source))?;
        let len = read_u32(&frame[0..4]);
        let stored_crc = read_u32(&frame[4..8]);
        let index = read_u64(&frame[8..16]);
        let term = read_u64(&frame[16..24]);

        if frame.iter().all(|byte| *byte == 0) && self.rest_is_zero()? {
            return Err(self.torn(expected_index));
        }
        if len > PAYLOAD_MAX_BYTES {
            return Err(self.bad_frame(
                expected_index,
                format!("declared length {len} exceeds the limit of {PAYLOAD_MAX_BYTES} bytes"),
            ));
        }
        if FRAME_HEADER_LEN + u64::from(len) > remaining {
            return Err(self.torn(expected_index));
        }
        let mut payload = vec![0u8; len as usize];
        self.reader
            .read_exact(&mut payload)
            .map_err(|source| self.io("read record payload", source))?;
        let computed_crc = record_crc(index, term, &payload);
        if computed_crc != stored_crc {
            return Err(FileError::BadChecksum {
                path: self.path.clone(),
                offset: self.offset,
                index: expected_index,
                stored: stored_crc,
                computed: computed_crc,
            });
        }
        if index != expected_index {
            return Err(self.bad_frame(
                expected_index,
                format!("index out of sequence: expected {expected_index}, found {index}"),
            ));
        }
        let hash = chain_hash(&self.head, index, term, &payload);
        let record = FileRecord {
            index,
            term,
            offset: self.offset,
            hash,
            payload,
        };
        self.head = hash;
        self.next_index = index + 1;
        self.offset += FRAME_HEADER_LEN + u64::from(len);
        Ok(record)
    }
}

impl Iterator for EventFileReader {
    type Item = Result<FileRecord, FileError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.finished || self.offset == self.file_len {
            self.finished = true;
            return None;
        }
        let result = self.read_record();
        if result.is_err() {
            self.finished = true;
        }
        Some(result)
    }
}

impl FileRecord {
    /// Decodes the record's batch; the error names the file, offset and index.
    pub fn decode_events_in(&self, path: &Path) -> Result<Vec<Event>, FileError> {
        decode_batch(&self.payload).map_err(|source| FileError::Codec {
            path: path.to_path_buf(),
            offset: self.offset,
            index: self.index,
            source,
        })
    }
}
