//! Property tests: random but legal event sequences over random configurations.
//!
//! A small random runtime plays the cluster's side (closes and evaluations, transition
//! completions, packing, claims and dones, optimizer steps, publishes, engine failures and
//! recoveries, clock ticks) and asks the real controller to decide in between. After every applied
//! event every invariant in `invariants.rs` holds (validate() included); decide is a pure function
//! of (state, now) and agrees with `run_decisions`; the digest is a pure fold of the log; and from
//! any reached state a cooperative runtime makes training progress (no deadlock).

use std::collections::BTreeSet;

use gyre_event::{
    CellId, CloseStatus, Duration, EngineId, Event, EventBody, ExecutionId, MicroStepId, Role,
    RunConfig, SchedulingMode, Timestamp,
};
use gyre_scheduler::{run_decisions, Controller, Resolution, SchedulerState};
use proptest::prelude::*;

use crate::harness::STANDALONE_ENGINE;
use crate::invariants;
use crate::resolutions::Resolutions;

#[derive(Clone, Debug)]
pub(crate) struct Setup {
    pub(crate) mode: SchedulingMode,
    pub(crate) streaming: bool,
    /// φ·B, whole groups.
    pub(crate) phi_groups: u32,
    pub(crate) mu: u32,
    pub(crate) n: u32,
    pub(crate) b: u32,
    pub(crate) rho_min: f64,
    pub(crate) tau_s: u64,
    pub(crate) cells: u32,
    pub(crate) capacity: u32,
    pub(crate) standalone: u32,
    pub(crate) async_cells: u32,
}

pub(crate) fn setup() -> impl Strategy<Value = Setup> {
    (
        prop_oneof![
            Just(SchedulingMode::Elastic),
            Just(SchedulingMode::Colocate),
            Just(SchedulingMode::Async)
        ],
        any::<bool>(),
        (1u32..=3, 1u32..=3, 1u32..=3, 0u32..=4),
        prop_oneof![Just(0.0), Just(0.25), Just(0.5), Just(1.0)],
        0u64..=15,
        (1u32..=4, 1u32..=4, 0u32..=4),
        1u32..=3,
    )
        .prop_map(
            |(mode, streaming, (mu, n, b, phi_factor), rho_min, tau_s, shape, async_cells)| {
                let (mut cells, capacity, mut standalone) = shape;
                let mut phi_groups = phi_factor * b / 2;
                let mut async_cells = async_cells;
                match mode {
                    // Colocate is one switch unit holding every node, with no extra dispatch.
                    SchedulingMode::Colocate => {
                        phi_groups = 0;
                        cells = 1;
                    }
                    // Async keeps at least one engine in rollout.
                    SchedulingMode::Async => {
                        async_cells = async_cells.min(cells);
                        if async_cells == cells && standalone == 0 {
                            standalone = capacity;
                        }
                    }
                    SchedulingMode::Elastic => {}
                }
                Setup {
                    mode,
                    streaming,
                    phi_groups,
                    mu,
                    n,
                    b,
                    rho_min,
                    tau_s,
                    cells,
                    capacity,
                    standalone,
                    async_cells,
                }
            },
        )
}

#[derive(Clone, Debug)]
pub(crate) enum Action {
    Decide,
    Close(u16, u8),
    Resolve(u16, u8),
    CompleteTransition(u8),
    Pack(u8),
    Claim(u8, bool),
    Done(u16),
    Optimizer,
    Publish,
    EngineDown(u8),
    EngineReady(u8),
    Tick(u8),
    /// A stretch of cooperative runtime (engines come back, work completes) until one more
    /// optimizer step, so random sequences reach later steps and bursts.
    Progress,
}

