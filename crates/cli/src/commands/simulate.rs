//! `gyre simulate`: run the real scheduler on a simulated cluster.
//!
//! Presets reproduce the paper's tables (`--preset table2`, `--preset table1`); `--config FILE`
//! runs one TOML configuration; `--print-config` shows a preset row as a complete TOML file to
//! start from. Output is a table (default) or JSON (`--json`), and optionally a self-contained
//! HTML report with role timelines (`--report out.html`).

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use gyre_simulator::{
    preset_rows, render_html, simulate, PaperRow, Preset, PresetOverrides, RunReport, SimConfig,
};

/// Arguments of `gyre simulate`.
#[derive(Args, Debug)]
#[command(
    allow_negative_numbers = true,
    after_long_help = "Examples:\n  gyre simulate --preset table2\n  gyre simulate --preset table2 --row E0 --print-config > e0.toml\n  gyre simulate --config e0.toml --seed 7 --json\n  gyre simulate --preset table1 --report table1.html"
)]
pub struct SimulateArgs {
    /// A preset of the paper: `table2` (scheduling ablation A0–E2, NL2RepoBench 122B, 12 steps) or
    /// `table1` (DeepSWE / TerminalBench at E[d] = 1 and 1.5, and the 2.4T run).
    #[arg(long, conflicts_with = "config")]
    preset: Option<String>,
    /// Only this row of the preset (e.g. `E0`, or `2.4T Gyre`).
    #[arg(long, requires = "preset")]
    row: Option<String>,
    /// Print the selected row as a complete TOML config and exit.
    #[arg(long, requires = "row")]
    print_config: bool,
    /// Run one TOML config (see `--print-config` for every field).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Seed for the workload; overrides the config's `seed`.
    #[arg(long)]
    seed: Option<u64>,
    /// Override N (executions per group) in every preset row.
    #[arg(long, requires = "preset")]
    n: Option<u32>,
    /// Override B (groups per step) in every preset row.
    #[arg(long, requires = "preset")]
    b: Option<u32>,
    /// Print JSON (one report, or the table with every row's report) instead of a table.
    #[arg(long)]
    json: bool,
    /// Also write the run's event log (the same CRC-framed, hash-chained format the control quorum
    /// exports) for `gyre replay` and `gyre audit`. Only with `--config` or a single `--row`.
    #[arg(long, value_name = "FILE")]
    log: Option<PathBuf>,
    /// Also write a self-contained HTML report (role timelines, step durations, staleness).
    #[arg(long, value_name = "FILE")]
    report: Option<PathBuf>,
    /// Sensitivity study: replace the calibrated training-to-rollout work ratio (above 0).
    #[arg(long, requires = "preset", value_parser = super::values::positive)]
    training_work_ratio: Option<f64>,
    /// Print the sampled statistics of each workload profile in the preset beside the paper's
    /// figures (the calibration check) and exit.
    #[arg(long, requires = "preset")]
    workload_stats: bool,
    /// Worker threads for preset sweeps (default: available cores).
    #[arg(long)]
    threads: Option<usize>,
}

#[derive(Serialize)]
struct TableRow {
    id: String,
    description: String,
    reference: String,
    total_hours: f64,
    ratio: f64,
    paper_hours: Option<f64>,
    paper_ratio: Option<f64>,
    ratio_error_percent: Option<f64>,
    mean_staleness: f64,
    expected_staleness: f64,
}

#[derive(Serialize)]
struct TableOutput {
    preset: String,
    seed: u64,
    rows: Vec<TableRow>,
    order_matches_paper: Option<bool>,
    reports: Vec<RunReport>,
}

