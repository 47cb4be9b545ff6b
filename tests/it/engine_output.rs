//! An engine that answers what no sampler can (an id outside the model's vocabulary, a
//! log-prob that is NaN or above zero) is treated as a protocol failure: nothing of that chunk
//! is kept, the answer continues on a fresh attempt, and the harness sees one ordinary answer
//! whose record holds only tokens the trainer can use.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use gyre_proxy::engine::{ChunkStream, EngineChunk, EngineFailure, EngineRequest, TokenEngine};
use serde_json::json;

use crate::in_process::{model, proxy, recording, wrapping_engine, Recording};

#[derive(Clone, Copy, Debug)]
enum Corruption {
    UnknownId,
    NanLogprob,
    PositiveLogprob,
}

/// Corrupts the second chunk of its first request's answer; later requests pass through.
struct Corrupting {
    inner: Arc<Recording>,
    corruption: Corruption,
    requests: AtomicUsize,
}

impl Corrupting {
    fn corrupt_and_generate(
        &self,
        request: EngineRequest,
    ) -> futures_util::future::BoxFuture<'static, Result<ChunkStream, EngineFailure>> {
        let first = self.requests.fetch_add(1, Ordering::SeqCst) == 0;
        let corruption = self.corruption;
        let answer = self.inner.generate(request);
        Box::pin(async move {
            let mut chunks = answer.await?;
            if !first {
                return Ok(chunks);
            }
            let (sender, receiver) = tokio::sync::mpsc::channel(16);
            tokio::spawn(async move {
                let mut seen = 0;
                while let Some(mut chunk) = chunks.recv().await {
                    if let Ok(EngineChunk::Tokens { ids, logprobs }) = &mut chunk {
                        seen += 1;
                        if seen == 2 {
                            match corruption {
                                Corruption::UnknownId => ids[0] = 1_000_000,
                                Corruption::NanLogprob => logprobs[0] = f32::NAN,
                                Corruption::PositiveLogprob => logprobs[0] = 3.5,
                            }
                        }
                    }
                    if sender.send(chunk).await.is_err() {
                        return;
                    }
                }
            });
            Ok(receiver)
        })
    }
}

wrapping_engine!(Corrupting, corrupt_and_generate);

#[test]
fn tokens_no_sampler_gives_are_refused_and_the_answer_continues() {
    let runtime = crate::support::runtime();
    let model = model();
    for corruption in [
        Corruption::UnknownId,
        Corruption::NanLogprob,
        Corruption::PositiveLogprob,
    ] {
        let engine = Arc::new(Corrupting {
            inner: recording(),
            corruption,
            requests: AtomicUsize::new(0),
        });
        let proxy = proxy(&runtime, engine.clone());
        let (status, answer) = proxy.post(
            "/v1/messages",
            &json!({"model": "m", "max_tokens": 64,
                    "messages": [{"role": "user", "content": "Say something."}]}),
        );
        assert_eq!(status, 200, "{corruption:?}: {answer}");
        assert_eq!(answer["type"], "message", "{corruption:?}: {answer}");
        assert_eq!(
            engine.requests.load(Ordering::SeqCst),
            2,
            "{corruption:?}: the answer continued on a second attempt"
        );
        let records = proxy.sink.records();
        assert!(!records.is_empty(), "{corruption:?}");
        for record in &records {
            assert!(
                record.output_ids.iter().all(|id| model.knows_id(*id)),
                "{corruption:?}: {:?}",
                record.output_ids
            );
            assert!(
                record
                    .output_logprobs
                    .iter()
                    .all(|logprob| logprob.is_finite() && *logprob <= 0.0),
                "{corruption:?}: {:?}",
                record.output_logprobs
            );
        }
        // The kept partial (the first chunk) is audit only; the call itself is whole.
        let calls: Vec<_> = records
            .iter()
            .filter(|record| record.kind != gyre_event::CallKind::Aborted)
            .collect();
        assert_eq!(calls.len(), 1, "{corruption:?}: {records:?}");
        assert!(calls[0].output_ids.len() >= 12, "{corruption:?}");
    }
}

/// A proxy whose engine dies after `tokens` sampled tokens on its first request, allowing
/// `attempts` engine attempts per call.
fn dying_engine_proxy(
    runtime: &tokio::runtime::Runtime,
    tokens: u32,
    attempts: usize,
) -> (Arc<Recording>, crate::in_process::Proxy) {
    let engine = recording();
    engine
        .inner
        .inject(gyre_proxy::engine::Fault::DieAfterTokens(tokens));
    let proxy = crate::in_process::proxy_with(
        runtime,
        engine.clone(),
        gyre_proxy::server::ServerConfig {
            engine_attempts_max: attempts,
            ..gyre_proxy::server::ServerConfig::default()
        },
    );
    (engine, proxy)
}

