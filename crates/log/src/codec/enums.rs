//! Domain enums ↔ protobuf enum numbers. Reading rejects 0 (UNSPECIFIED, never written) and
//! numbers this build does not know, naming the field.

use gyre_event::{CallKind, CloseStatus, Provenance, Role, SchedulingMode};
use gyre_proto::events as pb;

use super::BodyError;

fn invalid(field: &'static str, value: i32) -> BodyError {
    BodyError::InvalidEnum { field, value }
}

pub(crate) fn role_to_proto(role: Role) -> i32 {
    match role {
        Role::Rollout => pb::Role::Rollout as i32,
        Role::Training => pb::Role::Training as i32,
    }
}

pub(crate) fn role_from_proto(field: &'static str, value: i32) -> Result<Role, BodyError> {
    match pb::Role::try_from(value) {
        Ok(pb::Role::Rollout) => Ok(Role::Rollout),
        Ok(pb::Role::Training) => Ok(Role::Training),
        Ok(pb::Role::Unspecified) | Err(_) => Err(invalid(field, value)),
    }
}

pub(crate) fn close_status_to_proto(status: CloseStatus) -> i32 {
    let status = match status {
        CloseStatus::Completed => pb::CloseStatus::Completed,
        CloseStatus::Failed => pb::CloseStatus::Failed,
        CloseStatus::HarnessTimeout => pb::CloseStatus::HarnessTimeout,
        CloseStatus::OverallTimeout => pb::CloseStatus::OverallTimeout,
        CloseStatus::Cancelled => pb::CloseStatus::Cancelled,
        CloseStatus::Surplus => pb::CloseStatus::Surplus,
    };
    status as i32
}

pub(crate) fn close_status_from_proto(
    field: &'static str,
    value: i32,
) -> Result<CloseStatus, BodyError> {
    match pb::CloseStatus::try_from(value) {
        Ok(pb::CloseStatus::Completed) => Ok(CloseStatus::Completed),
        Ok(pb::CloseStatus::Failed) => Ok(CloseStatus::Failed),
        Ok(pb::CloseStatus::HarnessTimeout) => Ok(CloseStatus::HarnessTimeout),
        Ok(pb::CloseStatus::OverallTimeout) => Ok(CloseStatus::OverallTimeout),
        Ok(pb::CloseStatus::Cancelled) => Ok(CloseStatus::Cancelled),
        Ok(pb::CloseStatus::Surplus) => Ok(CloseStatus::Surplus),
        Ok(pb::CloseStatus::Unspecified) | Err(_) => Err(invalid(field, value)),
    }
}

pub(crate) fn mode_to_proto(mode: SchedulingMode) -> i32 {
    let mode = match mode {
        SchedulingMode::Elastic => pb::SchedulingMode::Elastic,
        SchedulingMode::Colocate => pb::SchedulingMode::Colocate,
        SchedulingMode::Async => pb::SchedulingMode::Async,
    };
    mode as i32
}

pub(crate) fn mode_from_proto(
    field: &'static str,
    value: i32,
) -> Result<SchedulingMode, BodyError> {
    match pb::SchedulingMode::try_from(value) {
        Ok(pb::SchedulingMode::Elastic) => Ok(SchedulingMode::Elastic),
        Ok(pb::SchedulingMode::Colocate) => Ok(SchedulingMode::Colocate),
        Ok(pb::SchedulingMode::Async) => Ok(SchedulingMode::Async),
        Ok(pb::SchedulingMode::Unspecified) | Err(_) => Err(invalid(field, value)),
    }
}

pub(crate) fn provenance_to_proto(provenance: Provenance) -> i32 {
    let provenance = match provenance {
        Provenance::System => pb::Provenance::System,
        Provenance::User => pb::Provenance::User,
        Provenance::ToolResult => pb::Provenance::ToolResult,
        Provenance::HarnessAssistant => pb::Provenance::HarnessAssistant,
        Provenance::EvaluatorCritique => pb::Provenance::EvaluatorCritique,
        Provenance::Template => pb::Provenance::Template,
        Provenance::Sampled => pb::Provenance::Sampled,
    };
    provenance as i32
}

pub(crate) fn provenance_from_proto(
    field: &'static str,
    value: i32,
) -> Result<Provenance, BodyError> {
    match pb::Provenance::try_from(value) {
        Ok(pb::Provenance::System) => Ok(Provenance::System),
        Ok(pb::Provenance::User) => Ok(Provenance::User),
        Ok(pb::Provenance::ToolResult) => Ok(Provenance::ToolResult),
        Ok(pb::Provenance::HarnessAssistant) => Ok(Provenance::HarnessAssistant),
        Ok(pb::Provenance::EvaluatorCritique) => Ok(Provenance::EvaluatorCritique),
        Ok(pb::Provenance::Template) => Ok(Provenance::Template),
        Ok(pb::Provenance::Sampled) => Ok(Provenance::Sampled),
        Ok(pb::Provenance::Unspecified) | Err(_) => Err(invalid(field, value)),
    }
}

pub(crate) fn call_kind_to_proto(kind: CallKind) -> i32 {
    match kind {
        CallKind::Turn => pb::CallKind::Turn as i32,
        CallKind::Summary => pb::CallKind::Summary as i32,
        CallKind::Aborted => pb::CallKind::Aborted as i32,
    }
}

pub(crate) fn call_kind_from_proto(field: &'static str, value: i32) -> Result<CallKind, BodyError> {
    match pb::CallKind::try_from(value) {
        Ok(pb::CallKind::Turn) => Ok(CallKind::Turn),
        Ok(pb::CallKind::Summary) => Ok(CallKind::Summary),
        Ok(pb::CallKind::Aborted) => Ok(CallKind::Aborted),
        Ok(pb::CallKind::Unspecified) | Err(_) => Err(invalid(field, value)),
    }
}
