//! Protobuf → domain: decodes one body at its kind's current schema version. Older versions
//! reach this module only after the upcasters have rewritten them (see `upcast.rs`).

use gyre_event::{
    AdmittedTrajectory, CallId, CellId, ConsumedGroup, DispatchedGroup, Duration, EngineId,
    EventBody, ExecutionId, GroupId, LogIndex, MicroStepId, ModelCallRecord, PolicyVersion,
    ProvenanceSpan, QueryId, RouteMove, RunConfig, SamplingSettings, StepId, TargetRange,
    Timestamp,
};
use gyre_proto::events::{self as pb, EventKind};
use prost::Message;

use super::enums::{
    call_kind_from_proto, close_status_from_proto, mode_from_proto, provenance_from_proto,
    role_from_proto,
};
use super::tokens::{le_to_f32s, le_to_u32s};
use super::wire::Reader;
use super::BodyError;

/// Decodes a body written at the current schema version of `kind`.
pub(crate) fn decode_body(kind: EventKind, bytes: &[u8]) -> Result<EventBody, BodyError> {
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
        EventKind::ModelCall => EventBody::ModelCall(Box::new(model_call_wire(bytes)?)),
        EventKind::ResponseStored => {
            let message = pb::ResponseStored::decode(bytes)?;
            EventBody::ResponseStored(Box::new(gyre_event::StoredResponseRecord {
                execution: ExecutionId(message.execution),
                response_id: message.response_id,
                previous_response_id: Some(message.previous_response_id)
                    .filter(|id| !id.is_empty()),
                items: message.items,
            }))
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
                rules: message.rules,
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

/// The prost path for `ModelCall`, kept as the oracle the wire reader is tested against.
#[cfg(test)]
pub(crate) fn model_call_prost(body: &bytes::Bytes) -> Result<ModelCallRecord, BodyError> {
    model_call(pb::ModelCall::decode(body.clone())?)
}

/// A `ModelCall` body read field by field with [`Reader`] straight into the record: the token
/// arrays are copied once, from the batch into the record's vectors (the hot path of every
/// fold; see `wire.rs`). Accepts and refuses what [`model_call_prost`] does, with the same
/// result.
pub(crate) fn model_call_wire(bytes: &[u8]) -> Result<ModelCallRecord, BodyError> {
    let mut reader = Reader::new(bytes, "model_call");
    let mut record = ModelCallRecord {
        execution: ExecutionId(0),
        call: CallId(0),
        agent: String::new(),
        kind: gyre_event::CallKind::Turn,
        parent_call: None,
        reused_prefix_tokens_count: 0,
        spawned_by: None,
        input_ids: Vec::new(),
        input_provenance: Vec::new(),
        output_ids: Vec::new(),
        output_logprobs: Vec::new(),
        engine: EngineId(0),
        policy_version: PolicyVersion(0),
        requested_at: Timestamp(0),
        first_token_after: Duration(0),
        completed_after: Duration(0),
        stop_sequences: Vec::new(),
        output_constraint: None,
        sampling: SamplingSettings::POLICY,
    };
    let (mut kind, mut agent, mut input_ids, mut output_ids, mut output_logprobs) =
        (0i32, &[][..], &[][..], &[][..], &[][..]);
    const PROVENANCE_FIELD: &str = "model_call.input_provenance.provenance";
    let mut bad_provenance = None;
    while !reader.is_empty() {
        let (tag, wire_type) = reader.key()?;
        match tag {
            1 => record.execution = ExecutionId(reader.varint_field(wire_type)?),
            2 => record.call = CallId(reader.varint_field(wire_type)?),
            3 => {
                agent = reader.bytes_field(wire_type)?;
                if std::str::from_utf8(agent).is_err() {
                    return Err(reader.malformed("`agent` is not UTF-8"));
                }
            }
            // Enum and 32-bit fields keep the low bits of the varint, as prost does.
            4 => kind = reader.varint_field(wire_type)? as i32,
            5 => record.parent_call = Some(CallId(reader.varint_field(wire_type)?)),
            6 => record.reused_prefix_tokens_count = reader.varint_field(wire_type)?,
            7 => record.spawned_by = Some(CallId(reader.varint_field(wire_type)?)),
            8 => input_ids = reader.bytes_field(wire_type)?,
            9 => {
                let span = reader.bytes_field(wire_type)?;
                let mut span = reader.nested(span, "model_call.input_provenance")?;
                let (mut provenance, mut tokens_count) = (0i32, 0u32);
                while !span.is_empty() {
                    let (tag, wire_type) = span.key()?;
                    match tag {
                        1 => provenance = span.varint_field(wire_type)? as i32,
                        2 => tokens_count = span.varint_field(wire_type)? as u32,
                        _ => span.skip(tag, wire_type)?,
                    }
                }
                // An invalid value is reported after the whole body parsed, as prost would.
                let provenance = provenance_from_proto(PROVENANCE_FIELD, provenance)
                    .unwrap_or_else(|_| {
                        bad_provenance.get_or_insert(provenance);
                        gyre_event::Provenance::System
                    });
                record.input_provenance.push(ProvenanceSpan {
                    provenance,
                    tokens_count,
                });
            }
            10 => output_ids = reader.bytes_field(wire_type)?,
            11 => output_logprobs = reader.bytes_field(wire_type)?,
            12 => record.engine = EngineId(reader.varint_field(wire_type)? as u32),
            13 => record.policy_version = PolicyVersion(reader.varint_field(wire_type)?),
            14 => record.requested_at = Timestamp(reader.varint_field(wire_type)?),
            15 => record.first_token_after = Duration(reader.varint_field(wire_type)?),
            16 => record.completed_after = Duration(reader.varint_field(wire_type)?),
            17 => {
                let stop = reader.bytes_field(wire_type)?;
                let stop = std::str::from_utf8(stop)
                    .map_err(|_| reader.malformed("a `stop_sequences` element is not UTF-8"))?;
                record.stop_sequences.push(stop.to_string());
            }
            18 => {
                let nested = reader.bytes_field(wire_type)?;
                let mut nested = reader.nested(nested, "model_call.output_constraint")?;
                // A repeated message field merges into one, as prost does.
                let constraint =
                    record
                        .output_constraint
                        .get_or_insert(gyre_event::OutputConstraint {
                            schema: None,
                            enforced: false,
                            constrained_tokens: 0,
                        });
                while !nested.is_empty() {
                    let (tag, wire_type) = nested.key()?;
                    match tag {
                        1 => {
                            let schema = nested.bytes_field(wire_type)?;
                            let schema = std::str::from_utf8(schema).map_err(|_| {
                                nested.malformed("`output_constraint.schema` is not UTF-8")
                            })?;
                            constraint.schema = Some(schema.to_string());
                        }
                        2 => constraint.enforced = nested.varint_field(wire_type)? != 0,
                        3 => {
                            // uint32: prost keeps the low 32 bits of a wider varint.
                            constraint.constrained_tokens = nested.varint_field(wire_type)? as u32
                        }
                        _ => nested.skip(tag, wire_type)?,
                    }
                }
            }
            19 => {
                let nested = reader.bytes_field(wire_type)?;
                let mut nested = reader.nested(nested, "model_call.sampling")?;
                // A repeated message field merges into the one before, as prost does.
                while !nested.is_empty() {
                    let (tag, wire_type) = nested.key()?;
                    match tag {
                        1 => {
                            record.sampling.temperature =
                                f32::from_bits(nested.fixed32_field(wire_type)?)
                        }
                        2 => {
                            record.sampling.top_p = f32::from_bits(nested.fixed32_field(wire_type)?)
                        }
                        // uint32: prost keeps the low 32 bits of a wider varint.
                        3 => record.sampling.top_k = Some(nested.varint_field(wire_type)? as u32),
                        _ => nested.skip(tag, wire_type)?,
                    }
                }
            }
            _ => reader.skip(tag, wire_type)?,
        }
    }
    if let Some(value) = bad_provenance {
        provenance_from_proto(PROVENANCE_FIELD, value)?;
    }
    record.kind = call_kind_from_proto("model_call.kind", kind)?;
    // UTF-8 was checked where the field was read.
    record.agent = String::from_utf8_lossy(agent).into_owned();
    record.input_ids = le_to_u32s("model_call.input_ids", input_ids)?;
    record.output_ids = le_to_u32s("model_call.output_ids", output_ids)?;
    record.output_logprobs = le_to_f32s("model_call.output_logprobs", output_logprobs)?;
    Ok(record)
}

#[cfg_attr(not(test), allow(dead_code))]
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
        stop_sequences: message.stop_sequences,
        output_constraint: message.output_constraint.map(|constraint| {
            gyre_event::OutputConstraint {
                schema: constraint.schema,
                enforced: constraint.enforced,
                constrained_tokens: constraint.constrained_tokens,
            }
        }),
        sampling: message
            .sampling
            .map_or(SamplingSettings::POLICY, |sampling| SamplingSettings {
                temperature: sampling
                    .temperature
                    .unwrap_or(SamplingSettings::POLICY.temperature),
                top_p: sampling.top_p.unwrap_or(SamplingSettings::POLICY.top_p),
                top_k: sampling.top_k,
            }),
    })
}

