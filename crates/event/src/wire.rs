//! A small byte writer and reader for projection snapshots: LEB128 varints, length-prefixed
//! bytes and strings, floats by their bits.
//!
//! The projections (`gyre-scheduler`, `gyre-trajectory`) encode their own state with these, and
//! `gyre-state` frames the result (magic, format version, checksum). This is the only encoding
//! helper in the pure crates; it lives here because both projection crates depend on
//! `gyre-event` and on nothing else they share.
//!
//! The reader never panics on any input: every read checks the remaining length first, names
//! the field it was reading and the absolute byte offset where it failed, and every count is
//! checked against the bytes left before anything is allocated for it. Encodings are canonical:
//! varints must be minimal and flags 0 or 1, so a decoder built on this reader can insist that
//! re-encoding what it accepted gives back the same bytes.

use std::fmt;

/// Why bytes could not be read, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WireError {
    /// Absolute byte offset (from the start of the whole encoding) where the bad value begins.
    pub offset: usize,
    /// The field being read, as a path (`scheduler.executions.engine`).
    pub field: &'static str,
    pub kind: WireErrorKind,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WireErrorKind {
    /// The input ends before the value does.
    Truncated {
        needed: usize,
        available: usize,
    },
    /// A varint longer than ten bytes, or past 64 bits.
    VarintOverflow,
    /// A varint with redundant trailing zero groups (the encoding is canonical).
    VarintNotMinimal,
    /// A value larger than its field allows.
    OutOfRange {
        value: u64,
        max: u64,
    },
    /// An enum or option tag this format does not define.
    UnknownTag {
        tag: u64,
    },
    /// A count that cannot fit in the bytes that remain.
    CountTooLarge {
        count: u64,
        remaining: usize,
    },
    InvalidUtf8,
    /// Map keys or set members not strictly increasing (duplicates or a non-canonical order).
    NotIncreasing,
    /// Bytes left over after the last field.
    TrailingBytes {
        count: usize,
    },
    /// Well-formed bytes describing a state that cannot exist (a child before its parent, an
    /// execution missing from its group).
    Inconsistent(String),
}

impl fmt::Display for WireErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireErrorKind::Truncated { needed, available } => write!(
                f,
                "truncated: {needed} more bytes needed, {available} available"
            ),
            WireErrorKind::VarintOverflow => f.write_str("varint overflows 64 bits"),
            WireErrorKind::VarintNotMinimal => f.write_str("varint is not minimally encoded"),
            WireErrorKind::OutOfRange { value, max } => {
                write!(f, "value {value} exceeds the field's maximum {max}")
            }
            WireErrorKind::UnknownTag { tag } => write!(f, "unknown tag {tag}"),
            WireErrorKind::CountTooLarge { count, remaining } => write!(
                f,
                "count {count} cannot fit in the {remaining} bytes that remain"
            ),
            WireErrorKind::InvalidUtf8 => f.write_str("string is not valid UTF-8"),
            WireErrorKind::NotIncreasing => f.write_str("keys are not strictly increasing"),
            WireErrorKind::TrailingBytes { count } => {
                write!(f, "{count} bytes left after the last field")
            }
            WireErrorKind::Inconsistent(message) => write!(f, "inconsistent state: {message}"),
        }
    }
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "at byte {}, field `{}`: {}",
            self.offset, self.field, self.kind
        )
    }
}

impl std::error::Error for WireError {}

/// Appends values to a growing byte vector.
#[derive(Clone, Debug, Default)]
pub struct Writer {
    bytes: Vec<u8>,
}

impl Writer {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    /// Bytes exactly as given, with no length (magic numbers, checksums).
    pub fn raw(&mut self, bytes: &[u8]) {
        self.bytes.extend_from_slice(bytes);
    }

    pub fn u8(&mut self, value: u8) {
        self.bytes.push(value);
    }

    pub fn bool(&mut self, value: bool) {
        self.bytes.push(value as u8);
    }

