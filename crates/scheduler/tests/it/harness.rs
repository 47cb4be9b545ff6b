//! The tests-as-data harness (STYLE rule 10): a tiny script language in, a rendered dump out.
//!
//! A script sets up one run and then plays the runtime's side of the event flow against a real
//! `SchedulerState`, asking the real controller to decide where the script says so. Each line is
//! `config key=value…` or `at <seconds> <command>`; `#` starts a comment. Commands:
//!
//! - `decide`: `run_decisions(now)`; prints the decided events and the key state.
//! - `state`: prints the key state.
//! - `finish e0-e3`: close each execution `completed` and record a valid evaluation.
//! - `close e3 <status>`, `eval e3 valid|invalid`, `dummy e3`, `exclude e3`.
//! - `complete cell0 training|rollout` (alias `complete-transition`): the cell worker reports.
//! - `begin cell1 training|rollout`: a raw `TransitionBegun` (for rejection tests).
//! - `pack [count] [ms=K]`: the packer enqueues ready groups (all, or `count`), K micro-steps each.
//! - `claim cell0 [ms3]`: claim the next unclaimed micro-step, or the one named.
//! - `claim-all cell0`, `done ms0 cell0`, `done-all`: micro-step progress.
//! - `optimizer`: `OptimizerStepped` with `consumed = state.batch_consumption()`.
//! - `publish`, `tick`, `engine-down engine2`, `engine-ready engine2`.
//!
//! Every event goes through the checked `apply`; after each one `validate()` and the invariants in
//! `invariants.rs` must hold, or the test panics. A rejected event is rendered with its error, and
//! the harness asserts that the state (and its digest) did not change.

use expect_test::Expect;
use gyre_event::{
    CellId, CloseStatus, Duration, EngineId, Event, EventBody, ExecutionId, MicroStepId, Role,
    RunConfig, SchedulingMode, StepId, Timestamp,
};
use gyre_scheduler::{run_decisions, Controller, SchedulerState};

use crate::invariants;
use crate::resolutions::Resolutions;

/// The engine id of the standalone pool in scripts.
pub const STANDALONE_ENGINE: EngineId = EngineId(100);

/// Run `script` and compare its rendered output with the snapshot.
pub fn check(script: &str, expect: Expect) {
    let mut harness = Harness::default();
    let output = harness.run(script);
    expect.assert_eq(&output);
}

/// A script interpreter over one projection; also usable directly from other tests.
#[derive(Default)]
pub struct Harness {
    pub state: SchedulerState,
    pub log: Vec<Event>,
    resolutions: Resolutions,
    out: String,
}

impl Harness {
    pub fn run(&mut self, script: &str) -> String {
        for raw in script.lines() {
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let words: Vec<&str> = line.split_whitespace().collect();
            match words[0] {
                "config" => self.config(&words[1..]),
                "at" => {
                    let seconds: u64 = words[1].parse().expect("`at` takes whole seconds");
                    self.command(line, Timestamp::from_secs(seconds), &words[2..]);
                }
                other => panic!("unknown script line `{other}`"),
            }
        }
        // The whole log replays into an identical projection (the digest is a pure fold).
        let mut replayed = SchedulerState::new();
        let mut resolutions = Resolutions::default();
        for event in &self.log {
            replayed
                .apply_unchecked(event)
                .expect("a logged event replays");
            resolutions
                .after(&mut replayed, event)
                .expect("a logged resolution replays");
        }
        assert_eq!(
            replayed, self.state,
            "replay diverged from the live projection"
        );
        assert_eq!(replayed.digest(), self.state.digest());
        std::mem::take(&mut self.out)
    }

