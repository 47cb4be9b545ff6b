//! Finite-difference gradient check of every parameter group through the training path.
//!
//! The analytic gradient is what `Trainer::accumulate` accumulates (exported as a flat buffer);
//! the numeric one is a central difference of F(θ) = Σ_u c_u log π_θ(y_u|c_u), where c_u are
//! the per-token coefficients that micro-step reported (the loss's gradient with respect to the
//! log-probs, which `reference.rs` checks against the f64 reference). A parameter group whose
//! ops lack a backward would show a zero or missing analytic gradient here.

use std::collections::BTreeMap;

use gyre_model::{ModelConfig, RopeLayout};
use gyre_trajectory::SplitMix64;

use crate::support::{row, stamp_weights, trainer};

fn check(config: ModelConfig, seed: u64) {
    let mut rng = SplitMix64::new(seed);
    let vocab = config.vocab_size as u32;
    let mut rows = vec![
        row(&mut rng, vocab, 1, 12, 6, 1.0),
        row(&mut rng, vocab, 2, 9, 5, -0.5),
    ];
    stamp_weights(&mut rows, 1, 2);
    let mut trainer = trainer(config, seed);
    let micro_step = vec![0, 1];
    let outcome = trainer
        .accumulate(&rows, &micro_step, &BTreeMap::new())
        .expect("micro-step runs");
    let coefficients: Vec<f64> = outcome
        .targets
        .iter()
        .map(|target| target.coefficient as f64)
        .collect();
    assert!(coefficients.iter().all(|coefficient| *coefficient != 0.0));
    let (_, gradient_buffer) = trainer.export_gradients().expect("gradients export");
    let analytic: Vec<f32> = gradient_buffer
        .chunks_exact(4)
        .map(|chunk| f32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]))
        .collect();
    let objective = |trainer: &gyre_model::Trainer| -> f64 {
        let logprobs = trainer
            .current_logprobs(&rows, &micro_step)
            .expect("scoring runs");
        logprobs
            .iter()
            .zip(&coefficients)
            .map(|(logprob, coefficient)| *logprob as f64 * coefficient)
            .sum()
    };
    let values = trainer
        .policy()
        .parameter_values()
        .expect("parameters read");
    let specs = trainer.policy().specs().to_vec();
    let mut offset = 0;
    for (index, spec) in specs.iter().enumerate() {
        let count = spec.elements_count();
        let gradient = &analytic[offset..offset + count];
        offset += count;
        // The largest-magnitude element and one seeded random element of each tensor.
        let largest = (0..count)
            .max_by(|a, b| gradient[*a].abs().total_cmp(&gradient[*b].abs()))
            .expect("non-empty tensor");
        assert!(
            gradient[largest].abs() > 1e-5,
            "{} has no gradient: a missing backward",
            spec.name
        );
        for element in [largest, rng.below(count as u64) as usize] {
            let step = 1e-2f32;
            let mut perturbed = values[index].clone();
            perturbed[element] = values[index][element] + step;
            let set = |data: &Vec<f32>| {
                let tensor = candle_core::Tensor::from_slice(
                    data,
                    spec.shape.clone(),
                    &candle_core::Device::Cpu,
                )
                .expect("tensor builds");
                trainer
                    .policy()
                    .set_parameter(index, &tensor)
                    .expect("parameter set");
            };
            set(&perturbed);
            let plus = objective(&trainer);
            perturbed[element] = values[index][element] - step;
            set(&perturbed);
            let minus = objective(&trainer);
            set(&values[index]);
            let numeric = (plus - minus) / (2.0 * step as f64);
            let analytic = gradient[element] as f64;
            let tolerance = 5e-6 + 3e-2 * analytic.abs().max(numeric.abs());
            assert!(
                (numeric - analytic).abs() <= tolerance,
                "{}[{element}]: numeric {numeric:.6e} vs analytic {analytic:.6e}",
                spec.name
            );
        }
    }
}

#[test]
fn every_parameter_group_matches_finite_differences_tied_interleaved_gqa() {
    check(ModelConfig::tiny(), 11);
}

#[test]
fn every_parameter_group_matches_finite_differences_untied_halves() {
    let config = ModelConfig {
        tie_embeddings: false,
        rope_layout: RopeLayout::Halves,
        kv_heads_count: 4,
        ..ModelConfig::tiny()
    };
    check(config, 12);
}
