//! The scheduler projection: a deterministic fold of the event log.
//!
//! Everything the controller needs is here: counters d, p, f (in executions), cell roles and
//! transitions, engine occupancy and routes, groups and their readiness, the open batch with its
//! micro-steps, burst progress and the supply-check timer. `apply` never panics on a committed
//! event; an event that makes no sense is returned as an [`ApplyError`] and leaves the state
//! unchanged. `validate` checks every invariant and is called after every apply in tests and in
//! the simulator.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

use gyre_event::{
    CellId, CloseStatus, ConsumedGroup, EngineId, Event, EventBody, ExecutionId, GroupId,
    MicroStepId, PolicyVersion, QueryId, Role, RunConfig, SchedulingMode, StepId, Timestamp,
};

use crate::ApplyError;

/// One elastic cell.
#[derive(Clone, Debug, PartialEq)]
pub struct CellState {
    pub id: CellId,
    pub nodes: u32,
    /// C_e of this cell.
    pub rollout_capacity: u32,
    pub engine: EngineId,
    pub role: Role,
    /// Set while a transition is under way (between `TransitionBegun` and `TransitionCompleted`).
    pub switching_to: Option<Role>,
    pub role_since: Timestamp,
}

impl CellState {
    /// True when the cell counts towards k(t): in training or switching in either direction.
    pub fn out_of_rollout(&self) -> bool {
        self.role == Role::Training || self.switching_to.is_some()
    }
}

/// One rollout engine (a cell's engine or a standalone engine).
#[derive(Clone, Debug, PartialEq)]
pub struct EngineState {
    pub id: EngineId,
    pub capacity: u32,
    pub cell: Option<CellId>,
    pub ready: bool,
    pub accepting: bool,
    pub running: BTreeSet<ExecutionId>,
}

impl EngineState {
    pub fn serving(&self) -> bool {
        self.ready && self.accepting
    }

    pub fn free(&self) -> u32 {
        self.capacity.saturating_sub(self.running.len() as u32)
    }
}

/// How an execution's result stands for its group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// No designated valid result yet (evaluation pending or not yet requested).
    Pending,
    /// A valid evaluation result is designated.
    Valid,
    /// A zero-reward dummy stands in for a total failure.
    Dummy,
    /// Excluded from training (for example, evaluation budget exhausted).
    Excluded,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ExecutionState {
    pub group: GroupId,
    pub engine: Option<EngineId>,
    pub closed: Option<CloseStatus>,
    pub resolution: Resolution,
}

#[derive(Clone, Debug, PartialEq)]
pub struct GroupState {
    pub id: GroupId,
    pub query: QueryId,
    /// v_d: latest published version when the group was accepted.
    pub dispatched_version: PolicyVersion,
    pub size: u32,
    pub started: u32,
    pub closed: u32,
    pub resolved: u32,
    pub packed_into: Option<StepId>,
}

impl GroupState {
    /// A group is ready once all N executions closed and each has a designated result.
    pub fn ready(&self) -> bool {
        self.closed == self.size && self.resolved == self.size
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct MicroStepState {
    pub group: GroupId,
    pub claimed_by: Option<CellId>,
    pub done: bool,
}

/// The batch of the step now being assembled and trained.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchState {
    pub step: StepId,
    pub opened_at: Timestamp,
    pub groups: Vec<GroupId>,
    pub micro_steps: BTreeMap<MicroStepId, MicroStepState>,
    /// Per packed group: (micro-steps enqueued, micro-steps claimed).
    pub group_claims: BTreeMap<GroupId, (u32, u32)>,
    /// Micro-steps claimed so far (claims are monotone, so this is a cursor too).
    pub claimed_count: u32,
    pub stream_closed: bool,
    pub join_window_closed: bool,
    /// Cells that claimed at least one micro-step of this batch.
    pub participants: BTreeSet<CellId>,
}

impl BatchState {
    pub fn all_claimed(&self) -> bool {
        self.claimed_count as usize == self.micro_steps.len()
    }

    pub fn all_done(&self) -> bool {
        self.micro_steps.values().all(|m| m.done)
    }

    /// Groups whose every micro-step is claimed.
    pub fn fully_claimed_groups(&self) -> usize {
        self.group_claims
            .values()
            .filter(|(total, claimed)| claimed == total)
            .count()
    }
}

/// The staleness of one consumed group, kept for the Theorem A.1 check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StalenessRecord {
    pub step: StepId,
    pub group: GroupId,
    pub staleness: u64,
}

