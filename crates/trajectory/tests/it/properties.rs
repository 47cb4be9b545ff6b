//! Property tests on random executions with compaction, sub-agents and retries.
//!
//! Each property is a checker of its own that returns `Err(why)`; `checkers_can_fail` shows that
//! each one rejects a deliberately broken admission (STYLE rule 12).

use std::collections::BTreeSet;

use gyre_event::{AdmittedTrajectory, CallId, ExecutionId, OutputConstraint};
use gyre_trajectory::synthetic::{build_tree, context_call, generate, SyntheticConfig};
use gyre_trajectory::{
    admit, materialise, objective, record_from_context, target_weight, trajectory_targets_count,
    trajectory_weights, Admission, ExecutionTargets, RoleClasses, SplitMix64, TargetToken, Tree,
    TreeConfig,
};
use proptest::prelude::*;

/// Every (call, output index) a trajectory targets.
fn target_tokens(trajectory: &AdmittedTrajectory) -> Vec<(CallId, u32)> {
    trajectory
        .targets
        .iter()
        .flat_map(|range| (range.start..range.end).map(move |index| (range.call, index)))
        .collect()
}

/// Trainable output tokens on the path of a leaf, as (call, output index): outputs an engine
/// sampled under an answer-format grammar are context only.
fn path_output_tokens(tree: &Tree, leaf: CallId) -> BTreeSet<(CallId, u32)> {
    let leaf = tree.node_of_call(leaf).expect("leaf exists");
    let mut tokens = BTreeSet::new();
    for piece in tree.path(leaf) {
        let node = tree.node(piece.node);
        for offset in node.trainable_from()..piece.cut {
            tokens.insert((node.call, (offset - node.input_len()) as u32));
        }
    }
    tokens
}

pub fn check_disjoint(admission: &Admission) -> Result<(), String> {
    let mut seen = BTreeSet::new();
    for trajectory in &admission.trajectories {
        for token in target_tokens(trajectory) {
            if !seen.insert(token) {
                return Err(format!("target {token:?} admitted twice"));
            }
        }
    }
    Ok(())
}

pub fn check_targets_sampled_on_path(tree: &Tree, admission: &Admission) -> Result<(), String> {
    for trajectory in &admission.trajectories {
        let on_path = path_output_tokens(tree, trajectory.leaf_call);
        for range in &trajectory.targets {
            let node = tree.node(tree.node_of_call(range.call).ok_or("target call unknown")?);
            if range.start >= range.end || range.end as usize > node.output_ids.len() {
                return Err(format!(
                    "range {range:?} is not inside the call's sampled output"
                ));
            }
        }
        for token in target_tokens(trajectory) {
            if !on_path.contains(&token) {
                return Err(format!(
                    "target {token:?} is not on the path of {}",
                    trajectory.leaf_call
                ));
            }
        }
        let row = materialise(tree, trajectory, 1.0, 1.0).map_err(|error| error.to_string())?;
        if row.targets_count() != trajectory_targets_count(trajectory) {
            return Err("materialised row lost targets".into());
        }
    }
    Ok(())
}

pub fn check_j_max(admission: &Admission, j_max: u32) -> Result<(), String> {
    if admission.trajectories.len() as u32 > j_max {
        return Err(format!(
            "{} trajectories, J_max {j_max}",
            admission.trajectories.len()
        ));
    }
    Ok(())
}

/// Independent oracle: before each draw, recompute from scratch which classes still had unmasked
/// trainable tokens on some leaf path; the drawn class must be the highest of them, and when
/// admission stops early nothing trainable may be left.
pub fn check_priority(
    tree: &Tree,
    classes: &RoleClasses,
    admission: &Admission,
    j_max: u32,
) -> Result<(), String> {
    let mut masked: BTreeSet<(CallId, u32)> = BTreeSet::new();
    let highest_open = |masked: &BTreeSet<(CallId, u32)>| -> Option<u32> {
        tree.leaves()
            .filter_map(|leaf| {
                let node = tree.node(leaf);
                let class = classes.classify(&node.agent, node.kind)?;
                let open = path_output_tokens(tree, node.call)
                    .iter()
                    .any(|token| !masked.contains(token));
                open.then_some(class)
            })
            .min()
    };
    for trajectory in &admission.trajectories {
        let expected = highest_open(&masked);
        if expected != Some(trajectory.class) {
            return Err(format!(
                "admitted class {} while class {expected:?} still had unmasked tokens",
                trajectory.class
            ));
        }
        let fresh: BTreeSet<(CallId, u32)> = path_output_tokens(tree, trajectory.leaf_call)
            .into_iter()
            .filter(|token| !masked.contains(token))
            .collect();
        let targets: BTreeSet<(CallId, u32)> = target_tokens(trajectory).into_iter().collect();
        if fresh != targets {
            return Err(format!(
                "targets of {} are not exactly its unmasked path tokens",
                trajectory.leaf_call
            ));
        }
        masked.extend(path_output_tokens(tree, trajectory.leaf_call));
    }
    if (admission.trajectories.len() as u32) < j_max && highest_open(&masked).is_some() {
        return Err("admission stopped early with trainable tokens left".into());
    }
    Ok(())
}

