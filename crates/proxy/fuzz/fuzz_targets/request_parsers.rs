//! Fuzz target: arbitrary bytes into the three request parsers, the content-coding decoders
//! and the output parser.
//!
//! A parser may reject, but never panic, and a rejection is always a 4xx whose body is the
//! API's error JSON. The proptest `hostile_requests` checks the same property in `cargo test`.
//! A body parsed incrementally against a previous one (`body::parse_body`, here the input and
//! a splice of it that shares a prefix) must equal the whole-document parse of the same bytes
//! with lone surrogate escapes replaced (`tests/it/incremental_body.rs` is the proptest twin).

#![no_main]

use bytes::Bytes;
use gyre_proxy::messages::Api;
use gyre_proxy::output::{parse_output, OutputFormat};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for api in [Api::Anthropic, Api::OpenAiChat, Api::OpenAiResponses] {
        if let Err(error) = gyre_proxy::parse_request(api, data) {
            assert!((400..500).contains(&error.status()), "{error:?}");
            let body: String = error.body();
            assert!(!body.is_empty());
        }
    }
    let half = data.len() / 2;
    let spliced: Vec<u8> = data[..data.len() * 3 / 4]
        .iter()
        .chain(&data[half..])
        .copied()
        .collect();
    let previous = gyre_proxy::body::parse_body(Api::Anthropic, Bytes::copy_from_slice(data), None);
    let incremental =
        gyre_proxy::body::parse_body(Api::Anthropic, Bytes::from(spliced.clone()), previous.ok());
    // The oracle reads the bytes as `parse_body` does: a JS client's lone UTF-16 surrogate
    // escape replaced (serde_json alone refuses it).
    let repaired = gyre_proxy::body::replace_lone_surrogates(Bytes::from(spliced.clone()));
    match serde_json::from_slice::<serde_json::Value>(&repaired) {
        Ok(whole) if whole.is_object() => {
            let parsed = incremental.expect("a JSON object parses incrementally too");
            assert_eq!(
                serde_json::to_string(parsed.value()).unwrap(),
                serde_json::to_string(&whole).unwrap()
            );
        }
        _ => assert!(incremental.is_err()),
    }
    // A compressed body: decoded within the limit or refused, never a panic.
    for coding in ["gzip", "deflate", "br", "zstd", "gzip, zstd"] {
        if let Ok(Some(decoded)) =
            gyre_proxy::content_encoding::decode(coding.as_bytes(), data, 1 << 20)
        {
            assert!(decoded.len() <= 1 << 20);
        }
    }
    if let Ok(text) = std::str::from_utf8(data) {
        for format in [
            OutputFormat::test_model(),
            OutputFormat::qwen(),
            OutputFormat::chatml_plain(),
        ] {
            let _ = parse_output(&format, text);
        }
    }
});