/// The scheduler projection.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SchedulerState {
    pub config: Option<RunConfig>,
    pub now: Timestamp,
    pub events_applied: u64,
    pub cells: Vec<CellState>,
    pub engines: BTreeMap<EngineId, EngineState>,
    /// d: executions dispatched into the rollout queue.
    pub dispatched: u64,
    /// p: executions started.
    pub started: u64,
    /// f: executions terminated, whatever the status.
    pub finished: u64,
    pub groups: BTreeMap<GroupId, GroupState>,
    pub executions: BTreeMap<ExecutionId, ExecutionState>,
    /// Groups with executions still to start, in dispatch order.
    pub start_queue: VecDeque<GroupId>,
    /// Ready groups not yet packed, ordered for the packer: oldest policy version first.
    pub ready_unpacked: BTreeSet<(PolicyVersion, GroupId)>,
    pub next_group: u64,
    pub next_execution: u64,
    pub next_micro_step: u64,
    /// Groups owed to the rollout queue (initial dispatch, then μ·B after each publish).
    pub dispatch_owed_groups: u64,
    pub initial_dispatch_done: bool,
    /// After a publish the core decides (eq (3)) whether it stays in training.
    pub core_decision_pending: bool,
    /// v_t: training version (optimizer steps taken).
    pub training_version: PolicyVersion,
    pub published_version: PolicyVersion,
    pub burst: u64,
    pub steps_in_burst: u32,
    pub burst_end_pending: bool,
    pub awaiting_publish: bool,
    pub batch: Option<BatchState>,
    /// When the supply check last started holding continuously (None while it does not hold).
    pub supply_ok_since: Option<Timestamp>,
    pub staleness: Vec<StalenessRecord>,
    pub rejected_claims: u64,
    pub run_complete: bool,
}

impl SchedulerState {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn config(&self) -> Option<&RunConfig> {
        self.config.as_ref()
    }

    /// Queued executions: d − p.
    pub fn queued(&self) -> u64 {
        self.dispatched - self.started
    }

    /// Running executions: p − f.
    pub fn running(&self) -> u64 {
        self.started - self.finished
    }

    /// Water level w = d − f.
    pub fn water_level(&self) -> u64 {
        self.dispatched - self.finished
    }

    /// k(t): cells out of rollout (training or switching).
    pub fn training_cells(&self) -> usize {
        self.cells.iter().filter(|c| c.out_of_rollout()).count()
    }

    /// C_s: capacity of the standalone pool.
    pub fn standalone_capacity(&self) -> u64 {
        self.engines
            .values()
            .filter(|e| e.cell.is_none())
            .map(|e| e.capacity as u64)
            .sum()
    }

    /// eq (1): C_R(t) = C_s + Σ C_e over cells in rollout role. Only engines that are ready and
    /// accepting count, so an engine that is down or switching is not capacity.
    pub fn rollout_capacity(&self) -> u64 {
        self.engines
            .values()
            .filter(|e| e.serving())
            .map(|e| e.capacity as u64)
            .sum()
    }

    pub fn transition_in_progress(&self) -> bool {
        self.cells.iter().any(|c| c.switching_to.is_some())
    }

    /// Optimizer steps in the current burst: μ, or fewer in the last burst of a run of `steps`
    /// that is not a multiple of μ (what the publish before it dispatched groups for, see
    /// `RunConfig::burst_dispatch_groups_after`).
    pub fn burst_steps(&self) -> u32 {
        let Some(config) = &self.config else { return 0 };
        if config.steps == 0 {
            return config.mu;
        }
        let burst_start = self
            .training_version
            .get()
            .saturating_sub(self.steps_in_burst as u64);
        let left = (config.steps as u64).saturating_sub(burst_start);
        config.mu.min(u32::try_from(left).unwrap_or(u32::MAX))
    }

    /// Groups the rest of the current burst still needs, counting the open batch's groups whose
    /// micro-steps are not all claimed: (steps of the burst − steps done in it)·B − fully
    /// claimed groups.
    pub fn burst_groups_needed(&self) -> u64 {
        let Some(config) = &self.config else { return 0 };
        let fully = self
            .batch
            .as_ref()
            .map(|b| b.fully_claimed_groups() as u64)
            .unwrap_or(0);
        let steps_left = self.burst_steps().saturating_sub(self.steps_in_burst) as u64;
        (steps_left * config.b as u64).saturating_sub(fully)
    }

    fn batch_groups_needed(&self) -> u64 {
        let Some(config) = &self.config else { return 0 };
        let fully = self
            .batch
            .as_ref()
            .map(|b| b.fully_claimed_groups() as u64)
            .unwrap_or(0);
        config.b as u64 - fully
    }

    /// The ready groups the supply check may count: ready and not fully claimed, capped at what
    /// training still needs. With streaming that is the current batch; without streaming the
    /// trainer waits for the whole burst's data (so minibatches can be shuffled across the burst,
    /// the paper's limitation of streaming), so the cap is the rest of the burst.
    pub fn supply_groups(&self) -> u64 {
        let Some(config) = &self.config else { return 0 };
        let in_batch_unclaimed = self
            .batch
            .as_ref()
            .map(|b| (b.groups.len() - b.fully_claimed_groups()) as u64)
            .unwrap_or(0);
        let available = self.ready_unpacked.len() as u64 + in_batch_unclaimed;
        let cap = if config.streaming {
            self.batch_groups_needed()
        } else {
            self.burst_groups_needed()
        };
        available.min(cap)
    }

