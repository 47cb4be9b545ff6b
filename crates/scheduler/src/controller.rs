//! The scheduler controller: `decide(&state, now) -> Vec<Event>`.
//!
//! Each call returns one coherent set of decisions (one rule's worth); the leader applies them
//! and asks again until nothing is left, which [`run_decisions`] does. Decisions follow
//! DESIGN.md §4 and the paper's 边界派发与水位控制 / 保住 harness 的角色切换 sections:
//!
//! - boundary dispatch: (φ+μ)·B groups at the start, μ·B after each publish;
//! - starts: min(d − p, C_R − (p − f)) queued executions, placed standalone-first then on rollout
//!   cells in descending index;
//! - joins: the next cell in index order enters training when eq (2) w ≤ C_R − C_e holds and the
//!   supply check has held for τ; transitions are serial;
//! - burst end: satellites return to rollout; after the publish, the core stays only if the next
//!   batch already has ρ_min·B ready groups and eq (3) w + μ·N·B ≤ C_s + Σ_{i≥1} C_e holds.

use gyre_event::{
    CellId, DispatchedGroup, EngineId, Event, EventBody, ExecutionId, GroupId, QueryId, Role,
    RouteMove, SchedulingMode, StepId, Timestamp,
};

use crate::SchedulerState;

/// The pure controller. Stateless: everything it knows is in the projection.
#[derive(Clone, Copy, Debug, Default)]
pub struct Controller;

/// The most decision rounds one `run_decisions` call may take; more means a controller bug.
const DECISION_ROUNDS_MAX: usize = 10_000;

/// Run `decide` and apply its events until it has nothing more to say; returns every event in
/// order. The leader proposes them as one atomic batch.
pub fn run_decisions(state: &mut SchedulerState, now: Timestamp) -> Vec<Event> {
    let mut all = Vec::new();
    for _ in 0..DECISION_ROUNDS_MAX {
        let events = Controller.decide(state, now);
        if events.is_empty() {
            return all;
        }
        for event in events {
            state
                .apply_unchecked(&event)
                .expect("the controller only emits events its own projection accepts");
            all.push(event);
        }
    }
    panic!("controller did not settle after {DECISION_ROUNDS_MAX} rounds");
}

impl Controller {
    pub fn decide(&self, state: &SchedulerState, now: Timestamp) -> Vec<Event> {
        let Some(config) = state.config() else {
            return Vec::new();
        };
        if state.cells.is_empty() && state.engines.is_empty() {
            return Vec::new();
        }
        let stamp = |body| Event::new(now, body);

        // Burst end: after μ optimizer steps satellites go back to rollout at once; the core
        // publishes and decides after the publish.
        if state.burst_end_pending {
            let mut out = vec![stamp(EventBody::BurstEnded { burst: state.burst })];
            if config.mode != SchedulingMode::Async {
                // Highest index first, so the training set stays a prefix after every event.
                for cell in state.cells.iter().skip(1).rev() {
                    if cell.role == Role::Training && cell.switching_to.is_none() {
                        out.push(stamp(EventBody::TransitionBegun {
                            cell: cell.id,
                            to: Role::Rollout,
                        }));
                    }
                }
            }
            return out;
        }

        // Boundary dispatch: d is fixed within a burst and grows only here.
        if state.dispatch_owed_groups > 0 {
            let groups: Vec<DispatchedGroup> = (0..state.dispatch_owed_groups)
                .map(|offset| {
                    let id = state.next_group + offset;
                    DispatchedGroup {
                        group: GroupId(id),
                        query: QueryId(id),
                    }
                })
                .collect();
            let mut out = Vec::new();
            if state.core_decision_pending {
                out.extend(self.core_after_publish(state, now));
            }
            out.push(stamp(EventBody::GroupsDispatched {
                groups,
                executions_per_group: config.n,
                policy_version: state.published_version,
            }));
            return out;
        }

        // Open the next batch as soon as the previous step is done.
        if state.batch.is_none() && !state.run_complete && !state.awaiting_publish {
            return vec![stamp(EventBody::BatchOpened {
                step: StepId(state.training_version.get()),
            })];
        }

        // Engines that went down hand their executions to serving engines.
        for engine in state.engines.values() {
            if !engine.ready && !engine.running.is_empty() {
                let moves = place_moves(state, engine.id, engine.running.iter().copied());
                if !moves.is_empty() {
                    return vec![stamp(EventBody::RoutesUpdated {
                        source: engine.id,
                        moves,
                    })];
                }
            }
        }

        // Start rule: min(d − p, C_R − (p − f)).
        let starts = self.starts(state, now);
        if !starts.is_empty() {
            return starts;
        }

        // The join window closes once the stream is closed and every micro-step is claimed, but
        // never under a cell still switching into training: closed early, the burst could end
        // without it, and it would finish joining after the burst, behind satellites already
        // back in rollout (the training set would no longer be a prefix).
        if let Some(batch) = &state.batch {
            let joining = state
                .cells
                .iter()
                .any(|c| c.switching_to == Some(Role::Training));
            if batch.stream_closed && batch.all_claimed() && !batch.join_window_closed && !joining {
                return vec![stamp(EventBody::JoinWindowClosed { step: batch.step })];
            }
        }

        if let Some(join) = self.next_join(state, now) {
            return join;
        }
        Vec::new()
    }

