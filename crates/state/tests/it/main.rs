//! gyre-state folds a simulated run: every event applies, digests are stable and sensitive.

mod fold;
