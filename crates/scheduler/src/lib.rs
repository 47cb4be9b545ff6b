//! gyre-scheduler: the elastic scheduler as a pure projection and a pure controller.
//!
//! [`SchedulerState`] folds events (`apply`) into the counters d, p, f, cell roles, engine
//! occupancy, groups, the open batch and burst progress. [`Controller::decide`] reads that state
//! and a leader-stamped `now` and returns the events the leader should propose: dispatches,
//! execution starts, batch openings, role transitions with their route updates, join-window
//! closes and burst ends. The same code runs on the control quorum and inside the simulator.
//! `SchedulerState::encode_into` / `decode_from` (`snapshot.rs`) are its snapshot encoding.
//!
//! Architecture invariant: this crate does no IO, reads no clock, draws no random numbers and
//! spawns nothing. Time arrives only as `Event::at` and the `now` argument of `decide`.

mod controller;
mod digest;
mod error;
mod snapshot;
mod state;

pub use controller::{run_decisions, Controller};
pub use error::ApplyError;
pub use state::{
    BatchState, CellState, EngineState, ExecutionState, GroupState, MicroStepState, Resolution,
    SchedulerState, StalenessRecord,
};