    /// When the controller next wants to be asked even if nothing happens: the moment the supply
    /// check will have held for τ.
    pub fn next_wakeup(&self, state: &SchedulerState) -> Option<Timestamp> {
        let config = state.config()?;
        let since = state.supply_ok_since?;
        self.join_candidate(state)?;
        let due = since.plus(config.tau);
        (due > state.now).then_some(due)
    }

    fn starts(&self, state: &SchedulerState, now: Timestamp) -> Vec<Event> {
        let capacity = state.rollout_capacity();
        let running = state.running();
        let count = state.queued().min(capacity.saturating_sub(running));
        if count == 0 {
            return Vec::new();
        }
        // Free slots in destination order: standalone pool first, then rollout cells in
        // descending index (those expected to stay in rollout longest).
        let mut slots: Vec<(EngineId, u32)> = destination_order(state)
            .into_iter()
            .filter_map(|id| state.engines.get(&id))
            .map(|engine| (engine.id, engine.free()))
            .filter(|(_, free)| *free > 0)
            .collect();
        let mut events = Vec::new();
        let mut queue = state.start_queue.iter().map(|group| {
            let started = state.groups.get(group).map(|g| (g.size, g.started));
            (*group, started.unwrap_or((0, 0)))
        });
        let mut current = queue.next();
        let mut slot_index = 0;
        for execution in (state.next_execution..).take(count as usize) {
            let Some((group, (size, started))) = current.as_mut() else {
                break;
            };
            while slot_index < slots.len() && slots[slot_index].1 == 0 {
                slot_index += 1;
            }
            let Some((engine, free)) = slots.get_mut(slot_index) else {
                break;
            };
            events.push(Event::new(
                now,
                EventBody::ExecutionStarted {
                    execution: ExecutionId(execution),
                    group: *group,
                    engine: *engine,
                },
            ));
            *free -= 1;
            *started += 1;
            if *started >= *size {
                current = queue.next();
            }
        }
        events
    }

