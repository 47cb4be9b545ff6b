//! Stable kind numbers and current schema versions.
//!
//! The numbers themselves are defined once, in `proto/events.proto` (`enum EventKind`); this
//! module maps domain variants onto them and says which schema version the writer emits.

use gyre_event::EventBody;
use gyre_proto::events::EventKind;

/// Every kind this build can read, in kind-number order.
pub const ALL_KINDS: [EventKind; 29] = [
    EventKind::RunStarted,
    EventKind::CellRegistered,
    EventKind::StandalonePoolRegistered,
    EventKind::EngineReady,
    EventKind::EngineDown,
    EventKind::GroupsDispatched,
    EventKind::ExecutionStarted,
    EventKind::ExecutionClosed,
    EventKind::ModelCall,
    EventKind::EvaluationRequested,
    EventKind::EvaluationCompleted,
    EventKind::EvaluationFailed,
    EventKind::DummyInserted,
    EventKind::ExecutionExcluded,
    EventKind::TrajectoriesAdmitted,
    EventKind::TransitionBegun,
    EventKind::TransitionCompleted,
    EventKind::RoutesUpdated,
    EventKind::BatchOpened,
    EventKind::MicroStepsEnqueued,
    EventKind::MicroStepClaimed,
    EventKind::MicroStepDone,
    EventKind::JoinWindowClosed,
    EventKind::OptimizerStepped,
    EventKind::WeightsPublished,
    EventKind::BurstEnded,
    EventKind::Tick,
    EventKind::ProjectionDigest,
    EventKind::ResponseStored,
];

/// The kind number of a domain event body.
pub fn kind_of(body: &EventBody) -> EventKind {
    match body {
        EventBody::RunStarted(_) => EventKind::RunStarted,
        EventBody::CellRegistered { .. } => EventKind::CellRegistered,
        EventBody::StandalonePoolRegistered { .. } => EventKind::StandalonePoolRegistered,
        EventBody::EngineReady { .. } => EventKind::EngineReady,
        EventBody::EngineDown { .. } => EventKind::EngineDown,
        EventBody::GroupsDispatched { .. } => EventKind::GroupsDispatched,
        EventBody::ExecutionStarted { .. } => EventKind::ExecutionStarted,
        EventBody::ExecutionClosed { .. } => EventKind::ExecutionClosed,
        EventBody::ModelCall(_) => EventKind::ModelCall,
        EventBody::EvaluationRequested { .. } => EventKind::EvaluationRequested,
        EventBody::EvaluationCompleted { .. } => EventKind::EvaluationCompleted,
        EventBody::EvaluationFailed { .. } => EventKind::EvaluationFailed,
        EventBody::DummyInserted { .. } => EventKind::DummyInserted,
        EventBody::ExecutionExcluded { .. } => EventKind::ExecutionExcluded,
        EventBody::TrajectoriesAdmitted { .. } => EventKind::TrajectoriesAdmitted,
        EventBody::TransitionBegun { .. } => EventKind::TransitionBegun,
        EventBody::TransitionCompleted { .. } => EventKind::TransitionCompleted,
        EventBody::RoutesUpdated { .. } => EventKind::RoutesUpdated,
        EventBody::BatchOpened { .. } => EventKind::BatchOpened,
        EventBody::MicroStepsEnqueued { .. } => EventKind::MicroStepsEnqueued,
        EventBody::MicroStepClaimed { .. } => EventKind::MicroStepClaimed,
        EventBody::MicroStepDone { .. } => EventKind::MicroStepDone,
        EventBody::JoinWindowClosed { .. } => EventKind::JoinWindowClosed,
        EventBody::OptimizerStepped { .. } => EventKind::OptimizerStepped,
        EventBody::WeightsPublished { .. } => EventKind::WeightsPublished,
        EventBody::BurstEnded { .. } => EventKind::BurstEnded,
        EventBody::Tick => EventKind::Tick,
        EventBody::ProjectionDigest { .. } => EventKind::ProjectionDigest,
        EventBody::ResponseStored(_) => EventKind::ResponseStored,
    }
}

/// The schema version the writer emits for `kind`; readers accept 1..=this, upcasting.
pub fn current_schema_version(kind: EventKind) -> u32 {
    match kind {
        // v2: tau in integer nanoseconds, j_max added (see proto/events.proto).
        EventKind::RunStarted => 2,
        _ => 1,
    }
}

/// The oldest schema version of any kind; every kind started at 1.
pub const OLDEST_SCHEMA_VERSION: u32 = 1;

/// A lowercase name for messages, matching `EventBody::kind_name`.
pub fn kind_name(kind: EventKind) -> &'static str {
    match kind {
        EventKind::Unspecified => "unspecified",
        EventKind::RunStarted => "run_started",
        EventKind::CellRegistered => "cell_registered",
        EventKind::StandalonePoolRegistered => "standalone_pool_registered",
        EventKind::EngineReady => "engine_ready",
        EventKind::EngineDown => "engine_down",
        EventKind::GroupsDispatched => "groups_dispatched",
        EventKind::ExecutionStarted => "execution_started",
        EventKind::ExecutionClosed => "execution_closed",
        EventKind::ModelCall => "model_call",
        EventKind::EvaluationRequested => "evaluation_requested",
        EventKind::EvaluationCompleted => "evaluation_completed",
        EventKind::EvaluationFailed => "evaluation_failed",
        EventKind::DummyInserted => "dummy_inserted",
        EventKind::ExecutionExcluded => "execution_excluded",
        EventKind::TrajectoriesAdmitted => "trajectories_admitted",
        EventKind::TransitionBegun => "transition_begun",
        EventKind::TransitionCompleted => "transition_completed",
        EventKind::RoutesUpdated => "routes_updated",
        EventKind::BatchOpened => "batch_opened",
        EventKind::MicroStepsEnqueued => "micro_steps_enqueued",
        EventKind::MicroStepClaimed => "micro_step_claimed",
        EventKind::MicroStepDone => "micro_step_done",
        EventKind::JoinWindowClosed => "join_window_closed",
        EventKind::OptimizerStepped => "optimizer_stepped",
        EventKind::WeightsPublished => "weights_published",
        EventKind::BurstEnded => "burst_ended",
        EventKind::Tick => "tick",
        EventKind::ProjectionDigest => "projection_digest",
        EventKind::ResponseStored => "response_stored",
    }
}

/// Looks up a kind number read from bytes; `None` for 0 and for numbers this build does not know.
pub fn kind_from_number(number: u32) -> Option<EventKind> {
    let number = i32::try_from(number).ok()?;
    match EventKind::try_from(number) {
        Ok(EventKind::Unspecified) | Err(_) => None,
        Ok(kind) => Some(kind),
    }
}
