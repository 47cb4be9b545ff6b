//! The forward pass: full sequences (training, scoring, prefill) and one-token decode steps
//! over per-sequence KV caches.
//!
//! The same code runs on tracked tensors (the trainer's `Var`s, so candle records a graph) and
//! on detached views of them (sampling and scoring, no graph). Matrices are stored `[out, in]`.

use candle_core::{Device, Tensor, D};

use crate::init::LAYER_PARAMETERS;
use crate::ops::{self, Result};
use crate::ModelConfig;

const ATTN_NORM: usize = 0;
const Q: usize = 1;
const K: usize = 2;
const V: usize = 3;
const O: usize = 4;
const MLP_NORM: usize = 5;
const GATE: usize = 6;
const UP: usize = 7;
const DOWN: usize = 8;

/// The keys and values (after RoPE, before head repetition) one sequence has seen, per layer:
/// `[kv_heads, tokens, head_dim]` each.
#[derive(Clone, Debug, Default)]
pub struct KvCache {
    pub layers: Vec<(Tensor, Tensor)>,
    pub tokens_count: usize,
}

/// A borrowed view of a parameter list in canonical order, with the RoPE tables.
pub struct Transformer<'a> {
    pub config: &'a ModelConfig,
    pub tensors: &'a [Tensor],
    pub cos: &'a Tensor,
    pub sin: &'a Tensor,
}

