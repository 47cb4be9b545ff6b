//! gyre-state folds a simulated run: every event applies, digests are stable and sensitive, and
//! snapshots round-trip and refuse damaged bytes; the fold is atomic and its projections agree
//! on resolutions.

mod atomic;
mod fold;
mod snapshot;
