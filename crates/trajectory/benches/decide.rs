//! `cargo bench -p gyre-trajectory --bench decide [-- EXECUTIONS]`: what the leader's
//! `Scoring::decide` costs in a long run. The controller loop asks it on every tick and every
//! applied entry, and the scoring projection keeps every execution the run started (200,000 by
//! default: 25,000 groups of 8, every one closed; one in 20,000 awaiting a retry after a failed
//! evaluation, the rest resolved). Printed beside the anchor it replaced: a walk over every execution
//! asking whether it awaits a resolution (what `decide` did before its index). Median of 101
//! calls each, three rounds; the machine is noisy.

use std::time::Instant;

use gyre_event::{
    CloseStatus, DispatchedGroup, EngineId, Event, EventBody, ExecutionId, GroupId, PolicyVersion,
    QueryId, Timestamp,
};
use gyre_trajectory::{Scoring, ScoringConfig};

fn median_ns(mut run: impl FnMut() -> usize) -> (f64, usize) {
    let mut times = Vec::new();
    let mut found = 0;
    for _ in 0..101 {
        let started = Instant::now();
        found = std::hint::black_box(run());
        times.push(started.elapsed().as_nanos() as f64);
    }
    times.sort_by(f64::total_cmp);
    (times[times.len() / 2], found)
}

fn main() {
    let executions: u64 = std::env::args()
        .skip(1)
        .find_map(|argument| argument.parse().ok())
        .unwrap_or(200_000);
    let per_group = 8u64;
    let groups = executions.div_ceil(per_group);
    let at = |body| Event::new(Timestamp::from_secs(1), body);
    let mut scoring = Scoring::new(ScoringConfig::default());
    scoring
        .apply(&at(EventBody::GroupsDispatched {
            groups: (0..groups)
                .map(|group| DispatchedGroup {
                    group: GroupId(group),
                    query: QueryId(group),
                })
                .collect(),
            executions_per_group: per_group as u32,
            policy_version: PolicyVersion(0),
        }))
        .expect("dispatch");
    for execution in 0..executions {
        let id = ExecutionId(execution);
        let events = [
            EventBody::ExecutionStarted {
                execution: id,
                group: GroupId(execution / per_group),
                engine: EngineId(0),
            },
            EventBody::ExecutionClosed {
                execution: id,
                status: CloseStatus::Completed,
            },
            EventBody::EvaluationRequested {
                execution: id,
                attempt: 0,
                artifact_version: 1,
                branch_ref: "main".into(),
            },
        ];
        for body in events {
            scoring.apply(&at(body)).expect("applies");
        }
        if execution % 20_000 == 0 {
            // Its evaluator failed: `decide` proposes the retry.
            scoring
                .apply(&at(EventBody::EvaluationFailed {
                    execution: id,
                    attempt: 0,
                    reason: "evaluator down".into(),
                }))
                .expect("applies");
        } else {
            scoring
                .apply(&at(EventBody::EvaluationCompleted {
                    execution: id,
                    attempt: 0,
                    score: 1.0,
                    valid: true,
                    evaluated_state_ref: "state".into(),
                    artifact_version: 1,
                    branch_ref: "main".into(),
                    evaluator: "bench".into(),
                }))
                .expect("applies");
        }
    }
    let now = Timestamp::from_secs(2);
    println!("executions: {executions}");
    for round in 1..=3 {
        let (decide, decisions) = median_ns(|| scoring.decide(now).len());
        let (walk, awaiting) = median_ns(|| {
            scoring
                .executions
                .values()
                .filter(|state| state.awaits_resolution())
                .count()
        });
        println!(
            "round {round}: decide {:.1} µs ({decisions} decisions); anchor, a walk over every \
             execution {:.1} µs ({awaiting} awaiting); ratio {:.0}×",
            decide / 1e3,
            walk / 1e3,
            walk / decide.max(1.0)
        );
    }
}
