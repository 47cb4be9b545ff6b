//! Every refusal of `apply_unchecked` leaves the projection exactly as it was.
//!
//! `gyre-state` folds each event into the scheduler without a copy and relies on a refused event
//! being a no-op for the whole state. From states the random runtime of `properties.rs` reaches,
//! hostile events of every kind the scheduler folds are built against the state, most of them
//! near misses (the id after the next one, a known engine that is full or down, a legal route
//! move followed by a wrong one, a micro-step enqueued twice in one event, a consumption with a
//! group dropped), some with arbitrary ids. Each goes through `apply_unchecked`: after a refusal
//! the state and its digest are unchanged, and the copying `apply` agrees on the outcome and the
//! state. An accepted probe is undone, so the runtime goes on from its own log. The refusals
//! that only a broken internal invariant can cause are checked on states broken by hand.

use gyre_event::{
    CellId, CloseStatus, ConsumedGroup, DispatchedGroup, Duration, EngineId, Event, EventBody,
    ExecutionId, GroupId, MicroStepId, PolicyVersion, QueryId, Role, RouteMove, SchedulingMode,
    StepId, Timestamp,
};
use gyre_scheduler::{ApplyError, Resolution, SchedulerState};
use proptest::prelude::*;

use crate::properties::{action, setup, Action, Runtime, Setup};

/// Every kind of event the scheduler folds with a check that can refuse it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    RunStarted,
    CellRegistered,
    StandalonePoolRegistered,
    EngineReady,
    EngineDown,
    GroupsDispatched,
    ExecutionStarted,
    ExecutionClosed,
    TransitionBegun,
    TransitionCompleted,
    RoutesUpdated,
    BatchOpened,
    MicroStepsEnqueued,
    MicroStepClaimed,
    MicroStepDone,
    JoinWindowClosed,
    OptimizerStepped,
    BurstEnded,
    WeightsPublished,
}

impl Kind {
    const ALL: [Kind; 19] = [
        Kind::RunStarted,
        Kind::CellRegistered,
        Kind::StandalonePoolRegistered,
        Kind::EngineReady,
        Kind::EngineDown,
        Kind::GroupsDispatched,
        Kind::ExecutionStarted,
        Kind::ExecutionClosed,
        Kind::TransitionBegun,
        Kind::TransitionCompleted,
        Kind::RoutesUpdated,
        Kind::BatchOpened,
        Kind::MicroStepsEnqueued,
        Kind::MicroStepClaimed,
        Kind::MicroStepDone,
        Kind::JoinWindowClosed,
        Kind::OptimizerStepped,
        Kind::BurstEnded,
        Kind::WeightsPublished,
    ];
}

/// One hostile event: its kind and the choices that shape it against the state. Choice 0 is
/// the most legal option everywhere, so shrinking heads for the nearest miss.
#[derive(Clone, Debug)]
struct Probe {
    kind: Kind,
    choices: Vec<u16>,
}

fn probe() -> impl Strategy<Value = Probe> {
    (
        prop::sample::select(Kind::ALL.to_vec()),
        prop::collection::vec(any::<u16>(), 1..16),
    )
        .prop_map(|(kind, choices)| Probe { kind, choices })
}

#[derive(Clone, Debug)]
enum Step {
    /// One action of the random runtime.
    Act(Action),
    /// Up to `rounds` cooperative rounds of the runtime, ending where `stop` says.
    Ripen {
        rounds: u8,
        stop: Stop,
    },
    Probe(Probe),
}

/// Where a stretch of cooperative rounds ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    /// Groups ready, the last round's packing not done.
    BeforePacking,
    /// Micro-steps claimed and done, the optimizer step not taken.
    BeforeOptimizer,
    /// After the optimizer step and a publish, before the controller dispatches what is owed.
    AfterPublish,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => action().prop_map(Step::Act),
        2 => (
            1u8..=4,
            prop::sample::select(vec![Stop::BeforePacking, Stop::BeforeOptimizer, Stop::AfterPublish]),
        )
            .prop_map(|(rounds, stop)| Step::Ripen { rounds, stop }),
        12 => probe().prop_map(Step::Probe),
    ]
}

fn batch_complete(state: &SchedulerState) -> bool {
    state
        .batch
        .as_ref()
        .is_some_and(|b| b.stream_closed && b.join_window_closed && b.all_done())
}

