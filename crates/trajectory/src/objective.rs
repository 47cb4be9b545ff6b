//! The execution-level objective: weights 1/L_i and 1/(B·N), and a reference loss.
//!
//! This is the paper's eq (5)–(6) (a GSPO variant) in plain f64, so that the trainer written
//! later can be tested against it token by token. For execution i with admitted target set T_i
//! (|T_i| = L_i) and group-relative advantage Â_i:
//!
//! - ρ_u = π_θ(y_u|c_u) / p_u^roll (eq 5), from log-probs: exp(log π − log p_roll);
//! - s_i = sg[exp((1/L_i) Σ_{u∈T_i} log ρ_u)], for monitoring and the clip mask;
//! - m_i = 0 if Â_i > 0 and s_i > 1.005, 0 if Â_i < 0 and s_i < 0.995, else 1;
//! - ρ̄_u = sg(min(ρ_u, 5));
//! - ℓ_u = min(100, −m_i ρ̄_u Â_i log π_θ(y_u|c_u));
//! - 𝓛_i = (1/L_i) Σ_{u∈T_i} ℓ_u (eq 6), and 0 when L_i = 0;
//! - 𝓛 = (1/(B·N)) Σ_i 𝓛_i over all B·N original executions (missing ones count as zero).
//!
//! The gradient coefficient of token u is ∂𝓛/∂log π_θ(y_u|c_u) with ρ̄ and m held constant
//! (they are stop-gradients): −m_i ρ̄_u Â_i / (L_i·B·N) while ℓ_u is below the cap, 0 once the
//! cap binds (ℓ_u = 100 exactly counts as below: the subgradient of min at the kink is taken
//! from the uncapped side). Everything depends only on the *set* T_i, never on which admitted
//! path carries a target, which is the invariance of eq (6).

use crate::TrajectoryError;

/// Token importance ratio cap (ρ̄ = min(ρ, 5)).
pub const TOKEN_RATIO_CAP: f64 = 5.0;
/// Sequence-ratio clip bound for positive advantages.
pub const SEQUENCE_RATIO_HIGH: f64 = 1.005;
/// Sequence-ratio clip bound for negative advantages.
pub const SEQUENCE_RATIO_LOW: f64 = 0.995;
/// Per-token loss cap.
pub const TOKEN_LOSS_CAP: f64 = 100.0;

/// One target token: its behaviour log-prob (recorded) and its log-prob under π_θ.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TargetToken {
    pub behaviour_logprob: f64,
    pub current_logprob: f64,
}

/// One execution's input to the loss: its advantage and all admitted targets (T_i).
#[derive(Clone, Debug, PartialEq)]
pub struct ExecutionTargets {
    pub advantage: f64,
    pub targets: Vec<TargetToken>,
}

/// One execution's share of the loss.
#[derive(Clone, Debug, PartialEq)]
pub struct ExecutionLoss {
    /// s_i; 1 when L_i = 0.
    pub sequence_ratio: f64,
    /// m_i.
    pub clip_mask: f64,
    /// 𝓛_i (before the 1/(B·N) batch weight).
    pub loss: f64,
    /// ∂𝓛/∂log π_θ(y_u|c_u) for each target, in input order (batch weight included).
    pub coefficients: Vec<f64>,
}

/// The batch loss and its per-execution parts.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchLoss {
    pub loss: f64,
    pub executions: Vec<ExecutionLoss>,
}

/// The weight of one admitted target of an execution with L_i targets in a batch of B·N
/// executions: 1/(L_i·B·N); 0 when L_i = 0.
pub fn target_weight(targets_count: u64, groups: u32, executions_per_group: u32) -> f64 {
    if targets_count == 0 || groups == 0 || executions_per_group == 0 {
        return 0.0;
    }
    1.0 / (targets_count as f64 * groups as f64 * executions_per_group as f64)
}

/// The clip mask m_i from the sequence ratio and the advantage's sign.
pub fn clip_mask(sequence_ratio: f64, advantage: f64) -> f64 {
    if (advantage > 0.0 && sequence_ratio > SEQUENCE_RATIO_HIGH)
        || (advantage < 0.0 && sequence_ratio < SEQUENCE_RATIO_LOW)
    {
        0.0
    } else {
        1.0
    }
}

