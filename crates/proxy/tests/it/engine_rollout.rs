//! `RolloutTokenEngine`: a real rollout engine (the embedded CPU policy, a small random one)
//! behind the proxy's engine trait — tokens and log-probs as the engine sampled them, the
//! finish kinds, an abort, and the refusals. It is not in the conformance suite
//! (`engine_suite.rs`): that suite's cases follow a script, and a model samples what it
//! samples; here the same request sent straight to the engine is the reference instead.

use std::sync::Arc;

use gyre_engine::{GenerationRequest, RolloutEngine, SamplingParams};
use gyre_event::PolicyVersion;
use gyre_model::{EmbeddedEngine, EngineConfig, ModelConfig, Policy};
use gyre_proxy::engine::rollout::RolloutTokenEngine;
use gyre_proxy::engine::{collect, EngineFailure, EngineRequest, FinishKind, TokenEngine};

use crate::engine_support::within;

fn engines() -> (Arc<EmbeddedEngine>, RolloutTokenEngine) {
    // A long context, so a request for many tokens decodes for seconds (the abort test).
    let config = ModelConfig {
        context_tokens_max: 1 << 15,
        ..ModelConfig::quickstart()
    };
    let policy = Policy::new(config, 7).expect("a random policy");
    let engine = Arc::new(
        EmbeddedEngine::start(policy, PolicyVersion(3), EngineConfig::default()).expect("starts"),
    );
    let adapter = RolloutTokenEngine::new("embedded@test", engine.clone());
    (engine, adapter)
}

fn request(rid: &str, max_new_tokens: u32) -> EngineRequest {
    let mut request = EngineRequest::new(rid, vec![1, 2, 3, 4, 5], max_new_tokens);
    request.seed = Some(11);
    request
}

#[test]
fn tokens_and_logprobs_are_the_engines_own() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let (engine, adapter) = engines();
    let stream = runtime
        .block_on(within(adapter.generate(request("a", 6))))
        .expect("accepted");
    let collected = runtime.block_on(within(collect(stream)));
    assert_eq!(collected.end, Some(Ok((FinishKind::Length, 3))));
    assert_eq!(collected.ids.len(), 6);
    // The same request straight to the engine samples the same tokens with the same
    // log-probs (same seed, same weights).
    let direct = engine
        .submit(GenerationRequest {
            prompt: vec![1, 2, 3, 4, 5],
            sampling: SamplingParams {
                temperature: 1.0,
                top_p: 1.0,
                new_tokens_max: 6,
                stop_tokens: Vec::new(),
                seed: 11,
                greedy: false,
            },
        })
        .expect("submits")
        .wait()
        .expect("generates");
    assert_eq!(collected.ids, direct.output_ids);
    assert_eq!(collected.logprobs, direct.output_logprobs);
    assert!(collected
        .logprobs
        .iter()
        .all(|lp| lp.is_finite() && *lp <= 0.0));

    // A stop id ends the answer with it (the first sampled token is made a stop id).
    let mut stopping = request("b", 6);
    stopping.stop_token_ids = vec![direct.output_ids[0]];
    let stream = runtime
        .block_on(within(adapter.generate(stopping)))
        .expect("accepted");
    let collected = runtime.block_on(within(collect(stream)));
    assert_eq!(collected.ids, vec![direct.output_ids[0]]);
    assert_eq!(collected.end, Some(Ok((FinishKind::Stop, 3))));
}

#[test]
fn an_abort_ends_the_stream_as_aborted() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let (_engine, adapter) = engines();
    // Seconds of decoding (32K tokens of context): still under way when the abort comes.
    let stream = runtime
        .block_on(within(adapter.generate(request("long", 100_000))))
        .expect("accepted");
    runtime
        .block_on(within(adapter.abort("long")))
        .expect("abort is answered");
    let collected = runtime.block_on(within(collect(stream)));
    assert_eq!(collected.end, Some(Ok((FinishKind::Abort, 3))));
    // Unknown rids are not an error.
    runtime
        .block_on(within(adapter.abort("never-sent")))
        .expect("abort of an unknown rid");
}

#[test]
fn what_the_engine_cannot_sample_is_refused_by_name() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let (_engine, adapter) = engines();
    let mut top_k = request("k", 4);
    top_k.top_k = Some(5);
    let failure = runtime
        .block_on(within(adapter.generate(top_k)))
        .expect_err("no top-k");
    assert!(
        matches!(&failure, EngineFailure::Rejected { message, .. } if message.contains("top_k")),
        "{failure}"
    );
    assert!(!failure.is_retryable());
    let empty = EngineRequest::new("e", Vec::new(), 4);
    let failure = runtime
        .block_on(within(adapter.generate(empty)))
        .expect_err("no prompt");
    assert!(failure.to_string().contains("embedded@test"), "{failure}");
    let mut bad = request("t", 4);
    bad.top_p = 0.0;
    let failure = runtime
        .block_on(within(adapter.generate(bad)))
        .expect_err("top_p 0");
    assert!(failure.to_string().contains("top_p"), "{failure}");
}
