//! What a simulated run reports: step times, staleness, counters, utilisation and role timelines.
//!
//! The JSON schema is documented in docs/simulator.md; floats are rounded to 4 decimals so the
//! output is stable and readable. Same seed ⇒ byte-identical JSON.

use std::collections::BTreeMap;

use serde::Serialize;

use gyre_event::{EventBody, Role, StepId};
use gyre_scheduler::SchedulerState;

use crate::SimConfig;

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RoleInterval {
    /// rollout | training | switching
    pub role: &'static str,
    pub start_h: f64,
    pub end_h: f64,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct CellTimeline {
    pub cell: u32,
    pub nodes: u32,
    pub intervals: Vec<RoleInterval>,
    pub hours_by_role: BTreeMap<&'static str, f64>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ExecutionCounts {
    pub dispatched: u64,
    pub started: u64,
    pub finished: u64,
    pub by_status: BTreeMap<&'static str, u64>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Utilization {
    /// Running executions over rollout capacity, time-averaged.
    pub rollout: f64,
    /// Node-time training cells spent on micro-steps over node-time they held the training role.
    pub training: f64,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RunReport {
    pub name: String,
    pub seed: u64,
    pub mode: &'static str,
    pub granularity: &'static str,
    pub streaming: bool,
    pub phi: f64,
    pub mu: u32,
    pub n: u32,
    pub b: u32,
    pub steps: u32,
    pub total_hours: f64,
    pub step_end_hours: Vec<f64>,
    pub step_duration_hours: Vec<f64>,
    /// Group-weighted mean of d = v_t − v_d over every consumed group.
    pub mean_staleness: f64,
    /// The same, excluding the first burst (the start-up transient Theorem A.1 does not cover).
    pub steady_state_mean_staleness: f64,
    /// Theorem A.1: φ + (μ − 1)/2.
    pub expected_staleness: f64,
    pub staleness_by_step: Vec<f64>,
    pub staleness_histogram: BTreeMap<String, u64>,
    pub executions: ExecutionCounts,
    pub groups_consumed: u64,
    pub utilization: Utilization,
    pub standalone_nodes: u32,
    pub cells: Vec<CellTimeline>,
    pub events: u64,
    /// SHA-256 of the scheduler projection at the end of the run.
    pub final_digest: String,
}

pub(crate) struct Metrics {
    last_ns: u64,
    running_integral: f64,
    capacity_integral: f64,
    busy_integral: f64,
    training_integral: f64,
    open: Vec<Option<(&'static str, u64)>>,
    intervals: Vec<Vec<RoleInterval>>,
    cell_nodes: u32,
    standalone_nodes: u32,
    step_end_ns: Vec<u64>,
    by_status: BTreeMap<&'static str, u64>,
}

fn hours(ns: u64) -> f64 {
    round4(ns as f64 / 3.6e12)
}

pub(crate) fn round4(value: f64) -> f64 {
    (value * 10_000.0).round() / 10_000.0
}

impl Metrics {
    pub fn new(cells: usize, cell_nodes: u32, standalone_nodes: u32) -> Self {
        Self {
            last_ns: 0,
            running_integral: 0.0,
            capacity_integral: 0.0,
            busy_integral: 0.0,
            training_integral: 0.0,
            open: vec![None; cells],
            intervals: vec![Vec::new(); cells],
            cell_nodes,
            standalone_nodes,
            step_end_ns: Vec::new(),
            by_status: BTreeMap::new(),
        }
    }

    /// Integrate piecewise-constant quantities up to `at` using the state as it was before `at`.
    pub fn advance(&mut self, state: &SchedulerState, at: u64, busy_training_nodes: u64) {
        let dt = at.saturating_sub(self.last_ns) as f64;
        if dt > 0.0 {
            self.running_integral += dt * state.running() as f64;
            self.capacity_integral += dt * state.rollout_capacity() as f64;
            self.busy_integral += dt * busy_training_nodes as f64;
            let training_nodes: u64 = state
                .cells
                .iter()
                .filter(|c| c.role == Role::Training && c.switching_to.is_none())
                .map(|c| c.nodes as u64)
                .sum();
            self.training_integral += dt * training_nodes as f64;
        }
        self.last_ns = at;
    }

    fn switch(&mut self, cell: usize, label: &'static str, at: u64) {
        if let Some((role, start)) = self.open[cell].take() {
            if at > start {
                self.intervals[cell].push(RoleInterval {
                    role,
                    start_h: hours(start),
                    end_h: hours(at),
                });
            }
        }
        self.open[cell] = Some((label, at));
    }

    pub fn observe(&mut self, event: &gyre_event::Event, state: &SchedulerState) {
        let at = event.at.nanos();
        match &event.body {
            EventBody::CellRegistered { cell, .. } => {
                let index = cell.get() as usize;
                let role = state
                    .cells
                    .get(index)
                    .map(|c| c.role)
                    .unwrap_or(Role::Rollout);
                self.switch(index, role.as_str(), at);
            }
            EventBody::TransitionBegun { cell, .. } => {
                self.switch(cell.get() as usize, "switching", at);
            }
            EventBody::TransitionCompleted { cell, role } => {
                self.switch(cell.get() as usize, role.as_str(), at);
            }
            EventBody::ExecutionClosed { status, .. } => {
                *self.by_status.entry(status.as_str()).or_insert(0) += 1;
            }
            _ => {}
        }
    }

    pub fn step_ended(&mut self, at: u64) {
        self.step_end_ns.push(at);
    }

    pub fn close(&mut self, at: u64, _state: &SchedulerState) {
        for cell in 0..self.open.len() {
            if let Some((role, start)) = self.open[cell].take() {
                if at > start {
                    self.intervals[cell].push(RoleInterval {
                        role,
                        start_h: hours(start),
                        end_h: hours(at),
                    });
                }
            }
        }
    }

    pub fn report(
        &self,
        config: &SimConfig,
        state: &SchedulerState,
        events: u64,
        digest: &[u8; 32],
    ) -> RunReport {
        let mut by_step: BTreeMap<StepId, (u64, u64)> = BTreeMap::new();
        let mut histogram: BTreeMap<u64, u64> = BTreeMap::new();
        let (mut sum, mut count, mut steady_sum, mut steady_count) = (0u64, 0u64, 0u64, 0u64);
        for record in &state.staleness {
            let entry = by_step.entry(record.step).or_insert((0, 0));
            entry.0 += record.staleness;
            entry.1 += 1;
            *histogram.entry(record.staleness).or_insert(0) += 1;
            sum += record.staleness;
            count += 1;
            if record.step.get() >= config.mu as u64 {
                steady_sum += record.staleness;
                steady_count += 1;
            }
        }
        let mean = |s: u64, c: u64| {
            if c == 0 {
                0.0
            } else {
                round4(s as f64 / c as f64)
            }
        };
        let mut previous = 0u64;
        let step_duration_hours = self
            .step_end_ns
            .iter()
            .map(|end| {
                let duration = hours(end - previous);
                previous = *end;
                duration
            })
            .collect();
        let cells = self
            .intervals
            .iter()
            .enumerate()
            .map(|(index, intervals)| {
                let mut hours_by_role = BTreeMap::new();
                for interval in intervals {
                    *hours_by_role.entry(interval.role).or_insert(0.0) +=
                        interval.end_h - interval.start_h;
                }
                for value in hours_by_role.values_mut() {
                    *value = round4(*value);
                }
                CellTimeline {
                    cell: index as u32,
                    nodes: state
                        .cells
                        .get(index)
                        .map(|c| c.nodes)
                        .unwrap_or(self.cell_nodes),
                    intervals: intervals.clone(),
                    hours_by_role,
                }
            })
            .collect();
        let ratio = |a: f64, b: f64| if b > 0.0 { round4(a / b) } else { 0.0 };
        RunReport {
            name: config.name.clone(),
            seed: config.seed,
            mode: config.scheduling_mode().as_str(),
            granularity: config.granularity(),
            streaming: config.streaming,
            phi: config.phi,
            mu: config.mu,
            n: config.n,
            b: config.b,
            steps: config.steps,
            total_hours: self.step_end_ns.last().map(|ns| hours(*ns)).unwrap_or(0.0),
            step_end_hours: self.step_end_ns.iter().map(|ns| hours(*ns)).collect(),
            step_duration_hours,
            mean_staleness: mean(sum, count),
            steady_state_mean_staleness: mean(steady_sum, steady_count),
            expected_staleness: round4(config.run_config().expected_staleness()),
            staleness_by_step: by_step.values().map(|(s, c)| mean(*s, *c)).collect(),
            staleness_histogram: histogram
                .into_iter()
                .map(|(d, c)| (d.to_string(), c))
                .collect(),
            executions: ExecutionCounts {
                dispatched: state.dispatched,
                started: state.started,
                finished: state.finished,
                by_status: self.by_status.clone(),
            },
            groups_consumed: count,
            utilization: Utilization {
                rollout: ratio(self.running_integral, self.capacity_integral),
                training: ratio(self.busy_integral, self.training_integral),
            },
            standalone_nodes: self.standalone_nodes,
            cells,
            events,
            final_digest: digest.iter().map(|b| format!("{b:02x}")).collect(),
        }
    }
}
