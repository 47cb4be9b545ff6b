//! The paper's experiments as simulator presets.
//!
//! `table2` is the paper's scheduling ablation on NL2RepoBench with Qwen 3.6 122B (12 steps,
//! 32 nodes, E[d] = 1.5): rows A0–A3, C0–C3, E0–E2. `table1` is the cross-workload comparison
//! (DeepSWE and TerminalBench at E[d] = 1 and 1.5, 24 steps; the 2.4T NL2RepoBench run, 48 steps)
//! of Gyre against Async and Colocate. Every row is a configuration of the same scheduler; every
//! workload and cost constant comes from one calibration (docs/design/20261202_simulator_calibration.md),
//! never from a per-row fit.

use crate::config::ModeName;
use crate::{
    CellsConfig, SimConfig, StandaloneConfig, SwitchConfig, TrainingConfig, WorkloadConfig,
};

/// A preset: a named set of rows with the paper's figures beside them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preset {
    Table2,
    Table1,
}

impl Preset {
    pub fn parse(name: &str) -> Option<Preset> {
        match name {
            "table2" => Some(Preset::Table2),
            "table1" => Some(Preset::Table1),
            _ => None,
        }
    }
}

/// One row: the config and what the paper reports for it.
#[derive(Clone, Debug)]
pub struct PaperRow {
    pub id: String,
    /// The row this one's speed is compared with (E0 in table 2; the Gyre row in table 1).
    pub reference: String,
    pub description: String,
    pub config: SimConfig,
    /// Paper's total hours, where it reports them.
    pub paper_hours: Option<f64>,
    /// Paper's ratio (total hours / reference hours), where it reports one.
    pub paper_ratio: Option<f64>,
}

/// Capacity per node in rollout role: NL2RepoBench 122B runs 144 executions per 4-node cell.
const NL2REPO_122B_CAPACITY_PER_NODE: u32 = 36;
/// DeepSWE and TerminalBench run 192 executions per 4-node cell.
const SWE_CAPACITY_PER_NODE: u32 = 48;
/// The 2.4T run serves 384 executions on 4 cells of 48 nodes.
const FLAGSHIP_CAPACITY_PER_NODE: u32 = 2;

/// Calibrated training cost, expressed as the ratio of training node-time to rollout node-time per
/// group (see the calibration note). Used to derive node-hours per step for every workload.
pub const TRAINING_TO_ROLLOUT_WORK_RATIO: f64 = 0.5;

/// NL2RepoBench on Qwen 3.6 122B: execution mean 1.93 h, query mean 2.96 h, 9.51% of queries over
/// 4 h, 6.25% harness timeouts (scored), 0.87% overall timeouts (discarded).
pub fn nl2repo_122b_workload() -> WorkloadConfig {
    WorkloadConfig {
        profile: "nl2repo-122b".to_string(),
        query_median_h: 1.70,
        query_sigma: 0.50,
        execution_sigma: 0.28,
        harness_timeout_h: 4.0,
        overall_timeout_h: 4.2,
        overall_given_harness_timeout: 0.122,
        total_failure_rate: 0.002,
        reroute_penalty_s: 20.0,
    }
}

/// NL2RepoBench on Qwen 3.8 2.4T: 61.1% of queries over 4 h; 38.2% of the longest executions end
/// by overall timeout; timeouts relaxed relative to 122B.
pub fn nl2repo_flagship_workload() -> WorkloadConfig {
    WorkloadConfig {
        profile: "nl2repo-2.4t".to_string(),
        query_median_h: 2.8,
        query_sigma: 0.44,
        execution_sigma: 0.28,
        harness_timeout_h: 4.4,
        overall_timeout_h: 4.6,
        overall_given_harness_timeout: 0.30,
        total_failure_rate: 0.002,
        reroute_penalty_s: 60.0,
    }
}

/// DeepSWE: the paper reports no duration statistics; issue-resolution executions are an order of
/// magnitude shorter than repository generation. We keep NL2RepoBench's shape (the same σs and
/// timeout-to-median proportions) and scale the median.
pub fn deepswe_workload() -> WorkloadConfig {
    scaled_shape("deepswe-122b", 0.45)
}

/// TerminalBench: no duration statistics in the paper; same shape, shorter median.
pub fn terminalbench_workload() -> WorkloadConfig {
    scaled_shape("terminalbench-122b", 0.30)
}

fn scaled_shape(profile: &str, median_h: f64) -> WorkloadConfig {
    let base = nl2repo_122b_workload();
    WorkloadConfig {
        profile: profile.to_string(),
        query_median_h: median_h,
        ..base
    }
}

/// Mean execution hours of a workload, estimated once from a fixed sample.
fn mean_execution_hours(workload: &WorkloadConfig, n: u32) -> f64 {
    crate::sample_stats(workload, n, 0xCA11_B8A7, 4_000).execution_mean_h
}

