//! Domain → protobuf: one body message per event kind, always at the current schema version.

use gyre_event::{EventBody, ModelCallRecord, RunConfig, SamplingSettings};
use gyre_proto::events as pb;
use prost::Message;

use super::enums::{
    call_kind_to_proto, close_status_to_proto, mode_to_proto, provenance_to_proto, role_to_proto,
};
use super::tokens::{f32s_to_le, u32s_to_le};

/// Encodes `body` as the protobuf message of its kind, at the kind's current schema version.
pub(crate) fn encode_body(body: &EventBody) -> Vec<u8> {
    match body {
        EventBody::RunStarted(config) => run_started(config).encode_to_vec(),
        EventBody::CellRegistered {
            cell,
            rollout_capacity,
            nodes,
            engine,
        } => pb::CellRegistered {
            cell: cell.get(),
            rollout_capacity: *rollout_capacity,
            nodes: *nodes,
            engine: engine.get(),
        }
        .encode_to_vec(),
        EventBody::StandalonePoolRegistered {
            engine,
            rollout_capacity,
            nodes,
        } => pb::StandalonePoolRegistered {
            engine: engine.get(),
            rollout_capacity: *rollout_capacity,
            nodes: *nodes,
        }
        .encode_to_vec(),
        EventBody::EngineReady { engine } => pb::EngineReady {
            engine: engine.get(),
        }
        .encode_to_vec(),
        EventBody::EngineDown { engine, reason } => pb::EngineDown {
            engine: engine.get(),
            reason: reason.clone(),
        }
        .encode_to_vec(),
        EventBody::GroupsDispatched {
            groups,
            executions_per_group,
            policy_version,
        } => pb::GroupsDispatched {
            groups: groups
                .iter()
                .map(|dispatched| pb::DispatchedGroup {
                    group: dispatched.group.get(),
                    query: dispatched.query.get(),
                })
                .collect(),
            executions_per_group: *executions_per_group,
            policy_version: policy_version.get(),
        }
        .encode_to_vec(),
        EventBody::ExecutionStarted {
            execution,
            group,
            engine,
        } => pb::ExecutionStarted {
            execution: execution.get(),
            group: group.get(),
            engine: engine.get(),
        }
        .encode_to_vec(),
        EventBody::ExecutionClosed { execution, status } => pb::ExecutionClosed {
            execution: execution.get(),
            status: close_status_to_proto(*status),
        }
        .encode_to_vec(),
        EventBody::ModelCall(record) => model_call(record).encode_to_vec(),
        EventBody::ResponseStored(record) => pb::ResponseStored {
            execution: record.execution.get(),
            response_id: record.response_id.clone(),
            previous_response_id: record.previous_response_id.clone().unwrap_or_default(),
            items: record.items.clone(),
        }
        .encode_to_vec(),
        EventBody::EvaluationRequested {
            execution,
            attempt,
            artifact_version,
            branch_ref,
        } => pb::EvaluationRequested {
            execution: execution.get(),
            attempt: *attempt,
            artifact_version: *artifact_version,
            branch_ref: branch_ref.clone(),
        }
        .encode_to_vec(),
        EventBody::EvaluationCompleted {
            execution,
            attempt,
            score,
            valid,
            evaluated_state_ref,
            artifact_version,
            branch_ref,
            evaluator,
        } => pb::EvaluationCompleted {
            execution: execution.get(),
            attempt: *attempt,
            score: *score,
            valid: *valid,
            evaluated_state_ref: evaluated_state_ref.clone(),
            artifact_version: *artifact_version,
            branch_ref: branch_ref.clone(),
            evaluator: evaluator.clone(),
        }
        .encode_to_vec(),
        EventBody::EvaluationFailed {
            execution,
            attempt,
            reason,
        } => pb::EvaluationFailed {
            execution: execution.get(),
            attempt: *attempt,
            reason: reason.clone(),
        }
        .encode_to_vec(),
        EventBody::DummyInserted { execution, group } => pb::DummyInserted {
            execution: execution.get(),
            group: group.get(),
        }
        .encode_to_vec(),
        EventBody::ExecutionExcluded { execution, reason } => pb::ExecutionExcluded {
            execution: execution.get(),
            reason: reason.clone(),
        }
        .encode_to_vec(),
        EventBody::TrajectoriesAdmitted {
            execution,
            trajectories,
        } => pb::TrajectoriesAdmitted {
            execution: execution.get(),
            trajectories: trajectories
                .iter()
                .map(|trajectory| pb::AdmittedTrajectory {
                    leaf_call: trajectory.leaf_call.get(),
                    class: trajectory.class,
                    targets: trajectory
                        .targets
                        .iter()
                        .map(|target| pb::TargetRange {
                            call: target.call.get(),
                            start: target.start,
                            end: target.end,
                        })
                        .collect(),
                })
                .collect(),
        }
        .encode_to_vec(),
        EventBody::TransitionBegun { cell, to } => pb::TransitionBegun {
            cell: cell.get(),
            to: role_to_proto(*to),
        }
        .encode_to_vec(),
        EventBody::TransitionCompleted { cell, role } => pb::TransitionCompleted {
            cell: cell.get(),
            role: role_to_proto(*role),
        }
        .encode_to_vec(),
        EventBody::RoutesUpdated { source, moves } => pb::RoutesUpdated {
            source_engine: source.get(),
            moves: moves
                .iter()
                .map(|route_move| pb::RouteMove {
                    execution: route_move.execution.get(),
                    from_engine: route_move.from.get(),
                    to_engine: route_move.to.get(),
                })
                .collect(),
        }
        .encode_to_vec(),
        EventBody::BatchOpened { step } => pb::BatchOpened { step: step.get() }.encode_to_vec(),
        EventBody::MicroStepsEnqueued {
            step,
            group,
            micro_steps,
            closes_stream,
        } => pb::MicroStepsEnqueued {
            step: step.get(),
            group: group.get(),
            micro_steps: micro_steps
                .iter()
                .map(|micro_step| micro_step.get())
                .collect(),
            closes_stream: *closes_stream,
        }
        .encode_to_vec(),
        EventBody::MicroStepClaimed {
            step,
            micro_step,
            cell,
        } => pb::MicroStepClaimed {
            step: step.get(),
            micro_step: micro_step.get(),
            cell: cell.get(),
        }
        .encode_to_vec(),
        EventBody::MicroStepDone {
            step,
            micro_step,
            cell,
        } => pb::MicroStepDone {
            step: step.get(),
            micro_step: micro_step.get(),
            cell: cell.get(),
        }
        .encode_to_vec(),
        EventBody::JoinWindowClosed { step } => {
            pb::JoinWindowClosed { step: step.get() }.encode_to_vec()
        }
        EventBody::OptimizerStepped {
            step,
            policy_version,
            consumed,
        } => pb::OptimizerStepped {
            step: step.get(),
            policy_version: policy_version.get(),
            consumed: consumed
                .iter()
                .map(|group| pb::ConsumedGroup {
                    group: group.group.get(),
                    staleness: group.staleness,
                })
                .collect(),
        }
        .encode_to_vec(),
        EventBody::WeightsPublished {
            policy_version,
            took,
        } => pb::WeightsPublished {
            policy_version: policy_version.get(),
            took_nanos: took.nanos(),
        }
        .encode_to_vec(),
        EventBody::BurstEnded { burst } => pb::BurstEnded { burst: *burst }.encode_to_vec(),
        EventBody::Tick => pb::Tick {}.encode_to_vec(),
        EventBody::ProjectionDigest { upto, hash, rules } => pb::ProjectionDigest {
            upto: upto.get(),
            hash: hash.to_vec(),
            rules: *rules,
        }
        .encode_to_vec(),
    }
}

