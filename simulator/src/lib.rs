//! gyre-simulator: a discrete-event simulator over the real scheduler.
//!
//! The simulator owns a virtual clock, a seeded workload model (execution and query durations
//! from the paper's reported statistics), a training cost model and switch/publish costs. It
//! feeds `gyre_scheduler::SchedulerState` with the events a real cluster would produce and asks
//! `gyre_scheduler::Controller` for decisions, exactly as the control quorum's leader does. The
//! run is an ordinary event log; the JSON report is computed from it.
//!
//! Determinism: every random draw comes from a ChaCha stream keyed by (seed, entity id), so the
//! same seed gives byte-identical output regardless of event interleaving.

mod config;
mod metrics;
mod presets;
mod report_html;
mod sim;
mod workload;

pub use config::{
    CellsConfig, ConfigError, SimConfig, StandaloneConfig, SwitchConfig, TrainingConfig,
    WorkloadConfig,
};
pub use metrics::{CellTimeline, RoleInterval, RunReport};
pub use presets::{preset_rows, PaperRow, Preset, PresetOverrides, TRAINING_TO_ROLLOUT_WORK_RATIO};
pub use report_html::render_html;
pub use sim::{simulate, try_simulate, SimOutput};
pub use workload::{sample_stats, Workload, WorkloadStats};
