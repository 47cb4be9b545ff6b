//! gyre-model: the embedded CPU policy (DESIGN.md §8) and the SmolLM2-135M profile.
//!
//! Architecture invariant: this is a leaf crate — the only one that links the ML framework
//! (candle 0.11, CPU). Others see it through `gyre_engine::RolloutEngine`, the flat weight
//! buffers of `gyre_engine::WeightManifest`, and `gyre_trajectory::Row` as training input.
//! Every training op has a backward (see [`ops`]); weights initialise from our own seeded
//! generator, so the same seed gives bit-identical weights and samples.
//!
//! Map: [`ModelConfig`] sizes a decoder-only transformer; [`Policy`] holds its parameters
//! ([`init`] names and seeds them; [`weights`] moves them as flat buffers and safetensors);
//! [`transformer`] is the forward pass (full sequences and KV-cached decode); [`sampler`] draws
//! tokens with behaviour log-probs; [`generation`] decodes several sequences together;
//! [`EmbeddedEngine`] serves them behind the rollout-engine trait; [`Trainer`] takes eq (5)–(6)
//! steps ([`objective`] on tensors, [`adamw`]); [`smollm2`] loads the GGUF model profile.

pub mod adamw;
mod config;
mod engine;
mod error;
pub mod generation;
#[cfg(feature = "gpu")]
pub mod gpu;
pub mod init;
pub mod objective;
pub mod ops;
mod policy;
pub mod sampler;
pub mod smollm2;
mod trainer;
pub mod transformer;
pub mod weights;

pub use config::*;
pub use engine::*;
pub use error::*;
pub use policy::*;
pub use trainer::*;
