//! Admission draws: seeded determinism and draw frequencies ∝ unmasked trainable tokens.

use gyre_trajectory::{admit, RoleClasses, SplitMix64};

use crate::support::build;

/// One root with output 1 and three main leaves with 2, 6 and 10 own output tokens: path weights
/// 3, 7 and 11 before any draw; after drawing the heaviest, the others weigh 2 and 6.
const THREE_LEAVES: &str = "
    c1 main turn: 1 -> 10
    c2 main turn: 1 10 2 -> 20 21
    c3 main turn: 1 10 3 -> 30 31 32 33 34 35
    c4 main turn: 1 10 4 -> 40 41 42 43 44 45 46 47 48 49
";

fn chi_square(observed: &[u64], expected_share: &[f64]) -> f64 {
    let total: u64 = observed.iter().sum();
    observed
        .iter()
        .zip(expected_share)
        .map(|(seen, share)| {
            let expected = share * total as f64;
            (*seen as f64 - expected).powi(2) / expected
        })
        .sum()
}

#[test]
fn first_draw_frequencies_follow_unmasked_tokens() {
    let tree = build(THREE_LEAVES);
    let classes = RoleClasses::claude_code();
    let mut counts = [0u64; 3];
    for seed in 0..21_000u64 {
        let admission = admit(&tree, &classes, 1, &mut SplitMix64::for_execution(seed, 1));
        let leaf = admission.trajectories[0].leaf_call.get();
        counts[(leaf - 2) as usize] += 1;
    }
    // χ² with 2 degrees of freedom; 13.8 is the 99.9% quantile. Seeds are fixed, so this either
    // always passes or always fails.
    let statistic = chi_square(&counts, &[3.0 / 21.0, 7.0 / 21.0, 11.0 / 21.0]);
    assert!(statistic < 13.8, "counts {counts:?}, χ² = {statistic}");
}

#[test]
fn later_draws_are_reweighted_by_the_mask() {
    let tree = build(THREE_LEAVES);
    let classes = RoleClasses::claude_code();
    let mut counts = [0u64; 2];
    for seed in 0..40_000u64 {
        let admission = admit(&tree, &classes, 2, &mut SplitMix64::for_execution(seed, 1));
        if admission.trajectories[0].leaf_call.get() == 4 {
            counts[(admission.trajectories[1].leaf_call.get() - 2) as usize] += 1;
        }
    }
    let statistic = chi_square(&counts, &[2.0 / 8.0, 6.0 / 8.0]);
    assert!(statistic < 10.8, "counts {counts:?}, χ² = {statistic}");
}

#[test]
fn same_seed_same_admission_and_other_seeds_differ() {
    let tree = build(THREE_LEAVES);
    let classes = RoleClasses::claude_code();
    let first = admit(&tree, &classes, 3, &mut SplitMix64::for_execution(9, 1));
    let second = admit(&tree, &classes, 3, &mut SplitMix64::for_execution(9, 1));
    assert_eq!(first, second);
    let orders: std::collections::BTreeSet<Vec<u64>> = (0..50u64)
        .map(|seed| {
            admit(&tree, &classes, 3, &mut SplitMix64::for_execution(seed, 1))
                .trajectories
                .iter()
                .map(|trajectory| trajectory.leaf_call.get())
                .collect()
        })
        .collect();
    assert!(orders.len() > 1, "the seed must matter");
}

#[test]
fn admission_stops_when_nothing_trainable_is_left() {
    let tree = build(THREE_LEAVES);
    let admission = admit(
        &tree,
        &RoleClasses::claude_code(),
        10,
        &mut SplitMix64::for_execution(3, 1),
    );
    assert_eq!(admission.trajectories.len(), 3);
    assert_eq!(admission.targets_count, 1 + 2 + 6 + 10);
}

/// Builds `script` with the answer-format constraints given as (call, constrained leading
/// outputs) applied to those calls' records, as the proxy writes them.
fn build_constrained(script: &str, constrained: &[(u64, u32)]) -> gyre_trajectory::Tree {
    let plain = build(script);
    let mut tree = gyre_trajectory::Tree::new(plain.execution(), Default::default());
    for mut record in plain.records() {
        if let Some((_, count)) = constrained
            .iter()
            .find(|(call, _)| *call == record.call.get())
        {
            record.output_constraint = Some(gyre_event::OutputConstraint {
                schema: Some(r#"{"type":"object"}"#.into()),
                enforced: *count as usize == record.output_ids.len(),
                constrained_tokens: *count,
            });
        }
        tree.apply(&record).expect("constrained records apply");
    }
    tree.validate();
    tree
}

/// Outputs sampled under an engine's grammar carry the masked distribution's log-probs, which
/// a trainer's recomputed log-probs cannot match: they stay context and are never targets,
/// also when a failover left only the first few of a call's outputs constrained.
#[test]
fn outputs_sampled_under_a_grammar_are_never_targets() {
    let tree = build_constrained(THREE_LEAVES, &[(3, 6), (4, 4)]);
    let classes = RoleClasses::claude_code();
    for seed in 0..200u64 {
        let admission = admit(&tree, &classes, 5, &mut SplitMix64::for_execution(seed, 1));
        let mut by_call = std::collections::BTreeMap::new();
        for trajectory in &admission.trajectories {
            for range in &trajectory.targets {
                by_call
                    .entry(range.call.get())
                    .or_insert_with(Vec::new)
                    .push((range.start, range.end));
            }
        }
        assert!(
            !by_call.contains_key(&3),
            "call 3 was sampled wholly under the grammar: {by_call:?}"
        );
        assert_eq!(
            by_call.get(&4),
            Some(&vec![(4, 10)]),
            "call 4's first four outputs were constrained, the other six are targets"
        );
        // Every trainable token is admitted once: c1 (1), c2 (2), c4's last six.
        assert_eq!(admission.targets_count, 1 + 2 + 6);
        // c3's leaf has nothing trainable of its own: drawn only for c1's token, if first.
        assert!(admission.trajectories.len() <= 3);
    }
    // Without the constraints the same tree admits every output.
    let plain = build(THREE_LEAVES);
    let admission = admit(&plain, &classes, 5, &mut SplitMix64::for_execution(7, 1));
    assert_eq!(admission.targets_count, 1 + 2 + 6 + 10);
}