pub(crate) fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        4 => Just(Action::Decide),
        4 => (any::<u16>(), any::<u8>()).prop_map(|(i, s)| Action::Close(i, s)),
        1 => (any::<u16>(), any::<u8>()).prop_map(|(i, s)| Action::Resolve(i, s)),
        2 => any::<u8>().prop_map(Action::CompleteTransition),
        2 => (1u8..=3).prop_map(Action::Pack),
        3 => (any::<u8>(), prop::bool::weighted(0.2)).prop_map(|(i, d)| Action::Claim(i, d)),
        2 => any::<u16>().prop_map(Action::Done),
        1 => Just(Action::Optimizer),
        1 => Just(Action::Publish),
        1 => prop::num::u8::ANY.prop_map(Action::EngineDown),
        1 => prop::num::u8::ANY.prop_map(Action::EngineReady),
        2 => (0u8..=20).prop_map(Action::Tick),
        1 => Just(Action::Progress),
    ]
}

/// The random runtime around one projection.
pub(crate) struct Runtime {
    pub(crate) state: SchedulerState,
    pub(crate) log: Vec<Event>,
    resolutions: Resolutions,
    now: Timestamp,
    down: BTreeSet<EngineId>,
}

impl Runtime {
    pub(crate) fn new(setup: &Setup) -> Self {
        let mut runtime = Runtime {
            state: SchedulerState::new(),
            log: Vec::new(),
            resolutions: Resolutions::default(),
            now: Timestamp::ZERO,
            down: BTreeSet::new(),
        };
        let config = RunConfig {
            run_seed: 1,
            mode: setup.mode,
            streaming: setup.streaming,
            phi: setup.phi_groups as f64 / setup.b as f64,
            mu: setup.mu,
            n: setup.n,
            b: setup.b,
            steps: 0,
            rho_min: setup.rho_min,
            tau: Duration::from_secs(setup.tau_s),
            j_max: 1,
            async_training_cells: setup.async_cells,
        };
        runtime.apply(EventBody::RunStarted(config));
        for index in 0..setup.cells {
            runtime.apply(EventBody::CellRegistered {
                cell: CellId(index),
                rollout_capacity: setup.capacity,
                nodes: 1,
                engine: EngineId(index),
            });
        }
        if setup.standalone > 0 {
            runtime.apply(EventBody::StandalonePoolRegistered {
                engine: STANDALONE_ENGINE,
                rollout_capacity: setup.standalone,
                nodes: 1,
            });
            runtime.apply(EventBody::EngineReady {
                engine: STANDALONE_ENGINE,
            });
        }
        for index in 0..setup.cells as usize {
            if runtime.state.cells[index].role == Role::Rollout {
                runtime.apply(EventBody::EngineReady {
                    engine: EngineId(index as u32),
                });
            }
        }
        runtime.decide();
        runtime
    }

    fn apply(&mut self, body: EventBody) {
        let event = Event::new(self.now, body);
        let before = self.state.clone();
        if let Err(error) = self.state.apply(&event) {
            panic!("the runtime's legal event {event:?} was rejected: {error}");
        }
        if let Err(error) = self.resolutions.after(&mut self.state, &event) {
            panic!("the resolution after {event:?} was refused: {error}");
        }
        invariants::check_step(&before, &self.state)
            .unwrap_or_else(|violation| panic!("after {event:?}: {violation}"));
        self.log.push(event);
    }

    fn decide(&mut self) {
        let mut expected_state = self.state.clone();
        let expected = run_decisions(&mut expected_state, self.now);
        let mut decided = Vec::new();
        loop {
            let events = Controller.decide(&self.state, self.now);
            assert_eq!(
                events,
                Controller.decide(&self.state.clone(), self.now),
                "decide is deterministic"
            );
            if events.is_empty() {
                break;
            }
            for event in events {
                assert_eq!(event.at, self.now, "decisions are stamped with now");
                self.apply(event.body.clone());
                decided.push(event);
            }
        }
        assert_eq!(
            decided, expected,
            "run_decisions agrees with decide applied by hand"
        );
        assert_eq!(expected_state, self.state);
        if let Some(due) = Controller.next_wakeup(&self.state) {
            assert!(due > self.state.now, "a wakeup lies in the future");
        }
    }

