//! Little-endian arrays in protobuf `bytes` fields: token ids as u32, log-probs as f32.
//!
//! Varint-packed repeated fields cost milliseconds per megabyte of tokens to decode; a raw
//! little-endian array is a length check and a copy (DESIGN.md §10).

use super::BodyError;

// Sized up front and filled 4 bytes at a time: `flat_map(..).collect()` has no exact size
// hint, so it grew the vector by doubling and pushed byte by byte (a MiB record re-copied
// ~20 times).
pub(crate) fn u32s_to_le(values: &[u32]) -> Vec<u8> {
    let mut out = vec![0u8; values.len() * 4];
    for (chunk, value) in out.chunks_exact_mut(4).zip(values) {
        chunk.copy_from_slice(&value.to_le_bytes());
    }
    out
}

pub(crate) fn f32s_to_le(values: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; values.len() * 4];
    for (chunk, value) in out.chunks_exact_mut(4).zip(values) {
        chunk.copy_from_slice(&value.to_le_bytes());
    }
    out
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
