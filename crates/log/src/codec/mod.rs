//! The event codec: `[Event]` ↔ one protobuf `EventBatch` (DESIGN.md §10).
//!
//! Layout, defined in `proto/events.proto`: an `EventBatch { magic, format_version, records }`
//! envelope whose records are `EventRecord { kind, schema_version, at_nanos, body }`. The body is
//! the protobuf message of that kind at that schema version. The writer always writes current
//! versions; the reader accepts every version from 1 to current and upcasts (see [`upcast`]).
//!
//! Decoding never panics on arbitrary bytes: every way bytes can be wrong is a [`CodecError`]
//! naming the event's position, kind, version and field.

mod decode;
mod encode;
mod enums;
mod error;
mod kind;
mod tokens;
pub mod upcast;

use gyre_event::{Event, Timestamp};
use gyre_proto::events as pb;
use prost::Message;

pub use error::{BodyError, CodecError};
pub use kind::{
    current_schema_version, kind_from_number, kind_name, kind_of, ALL_KINDS, OLDEST_SCHEMA_VERSION,
};
pub use pb::EventKind;

/// "GYRE" read as a little-endian u32; the first field of every batch.
pub const BATCH_MAGIC: u32 = u32::from_le_bytes(*b"GYRE");
/// The envelope format this build writes and reads.
pub const BATCH_FORMAT_VERSION: u32 = 1;

/// Encodes events, in order, as one `EventBatch` at current schema versions.
pub fn encode_batch(events: &[Event]) -> Vec<u8> {
    encode_envelope(events.iter().map(encode_record).collect())
}

/// One event as its record, at the current schema version.
pub fn encode_record(event: &Event) -> pb::EventRecord {
    let kind = kind_of(&event.body);
    pb::EventRecord {
        kind: kind as u32,
        schema_version: current_schema_version(kind),
        at_nanos: event.at.nanos(),
        body: encode::encode_body(&event.body).into(),
    }
}

/// The records of a batch, each checked by decoding it completely (so a batch built from them
/// decodes wherever it is read), with bodies at the current schema version: a current body is
/// kept as the slice of `bytes` it came in (not re-encoded), an older one is upcast and
/// re-encoded. For the leader, which re-stamps `at` on records it did not write.
pub fn validated_records(bytes: &bytes::Bytes) -> Result<Vec<pb::EventRecord>, CodecError> {
    let batch = envelope_from(bytes, bytes.clone())?;
    batch
        .records
        .into_iter()
        .enumerate()
        .map(|(position, record)| {
            let current = kind_from_number(record.kind)
                .is_some_and(|kind| record.schema_version == current_schema_version(kind));
            let event = decode_record(position, record.clone())?;
            Ok(if current {
                record
            } else {
                encode_record(&event)
            })
        })
        .collect()
}

/// Wraps already-encoded records in the batch envelope. Used by [`encode_batch`] and by tools
/// (and tests) that need to write bodies at an old schema version.
pub fn encode_envelope(records: Vec<pb::EventRecord>) -> Vec<u8> {
    pb::EventBatch {
        magic: BATCH_MAGIC,
        format_version: BATCH_FORMAT_VERSION,
        records,
    }
    .encode_to_vec()
}

/// Decodes one `EventBatch`, upcasting old bodies to today's types.
pub fn decode_batch(bytes: &[u8]) -> Result<Vec<Event>, CodecError> {
    // One copy of the whole batch; every record body and token array is then a slice of it.
    decode_batch_shared(&bytes::Bytes::copy_from_slice(bytes))
}

/// [`decode_batch`] of a batch already in a `Bytes` (a Raft entry's payload): record bodies
/// and token arrays are slices of it, nothing is copied before the domain types.
pub fn decode_batch_shared(bytes: &bytes::Bytes) -> Result<Vec<Event>, CodecError> {
    let batch = envelope_from(bytes, bytes.clone())?;
    batch
        .records
        .into_iter()
        .enumerate()
        .map(|(position, record)| decode_record(position, record))
        .collect()
}

/// Decodes and checks the envelope only, leaving bodies encoded.
pub fn decode_envelope(bytes: &[u8]) -> Result<pb::EventBatch, CodecError> {
    envelope_from(bytes, bytes)
}

/// The envelope decoded from `buffer`, whose bytes are `bytes`.
fn envelope_from(bytes: &[u8], buffer: impl bytes::Buf) -> Result<pb::EventBatch, CodecError> {
    let batch = match pb::EventBatch::decode(buffer) {
        Ok(batch) => batch,
        Err(source) => {
            // Our writer puts the magic first (tag 0x0D, fixed32), so bytes that do not start
            // with it are not a batch at all; say so rather than report a protobuf detail.
            return Err(match leading_magic(bytes) {
                Some(BATCH_MAGIC) => CodecError::BadEnvelope { source },
                found => CodecError::BadMagic {
                    expected: BATCH_MAGIC,
                    found: found.unwrap_or(0),
                },
            });
        }
    };
    if batch.magic != BATCH_MAGIC {
        return Err(CodecError::BadMagic {
            expected: BATCH_MAGIC,
            found: batch.magic,
        });
    }
    if batch.format_version != BATCH_FORMAT_VERSION {
        return Err(CodecError::UnsupportedFormatVersion {
            found: batch.format_version,
            supported: BATCH_FORMAT_VERSION,
        });
    }
    Ok(batch)
}

/// The magic value if `bytes` begins with field 1 as fixed32, as our writer emits it.
fn leading_magic(bytes: &[u8]) -> Option<u32> {
    const MAGIC_TAG: u8 = (1 << 3) | 5; // field 1, wire type 5 (fixed32)
    match bytes {
        [MAGIC_TAG, a, b, c, d, ..] => Some(u32::from_le_bytes([*a, *b, *c, *d])),
        _ => None,
    }
}

fn decode_record(position: usize, record: pb::EventRecord) -> Result<Event, CodecError> {
    let kind = kind_from_number(record.kind).ok_or(CodecError::UnknownKind {
        position,
        kind: record.kind,
    })?;
    let current = current_schema_version(kind);
    let found = record.schema_version;
    let unsupported = || CodecError::UnsupportedSchemaVersion {
        position,
        kind: kind_name(kind),
        found,
        oldest: OLDEST_SCHEMA_VERSION,
        current,
    };
    if found < OLDEST_SCHEMA_VERSION || found > current {
        return Err(unsupported());
    }
    let body_error = |problem| CodecError::Body {
        position,
        kind: kind_name(kind),
        schema_version: found,
        problem,
    };
    let mut body = record.body;
    let mut version = found;
    while version < current {
        let step = upcast::upcaster(kind, version).ok_or_else(unsupported)?;
        body = (step.upcast)(&body).map_err(body_error)?.into();
        version += 1;
    }
    let body = decode::decode_body(kind, &body).map_err(body_error)?;
    Ok(Event {
        at: Timestamp(record.at_nanos),
        body,
    })
}