impl Transformer<'_> {
    fn embed(&self) -> &Tensor {
        &self.tensors[0]
    }

    fn layer(&self, layer: usize, which: usize) -> &Tensor {
        &self.tensors[1 + layer * LAYER_PARAMETERS.len() + which]
    }

    fn final_norm(&self) -> &Tensor {
        &self.tensors[1 + self.config.layers_count * LAYER_PARAMETERS.len()]
    }

    fn head(&self) -> &Tensor {
        if self.config.tie_embeddings {
            self.embed()
        } else {
            &self.tensors[2 + self.config.layers_count * LAYER_PARAMETERS.len()]
        }
    }

    fn device(&self) -> &Device {
        self.embed().device()
    }

    /// Hidden states `[B, T, d]` before the final norm for tokens `[B, T]` at positions
    /// `0..T`. With `cache`, also returns each layer's keys and values (batch 1 only).
    pub fn hidden_states(
        &self,
        tokens: &Tensor,
        mut cache: Option<&mut KvCache>,
    ) -> Result<Tensor> {
        let (batch, length) = tokens.dims2()?;
        let config = self.config;
        let (heads, kv_heads, head_dim) =
            (config.heads_count, config.kv_heads_count, config.head_dim());
        let mut xs = self
            .embed()
            .index_select(&tokens.flatten_all()?, 0)?
            .reshape((batch, length, config.model_dim))?;
        let cos = self.cos.narrow(0, 0, length)?;
        let sin = self.sin.narrow(0, 0, length)?;
        let mask = ops::causal_mask(length, self.device())?;
        let scale = 1.0 / (head_dim as f64).sqrt();
        if let Some(cache) = cache.as_deref_mut() {
            cache.layers.clear();
            cache.tokens_count = length;
        }
        for layer in 0..config.layers_count {
            let normed = ops::rms_norm(&xs, self.layer(layer, ATTN_NORM), config.rms_norm_epsilon)?;
            let query = ops::linear(&normed, self.layer(layer, Q))?
                .reshape((batch, length, heads, head_dim))?
                .transpose(1, 2)?;
            let key = ops::linear(&normed, self.layer(layer, K))?
                .reshape((batch, length, kv_heads, head_dim))?
                .transpose(1, 2)?;
            let value = ops::linear(&normed, self.layer(layer, V))?
                .reshape((batch, length, kv_heads, head_dim))?
                .transpose(1, 2)?
                .contiguous()?;
            let query = ops::rope(&query.contiguous()?, &cos, &sin, config.rope_layout)?;
            let key = ops::rope(&key.contiguous()?, &cos, &sin, config.rope_layout)?;
            if let Some(cache) = cache.as_deref_mut() {
                cache.layers.push((
                    key.squeeze(0)?.contiguous()?,
                    value.squeeze(0)?.contiguous()?,
                ));
            }
            let repeats = heads / kv_heads;
            let key = ops::repeat_kv(&key, repeats)?;
            let value = ops::repeat_kv(&value, repeats)?;
            let scores = (query.matmul(&key.t()?)? * scale)?.broadcast_add(&mask)?;
            let attended = ops::softmax(&scores)?
                .matmul(&value)?
                .transpose(1, 2)?
                .reshape((batch, length, heads * head_dim))?;
            xs = (xs + ops::linear(&attended, self.layer(layer, O))?)?;
            xs = (&xs + self.mlp(&xs, layer)?)?;
        }
        Ok(xs)
    }

    fn mlp(&self, xs: &Tensor, layer: usize) -> Result<Tensor> {
        let normed = ops::rms_norm(
            xs,
            self.layer(layer, MLP_NORM),
            self.config.rms_norm_epsilon,
        )?;
        let gate = ops::linear(&normed, self.layer(layer, GATE))?.silu()?;
        let up = ops::linear(&normed, self.layer(layer, UP))?;
        ops::linear(&(gate * up)?, self.layer(layer, DOWN))
    }

    /// Logits `[n, V]` from hidden states `[n, d]`: final norm and LM head.
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        let normed = ops::rms_norm(hidden, self.final_norm(), self.config.rms_norm_epsilon)?;
        ops::linear(&normed, self.head())
    }

    /// Prefills one prompt into `cache` and returns the logits `[V]` of its last position.
    pub fn prefill(&self, prompt: &[u32], cache: &mut KvCache) -> Result<Tensor> {
        let tokens = Tensor::from_slice(prompt, (1, prompt.len()), self.device())?;
        let hidden = self.hidden_states(&tokens, Some(cache))?;
        let last = hidden
            .narrow(1, prompt.len() - 1, 1)?
            .reshape((1, self.config.model_dim))?;
        self.logits(&last)?.squeeze(0)
    }

    /// One decode step for several sequences at once: `tokens[i]` enters sequence i at
    /// position `caches[i].tokens_count`. Projections and the MLP run batched; attention runs
    /// per sequence over its own cache. Returns logits `[n, V]`.
    pub fn decode(&self, tokens: &[u32], caches: &mut [&mut KvCache]) -> Result<Tensor> {
        let config = self.config;
        let count = tokens.len();
        let (heads, kv_heads, head_dim) =
            (config.heads_count, config.kv_heads_count, config.head_dim());
        let repeats = heads / kv_heads;
        let device = self.device().clone();
        let positions: Vec<u32> = caches
            .iter()
            .map(|cache| cache.tokens_count as u32)
            .collect();
        let positions = Tensor::from_vec(positions, count, &device)?;
        let cos = self.cos.index_select(&positions, 0)?.unsqueeze(1)?;
        let sin = self.sin.index_select(&positions, 0)?.unsqueeze(1)?;
        let scale = 1.0 / (head_dim as f64).sqrt();
        let mut xs = self
            .embed()
            .index_select(&Tensor::from_slice(tokens, count, &device)?, 0)?;
        for layer in 0..config.layers_count {
            let normed = ops::rms_norm(&xs, self.layer(layer, ATTN_NORM), config.rms_norm_epsilon)?;
            let query =
                ops::linear(&normed, self.layer(layer, Q))?.reshape((count, heads, head_dim))?;
            let key =
                ops::linear(&normed, self.layer(layer, K))?.reshape((count, kv_heads, head_dim))?;
            let value =
                ops::linear(&normed, self.layer(layer, V))?.reshape((count, kv_heads, head_dim))?;
            let query = ops::rope(&query, &cos, &sin, config.rope_layout)?;
            let key = ops::rope(&key, &cos, &sin, config.rope_layout)?;
            let mut attended = Vec::with_capacity(count);
            for (index, cache) in caches.iter_mut().enumerate() {
                let new_key = key.narrow(0, index, 1)?.transpose(0, 1)?;
                let new_value = value.narrow(0, index, 1)?.transpose(0, 1)?;
                let (cached_key, cached_value) = &cache.layers[layer];
                let all_keys = Tensor::cat(&[cached_key, &new_key], 1)?;
                let all_values = Tensor::cat(&[cached_value, &new_value], 1)?;
                // Heads of one KV group attend together: [KV, repeats, hd] @ [KV, hd, L].
                let grouped = query
                    .narrow(0, index, 1)?
                    .reshape((kv_heads, repeats, head_dim))?;
                let scores = (grouped.matmul(&all_keys.t()?)? * scale)?;
                attended.push(
                    ops::softmax(&scores)?
                        .matmul(&all_values)?
                        .reshape((1, heads * head_dim))?,
                );
                cache.layers[layer] = (all_keys, all_values);
            }
            let attended = Tensor::cat(&attended, 0)?;
            xs = (xs + ops::linear(&attended, self.layer(layer, O))?)?;
            xs = (&xs + self.mlp(&xs, layer)?)?;
        }
        for cache in caches.iter_mut() {
            cache.tokens_count += 1;
        }
        self.logits(&xs)
    }

    /// Logits `[n, V]` of the last position of each sequence, recomputing every sequence from
    /// scratch (no cache): the baseline the KV cache is measured against.
    pub fn last_logits_uncached(&self, sequences: &[&[u32]]) -> Result<Tensor> {
        let length = sequences
            .iter()
            .map(|sequence| sequence.len())
            .max()
            .unwrap_or(0);
        let mut padded = Vec::with_capacity(sequences.len() * length);
        for sequence in sequences {
            padded.extend_from_slice(sequence);
            padded.extend(std::iter::repeat_n(0, length - sequence.len()));
        }
        let tokens = Tensor::from_vec(padded, (sequences.len(), length), self.device())?;
        let hidden = self
            .hidden_states(&tokens, None)?
            .reshape((sequences.len() * length, self.config.model_dim))?;
        let last: Vec<u32> = sequences
            .iter()
            .enumerate()
            .map(|(index, sequence)| (index * length + sequence.len() - 1) as u32)
            .collect();
        let last = Tensor::from_vec(last, sequences.len(), self.device())?;
        self.logits(&hidden.index_select(&last, 0)?)
    }

    /// Log-probs `[n]` of `targets[i]` given hidden state row `rows[i]` of `hidden` `[R·T, d]`,
    /// with logits divided by `temperature`. Differentiable when `hidden` is tracked.
    pub fn target_logprobs(
        &self,
        hidden: &Tensor,
        rows: &[u32],
        targets: &[u32],
        temperature: f64,
    ) -> Result<Tensor> {
        let device = self.device();
        let selected = hidden.index_select(&Tensor::from_slice(rows, rows.len(), device)?, 0)?;
        let mut logits = self.logits(&selected)?;
        if temperature != 1.0 {
            logits = (logits / temperature)?;
        }
        let targets = Tensor::from_slice(targets, (targets.len(), 1), device)?;
        ops::log_softmax(&logits)?
            .gather(&targets, D::Minus1)?
            .squeeze(1)
    }
}