/// Training cost from the calibrated work ratio: node-hours per step =
/// ratio × B × N × mean execution hours / capacity per node.
fn training_for(
    workload: &WorkloadConfig,
    n: u32,
    b: u32,
    capacity_per_node: u32,
    min_nodes: u32,
    publish_s: f64,
    ratio: f64,
) -> TrainingConfig {
    let rollout_node_hours_per_group =
        n as f64 * mean_execution_hours(workload, n) / capacity_per_node as f64;
    TrainingConfig {
        node_hours_per_step: ratio * rollout_node_hours_per_group * b as f64,
        micro_steps_per_group: 4,
        pipeline_fill_drain_s: 90.0,
        optimizer_s: 45.0,
        weight_pull_s: 30.0,
        publish_s,
        min_nodes_per_cell: min_nodes,
    }
}

struct Shape {
    mode: ModeName,
    streaming: bool,
    phi: f64,
    mu: u32,
    cells: u32,
    nodes_per_cell: u32,
    standalone_nodes: u32,
    async_training_cells: u32,
}

#[allow(clippy::too_many_arguments)] // one row of the paper's tables, named at each call site
fn build(
    name: &str,
    seed: u64,
    shape: Shape,
    workload: &WorkloadConfig,
    training: &TrainingConfig,
    n: u32,
    b: u32,
    steps: u32,
    capacity_per_node: u32,
) -> SimConfig {
    SimConfig {
        name: name.to_string(),
        seed,
        mode: shape.mode,
        streaming: shape.streaming,
        phi: shape.phi,
        mu: shape.mu,
        n,
        b,
        steps,
        rho_min: 0.25,
        tau_s: 120.0,
        async_training_cells: shape.async_training_cells,
        cells: CellsConfig {
            count: shape.cells,
            nodes_per_cell: shape.nodes_per_cell,
            capacity_per_node,
        },
        standalone: StandaloneConfig {
            nodes: shape.standalone_nodes,
        },
        workload: workload.clone(),
        training: training.clone(),
        switch: SwitchConfig::default(),
    }
}

#[allow(clippy::too_many_arguments)]
fn shape(
    mode: ModeName,
    streaming: bool,
    phi: f64,
    mu: u32,
    cells: u32,
    nodes_per_cell: u32,
    standalone_nodes: u32,
    async_training_cells: u32,
) -> Shape {
    Shape {
        mode,
        streaming,
        phi,
        mu,
        cells,
        nodes_per_cell,
        standalone_nodes,
        async_training_cells,
    }
}

/// Changes to a preset: `n` and `b` override the paper's values (robustness checks: elastic must
/// stay ahead when B or N change); `training_work_ratio` replaces the calibrated
/// [`TRAINING_TO_ROLLOUT_WORK_RATIO`] (for sensitivity studies only).
#[derive(Clone, Copy, Debug, Default)]
pub struct PresetOverrides {
    pub n: Option<u32>,
    pub b: Option<u32>,
    pub training_work_ratio: Option<f64>,
}

/// The rows of a preset for one seed.
pub fn preset_rows(preset: Preset, seed: u64, overrides: PresetOverrides) -> Vec<PaperRow> {
    let ratio = overrides
        .training_work_ratio
        .unwrap_or(TRAINING_TO_ROLLOUT_WORK_RATIO);
    match preset {
        Preset::Table2 => table2(
            seed,
            overrides.n.unwrap_or(16),
            overrides.b.unwrap_or(32),
            ratio,
        ),
        Preset::Table1 => table1(seed, overrides.n, overrides.b, ratio),
    }
}

fn table2(seed: u64, n: u32, b: u32, ratio: f64) -> Vec<PaperRow> {
    use ModeName::*;
    let workload = nl2repo_122b_workload();
    let training = training_for(
        &workload,
        n,
        b,
        NL2REPO_122B_CAPACITY_PER_NODE,
        4,
        90.0,
        ratio,
    );
    let rows: [(&str, &str, Shape, f64, f64); 11] = [
        (
            "A0",
            "original Async, 16 T / 16 R",
            shape(Async, false, 1.5, 1, 8, 4, 0, 4),
            25.08,
            1.556,
        ),
        (
            "A1",
            "A0 with 8 T / 24 R",
            shape(Async, false, 1.5, 1, 8, 4, 0, 2),
            27.01,
            1.676,
        ),
        (
            "A2",
            "A0 with multi-step bursts",
            shape(Async, false, 0.5, 3, 8, 4, 0, 4),
            32.58,
            2.021,
        ),
        (
            "A3",
            "A0 with streaming",
            shape(Async, true, 1.5, 1, 8, 4, 0, 4),
            22.18,
            1.376,
        ),
        (
            "C0",
            "original Colocate, 32 C / 0 S, global switch",
            shape(Colocate, false, 0.0, 4, 8, 4, 0, 0),
            23.23,
            1.442,
        ),
        (
            "C1",
            "C0 with standalone rollout nodes, 28 C / 4 S",
            shape(Elastic, false, 0.5, 3, 1, 28, 4, 0),
            22.56,
            1.400,
        ),
        (
            "C2",
            "C1 with streaming",
            shape(Elastic, true, 0.5, 3, 1, 28, 4, 0),
            19.23,
            1.193,
        ),
        (
            "C3",
            "C2 with 16 C / 16 S",
            shape(Elastic, true, 0.5, 3, 1, 16, 16, 0),
            20.69,
            1.284,
        ),
        (
            "E0",
            "C2 with fine-grained elastic cells, 8 × 4 nodes",
            shape(Elastic, true, 0.5, 3, 8, 4, 0, 0),
            16.12,
            1.000,
        ),
        (
            "E1",
            "E0 with single-step bursts",
            shape(Elastic, true, 1.5, 1, 8, 4, 0, 0),
            17.87,
            1.109,
        ),
        (
            "E2",
            "E0 with 4 × 8-node cells",
            shape(Elastic, true, 0.5, 3, 4, 8, 0, 0),
            16.47,
            1.022,
        ),
    ];
    rows.into_iter()
        .map(|(id, description, shape, hours, ratio)| PaperRow {
            id: id.to_string(),
            reference: "E0".to_string(),
            description: description.to_string(),
            config: build(
                id,
                seed,
                shape,
                &workload,
                &training,
                n,
                b,
                12,
                NL2REPO_122B_CAPACITY_PER_NODE,
            ),
            paper_hours: Some(hours),
            paper_ratio: Some(ratio),
        })
        .collect()
}

