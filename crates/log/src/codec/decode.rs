//! Protobuf → domain: decodes one body at its kind's current schema version. Older versions
//! reach this module only after the upcasters have rewritten them (see `upcast.rs`).

use gyre_event::{
    AdmittedTrajectory, CallId, CellId, ConsumedGroup, DispatchedGroup, Duration, EngineId,
    EventBody, ExecutionId, GroupId, LogIndex, MicroStepId, ModelCallRecord, PolicyVersion,
    ProvenanceSpan, QueryId, RouteMove, RunConfig, StepId, TargetRange, Timestamp,
};
use gyre_proto::events::{self as pb, EventKind};
use prost::Message;

use super::enums::{
    call_kind_from_proto, close_status_from_proto, mode_from_proto, provenance_from_proto,
    role_from_proto,
};
use super::tokens::{le_to_f32s, le_to_u32s};
use super::BodyError;

/// Decodes a body written at the current schema version of `kind`.
pub(crate) fn decode_body(kind: EventKind, body: &bytes::Bytes) -> Result<EventBody, BodyError> {
    let bytes: &[u8] = body;
    let body = match kind {
        EventKind::Unspecified => {
            // Callers look kinds up with `kind_from_number`, which never yields Unspecified.
            return Err(BodyError::InvalidValue {
                field: "kind",
                detail: "kind 0 (unspecified) is never written".to_string(),
            });
        }
        EventKind::RunStarted => {
            EventBody::RunStarted(run_started(pb::RunStarted::decode(bytes)?)?)
        }
        EventKind::CellRegistered => {
            let message = pb::CellRegistered::decode(bytes)?;
            EventBody::CellRegistered {
                cell: CellId(message.cell),
                rollout_capacity: message.rollout_capacity,
                nodes: message.nodes,
                engine: EngineId(message.engine),
            }
        }
        EventKind::StandalonePoolRegistered => {
            let message = pb::StandalonePoolRegistered::decode(bytes)?;
            EventBody::StandalonePoolRegistered {
                engine: EngineId(message.engine),
                rollout_capacity: message.rollout_capacity,
                nodes: message.nodes,
            }
        }
        EventKind::EngineReady => EventBody::EngineReady {
            engine: EngineId(pb::EngineReady::decode(bytes)?.engine),
        },
        EventKind::EngineDown => {
            let message = pb::EngineDown::decode(bytes)?;
            EventBody::EngineDown {
                engine: EngineId(message.engine),
                reason: message.reason,
            }
        }
        EventKind::GroupsDispatched => {
            let message = pb::GroupsDispatched::decode(bytes)?;
            EventBody::GroupsDispatched {
                groups: message
                    .groups
                    .into_iter()
                    .map(|group| DispatchedGroup {
                        group: GroupId(group.group),
                        query: QueryId(group.query),
                    })
                    .collect(),
                executions_per_group: message.executions_per_group,
                policy_version: PolicyVersion(message.policy_version),
            }
        }
        EventKind::ExecutionStarted => {
            let message = pb::ExecutionStarted::decode(bytes)?;
            EventBody::ExecutionStarted {
                execution: ExecutionId(message.execution),
                group: GroupId(message.group),
                engine: EngineId(message.engine),
            }
        }
        EventKind::ExecutionClosed => {
            let message = pb::ExecutionClosed::decode(bytes)?;
            EventBody::ExecutionClosed {
                execution: ExecutionId(message.execution),
                status: close_status_from_proto("execution_closed.status", message.status)?,
            }
        }
        EventKind::ModelCall => {
            // From the `Bytes`: the token arrays are slices of the batch, not copies.
            EventBody::ModelCall(Box::new(model_call(pb::ModelCall::decode(body.clone())?)?))
        }
        EventKind::EvaluationRequested => {
            let message = pb::EvaluationRequested::decode(bytes)?;
            EventBody::EvaluationRequested {
                execution: ExecutionId(message.execution),
                attempt: message.attempt,
                artifact_version: message.artifact_version,
                branch_ref: message.branch_ref,
            }
        }
        EventKind::EvaluationCompleted => {
            let message = pb::EvaluationCompleted::decode(bytes)?;
            EventBody::EvaluationCompleted {
                execution: ExecutionId(message.execution),
                attempt: message.attempt,
                score: message.score,
                valid: message.valid,
                evaluated_state_ref: message.evaluated_state_ref,
                artifact_version: message.artifact_version,
                branch_ref: message.branch_ref,
                evaluator: message.evaluator,
            }
        }
        EventKind::EvaluationFailed => {
            let message = pb::EvaluationFailed::decode(bytes)?;
            EventBody::EvaluationFailed {
                execution: ExecutionId(message.execution),
                attempt: message.attempt,
                reason: message.reason,
            }
        }
        EventKind::DummyInserted => {
            let message = pb::DummyInserted::decode(bytes)?;
            EventBody::DummyInserted {
                execution: ExecutionId(message.execution),
                group: GroupId(message.group),
            }
        }
        EventKind::ExecutionExcluded => {
            let message = pb::ExecutionExcluded::decode(bytes)?;
            EventBody::ExecutionExcluded {
                execution: ExecutionId(message.execution),
                reason: message.reason,
            }
        }
        EventKind::TrajectoriesAdmitted => {
            let message = pb::TrajectoriesAdmitted::decode(bytes)?;
            EventBody::TrajectoriesAdmitted {
                execution: ExecutionId(message.execution),
                trajectories: message
                    .trajectories
                    .into_iter()
                    .map(|trajectory| AdmittedTrajectory {
                        leaf_call: CallId(trajectory.leaf_call),
                        class: trajectory.class,
                        targets: trajectory
                            .targets
                            .into_iter()
                            .map(|target| TargetRange {
                                call: CallId(target.call),
                                start: target.start,
                                end: target.end,
                            })
                            .collect(),
                    })
                    .collect(),
            }
        }
        EventKind::TransitionBegun => {
            let message = pb::TransitionBegun::decode(bytes)?;
            EventBody::TransitionBegun {
                cell: CellId(message.cell),
                to: role_from_proto("transition_begun.to", message.to)?,
            }
        }
        EventKind::TransitionCompleted => {
            let message = pb::TransitionCompleted::decode(bytes)?;
            EventBody::TransitionCompleted {
                cell: CellId(message.cell),
                role: role_from_proto("transition_completed.role", message.role)?,
            }
        }
        EventKind::RoutesUpdated => {
            let message = pb::RoutesUpdated::decode(bytes)?;
            EventBody::RoutesUpdated {
                source: EngineId(message.source_engine),
                moves: message
                    .moves
                    .into_iter()
                    .map(|route_move| RouteMove {
                        execution: ExecutionId(route_move.execution),
                        from: EngineId(route_move.from_engine),
                        to: EngineId(route_move.to_engine),
                    })
                    .collect(),
            }
        }
        EventKind::BatchOpened => EventBody::BatchOpened {
            step: StepId(pb::BatchOpened::decode(bytes)?.step),
        },
        EventKind::MicroStepsEnqueued => {
            let message = pb::MicroStepsEnqueued::decode(bytes)?;
            EventBody::MicroStepsEnqueued {
                step: StepId(message.step),
                group: GroupId(message.group),
                micro_steps: message.micro_steps.into_iter().map(MicroStepId).collect(),
                closes_stream: message.closes_stream,
            }
        }
        EventKind::MicroStepClaimed => {
            let message = pb::MicroStepClaimed::decode(bytes)?;
            EventBody::MicroStepClaimed {
                step: StepId(message.step),
                micro_step: MicroStepId(message.micro_step),
                cell: CellId(message.cell),
            }
        }
        EventKind::MicroStepDone => {
            let message = pb::MicroStepDone::decode(bytes)?;
            EventBody::MicroStepDone {
                step: StepId(message.step),
                micro_step: MicroStepId(message.micro_step),
                cell: CellId(message.cell),
            }
        }
        EventKind::JoinWindowClosed => EventBody::JoinWindowClosed {
            step: StepId(pb::JoinWindowClosed::decode(bytes)?.step),
        },
        EventKind::OptimizerStepped => {
            let message = pb::OptimizerStepped::decode(bytes)?;
            EventBody::OptimizerStepped {
                step: StepId(message.step),
                policy_version: PolicyVersion(message.policy_version),
                consumed: message
                    .consumed
                    .into_iter()
                    .map(|group| ConsumedGroup {
                        group: GroupId(group.group),
                        staleness: group.staleness,
                    })
                    .collect(),
            }
        }
        EventKind::WeightsPublished => {
            let message = pb::WeightsPublished::decode(bytes)?;
            EventBody::WeightsPublished {
                policy_version: PolicyVersion(message.policy_version),
                took: Duration(message.took_nanos),
            }
        }
        EventKind::BurstEnded => EventBody::BurstEnded {
            burst: pb::BurstEnded::decode(bytes)?.burst,
        },
        EventKind::Tick => {
            // Decoded anyway so that garbage in a tick's body is reported, not ignored.
            pb::Tick::decode(bytes)?;
            EventBody::Tick
        }
        EventKind::ProjectionDigest => {
            let message = pb::ProjectionDigest::decode(bytes)?;
            let found = message.hash.len();
            let hash: [u8; 32] = message
                .hash
                .try_into()
                .map_err(|_| BodyError::WrongLength {
                    field: "projection_digest.hash",
                    expected: 32,
                    found,
                })?;
            EventBody::ProjectionDigest {
                upto: LogIndex(message.upto),
                hash,
            }
        }
    };
    Ok(body)
}

