//! Sampler and trainer agree on log-probs; seeds make everything reproducible.
//!
//! Tolerance for sampler vs trainer: 1e-4 absolute per token (the sampler reads logits from
//! the KV-cached decode path, the trainer from a full batched forward; both f32).

use gyre_engine::{FinishReason, GenerationRequest, SamplingParams};
use gyre_event::{CallId, ExecutionId, PolicyVersion};
use gyre_model::generation::{generate, DecodeBatch};
use gyre_model::{ModelConfig, Policy, Trainer, TrainerConfig};
use gyre_trajectory::Row;

fn request(
    prompt: Vec<u32>,
    seed: u64,
    temperature: f64,
    top_p: f64,
    new_tokens_max: u32,
) -> GenerationRequest {
    GenerationRequest {
        prompt,
        sampling: SamplingParams {
            temperature,
            top_p,
            new_tokens_max,
            stop_tokens: vec![],
            seed,
            greedy: false,
        },
    }
}

fn requests(temperature: f64, top_p: f64) -> Vec<GenerationRequest> {
    (0..4)
        .map(|index| {
            request(
                vec![1, 2 + index, 3, 4 + index],
                40 + index as u64,
                temperature,
                top_p,
                24,
            )
        })
        .collect()
}

/// Recomputes the generated tokens' log-probs with the trainer.
fn trainer_logprobs(policy: Policy, temperature: f64, prompt: &[u32], output: &[u32]) -> Vec<f32> {
    let trainer = Trainer::new(
        policy,
        TrainerConfig {
            temperature,
            ..TrainerConfig::default()
        },
    )
    .expect("valid trainer");
    let mut tokens = prompt.to_vec();
    tokens.extend_from_slice(output);
    let start = prompt.len() as u64;
    let row = Row {
        execution: ExecutionId(0),
        leaf_call: CallId(0),
        class: 0,
        target_spans: vec![(start, tokens.len() as u64)],
        behaviour_logprobs: vec![0.0; output.len()],
        tokens,
        advantage: 1.0,
        target_weight: 1.0,
    };
    trainer
        .current_logprobs(&[row], &[0])
        .expect("scoring runs")
}

fn assert_agreement(temperature: f64) {
    let config = ModelConfig::quickstart();
    let policy = Policy::new(config.clone(), 3).expect("valid config");
    let results = generate(&policy, PolicyVersion(0), requests(temperature, 1.0), true)
        .expect("generation runs");
    for (request, result) in requests(temperature, 1.0).iter().zip(results) {
        let generation = result.expect("request accepted");
        assert_eq!(generation.finish_reason, FinishReason::Length);
        let recomputed = trainer_logprobs(
            Policy::new(config.clone(), 3).expect("valid config"),
            temperature,
            &request.prompt,
            &generation.output_ids,
        );
        for (sampled, trained) in generation.output_logprobs.iter().zip(&recomputed) {
            assert!(
                (sampled - trained).abs() <= 1e-4,
                "sampler {sampled} vs trainer {trained}"
            );
        }
    }
}

#[test]
fn sampler_logprobs_equal_trainer_logprobs() {
    assert_agreement(1.0);
}

#[test]
fn sampler_logprobs_equal_trainer_logprobs_at_temperature() {
    assert_agreement(0.7);
}

#[test]
fn same_seed_same_weights_same_samples() {
    let config = ModelConfig::quickstart();
    let first = Policy::new(config.clone(), 9).expect("valid config");
    let second = Policy::new(config.clone(), 9).expect("valid config");
    let other = Policy::new(config, 10).expect("valid config");
    let (first_manifest, first_buffer) = first.export_weights(PolicyVersion(0)).expect("export");
    let (second_manifest, second_buffer) = second.export_weights(PolicyVersion(0)).expect("export");
    let (other_manifest, _) = other.export_weights(PolicyVersion(0)).expect("export");
    assert_eq!(first_buffer, second_buffer);
    assert_eq!(first_manifest.checksum, second_manifest.checksum);
    assert_ne!(first_manifest.checksum, other_manifest.checksum);
    let run = |policy: &Policy| {
        generate(policy, PolicyVersion(0), requests(0.9, 0.95), true).expect("generation runs")
    };
    assert_eq!(run(&first), run(&second));
    assert_ne!(run(&first), run(&other));
}

#[test]
fn kv_cache_and_recomputation_agree() {
    let policy = Policy::new(ModelConfig::quickstart(), 5).expect("valid config");
    let greedy: Vec<GenerationRequest> = (0..3)
        .map(|index| GenerationRequest {
            prompt: vec![7, 8 + index, 9],
            sampling: SamplingParams::greedy(20, vec![]),
        })
        .collect();
    let cached = generate(&policy, PolicyVersion(0), greedy.clone(), true).expect("cached run");
    let uncached = generate(&policy, PolicyVersion(0), greedy, false).expect("uncached run");
    for (cached, uncached) in cached.into_iter().zip(uncached) {
        let (cached, uncached) = (cached.expect("accepted"), uncached.expect("accepted"));
        assert_eq!(cached.output_ids, uncached.output_ids);
        for (a, b) in cached.output_logprobs.iter().zip(&uncached.output_logprobs) {
            assert!((a - b).abs() <= 1e-4);
        }
    }
}

#[test]
fn stop_tokens_and_cancellation_end_a_sequence_mid_generation() {
    let policy = Policy::new(ModelConfig::quickstart(), 5).expect("valid config");
    // Greedy decoding from this prompt emits some token first; make it the stop token.
    let probe = generate(
        &policy,
        PolicyVersion(0),
        vec![GenerationRequest {
            prompt: vec![1, 2, 3],
            sampling: SamplingParams::greedy(5, vec![]),
        }],
        true,
    )
    .expect("generation runs")
    .remove(0)
    .expect("accepted");
    let stop = probe.output_ids[2];
    let stopped = generate(
        &policy,
        PolicyVersion(0),
        vec![GenerationRequest {
            prompt: vec![1, 2, 3],
            sampling: SamplingParams::greedy(5, vec![stop]),
        }],
        true,
    )
    .expect("generation runs")
    .remove(0)
    .expect("accepted");
    assert_eq!(stopped.finish_reason, FinishReason::Stop);
    assert_eq!(*stopped.output_ids.last().expect("non-empty"), stop);
    assert!(stopped.output_ids.len() <= 3);

    let mut batch = DecodeBatch::new(PolicyVersion(0), true);
    let keep = gyre_engine::CancelToken::default();
    let cancel = gyre_engine::CancelToken::default();
    let long = request(vec![1, 2, 3], 1, 1.0, 1.0, 50);
    assert!(batch
        .admit(&policy, 0, long.clone(), keep)
        .expect("admitted")
        .is_none());
    assert!(batch
        .admit(&policy, 1, long, cancel.clone())
        .expect("admitted")
        .is_none());
    assert!(batch.step(&policy).expect("step runs").is_empty());
    cancel.cancel();
    let finished = batch.step(&policy).expect("step runs");
    assert_eq!(finished.len(), 1);
    assert_eq!(finished[0].0, 1);
    assert_eq!(finished[0].1, Err(gyre_engine::EngineError::Aborted));
    assert_eq!(batch.len(), 1);
}
