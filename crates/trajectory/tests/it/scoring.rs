//! The partial-scoring state machine, driven by event scripts.

use std::collections::BTreeMap;

use gyre_event::{
    CloseStatus, DispatchedGroup, Duration, EngineId, Event, EventBody, ExecutionId, GroupId,
    PolicyVersion, QueryId, Timestamp,
};
use gyre_trajectory::{
    group_advantages, AdvantageNormalization, Resolution, Scoring, ScoringConfig,
    ADVANTAGE_STD_EPSILON,
};

fn at(seconds: u64, body: EventBody) -> Event {
    Event::new(Timestamp::from_secs(seconds), body)
}

fn group_of(n: u32) -> Scoring {
    let mut scoring = Scoring::new(ScoringConfig {
        evaluation_budget: Duration::from_secs(100),
        attempts_max: 4,
    });
    scoring
        .apply(&at(
            0,
            EventBody::GroupsDispatched {
                groups: vec![DispatchedGroup {
                    group: GroupId(1),
                    query: QueryId(1),
                }],
                executions_per_group: n,
                policy_version: PolicyVersion(0),
            },
        ))
        .expect("dispatch applies");
    for execution in 1..=n as u64 {
        scoring
            .apply(&at(
                0,
                EventBody::ExecutionStarted {
                    execution: ExecutionId(execution),
                    group: GroupId(1),
                    engine: EngineId(0),
                },
            ))
            .expect("start applies");
    }
    scoring
}

fn close(scoring: &mut Scoring, execution: u64, status: CloseStatus) {
    scoring
        .apply(&at(
            10,
            EventBody::ExecutionClosed {
                execution: ExecutionId(execution),
                status,
            },
        ))
        .expect("close applies");
}

fn request(scoring: &mut Scoring, execution: u64, attempt: u32, artifact_version: u64) {
    scoring
        .apply(&at(
            11,
            EventBody::EvaluationRequested {
                execution: ExecutionId(execution),
                attempt,
                artifact_version,
                branch_ref: "main".into(),
            },
        ))
        .expect("request applies");
}

fn complete(execution: u64, attempt: u32, score: f64, valid: bool, artifact_version: u64) -> Event {
    at(
        12,
        EventBody::EvaluationCompleted {
            execution: ExecutionId(execution),
            attempt,
            score,
            valid,
            evaluated_state_ref: format!("state-{artifact_version}"),
            artifact_version,
            branch_ref: "main".into(),
            evaluator: "tests".into(),
        },
    )
}

#[test]
fn group_is_ready_only_when_every_member_is_resolved() {
    let mut scoring = group_of(3);
    close(&mut scoring, 1, CloseStatus::Completed);
    request(&mut scoring, 1, 1, 1);
    scoring
        .apply(&complete(1, 1, 1.0, true, 1))
        .expect("completion applies");
    close(&mut scoring, 2, CloseStatus::HarnessTimeout);
    request(&mut scoring, 2, 1, 4);
    scoring
        .apply(&complete(2, 1, 0.5, true, 4))
        .expect("a harness timeout is still scored");
    assert!(
        !scoring.group_ready(GroupId(1)),
        "member 3 is still running"
    );
    close(&mut scoring, 3, CloseStatus::Failed);
    scoring
        .apply(&at(
            13,
            EventBody::DummyInserted {
                execution: ExecutionId(3),
                group: GroupId(1),
            },
        ))
        .expect("dummy applies");
    scoring.validate();
    assert!(scoring.group_ready(GroupId(1)));
    let advantages = scoring
        .advantages(GroupId(1), AdvantageNormalization::MeanOnly)
        .expect("ready");
    assert_eq!(advantages[&ExecutionId(1)], 0.5);
    assert_eq!(advantages[&ExecutionId(2)], 0.0);
    assert_eq!(advantages[&ExecutionId(3)], -0.5);
}

#[test]
fn evaluator_failure_is_pending_then_retried_then_excluded() {
    let mut scoring = group_of(2);
    close(&mut scoring, 1, CloseStatus::Completed);
    request(&mut scoring, 1, 1, 7);
    scoring
        .apply(&at(
            12,
            EventBody::EvaluationFailed {
                execution: ExecutionId(1),
                attempt: 1,
                reason: "evaluator crashed".into(),
            },
        ))
        .expect("failure applies");
    assert_eq!(
        scoring.executions[&ExecutionId(1)].resolution(),
        None,
        "pending, not a zero"
    );
    // Within the budget: retry on the same artifact version and branch.
    assert_eq!(
        scoring.decide(Timestamp::from_secs(50)),
        vec![EventBody::EvaluationRequested {
            execution: ExecutionId(1),
            attempt: 2,
            artifact_version: 7,
            branch_ref: "main".into()
        }]
    );
    // Budget spent: excluded.
    let decisions = scoring.decide(Timestamp::from_secs(100));
    assert!(matches!(
        decisions.as_slice(),
        [EventBody::ExecutionExcluded {
            execution: ExecutionId(1),
            ..
        }]
    ));
    for decision in decisions {
        scoring
            .apply(&at(100, decision))
            .expect("exclusion applies");
    }
    close(&mut scoring, 2, CloseStatus::Completed);
    request(&mut scoring, 2, 1, 1);
    scoring
        .apply(&complete(2, 1, 0.3, true, 1))
        .expect("completion applies");
    let advantages = scoring
        .advantages(GroupId(1), AdvantageNormalization::default())
        .expect("ready");
    assert_eq!(
        advantages.len(),
        1,
        "the excluded execution contributes nothing"
    );
    assert_eq!(advantages[&ExecutionId(2)], 0.0);
}

