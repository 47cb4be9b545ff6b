//! The scheduler's integration tests: one binary (STYLE rule 15).
//!
//! `harness` is the tests-as-data script runner, `scenarios` holds one scripted scenario per rule
//! of DESIGN.md §4, `rejections` shows that nonsense is refused with the state unchanged,
//! `invariants` holds one function per invariant (each with a test that it can fail), and
//! `properties` drives random legal event sequences through the projection and the controller,
//! and `snapshot` checks the projection's snapshot encoding on the states they reach.
//! `resolutions` stands in for the scoring projection, which hands the scheduler its
//! resolutions in `gyre-state`. `atomic` shows that every event `apply_unchecked` refuses, from
//! the states the random runtime reaches, leaves the projection and its digest unchanged.

mod atomic;
mod harness;
mod invariants;
mod properties;
mod rejections;
mod resolutions;
mod scenarios;
mod snapshot;
