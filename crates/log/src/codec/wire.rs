//! A protobuf wire-format reader over a byte slice, for the hot bodies decoded without prost.
//!
//! Folding a batch decodes every `ModelCall` record, on every replica and again at each replay.
//! prost builds an intermediate message whose `bytes` fields are reference-counted slices of the
//! batch (an atomic increment and decrement each) before the domain types copy them out; this
//! reader hands out plain sub-slices instead, so a record is read straight into its domain type.
//!
//! It accepts exactly what prost 0.14 accepts for the same message, with the same rules: varints
//! of at most 10 bytes (the 10th at most 1), keys at most `u32::MAX` with a tag of at least 1,
//! wire types 0–5, the wire type a known field declares, unknown fields (groups included, nested
//! at most 100 deep) skipped, and for a field that appears twice the last value (a repeated
//! field collects every occurrence). The codec's property tests check the equivalence on
//! arbitrary and on mutated bytes.

use super::BodyError;

/// prost's `RECURSION_LIMIT`: how deep nested messages and groups may go.
const RECURSION_LIMIT: u32 = 100;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WireType {
    Varint,
    SixtyFourBit,
    LengthDelimited,
    StartGroup,
    EndGroup,
    ThirtyTwoBit,
}

pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    /// What the message is, for errors (`model_call`, `model_call.input_provenance`).
    message: &'static str,
    depth_left: u32,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8], message: &'static str) -> Self {
        Reader {
            bytes,
            message,
            depth_left: RECURSION_LIMIT,
        }
    }

    /// A reader for a nested message, one level deeper than `self`.
    pub(crate) fn nested(&self, bytes: &'a [u8], message: &'static str) -> Result<Self, BodyError> {
        if self.depth_left == 0 {
            return Err(self.malformed("messages nested more than 100 deep"));
        }
        Ok(Reader {
            bytes,
            message,
            depth_left: self.depth_left - 1,
        })
    }

    pub(crate) fn malformed(&self, detail: &'static str) -> BodyError {
        BodyError::Malformed {
            message: self.message,
            detail,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    pub(crate) fn varint(&mut self) -> Result<u64, BodyError> {
        let mut value = 0u64;
        for (count, &byte) in self.bytes.iter().take(10).enumerate() {
            value |= u64::from(byte & 0x7f) << (count * 7);
            if byte < 0x80 {
                if count == 9 && byte > 1 {
                    break;
                }
                self.bytes = &self.bytes[count + 1..];
                return Ok(value);
            }
        }
        Err(self.malformed("invalid varint"))
    }

    /// A known fixed32 field's value, after checking the wire type its key came with.
    pub(crate) fn fixed32_field(&mut self, wire_type: WireType) -> Result<u32, BodyError> {
        self.expect(wire_type, WireType::ThirtyTwoBit)?;
        let bytes = self.take(4)?;
        Ok(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    /// The next field's tag and wire type.
    pub(crate) fn key(&mut self) -> Result<(u32, WireType), BodyError> {
        let key = self.varint()?;
        let key = u32::try_from(key).map_err(|_| self.malformed("invalid key value"))?;
        let wire_type = match key & 7 {
            0 => WireType::Varint,
            1 => WireType::SixtyFourBit,
            2 => WireType::LengthDelimited,
            3 => WireType::StartGroup,
            4 => WireType::EndGroup,
            5 => WireType::ThirtyTwoBit,
            _ => return Err(self.malformed("invalid wire type value")),
        };
        let tag = key >> 3;
        if tag == 0 {
            return Err(self.malformed("invalid tag value: 0"));
        }
        Ok((tag, wire_type))
    }

    fn take(&mut self, length: u64) -> Result<&'a [u8], BodyError> {
        let length = usize::try_from(length)
            .ok()
            .filter(|length| *length <= self.bytes.len())
            .ok_or_else(|| self.malformed("buffer underflow"))?;
        let (taken, rest) = self.bytes.split_at(length);
        self.bytes = rest;
        Ok(taken)
    }

    /// A length-delimited field's bytes.
    pub(crate) fn delimited(&mut self) -> Result<&'a [u8], BodyError> {
        let length = self.varint()?;
        self.take(length)
    }

    /// Checks that a known field came with the wire type its declaration implies.
    pub(crate) fn expect(&self, found: WireType, expected: WireType) -> Result<(), BodyError> {
        if found == expected {
            Ok(())
        } else {
            Err(self.malformed("invalid wire type for the field"))
        }
    }

    /// A known varint field's value, after checking the wire type its key came with.
    pub(crate) fn varint_field(&mut self, wire_type: WireType) -> Result<u64, BodyError> {
        self.expect(wire_type, WireType::Varint)?;
        self.varint()
    }

    /// A known length-delimited field's bytes, after checking the wire type its key came with.
    pub(crate) fn bytes_field(&mut self, wire_type: WireType) -> Result<&'a [u8], BodyError> {
        self.expect(wire_type, WireType::LengthDelimited)?;
        self.delimited()
    }

    /// Skips an unknown field whose key has just been read.
    pub(crate) fn skip(&mut self, tag: u32, wire_type: WireType) -> Result<(), BodyError> {
        self.skip_at(tag, wire_type, self.depth_left)
    }

    fn skip_at(&mut self, tag: u32, wire_type: WireType, depth_left: u32) -> Result<(), BodyError> {
        if depth_left == 0 {
            return Err(self.malformed("groups nested more than 100 deep"));
        }
        match wire_type {
            WireType::Varint => {
                self.varint()?;
            }
            WireType::SixtyFourBit => {
                self.take(8)?;
            }
            WireType::ThirtyTwoBit => {
                self.take(4)?;
            }
            WireType::LengthDelimited => {
                self.delimited()?;
            }
            WireType::StartGroup => loop {
                let (inner_tag, inner_wire_type) = self.key()?;
                if inner_wire_type == WireType::EndGroup {
                    if inner_tag != tag {
                        return Err(self.malformed("unexpected end group tag"));
                    }
                    break;
                }
                self.skip_at(inner_tag, inner_wire_type, depth_left - 1)?;
            },
            WireType::EndGroup => return Err(self.malformed("unexpected end group tag")),
        }
        Ok(())
    }
}
