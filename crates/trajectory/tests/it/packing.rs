//! Trajectory buffer → stream packer → micro-step queue, end to end on events.

use gyre_event::{
    CellId, CloseStatus, DispatchedGroup, EngineId, Event, EventBody, ExecutionId, GroupId,
    MicroStepId, PolicyVersion, QueryId, StepId, Timestamp,
};
use gyre_trajectory::synthetic::{build_tree, generate, SyntheticConfig};
use gyre_trajectory::{
    pack_rows, padding_fraction, AdvantageNormalization, MicroStepQueue, RoleClasses,
    ScoringConfig, StreamPacker, TrajectoryBuffer, TreeConfig,
};

fn event(body: EventBody) -> Event {
    Event::new(Timestamp::ZERO, body)
}

/// Two groups of two executions each; group 2 was dispatched at an older policy version.
fn filled_buffer() -> TrajectoryBuffer {
    let mut buffer = TrajectoryBuffer::new(TreeConfig::default(), ScoringConfig::default());
    for (group, version) in [(1u64, 3u64), (2, 1)] {
        buffer
            .apply(&event(EventBody::GroupsDispatched {
                groups: vec![DispatchedGroup {
                    group: GroupId(group),
                    query: QueryId(group),
                }],
                executions_per_group: 2,
                policy_version: PolicyVersion(version),
            }))
            .expect("dispatch");
    }
    for execution in 1..=4u64 {
        let group = GroupId(1 + (execution - 1) / 2);
        buffer
            .apply(&event(EventBody::ExecutionStarted {
                execution: ExecutionId(execution),
                group,
                engine: EngineId(0),
            }))
            .expect("start");
        let calls = generate(SyntheticConfig::small(10, 1), execution);
        let tree =
            build_tree(ExecutionId(execution), &calls, TreeConfig::default()).expect("calls apply");
        // Replay the tree's nodes as records through the buffer, as the log would.
        for calls_done in 0..calls.len() {
            let record = gyre_trajectory::record_from_context(
                &build_tree(
                    ExecutionId(execution),
                    &calls[..calls_done],
                    TreeConfig::default(),
                )
                .expect("prefix applies"),
                &gyre_trajectory::synthetic::context_call(&calls[calls_done]),
            );
            buffer
                .apply(&event(EventBody::ModelCall(Box::new(record))))
                .expect("record applies");
        }
        assert_eq!(
            buffer.trees[&ExecutionId(execution)],
            tree,
            "log replay rebuilds the same tree"
        );
        buffer
            .apply(&event(EventBody::ExecutionClosed {
                execution: ExecutionId(execution),
                status: CloseStatus::Completed,
            }))
            .expect("close");
        buffer
            .apply(&event(EventBody::EvaluationRequested {
                execution: ExecutionId(execution),
                attempt: 1,
                artifact_version: 1,
                branch_ref: "b".into(),
            }))
            .expect("request");
        buffer
            .apply(&event(EventBody::EvaluationCompleted {
                execution: ExecutionId(execution),
                attempt: 1,
                score: execution as f64 % 2.0,
                valid: true,
                evaluated_state_ref: "s".into(),
                artifact_version: 1,
                branch_ref: "b".into(),
                evaluator: "tests".into(),
            }))
            .expect("complete");
    }
    buffer.validate();
    buffer
}

