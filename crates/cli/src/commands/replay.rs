//! `gyre replay LOG`: verify an event log and print a post-mortem.
//!
//! Replay reads the file record by record (CRC and hash chain verified by `gyre-log`), folds every
//! event into a fresh `ControlState`, checks every `ProjectionDigest` checkpoint, and prints what
//! happened: events by kind, role transitions, bursts and steps, groups and rewards, staleness.
//! `--at INDEX` stops after that entry and dumps the projection; `--recompute` re-runs the
//! controller at every decision point and reports the first divergence (a determinism bug). A
//! damaged file is reported at its first bad record, and everything before it is still replayed.
//!
//! `LOG` may also be a control node's data directory (`gyre control run --data-dir`), read
//! without changing it: its segments in order (CRCs, the hash chain within and across segments),
//! up to the committed index its meta file records, its archived segments (`archive/`, what
//! purges moved there) before the live ones. When the log it holds does not reach back to
//! entry 1 (purged without an archive, or restarted behind a received snapshot), replay starts
//! from the newest snapshot that covers the gap (checksummed, and its digest checked) and
//! reports where it started.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;
use serde::Serialize;

use gyre_event::{CallKind, EngineId, Event, EventBody, ModelCallRecord, Role};
use gyre_log::file::{hex, ChainHash};
use gyre_log::EventFileReader;
use gyre_scheduler::run_decisions;
use gyre_state::ControlState;

use super::pipeline;

/// Arguments of `gyre replay`.
#[derive(Args, Debug)]
#[command(
    after_long_help = "Exit status: 0 when every record, digest and (with --recompute) decision verified; 2 when the file is damaged, a digest differs or a decision diverges (the report still covers everything before the problem)."
)]
pub struct ReplayArgs {
    /// The event log: a file written by `gyre simulate --log` or exported with `gyre log
    /// export`, or a control node's data directory.
    log: PathBuf,
    /// Stop after this log entry (1-based) and dump the projection state there.
    #[arg(long, value_name = "INDEX", value_parser = clap::value_parser!(u64).range(1..))]
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

/// The proxy's records: how many model calls, how they form trees, how much was reused.
#[derive(Serialize, Default)]
struct ModelCalls {
    calls: u64,
    executions: usize,
    /// Distinct (execution, agent) pairs: main agents and sub-agents.
    agents: usize,
    /// Calls with no parent: first turns, sub-agents, the turn after a compaction.
    roots: u64,
    /// Calls hanging from a call that already had a child: retries, rewinds, compactions.
    branches: u64,
    summaries: u64,
    /// Abandoned attempts (engine died or was switched mid-answer), kept for audit only.
    aborted: u64,
    /// Calls whose whole prompt an earlier call of the execution already had: a call with no
    /// new input hanging where its parent's prompt ends, or a root whose input an earlier root
    /// had. The same prompt sampled again. A harness's retry answered
    /// anew (a proxy now answers a re-sent call from its record), or a question asked again on
    /// purpose; each extra sample is a sibling that may be a leaf no harness continued.
    resampled_prompts: u64,
    /// Calls hanging from an answered call that reuse its whole prompt but not its whole
    /// sampled answer (a resampled prompt aside): the harness re-sent that answer otherwise
    /// than it was sampled (edited it, rewound it, or re-serialised it in a way the proxy
    /// could not restore), so the rest of the answer was encoded again as input. A run whose
    /// harness only appends to its conversation should have none.
    answers_not_reused_whole: u64,
    /// Output tokens of those parents' answers that their children did not reuse.
    answer_tokens_re_encoded: u64,
    /// Calls whose request asked for a JSON answer format (structured outputs).
    formatted: u64,
    /// Of those, calls the engine's grammar held to it (their behaviour log-probs are of the
    /// constrained policy).
    formatted_enforced: u64,
    /// Output tokens sampled under an engine's grammar: their log-probs are of the masked
    /// distribution, so the trajectory processor never makes them targets.
    constrained_output_tokens: u64,
    /// Calls sampled with other settings than the policy's own (a harness's temperature,
    /// top-p or top-k under `gyre proxy --sampling harness`): context for training.
    sampled_with_other_settings: u64,
    input_tokens_new: u64,
    input_tokens_reused: u64,
    output_tokens: u64,
    by_engine: BTreeMap<String, u64>,
    by_policy_version: BTreeMap<u64, u64>,
    #[serde(skip)]
    seen_executions: BTreeSet<u64>,
    /// Calls per engine, keyed by id while replaying; `by_engine` is written from it at the end.
    #[serde(skip)]
    calls_by_engine: BTreeMap<EngineId, u64>,
    /// Agents seen, by execution (looked up by `&str`: no copy of a seen agent's name).
    #[serde(skip)]
    seen_agents: BTreeMap<u64, BTreeSet<String>>,
    #[serde(skip)]
    parents: BTreeSet<(u64, u64)>,
    /// (execution, call) → where that call's prompt ends on its path (reused + new input),
    /// and where its answer ends (the prompt and every sampled token).
    #[serde(skip)]
    prompt_ends: BTreeMap<(u64, u64), (u64, u64)>,
    /// (execution, hash of a root's input tokens).
    #[serde(skip)]
    root_prompts: BTreeSet<(u64, u64)>,
}

impl ModelCalls {
    /// Writes the figures kept in replay-only forms into their reported ones.
    fn finish(&mut self) {
        self.by_engine = self
            .calls_by_engine
            .iter()
            .map(|(engine, calls)| (engine.to_string(), *calls))
            .collect();
    }