    fn config(&mut self, words: &[&str]) {
        let mut config = RunConfig {
            run_seed: 7,
            mode: SchedulingMode::Elastic,
            streaming: true,
            phi: 0.0,
            mu: 1,
            n: 1,
            b: 1,
            steps: 0,
            rho_min: 0.5,
            tau: Duration::from_secs(10),
            j_max: 1,
            async_training_cells: 1,
        };
        let (mut cells, mut capacity, mut standalone) = (1u32, 4u32, 0u32);
        for word in words {
            let (key, value) = word.split_once('=').expect("config takes key=value");
            match key {
                "mode" => {
                    config.mode = match value {
                        "elastic" => SchedulingMode::Elastic,
                        "colocate" => SchedulingMode::Colocate,
                        "async" => SchedulingMode::Async,
                        _ => panic!("unknown mode {value}"),
                    }
                }
                "phi" => config.phi = value.parse().expect("phi"),
                "mu" => config.mu = value.parse().expect("mu"),
                "n" => config.n = value.parse().expect("n"),
                "b" => config.b = value.parse().expect("b"),
                "steps" => config.steps = value.parse().expect("steps"),
                "rho_min" => config.rho_min = value.parse().expect("rho_min"),
                "tau" => config.tau = Duration::from_secs(value.parse().expect("tau")),
                "streaming" => config.streaming = value == "on",
                "async_cells" => config.async_training_cells = value.parse().expect("async_cells"),
                "cells" => {
                    let (count, each) = value.split_once('x').expect("cells=KxC");
                    cells = count.parse().expect("cell count");
                    capacity = each.parse().expect("cell capacity");
                }
                "standalone" => standalone = value.parse().expect("standalone capacity"),
                _ => panic!("unknown config key {key}"),
            }
        }
        let at = Timestamp::ZERO;
        self.apply(at, EventBody::RunStarted(config))
            .expect("the script's config is valid");
        for index in 0..cells {
            self.apply(
                at,
                EventBody::CellRegistered {
                    cell: CellId(index),
                    rollout_capacity: capacity,
                    nodes: 4,
                    engine: EngineId(index),
                },
            )
            .expect("cell registers");
        }
        if standalone > 0 {
            self.apply(
                at,
                EventBody::StandalonePoolRegistered {
                    engine: STANDALONE_ENGINE,
                    rollout_capacity: standalone,
                    nodes: 1,
                },
            )
            .expect("pool registers");
            self.apply(
                at,
                EventBody::EngineReady {
                    engine: STANDALONE_ENGINE,
                },
            )
            .expect("pool ready");
        }
        for index in 0..cells as usize {
            if self.state.cells[index].role == Role::Rollout {
                self.apply(
                    at,
                    EventBody::EngineReady {
                        engine: EngineId(index as u32),
                    },
                )
                .expect("engine ready");
            }
        }
    }

    /// Apply one event through the checked path; on success check every invariant, on error
    /// check that nothing changed.
    pub fn apply(&mut self, at: Timestamp, body: EventBody) -> Result<(), String> {
        let event = Event::new(at, body);
        let before = self.state.clone();
        let digest_before = self.state.digest();
        match self.state.apply(&event) {
            Ok(()) => {
                self.resolutions
                    .after(&mut self.state, &event)
                    .unwrap_or_else(|error| panic!("after {event:?}: resolution refused: {error}"));
                invariants::check_step(&before, &self.state).unwrap_or_else(|violation| {
                    panic!(
                        "after {event:?}: {violation}\n{}{}",
                        self.out,
                        render_state(&self.state)
                    )
                });
                self.log.push(event);
                Ok(())
            }
            Err(error) => {
                assert_eq!(self.state, before, "a rejected event changed the state");
                assert_eq!(self.state.digest(), digest_before);
                Err(error.to_string())
            }
        }
    }

    fn emit(&mut self, line: &str, at: Timestamp, body: EventBody) {
        if let Err(error) = self.apply(at, body) {
            self.out
                .push_str(&format!("{line}\n  rejected: {error} (state unchanged)\n"));
        }
    }