pub fn check_counts_and_weights(
    admission: &Admission,
    groups: u32,
    executions_per_group: u32,
) -> Result<(), String> {
    let sum: u64 = admission
        .trajectories
        .iter()
        .map(trajectory_targets_count)
        .sum();
    if sum != admission.targets_count {
        return Err(format!(
            "Σ L_r = {sum} but L_i = {}",
            admission.targets_count
        ));
    }
    let weights = trajectory_weights(&admission.trajectories);
    let total: f64 = weights.iter().sum();
    if admission.targets_count > 0 && (total - 1.0).abs() > 1e-12 {
        return Err(format!("trajectory weights sum to {total}"));
    }
    let per_target = target_weight(admission.targets_count, groups, executions_per_group);
    let execution_total =
        per_target * admission.targets_count as f64 * (groups * executions_per_group) as f64;
    if admission.targets_count > 0 && (execution_total - 1.0).abs() > 1e-9 {
        return Err(format!(
            "per-execution target weights sum to {execution_total}·B·N⁻¹"
        ));
    }
    Ok(())
}

fn random_execution(seed: u64, main_calls: u32, sub_agents: u32) -> Tree {
    let calls = generate(SyntheticConfig::small(main_calls, sub_agents), seed);
    let tree = build_tree(ExecutionId(seed), &calls, TreeConfig::default())
        .expect("generated calls apply");
    tree.validate();
    tree
}

