//! proptest strategies for arbitrary events of every kind.
//!
//! Floats are any value except NaN (NaN ≠ NaN would make equality checks meaningless; the
//! codec's bit-exactness for NaN is tested separately).

use gyre_event::{
    AdmittedTrajectory, CallId, CallKind, CellId, CloseStatus, ConsumedGroup, DispatchedGroup,
    Duration, EngineId, Event, EventBody, ExecutionId, GroupId, LogIndex, MicroStepId,
    ModelCallRecord, OutputConstraint, PolicyVersion, Provenance, ProvenanceSpan, QueryId, Role,
    RouteMove, RunConfig, SamplingSettings, SchedulingMode, StepId, TargetRange, Timestamp,
};
use proptest::prelude::*;

fn f64_not_nan() -> impl Strategy<Value = f64> {
    use proptest::num::f64::*;
    POSITIVE | NEGATIVE | NORMAL | SUBNORMAL | ZERO | INFINITE
}

fn f32_not_nan() -> impl Strategy<Value = f32> {
    use proptest::num::f32::*;
    POSITIVE | NEGATIVE | NORMAL | SUBNORMAL | ZERO | INFINITE
}

fn text() -> impl Strategy<Value = String> {
    "\\PC{0,16}"
}

fn role() -> impl Strategy<Value = Role> {
    prop_oneof![Just(Role::Rollout), Just(Role::Training)]
}

fn mode() -> impl Strategy<Value = SchedulingMode> {
    prop_oneof![
        Just(SchedulingMode::Elastic),
        Just(SchedulingMode::Colocate),
        Just(SchedulingMode::Async)
    ]
}

fn provenance() -> impl Strategy<Value = Provenance> {
    proptest::sample::select(Provenance::ALL.to_vec())
}

fn close_status() -> impl Strategy<Value = CloseStatus> {
    proptest::sample::select(CloseStatus::ALL.to_vec())
}

fn run_config() -> impl Strategy<Value = RunConfig> {
    (
        (any::<u64>(), mode(), any::<bool>(), f64_not_nan()),
        (any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>()),
        (f64_not_nan(), any::<u64>(), any::<u32>(), any::<u32>()),
    )
        .prop_map(
            |(
                (run_seed, mode, streaming, phi),
                (mu, n, b, steps),
                (rho_min, tau, j_max, async_training_cells),
            )| RunConfig {
                run_seed,
                mode,
                streaming,
                phi,
                mu,
                n,
                b,
                steps,
                rho_min,
                tau: Duration(tau),
                j_max,
                async_training_cells,
            },
        )
}