pub fn run(args: SimulateArgs) -> anyhow::Result<()> {
    if let Some(path) = &args.config {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading config {}", path.display()))?;
        let mut config = SimConfig::from_toml(&text)
            .with_context(|| format!("config {} is not valid", path.display()))?;
        if let Some(seed) = args.seed {
            config.seed = seed;
        }
        let output = gyre_simulator::try_simulate(&config)
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("config {}", path.display()))?;
        if let Some(log_path) = &args.log {
            let written = write_log(log_path, &output)?;
            eprintln!("event log: {written}");
        }
        if let Some(report_path) = &args.report {
            let html = render_html(
                &format!("Gyre simulation: {}", config.name),
                std::slice::from_ref(&output.report),
                None,
            );
            std::fs::write(report_path, html)
                .with_context(|| format!("writing {}", report_path.display()))?;
        }
        if args.json {
            outln!("{}", serde_json::to_string_pretty(&output.report)?);
        } else {
            print_single(&output.report);
            if let Some(report_path) = &args.report {
                outln!("report: {}", report_path.display());
            }
        }
        return Ok(());
    }
    let Some(preset_name) = &args.preset else {
        bail!("give --preset table2|table1 or --config FILE (see gyre simulate --help)");
    };
    let preset = Preset::parse(preset_name)
        .with_context(|| format!("unknown preset `{preset_name}`: expected table2 or table1"))?;
    let seed = args.seed.unwrap_or(1);
    let overrides = PresetOverrides {
        n: args.n,
        b: args.b,
        training_work_ratio: args.training_work_ratio,
    };
    let mut rows = preset_rows(preset, seed, overrides);
    if let Some(row) = &args.row {
        let known: Vec<String> = rows.iter().map(|r| r.id.clone()).collect();
        rows.retain(|r| &r.id == row);
        if rows.is_empty() {
            bail!(
                "preset {preset_name} has no row `{row}`; rows: {}",
                known.join(", ")
            );
        }
    }
    // Validated before anything is printed: `--print-config` must not show a config that
    // `--config` would then refuse. The error names the flags that made the row invalid (a
    // derived field such as `training.node_hours_per_step` alone would not tell the user).
    let flags = override_flags(&args);
    for row in &rows {
        row.config.validate().with_context(|| {
            if flags.is_empty() {
                format!("preset row {} is not valid", row.id)
            } else {
                format!("preset row {} is not valid with {flags}", row.id)
            }
        })?;
    }
    if args.print_config {
        out!("{}", rows[0].config.to_toml());
        return Ok(());
    }
    if args.workload_stats {
        print_workload_stats(&rows, seed);
        return Ok(());
    }
    let log = match &args.log {
        Some(_) if rows.len() != 1 => {
            bail!("--log needs one run: add --row ID (or use --config FILE)")
        }
        Some(path) => Some((0, path.as_path())),
        None => None,
    };
    let run = simulate_rows(
        preset_name,
        seed,
        &rows,
        args.threads,
        log,
        args.report.as_deref(),
    )?;
    if let Some(written) = &run.log {
        eprintln!("event log: {written}");
    }
    if args.json {
        let output = TableOutput {
            preset: preset_name.clone(),
            seed,
            rows: run.table,
            order_matches_paper: run.order,
            reports: run.reports,
        };
        outln!("{}", serde_json::to_string_pretty(&output)?);
    } else {
        out!("{}", run.text);
        if let Some(report_path) = &args.report {
            outln!("report: {}", report_path.display());
        }
    }
    Ok(())
}

/// The preset overrides the user gave, as flags (`--b 0 --training-work-ratio 2`), for errors.
fn override_flags(args: &SimulateArgs) -> String {
    let mut flags = Vec::new();
    if let Some(n) = args.n {
        flags.push(format!("--n {n}"));
    }
    if let Some(b) = args.b {
        flags.push(format!("--b {b}"));
    }
    if let Some(ratio) = args.training_work_ratio {
        flags.push(format!("--training-work-ratio {ratio:?}"));
    }
    flags.join(" ")
}

/// A preset's rows, each simulated once: what `gyre simulate --preset` and `gyre quickstart`
/// print and write.
pub(crate) struct RowsRun {
    table: Vec<TableRow>,
    order: Option<bool>,
    /// The table as text, ending in a newline.
    pub(crate) text: String,
    reports: Vec<RunReport>,
    /// The event log written, if one was asked for.
    pub(crate) log: Option<LogWritten>,
}

/// Simulates each of `rows` once (validated by the caller), writes the event log of row
/// `log.0` to `log.1` and the HTML report to `report` when asked, and renders the table.
pub(crate) fn simulate_rows(
    preset_name: &str,
    seed: u64,
    rows: &[PaperRow],
    threads: Option<usize>,
    log: Option<(usize, &std::path::Path)>,
    report: Option<&std::path::Path>,
) -> anyhow::Result<RowsRun> {
    let (reports, kept) = run_rows(rows, threads, log.map(|(index, _)| index))?;
    let log = match (log, kept) {
        (Some((_, path)), Some(output)) => Some(write_log(path, &output)?),
        _ => None,
    };
    let table = table_rows(rows, &reports);
    let order = order_matches(&table);
    let text = render_table(preset_name, seed, &table, order);
    if let Some(report_path) = report {
        let html = render_html(
            &format!("Gyre simulation: {preset_name} (seed {seed})"),
            &reports,
            Some(&text),
        );
        std::fs::write(report_path, html)
            .with_context(|| format!("writing {}", report_path.display()))?;
    }
    Ok(RowsRun {
        table,
        order,
        text,
        reports,
        log,
    })
}

