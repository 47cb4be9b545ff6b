//! gyre-state: every projection of the log, folded together, with one digest.
//!
//! `ControlState` is what a control node's state machine, `gyre replay` and the simulator's digest
//! checkpoints fold: the scheduler projection (`gyre-scheduler`) and the trajectory buffer
//! (`gyre-trajectory`: trees, scoring, admissions, packed groups). `digest` combines both and is
//! what `ProjectionDigest` events carry, so a replica or a replay that folds the same events must
//! reach the same bytes. Keeping this fold in its own pure crate keeps `gyre-log` free of domain
//! logic and lets the simulator verify digests without openraft. `encode_snapshot` /
//! `decode_snapshot` (`snapshot.rs`) are the compact, versioned binary form of the whole state
//! that a control node's Raft snapshot carries.
//!
//! Architecture invariant: pure — no IO, no clock, no RNG, no async.

use gyre_event::{Event, EventBody, ExecutionId};
use gyre_scheduler::{ApplyError, SchedulerState};
use gyre_trajectory::{
    AttemptOutcome, ScoringConfig, TrajectoryBuffer, TrajectoryError, TreeConfig,
};
use sha2::{Digest, Sha256};

mod responses;
mod snapshot;

pub use responses::{ExecutionResponses, StoredResponses};

pub use snapshot::{SnapshotDecodeError, SNAPSHOT_FORMAT_VERSION, SNAPSHOT_MAGIC};

/// Which projection refused an event, and why.
#[derive(Clone, Debug, PartialEq)]
pub enum StateError {
    Scheduler(ApplyError),
    Trajectory(TrajectoryError),
    /// The stored-responses projection refused a `ResponseStored`.
    Responses(String),
}

impl std::fmt::Display for StateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StateError::Scheduler(error) => write!(f, "scheduler projection: {error}"),
            StateError::Trajectory(error) => write!(f, "trajectory projection: {error}"),
            StateError::Responses(error) => write!(f, "stored-responses projection: {error}"),
        }
    }
}

impl std::error::Error for StateError {}

/// All projections of the log.
#[derive(Clone, Debug, PartialEq)]
pub struct ControlState {
    pub scheduler: SchedulerState,
    pub trajectories: TrajectoryBuffer,
    /// Stored OpenAI Responses answers of open executions (`ResponseStored`).
    pub responses: StoredResponses,
    pub events_applied: u64,
}

impl Default for ControlState {
    fn default() -> Self {
        Self::new()
    }
}

/// Digest items per entry between two checkpoints, at most (see [`digest_interval`]).
pub const DIGEST_ITEMS_PER_ENTRY: u64 = 16;

/// Entries between two digest checkpoints when the state holds `items`
/// ([`ControlState::digest_items`]): at least `every`, and at least `items /
/// DIGEST_ITEMS_PER_ENTRY`, so a checkpoint's cost, which grows with the state, is spread over
/// enough entries to stay a bounded share of folding them. A divergence is then found within
/// that many entries instead of `every`.
pub fn digest_interval(every: u64, items: u64) -> u64 {
    every.max(items / DIGEST_ITEMS_PER_ENTRY)
}

