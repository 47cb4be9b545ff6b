//! [`Trainer`]: eq (5)–(6) over packed micro-steps, gradient accumulation, clipping, AdamW.
//!
//! One optimizer step over a batch of packed rows (`gyre_trajectory::Row`) runs in two passes.
//! `score` computes the current log π_θ of every target with the weights frozen and derives each
//! execution's s_i and clip mask m_i over its whole target set T_i, which may span rows and
//! micro-steps. `accumulate` then runs each micro-step forward with a graph: the loss of its
//! targets is built by `objective_loss`, its gradient with respect to the targets' log-probs
//! (the per-token coefficients) comes from one small backward, and the model's gradient from a
//! second backward of Σ coefficient·log π — the chain rule split at the log-probs. Gradients
//! sum over micro-steps (the 1/(L_i·B·N) weights are already in the loss), then `apply` clips
//! their global norm and takes one AdamW step. Gradients can leave and re-enter as flat buffers
//! (the all-reduce) between the two.

use std::collections::BTreeMap;

use candle_core::{Device, Tensor, Var};
use gyre_engine::WeightManifest;
use gyre_event::{ExecutionId, PolicyVersion};
use gyre_trajectory::{clip_mask, Row};

use crate::adamw::{AdamW, AdamWConfig};
use crate::objective::{objective_loss, TargetConstants};
use crate::weights::{manifest_layout, pack, unpack};
use crate::{ModelError, Policy};

/// Trainer settings.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainerConfig {
    pub optimizer: AdamWConfig,
    /// The global gradient norm is scaled down to at most this.
    pub gradient_norm_max: f64,
    /// log π_θ is taken on logits / temperature, matching the sampler's temperature so that
    /// the trainer's log-probs equal the behaviour log-probs at equal weights.
    pub temperature: f64,
}

impl Default for TrainerConfig {
    fn default() -> Self {
        Self {
            optimizer: AdamWConfig::default(),
            gradient_norm_max: 1.0,
            temperature: 1.0,
        }
    }
}

/// s_i and m_i of one execution, from the scoring pass.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ExecutionRatio {
    pub sequence_ratio: f64,
    pub clip_mask: f64,
}

/// One target's outcome in a micro-step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TargetOutcome {
    /// Index of the row in the micro-step.
    pub row: usize,
    /// Row position of the target token.
    pub position: u64,
    /// log π_θ(y_u|c_u) at the current weights.
    pub current_logprob: f32,
    /// ∂𝓛/∂log π_θ(y_u|c_u) from autograd.
    pub coefficient: f32,
}

/// One micro-step's loss share and per-target outcomes.
#[derive(Clone, Debug, PartialEq)]
pub struct MicroStepOutcome {
    pub loss: f64,
    pub targets: Vec<TargetOutcome>,
}

/// What one optimizer step did.
#[derive(Clone, Debug, PartialEq)]
pub struct StepReport {
    /// 𝓛 summed over the micro-steps.
    pub loss: f64,
    /// Global gradient norm before clipping.
    pub gradient_norm: f64,
    pub clipped: bool,
    pub micro_steps_count: usize,
    pub targets_count: usize,
    pub executions: BTreeMap<ExecutionId, ExecutionRatio>,
    /// The policy version after the step.
    pub version: PolicyVersion,
}

/// A micro-step laid out as one padded batch `[R, T]` with its targets flattened.
struct PackedBatch {
    tokens: Tensor,
    /// Index into the flattened hidden states `[R·T, d]` of the position predicting each target.
    hidden_rows: Vec<u32>,
    target_ids: Vec<u32>,
    target_places: Vec<(usize, u64)>,
    target_executions: Vec<ExecutionId>,
    constants: TargetConstants,
}

/// The optimizer owner: a [`Policy`], its AdamW state and the accumulated gradients.
pub struct Trainer {
    policy: Policy,
    config: TrainerConfig,
    optimizer: AdamW,
    gradients: Option<Vec<Tensor>>,
    micro_steps_accumulated: usize,
    version: PolicyVersion,
}

