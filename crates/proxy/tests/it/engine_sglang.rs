//! The SGLang adapter and fake, protocol details: the fake's cumulative wire format,
//! cumulative → delta conversion of hand-written streams, weight versions, malformed events
//! naming the field, in-band errors, HTTP statuses, timeouts and bad addresses.

use std::sync::Arc;

use gyre_proxy::engine::fake::{FakeFault, FakeOptions, FakeServer};
use gyre_proxy::engine::{
    collect, Collected, EngineChunk, EngineFailure, Fault, FinishKind, HttpEngineConfig,
    SglangConfig, SglangEngine, TokenEngine,
};
use serde_json::{json, Value};

use crate::engine_support::{http, options, request, scripted, sse_data, within, SCRIPT};

async fn fake() -> FakeServer {
    let backing = scripted(SCRIPT, options("scripted"));
    FakeServer::sglang(Arc::new(backing), FakeOptions::default())
        .await
        .expect("the fake binds")
}

fn adapter(fake: &FakeServer) -> SglangEngine {
    SglangEngine::new(&fake.url(), SglangConfig::default()).expect("a valid address")
}

/// Serves `events` (then `[DONE]`) and reads them through the adapter.
async fn through(events: &[Value]) -> Collected {
    let fake = fake().await;
    fake.inject(FakeFault::RawEvents(
        events.iter().map(Value::to_string).collect(),
    ));
    let stream = within(adapter(&fake).generate(request("r1", None)))
        .await
        .expect("starts");
    within(collect(stream)).await
}

fn event(ids: &[u32], finish: Value, weight_version: &str) -> Value {
    let logprobs: Vec<Value> = ids
        .iter()
        .map(|&id| json!([-(f64::from(id) / 100.0), id, null]))
        .collect();
    json!({
        "text": "",
        "output_ids": ids,
        "meta_info": {
            "id": "r1",
            "finish_reason": finish,
            "prompt_tokens": 3,
            "completion_tokens": ids.len(),
            "weight_version": weight_version,
            "output_token_logprobs": logprobs,
        },
    })
}

#[tokio::test]
async fn the_fake_streams_cumulative_events_as_sglang_does() {
    let fake = fake().await;
    let body = json!({
        "rid": "wire-1",
        "input_ids": [1, 20, 30],
        "sampling_params": {"max_new_tokens": 8, "temperature": 0.5, "stop_token_ids": [2]},
        "return_logprob": true,
        "stream": true,
    });
    let (status, text) = http(
        "POST",
        &format!("{}/generate", fake.url()),
        &body.to_string(),
    )
    .await;
    assert_eq!(status, 200);
    let data = sse_data(&text);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let events: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|event| serde_json::from_str(event).expect("JSON events"))
        .collect();
    assert!(events.len() >= 3);
    let mut previous: Vec<Value> = Vec::new();
    for event in &events {
        let ids = event["output_ids"].as_array().expect("output_ids").clone();
        assert!(ids.starts_with(&previous), "cumulative: {event}");
        let logprob_ids: Vec<Value> = event["meta_info"]["output_token_logprobs"]
            .as_array()
            .expect("logprobs")
            .iter()
            .map(|entry| entry[1].clone())
            .collect();
        assert_eq!(logprob_ids, ids);
        assert_eq!(event["meta_info"]["id"], "wire-1");
        previous = ids;
    }
    let last = events.last().expect("events");
    assert_eq!(
        last["meta_info"]["finish_reason"],
        json!({"type": "length", "length": 8})
    );
    assert_eq!(last["meta_info"]["completion_tokens"], 8);
    assert_eq!(last["meta_info"]["weight_version"], "0");
    assert!(events[0]["meta_info"]["finish_reason"].is_null());

    let (status, text) = http(
        "POST",
        &format!("{}/generate", fake.url()),
        &json!({"text": "hello"}).to_string(),
    )
    .await;
    assert_eq!(status, 400, "{text}");
    let (status, _) = http("GET", &format!("{}/health_generate", fake.url()), "").await;
    assert_eq!(status, 200);
    assert_eq!(fake.stats().generate_requests, 2);
}

#[tokio::test]
async fn cumulative_events_become_deltas() {
    let collected = through(&[
        event(&[11, 12], Value::Null, "default"),
        event(&[11, 12], Value::Null, "default"),
        event(&[11, 12, 13], Value::Null, "default"),
        event(
            &[11, 12, 13, 14, 15],
            json!({"type": "length", "length": 5}),
            "12",
        ),
    ])
    .await;
    assert_eq!(collected.ids, vec![11, 12, 13, 14, 15]);
    assert_eq!(collected.logprobs, vec![-0.11, -0.12, -0.13, -0.14, -0.15]);
    assert_eq!(
        collected.chunks_count, 3,
        "an event with no new ids adds no chunk"
    );
    assert_eq!(collected.end, Some(Ok((FinishKind::Length, 12))));

    let collected = through(&[event(
        &[5],
        json!({"type": "stop", "matched": 5}),
        "default",
    )])
    .await;
    assert_eq!(
        collected.end,
        Some(Ok((FinishKind::Stop, 0))),
        "a non-integer weight version is 0"
    );
    let collected = through(&[event(&[], json!({"type": "abort", "message": "x"}), "3")]).await;
    assert_eq!(
        (collected.ids.len(), collected.end),
        (0, Some(Ok((FinishKind::Abort, 3))))
    );
}