    fn observe(&mut self, record: &ModelCallRecord) {
        let execution = record.execution.get();
        self.calls += 1;
        let agents = self.seen_agents.entry(execution).or_default();
        if !agents.contains(record.agent.as_str()) {
            agents.insert(record.agent.clone());
            self.agents += 1;
        }
        self.seen_executions.insert(execution);
        self.executions = self.seen_executions.len();
        match record.parent_call {
            None => self.roots += 1,
            Some(parent) => {
                if !self.parents.insert((execution, parent.get())) {
                    self.branches += 1;
                }
            }
        }
        match record.kind {
            CallKind::Turn => {}
            CallKind::Summary => self.summaries += 1,
            CallKind::Aborted => self.aborted += 1,
        }
        if record.kind != CallKind::Aborted {
            let reused = record.reused_prefix_tokens_count;
            let again = match record.parent_call {
                Some(parent) => {
                    let ends = self.prompt_ends.get(&(execution, parent.get())).copied();
                    let again = record.input_ids.is_empty()
                        && ends.is_some_and(|(prompt_end, _)| prompt_end == reused);
                    if let Some((prompt_end, answer_end)) = ends.filter(|_| !again) {
                        // Only a child that carries its parent's whole prompt and diverges in
                        // the answer: one that branches inside the prompt rewound the
                        // conversation, it did not re-send the answer.
                        if (prompt_end..answer_end).contains(&reused) {
                            self.answers_not_reused_whole += 1;
                            self.answer_tokens_re_encoded += answer_end - reused;
                        }
                    }
                    again
                }
                None => {
                    use std::hash::{Hash, Hasher};
                    let mut input = std::collections::hash_map::DefaultHasher::new();
                    record.input_ids.hash(&mut input);
                    !self.root_prompts.insert((execution, input.finish()))
                }
            };
            self.resampled_prompts += u64::from(again);
            let prompt_end = reused + record.input_ids.len() as u64;
            self.prompt_ends.insert(
                (execution, record.call.get()),
                (prompt_end, prompt_end + record.output_ids.len() as u64),
            );
        }
        if let Some(constraint) = &record.output_constraint {
            self.formatted += 1;
            self.formatted_enforced += u64::from(constraint.enforced);
            self.constrained_output_tokens += u64::from(record.constrained_output_tokens());
        }
        self.sampled_with_other_settings += u64::from(!record.sampling.is_policy());
        self.input_tokens_new += record.input_ids.len() as u64;
        self.input_tokens_reused += record.reused_prefix_tokens_count;
        self.output_tokens += record.output_ids.len() as u64;
        *self.calls_by_engine.entry(record.engine).or_insert(0) += 1;
        *self
            .by_policy_version
            .entry(record.policy_version.get())
            .or_insert(0) += 1;
    }
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
    /// The snapshot entry replay started from (a node data directory whose log start was
    /// purged); `null` when it replayed from the first entry.
    started_from_snapshot: Option<u64>,
    /// The first entry of an event file that does not start at entry 1 (an export of a node
    /// whose log before it was purged): the state before it is not in the file, so replay
    /// verifies CRCs and the hash chain but neither digests nor refusals, and its projections
    /// cover the file's entries only. `null` for a whole log.
    partial_from: Option<u64>,
    /// The last entry replayed (its index).
    entries: u64,
    /// Entries read (fewer than `entries` when the log does not start at entry 1).
    entries_read: u64,
    events: u64,
    /// Events the projection refused, folded as no-ops as every replica folds them (a client's
    /// event that did not apply, a decision that lost a race): how many, and the first few.
    events_refused: u64,
    refused: Vec<Refusal>,
    /// Digest checkpoints not checked (in a file that does not start at entry 1).
    digests_unchecked: u64,
    head_hash: String,
    digests_verified: u64,
    /// The fold rules the log's digest checkpoints state (the first that states any; see
    /// `gyre_state::FOLD_RULES`); `null` when none does (a log written before rules were
    /// recorded, or one without checkpoints).
    fold_rules: Option<u32>,
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
    model_calls: ModelCalls,
    final_state: StateDump,
    problem: Option<Problem>,
}

/// An event the projection refused.
#[derive(Serialize)]
struct Refusal {
    entry: u64,
    position: usize,
    kind: &'static str,
    reason: String,
}

/// Refusals listed in the report (all are counted).
const REFUSALS_LISTED: usize = 20;

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

/// One verified entry: its index, chain hash and events.
struct Entry {
    index: u64,
    hash: ChainHash,
    events: Vec<Event>,
}

/// Where the entries come from.
enum Source {
    File {
        path: PathBuf,
        reader: EventFileReader,
    },
    DataDir(Box<DataDir>),
}

impl Source {
    /// Reads, verifies and decodes every entry in order and hands each to `send`, then the
    /// problem that stopped the read, if any; stops early when `send` returns `false` (the
    /// fold stopped). Runs on the pipeline's reading thread. Returns the chain hash the log
    /// starts from.
    fn stream(self, send: &mut dyn FnMut(Result<Entry, Problem>) -> bool) -> ChainHash {
        match self {
            Source::File { path, mut reader } => {
                let base = reader.header().base_hash;
                while let Some(record) = reader.next() {
                    let item = match record {
                        Ok(record) => match record.decode_events_in(&path) {
                            Ok(events) => Ok(Entry {
                                index: record.index,
                                hash: record.hash,
                                events,
                            }),
                            Err(error) => Err(Problem {
                                kind: "undecodable_record",
                                entry: Some(record.index),
                                message: error.to_string(),
                            }),
                        },
                        Err(error) => Err(Problem {
                            kind: "damaged_record",
                            entry: Some(reader.next_index()),
                            message: error.to_string(),
                        }),
                    };
                    let last = item.is_err();
                    if !send(item) || last {
                        break;
                    }
                }
                base
            }
            Source::DataDir(data) => stream_data_dir(&data, send),
        }
    }
}

/// A data directory opened for replay: the state to start from and the segments to read
/// after it, up to the committed index. Entries are read (and decoded) segment by segment as
/// the fold goes, so replay holds one segment's records at a time, not the whole log.
struct DataDir {
    start_index: u64,
    start_state: ControlState,
    committed: u64,
    segments: Vec<(u64, PathBuf)>,
}

fn open_data_dir(dir: &std::path::Path) -> anyhow::Result<DataDir> {
    use gyre_log::raft::Projection;

    let log_dir = dir.join("log");
    anyhow::ensure!(
        log_dir.is_dir(),
        "{} is a directory but not a control node's data directory (it has no log/ directory)",
        dir.display()
    );
    let meta = gyre_log::raft::read_meta(dir)
        .with_context(|| format!("reading the meta file of {}", dir.display()))?;
    let committed = meta.committed.map_or(0, |log_id| log_id.index);
    // The archived segments (purged behind snapshots, kept by `--archive-purged`) first, then
    // the live log: one chain from the archive's first entry when the archive reaches it.
    let segments: Vec<(u64, PathBuf)> = gyre_log::raft::archive::log_segments(dir)
        .with_context(|| format!("listing the log segments of {}", dir.display()))?
        .into_iter()
        .map(|segment| (segment.first_index, segment.path))
        .collect();

    // The newest snapshot that reads back intact, for a log whose start was purged.
    let mut snapshots: Vec<PathBuf> = std::fs::read_dir(dir.join("snapshots"))
        .map(|listing| {
            listing
                .filter_map(|entry| entry.ok())
                .map(|entry| entry.path())
                .filter(|path| {
                    let name = path.file_name().map(|n| n.to_string_lossy().to_string());
                    name.is_some_and(|n| n.starts_with("snap-") && n.ends_with(".snap"))
                })
                .collect()
        })
        .unwrap_or_default();
    snapshots.sort();
    let first_index = segments.first().map_or(1, |(first, _)| *first);
    let (mut start_index, mut start_state) = (0u64, ControlState::new());
    if first_index > 1 {
        let mut failures = Vec::new();
        for path in snapshots.iter().rev() {
            let bytes =
                std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            let restored = gyre_log::raft::snapshot::decode_snapshot(path, &bytes)
                .map_err(|error| error.to_string())
                .and_then(|(header, body)| {
                    let projection = gyre_control::ControlProjection::restore(body)?;
                    let digest = hex(&projection.state.digest());
                    if digest != header.digest {
                        return Err(format!(
                            "{}: restored digest {digest} differs from the recorded {}",
                            path.display(),
                            header.digest
                        ));
                    }
                    Ok((
                        header.last_log_id.map_or(0, |id| id.index),
                        projection.state,
                    ))
                });
            match restored {
                Ok((index, state)) if index + 1 >= first_index => {
                    (start_index, start_state) = (index, state);
                    break;
                }
                Ok((index, _)) => failures.push(format!(
                    "{} ends at entry {index}, before the log's first entry {first_index}",
                    path.display()
                )),
                Err(error) => failures.push(error),
            }
        }
        anyhow::ensure!(
            start_index > 0,
            "{}: the log starts at entry {first_index} (earlier entries were purged) and no snapshot covers the gap{}",
            dir.display(),
            if failures.is_empty() {
                String::new()
            } else {
                format!(": {}", failures.join("; "))
            }
        );
    }

    Ok(DataDir {
        start_index,
        start_state,
        committed,
        segments,
    })
}

/// [`Source::stream`] for a data directory: its segments in order (CRCs, the hash chain
/// within and across segments), the entries after `start_index` up to `committed`.
fn stream_data_dir(
    data: &DataDir,
    send: &mut dyn FnMut(Result<Entry, Problem>) -> bool,
) -> ChainHash {
    use gyre_log::raft::record::{split_payload, RecordKind};
    use gyre_log::raft::segment::scan_segment;

    let (start_index, committed) = (data.start_index, data.committed);
    let first_index = data.segments.first().map_or(1, |(first, _)| *first);
    let mut problem = None;
    let mut base_hash = None;
    let mut previous: Option<(u64, ChainHash)> = None;
    'segments: for (_, path) in &data.segments {
        let mut found = Vec::new();
        let scan = scan_segment(path, |record, payload| {
            found.push((
                *record,
                split_payload(payload)
                    .map(|(kind, _, body)| (kind == RecordKind::Events).then(|| body.to_vec())),
            ));
            Ok(())
        });
        // Records verified before a damaged one still replay; the damage is reported after them.
        let (scan, damage) = match scan {
            Ok(scan) => (Some(scan), None),
            Err(error) => (None, Some(error.to_string())),
        };
        if let (Some(scan), Some((next, head))) = (&scan, previous) {
            if scan.header.first_index != next
                || (!scan.header.detached() && scan.header.base_hash != head)
            {
                problem = Some(Problem {
                    kind: "broken_chain",
                    entry: Some(next),
                    message: format!(
                        "{} starts at entry {} with a base hash that does not continue the previous segment (expected entry {next})",
                        path.display(),
                        scan.header.first_index
                    ),
                });
                break;
            }
        }
        if let Some(scan) = &scan {
            base_hash.get_or_insert(scan.header.base_hash);
        }
        let found_last = found.last().map(|(record, _)| record.index);
        for (record, body) in found {
            if record.index > committed {
                break 'segments;
            }
            if record.index <= start_index {
                continue;
            }
            let decoded = body.and_then(|bytes| match bytes {
                Some(bytes) => gyre_log::decode_batch(&bytes).map_err(|error| error.to_string()),
                None => Ok(Vec::new()),
            });
            let events = match decoded {
                Ok(events) => events,
                Err(error) => {
                    problem = Some(Problem {
                        kind: "undecodable_record",
                        entry: Some(record.index),
                        message: format!("{} entry {}: {error}", path.display(), record.index),
                    });
                    break 'segments;
                }
            };
            let entry = Entry {
                index: record.index,
                hash: record.hash,
                events,
            };
            if !send(Ok(entry)) {
                break 'segments;
            }
        }
        match (scan, damage) {
            (Some(scan), _) => previous = Some((scan.next_index, scan.head_hash)),
            (None, damage) => {
                let next = found_last
                    .map_or(previous.map_or(first_index, |(next, _)| next), |last| {
                        last + 1
                    });
                problem = Some(Problem {
                    kind: "damaged_record",
                    entry: Some(next),
                    message: damage.unwrap_or_default(),
                });
                break;
            }
        }
    }
    if let Some(problem) = problem {
        send(Err(problem));
    }
    base_hash.unwrap_or([0; 32])
}

