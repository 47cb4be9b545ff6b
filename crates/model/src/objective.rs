//! Eq (5)–(6) on tensors: the loss of one micro-step's targets, differentiable in log π_θ.
//!
//! For target u of execution i (paper symbols, as in `gyre_trajectory::objective`):
//! ρ_u = exp(log π_θ − log p_roll) (eq 5); ρ̄_u = sg(min(ρ_u, 5)); m_i the execution's clip
//! mask (computed from s_i over all of T_i before the micro-steps, see `Trainer::score`);
//! ℓ_u = min(100, −m_i ρ̄_u Â_i log π_θ); the micro-step's share of 𝓛 is Σ_u w_u ℓ_u with
//! w_u = 1/(L_i·B·N) (eq 6). The min's kink takes the uncapped side's gradient, as in the
//! reference. Stop-gradients are `detach`.

use candle_core::Tensor;

use crate::ModelError;
use gyre_trajectory::{TOKEN_LOSS_CAP, TOKEN_RATIO_CAP};

/// The constants of one micro-step's targets, in target order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TargetConstants {
    /// log p_roll (behaviour log-prob).
    pub behaviour_logprobs: Vec<f32>,
    /// Â_i of the target's execution.
    pub advantages: Vec<f32>,
    /// m_i of the target's execution.
    pub clip_masks: Vec<f32>,
    /// w_u = 1/(L_i·B·N).
    pub weights: Vec<f32>,
}

impl TargetConstants {
    pub fn len(&self) -> usize {
        self.behaviour_logprobs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.behaviour_logprobs.is_empty()
    }
}

/// Σ_u w_u ℓ_u as a scalar tensor, differentiable through `logprobs` `[n]`.
pub fn objective_loss(
    logprobs: &Tensor,
    constants: &TargetConstants,
) -> Result<Tensor, ModelError> {
    let count = constants.len();
    if logprobs.dims1()? != count {
        return Err(ModelError::input(format!(
            "{} log-probs for {count} targets",
            logprobs.dims1()?
        )));
    }
    let device = logprobs.device();
    let vector = |values: &[f32]| Tensor::from_slice(values, count, device);
    let behaviour = vector(&constants.behaviour_logprobs)?;
    let advantages = vector(&constants.advantages)?;
    let masks = vector(&constants.clip_masks)?;
    let weights = vector(&constants.weights)?;
    // ρ̄_u = sg(min(ρ_u, 5)), ρ_u = π_θ / p_roll (eq 5).
    let ratio_capped = (logprobs.detach() - behaviour)?
        .exp()?
        .minimum(TOKEN_RATIO_CAP)?;
    // −m_i ρ̄_u Â_i: a constant slope per target.
    let slope = (masks * ratio_capped)?.mul(&advantages)?.neg()?;
    let uncapped = (slope * logprobs)?;
    // ℓ_u = min(100, ·): capped targets become the constant 100.
    let capped = uncapped
        .detach()
        .gt(TOKEN_LOSS_CAP)?
        .to_dtype(candle_core::DType::F32)?;
    let kept = capped.affine(-1.0, 1.0)?;
    let token_losses = ((uncapped * kept)? + (capped * TOKEN_LOSS_CAP)?)?;
    Ok((token_losses * weights)?.sum_all()?)
}
