//! gyre-model integration tests: one binary, one module per property.

mod engine;
mod gradcheck;
mod logprobs;
mod reference;
mod smollm2;
mod support;
mod weights;