/// Cooperative rounds (engines back, closes, resolutions, packing, claims, dones, decisions),
/// so that probes meet ready groups, complete batches and owed dispatches more often than
/// random actions alone reach them.
fn ripen(runtime: &mut Runtime, rounds: u8, stop: Stop) {
    for round in 0..rounds {
        if batch_complete(&runtime.state) {
            break;
        }
        for index in 0..4 {
            runtime.act(&Action::EngineReady(index));
        }
        runtime.act(&Action::CompleteTransition(0));
        let state = &runtime.state;
        let open = state
            .executions
            .values()
            .filter(|e| e.closed.is_none())
            .count();
        let pending = state
            .executions
            .values()
            .filter(|e| e.resolution == Resolution::Pending)
            .count();
        // `Close(28, _)` closes with `Completed` and resolves with a valid evaluation.
        for _ in 0..open {
            runtime.act(&Action::Close(28, 0));
        }
        for _ in 0..pending {
            runtime.act(&Action::Resolve(0, 0));
        }
        if stop == Stop::BeforePacking && round + 1 == rounds {
            return;
        }
        runtime.act(&Action::Pack(3));
        let micro_steps = runtime
            .state
            .batch
            .as_ref()
            .map_or(0, |b| b.micro_steps.len());
        for _ in 0..micro_steps {
            runtime.act(&Action::Claim(0, false));
            runtime.act(&Action::Done(0));
        }
        runtime.act(&Action::Tick(5));
    }
    if stop == Stop::AfterPublish {
        // The controller ends the burst (if this step ends it); `Publish` acts only then.
        runtime.act(&Action::Optimizer);
        runtime.act(&Action::Decide);
        runtime.act(&Action::Publish);
    }
}

/// Hands out the probe's choices in turn (cycling), each reduced to a range.
struct Chooser<'a> {
    choices: &'a [u16],
    next: usize,
}

impl<'a> Chooser<'a> {
    fn new(choices: &'a [u16]) -> Self {
        Self { choices, next: 0 }
    }