/// An event log as written: its path, entries, events and head hash.
pub(crate) struct LogWritten {
    path: PathBuf,
    entries: u64,
    events: usize,
    head: String,
}

impl std::fmt::Display for LogWritten {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({} entries, {} events, head {})",
            self.path.display(),
            self.entries,
            self.events,
            self.head
        )
    }
}

/// Write the run as an event file: one record per log entry, then one fdatasync.
fn write_log(
    path: &std::path::Path,
    output: &gyre_simulator::SimOutput,
) -> anyhow::Result<LogWritten> {
    let mut writer = gyre_log::EventFileWriter::create(path)
        .with_context(|| format!("creating event log {}", path.display()))?;
    writer.set_term(1);
    let mut entries = 0u64;
    for entry in output.entries() {
        writer
            .append_batch(entry)
            .with_context(|| format!("appending to {}", path.display()))?;
        entries += 1;
    }
    writer
        .sync()
        .with_context(|| format!("syncing {}", path.display()))?;
    Ok(LogWritten {
        path: path.to_path_buf(),
        entries,
        events: output.events.len(),
        head: gyre_log::file::hex(&writer.head_hash()),
    })
}

/// Run rows on a few threads; results come back in row order, so output is deterministic.
/// Row `keep`'s whole output (its events, for an event log) comes back too; the others keep
/// only their reports.
fn run_rows(
    rows: &[PaperRow],
    threads: Option<usize>,
    keep: Option<usize>,
) -> anyhow::Result<(Vec<RunReport>, Option<gyre_simulator::SimOutput>)> {
    let threads = threads
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        })
        .clamp(1, rows.len().max(1));
    let progress = ProgressBar::new(rows.len() as u64);
    progress.set_style(
        ProgressStyle::with_template("{spinner} simulating {pos}/{len} rows [{elapsed}] {msg}")
            .expect("static progress template"),
    );
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<std::sync::Mutex<Option<RunReport>>> =
        rows.iter().map(|_| std::sync::Mutex::new(None)).collect();
    let kept = std::sync::Mutex::new(None);
    std::thread::scope(|scope| {
        for worker in 0..threads {
            let (next, results, progress, kept) = (&next, &results, &progress, &kept);
            std::thread::Builder::new()
                .name(format!("simulate-{worker}"))
                .spawn_scoped(scope, move || loop {
                    let index = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(row) = rows.get(index) else { break };
                    progress.set_message(row.id.clone());
                    let output = simulate(&row.config);
                    let report = output.report.clone();
                    if keep == Some(index) {
                        *kept
                            .lock()
                            .expect("no simulation thread panics while holding the kept output") =
                            Some(output);
                    }
                    *results[index]
                        .lock()
                        .expect("no simulation thread panics while holding a result slot") =
                        Some(report);
                    progress.inc(1);
                })
                .expect("spawning a simulation thread");
        }
    });
    progress.finish_and_clear();
    let reports = results
        .into_iter()
        .map(|slot| {
            slot.into_inner()
                .expect("result slot lock is not poisoned")
                .context("a simulation row produced no report")
        })
        .collect::<anyhow::Result<_>>()?;
    let kept = kept
        .into_inner()
        .expect("the kept output's lock is not poisoned");
    Ok((reports, kept))
}

fn table_rows(rows: &[PaperRow], reports: &[RunReport]) -> Vec<TableRow> {
    rows.iter()
        .zip(reports)
        .map(|(row, report)| {
            let reference = rows
                .iter()
                .zip(reports)
                .find(|(r, _)| r.id == row.reference)
                .map(|(_, rep)| rep.total_hours)
                .unwrap_or(report.total_hours);
            let ratio = if reference > 0.0 {
                report.total_hours / reference
            } else {
                0.0
            };
            let ratio = (ratio * 1000.0).round() / 1000.0;
            TableRow {
                id: row.id.clone(),
                description: row.description.clone(),
                reference: row.reference.clone(),
                total_hours: report.total_hours,
                ratio,
                paper_hours: row.paper_hours,
                paper_ratio: row.paper_ratio,
                ratio_error_percent: row
                    .paper_ratio
                    .map(|paper| ((ratio / paper - 1.0) * 1000.0).round() / 10.0),
                mean_staleness: report.mean_staleness,
                expected_staleness: report.expected_staleness,
            }
        })
        .collect()
}

