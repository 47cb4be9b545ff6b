//! Request bodies a client compressed (`Content-Encoding`).
//!
//! The CLIs measured so far send plain JSON (they only *accept* compressed answers), but an
//! HTTP client may compress its request body, and Codex has a zstd request-compression switch.
//! A body the proxy cannot read as JSON would be a 400 that ends the harness's run, so the
//! codings HTTP clients use are decoded here: `gzip` (and `x-gzip`), `deflate` (zlib-wrapped as
//! RFC 9110 says, and the raw stream some clients send instead), `br` and `zstd`; `identity`
//! is nothing. Several codings (`gzip, zstd`) were applied in the order listed and are undone
//! in reverse.
//!
//! **Limits.** The compressed body is held to the body limit as it arrives (the server does
//! that); every decoded stage is held to the same limit here, so a small body that inflates to
//! gigabytes (a decompression bomb) is refused after `limit + 1` bytes, never held whole. The
//! zstd decoder also refuses frames whose window is over its default maximum before allocating.
//!
//! Pure: bytes in, bytes out, no IO.

use std::io::Read;

/// Content codings the proxy decodes, as named in an `Accept-Encoding` answer to a 415.
pub const SUPPORTED: &str = "gzip, deflate, br, zstd";

/// Codings one body may stack. Real clients apply one; each stage is a full pass over up to
/// the body limit, so a header listing hundreds would cost seconds of CPU per request.
pub const STACKED_MAX: usize = 3;

/// The largest zstd window accepted at a body limit of `limit`: the decoder holds a window
/// before it yields output, so a window far above the limit would be memory the limit never
/// sees. Encoders size the window to the content (or 8 MiB at most by default), so a body
/// within the limit fits.
fn zstd_window_max(limit: usize) -> u64 {
    (limit.max(1 << 20) as u64).min(ruzstd::decoding::DEFAULT_MAX_WINDOW_SIZE)
}

/// Why a compressed body could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// A coding the proxy does not decode (HTTP 415).
    #[error("content-encoding {0:?} is not supported (supported: {SUPPORTED})")]
    Unsupported(String),
    /// The decoded body is over the body limit (HTTP 413).
    #[error("the request body decoded from content-encoding {encoding} exceeds the limit of {limit} bytes")]
    TooLarge { encoding: String, limit: usize },
    /// The bytes are not a valid stream of that coding (HTTP 400).
    #[error("the request body is not valid {encoding} (content-encoding): {detail}")]
    Corrupt { encoding: String, detail: String },
}

/// The codings named by a `Content-Encoding` header value, in the order they were applied,
/// lowercased, without `identity`. A value that is not text is one unsupported coding.
pub fn codings(header: &[u8]) -> Result<Vec<String>, DecodeError> {
    let text = std::str::from_utf8(header)
        .map_err(|_| DecodeError::Unsupported(String::from_utf8_lossy(header).into_owned()))?;
    let mut codings = Vec::new();
    for coding in text.split(',') {
        let coding = coding.trim().to_ascii_lowercase();
        match coding.as_str() {
            "" | "identity" => {}
            "gzip" | "x-gzip" | "deflate" | "br" | "zstd" => codings.push(coding),
            _ => return Err(DecodeError::Unsupported(coding)),
        }
    }
    if codings.len() > STACKED_MAX {
        return Err(DecodeError::Unsupported(format!(
            "{} (more than {STACKED_MAX} stacked codings)",
            codings.join(", ")
        )));
    }
    Ok(codings)
}

/// Undoes the codings of a `Content-Encoding` header value on `body`. `Ok(None)` when there is
/// nothing to undo (no coding, or only `identity`): the caller keeps the body it has.
pub fn decode(header: &[u8], body: &[u8], limit: usize) -> Result<Option<Vec<u8>>, DecodeError> {
    let codings = codings(header)?;
    let Some((last, earlier)) = codings.split_last() else {
        return Ok(None);
    };
    let mut decoded = decode_one(last, body, limit)?;
    for coding in earlier.iter().rev() {
        decoded = decode_one(coding, &decoded, limit)?;
    }
    Ok(Some(decoded))
}