    /// A number in `0..count`.
    fn choose(&mut self, count: usize) -> usize {
        let choice = self.choices[self.next % self.choices.len()];
        self.next += 1;
        choice as usize % count.max(1)
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> Option<T> {
        let index = self.choose(items.len());
        items.get(index).copied()
    }

    /// `value` itself most often, otherwise just off it or an arbitrary small number.
    fn near(&mut self, value: u64) -> u64 {
        match self.choose(7) {
            0..=2 => value,
            3 => value + 1,
            4 => value.saturating_sub(1),
            5 => value + 2 + self.choose(4) as u64,
            _ => self.choose(32) as u64,
        }
    }

    fn engine(&mut self, state: &SchedulerState) -> EngineId {
        let known: Vec<EngineId> = state.engines.keys().copied().collect();
        let unknown = known.last().map_or(0, |last| last.get() + 1);
        match self.choose(6) {
            0..=3 => self.pick(&known).unwrap_or(EngineId(unknown)),
            4 => EngineId(unknown),
            _ => EngineId(self.choose(128) as u32),
        }
    }

    fn cell(&mut self, state: &SchedulerState) -> CellId {
        let count = state.cells.len() as u32;
        match self.choose(6) {
            0..=3 => CellId(self.choose(count as usize) as u32),
            4 => CellId(count),
            _ => CellId(self.choose(16) as u32),
        }
    }

    fn training_cell(&mut self, state: &SchedulerState) -> CellId {
        let training: Vec<CellId> = state
            .cells
            .iter()
            .filter(|c| c.role == Role::Training)
            .map(|c| c.id)
            .collect();
        match self.choose(3) {
            0 | 1 => self.pick(&training).unwrap_or(CellId(0)),
            _ => self.cell(state),
        }
    }

    fn role(&mut self) -> Role {
        [Role::Rollout, Role::Training][self.choose(2)]
    }

    fn execution(&mut self, state: &SchedulerState) -> ExecutionId {
        let known: Vec<ExecutionId> = state.executions.keys().copied().collect();
        match self.choose(5) {
            0..=2 => self
                .pick(&known)
                .unwrap_or(ExecutionId(state.next_execution)),
            3 => ExecutionId(self.near(state.next_execution)),
            _ => ExecutionId(self.choose(256) as u64),
        }
    }

    fn group(&mut self, state: &SchedulerState) -> GroupId {
        let known: Vec<GroupId> = state.groups.keys().copied().collect();
        match self.choose(5) {
            0..=2 => self.pick(&known).unwrap_or(GroupId(state.next_group)),
            3 => GroupId(self.near(state.next_group)),
            _ => GroupId(self.choose(64) as u64),
        }
    }

    fn step_id(&mut self, state: &SchedulerState) -> StepId {
        let current = state
            .batch
            .as_ref()
            .map_or(state.training_version.get(), |b| b.step.get());
        match self.choose(4) {
            0..=2 => StepId(current),
            _ => StepId(self.near(current)),
        }
    }

    fn micro_step(&mut self, state: &SchedulerState) -> MicroStepId {
        let known: Vec<MicroStepId> = state
            .batch
            .as_ref()
            .map(|b| b.micro_steps.keys().copied().collect())
            .unwrap_or_default();
        match self.choose(5) {
            0..=3 => self
                .pick(&known)
                .unwrap_or(MicroStepId(state.next_micro_step)),
            _ => MicroStepId(self.near(state.next_micro_step)),
        }
    }

    fn version(&mut self, value: PolicyVersion) -> PolicyVersion {
        PolicyVersion(self.near(value.get()))
    }
}

/// The hostile event `probe` describes, built against `state`.
fn build(probe: &Probe, state: &SchedulerState) -> EventBody {
    let mut chooser = Chooser::new(&probe.choices);
    let c = &mut chooser;
    let config = state.config().expect("the runtime started the run");
    match probe.kind {
        Kind::RunStarted => EventBody::RunStarted(config.clone()),
        Kind::CellRegistered => EventBody::CellRegistered {
            cell: CellId(c.near(state.cells.len() as u64) as u32),
            rollout_capacity: 1 + c.choose(4) as u32,
            nodes: 1,
            engine: c.engine(state),
        },
        Kind::StandalonePoolRegistered => EventBody::StandalonePoolRegistered {
            engine: c.engine(state),
            rollout_capacity: 1 + c.choose(4) as u32,
            nodes: 1,
        },
        Kind::EngineReady => EventBody::EngineReady {
            engine: c.engine(state),
        },
        Kind::EngineDown => EventBody::EngineDown {
            engine: c.engine(state),
            reason: "hostile".into(),
        },
        Kind::GroupsDispatched => {
            let owed = state.dispatch_owed_groups as usize;
            let count = match c.choose(3) {
                0 | 1 => owed.min(2 + c.choose(3)),
                _ => c.choose(owed + 3),
            };
            let first = c.near(state.next_group);
            let mut groups: Vec<DispatchedGroup> = (first..first + count as u64)
                .map(|id| DispatchedGroup {
                    group: GroupId(id),
                    query: QueryId(id),
                })
                .collect();
            // Out of order half way: a gap or a repeat after some good ids.
            if groups.len() >= 2 && c.choose(2) == 1 {
                let at = 1 + c.choose(groups.len() - 1);
                let id = groups[at].group.get();
                groups[at].group = GroupId([id + 1, id.saturating_sub(1)][c.choose(2)]);
            }
            EventBody::GroupsDispatched {
                groups,
                executions_per_group: [config.n, config.n + 1][c.choose(4) / 3],
                policy_version: state.published_version,
            }
        }
        Kind::ExecutionStarted => {
            let execution = match c.choose(4) {
                0 | 1 => ExecutionId(state.next_execution),
                _ => c.execution(state),
            };
            let group = match c.choose(4) {
                0 | 1 => state
                    .start_queue
                    .front()
                    .copied()
                    .unwrap_or(GroupId(state.next_group)),
                _ => c.group(state),
            };
            EventBody::ExecutionStarted {
                execution,
                group,
                engine: c.engine(state),
            }
        }
        Kind::ExecutionClosed => EventBody::ExecutionClosed {
            execution: c.execution(state),
            status: CloseStatus::ALL[c.choose(CloseStatus::ALL.len())],
        },
        Kind::TransitionBegun => EventBody::TransitionBegun {
            cell: c.cell(state),
            to: c.role(),
        },
        Kind::TransitionCompleted => {
            let switching: Vec<(CellId, Role)> = state
                .cells
                .iter()
                .filter_map(|cell| cell.switching_to.map(|to| (cell.id, to)))
                .collect();
            let (cell, role) = match (c.choose(3), c.pick(&switching)) {
                (0, Some(legal)) => legal,
                _ => (c.cell(state), c.role()),
            };
            EventBody::TransitionCompleted { cell, role }
        }
        Kind::RoutesUpdated => {
            let busy: Vec<EngineId> = state
                .engines
                .values()
                .filter(|e| !e.running.is_empty())
                .map(|e| e.id)
                .collect();
            let source = match c.choose(4) {
                0..=2 => c.pick(&busy).unwrap_or(EngineId(0)),
                _ => c.engine(state),
            };
            let on_source: Vec<ExecutionId> = state
                .engines
                .get(&source)
                .map(|e| e.running.iter().copied().collect())
                .unwrap_or_default();
            let moves = (0..1 + c.choose(4))
                .map(|_| {
                    let execution = match c.choose(5) {
                        0..=3 => c.pick(&on_source).unwrap_or_else(|| c.execution(state)),
                        _ => c.execution(state),
                    };
                    let from = match c.choose(5) {
                        0..=3 => source,
                        _ => c.engine(state),
                    };
                    RouteMove {
                        execution,
                        from,
                        to: c.engine(state),
                    }
                })
                .collect();
            EventBody::RoutesUpdated { source, moves }
        }
        Kind::BatchOpened => EventBody::BatchOpened {
            step: StepId(c.near(state.training_version.get())),
        },
        Kind::MicroStepsEnqueued => {
            let step = c.step_id(state);
            let ready: Vec<GroupId> = state.ready_unpacked.iter().map(|(_, g)| *g).collect();
            let group = match c.choose(5) {
                0 | 1 => state
                    .next_group_to_pack()
                    .unwrap_or(GroupId(state.next_group)),
                2 => c.pick(&ready).unwrap_or(GroupId(state.next_group)),
                _ => c.group(state),
            };
            let first = c.near(state.next_micro_step);
            let count = [1, 2, 3, 0][c.choose(4)];
            let mut micro_steps: Vec<MicroStepId> =
                (first..first + count).map(MicroStepId).collect();
            // Enqueued twice: one already in the batch, or one repeated in this event.
            match c.choose(3) {
                1 => micro_steps.push(c.micro_step(state)),
                2 => {
                    if let Some(repeat) = micro_steps.first().copied() {
                        micro_steps.push(repeat);
                    }
                }
                _ => {}
            }
            let closes = state
                .batch
                .as_ref()
                .is_some_and(|b| b.groups.len() + 1 == config.b as usize);
            EventBody::MicroStepsEnqueued {
                step,
                group,
                micro_steps,
                closes_stream: closes != (c.choose(4) == 3),
            }
        }
        Kind::MicroStepClaimed => EventBody::MicroStepClaimed {
            step: c.step_id(state),
            micro_step: c.micro_step(state),
            cell: c.training_cell(state),
        },
        Kind::MicroStepDone => {
            let step = c.step_id(state);
            let micro_step = c.micro_step(state);
            let owner = state
                .batch
                .as_ref()
                .and_then(|b| b.micro_steps.get(&micro_step))
                .and_then(|m| m.claimed_by);
            let cell = match (c.choose(3), owner) {
                (0, Some(owner)) => owner,
                _ => c.training_cell(state),
            };
            EventBody::MicroStepDone {
                step,
                micro_step,
                cell,
            }
        }
        Kind::JoinWindowClosed => EventBody::JoinWindowClosed {
            step: c.step_id(state),
        },
        Kind::OptimizerStepped => {
            let mut consumed = state.batch_consumption();
            match c.choose(5) {
                2 => {
                    consumed.pop();
                }
                3 if !consumed.is_empty() => {
                    let at = c.choose(consumed.len());
                    consumed[at].staleness += 1;
                }
                4 => consumed.push(ConsumedGroup {
                    group: c.group(state),
                    staleness: 0,
                }),
                _ => {}
            }
            EventBody::OptimizerStepped {
                step: c.step_id(state),
                policy_version: c.version(state.training_version.next()),
                consumed,
            }
        }
        Kind::BurstEnded => EventBody::BurstEnded {
            burst: c.near(state.burst),
        },
        Kind::WeightsPublished => EventBody::WeightsPublished {
            policy_version: c.version(state.training_version),
            took: Duration::from_secs(1),
        },
    }
}

/// What one probe did.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Refused,
    Accepted,
}

