//! The weight-buffer manifest: how every parameter sits in one flat byte buffer.
//!
//! All parameters travel as one contiguous little-endian buffer plus this manifest — what the
//! weight transport moves between cells, what the publish step hands to engines, and (with the
//! same layout) what the gradient all-reduce sums. Offsets and lengths are in bytes; tensors are
//! contiguous, in manifest order, without gaps; the checksum is CRC-32C of the whole buffer.

use gyre_event::PolicyVersion;

use crate::EngineError;

/// Element type of a tensor in a flat buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    F32,
}

impl DType {
    pub fn size_bytes(self) -> u64 {
        match self {
            DType::F32 => 4,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
        }
    }
}

/// One tensor's place in the buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorEntry {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<u64>,
    pub offset_bytes: u64,
    pub len_bytes: u64,
}

impl TensorEntry {
    pub fn elements_count(&self) -> u64 {
        self.shape.iter().product()
    }
}

/// `{version, tensors: [name, dtype, shape, offset, len], checksum}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WeightManifest {
    pub version: PolicyVersion,
    pub tensors: Vec<TensorEntry>,
    /// CRC-32C of the buffer.
    pub checksum: u32,
}

impl WeightManifest {
    /// Lays `tensors` (name, dtype, shape) out back to back; the checksum is computed later by
    /// [`Self::seal`].
    pub fn layout(version: PolicyVersion, tensors: Vec<(String, DType, Vec<u64>)>) -> Self {
        let mut offset_bytes = 0;
        let tensors = tensors
            .into_iter()
            .map(|(name, dtype, shape)| {
                let len_bytes = shape.iter().product::<u64>() * dtype.size_bytes();
                let entry = TensorEntry {
                    name,
                    dtype,
                    shape,
                    offset_bytes,
                    len_bytes,
                };
                offset_bytes += len_bytes;
                entry
            })
            .collect();
        Self {
            version,
            tensors,
            checksum: 0,
        }
    }

    /// The buffer size the manifest describes.
    pub fn total_bytes(&self) -> u64 {
        self.tensors
            .last()
            .map(|entry| entry.offset_bytes + entry.len_bytes)
            .unwrap_or(0)
    }

    pub fn checksum_of(buffer: &[u8]) -> u32 {
        crc32c::crc32c(buffer)
    }

    /// Stamps the checksum of `buffer` into the manifest.
    pub fn seal(mut self, buffer: &[u8]) -> Self {
        self.checksum = Self::checksum_of(buffer);
        self
    }

    /// Checks that the layout is contiguous and consistent and that `buffer` matches it.
    pub fn validate(&self, buffer: &[u8]) -> Result<(), EngineError> {
        let mut expected_offset = 0;
        for entry in &self.tensors {
            if entry.offset_bytes != expected_offset {
                return Err(EngineError::InvalidWeights {
                    message: format!(
                        "tensor {} starts at byte {}, expected {expected_offset}",
                        entry.name, entry.offset_bytes
                    ),
                });
            }
            if entry.len_bytes != entry.elements_count() * entry.dtype.size_bytes() {
                return Err(EngineError::InvalidWeights {
                    message: format!(
                        "tensor {} has {} bytes for shape {:?}",
                        entry.name, entry.len_bytes, entry.shape
                    ),
                });
            }
            expected_offset += entry.len_bytes;
        }
        if buffer.len() as u64 != expected_offset {
            return Err(EngineError::InvalidWeights {
                message: format!(
                    "buffer has {} bytes, manifest describes {expected_offset}",
                    buffer.len()
                ),
            });
        }
        let checksum = Self::checksum_of(buffer);
        if checksum != self.checksum {
            return Err(EngineError::InvalidWeights {
                message: format!(
                    "checksum {checksum:#010x} does not match manifest {:#010x}",
                    self.checksum
                ),
            });
        }
        Ok(())
    }

    /// Renders the manifest as JSON-like text for logs and files.
    pub fn render(&self) -> String {
        let mut out = format!(
            "{{\"version\": {}, \"checksum\": {}, \"tensors\": [",
            self.version.get(),
            self.checksum
        );
        for (index, entry) in self.tensors.iter().enumerate() {
            if index > 0 {
                out.push_str(", ");
            }
            out.push_str(&format!(
                "[\"{}\", \"{}\", {:?}, {}, {}]",
                entry.name,
                entry.dtype.name(),
                entry.shape,
                entry.offset_bytes,
                entry.len_bytes
            ));
        }
        out.push_str("]}");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_contiguous_and_checksum_catches_a_flipped_byte() {
        let manifest = WeightManifest::layout(
            PolicyVersion(3),
            vec![
                ("a".into(), DType::F32, vec![2, 3]),
                ("b".into(), DType::F32, vec![4]),
            ],
        );
        assert_eq!(manifest.tensors[1].offset_bytes, 24);
        assert_eq!(manifest.total_bytes(), 40);
        let mut buffer = vec![7u8; 40];
        let manifest = manifest.seal(&buffer);
        assert_eq!(manifest.validate(&buffer), Ok(()));
        buffer[5] ^= 1;
        assert!(manifest.validate(&buffer).is_err());
        assert!(manifest.validate(&buffer[..39]).is_err());
        assert_eq!(
            manifest.render().split("tensors").next(),
            Some(format!("{{\"version\": 3, \"checksum\": {}, \"", manifest.checksum).as_str())
        );
    }
}