#[cfg(test)]
mod wire_tests {
    use proptest::prelude::*;
    use prost::Message;

    use super::{model_call_prost, model_call_wire, pb, BodyError, ModelCallRecord};

    /// The wire reader must agree with prost: the same record, or an error of the same kind
    /// (prost's own decode errors become `Malformed`).
    fn agree(bytes: &[u8]) -> Result<(), TestCaseError> {
        let old = model_call_prost(&bytes::Bytes::copy_from_slice(bytes));
        let new = model_call_wire(bytes);
        // Log-probs compared by their bits: NaN payloads must survive, and NaN != NaN.
        let bits = |result: Result<ModelCallRecord, BodyError>| {
            result.map(|mut record| {
                let bits: Vec<u32> = record
                    .output_logprobs
                    .iter()
                    .map(|lp| lp.to_bits())
                    .collect();
                record.output_logprobs.clear();
                let sampling_bits = (
                    record.sampling.temperature.to_bits(),
                    record.sampling.top_p.to_bits(),
                );
                record.sampling.temperature = 0.0;
                record.sampling.top_p = 0.0;
                (record, bits, sampling_bits)
            })
        };
        match (old, new) {
            (Err(BodyError::Protobuf(_)), Err(BodyError::Malformed { .. })) => {}
            (old, new) => prop_assert_eq!(bits(old), bits(new)),
        }
        Ok(())
    }