    fn command(&mut self, line: &str, at: Timestamp, words: &[&str]) {
        match words {
            ["decide"] => {
                let before = self.state.clone();
                // decide is a pure function of (state, now).
                let first = Controller.decide(&self.state, at);
                assert_eq!(first, Controller.decide(&self.state.clone(), at));
                let events = run_decisions(&mut self.state, at);
                // The same decisions applied one by one through the checked path give the same
                // projection, with every invariant holding after each of them.
                let mut stepwise = before.clone();
                let mut previous = before;
                for event in &events {
                    stepwise.apply(event).expect("a decided event applies");
                    invariants::check_step(&previous, &stepwise).unwrap_or_else(|violation| {
                        panic!(
                            "after decided {event:?}: {violation}\n{}{}",
                            self.out,
                            render_state(&stepwise)
                        )
                    });
                    previous = stepwise.clone();
                }
                assert_eq!(stepwise, self.state);
                self.out.push_str(&format!("{line}\n"));
                if events.is_empty() {
                    self.out.push_str("  (nothing)\n");
                }
                for rendered in render_events(&events) {
                    self.out.push_str(&format!("  {rendered}\n"));
                }
                self.log.extend(events);
                self.out.push_str(&render_state(&self.state));
            }
            ["state"] => {
                self.out.push_str(&format!("{line}\n"));
                self.out.push_str(&render_state(&self.state));
            }
            ["tick"] => self.emit(line, at, EventBody::Tick),
            ["finish", ids] => {
                for execution in executions(ids) {
                    self.emit(
                        line,
                        at,
                        EventBody::ExecutionClosed {
                            execution,
                            status: CloseStatus::Completed,
                        },
                    );
                    self.emit(line, at, evaluation(execution, true));
                }
            }
            ["close", ids, status] => {
                let status = CloseStatus::ALL
                    .into_iter()
                    .find(|s| s.as_str() == *status)
                    .unwrap_or_else(|| panic!("unknown close status {status}"));
                for execution in executions(ids) {
                    self.emit(line, at, EventBody::ExecutionClosed { execution, status });
                }
            }
            ["eval", ids, validity] => {
                for execution in executions(ids) {
                    self.emit(line, at, evaluation(execution, *validity == "valid"));
                }
            }
            ["dummy", ids] => {
                for execution in executions(ids) {
                    let group = self.state.executions[&execution].group;
                    self.emit(line, at, EventBody::DummyInserted { execution, group });
                }
            }
            ["exclude", ids] => {
                for execution in executions(ids) {
                    self.emit(
                        line,
                        at,
                        EventBody::ExecutionExcluded {
                            execution,
                            reason: "script".to_string(),
                        },
                    );
                }
            }
            ["complete" | "complete-transition", cell, role] => {
                let body = EventBody::TransitionCompleted {
                    cell: cell_id(cell),
                    role: role_named(role),
                };
                self.emit(line, at, body);
            }
            ["begin", cell, role] => {
                let body = EventBody::TransitionBegun {
                    cell: cell_id(cell),
                    to: role_named(role),
                };
                self.emit(line, at, body);
            }
            ["pack", rest @ ..] => self.pack(line, at, rest),
            ["claim", cell] => {
                let micro_step = self.state.next_unclaimed_micro_step();
                let Some(micro_step) = micro_step else {
                    self.out.push_str(&format!("{line}\n  nothing to claim\n"));
                    return;
                };
                self.claim(line, at, cell_id(cell), micro_step);
            }
            ["claim", cell, micro_step] => {
                self.claim(line, at, cell_id(cell), micro_step_id(micro_step));
            }
            ["claim-all", cell] => {
                while let Some(micro_step) = self.state.next_unclaimed_micro_step() {
                    let claimed_before = self.state.batch.as_ref().map(|b| b.claimed_count);
                    self.claim(line, at, cell_id(cell), micro_step);
                    if self.state.batch.as_ref().map(|b| b.claimed_count) == claimed_before {
                        break;
                    }
                }
            }
            ["done", micro_step, cell] => {
                let step = self.open_step();
                let body = EventBody::MicroStepDone {
                    step,
                    micro_step: micro_step_id(micro_step),
                    cell: cell_id(cell),
                };
                self.emit(line, at, body);
            }
            ["done-all"] => {
                let step = self.open_step();
                let pending: Vec<(MicroStepId, CellId)> = self
                    .state
                    .batch
                    .iter()
                    .flat_map(|b| b.micro_steps.iter())
                    .filter(|(_, m)| !m.done)
                    .filter_map(|(id, m)| m.claimed_by.map(|cell| (*id, cell)))
                    .collect();
                for (micro_step, cell) in pending {
                    let body = EventBody::MicroStepDone {
                        step,
                        micro_step,
                        cell,
                    };
                    self.emit(line, at, body);
                }
            }
            ["optimizer"] => {
                let step = self.open_step();
                let consumed = self.state.batch_consumption();
                let version = self.state.training_version.next();
                let rendered: Vec<String> = consumed
                    .iter()
                    .map(|c| format!("{}:d={}", c.group, c.staleness))
                    .collect();
                let body = EventBody::OptimizerStepped {
                    step,
                    policy_version: version,
                    consumed,
                };
                match self.apply(at, body) {
                    Ok(()) => self.out.push_str(&format!(
                        "{line}\n  {step} -> {version} consumed {}\n",
                        rendered.join(" ")
                    )),
                    Err(error) => self
                        .out
                        .push_str(&format!("{line}\n  rejected: {error} (state unchanged)\n")),
                }
            }
            ["publish"] => {
                let body = EventBody::WeightsPublished {
                    policy_version: self.state.training_version,
                    took: Duration::from_secs(1),
                };
                self.emit(line, at, body);
            }
            ["engine-down", engine] => {
                let body = EventBody::EngineDown {
                    engine: engine_id(engine),
                    reason: "script".to_string(),
                };
                self.emit(line, at, body);
            }
            ["engine-ready", engine] => {
                let body = EventBody::EngineReady {
                    engine: engine_id(engine),
                };
                self.emit(line, at, body);
            }
            _ => panic!("unknown command `{line}`"),
        }
    }

