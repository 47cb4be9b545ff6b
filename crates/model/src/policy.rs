//! [`Policy`]: the parameters of one model, as candle `Var`s, plus its RoPE tables.
//!
//! The trainer differentiates through the `Var`s; sampling and scoring use detached views that
//! share their storage (so an optimizer step is visible to both, and inference records no graph).

use candle_core::{DType, Device, Tensor, Var};

use crate::init::{initial_values, parameter_specs, ParameterSpec};
use crate::ops;
use crate::transformer::Transformer;
use crate::{ModelConfig, ModelError};

/// A decoder-only transformer's parameters.
pub struct Policy {
    config: ModelConfig,
    specs: Vec<ParameterSpec>,
    vars: Vec<Var>,
    detached: Vec<Tensor>,
    cos: Tensor,
    sin: Tensor,
}

impl std::fmt::Debug for Policy {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Policy")
            .field("config", &self.config)
            .field("parameters_count", &self.parameters_count())
            .finish()
    }
}

impl Policy {
    /// A freshly initialised model; same `config` and `seed` ⇒ bit-identical weights.
    pub fn new(config: ModelConfig, seed: u64) -> Result<Self, ModelError> {
        config.validate()?;
        let specs = parameter_specs(&config);
        let device = Device::Cpu;
        let tensors = specs
            .iter()
            .enumerate()
            .map(|(index, spec)| {
                Tensor::from_vec(
                    initial_values(spec, seed, index),
                    spec.shape.clone(),
                    &device,
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        Self::from_tensors(config, tensors)
    }

    /// A model from parameter tensors in canonical order (shapes are checked).
    pub fn from_tensors(config: ModelConfig, tensors: Vec<Tensor>) -> Result<Self, ModelError> {
        config.validate()?;
        let specs = parameter_specs(&config);
        if tensors.len() != specs.len() {
            return Err(ModelError::weights(format!(
                "{} tensors given, the config has {}",
                tensors.len(),
                specs.len()
            )));
        }
        let mut vars = Vec::with_capacity(specs.len());
        for (spec, tensor) in specs.iter().zip(tensors) {
            if tensor.dims() != spec.shape.as_slice() {
                return Err(ModelError::weights(format!(
                    "{} has shape {:?}, expected {:?}",
                    spec.name,
                    tensor.dims(),
                    spec.shape
                )));
            }
            vars.push(Var::from_tensor(
                &tensor.to_dtype(DType::F32)?.contiguous()?,
            )?);
        }
        let detached = vars.iter().map(|var| var.as_tensor().detach()).collect();
        let (cos, sin) = ops::rope_tables(
            config.head_dim(),
            config.context_tokens_max,
            config.rope_base,
            &Device::Cpu,
        )?;
        Ok(Self {
            config,
            specs,
            vars,
            detached,
            cos,
            sin,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn specs(&self) -> &[ParameterSpec] {
        &self.specs
    }

    pub fn vars(&self) -> &[Var] {
        &self.vars
    }

    pub fn parameters_count(&self) -> usize {
        self.specs.iter().map(ParameterSpec::elements_count).sum()
    }

    /// The model over detached parameters: inference, no graph.
    pub fn inference(&self) -> Transformer<'_> {
        Transformer {
            config: &self.config,
            tensors: &self.detached,
            cos: &self.cos,
            sin: &self.sin,
        }
    }

    /// The model over the trainable `Var`s plus the tensor list it reads (for `backward`).
    pub fn tracked<'a>(&'a self, tensors: &'a [Tensor]) -> Transformer<'a> {
        Transformer {
            config: &self.config,
            tensors,
            cos: &self.cos,
            sin: &self.sin,
        }
    }

    /// The `Var`s as tensors, for [`Self::tracked`].
    pub fn tracked_tensors(&self) -> Vec<Tensor> {
        self.vars
            .iter()
            .map(|var| var.as_tensor().clone())
            .collect()
    }

    /// Overwrites parameter `index` in place (shape must match).
    pub fn set_parameter(&self, index: usize, values: &Tensor) -> Result<(), ModelError> {
        let var = self
            .vars
            .get(index)
            .ok_or_else(|| ModelError::weights(format!("no parameter number {index}")))?;
        var.set(values)?;
        Ok(())
    }

    /// The current values of every parameter, in canonical order.
    pub fn parameter_values(&self) -> Result<Vec<Vec<f32>>, ModelError> {
        self.detached
            .iter()
            .map(|tensor| Ok(tensor.flatten_all()?.to_vec1::<f32>()?))
            .collect()
    }
}
