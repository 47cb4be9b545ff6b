//! The event vocabulary of the whole system.
//!
//! Kinds are never removed or renumbered: the encoding in `gyre-log` assigns each variant a
//! stable `kind` number and a schema version, and old logs are upcast on read.

use crate::{
    CallId, CellId, Duration, EngineId, ExecutionId, GroupId, LogIndex, MicroStepId,
    ModelCallRecord, PolicyVersion, QueryId, RunConfig, StepId, StoredResponseRecord,
};

/// The role a cell plays.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    Rollout,
    Training,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Rollout => "rollout",
            Role::Training => "training",
        }
    }
}

/// How an execution ended. Every status increments f exactly once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CloseStatus {
    Completed,
    Failed,
    /// The harness's own time limit hit; the preserved work is still scored.
    HarnessTimeout,
    /// The execution's whole budget ran out; no valid reward is expected.
    OverallTimeout,
    Cancelled,
    /// An oversampled execution no longer needed.
    Surplus,
}

impl CloseStatus {
    pub const ALL: [CloseStatus; 6] = [
        CloseStatus::Completed,
        CloseStatus::Failed,
        CloseStatus::HarnessTimeout,
        CloseStatus::OverallTimeout,
        CloseStatus::Cancelled,
        CloseStatus::Surplus,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            CloseStatus::Completed => "completed",
            CloseStatus::Failed => "failed",
            CloseStatus::HarnessTimeout => "harness_timeout",
            CloseStatus::OverallTimeout => "overall_timeout",
            CloseStatus::Cancelled => "cancelled",
            CloseStatus::Surplus => "surplus",
        }
    }
}

/// A group handed to the rollout queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DispatchedGroup {
    pub group: GroupId,
    pub query: QueryId,
}

/// An execution moved from one engine to another during a role switch or an engine failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouteMove {
    pub execution: ExecutionId,
    pub from: EngineId,
    pub to: EngineId,
}

/// A range of one call's `output_ids` fixed as training targets: `[start, end)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct TargetRange {
    pub call: CallId,
    pub start: u32,
    pub end: u32,
}

/// One admitted trajectory: the leaf that defines it and the targets fixed when it was drawn.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdmittedTrajectory {
    pub leaf_call: CallId,
    /// Index of the role class in the harness's priority order (0 = highest).
    pub class: u32,
    pub targets: Vec<TargetRange>,
}

/// A group consumed by an optimizer step, with its scheduling staleness d = v_t − v_d.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConsumedGroup {
    pub group: GroupId,
    pub staleness: u64,
}

/// Every fact Gyre records. Projections fold these; controllers return them.
#[derive(Clone, Debug, PartialEq)]
pub enum EventBody {
    // --- run and topology ---
    RunStarted(RunConfig),
    CellRegistered {
        cell: CellId,
        /// C_e: concurrent executions the cell serves in rollout role.
        rollout_capacity: u32,
        nodes: u32,
        /// The engine the cell runs while in rollout role.
        engine: EngineId,
    },
    StandalonePoolRegistered {
        engine: EngineId,
        /// This engine's share of C_s.
        rollout_capacity: u32,
        nodes: u32,
    },
    EngineReady {
        engine: EngineId,
    },
    EngineDown {
        engine: EngineId,
        reason: String,
    },

    // --- rollout lifecycle (counters d, p, f) ---
    GroupsDispatched {
        groups: Vec<DispatchedGroup>,
        executions_per_group: u32,
        /// v_d: the latest published version when these groups were accepted.
        policy_version: PolicyVersion,
    },
    ExecutionStarted {
        execution: ExecutionId,
        group: GroupId,
        engine: EngineId,
    },
    ExecutionClosed {
        execution: ExecutionId,
        status: CloseStatus,
    },
    ModelCall(Box<ModelCallRecord>),

