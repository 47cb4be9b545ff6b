//! The trajectory buffer's snapshot encoding, on buffers a random runtime folds from legal
//! event streams: dispatches, starts, model calls of synthetic executions (compaction,
//! sub-agents, retries), closes with every status, evaluation attempts that complete or fail,
//! dummies, exclusions, the scoring controller's retries, admissions and packing. Buffers
//! round-trip exactly and re-encode to the same bytes, the restored buffer folds the rest of the
//! log to the same buffer, and cut, flipped or arbitrary bytes are refused or decode
//! canonically — never a panic.

use std::collections::BTreeMap;

use gyre_event::wire::{Reader, WireError, WireErrorKind, Writer};
use gyre_event::{
    CloseStatus, ConsumedGroup, DispatchedGroup, Duration, EngineId, Event, EventBody, ExecutionId,
    GroupId, MicroStepId, PolicyVersion, QueryId, StepId, Timestamp,
};
use gyre_trajectory::synthetic::{context_call, generate, SyntheticCall, SyntheticConfig};
use gyre_trajectory::{
    record_from_context, AttemptOutcome, RoleClasses, ScoringConfig, TrajectoryBuffer, Tree,
    TreeConfig,
};
use proptest::prelude::*;

fn encode(buffer: &TrajectoryBuffer) -> Vec<u8> {
    let mut writer = Writer::new();
    buffer.encode_into(&mut writer);
    writer.into_bytes()
}

fn decode(bytes: &[u8]) -> Result<TrajectoryBuffer, WireError> {
    let mut reader = Reader::new(bytes);
    let buffer = TrajectoryBuffer::decode_from(&mut reader)?;
    reader.finish("end")?;
    Ok(buffer)
}

/// Whatever decodes must re-encode to exactly the bytes it came from; anything else must be an
/// error. Reaching the end at all means no panic.
fn check_refused_or_canonical(bytes: &[u8]) -> Result<(), String> {
    match decode(bytes) {
        Err(_) => Ok(()),
        Ok(buffer) if encode(&buffer) == bytes => Ok(()),
        Ok(_) => Err("accepted bytes that do not re-encode to themselves".into()),
    }
}

#[derive(Clone, Debug)]
enum Op {
    Dispatch,
    Start(u8),
    Call(u8),
    Close(u8, u8),
    Request(u8, u8),
    Complete(u8, bool, u8),
    Fail(u8),
    Dummy(u8),
    Exclude(u8),
    Decide,
    Admit,
    Pack,
    /// An optimizer step consuming the oldest packed group not yet consumed (its closed
    /// members' trees retire, running ones when they close).
    Step,
    Tick(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => Just(Op::Dispatch),
        3 => any::<u8>().prop_map(Op::Start),
        8 => any::<u8>().prop_map(Op::Call),
        3 => (any::<u8>(), any::<u8>()).prop_map(|(i, s)| Op::Close(i, s)),
        3 => (any::<u8>(), 1u8..=3).prop_map(|(i, v)| Op::Request(i, v)),
        3 => (any::<u8>(), prop::bool::weighted(0.7), any::<u8>())
            .prop_map(|(i, valid, score)| Op::Complete(i, valid, score)),
        1 => any::<u8>().prop_map(Op::Fail),
        1 => any::<u8>().prop_map(Op::Dummy),
        1 => any::<u8>().prop_map(Op::Exclude),
        1 => Just(Op::Decide),
        2 => Just(Op::Admit),
        2 => Just(Op::Pack),
        1 => Just(Op::Step),
        1 => (0u8..=200).prop_map(Op::Tick),
    ]
}

#[derive(Clone, Debug)]
struct Shape {
    seed: u64,
    executions_per_group: u32,
    main_calls: u32,
    sub_agents: u32,
    j_max: u32,
}

fn shape() -> impl Strategy<Value = Shape> {
    (any::<u64>(), 1u32..=3, 1u32..=8, 0u32..=2, 1u32..=4).prop_map(
        |(seed, executions_per_group, main_calls, sub_agents, j_max)| Shape {
            seed,
            executions_per_group,
            main_calls,
            sub_agents,
            j_max,
        },
    )
}

