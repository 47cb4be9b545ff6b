//! Parameter names, shapes and their deterministic initialisation from a seed.
//!
//! candle's CPU generator cannot be seeded, so weights are drawn from our own SplitMix64
//! (`gyre_trajectory::SplitMix64`) through Box–Muller: same seed ⇒ bit-identical weights on
//! every machine. Each tensor draws from its own stream (seed mixed with the tensor's index), so
//! adding a tensor never shifts the values of the others.

use gyre_trajectory::SplitMix64;

use crate::ModelConfig;

/// How a parameter starts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    Ones,
    Normal { standard_deviation: f64 },
}

/// One parameter: its name, shape `[out, in]` for matrices, and initialiser.
#[derive(Clone, Debug, PartialEq)]
pub struct ParameterSpec {
    pub name: String,
    pub shape: Vec<usize>,
    pub init: Init,
}

impl ParameterSpec {
    pub fn elements_count(&self) -> usize {
        self.shape.iter().product()
    }
}

/// Index of each parameter of one layer inside [`parameter_specs`]'s per-layer block.
pub const LAYER_PARAMETERS: [&str; 9] = [
    "attn_norm.weight",
    "attn.q.weight",
    "attn.k.weight",
    "attn.v.weight",
    "attn.o.weight",
    "mlp_norm.weight",
    "mlp.gate.weight",
    "mlp.up.weight",
    "mlp.down.weight",
];

/// Every parameter of `config`, in the canonical order used by the flat buffer:
/// `embed.weight`, then `layers.{i}.*` in [`LAYER_PARAMETERS`] order, `norm.weight`, and
/// `lm_head.weight` unless embeddings are tied.
pub fn parameter_specs(config: &ModelConfig) -> Vec<ParameterSpec> {
    let model_dim = config.model_dim;
    let query_dim = config.heads_count * config.head_dim();
    let kv_dim = config.kv_heads_count * config.head_dim();
    let hidden = config.mlp_hidden_dim;
    let normal = Init::Normal {
        standard_deviation: 0.02,
    };
    // GPT-2's scaled init for the projections that write into the residual stream.
    let residual = Init::Normal {
        standard_deviation: 0.02 / (2.0 * config.layers_count as f64).sqrt(),
    };
    let mut specs = vec![spec(
        "embed.weight",
        &[config.vocab_size, model_dim],
        normal,
    )];
    for layer in 0..config.layers_count {
        let shapes: [(&[usize], Init); 9] = [
            (&[model_dim], Init::Ones),
            (&[query_dim, model_dim], normal),
            (&[kv_dim, model_dim], normal),
            (&[kv_dim, model_dim], normal),
            (&[model_dim, query_dim], residual),
            (&[model_dim], Init::Ones),
            (&[hidden, model_dim], normal),
            (&[hidden, model_dim], normal),
            (&[model_dim, hidden], residual),
        ];
        for (suffix, (shape, init)) in LAYER_PARAMETERS.iter().zip(shapes) {
            specs.push(spec(&format!("layers.{layer}.{suffix}"), shape, init));
        }
    }
    specs.push(spec("norm.weight", &[model_dim], Init::Ones));
    if !config.tie_embeddings {
        specs.push(spec(
            "lm_head.weight",
            &[config.vocab_size, model_dim],
            normal,
        ));
    }
    specs
}

fn spec(name: &str, shape: &[usize], init: Init) -> ParameterSpec {
    ParameterSpec {
        name: name.to_string(),
        shape: shape.to_vec(),
        init,
    }
}

/// The initial values of parameter number `index` under `seed`.
pub fn initial_values(spec: &ParameterSpec, seed: u64, index: usize) -> Vec<f32> {
    let count = spec.elements_count();
    match spec.init {
        Init::Ones => vec![1.0; count],
        Init::Normal { standard_deviation } => {
            let mut rng = SplitMix64::for_execution(seed, index as u64);
            let mut values = Vec::with_capacity(count);
            while values.len() < count {
                let (first, second) = standard_normal_pair(&mut rng);
                values.push((first * standard_deviation) as f32);
                if values.len() < count {
                    values.push((second * standard_deviation) as f32);
                }
            }
            values
        }
    }
}

/// A uniform draw in [0, 1) with 53 random bits.
pub fn uniform(rng: &mut SplitMix64) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

fn standard_normal_pair(rng: &mut SplitMix64) -> (f64, f64) {
    // Box–Muller; 1 − u keeps the logarithm's argument in (0, 1].
    let radius = (-2.0 * (1.0 - uniform(rng)).ln()).sqrt();
    let angle = 2.0 * std::f64::consts::PI * uniform(rng);
    (radius * angle.cos(), radius * angle.sin())
}
