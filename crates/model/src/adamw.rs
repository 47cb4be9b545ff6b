//! AdamW with a constant learning rate (as in the paper), over detached parameter tensors.

use candle_core::{Tensor, Var};

use crate::ModelError;

/// AdamW hyper-parameters; `learning_rate` stays constant across steps.
#[derive(Clone, Debug, PartialEq)]
pub struct AdamWConfig {
    pub learning_rate: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub epsilon: f64,
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        Self {
            learning_rate: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            epsilon: 1e-8,
            weight_decay: 0.01,
        }
    }
}

/// First and second moments per parameter and the step count.
pub struct AdamW {
    config: AdamWConfig,
    first_moments: Vec<Tensor>,
    second_moments: Vec<Tensor>,
    steps_count: u64,
}

impl AdamW {
    pub fn new(config: AdamWConfig, vars: &[Var]) -> Result<Self, ModelError> {
        let zeros = |var: &Var| var.as_tensor().detach().zeros_like();
        Ok(Self {
            config,
            first_moments: vars.iter().map(zeros).collect::<Result<_, _>>()?,
            second_moments: vars.iter().map(zeros).collect::<Result<_, _>>()?,
            steps_count: 0,
        })
    }

    pub fn steps_count(&self) -> u64 {
        self.steps_count
    }

    /// One update: θ ← θ − lr·(m̂ / (√v̂ + ε) + λθ), decoupled weight decay.
    pub fn step(&mut self, vars: &[Var], gradients: &[Tensor]) -> Result<(), ModelError> {
        let config = &self.config;
        self.steps_count += 1;
        let step = self.steps_count as i32;
        let first_correction = 1.0 - config.beta1.powi(step);
        let second_correction = 1.0 - config.beta2.powi(step);
        for (index, (var, gradient)) in vars.iter().zip(gradients).enumerate() {
            let first = ((&self.first_moments[index] * config.beta1)?
                + (gradient * (1.0 - config.beta1))?)?;
            let second = ((&self.second_moments[index] * config.beta2)?
                + (gradient.sqr()? * (1.0 - config.beta2))?)?;
            let parameter = var.as_tensor().detach();
            let update = (&first / first_correction)?
                .broadcast_div(&((&second / second_correction)?.sqrt()? + config.epsilon)?)?;
            let decayed = (&parameter * (1.0 - config.learning_rate * config.weight_decay))?;
            var.set(&(decayed - (update * config.learning_rate)?)?)?;
            self.first_moments[index] = first;
            self.second_moments[index] = second;
        }
        Ok(())
    }
}
