//! Run configuration as it is recorded on the log (the `RunStarted` event).
//!
//! The paper's symbols keep their names: φ (`phi`), μ (`mu`), N (`n`), B (`b`), ρ_min
//! (`rho_min`), τ (`tau`). Validation of user-written TOML happens at the edge (the CLI and the
//! simulator); [`RunConfig::validate`] is the last line of defence and names the bad field.

use crate::Duration;

/// How cells are given roles. All three are configurations of the one scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SchedulingMode {
    /// Cells move between rollout and training one at a time, driven by the water level.
    Elastic,
    /// All cells switch together (one switch unit); no extra dispatch (φ = 0).
    Colocate,
    /// A static partition: the first `async_training_cells` cells train forever, the rest roll out.
    Async,
}

impl SchedulingMode {
    pub fn as_str(self) -> &'static str {
        match self {
            SchedulingMode::Elastic => "elastic",
            SchedulingMode::Colocate => "colocate",
            SchedulingMode::Async => "async",
        }
    }
}

/// Scheduler and trajectory parameters of one run.
#[derive(Clone, Debug, PartialEq)]
pub struct RunConfig {
    /// Seed for every deterministic draw derived from the log (admission draws, for example).
    pub run_seed: u64,
    pub mode: SchedulingMode,
    /// Streaming training: cells may start on a batch before all of its B groups are ready.
    pub streaming: bool,
    /// φ: extra dispatch, in units of B groups (fractional allowed).
    pub phi: f64,
    /// μ: optimizer steps per burst (weights are published after the μ-th).
    pub mu: u32,
    /// N: executions per group.
    pub n: u32,
    /// B: groups per optimizer step.
    pub b: u32,
    /// Number of optimizer steps the run takes; 0 means unbounded.
    pub steps: u32,
    /// ρ_min: fraction of B that must be ready (and unclaimed) before a cell may switch.
    pub rho_min: f64,
    /// τ: how long the supply check must hold continuously.
    pub tau: Duration,
    /// J_max: trajectories admitted per execution.
    pub j_max: u32,
    /// Async only: how many leading cells form the static training partition.
    pub async_training_cells: u32,
}

/// A configuration error naming the offending field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    pub field: &'static str,
    pub message: String,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid `{}`: {}", self.field, self.message)
    }
}

impl std::error::Error for ConfigError {}

fn bad(field: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError {
        field,
        message: message.into(),
    }
}

impl RunConfig {
    /// Initial dispatch in executions: (φ+μ)·N·B, rounded to whole groups.
    pub fn initial_dispatch_groups(&self) -> u64 {
        ((self.phi + self.mu as f64) * self.b as f64).round() as u64
    }

    /// Dispatch after each publish, in groups: μ·B.
    pub fn burst_dispatch_groups(&self) -> u64 {
        self.mu as u64 * self.b as u64
    }

    /// Dispatch after publishing `version`, in groups: μ·B, or B per step still to train when
    /// fewer than μ remain of a run of `steps` (0 once the run is complete; `steps == 0` runs
    /// without end).
    pub fn burst_dispatch_groups_after(&self, version: u64) -> u64 {
        if self.steps == 0 {
            return self.burst_dispatch_groups();
        }
        let remaining = (self.steps as u64).saturating_sub(version);
        remaining.min(self.mu as u64) * self.b as u64
    }

    /// ρ_min·B in groups, rounded up so that a positive ρ_min always demands at least one group.
    pub fn supply_groups_min(&self) -> u64 {
        (self.rho_min * self.b as f64).ceil() as u64
    }

    /// The paper's Theorem A.1: steady-state group-weighted mean staleness φ + (μ−1)/2.
    pub fn expected_staleness(&self) -> f64 {
        self.phi + (self.mu as f64 - 1.0) / 2.0
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if !self.phi.is_finite() || self.phi < 0.0 {
            return Err(bad(
                "phi",
                format!("must be a finite number ≥ 0, got {}", self.phi),
            ));
        }
        if self.mu < 1 {
            return Err(bad(
                "mu",
                "must be ≥ 1 (one burst takes at least one optimizer step)",
            ));
        }
        if self.n < 1 {
            return Err(bad("n", "must be ≥ 1 execution per group"));
        }
        if self.b < 1 {
            return Err(bad("b", "must be ≥ 1 group per step"));
        }
        if !self.rho_min.is_finite() || self.rho_min < 0.0 || self.rho_min > 1.0 {
            return Err(bad(
                "rho_min",
                format!("must lie in [0, 1], got {}", self.rho_min),
            ));
        }
        if self.j_max < 1 {
            return Err(bad("j_max", "must be ≥ 1 trajectory per execution"));
        }
        if self.mode == SchedulingMode::Colocate && self.phi > 0.0 {
            return Err(bad(
                "phi",
                format!(
                    "colocate cannot dispatch extra groups: phi must be 0, got {}",
                    self.phi
                ),
            ));
        }
        if self.mode == SchedulingMode::Async && self.async_training_cells < 1 {
            return Err(bad(
                "async_training_cells",
                "async mode needs at least one cell in the static training partition",
            ));
        }
        // φ·B must be whole groups; a fractional group cannot be dispatched.
        let extra_groups = self.phi * self.b as f64;
        if (extra_groups - extra_groups.round()).abs() > 1e-9 {
            return Err(bad(
                "phi",
                format!("phi·b = {extra_groups} is not a whole number of groups"),
            ));
        }
        Ok(())
    }
}