fn decode_one(coding: &str, body: &[u8], limit: usize) -> Result<Vec<u8>, DecodeError> {
    let corrupt = |detail: String| DecodeError::Corrupt {
        encoding: coding.to_string(),
        detail,
    };
    let out = match coding {
        "gzip" | "x-gzip" => read_capped(flate2::read::MultiGzDecoder::new(body), limit),
        "deflate" => {
            // RFC 9110's `deflate` is the zlib format; a raw deflate stream has no valid zlib
            // header (the check bits make a false match 1 in 31 and the method must be 8).
            if zlib_header(body) {
                read_capped(flate2::read::ZlibDecoder::new(body), limit)
            } else {
                read_capped(flate2::read::DeflateDecoder::new(body), limit)
            }
        }
        "br" => read_capped(
            brotli_decompressor::Decompressor::new(body, 64 << 10),
            limit,
        ),
        "zstd" => zstd_frames(body, limit),
        other => return Err(DecodeError::Unsupported(other.to_string())),
    };
    match out {
        Ok(Some(bytes)) => Ok(bytes),
        Ok(None) => Err(DecodeError::TooLarge {
            encoding: coding.to_string(),
            limit,
        }),
        Err(detail) => Err(corrupt(detail)),
    }
}

fn zlib_header(body: &[u8]) -> bool {
    match body {
        [cmf, flg, ..] => {
            cmf & 0x0f == 8 && cmf >> 4 <= 7 && (u16::from(*cmf) << 8 | u16::from(*flg)) % 31 == 0
        }
        _ => false,
    }
}

/// Reads `reader` to its end, or `None` past `limit` bytes.
fn read_capped(reader: impl Read, limit: usize) -> Result<Option<Vec<u8>>, String> {
    let mut out = Vec::new();
    reader
        .take(limit as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|error| error.to_string())?;
    // `read_to_end` grows by doubling: a kept body is charged its length, so hold no more.
    out.shrink_to_fit();
    Ok((out.len() <= limit).then_some(out))
}