    fn open_step(&self) -> StepId {
        self.state
            .batch
            .as_ref()
            .map(|b| b.step)
            .unwrap_or(StepId(self.state.training_version.get()))
    }

    fn claim(&mut self, line: &str, at: Timestamp, cell: CellId, micro_step: MicroStepId) {
        let rejected_before = self.state.rejected_claims;
        let body = EventBody::MicroStepClaimed {
            step: self.open_step(),
            micro_step,
            cell,
        };
        self.emit(line, at, body);
        if self.state.rejected_claims != rejected_before {
            self.out.push_str(&format!(
                "{line}\n  {micro_step} already claimed by {}: recorded no-op (rejected_claims={})\n",
                self.state.batch.as_ref().expect("claims need a batch").micro_steps[&micro_step]
                    .claimed_by
                    .expect("claimed"),
                self.state.rejected_claims
            ));
        }
    }

    fn pack(&mut self, line: &str, at: Timestamp, words: &[&str]) {
        let mut count = usize::MAX;
        let mut per_group = 1u64;
        for word in words {
            match word.strip_prefix("ms=") {
                Some(value) => per_group = value.parse().expect("ms=K"),
                None => count = word.parse().expect("pack [count] [ms=K]"),
            }
        }
        let mut packed = 0;
        while packed < count {
            let Some(group) = self.state.next_group_to_pack() else {
                break;
            };
            let batch = self.state.batch.as_ref().expect("packing needs a batch");
            let b = self.state.config().expect("config").b as usize;
            let first = self.state.next_micro_step;
            let body = EventBody::MicroStepsEnqueued {
                step: batch.step,
                group,
                micro_steps: (0..per_group).map(|i| MicroStepId(first + i)).collect(),
                closes_stream: batch.groups.len() + 1 == b,
            };
            if let Err(error) = self.apply(at, body) {
                panic!("`{line}`: the packer's enqueue was rejected: {error}");
            }
            packed += 1;
        }
    }
}

