//! The reference loss on materialised rows agrees with the per-execution target set.

use gyre_event::ExecutionId;
use gyre_trajectory::synthetic::{build_tree, generate, SyntheticConfig};
use gyre_trajectory::{
    admit, materialise, objective, target_weight, ExecutionTargets, RoleClasses, SplitMix64,
    TargetToken, TreeConfig,
};

#[test]
fn rows_carry_weights_that_reproduce_the_batch_loss() {
    let (groups, executions_per_group) = (2u32, 3u32);
    let mut executions = Vec::new();
    let mut weighted_sum = 0.0;
    for seed in 0..(groups * executions_per_group) as u64 {
        let calls = generate(SyntheticConfig::small(12, 1), seed);
        let tree =
            build_tree(ExecutionId(seed), &calls, TreeConfig::default()).expect("calls apply");
        let admission = admit(
            &tree,
            &RoleClasses::claude_code(),
            5,
            &mut SplitMix64::for_execution(5, seed),
        );
        let advantage = seed as f64 - 2.5;
        let weight = target_weight(admission.targets_count, groups, executions_per_group);
        let mut targets = Vec::new();
        for trajectory in &admission.trajectories {
            let row = materialise(&tree, trajectory, advantage, weight)
                .expect("admitted rows materialise");
            for logprob in &row.behaviour_logprobs {
                // On-policy: ρ = 1, m = 1, ℓ_u = −Â log π (below the cap for these values).
                let token_loss = (-advantage * *logprob as f64).min(100.0);
                weighted_sum += row.target_weight * token_loss;
                targets.push(TargetToken {
                    behaviour_logprob: *logprob as f64,
                    current_logprob: *logprob as f64,
                });
            }
        }
        executions.push(ExecutionTargets { advantage, targets });
    }
    let batch = objective(&executions, groups, executions_per_group).expect("valid batch");
    assert!(
        (batch.loss - weighted_sum).abs() < 1e-9,
        "{} vs {}",
        batch.loss,
        weighted_sum
    );
}

#[test]
fn off_policy_ratio_is_capped_and_clip_mask_applies() {
    let tokens = vec![
        TargetToken {
            behaviour_logprob: -3.0,
            current_logprob: -0.5,
        }, // ρ = e^2.5 ≈ 12.2 → 5
        TargetToken {
            behaviour_logprob: -1.0,
            current_logprob: -1.0,
        },
    ];
    let positive = objective(
        &[ExecutionTargets {
            advantage: 1.0,
            targets: tokens.clone(),
        }],
        1,
        1,
    )
    .expect("valid");
    // s = exp(2.5/2) > 1.005 with Â > 0: masked, zero loss and zero gradients.
    assert_eq!(positive.executions[0].clip_mask, 0.0);
    assert_eq!(positive.loss, 0.0);
    assert!(positive.executions[0]
        .coefficients
        .iter()
        .all(|coefficient| *coefficient == 0.0));
    let negative = objective(
        &[ExecutionTargets {
            advantage: -1.0,
            targets: tokens,
        }],
        1,
        1,
    )
    .expect("valid");
    assert_eq!(negative.executions[0].clip_mask, 1.0);
    // ℓ = [−1·5·(−1)·(−0.5), −1·1·(−1)·(−1)] = [−2.5, −1]; 𝓛 = −1.75.
    assert!((negative.loss + 1.75).abs() < 1e-12);
    assert_eq!(negative.executions[0].coefficients, vec![2.5, 0.5]);
}
