//! The fold is atomic and the projections agree on resolutions.
//!
//! A simulated run's log, with hostile events slipped in at random points (completions bound
//! to another branch, results for executions that do not exist or are closed twice, dummies
//! and exclusions of resolved executions, groups dispatched out of order, starts in the wrong
//! group, late higher-version evaluations). After every event: a refused one left the whole
//! state (and its digest) unchanged, and the scheduler holds every execution as resolved exactly
//! when scoring does, with the same kind, and every group as ready exactly when scoring does.
//! At the end the state, frozen designations included, survives its snapshot.

use gyre_event::{
    CloseStatus, DispatchedGroup, EngineId, Event, EventBody, ExecutionId, GroupId, PolicyVersion,
    QueryId,
};
use gyre_scheduler::Resolution as SchedulerResolution;
use gyre_state::ControlState;
use gyre_trajectory::{AttemptOutcome, Resolution};
use proptest::prelude::*;

use crate::fold::simulated_run;

/// A hostile event built against the state at the point it is slipped in.
#[derive(Clone, Copy, Debug)]
enum Hostile {
    CompletionOnAnotherBranch(usize),
    CompletionOfUnknownExecution,
    SecondOutcomeOfAnAttempt(usize),
    LateHigherVersion(usize, bool),
    DummyOf(usize),
    ExclusionOf(usize),
    CloseOf(usize, usize),
    GroupsOutOfOrder,
    StartInTheWrongGroup(usize),
}

fn hostile() -> impl Strategy<Value = Hostile> {
    prop_oneof![
        any::<usize>().prop_map(Hostile::CompletionOnAnotherBranch),
        Just(Hostile::CompletionOfUnknownExecution),
        any::<usize>().prop_map(Hostile::SecondOutcomeOfAnAttempt),
        (any::<usize>(), any::<bool>()).prop_map(|(i, v)| Hostile::LateHigherVersion(i, v)),
        any::<usize>().prop_map(Hostile::DummyOf),
        any::<usize>().prop_map(Hostile::ExclusionOf),
        (any::<usize>(), any::<usize>()).prop_map(|(i, s)| Hostile::CloseOf(i, s)),
        Just(Hostile::GroupsOutOfOrder),
        any::<usize>().prop_map(Hostile::StartInTheWrongGroup),
    ]
}

fn pick<T: Copy>(items: &[T], index: usize) -> Option<T> {
    (!items.is_empty()).then(|| items[index % items.len()])
}

fn completion(
    execution: ExecutionId,
    attempt: u32,
    artifact_version: u64,
    branch_ref: &str,
    score: f64,
) -> EventBody {
    EventBody::EvaluationCompleted {
        execution,
        attempt,
        score,
        valid: true,
        evaluated_state_ref: "hostile".into(),
        artifact_version,
        branch_ref: branch_ref.into(),
        evaluator: "hostile".into(),
    }
}

