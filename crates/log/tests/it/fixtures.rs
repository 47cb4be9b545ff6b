//! Hand-written events: one of every kind, with values that exercise every field.

use gyre_event::{
    AdmittedTrajectory, CallId, CallKind, CellId, CloseStatus, ConsumedGroup, DispatchedGroup,
    Duration, EngineId, Event, EventBody, ExecutionId, GroupId, LogIndex, MicroStepId,
    ModelCallRecord, PolicyVersion, Provenance, ProvenanceSpan, QueryId, Role, RouteMove,
    RunConfig, SchedulingMode, StepId, TargetRange, Timestamp,
};

pub fn run_config() -> RunConfig {
    RunConfig {
        run_seed: 42,
        mode: SchedulingMode::Elastic,
        streaming: true,
        phi: 0.5,
        mu: 2,
        n: 16,
        b: 32,
        steps: 48,
        rho_min: 0.25,
        tau: Duration::from_secs_f64(1.5),
        j_max: 4,
        async_training_cells: 0,
    }
}

pub fn model_call() -> ModelCallRecord {
    ModelCallRecord {
        execution: ExecutionId(7),
        call: CallId(70),
        agent: "main".to_string(),
        kind: CallKind::Turn,
        parent_call: Some(CallId(69)),
        reused_prefix_tokens_count: 1234,
        spawned_by: None,
        input_ids: vec![1, 2, 3, 0xFFFF_FFFF, 151_643],
        input_provenance: vec![
            ProvenanceSpan {
                provenance: Provenance::Template,
                tokens_count: 1,
            },
            ProvenanceSpan {
                provenance: Provenance::ToolResult,
                tokens_count: 4,
            },
        ],
        output_ids: vec![10, 11, 12],
        output_logprobs: vec![-0.125, -2.5, 0.0],
        engine: EngineId(3),
        policy_version: PolicyVersion(5),
        requested_at: Timestamp(9_000_000_000),
        first_token_after: Duration(120_000_000),
        completed_after: Duration(2_500_000_000),
        stop_sequences: Vec::new(),
        output_constraint: None,
        sampling: gyre_event::SamplingSettings::POLICY,
    }
}

/// One event of every kind, in kind-number order, with distinct timestamps.
pub fn all_kinds() -> Vec<Event> {
    let mut all = kinds_1_to_28();
    all.extend(kinds_from_29());
    all
}

/// Kinds added after the first golden files (kind 29 on): their own golden.
pub fn kinds_from_29() -> Vec<Event> {
    vec![Event::new(
        Timestamp(29_000),
        EventBody::ResponseStored(Box::new(gyre_event::StoredResponseRecord {
            execution: ExecutionId(1),
            response_id: "resp_2".into(),
            previous_response_id: Some("resp_1".into()),
            items: br#"{"type":"function_call_output","call_id":"call_1","output":"ok"}"#.to_vec(),
        })),
    )]
}

/// One event of each of kinds 1 to 28 (what `batch_f1_all_kinds.bin` and
/// `file_f1_three_records.bin` hold), in kind-number order, with distinct timestamps.
pub fn kinds_1_to_28() -> Vec<Event> {
    let bodies = vec![
        EventBody::RunStarted(run_config()),
        EventBody::CellRegistered {
            cell: CellId(1),
            rollout_capacity: 144,
            nodes: 4,
            engine: EngineId(1),
        },
        EventBody::StandalonePoolRegistered {
            engine: EngineId(100),
            rollout_capacity: 32,
            nodes: 1,
        },
        EventBody::EngineReady {
            engine: EngineId(1),
        },
        EventBody::EngineDown {
            engine: EngineId(2),
            reason: "oom on gpu 3".to_string(),
        },
        EventBody::GroupsDispatched {
            groups: vec![
                DispatchedGroup {
                    group: GroupId(1),
                    query: QueryId(11),
                },
                DispatchedGroup {
                    group: GroupId(2),
                    query: QueryId(12),
                },
            ],
            executions_per_group: 16,
            policy_version: PolicyVersion(0),
        },
        EventBody::ExecutionStarted {
            execution: ExecutionId(7),
            group: GroupId(1),
            engine: EngineId(1),
        },
        EventBody::ExecutionClosed {
            execution: ExecutionId(7),
            status: CloseStatus::HarnessTimeout,
        },
        EventBody::ModelCall(Box::new(model_call())),
        EventBody::EvaluationRequested {
            execution: ExecutionId(7),
            attempt: 1,
            artifact_version: 3,
            branch_ref: "refs/heads/e7".to_string(),
        },
        EventBody::EvaluationCompleted {
            execution: ExecutionId(7),
            attempt: 1,
            score: 0.75,
            valid: true,
            evaluated_state_ref: "sha256:abc".to_string(),
            artifact_version: 3,
            branch_ref: "refs/heads/e7".to_string(),
            evaluator: "pytest-runner".to_string(),
        },
        EventBody::EvaluationFailed {
            execution: ExecutionId(8),
            attempt: 2,
            reason: "sandbox lost".to_string(),
        },
        EventBody::DummyInserted {
            execution: ExecutionId(9),
            group: GroupId(1),
        },
        EventBody::ExecutionExcluded {
            execution: ExecutionId(10),
            reason: "overall timeout".to_string(),
        },
        EventBody::TrajectoriesAdmitted {
            execution: ExecutionId(7),
            trajectories: vec![AdmittedTrajectory {
                leaf_call: CallId(70),
                class: 0,
                targets: vec![
                    TargetRange {
                        call: CallId(69),
                        start: 0,
                        end: 12,
                    },
                    TargetRange {
                        call: CallId(70),
                        start: 0,
                        end: 3,
                    },
                ],
            }],
        },
        EventBody::TransitionBegun {
            cell: CellId(0),
            to: Role::Training,
        },
        EventBody::TransitionCompleted {
            cell: CellId(0),
            role: Role::Training,
        },
        EventBody::RoutesUpdated {
            source: EngineId(0),
            moves: vec![RouteMove {
                execution: ExecutionId(7),
                from: EngineId(0),
                to: EngineId(100),
            }],
        },
        EventBody::BatchOpened { step: StepId(1) },
        EventBody::MicroStepsEnqueued {
            step: StepId(1),
            group: GroupId(1),
            micro_steps: vec![MicroStepId(1), MicroStepId(2)],
            closes_stream: true,
        },
        EventBody::MicroStepClaimed {
            step: StepId(1),
            micro_step: MicroStepId(1),
            cell: CellId(0),
        },
        EventBody::MicroStepDone {
            step: StepId(1),
            micro_step: MicroStepId(1),
            cell: CellId(0),
        },
        EventBody::JoinWindowClosed { step: StepId(1) },
        EventBody::OptimizerStepped {
            step: StepId(1),
            policy_version: PolicyVersion(1),
            consumed: vec![ConsumedGroup {
                group: GroupId(1),
                staleness: 1,
            }],
        },
        EventBody::WeightsPublished {
            policy_version: PolicyVersion(1),
            took: Duration::from_secs(3),
        },
        EventBody::BurstEnded { burst: 1 },
        EventBody::Tick,
        EventBody::ProjectionDigest {
            upto: LogIndex(27),
            hash: std::array::from_fn(|i| i as u8),
            // Not stated (0, absent on the wire): the golden bytes predate the field.
            rules: 0,
        },
    ];
    bodies
        .into_iter()
        .enumerate()
        .map(|(i, body)| Event::new(Timestamp(1_000 * (i as u64 + 1)), body))
        .collect()
}