fn evaluation(execution: ExecutionId, valid: bool) -> EventBody {
    EventBody::EvaluationCompleted {
        execution,
        attempt: 0,
        score: 1.0,
        valid,
        evaluated_state_ref: "script".to_string(),
        artifact_version: 1,
        branch_ref: "main".to_string(),
        evaluator: "script".to_string(),
    }
}

/// `e3`, `e0-e7` or `e1,e4`.
fn executions(text: &str) -> Vec<ExecutionId> {
    let mut out = Vec::new();
    for part in text.split(',') {
        let part = part.strip_prefix('e').expect("execution ids look like e3");
        match part.split_once("-e").or_else(|| part.split_once('-')) {
            Some((low, high)) => {
                let (low, high): (u64, u64) = (low.parse().expect("id"), high.parse().expect("id"));
                out.extend((low..=high).map(ExecutionId));
            }
            None => out.push(ExecutionId(part.parse().expect("execution id"))),
        }
    }
    out
}

fn cell_id(text: &str) -> CellId {
    CellId(
        text.strip_prefix("cell")
            .and_then(|n| n.parse().ok())
            .expect("cells look like cell0"),
    )
}

fn engine_id(text: &str) -> EngineId {
    EngineId(
        text.strip_prefix("engine")
            .and_then(|n| n.parse().ok())
            .expect("engines look like engine2"),
    )
}

fn micro_step_id(text: &str) -> MicroStepId {
    MicroStepId(
        text.strip_prefix("ms")
            .and_then(|n| n.parse().ok())
            .expect("micro-steps look like ms0"),
    )
}

fn role_named(text: &str) -> Role {
    match text {
        "training" => Role::Training,
        "rollout" => Role::Rollout,
        _ => panic!("unknown role {text}"),
    }
}

fn seconds(at: Timestamp) -> String {
    let text = format!("{:.3}", at.as_secs_f64());
    match text.strip_suffix(".000") {
        Some(whole) => whole.to_string(),
        None => text,
    }
}

/// Compact rendering of decided events; runs of starts are folded per engine.
pub fn render_events(events: &[Event]) -> Vec<String> {
    let mut lines = Vec::new();
    let mut starts: Vec<(EngineId, Vec<ExecutionId>)> = Vec::new();
    let flush = |starts: &mut Vec<(EngineId, Vec<ExecutionId>)>, lines: &mut Vec<String>| {
        if starts.is_empty() {
            return;
        }
        let total: usize = starts.iter().map(|(_, e)| e.len()).sum();
        let parts: Vec<String> = starts
            .iter()
            .map(|(engine, ids)| format!("{engine}[{}]", id_range(ids)))
            .collect();
        lines.push(format!("start {total}: {}", parts.join(" ")));
        starts.clear();
    };
    for event in events {
        if let EventBody::ExecutionStarted {
            execution, engine, ..
        } = &event.body
        {
            match starts.last_mut() {
                Some((last, ids)) if last == engine => ids.push(*execution),
                _ => starts.push((*engine, vec![*execution])),
            }
            continue;
        }
        flush(&mut starts, &mut lines);
        lines.push(match &event.body {
            EventBody::GroupsDispatched {
                groups,
                executions_per_group,
                policy_version,
            } => format!(
                "dispatch {} groups g{}..g{} ({} executions, v_d={})",
                groups.len(),
                groups.first().map(|g| g.group.get()).unwrap_or(0),
                groups.last().map(|g| g.group.get()).unwrap_or(0),
                groups.len() as u64 * *executions_per_group as u64,
                policy_version.get()
            ),
            EventBody::BatchOpened { step } => format!("open {step}"),
            EventBody::TransitionBegun { cell, to } => format!("begin {cell} -> {}", to.as_str()),
            EventBody::RoutesUpdated { source, moves } => {
                let mut by_destination: Vec<(EngineId, Vec<ExecutionId>)> = Vec::new();
                for route in moves {
                    match by_destination.last_mut() {
                        Some((to, ids)) if *to == route.to => ids.push(route.execution),
                        _ => by_destination.push((route.to, vec![route.execution])),
                    }
                }
                let parts: Vec<String> = by_destination
                    .iter()
                    .map(|(to, ids)| format!("{}->{to}", id_range(ids)))
                    .collect();
                format!("routes from {source}: {}", parts.join(" "))
            }
            EventBody::JoinWindowClosed { step } => format!("join-window-closed {step}"),
            EventBody::BurstEnded { burst } => format!("burst-ended {burst}"),
            other => format!("{other:?}"),
        });
    }
    flush(&mut starts, &mut lines);
    lines
}

