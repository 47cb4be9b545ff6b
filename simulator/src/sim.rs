//! The discrete-event loop: a virtual clock, a seeded cluster, and the real scheduler.
//!
//! The loop pops the next simulated occurrence (an execution ending, a transition finishing, a
//! micro-step or optimizer step completing, a publish landing, a controller wake-up), turns it into
//! log events, applies them to the real `SchedulerState`, and then lets the real controller decide
//! (`run_decisions`). The simulated cell workers react to the decided events the way a real
//! runtime does: start harnesses, switch roles after the measured switch cost, claim micro-steps
//! when idle, step the optimizer and publish weights.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use gyre_event::{
    CellId, CloseStatus, Duration, EngineId, Event, EventBody, ExecutionId, GroupId, MicroStepId,
    Role, StepId, Timestamp,
};
use gyre_scheduler::{run_decisions, Controller};
use gyre_state::ControlState;

use crate::metrics::Metrics;
use crate::workload::{ExecutionOutcome, Workload};
use crate::{RunReport, SimConfig};

/// Engine ids: cells use their index; the standalone pool uses this one.
const STANDALONE_ENGINE: EngineId = EngineId(10_000);

/// A `ProjectionDigest` checkpoint is appended after this many log entries, as the leader does.
pub const DIGEST_EVERY_ENTRIES: u64 = 64;

/// The result of one simulated run: the report and the full event log.
pub struct SimOutput {
    pub report: RunReport,
    pub events: Vec<Event>,
    /// Entry boundaries: entry i holds `events[batch_ends[i-1]..batch_ends[i]]`. One entry is what
    /// the leader would propose as one Raft entry (one occurrence and the decisions it caused).
    pub batch_ends: Vec<usize>,
    pub final_digest: [u8; 32],
}

