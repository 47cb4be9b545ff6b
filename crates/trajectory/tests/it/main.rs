//! Integration tests of gyre-trajectory (one test binary per crate, STYLE rule 15).

mod admission;
mod objective;
mod packing;
mod properties;
mod scenarios;
mod scoring;
mod snapshot;
mod support;
mod tidy;
