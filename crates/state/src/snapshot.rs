//! The snapshot encoding of [`ControlState`]: what a control node's Raft snapshot body holds, so
//! a restore decodes the projections instead of refolding the log.
//!
//! Layout: `GYRESNAP` (8 bytes), the format version (u32 little-endian), the body, then the
//! SHA-256 of everything before it (32 bytes). The body is the scheduler projection
//! (`SchedulerState::encode_into`), the trajectory buffer (`TrajectoryBuffer::encode_into`),
//! `events_applied` and (version 4 on) the stored responses, written with `gyre_event::wire`. The encoding is canonical: one state has
//! one encoding, so replicas that folded the same log write byte-identical snapshots, and
//! anything decoded from the current version re-encodes to the bytes it came from (a version-1
//! snapshot is brought to the current state on decode: consumed executions' trees retire).
//!
//! Decoding never panics: the magic and version are checked first (an unknown version is
//! refused by name, before anything else is trusted), then the checksum (so a flipped bit or a
//! truncation is refused as such), then every field is read with its remaining length checked,
//! naming the field and the byte offset of anything wrong. Allocation is bounded by the input
//! length. A change to any field's encoding, in any of the three crates, needs a new
//! [`SNAPSHOT_FORMAT_VERSION`].

use std::fmt;

use gyre_event::wire::{Reader, WireError, Writer};
use gyre_scheduler::SchedulerState;
use gyre_trajectory::TrajectoryBuffer;
use sha2::{Digest, Sha256};

use crate::{ControlState, StoredResponses};

/// The first eight bytes of every snapshot.
pub const SNAPSHOT_MAGIC: [u8; 8] = *b"GYRESNAP";

/// The format this build writes. It also reads version 1, written before consumed executions'
/// trees were retired (no retired section: every tree is live), version 2, written before
/// tree nodes kept their calls' stop sequences (none then), version 3, written before the
/// stored-responses section (none then), version 4, written before tree nodes kept how
/// many outputs an answer-format grammar constrained (none then), and version 5, written
/// before designated results were frozen (each is the one the old rule gives).
pub const SNAPSHOT_FORMAT_VERSION: u32 = 6;

/// The first version with the stored-responses section.
const RESPONSES_SINCE: u32 = 4;

/// The first version written after the scheduler learnt its resolutions from scoring (and
/// designations were frozen).
const FROZEN_DESIGNATIONS_SINCE: u32 = 6;

// The trajectory part is versioned with the snapshot: versions 1 to 3 are its formats 1 to 3,
// version 4 holds its format 3, version 5 its format 4 and version 6 its format 5.
const _: () = assert!(gyre_trajectory::TRAJECTORY_FORMAT == 5);

/// The trajectory part's format in a snapshot of `version`.
fn trajectory_format(version: u32) -> u32 {
    match version {
        0..=3 => version,
        4 => 3,
        5 => 4,
        _ => 5,
    }
}

/// The oldest format this build reads.
const OLDEST_READ_VERSION: u32 = 1;

const VERSION_BYTES: usize = 4;
const HEADER_BYTES: usize = SNAPSHOT_MAGIC.len() + VERSION_BYTES;
const CHECKSUM_BYTES: usize = 32;

/// Why bytes are not a snapshot this build can restore.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SnapshotDecodeError {
    /// Shorter than the fixed header and checksum.
    TooShort { length: usize },
    /// The first eight bytes are not `GYRESNAP`.
    BadMagic { found: [u8; 8] },
    /// Written by a build with another format version.
    UnsupportedVersion { found: u32, supported: u32 },
    /// The trailing SHA-256 does not match the bytes (a flipped bit or a truncation).
    ChecksumMismatch,
    /// The checksum matches but a field is malformed (a bug in the writer, or bytes made by hand).
    Malformed(WireError),
    /// The fields decode but the projections contradict each other.
    Inconsistent(String),
}

impl fmt::Display for SnapshotDecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SnapshotDecodeError::TooShort { length } => write!(
                f,
                "snapshot is {length} bytes, shorter than its {} byte header and checksum",
                HEADER_BYTES + CHECKSUM_BYTES
            ),
            SnapshotDecodeError::BadMagic { found } => write!(
                f,
                "not a control-state snapshot: starts with {found:02x?} instead of `GYRESNAP`"
            ),
            SnapshotDecodeError::UnsupportedVersion { found, supported } => write!(
                f,
                "snapshot format version {found} is not supported: this build reads versions \
                 {OLDEST_READ_VERSION} to {supported}"
            ),
            SnapshotDecodeError::ChecksumMismatch => {
                f.write_str("snapshot checksum mismatch: the bytes were corrupted or cut short")
            }
            SnapshotDecodeError::Malformed(error) => write!(f, "malformed snapshot {error}"),
            SnapshotDecodeError::Inconsistent(detail) => {
                write!(f, "inconsistent snapshot: {detail}")
            }
        }
    }
}