/// A random but legal runtime around one buffer; every event it logs applies.
struct Runtime {
    shape: Shape,
    buffer: TrajectoryBuffer,
    log: Vec<Event>,
    now: Timestamp,
    next_group: u64,
    next_execution: u64,
    next_micro_step: u64,
    next_step: u64,
    consumed: std::collections::BTreeSet<GroupId>,
    /// Each started execution's synthetic calls and how many were recorded.
    calls: BTreeMap<ExecutionId, (Vec<SyntheticCall>, usize)>,
}

fn pick<T: Copy>(items: &[T], index: u8) -> Option<T> {
    (!items.is_empty()).then(|| items[index as usize % items.len()])
}

impl Runtime {
    fn new(shape: Shape) -> Self {
        Runtime {
            shape,
            buffer: TrajectoryBuffer::new(
                TreeConfig::default(),
                ScoringConfig {
                    evaluation_budget: Duration::from_secs(600),
                    attempts_max: 3,
                },
            ),
            log: Vec::new(),
            now: Timestamp::ZERO,
            next_group: 0,
            next_execution: 0,
            next_micro_step: 0,
            next_step: 0,
            consumed: std::collections::BTreeSet::new(),
            calls: BTreeMap::new(),
        }
    }

    fn apply(&mut self, body: EventBody) {
        let event = Event::new(self.now, body);
        if let Err(error) = self.buffer.apply(&event) {
            panic!("the runtime's legal event {event:?} was rejected: {error}");
        }
        self.buffer.validate();
        self.log.push(event);
    }

    fn executions_where(
        &self,
        keep: impl Fn(&gyre_trajectory::ExecutionScore) -> bool,
    ) -> Vec<ExecutionId> {
        self.buffer
            .scoring
            .executions
            .iter()
            .filter(|(_, score)| keep(score))
            .map(|(id, _)| *id)
            .collect()
    }