pub fn run(args: ReplayArgs) -> anyhow::Result<()> {
    let (source, mut state, started_at) = if args.log.is_dir() {
        let mut data = open_data_dir(&args.log)?;
        if !args.json {
            outln!(
                "{}: a node data directory, committed through entry {}{}",
                args.log.display(),
                data.committed,
                if data.start_index > 0 {
                    format!(
                        "; replay starts from the snapshot at entry {} (the log before it was purged)",
                        data.start_index
                    )
                } else {
                    String::new()
                }
            );
        }
        let start_state = std::mem::replace(&mut data.start_state, ControlState::new());
        let start_index = data.start_index;
        (Source::DataDir(Box::new(data)), start_state, start_index)
    } else {
        let reader = EventFileReader::open(&args.log)
            .with_context(|| format!("opening {}", args.log.display()))?;
        (
            Source::File {
                path: args.log.clone(),
                reader,
            },
            ControlState::new(),
            0,
        )
    };
    let mut report = PostMortem {
        log: args.log.display().to_string(),
        started_from_snapshot: (started_at > 0).then_some(started_at),
        partial_from: None,
        entries: started_at,
        entries_read: 0,
        events: 0,
        events_refused: 0,
        refused: Vec::new(),
        digests_unchecked: 0,
        head_hash: String::new(),
        digests_verified: 0,
        fold_rules: None,
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
        model_calls: ModelCalls::default(),
        final_state: dump(&state, 0),
        problem: None,
    };
    let mut score_sum = 0.0;
    let mut staleness_sum = 0u64;
    // One thread reads, verifies and decodes the entries; this one folds them, in log order.
    let (base_hash, last_hash) = pipeline::ahead(
        move |send| source.stream(send),
        |records| {
            let mut last_hash = None;
            'records: for record in records {
                let record = match record {
                    Ok(record) => record,
                    Err(problem) => {
                        report.problem = Some(problem);
                        break;
                    }
                };
                last_hash = Some(record.hash);
                if report.entries_read == 0 && started_at == 0 && record.index > 1 {
                    report.partial_from = Some(record.index);
                }
                if let Some(at) = args.at.filter(|at| *at < record.index) {
                    report.problem = Some(Problem {
                        kind: "index_out_of_range",
                        entry: Some(at),
                        message: format!(
                            "--at {at}, but replay starts at entry {} (the log before it is {})",
                            record.index,
                            if started_at > 0 {
                                "in the node's snapshot"
                            } else {
                                "not in the file: it was purged before the export"
                            }
                        ),
                    });
                    break;
                }
                report.entries_read += 1;
                let events = record.events;
                let mut position = 0;
                // Decisions already checked as part of a batch the controller returned at once.
                let mut verified_until = 0;
                while position < events.len() {
                    let event = &events[position];
                    // The controller's decisions need the state before them: not in a file
                    // that starts past entry 1.
                    if args.recompute
                        && report.partial_from.is_none()
                        && is_decision(&event.body)
                        && position >= verified_until
                    {
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
                    if let EventBody::ProjectionDigest { rules, .. } = &event.body {
                        if *rules != 0 && report.fold_rules.is_none() {
                            report.fold_rules = Some(*rules);
                        }
                        // Another build's rules: its digests say nothing about this fold. (A
                        // partial file's checkpoints are not compared at all: counted unchecked
                        // below, the rules noted.)
                        if let (Some(why), None) =
                            (gyre_state::fold_rules_mismatch(*rules), report.partial_from)
                        {
                            report.problem = Some(Problem {
                                kind: "fold_rules_mismatch",
                                entry: Some(record.index),
                                message: format!("checkpoint in entry {}: {why}", record.index),
                            });
                            break 'records;
                        }
                    }
                    if let (EventBody::ProjectionDigest { .. }, Some(_)) =
                        (&event.body, report.partial_from)
                    {
                        report.digests_unchecked += 1;
                    } else if let EventBody::ProjectionDigest { hash, .. } = &event.body {
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
                    // A refused event leaves the state as it was, on every replica too.
                    if let Err(error) = state.apply(event) {
                        report.events_refused += 1;
                        if report.refused.len() < REFUSALS_LISTED {
                            report.refused.push(Refusal {
                                entry: record.index,
                                position,
                                kind: event.kind_name(),
                                reason: error.to_string(),
                            });
                        }
                    } else {
                        observe(event, &mut report, &mut score_sum, &mut staleness_sum);
                    }
                    position += 1;
                }
                report.entries = record.index;
                if args.at == Some(record.index) {
                    break;
                }
            }
            last_hash
        },
    );
    report.head_hash = hex(&last_hash.unwrap_or(base_hash));
    report.model_calls.finish();
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
        outln!("{}", serde_json::to_string_pretty(&report)?);
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
        EventBody::ModelCall(record) => report.model_calls.observe(record),
        _ => {}
    }
}