fn id_range(ids: &[ExecutionId]) -> String {
    let contiguous = ids.windows(2).all(|w| w[1].get() == w[0].get() + 1);
    match ids {
        [one] => one.to_string(),
        [first, .., last] if contiguous => format!("{first}..{last}"),
        _ => ids
            .iter()
            .map(|id| id.to_string())
            .collect::<Vec<_>>()
            .join(","),
    }
}

/// Two lines of key state: counters and capacity, then roles, engines, batch and supply.
pub fn render_state(state: &SchedulerState) -> String {
    let roles: Vec<&str> = state
        .cells
        .iter()
        .map(|c| match (c.role, c.switching_to) {
            (Role::Rollout, None) => "R",
            (Role::Training, None) => "T",
            (Role::Rollout, Some(_)) => "R>T",
            (Role::Training, Some(_)) => "T>R",
        })
        .collect();
    let engines: Vec<String> = state
        .engines
        .values()
        .map(|e| {
            let flag = match (e.ready, e.accepting) {
                (true, true) => "",
                (true, false) => "x",
                (false, _) => "!",
            };
            format!("{}:{}/{}{flag}", e.id.get(), e.running.len(), e.capacity)
        })
        .collect();
    let batch = match &state.batch {
        None => "-".to_string(),
        Some(b) => format!(
            "{}{{{} ms={} claimed={} done={}{}{}}}",
            b.step,
            if b.groups.is_empty() {
                "none".to_string()
            } else {
                b.groups
                    .iter()
                    .map(|g| g.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            },
            b.micro_steps.len(),
            b.claimed_count,
            b.micro_steps.values().filter(|m| m.done).count(),
            if b.stream_closed {
                " stream-closed"
            } else {
                ""
            },
            if b.join_window_closed {
                " window-closed"
            } else {
                ""
            },
        ),
    };
    let mut flags = Vec::new();
    if state.dispatch_owed_groups > 0 {
        flags.push(format!("owed={}", state.dispatch_owed_groups));
    }
    if state.burst_end_pending {
        flags.push("burst-end-pending".to_string());
    }
    if state.awaiting_publish {
        flags.push("awaiting-publish".to_string());
    }
    if state.core_decision_pending {
        flags.push("core-decision-pending".to_string());
    }
    let since = state
        .supply_ok_since
        .map(seconds)
        .unwrap_or_else(|| "-".to_string());
    let wakeup = Controller
        .next_wakeup(state)
        .map(seconds)
        .unwrap_or_else(|| "-".to_string());
    let ready: Vec<String> = state
        .ready_unpacked
        .iter()
        .map(|(_, g)| g.to_string())
        .collect();
    format!(
        "  = d={} p={} f={} w={} C_R={} k={} v_t={} v_pub={} burst={}.{}{}\n    roles=[{}] engines=[{}] ready=[{}] batch={} supply={}/{} since={} wakeup={}\n",
        state.dispatched,
        state.started,
        state.finished,
        state.water_level(),
        state.rollout_capacity(),
        state.training_cells(),
        state.training_version.get(),
        state.published_version.get(),
        state.burst,
        state.steps_in_burst,
        if flags.is_empty() { String::new() } else { format!(" {}", flags.join(" ")) },
        roles.join(" "),
        engines.join(" "),
        ready.join(","),
        batch,
        state.supply_groups(),
        state.supply_threshold(),
        since,
        wakeup,
    )
}
