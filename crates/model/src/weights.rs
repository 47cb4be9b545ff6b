//! Weights as transferable buffers: one flat little-endian f32 buffer plus a
//! [`WeightManifest`], the same layout for gradients, and safetensors files.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};
use gyre_engine::{DType, WeightManifest};
use gyre_event::PolicyVersion;

use crate::{ModelConfig, ModelError, Policy};

/// The manifest layout of `policy`'s parameters (checksum not yet stamped).
pub fn manifest_layout(policy: &Policy, version: PolicyVersion) -> WeightManifest {
    WeightManifest::layout(
        version,
        policy
            .specs()
            .iter()
            .map(|spec| {
                (
                    spec.name.clone(),
                    DType::F32,
                    spec.shape.iter().map(|&dim| dim as u64).collect(),
                )
            })
            .collect(),
    )
}

/// Packs tensors (one per manifest entry, any shape with the right element count) into one
/// sealed buffer.
pub fn pack(
    manifest: WeightManifest,
    tensors: &[Tensor],
) -> Result<(WeightManifest, Vec<u8>), ModelError> {
    let mut buffer = Vec::with_capacity(manifest.total_bytes() as usize);
    for tensor in tensors {
        for value in tensor.flatten_all()?.to_vec1::<f32>()? {
            buffer.extend_from_slice(&value.to_le_bytes());
        }
    }
    if buffer.len() as u64 != manifest.total_bytes() {
        return Err(ModelError::weights(format!(
            "packed {} bytes for a manifest of {}",
            buffer.len(),
            manifest.total_bytes()
        )));
    }
    let manifest = manifest.seal(&buffer);
    Ok((manifest, buffer))
}

/// Unpacks a validated buffer into one tensor per manifest entry, checking the entries'
/// names and shapes against `expected`.
pub fn unpack(
    expected: &WeightManifest,
    manifest: &WeightManifest,
    buffer: &[u8],
) -> Result<Vec<Tensor>, ModelError> {
    manifest.validate(buffer)?;
    if manifest.tensors.len() != expected.tensors.len() {
        return Err(ModelError::weights(format!(
            "buffer has {} tensors, the model has {}",
            manifest.tensors.len(),
            expected.tensors.len()
        )));
    }
    let mut tensors = Vec::with_capacity(manifest.tensors.len());
    for (entry, want) in manifest.tensors.iter().zip(&expected.tensors) {
        if entry.name != want.name || entry.shape != want.shape || entry.dtype != want.dtype {
            return Err(ModelError::weights(format!(
                "buffer tensor {} {:?} does not match model tensor {} {:?}",
                entry.name, entry.shape, want.name, want.shape
            )));
        }
        let bytes =
            &buffer[entry.offset_bytes as usize..(entry.offset_bytes + entry.len_bytes) as usize];
        let values: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|chunk| f32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]))
            .collect();
        let shape: Vec<usize> = entry.shape.iter().map(|&dim| dim as usize).collect();
        tensors.push(Tensor::from_vec(values, shape, &Device::Cpu)?);
    }
    Ok(tensors)
}

impl Policy {
    /// All parameters as one flat buffer and its sealed manifest.
    pub fn export_weights(
        &self,
        version: PolicyVersion,
    ) -> Result<(WeightManifest, Vec<u8>), ModelError> {
        let tensors: Vec<Tensor> = self
            .vars()
            .iter()
            .map(|var| var.as_tensor().detach())
            .collect();
        pack(manifest_layout(self, version), &tensors)
    }

    /// Overwrites every parameter from a flat buffer (manifest validated, checksum checked,
    /// names and shapes must match this model).
    pub fn import_weights(
        &self,
        manifest: &WeightManifest,
        buffer: &[u8],
    ) -> Result<(), ModelError> {
        let tensors = unpack(&manifest_layout(self, manifest.version), manifest, buffer)?;
        for (index, tensor) in tensors.iter().enumerate() {
            self.set_parameter(index, tensor)?;
        }
        Ok(())
    }

    /// A new model of `config` from a flat buffer.
    pub fn from_buffer(
        config: ModelConfig,
        manifest: &WeightManifest,
        buffer: &[u8],
    ) -> Result<Self, ModelError> {
        let policy = Self::new(config, 0)?;
        policy.import_weights(manifest, buffer)?;
        Ok(policy)
    }

    /// Writes every parameter to a safetensors file under its canonical name.
    pub fn save_safetensors(&self, path: &Path) -> Result<(), ModelError> {
        let tensors: HashMap<String, Tensor> = self
            .specs()
            .iter()
            .zip(self.vars())
            .map(|(spec, var)| (spec.name.clone(), var.as_tensor().detach()))
            .collect();
        candle_core::safetensors::save(&tensors, path)?;
        Ok(())
    }

    /// Loads a model of `config` from a safetensors file written by [`Self::save_safetensors`].
    pub fn load_safetensors(config: ModelConfig, path: &Path) -> Result<Self, ModelError> {
        let mut stored = candle_core::safetensors::load(path, &Device::Cpu)?;
        let specs = crate::init::parameter_specs(&config);
        let mut tensors = Vec::with_capacity(specs.len());
        for spec in &specs {
            let tensor = stored.remove(&spec.name).ok_or_else(|| {
                ModelError::weights(format!("{} is missing from {}", spec.name, path.display()))
            })?;
            tensors.push(tensor);
        }
        if let Some(extra) = stored.keys().next() {
            return Err(ModelError::weights(format!(
                "{} holds {extra}, which the config does not have",
                path.display()
            )));
        }
        Self::from_tensors(config, tensors)
    }
}