#[test]
fn packer_takes_oldest_group_first_and_closes_the_stream() {
    let mut buffer = filled_buffer();
    assert!(buffer.packable_groups().is_empty(), "nothing admitted yet");
    for decision in buffer.decide_admissions(11, 5, &RoleClasses::claude_code()) {
        buffer.apply(&event(decision)).expect("admission applies");
    }
    let mut packer = StreamPacker::new(StepId(0), 2, 4_096, MicroStepId(0));
    let mut queue = MicroStepQueue::default();
    let mut order = Vec::new();
    while let Some(group) = StreamPacker::choose_group(&buffer.packable_groups()) {
        let rows = buffer
            .rows(group, 2, AdvantageNormalization::default())
            .expect("ready group");
        assert!(!rows.is_empty());
        let (enqueue, micro_steps) = packer.pack_group(group, &rows).expect("rows fit");
        let rows_packed: usize = micro_steps
            .iter()
            .map(|micro_step| micro_step.rows.len())
            .sum();
        assert_eq!(rows_packed, rows.len(), "every row is packed exactly once");
        queue.apply(&enqueue).expect("enqueue");
        buffer
            .apply(&event(enqueue))
            .expect("buffer marks the group packed");
        order.push(group);
    }
    assert_eq!(
        order,
        vec![GroupId(2), GroupId(1)],
        "oldest policy version first"
    );
    assert!(packer.is_closed());
    assert!(queue.steps[&StepId(0)].stream_closed);
    // Claims: at most once each; a second claim of the same micro-step is rejected.
    let mut claimed = Vec::new();
    let mut cell = 0u32;
    while let Some(claim) = queue.decide_claim(StepId(0), CellId(cell % 2)) {
        queue.apply(&claim).expect("fresh claim");
        assert!(queue.apply(&claim).is_err(), "double claim rejected");
        if let EventBody::MicroStepClaimed {
            micro_step,
            cell,
            step,
        } = claim
        {
            claimed.push(micro_step);
            queue
                .apply(&EventBody::MicroStepDone {
                    step,
                    micro_step,
                    cell,
                })
                .expect("done");
        }
        cell += 1;
    }
    queue.validate();
    let mut unique = claimed.clone();
    unique.dedup();
    assert_eq!(unique, claimed);
    assert!(queue.step_complete(StepId(0)));
}

#[test]
fn packing_pads_less_than_one_row_per_micro_step() {
    let lengths: Vec<u64> = (0..40u64)
        .map(|index| 200 + (index * 7919) % 1_800)
        .collect();
    let tokens_max = 4_096;
    let bins = pack_rows(&lengths, tokens_max).expect("rows fit");
    let total: u64 = lengths.iter().sum();
    let packed = padding_fraction(total, bins.len() as u64, tokens_max);
    let naive = padding_fraction(total, lengths.len() as u64, tokens_max);
    assert!(packed < 0.1, "packed padding {packed}");
    assert!(naive > 0.6, "naive padding {naive}");
}

/// A row's log-probs stay beside their tokens whatever order its targets come in (the spans
/// are sorted, the log-probs with them), and targets that overlap are refused: a token trained
/// twice would count twice in the loss's denominator.
#[test]
fn target_order_never_misaligns_log_probs_and_overlaps_are_refused() {
    use gyre_trajectory::{admit, materialise, SplitMix64};
    let calls = generate(SyntheticConfig::small(12, 1), 3);
    let tree = build_tree(ExecutionId(3), &calls, TreeConfig::default()).expect("calls apply");
    let admission = admit(
        &tree,
        &RoleClasses::claude_code(),
        5,
        &mut SplitMix64::for_execution(5, 3),
    );
    let trajectory = admission
        .trajectories
        .iter()
        .find(|trajectory| trajectory.targets.len() > 1)
        .expect("a trajectory with several targets")
        .clone();
    let forward = materialise(&tree, &trajectory, 1.0, 1.0).expect("materialises");
    let mut reversed = trajectory.clone();
    reversed.targets.reverse();
    let backward = materialise(&tree, &reversed, 1.0, 1.0).expect("materialises");
    assert_eq!(backward.target_spans, forward.target_spans);
    assert_eq!(
        backward.behaviour_logprobs, forward.behaviour_logprobs,
        "each log-prob beside its token"
    );
    let mut overlapping = trajectory.clone();
    overlapping.targets.push(trajectory.targets[0]);
    let error = materialise(&tree, &overlapping, 1.0, 1.0).expect_err("overlap refused");
    assert!(error.to_string().contains("overlap"), "{error}");
}
