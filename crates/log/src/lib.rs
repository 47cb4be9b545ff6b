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
//! The Raft log store, snapshots and the proposer arrive with the replicated-log work and build
//! on these modules.

pub mod codec;
pub mod file;

pub use codec::{decode_batch, encode_batch, BodyError, CodecError};
pub use file::{
    AppendedRecord, ChainHash, EventFileReader, EventFileWriter, FileError, FileHeader, FileRecord,
    Recovered,
};
