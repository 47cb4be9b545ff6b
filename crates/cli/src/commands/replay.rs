//! `gyre replay LOG`: verify an event log and print a post-mortem.
//!
//! Replay reads the file record by record (CRC and hash chain verified by `gyre-log`), folds every
//! event into a fresh `ControlState`, checks every `ProjectionDigest` checkpoint, and prints what
//! happened: events by kind, role transitions, bursts and steps, groups and rewards, staleness.
//! `--at INDEX` stops after that entry and dumps the projection; `--recompute` re-runs the
//! controller at every decision point and reports the first divergence (a determinism bug). A
//! damaged file is reported at its first bad record, and everything before it is still replayed.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;
use serde::Serialize;

use gyre_event::{Event, EventBody, Role};
use gyre_log::{file::hex, EventFileReader};
use gyre_scheduler::run_decisions;
use gyre_state::ControlState;

/// Arguments of `gyre replay`.
#[derive(Args, Debug)]
#[command(
    after_long_help = "Exit status: 0 when every record, digest and (with --recompute) decision verified; 2 when the file is damaged, a digest differs or a decision diverges (the report still covers everything before the problem)."
)]
pub struct ReplayArgs {
    /// The event log (a file written by `gyre simulate --log` or exported from a node).
    log: PathBuf,
    /// Stop after this log entry (1-based) and dump the projection state there.
    #[arg(long, value_name = "INDEX")]
    at: Option<u64>,
    /// Re-run the controller at each decision point and report the first divergence.
    #[arg(long)]
    recompute: bool,
    /// Print the post-mortem as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize, Default)]
struct Transition {
    at_hours: f64,
    cell: u32,
    event: &'static str,
    role: &'static str,
}

#[derive(Serialize)]
struct StepSummary {
    step: u64,
    end_hours: f64,
    groups: usize,
    mean_staleness: f64,
}

#[derive(Serialize, Default)]
struct Rewards {
    evaluations_valid: u64,
    evaluations_invalid: u64,
    evaluations_failed: u64,
    mean_score: f64,
    dummies: u64,
    excluded: u64,
}

#[derive(Serialize)]
struct Problem {
    kind: &'static str,
    entry: Option<u64>,
    message: String,
}

#[derive(Serialize)]
struct StateDump {
    entry: u64,
    at_hours: f64,
    dispatched: u64,
    started: u64,
    finished: u64,
    water_level: u64,
    rollout_capacity: u64,
    training_version: u64,
    published_version: u64,
    burst: u64,
    roles: Vec<String>,
    open_batch: Option<String>,
    ready_unpacked_groups: usize,
    digest: String,
}

#[derive(Serialize)]
struct PostMortem {
    log: String,
    entries: u64,
    events: u64,
    head_hash: String,
    digests_verified: u64,
    decisions_recomputed: u64,
    events_by_kind: BTreeMap<&'static str, u64>,
    transitions: Vec<Transition>,
    steps: Vec<StepSummary>,
    bursts_ended_hours: Vec<f64>,
    publishes: Vec<(u64, f64)>,
    groups_consumed: usize,
    rewards: Rewards,
    staleness_histogram: BTreeMap<u64, u64>,
    mean_staleness: f64,
    final_state: StateDump,
    problem: Option<Problem>,
}

/// The kinds the controller decides (as opposed to reports from runtimes).
fn is_decision(body: &EventBody) -> bool {
    matches!(
        body,
        EventBody::GroupsDispatched { .. }
            | EventBody::ExecutionStarted { .. }
            | EventBody::BatchOpened { .. }
            | EventBody::RoutesUpdated { .. }
            | EventBody::JoinWindowClosed { .. }
            | EventBody::TransitionBegun { .. }
            | EventBody::BurstEnded { .. }
    )
}

fn hours(event: &Event) -> f64 {
    event.at.as_hours_f64()
}

fn dump(state: &ControlState, entry: u64) -> StateDump {
    let scheduler = &state.scheduler;
    StateDump {
        entry,
        at_hours: scheduler.now.as_hours_f64(),
        dispatched: scheduler.dispatched,
        started: scheduler.started,
        finished: scheduler.finished,
        water_level: scheduler.water_level(),
        rollout_capacity: scheduler.rollout_capacity(),
        training_version: scheduler.training_version.get(),
        published_version: scheduler.published_version.get(),
        burst: scheduler.burst,
        roles: scheduler
            .cells
            .iter()
            .map(|cell| match cell.switching_to {
                Some(to) => format!("{}:{}→{}", cell.id, cell.role.as_str(), to.as_str()),
                None => format!("{}:{}", cell.id, cell.role.as_str()),
            })
            .collect(),
        open_batch: scheduler.batch.as_ref().map(|batch| {
            format!(
                "{}: {} groups, {}/{} micro-steps claimed, stream {}",
                batch.step,
                batch.groups.len(),
                batch.claimed_count,
                batch.micro_steps.len(),
                if batch.stream_closed {
                    "closed"
                } else {
                    "open"
                }
            )
        }),
        ready_unpacked_groups: scheduler.ready_unpacked.len(),
        digest: hex(&state.digest()),
    }
}

pub fn run(args: ReplayArgs) -> anyhow::Result<()> {
    if args.log.is_dir() {
        bail!(
            "{} is a directory: replay reads an event file (`gyre simulate --log`, or a node's log exported with `gyre log export`)",
            args.log.display()
        );
    }
    let reader = EventFileReader::open(&args.log)
        .with_context(|| format!("opening {}", args.log.display()))?;
    let mut state = ControlState::new();
    let mut report = PostMortem {
        log: args.log.display().to_string(),
        entries: 0,
        events: 0,
        head_hash: String::new(),
        digests_verified: 0,
        decisions_recomputed: 0,
        events_by_kind: BTreeMap::new(),
        transitions: Vec::new(),
        steps: Vec::new(),
        bursts_ended_hours: Vec::new(),
        publishes: Vec::new(),
        groups_consumed: 0,
        rewards: Rewards::default(),
        staleness_histogram: BTreeMap::new(),
        mean_staleness: 0.0,
        final_state: dump(&state, 0),
        problem: None,
    };
    let mut score_sum = 0.0;
    let mut staleness_sum = 0u64;
    let mut head = reader.header().base_hash;
    'records: for record in reader {
        let record = match record {
            Ok(record) => record,
            Err(error) => {
                report.problem = Some(Problem {
                    kind: "damaged_record",
                    entry: Some(report.entries + 1),
                    message: error.to_string(),
                });
                break;
            }
        };
        head = record.hash;
        let events = match record.decode_events_in(&args.log) {
            Ok(events) => events,
            Err(error) => {
                report.problem = Some(Problem {
                    kind: "undecodable_record",
                    entry: Some(record.index),
                    message: error.to_string(),
                });
                break;
            }
        };
        let mut position = 0;
        // Decisions already checked as part of a batch the controller returned at once.
        let mut verified_until = 0;
        while position < events.len() {
            let event = &events[position];
            if args.recompute && is_decision(&event.body) && position >= verified_until {
                let mut scratch = state.scheduler.clone();
                let expected = run_decisions(&mut scratch, event.at);
                let got = &events[position..(position + expected.len()).min(events.len())];
                if expected.is_empty() || got != expected.as_slice() {
                    report.problem = Some(Problem {
                        kind: "decision_divergence",
                        entry: Some(record.index),
                        message: format!(
                            "at event {position} of entry {}: the log has {} but the controller now decides {}",
                            record.index,
                            describe(got.first()),
                            describe(expected.first())
                        ),
                    });
                    break 'records;
                }
                report.decisions_recomputed += expected.len() as u64;
                verified_until = position + expected.len();
            }
            if let EventBody::ProjectionDigest { hash, .. } = &event.body {
                let ours = state.digest();
                if &ours != hash {
                    report.problem = Some(Problem {
                        kind: "digest_mismatch",
                        entry: Some(record.index),
                        message: format!(
                            "checkpoint in entry {} says {} but replay computes {}",
                            record.index,
                            hex(hash),
                            hex(&ours)
                        ),
                    });
                    break 'records;
                }
                report.digests_verified += 1;
            }
            if let Err(error) = state.apply(event) {
                report.problem = Some(Problem {
                    kind: "rejected_event",
                    entry: Some(record.index),
                    message: format!(
                        "event {position} ({}) of entry {}: {error}",
                        event.kind_name(),
                        record.index
                    ),
                });
                break 'records;
            }
            observe(event, &mut report, &mut score_sum, &mut staleness_sum);
            position += 1;
        }
        report.entries = record.index;
        if args.at == Some(record.index) {
            break;
        }
    }
    report.head_hash = hex(&head);
    report.final_state = dump(&state, report.entries);
    let valid = report.rewards.evaluations_valid.max(1) as f64;
    report.rewards.mean_score = (score_sum / valid * 10_000.0).round() / 10_000.0;
    report.mean_staleness = if report.groups_consumed == 0 {
        0.0
    } else {
        ((staleness_sum as f64 / report.groups_consumed as f64) * 10_000.0).round() / 10_000.0
    };
    if let Some(at) = args.at {
        if report.entries < at && report.problem.is_none() {
            report.problem = Some(Problem {
                kind: "index_out_of_range",
                entry: Some(at),
                message: format!("--at {at} but the log has {} entries", report.entries),
            });
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_text(&report);
    }
    if let Some(problem) = &report.problem {
        bail!("replay stopped: {}", problem.message);
    }
    Ok(())
}

fn describe(event: Option<&Event>) -> String {
    match event {
        Some(event) => format!("{} {:?}", event.kind_name(), event.body)
            .chars()
            .take(160)
            .collect(),
        None => "nothing".to_string(),
    }
}

fn observe(event: &Event, report: &mut PostMortem, score_sum: &mut f64, staleness_sum: &mut u64) {
    report.events += 1;
    *report.events_by_kind.entry(event.kind_name()).or_insert(0) += 1;
    match &event.body {
        EventBody::TransitionBegun { cell, to } => report.transitions.push(Transition {
            at_hours: hours(event),
            cell: cell.get(),
            event: "begun",
            role: to.as_str(),
        }),
        EventBody::TransitionCompleted { cell, role } => report.transitions.push(Transition {
            at_hours: hours(event),
            cell: cell.get(),
            event: "completed",
            role: role.as_str(),
        }),
        EventBody::OptimizerStepped { step, consumed, .. } => {
            let sum: u64 = consumed.iter().map(|c| c.staleness).sum();
            for record in consumed {
                *report
                    .staleness_histogram
                    .entry(record.staleness)
                    .or_insert(0) += 1;
            }
            *staleness_sum += sum;
            report.groups_consumed += consumed.len();
            report.steps.push(StepSummary {
                step: step.get(),
                end_hours: (hours(event) * 10_000.0).round() / 10_000.0,
                groups: consumed.len(),
                mean_staleness: if consumed.is_empty() {
                    0.0
                } else {
                    sum as f64 / consumed.len() as f64
                },
            });
        }
        EventBody::BurstEnded { .. } => report.bursts_ended_hours.push(hours(event)),
        EventBody::WeightsPublished { policy_version, .. } => {
            report.publishes.push((policy_version.get(), hours(event)))
        }
        EventBody::EvaluationCompleted { valid, score, .. } => {
            if *valid {
                report.rewards.evaluations_valid += 1;
                *score_sum += score;
            } else {
                report.rewards.evaluations_invalid += 1;
            }
        }
        EventBody::EvaluationFailed { .. } => report.rewards.evaluations_failed += 1,
        EventBody::DummyInserted { .. } => report.rewards.dummies += 1,
        EventBody::ExecutionExcluded { .. } => report.rewards.excluded += 1,
        _ => {}
    }
}

fn print_text(report: &PostMortem) {
    println!(
        "log {}: {} entries, {} events, head {}",
        report.log, report.entries, report.events, report.head_hash
    );
    println!(
        "verified: CRC and hash chain of every record read; {} digest checkpoints; {} decisions recomputed",
        report.digests_verified, report.decisions_recomputed
    );
    println!("\nevents by kind:");
    for (kind, count) in &report.events_by_kind {
        println!("  {kind:<28} {count:>9}");
    }
    println!("\nrole transitions (completed):");
    let mut by_cell: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for transition in report.transitions.iter().filter(|t| t.event == "completed") {
        by_cell.entry(transition.cell).or_default().push(format!(
            "{:.2}h→{}",
            transition.at_hours,
            if transition.role == Role::Training.as_str() {
                "T"
            } else {
                "R"
            }
        ));
    }
    for (cell, list) in &by_cell {
        let shown: Vec<&String> = list.iter().take(12).collect();
        let more = if list.len() > 12 {
            format!(" … (+{})", list.len() - 12)
        } else {
            String::new()
        };
        println!(
            "  cell{cell}: {}{more}",
            shown
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    println!("\nsteps (end time, groups, mean staleness):");
    for step in &report.steps {
        println!(
            "  {:>4}  {:>8.3} h  {:>4} groups  d̄ = {:.3}",
            step.step, step.end_hours, step.groups, step.mean_staleness
        );
    }
    println!(
        "\nbursts ended: {}; publishes: {}",
        report.bursts_ended_hours.len(),
        report.publishes.len()
    );
    let rewards = &report.rewards;
    println!(
        "rewards: {} valid evaluations (mean score {:.4}), {} invalid, {} failed; {} dummies; {} excluded",
        rewards.evaluations_valid,
        rewards.mean_score,
        rewards.evaluations_invalid,
        rewards.evaluations_failed,
        rewards.dummies,
        rewards.excluded
    );
    println!(
        "staleness: {} groups consumed, mean {:.4}, histogram {:?}",
        report.groups_consumed, report.mean_staleness, report.staleness_histogram
    );
    let state = &report.final_state;
    println!(
        "\nstate after entry {} ({:.3} h): d={} p={} f={} w={} C_R={} v_t={} v_pub={} burst={}",
        state.entry,
        state.at_hours,
        state.dispatched,
        state.started,
        state.finished,
        state.water_level,
        state.rollout_capacity,
        state.training_version,
        state.published_version,
        state.burst
    );
    println!("  roles: {}", state.roles.join(" "));
    if let Some(batch) = &state.open_batch {
        println!("  open batch {batch}");
    }
    println!(
        "  ready unpacked groups: {}; digest {}",
        state.ready_unpacked_groups, state.digest
    );
    if let Some(problem) = &report.problem {
        println!(
            "\nPROBLEM ({}) at entry {:?}: {}",
            problem.kind, problem.entry, problem.message
        );
    }
}