    // --- evaluation (partial scoring) ---
    EvaluationRequested {
        execution: ExecutionId,
        attempt: u32,
        artifact_version: u64,
        branch_ref: String,
    },
    EvaluationCompleted {
        execution: ExecutionId,
        attempt: u32,
        score: f64,
        valid: bool,
        evaluated_state_ref: String,
        artifact_version: u64,
        branch_ref: String,
        evaluator: String,
    },
    EvaluationFailed {
        execution: ExecutionId,
        attempt: u32,
        reason: String,
    },
    DummyInserted {
        execution: ExecutionId,
        group: GroupId,
    },
    ExecutionExcluded {
        execution: ExecutionId,
        reason: String,
    },
    TrajectoriesAdmitted {
        execution: ExecutionId,
        trajectories: Vec<AdmittedTrajectory>,
    },

    // --- roles and routing ---
    TransitionBegun {
        cell: CellId,
        to: Role,
    },
    TransitionCompleted {
        cell: CellId,
        role: Role,
    },
    RoutesUpdated {
        /// The engine that stopped accepting.
        source: EngineId,
        moves: Vec<RouteMove>,
    },

    // --- streaming training ---
    BatchOpened {
        step: StepId,
    },
    MicroStepsEnqueued {
        step: StepId,
        group: GroupId,
        micro_steps: Vec<MicroStepId>,
        /// The stream for this step closes with this enqueue (the B-th group).
        closes_stream: bool,
    },
    MicroStepClaimed {
        step: StepId,
        micro_step: MicroStepId,
        cell: CellId,
    },
    MicroStepDone {
        step: StepId,
        micro_step: MicroStepId,
        cell: CellId,
    },
    JoinWindowClosed {
        step: StepId,
    },
    OptimizerStepped {
        step: StepId,
        /// v_t after this step.
        policy_version: PolicyVersion,
        consumed: Vec<ConsumedGroup>,
    },
    WeightsPublished {
        policy_version: PolicyVersion,
        took: Duration,
    },
    BurstEnded {
        burst: u64,
    },

    // --- time and integrity ---
    Tick,
    /// The digest of the projections before this event (checkpoint `upto`), and the version
    /// of the fold's rules the writer folded by (`gyre_state::FOLD_RULES`; 0: not stated, a
    /// log written before rules were recorded).
    ProjectionDigest {
        upto: LogIndex,
        hash: [u8; 32],
        rules: u32,
    },

    // --- model API state ---
    ResponseStored(Box<StoredResponseRecord>),
}

impl EventBody {
    pub fn kind_name(&self) -> &'static str {
        match self {
            EventBody::RunStarted(_) => "run_started",
            EventBody::CellRegistered { .. } => "cell_registered",
            EventBody::StandalonePoolRegistered { .. } => "standalone_pool_registered",
            EventBody::EngineReady { .. } => "engine_ready",
            EventBody::EngineDown { .. } => "engine_down",
            EventBody::GroupsDispatched { .. } => "groups_dispatched",
            EventBody::ExecutionStarted { .. } => "execution_started",
            EventBody::ExecutionClosed { .. } => "execution_closed",
            EventBody::ModelCall(_) => "model_call",
            EventBody::EvaluationRequested { .. } => "evaluation_requested",
            EventBody::EvaluationCompleted { .. } => "evaluation_completed",
            EventBody::EvaluationFailed { .. } => "evaluation_failed",
            EventBody::DummyInserted { .. } => "dummy_inserted",
            EventBody::ExecutionExcluded { .. } => "execution_excluded",
            EventBody::TrajectoriesAdmitted { .. } => "trajectories_admitted",
            EventBody::TransitionBegun { .. } => "transition_begun",
            EventBody::TransitionCompleted { .. } => "transition_completed",
            EventBody::RoutesUpdated { .. } => "routes_updated",
            EventBody::BatchOpened { .. } => "batch_opened",
            EventBody::MicroStepsEnqueued { .. } => "micro_steps_enqueued",
            EventBody::MicroStepClaimed { .. } => "micro_step_claimed",
            EventBody::MicroStepDone { .. } => "micro_step_done",
            EventBody::JoinWindowClosed { .. } => "join_window_closed",
            EventBody::OptimizerStepped { .. } => "optimizer_stepped",
            EventBody::WeightsPublished { .. } => "weights_published",
            EventBody::BurstEnded { .. } => "burst_ended",
            EventBody::Tick => "tick",
            EventBody::ProjectionDigest { .. } => "projection_digest",
            EventBody::ResponseStored(_) => "response_stored",
        }
    }
}