/// Applies `body` to `state` with `apply_unchecked`; a refusal must leave the state and its
/// digest unchanged, and the copying `apply` must agree. An accepted probe is undone.
fn check_probe(state: &mut SchedulerState, body: EventBody) -> Result<Outcome, String> {
    let event = Event::new(Timestamp(state.now.0 + 1), body);
    let before = state.clone();
    let digest = state.digest();
    let mut checked = before.clone();
    let checked_result = checked.apply(&event);
    let result = state.apply_unchecked(&event);
    if result != checked_result {
        return Err(format!(
            "apply_unchecked gave {result:?} but apply {checked_result:?} for {:?}",
            event.body
        ));
    }
    match result {
        Err(error) => {
            if *state != before || state.digest() != digest {
                return Err(format!(
                    "refused {:?} ({error}) but the state changed",
                    event.body
                ));
            }
            Ok(Outcome::Refused)
        }
        Ok(()) => {
            if *state != checked {
                return Err(format!(
                    "apply and apply_unchecked reached different states on {:?}",
                    event.body
                ));
            }
            *state = before;
            Ok(Outcome::Accepted)
        }
    }
}

fn reached_state(setup: &Setup, actions: &[Action]) -> Runtime {
    let mut runtime = Runtime::new(setup);
    for action in actions {
        runtime.act(action);
    }
    runtime
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Hostile probes interleaved with the random runtime's actions: every refusal is a no-op.
    /// At the end every kind is probed once more from the state reached.
    #[test]
    fn refused_events_leave_the_state_unchanged(
        setup in setup(),
        before in prop::collection::vec(action(), 0..100),
        steps in prop::collection::vec(step(), 1..120),
        last in prop::collection::vec(any::<u16>(), 1..8),
    ) {
        let mut runtime = reached_state(&setup, &before);
        let mut refused = 0usize;
        let last_probes: Vec<Step> = Kind::ALL
            .iter()
            .map(|kind| Step::Probe(Probe { kind: *kind, choices: last.clone() }))
            .collect();
        for step in steps.iter().chain(&last_probes) {
            match step {
                Step::Act(action) => runtime.act(action),
                Step::Ripen { rounds, stop } => ripen(&mut runtime, *rounds, *stop),
                Step::Probe(probe) => {
                    let body = build(probe, &runtime.state);
                    match check_probe(&mut runtime.state, body) {
                        Ok(Outcome::Refused) => refused += 1,
                        Ok(Outcome::Accepted) => {}
                        Err(failure) => prop_assert!(false, "{}", failure),
                    }
                }
            }
        }
        // `RunStarted` is always refused once the run started.
        prop_assert!(refused >= 1);
    }
}