    fn act(&mut self, op: &Op) {
        let attempts_max = self.buffer.scoring.config.attempts_max as usize;
        match op {
            Op::Dispatch => {
                let group = GroupId(self.next_group);
                self.next_group += 1;
                self.apply(EventBody::GroupsDispatched {
                    groups: vec![DispatchedGroup {
                        group,
                        query: QueryId(group.get() % 3),
                    }],
                    executions_per_group: self.shape.executions_per_group,
                    policy_version: PolicyVersion(group.get() % 4),
                });
            }
            Op::Start(index) => {
                let open: Vec<GroupId> = self
                    .buffer
                    .scoring
                    .groups
                    .iter()
                    // One member more than N, so that surplus executions occur; never into a
                    // group an optimizer step consumed (the scheduler has dropped it).
                    .filter(|(id, g)| {
                        g.members.len() as u32 <= g.executions_per_group
                            && !self.consumed.contains(id)
                    })
                    .map(|(id, _)| *id)
                    .collect();
                let Some(group) = pick(&open, *index) else {
                    return;
                };
                let execution = ExecutionId(self.next_execution);
                self.next_execution += 1;
                let calls = generate(
                    SyntheticConfig::small(self.shape.main_calls, self.shape.sub_agents),
                    self.shape.seed ^ execution.get().wrapping_mul(0x9E37_79B9_7F4A_7C15),
                );
                self.calls.insert(execution, (calls, 0));
                self.apply(EventBody::ExecutionStarted {
                    execution,
                    group,
                    engine: EngineId(0),
                });
            }
            Op::Call(index) => {
                let recording: Vec<ExecutionId> = self
                    .calls
                    .iter()
                    .filter(|(id, (calls, done))| {
                        let score = &self.buffer.scoring.executions[id];
                        *done < calls.len()
                            && score.closed.is_none()
                            && !self.consumed.contains(&score.group)
                    })
                    .map(|(id, _)| *id)
                    .collect();
                let Some(execution) = pick(&recording, *index) else {
                    return;
                };
                let empty = Tree::new(execution, TreeConfig::default());
                let tree = self.buffer.trees.get(&execution).unwrap_or(&empty);
                let (calls, done) = &self.calls[&execution];
                let mut record = record_from_context(tree, &context_call(&calls[*done]));
                // Every third call ran with stop sequences (the snapshot's own section).
                if *done % 3 == 1 {
                    record.stop_sequences = vec!["\nObservation:".into(), format!("<{done}>")];
                }
                // Every fourth answered under an answer-format grammar, wholly or (a
                // failover's continuation) its first outputs only (the snapshot's own section).
                if *done % 4 == 2 {
                    let outputs = record.output_ids.len() as u32;
                    let constrained = if *done % 8 == 2 { outputs } else { outputs / 2 };
                    record.output_constraint = Some(gyre_event::OutputConstraint {
                        schema: Some(r#"{"type":"object"}"#.into()),
                        enforced: constrained == outputs,
                        constrained_tokens: constrained,
                    });
                }
                if let Some((_, done)) = self.calls.get_mut(&execution) {
                    *done += 1;
                }
                self.apply(EventBody::ModelCall(Box::new(record)));
            }
            Op::Close(index, status) => {
                let running = self.executions_where(|s| s.closed.is_none());
                if let Some(execution) = pick(&running, *index) {
                    let status = CloseStatus::ALL[*status as usize % CloseStatus::ALL.len()];
                    self.apply(EventBody::ExecutionClosed { execution, status });
                }
            }
            Op::Request(index, artifact_version) => {
                let waiting = self.executions_where(|s| {
                    s.closed.is_some()
                        && s.resolution().is_none()
                        && s.attempts.len() < attempts_max
                        && s.attempts.values().all(|a| a.outcome.is_some())
                });
                if let Some(execution) = pick(&waiting, *index) {
                    let attempts = &self.buffer.scoring.executions[&execution].attempts;
                    let attempt = attempts.keys().next_back().map_or(1, |last| last + 1);
                    self.apply(EventBody::EvaluationRequested {
                        execution,
                        attempt,
                        artifact_version: *artifact_version as u64,
                        branch_ref: format!("branch-{}", execution.get() % 2),
                    });
                }
            }
            Op::Complete(index, valid, score) => {
                let pending = self.unsettled();
                if let Some((execution, attempt)) = pick(&pending, *index) {
                    let record = &self.buffer.scoring.executions[&execution].attempts[&attempt];
                    let body = EventBody::EvaluationCompleted {
                        execution,
                        attempt,
                        score: *score as f64 / 25.0,
                        valid: *valid,
                        evaluated_state_ref: format!("state-{score}"),
                        artifact_version: record.artifact_version,
                        branch_ref: record.branch_ref.clone(),
                        evaluator: "tests".into(),
                    };
                    self.apply(body);
                }
            }
            Op::Fail(index) => {
                let pending = self.unsettled();
                if let Some((execution, attempt)) = pick(&pending, *index) {
                    self.apply(EventBody::EvaluationFailed {
                        execution,
                        attempt,
                        reason: "evaluator crashed".into(),
                    });
                }
            }
            Op::Dummy(index) => {
                // A total failure: closed, nothing valid and nothing still being evaluated.
                let candidates = self.executions_where(|s| {
                    s.closed.is_some()
                        && s.best_valid().is_none()
                        && s.excluded.is_none()
                        && s.attempts.values().all(|a| a.outcome.is_some())
                });
                if let Some(execution) = pick(&candidates, *index) {
                    let group = self.buffer.scoring.executions[&execution].group;
                    self.apply(EventBody::DummyInserted { execution, group });
                }
            }
            Op::Exclude(index) => {
                let candidates = self.executions_where(|s| s.best_valid().is_none() && !s.dummy);
                if let Some(execution) = pick(&candidates, *index) {
                    self.apply(EventBody::ExecutionExcluded {
                        execution,
                        reason: "operator".into(),
                    });
                }
            }
            Op::Decide => {
                for body in self.buffer.scoring.decide(self.now) {
                    self.apply(body);
                }
            }
            Op::Admit => {
                let decisions = self.buffer.decide_admissions(
                    self.shape.seed,
                    self.shape.j_max,
                    &RoleClasses::claude_code(),
                );
                for body in decisions {
                    self.apply(body);
                }
            }
            Op::Pack => {
                if let Some((group, _)) = self.buffer.packable_groups().first().copied() {
                    let micro_step = MicroStepId(self.next_micro_step);
                    self.next_micro_step += 1;
                    self.apply(EventBody::MicroStepsEnqueued {
                        step: StepId(0),
                        group,
                        micro_steps: vec![micro_step],
                        closes_stream: false,
                    });
                }
            }
            Op::Step => {
                let next = self
                    .buffer
                    .packed_groups
                    .iter()
                    .find(|group| !self.consumed.contains(group))
                    .copied();
                if let Some(group) = next {
                    self.consumed.insert(group);
                    let step = StepId(self.next_step);
                    self.next_step += 1;
                    self.apply(EventBody::OptimizerStepped {
                        step,
                        policy_version: PolicyVersion(self.next_step),
                        consumed: vec![ConsumedGroup {
                            group,
                            staleness: 0,
                        }],
                    });
                }
            }
            Op::Tick(seconds) => {
                self.now = self.now.plus(Duration::from_secs(*seconds as u64));
                self.apply(EventBody::Tick);
            }
        }
    }

    /// (execution, attempt) pairs requested and still without an outcome.
    fn unsettled(&self) -> Vec<(ExecutionId, u32)> {
        self.buffer
            .scoring
            .executions
            .iter()
            .flat_map(|(id, score)| {
                score
                    .attempts
                    .iter()
                    .filter(|(_, a)| a.outcome.is_none())
                    .map(move |(attempt, _)| (*id, *attempt))
            })
            .collect()
    }
}

fn run(shape: &Shape, ops: &[Op]) -> Runtime {
    let mut runtime = Runtime::new(shape.clone());
    runtime.act(&Op::Dispatch);
    for op in ops {
        runtime.act(op);
    }
    runtime
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// decode(encode(b)) == b with the same bytes, and folding the rest of the log into the
    /// restored buffer reaches the original.
    #[test]
    fn snapshot_round_trips_and_folding_continues(
        shape in shape(),
        before in prop::collection::vec(op(), 0..160),
        after in prop::collection::vec(op(), 0..160),
    ) {
        let mut runtime = run(&shape, &before);
        let bytes = encode(&runtime.buffer);
        let restored = decode(&bytes).expect("a snapshot of a folded buffer decodes");
        restored.validate();
        prop_assert_eq!(&restored, &runtime.buffer);
        prop_assert_eq!(&encode(&restored), &bytes, "re-encoding gives the same bytes");
        prop_assert_eq!(&encode(&runtime.buffer.clone()), &bytes, "encoding is deterministic");
        // The controllers read the restored buffer exactly as the original.
        let classes = RoleClasses::claude_code();
        prop_assert_eq!(
            restored.decide_admissions(shape.seed, shape.j_max, &classes),
            runtime.buffer.decide_admissions(shape.seed, shape.j_max, &classes)
        );
        prop_assert_eq!(restored.packable_groups(), runtime.buffer.packable_groups());
        let logged = runtime.log.len();
        for op in &after {
            runtime.act(op);
        }
        let mut continued = restored;
        for event in &runtime.log[logged..] {
            continued.apply(event).expect("the rest of the log folds into the restored buffer");
        }
        continued.validate();
        prop_assert_eq!(&continued, &runtime.buffer);
        prop_assert_eq!(encode(&continued), encode(&runtime.buffer));
    }

    /// A strict prefix is always refused; flipped bits and arbitrary bytes are refused or decode
    /// to a buffer that re-encodes to them.
    #[test]
    fn mangled_snapshots_are_refused_or_canonical(
        shape in shape(),
        ops in prop::collection::vec(op(), 0..100),
        cut in any::<prop::sample::Index>(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), 0u8..8), 1..4),
        garbage in prop::collection::vec(any::<u8>(), 0..96),
    ) {
        let bytes = encode(&run(&shape, &ops).buffer);
        prop_assert!(decode(&bytes[..cut.index(bytes.len())]).is_err());
        let mut flipped = bytes.clone();
        for (position, bit) in &flips {
            flipped[position.index(bytes.len())] ^= 1 << bit;
        }
        prop_assert_eq!(check_refused_or_canonical(&flipped), Ok(()));
        let mut extended = bytes.clone();
        extended.extend_from_slice(&garbage);
        prop_assert_eq!(decode(&extended).is_ok(), garbage.is_empty());
        prop_assert_eq!(check_refused_or_canonical(&garbage), Ok(()));
    }
}