/// Whether sorting rows by simulated hours gives the paper's order (rows with paper hours only).
fn order_matches(rows: &[TableRow]) -> Option<bool> {
    let with_paper: Vec<&TableRow> = rows.iter().filter(|r| r.paper_hours.is_some()).collect();
    if with_paper.len() < 2 || with_paper.len() != rows.len() {
        return None;
    }
    let mut by_sim: Vec<&TableRow> = with_paper.clone();
    by_sim.sort_by(|a, b| a.total_hours.total_cmp(&b.total_hours));
    let mut by_paper = with_paper;
    by_paper.sort_by(|a, b| {
        a.paper_hours
            .unwrap_or(0.0)
            .total_cmp(&b.paper_hours.unwrap_or(0.0))
    });
    Some(
        by_sim
            .iter()
            .map(|r| &r.id)
            .eq(by_paper.iter().map(|r| &r.id)),
    )
}

fn render_table(preset: &str, seed: u64, rows: &[TableRow], order: Option<bool>) -> String {
    let mut out = String::new();
    let _ = std::fmt::Write::write_fmt(
        &mut out,
        format_args!("preset {preset}, seed {seed}; ratio = hours / reference row's hours\n"),
    );
    let width = rows
        .iter()
        .map(|r| r.id.chars().count())
        .max()
        .unwrap_or(3)
        .max(3);
    out.push_str(&format!(
        "{:<width$} {:>9} {:>7} {:>9} {:>7} {:>7} {:>7} {:>7}  {}\n",
        "row", "hours", "ratio", "paper h", "paper", "err %", "E[d]", "A.1", "description"
    ));
    let fmt = |v: Option<f64>, d: usize| {
        v.map(|x| format!("{x:.d$}"))
            .unwrap_or_else(|| "—".to_string())
    };
    for row in rows {
        out.push_str(&format!(
            "{:<width$} {:>9.2} {:>7.3} {:>9} {:>7} {:>7} {:>7.3} {:>7.3}  {}\n",
            row.id,
            row.total_hours,
            row.ratio,
            fmt(row.paper_hours, 2),
            fmt(row.paper_ratio, 3),
            fmt(row.ratio_error_percent, 1),
            row.mean_staleness,
            row.expected_staleness,
            row.description
        ));
    }
    if let Some(order) = order {
        out.push_str(&format!(
            "order by total hours matches the paper: {}\n",
            if order { "yes" } else { "no" }
        ));
    }
    out
}

fn print_single(report: &RunReport) {
    outln!(
        "{}: {} ({}), streaming {}, φ={} μ={} N={} B={}",
        report.name,
        report.mode,
        report.granularity,
        report.streaming,
        report.phi,
        report.mu,
        report.n,
        report.b
    );
    outln!(
        "total {:.2} h over {} steps",
        report.total_hours,
        report.steps
    );
    outln!(
        "mean staleness {:.3} (steady state {:.3}; Theorem A.1: {:.3})",
        report.mean_staleness,
        report.steady_state_mean_staleness,
        report.expected_staleness
    );
    outln!(
        "executions dispatched {} started {} finished {}; groups consumed {}",
        report.executions.dispatched,
        report.executions.started,
        report.executions.finished,
        report.groups_consumed
    );
    outln!(
        "utilisation: rollout {:.1}%, training {:.1}%",
        report.utilization.rollout * 100.0,
        report.utilization.training * 100.0
    );
}

/// What the paper reports for each workload profile, for the calibration check.
fn paper_workload_figures(profile: &str) -> &'static str {
    match profile {
        "nl2repo-122b" => "paper: execution mean 1.93 h, query mean 2.96 h, 9.51% of queries > 4 h, 6.25% harness timeouts, 0.87% overall timeouts",
        "nl2repo-2.4t" => "paper: 61.1% of queries > 4 h, 38.2% of longest executions end by overall timeout",
        _ => "paper: no duration statistics reported (shape of nl2repo-122b, scaled median)",
    }
}

fn print_workload_stats(rows: &[PaperRow], seed: u64) {
    let mut seen = std::collections::BTreeSet::new();
    for row in rows {
        let workload = &row.config.workload;
        if !seen.insert(workload.profile.clone()) {
            continue;
        }
        let stats = gyre_simulator::sample_stats(workload, row.config.n, seed, 20_000);
        outln!(
            "{} (N = {}, {} sampled queries)",
            workload.profile,
            row.config.n,
            stats.queries
        );
        outln!(
            "  simulated: execution mean {:.2} h, query mean {:.2} h, {:.2}% of queries > 4 h, {:.2}% harness timeouts, {:.2}% overall timeouts, {:.1}% of longest executions overall-timeout",
            stats.execution_mean_h,
            stats.query_mean_h,
            stats.query_over_4h_fraction * 100.0,
            stats.harness_timeout_fraction * 100.0,
            stats.overall_timeout_fraction * 100.0,
            stats.longest_execution_overall_timeout_fraction * 100.0
        );
        outln!("  {}", paper_workload_figures(&workload.profile));
    }
}
