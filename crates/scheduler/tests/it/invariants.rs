//! Invariants of the scheduler projection, one property per function (STYLE rule 12).
//!
//! Each takes the projection (or the projection before and after one event) and returns the
//! first violation as a message. The harness and the property tests call [`check_step`] after
//! every applied event; the tests at the bottom feed each invariant a deliberately broken state
//! to show that it can fail.

use gyre_event::{Role, SchedulingMode};
use gyre_scheduler::SchedulerState;

/// Every invariant, for the step from `before` to `after` (one applied event).
pub fn check_step(before: &SchedulerState, after: &SchedulerState) -> Result<(), String> {
    after.validate()?;
    counters_ordered(after)?;
    counters_monotone(before, after)?;
    running_within_capacity(after)?;
    training_set_is_prefix(after)?;
    single_joiner(after)?;
    claims_are_final(before, after)?;
    supply_timer_consistent(after)?;
    dispatch_only_at_boundaries(after)?;
    Ok(())
}

/// f ≤ p ≤ d, so queued d − p and running p − f are never negative.
pub fn counters_ordered(state: &SchedulerState) -> Result<(), String> {
    let (d, p, f) = (state.dispatched, state.started, state.finished);
    if f <= p && p <= d {
        Ok(())
    } else {
        Err(format!("counters out of order: d={d} p={p} f={f}"))
    }
}

/// d, p and f only grow.
pub fn counters_monotone(before: &SchedulerState, after: &SchedulerState) -> Result<(), String> {
    let pairs = [
        ("d", before.dispatched, after.dispatched),
        ("p", before.started, after.started),
        ("f", before.finished, after.finished),
    ];
    for (name, old, new) in pairs {
        if new < old {
            return Err(format!("counter {name} went back from {old} to {new}"));
        }
    }
    Ok(())
}

/// An engine is down when it should be serving (standalone, or its cell is settled in rollout)
/// but is not ready.
pub fn engine_down(state: &SchedulerState) -> bool {
    state.engines.values().any(|engine| {
        let should_serve = match engine.cell {
            None => true,
            Some(cell) => state
                .cells
                .get(cell.get() as usize)
                .is_some_and(|c| c.role == Role::Rollout && c.switching_to.is_none()),
        };
        should_serve && !engine.ready
    })
}

/// running = p − f ≤ C_R whenever no engine is down (a failure may strand executions).
pub fn running_within_capacity(state: &SchedulerState) -> Result<(), String> {
    if engine_down(state) {
        return Ok(());
    }
    let (running, capacity) = (state.running(), state.rollout_capacity());
    if running <= capacity {
        Ok(())
    } else {
        Err(format!("{running} executions running but C_R = {capacity}"))
    }
}

/// The training set (cells in training and staying there, or joining) is a prefix of the cell
/// order: the core first, then satellites in index order. Cells returning to rollout at a burst
/// end are leaving the set and may report back in any order, so "out of rollout" (which counts
/// them) is not a prefix in general; eq (1) still counts them out of rollout. Async's static
/// partition is its first `async_training_cells` cells, also a prefix.
pub fn training_set_is_prefix(state: &SchedulerState) -> Result<(), String> {
    let training: Vec<bool> = state
        .cells
        .iter()
        .map(|c| match c.switching_to {
            Some(to) => to == Role::Training,
            None => c.role == Role::Training,
        })
        .collect();
    let prefix = training.iter().take_while(|t| **t).count();
    if training[prefix..].iter().any(|t| *t) {
        let roles: Vec<String> = state
            .cells
            .iter()
            .map(|c| format!("{}:{:?}/{:?}", c.id, c.role, c.switching_to))
            .collect();
        return Err(format!(
            "the training set is not a prefix: {}",
            roles.join(" ")
        ));
    }
    Ok(())
}

/// At most one cell is switching to training at any time (transitions into training are serial).
pub fn single_joiner(state: &SchedulerState) -> Result<(), String> {
    let joining: Vec<String> = state
        .cells
        .iter()
        .filter(|c| c.switching_to == Some(Role::Training))
        .map(|c| c.id.to_string())
        .collect();
    if joining.len() <= 1 {
        Ok(())
    } else {
        Err(format!(
            "{} switching to training at once",
            joining.join(", ")
        ))
    }
}