fn run_started(config: &RunConfig) -> pb::RunStarted {
    pb::RunStarted {
        run_seed: config.run_seed,
        mode: mode_to_proto(config.mode),
        streaming: config.streaming,
        phi: config.phi,
        mu: config.mu,
        n: config.n,
        b: config.b,
        steps: config.steps,
        rho_min: config.rho_min,
        async_training_cells: config.async_training_cells,
        j_max: config.j_max,
        tau_nanos: config.tau.nanos(),
    }
}

fn model_call(record: &ModelCallRecord) -> pb::ModelCall {
    pb::ModelCall {
        execution: record.execution.get(),
        call: record.call.get(),
        agent: record.agent.clone(),
        kind: call_kind_to_proto(record.kind),
        parent_call: record.parent_call.map(|call| call.get()),
        reused_prefix_tokens_count: record.reused_prefix_tokens_count,
        spawned_by: record.spawned_by.map(|call| call.get()),
        input_ids: u32s_to_le(&record.input_ids).into(),
        input_provenance: record
            .input_provenance
            .iter()
            .map(|span| pb::ProvenanceSpan {
                provenance: provenance_to_proto(span.provenance),
                tokens_count: span.tokens_count,
            })
            .collect(),
        output_ids: u32s_to_le(&record.output_ids).into(),
        output_logprobs: f32s_to_le(&record.output_logprobs).into(),
        engine: record.engine.get(),
        policy_version: record.policy_version.get(),
        requested_at_nanos: record.requested_at.nanos(),
        first_token_after_nanos: record.first_token_after.nanos(),
        completed_after_nanos: record.completed_after.nanos(),
        stop_sequences: record.stop_sequences.clone(),
        output_constraint: record.output_constraint.as_ref().map(|constraint| {
            pb::OutputConstraint {
                schema: constraint.schema.clone(),
                enforced: constraint.enforced,
                constrained_tokens: constraint.constrained_tokens,
            }
        }),
        // The policy's own settings are the absent message; otherwise only what differs.
        sampling: (!record.sampling.is_policy()).then(|| {
            let policy = SamplingSettings::POLICY;
            pb::Sampling {
                temperature: (record.sampling.temperature != policy.temperature)
                    .then_some(record.sampling.temperature),
                top_p: (record.sampling.top_p != policy.top_p).then_some(record.sampling.top_p),
                top_k: record.sampling.top_k,
            }
        }),
    }
}
