//! The embedded engine behind the rollout-engine trait: batching, versions, abort.

use gyre_engine::{EngineError, GenerationRequest, RolloutEngine, SamplingParams, WeightUpdate};
use gyre_event::PolicyVersion;
use gyre_model::generation::generate;
use gyre_model::{EmbeddedEngine, EngineConfig, ModelConfig, Policy};

fn request(seed: u64, new_tokens_max: u32) -> GenerationRequest {
    GenerationRequest {
        prompt: vec![3, 1, 4, 1, 5],
        sampling: SamplingParams {
            temperature: 1.0,
            top_p: 0.9,
            new_tokens_max,
            stop_tokens: vec![],
            seed,
            greedy: false,
        },
    }
}

fn long_context() -> ModelConfig {
    ModelConfig {
        context_tokens_max: 4096,
        ..ModelConfig::tiny()
    }
}

#[test]
fn concurrent_requests_match_direct_generation_and_weights_update_between_requests() {
    let config = ModelConfig::quickstart();
    let engine = EmbeddedEngine::start(
        Policy::new(config.clone(), 1).expect("valid config"),
        PolicyVersion(0),
        EngineConfig::default(),
    )
    .expect("engine starts");
    let pendings: Vec<_> = (0..6)
        .map(|seed| engine.submit(request(seed, 16)).expect("accepted"))
        .collect();
    // The update is a barrier: the six requests above finish on version 0.
    let (manifest, buffer) = Policy::new(config.clone(), 2)
        .expect("valid config")
        .export_weights(PolicyVersion(1))
        .expect("export");
    let version = engine
        .update_weights(WeightUpdate {
            version: PolicyVersion(1),
            manifest,
            buffer,
        })
        .expect("update");
    assert_eq!(version, PolicyVersion(1));
    assert_eq!(engine.policy_version(), PolicyVersion(1));
    let old = Policy::new(config.clone(), 1).expect("valid config");
    let expected_old = generate(
        &old,
        PolicyVersion(0),
        (0..6).map(|seed| request(seed, 16)).collect(),
        true,
    )
    .expect("direct generation");
    for (pending, expected) in pendings.into_iter().zip(expected_old) {
        let generation = pending.wait().expect("finished");
        assert_eq!(generation.policy_version, PolicyVersion(0));
        assert_eq!(
            generation.output_ids,
            expected.expect("accepted").output_ids
        );
    }
    let after = engine
        .submit(request(0, 16))
        .expect("accepted")
        .wait()
        .expect("finished");
    assert_eq!(after.policy_version, PolicyVersion(1));
    let new = Policy::new(config, 2).expect("valid config");
    let expected_new =
        generate(&new, PolicyVersion(1), vec![request(0, 16)], true).expect("direct generation");
    assert_eq!(Ok(after), expected_new[0]);
}

#[test]
fn cancel_and_abort_all_stop_generation() {
    let engine = EmbeddedEngine::start(
        Policy::new(long_context(), 1).expect("valid config"),
        PolicyVersion(0),
        EngineConfig::default(),
    )
    .expect("engine starts");
    // 4000 tokens take seconds; cancellation is observed within one token.
    let pending = engine.submit(request(1, 4000)).expect("accepted");
    pending.cancel();
    assert_eq!(pending.wait(), Err(EngineError::Aborted));
    let pendings: Vec<_> = (0..3)
        .map(|seed| engine.submit(request(seed, 4000)).expect("accepted"))
        .collect();
    assert_eq!(engine.abort_all(), Ok(3));
    for pending in pendings {
        assert_eq!(pending.wait(), Err(EngineError::Aborted));
    }
    // The engine keeps serving after an abort.
    let generation = engine
        .submit(request(9, 4))
        .expect("accepted")
        .wait()
        .expect("finished");
    assert_eq!(generation.output_ids.len(), 4);
}

#[test]
fn bad_requests_are_rejected_as_values() {
    let engine = EmbeddedEngine::start(
        Policy::new(long_context(), 1).expect("valid config"),
        PolicyVersion(0),
        EngineConfig {
            requests_max: 2,
            ..EngineConfig::default()
        },
    )
    .expect("engine starts");
    let mut bad = request(0, 4);
    bad.prompt = vec![999];
    assert!(matches!(
        engine.submit(bad).expect("queued").wait(),
        Err(EngineError::InvalidRequest {
            field: "prompt",
            ..
        })
    ));
    let mut hot = request(0, 4);
    hot.sampling.temperature = 0.0;
    assert!(matches!(
        engine.submit(hot),
        Err(EngineError::InvalidRequest {
            field: "temperature",
            ..
        })
    ));
    let first = engine.submit(request(1, 4000)).expect("accepted");
    let second = engine.submit(request(2, 4000)).expect("accepted");
    assert_eq!(
        engine.submit(request(3, 4)).err(),
        Some(EngineError::QueueFull { capacity: 2 })
    );
    first.cancel();
    second.cancel();
    assert_eq!(first.wait(), Err(EngineError::Aborted));
    assert_eq!(second.wait(), Err(EngineError::Aborted));
}
