//! A node's archived log: the segments its purges moved to `<dir>/archive/` (see `writer`,
//! `LogStoreOptions::archive`), read back together with the live log.
//!
//! A purge only archives this node's committed log (the purge point is in the log), so the
//! archived segments and the live ones form one chain, except across a restart of the log
//! behind a received snapshot: that segment's header is *detached* (its base hash unknown), and
//! nothing before it continues into it. [`log_segments`] therefore returns the segments from
//! the last detached one on (or from the first); readers verify the chain across them as
//! across any two segments.

use std::fs;
use std::path::{Path, PathBuf};

use crate::file::{chain_hash, ChainHash};

use super::error::RaftStoreError;
use super::segment::{parse_segment_file_name, read_segment_header};

/// Directory of archived segments, under a node's data directory.
pub const ARCHIVE_DIR: &str = "archive";

/// Where a segment lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SegmentHome {
    Archive,
    Log,
}

/// One segment of a data directory's log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogSegment {
    pub first_index: u64,
    pub path: PathBuf,
    pub home: SegmentHome,
}

/// Segment files in `dir` by first index (other files are ignored; a missing `dir` has none).
fn list(dir: &Path, home: SegmentHome) -> Result<Vec<LogSegment>, RaftStoreError> {
    let listing = match fs::read_dir(dir) {
        Ok(listing) => listing,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(RaftStoreError::io(dir, "list segments")(error)),
    };
    let mut segments = Vec::new();
    for entry in listing {
        let entry = entry.map_err(RaftStoreError::io(dir, "list segments"))?;
        if let Some(first_index) = parse_segment_file_name(&entry.file_name().to_string_lossy()) {
            segments.push(LogSegment {
                first_index,
                path: entry.path(),
                home,
            });
        }
    }
    segments.sort_by_key(|segment| segment.first_index);
    Ok(segments)
}

/// The segments of the data directory `dir` that form the longest log ending in its live log
/// (`dir/log`): archived segments before the live log's first, from the last segment whose
/// chain is detached (a restart behind a received snapshot) on. Archived segments at or after
/// the live log's first index are left out (they cannot belong to it).
pub fn log_segments(dir: &Path) -> Result<Vec<LogSegment>, RaftStoreError> {
    let live = list(&dir.join("log"), SegmentHome::Log)?;
    let live_first = live.first().map(|segment| segment.first_index);
    let mut segments: Vec<LogSegment> = list(&dir.join(ARCHIVE_DIR), SegmentHome::Archive)?
        .into_iter()
        .filter(|segment| live_first.is_none_or(|first| segment.first_index < first))
        .collect();
    segments.extend(live);
    let mut start = 0;
    for (position, segment) in segments.iter().enumerate() {
        if position > 0 && read_segment_header(&segment.path)?.detached() {
            start = position;
        }
    }
    Ok(segments.split_off(start))
}

/// Bytes and segment count of `dir/archive`.
pub fn archive_size(dir: &Path) -> Result<(u64, u64), RaftStoreError> {
    let mut bytes = 0;
    let mut count = 0;
    for segment in list(&dir.join(ARCHIVE_DIR), SegmentHome::Archive)? {
        // A segment deleted since it was listed (by hand, or a trim) holds nothing.
        let Some(len) = segment_len(&segment.path)? else {
            continue;
        };
        bytes += len;
        count += 1;
    }
    Ok((bytes, count))
}

/// The size of the segment file at `path`; `None` when it is gone.
fn segment_len(path: &Path) -> Result<Option<u64>, RaftStoreError> {
    match fs::metadata(path) {
        Ok(metadata) => Ok(Some(metadata.len())),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(RaftStoreError::io(path, "read segment size")(error)),
    }
}

/// What [`trim_archive`] did and left.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Trimmed {
    /// Archived segments deleted, and their bytes.
    pub deleted_segments: u64,
    pub deleted_bytes: u64,
    /// The archive after: bytes and segments.
    pub bytes: u64,
    pub segments: u64,
    /// First log index the archive still holds (none when empty).
    pub first_index: Option<u64>,
}

/// Keeps `dir/archive` within `bytes_max` bytes: deletes its oldest segments (lowest first
/// index) until the rest fit, and syncs the directory when it deleted any. The newest part of
/// the archive is what is kept: the entries just behind the live log.
pub fn trim_archive(dir: &Path, bytes_max: u64) -> Result<Trimmed, RaftStoreError> {
    let archive_dir = dir.join(ARCHIVE_DIR);
    let mut sized = Vec::new();
    let mut trimmed = Trimmed::default();
    for segment in list(&archive_dir, SegmentHome::Archive)? {
        let Some(bytes) = segment_len(&segment.path)? else {
            continue;
        };
        trimmed.bytes += bytes;
        trimmed.segments += 1;
        sized.push((segment, bytes));
    }
    let mut kept = sized.into_iter().peekable();
    while trimmed.bytes > bytes_max {
        let Some((segment, bytes)) = kept.next() else {
            break;
        };
        match fs::remove_file(&segment.path) {
            Ok(()) => {}
            // Gone already (an operator deleted it): it frees nothing more.
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => {
                return Err(RaftStoreError::io(&segment.path, "delete archived segment")(error))
            }
        }
        tracing::warn!(
            segment = %segment.path.display(),
            first_index = segment.first_index,
            bytes,
            bytes_max,
            "the archive is over its size limit: its oldest segment is deleted"
        );
        trimmed.bytes -= bytes;
        trimmed.segments -= 1;
        trimmed.deleted_bytes += bytes;
        trimmed.deleted_segments += 1;
    }
    trimmed.first_index = kept.peek().map(|(segment, _)| segment.first_index);
    if trimmed.deleted_segments > 0 {
        super::meta::sync_directory(&archive_dir)?;
    }
    Ok(trimmed)
}

