//! Integration tests of the simulator: determinism, config validation, Theorem A.1, the paper's
//! tables and the elastic scheduler's lead over the baselines.

mod config_errors;
mod digests;
mod paper;
mod staleness;
