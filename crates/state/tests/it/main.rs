//! gyre-state folds a simulated run: every event applies, digests are stable and sensitive, and
//! snapshots round-trip and refuse damaged bytes.

mod fold;
mod snapshot;