fn model_call() -> impl Strategy<Value = ModelCallRecord> {
    (
        (any::<u64>(), any::<u64>(), text(), 0u8..3),
        (
            proptest::option::of(any::<u64>()),
            any::<u64>(),
            proptest::option::of(any::<u64>()),
        ),
        (
            proptest::collection::vec(any::<u32>(), 0..64),
            proptest::collection::vec((provenance(), any::<u32>()), 0..6),
            proptest::collection::vec(any::<u32>(), 0..64),
            proptest::collection::vec(f32_not_nan(), 0..64),
        ),
        (
            any::<u32>(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            proptest::collection::vec("\\PC{0,6}", 0..3),
            proptest::option::of((
                proptest::option::of("\\PC{1,8}"),
                any::<bool>(),
                any::<u32>(),
            )),
            proptest::option::of((
                f32_not_nan(),
                f32_not_nan(),
                proptest::option::of(any::<u32>()),
            )),
        ),
    )
        .prop_map(
            |(
                (execution, call, agent, kind),
                (parent_call, reused_prefix_tokens_count, spawned_by),
                (input_ids, spans, output_ids, output_logprobs),
                (
                    engine,
                    policy_version,
                    requested_at,
                    first_token_after,
                    completed_after,
                    stop_sequences,
                    output_constraint,
                    sampling,
                ),
            )| ModelCallRecord {
                execution: ExecutionId(execution),
                call: CallId(call),
                agent,
                kind: match kind {
                    0 => CallKind::Turn,
                    1 => CallKind::Summary,
                    _ => CallKind::Aborted,
                },
                parent_call: parent_call.map(CallId),
                reused_prefix_tokens_count,
                spawned_by: spawned_by.map(CallId),
                input_ids,
                input_provenance: spans
                    .into_iter()
                    .map(|(provenance, tokens_count)| ProvenanceSpan {
                        provenance,
                        tokens_count,
                    })
                    .collect(),
                output_ids,
                output_logprobs,
                engine: EngineId(engine),
                policy_version: PolicyVersion(policy_version),
                requested_at: Timestamp(requested_at),
                first_token_after: Duration(first_token_after),
                completed_after: Duration(completed_after),
                stop_sequences,
                output_constraint: output_constraint.map(
                    |(schema, enforced, constrained_tokens)| OutputConstraint {
                        schema,
                        enforced,
                        constrained_tokens,
                    },
                ),
                sampling: sampling.map_or(
                    SamplingSettings::POLICY,
                    |(temperature, top_p, top_k)| SamplingSettings {
                        temperature,
                        top_p,
                        top_k,
                    },
                ),
            },
        )
}

fn trajectory() -> impl Strategy<Value = AdmittedTrajectory> {
    (
        any::<u64>(),
        any::<u32>(),
        proptest::collection::vec((any::<u64>(), any::<u32>(), any::<u32>()), 0..4),
    )
        .prop_map(|(leaf_call, class, targets)| AdmittedTrajectory {
            leaf_call: CallId(leaf_call),
            class,
            targets: targets
                .into_iter()
                .map(|(call, start, end)| TargetRange {
                    call: CallId(call),
                    start,
                    end,
                })
                .collect(),
        })
}

/// Any event body, every kind equally likely.
pub fn event_body() -> BoxedStrategy<EventBody> {
    prop_oneof![
        run_config().prop_map(EventBody::RunStarted),
        (any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>()).prop_map(
            |(cell, rollout_capacity, nodes, engine)| EventBody::CellRegistered {
                cell: CellId(cell),
                rollout_capacity,
                nodes,
                engine: EngineId(engine),
            }
        ),
        (any::<u32>(), any::<u32>(), any::<u32>()).prop_map(|(engine, rollout_capacity, nodes)| {
            EventBody::StandalonePoolRegistered {
                engine: EngineId(engine),
                rollout_capacity,
                nodes,
            }
        }),
        any::<u32>().prop_map(|engine| EventBody::EngineReady {
            engine: EngineId(engine)
        }),
        (any::<u32>(), text()).prop_map(|(engine, reason)| EventBody::EngineDown {
            engine: EngineId(engine),
            reason,
        }),
        (
            proptest::collection::vec((any::<u64>(), any::<u64>()), 0..8),
            any::<u32>(),
            any::<u64>()
        )
            .prop_map(|(groups, executions_per_group, policy_version)| {
                EventBody::GroupsDispatched {
                    groups: groups
                        .into_iter()
                        .map(|(group, query)| DispatchedGroup {
                            group: GroupId(group),
                            query: QueryId(query),
                        })
                        .collect(),
                    executions_per_group,
                    policy_version: PolicyVersion(policy_version),
                }
            }),
        (any::<u64>(), any::<u64>(), any::<u32>()).prop_map(|(execution, group, engine)| {
            EventBody::ExecutionStarted {
                execution: ExecutionId(execution),
                group: GroupId(group),
                engine: EngineId(engine),
            }
        }),
        (any::<u64>(), close_status()).prop_map(|(execution, status)| {
            EventBody::ExecutionClosed {
                execution: ExecutionId(execution),
                status,
            }
        }),
        model_call().prop_map(|record| EventBody::ModelCall(Box::new(record))),
        (any::<u64>(), any::<u32>(), any::<u64>(), text()).prop_map(
            |(execution, attempt, artifact_version, branch_ref)| {
                EventBody::EvaluationRequested {
                    execution: ExecutionId(execution),
                    attempt,
                    artifact_version,
                    branch_ref,
                }
            }
        ),
        (
            (any::<u64>(), any::<u32>(), f64_not_nan(), any::<bool>()),
            (text(), any::<u64>(), text(), text())
        )
            .prop_map(
                |(
                    (execution, attempt, score, valid),
                    (evaluated_state_ref, artifact_version, branch_ref, evaluator),
                )| EventBody::EvaluationCompleted {
                    execution: ExecutionId(execution),
                    attempt,
                    score,
                    valid,
                    evaluated_state_ref,
                    artifact_version,
                    branch_ref,
                    evaluator,
                }
            ),
        (any::<u64>(), any::<u32>(), text()).prop_map(|(execution, attempt, reason)| {
            EventBody::EvaluationFailed {
                execution: ExecutionId(execution),
                attempt,
                reason,
            }
        }),
        (any::<u64>(), any::<u64>()).prop_map(|(execution, group)| EventBody::DummyInserted {
            execution: ExecutionId(execution),
            group: GroupId(group),
        }),
        (any::<u64>(), text()).prop_map(|(execution, reason)| EventBody::ExecutionExcluded {
            execution: ExecutionId(execution),
            reason,
        }),
        (any::<u64>(), proptest::collection::vec(trajectory(), 0..4)).prop_map(
            |(execution, trajectories)| EventBody::TrajectoriesAdmitted {
                execution: ExecutionId(execution),
                trajectories,
            }
        ),
        (any::<u32>(), role()).prop_map(|(cell, to)| EventBody::TransitionBegun {
            cell: CellId(cell),
            to,
        }),
        (any::<u32>(), role()).prop_map(|(cell, role)| EventBody::TransitionCompleted {
            cell: CellId(cell),
            role,
        }),
        (
            any::<u32>(),
            proptest::collection::vec((any::<u64>(), any::<u32>(), any::<u32>()), 0..6)
        )
            .prop_map(|(source, moves)| EventBody::RoutesUpdated {
                source: EngineId(source),
                moves: moves
                    .into_iter()
                    .map(|(execution, from, to)| RouteMove {
                        execution: ExecutionId(execution),
                        from: EngineId(from),
                        to: EngineId(to),
                    })
                    .collect(),
            }),
        any::<u64>().prop_map(|step| EventBody::BatchOpened { step: StepId(step) }),
        (
            any::<u64>(),
            any::<u64>(),
            proptest::collection::vec(any::<u64>(), 0..8),
            any::<bool>()
        )
            .prop_map(|(step, group, micro_steps, closes_stream)| {
                EventBody::MicroStepsEnqueued {
                    step: StepId(step),
                    group: GroupId(group),
                    micro_steps: micro_steps.into_iter().map(MicroStepId).collect(),
                    closes_stream,
                }
            }),
        (any::<u64>(), any::<u64>(), any::<u32>()).prop_map(|(step, micro_step, cell)| {
            EventBody::MicroStepClaimed {
                step: StepId(step),
                micro_step: MicroStepId(micro_step),
                cell: CellId(cell),
            }
        }),
        (any::<u64>(), any::<u64>(), any::<u32>()).prop_map(|(step, micro_step, cell)| {
            EventBody::MicroStepDone {
                step: StepId(step),
                micro_step: MicroStepId(micro_step),
                cell: CellId(cell),
            }
        }),
        any::<u64>().prop_map(|step| EventBody::JoinWindowClosed { step: StepId(step) }),
        (
            any::<u64>(),
            any::<u64>(),
            proptest::collection::vec((any::<u64>(), any::<u64>()), 0..6)
        )
            .prop_map(
                |(step, policy_version, consumed)| EventBody::OptimizerStepped {
                    step: StepId(step),
                    policy_version: PolicyVersion(policy_version),
                    consumed: consumed
                        .into_iter()
                        .map(|(group, staleness)| ConsumedGroup {
                            group: GroupId(group),
                            staleness,
                        })
                        .collect(),
                }
            ),
        (any::<u64>(), any::<u64>()).prop_map(|(policy_version, took)| {
            EventBody::WeightsPublished {
                policy_version: PolicyVersion(policy_version),
                took: Duration(took),
            }
        }),
        any::<u64>().prop_map(|burst| EventBody::BurstEnded { burst }),
        Just(EventBody::Tick),
        (any::<u64>(), any::<[u8; 32]>(), any::<u32>()).prop_map(|(upto, hash, rules)| {
            EventBody::ProjectionDigest {
                upto: LogIndex(upto),
                hash,
                rules,
            }
        }),
        (
            any::<u64>(),
            "resp_[a-z0-9]{0,12}",
            proptest::option::of("resp_[a-z0-9]{1,12}"),
            proptest::collection::vec(any::<u8>(), 0..64),
        )
            .prop_map(|(execution, response_id, previous_response_id, items)| {
                EventBody::ResponseStored(Box::new(gyre_event::StoredResponseRecord {
                    execution: ExecutionId(execution),
                    response_id,
                    previous_response_id,
                    items,
                }))
            }),
    ]
    .boxed()
}

pub fn event() -> impl Strategy<Value = Event> {
    (any::<u64>(), event_body()).prop_map(|(at, body)| Event::new(Timestamp(at), body))
}

pub fn events(max: usize) -> impl Strategy<Value = Vec<Event>> {
    proptest::collection::vec(event(), 0..max)
}