    /// The supply threshold: ρ_min·B, but never more than the current batch still needs (so a
    /// nearly full batch cannot deadlock); without streaming, everything the burst still needs.
    pub fn supply_threshold(&self) -> u64 {
        let Some(config) = &self.config else {
            return u64::MAX;
        };
        if !config.streaming {
            return self.burst_groups_needed().max(1);
        }
        config
            .supply_groups_min()
            .min(self.batch_groups_needed())
            .max(1)
    }

    pub fn supply_holds(&self) -> bool {
        self.supply_groups() >= self.supply_threshold()
    }

    /// The group the packer should take next: ready, unpacked, oldest policy version first.
    pub fn next_group_to_pack(&self) -> Option<GroupId> {
        let batch = self.batch.as_ref()?;
        let config = self.config.as_ref()?;
        if batch.stream_closed || batch.groups.len() >= config.b as usize {
            return None;
        }
        self.ready_unpacked.iter().next().map(|(_, group)| *group)
    }

    /// The groups the open batch consumes with their staleness d = v_t − v_d, as the
    /// `OptimizerStepped` event must record them.
    pub fn batch_consumption(&self) -> Vec<ConsumedGroup> {
        let Some(batch) = &self.batch else {
            return Vec::new();
        };
        batch
            .groups
            .iter()
            .map(|group| {
                let v_d = self
                    .groups
                    .get(group)
                    .map(|g| g.dispatched_version)
                    .unwrap_or(PolicyVersion::INITIAL);
                ConsumedGroup {
                    group: *group,
                    staleness: self.training_version.get().saturating_sub(v_d.get()),
                }
            })
            .collect()
    }

    /// The next micro-step nobody has claimed, in id order.
    pub fn next_unclaimed_micro_step(&self) -> Option<MicroStepId> {
        let batch = self.batch.as_ref()?;
        batch
            .micro_steps
            .iter()
            .find(|(_, m)| m.claimed_by.is_none())
            .map(|(id, _)| *id)
    }

    /// Whether training cells may claim now: streaming claims any enqueued micro-step; without
    /// streaming the stream must be closed and the data of the rest of the burst must be ready
    /// too (the trainer shuffles minibatches across the whole burst).
    pub fn claims_open(&self) -> bool {
        let (Some(batch), Some(config)) = (&self.batch, &self.config) else {
            return false;
        };
        if self.awaiting_publish {
            return false;
        }
        if config.streaming {
            return true;
        }
        let later_steps = self.burst_steps().saturating_sub(self.steps_in_burst + 1) as u64;
        batch.stream_closed && self.ready_unpacked.len() as u64 >= later_steps * config.b as u64
    }

    /// Apply one committed event. On error the state is unchanged.
    pub fn apply(&mut self, event: &Event) -> Result<(), ApplyError> {
        let mut next = self.clone();
        next.apply_in_place(event)?;
        next.now = next.now.max(event.at);
        next.events_applied += 1;
        next.refresh_supply_timer(event.at);
        *self = next;
        Ok(())
    }

    /// Apply without copying the state first; much cheaper on large states. A refusal still
    /// leaves the state unchanged, because `apply_in_place` makes every check before its first
    /// change (`tests/it/atomic.rs`); `gyre-state` folds every event this way and relies on it.
    pub fn apply_unchecked(&mut self, event: &Event) -> Result<(), ApplyError> {
        self.apply_in_place(event)?;
        self.now = self.now.max(event.at);
        self.events_applied += 1;
        self.refresh_supply_timer(event.at);
        Ok(())
    }

    /// Starts the supply timer at `at` if the supply check now holds and it was not running,
    /// stops it if the check fails (what every fold does after its event).
    pub fn refresh_supply_timer(&mut self, at: Timestamp) {
        if self.supply_holds() {
            if self.supply_ok_since.is_none() {
                self.supply_ok_since = Some(at);
            }
        } else {
            self.supply_ok_since = None;
        }
    }

    fn reset_supply_timer(&mut self, at: Timestamp) {
        self.supply_ok_since = if self.supply_holds() { Some(at) } else { None };
    }

    fn config_or(&self, what: &'static str) -> Result<&RunConfig, ApplyError> {
        self.config.as_ref().ok_or(ApplyError::NotStarted(what))
    }