    /// The cell that would join training next, if a join is structurally possible now: the
    /// lowest-index cell still in rollout, with no transition under way and a batch to train on.
    fn join_candidate<'a>(&self, state: &'a SchedulerState) -> Option<&'a crate::CellState> {
        let config = state.config()?;
        if config.mode == SchedulingMode::Async
            || state.transition_in_progress()
            || state.awaiting_publish
            || state.burst_end_pending
            || state.run_complete
        {
            return None;
        }
        let batch = state.batch.as_ref()?;
        if batch.join_window_closed {
            return None;
        }
        state.cells.iter().find(|cell| cell.role == Role::Rollout)
    }

    fn next_join(&self, state: &SchedulerState, now: Timestamp) -> Option<Vec<Event>> {
        let config = state.config()?;
        let cell = self.join_candidate(state)?;
        // eq (2): w ≤ C_R − C_e, so what is left in rollout can serve every unfinished execution.
        let capacity_after = state
            .rollout_capacity()
            .checked_sub(cell.rollout_capacity as u64)?;
        if state.water_level() > capacity_after {
            return None;
        }
        // Supply check: enough ready work has been waiting for τ.
        let since = state.supply_ok_since?;
        if now.saturating_sub(since) < config.tau {
            return None;
        }
        Some(self.switch_to_training(state, cell.id, now))
    }

    /// The role-switch protocol for a cell entering training: the source stops accepting
    /// (`TransitionBegun`), destination capacity is reserved and routes move
    /// (`RoutesUpdated`); the cell worker then cancels the source's outstanding requests, which
    /// the proxy retries on the destination, and reports `TransitionCompleted`.
    fn switch_to_training(
        &self,
        state: &SchedulerState,
        cell: CellId,
        now: Timestamp,
    ) -> Vec<Event> {
        let mut events = vec![Event::new(
            now,
            EventBody::TransitionBegun {
                cell,
                to: Role::Training,
            },
        )];
        let source = state.cells[cell.get() as usize].engine;
        if let Some(engine) = state.engines.get(&source) {
            if !engine.running.is_empty() {
                let moves = place_moves(state, source, engine.running.iter().copied());
                events.push(Event::new(now, EventBody::RoutesUpdated { source, moves }));
            }
        }
        events
    }

    /// After a publish: the core stays in training only if the next batch already has ρ_min·B
    /// ready groups and eq (3) w + μ·N·B ≤ C_s + Σ_{i≥1} C_e holds; otherwise it returns.
    fn core_after_publish(&self, state: &SchedulerState, now: Timestamp) -> Vec<Event> {
        let Some(config) = state.config() else {
            return Vec::new();
        };
        let Some(core) = state.cells.first() else {
            return Vec::new();
        };
        if core.role != Role::Training || core.switching_to.is_some() {
            return Vec::new();
        }
        let capacity_without_core: u64 = state.standalone_capacity()
            + state
                .cells
                .iter()
                .skip(1)
                .map(|c| c.rollout_capacity as u64)
                .sum::<u64>();
        // What the publish owes is dispatched in the same decision: μ·B, or less for the last
        // burst of a run.
        let incoming = state.dispatch_owed_groups * config.n as u64;
        let eq3 = state.water_level() + incoming <= capacity_without_core;
        let supply = state.ready_unpacked.len() as u64 >= config.supply_groups_min();
        if eq3 && supply {
            Vec::new()
        } else {
            vec![Event::new(
                now,
                EventBody::TransitionBegun {
                    cell: core.id,
                    to: Role::Rollout,
                },
            )]
        }
    }
}

/// Engines in destination order: standalone pool first (by id), then cells in rollout role in
/// descending index.
fn destination_order(state: &SchedulerState) -> Vec<EngineId> {
    let mut order: Vec<EngineId> = state
        .engines
        .values()
        .filter(|e| e.cell.is_none() && e.serving())
        .map(|e| e.id)
        .collect();
    order.extend(
        state
            .cells
            .iter()
            .rev()
            .filter(|c| c.role == Role::Rollout && c.switching_to.is_none())
            .filter_map(|c| state.engines.get(&c.engine))
            .filter(|e| e.serving())
            .map(|e| e.id),
    );
    order
}

/// Reserve destination slots for executions leaving `source`, in destination order.
fn place_moves(
    state: &SchedulerState,
    source: EngineId,
    executions: impl Iterator<Item = ExecutionId>,
) -> Vec<RouteMove> {
    let mut slots: Vec<(EngineId, u32)> = destination_order(state)
        .into_iter()
        .filter(|id| *id != source)
        .filter_map(|id| state.engines.get(&id))
        .map(|e| (e.id, e.free()))
        .collect();
    let mut moves = Vec::new();
    let mut index = 0;
    for execution in executions {
        while index < slots.len() && slots[index].1 == 0 {
            index += 1;
        }
        let Some((to, free)) = slots.get_mut(index) else {
            break;
        };
        moves.push(RouteMove {
            execution,
            from: source,
            to: *to,
        });
        *free -= 1;
    }
    moves
}