/// The arms whose last lookup guards an internal invariant (an execution's group, the group at
/// the front of the start queue, a cell's engine) make it before they change anything too:
/// with the invariant broken by hand, the refusal leaves the state and its digest unchanged.
#[test]
fn refusals_on_broken_invariants_change_nothing() {
    let setup = Setup {
        mode: SchedulingMode::Elastic,
        streaming: true,
        phi_groups: 0,
        mu: 1,
        n: 2,
        b: 1,
        rho_min: 0.5,
        tau_s: 0,
        cells: 2,
        capacity: 2,
        standalone: 8,
        async_cells: 1,
    };
    let reached = Runtime::new(&setup).state;
    let refuse = |broken: &SchedulerState, body: EventBody, expected: ApplyError| {
        let mut state = broken.clone();
        let digest = state.digest();
        let event = Event::new(Timestamp(state.now.0 + 1), body);
        assert_eq!(
            state.apply_unchecked(&event),
            Err(expected),
            "{:?}",
            event.body
        );
        assert!(
            state == *broken,
            "refused {:?} but the state changed",
            event.body
        );
        assert_eq!(state.digest(), digest);
    };

    // A running execution whose group is gone.
    let (execution, group) = reached
        .executions
        .iter()
        .find(|(_, e)| e.closed.is_none())
        .map(|(id, e)| (*id, e.group))
        .expect("the runtime started executions");
    let mut broken = reached.clone();
    broken.groups.remove(&group);
    refuse(
        &broken,
        EventBody::ExecutionClosed {
            execution,
            status: CloseStatus::Completed,
        },
        ApplyError::UnknownGroup(group),
    );

    // A start queue whose front group is unknown, started on an engine with room.
    let engine = reached
        .engines
        .values()
        .find(|e| e.serving() && e.free() > 0)
        .map(|e| e.id)
        .expect("the standalone pool has room");
    let unknown = GroupId(reached.next_group);
    let mut broken = reached.clone();
    broken.start_queue.push_front(unknown);
    refuse(
        &broken,
        EventBody::ExecutionStarted {
            execution: ExecutionId(reached.next_execution),
            group: unknown,
            engine,
        },
        ApplyError::UnknownGroup(unknown),
    );

    // A cell in rollout whose engine is gone begins and completes a switch.
    let cell = reached
        .cells
        .iter()
        .find(|c| c.role == Role::Rollout && c.switching_to.is_none())
        .expect("a cell is in rollout")
        .clone();
    let mut broken = reached.clone();
    broken.engines.remove(&cell.engine);
    refuse(
        &broken,
        EventBody::TransitionBegun {
            cell: cell.id,
            to: Role::Training,
        },
        ApplyError::UnknownEngine(cell.engine),
    );
    broken.cells[cell.id.get() as usize].switching_to = Some(Role::Training);
    refuse(
        &broken,
        EventBody::TransitionCompleted {
            cell: cell.id,
            role: Role::Training,
        },
        ApplyError::UnknownEngine(cell.engine),
    );
}