impl Trainer {
    pub fn new(policy: Policy, config: TrainerConfig) -> Result<Self, ModelError> {
        if !(config.gradient_norm_max > 0.0 && config.temperature > 0.0) {
            return Err(ModelError::config(
                "gradient_norm_max",
                "gradient_norm_max and temperature must be positive",
            ));
        }
        let optimizer = AdamW::new(config.optimizer.clone(), policy.vars())?;
        Ok(Self {
            policy,
            config,
            optimizer,
            gradients: None,
            micro_steps_accumulated: 0,
            version: PolicyVersion(0),
        })
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    pub fn version(&self) -> PolicyVersion {
        self.version
    }

    /// Scoring pass: s_i and m_i for every execution with targets in `rows`.
    pub fn score(
        &self,
        rows: &[Row],
        micro_steps: &[Vec<usize>],
    ) -> Result<BTreeMap<ExecutionId, ExecutionRatio>, ModelError> {
        let mut sums: BTreeMap<ExecutionId, (f64, u64, f64)> = BTreeMap::new();
        for micro_step in micro_steps {
            let batch = self.pack(rows, micro_step, &BTreeMap::new())?;
            let logprobs = self.batch_logprobs(&batch)?;
            for (index, logprob) in logprobs.iter().enumerate() {
                let entry = sums
                    .entry(batch.target_executions[index])
                    .or_insert((0.0, 0, 0.0));
                entry.0 += *logprob as f64 - batch.constants.behaviour_logprobs[index] as f64;
                entry.1 += 1;
                entry.2 = batch.constants.advantages[index] as f64;
            }
        }
        Ok(sums
            .into_iter()
            .map(|(execution, (log_ratio_sum, count, advantage))| {
                // s_i = sg[exp(mean_u log ρ_u)]; m_i from its side of the band.
                let sequence_ratio = (log_ratio_sum / count as f64).exp();
                let ratio = ExecutionRatio {
                    sequence_ratio,
                    clip_mask: clip_mask(sequence_ratio, advantage),
                };
                (execution, ratio)
            })
            .collect())
    }

    /// log π_θ of every target of one micro-step at the current weights (no graph), in target
    /// order: rows in micro-step order, spans ascending.
    pub fn current_logprobs(
        &self,
        rows: &[Row],
        micro_step: &[usize],
    ) -> Result<Vec<f32>, ModelError> {
        self.batch_logprobs(&self.pack(rows, micro_step, &BTreeMap::new())?)
    }

    fn batch_logprobs(&self, batch: &PackedBatch) -> Result<Vec<f32>, ModelError> {
        if batch.target_ids.is_empty() {
            return Ok(Vec::new());
        }
        let model = self.policy.inference();
        let hidden = self.flat_hidden(&model.hidden_states(&batch.tokens, None)?)?;
        Ok(model
            .target_logprobs(
                &hidden,
                &batch.hidden_rows,
                &batch.target_ids,
                self.config.temperature,
            )?
            .to_vec1::<f32>()?)
    }

    /// Forward and backward of one micro-step; adds its gradient to the accumulator.
    pub fn accumulate(
        &mut self,
        rows: &[Row],
        micro_step: &[usize],
        ratios: &BTreeMap<ExecutionId, ExecutionRatio>,
    ) -> Result<MicroStepOutcome, ModelError> {
        let batch = self.pack(rows, micro_step, ratios)?;
        self.micro_steps_accumulated += 1;
        if batch.target_ids.is_empty() {
            return Ok(MicroStepOutcome {
                loss: 0.0,
                targets: Vec::new(),
            });
        }
        let tensors = self.policy.tracked_tensors();
        let model = self.policy.tracked(&tensors);
        let hidden = self.flat_hidden(&model.hidden_states(&batch.tokens, None)?)?;
        let logprobs = model.target_logprobs(
            &hidden,
            &batch.hidden_rows,
            &batch.target_ids,
            self.config.temperature,
        )?;
        // ∂𝓛/∂log π through the loss's own ops, with log π as a leaf.
        let logprob_leaf = Var::from_tensor(&logprobs.detach())?;
        let loss = objective_loss(logprob_leaf.as_tensor(), &batch.constants)?;
        let loss_value = loss.to_scalar::<f32>()? as f64;
        let coefficients = loss
            .backward()?
            .get(logprob_leaf.as_tensor())
            .cloned()
            .unwrap_or(logprob_leaf.as_tensor().zeros_like()?);
        // ∂𝓛/∂θ = Σ_u coefficient_u ∂log π_u/∂θ.
        let surrogate = (logprobs.clone() * coefficients.detach())?.sum_all()?;
        let gradients = surrogate.backward()?;
        let mut accumulated = match self.gradients.take() {
            Some(accumulated) => accumulated,
            None => self.zero_gradients()?,
        };
        for (sum, var) in accumulated.iter_mut().zip(self.policy.vars()) {
            if let Some(gradient) = gradients.get(var.as_tensor()) {
                *sum = (&*sum + gradient)?;
            }
        }
        self.gradients = Some(accumulated);
        let current = logprobs.to_vec1::<f32>()?;
        let coefficients = coefficients.to_vec1::<f32>()?;
        let targets = batch
            .target_places
            .iter()
            .enumerate()
            .map(|(index, &(row, position))| TargetOutcome {
                row,
                position,
                current_logprob: current[index],
                coefficient: coefficients[index],
            })
            .collect();
        Ok(MicroStepOutcome {
            loss: loss_value,
            targets,
        })
    }

    /// The accumulated gradients as one flat buffer in the weight manifest's layout.
    pub fn export_gradients(&self) -> Result<(WeightManifest, Vec<u8>), ModelError> {
        let gradients = match &self.gradients {
            Some(gradients) => gradients.clone(),
            None => self.zero_gradients()?,
        };
        pack(manifest_layout(&self.policy, self.version), &gradients)
    }

    /// Replaces the accumulated gradients (e.g. with the all-reduced sum).
    pub fn import_gradients(
        &mut self,
        manifest: &WeightManifest,
        buffer: &[u8],
    ) -> Result<(), ModelError> {
        let expected = manifest_layout(&self.policy, manifest.version);
        self.gradients = Some(unpack(&expected, manifest, buffer)?);
        Ok(())
    }

    /// Clips the accumulated gradient's global norm, takes one AdamW step, clears the
    /// accumulator and advances the version. Returns (norm before clipping, whether clipped).
    pub fn apply(&mut self) -> Result<(f64, bool), ModelError> {
        let gradients = match self.gradients.take() {
            Some(gradients) => gradients,
            None => self.zero_gradients()?,
        };
        let mut squared = 0.0f64;
        for gradient in &gradients {
            squared += gradient.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
        }
        let norm = squared.sqrt();
        let clipped = norm > self.config.gradient_norm_max;
        let gradients = if clipped {
            let scale = self.config.gradient_norm_max / norm;
            gradients
                .iter()
                .map(|gradient| gradient * scale)
                .collect::<Result<Vec<_>, _>>()?
        } else {
            gradients
        };
        self.optimizer.step(self.policy.vars(), &gradients)?;
        self.micro_steps_accumulated = 0;
        self.version = PolicyVersion(self.version.get() + 1);
        Ok((norm, clipped))
    }

    /// A whole optimizer step: score, accumulate every micro-step, clip, AdamW.
    pub fn train_step(
        &mut self,
        rows: &[Row],
        micro_steps: &[Vec<usize>],
    ) -> Result<StepReport, ModelError> {
        let ratios = self.score(rows, micro_steps)?;
        let mut loss = 0.0;
        let mut targets_count = 0;
        for micro_step in micro_steps {
            let outcome = self.accumulate(rows, micro_step, &ratios)?;
            loss += outcome.loss;
            targets_count += outcome.targets.len();
        }
        let (gradient_norm, clipped) = self.apply()?;
        Ok(StepReport {
            loss,
            gradient_norm,
            clipped,
            micro_steps_count: micro_steps.len(),
            targets_count,
            executions: ratios,
            version: self.version,
        })
    }

    fn zero_gradients(&self) -> Result<Vec<Tensor>, ModelError> {
        Ok(self
            .policy
            .vars()
            .iter()
            .map(|var| var.as_tensor().detach().zeros_like())
            .collect::<Result<_, _>>()?)
    }

    fn flat_hidden(&self, hidden: &Tensor) -> Result<Tensor, ModelError> {
        let (batch, length, dim) = hidden.dims3()?;
        Ok(hidden.reshape((batch * length, dim))?)
    }

    fn pack(
        &self,
        rows: &[Row],
        micro_step: &[usize],
        ratios: &BTreeMap<ExecutionId, ExecutionRatio>,
    ) -> Result<PackedBatch, ModelError> {
        let config = self.policy.config();
        let mut selected = Vec::with_capacity(micro_step.len());
        for &index in micro_step {
            let row = rows.get(index).ok_or_else(|| {
                ModelError::input(format!("micro-step names row {index} of {}", rows.len()))
            })?;
            if row.tokens.is_empty() || row.tokens.len() > config.context_tokens_max {
                return Err(ModelError::input(format!(
                    "row {index} has {} tokens; the model takes 1..={}",
                    row.tokens.len(),
                    config.context_tokens_max
                )));
            }
            if row.behaviour_logprobs.len() as u64 != row.targets_count() {
                return Err(ModelError::input(format!(
                    "row {index} has {} behaviour log-probs for {} targets",
                    row.behaviour_logprobs.len(),
                    row.targets_count()
                )));
            }
            selected.push(row);
        }
        let length = selected
            .iter()
            .map(|row| row.tokens.len())
            .max()
            .unwrap_or(1);
        let mut tokens = Vec::with_capacity(selected.len() * length);
        let mut batch = PackedBatch {
            tokens: Tensor::zeros(1, candle_core::DType::U32, &Device::Cpu)?,
            hidden_rows: Vec::new(),
            target_ids: Vec::new(),
            target_places: Vec::new(),
            target_executions: Vec::new(),
            constants: TargetConstants::default(),
        };
        for (row_index, row) in selected.iter().enumerate() {
            if let Some(token) = row
                .tokens
                .iter()
                .find(|&&token| token as usize >= config.vocab_size)
            {
                return Err(ModelError::input(format!(
                    "row {row_index} holds token {token}, outside the vocabulary of {}",
                    config.vocab_size
                )));
            }
            tokens.extend_from_slice(&row.tokens);
            tokens.extend(std::iter::repeat_n(0, length - row.tokens.len()));
            let mask = ratios
                .get(&row.execution)
                .map(|ratio| ratio.clip_mask)
                .unwrap_or(1.0);
            let mut behaviour = row.behaviour_logprobs.iter();
            for &(start, end) in &row.target_spans {
                if start == 0 || end > row.tokens.len() as u64 || start >= end {
                    return Err(ModelError::input(format!(
                        "row {row_index} has target span [{start}, {end}) outside 1..{}",
                        row.tokens.len()
                    )));
                }
                for position in start..end {
                    batch
                        .hidden_rows
                        .push((row_index * length + position as usize - 1) as u32);
                    batch.target_ids.push(row.tokens[position as usize]);
                    batch.target_places.push((row_index, position));
                    batch.target_executions.push(row.execution);
                    let constants = &mut batch.constants;
                    constants
                        .behaviour_logprobs
                        .push(*behaviour.next().expect("counts were checked above"));
                    constants.advantages.push(row.advantage as f32);
                    constants.clip_masks.push(mask as f32);
                    constants.weights.push(row.target_weight as f32);
                }
            }
        }
        batch.tokens = Tensor::from_vec(tokens, (selected.len(), length), &Device::Cpu)?;
        Ok(batch)
    }
}
