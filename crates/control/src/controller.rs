//! The leader's controller loop (DESIGN.md §2): decisions are events.
//!
//! Every node runs this loop; only the leader acts. It wakes on a tick (`tick_interval`, 50 ms)
//! and whenever the applied index moves. Once per term it first waits until its projection has
//! applied everything committed before it became leader (`ensure_linearizable`), so a new leader
//! resumes from the projection, never from stale memory. Then it asks the pure controller
//! (`gyre_scheduler::Controller::decide`) whether there is anything to do at `now`; if so it runs
//! `run_decisions` on a clone of the scheduler projection and proposes every returned event as one
//! request (one atomic batch), waiting for it to be applied before deciding again. With nothing
//! for the scheduler to do it proposes the scoring projection's decisions (`Scoring::decide`:
//! evaluation retries and budget exclusions). When nothing was folded for `idle_tick` (1 s), it
//! proposes a `Tick`.
//!
//! A decision computed at applied index i can race with client events committed after i; the
//! projection then refuses what no longer applies (deterministically on every replica), and
//! `gyre replay --recompute` reports it as a divergence. Closing this race needs decisions
//! computed inside the proposer at the batch boundary (a known gap).

use std::time::Duration;

use gyre_event::{Event, EventBody, Timestamp};
use gyre_log::raft::{NodeId, Raft, StateMachineStore};
use gyre_scheduler::{run_decisions, Controller};
use tokio::sync::{mpsc, oneshot, watch};

use crate::projection::ControlProjection;
use crate::proposer::{wall_clock, AppendJob};

#[derive(Clone, Copy, Debug)]
pub struct ControllerOptions {
    pub tick_interval: Duration,
    pub idle_tick: Duration,
}

impl Default for ControllerOptions {
    fn default() -> Self {
        ControllerOptions {
            tick_interval: Duration::from_millis(50),
            idle_tick: Duration::from_secs(1),
        }
    }
}

pub struct ControllerLoop {
    pub id: NodeId,
    pub raft: Raft,
    pub state_machine: StateMachineStore<ControlProjection>,
    pub jobs: mpsc::Sender<AppendJob>,
    pub options: ControllerOptions,
}

/// What one wake-up wants proposed: the scheduler's decisions; else the scoring projection's
/// (an evaluation retry on the same artifact while the execution's budget lasts, an exclusion
/// once it is spent: without these a pending evaluation would hold its group back forever);
/// else, when idle, a `Tick`.
fn plan(projection: &ControlProjection, now: Timestamp, idle_tick: Duration) -> Vec<Event> {
    let scheduler = &projection.state.scheduler;
    if !Controller.decide(scheduler, now).is_empty() {
        let mut scratch = scheduler.clone();
        return run_decisions(&mut scratch, now);
    }
    let scoring = projection.state.trajectories.scoring.decide(now);
    if !scoring.is_empty() {
        return scoring
            .into_iter()
            .map(|body| Event::new(now, body))
            .collect();
    }
    let idle_nanos = u64::try_from(idle_tick.as_nanos()).unwrap_or(u64::MAX);
    if now.nanos().saturating_sub(projection.last_at.nanos()) >= idle_nanos {
        return vec![Event::new(now, EventBody::Tick)];
    }
    Vec::new()
}

impl ControllerLoop {
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let mut metrics = self.raft.metrics();
        let mut interval = tokio::time::interval(self.options.tick_interval);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut ready_term = None;
        loop {
            tokio::select! {
                _ = interval.tick() => {}
                changed = metrics.changed() => if changed.is_err() { return },
                _ = shutdown.changed() => return,
            }
            let (leader, term) = {
                let current = metrics.borrow();
                (current.current_leader, current.current_term)
            };
            if leader != Some(self.id) {
                ready_term = None;
                continue;
            }
            if ready_term != Some(term) {
                if self.raft.ensure_linearizable().await.is_err() {
                    continue;
                }
                tracing::info!(
                    term,
                    "leader caught up; controller resumes from the projection"
                );
                ready_term = Some(term);
            }
            let now = wall_clock();
            let events = self.state_machine.with_projection(|projection, _| {
                plan(
                    projection,
                    now.max(projection.last_at),
                    self.options.idle_tick,
                )
            });
            if events.is_empty() {
                continue;
            }
            let (reply, answer) = oneshot::channel();
            let records = events.iter().map(gyre_log::encode_record).collect();
            if self.jobs.send(AppendJob { records, reply }).await.is_err() {
                return;
            }
            match answer.await {
                Ok(Ok(outcome)) => {
                    if let Some(reason) = outcome.rejected.iter().flatten().next() {
                        tracing::warn!(reason = %reason, "a decision was refused on apply");
                    }
                }
                Ok(Err(error)) => tracing::debug!(%error, "decision batch not committed"),
                Err(_) => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gyre_event::{CloseStatus, DispatchedGroup, EngineId, ExecutionId, GroupId, QueryId};

    /// A closed execution whose evaluation failed is retried, and once its budget is spent it
    /// is excluded: the leader proposes both, so a pending evaluation never holds its group
    /// back.
    #[test]
    fn the_leader_proposes_scoring_retries_and_exclusions() {
        let mut projection = ControlProjection::new();
        let at = Timestamp::from_secs(1);
        let bodies = vec![
            EventBody::GroupsDispatched {
                groups: vec![DispatchedGroup {
                    group: GroupId(0),
                    query: QueryId(0),
                }],
                executions_per_group: 1,
                policy_version: gyre_event::PolicyVersion::INITIAL,
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
                attempt: 0,
                artifact_version: 3,
                branch_ref: "main".into(),
            },
            EventBody::EvaluationFailed {
                execution: ExecutionId(0),
                attempt: 0,
                reason: "evaluator crashed".into(),
            },
        ];
        // Only the trajectory buffer's fold matters here: the scheduler has no run configured,
        // so the scoring projection is driven directly.
        for body in bodies {
            projection
                .state
                .trajectories
                .apply(&Event::new(at, body))
                .expect("the scoring events fold");
        }
        let idle = Duration::from_secs(3600);
        let retry = plan(&projection, Timestamp::from_secs(2), idle);
        assert!(
            matches!(
                retry.as_slice(),
                [Event {
                    body: EventBody::EvaluationRequested {
                        attempt: 1,
                        artifact_version: 3,
                        ..
                    },
                    ..
                }]
            ),
            "{retry:?}"
        );
        let spent = Timestamp::from_secs(7 * 3600);
        let excluded = plan(&projection, spent, idle);
        assert!(
            matches!(
                excluded.as_slice(),
                [Event {
                    body: EventBody::ExecutionExcluded { .. },
                    ..
                }]
            ),
            "{excluded:?}"
        );
    }
}
