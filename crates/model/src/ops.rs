//! Differentiable building blocks composed from candle primitives that all have a backward.
//!
//! candle 0.11's fused `rms_norm`, `softmax_last_dim`, rope and sdpa kernels have no backward
//! (`apply_op*_no_bwd`): a model built from them silently trains only its LM head. Everything
//! here is composed from ops with a backward instead, and the finite-difference gradient check
//! in `tests/it/gradcheck.rs` covers every parameter group so that this cannot regress.
//! Subtracting a detached maximum before `exp` changes neither softmax nor its gradient.

use candle_core::{DType, Device, Tensor, D};

use crate::RopeLayout;

pub type Result<T> = candle_core::Result<T>;

/// RMSNorm over the last dimension: x / sqrt(mean(x²) + ε) · w.
pub fn rms_norm(xs: &Tensor, weight: &Tensor, epsilon: f64) -> Result<Tensor> {
    let mean_square = xs.sqr()?.mean_keepdim(D::Minus1)?;
    let inverse_rms = (mean_square + epsilon)?.sqrt()?.recip()?;
    xs.broadcast_mul(&inverse_rms)?.broadcast_mul(weight)
}

/// Softmax over the last dimension.
pub fn softmax(xs: &Tensor) -> Result<Tensor> {
    let maximum = xs.max_keepdim(D::Minus1)?.detach();
    let exponentials = xs.broadcast_sub(&maximum)?.exp()?;
    let sum = exponentials.sum_keepdim(D::Minus1)?;
    exponentials.broadcast_div(&sum)
}

/// Log-softmax over the last dimension.
pub fn log_softmax(xs: &Tensor) -> Result<Tensor> {
    let maximum = xs.max_keepdim(D::Minus1)?.detach();
    let shifted = xs.broadcast_sub(&maximum)?;
    let log_sum = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?;
    shifted.broadcast_sub(&log_sum)
}

/// `xs @ weightᵀ` for a weight stored `[out, in]`, over any leading dimensions.
pub fn linear(xs: &Tensor, weight: &Tensor) -> Result<Tensor> {
    let dims = xs.dims();
    let in_dim = dims[dims.len() - 1];
    let rows: usize = dims[..dims.len() - 1].iter().product();
    let out = xs.reshape((rows, in_dim))?.matmul(&weight.t()?)?;
    let mut out_dims = dims.to_vec();
    let last = out_dims.len() - 1;
    out_dims[last] = weight.dim(0)?;
    out.reshape(out_dims)
}

/// cos and sin tables `[positions, head_dim/2]` for RoPE.
pub fn rope_tables(
    head_dim: usize,
    positions_max: usize,
    base: f64,
    device: &Device,
) -> Result<(Tensor, Tensor)> {
    let half = head_dim / 2;
    let mut cos = Vec::with_capacity(positions_max * half);
    let mut sin = Vec::with_capacity(positions_max * half);
    for position in 0..positions_max {
        for index in 0..half {
            let frequency = 1.0 / base.powf(2.0 * index as f64 / head_dim as f64);
            let angle = position as f64 * frequency;
            cos.push(angle.cos() as f32);
            sin.push(angle.sin() as f32);
        }
    }
    Ok((
        Tensor::from_vec(cos, (positions_max, half), device)?,
        Tensor::from_vec(sin, (positions_max, half), device)?,
    ))
}

/// Rotates `xs` `[..., T, head_dim]` by position; `cos`/`sin` broadcast to `[..., T, head_dim/2]`.
pub fn rope(xs: &Tensor, cos: &Tensor, sin: &Tensor, layout: RopeLayout) -> Result<Tensor> {
    let dims = xs.dims().to_vec();
    let head_dim = dims[dims.len() - 1];
    let half = head_dim / 2;
    let (first, second) = match layout {
        RopeLayout::Halves => (
            xs.narrow(D::Minus1, 0, half)?,
            xs.narrow(D::Minus1, half, half)?,
        ),
        RopeLayout::Interleaved => {
            let mut pair_dims = dims.clone();
            let last = pair_dims.len() - 1;
            pair_dims[last] = half;
            pair_dims.push(2);
            let pairs = xs.reshape(pair_dims.clone())?;
            let mut single = pair_dims.clone();
            single.pop();
            (
                pairs.narrow(D::Minus1, 0, 1)?.reshape(single.clone())?,
                pairs.narrow(D::Minus1, 1, 1)?.reshape(single)?,
            )
        }
    };
    let rotated_first = (first.broadcast_mul(cos)? - second.broadcast_mul(sin)?)?;
    let rotated_second = (first.broadcast_mul(sin)? + second.broadcast_mul(cos)?)?;
    match layout {
        RopeLayout::Halves => Tensor::cat(&[rotated_first, rotated_second], D::Minus1),
        RopeLayout::Interleaved => {
            Tensor::stack(&[rotated_first, rotated_second], D::Minus1)?.reshape(dims)
        }
    }
}

/// Repeats KV heads `[B, KV, T, hd]` → `[B, KV·n, T, hd]`; head h reads KV head h / n.
pub fn repeat_kv(xs: &Tensor, repeats: usize) -> Result<Tensor> {
    if repeats == 1 {
        return Ok(xs.clone());
    }
    let (batch, kv_heads, tokens, head_dim) = xs.dims4()?;
    Tensor::cat(&vec![xs; repeats], 2)?.reshape((batch, kv_heads * repeats, tokens, head_dim))
}

/// Additive causal mask `[T, T]`: 0 on and below the diagonal, −∞ above.
pub fn causal_mask(tokens: usize, device: &Device) -> Result<Tensor> {
    let values: Vec<f32> = (0..tokens)
        .flat_map(|row| {
            (0..tokens).map(move |column| if column > row { f32::NEG_INFINITY } else { 0.0 })
        })
        .collect();
    Tensor::from_vec(values, (tokens, tokens), device)?.to_dtype(DType::F32)
}