    /// Unsigned LEB128: seven bits per byte, least significant group first.
    pub fn varint(&mut self, mut value: u64) {
        while value >= 0x80 {
            self.bytes.push((value as u8 & 0x7f) | 0x80);
            value >>= 7;
        }
        self.bytes.push(value as u8);
    }

    pub fn u32(&mut self, value: u32) {
        self.varint(value as u64);
    }

    /// A count of the elements that follow.
    pub fn count(&mut self, count: usize) {
        self.varint(count as u64);
    }

    /// A member of a strictly increasing sequence: the first as is, each later one as its gap
    /// to the previous minus one (sorted ids cost a byte each).
    pub fn increasing(&mut self, previous: Option<u64>, value: u64) {
        match previous {
            None => self.varint(value),
            Some(previous) => {
                debug_assert!(value > previous, "increasing values only");
                self.varint(value.wrapping_sub(previous).wrapping_sub(1));
            }
        }
    }

    /// `None` as 0, `Some(v)` as 1 then v.
    pub fn option_varint(&mut self, value: Option<u64>) {
        match value {
            None => self.u8(0),
            Some(value) => {
                self.u8(1);
                self.varint(value);
            }
        }
    }

    /// `u32` values as varints, one after the other (the count is the caller's).
    pub fn u32s(&mut self, values: &[u32]) {
        self.bytes.reserve(values.len() * 3);
        for value in values {
            self.varint(*value as u64);
        }
    }

    /// `f32` values by their bits, one after the other (the count is the caller's).
    pub fn f32s(&mut self, values: &[f32]) {
        self.bytes.reserve(values.len() * 4);
        for value in values {
            self.f32(*value);
        }
    }

    pub fn f64(&mut self, value: f64) {
        self.bytes.extend_from_slice(&value.to_bits().to_le_bytes());
    }

    pub fn f32(&mut self, value: f32) {
        self.bytes.extend_from_slice(&value.to_bits().to_le_bytes());
    }

    /// Length-prefixed bytes.
    pub fn bytes(&mut self, value: &[u8]) {
        self.count(value.len());
        self.raw(value);
    }

    pub fn str(&mut self, value: &str) {
        self.bytes(value.as_bytes());
    }
}

