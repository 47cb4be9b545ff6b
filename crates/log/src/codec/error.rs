//! What can be wrong with bytes that claim to be an event batch.
//!
//! Every error names the position of the event in its batch, its kind and schema version where
//! they are known, and the field at fault, so that `gyre replay` can say exactly what it refused.

/// Why an encoded batch could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// The bytes are not an event batch at all.
    #[error(
        "not an event batch: bad magic (expected {expected:#010x} \"GYRE\", found {found:#010x})"
    )]
    BadMagic { expected: u32, found: u32 },
    /// The envelope starts like a batch but does not parse.
    #[error("event batch envelope is truncated or corrupt: {source}")]
    BadEnvelope { source: prost::DecodeError },
    #[error(
        "event batch format version {found} is not readable by this build (it reads {supported})"
    )]
    UnsupportedFormatVersion { found: u32, supported: u32 },
    #[error("event {position}: unknown kind {kind} (a newer writer, or corrupt bytes)")]
    UnknownKind { position: usize, kind: u32 },
    #[error(
        "event {position} ({kind}): schema version {found} is not readable by this build \
         (it reads versions {oldest}..={current})"
    )]
    UnsupportedSchemaVersion {
        position: usize,
        kind: &'static str,
        found: u32,
        oldest: u32,
        current: u32,
    },
    /// The body of one event is wrong.
    #[error("event {position} ({kind} v{schema_version}): {problem}")]
    Body {
        position: usize,
        kind: &'static str,
        schema_version: u32,
        problem: BodyError,
    },
}

/// What is wrong inside one event's body.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    #[error("body is truncated or not a valid protobuf message: {0}")]
    Protobuf(prost::DecodeError),
    /// Like `Protobuf`, found by the codec's own wire reader (see `codec::wire`).
    #[error("body is truncated or not a valid protobuf message: {message}: {detail}")]
    Malformed {
        message: &'static str,
        detail: &'static str,
    },
    #[error(
        "`{field}` holds {length} bytes, which is not a multiple of 4 \
         (it is an array of little-endian 4-byte values)"
    )]
    NotMultipleOf4 { field: &'static str, length: usize },
    #[error("`{field}` has invalid enum value {value}")]
    InvalidEnum { field: &'static str, value: i32 },
    #[error("`{field}` holds {found} bytes, expected exactly {expected}")]
    WrongLength {
        field: &'static str,
        expected: usize,
        found: usize,
    },
    #[error("`{field}` is invalid: {detail}")]
    InvalidValue { field: &'static str, detail: String },
}

impl From<prost::DecodeError> for BodyError {
    fn from(error: prost::DecodeError) -> Self {
        BodyError::Protobuf(error)
    }
}