/// A micro-step is claimed at most once: once a claim is recorded it never changes hands.
pub fn claims_are_final(before: &SchedulerState, after: &SchedulerState) -> Result<(), String> {
    let (Some(old), Some(new)) = (&before.batch, &after.batch) else {
        return Ok(());
    };
    if old.step != new.step {
        return Ok(());
    }
    for (id, micro_step) in &old.micro_steps {
        if let Some(cell) = micro_step.claimed_by {
            let now = new.micro_steps.get(id).and_then(|m| m.claimed_by);
            if now != Some(cell) {
                return Err(format!("{id} was claimed by {cell} and is now {now:?}"));
            }
        }
    }
    let claimed = new
        .micro_steps
        .values()
        .filter(|m| m.claimed_by.is_some())
        .count();
    if claimed != new.claimed_count as usize {
        return Err(format!(
            "{claimed} micro-steps claimed but the claim cursor says {}",
            new.claimed_count
        ));
    }
    Ok(())
}

/// The supply timer runs exactly while the supply check holds, and never starts in the future.
pub fn supply_timer_consistent(state: &SchedulerState) -> Result<(), String> {
    match (state.supply_ok_since, state.supply_holds()) {
        (Some(since), true) if since <= state.now => Ok(()),
        (None, false) => Ok(()),
        (since, holds) => Err(format!(
            "supply timer {since:?} but supply holds = {holds} (now {})",
            state.now
        )),
    }
}

/// Boundary dispatch: d counts the initial (φ+μ)·B groups and μ·B more per publish, N each, less
/// what is owed but not yet dispatched. So d never moves inside a burst.
pub fn dispatch_only_at_boundaries(state: &SchedulerState) -> Result<(), String> {
    let Some(config) = state.config() else {
        return Ok(());
    };
    let n = config.n as u64;
    let publishes = if config.mode == SchedulingMode::Async && config.mu == 0 {
        0
    } else {
        state.published_version.get() / config.mu as u64
    };
    let groups = config.initial_dispatch_groups() + publishes * config.burst_dispatch_groups();
    if state.dispatched + n * state.dispatch_owed_groups == n * groups {
        Ok(())
    } else {
        Err(format!(
            "d = {} with {} groups owed, but boundary dispatch allows {} groups of {n}",
            state.dispatched, state.dispatch_owed_groups, groups
        ))
    }
}

#[cfg(test)]
mod can_fail {
    //! Each invariant rejects a deliberately broken state.

    use std::collections::BTreeMap;

    use gyre_event::{CellId, ExecutionId, GroupId, MicroStepId, Role, StepId, Timestamp};
    use gyre_scheduler::{BatchState, MicroStepState, SchedulerState};

    use super::*;
    use crate::harness::Harness;

    /// A healthy mid-run state: three cells, cell0 training on an open batch with claimed work.
    fn healthy() -> SchedulerState {
        let mut harness = Harness::default();
        harness.run(
            "config mode=elastic phi=0 mu=1 n=1 b=2 rho_min=0.5 tau=0 cells=3x2 standalone=2
             at 0 decide
             at 1 finish e0-e1
             at 1 decide
             at 2 complete cell0 training
             at 2 decide
             at 3 pack
             at 3 claim cell0",
        );
        let state = harness.state;
        check_step(&state, &state).expect("the healthy state passes every invariant");
        state
    }

    #[test]
    fn healthy_state_passes() {
        let state = healthy();
        assert_eq!(state.cells[0].role, Role::Training);
        assert!(state.batch.as_ref().is_some_and(|b| b.claimed_count == 1));
    }

    #[test]
    fn counters_ordered_fails_when_f_exceeds_p() {
        let mut state = healthy();
        state.finished = state.started + 1;
        assert!(counters_ordered(&state).is_err());
        assert!(check_step(&state, &state).is_err());
    }

    #[test]
    fn counters_monotone_fails_when_d_goes_back() {
        let before = healthy();
        let mut after = before.clone();
        after.dispatched -= 1;
        let error = counters_monotone(&before, &after).expect_err("d went back");
        assert!(error.contains("counter d"), "{error}");
    }

