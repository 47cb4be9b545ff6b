//! Hostile input to every request parser: arbitrary bytes, arbitrary JSON built from the APIs'
//! own vocabulary, and valid requests with one subtree replaced. The parsers must never panic,
//! and every rejection must be a 4xx in the API's own error shape. (The same property runs
//! unbounded under cargo-fuzz: `crates/proxy/fuzz`.)

use gyre_proxy::messages::Api;
use gyre_proxy::{parse_request, ApiError};
use proptest::prelude::*;
use serde_json::{json, Map, Value};

const APIS: [Api; 3] = [Api::Anthropic, Api::OpenAiChat, Api::OpenAiResponses];

fn assert_api_shaped(api: Api, error: &ApiError) -> Result<(), TestCaseError> {
    prop_assert_eq!(error.api, api);
    prop_assert!(
        (400..500).contains(&error.status()),
        "status {}",
        error.status()
    );
    prop_assert!(!error.message.is_empty());
    let body: Value =
        serde_json::from_str(&error.body()).map_err(|e| TestCaseError::fail(e.to_string()))?;
    match api {
        Api::Anthropic => {
            prop_assert_eq!(&body["type"], "error");
            prop_assert!(body["error"]["type"].is_string());
            prop_assert_eq!(
                body["error"]["message"].as_str(),
                Some(error.message.as_str())
            );
        }
        Api::OpenAiChat | Api::OpenAiResponses => {
            prop_assert!(body["error"]["type"].is_string());
            prop_assert_eq!(
                body["error"]["message"].as_str(),
                Some(error.message.as_str())
            );
            prop_assert!(body["error"].get("param").is_some());
            prop_assert!(body["error"].get("code").is_some());
        }
    }
    Ok(())
}

fn check_all(bytes: &[u8]) -> Result<(), TestCaseError> {
    for api in APIS {
        if let Err(error) = parse_request(api, bytes) {
            assert_api_shaped(api, &error)?;
        }
    }
    Ok(())
}

/// Keys and strings the three APIs use, so random JSON reaches deep into the parsers.
const WORDS: &[&str] = &[
    "model",
    "max_tokens",
    "messages",
    "system",
    "tools",
    "tool_choice",
    "stream",
    "role",
    "content",
    "type",
    "text",
    "thinking",
    "signature",
    "redacted_thinking",
    "data",
    "tool_use",
    "tool_result",
    "tool_use_id",
    "id",
    "name",
    "input",
    "input_schema",
    "is_error",
    "user",
    "assistant",
    "tool",
    "developer",
    "function",
    "arguments",
    "tool_calls",
    "tool_call_id",
    "image",
    "image_url",
    "input",
    "instructions",
    "message",
    "function_call",
    "function_call_output",
    "call_id",
    "output",
    "reasoning",
    "summary",
    "encrypted_content",
    "input_text",
    "output_text",
    "summary_text",
    "stream_options",
    "include_usage",
    "n",
    "stop",
    "stop_sequences",
    "temperature",
    "metadata",
    "user_id",
    "cache_control",
    "any",
    "auto",
    "none",
    "required",
    "enabled",
    "adaptive",
    "budget_tokens",
    "parameters",
    "custom",
];

fn word() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => proptest::sample::select(WORDS).prop_map(str::to_string),
        1 => ".{0,6}",
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (-1e6f64..1e6).prop_map(Value::from),
        Just(Value::from(u64::MAX)),
        Just(Value::from(1.5e300)),
        word().prop_map(Value::from),
    ];
    leaf.prop_recursive(6, 64, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::vec((word(), inner), 0..6)
                .prop_map(|pairs| Value::Object(pairs.into_iter().collect::<Map<String, Value>>())),
        ]
    })
}

fn valid_requests() -> Vec<Value> {
    vec![
        json!({"model": "m", "max_tokens": 9, "system": [{"type": "text", "text": "s"}],
               "messages": [
                   {"role": "user", "content": "go"},
                   {"role": "assistant", "content": [
                       {"type": "thinking", "thinking": "t", "signature": "s"},
                       {"type": "tool_use", "id": "a", "name": "Bash", "input": {"c": 1}}]},
                   {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": "ok"}]}],
               "tools": [{"name": "Bash", "input_schema": {"type": "object"}}]}),
        json!({"model": "m", "messages": [
                   {"role": "user", "content": "go"},
                   {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                   {"role": "tool", "tool_call_id": "c", "content": "r"}],
               "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}], "stream": true}),
        json!({"model": "m", "instructions": "i", "input": [
                   {"role": "user", "content": "go"},
                   {"type": "reasoning", "summary": [{"type": "summary_text", "text": "r"}], "encrypted_content": "E"},
                   {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                   {"type": "function_call_output", "call_id": "c", "output": "o"}],
               "tools": [{"type": "function", "name": "f"}]}),
    ]
}

fn size(value: &Value) -> usize {
    1 + match value {
        Value::Array(items) => items.iter().map(size).sum(),
        Value::Object(map) => map.values().map(size).sum(),
        _ => 0,
    }
}

/// Replaces the `target`-th node in pre-order (counting from the root) with `replacement`.
fn replace_nth(
    value: &mut Value,
    target: usize,
    counter: &mut usize,
    replacement: &mut Option<Value>,
) {
    if *counter == target {
        if let Some(new) = replacement.take() {
            *value = new;
        }
    }
    *counter += 1;
    match value {
        Value::Array(items) => items
            .iter_mut()
            .for_each(|item| replace_nth(item, target, counter, replacement)),
        Value::Object(map) => map
            .values_mut()
            .for_each(|item| replace_nth(item, target, counter, replacement)),
        _ => {}
    }
}

/// Replaces the subtree at a position chosen by `seed` with `replacement`.
fn mutate(value: &mut Value, seed: usize, replacement: Value) {
    let target = seed % size(value);
    replace_nth(value, target, &mut 0, &mut Some(replacement));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        check_all(&bytes)?;
    }

    #[test]
    fn arbitrary_json_never_panics(value in json_value()) {
        check_all(value.to_string().as_bytes())?;
    }

    #[test]
    fn mutated_valid_requests_never_panic(
        which in 0usize..3,
        seed in any::<usize>(),
        replacement in json_value(),
    ) {
        let mut request = valid_requests()[which].clone();
        mutate(&mut request, seed, replacement);
        check_all(request.to_string().as_bytes())?;
    }
}

#[test]
fn the_valid_requests_parse() {
    for (request, api) in valid_requests().iter().zip(APIS) {
        parse_request(api, request.to_string().as_bytes()).expect("a valid request parses");
    }
}

#[test]
fn deep_nesting_is_a_clean_rejection() {
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    for api in APIS {
        let error = parse_request(api, deep.as_bytes()).expect_err("too deep");
        assert!(
            error.message.contains("recursion limit"),
            "{}",
            error.message
        );
    }
    let deep_object = format!(
        "{{\"model\":\"m\",\"max_tokens\":1,\"messages\":{}{}}}",
        "[".repeat(120),
        "]".repeat(120)
    );
    let error = parse_request(Api::Anthropic, deep_object.as_bytes()).expect_err("rejected");
    assert_eq!(error.status(), 400);
}
