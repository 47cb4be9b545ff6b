//! Why an event could not be applied to the scheduler projection.
//!
//! A committed event that the projection rejects is a bug upstream (the leader validates before
//! proposing); replay reports it with the event's position instead of panicking.

use gyre_event::{CellId, EngineId, ExecutionId, GroupId, MicroStepId, StepId};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApplyError {
    NotStarted(&'static str),
    AlreadyStarted,
    UnknownCell(CellId),
    UnknownEngine(EngineId),
    DuplicateEngine(EngineId),
    UnknownGroup(GroupId),
    UnknownExecution(ExecutionId),
    DuplicateExecution(ExecutionId),
    ExecutionAlreadyClosed(ExecutionId),
    NothingQueued(GroupId),
    EngineFull(EngineId),
    EngineNotAccepting(EngineId),
    WrongEngine {
        execution: ExecutionId,
        engine: EngineId,
    },
    NoOpenBatch(StepId),
    WrongStep {
        expected: Option<StepId>,
        got: StepId,
    },
    GroupNotReady(GroupId),
    GroupAlreadyPacked(GroupId),
    StreamClosed(StepId),
    UnknownMicroStep(MicroStepId),
    MicroStepNotClaimedBy {
        micro_step: MicroStepId,
        cell: CellId,
    },
    CellNotTraining(CellId),
    BatchIncomplete(StepId),
    ConsumptionMismatch(StepId),
    TransitionConflict(CellId),
    Invalid(String),
}

impl std::fmt::Display for ApplyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApplyError::NotStarted(what) => write!(f, "{what} before run_started"),
            ApplyError::AlreadyStarted => write!(f, "run_started seen twice"),
            ApplyError::UnknownCell(cell) => write!(f, "unknown cell {cell}"),
            ApplyError::UnknownEngine(engine) => write!(f, "unknown engine {engine}"),
            ApplyError::DuplicateEngine(engine) => write!(f, "engine {engine} registered twice"),
            ApplyError::UnknownGroup(group) => write!(f, "unknown group {group}"),
            ApplyError::UnknownExecution(id) => write!(f, "unknown execution {id}"),
            ApplyError::DuplicateExecution(id) => write!(f, "execution {id} started twice"),
            ApplyError::ExecutionAlreadyClosed(id) => write!(f, "execution {id} already closed"),
            ApplyError::NothingQueued(group) => {
                write!(f, "group {group} has no queued execution left to start")
            }
            ApplyError::EngineFull(engine) => write!(f, "engine {engine} is at capacity"),
            ApplyError::EngineNotAccepting(engine) => {
                write!(f, "engine {engine} is not ready or not accepting executions")
            }
            ApplyError::WrongEngine { execution, engine } => {
                write!(f, "execution {execution} is not running on engine {engine}")
            }
            ApplyError::NoOpenBatch(step) => write!(f, "no open batch for {step}"),
            ApplyError::WrongStep { expected, got } => {
                write!(f, "event for {got} but the open batch is {expected:?}")
            }
            ApplyError::GroupNotReady(group) => write!(f, "group {group} is not ready"),
            ApplyError::GroupAlreadyPacked(group) => write!(f, "group {group} already packed"),
            ApplyError::StreamClosed(step) => write!(f, "stream of {step} is already closed"),
            ApplyError::UnknownMicroStep(id) => write!(f, "unknown micro-step {id}"),
            ApplyError::MicroStepNotClaimedBy { micro_step, cell } => {
                write!(f, "micro-step {micro_step} is not claimed by {cell}")
            }
            ApplyError::CellNotTraining(cell) => write!(f, "{cell} is not in training role"),
            ApplyError::BatchIncomplete(step) => {
                write!(f, "optimizer step for {step} before all micro-steps were done")
            }
            ApplyError::ConsumptionMismatch(step) => write!(
                f,
                "optimizer step for {step} records consumed groups or staleness that differ from the projection"
            ),
            ApplyError::TransitionConflict(cell) => {
                write!(f, "transition of {cell} conflicts with its current role or another transition")
            }
            ApplyError::Invalid(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for ApplyError {}
