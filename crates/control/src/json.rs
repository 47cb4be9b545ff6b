//! The JSON form of `gyre_event::Event`, used by `gyre log append` (stdin) and `gyre log tail`
//! (stdout); documented in docs/control.md.
//!
//! One event is one JSON object: `{"at": <nanoseconds>, "kind": "<kind name>", ...fields}`. The
//! kind names are `EventBody::kind_name`; ids are plain integers; enums are lowercase snake case
//! strings; durations and times are integer nanoseconds (`tau`, `took`, `requested_at`, ...);
//! `ProjectionDigest.hash` is 64 hex digits. `at` is optional on input (the leader overwrites
//! it). These are serde mirrors of the domain types, so `gyre-event` stays free of serde; the
//! conversions are total in both directions, except that a malformed hash is refused.

use gyre_event as ev;
use serde::{Deserialize, Serialize};

/// One event as a JSON object.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EventJson {
    #[serde(default)]
    pub at: u64,
    #[serde(flatten)]
    pub body: BodyJson,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RoleJson {
    Rollout,
    Training,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CloseStatusJson {
    Completed,
    Failed,
    HarnessTimeout,
    OverallTimeout,
    Cancelled,
    Surplus,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModeJson {
    Elastic,
    Colocate,
    Async,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProvenanceJson {
    System,
    User,
    ToolResult,
    HarnessAssistant,
    EvaluatorCritique,
    Template,
    Sampled,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallKindJson {
    Turn,
    Summary,
    Aborted,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunConfigJson {
    pub run_seed: u64,
    pub mode: ModeJson,
    pub streaming: bool,
    pub phi: f64,
    pub mu: u32,
    pub n: u32,
    pub b: u32,
    pub steps: u32,
    pub rho_min: f64,
    /// τ in nanoseconds.
    pub tau: u64,
    pub j_max: u32,
    pub async_training_cells: u32,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SpanJson {
    pub provenance: ProvenanceJson,
    pub tokens_count: u32,
}

/// `ModelCallRecord`; its `kind` field is called `call_kind` here (`kind` names the event).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ModelCallJson {
    pub execution: u64,
    pub call: u64,
    pub agent: String,
    pub call_kind: CallKindJson,
    #[serde(default)]
    pub parent_call: Option<u64>,
    #[serde(default)]
    pub reused_prefix_tokens_count: u64,
    #[serde(default)]
    pub spawned_by: Option<u64>,
    #[serde(default)]
    pub input_ids: Vec<u32>,
    #[serde(default)]
    pub input_provenance: Vec<SpanJson>,
    #[serde(default)]
    pub output_ids: Vec<u32>,
    #[serde(default)]
    pub output_logprobs: Vec<f32>,
    pub engine: u32,
    pub policy_version: u64,
    pub requested_at: u64,
    pub first_token_after: u64,
    pub completed_after: u64,
    /// The request's stop sequences; omitted when it gave none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop_sequences: Vec<String>,
    /// The answer format the request asked for; omitted for plain text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_constraint: Option<OutputConstraintJson>,
    /// How the engine sampled; omitted for the policy's own settings (temperature 1, no
    /// truncation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampling: Option<SamplingJson>,
}

/// [`ev::SamplingSettings`]; a field left out is the policy's (`temperature` 1, `top_p` 1, no
/// `top_k`).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SamplingJson {
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub temperature: f32,
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub top_p: f32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<u32>,
}

fn one() -> f32 {
    1.0
}

fn is_one(value: &f32) -> bool {
    *value == 1.0
}

/// [`ev::OutputConstraint`]: `schema` is the JSON Schema's text as the request sent it
/// (omitted: any JSON object).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct OutputConstraintJson {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<String>,
    pub enforced: bool,
    /// Leading output tokens sampled under the engine's grammar (omitted: 0).
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub constrained_tokens: u32,
}

fn is_zero_u32(value: &u32) -> bool {
    *value == 0
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GroupJson {
    pub group: u64,
    pub query: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MoveJson {
    pub execution: u64,
    pub from: u32,
    pub to: u32,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TargetJson {
    pub call: u64,
    pub start: u32,
    pub end: u32,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TrajectoryJson {
    pub leaf_call: u64,
    pub class: u32,
    pub targets: Vec<TargetJson>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ConsumedJson {
    pub group: u64,
    pub staleness: u64,
}

/// `EventBody`, tagged by `kind`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum BodyJson {
    RunStarted(RunConfigJson),
    CellRegistered {
        cell: u32,
        rollout_capacity: u32,
        nodes: u32,
        engine: u32,
    },
    StandalonePoolRegistered {
        engine: u32,
        rollout_capacity: u32,
        nodes: u32,
    },
    EngineReady {
        engine: u32,
    },
    EngineDown {
        engine: u32,
        reason: String,
    },
    GroupsDispatched {
        groups: Vec<GroupJson>,
        executions_per_group: u32,
        policy_version: u64,
    },
    ExecutionStarted {
        execution: u64,
        group: u64,
        engine: u32,
    },
    ExecutionClosed {
        execution: u64,
        status: CloseStatusJson,
    },
    ModelCall(ModelCallJson),
    EvaluationRequested {
        execution: u64,
        attempt: u32,
        artifact_version: u64,
        branch_ref: String,
    },
    EvaluationCompleted {
        execution: u64,
        attempt: u32,
        score: f64,
        valid: bool,
        evaluated_state_ref: String,
        artifact_version: u64,
        branch_ref: String,
        evaluator: String,
    },
    EvaluationFailed {
        execution: u64,
        attempt: u32,
        reason: String,
    },
    DummyInserted {
        execution: u64,
        group: u64,
    },
    ExecutionExcluded {
        execution: u64,
        reason: String,
    },
    TrajectoriesAdmitted {
        execution: u64,
        trajectories: Vec<TrajectoryJson>,
    },
    TransitionBegun {
        cell: u32,
        to: RoleJson,
    },
    TransitionCompleted {
        cell: u32,
        role: RoleJson,
    },
    RoutesUpdated {
        source: u32,
        moves: Vec<MoveJson>,
    },
    BatchOpened {
        step: u64,
    },
    MicroStepsEnqueued {
        step: u64,
        group: u64,
        micro_steps: Vec<u64>,
        closes_stream: bool,
    },
    MicroStepClaimed {
        step: u64,
        micro_step: u64,
        cell: u32,
    },
    MicroStepDone {
        step: u64,
        micro_step: u64,
        cell: u32,
    },
    JoinWindowClosed {
        step: u64,
    },
    OptimizerStepped {
        step: u64,
        policy_version: u64,
        consumed: Vec<ConsumedJson>,
    },
    WeightsPublished {
        policy_version: u64,
        took: u64,
    },
    BurstEnded {
        burst: u64,
    },
    Tick,
    ProjectionDigest {
        upto: u64,
        hash: String,
        /// The fold rules the writer folded by; 0 or absent: not stated.
        #[serde(default)]
        rules: u32,
    },
    /// `items` is a JSON array of the stored items (a string when the bytes are not JSON).
    ResponseStored {
        execution: u64,
        response_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        previous_response_id: Option<String>,
        items: serde_json::Value,
    },
}

fn role(role: ev::Role) -> RoleJson {
    match role {
        ev::Role::Rollout => RoleJson::Rollout,
        ev::Role::Training => RoleJson::Training,
    }
}

fn role_back(role: RoleJson) -> ev::Role {
    match role {
        RoleJson::Rollout => ev::Role::Rollout,
        RoleJson::Training => ev::Role::Training,
    }
}

fn status(status: ev::CloseStatus) -> CloseStatusJson {
    use ev::CloseStatus as S;
    match status {
        S::Completed => CloseStatusJson::Completed,
        S::Failed => CloseStatusJson::Failed,
        S::HarnessTimeout => CloseStatusJson::HarnessTimeout,
        S::OverallTimeout => CloseStatusJson::OverallTimeout,
        S::Cancelled => CloseStatusJson::Cancelled,
        S::Surplus => CloseStatusJson::Surplus,
    }
}

fn status_back(status: CloseStatusJson) -> ev::CloseStatus {
    use ev::CloseStatus as S;
    match status {
        CloseStatusJson::Completed => S::Completed,
        CloseStatusJson::Failed => S::Failed,
        CloseStatusJson::HarnessTimeout => S::HarnessTimeout,
        CloseStatusJson::OverallTimeout => S::OverallTimeout,
        CloseStatusJson::Cancelled => S::Cancelled,
        CloseStatusJson::Surplus => S::Surplus,
    }
}

fn provenance(provenance: ev::Provenance) -> ProvenanceJson {
    use ev::Provenance as P;
    match provenance {
        P::System => ProvenanceJson::System,
        P::User => ProvenanceJson::User,
        P::ToolResult => ProvenanceJson::ToolResult,
        P::HarnessAssistant => ProvenanceJson::HarnessAssistant,
        P::EvaluatorCritique => ProvenanceJson::EvaluatorCritique,
        P::Template => ProvenanceJson::Template,
        P::Sampled => ProvenanceJson::Sampled,
    }
}

fn provenance_back(provenance: ProvenanceJson) -> ev::Provenance {
    use ev::Provenance as P;
    match provenance {
        ProvenanceJson::System => P::System,
        ProvenanceJson::User => P::User,
        ProvenanceJson::ToolResult => P::ToolResult,
        ProvenanceJson::HarnessAssistant => P::HarnessAssistant,
        ProvenanceJson::EvaluatorCritique => P::EvaluatorCritique,
        ProvenanceJson::Template => P::Template,
        ProvenanceJson::Sampled => P::Sampled,
    }
}

fn mode(mode: ev::SchedulingMode) -> ModeJson {
    match mode {
        ev::SchedulingMode::Elastic => ModeJson::Elastic,
        ev::SchedulingMode::Colocate => ModeJson::Colocate,
        ev::SchedulingMode::Async => ModeJson::Async,
    }
}

fn mode_back(mode: ModeJson) -> ev::SchedulingMode {
    match mode {
        ModeJson::Elastic => ev::SchedulingMode::Elastic,
        ModeJson::Colocate => ev::SchedulingMode::Colocate,
        ModeJson::Async => ev::SchedulingMode::Async,
    }
}

fn call_kind(kind: ev::CallKind) -> CallKindJson {
    match kind {
        ev::CallKind::Turn => CallKindJson::Turn,
        ev::CallKind::Summary => CallKindJson::Summary,
        ev::CallKind::Aborted => CallKindJson::Aborted,
    }
}

fn call_kind_back(kind: CallKindJson) -> ev::CallKind {
    match kind {
        CallKindJson::Turn => ev::CallKind::Turn,
        CallKindJson::Summary => ev::CallKind::Summary,
        CallKindJson::Aborted => ev::CallKind::Aborted,
    }
}

fn hex_to_hash(hex: &str) -> Result<[u8; 32], String> {
    if hex.len() != 64 || !hex.is_ascii() {
        return Err(format!("hash must be 64 hex digits, got {:?}", hex));
    }
    let mut hash = [0u8; 32];
    for (i, byte) in hash.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
            .map_err(|_| format!("hash {hex:?} is not hexadecimal"))?;
    }
    Ok(hash)
}

impl From<&ev::Event> for EventJson {
    fn from(event: &ev::Event) -> Self {
        use ev::EventBody as E;
        let body = match &event.body {
            E::RunStarted(c) => BodyJson::RunStarted(RunConfigJson {
                run_seed: c.run_seed,
                mode: mode(c.mode),
                streaming: c.streaming,
                phi: c.phi,
                mu: c.mu,
                n: c.n,
                b: c.b,
                steps: c.steps,
                rho_min: c.rho_min,
                tau: c.tau.nanos(),
                j_max: c.j_max,
                async_training_cells: c.async_training_cells,
            }),
            E::CellRegistered {
                cell,
                rollout_capacity,
                nodes,
                engine,
            } => BodyJson::CellRegistered {
                cell: cell.0,
                rollout_capacity: *rollout_capacity,
                nodes: *nodes,
                engine: engine.0,
            },
            E::StandalonePoolRegistered {
                engine,
                rollout_capacity,
                nodes,
            } => BodyJson::StandalonePoolRegistered {
                engine: engine.0,
                rollout_capacity: *rollout_capacity,
                nodes: *nodes,
            },
            E::EngineReady { engine } => BodyJson::EngineReady { engine: engine.0 },
            E::EngineDown { engine, reason } => BodyJson::EngineDown {
                engine: engine.0,
                reason: reason.clone(),
            },
            E::GroupsDispatched {
                groups,
                executions_per_group,
                policy_version,
            } => BodyJson::GroupsDispatched {
                groups: groups
                    .iter()
                    .map(|g| GroupJson {
                        group: g.group.0,
                        query: g.query.0,
                    })
                    .collect(),
                executions_per_group: *executions_per_group,
                policy_version: policy_version.0,
            },
            E::ExecutionStarted {
                execution,
                group,
                engine,
            } => BodyJson::ExecutionStarted {
                execution: execution.0,
                group: group.0,
                engine: engine.0,
            },
            E::ExecutionClosed {
                execution,
                status: s,
            } => BodyJson::ExecutionClosed {
                execution: execution.0,
                status: status(*s),
            },
            E::ModelCall(r) => BodyJson::ModelCall(ModelCallJson {
                execution: r.execution.0,
                call: r.call.0,
                agent: r.agent.clone(),
                call_kind: call_kind(r.kind),
                parent_call: r.parent_call.map(|c| c.0),
                reused_prefix_tokens_count: r.reused_prefix_tokens_count,
                spawned_by: r.spawned_by.map(|c| c.0),
                input_ids: r.input_ids.clone(),
                input_provenance: r
                    .input_provenance
                    .iter()
                    .map(|s| SpanJson {
                        provenance: provenance(s.provenance),
                        tokens_count: s.tokens_count,
                    })
                    .collect(),
                output_ids: r.output_ids.clone(),
                output_logprobs: r.output_logprobs.clone(),
                engine: r.engine.0,
                policy_version: r.policy_version.0,
                requested_at: r.requested_at.0,
                first_token_after: r.first_token_after.0,
                completed_after: r.completed_after.0,
                stop_sequences: r.stop_sequences.clone(),
                output_constraint: r.output_constraint.as_ref().map(|constraint| {
                    OutputConstraintJson {
                        schema: constraint.schema.clone(),
                        enforced: constraint.enforced,
                        constrained_tokens: constraint.constrained_tokens,
                    }
                }),
                sampling: (!r.sampling.is_policy()).then_some(SamplingJson {
                    temperature: r.sampling.temperature,
                    top_p: r.sampling.top_p,
                    top_k: r.sampling.top_k,
                }),
            }),
            E::EvaluationRequested {
                execution,
                attempt,
                artifact_version,
                branch_ref,
            } => BodyJson::EvaluationRequested {
                execution: execution.0,
                attempt: *attempt,
                artifact_version: *artifact_version,
                branch_ref: branch_ref.clone(),
            },
            E::EvaluationCompleted {
                execution,
                attempt,
                score,
                valid,
                evaluated_state_ref,
                artifact_version,
                branch_ref,
                evaluator,
            } => BodyJson::EvaluationCompleted {
                execution: execution.0,
                attempt: *attempt,
                score: *score,
                valid: *valid,
                evaluated_state_ref: evaluated_state_ref.clone(),
                artifact_version: *artifact_version,
                branch_ref: branch_ref.clone(),
                evaluator: evaluator.clone(),
            },
            E::EvaluationFailed {
                execution,
                attempt,
                reason,
            } => BodyJson::EvaluationFailed {
                execution: execution.0,
                attempt: *attempt,
                reason: reason.clone(),
            },
            E::DummyInserted { execution, group } => BodyJson::DummyInserted {
                execution: execution.0,
                group: group.0,
            },
            E::ExecutionExcluded { execution, reason } => BodyJson::ExecutionExcluded {
                execution: execution.0,
                reason: reason.clone(),
            },
            E::TrajectoriesAdmitted {
                execution,
                trajectories,
            } => BodyJson::TrajectoriesAdmitted {
                execution: execution.0,
                trajectories: trajectories
                    .iter()
                    .map(|t| TrajectoryJson {
                        leaf_call: t.leaf_call.0,
                        class: t.class,
                        targets: t
                            .targets
                            .iter()
                            .map(|r| TargetJson {
                                call: r.call.0,
                                start: r.start,
                                end: r.end,
                            })
                            .collect(),
                    })
                    .collect(),
            },
            E::TransitionBegun { cell, to } => BodyJson::TransitionBegun {
                cell: cell.0,
                to: role(*to),
            },
            E::TransitionCompleted { cell, role: r } => BodyJson::TransitionCompleted {
                cell: cell.0,
                role: role(*r),
            },
            E::RoutesUpdated { source, moves } => BodyJson::RoutesUpdated {
                source: source.0,
                moves: moves
                    .iter()
                    .map(|m| MoveJson {
                        execution: m.execution.0,
                        from: m.from.0,
                        to: m.to.0,
                    })
                    .collect(),
            },
            E::BatchOpened { step } => BodyJson::BatchOpened { step: step.0 },
            E::MicroStepsEnqueued {
                step,
                group,
                micro_steps,
                closes_stream,
            } => BodyJson::MicroStepsEnqueued {
                step: step.0,
                group: group.0,
                micro_steps: micro_steps.iter().map(|m| m.0).collect(),
                closes_stream: *closes_stream,
            },
            E::MicroStepClaimed {
                step,
                micro_step,
                cell,
            } => BodyJson::MicroStepClaimed {
                step: step.0,
                micro_step: micro_step.0,
                cell: cell.0,
            },
            E::MicroStepDone {
                step,
                micro_step,
                cell,
            } => BodyJson::MicroStepDone {
                step: step.0,
                micro_step: micro_step.0,
                cell: cell.0,
            },
            E::JoinWindowClosed { step } => BodyJson::JoinWindowClosed { step: step.0 },
            E::OptimizerStepped {
                step,
                policy_version,
                consumed,
            } => BodyJson::OptimizerStepped {
                step: step.0,
                policy_version: policy_version.0,
                consumed: consumed
                    .iter()
                    .map(|c| ConsumedJson {
                        group: c.group.0,
                        staleness: c.staleness,
                    })
                    .collect(),
            },
            E::WeightsPublished {
                policy_version,
                took,
            } => BodyJson::WeightsPublished {
                policy_version: policy_version.0,
                took: took.0,
            },
            E::BurstEnded { burst } => BodyJson::BurstEnded { burst: *burst },
            E::Tick => BodyJson::Tick,
            E::ProjectionDigest { upto, hash, rules } => BodyJson::ProjectionDigest {
                upto: upto.0,
                hash: gyre_log::file::hex(hash),
                rules: *rules,
            },
            E::ResponseStored(record) => BodyJson::ResponseStored {
                execution: record.execution.get(),
                response_id: record.response_id.clone(),
                previous_response_id: record.previous_response_id.clone(),
                items: items_to_json(&record.items),
            },
        };
        EventJson {
            at: event.at.0,
            body,
        }
    }
}

impl TryFrom<EventJson> for ev::Event {
    type Error = String;

    fn try_from(json: EventJson) -> Result<Self, String> {
        use ev::EventBody as E;
        let body = match json.body {
            BodyJson::RunStarted(c) => E::RunStarted(ev::RunConfig {
                run_seed: c.run_seed,
                mode: mode_back(c.mode),
                streaming: c.streaming,
                phi: c.phi,
                mu: c.mu,
                n: c.n,
                b: c.b,
                steps: c.steps,
                rho_min: c.rho_min,
                tau: ev::Duration(c.tau),
                j_max: c.j_max,
                async_training_cells: c.async_training_cells,
            }),
            BodyJson::CellRegistered {
                cell,
                rollout_capacity,
                nodes,
                engine,
            } => E::CellRegistered {
                cell: ev::CellId(cell),
                rollout_capacity,
                nodes,
                engine: ev::EngineId(engine),
            },
            BodyJson::StandalonePoolRegistered {
                engine,
                rollout_capacity,
                nodes,
            } => E::StandalonePoolRegistered {
                engine: ev::EngineId(engine),
                rollout_capacity,
                nodes,
            },
            BodyJson::EngineReady { engine } => E::EngineReady {
                engine: ev::EngineId(engine),
            },
            BodyJson::EngineDown { engine, reason } => E::EngineDown {
                engine: ev::EngineId(engine),
                reason,
            },
            BodyJson::GroupsDispatched {
                groups,
                executions_per_group,
                policy_version,
            } => E::GroupsDispatched {
                groups: groups
                    .into_iter()
                    .map(|g| ev::DispatchedGroup {
                        group: ev::GroupId(g.group),
                        query: ev::QueryId(g.query),
                    })
                    .collect(),
                executions_per_group,
                policy_version: ev::PolicyVersion(policy_version),
            },
            BodyJson::ExecutionStarted {
                execution,
                group,
                engine,
            } => E::ExecutionStarted {
                execution: ev::ExecutionId(execution),
                group: ev::GroupId(group),
                engine: ev::EngineId(engine),
            },
            BodyJson::ExecutionClosed { execution, status } => E::ExecutionClosed {
                execution: ev::ExecutionId(execution),
                status: status_back(status),
            },
            BodyJson::ModelCall(r) => E::ModelCall(Box::new(ev::ModelCallRecord {
                execution: ev::ExecutionId(r.execution),
                call: ev::CallId(r.call),
                agent: r.agent,
                kind: call_kind_back(r.call_kind),
                parent_call: r.parent_call.map(ev::CallId),
                reused_prefix_tokens_count: r.reused_prefix_tokens_count,
                spawned_by: r.spawned_by.map(ev::CallId),
                input_ids: r.input_ids,
                input_provenance: r
                    .input_provenance
                    .into_iter()
                    .map(|s| ev::ProvenanceSpan {
                        provenance: provenance_back(s.provenance),
                        tokens_count: s.tokens_count,
                    })
                    .collect(),
                output_ids: r.output_ids,
                output_logprobs: r.output_logprobs,
                engine: ev::EngineId(r.engine),
                policy_version: ev::PolicyVersion(r.policy_version),
                requested_at: ev::Timestamp(r.requested_at),
                first_token_after: ev::Duration(r.first_token_after),
                completed_after: ev::Duration(r.completed_after),
                stop_sequences: r.stop_sequences,
                output_constraint: r.output_constraint.map(|constraint| ev::OutputConstraint {
                    schema: constraint.schema,
                    enforced: constraint.enforced,
                    constrained_tokens: constraint.constrained_tokens,
                }),
                sampling: r.sampling.map_or(ev::SamplingSettings::POLICY, |sampling| {
                    ev::SamplingSettings {
                        temperature: sampling.temperature,
                        top_p: sampling.top_p,
                        top_k: sampling.top_k,
                    }
                }),
            })),
            BodyJson::EvaluationRequested {
                execution,
                attempt,
                artifact_version,
                branch_ref,
            } => E::EvaluationRequested {
                execution: ev::ExecutionId(execution),
                attempt,
                artifact_version,
                branch_ref,
            },
            BodyJson::EvaluationCompleted {
                execution,
                attempt,
                score,
                valid,
                evaluated_state_ref,
                artifact_version,
                branch_ref,
                evaluator,
            } => E::EvaluationCompleted {
                execution: ev::ExecutionId(execution),
                attempt,
                score,
                valid,
                evaluated_state_ref,
                artifact_version,
                branch_ref,
                evaluator,
            },
            BodyJson::EvaluationFailed {
                execution,
                attempt,
                reason,
            } => E::EvaluationFailed {
                execution: ev::ExecutionId(execution),
                attempt,
                reason,
            },
            BodyJson::DummyInserted { execution, group } => E::DummyInserted {
                execution: ev::ExecutionId(execution),
                group: ev::GroupId(group),
            },
            BodyJson::ExecutionExcluded { execution, reason } => E::ExecutionExcluded {
                execution: ev::ExecutionId(execution),
                reason,
            },
            BodyJson::TrajectoriesAdmitted {
                execution,
                trajectories,
            } => E::TrajectoriesAdmitted {
                execution: ev::ExecutionId(execution),
                trajectories: trajectories
                    .into_iter()
                    .map(|t| ev::AdmittedTrajectory {
                        leaf_call: ev::CallId(t.leaf_call),
                        class: t.class,
                        targets: t
                            .targets
                            .into_iter()
                            .map(|r| ev::TargetRange {
                                call: ev::CallId(r.call),
                                start: r.start,
                                end: r.end,
                            })
                            .collect(),
                    })
                    .collect(),
            },
            BodyJson::TransitionBegun { cell, to } => E::TransitionBegun {
                cell: ev::CellId(cell),
                to: role_back(to),
            },
            BodyJson::TransitionCompleted { cell, role } => E::TransitionCompleted {
                cell: ev::CellId(cell),
                role: role_back(role),
            },
            BodyJson::RoutesUpdated { source, moves } => E::RoutesUpdated {
                source: ev::EngineId(source),
                moves: moves
                    .into_iter()
                    .map(|m| ev::RouteMove {
                        execution: ev::ExecutionId(m.execution),
                        from: ev::EngineId(m.from),
                        to: ev::EngineId(m.to),
                    })
                    .collect(),
            },
            BodyJson::BatchOpened { step } => E::BatchOpened {
                step: ev::StepId(step),
            },
            BodyJson::MicroStepsEnqueued {
                step,
                group,
                micro_steps,
                closes_stream,
            } => E::MicroStepsEnqueued {
                step: ev::StepId(step),
                group: ev::GroupId(group),
                micro_steps: micro_steps.into_iter().map(ev::MicroStepId).collect(),
                closes_stream,
            },
            BodyJson::MicroStepClaimed {
                step,
                micro_step,
                cell,
            } => E::MicroStepClaimed {
                step: ev::StepId(step),
                micro_step: ev::MicroStepId(micro_step),
                cell: ev::CellId(cell),
            },
            BodyJson::MicroStepDone {
                step,
                micro_step,
                cell,
            } => E::MicroStepDone {
                step: ev::StepId(step),
                micro_step: ev::MicroStepId(micro_step),
                cell: ev::CellId(cell),
            },
            BodyJson::JoinWindowClosed { step } => E::JoinWindowClosed {
                step: ev::StepId(step),
            },
            BodyJson::OptimizerStepped {
                step,
                policy_version,
                consumed,
            } => E::OptimizerStepped {
                step: ev::StepId(step),
                policy_version: ev::PolicyVersion(policy_version),
                consumed: consumed
                    .into_iter()
                    .map(|c| ev::ConsumedGroup {
                        group: ev::GroupId(c.group),
                        staleness: c.staleness,
                    })
                    .collect(),
            },
            BodyJson::WeightsPublished {
                policy_version,
                took,
            } => E::WeightsPublished {
                policy_version: ev::PolicyVersion(policy_version),
                took: ev::Duration(took),
            },
            BodyJson::BurstEnded { burst } => E::BurstEnded { burst },
            BodyJson::Tick => E::Tick,
            BodyJson::ProjectionDigest { upto, hash, rules } => E::ProjectionDigest {
                upto: ev::LogIndex(upto),
                hash: hex_to_hash(&hash)?,
                rules,
            },
            BodyJson::ResponseStored {
                execution,
                response_id,
                previous_response_id,
                items,
            } => E::ResponseStored(Box::new(ev::StoredResponseRecord {
                execution: ev::ExecutionId(execution),
                response_id,
                previous_response_id,
                items: items_from_json(items)?,
            })),
        };
        Ok(ev::Event {
            at: ev::Timestamp(json.at),
            body,
        })
    }
}

/// Stored items (comma-separated JSON values) as a JSON array; bytes that are not JSON values
/// are shown as a string.
fn items_to_json(items: &[u8]) -> serde_json::Value {
    let mut array = Vec::with_capacity(items.len() + 2);
    array.push(b'[');
    array.extend_from_slice(items);
    array.push(b']');
    match serde_json::from_slice::<serde_json::Value>(&array) {
        Ok(value @ serde_json::Value::Array(_)) => value,
        _ => serde_json::Value::String(String::from_utf8_lossy(items).into_owned()),
    }
}

/// `items` of a `response_stored` event: an array of items, or the raw text.
fn items_from_json(items: serde_json::Value) -> Result<Vec<u8>, String> {
    match items {
        serde_json::Value::Array(values) => {
            let mut out = Vec::new();
            for value in values {
                if !out.is_empty() {
                    out.push(b',');
                }
                out.extend(serde_json::to_vec(&value).map_err(|error| error.to_string())?);
            }
            Ok(out)
        }
        serde_json::Value::String(text) => Ok(text.into_bytes()),
        other => Err(format!(
            "response_stored.items must be an array of items or a string, not {other}"
        )),
    }
}

/// Parses one JSON line into an event; the error names what is wrong.
pub fn parse_event(line: &str) -> Result<ev::Event, String> {
    let json: EventJson = serde_json::from_str(line).map_err(|error| error.to_string())?;
    ev::Event::try_from(json)
}

/// One event as a JSON object.
pub fn event_to_json(event: &ev::Event) -> serde_json::Value {
    serde_json::to_value(EventJson::from(event)).unwrap_or(serde_json::Value::Null)
}
