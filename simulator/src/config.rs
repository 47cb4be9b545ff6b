//! The simulator's TOML configuration: one run of one scheduling configuration.
//!
//! Field names are the paper's symbols (`phi`, `mu`, `n`, `b`, `rho_min`, `tau_s`). Unknown keys
//! are rejected; every semantic error names the field (`cells.nodes_per_cell`, `mu`, ...).

use serde::{Deserialize, Serialize};

use gyre_event::{Duration, RunConfig, SchedulingMode};

/// A config error naming the offending field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config is not valid TOML or has an unknown/mistyped key: {0}")]
    Parse(String),
    #[error("invalid `{field}`: {message}")]
    Field { field: String, message: String },
}

fn field_error(field: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::Field {
        field: field.to_string(),
        message: message.into(),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModeName {
    Elastic,
    Colocate,
    Async,
}

/// One simulated run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimConfig {
    /// A label for tables and reports (e.g. "E0").
    #[serde(default = "default_name")]
    pub name: String,
    pub seed: u64,
    /// elastic | colocate | async.
    pub mode: ModeName,
    /// Streaming training: cells train on a batch before all of its B groups are ready.
    pub streaming: bool,
    /// φ: extra dispatch in units of B.
    pub phi: f64,
    /// μ: optimizer steps per burst.
    pub mu: u32,
    /// N: executions per group.
    pub n: u32,
    /// B: groups per step.
    pub b: u32,
    /// Optimizer steps to simulate.
    pub steps: u32,
    /// ρ_min: fraction of B the supply check demands.
    pub rho_min: f64,
    /// τ in seconds: how long the supply check must hold.
    pub tau_s: f64,
    /// Async only: leading cells that form the static training partition.
    #[serde(default)]
    pub async_training_cells: u32,
    pub cells: CellsConfig,
    #[serde(default)]
    pub standalone: StandaloneConfig,
    pub workload: WorkloadConfig,
    pub training: TrainingConfig,
    #[serde(default)]
    pub switch: SwitchConfig,
}

fn default_name() -> String {
    "custom".to_string()
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CellsConfig {
    /// K: number of elastic cells (cell 0 is the core).
    pub count: u32,
    pub nodes_per_cell: u32,
    /// Concurrent executions one node serves in rollout role (C_e = this × nodes_per_cell).
    pub capacity_per_node: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StandaloneConfig {
    /// Nodes of the standalone rollout pool (C_s = nodes × cells.capacity_per_node).
    pub nodes: u32,
}

/// The rollout workload: per-query difficulty times per-execution noise, both log-normal, capped
/// by the harness timeout. See docs/design/20261202_simulator_calibration.md.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadConfig {
    /// A name for the profile (e.g. "nl2repo-122b").
    pub profile: String,
    /// Median of the per-query duration scale, hours.
    pub query_median_h: f64,
    /// Log-space standard deviation of the per-query scale (between-query spread).
    pub query_sigma: f64,
    /// Log-space standard deviation of executions around their query's scale.
    pub execution_sigma: f64,
    /// The harness's own time limit, hours; work is still scored (status harness-timeout).
    pub harness_timeout_h: f64,
    /// The execution's whole budget, hours; no valid reward (status overall-timeout, excluded).
    pub overall_timeout_h: f64,
    /// Probability that a harness-timed-out execution also exhausts its evaluation budget.
    pub overall_given_harness_timeout: f64,
    /// Probability of a total failure with nothing to evaluate (becomes a zero-reward dummy).
    #[serde(default)]
    pub total_failure_rate: f64,
    /// Extra seconds an execution loses when its calls are rerouted (prefix recompute).
    #[serde(default)]
    pub reroute_penalty_s: f64,
}

/// Training cost model. Throughput scales with nodes; see the calibration note.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainingConfig {
    /// Node-hours of forward/backward work for one step's B groups.
    pub node_hours_per_step: f64,
    /// Micro-steps each group is packed into.
    pub micro_steps_per_group: u32,
    /// One pipeline fill plus one drain, paid once per cell per batch, seconds.
    pub pipeline_fill_drain_s: f64,
    /// Gradient reduce, clip and optimizer update on the core, seconds.
    pub optimizer_s: f64,
    /// A satellite pulling the core's weights before it can train, seconds.
    pub weight_pull_s: f64,
    /// Publishing new weights to every rollout engine at burst end, seconds.
    pub publish_s: f64,
    /// The smallest cell that fits the model's memory and training parallelism, nodes.
    pub min_nodes_per_cell: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwitchConfig {
    /// Measured in the paper: 8.52 s.
    pub rollout_to_training_s: f64,
    /// Measured in the paper: 3.46 s.
    pub training_to_rollout_s: f64,
}

impl Default for SwitchConfig {
    fn default() -> Self {
        Self {
            rollout_to_training_s: 8.52,
            training_to_rollout_s: 3.46,
        }
    }
}

/// Largest duration in seconds a field may hold (about 116 days): simulated time is a u64 of
/// nanoseconds, and sums of durations must stay far from its end.
const SECONDS_MAX: f64 = 1e7;
/// Largest duration in hours (about 11 years).
const HOURS_MAX: f64 = 1e5;
/// Largest log-space standard deviation of a duration scale: e^(10·z) is already far past any
/// horizon, and larger ones overflow to infinity.
const SIGMA_MAX: f64 = 10.0;
/// Largest count of steps, groups per step or executions per group, and of nodes.
const COUNT_MAX: u32 = 1_000_000;
/// Largest count of executions per step (B·N) and of nodes in all (cells and standalone).
const PRODUCT_MAX: u64 = 10_000_000;

/// `value` ≤ `max` (NaN passes: the finite checks name it).
fn at_most(field: &str, value: f64, max: f64) -> Result<(), ConfigError> {
    if value.is_nan() || value <= max {
        Ok(())
    } else {
        Err(field_error(
            field,
            format!("must be at most {max}, got {value}"),
        ))
    }
}

fn count_at_most(field: &str, value: u32, max: u32) -> Result<(), ConfigError> {
    if value <= max {
        Ok(())
    } else {
        Err(field_error(
            field,
            format!("must be at most {max}, got {value}"),
        ))
    }
}

fn positive(field: &str, value: f64) -> Result<(), ConfigError> {
    if value.is_finite() && value > 0.0 {
        Ok(())
    } else {
        Err(field_error(
            field,
            format!("must be a finite number > 0, got {value}"),
        ))
    }
}

fn non_negative(field: &str, value: f64) -> Result<(), ConfigError> {
    if value.is_finite() && value >= 0.0 {
        Ok(())
    } else {
        Err(field_error(
            field,
            format!("must be a finite number ≥ 0, got {value}"),
        ))
    }
}

fn probability(field: &str, value: f64) -> Result<(), ConfigError> {
    if (0.0..=1.0).contains(&value) {
        Ok(())
    } else {
        Err(field_error(
            field,
            format!("must lie in [0, 1], got {value}"),
        ))
    }
}

impl SimConfig {
    /// Parse and validate a TOML config.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let config: SimConfig =
            toml::from_str(text).map_err(|error| ConfigError::Parse(error.to_string()))?;
        config.validate()?;
        Ok(config)
    }

    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("a SimConfig always serialises to TOML")
    }

    pub fn scheduling_mode(&self) -> SchedulingMode {
        match self.mode {
            ModeName::Elastic => SchedulingMode::Elastic,
            ModeName::Colocate => SchedulingMode::Colocate,
            ModeName::Async => SchedulingMode::Async,
        }
    }

    /// Colocate is one switch unit: all cells together. The simulator merges them into one cell
    /// so the same serial-transition code moves the whole pool at once.
    pub fn effective_cells(&self) -> (u32, u32) {
        match self.mode {
            ModeName::Colocate => (1, self.cells.count * self.cells.nodes_per_cell),
            _ => (self.cells.count, self.cells.nodes_per_cell),
        }
    }

    pub fn total_nodes(&self) -> u32 {
        self.cells.count * self.cells.nodes_per_cell + self.standalone.nodes
    }

    /// Switch granularity as the paper's Table 2 names it.
    pub fn granularity(&self) -> &'static str {
        match (self.mode, self.cells.count) {
            (ModeName::Async, _) => "static",
            (ModeName::Colocate, _) if self.standalone.nodes == 0 => "global",
            (_, 1) => "coarse",
            _ => "fine",
        }
    }

    pub fn run_config(&self) -> RunConfig {
        RunConfig {
            run_seed: self.seed,
            mode: self.scheduling_mode(),
            streaming: self.streaming,
            phi: self.phi,
            mu: self.mu,
            n: self.n,
            b: self.b,
            steps: self.steps,
            rho_min: self.rho_min,
            tau: Duration::from_secs_f64(self.tau_s),
            j_max: 5,
            async_training_cells: self.async_training_cells,
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.mu < 1 {
            return Err(field_error(
                "mu",
                "must be ≥ 1 (a burst takes at least one step)",
            ));
        }
        non_negative("phi", self.phi)?;
        if self.mode == ModeName::Colocate && self.phi > 0.0 {
            return Err(field_error(
                "phi",
                format!(
                    "colocate cannot dispatch extra groups: phi must be 0, got {}",
                    self.phi
                ),
            ));
        }
        if self.n < 1 {
            return Err(field_error("n", "must be ≥ 1 execution per group"));
        }
        if self.b < 1 {
            return Err(field_error("b", "must be ≥ 1 group per step"));
        }
        if self.steps < 1 {
            return Err(field_error(
                "steps",
                "must be ≥ 1 (the simulator runs a finite number of steps)",
            ));
        }
        count_at_most("n", self.n, COUNT_MAX)?;
        count_at_most("b", self.b, COUNT_MAX)?;
        count_at_most("steps", self.steps, COUNT_MAX)?;
        count_at_most("mu", self.mu, self.steps.max(1)).map_err(|_| {
            field_error(
                "mu",
                format!(
                    "a burst of {} steps is longer than the run's {} steps",
                    self.mu, self.steps
                ),
            )
        })?;
        if u64::from(self.b) * u64::from(self.n) > PRODUCT_MAX {
            return Err(field_error(
                "n",
                format!(
                    "b·n = {} executions per step; at most {PRODUCT_MAX} are simulated",
                    u64::from(self.b) * u64::from(self.n)
                ),
            ));
        }
        probability("rho_min", self.rho_min)?;
        non_negative("tau_s", self.tau_s)?;
        at_most("tau_s", self.tau_s, SECONDS_MAX)?;
        count_at_most("cells.count", self.cells.count, COUNT_MAX)?;
        count_at_most("cells.nodes_per_cell", self.cells.nodes_per_cell, COUNT_MAX)?;
        count_at_most(
            "cells.capacity_per_node",
            self.cells.capacity_per_node,
            COUNT_MAX,
        )?;
        count_at_most("standalone.nodes", self.standalone.nodes, COUNT_MAX)?;
        let nodes = u64::from(self.cells.count) * u64::from(self.cells.nodes_per_cell)
            + u64::from(self.standalone.nodes);
        if nodes > PRODUCT_MAX {
            return Err(field_error(
                "cells.nodes_per_cell",
                format!("{nodes} nodes in all; at most {PRODUCT_MAX} are simulated"),
            ));
        }
        if self.cells.count < 1 {
            return Err(field_error("cells.count", "must be ≥ 1 cell"));
        }
        if self.cells.capacity_per_node < 1 {
            return Err(field_error(
                "cells.capacity_per_node",
                "must be ≥ 1 concurrent execution",
            ));
        }
        if self.cells.nodes_per_cell < self.training.min_nodes_per_cell {
            return Err(field_error(
                "cells.nodes_per_cell",
                format!(
                    "a cell of {} nodes is too small: the model needs at least {} nodes (training.min_nodes_per_cell) to train",
                    self.cells.nodes_per_cell, self.training.min_nodes_per_cell
                ),
            ));
        }
        match self.mode {
            ModeName::Async => {
                if self.async_training_cells < 1 || self.async_training_cells > self.cells.count {
                    return Err(field_error(
                        "async_training_cells",
                        format!(
                            "async needs 1..={} cells in the static training partition, got {}",
                            self.cells.count, self.async_training_cells
                        ),
                    ));
                }
                if self.async_training_cells == self.cells.count && self.standalone.nodes == 0 {
                    return Err(field_error(
                        "async_training_cells",
                        "every node trains: async needs rollout cells or a standalone pool",
                    ));
                }
            }
            _ => {
                if self.async_training_cells != 0 {
                    return Err(field_error(
                        "async_training_cells",
                        "only meaningful with mode = \"async\"",
                    ));
                }
            }
        }
        let extra = self.phi * self.b as f64;
        if (extra - extra.round()).abs() > 1e-9 {
            return Err(field_error(
                "phi",
                format!("phi·b = {extra} must be a whole number of groups"),
            ));
        }
        let w = &self.workload;
        positive("workload.query_median_h", w.query_median_h)?;
        at_most("workload.query_median_h", w.query_median_h, HOURS_MAX)?;
        non_negative("workload.query_sigma", w.query_sigma)?;
        at_most("workload.query_sigma", w.query_sigma, SIGMA_MAX)?;
        non_negative("workload.execution_sigma", w.execution_sigma)?;
        at_most("workload.execution_sigma", w.execution_sigma, SIGMA_MAX)?;
        positive("workload.harness_timeout_h", w.harness_timeout_h)?;
        at_most("workload.harness_timeout_h", w.harness_timeout_h, HOURS_MAX)?;
        at_most("workload.overall_timeout_h", w.overall_timeout_h, HOURS_MAX)?;
        if !(w.overall_timeout_h.is_finite() && w.overall_timeout_h >= w.harness_timeout_h) {
            return Err(field_error(
                "workload.overall_timeout_h",
                format!(
                    "must be ≥ workload.harness_timeout_h ({}), got {}",
                    w.harness_timeout_h, w.overall_timeout_h
                ),
            ));
        }
        probability(
            "workload.overall_given_harness_timeout",
            w.overall_given_harness_timeout,
        )?;
        probability("workload.total_failure_rate", w.total_failure_rate)?;
        non_negative("workload.reroute_penalty_s", w.reroute_penalty_s)?;
        at_most(
            "workload.reroute_penalty_s",
            w.reroute_penalty_s,
            SECONDS_MAX,
        )?;
        let t = &self.training;
        positive("training.node_hours_per_step", t.node_hours_per_step)?;
        at_most(
            "training.node_hours_per_step",
            t.node_hours_per_step,
            HOURS_MAX * 100.0,
        )?;
        count_at_most(
            "training.micro_steps_per_group",
            t.micro_steps_per_group,
            COUNT_MAX,
        )?;
        count_at_most(
            "training.min_nodes_per_cell",
            t.min_nodes_per_cell,
            COUNT_MAX,
        )?;
        for (field, value) in [
            ("training.pipeline_fill_drain_s", t.pipeline_fill_drain_s),
            ("training.optimizer_s", t.optimizer_s),
            ("training.weight_pull_s", t.weight_pull_s),
            ("training.publish_s", t.publish_s),
            (
                "switch.rollout_to_training_s",
                self.switch.rollout_to_training_s,
            ),
            (
                "switch.training_to_rollout_s",
                self.switch.training_to_rollout_s,
            ),
        ] {
            at_most(field, value, SECONDS_MAX)?;
        }
        if t.micro_steps_per_group < 1 {
            return Err(field_error("training.micro_steps_per_group", "must be ≥ 1"));
        }
        non_negative("training.pipeline_fill_drain_s", t.pipeline_fill_drain_s)?;
        non_negative("training.optimizer_s", t.optimizer_s)?;
        non_negative("training.weight_pull_s", t.weight_pull_s)?;
        non_negative("training.publish_s", t.publish_s)?;
        if t.min_nodes_per_cell < 1 {
            return Err(field_error("training.min_nodes_per_cell", "must be ≥ 1"));
        }
        non_negative(
            "switch.rollout_to_training_s",
            self.switch.rollout_to_training_s,
        )?;
        non_negative(
            "switch.training_to_rollout_s",
            self.switch.training_to_rollout_s,
        )?;
        // The rollout side must be able to run at least one execution, or nothing ever finishes.
        let rollout_nodes = match self.mode {
            ModeName::Async => {
                (self.cells.count - self.async_training_cells) * self.cells.nodes_per_cell
                    + self.standalone.nodes
            }
            _ => self.total_nodes(),
        };
        if rollout_nodes == 0 {
            return Err(field_error(
                "standalone.nodes",
                "no node is ever in rollout role",
            ));
        }
        self.run_config()
            .validate()
            .map_err(|error| field_error(error.field, error.message))
    }
}
