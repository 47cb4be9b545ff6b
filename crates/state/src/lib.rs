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
use gyre_scheduler::{ApplyError, Resolution as SchedulerResolution, SchedulerState};
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

/// Whether the trajectory buffer folds `body` before the scheduler (see [`ControlState::apply`]).
fn trajectory_first(body: &EventBody) -> bool {
    matches!(
        body,
        EventBody::ModelCall(_)
            | EventBody::EvaluationRequested { .. }
            | EventBody::EvaluationCompleted { .. }
            | EventBody::EvaluationFailed { .. }
            | EventBody::DummyInserted { .. }
            | EventBody::ExecutionExcluded { .. }
            | EventBody::TrajectoriesAdmitted { .. }
    )
}

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

/// The version of the fold's rules: what state `ControlState::apply` makes of a log. Bump it
/// with any change to the fold that changes the state (or the digest) some log folds to, and
/// note the change in docs/ARCHITECTURE.md. Digest checkpoints state the rules their writer
/// folded by, so a replica or a `gyre replay` of another build stops naming both versions
/// instead of reporting a bare digest mismatch.
///
/// 1: the fold of sessions 30 and 31 (one resolution rule in `Scoring`, frozen designations,
/// an atomic fold that refuses before it changes anything), the first stated.
pub const FOLD_RULES: u32 = 1;