fn execution_loss(execution: &ExecutionTargets, batch_executions: f64) -> ExecutionLoss {
    let targets_count = execution.targets.len();
    if targets_count == 0 {
        return ExecutionLoss {
            sequence_ratio: 1.0,
            clip_mask: 1.0,
            loss: 0.0,
            coefficients: Vec::new(),
        };
    }
    let count = targets_count as f64;
    let mean_log_ratio: f64 = execution
        .targets
        .iter()
        .map(|target| target.current_logprob - target.behaviour_logprob)
        .sum::<f64>()
        / count;
    let sequence_ratio = mean_log_ratio.exp();
    let mask = clip_mask(sequence_ratio, execution.advantage);
    let mut loss_sum = 0.0;
    let mut coefficients = Vec::with_capacity(targets_count);
    for target in &execution.targets {
        let ratio = (target.current_logprob - target.behaviour_logprob).exp();
        let ratio_capped = ratio.min(TOKEN_RATIO_CAP);
        let slope = -mask * ratio_capped * execution.advantage;
        let uncapped = slope * target.current_logprob;
        let (token_loss, gradient) = if uncapped > TOKEN_LOSS_CAP {
            (TOKEN_LOSS_CAP, 0.0)
        } else {
            (uncapped, slope)
        };
        loss_sum += token_loss;
        // +0.0 turns a −0.0 (zero advantage or mask) into a plain zero.
        coefficients.push(gradient / (count * batch_executions) + 0.0);
    }
    ExecutionLoss {
        sequence_ratio,
        clip_mask: mask,
        loss: loss_sum / count + 0.0,
        coefficients,
    }
}

/// The reference loss of a batch of B groups × N executions. `executions` lists the executions
/// that have targets or advantages; executions not listed (excluded, or with L_i = 0) add zero
/// but still count in the B·N denominator.
pub fn objective(
    executions: &[ExecutionTargets],
    groups: u32,
    executions_per_group: u32,
) -> Result<BatchLoss, TrajectoryError> {
    let batch_executions = groups as u64 * executions_per_group as u64;
    if batch_executions == 0 {
        return Err(TrajectoryError::Config {
            field: "b·n",
            message: "must be at least 1".into(),
        });
    }
    if executions.len() as u64 > batch_executions {
        return Err(TrajectoryError::Config {
            field: "b·n",
            message: format!(
                "{} executions given for a batch of {batch_executions}",
                executions.len()
            ),
        });
    }
    let parts: Vec<ExecutionLoss> = executions
        .iter()
        .map(|execution| execution_loss(execution, batch_executions as f64))
        .collect();
    let loss = parts.iter().map(|part| part.loss).sum::<f64>() / batch_executions as f64;
    Ok(BatchLoss {
        loss,
        executions: parts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(behaviour: f64, current: f64) -> TargetToken {
        TargetToken {
            behaviour_logprob: behaviour,
            current_logprob: current,
        }
    }

    #[test]
    fn on_policy_loss_is_mean_negative_logprob_times_advantage() {
        let execution = ExecutionTargets {
            advantage: 1.0,
            targets: vec![token(-1.0, -1.0), token(-3.0, -3.0)],
        };
        let batch = objective(&[execution], 1, 2).expect("valid batch");
        // 𝓛_i = (1 + 3)/2 = 2; 𝓛 = 2 / (B·N = 2) = 1.
        assert!((batch.loss - 1.0).abs() < 1e-12);
        assert_eq!(batch.executions[0].coefficients, vec![-0.25, -0.25]);
    }

    #[test]
    fn clip_mask_follows_the_advantage_sign() {
        assert_eq!(clip_mask(1.01, 1.0), 0.0);
        assert_eq!(clip_mask(1.01, -1.0), 1.0);
        assert_eq!(clip_mask(0.99, -1.0), 0.0);
        assert_eq!(clip_mask(0.99, 1.0), 1.0);
        assert_eq!(clip_mask(2.0, 0.0), 1.0);
    }

    #[test]
    fn token_loss_cap_zeroes_the_gradient() {
        let execution = ExecutionTargets {
            advantage: -1.0,
            targets: vec![token(-200.0, -200.0)],
        };
        let batch = objective(&[execution], 1, 1).expect("valid batch");
        // −m ρ̄ Â log π = −1·1·(−1)·(−200) = −200: below the cap, gradient stays.
        assert_eq!(batch.executions[0].coefficients, vec![1.0]);
        let execution = ExecutionTargets {
            advantage: 1.0,
            targets: vec![token(-200.0, -200.0)],
        };
        let batch = objective(&[execution], 1, 1).expect("valid batch");
        assert_eq!(batch.loss, TOKEN_LOSS_CAP);
        assert_eq!(batch.executions[0].coefficients, vec![0.0]);
    }

    #[test]
    fn empty_execution_contributes_zero() {
        let batch = objective(
            &[ExecutionTargets {
                advantage: 3.0,
                targets: vec![],
            }],
            2,
            2,
        )
        .expect("valid");
        assert_eq!(batch.loss, 0.0);
        assert_eq!(target_weight(0, 2, 2), 0.0);
        assert_eq!(target_weight(4, 2, 2), 1.0 / 16.0);
    }
}