    pub(crate) fn act(&mut self, action: &Action) {
        match action {
            Action::Decide => self.decide(),
            Action::Close(index, status) => {
                let running: Vec<ExecutionId> = self
                    .state
                    .executions
                    .iter()
                    .filter(|(_, e)| e.closed.is_none())
                    .map(|(id, _)| *id)
                    .collect();
                if running.is_empty() {
                    return;
                }
                let execution = running[*index as usize % running.len()];
                let status = CloseStatus::ALL[*status as usize % CloseStatus::ALL.len()];
                self.apply(EventBody::ExecutionClosed { execution, status });
                if self.state.executions[&execution].resolution == Resolution::Pending
                    && (*index / 7) % 3 != 0
                {
                    self.resolve(execution, *index as u8);
                }
            }
            Action::Resolve(index, how) => {
                let pending: Vec<ExecutionId> = self
                    .state
                    .executions
                    .iter()
                    .filter(|(_, e)| e.closed.is_some() && e.resolution == Resolution::Pending)
                    .map(|(id, _)| *id)
                    .collect();
                if !pending.is_empty() {
                    self.resolve(pending[*index as usize % pending.len()], *how);
                }
            }
            Action::CompleteTransition(index) => {
                let switching: Vec<(CellId, Role)> = self
                    .state
                    .cells
                    .iter()
                    .filter_map(|c| c.switching_to.map(|to| (c.id, to)))
                    .collect();
                if !switching.is_empty() {
                    let (cell, role) = switching[*index as usize % switching.len()];
                    self.apply(EventBody::TransitionCompleted { cell, role });
                }
            }
            Action::Pack(count) => {
                for _ in 0..*count {
                    if !self.pack_one(*count as u64) {
                        break;
                    }
                }
            }
            Action::Claim(index, duplicate) => self.claim(*index as usize, *duplicate),
            Action::Done(index) => {
                let Some(batch) = &self.state.batch else {
                    return;
                };
                let step = batch.step;
                let claimed: Vec<(MicroStepId, CellId)> = batch
                    .micro_steps
                    .iter()
                    .filter(|(_, m)| !m.done)
                    .filter_map(|(id, m)| m.claimed_by.map(|cell| (*id, cell)))
                    .collect();
                if !claimed.is_empty() {
                    let (micro_step, cell) = claimed[*index as usize % claimed.len()];
                    self.apply(EventBody::MicroStepDone {
                        step,
                        micro_step,
                        cell,
                    });
                }
            }
            Action::Optimizer => {
                self.optimizer();
            }
            Action::Publish => {
                self.publish();
            }
            Action::EngineDown(index) => {
                let engines: Vec<EngineId> = self.state.engines.keys().copied().collect();
                let engine = engines[*index as usize % engines.len()];
                self.apply(EventBody::EngineDown {
                    engine,
                    reason: "random".to_string(),
                });
                self.down.insert(engine);
            }
            Action::EngineReady(index) => {
                let down: Vec<EngineId> = self.down.iter().copied().collect();
                if !down.is_empty() {
                    let engine = down[*index as usize % down.len()];
                    self.apply(EventBody::EngineReady { engine });
                    self.down.remove(&engine);
                }
            }
            Action::Tick(seconds) => {
                self.now = self.now.plus(Duration::from_secs(*seconds as u64));
                self.apply(EventBody::Tick);
                self.decide();
            }
            Action::Progress => {
                self.drain(50, 1);
            }
        }
    }

    fn resolve(&mut self, execution: ExecutionId, how: u8) {
        let group = self.state.executions[&execution].group;
        match how % 4 {
            0 | 1 => self.apply(evaluation(execution, true)),
            2 => self.apply(EventBody::DummyInserted { execution, group }),
            _ => self.apply(EventBody::ExecutionExcluded {
                execution,
                reason: "random".to_string(),
            }),
        }
    }

    fn pack_one(&mut self, micro_steps: u64) -> bool {
        let Some(group) = self.state.next_group_to_pack() else {
            return false;
        };
        let batch = self.state.batch.as_ref().expect("packing needs a batch");
        let b = self.state.config().expect("config").b as usize;
        let first = self.state.next_micro_step;
        let body = EventBody::MicroStepsEnqueued {
            step: batch.step,
            group,
            micro_steps: (0..micro_steps).map(|i| MicroStepId(first + i)).collect(),
            closes_stream: batch.groups.len() + 1 == b,
        };
        self.apply(body);
        true
    }

