//! `gyre quickstart`: the first thing a new user runs.
//!
//! Today it runs the paper's scheduling ablation (Table 2) on the simulator with the real
//! scheduler, writes an HTML report and the E0 run's event log into an output directory, and
//! prints the table and where everything went. When the embedded CPU policy and the cell workers
//! land, quickstart becomes the embedded end-to-end training run.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use gyre_simulator::{preset_rows, Preset, PresetOverrides};

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
    outln!(
        "gyre quickstart: simulating the paper's Table 2 (NL2RepoBench, 122B, 32 nodes, 12 steps)"
    );
    outln!("with the real elastic scheduler on a simulated cluster (no GPU needed).\n");
    let rows = preset_rows(Preset::Table2, args.seed, PresetOverrides::default());
    for row in &rows {
        row.config
            .validate()
            .with_context(|| format!("preset row {} is not valid", row.id))?;
    }
    let e0 = rows
        .iter()
        .position(|row| row.id == "E0")
        .context("preset table2 has no row E0")?;
    // Each row is simulated once: the E0 run that the table shows is the one its log records.
    let run = super::simulate::simulate_rows(
        "table2",
        args.seed,
        &rows,
        None,
        Some((e0, &log)),
        Some(&report),
    )?;
    out!("{}", run.text);
    outln!(
        "\nreport:    {} (cell role timelines, step durations, staleness)",
        report.display()
    );
    let written = run.log.context("the E0 event log was not written")?;
    outln!("event log: {written}");
    outln!(
        "           (the E0 run, CRC-framed and hash-chained: `gyre replay {}`)",
        log.display()
    );
    outln!("next:      gyre simulate --preset table2 --row E0 --print-config > e0.toml; edit; gyre simulate --config e0.toml");
    Ok(())
}