impl ControlState {
    pub fn new() -> Self {
        Self {
            scheduler: SchedulerState::new(),
            trajectories: TrajectoryBuffer::new(TreeConfig::default(), ScoringConfig::default()),
            responses: StoredResponses::default(),
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
        self.fold_responses(event)?;
        self.events_applied += 1;
        Ok(())
    }

    /// The stored-responses part of the fold (after the other projections: `ResponseStored`
    /// is theirs to ignore, and a close they accepted drops the execution's responses).
    fn fold_responses(&mut self, event: &Event) -> Result<(), StateError> {
        match &event.body {
            EventBody::ResponseStored(record) => {
                let closed = self.execution_closed(record.execution);
                self.responses
                    .apply(record, closed)
                    .map_err(StateError::Responses)
            }
            EventBody::ExecutionClosed { execution, .. } => {
                self.responses.close(*execution);
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Whether the scheduler or scoring holds `execution` as closed (the scheduler drops an
    /// execution once an optimizer step consumed its group; scoring keeps every close).
    pub fn execution_closed(&self, execution: ExecutionId) -> bool {
        self.scheduler
            .executions
            .get(&execution)
            .is_some_and(|state| state.closed.is_some())
            || self
                .trajectories
                .scoring
                .executions
                .get(&execution)
                .is_some_and(|score| score.closed.is_some())
    }

    /// [`ControlState::apply`] taking the event by value (replay and the state machine own
    /// their decoded events): the same fold, without copying a model call's tokens.
    pub fn apply_owned(&mut self, event: Event) -> Result<(), StateError> {
        self.scheduler
            .apply_unchecked(&event)
            .map_err(StateError::Scheduler)?;
        if matches!(
            event.body,
            EventBody::ResponseStored(_) | EventBody::ExecutionClosed { .. }
        ) {
            self.trajectories
                .apply(&event)
                .map_err(StateError::Trajectory)?;
            self.fold_responses(&event)?;
            self.events_applied += 1;
            return Ok(());
        }
        self.trajectories
            .apply_owned(event)
            .map_err(StateError::Trajectory)?;
        self.events_applied += 1;
        Ok(())
    }

    pub fn validate(&self) -> Result<(), String> {
        self.scheduler.validate()
    }

    /// About how many items [`ControlState::digest`] feeds: its cost grows with the run (every
    /// execution's scoring state, group, admission and tree count is fed, consumed ones too),
    /// so a fixed cadence of digests made a long run's folding quadratic. See
    /// [`digest_interval`].
    pub fn digest_items(&self) -> u64 {
        let buffer = &self.trajectories;
        (self.scheduler.groups.len()
            + self.scheduler.executions.len()
            + buffer.trees.len()
            + buffer.retired.len()
            + buffer.scoring.executions.len()
            + buffer.scoring.groups.len()
            + buffer.admissions.len()
            + buffer.packed_groups.len()
            + self.responses.executions.len()) as u64
    }

    /// SHA-256 over the scheduler digest and a canonical encoding of the trajectory buffer:
    /// tree shapes and token counts, every execution's scoring state (close, attempts with their
    /// bindings and outcomes, dummy, exclusion), groups, admissions and packed groups. Fields are
    /// fed in `BTreeMap` order with explicit tags and lengths; floats by their bits.
    pub fn digest(&self) -> [u8; 32] {
        let mut feed = Feed(Sha256::new());
        feed.bytes(b"gyre-state-digest-v2");
        feed.bytes(&self.scheduler.digest());
        let buffer = &self.trajectories;
        // Live and retired trees alike: retiring a consumed execution's tree does not change
        // the digest (logs folded before retirement existed verify unchanged).
        feed.u64((buffer.trees.len() + buffer.retired.len()) as u64);
        for (execution, (nodes, leaves, tokens)) in buffer.tree_counts() {
            feed.u64(execution.get());
            feed.u64(nodes);
            feed.u64(leaves);
            feed.u64(tokens);
        }
        let scoring = &buffer.scoring;
        feed.u64(scoring.executions.len() as u64);
        for (execution, score) in &scoring.executions {
            feed.u64(execution.get());
            feed.u64(score.group.get());
            feed.u64(score.started_at.nanos());
            match score.closed {
                Some((status, at)) => {
                    feed.u64(1 + status as u64);
                    feed.u64(at.nanos());
                }
                None => feed.u64(0),
            }
            feed.u64(score.attempts.len() as u64);
            for (attempt, record) in &score.attempts {
                feed.u64(*attempt as u64);
                feed.u64(record.artifact_version);
                feed.bytes(record.branch_ref.as_bytes());
                feed.u64(record.requested_at.nanos());
                match &record.outcome {
                    None => feed.u64(0),
                    Some(AttemptOutcome::Completed {
                        score,
                        valid,
                        evaluated_state_ref,
                        evaluator,
                    }) => {
                        feed.u64(1);
                        feed.u64(score.to_bits());
                        feed.u64(*valid as u64);
                        feed.bytes(evaluated_state_ref.as_bytes());
                        feed.bytes(evaluator.as_bytes());
                    }
                    Some(AttemptOutcome::Failed { reason }) => {
                        feed.u64(2);
                        feed.bytes(reason.as_bytes());
                    }
                }
            }
            feed.u64(score.dummy as u64);
            match &score.excluded {
                Some(reason) => feed.bytes(reason.as_bytes()),
                None => feed.u64(u64::MAX),
            }
        }
        feed.u64(scoring.groups.len() as u64);
        for (group, state) in &scoring.groups {
            feed.u64(group.get());
            feed.u64(state.executions_per_group as u64);
            feed.u64(state.policy_version.get());
            feed.u64(state.members.len() as u64);
            for member in &state.members {
                feed.u64(member.get());
            }
        }
        feed.u64(buffer.admissions.len() as u64);
        for (execution, trajectories) in &buffer.admissions {
            feed.u64(execution.get());
            feed.u64(trajectories.len() as u64);
            for trajectory in trajectories {
                feed.u64(trajectory.leaf_call.get());
                feed.u64(trajectory.class as u64);
                feed.u64(trajectory.targets.len() as u64);
                for target in &trajectory.targets {
                    feed.u64(target.call.get());
                    feed.u64(target.start as u64);
                    feed.u64(target.end as u64);
                }
            }
        }
        feed.u64(buffer.packed_groups.len() as u64);
        for group in &buffer.packed_groups {
            feed.u64(group.get());
        }
        // Fed only when some execution holds stored responses, so a log without
        // `ResponseStored` events verifies with the digests it was written with.
        if !self.responses.is_empty() {
            feed.bytes(b"stored-responses");
            feed.u64(self.responses.executions.len() as u64);
            for (execution, held) in &self.responses.executions {
                feed.u64(execution.get());
                feed.u64(held.records.len() as u64);
                for record in &held.records {
                    feed.bytes(record.response_id.as_bytes());
                    match &record.previous_response_id {
                        Some(previous) => feed.bytes(previous.as_bytes()),
                        None => feed.u64(u64::MAX),
                    }
                    feed.bytes(&record.items);
                }
            }
        }
        feed.0.finalize().into()
    }
}

/// Length-prefixed, tagged input to the digest.
struct Feed(Sha256);

impl Feed {
    fn u64(&mut self, value: u64) {
        self.0.update(value.to_le_bytes());
    }

    fn bytes(&mut self, value: &[u8]) {
        self.u64(value.len() as u64);
        self.0.update(value);
    }
}