#[tokio::test]
async fn malformed_events_are_protocol_failures_naming_the_field() {
    let good = event(&[5, 6], Value::Null, "default");
    let mut bad_logprob = good.clone();
    bad_logprob["meta_info"]["output_token_logprobs"] = json!([["a", 5, null], [-0.1, 6, null]]);
    let mut wrong_id = good.clone();
    wrong_id["meta_info"]["output_token_logprobs"] = json!([[-0.1, 5, null], [-0.1, 7, null]]);
    let mut short = good.clone();
    short["meta_info"]["output_token_logprobs"] = json!([[-0.1, 5, null]]);
    let mut no_logprobs = good.clone();
    no_logprobs["meta_info"]
        .as_object_mut()
        .expect("meta_info")
        .remove("output_token_logprobs");
    let cases: Vec<(Vec<Value>, &str)> = vec![
        (
            vec![json!({"output_ids": "5", "meta_info": {}})],
            "output_ids: invalid type",
        ),
        (vec![json!({"meta_info": {}})], "output_ids: missing"),
        (vec![json!({"output_ids": [5]})], "meta_info: missing"),
        (
            vec![bad_logprob],
            "meta_info.output_token_logprobs: invalid type",
        ),
        (
            vec![no_logprobs],
            "meta_info.output_token_logprobs: missing",
        ),
        (
            vec![wrong_id],
            "meta_info.output_token_logprobs[1]: token id 7 but output_ids[1] is 6",
        ),
        (
            vec![short],
            "meta_info.output_token_logprobs: 1 entries for 2 output_ids",
        ),
        (
            vec![good.clone(), event(&[5], Value::Null, "default")],
            "output_ids: a cumulative event has 1 ids after 2 were streamed",
        ),
        (
            vec![good.clone(), event(&[9, 6, 7], Value::Null, "default")],
            "output_ids: a cumulative event changed ids already streamed",
        ),
        (
            vec![event(&[5], json!({"type": "eos"}), "default")],
            "meta_info.finish_reason.type: unknown value \"eos\"",
        ),
        (
            vec![event(&[5], json!("stop"), "default")],
            "meta_info.finish_reason: invalid type",
        ),
        (
            vec![good.clone()],
            "meta_info.finish_reason: the stream ended ([DONE])",
        ),
        (vec![json!([1, 2])], "event: not a JSON object"),
        (vec![json!(-1.5)], "event: not a JSON object"),
    ];
    for (events, expected) in cases {
        let collected = through(&events).await;
        match collected.failure() {
            Some(EngineFailure::Protocol { engine, message }) => {
                assert!(engine.starts_with("sglang@127.0.0.1:"), "{engine}");
                assert!(
                    message.starts_with(expected),
                    "{message:?} should start with {expected:?}"
                );
            }
            other => panic!("{events:?}: expected a protocol failure, got {other:?}"),
        }
    }
    // Not JSON at all.
    let fake = fake().await;
    fake.inject(FakeFault::RawEvents(vec!["{\"output_ids\": [1,".into()]));
    let collected = within(collect(
        adapter(&fake)
            .generate(request("r1", None))
            .await
            .expect("starts"),
    ))
    .await;
    assert!(
        matches!(collected.failure(), Some(EngineFailure::Protocol { message, .. }) if message.starts_with("event: not a JSON object")),
        "{:?}",
        collected.end
    );
}

#[tokio::test]
async fn engine_errors_and_statuses() {
    let collected = through(&[json!({"error": {"message": "The input (40000 tokens) is longer than the model's context length"}})]).await;
    assert_eq!(
        collected.failure().map(ToString::to_string),
        Some(format!(
            "{}: failed: The input (40000 tokens) is longer than the model's context length",
            collected.failure().expect("failed").engine()
        ))
    );

    let fake = fake().await;
    let engine = adapter(&fake);
    fake.inject(FakeFault::Status {
        code: 503,
        body: "overloaded".into(),
    });
    let failure = within(engine.generate(request("r1", None)))
        .await
        .expect_err("503");
    match &failure {
        EngineFailure::Status { code, body, .. } => {
            assert_eq!(*code, 503);
            assert!(body.contains("overloaded"), "{body}");
        }
        other => panic!("expected a status, got {other:?}"),
    }
    assert!(failure.is_retryable());
    fake.inject(FakeFault::Status {
        code: 400,
        body: "bad".into(),
    });
    let failure = within(engine.generate(request("r2", None)))
        .await
        .expect_err("400");
    assert!(!failure.is_retryable());
    // The rids of refused requests are free again.
    let collected = within(collect(
        engine.generate(request("r1", None)).await.expect("starts"),
    ))
    .await;
    assert_eq!(collected.finish(), Some(FinishKind::Stop));
}

