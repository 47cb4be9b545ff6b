//! Fuzz target: arbitrary bytes into the three request parsers and the output parser.
//!
//! A parser may reject, but never panic, and a rejection is always a 4xx whose body is the
//! API's error JSON. The proptest `hostile_requests` checks the same property in `cargo test`.

#![no_main]

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