/// One entry read from a segment file.
#[derive(Clone, Copy, Debug)]
pub struct FileEntry<'a> {
    pub index: u64,
    pub term: u64,
    /// The record's payload (see `record::split_payload`).
    pub payload: &'a [u8],
}

/// Why [`read_entries`] stopped before `before`.
enum Stop {
    /// `each` asked to stop, or `before` was reached.
    Done,
    Error(RaftStoreError),
}

/// Reads the entries `[from, before)` of the data directory `dir` from its segment files
/// (archived and live, as [`log_segments`] picks them), in index order, verifying each
/// record's checksum and the hash chain within and across segments, and calls `each` with
/// every one until it returns false. Entries before the first segment are not there to read:
/// the first entry delivered is then the first one the files hold. Returns the index after the
/// last entry delivered (`from` if none).
///
/// Meant for what the log store no longer serves (entries purged behind a snapshot) while the
/// node runs: a purge moving a segment to the archive while this reads is met by listing the
/// segments again.
pub fn read_entries(
    dir: &Path,
    from: u64,
    before: u64,
    mut each: impl FnMut(FileEntry<'_>) -> bool,
) -> Result<u64, RaftStoreError> {
    let mut next = from;
    // The chain value after the last entry delivered (None: nothing delivered yet).
    let mut head: Option<ChainHash> = None;
    let mut relisted = 0;
    'list: loop {
        if next >= before {
            return Ok(next);
        }
        let segments = match log_segments(dir) {
            Ok(segments) => segments,
            // A segment listed was moved to the archive before its header was read.
            Err(RaftStoreError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound && relisted < 8 =>
            {
                relisted += 1;
                continue 'list;
            }
            Err(error) => return Err(error),
        };
        // After entries were delivered, the files must still hold `next`: a segment the
        // archive's size limit deleted since (the read was relisting) is named as such, not
        // taken for a gap in the log.
        if head.is_some() {
            if let Some(first) = segments.first().map(|segment| segment.first_index) {
                if first > next {
                    return Err(RaftStoreError::Trimmed { next, first });
                }
            }
        }
        for (position, segment) in segments.iter().enumerate() {
            // Skip segments wholly before `next`.
            if segments
                .get(position + 1)
                .is_some_and(|following| following.first_index <= next)
            {
                continue;
            }
            let mut stop = None;
            // The scan chains records from the segment's base hash; whether that base continues
            // the entry delivered before is checked at the segment's first delivered record.
            let mut continued = false;
            let scan = super::segment::scan_segment(&segment.path, |record, payload| {
                if record.index < next {
                    return Ok(());
                }
                if record.index >= before {
                    stop = Some(Stop::Done);
                    return Err(stop_scan());
                }
                if head.is_some() && record.index != next {
                    stop = Some(Stop::Error(RaftStoreError::BadLog {
                        dir: dir.to_path_buf(),
                        detail: format!(
                            "{} holds entry {} where entry {next} was expected: the segments do \
                             not continue each other",
                            segment.path.display(),
                            record.index
                        ),
                    }));
                    return Err(stop_scan());
                }
                if let (Some(previous), false) = (head, continued) {
                    let expected = chain_hash(&previous, record.index, record.term, payload);
                    if expected != record.hash {
                        stop = Some(Stop::Error(RaftStoreError::BadLog {
                            dir: dir.to_path_buf(),
                            detail: format!(
                                "{} entry {}: the hash chain does not continue from entry {}",
                                segment.path.display(),
                                record.index,
                                next - 1
                            ),
                        }));
                        return Err(stop_scan());
                    }
                }
                if !each(FileEntry {
                    index: record.index,
                    term: record.term,
                    payload,
                }) {
                    stop = Some(Stop::Done);
                    return Err(stop_scan());
                }
                continued = true;
                head = Some(record.hash);
                next = record.index + 1;
                if next >= before {
                    // Done: the record after `before` may be one the writer is appending.
                    stop = Some(Stop::Done);
                    return Err(stop_scan());
                }
                Ok(())
            });
            match (stop, scan) {
                (Some(Stop::Done), _) => return Ok(next),
                (Some(Stop::Error(error)), _) => return Err(error),
                (None, Ok(_)) => {}
                (None, Err(RaftStoreError::Io { source, .. }))
                    if source.kind() == std::io::ErrorKind::NotFound && relisted < 8 =>
                {
                    // Moved to the archive since it was listed (or deleted from it).
                    relisted += 1;
                    continue 'list;
                }
                (None, Err(error)) => return Err(error),
            }
        }
        return Ok(next);
    }
}

/// The error a scan callback returns to stop the scan early (never reported).
fn stop_scan() -> RaftStoreError {
    RaftStoreError::Raft {
        detail: "scan stopped".into(),
    }
}