    fn span() -> impl Strategy<Value = pb::ProvenanceSpan> {
        (-1i32..9, any::<u32>()).prop_map(|(provenance, tokens_count)| pb::ProvenanceSpan {
            provenance,
            tokens_count,
        })
    }

    fn message() -> impl Strategy<Value = pb::ModelCall> {
        (
            (any::<u64>(), any::<u64>(), "[a-z]{0,6}", -1i32..5),
            (
                proptest::option::of(any::<u64>()),
                any::<u64>(),
                proptest::option::of(any::<u64>()),
            ),
            (
                proptest::collection::vec(any::<u8>(), 0..24),
                proptest::collection::vec(span(), 0..3),
                proptest::collection::vec(any::<u8>(), 0..24),
                proptest::collection::vec(any::<u8>(), 0..24),
            ),
            (
                any::<u32>(),
                any::<u64>(),
                any::<u64>(),
                any::<u64>(),
                any::<u64>(),
                proptest::collection::vec("[a-z\\n]{0,4}", 0..3),
                proptest::option::of((
                    proptest::option::of("[a-z{}\"]{0,6}"),
                    any::<bool>(),
                    any::<u32>(),
                )),
                proptest::option::of((
                    proptest::option::of(any::<f32>()),
                    proptest::option::of(any::<f32>()),
                    proptest::option::of(any::<u32>()),
                )),
            ),
        )
            .prop_map(
                |(
                    (execution, call, agent, kind),
                    (parent_call, reused, spawned_by),
                    (input, provenance, output, logprobs),
                    (engine, policy, requested, first, completed, stops, constraint, sampling),
                )| pb::ModelCall {
                    execution,
                    call,
                    agent,
                    kind,
                    parent_call,
                    reused_prefix_tokens_count: reused,
                    spawned_by,
                    input_ids: input.into(),
                    input_provenance: provenance,
                    output_ids: output.into(),
                    output_logprobs: logprobs.into(),
                    engine,
                    policy_version: policy,
                    requested_at_nanos: requested,
                    first_token_after_nanos: first,
                    completed_after_nanos: completed,
                    stop_sequences: stops,
                    output_constraint: constraint.map(|(schema, enforced, constrained_tokens)| {
                        pb::OutputConstraint {
                            schema,
                            enforced,
                            constrained_tokens,
                        }
                    }),
                    sampling: sampling.map(|(temperature, top_p, top_k)| pb::Sampling {
                        temperature,
                        top_p,
                        top_k,
                    }),
                },
            )
    }