impl std::error::Error for SnapshotDecodeError {}

impl From<WireError> for SnapshotDecodeError {
    fn from(error: WireError) -> Self {
        SnapshotDecodeError::Malformed(error)
    }
}

fn checksum(bytes: &[u8]) -> [u8; CHECKSUM_BYTES] {
    Sha256::digest(bytes).into()
}

impl ControlState {
    /// The canonical, versioned snapshot encoding of every projection. Same state, same bytes.
    pub fn encode_snapshot(&self) -> Vec<u8> {
        let ControlState {
            scheduler,
            trajectories,
            responses,
            events_applied,
        } = self;
        let mut writer = Writer::new();
        writer.raw(&SNAPSHOT_MAGIC);
        writer.raw(&SNAPSHOT_FORMAT_VERSION.to_le_bytes());
        scheduler.encode_into(&mut writer);
        trajectories.encode_into(&mut writer);
        writer.varint(*events_applied);
        responses.encode_into(&mut writer);
        let mut bytes = writer.into_bytes();
        let sum = checksum(&bytes);
        bytes.extend_from_slice(&sum);
        bytes
    }

    /// Restores a state written by [`ControlState::encode_snapshot`]. Never panics, whatever the
    /// bytes; the error names what was wrong and, for a malformed field, its byte offset.
    pub fn decode_snapshot(bytes: &[u8]) -> Result<ControlState, SnapshotDecodeError> {
        if bytes.len() < HEADER_BYTES {
            return Err(SnapshotDecodeError::TooShort {
                length: bytes.len(),
            });
        }
        let (magic, rest) = bytes.split_at(SNAPSHOT_MAGIC.len());
        if magic != SNAPSHOT_MAGIC {
            let mut found = [0u8; 8];
            found.copy_from_slice(magic);
            return Err(SnapshotDecodeError::BadMagic { found });
        }
        let mut version = [0u8; VERSION_BYTES];
        version.copy_from_slice(&rest[..VERSION_BYTES]);
        let version = u32::from_le_bytes(version);
        if !(OLDEST_READ_VERSION..=SNAPSHOT_FORMAT_VERSION).contains(&version) {
            return Err(SnapshotDecodeError::UnsupportedVersion {
                found: version,
                supported: SNAPSHOT_FORMAT_VERSION,
            });
        }
        if bytes.len() < HEADER_BYTES + CHECKSUM_BYTES {
            return Err(SnapshotDecodeError::TooShort {
                length: bytes.len(),
            });
        }
        let (covered, sum) = bytes.split_at(bytes.len() - CHECKSUM_BYTES);
        if checksum(covered) != sum {
            return Err(SnapshotDecodeError::ChecksumMismatch);
        }
        let mut reader = Reader::with_base(&covered[HEADER_BYTES..], HEADER_BYTES);
        let scheduler = SchedulerState::decode_from(&mut reader)?;
        let mut trajectories =
            TrajectoryBuffer::decode_versioned(&mut reader, trajectory_format(version))?;
        if version == 1 {
            // Written before retirement: bring it to what a fold of the same log holds now.
            trajectories.retire_consumed(
                scheduler
                    .staleness
                    .iter()
                    .map(|record| (record.group, record.step)),
            );
        }
        let events_applied = reader.varint("events_applied")?;
        let responses = if version >= RESPONSES_SINCE {
            StoredResponses::decode_from(&mut reader)?
        } else {
            StoredResponses::default()
        };
        reader.finish("end of body")?;
        let mut state = ControlState {
            scheduler,
            trajectories,
            responses,
            events_applied,
        };
        if version < FROZEN_DESIGNATIONS_SINCE {
            // Written before the scheduler learnt its resolutions from scoring.
            state.reconcile_resolutions().map_err(|error| {
                SnapshotDecodeError::Inconsistent(format!(
                    "a version-{version} snapshot's scheduler and scoring do not reconcile: {error}"
                ))
            })?;
        }
        Ok(state)
    }
}