fn table1(seed: u64, n: Option<u32>, b: Option<u32>, ratio: f64) -> Vec<PaperRow> {
    use ModeName::*;
    let mut rows = Vec::new();
    // (workload, E[d], Gyre (φ, μ), paper speed-up vs Async, vs Colocate)
    let swe: [(&str, WorkloadConfig, f64, f64, u32, f64, f64); 4] = [
        ("DeepSWE", deepswe_workload(), 1.0, 0.5, 2, 1.569, 1.610),
        ("DeepSWE", deepswe_workload(), 1.5, 0.5, 3, 1.572, 1.824),
        (
            "TerminalBench",
            terminalbench_workload(),
            1.0,
            0.5,
            2,
            1.383,
            1.809,
        ),
        (
            "TerminalBench",
            terminalbench_workload(),
            1.5,
            0.5,
            3,
            1.430,
            1.849,
        ),
    ];
    for (bench, workload, staleness, phi, mu, vs_async, vs_colocate) in swe {
        let (n, b) = (n.unwrap_or(16), b.unwrap_or(48));
        let training = training_for(&workload, n, b, SWE_CAPACITY_PER_NODE, 4, 90.0, ratio);
        let tag = format!("{bench} E[d]={staleness}");
        let gyre_id = format!("{tag} Gyre");
        let colocate_mu = (2.0 * staleness + 1.0).round() as u32;
        let variants = [
            (
                format!("{tag} Gyre"),
                shape(Elastic, true, phi, mu, 6, 4, 0, 0),
                None,
            ),
            (
                format!("{tag} Async"),
                shape(Async, false, staleness, 1, 6, 4, 0, 3),
                Some(vs_async),
            ),
            (
                format!("{tag} Colocate"),
                shape(Colocate, false, 0.0, colocate_mu, 6, 4, 0, 0),
                Some(vs_colocate),
            ),
        ];
        for (id, shape, ratio) in variants {
            rows.push(PaperRow {
                reference: gyre_id.clone(),
                description: format!("{bench}, 24 nodes in 6 cells, 24 steps"),
                config: build(
                    &id,
                    seed,
                    shape,
                    &workload,
                    &training,
                    n,
                    b,
                    24,
                    SWE_CAPACITY_PER_NODE,
                ),
                id,
                paper_hours: None,
                paper_ratio: ratio,
            });
        }
    }
    let workload = nl2repo_flagship_workload();
    let (n, b) = (n.unwrap_or(16), b.unwrap_or(16));
    let training = training_for(
        &workload,
        n,
        b,
        FLAGSHIP_CAPACITY_PER_NODE,
        48,
        300.0,
        ratio,
    );
    let flagship = [
        (
            "2.4T Gyre",
            shape(Elastic, true, 0.5, 3, 4, 48, 0, 0),
            75.42,
            None,
        ),
        (
            "2.4T Async",
            shape(Async, false, 1.5, 1, 4, 48, 0, 2),
            134.55,
            Some(1.78),
        ),
        (
            "2.4T Colocate",
            shape(Colocate, false, 0.0, 4, 4, 48, 0, 0),
            91.47,
            Some(1.21),
        ),
    ];
    for (id, shape, hours, ratio) in flagship {
        rows.push(PaperRow {
            id: id.to_string(),
            reference: "2.4T Gyre".to_string(),
            description: "NL2RepoBench on Qwen 3.8 2.4T, 4 cells × 48 nodes, 48 steps".to_string(),
            config: build(
                id,
                seed,
                shape,
                &workload,
                &training,
                n,
                b,
                48,
                FLAGSHIP_CAPACITY_PER_NODE,
            ),
            paper_hours: Some(hours),
            paper_ratio: ratio,
        });
    }
    rows
}