/// What to do with a digest checkpoint that states fold rules `stated` (0: not stated): `None`
/// to compare it, or why it cannot be compared (this build folds by other rules).
pub fn fold_rules_mismatch(stated: u32) -> Option<String> {
    (stated != 0 && stated != FOLD_RULES).then(|| {
        format!(
            "the checkpoint was written by a build that folds by rules {stated}; this build folds by rules {FOLD_RULES}, so their digests cannot be compared: run every node, and replay this log, with a build of rules {stated}"
        )
    })
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

    /// Fold one committed event into every projection. **Atomic**: on a refusal (the
    /// refusing projection's reason is returned) no projection has changed, so a refused event
    /// is a no-op for the whole state, as a replica, `gyre replay` and the simulator all fold it.
    ///
    /// Resolutions have one authority, the scoring projection (`gyre_trajectory::Scoring`):
    /// the scheduler folds closes and counts, and learns each execution's resolution only from
    /// here, the moment scoring reaches it ([`ControlState::hand_on_resolution`]). So the two
    /// never disagree on whether a group is ready, nor on why.
    ///
    /// Order, which is what makes the fold atomic: an event only the trajectory buffer can
    /// refuse (evaluation outcomes, dummies, exclusions, model calls, admissions) goes to it
    /// first, and the scheduler, which folds those without refusing, after; every other event
    /// goes to the scheduler first. The trajectory buffer never refuses one of those that the
    /// scheduler accepted (group and execution ids are the scheduler's to order and check, a
    /// close the scheduler accepts is of a started, open execution), and each projection
    /// leaves itself unchanged on its own refusal. `tests/it/atomic.rs` checks the whole.
    pub fn apply(&mut self, event: &Event) -> Result<(), StateError> {
        let resolved_before = self.resolved(&event.body);
        match &event.body {
            // Only the stored-responses projection folds (and can refuse) these.
            EventBody::ResponseStored(record) => {
                let closed = self.execution_closed(record.execution);
                self.responses
                    .apply(record, closed)
                    .map_err(StateError::Responses)?;
                self.scheduler.fold_untracked(event.at);
            }
            body if trajectory_first(body) => {
                self.trajectories
                    .apply(event)
                    .map_err(StateError::Trajectory)?;
                // Before the scheduler's fold, which refreshes its supply timer after it.
                if !resolved_before {
                    self.hand_on_resolution(event)?;
                }
                self.scheduler
                    .apply_unchecked(event)
                    .map_err(StateError::Scheduler)?;
            }
            _ => {
                self.scheduler
                    .apply_unchecked(event)
                    .map_err(StateError::Scheduler)?;
                self.trajectories
                    .apply(event)
                    .map_err(StateError::Trajectory)?;
                if !resolved_before && self.hand_on_resolution(event)? {
                    self.scheduler.refresh_supply_timer(event.at);
                }
            }
        }
        if let EventBody::ExecutionClosed { execution, .. } = &event.body {
            self.responses.close(*execution);
        }
        self.events_applied += 1;
        Ok(())
    }

    /// The execution whose resolution `body` may settle, if any.
    fn resolving(body: &EventBody) -> Option<ExecutionId> {
        match body {
            EventBody::ExecutionClosed { execution, .. }
            | EventBody::EvaluationCompleted { execution, .. }
            | EventBody::DummyInserted { execution, .. }
            | EventBody::ExecutionExcluded { execution, .. } => Some(*execution),
            _ => None,
        }
    }

    /// Whether scoring had already resolved the execution `body` may settle (true when the
    /// event settles none).
    fn resolved(&self, body: &EventBody) -> bool {
        Self::resolving(body).is_none_or(|execution| {
            self.trajectories
                .scoring
                .executions
                .get(&execution)
                .is_some_and(|score| score.is_resolved())
        })
    }

    /// Tells the scheduler the resolution scoring reached with `event`, if it reached one.
    /// Only a first resolution is handed on (the caller checks), and only for an execution
    /// the scheduler holds: it drops an execution once an optimizer step consumed its group,
    /// which needs every member resolved already (so nothing is lost by skipping one it no
    /// longer holds, and the fold cannot fail here after both projections folded the event).
    /// Whether one was handed on.
    fn hand_on_resolution(&mut self, event: &Event) -> Result<bool, StateError> {
        let Some(execution) = Self::resolving(&event.body) else {
            return Ok(false);
        };
        self.hand_on(execution)
    }

    /// Hands scoring's resolution of `execution` to the scheduler, if scoring has one and the
    /// scheduler holds the execution; whether it did. (The caller refreshes the scheduler's
    /// supply timer, see `SchedulerState::resolve`.)
    fn hand_on(&mut self, execution: ExecutionId) -> Result<bool, StateError> {
        if !self.scheduler.executions.contains_key(&execution) {
            return Ok(false);
        }
        let Some(score) = self.trajectories.scoring.executions.get(&execution) else {
            return Ok(false);
        };
        // `ExecutionScore::resolution` read field by field, without building it (it clones an
        // exclusion's reason, and this runs for every close and completion).
        let resolution = if score.excluded.is_some() {
            SchedulerResolution::Excluded
        } else if score.closed.is_none() {
            return Ok(false);
        } else if score.dummy {
            SchedulerResolution::Dummy
        } else if score.designated.is_some() {
            SchedulerResolution::Valid
        } else {
            return Ok(false);
        };
        self.scheduler
            .resolve(execution, resolution)
            .map_err(StateError::Scheduler)?;
        Ok(true)
    }

    /// Brings a state restored from a snapshot written before the scheduler learnt its
    /// resolutions from scoring (format 5 and older) to what the fold reaches now: every
    /// execution scoring holds as resolved but the scheduler as pending (an overall-timeout
    /// close, resolved by scoring at the close, waited for an `ExecutionExcluded` then) is
    /// handed on. (The reverse, a resolution the old scheduler counted that scoring refused,
    /// is left as it was: its group may already have been trained on.)
    pub fn reconcile_resolutions(&mut self) -> Result<(), StateError> {
        let pending: Vec<ExecutionId> = self
            .scheduler
            .executions
            .iter()
            .filter(|(_, held)| held.resolution == SchedulerResolution::Pending)
            .map(|(execution, _)| *execution)
            .collect();
        let mut handed = false;
        for execution in pending {
            handed |= self.hand_on(execution)?;
        }
        if handed {
            let now = self.scheduler.now;
            self.scheduler.refresh_supply_timer(now);
        }
        Ok(())
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
        if !matches!(event.body, EventBody::ModelCall(_)) {
            return self.apply(&event);
        }
        // A model call: the trajectory buffer is the only projection that folds it.
        let at = event.at;
        self.trajectories
            .apply_owned(event)
            .map_err(StateError::Trajectory)?;
        self.scheduler.fold_untracked(at);
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
        // Collected in this pass, fed at the end (see there).
        let mut overrides: Vec<(ExecutionId, u32)> = Vec::new();
        for (execution, score) in &scoring.executions {
            if let Some(attempt) = score.designation_override() {
                overrides.push((*execution, attempt));
            }
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
        // Fed only when some designation was frozen before a higher-version completion was
        // folded (the one case it is not implied by the attempts above), so logs without one
        // verify with the digests they were written with.
        if !overrides.is_empty() {
            feed.bytes(b"frozen-designations");
            feed.u64(overrides.len() as u64);
            for (execution, attempt) in overrides {
                feed.u64(execution.get());
                feed.u64(u64::from(attempt));
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