fn print_text(report: &PostMortem) {
    outln!(
        "log {}: {} entries, {} events, head {}",
        report.log,
        report.entries,
        report.events,
        report.head_hash
    );
    if let Some(first) = report.partial_from {
        outln!(
            "partial: the file starts at entry {first} (the log before it was purged before the \
             export); {} entries read. The state before entry {first} is not in the file: \
             {} digest checkpoints not checked, refusals and projections cover these entries only",
            report.entries_read,
            report.digests_unchecked
        );
    }
    outln!(
        "verified: CRC and hash chain of every record read; {} digest checkpoints; {} decisions recomputed; fold rules {}",
        report.digests_verified,
        report.decisions_recomputed,
        match report.fold_rules {
            Some(rules) => format!("{rules} (this build: {})", gyre_state::FOLD_RULES),
            None => format!("not stated by the log (this build: {})", gyre_state::FOLD_RULES),
        }
    );
    if report.events_refused > 0 {
        outln!(
            "refused: {} events the projection refused (folded as no-ops, as every replica does){}",
            report.events_refused,
            if report.events_refused as usize > report.refused.len() {
                format!("; the first {}:", report.refused.len())
            } else {
                ":".to_string()
            }
        );
        for refusal in &report.refused {
            outln!(
                "  entry {} event {} ({}): {}",
                refusal.entry,
                refusal.position,
                refusal.kind,
                refusal.reason
            );
        }
    }
    outln!("\nevents by kind:");
    for (kind, count) in &report.events_by_kind {
        outln!("  {kind:<28} {count:>9}");
    }
    outln!("\nrole transitions (completed):");
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
        outln!(
            "  cell{cell}: {}{more}",
            shown
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    outln!("\nsteps (end time, groups, mean staleness):");
    for step in &report.steps {
        outln!(
            "  {:>4}  {:>8.3} h  {:>4} groups  d̄ = {:.3}",
            step.step,
            step.end_hours,
            step.groups,
            step.mean_staleness
        );
    }
    outln!(
        "\nbursts ended: {}; publishes: {}",
        report.bursts_ended_hours.len(),
        report.publishes.len()
    );
    let rewards = &report.rewards;
    outln!(
        "rewards: {} valid evaluations (mean score {:.4}), {} invalid, {} failed; {} dummies; {} excluded",
        rewards.evaluations_valid,
        rewards.mean_score,
        rewards.evaluations_invalid,
        rewards.evaluations_failed,
        rewards.dummies,
        rewards.excluded
    );
    outln!(
        "staleness: {} groups consumed, mean {:.4}, histogram {:?}",
        report.groups_consumed,
        report.mean_staleness,
        report.staleness_histogram
    );
    let calls = &report.model_calls;
    if calls.calls > 0 {
        let input = calls.input_tokens_new + calls.input_tokens_reused;
        outln!(
            "\nmodel calls: {} in {} executions ({} agents): {} roots, {} branches, {} compactions, {} aborted attempts",
            calls.calls, calls.executions, calls.agents, calls.roots, calls.branches, calls.summaries, calls.aborted
        );
        outln!(
            "  prompts sampled more than once: {} (a retry answered anew, or the same question asked again)",
            calls.resampled_prompts
        );
        outln!(
            "  answers not reused whole by the call after them: {} ({} sampled tokens encoded again as input; an edited or rewound answer, or one the harness re-sent in a form the proxy could not restore)",
            calls.answers_not_reused_whole, calls.answer_tokens_re_encoded
        );
        if calls.formatted > 0 {
            outln!(
                "  structured outputs: {} calls asked for a JSON format, {} held to it by the engine's grammar; {} output tokens sampled under a grammar (never targets)",
                calls.formatted, calls.formatted_enforced, calls.constrained_output_tokens
            );
        }
        if calls.sampled_with_other_settings > 0 {
            outln!(
                "  sampled with a harness's own temperature / top-p / top-k: {} calls (context for training, never targets)",
                calls.sampled_with_other_settings
            );
        }
        outln!(
            "  input tokens: {} new, {} reused ({:.1}% reused); output tokens: {}",
            calls.input_tokens_new,
            calls.input_tokens_reused,
            100.0 * calls.input_tokens_reused as f64 / input.max(1) as f64,
            calls.output_tokens
        );
        let engines: Vec<String> = calls
            .by_engine
            .iter()
            .map(|(engine, n)| format!("{engine} {n}"))
            .collect();
        let versions: Vec<String> = calls
            .by_policy_version
            .iter()
            .map(|(version, n)| format!("v{version} {n}"))
            .collect();
        outln!(
            "  engines: {}; policy versions: {}",
            engines.join(", "),
            versions.join(", ")
        );
    }
    let state = &report.final_state;
    outln!(
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
    outln!("  roles: {}", state.roles.join(" "));
    if let Some(batch) = &state.open_batch {
        outln!("  open batch {batch}");
    }
    outln!(
        "  ready unpacked groups: {}; digest {}",
        state.ready_unpacked_groups,
        state.digest
    );
    if let Some(problem) = &report.problem {
        outln!(
            "\nPROBLEM ({}) at entry {:?}: {}",
            problem.kind,
            problem.entry,
            problem.message
        );
    }
}