/// Reads values back, checking every length against the bytes that remain.
#[derive(Clone, Debug)]
pub struct Reader<'a> {
    bytes: &'a [u8],
    position: usize,
    /// Offset of `bytes[0]` in the whole encoding, so errors name absolute offsets.
    base: usize,
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Self::with_base(bytes, 0)
    }

    /// A reader over a slice that starts `base` bytes into the whole encoding.
    pub fn with_base(bytes: &'a [u8], base: usize) -> Self {
        Self {
            bytes,
            position: 0,
            base,
        }
    }

    /// Absolute offset of the next byte to read.
    pub fn offset(&self) -> usize {
        self.base + self.position
    }

    pub fn remaining(&self) -> usize {
        self.bytes.len() - self.position
    }

    /// An error at the current offset.
    pub fn error(&self, field: &'static str, kind: WireErrorKind) -> WireError {
        self.error_at(self.offset(), field, kind)
    }

    /// An error at an earlier offset (where the value that turned out bad began).
    pub fn error_at(&self, offset: usize, field: &'static str, kind: WireErrorKind) -> WireError {
        WireError {
            offset,
            field,
            kind,
        }
    }

    /// Fails unless every byte was read.
    pub fn finish(&self, field: &'static str) -> Result<(), WireError> {
        match self.remaining() {
            0 => Ok(()),
            count => Err(self.error(field, WireErrorKind::TrailingBytes { count })),
        }
    }

    pub fn raw(&mut self, field: &'static str, count: usize) -> Result<&'a [u8], WireError> {
        if count > self.remaining() {
            return Err(self.error(
                field,
                WireErrorKind::Truncated {
                    needed: count,
                    available: self.remaining(),
                },
            ));
        }
        let slice = &self.bytes[self.position..self.position + count];
        self.position += count;
        Ok(slice)
    }

    pub fn u8(&mut self, field: &'static str) -> Result<u8, WireError> {
        Ok(self.raw(field, 1)?[0])
    }

    pub fn bool(&mut self, field: &'static str) -> Result<bool, WireError> {
        let start = self.offset();
        match self.u8(field)? {
            0 => Ok(false),
            1 => Ok(true),
            tag => Err(self.error_at(start, field, WireErrorKind::UnknownTag { tag: tag as u64 })),
        }
    }

    pub fn varint(&mut self, field: &'static str) -> Result<u64, WireError> {
        let start = self.offset();
        let rest = &self.bytes[self.position..];
        // The common case first: a value below 128 is one byte.
        if let Some(&byte) = rest.first() {
            if byte < 0x80 {
                self.position += 1;
                return Ok(byte as u64);
            }
        }
        let mut value: u64 = 0;
        for (index, &byte) in rest.iter().take(10).enumerate() {
            if index == 9 && byte > 1 {
                return Err(self.error_at(start, field, WireErrorKind::VarintOverflow));
            }
            value |= ((byte & 0x7f) as u64) << (7 * index);
            if byte & 0x80 == 0 {
                if byte == 0 && index > 0 {
                    return Err(self.error_at(start, field, WireErrorKind::VarintNotMinimal));
                }
                self.position += index + 1;
                return Ok(value);
            }
        }
        if rest.len() >= 10 {
            return Err(self.error_at(start, field, WireErrorKind::VarintOverflow));
        }
        Err(self.error_at(
            start,
            field,
            WireErrorKind::Truncated {
                needed: rest.len() + 1,
                available: rest.len(),
            },
        ))
    }

    pub fn u32(&mut self, field: &'static str) -> Result<u32, WireError> {
        let start = self.offset();
        let value = self.varint(field)?;
        u32::try_from(value).map_err(|_| {
            self.error_at(
                start,
                field,
                WireErrorKind::OutOfRange {
                    value,
                    max: u32::MAX as u64,
                },
            )
        })
    }

    /// A count of elements that each take at least `element_bytes_min` bytes; refused when they
    /// could not fit in what remains, so a caller may allocate `count` elements up front.
    pub fn count(
        &mut self,
        field: &'static str,
        element_bytes_min: usize,
    ) -> Result<usize, WireError> {
        let start = self.offset();
        let count = self.varint(field)?;
        let remaining = self.remaining();
        let fits = count
            .checked_mul(element_bytes_min.max(1) as u64)
            .is_some_and(|bytes| bytes <= remaining as u64);
        if !fits {
            return Err(self.error_at(
                start,
                field,
                WireErrorKind::CountTooLarge { count, remaining },
            ));
        }
        Ok(count as usize)
    }

    /// The next member of a strictly increasing sequence written by [`Writer::increasing`].
    pub fn increasing(
        &mut self,
        field: &'static str,
        previous: Option<u64>,
    ) -> Result<u64, WireError> {
        let start = self.offset();
        let encoded = self.varint(field)?;
        match previous {
            None => Ok(encoded),
            Some(previous) => previous
                .checked_add(1)
                .and_then(|next| next.checked_add(encoded))
                .ok_or_else(|| {
                    self.error_at(
                        start,
                        field,
                        WireErrorKind::OutOfRange {
                            value: encoded,
                            max: u64::MAX - previous.saturating_add(1),
                        },
                    )
                }),
        }
    }

    /// `count` varints that must each fit in a `u32`.
    pub fn u32s(&mut self, field: &'static str, count: usize) -> Result<Vec<u32>, WireError> {
        let mut values = Vec::with_capacity(count.min(self.remaining()));
        for _ in 0..count {
            values.push(self.u32(field)?);
        }
        Ok(values)
    }

    /// `count` floats by their bits.
    pub fn f32s(&mut self, field: &'static str, count: usize) -> Result<Vec<f32>, WireError> {
        let bytes = match count.checked_mul(4) {
            Some(length) => self.raw(field, length)?,
            None => {
                return Err(self.error(
                    field,
                    WireErrorKind::CountTooLarge {
                        count: count as u64,
                        remaining: self.remaining(),
                    },
                ))
            }
        };
        Ok(bytes
            .chunks_exact(4)
            .map(|chunk| {
                f32::from_bits(u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]))
            })
            .collect())
    }

    pub fn option_varint(&mut self, field: &'static str) -> Result<Option<u64>, WireError> {
        if self.bool(field)? {
            Ok(Some(self.varint(field)?))
        } else {
            Ok(None)
        }
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], WireError> {
        let mut array = [0u8; N];
        array.copy_from_slice(self.raw(field, N)?);
        Ok(array)
    }

    pub fn f64(&mut self, field: &'static str) -> Result<f64, WireError> {
        Ok(f64::from_bits(u64::from_le_bytes(self.array(field)?)))
    }

    pub fn f32(&mut self, field: &'static str) -> Result<f32, WireError> {
        Ok(f32::from_bits(u32::from_le_bytes(self.array(field)?)))
    }

    /// Length-prefixed bytes, borrowed from the input.
    pub fn bytes(&mut self, field: &'static str) -> Result<&'a [u8], WireError> {
        let count = self.count(field, 1)?;
        self.raw(field, count)
    }

    pub fn string(&mut self, field: &'static str) -> Result<String, WireError> {
        let start = self.offset();
        let bytes = self.bytes(field)?;
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|_| self.error_at(start, field, WireErrorKind::InvalidUtf8))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_round_trip_and_refuse_non_canonical_forms() {
        for value in [0, 1, 127, 128, 300, u32::MAX as u64, u64::MAX - 1, u64::MAX] {
            let mut writer = Writer::new();
            writer.varint(value);
            let bytes = writer.into_bytes();
            let mut reader = Reader::new(&bytes);
            assert_eq!(reader.varint("v"), Ok(value));
            assert_eq!(reader.finish("end"), Ok(()));
        }
        let overlong = Reader::new(&[0x80, 0x00]).varint("v").map_err(|e| e.kind);
        assert_eq!(overlong, Err(WireErrorKind::VarintNotMinimal));
        let too_wide = [0xff; 9].iter().copied().chain([0x02]).collect::<Vec<_>>();
        let overflow = Reader::new(&too_wide).varint("v").map_err(|e| e.kind);
        assert_eq!(overflow, Err(WireErrorKind::VarintOverflow));
        let cut = Reader::with_base(&[0x80], 7).varint("v");
        assert_eq!(cut.map_err(|e| e.offset), Err(7));
    }

    #[test]
    fn counts_are_bounded_by_the_remaining_bytes() {
        let mut writer = Writer::new();
        writer.count(3);
        writer.raw(&[1, 2, 3, 4, 5]);
        let bytes = writer.into_bytes();
        assert_eq!(Reader::new(&bytes).count("c", 1), Ok(3));
        let refused = Reader::new(&bytes).count("c", 2).map_err(|e| e.kind);
        assert_eq!(
            refused,
            Err(WireErrorKind::CountTooLarge {
                count: 3,
                remaining: 5
            })
        );
    }

    #[test]
    fn increasing_sequences_cannot_repeat() {
        let mut writer = Writer::new();
        writer.increasing(None, 5);
        writer.increasing(Some(5), 6);
        writer.increasing(Some(6), 100);
        let bytes = writer.into_bytes();
        let mut reader = Reader::new(&bytes);
        assert_eq!(reader.increasing("k", None), Ok(5));
        assert_eq!(reader.increasing("k", Some(5)), Ok(6));
        assert_eq!(reader.increasing("k", Some(6)), Ok(100));
        let wraps = Reader::new(&[0x01]).increasing("k", Some(u64::MAX - 1));
        assert!(wraps.is_err());
    }

    #[test]
    fn errors_name_field_and_offset() {
        let error = Reader::with_base(&[2], 40)
            .bool("scheduler.run_complete")
            .expect_err("2 is not a flag");
        assert_eq!(
            error.to_string(),
            "at byte 40, field `scheduler.run_complete`: unknown tag 2"
        );
    }
}