fn run_started(message: pb::RunStarted) -> Result<RunConfig, BodyError> {
    Ok(RunConfig {
        run_seed: message.run_seed,
        mode: mode_from_proto("run_started.mode", message.mode)?,
        streaming: message.streaming,
        phi: message.phi,
        mu: message.mu,
        n: message.n,
        b: message.b,
        steps: message.steps,
        rho_min: message.rho_min,
        tau: Duration(message.tau_nanos),
        j_max: message.j_max,
        async_training_cells: message.async_training_cells,
    })
}

fn model_call(message: pb::ModelCall) -> Result<ModelCallRecord, BodyError> {
    let input_provenance = message
        .input_provenance
        .iter()
        .map(|span| {
            Ok(ProvenanceSpan {
                provenance: provenance_from_proto(
                    "model_call.input_provenance.provenance",
                    span.provenance,
                )?,
                tokens_count: span.tokens_count,
            })
        })
        .collect::<Result<Vec<_>, BodyError>>()?;
    Ok(ModelCallRecord {
        execution: ExecutionId(message.execution),
        call: CallId(message.call),
        agent: message.agent,
        kind: call_kind_from_proto("model_call.kind", message.kind)?,
        parent_call: message.parent_call.map(CallId),
        reused_prefix_tokens_count: message.reused_prefix_tokens_count,
        spawned_by: message.spawned_by.map(CallId),
        input_ids: le_to_u32s("model_call.input_ids", &message.input_ids)?,
        input_provenance,
        output_ids: le_to_u32s("model_call.output_ids", &message.output_ids)?,
        output_logprobs: le_to_f32s("model_call.output_logprobs", &message.output_logprobs)?,
        engine: EngineId(message.engine),
        policy_version: PolicyVersion(message.policy_version),
        requested_at: Timestamp(message.requested_at_nanos),
        first_token_after: Duration(message.first_token_after_nanos),
        completed_after: Duration(message.completed_after_nanos),
    })
}
