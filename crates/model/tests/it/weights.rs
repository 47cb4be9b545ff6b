//! Weights and gradients as flat buffers, and safetensors files, round-trip exactly.

use std::collections::BTreeMap;

use gyre_engine::EngineError;
use gyre_event::PolicyVersion;
use gyre_model::{ModelConfig, ModelError, Policy};
use gyre_trajectory::SplitMix64;

use crate::support::{row, stamp_weights, trainer};

fn logits(policy: &Policy) -> Vec<f32> {
    let tokens =
        candle_core::Tensor::from_slice(&[1u32, 5, 9, 2], (1, 4), &candle_core::Device::Cpu)
            .expect("tensor");
    let model = policy.inference();
    let hidden = model
        .hidden_states(&tokens, None)
        .expect("forward")
        .squeeze(0)
        .expect("squeeze");
    model
        .logits(&hidden)
        .expect("logits")
        .flatten_all()
        .expect("flat")
        .to_vec1()
        .expect("values")
}

#[test]
fn flat_buffer_and_safetensors_round_trip_exactly() {
    let config = ModelConfig::quickstart();
    let source = Policy::new(config.clone(), 1).expect("valid config");
    let (manifest, buffer) = source.export_weights(PolicyVersion(4)).expect("export");
    assert_eq!(manifest.version, PolicyVersion(4));
    assert_eq!(manifest.total_bytes() as usize, buffer.len());
    assert_eq!(
        manifest.total_bytes() as usize,
        4 * source.parameters_count()
    );
    assert_eq!(manifest.tensors[0].name, "embed.weight");
    assert!(manifest
        .render()
        .starts_with("{\"version\": 4, \"checksum\": "));

    let target = Policy::new(config.clone(), 2).expect("valid config");
    assert_ne!(logits(&source), logits(&target));
    target.import_weights(&manifest, &buffer).expect("import");
    assert_eq!(logits(&source), logits(&target));

    let mut corrupted = buffer.clone();
    corrupted[17] ^= 0x40;
    match target.import_weights(&manifest, &corrupted) {
        Err(ModelError::Engine(EngineError::InvalidWeights { message })) => {
            assert!(message.contains("checksum"))
        }
        other => panic!("corrupted buffer accepted: {other:?}"),
    }
    let other_shape = Policy::new(ModelConfig::tiny(), 1).expect("valid config");
    assert!(other_shape.import_weights(&manifest, &buffer).is_err());

    let directory = tempfile::tempdir().expect("temp dir");
    let path = directory.path().join("policy.safetensors");
    source.save_safetensors(&path).expect("save");
    let loaded = Policy::load_safetensors(config, &path).expect("load");
    assert_eq!(logits(&source), logits(&loaded));
    assert!(Policy::load_safetensors(ModelConfig::tiny(), &path).is_err());
}

#[test]
fn gradients_travel_in_the_weight_layout_and_drive_the_step() {
    let config = ModelConfig::tiny();
    let mut rng = SplitMix64::new(8);
    let mut rows = vec![
        row(&mut rng, 32, 1, 10, 4, 1.0),
        row(&mut rng, 32, 2, 10, 4, -1.0),
    ];
    stamp_weights(&mut rows, 1, 2);
    let mut first = trainer(config.clone(), 3);
    let mut second = trainer(config, 3);
    first
        .accumulate(&rows, &[0, 1], &BTreeMap::new())
        .expect("micro-step");
    let (manifest, gradients) = first.export_gradients().expect("export");
    let (weights_manifest, _) = first
        .policy()
        .export_weights(PolicyVersion(0))
        .expect("export");
    assert_eq!(manifest.tensors, weights_manifest.tensors);
    // Another cell imports the (all-reduced) gradients and takes the same step.
    second
        .import_gradients(&manifest, &gradients)
        .expect("import");
    let (norm_first, _) = first.apply().expect("step");
    let (norm_second, _) = second.apply().expect("step");
    assert_eq!(norm_first, norm_second);
    assert!(norm_first > 0.0);
    let (_, after_first) = first
        .policy()
        .export_weights(PolicyVersion(1))
        .expect("export");
    let (_, after_second) = second
        .policy()
        .export_weights(PolicyVersion(1))
        .expect("export");
    assert_eq!(after_first, after_second);
    assert_eq!(first.version(), PolicyVersion(1));
}

#[test]
fn a_training_step_raises_the_logprob_of_positive_targets() {
    let config = ModelConfig::quickstart();
    let mut rng = SplitMix64::new(21);
    let mut rows: Vec<_> = (0..4)
        .map(|execution| row(&mut rng, 256, execution, 64, 32, 1.0))
        .collect();
    stamp_weights(&mut rows, 1, 4);
    let mut trainer = trainer(config, 4);
    let all: Vec<usize> = (0..rows.len()).collect();
    let before: f32 = trainer
        .current_logprobs(&rows, &all)
        .expect("score")
        .iter()
        .sum();
    for row in rows.iter_mut() {
        row.behaviour_logprobs = vec![before / 124.0; row.behaviour_logprobs.len()];
    }
    let micro_steps = vec![vec![0, 1], vec![2, 3]];
    let report = trainer.train_step(&rows, &micro_steps).expect("step");
    assert_eq!(report.micro_steps_count, 2);
    assert_eq!(report.targets_count, 124);
    assert!(report.gradient_norm > 0.0 && report.loss > 0.0);
    let after: f32 = trainer
        .current_logprobs(&rows, &all)
        .expect("score")
        .iter()
        .sum();
    assert!(
        after > before,
        "log-prob of positive-advantage targets fell: {before} → {after}"
    );
}