/// [`random_execution`] with about a third of the calls answered under an answer-format
/// grammar (all of a call's outputs, or, a failover's continuation, only the first few) and
/// an eighth sampled with a harness's own temperature.
fn random_constrained_execution(seed: u64, main_calls: u32, sub_agents: u32) -> Tree {
    let calls = generate(SyntheticConfig::small(main_calls, sub_agents), seed);
    let mut tree = Tree::new(ExecutionId(seed), TreeConfig::default());
    let mut rng = SplitMix64::new(seed ^ 0xC0_57A1);
    for call in &calls {
        let mut record = record_from_context(&tree, &context_call(call));
        if rng.below(8) == 0 {
            // Sampled with a harness's own temperature: every output is context.
            record.sampling.temperature = 0.7;
        } else if rng.below(3) == 0 {
            let outputs = record.output_ids.len() as u64;
            let constrained = rng.below(outputs + 1) as u32;
            record.output_constraint = Some(OutputConstraint {
                schema: None,
                enforced: outputs > 0 && u64::from(constrained) == outputs,
                constrained_tokens: constrained,
            });
        }
        tree.apply(&record).expect("generated calls apply");
    }
    tree.validate();
    tree
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Admission over trees with context-only outputs (a grammar's, a harness's temperature)
    /// keeps every property and never targets one of them, and the tree's own records (a
    /// proxy's restart) keep the counts.
    #[test]
    fn context_outputs_are_never_admitted(seed in any::<u64>(), main_calls in 1u32..30, sub_agents in 0u32..4, run_seed in any::<u64>()) {
        let tree = random_constrained_execution(seed, main_calls, sub_agents);
        let classes = RoleClasses::claude_code();
        let admission = admit(&tree, &classes, 64, &mut SplitMix64::for_execution(run_seed, seed));
        prop_assert_eq!(check_disjoint(&admission), Ok(()));
        prop_assert_eq!(check_targets_sampled_on_path(&tree, &admission), Ok(()));
        prop_assert_eq!(check_priority(&tree, &classes, &admission, 64), Ok(()));
        for trajectory in &admission.trajectories {
            for range in &trajectory.targets {
                let node = tree.node(tree.node_of_call(range.call).expect("target call"));
                prop_assert!(range.start >= node.context_outputs, "{:?} targets a constrained output of {}", range, node.context_outputs);
            }
        }
        let mut rebuilt = Tree::new(tree.execution(), TreeConfig::default());
        for record in tree.records() {
            rebuilt.apply(&record).expect("each record applies");
        }
        prop_assert_eq!(&rebuilt, &tree);
    }

    #[test]
    fn admission_properties(seed in any::<u64>(), main_calls in 1u32..30, sub_agents in 0u32..4, j_max in 1u32..8, run_seed in any::<u64>()) {
        let tree = random_execution(seed, main_calls, sub_agents);
        let classes = RoleClasses::claude_code();
        let admission = admit(&tree, &classes, j_max, &mut SplitMix64::for_execution(run_seed, seed));
        prop_assert_eq!(check_disjoint(&admission), Ok(()));
        prop_assert_eq!(check_targets_sampled_on_path(&tree, &admission), Ok(()));
        prop_assert_eq!(check_j_max(&admission, j_max), Ok(()));
        prop_assert_eq!(check_priority(&tree, &classes, &admission, j_max), Ok(()));
        prop_assert_eq!(check_counts_and_weights(&admission, 3, 4), Ok(()));
        // Same seed ⇒ same admission, also on a tree rebuilt from its own records (replay).
        let again = admit(&tree, &classes, j_max, &mut SplitMix64::for_execution(run_seed, seed));
        prop_assert_eq!(&again, &admission);
        let replayed = random_execution(seed, main_calls, sub_agents);
        prop_assert_eq!(&replayed, &tree);
    }

    /// `Tree::records` gives back records that rebuild the same tree (a proxy restarting
    /// after the log was purged rebuilds its sessions from the projection's trees).
    #[test]
    fn a_tree_rebuilds_from_its_own_records(seed in any::<u64>(), main_calls in 1u32..30, sub_agents in 0u32..4) {
        let tree = random_execution(seed, main_calls, sub_agents);
        let mut rebuilt = Tree::new(tree.execution(), TreeConfig::default());
        for record in tree.records() {
            rebuilt.apply(&record).expect("each record applies");
        }
        rebuilt.validate();
        prop_assert_eq!(&rebuilt, &tree);
    }

    #[test]
    fn loss_does_not_depend_on_which_path_carries_a_target(
        seed in any::<u64>(), main_calls in 1u32..20, sub_agents in 0u32..3, advantage in -3.0f64..3.0, drift in 0.0f64..0.2, rotate in 0usize..5,
    ) {
        let tree = random_execution(seed, main_calls, sub_agents);
        let admission = admit(&tree, &RoleClasses::claude_code(), 5, &mut SplitMix64::for_execution(1, seed));
        let mut rng = SplitMix64::new(seed ^ 0x5EED);
        // Current log-probs per target token, keyed by token, so every carrier sees the same value.
        let current = |call: CallId, index: u32, behaviour: f32| -> f64 {
            let noise = ((call.get().wrapping_mul(31).wrapping_add(index as u64)) % 97) as f64 / 97.0;
            behaviour as f64 + drift * (noise - 0.5)
        };
        let token_of = |(call, index): (CallId, u32)| -> TargetToken {
            let node = tree.node(tree.node_of_call(call).expect("target call exists"));
            let behaviour = node.output_logprobs[index as usize];
            TargetToken { behaviour_logprob: behaviour as f64, current_logprob: current(call, index, behaviour) }
        };
        let all: Vec<(CallId, u32)> = admission.trajectories.iter().flat_map(target_tokens).collect();
        let baseline = objective(&[ExecutionTargets { advantage, targets: all.iter().copied().map(token_of).collect() }], 2, 2)
            .expect("valid batch");
        // Reassign the same target set to carriers in another order (a different path carrying
        // each shared target): rotate and shuffle the token list.
        let mut reassigned = all.clone();
        if !reassigned.is_empty() {
            let shift = rotate % reassigned.len();
            reassigned.rotate_left(shift);
            for index in (1..reassigned.len()).rev() {
                let other = rng.below(index as u64 + 1) as usize;
                reassigned.swap(index, other);
            }
        }
        let moved = objective(&[ExecutionTargets { advantage, targets: reassigned.iter().copied().map(token_of).collect() }], 2, 2)
            .expect("valid batch");
        prop_assert!((baseline.loss - moved.loss).abs() <= 1e-12 * (1.0 + baseline.loss.abs()));
        prop_assert_eq!(baseline.executions[0].clip_mask, moved.executions[0].clip_mask);
        let ratio_gap = (baseline.executions[0].sequence_ratio - moved.executions[0].sequence_ratio).abs();
        prop_assert!(ratio_gap <= 1e-12);
        // Per-token gradient coefficients follow the token, not its carrier.
        for (position, token) in reassigned.iter().enumerate() {
            let original = all.iter().position(|candidate| candidate == token).expect("same set");
            prop_assert_eq!(baseline.executions[0].coefficients[original], moved.executions[0].coefficients[position]);
        }
    }
}

#[test]
fn checkers_can_fail() {
    let tree = random_execution(42, 20, 2);
    let classes = RoleClasses::claude_code();
    let admission = admit(&tree, &classes, 5, &mut SplitMix64::for_execution(1, 42));
    assert!(
        admission.trajectories.len() >= 2,
        "the fixture admits several trajectories"
    );

    let mut overlapping = admission.clone();
    let first = overlapping.trajectories[0].clone();
    overlapping.trajectories[1]
        .targets
        .extend(first.targets.iter().copied());
    assert!(check_disjoint(&overlapping).is_err());

    let mut off_path = admission.clone();
    let foreign = admission.trajectories[1].targets.clone();
    off_path.trajectories[0].targets = foreign;
    assert!(
        check_targets_sampled_on_path(&tree, &off_path).is_err()
            || check_priority(&tree, &classes, &off_path, 5).is_err()
    );

    assert!(check_j_max(&admission, admission.trajectories.len() as u32 - 1).is_err());

    let mut reordered = admission.clone();
    reordered.trajectories.reverse();
    assert!(check_priority(&tree, &classes, &reordered, 5).is_err());

    let mut truncated = admission.clone();
    truncated.trajectories.pop();
    assert!(check_priority(&tree, &classes, &truncated, 5).is_err());

    let mut miscounted = admission.clone();
    miscounted.targets_count += 1;
    assert!(check_counts_and_weights(&miscounted, 1, 1).is_err());
}