/// A buffer with trees, every kind of scoring state, admissions and a packed group.
fn busy_buffer() -> TrajectoryBuffer {
    let buffer = busy_runtime().buffer;
    assert!(
        !buffer.packed_groups.is_empty(),
        "the fixture packed a group"
    );
    assert!(
        buffer.trees.values().any(|tree| tree
            .nodes()
            .iter()
            .any(|node| !node.stop_sequences.is_empty())),
        "the fixture has calls with stop sequences"
    );
    assert!(
        buffer.trees.values().any(|tree| tree
            .records()
            .iter()
            .any(|record| !record.stop_sequences.is_empty())),
        "the records a tree gives back (a proxy's restart) keep them"
    );
    assert!(
        buffer.trees.values().any(
            |tree| tree.nodes().iter().any(|node| node.context_outputs > 0
                && (node.context_outputs as usize) < node.output_ids.len())
        ),
        "the fixture has calls with some outputs sampled under a grammar"
    );
    assert!(buffer.trees.values().any(|tree| tree.roots().count() > 1));
    assert!(buffer.scoring.executions.values().any(|score| score
        .attempts
        .values()
        .any(|a| matches!(a.outcome, Some(AttemptOutcome::Failed { .. })))));
    buffer
}

/// The runtime that folded [`busy_buffer`].
fn busy_runtime() -> Runtime {
    let shape = Shape {
        seed: 7,
        executions_per_group: 2,
        main_calls: 4,
        sub_agents: 1,
        j_max: 2,
    };
    let mut ops = vec![Op::Dispatch, Op::Start(0), Op::Start(0), Op::Start(1)];
    ops.extend((0..40).map(|i| Op::Call(i as u8)));
    ops.extend([Op::Close(0, 0), Op::Close(0, 1), Op::Close(0, 4)]);
    ops.extend([
        Op::Request(0, 1),
        Op::Request(0, 2),
        Op::Complete(0, true, 3),
    ]);
    ops.extend([Op::Fail(0), Op::Request(0, 1), Op::Complete(0, true, 9)]);
    ops.extend([Op::Admit, Op::Pack, Op::Tick(5)]);
    run(&shape, &ops)
}