    fn claim(&mut self, index: usize, duplicate: bool) {
        if !self.state.claims_open() {
            return;
        }
        let training: Vec<CellId> = self
            .state
            .cells
            .iter()
            .filter(|c| c.role == Role::Training && c.switching_to.is_none())
            .map(|c| c.id)
            .collect();
        if training.is_empty() {
            return;
        }
        let cell = training[index % training.len()];
        let batch = self.state.batch.as_ref().expect("claims need a batch");
        let step = batch.step;
        let already = batch
            .micro_steps
            .iter()
            .find(|(_, m)| m.claimed_by.is_some())
            .map(|(id, m)| (*id, m.claimed_by));
        match (duplicate, already) {
            (true, Some((micro_step, owner))) => {
                let rejected = self.state.rejected_claims;
                self.apply(EventBody::MicroStepClaimed {
                    step,
                    micro_step,
                    cell,
                });
                assert_eq!(
                    self.state.rejected_claims,
                    rejected + 1,
                    "a duplicate is recorded"
                );
                let now_owner =
                    self.state.batch.as_ref().expect("batch").micro_steps[&micro_step].claimed_by;
                assert_eq!(now_owner, owner, "the first claim wins");
            }
            _ => {
                if let Some(micro_step) = self.state.next_unclaimed_micro_step() {
                    self.apply(EventBody::MicroStepClaimed {
                        step,
                        micro_step,
                        cell,
                    });
                }
            }
        }
    }

    fn optimizer(&mut self) -> bool {
        let Some(batch) = &self.state.batch else {
            return false;
        };
        if !(batch.stream_closed && batch.join_window_closed && batch.all_done()) {
            return false;
        }
        let step = batch.step;
        let consumed = self.state.batch_consumption();
        // d = v_t − v_d, with v_t the training version before this step.
        for record in &consumed {
            let v_d = self.state.groups[&record.group].dispatched_version.get();
            assert_eq!(record.staleness, self.state.training_version.get() - v_d);
        }
        let recorded = self.state.staleness.len();
        self.apply(EventBody::OptimizerStepped {
            step,
            policy_version: self.state.training_version.next(),
            consumed: consumed.clone(),
        });
        assert_eq!(self.state.staleness.len(), recorded + consumed.len());
        true
    }

    fn publish(&mut self) -> bool {
        if !self.state.awaiting_publish {
            return false;
        }
        self.apply(EventBody::WeightsPublished {
            policy_version: self.state.training_version,
            took: Duration::from_secs(1),
        });
        true
    }

    /// A cooperative runtime: every engine up, everything completes promptly, the clock moves to
    /// the controller's next wakeup. Returns the optimizer steps taken within `rounds`.
    pub(crate) fn drain(&mut self, rounds: usize, steps_wanted: u64) -> u64 {
        let start = self.state.training_version.get();
        for engine in std::mem::take(&mut self.down) {
            self.apply(EventBody::EngineReady { engine });
        }
        for _ in 0..rounds {
            if self.state.training_version.get() >= start + steps_wanted {
                break;
            }
            self.decide();
            self.act(&Action::CompleteTransition(0));
            let open: Vec<ExecutionId> = self
                .state
                .executions
                .iter()
                .filter(|(_, e)| e.closed.is_none() || e.resolution == Resolution::Pending)
                .map(|(id, _)| *id)
                .collect();
            for execution in open {
                if self.state.executions[&execution].closed.is_none() {
                    self.apply(EventBody::ExecutionClosed {
                        execution,
                        status: CloseStatus::Completed,
                    });
                }
                if self.state.executions[&execution].resolution == Resolution::Pending {
                    self.apply(evaluation(execution, true));
                }
            }
            while self.pack_one(1) {}
            while self.state.claims_open() && self.state.next_unclaimed_micro_step().is_some() {
                let claimed = self.state.batch.as_ref().map(|b| b.claimed_count);
                self.claim(0, false);
                if self.state.batch.as_ref().map(|b| b.claimed_count) == claimed {
                    break;
                }
            }
            for index in 0..64 {
                self.act(&Action::Done(index));
            }
            self.decide();
            self.optimizer();
            self.publish();
            let next = Controller
                .next_wakeup(&self.state)
                .unwrap_or(self.now.plus(Duration::from_secs(1)));
            self.now = next.max(self.now.plus(Duration::from_secs(1)));
            self.apply(EventBody::Tick);
        }
        self.state.training_version.get() - start
    }