/// The hostile events (one or two: a request and its completion) for `kind` at `state`.
fn build(kind: Hostile, state: &ControlState) -> Vec<EventBody> {
    let scoring = &state.trajectories.scoring;
    let executions: Vec<ExecutionId> = scoring.executions.keys().copied().collect();
    match kind {
        Hostile::CompletionOnAnotherBranch(index) => {
            let requested: Vec<(ExecutionId, u32, u64)> = scoring
                .executions
                .iter()
                .flat_map(|(execution, score)| {
                    score
                        .attempts
                        .iter()
                        .filter(|(_, record)| record.outcome.is_none())
                        .map(|(attempt, record)| (*execution, *attempt, record.artifact_version))
                })
                .collect();
            match pick(&requested, index) {
                Some((execution, attempt, version)) => {
                    vec![completion(execution, attempt, version, "elsewhere", 9.0)]
                }
                None => Vec::new(),
            }
        }
        Hostile::CompletionOfUnknownExecution => {
            vec![completion(ExecutionId(u64::MAX / 2), 0, 1, "main", 1.0)]
        }
        Hostile::SecondOutcomeOfAnAttempt(index) => {
            let settled: Vec<(ExecutionId, u32, u64)> = scoring
                .executions
                .iter()
                .flat_map(|(execution, score)| {
                    score
                        .attempts
                        .iter()
                        .filter(|(_, record)| {
                            matches!(record.outcome, Some(AttemptOutcome::Completed { .. }))
                        })
                        .map(|(attempt, record)| (*execution, *attempt, record.artifact_version))
                })
                .collect();
            match pick(&settled, index) {
                Some((execution, attempt, version)) => {
                    vec![completion(execution, attempt, version, "main", -3.0)]
                }
                None => Vec::new(),
            }
        }
        Hostile::LateHigherVersion(index, valid) => match pick(&executions, index) {
            Some(execution) => {
                let score = &scoring.executions[&execution];
                let attempt = score.attempts.keys().next_back().map_or(0, |last| last + 1);
                let mut completed = completion(execution, attempt, 1_000, "main", 7.0);
                if let EventBody::EvaluationCompleted { valid: v, .. } = &mut completed {
                    *v = valid;
                }
                vec![
                    EventBody::EvaluationRequested {
                        execution,
                        attempt,
                        artifact_version: 1_000,
                        branch_ref: "main".into(),
                    },
                    completed,
                ]
            }
            None => Vec::new(),
        },
        Hostile::DummyOf(index) => match pick(&executions, index) {
            Some(execution) => vec![EventBody::DummyInserted {
                execution,
                group: scoring.executions[&execution].group,
            }],
            None => Vec::new(),
        },
        Hostile::ExclusionOf(index) => match pick(&executions, index) {
            Some(execution) => vec![EventBody::ExecutionExcluded {
                execution,
                reason: "hostile".into(),
            }],
            None => Vec::new(),
        },
        Hostile::CloseOf(index, status) => match pick(&executions, index) {
            Some(execution) => vec![EventBody::ExecutionClosed {
                execution,
                status: CloseStatus::ALL[status % CloseStatus::ALL.len()],
            }],
            None => Vec::new(),
        },
        Hostile::GroupsOutOfOrder => {
            let next = scoring.groups.keys().next_back().map_or(0, |g| g.get() + 1);
            let config = state.scheduler.config().map_or(1, |config| config.n);
            vec![EventBody::GroupsDispatched {
                groups: vec![
                    DispatchedGroup {
                        group: GroupId(next),
                        query: QueryId(next),
                    },
                    DispatchedGroup {
                        group: GroupId(next + 2),
                        query: QueryId(next + 2),
                    },
                ],
                executions_per_group: config,
                policy_version: PolicyVersion::INITIAL,
            }]
        }
        Hostile::StartInTheWrongGroup(index) => {
            let groups: Vec<GroupId> = scoring.groups.keys().copied().collect();
            let next = executions.last().map_or(0, |e| e.get() + 1);
            match pick(&groups, index) {
                Some(group) => vec![EventBody::ExecutionStarted {
                    execution: ExecutionId(next),
                    group,
                    engine: EngineId(0),
                }],
                None => Vec::new(),
            }
        }
    }
}

