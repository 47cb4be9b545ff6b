//! gyre-log: the crate that owns Gyre's event log on disk.
//!
//! Today it holds two things, both pure byte formats with no domain logic:
//!
//! - [`codec`]: the event encoding of DESIGN.md §10. A batch of [`gyre_event::Event`]s becomes
//!   one protobuf `EventBatch` (schema: `proto/events.proto`, generated code in `gyre-proto`).
//!   Every record carries a stable kind number and a per-kind schema version; old versions are
//!   upcast on read, and golden files in `testdata/golden/` pin that old bytes stay readable.
//! - [`file`]: an append-only event file of CRC-framed, hash-chained records, one `EventBatch`
//!   per record. The framing is the one the Raft log segments use, so `gyre replay` reads a
//!   simulator's run and an exported log the same way.
//!
//! - [`raft`]: the Raft-replicated log — openraft 0.9.25 storage (segmented log store, snapshot
//!   files, a state machine folding batches into a [`raft::Projection`]) behind a thin adapter.

pub mod codec;
pub mod file;
pub mod raft;

pub use codec::{
    decode_batch, decode_batch_shared, encode_batch, encode_envelope, encode_record,
    validated_records, BodyError, CodecError,
};
pub use file::{
    AppendedRecord, ChainHash, EventFileReader, EventFileWriter, FileError, FileHeader, FileRecord,
    Recovered,
};
