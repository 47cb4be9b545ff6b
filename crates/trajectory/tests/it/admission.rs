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