    #[derive(Clone, Debug)]
    enum Mutation {
        Flip(usize, u8),
        Truncate(usize),
        Insert(usize, Vec<u8>),
    }

    fn mutation() -> impl Strategy<Value = Mutation> {
        prop_oneof![
            (any::<usize>(), any::<u8>()).prop_map(|(at, mask)| Mutation::Flip(at, mask)),
            any::<usize>().prop_map(Mutation::Truncate),
            (any::<usize>(), proptest::collection::vec(any::<u8>(), 1..8))
                .prop_map(|(at, bytes)| Mutation::Insert(at, bytes)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        #[test]
        fn the_wire_reader_agrees_with_prost_on_arbitrary_bytes(
            bytes in proptest::collection::vec(any::<u8>(), 0..96)
        ) {
            agree(&bytes)?;
        }

        #[test]
        fn the_wire_reader_agrees_with_prost_on_encoded_and_mutated_records(
            message in message(),
            duplicate in any::<bool>(),
            mutations in proptest::collection::vec(mutation(), 0..3),
        ) {
            let mut bytes = message.encode_to_vec();
            if duplicate {
                // Every field again: the last value of a scalar wins, spans accumulate.
                bytes.extend(message.encode_to_vec());
            }
            agree(&bytes)?;
            for change in mutations {
                match change {
                    Mutation::Flip(at, mask) if !bytes.is_empty() => {
                        let at = at % bytes.len();
                        bytes[at] ^= mask;
                    }
                    Mutation::Truncate(at) => bytes.truncate(at % (bytes.len() + 1)),
                    Mutation::Insert(at, extra) => {
                        let at = at % (bytes.len() + 1);
                        bytes.splice(at..at, extra);
                    }
                    Mutation::Flip(..) => {}
                }
                agree(&bytes)?;
            }
        }
    }

    #[test]
    fn deeply_nested_groups_are_refused_like_prost() {
        // Field 20 as a start group, nested 150 deep, then closed.
        let mut bytes = Vec::new();
        for _ in 0..150 {
            bytes.push(0xa3);
            bytes.push(0x01);
        }
        for _ in 0..150 {
            bytes.push(0xa4);
            bytes.push(0x01);
        }
        agree(&bytes).unwrap();
        assert!(model_call_wire(&bytes).is_err());
        // 99 deep is accepted by both.
        let mut bytes = Vec::new();
        for _ in 0..99 {
            bytes.extend([0xa3, 0x01]);
        }
        for _ in 0..99 {
            bytes.extend([0xa4, 0x01]);
        }
        agree(&bytes).unwrap();
    }
}
