//! Little-endian arrays in protobuf `bytes` fields: token ids as u32, log-probs as f32.
//!
//! Varint-packed repeated fields cost milliseconds per megabyte of tokens to decode; a raw
//! little-endian array is a length check and a copy (DESIGN.md §10).

use super::BodyError;

pub(crate) fn u32s_to_le(values: &[u32]) -> Vec<u8> {
    values
        .iter()
        .flat_map(|value| value.to_le_bytes())
        .collect()
}

pub(crate) fn f32s_to_le(values: &[f32]) -> Vec<u8> {
    values
        .iter()
        .flat_map(|value| value.to_le_bytes())
        .collect()
}

fn chunks4<'a>(
    field: &'static str,
    bytes: &'a [u8],
) -> Result<std::slice::ChunksExact<'a, u8>, BodyError> {
    let chunks = bytes.chunks_exact(4);
    if !chunks.remainder().is_empty() {
        return Err(BodyError::NotMultipleOf4 {
            field,
            length: bytes.len(),
        });
    }
    Ok(chunks)
}

fn array4(chunk: &[u8]) -> [u8; 4] {
    chunk
        .try_into()
        .expect("chunks_exact(4) yields slices of exactly 4 bytes")
}

pub(crate) fn le_to_u32s(field: &'static str, bytes: &[u8]) -> Result<Vec<u32>, BodyError> {
    Ok(chunks4(field, bytes)?
        .map(|chunk| u32::from_le_bytes(array4(chunk)))
        .collect())
}

/// Decodes f32 values bit-exactly (NaN payloads included).
pub(crate) fn le_to_f32s(field: &'static str, bytes: &[u8]) -> Result<Vec<f32>, BodyError> {
    Ok(chunks4(field, bytes)?
        .map(|chunk| f32::from_le_bytes(array4(chunk)))
        .collect())
}
