//! The vLLM adapter and fake, protocol details: the fake's wire format (prefixed request ids,
//! `token_id:` log-prob entries, finish reason on the last token's event), aborts by the
//! echoed id, `[DONE]` without a finish, malformed events naming the field, in-band errors.

use std::sync::Arc;

use gyre_proxy::engine::fake::{FakeFault, FakeOptions, FakeServer};
use gyre_proxy::engine::{
    collect, Collected, EngineFailure, FinishKind, TokenEngine, VllmConfig, VllmEngine,
};
use serde_json::{json, Value};

use crate::engine_support::{http, options, request, scripted, sse_data, within, SCRIPT};

async fn fake() -> FakeServer {
    let backing = scripted(SCRIPT, options("scripted"));
    FakeServer::vllm(Arc::new(backing), FakeOptions::default())
        .await
        .expect("the fake binds")
}

fn adapter(fake: &FakeServer) -> VllmEngine {
    VllmEngine::new(&fake.url(), VllmConfig::default()).expect("a valid address")
}

async fn through(events: &[Value]) -> Collected {
    let fake = fake().await;
    fake.inject(FakeFault::RawEvents(
        events.iter().map(Value::to_string).collect(),
    ));
    let engine = adapter(&fake);
    engine.set_policy_version(4);
    let stream = within(engine.generate(request("r1", None)))
        .await
        .expect("starts");
    within(collect(stream)).await
}

fn event(ids: &[u32], finish: Value) -> Value {
    let content: Vec<Value> = ids
        .iter()
        .map(|&id| json!({"token": format!("token_id:{id}"), "logprob": -(f64::from(id) / 10.0), "bytes": null, "top_logprobs": []}))
        .collect();
    json!({
        "request_id": "generate-tokens-r1",
        "choices": [{"index": 0, "logprobs": {"content": content}, "finish_reason": finish, "token_ids": ids}],
    })
}

#[tokio::test]
async fn the_fake_speaks_vllms_wire_format() {
    let fake = fake().await;
    let body = json!({
        "request_id": "wire-1",
        "token_ids": [1, 20, 30],
        "sampling_params": {"max_tokens": 7, "logprobs": 0, "temperature": 0.2},
        "stream": true,
    });
    let url = format!("{}/inference/v1/generate", fake.url());
    let (status, text) = http("POST", &url, &body.to_string()).await;
    assert_eq!(status, 200);
    let data = sse_data(&text);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let events: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|event| serde_json::from_str(event).expect("JSON events"))
        .collect();
    let mut total = 0;
    for (index, event) in events.iter().enumerate() {
        assert_eq!(event["request_id"], "generate-tokens-wire-1");
        let choice = &event["choices"][0];
        let ids = choice["token_ids"].as_array().expect("token_ids");
        assert!(!ids.is_empty(), "events without new tokens are not sent");
        total += ids.len();
        let content = choice["logprobs"]["content"].as_array().expect("content");
        for (entry, id) in content.iter().zip(ids) {
            assert_eq!(entry["token"], format!("token_id:{id}"));
            assert!(entry["logprob"].as_f64().expect("a number") < 0.0);
        }
        let last = index + 1 == events.len();
        assert_eq!(
            choice["finish_reason"],
            if last { json!("length") } else { Value::Null }
        );
    }
    assert_eq!(total, 7);

    // Without `logprobs` there are none; without `sampling_params` the request is refused.
    let body = json!({"token_ids": [1], "sampling_params": {"max_tokens": 2}});
    let (status, text) = http("POST", &url, &body.to_string()).await;
    assert_eq!(status, 200);
    let answer: Value = serde_json::from_str(&text).expect("JSON");
    assert!(answer["choices"][0]["logprobs"].is_null());
    assert_eq!(
        answer["choices"][0]["token_ids"].as_array().map(Vec::len),
        Some(2)
    );
    let (status, _) = http("POST", &url, &json!({"token_ids": [1]}).to_string()).await;
    assert_eq!(status, 400);
    let abort_url = format!("{}/abort_requests", fake.url());
    let (status, text) = http("POST", &abort_url, "{}").await;
    assert_eq!((status, text.contains("request_ids")), (400, true));
    let (status, _) = http(
        "POST",
        &abort_url,
        &json!({"request_ids": ["nope"]}).to_string(),
    )
    .await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn done_without_a_finish_is_an_abort() {
    let collected = through(&[event(&[5, 6], Value::Null), event(&[7], Value::Null)]).await;
    assert_eq!(collected.ids, vec![5, 6, 7]);
    assert_eq!(collected.logprobs, vec![-0.5, -0.6, -0.7]);
    assert_eq!(collected.end, Some(Ok((FinishKind::Abort, 4))));
    let collected = through(&[event(&[5], json!("stop"))]).await;
    assert_eq!(collected.end, Some(Ok((FinishKind::Stop, 4))));
    let usage_only =
        json!({"request_id": "generate-tokens-r1", "choices": [], "usage": {"prompt_tokens": 3}});
    let collected = through(&[
        event(&[5], Value::Null),
        usage_only,
        event(&[6], json!("length")),
    ])
    .await;
    assert_eq!(
        (collected.ids, collected.end),
        (vec![5, 6], Some(Ok((FinishKind::Length, 4))))
    );
}