impl SimOutput {
    /// The log entries, each a slice of events.
    pub fn entries(&self) -> impl Iterator<Item = &[Event]> {
        let mut start = 0;
        self.batch_ends.iter().map(move |end| {
            let entry = &self.events[start..*end];
            start = *end;
            entry
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Occurrence {
    ExecutionEnds {
        execution: ExecutionId,
        generation: u32,
    },
    TransitionDone {
        cell: CellId,
        role: Role,
    },
    MicroStepDone {
        step: StepId,
        micro_step: MicroStepId,
        cell: CellId,
    },
    OptimizerDone {
        step: StepId,
    },
    PublishDone,
    Wakeup,
}

#[derive(Clone, Debug, Default)]
struct CellRuntime {
    busy: bool,
    /// The batch for which this cell already paid its pipeline fill and drain.
    pipeline_for: Option<StepId>,
    /// A satellite must pull the core's weights after it enters training.
    needs_weight_pull: bool,
}

#[derive(Clone, Debug)]
struct RunningExecution {
    outcome: ExecutionOutcome,
    ends_at: u64,
    generation: u32,
}

struct Simulation<'a> {
    config: &'a SimConfig,
    workload: Workload,
    control: ControlState,
    queue: BinaryHeap<Reverse<(u64, u64, Occurrence)>>,
    sequence: u64,
    now: u64,
    events: Vec<Event>,
    cells: Vec<CellRuntime>,
    cell_nodes: Vec<u32>,
    running: BTreeMap<ExecutionId, RunningExecution>,
    group_next_index: BTreeMap<GroupId, u64>,
    optimizer_scheduled: Option<StepId>,
    publish_scheduled: bool,
    wakeup_at: Option<u64>,
    metrics: Metrics,
    batch_ends: Vec<usize>,
    /// Entries closed since the last digest entry.
    entries_since_digest: u64,
}

/// Run one configuration to completion (its `steps` optimizer steps). Panics where
/// [`try_simulate`] returns an error (a validated config never stalls).
pub fn simulate(config: &SimConfig) -> SimOutput {
    try_simulate(config).unwrap_or_else(|error| panic!("{error}"))
}

/// [`simulate`], or why the run could not complete: nothing left scheduled before the last
/// step (a scheduler that cannot make progress with this config).
pub fn try_simulate(config: &SimConfig) -> Result<SimOutput, String> {
    let mut simulation = Simulation::new(config);
    simulation.run()?;
    Ok(simulation.finish())
}

/// The simulated time a run may reach (100 years, in nanoseconds; time is a u64 of them).
const HORIZON_NS: u64 = 100 * 365 * 24 * 3_600_000_000_000;

fn seconds(value: f64) -> u64 {
    Duration::from_secs_f64(value).nanos()
}

impl<'a> Simulation<'a> {
    fn new(config: &'a SimConfig) -> Self {
        let (cell_count, nodes_per_cell) = config.effective_cells();
        Self {
            config,
            workload: Workload::new(config.workload.clone(), config.seed),
            control: ControlState::new(),
            queue: BinaryHeap::new(),
            sequence: 0,
            now: 0,
            events: Vec::new(),
            cells: vec![CellRuntime::default(); cell_count as usize],
            cell_nodes: vec![nodes_per_cell; cell_count as usize],
            running: BTreeMap::new(),
            group_next_index: BTreeMap::new(),
            optimizer_scheduled: None,
            publish_scheduled: false,
            wakeup_at: None,
            batch_ends: Vec::new(),
            entries_since_digest: 0,
            metrics: Metrics::new(cell_count as usize, nodes_per_cell, config.standalone.nodes),
        }
    }

    fn schedule(&mut self, at: u64, occurrence: Occurrence) {
        self.sequence += 1;
        self.queue.push(Reverse((at, self.sequence, occurrence)));
    }

    /// Apply an event that the simulated cluster (not the controller) produced.
    fn record(&mut self, body: EventBody) {
        let event = Event::new(Timestamp(self.now), body);
        self.control
            .apply(&event)
            .unwrap_or_else(|error| panic!("simulated event {event:?} rejected: {error}"));
        debug_assert_eq!(self.control.scheduler.validate(), Ok(()));
        self.observe(&event);
        self.events.push(event);
    }

    fn run(&mut self) -> Result<(), String> {
        let config = self.config;
        self.record(EventBody::RunStarted(config.run_config()));
        let capacity_per_cell = self.cell_nodes[0] * config.cells.capacity_per_node;
        for index in 0..self.cells.len() {
            self.record(EventBody::CellRegistered {
                cell: CellId(index as u32),
                rollout_capacity: capacity_per_cell,
                nodes: self.cell_nodes[index],
                engine: EngineId(index as u32),
            });
        }
        if config.standalone.nodes > 0 {
            self.record(EventBody::StandalonePoolRegistered {
                engine: STANDALONE_ENGINE,
                rollout_capacity: config.standalone.nodes * config.cells.capacity_per_node,
                nodes: config.standalone.nodes,
            });
            self.record(EventBody::EngineReady {
                engine: STANDALONE_ENGINE,
            });
        }
        for index in 0..self.cells.len() {
            if self.control.scheduler.cells[index].role == Role::Rollout {
                self.record(EventBody::EngineReady {
                    engine: EngineId(index as u32),
                });
            }
        }
        self.decide_and_react();
        self.end_entry();
        while let Some(Reverse((at, _, occurrence))) = self.queue.pop() {
            if self.control.scheduler.run_complete {
                break;
            }
            if at > HORIZON_NS {
                return Err(format!(
                    "simulation of {} passed {} years of simulated time before its last step: \
                     the config's durations are too long to simulate",
                    config.name,
                    HORIZON_NS / (365 * 24 * 3_600_000_000_000)
                ));
            }
            self.metrics
                .advance(&self.control.scheduler, at, self.busy_training_nodes());
            self.now = at;
            self.handle(occurrence);
            self.decide_and_react();
            self.end_entry();
        }
        if !self.control.scheduler.run_complete {
            return Err(format!(
                "simulation of {} stalled at {:.2} h with nothing scheduled (d={} p={} f={})",
                config.name,
                self.now as f64 / 3.6e12,
                self.control.scheduler.dispatched,
                self.control.scheduler.started,
                self.control.scheduler.finished
            ));
        }
        Ok(())
    }

    /// Close the current log entry; every `DIGEST_EVERY_ENTRIES` entries, or more as the state
    /// grows ([`gyre_state::digest_interval`]), append a digest entry, as the leader does, so
    /// replay can verify the projection.
    fn end_entry(&mut self) {
        if self.batch_ends.last().copied().unwrap_or(0) == self.events.len() {
            return;
        }
        self.batch_ends.push(self.events.len());
        let entries = self.batch_ends.len() as u64;
        self.entries_since_digest += 1;
        let interval =
            gyre_state::digest_interval(DIGEST_EVERY_ENTRIES, self.control.digest_items());
        if self.entries_since_digest >= interval {
            self.entries_since_digest = 0;
            let hash = self.control.digest();
            self.record(EventBody::ProjectionDigest {
                upto: gyre_event::LogIndex(entries),
                hash,
                rules: gyre_state::FOLD_RULES,
            });
            self.batch_ends.push(self.events.len());
        }
    }

    fn busy_training_nodes(&self) -> u64 {
        self.cells
            .iter()
            .zip(&self.cell_nodes)
            .filter(|(cell, _)| cell.busy)
            .map(|(_, nodes)| *nodes as u64)
            .sum()
    }

    fn handle(&mut self, occurrence: Occurrence) {
        match occurrence {
            Occurrence::ExecutionEnds {
                execution,
                generation,
            } => {
                let Some(running) = self.running.get(&execution) else {
                    return;
                };
                if running.generation != generation {
                    return; // superseded by a reroute delay
                }
                let outcome = running.outcome;
                self.running.remove(&execution);
                self.record(EventBody::ExecutionClosed {
                    execution,
                    status: outcome.status,
                });
                let group = self
                    .control
                    .scheduler
                    .executions
                    .get(&execution)
                    .map(|e| e.group)
                    .expect("a closed execution is known to the projection");
                if outcome.dummy {
                    self.record(EventBody::DummyInserted { execution, group });
                } else if outcome.status == CloseStatus::OverallTimeout {
                    self.record(EventBody::ExecutionExcluded {
                        execution,
                        reason: "overall timeout: evaluation budget exhausted".to_string(),
                    });
                } else {
                    self.record(EventBody::EvaluationRequested {
                        execution,
                        attempt: 0,
                        artifact_version: 1,
                        branch_ref: "main".to_string(),
                    });
                    self.record(EventBody::EvaluationCompleted {
                        execution,
                        attempt: 0,
                        score: outcome.score,
                        valid: true,
                        evaluated_state_ref: format!("sim/{execution}/final"),
                        artifact_version: 1,
                        branch_ref: "main".to_string(),
                        evaluator: "simulated".to_string(),
                    });
                }
            }
            Occurrence::TransitionDone { cell, role } => {
                self.record(EventBody::TransitionCompleted { cell, role });
                let runtime = &mut self.cells[cell.get() as usize];
                runtime.needs_weight_pull = role == Role::Training && cell.get() > 0;
                runtime.pipeline_for = None;
            }
            Occurrence::MicroStepDone {
                step,
                micro_step,
                cell,
            } => {
                self.cells[cell.get() as usize].busy = false;
                self.record(EventBody::MicroStepDone {
                    step,
                    micro_step,
                    cell,
                });
            }
            Occurrence::OptimizerDone { step } => {
                let consumed = self.control.scheduler.batch_consumption();
                self.optimizer_scheduled = None;
                self.record(EventBody::OptimizerStepped {
                    step,
                    policy_version: self.control.scheduler.training_version.next(),
                    consumed,
                });
                self.metrics.step_ended(self.now);
            }
            Occurrence::PublishDone => {
                self.publish_scheduled = false;
                self.record(EventBody::WeightsPublished {
                    policy_version: self.control.scheduler.training_version,
                    took: Duration::from_secs_f64(self.config.training.publish_s),
                });
            }
            Occurrence::Wakeup => {
                self.wakeup_at = None;
                self.record(EventBody::Tick);
            }
        }
    }

    /// Let the controller decide, then let the simulated runtime react, until both are quiet.
    fn decide_and_react(&mut self) {
        loop {
            let decided = run_decisions(&mut self.control.scheduler, Timestamp(self.now));
            let mut progressed = !decided.is_empty();
            for event in decided {
                self.control
                    .trajectories
                    .apply(&event)
                    .unwrap_or_else(|error| panic!("decided event {event:?} rejected: {error}"));
                self.observe(&event);
                self.react(&event);
                self.events.push(event);
            }
            progressed |= self.pack();
            progressed |= self.claim();
            self.maybe_schedule_optimizer();
            if !progressed {
                break;
            }
        }
        if let Some(due) = Controller.next_wakeup(&self.control.scheduler) {
            let due = due.nanos();
            if due > self.now && self.wakeup_at.is_none_or(|at| at > due) {
                self.wakeup_at = Some(due);
                self.schedule(due, Occurrence::Wakeup);
            }
        }
    }

    fn observe(&mut self, event: &Event) {
        self.metrics.observe(event, &self.control.scheduler);
    }

    /// The simulated runtime's reaction to a decided event.
    fn react(&mut self, event: &Event) {
        match &event.body {
            EventBody::ExecutionStarted {
                execution, group, ..
            } => {
                let index = self.group_next_index.entry(*group).or_insert(0);
                let query = gyre_event::QueryId(group.get());
                let outcome = self.workload.outcome(query, *index);
                *index += 1;
                let ends_at = self.now.saturating_add(seconds(outcome.duration_s));
                self.running.insert(
                    *execution,
                    RunningExecution {
                        outcome,
                        ends_at,
                        generation: 0,
                    },
                );
                self.schedule(
                    ends_at,
                    Occurrence::ExecutionEnds {
                        execution: *execution,
                        generation: 0,
                    },
                );
            }
            EventBody::RoutesUpdated { moves, .. } => {
                let penalty = seconds(self.config.workload.reroute_penalty_s);
                if penalty == 0 {
                    return;
                }
                for route in moves {
                    if let Some(running) = self.running.get_mut(&route.execution) {
                        running.generation += 1;
                        running.ends_at += penalty;
                        let (at, generation) = (running.ends_at, running.generation);
                        self.schedule(
                            at,
                            Occurrence::ExecutionEnds {
                                execution: route.execution,
                                generation,
                            },
                        );
                    }
                }
            }
            EventBody::TransitionBegun { cell, to } => {
                let cost = match to {
                    Role::Training => self.config.switch.rollout_to_training_s,
                    Role::Rollout => self.config.switch.training_to_rollout_s,
                };
                self.schedule(
                    self.now.saturating_add(seconds(cost)),
                    Occurrence::TransitionDone {
                        cell: *cell,
                        role: *to,
                    },
                );
            }
            EventBody::BurstEnded { .. } if !self.publish_scheduled => {
                self.publish_scheduled = true;
                self.schedule(
                    self.now
                        .saturating_add(seconds(self.config.training.publish_s)),
                    Occurrence::PublishDone,
                );
            }
            _ => {}
        }
    }

    /// The simulated packer: take ready groups, oldest policy version first, into the open batch.
    fn pack(&mut self) -> bool {
        let mut progressed = false;
        while let Some(group) = self.control.scheduler.next_group_to_pack() {
            let batch = self
                .control
                .scheduler
                .batch
                .as_ref()
                .expect("packing needs an open batch");
            let step = batch.step;
            let closes = batch.groups.len() + 1 == self.config.b as usize;
            let first = self.control.scheduler.next_micro_step;
            let micro_steps = (0..self.config.training.micro_steps_per_group as u64)
                .map(|offset| MicroStepId(first + offset))
                .collect();
            self.record(EventBody::MicroStepsEnqueued {
                step,
                group,
                micro_steps,
                closes_stream: closes,
            });
            progressed = true;
        }
        progressed
    }

    /// Idle training cells claim micro-steps, lowest cell index first.
    fn claim(&mut self) -> bool {
        let mut progressed = false;
        if !self.control.scheduler.claims_open() {
            return false;
        }
        for index in 0..self.cells.len() {
            let cell = &self.control.scheduler.cells[index];
            if cell.role != Role::Training || cell.switching_to.is_some() || self.cells[index].busy
            {
                continue;
            }
            let Some(micro_step) = self.control.scheduler.next_unclaimed_micro_step() else {
                break;
            };
            let step = self
                .control
                .scheduler
                .batch
                .as_ref()
                .expect("claims need a batch")
                .step;
            let cell_id = CellId(index as u32);
            self.record(EventBody::MicroStepClaimed {
                step,
                micro_step,
                cell: cell_id,
            });
            let training = &self.config.training;
            let work_node_hours = training.node_hours_per_step
                / (self.config.b as f64 * training.micro_steps_per_group as f64);
            let mut cost_s = work_node_hours * 3600.0 / self.cell_nodes[index] as f64;
            let runtime = &mut self.cells[index];
            if runtime.needs_weight_pull {
                cost_s += training.weight_pull_s;
                runtime.needs_weight_pull = false;
            }
            if runtime.pipeline_for != Some(step) {
                cost_s += training.pipeline_fill_drain_s;
                runtime.pipeline_for = Some(step);
            }
            runtime.busy = true;
            self.schedule(
                self.now.saturating_add(seconds(cost_s)),
                Occurrence::MicroStepDone {
                    step,
                    micro_step,
                    cell: cell_id,
                },
            );
            progressed = true;
        }
        progressed
    }

    fn maybe_schedule_optimizer(&mut self) {
        let Some(batch) = &self.control.scheduler.batch else {
            return;
        };
        if batch.join_window_closed && batch.all_done() && self.optimizer_scheduled.is_none() {
            let step = batch.step;
            self.optimizer_scheduled = Some(step);
            self.schedule(
                self.now
                    .saturating_add(seconds(self.config.training.optimizer_s)),
                Occurrence::OptimizerDone { step },
            );
        }
    }

    fn finish(mut self) -> SimOutput {
        self.metrics.close(self.now, &self.control.scheduler);
        let digest = self.control.digest();
        let report = self.metrics.report(
            self.config,
            &self.control.scheduler,
            self.events.len() as u64,
            &digest,
        );
        SimOutput {
            report,
            events: self.events,
            batch_ends: self.batch_ends,
            final_digest: digest,
        }
    }
}