    /// Folds `event` into the projection. Every arm checks everything that can refuse the event
    /// before it changes anything (check, then mutate), so an `Err` leaves the state exactly as
    /// it was.
    fn apply_in_place(&mut self, event: &Event) -> Result<(), ApplyError> {
        let at = event.at;
        match &event.body {
            EventBody::RunStarted(config) => {
                if self.config.is_some() {
                    return Err(ApplyError::AlreadyStarted);
                }
                config
                    .validate()
                    .map_err(|error| ApplyError::Invalid(error.to_string()))?;
                self.dispatch_owed_groups = config.initial_dispatch_groups();
                self.config = Some(config.clone());
            }
            EventBody::CellRegistered {
                cell,
                rollout_capacity,
                nodes,
                engine,
            } => {
                let config = self.config_or("cell_registered")?;
                if cell.get() as usize != self.cells.len() {
                    return Err(ApplyError::Invalid(format!(
                        "cells must register in index order: expected cell{}, got {cell}",
                        self.cells.len()
                    )));
                }
                if self.engines.contains_key(engine) {
                    return Err(ApplyError::DuplicateEngine(*engine));
                }
                // Async: the first cells form the static training partition from the start.
                let role = if config.mode == SchedulingMode::Async
                    && cell.get() < config.async_training_cells
                {
                    Role::Training
                } else {
                    Role::Rollout
                };
                self.cells.push(CellState {
                    id: *cell,
                    nodes: *nodes,
                    rollout_capacity: *rollout_capacity,
                    engine: *engine,
                    role,
                    switching_to: None,
                    role_since: at,
                });
                self.engines.insert(
                    *engine,
                    EngineState {
                        id: *engine,
                        capacity: *rollout_capacity,
                        cell: Some(*cell),
                        ready: false,
                        accepting: role == Role::Rollout,
                        running: BTreeSet::new(),
                    },
                );
            }
            EventBody::StandalonePoolRegistered {
                engine,
                rollout_capacity,
                ..
            } => {
                self.config_or("standalone_pool_registered")?;
                if self.engines.contains_key(engine) {
                    return Err(ApplyError::DuplicateEngine(*engine));
                }
                self.engines.insert(
                    *engine,
                    EngineState {
                        id: *engine,
                        capacity: *rollout_capacity,
                        cell: None,
                        ready: false,
                        accepting: true,
                        running: BTreeSet::new(),
                    },
                );
            }
            EventBody::EngineReady { engine } => {
                let cell_role = self.engine_cell_role(*engine)?;
                let state = self
                    .engines
                    .get_mut(engine)
                    .ok_or(ApplyError::UnknownEngine(*engine))?;
                state.ready = true;
                state.accepting = cell_role.is_none_or(|role| role == Role::Rollout);
            }
            EventBody::EngineDown { engine, .. } => {
                let state = self
                    .engines
                    .get_mut(engine)
                    .ok_or(ApplyError::UnknownEngine(*engine))?;
                state.ready = false;
            }
            EventBody::GroupsDispatched {
                groups,
                executions_per_group,
                policy_version,
            } => {
                let config = self.config_or("groups_dispatched")?;
                if *executions_per_group != config.n {
                    return Err(ApplyError::Invalid(format!(
                        "groups dispatched with {executions_per_group} executions each, config n = {}",
                        config.n
                    )));
                }
                if groups.len() as u64 > self.dispatch_owed_groups {
                    return Err(ApplyError::Invalid(format!(
                        "{} groups dispatched but only {} are owed (boundary dispatch)",
                        groups.len(),
                        self.dispatch_owed_groups
                    )));
                }
                // Every id is checked before anything changes: a refusal leaves the state as
                // it was.
                for (offset, dispatched) in (0u64..).zip(groups) {
                    let expected = self.next_group.saturating_add(offset);
                    if dispatched.group.get() != expected {
                        return Err(ApplyError::Invalid(format!(
                            "group ids must be dispatched in order: expected g{expected}, got {}",
                            dispatched.group
                        )));
                    }
                }
                for dispatched in groups {
                    self.next_group += 1;
                    self.groups.insert(
                        dispatched.group,
                        GroupState {
                            id: dispatched.group,
                            query: dispatched.query,
                            dispatched_version: *policy_version,
                            size: *executions_per_group,
                            started: 0,
                            closed: 0,
                            resolved: 0,
                            packed_into: None,
                        },
                    );
                    self.start_queue.push_back(dispatched.group);
                    self.dispatched += *executions_per_group as u64;
                }
                self.dispatch_owed_groups -= groups.len() as u64;
                if !self.initial_dispatch_done {
                    self.initial_dispatch_done = true;
                } else {
                    self.core_decision_pending = false;
                }
            }
            EventBody::ExecutionStarted {
                execution,
                group,
                engine,
            } => {
                if self.executions.contains_key(execution) {
                    return Err(ApplyError::DuplicateExecution(*execution));
                }
                if execution.get() != self.next_execution {
                    return Err(ApplyError::Invalid(format!(
                        "execution ids must start in order: expected e{}, got {execution}",
                        self.next_execution
                    )));
                }
                if self.start_queue.front() != Some(group) {
                    return Err(ApplyError::NothingQueued(*group));
                }
                let engine_state = self
                    .engines
                    .get_mut(engine)
                    .ok_or(ApplyError::UnknownEngine(*engine))?;
                if !engine_state.serving() {
                    return Err(ApplyError::EngineNotAccepting(*engine));
                }
                if engine_state.free() == 0 {
                    return Err(ApplyError::EngineFull(*engine));
                }
                // The front of the start queue is always a known group; the lookup still comes
                // before any change so that even a broken invariant is refused atomically.
                let group_state = self
                    .groups
                    .get_mut(group)
                    .ok_or(ApplyError::UnknownGroup(*group))?;
                engine_state.running.insert(*execution);
                group_state.started += 1;
                if group_state.started == group_state.size {
                    self.start_queue.pop_front();
                }
                self.executions.insert(
                    *execution,
                    ExecutionState {
                        group: *group,
                        engine: Some(*engine),
                        closed: None,
                        resolution: Resolution::Pending,
                    },
                );
                self.next_execution += 1;
                self.started += 1;
            }
            EventBody::ExecutionClosed { execution, status } => {
                let state = self
                    .executions
                    .get_mut(execution)
                    .ok_or(ApplyError::UnknownExecution(*execution))?;
                if state.closed.is_some() {
                    return Err(ApplyError::ExecutionAlreadyClosed(*execution));
                }
                // A known execution's group is always known (the two are dropped together);
                // the lookup still comes before any change.
                let group = state.group;
                let group_state = self
                    .groups
                    .get_mut(&group)
                    .ok_or(ApplyError::UnknownGroup(group))?;
                state.closed = Some(*status);
                if let Some(engine) = state.engine.take() {
                    if let Some(engine_state) = self.engines.get_mut(&engine) {
                        engine_state.running.remove(execution);
                    }
                }
                self.finished += 1;
                group_state.closed += 1;
                self.note_if_ready(group);
            }
            EventBody::TransitionBegun { cell, to } => {
                let index = cell.get() as usize;
                let state = self
                    .cells
                    .get_mut(index)
                    .ok_or(ApplyError::UnknownCell(*cell))?;
                if state.switching_to.is_some() || state.role == *to {
                    return Err(ApplyError::TransitionConflict(*cell));
                }
                // A cell's engine registers with it; the lookup still comes before any change.
                let engine = state.engine;
                let engine_state = self
                    .engines
                    .get_mut(&engine)
                    .ok_or(ApplyError::UnknownEngine(engine))?;
                state.switching_to = Some(*to);
                // Step one of the role switch: the source stops accepting.
                engine_state.accepting = false;
            }
            EventBody::RoutesUpdated { source, moves } => {
                // The moves apply in order, each seeing the ones before it. They are played on
                // copies of the engines they touch, which replace the originals only once every
                // move passed: a refusal leaves every engine as it was.
                let mut touched: BTreeMap<EngineId, EngineState> = BTreeMap::new();
                for route in moves {
                    let from = Self::engine_copy(&self.engines, &mut touched, route.from)?;
                    if route.from != *source || !from.running.remove(&route.execution) {
                        return Err(ApplyError::WrongEngine {
                            execution: route.execution,
                            engine: route.from,
                        });
                    }
                    let to = Self::engine_copy(&self.engines, &mut touched, route.to)?;
                    if !to.serving() {
                        return Err(ApplyError::EngineNotAccepting(route.to));
                    }
                    if to.free() == 0 {
                        return Err(ApplyError::EngineFull(route.to));
                    }
                    to.running.insert(route.execution);
                }
                self.engines.extend(touched);
                for route in moves {
                    if let Some(state) = self.executions.get_mut(&route.execution) {
                        state.engine = Some(route.to);
                    }
                }
            }
            EventBody::TransitionCompleted { cell, role } => {
                let index = cell.get() as usize;
                let state = self
                    .cells
                    .get_mut(index)
                    .ok_or(ApplyError::UnknownCell(*cell))?;
                if state.switching_to != Some(*role) {
                    return Err(ApplyError::TransitionConflict(*cell));
                }
                // A cell's engine registers with it; the lookup still comes before any change.
                let engine = state.engine;
                let engine_state = self
                    .engines
                    .get_mut(&engine)
                    .ok_or(ApplyError::UnknownEngine(engine))?;
                state.switching_to = None;
                state.role = *role;
                state.role_since = at;
                match role {
                    Role::Rollout => {
                        engine_state.ready = true;
                        engine_state.accepting = true;
                    }
                    Role::Training => {
                        engine_state.ready = false;
                        engine_state.accepting = false;
                    }
                }
                self.reset_supply_timer(at);
            }
            EventBody::BatchOpened { step } => {
                self.config_or("batch_opened")?;
                if let Some(open) = &self.batch {
                    return Err(ApplyError::WrongStep {
                        expected: Some(open.step),
                        got: *step,
                    });
                }
                if step.get() != self.training_version.get() {
                    return Err(ApplyError::WrongStep {
                        expected: Some(StepId(self.training_version.get())),
                        got: *step,
                    });
                }
                self.batch = Some(BatchState {
                    step: *step,
                    opened_at: at,
                    groups: Vec::new(),
                    micro_steps: BTreeMap::new(),
                    group_claims: BTreeMap::new(),
                    claimed_count: 0,
                    stream_closed: false,
                    join_window_closed: false,
                    participants: BTreeSet::new(),
                });
                self.reset_supply_timer(at);
            }
            EventBody::MicroStepsEnqueued {
                step,
                group,
                micro_steps,
                closes_stream,
            } => {
                let b = self.config_or("micro_steps_enqueued")?.b as usize;
                let group_state = self
                    .groups
                    .get(group)
                    .ok_or(ApplyError::UnknownGroup(*group))?;
                if !group_state.ready() {
                    return Err(ApplyError::GroupNotReady(*group));
                }
                if group_state.packed_into.is_some() {
                    return Err(ApplyError::GroupAlreadyPacked(*group));
                }
                let version = group_state.dispatched_version;
                let batch = self.open_batch_mut(*step)?;
                if batch.stream_closed {
                    return Err(ApplyError::StreamClosed(*step));
                }
                if micro_steps.is_empty() {
                    return Err(ApplyError::Invalid(format!(
                        "group {group} enqueued with no micro-steps"
                    )));
                }
                let closes = batch.groups.len() + 1 == b;
                if closes != *closes_stream {
                    return Err(ApplyError::Invalid(format!(
                        "closes_stream = {closes_stream} but the batch would hold {} of {b} groups",
                        batch.groups.len() + 1
                    )));
                }
                // Every micro-step is checked (against the batch and the ones before it in this
                // event) before any is inserted: a refusal leaves the batch as it was.
                let mut seen = BTreeSet::new();
                for micro_step in micro_steps {
                    if batch.micro_steps.contains_key(micro_step) || !seen.insert(*micro_step) {
                        return Err(ApplyError::Invalid(format!(
                            "micro-step {micro_step} enqueued twice"
                        )));
                    }
                }
                for micro_step in micro_steps {
                    batch.micro_steps.insert(
                        *micro_step,
                        MicroStepState {
                            group: *group,
                            claimed_by: None,
                            done: false,
                        },
                    );
                }
                batch.groups.push(*group);
                batch
                    .group_claims
                    .insert(*group, (micro_steps.len() as u32, 0));
                batch.stream_closed = closes;
                let highest = micro_steps.iter().map(|m| m.get()).max().unwrap_or(0);
                self.next_micro_step = self.next_micro_step.max(highest + 1);
                self.ready_unpacked.remove(&(version, *group));
                if let Some(group_state) = self.groups.get_mut(group) {
                    group_state.packed_into = Some(*step);
                }
            }
            EventBody::MicroStepClaimed {
                step,
                micro_step,
                cell,
            } => {
                let is_training = self
                    .cells
                    .get(cell.get() as usize)
                    .ok_or(ApplyError::UnknownCell(*cell))?
                    .role
                    == Role::Training;
                if !is_training {
                    return Err(ApplyError::CellNotTraining(*cell));
                }
                let batch = self.open_batch_mut(*step)?;
                let state = batch
                    .micro_steps
                    .get_mut(micro_step)
                    .ok_or(ApplyError::UnknownMicroStep(*micro_step))?;
                if state.claimed_by.is_some() {
                    // Two cells raced for the same micro-step; the first committed claim wins and
                    // the later one is a recorded no-op.
                    self.rejected_claims += 1;
                } else {
                    state.claimed_by = Some(*cell);
                    let group = state.group;
                    batch.participants.insert(*cell);
                    batch.claimed_count += 1;
                    if let Some((_, claimed)) = batch.group_claims.get_mut(&group) {
                        *claimed += 1;
                    }
                }
            }
            EventBody::MicroStepDone {
                step,
                micro_step,
                cell,
            } => {
                let batch = self.open_batch_mut(*step)?;
                let state = batch
                    .micro_steps
                    .get_mut(micro_step)
                    .ok_or(ApplyError::UnknownMicroStep(*micro_step))?;
                if state.claimed_by != Some(*cell) {
                    return Err(ApplyError::MicroStepNotClaimedBy {
                        micro_step: *micro_step,
                        cell: *cell,
                    });
                }
                state.done = true;
            }
            EventBody::JoinWindowClosed { step } => {
                let batch = self.open_batch_mut(*step)?;
                batch.join_window_closed = true;
            }
            EventBody::OptimizerStepped {
                step,
                policy_version,
                consumed,
            } => {
                let config = self.config_or("optimizer_stepped")?.clone();
                let batch = self.batch.as_ref().ok_or(ApplyError::NoOpenBatch(*step))?;
                if batch.step != *step {
                    return Err(ApplyError::WrongStep {
                        expected: Some(batch.step),
                        got: *step,
                    });
                }
                if !(batch.stream_closed && batch.join_window_closed && batch.all_done()) {
                    return Err(ApplyError::BatchIncomplete(*step));
                }
                if *policy_version != self.training_version.next() {
                    return Err(ApplyError::Invalid(format!(
                        "optimizer step produced {policy_version}, expected {}",
                        self.training_version.next()
                    )));
                }
                if *consumed != self.batch_consumption() {
                    return Err(ApplyError::ConsumptionMismatch(*step));
                }
                for record in consumed {
                    self.staleness.push(StalenessRecord {
                        step: *step,
                        group: record.group,
                        staleness: record.staleness,
                    });
                    // A consumed group's executions are no longer needed by the scheduler.
                    if let Some(group) = self.groups.remove(&record.group) {
                        let _ = group;
                    }
                }
                self.executions
                    .retain(|_, execution| consumed.iter().all(|c| c.group != execution.group));
                self.training_version = *policy_version;
                self.batch = None;
                self.steps_in_burst += 1;
                if self.steps_in_burst >= config.mu {
                    self.burst_end_pending = true;
                }
                if config.steps > 0 && self.training_version.get() >= config.steps as u64 {
                    self.run_complete = true;
                }
            }
            EventBody::BurstEnded { burst } => {
                if !self.burst_end_pending || *burst != self.burst {
                    return Err(ApplyError::Invalid(format!(
                        "burst_ended for burst {burst} but burst {} is {}",
                        self.burst,
                        if self.burst_end_pending {
                            "ending"
                        } else {
                            "not complete"
                        }
                    )));
                }
                self.burst += 1;
                self.steps_in_burst = 0;
                self.burst_end_pending = false;
                self.awaiting_publish = true;
            }
            EventBody::WeightsPublished { policy_version, .. } => {
                let config = self.config_or("weights_published")?.clone();
                // Weights are published once per burst, after `BurstEnded`; a publish at any
                // other time would dispatch μ·B groups inside a burst.
                if !self.awaiting_publish {
                    return Err(ApplyError::Invalid(format!(
                        "published {policy_version} but no burst has ended awaiting a publish"
                    )));
                }
                if *policy_version != self.training_version {
                    return Err(ApplyError::Invalid(format!(
                        "published {policy_version} but the training version is {}",
                        self.training_version
                    )));
                }
                self.published_version = *policy_version;
                self.awaiting_publish = false;
                // μ·B groups feed the next burst's μ steps; when fewer steps remain (a run of
                // `steps` not a multiple of μ), only what they will consume, and nothing once
                // the run is complete: a rollout dispatched then would never be trained on.
                let owed = config.burst_dispatch_groups_after(policy_version.get());
                self.dispatch_owed_groups += owed;
                self.core_decision_pending = config.mode != SchedulingMode::Async && owed > 0;
            }
            // Resolutions are not this projection's to decide: `gyre-state` hands on each one
            // the scoring projection reaches (`SchedulerState::resolve`).
            EventBody::ModelCall(_)
            | EventBody::EvaluationRequested { .. }
            | EventBody::EvaluationCompleted { .. }
            | EventBody::DummyInserted { .. }
            | EventBody::ExecutionExcluded { .. }
            | EventBody::EvaluationFailed { .. }
            | EventBody::TrajectoriesAdmitted { .. }
            | EventBody::Tick
            | EventBody::ProjectionDigest { .. }
            | EventBody::ResponseStored(_) => {}
        }
        Ok(())
    }

