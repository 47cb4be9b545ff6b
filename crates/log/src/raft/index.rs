//! The in-memory index of the log: where every entry that is not purged lives.
//!
//! An entry is `Pending` from the moment `append` returns (so readers see it at once) until
//! the writer has written it; then it points at its record in a segment file. Reads of
//! written entries go to the file (`pread`), so multi-MB token records are not kept in memory.

use std::collections::VecDeque;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

use crate::file::{read_u32, read_u64, record_crc, FRAME_HEADER_LEN};

use super::error::RaftStoreError;
use super::record::decode_entry;
use super::types::{Entry, LogId};

/// A read-only handle on one segment file; stays valid after the file is deleted.
#[derive(Debug)]
pub(crate) struct SegmentFile {
    pub path: PathBuf,
    pub file: File,
}

impl SegmentFile {
    pub fn open(path: PathBuf) -> Result<Arc<Self>, RaftStoreError> {
        let file =
            File::open(&path).map_err(RaftStoreError::io(&path, "open segment for reading"))?;
        Ok(Arc::new(SegmentFile { path, file }))
    }

    /// Reads the record at `offset`, checks its frame and checksum, and rebuilds its entry.
    pub fn read_entry(
        &self,
        index: u64,
        offset: u64,
        payload_len: u32,
    ) -> Result<Entry, RaftStoreError> {
        let mut bytes = vec![0u8; FRAME_HEADER_LEN as usize + payload_len as usize];
        self.file
            .read_exact_at(&mut bytes, offset)
            .map_err(RaftStoreError::io(&self.path, "read record"))?;
        let corrupt = |detail: String| RaftStoreError::CorruptRecord {
            segment: self.path.clone(),
            offset,
            index,
            detail,
        };
        let len = read_u32(&bytes[0..4]);
        let stored_crc = read_u32(&bytes[4..8]);
        let found_index = read_u64(&bytes[8..16]);
        let term = read_u64(&bytes[16..24]);
        let payload = &bytes[FRAME_HEADER_LEN as usize..];
        if len != payload_len || found_index != index {
            return Err(corrupt(format!(
                "frame says index {found_index}, length {len}; expected index {index}, \
                 length {payload_len}"
            )));
        }
        let computed_crc = record_crc(index, term, payload);
        if computed_crc != stored_crc {
            return Err(corrupt(format!(
                "checksum mismatch (stored {stored_crc:#010x}, computed {computed_crc:#010x})"
            )));
        }
        decode_entry(index, term, payload).map_err(corrupt)
    }
}

#[derive(Clone, Debug)]
pub(crate) enum Place {
    /// Appended, not yet written by the writer.
    Pending(Arc<Entry>),
    Disk {
        segment: Arc<SegmentFile>,
        offset: u64,
        payload_len: u32,
        /// The entry as appended, kept after its write while the writer's cache budget
        /// allows: replication and apply read an entry right after it is written, and
        /// serving them from memory saves a `pread`, a CRC check and a copy per read.
        cached: Option<Arc<Entry>>,
    },
}

#[derive(Clone, Debug)]
pub(crate) struct Slot {
    pub log_id: LogId,
    pub place: Place,
    /// Payload bytes, for byte-bounded reads.
    pub payload_len: u32,
}

/// Entries `first .. first + slots.len()`, consecutive.
#[derive(Debug, Default)]
pub(crate) struct LogIndex {
    pub last_purged: Option<LogId>,
    pub first: u64,
    pub slots: VecDeque<Slot>,
}

impl LogIndex {
    pub fn last_log_id(&self) -> Option<LogId> {
        self.slots
            .back()
            .map(|slot| slot.log_id)
            .or(self.last_purged)
    }

    /// The index one past the last entry, if there is any entry.
    pub fn end(&self) -> u64 {
        self.first + self.slots.len() as u64
    }

    pub fn get(&self, index: u64) -> Option<&Slot> {
        if index < self.first {
            return None;
        }
        self.slots.get(usize::try_from(index - self.first).ok()?)
    }

    /// Makes `index` the next index to append. openraft never leaves a hole, so this is
    /// normally a no-op; an append that overlaps the end replaces the overlapped entries (as a
    /// conflict truncation would), and one past a hole restarts the index there. The second
    /// case is reported: on disk it leaves a hole that recovery refuses.
    pub fn make_room(&mut self, index: u64) -> Option<String> {
        if self.slots.is_empty() {
            self.first = index;
            return None;
        }
        let end = self.end();
        if index == end {
            return None;
        }
        if index < end {
            self.truncate_from(index);
            if self.slots.is_empty() {
                self.first = index;
            }
            None
        } else {
            self.slots.clear();
            self.first = index;
            Some(format!(
                "append at index {index} leaves a hole after index {}",
                end - 1
            ))
        }
    }

    pub fn push(&mut self, slot: Slot) {
        if self.slots.is_empty() {
            self.first = slot.log_id.index;
        }
        self.slots.push_back(slot);
    }

    /// Removes entries at `index` and after.
    pub fn truncate_from(&mut self, index: u64) {
        if index <= self.first {
            self.slots.clear();
        } else {
            let keep = usize::try_from(index - self.first).unwrap_or(usize::MAX);
            self.slots.truncate(keep);
        }
    }

    /// Removes entries up to `upto` inclusive and records it as purged.
    pub fn purge_upto(&mut self, upto: LogId) {
        while let Some(slot) = self.slots.front() {
            if slot.log_id.index > upto.index {
                break;
            }
            self.slots.pop_front();
            self.first += 1;
        }
        if self.slots.is_empty() {
            self.first = upto.index + 1;
        }
        if self
            .last_purged
            .is_none_or(|purged| purged.index < upto.index)
        {
            self.last_purged = Some(upto);
        }
    }
}