    /// The scoring stand-in as it stood after the first `events` of the log (what a restored
    /// snapshot's fold continues from).
    pub(crate) fn resolutions_at(&self, events: usize) -> Resolutions {
        let mut state = SchedulerState::new();
        let mut resolutions = Resolutions::default();
        for event in &self.log[..events] {
            state
                .apply_unchecked(event)
                .expect("a logged event replays");
            resolutions
                .after(&mut state, event)
                .expect("a logged resolution replays");
        }
        resolutions
    }

    /// Replaying the log into a fresh projection gives the same state and digest, through both
    /// apply paths.
    fn check_replay(&self) {
        let mut checked = SchedulerState::new();
        let mut unchecked = SchedulerState::new();
        let (mut checked_resolutions, mut unchecked_resolutions) =
            (Resolutions::default(), Resolutions::default());
        for event in &self.log {
            checked.apply(event).expect("a logged event replays");
            checked_resolutions
                .after(&mut checked, event)
                .expect("a logged resolution replays");
            unchecked
                .apply_unchecked(event)
                .expect("a logged event replays");
            unchecked_resolutions
                .after(&mut unchecked, event)
                .expect("a logged resolution replays");
        }
        assert_eq!(checked, self.state);
        assert_eq!(unchecked, self.state);
        assert_eq!(checked.digest(), self.state.digest());
        assert_eq!(unchecked.digest(), self.state.digest());
    }
}

fn evaluation(execution: ExecutionId, valid: bool) -> EventBody {
    EventBody::EvaluationCompleted {
        execution,
        attempt: 0,
        score: 0.5,
        valid,
        evaluated_state_ref: "random".to_string(),
        artifact_version: 1,
        branch_ref: "main".to_string(),
        evaluator: "random".to_string(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Random legal sequences keep every invariant after every event, decide stays pure and
    /// agrees with run_decisions, and the log replays to the same digest.
    #[test]
    fn random_runtime_keeps_every_invariant(
        setup in setup(),
        actions in prop::collection::vec(action(), 1..200),
    ) {
        let mut runtime = Runtime::new(&setup);
        for action in &actions {
            runtime.act(action);
        }
        runtime.check_replay();
    }

    /// From any state the random runtime reaches, a cooperative runtime makes progress: two more
    /// optimizer steps within a bounded number of rounds (no deadlock in any mode).
    #[test]
    fn cooperative_runtime_always_makes_progress(
        setup in setup(),
        actions in prop::collection::vec(action(), 0..80),
    ) {
        let mut runtime = Runtime::new(&setup);
        for action in &actions {
            runtime.act(action);
        }
        let steps = runtime.drain(200, 2);
        prop_assert!(steps >= 2, "only {} optimizer steps from {:?}", steps, setup);
        runtime.check_replay();
    }
}

/// The digest tells states apart: one more event changes it, and equal logs give equal digests.
#[test]
fn digest_changes_with_the_log() {
    let setup = Setup {
        mode: SchedulingMode::Elastic,
        streaming: true,
        phi_groups: 1,
        mu: 2,
        n: 2,
        b: 2,
        rho_min: 0.5,
        tau_s: 0,
        cells: 3,
        capacity: 2,
        standalone: 2,
        async_cells: 1,
    };
    let mut first = Runtime::new(&setup);
    let mut second = Runtime::new(&setup);
    assert_eq!(first.state.digest(), second.state.digest());
    first.act(&Action::Close(0, 0));
    assert_ne!(first.state.digest(), second.state.digest());
    second.act(&Action::Close(0, 0));
    assert_eq!(first.state.digest(), second.state.digest());
    first.check_replay();
}
