//! Model shapes: a decoder-only transformer's sizes, validated, with the named presets.

use crate::ModelError;

/// How rotary position embeddings pair the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeLayout {
    /// Dimension i pairs with i + head_dim/2 (GPT-NeoX / Hugging Face llama).
    Halves,
    /// Dimension 2i pairs with 2i + 1 (GGUF llama weights, whose q/k rows are permuted).
    Interleaved,
}

/// The sizes of a decoder-only transformer: token embeddings, RoPE, pre-RMSNorm attention with
/// grouped KV heads, a SwiGLU MLP and an LM head (tied to the embeddings or not).
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub vocab_size: usize,
    pub model_dim: usize,
    pub layers_count: usize,
    pub heads_count: usize,
    /// Key/value heads; `heads_count` must be a multiple of it (GQA).
    pub kv_heads_count: usize,
    pub mlp_hidden_dim: usize,
    /// Longest sequence (prompt + generated) the model accepts.
    pub context_tokens_max: usize,
    pub rope_base: f64,
    pub rope_layout: RopeLayout,
    pub rms_norm_epsilon: f64,
    pub tie_embeddings: bool,
}

impl ModelConfig {
    /// The quickstart policy: byte-level vocabulary, 2 layers, d = 128 (≈0.5 M parameters).
    /// One optimizer step over 8 rows × 256 tokens takes about a second on 2 cores.
    pub fn quickstart() -> Self {
        Self {
            vocab_size: 256,
            model_dim: 128,
            layers_count: 2,
            heads_count: 4,
            kv_heads_count: 4,
            mlp_hidden_dim: 384,
            context_tokens_max: 512,
            rope_base: 10_000.0,
            rope_layout: RopeLayout::Halves,
            rms_norm_epsilon: 1e-5,
            tie_embeddings: false,
        }
    }

    /// A very small model for gradient checks and fast tests (GQA and tied embeddings on, so
    /// every code path is exercised).
    pub fn tiny() -> Self {
        Self {
            vocab_size: 32,
            model_dim: 16,
            layers_count: 2,
            heads_count: 4,
            kv_heads_count: 2,
            mlp_hidden_dim: 24,
            context_tokens_max: 64,
            rope_base: 10_000.0,
            rope_layout: RopeLayout::Interleaved,
            rms_norm_epsilon: 1e-5,
            tie_embeddings: true,
        }
    }

    pub fn head_dim(&self) -> usize {
        self.model_dim / self.heads_count
    }

    pub fn validate(&self) -> Result<(), ModelError> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("model_dim", self.model_dim),
            ("layers_count", self.layers_count),
            ("heads_count", self.heads_count),
            ("kv_heads_count", self.kv_heads_count),
            ("mlp_hidden_dim", self.mlp_hidden_dim),
            ("context_tokens_max", self.context_tokens_max),
        ];
        for (field, value) in positive {
            if value == 0 {
                return Err(ModelError::config(field, "must be positive"));
            }
        }
        if !self.model_dim.is_multiple_of(self.heads_count) {
            return Err(ModelError::config(
                "heads_count",
                format!("must divide model_dim {}", self.model_dim),
            ));
        }
        if !self.head_dim().is_multiple_of(2) {
            return Err(ModelError::config(
                "heads_count",
                "head dimension must be even for RoPE",
            ));
        }
        if !self.heads_count.is_multiple_of(self.kv_heads_count) {
            return Err(ModelError::config(
                "kv_heads_count",
                format!("must divide heads_count {}", self.heads_count),
            ));
        }
        if !(self.rope_base > 1.0 && self.rms_norm_epsilon > 0.0) {
            return Err(ModelError::config(
                "rope_base",
                "rope_base must exceed 1 and rms_norm_epsilon be positive",
            ));
        }
        Ok(())
    }
}