#[tokio::test]
async fn malformed_events_are_protocol_failures_naming_the_field() {
    let good = event(&[5, 6], Value::Null);
    let mut wrong_token = good.clone();
    wrong_token["choices"][0]["logprobs"]["content"][1]["token"] = json!("token_id:9");
    let mut odd_token = good.clone();
    odd_token["choices"][0]["logprobs"]["content"][0]["token"] = json!("token_id:x");
    let mut no_logprobs = good.clone();
    no_logprobs["choices"][0]["logprobs"] = Value::Null;
    let mut bad_logprob = good.clone();
    bad_logprob["choices"][0]["logprobs"]["content"][0]["logprob"] = json!("low");
    let mut short = good.clone();
    short["choices"][0]["token_ids"] = json!([5]);
    let mut bad_ids = good.clone();
    bad_ids["choices"][0]["token_ids"] = json!([5, -6]);
    let mut two = good.clone();
    two["choices"] = json!([good["choices"][0], good["choices"][0]]);
    let cases: Vec<(Value, &str)> = vec![
        (
            wrong_token,
            "choices[0].logprobs.content[1].token: token_id:9 but token_ids[1] is 6",
        ),
        (
            odd_token,
            "choices[0].logprobs.content[0].token: not token_id:<integer>",
        ),
        (no_logprobs, "choices[0].logprobs: missing"),
        (bad_logprob, "choices[0].logprobs.content: invalid type"),
        (
            short,
            "choices[0].logprobs.content: 2 entries for 1 token_ids",
        ),
        (bad_ids, "choices[0].token_ids: invalid value"),
        (two, "choices: 2 choices, expected 1"),
        (json!({"request_id": "x"}), "choices: missing"),
        (json!({"choices": "none"}), "choices: invalid type"),
        (
            event(&[5], json!("weird")),
            "choices[0].finish_reason: unknown value \"weird\"",
        ),
        (json!("text"), "event: not a JSON object"),
    ];
    for (bad, expected) in cases {
        let collected = through(std::slice::from_ref(&bad)).await;
        match collected.failure() {
            Some(EngineFailure::Protocol { engine, message }) => {
                assert!(engine.starts_with("vllm@127.0.0.1:"), "{engine}");
                assert!(
                    message.starts_with(expected),
                    "{message:?} should start with {expected:?}"
                );
            }
            other => panic!("{bad}: expected a protocol failure, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn in_band_errors_are_failures() {
    for (bad, expected) in [
        (
            json!({"error": {"message": "engine dead", "type": "InternalServerError", "code": 500}}),
            "engine dead",
        ),
        (
            json!({"object": "error", "message": "old style", "code": 400}),
            "old style",
        ),
        (
            event(&[5], json!("error")),
            "choices[0].finish_reason: error",
        ),
    ] {
        let collected = through(&[bad]).await;
        match collected.failure() {
            Some(EngineFailure::Failed { message, .. }) => assert_eq!(message, expected),
            other => panic!("expected a failure, got {other:?}"),
        }
    }
}