    /// The copy in `touched` of engine `id`, taken from `engines` the first time it is asked
    /// for.
    fn engine_copy<'a>(
        engines: &BTreeMap<EngineId, EngineState>,
        touched: &'a mut BTreeMap<EngineId, EngineState>,
        id: EngineId,
    ) -> Result<&'a mut EngineState, ApplyError> {
        match touched.entry(id) {
            Entry::Occupied(copy) => Ok(copy.into_mut()),
            Entry::Vacant(slot) => {
                let engine = engines.get(&id).ok_or(ApplyError::UnknownEngine(id))?;
                Ok(slot.insert(engine.clone()))
            }
        }
    }

    fn engine_cell_role(&self, engine: EngineId) -> Result<Option<Role>, ApplyError> {
        let state = self
            .engines
            .get(&engine)
            .ok_or(ApplyError::UnknownEngine(engine))?;
        Ok(state
            .cell
            .and_then(|cell| self.cells.get(cell.get() as usize))
            .map(|cell| {
                if cell.switching_to.is_some() {
                    Role::Training
                } else {
                    cell.role
                }
            }))
    }

    /// Records the resolution the scoring projection reached for `execution` (the one
    /// authority on resolutions; `gyre-state` calls this the moment scoring resolves it). The
    /// first resolution stands: a later call for the same execution changes nothing. `Pending`
    /// is not a resolution and is refused. Call it before folding the event that resolved the
    /// execution (that fold refreshes the supply timer), or call
    /// [`SchedulerState::refresh_supply_timer`] after it.
    pub fn resolve(
        &mut self,
        execution: ExecutionId,
        resolution: Resolution,
    ) -> Result<(), ApplyError> {
        if resolution == Resolution::Pending {
            return Err(ApplyError::Invalid(format!(
                "{execution} resolved as pending"
            )));
        }
        let state = self
            .executions
            .get(&execution)
            .ok_or(ApplyError::UnknownExecution(execution))?;
        if state.resolution != Resolution::Pending {
            return Ok(());
        }
        let group = state.group;
        let group_state = self
            .groups
            .get_mut(&group)
            .ok_or(ApplyError::UnknownGroup(group))?;
        group_state.resolved += 1;
        if let Some(state) = self.executions.get_mut(&execution) {
            state.resolution = resolution;
        }
        self.note_if_ready(group);
        Ok(())
    }

    /// The bookkeeping of folding an event this projection does not track (time, count,
    /// supply timer), for a caller that cannot hand over the event itself.
    pub fn fold_untracked(&mut self, at: Timestamp) {
        self.now = self.now.max(at);
        self.events_applied += 1;
        self.refresh_supply_timer(at);
    }

    fn note_if_ready(&mut self, group: GroupId) {
        if let Some(state) = self.groups.get(&group) {
            if state.ready() && state.packed_into.is_none() {
                self.ready_unpacked
                    .insert((state.dispatched_version, group));
            }
        }
    }

    fn open_batch_mut(&mut self, step: StepId) -> Result<&mut BatchState, ApplyError> {
        let batch = self.batch.as_mut().ok_or(ApplyError::NoOpenBatch(step))?;
        if batch.step != step {
            return Err(ApplyError::WrongStep {
                expected: Some(batch.step),
                got: step,
            });
        }
        Ok(batch)
    }

    /// Check every invariant of the projection; returns the first violation.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.finished <= self.started && self.started <= self.dispatched) {
            return Err(format!(
                "counters out of order: d={} p={} f={}",
                self.dispatched, self.started, self.finished
            ));
        }
        let on_engines: u64 = self.engines.values().map(|e| e.running.len() as u64).sum();
        if on_engines != self.running() {
            return Err(format!(
                "{} executions on engines but p − f = {}",
                on_engines,
                self.running()
            ));
        }
        for engine in self.engines.values() {
            if engine.running.len() as u32 > engine.capacity {
                return Err(format!(
                    "{} runs {} executions over its capacity {}",
                    engine.id,
                    engine.running.len(),
                    engine.capacity
                ));
            }
        }
        let queued_in_groups: u64 = self
            .start_queue
            .iter()
            .filter_map(|g| self.groups.get(g))
            .map(|g| (g.size - g.started) as u64)
            .sum();
        if queued_in_groups != self.queued() {
            return Err(format!(
                "start queue holds {queued_in_groups} executions but d − p = {}",
                self.queued()
            ));
        }
        if let Some(config) = &self.config {
            // The training set (cells training and staying, or joining) is always a prefix of
            // the cell order. Cells returning to rollout at a burst end may finish in any order.
            let out: Vec<bool> = self
                .cells
                .iter()
                .map(|c| match c.switching_to {
                    Some(to) => to == Role::Training,
                    None => c.role == Role::Training,
                })
                .collect();
            if let Some(first_in) = out.iter().position(|o| !o) {
                if out[first_in..].iter().any(|o| *o) {
                    return Err(format!("cells out of rollout are not a prefix: {out:?}"));
                }
            }
            let joining = self
                .cells
                .iter()
                .filter(|c| c.switching_to == Some(Role::Training))
                .count();
            if joining > 1 {
                return Err(format!("{joining} cells switching to training at once"));
            }
            if let Some(batch) = &self.batch {
                if batch.groups.len() > config.b as usize {
                    return Err(format!(
                        "batch {} holds {} groups, more than b = {}",
                        batch.step,
                        batch.groups.len(),
                        config.b
                    ));
                }
                if batch
                    .micro_steps
                    .values()
                    .any(|m| m.done && m.claimed_by.is_none())
                {
                    return Err("a micro-step is done but unclaimed".to_string());
                }
            }
            if self.steps_in_burst > config.mu {
                return Err(format!(
                    "{} steps in a burst of μ = {}",
                    self.steps_in_burst, config.mu
                ));
            }
        }
        for (version, group) in &self.ready_unpacked {
            match self.groups.get(group) {
                Some(state) if state.ready() && state.packed_into.is_none() => {
                    if state.dispatched_version != *version {
                        return Err(format!("{group} filed under the wrong version"));
                    }
                }
                _ => return Err(format!("{group} listed as ready-unpacked but is not")),
            }
        }
        Ok(())
    }
}
