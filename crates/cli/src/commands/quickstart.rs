//! `gyre quickstart`: the first thing a new user runs.
//!
//! Today it runs the paper's scheduling ablation (Table 2) on the simulator with the real
//! scheduler, writes an HTML report and the E0 run's event log into an output directory, and
//! prints the table and where everything went. When the embedded CPU policy and the cell workers
//! land, quickstart becomes the embedded end-to-end training run.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use super::simulate::{self, SimulateArgs};

/// Arguments of `gyre quickstart`.
#[derive(Args, Debug)]
pub struct QuickstartArgs {
    /// Where to write the report and the event log.
    #[arg(long, default_value = "gyre-quickstart")]
    out: PathBuf,
    /// Workload seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

pub fn run(args: QuickstartArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let report = args.out.join("table2.html");
    let log = args.out.join("e0.log");
    // The event file writer never overwrites; quickstart owns this file, so replace it.
    if log.exists() {
        std::fs::remove_file(&log)
            .with_context(|| format!("removing the previous {}", log.display()))?;
    }
    println!(
        "gyre quickstart: simulating the paper's Table 2 (NL2RepoBench, 122B, 32 nodes, 12 steps)"
    );
    println!("with the real elastic scheduler on a simulated cluster (no GPU needed).\n");
    simulate::run(SimulateArgs::for_preset(
        "table2",
        args.seed,
        None,
        Some(report.clone()),
        None,
    ))?;
    simulate::run(SimulateArgs::for_preset(
        "table2",
        args.seed,
        Some("E0"),
        None,
        Some(log.clone()),
    ))
    .map(|_| ())?;
    println!(
        "\nreport:    {} (cell role timelines, step durations, staleness)",
        report.display()
    );
    println!(
        "event log: {} (the E0 run, CRC-framed and hash-chained)",
        log.display()
    );
    println!("next:      gyre simulate --preset table2 --row E0 --print-config > e0.toml; edit; gyre simulate --config e0.toml");
    Ok(())
}