/// An adapter for `fake` whose streams time out after `idle_timeout_ms` without a token.
fn with_idle_timeout(fake: &FakeServer, idle_timeout_ms: u64) -> SglangEngine {
    let config = SglangConfig {
        http: HttpEngineConfig {
            idle_timeout_ms,
            ..HttpEngineConfig::default()
        },
        ..SglangConfig::default()
    };
    SglangEngine::new(&fake.url(), config).expect("valid")
}

#[tokio::test]
async fn a_silent_engine_times_out() {
    let backing = scripted(SCRIPT, options("scripted"));
    backing.inject(Fault::StallAfterTokens(3));
    let fake = FakeServer::sglang(Arc::new(backing.clone()), FakeOptions::default())
        .await
        .expect("the fake binds");
    // Long enough that a descheduled test thread does not time out before the first tokens
    // (the stall comes after them).
    let engine = with_idle_timeout(&fake, 1000);
    let mut stream = within(engine.generate(request("r1", None)))
        .await
        .expect("starts");
    assert!(matches!(
        within(stream.recv()).await,
        Some(Ok(EngineChunk::Tokens { .. }))
    ));
    let rest = within(collect(stream)).await;
    assert!(
        matches!(
            rest.failure(),
            Some(EngineFailure::TimedOut { after_ms: 1000, .. })
        ),
        "{:?}",
        rest.end
    );
    // The adapter aborts what it stopped waiting for.
    within(fake.wait_for_stats(|stats| stats.abort_requests >= 1)).await;
    within(backing.wait_idle()).await;
    assert_eq!(engine.in_flight_count(), 0);
}

/// A stuck engine (or a gateway in front of it) that keeps the stream alive with SSE comments
/// but sends no token times out like a silent one: comments are not progress.
#[tokio::test]
async fn an_engine_sending_only_keep_alive_comments_times_out() {
    let backing = scripted(SCRIPT, options("scripted"));
    let fake = FakeServer::sglang(Arc::new(backing.clone()), FakeOptions::default())
        .await
        .expect("the fake binds");
    fake.inject(FakeFault::KeepAliveOnly { every_ms: 20 });
    let engine = with_idle_timeout(&fake, 400);
    let stream = within(engine.generate(request("r1", None)))
        .await
        .expect("starts");
    let collected = within(collect(stream)).await;
    assert!(
        matches!(
            collected.failure(),
            Some(EngineFailure::TimedOut {
                after_ms: 400,
                waiting_for: "the next token",
                ..
            })
        ),
        "{:?}",
        collected.end
    );
    assert!(collected
        .failure()
        .is_some_and(|failure| failure.is_retryable()));
    within(fake.wait_for_stats(|stats| stats.abort_requests >= 1)).await;
    assert_eq!(engine.in_flight_count(), 0);
    // The next request is served normally.
    let collected = within(collect(
        engine.generate(request("r2", None)).await.expect("starts"),
    ))
    .await;
    assert_eq!(collected.finish(), Some(FinishKind::Stop));
}

#[test]
fn addresses_must_be_plain_http_with_a_port() {
    for address in ["127.0.0.1", "https://engine:443", "http://", "ftp://x:1"] {
        let failure = SglangEngine::new(address, SglangConfig::default())
            .err()
            .unwrap_or_else(|| panic!("{address} is refused"));
        assert!(
            matches!(failure, EngineFailure::Rejected { .. }),
            "{failure}"
        );
    }
    let engine =
        SglangEngine::new("http://10.0.0.5:30000/", SglangConfig::default()).expect("valid");
    assert_eq!(engine.name(), "sglang@10.0.0.5:30000");
    let engine = SglangEngine::new("10.0.0.5:30000", SglangConfig::default()).expect("valid");
    assert_eq!(engine.name(), "sglang@10.0.0.5:30000");
}

/// An engine (or a gateway) that sends an error's head and then stalls its body: the failure
/// comes back within the response timeout, with what the body held so far, instead of holding
/// the call (and a stop sequence's or a disconnect's abort) for ever.
#[tokio::test]
async fn an_error_whose_body_stalls_fails_within_the_response_timeout() {
    let fake = fake().await;
    let config = SglangConfig {
        http: HttpEngineConfig {
            response_timeout_ms: 300,
            ..HttpEngineConfig::default()
        },
        ..SglangConfig::default()
    };
    let engine = SglangEngine::new(&fake.url(), config).expect("valid");
    fake.inject(FakeFault::StatusThenStall { code: 503 });
    let started = std::time::Instant::now();
    let failure = within(engine.generate(request("r1", None)))
        .await
        .expect_err("503");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    match &failure {
        EngineFailure::Status { code, body, .. } => {
            assert_eq!(*code, 503);
            assert!(body.starts_with("{\"error\""), "{body}");
        }
        other => panic!("expected a status, got {other:?}"),
    }
}
