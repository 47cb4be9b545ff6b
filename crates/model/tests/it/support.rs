//! Shared test fixtures: seeded random rows in the trajectory packer's format.

use gyre_event::{CallId, ExecutionId};
use gyre_model::{ModelConfig, Policy, Trainer, TrainerConfig};
use gyre_trajectory::{target_weight, Row, SplitMix64};

/// A trainer over a fresh seeded policy.
pub fn trainer(config: ModelConfig, seed: u64) -> Trainer {
    let policy = Policy::new(config, seed).expect("valid config");
    Trainer::new(policy, TrainerConfig::default()).expect("valid trainer config")
}

/// One row: random tokens, a target span near its end, placeholder behaviour log-probs.
pub fn row(
    rng: &mut SplitMix64,
    vocab: u32,
    execution: u64,
    length: usize,
    targets: usize,
    advantage: f64,
) -> Row {
    let tokens: Vec<u32> = (0..length)
        .map(|_| rng.below(vocab as u64) as u32)
        .collect();
    let start = (length - targets) as u64;
    Row {
        execution: ExecutionId(execution),
        leaf_call: CallId(execution * 10),
        class: 0,
        tokens,
        target_spans: vec![
            (start, start + targets as u64 / 2),
            (start + targets as u64 / 2 + 1, length as u64),
        ],
        behaviour_logprobs: vec![-3.0; targets - 1],
        advantage,
        target_weight: 0.0,
    }
}

/// Stamps the 1/(L_i·B·N) weight of every row from its execution's total target count.
pub fn stamp_weights(rows: &mut [Row], groups: u32, executions_per_group: u32) {
    for index in 0..rows.len() {
        let execution = rows[index].execution;
        let targets: u64 = rows
            .iter()
            .filter(|row| row.execution == execution)
            .map(Row::targets_count)
            .sum();
        rows[index].target_weight = target_weight(targets, groups, executions_per_group);
    }
}