/// One or more concatenated zstd frames (a stream may hold several, RFC 8878 §3.1).
fn zstd_frames(body: &[u8], limit: usize) -> Result<Option<Vec<u8>>, String> {
    let mut rest = body;
    let mut out = Vec::new();
    if rest.is_empty() {
        return Err("empty body".to_string());
    }
    while !rest.is_empty() {
        let at = body.len() - rest.len();
        let decoder = ruzstd::decoding::StreamingDecoder::new_with_max_window_size(
            &mut rest,
            zstd_window_max(limit),
        )
        .map_err(|error| format!("frame at byte {at}: {error}"))?;
        let room = limit - out.len();
        match read_capped(decoder, room)? {
            Some(frame) => out.extend_from_slice(&frame),
            None => return Ok(None),
        }
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use proptest::prelude::*;

    use super::*;

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(bytes).unwrap();
        encoder.finish().unwrap()
    }

    fn zlib(bytes: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(bytes).unwrap();
        encoder.finish().unwrap()
    }

    fn raw_deflate(bytes: &[u8]) -> Vec<u8> {
        let mut encoder =
            flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(bytes).unwrap();
        encoder.finish().unwrap()
    }

    fn zstd(bytes: &[u8]) -> Vec<u8> {
        ruzstd::encoding::compress_to_vec(bytes, ruzstd::encoding::CompressionLevel::Fastest)
    }

    const BODY: &[u8] =
        br#"{"model":"m","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}"#;

    #[test]
    fn each_coding_round_trips() {
        for (header, encoded) in [
            ("gzip", gzip(BODY)),
            ("x-gzip", gzip(BODY)),
            ("deflate", zlib(BODY)),
            ("deflate", raw_deflate(BODY)),
            ("zstd", zstd(BODY)),
            ("ZSTD", zstd(BODY)),
        ] {
            let decoded = decode(header.as_bytes(), &encoded, 1 << 20).unwrap();
            assert_eq!(decoded.as_deref(), Some(BODY), "{header}");
        }
    }

    #[test]
    fn brotli_from_a_fixed_stream() {
        // `brotli` (the encoder) is not a dependency: `BODY` as Google's reference encoder
        // (PyPI `brotli`, `brotli.compress(BODY, quality=11)`) writes it.
        const ENCODED: [u8; 74] = [
            0x1b, 0x48, 0x00, 0x30, 0xac, 0x8e, 0x77, 0x12, 0x6f, 0x18, 0x21, 0x21, 0x9e, 0xd5,
            0x1a, 0xb1, 0x38, 0x7c, 0x29, 0x82, 0xb7, 0x57, 0x36, 0x6d, 0xad, 0xc3, 0xd2, 0xd5,
            0x37, 0x45, 0x62, 0xb6, 0x52, 0x24, 0x2c, 0x2d, 0x45, 0xbe, 0xe6, 0x1c, 0xe3, 0x50,
            0x07, 0x91, 0x81, 0xb6, 0x6f, 0x90, 0xf3, 0xc1, 0x21, 0x67, 0xf0, 0x2d, 0x2d, 0xb8,
            0x62, 0x1a, 0x03, 0x2a, 0x95, 0xf9, 0x27, 0x99, 0x8f, 0x27, 0x30, 0x0a, 0x95, 0x88,
            0xff, 0xf7, 0xed, 0x3b,
        ];
        let decoded = decode(b"br", &ENCODED, 1 << 20).unwrap();
        assert_eq!(decoded.as_deref(), Some(BODY));
        let error = decode(b"br", &ENCODED, 16).unwrap_err();
        assert!(matches!(error, DecodeError::TooLarge { .. }));
    }

    #[test]
    fn identity_and_nothing_leave_the_body_alone() {
        assert_eq!(decode(b"", BODY, 16).unwrap(), None);
        assert_eq!(decode(b"identity", BODY, 16).unwrap(), None);
        assert_eq!(decode(b" identity , ", BODY, 16).unwrap(), None);
    }

    #[test]
    fn stacked_codings_are_undone_in_reverse() {
        let encoded = zstd(&gzip(BODY));
        let decoded = decode(b"gzip, zstd", &encoded, 1 << 20).unwrap();
        assert_eq!(decoded.as_deref(), Some(BODY));
        // In the wrong order the outer stream is not gzip.
        let error = decode(b"zstd, gzip", &encoded, 1 << 20).unwrap_err();
        assert!(matches!(&error, DecodeError::Corrupt { encoding, .. } if encoding == "gzip"));
    }

    #[test]
    fn concatenated_members_and_frames_are_one_body() {
        let mut members = gzip(b"{\"a\":");
        members.extend(gzip(b"1}"));
        assert_eq!(
            decode(b"gzip", &members, 64).unwrap().as_deref(),
            Some(&b"{\"a\":1}"[..])
        );
        let mut frames = zstd(b"{\"a\":");
        frames.extend(zstd(b"1}"));
        assert_eq!(
            decode(b"zstd", &frames, 64).unwrap().as_deref(),
            Some(&b"{\"a\":1}"[..])
        );
    }

    #[test]
    fn a_bomb_stops_at_the_limit() {
        let huge = vec![b' '; 8 << 20];
        for (header, encoded) in [("gzip", gzip(&huge)), ("zstd", zstd(&huge))] {
            assert!(encoded.len() < 64 << 10, "{header}: {}", encoded.len());
            let error = decode(header.as_bytes(), &encoded, 1 << 20).unwrap_err();
            assert_eq!(
                error,
                DecodeError::TooLarge {
                    encoding: header.to_string(),
                    limit: 1 << 20
                }
            );
            assert!(error
                .to_string()
                .contains("exceeds the limit of 1048576 bytes"));
        }
        // Exactly at the limit is fine.
        let decoded = decode(b"gzip", &gzip(&huge[..1 << 20]), 1 << 20).unwrap();
        assert_eq!(decoded.map(|body| body.len()), Some(1 << 20));
    }

    #[test]
    fn a_zstd_window_far_above_the_limit_is_refused_before_it_is_held() {
        // A frame header declaring a 128 MiB window (Window_Descriptor exponent 17), no
        // content size: the decoder would hold the window before yielding a byte.
        let mut frame = vec![0x28, 0xb5, 0x2f, 0xfd, 0x00, 17 << 3];
        // One raw, last block of 4 bytes.
        frame.extend_from_slice(&[0x21, 0x00, 0x00]);
        frame.extend_from_slice(b"{}  ");
        let error = decode(b"zstd", &frame, 1 << 20).unwrap_err();
        assert!(matches!(error, DecodeError::Corrupt { .. }), "{error:?}");
        assert!(error.to_string().contains("window"), "{error}");
    }

    #[test]
    fn more_than_three_stacked_codings_are_refused() {
        let error = decode(b"gzip, gzip, gzip, gzip", BODY, 1 << 20).unwrap_err();
        assert!(matches!(error, DecodeError::Unsupported(_)));
        assert!(
            error.to_string().contains("more than 3 stacked codings"),
            "{error}"
        );
        let three = gzip(&gzip(&gzip(BODY)));
        assert_eq!(
            decode(b"gzip, gzip, gzip", &three, 1 << 20)
                .unwrap()
                .as_deref(),
            Some(BODY)
        );
    }

    #[test]
    fn unknown_codings_are_named() {
        for (header, named) in [
            ("compress", "compress"),
            ("gzip, lzma", "lzma"),
            ("Snappy", "snappy"),
        ] {
            let error = decode(header.as_bytes(), BODY, 1 << 20).unwrap_err();
            assert_eq!(error, DecodeError::Unsupported(named.to_string()));
            assert!(error
                .to_string()
                .contains("supported: gzip, deflate, br, zstd"));
        }
        assert!(matches!(
            decode(&[0xff, 0xfe], BODY, 16),
            Err(DecodeError::Unsupported(_))
        ));
    }

    #[test]
    fn plain_json_sent_as_compressed_is_corrupt_not_a_panic() {
        for header in ["gzip", "deflate", "br", "zstd"] {
            let error = decode(header.as_bytes(), BODY, 1 << 20).unwrap_err();
            assert!(
                matches!(&error, DecodeError::Corrupt { encoding, .. } if encoding == header),
                "{header}: {error:?}"
            );
            assert!(error.to_string().contains(&format!("not valid {header}")));
        }
        assert!(matches!(
            decode(b"zstd", b"", 16),
            Err(DecodeError::Corrupt { .. })
        ));
    }

    proptest! {
        /// Any bytes under any coding: an answer or an error, never a panic, never more than
        /// the limit.
        #[test]
        fn arbitrary_bytes_never_panic(
            bytes in proptest::collection::vec(any::<u8>(), 0..512),
            coding in prop::sample::select(vec!["gzip", "deflate", "br", "zstd"]),
        ) {
            if let Ok(Some(decoded)) = decode(coding.as_bytes(), &bytes, 4096) {
                prop_assert!(decoded.len() <= 4096);
            }
        }

        /// Corrupting a valid stream: an answer or an error, never a panic.
        #[test]
        fn corrupted_streams_never_panic(
            body in proptest::collection::vec(any::<u8>(), 0..2048),
            flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
            zstd_coding in any::<bool>(),
        ) {
            let (coding, mut encoded) = if zstd_coding { ("zstd", zstd(&body)) } else { ("gzip", gzip(&body)) };
            for (at, byte) in flips {
                let at = at.index(encoded.len());
                encoded[at] ^= byte | 1;
            }
            let _ = decode(coding.as_bytes(), &encoded, 4096);
        }
    }
}