/// Exhaustive on one busy buffer: every truncation is refused, every single-bit flip is refused
/// or decodes canonically.
#[test]
fn every_truncation_and_bit_flip_of_a_busy_buffer() {
    let buffer = busy_buffer();
    let bytes = encode(&buffer);
    assert_eq!(decode(&bytes).as_ref(), Ok(&buffer));
    for cut in 0..bytes.len() {
        assert!(
            decode(&bytes[..cut]).is_err(),
            "prefix of {cut} bytes accepted"
        );
    }
    for position in 0..bytes.len() {
        for bit in 0..8 {
            let mut flipped = bytes.clone();
            flipped[position] ^= 1 << bit;
            assert_eq!(
                check_refused_or_canonical(&flipped),
                Ok(()),
                "bit {bit} of byte {position}"
            );
        }
    }
}

/// An optimizer step consuming a group replaces its closed members' trees by their counts:
/// `tree_counts` (what the state digest reads) is unchanged, the tokens are gone, the buffer
/// round-trips, a late record for a retired execution is refused, and a member still running
/// at the step (the buffer does not check readiness) retires when it closes.
#[test]
fn a_consumed_group_retires_its_trees_and_keeps_their_counts() {
    let mut runtime = busy_runtime();
    let group = *runtime
        .buffer
        .packed_groups
        .first()
        .expect("the fixture packed a group");
    let with_trees: Vec<ExecutionId> = runtime.buffer.scoring.groups[&group]
        .members
        .iter()
        .copied()
        .filter(|member| runtime.buffer.trees.contains_key(member))
        .collect();
    assert!(
        !with_trees.is_empty(),
        "the packed group has recorded calls"
    );
    let counts_before: Vec<_> = runtime.buffer.tree_counts().collect();
    let live_before = runtime.buffer.trees.len();

    runtime.act(&Op::Step);
    let buffer = &runtime.buffer;
    assert_eq!(
        buffer.tree_counts().collect::<Vec<_>>(),
        counts_before,
        "retiring keeps every tree's counts"
    );
    assert_eq!(
        buffer.retired.keys().copied().collect::<Vec<_>>(),
        with_trees
    );
    assert_eq!(buffer.trees.len(), live_before - with_trees.len());
    assert!(buffer.retired.values().all(|r| r.step == StepId(0)));
    assert!(buffer.retiring.is_empty(), "every member was closed");

    // The snapshot of a buffer with retired trees round-trips, and damage is refused.
    let bytes = encode(buffer);
    assert_eq!(decode(&bytes).as_ref(), Ok(buffer));
    for cut in 0..bytes.len() {
        assert!(
            decode(&bytes[..cut]).is_err(),
            "prefix of {cut} bytes accepted"
        );
    }

    // A late record for a retired execution is refused, by name, and changes nothing.
    let retired = with_trees[0];
    let (calls, _) = &runtime.calls[&retired];
    let record = record_from_context(
        &Tree::new(retired, TreeConfig::default()),
        &context_call(&calls[0]),
    );
    let mut late = buffer.clone();
    let error = late
        .apply(&Event::new(
            Timestamp::ZERO,
            EventBody::ModelCall(Box::new(record)),
        ))
        .expect_err("a record after the step is refused");
    assert!(error.to_string().contains("retired"), "{error}");
    assert_eq!(&late, buffer);

    // A member still running when its group is consumed retires when it closes.
    let (group, execution) = (GroupId(1_000), ExecutionId(1_000));
    runtime.apply(EventBody::GroupsDispatched {
        groups: vec![DispatchedGroup {
            group,
            query: QueryId(0),
        }],
        executions_per_group: 1,
        policy_version: PolicyVersion(0),
    });
    runtime.apply(EventBody::ExecutionStarted {
        execution,
        group,
        engine: EngineId(0),
    });
    let calls = generate(SyntheticConfig::small(2, 0), 5);
    let record = record_from_context(
        &Tree::new(execution, TreeConfig::default()),
        &context_call(&calls[0]),
    );
    runtime.apply(EventBody::ModelCall(Box::new(record)));
    let counts_before: Vec<_> = runtime.buffer.tree_counts().collect();
    runtime.apply(EventBody::OptimizerStepped {
        step: StepId(1),
        policy_version: PolicyVersion(2),
        consumed: vec![ConsumedGroup {
            group,
            staleness: 0,
        }],
    });
    assert!(runtime.buffer.trees.contains_key(&execution));
    assert_eq!(runtime.buffer.retiring.get(&execution), Some(&StepId(1)));
    let bytes = encode(&runtime.buffer);
    assert_eq!(decode(&bytes).as_ref(), Ok(&runtime.buffer));
    runtime.apply(EventBody::ExecutionClosed {
        execution,
        status: CloseStatus::Completed,
    });
    assert!(runtime.buffer.retiring.is_empty());
    assert_eq!(runtime.buffer.retired[&execution].step, StepId(1));
    assert_eq!(
        runtime.buffer.tree_counts().collect::<Vec<_>>(),
        counts_before
    );

    // A closed execution's records are frozen: a call still in flight at the close is refused
    // by name and changes nothing.
    let (group, execution) = (GroupId(1_001), ExecutionId(1_001));
    runtime.apply(EventBody::GroupsDispatched {
        groups: vec![DispatchedGroup {
            group,
            query: QueryId(1),
        }],
        executions_per_group: 1,
        policy_version: PolicyVersion(2),
    });
    runtime.apply(EventBody::ExecutionStarted {
        execution,
        group,
        engine: EngineId(0),
    });
    runtime.apply(EventBody::ExecutionClosed {
        execution,
        status: CloseStatus::HarnessTimeout,
    });
    let late = record_from_context(
        &Tree::new(execution, TreeConfig::default()),
        &context_call(&calls[0]),
    );
    let before = runtime.buffer.clone();
    let error = runtime
        .buffer
        .apply(&Event::new(
            Timestamp::ZERO,
            EventBody::ModelCall(Box::new(late)),
        ))
        .expect_err("a call after the close is refused");
    assert!(
        error.to_string().contains("closed (harness_timeout)"),
        "{error}"
    );
    assert_eq!(runtime.buffer, before);
}

/// A node that names a parent after itself is refused at the parent field, by offset.
#[test]
fn a_node_whose_parent_does_not_precede_it_is_refused() {
    let mut writer = Writer::new();
    writer.u32(16); // nodes_max
    writer.varint(1 << 20); // path_tokens_max
    writer.varint(1); // root_shared_tokens_min
    writer.count(1); // one node
    writer.varint(3); // call
    writer.varint(0); // a new agent name follows
    writer.str("main");
    writer.u8(0); // turn
    writer.u32(0); // engine
    writer.varint(0); // policy version
    writer.option_varint(None); // spawned_by
    let parent_offset = writer.len();
    writer.varint(1); // parent: one node back, but this is the first node
    writer.raw(&[0; 16]); // room for the rest of a node, so the node count is plausible
    let bytes = writer.into_bytes();
    let error = Tree::decode_from(&mut Reader::new(&bytes), ExecutionId(1))
        .expect_err("the first node has no earlier node to hang from");
    assert_eq!(error.field, "trajectory.trees.nodes.parent");
    assert_eq!(error.offset, parent_offset);
    assert_eq!(error.kind, WireErrorKind::OutOfRange { value: 1, max: 0 });
}
