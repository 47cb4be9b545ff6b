//! gyre-state: every projection of the log, folded together, with one digest.
//!
//! `ControlState` is what a control node's state machine, `gyre replay` and the simulator's digest
//! checkpoints fold: the scheduler projection (`gyre-scheduler`) and the trajectory buffer
//! (`gyre-trajectory`: trees, scoring, admissions, packed groups). `digest` combines both and is
//! what `ProjectionDigest` events carry, so a replica or a replay that folds the same events must
//! reach the same bytes. Keeping this fold in its own pure crate keeps `gyre-log` free of domain
//! logic and lets the simulator verify digests without openraft.
//!
//! Architecture invariant: pure — no IO, no clock, no RNG, no async.

use std::fmt::Write;

use gyre_event::Event;
use gyre_scheduler::{ApplyError, SchedulerState};
use gyre_trajectory::{ScoringConfig, TrajectoryBuffer, TrajectoryError, TreeConfig};
use sha2::{Digest, Sha256};

/// Which projection refused an event, and why.
#[derive(Clone, Debug, PartialEq)]
pub enum StateError {
    Scheduler(ApplyError),
    Trajectory(TrajectoryError),
}

impl std::fmt::Display for StateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StateError::Scheduler(error) => write!(f, "scheduler projection: {error}"),
            StateError::Trajectory(error) => write!(f, "trajectory projection: {error}"),
        }
    }
}

impl std::error::Error for StateError {}

/// All projections of the log.
#[derive(Clone, Debug, PartialEq)]
pub struct ControlState {
    pub scheduler: SchedulerState,
    pub trajectories: TrajectoryBuffer,
    pub events_applied: u64,
}

impl Default for ControlState {
    fn default() -> Self {
        Self::new()
    }
}

impl ControlState {
    pub fn new() -> Self {
        Self {
            scheduler: SchedulerState::new(),
            trajectories: TrajectoryBuffer::new(TreeConfig::default(), ScoringConfig::default()),
            events_applied: 0,
        }
    }

    /// Fold one committed event into every projection. A refusal is reported with the
    /// projection's reason; the scheduler is left unchanged on its own refusal.
    pub fn apply(&mut self, event: &Event) -> Result<(), StateError> {
        self.scheduler
            .apply_unchecked(event)
            .map_err(StateError::Scheduler)?;
        self.trajectories
            .apply(event)
            .map_err(StateError::Trajectory)?;
        self.events_applied += 1;
        Ok(())
    }

    pub fn validate(&self) -> Result<(), String> {
        self.scheduler.validate()
    }

    /// SHA-256 over the scheduler digest and a canonical summary of the trajectory buffer (tree
    /// shapes and token counts, scoring state, admissions, packed groups). Token arrays enter
    /// through their counts and the trees' own structure, which keeps checkpoints cheap.
    pub fn digest(&self) -> [u8; 32] {
        let mut hasher = Sha256::new();
        hasher.update(b"gyre-state-digest-v1");
        hasher.update(self.scheduler.digest());
        let mut summary = String::new();
        for (execution, tree) in &self.trajectories.trees {
            let tokens: u64 = tree.nodes().iter().map(|n| n.segment_len()).sum();
            let _ = write!(summary, "t{}:{}:{}:{};", execution.get(), tree.len(), tree.leaves().count(), tokens);
        }
        // Debug output of BTreeMap-based state is deterministic (ordered keys, exact floats).
        let _ = write!(summary, "s{:?};", self.trajectories.scoring);
        let _ = write!(summary, "a{:?};", self.trajectories.admissions);
        let _ = write!(summary, "p{:?}", self.trajectories.packed_groups);
        hasher.update(summary.as_bytes());
        hasher.finalize().into()
    }
}
