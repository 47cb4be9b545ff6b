//! `--context-tokens-max`: a prompt that leaves the engines' context no room for an answer is
//! refused in each API's own words (which Claude Code and Codex answer by compacting), with
//! nothing sent to the engine or recorded; an answer is cut to the room left.

use gyre_proxy::server::ServerConfig;
use serde_json::json;

use crate::in_process::{proxy_with, recording};

#[test]
fn a_prompt_the_context_cannot_hold_is_refused_in_the_apis_words() {
    let runtime = crate::support::runtime();
    let engine = recording();
    let window = 96;
    let proxy = proxy_with(
        &runtime,
        engine.clone(),
        ServerConfig {
            context_tokens_max: Some(window),
            ..ServerConfig::default()
        },
    );
    let long = "many words of an over-long tool output ".repeat(40);

    let (status, error) = proxy.post(
        "/v1/messages",
        &json!({"model": "m", "max_tokens": 64,
                "messages": [{"role": "user", "content": long}]}),
    );
    assert_eq!(status, 400, "{error}");
    assert_eq!(error["error"]["type"], "invalid_request_error", "{error}");
    let message = error["error"]["message"].as_str().expect("message");
    // What Claude Code matches: `^prompt is too long: \d+ tokens > \d+ maximum$`.
    let words: Vec<&str> = message.split(' ').collect();
    assert_eq!(
        (words[..4].join(" "), words[5..].join(" ")),
        (
            "prompt is too long:".to_string(),
            format!("tokens > {} maximum", window - 1)
        ),
        "{message}"
    );
    assert!(words[4].parse::<u32>().expect("a token count") > window - 1);

    let (status, error) = proxy.post(
        "/v1/chat/completions",
        &json!({"model": "m", "messages": [{"role": "user", "content": long}]}),
    );
    assert_eq!(status, 400, "{error}");
    assert_eq!(error["error"]["code"], "context_length_exceeded", "{error}");
    assert_eq!(error["error"]["param"], "messages", "{error}");
    let (status, error) = proxy.post(
        "/v1/responses",
        &json!({"model": "m", "input": long, "stream": true}),
    );
    assert_eq!(
        status, 400,
        "a streamed call is refused before its stream opens: {error}"
    );
    assert_eq!(error["error"]["code"], "context_length_exceeded", "{error}");
    assert!(
        proxy.sink.records().is_empty(),
        "nothing is recorded for a refused call"
    );
    assert!(
        engine.sampling.lock().expect("lock").is_empty(),
        "nothing reaches the engine"
    );
    assert!(
        proxy
            .metrics()
            .contains("gyre_proxy_context_too_long_total 3"),
        "{}",
        proxy.metrics()
    );

    // A prompt that fits gets an answer limit cut to the room left.
    let medium = "many words of a tool output ".repeat(4);
    let (status, answer) = proxy.post(
        "/v1/messages",
        &json!({"model": "m", "max_tokens": 64,
                "messages": [{"role": "user", "content": medium}]}),
    );
    assert_eq!(status, 200, "{answer}");
    let records = proxy.sink.records();
    assert_eq!(records.len(), 1);
    let prompt =
        (records[0].reused_prefix_tokens_count as usize + records[0].input_ids.len()) as u32;
    let asked = engine.max_new_tokens.lock().expect("lock").clone();
    assert_eq!(
        asked,
        [64.min(window - prompt)],
        "a prompt of {prompt} tokens"
    );
    assert!(
        window - prompt < 64,
        "the test's prompt ({prompt} tokens) leaves less room than asked"
    );
    let used = prompt as usize + records[0].output_ids.len();
    assert!(
        used <= window as usize,
        "{used} tokens in a window of {window}"
    );
}