#[test]
fn later_attempts_never_overwrite_earlier_ones() {
    let mut scoring = group_of(1);
    close(&mut scoring, 1, CloseStatus::Completed);
    request(&mut scoring, 1, 1, 2);
    scoring
        .apply(&complete(1, 1, 0.8, true, 2))
        .expect("completion applies");
    assert!(
        scoring.apply(&complete(1, 1, 0.1, true, 2)).is_err(),
        "a second outcome for attempt 1 is rejected"
    );
    request(&mut scoring, 1, 2, 2);
    scoring
        .apply(&complete(1, 2, 0.1, true, 2))
        .expect("a later attempt is recorded");
    assert_eq!(
        scoring.executions[&ExecutionId(1)].resolution(),
        Some(Resolution::Valid {
            reward: 0.8,
            attempt: 1
        })
    );
    assert!(
        scoring.apply(&complete(1, 9, 0.1, true, 2)).is_err(),
        "unrequested attempt"
    );
    request(&mut scoring, 1, 3, 2);
    assert!(
        scoring.apply(&complete(1, 3, 0.1, true, 5)).is_err(),
        "completion bound to another artifact"
    );
}

#[test]
fn overall_timeout_and_surplus_are_excluded_on_close() {
    let mut scoring = group_of(2);
    close(&mut scoring, 1, CloseStatus::OverallTimeout);
    close(&mut scoring, 2, CloseStatus::Surplus);
    for execution in [1, 2] {
        assert!(matches!(
            scoring.executions[&ExecutionId(execution)].resolution(),
            Some(Resolution::Excluded { .. })
        ));
    }
    // The rule the scheduler counts by: N members, each closed and resolved (an excluded
    // member is resolved), so the group is ready, with no valid reward to train on.
    assert!(scoring.group_ready(GroupId(1)));
    assert_eq!(
        scoring.advantages(GroupId(1), AdvantageNormalization::default()),
        Some(BTreeMap::new())
    );
}

#[test]
fn a_designated_result_is_frozen_when_chosen() {
    let mut scoring = group_of(1);
    // A valid evaluation of an intermediate artifact while the execution still runs.
    request(&mut scoring, 1, 1, 1);
    scoring
        .apply(&complete(1, 1, 0.2, true, 1))
        .expect("an intermediate evaluation applies");
    assert_eq!(scoring.executions[&ExecutionId(1)].resolution(), None);
    request(&mut scoring, 1, 2, 3);
    scoring
        .apply(&complete(1, 2, 0.6, true, 3))
        .expect("a later artifact's evaluation applies");
    // At close the highest artifact version completed so far is designated...
    close(&mut scoring, 1, CloseStatus::Completed);
    let designated = Some(Resolution::Valid {
        reward: 0.6,
        attempt: 2,
    });
    assert_eq!(scoring.executions[&ExecutionId(1)].resolution(), designated);
    assert!(scoring.group_ready(GroupId(1)));
    // ...and a completion of a higher version folded after that is kept, but replaces nothing:
    // the group may already have been packed with 0.6.
    request(&mut scoring, 1, 3, 9);
    scoring
        .apply(&complete(1, 3, 1.0, true, 9))
        .expect("a late evaluation is recorded");
    let score = &scoring.executions[&ExecutionId(1)];
    assert_eq!(score.resolution(), designated);
    assert_eq!(score.best_valid(), Some((3, 1.0)));
    assert_eq!(score.designation_override(), Some(2));
    scoring.validate();
}

#[test]
fn std_normalised_advantages_use_a_documented_epsilon() {
    let advantages = group_advantages(&[1.0, 0.0], AdvantageNormalization::default());
    let expected = 0.5 / (0.5 + ADVANTAGE_STD_EPSILON);
    assert!((advantages[0] - expected).abs() < 1e-15 && (advantages[1] + expected).abs() < 1e-15);
    assert_eq!(
        group_advantages(&[2.0, 2.0, 2.0], AdvantageNormalization::default()),
        vec![0.0, 0.0, 0.0]
    );
}