/// An engine that samples the whole answer, to the call's limit, and dies before saying it
/// ended: the answer is complete at its limit, and no other engine is asked for more. On the
/// last attempt a call is allowed too: it is answered, not refused as overloaded for want of
/// attempts.
#[test]
fn an_engine_that_dies_after_the_last_token_ends_the_answer_at_its_limit() {
    let runtime = crate::support::runtime();
    for attempts in [4, 1] {
        let (engine, proxy) = dying_engine_proxy(&runtime, 8, attempts);
        let (status, answer) = proxy.post(
            "/v1/messages",
            &json!({"model": "m", "max_tokens": 8,
                    "messages": [{"role": "user", "content": "Say something."}]}),
        );
        assert_eq!(status, 200, "{attempts} attempts: {answer}");
        assert_eq!(answer["stop_reason"], "max_tokens", "{answer}");
        assert_eq!(
            engine.max_new_tokens.lock().expect("lock").len(),
            1,
            "no second engine request"
        );
        let calls: Vec<_> = proxy
            .sink
            .records()
            .into_iter()
            .filter(|record| record.kind != gyre_event::CallKind::Aborted)
            .collect();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].output_ids.len(), 8);
    }
}

/// A Responses stream that fails after its first events (every engine attempt died): the
/// `error` event is numbered after the events before it, as a Responses stream must be (it was
/// always 0, which goes backwards).
#[test]
fn a_responses_streams_error_event_follows_the_events_before_it() {
    let runtime = crate::support::runtime();
    let (_engine, proxy) = dying_engine_proxy(&runtime, 3, 1);
    let auth = format!("Bearer {}", proxy.token);
    let (status, text) = crate::support::http(
        &proxy.address,
        "POST",
        "/v1/responses",
        &[
            ("content-type", "application/json"),
            ("authorization", &auth),
        ],
        &json!({"model": "m", "stream": true, "max_output_tokens": 64, "input": "Say something."})
            .to_string(),
    );
    assert_eq!(status, 200, "{text}");
    let events: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .map(|data| serde_json::from_str(data).expect("JSON event"))
        .collect();
    let error = events.last().expect("events");
    assert_eq!(error["type"], "error", "{text}");
    let numbers: Vec<u64> = events
        .iter()
        .map(|event| event["sequence_number"].as_u64().expect("numbered"))
        .collect();
    assert!(numbers.len() > 1, "{text}");
    assert!(
        numbers.windows(2).all(|pair| pair[1] == pair[0] + 1),
        "{numbers:?}"
    );
}

/// An engine whose request panics (a bug on the call's path): the call's task dies, and the
/// harness gets an error it can act on (a 500, or an `error` event ending the stream) instead
/// of an answer or stream that just stops.
struct Panicking {
    inner: Arc<Recording>,
}

impl Panicking {
    fn panic_on_generate(
        &self,
        _request: EngineRequest,
    ) -> futures_util::future::BoxFuture<'static, Result<ChunkStream, EngineFailure>> {
        Box::pin(async { panic!("a bug on the call's path (this panic is the test's)") })
    }
}

wrapping_engine!(Panicking, panic_on_generate);

#[test]
fn a_panic_on_a_calls_path_reaches_the_harness_as_an_error() {
    let runtime = crate::support::runtime();
    let proxy = proxy(&runtime, Arc::new(Panicking { inner: recording() }));
    let body = json!({"model": "m", "max_tokens": 8,
                      "messages": [{"role": "user", "content": "Say something."}]});
    let (status, answer) = proxy.post("/v1/messages", &body);
    assert_eq!(status, 500, "{answer}");
    assert_eq!(answer["error"]["type"], "api_error", "{answer}");

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (status, text) = crate::support::http(
        &proxy.address,
        "POST",
        "/v1/messages",
        &[
            ("content-type", "application/json"),
            ("x-api-key", &proxy.token),
        ],
        &streamed.to_string(),
    );
    assert_eq!(status, 200, "{text}");
    let last_event = text.rfind("event: ").map(|at| &text[at..]);
    assert!(
        last_event.is_some_and(|event| event.starts_with("event: error")),
        "the stream ends with an error event: {text}"
    );
    assert!(proxy.sink.records().is_empty(), "nothing recorded");
}