    #[test]
    fn running_within_capacity_fails_when_overfull() {
        let mut state = healthy();
        // Pretend ten more executions run than the rollout engines hold.
        state.started += 10;
        state.dispatched += 10;
        let engine = state
            .engines
            .values_mut()
            .find(|e| e.cell.is_none())
            .expect("pool");
        engine.capacity = 1;
        assert!(running_within_capacity(&state).is_err());
    }

    #[test]
    fn running_within_capacity_excuses_a_down_engine() {
        let mut state = healthy();
        state.started += 9;
        state.dispatched += 9;
        assert!(running_within_capacity(&state).is_err());
        let engine = state
            .engines
            .values_mut()
            .find(|e| e.cell.is_none())
            .expect("pool");
        engine.ready = false;
        assert!(running_within_capacity(&state).is_ok());
    }

    #[test]
    fn prefix_fails_for_a_gap() {
        let mut state = healthy();
        state.cells[0].role = Role::Rollout;
        state.cells[0].switching_to = None;
        state.cells[1].role = Role::Training;
        state.cells[1].switching_to = None;
        assert!(training_set_is_prefix(&state).is_err());
        // A satellite that completes its join behind a cell settled in rollout.
        let mut state = healthy();
        state.cells[1].role = Role::Rollout;
        state.cells[1].switching_to = None;
        state.cells[2].role = Role::Rollout;
        state.cells[2].switching_to = Some(Role::Training);
        assert!(training_set_is_prefix(&state).is_err());
    }

    #[test]
    fn prefix_allows_satellites_returning_in_any_order() {
        let mut state = healthy();
        state.cells[1].role = Role::Rollout;
        state.cells[1].switching_to = None;
        state.cells[2].role = Role::Training;
        state.cells[2].switching_to = Some(Role::Rollout);
        assert_eq!(training_set_is_prefix(&state), Ok(()));
    }

    #[test]
    fn single_joiner_fails_for_two() {
        let mut state = healthy();
        state.cells[1].switching_to = Some(Role::Training);
        assert!(single_joiner(&state).is_ok());
        state.cells[2].switching_to = Some(Role::Training);
        assert!(single_joiner(&state).is_err());
    }

    #[test]
    fn claims_are_final_fails_when_a_claim_changes_hands() {
        let before = healthy();
        let mut after = before.clone();
        let batch = after.batch.as_mut().expect("batch");
        let claimed = batch
            .micro_steps
            .values_mut()
            .find(|m| m.claimed_by.is_some())
            .expect("a claimed micro-step");
        claimed.claimed_by = Some(CellId(1));
        assert!(claims_are_final(&before, &after).is_err());
    }

    #[test]
    fn claims_are_final_fails_when_the_cursor_disagrees() {
        let mut state = SchedulerState::new();
        let mut micro_steps = BTreeMap::new();
        micro_steps.insert(
            MicroStepId(0),
            MicroStepState {
                group: GroupId(0),
                claimed_by: Some(CellId(0)),
                done: false,
            },
        );
        state.batch = Some(BatchState {
            step: StepId(0),
            opened_at: Timestamp::ZERO,
            groups: vec![GroupId(0)],
            micro_steps,
            group_claims: BTreeMap::new(),
            claimed_count: 0,
            stream_closed: false,
            join_window_closed: false,
            participants: Default::default(),
        });
        assert!(claims_are_final(&state, &state).is_err());
    }

    #[test]
    fn supply_timer_fails_when_running_without_supply() {
        let mut state = healthy();
        assert!(state.supply_holds());
        state.supply_ok_since = None;
        assert!(supply_timer_consistent(&state).is_err());
        let mut state = healthy();
        state.supply_ok_since = Some(state.now.plus(gyre_event::Duration::from_secs(1)));
        assert!(supply_timer_consistent(&state).is_err());
    }

    #[test]
    fn dispatch_only_at_boundaries_fails_for_extra_groups() {
        let mut state = healthy();
        state.dispatched += 1;
        assert!(dispatch_only_at_boundaries(&state).is_err());
        let mut state = healthy();
        state.executions.remove(&ExecutionId(0));
        state.dispatch_owed_groups += 1;
        assert!(dispatch_only_at_boundaries(&state).is_err());
    }
}
