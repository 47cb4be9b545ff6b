//! The trainer's eq (5)–(6) loss and per-token coefficients against `gyre_trajectory`'s f64
//! reference, on seeded random batches that exercise the clip mask and the loss cap.
//!
//! Tolerance: loss within 1e-5 relative (+1e-6 absolute); each coefficient within 1e-4
//! relative (+1e-7 absolute). The trainer runs in f32, the reference in f64 on the trainer's
//! own current log-probs, so only f32 rounding separates them.

use std::collections::BTreeMap;

use gyre_model::ModelConfig;
use gyre_trajectory::{objective, ExecutionTargets, SplitMix64, TargetToken};

use crate::support::{row, stamp_weights, trainer};

#[test]
fn loss_and_coefficients_match_the_reference_on_random_batches() {
    let mut clipped_seen = 0;
    let mut capped_seen = 0;
    for seed in 0..4u64 {
        let mut rng = SplitMix64::new(100 + seed);
        let config = ModelConfig::tiny();
        let vocab = config.vocab_size as u32;
        let (groups, per_group) = (2u32, 3u32);
        let mut trainer = trainer(config, seed);
        // Executions 0..5; execution 5 is missing (excluded) but counts in B·N.
        let mut rows = Vec::new();
        for execution in 0..5u64 {
            let advantage = match execution {
                0 => 40.0, // ℓ_u above 100: the cap binds
                1 => -0.7,
                2 => -0.3,
                _ => rng.below(2000) as f64 / 1000.0 - 1.0,
            };
            for _ in 0..1 + rng.below(2) {
                let length = 8 + rng.below(12) as usize;
                let targets = 3 + rng.below(4) as usize;
                rows.push(row(&mut rng, vocab, execution, length, targets, advantage));
            }
        }
        stamp_weights(&mut rows, groups, per_group);
        // Behaviour log-probs near the current ones, shifted per execution so that some sequence
        // ratios leave the [0.995, 1.005] band.
        let all: Vec<usize> = (0..rows.len()).collect();
        let current = trainer.current_logprobs(&rows, &all).expect("scoring runs");
        let mut cursor = 0;
        for row in rows.iter_mut() {
            let shift = [0.0, 0.02, -0.02, 0.001][row.execution.get() as usize % 4];
            for behaviour in row.behaviour_logprobs.iter_mut() {
                let jitter = (rng.below(1000) as f32 / 1000.0 - 0.5) * 0.004;
                *behaviour = current[cursor] - shift + jitter;
                cursor += 1;
            }
        }
        // Two micro-steps that split executions across them.
        let micro_steps: Vec<Vec<usize>> = vec![
            (0..rows.len()).filter(|index| index % 2 == 0).collect(),
            (0..rows.len()).filter(|index| index % 2 == 1).collect(),
        ];
        let ratios = trainer.score(&rows, &micro_steps).expect("scoring runs");
        let mut loss = 0.0;
        let mut outcomes = BTreeMap::new();
        for micro_step in &micro_steps {
            let outcome = trainer
                .accumulate(&rows, micro_step, &ratios)
                .expect("micro-step runs");
            loss += outcome.loss;
            for target in outcome.targets {
                outcomes.insert((micro_step[target.row], target.position), target);
            }
        }
        // The reference, execution by execution, targets in row then position order.
        let mut executions: BTreeMap<u64, (f64, Vec<TargetToken>, Vec<f32>)> = BTreeMap::new();
        for (index, row) in rows.iter().enumerate() {
            let entry = executions.entry(row.execution.get()).or_insert((
                row.advantage,
                Vec::new(),
                Vec::new(),
            ));
            let positions = row
                .target_spans
                .iter()
                .flat_map(|(start, end)| *start..*end);
            for (position, behaviour) in positions.zip(&row.behaviour_logprobs) {
                let outcome = outcomes[&(index, position)];
                entry.1.push(TargetToken {
                    behaviour_logprob: *behaviour as f64,
                    current_logprob: outcome.current_logprob as f64,
                });
                entry.2.push(outcome.coefficient);
            }
        }
        let inputs: Vec<ExecutionTargets> = executions
            .values()
            .map(|(advantage, targets, _)| ExecutionTargets {
                advantage: *advantage,
                targets: targets.clone(),
            })
            .collect();
        let reference = objective(&inputs, groups, per_group).expect("valid batch");
        assert!(
            (loss - reference.loss).abs() <= 1e-6 + 1e-5 * reference.loss.abs(),
            "seed {seed}: loss {loss} vs reference {}",
            reference.loss
        );
        for ((_, (_, _, coefficients)), part) in executions.iter().zip(&reference.executions) {
            if part.clip_mask == 0.0 {
                clipped_seen += 1;
            }
            for (ours, theirs) in coefficients.iter().zip(&part.coefficients) {
                if *theirs == 0.0 && part.clip_mask == 1.0 {
                    capped_seen += 1;
                }
                assert!(
                    (*ours as f64 - theirs).abs() <= 1e-7 + 1e-4 * theirs.abs(),
                    "seed {seed}: coefficient {ours} vs reference {theirs}"
                );
            }
        }
        for (execution, ratio) in &ratios {
            let part = &reference.executions[executions
                .keys()
                .position(|key| *key == execution.get())
                .expect("scored execution")];
            assert_eq!(
                ratio.clip_mask, part.clip_mask,
                "seed {seed}: mask of {execution}"
            );
        }
    }
    assert!(clipped_seen > 0, "no batch exercised the clip mask");
    assert!(capped_seen > 0, "no batch exercised the loss cap");
}