/// The scheduler and scoring agree on every execution the scheduler holds and every group.
fn agree(state: &ControlState) -> Result<(), String> {
    let scoring = &state.trajectories.scoring;
    for (execution, held) in &state.scheduler.executions {
        let expected = match scoring
            .executions
            .get(execution)
            .and_then(|score| score.resolution())
        {
            None => SchedulerResolution::Pending,
            Some(Resolution::Valid { .. }) => SchedulerResolution::Valid,
            Some(Resolution::Dummy) => SchedulerResolution::Dummy,
            Some(Resolution::Excluded { .. }) => SchedulerResolution::Excluded,
        };
        if held.resolution != expected {
            return Err(format!(
                "{execution}: the scheduler holds {:?}, scoring {expected:?}",
                held.resolution
            ));
        }
    }
    for (group, held) in &state.scheduler.groups {
        if held.ready() != scoring.group_ready(*group) {
            return Err(format!(
                "{group}: ready for the scheduler {}, for scoring {}",
                held.ready(),
                scoring.group_ready(*group)
            ));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    #[test]
    fn refusals_change_nothing_and_the_projections_agree(
        seed in 0u64..1_000,
        hostile in prop::collection::vec((0.0f64..1.0, hostile()), 1..40),
    ) {
        let run = simulated_run(seed, 3);
        let mut at: Vec<(usize, Hostile)> = hostile
            .iter()
            .map(|(position, kind)| ((position * run.len() as f64) as usize, *kind))
            .collect();
        at.sort_by_key(|(position, _)| *position);
        let mut pending = at.into_iter().peekable();
        let mut state = ControlState::new();
        let mut refused = 0usize;
        for (position, event) in run.iter().enumerate() {
            let mut slipped = Vec::new();
            while let Some((_, kind)) = pending.next_if(|(p, _)| *p <= position) {
                slipped.extend(build(kind, &state).into_iter().map(|body| Event::new(event.at, body)));
            }
            for event in slipped.iter().chain(std::iter::once(event)) {
                let before = state.clone();
                let digest = state.digest();
                match state.apply(event) {
                    Ok(()) => {}
                    Err(error) => {
                        refused += 1;
                        prop_assert!(
                            state == before,
                            "refused {:?} ({}) but the state changed", event.body, error
                        );
                        prop_assert_eq!(state.digest(), digest);
                    }
                }
                if let Err(split) = agree(&state) {
                    prop_assert!(false, "after {:?}: {}", event.body, split);
                }
            }
        }
        let _ = refused;
        // Late higher-version completions leave frozen designations that differ from the rule:
        // the snapshot keeps them (and the digest covers them).
        let restored = ControlState::decode_snapshot(&state.encode_snapshot())
            .expect("the state's snapshot decodes");
        prop_assert!(restored == state, "the snapshot restores the state");
        prop_assert_eq!(restored.digest(), state.digest());
    }
}

/// Folds `run` up to and including the first close of an execution that the run then
/// evaluates; returns that execution, the state, and the rest of the run.
fn up_to_first_evaluated_close(run: &[Event]) -> (ExecutionId, ControlState, &[Event]) {
    let mut state = ControlState::new();
    for (position, event) in run.iter().enumerate() {
        state.apply(event).expect("the simulated run folds");
        if let EventBody::ExecutionClosed { execution, .. } = &event.body {
            let evaluated = run[position + 1..].iter().any(|later| {
                matches!(&later.body, EventBody::EvaluationRequested { execution: e, .. } if e == execution)
            });
            if evaluated {
                return (*execution, state, &run[position + 1..]);
            }
        }
    }
    panic!("the run evaluates no execution");
}

/// The split this fold used to have: the scheduler counted any valid completion while scoring
/// refused one bound to another branch, so the group was ready for one projection and never
/// for the other. Now the refusal changes nothing and the result counts once it is valid.
#[test]
fn a_completion_bound_to_another_branch_resolves_nothing() {
    let run = simulated_run(5, 2);
    let (execution, mut state, rest) = up_to_first_evaluated_close(&run);
    let request = rest
        .iter()
        .find(|event| matches!(&event.body, EventBody::EvaluationRequested { execution: e, .. } if *e == execution))
        .expect("requested");
    state.apply(request).expect("the request folds");
    let EventBody::EvaluationRequested {
        attempt,
        artifact_version,
        ..
    } = &request.body
    else {
        unreachable!()
    };
    let before = state.clone();
    let forged = Event::new(
        request.at,
        completion(execution, *attempt, *artifact_version, "elsewhere", 1.0),
    );
    let error = state.apply(&forged).expect_err("bound to another branch");
    assert!(error.to_string().contains("elsewhere"), "{error}");
    assert!(state == before, "the refusal changed nothing");
    assert_eq!(
        state.scheduler.executions[&execution].resolution,
        SchedulerResolution::Pending
    );
    let bound = Event::new(
        request.at,
        completion(execution, *attempt, *artifact_version, "main", 1.0),
    );
    state.apply(&bound).expect("the bound completion folds");
    assert_eq!(
        state.scheduler.executions[&execution].resolution,
        SchedulerResolution::Valid
    );
    agree(&state).expect("the projections agree");
    // A later artifact's valid evaluation is kept, but the designated reward stays frozen; the
    // digest and the snapshot record that it differs from what the rule would pick now.
    let digest = state.digest();
    let late = attempt + 1;
    for body in [
        EventBody::EvaluationRequested {
            execution,
            attempt: late,
            artifact_version: artifact_version + 1,
            branch_ref: "main".into(),
        },
        completion(execution, late, artifact_version + 1, "main", 5.0),
    ] {
        state
            .apply(&Event::new(request.at, body))
            .expect("a late evaluation folds");
    }
    let score = &state.trajectories.scoring.executions[&execution];
    assert_eq!(
        score.resolution(),
        Some(Resolution::Valid {
            reward: 1.0,
            attempt: *attempt
        })
    );
    assert_eq!(score.designation_override(), Some(*attempt));
    assert_ne!(state.digest(), digest);
    let restored = ControlState::decode_snapshot(&state.encode_snapshot()).expect("decodes");
    assert!(restored == state);
}

/// An execution closed by its overall timeout expects no valid reward: both projections hold it
/// excluded at the close, with no `ExecutionExcluded` needed (the simulator still sends one; it
/// changes nothing).
#[test]
fn an_overall_timeout_is_excluded_at_its_close() {
    let run = simulated_run(5, 2);
    let (execution, state, _) = up_to_first_evaluated_close(&run);
    // The same log with that close an overall timeout instead.
    let mut state_timeout = ControlState::new();
    for event in &run {
        let mut event = event.clone();
        if let EventBody::ExecutionClosed {
            execution: e,
            status,
        } = &mut event.body
        {
            if *e == execution {
                *status = CloseStatus::OverallTimeout;
                state_timeout.apply(&event).expect("the close folds");
                break;
            }
        }
        state_timeout.apply(&event).expect("the run folds");
    }
    assert_eq!(
        state.scheduler.executions[&execution].resolution,
        SchedulerResolution::Pending,
        "a completed execution waits for its evaluation"
    );
    assert_eq!(
        state_timeout.scheduler.executions[&execution].resolution,
        SchedulerResolution::Excluded
    );
    agree(&state_timeout).expect("the projections agree");
}

/// A first model call of an execution that its tree refuses (a parent that does not exist)
/// leaves no tree behind: the digest reads every tree, so an empty one would change the state.
#[test]
fn a_refused_first_model_call_leaves_no_tree() {
    use gyre_event::{CallId, CallKind, Duration, ModelCallRecord, Timestamp};
    let record = ModelCallRecord {
        execution: ExecutionId(7),
        call: CallId(70),
        agent: "main".to_string(),
        kind: CallKind::Turn,
        parent_call: Some(CallId(69)),
        reused_prefix_tokens_count: 4,
        spawned_by: None,
        input_ids: vec![1, 2],
        input_provenance: vec![],
        output_ids: vec![10],
        output_logprobs: vec![-0.5],
        engine: EngineId(0),
        policy_version: PolicyVersion(0),
        requested_at: Timestamp(0),
        first_token_after: Duration(0),
        completed_after: Duration(0),
        stop_sequences: Vec::new(),
        output_constraint: None,
        sampling: gyre_event::SamplingSettings::POLICY,
    };
    let event = Event::new(Timestamp(1), EventBody::ModelCall(Box::new(record)));
    let before = ControlState::new();
    let mut state = before.clone();
    state
        .apply(&event)
        .expect_err("an unknown parent is refused");
    assert!(state == before && state.digest() == before.digest());
    let mut owned = before.clone();
    owned.apply_owned(event).expect_err("refused by value too");
    assert!(owned == before);
}

/// An evaluation attempt numbered `u32::MAX` leaves no number for a retry: the leader's
/// scoring decision excludes the execution instead of overflowing (a panic in debug builds; a
/// wrapped attempt 0, refused by every replica and proposed again every tick, in release).
#[test]
fn the_last_attempt_number_is_excluded_not_retried() {
    use gyre_event::Timestamp;
    let mut state = ControlState::new();
    let mut scoring = state.trajectories.scoring.clone();
    let at = Timestamp(1);
    for body in [
        EventBody::GroupsDispatched {
            groups: vec![DispatchedGroup {
                group: GroupId(0),
                query: QueryId(0),
            }],
            executions_per_group: 1,
            policy_version: PolicyVersion::INITIAL,
        },
        EventBody::ExecutionStarted {
            execution: ExecutionId(0),
            group: GroupId(0),
            engine: EngineId(0),
        },
        EventBody::ExecutionClosed {
            execution: ExecutionId(0),
            status: CloseStatus::Completed,
        },
        EventBody::EvaluationRequested {
            execution: ExecutionId(0),
            attempt: u32::MAX,
            artifact_version: 1,
            branch_ref: "main".into(),
        },
        EventBody::EvaluationFailed {
            execution: ExecutionId(0),
            attempt: u32::MAX,
            reason: "evaluator crashed".into(),
        },
    ] {
        scoring.apply(&Event::new(at, body)).expect("folds");
    }
    state.trajectories.scoring = scoring;
    let decided = state.trajectories.scoring.decide(Timestamp(2));
    assert!(
        matches!(
            decided.as_slice(),
            [EventBody::ExecutionExcluded {
                execution: ExecutionId(0),
                ..
            }]
        ),
        "{decided:?}"
    );
}
