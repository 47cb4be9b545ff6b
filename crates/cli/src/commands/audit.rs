//! `gyre audit`: an evidence bundle for a reward dispute, and its offline verification.
//!
//! `gyre audit LOG --execution E --out bundle.json` gathers, from a verified event log, every fact
//! about one execution: its model calls (tokens, log-probs, provenance, engine, policy version,
//! times), its close, every evaluation attempt, its group's rewards and advantage, its admitted
//! trajectories, and the optimizer step that consumed the group. The bundle carries the full
//! payload of every log entry it cites and the (index, term, payload digest) of every entry from
//! the first cited one to the head, so `gyre audit verify bundle.json --head HASH` can recompute
//! the hash chain up to a head hash the verifier trusts, re-extract the facts from the cited
//! payloads and check they are exactly what the bundle claims — without the log.
//!
//! The group's rewards and the advantage are what the scoring projection makes of the group's
//! events (see [`extract`]). Verify recomputes from the entries the bundle carries; whether an
//! entry was left out it can tell only for a bundle built with `--complete`, which carries
//! every entry from the group's dispatch through the step that consumed it (or the head):
//! `verify` prints `complete:` or `partial:`, and `--require-complete` fails on partial.
//!
//! **Refusals by the whole state.** A replica folds every event into every projection at once
//! and an event any of them refuses is a no-op for all (`ControlState::apply`): a start on a
//! full engine, a dispatch nobody owed, a close of a consumed execution. The facts fold the
//! group's events through the scoring projection alone, which cannot see those refusals, so the
//! builder folds the whole log through `ControlState` and lists, in `state_refused`, each event
//! about the execution or its group that the whole state refused (a scoring event of the group,
//! any start of the execution, its model calls and admission, the step consuming the group);
//! the facts skip them and their entries are carried. A verifier cannot recompute them from
//! the carried entries (they depend on everything before the group): it takes the list as the
//! bundle's claim, checks that each names a carried event about the execution or its group, and
//! always says what it took. A bundle built from a log that starts past entry 1 has
//! `state_refused: null` (unknown), which `verify` says and `--require-complete` refuses.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use gyre_event::{Event, EventBody, ExecutionId, GroupId};
use gyre_log::file::{chain_hash_of_digest, hex, payload_digest};
use gyre_log::{decode_batch, EventFileReader};
use gyre_trajectory::{AdvantageNormalization, Resolution, Scoring, ScoringConfig};

const BUNDLE_FORMAT: &str = "gyre-audit-bundle-v3";

/// Arguments of `gyre audit`.
#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct AuditArgs {
    #[command(subcommand)]
    command: Option<AuditCommand>,
    /// The event log to audit.
    log: Option<PathBuf>,
    /// The execution in dispute (`e42` or `42`).
    #[arg(long)]
    execution: Option<String>,
    /// Where to write the bundle (JSON).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Carry every entry from the group's dispatch to the last cited one, not only the cited
    /// ones: `audit verify` can then say nothing relevant was left out in between (larger:
    /// every other execution's calls in that span are in it).
    #[arg(long)]
    complete: bool,
}

#[derive(Subcommand, Debug)]
enum AuditCommand {
    /// Check a bundle offline against a head hash you trust.
    Verify {
        /// The bundle written by `gyre audit LOG --execution E --out FILE`.
        bundle: PathBuf,
        /// The log head hash (hex) the bundle must chain to.
        #[arg(long)]
        head: String,
        /// Fail unless the bundle carries every entry from the group's dispatch on (one built
        /// with `--complete`), so no relevant entry can have been left out.
        #[arg(long)]
        require_complete: bool,
    },
}

#[derive(Serialize, Deserialize)]
struct ChainLink {
    index: u64,
    term: u64,
    payload_sha256: String,
}

#[derive(Serialize, Deserialize)]
struct Bundle {
    format: String,
    execution: String,
    facts: Value,
    /// Chain value before the first link.
    base_hash: String,
    chain: Vec<ChainLink>,
    head: String,
    /// Full payloads (hex) of the entries the facts cite, by index.
    payloads: BTreeMap<u64, String>,
    /// (entry, position) of each event about the execution or its group the whole state
    /// refused (see the module documentation); the facts skip them. `null` when they are
    /// unknown: the log the bundle was built from starts past entry 1.
    state_refused: Option<Vec<(u64, usize)>>,
}

pub fn run(args: AuditArgs) -> anyhow::Result<()> {
    match args.command {
        Some(AuditCommand::Verify {
            bundle,
            head,
            require_complete,
        }) => verify(&bundle, &head, require_complete),
        None => {
            let (Some(log), Some(execution), Some(out)) = (args.log, args.execution, args.out)
            else {
                bail!("usage: gyre audit LOG --execution E --out bundle.json, or gyre audit verify BUNDLE --head HASH");
            };
            build(&log, &execution, &out, args.complete)
        }
    }
}

fn parse_execution(text: &str) -> anyhow::Result<ExecutionId> {
    let digits = text.strip_prefix('e').unwrap_or(text);
    let id = digits
        .parse::<u64>()
        .with_context(|| format!("`{text}` is not an execution id (expected e42 or 42)"))?;
    Ok(ExecutionId(id))
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn from_hex(text: &str) -> anyhow::Result<Vec<u8>> {
    if let Some((at, found)) = text.char_indices().find(|(_, c)| !c.is_ascii_hexdigit()) {
        bail!("`{found}` at byte {at} is not a hex digit");
    }
    if !text.len().is_multiple_of(2) {
        bail!("hex string has odd length");
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).with_context(|| format!("bad hex at {i}")))
        .collect()
}

fn hash_from_hex(text: &str) -> anyhow::Result<[u8; 32]> {
    let bytes = from_hex(text)?;
    bytes
        .try_into()
        .map_err(|_| anyhow::anyhow!("a hash is 32 bytes (64 hex digits)"))
}

/// Whether `event` concerns the scoring of `group`, whose members so far are `members`: the
/// dispatch of the group, a member's start, close, evaluations, dummy or exclusion.
fn concerns_group(event: &Event, group: GroupId, members: &BTreeSet<ExecutionId>) -> bool {
    match &event.body {
        EventBody::GroupsDispatched { groups, .. } => {
            groups.iter().any(|dispatched| dispatched.group == group)
        }
        EventBody::ExecutionStarted { group: g, .. } => *g == group,
        EventBody::ExecutionClosed { execution, .. }
        | EventBody::EvaluationRequested { execution, .. }
        | EventBody::EvaluationCompleted { execution, .. }
        | EventBody::EvaluationFailed { execution, .. }
        | EventBody::DummyInserted { execution, .. }
        | EventBody::ExecutionExcluded { execution, .. } => members.contains(execution),
        _ => false,
    }
}

/// Whether `event` is one of the facts about `execution` beyond its group's scoring events:
/// any start of it (a refused one may name another group), its model calls and admission, and
/// the optimizer step that consumed `group`.
fn concerns_execution(event: &Event, execution: ExecutionId, group: Option<GroupId>) -> bool {
    match &event.body {
        EventBody::ExecutionStarted { execution: e, .. }
        | EventBody::TrajectoriesAdmitted { execution: e, .. } => *e == execution,
        EventBody::ModelCall(record) => record.execution == execution,
        EventBody::OptimizerStepped { consumed, .. } => {
            consumed.iter().any(|c| Some(c.group) == group)
        }
        _ => false,
    }
}

/// Everything the bundle claims about `execution`, extracted from `(entry index, events)` pairs.
/// The same function builds the bundle and verifies it.
///
/// The group's rewards and the advantage are what the scoring projection
/// ([`gyre_trajectory::Scoring`], the one training folds) makes of the group's events: the
/// first start the whole state accepted names the group, an event the projection refuses (a
/// second start, an outcome for an attempt never requested, a second close) or the whole state
/// refused (`state_refused`) counts for nothing, each member's designated result is the one
/// scoring froze (the valid completion with the highest artifact version when the member was
/// first closed with one), closes by timeout, cancellation or surplus exclude, and the
/// advantage exists once the group is ready. Every entry holding an accepted event of the
/// group is cited, so a verifier folding the cited entries alone reaches the same state.
fn extract(
    entries: &[(u64, Vec<Event>)],
    execution: ExecutionId,
    state_refused: &BTreeSet<(u64, usize)>,
) -> Extracted {
    let mut cited = BTreeSet::new();
    let mut skipped = BTreeSet::new();
    let group: Option<GroupId> = entries.iter().find_map(|(index, events)| {
        events
            .iter()
            .enumerate()
            .find_map(|(position, event)| match &event.body {
                EventBody::ExecutionStarted {
                    execution: e,
                    group: g,
                    ..
                } if *e == execution && !state_refused.contains(&(*index, position)) => Some(*g),
                _ => None,
            })
    });
    let mut scoring = Scoring::new(ScoringConfig::default());
    let mut members: BTreeSet<ExecutionId> = BTreeSet::new();
    // Accepted scoring events of the group, by (entry, position in the entry).
    let mut accepted: BTreeSet<(u64, usize)> = BTreeSet::new();
    let mut dispatched_in: Option<u64> = None;
    // The entry whose event froze the designated result (see `gyre_trajectory::Scoring`).
    let mut designated_in: Option<u64> = None;
    if let Some(group) = group {
        for (index, events) in entries {
            for (position, event) in events.iter().enumerate() {
                if !concerns_group(event, group, &members) {
                    continue;
                }
                if state_refused.contains(&(*index, position)) {
                    // Carried too, so a verifier sees the event the bundle says was refused.
                    skipped.insert((*index, position));
                    cited.insert(*index);
                    continue;
                }
                // Only this group's events are folded, so the fold of the cited entries alone
                // (the verifier's) is the same fold.
                let event = match &event.body {
                    EventBody::GroupsDispatched {
                        groups,
                        executions_per_group,
                        policy_version,
                    } => Event::new(
                        event.at,
                        EventBody::GroupsDispatched {
                            groups: groups
                                .iter()
                                .filter(|dispatched| dispatched.group == group)
                                .cloned()
                                .collect(),
                            executions_per_group: *executions_per_group,
                            policy_version: *policy_version,
                        },
                    ),
                    _ => event.clone(),
                };
                let undesignated = scoring
                    .executions
                    .get(&execution)
                    .is_none_or(|score| score.designated.is_none());
                if scoring.apply(&event).is_ok() {
                    let designated_now = scoring
                        .executions
                        .get(&execution)
                        .is_some_and(|score| score.designated.is_some());
                    if undesignated && designated_now {
                        designated_in = Some(*index);
                    }
                    match &event.body {
                        EventBody::ExecutionStarted { execution: e, .. } => {
                            members.insert(*e);
                        }
                        EventBody::GroupsDispatched { .. } => dispatched_in = Some(*index),
                        _ => {}
                    }
                    accepted.insert((*index, position));
                    cited.insert(*index);
                }
            }
        }
    }
    let mut started = Value::Null;
    let mut closed = Value::Null;
    let mut calls = Vec::new();
    let mut evaluations = Vec::new();
    let mut admitted = Value::Null;
    let mut consumed_by = Value::Null;
    let mut dummy = false;
    let mut excluded = Value::Null;
    for (index, events) in entries {
        for (position, event) in events.iter().enumerate() {
            if state_refused.contains(&(*index, position)) {
                // No replica applied it: listed and carried, never a fact.
                if concerns_execution(event, execution, group) {
                    skipped.insert((*index, position));
                    cited.insert(*index);
                }
                continue;
            }
            let at_s = event.at.as_secs_f64();
            let scored = accepted.contains(&(*index, position));
            let mut cite = false;
            match &event.body {
                EventBody::ExecutionStarted {
                    execution: e,
                    group: g,
                    engine,
                } if *e == execution && scored => {
                    started = json!({"entry": index, "at_s": at_s, "group": g.to_string(), "engine": engine.to_string()});
                    cite = true;
                }
                EventBody::ExecutionClosed {
                    execution: e,
                    status,
                } if *e == execution && scored => {
                    closed = json!({"entry": index, "at_s": at_s, "status": status.as_str()});
                    cite = true;
                }
                EventBody::ModelCall(record) if record.execution == execution => {
                    calls.push(json!({
                        "entry": index,
                        "call": record.call.to_string(),
                        "agent": record.agent,
                        "kind": format!("{:?}", record.kind),
                        "parent_call": record.parent_call.map(|c| c.to_string()),
                        "reused_prefix_tokens": record.reused_prefix_tokens_count,
                        "spawned_by": record.spawned_by.map(|c| c.to_string()),
                        "input_ids": record.input_ids,
                        "input_provenance": record.input_provenance.iter().map(|s| json!([s.provenance.as_str(), s.tokens_count])).collect::<Vec<_>>(),
                        "output_ids": record.output_ids,
                        "output_logprobs": record.output_logprobs,
                        "engine": record.engine.to_string(),
                        "policy_version": record.policy_version.get(),
                        "requested_at_s": record.requested_at.as_secs_f64(),
                        "first_token_after_s": record.first_token_after.as_secs_f64(),
                        "completed_after_s": record.completed_after.as_secs_f64(),
                        "stop_sequences": record.stop_sequences,
                        "output_constraint": record.output_constraint.as_ref().map(|constraint| json!({
                            "schema": constraint.schema,
                            "enforced": constraint.enforced,
                            "constrained_tokens": constraint.constrained_tokens,
                        })),
                        "sampling": {
                            "temperature": record.sampling.temperature,
                            "top_p": record.sampling.top_p,
                            "top_k": record.sampling.top_k,
                        },
                        "context_output_tokens": record.context_output_tokens(),
                    }));
                    cite = true;
                }
                EventBody::EvaluationRequested {
                    execution: e,
                    attempt,
                    artifact_version,
                    branch_ref,
                } if *e == execution && scored => {
                    evaluations.push(json!({"entry": index, "at_s": at_s, "kind": "requested", "attempt": attempt, "artifact_version": artifact_version, "branch_ref": branch_ref}));
                    cite = true;
                }
                EventBody::EvaluationCompleted {
                    execution: e,
                    attempt,
                    score,
                    valid,
                    evaluated_state_ref,
                    artifact_version,
                    branch_ref,
                    evaluator,
                } if *e == execution && scored => {
                    evaluations.push(json!({"entry": index, "at_s": at_s, "kind": "completed", "attempt": attempt, "score": score, "valid": valid, "evaluated_state_ref": evaluated_state_ref, "artifact_version": artifact_version, "branch_ref": branch_ref, "evaluator": evaluator}));
                    cite = true;
                }
                EventBody::EvaluationFailed {
                    execution: e,
                    attempt,
                    reason,
                } if *e == execution && scored => {
                    evaluations.push(json!({"entry": index, "at_s": at_s, "kind": "failed", "attempt": attempt, "reason": reason}));
                    cite = true;
                }
                EventBody::DummyInserted { execution: e, .. } if *e == execution && scored => {
                    dummy = true;
                    cite = true;
                }
                EventBody::ExecutionExcluded {
                    execution: e,
                    reason,
                } if *e == execution && scored => {
                    excluded = json!({"entry": index, "reason": reason});
                    cite = true;
                }
                EventBody::TrajectoriesAdmitted {
                    execution: e,
                    trajectories,
                } if *e == execution => {
                    admitted = json!({"entry": index, "trajectories": trajectories.iter().map(|t| json!({
                        "leaf_call": t.leaf_call.to_string(),
                        "class": t.class,
                        "targets": t.targets.iter().map(|r| json!([r.call.to_string(), r.start, r.end])).collect::<Vec<_>>(),
                    })).collect::<Vec<_>>()});
                    cite = true;
                }
                EventBody::OptimizerStepped {
                    step,
                    policy_version,
                    consumed,
                } => {
                    if let Some(record) = consumed.iter().find(|c| Some(c.group) == group) {
                        consumed_by = json!({"entry": index, "at_s": at_s, "step": step.get(), "policy_version_after": policy_version.get(), "staleness": record.staleness});
                        cite = true;
                    }
                }
                _ => {}
            }
            if cite {
                cited.insert(*index);
            }
        }
    }
    let normalization = AdvantageNormalization::default();
    let mut rewards: Vec<Value> = Vec::new();
    let mut without_reward: Vec<String> = Vec::new();
    for member in &members {
        match scoring.executions[member].resolution() {
            Some(Resolution::Valid { reward, .. }) => {
                rewards.push(json!([member.to_string(), reward]));
            }
            Some(Resolution::Dummy) => rewards.push(json!([member.to_string(), 0.0])),
            Some(Resolution::Excluded { .. }) | None => without_reward.push(member.to_string()),
        }
    }
    let designated = scoring
        .executions
        .get(&execution)
        .and_then(|score| score.designated())
        .map(|(attempt, score)| json!({"attempt": attempt, "score": score, "frozen_in": designated_in}));
    let advantage = group
        .and_then(|group| scoring.advantages(group, normalization))
        .and_then(|advantages| advantages.get(&execution).copied());
    let facts = json!({
        "execution": execution.to_string(),
        "group": group.map(|g| g.to_string()),
        "group_dispatched_in": dispatched_in,
        "started": started,
        "closed": closed,
        "model_calls": calls,
        "evaluations": evaluations,
        "dummy": dummy,
        "excluded": excluded,
        "designated_result": designated,
        "group_rewards": rewards,
        "group_members_without_reward": without_reward,
        "advantage": advantage,
        "advantage_normalization": format!("{normalization:?}"),
        "admitted": admitted,
        "consumed_by": consumed_by,
    });
    Extracted {
        facts,
        cited,
        skipped,
    }
}

/// What [`extract`] found.
struct Extracted {
    facts: Value,
    /// The entries the facts cite.
    cited: BTreeSet<u64>,
    /// The events of the group skipped as refused by the whole state.
    skipped: BTreeSet<(u64, usize)>,
}

/// (entry, position) of every event the whole state refuses when the log is folded from its
/// first entry (`ControlState::apply`, as every replica folds it).
fn refused_by_state(entries: &[(u64, Vec<Event>)]) -> BTreeSet<(u64, usize)> {
    let mut state = gyre_state::ControlState::new();
    let mut refused = BTreeSet::new();
    for (index, events) in entries {
        for (position, event) in events.iter().enumerate() {
            if state.apply(event).is_err() {
                refused.insert((*index, position));
            }
        }
    }
    refused
}

fn build(
    log: &std::path::Path,
    execution: &str,
    out: &std::path::Path,
    complete: bool,
) -> anyhow::Result<()> {
    let execution = parse_execution(execution)?;
    if log.is_dir() {
        bail!(
            "{} is a directory: audit reads an event file; export a control node's log with \
             `gyre log export --node ADDR --out FILE` (or a proxy's `--log` file)",
            log.display()
        );
    }
    let reader =
        EventFileReader::open(log).with_context(|| format!("opening {}", log.display()))?;
    let base = reader.header().base_hash;
    let mut entries = Vec::new();
    let mut links = Vec::new();
    let mut payloads = BTreeMap::new();
    let mut hashes = Vec::new();
    for record in reader {
        let record = record
            .with_context(|| format!("reading {} (audit needs an undamaged log)", log.display()))?;
        let events = record.decode_events_in(log)?;
        links.push(ChainLink {
            index: record.index,
            term: record.term,
            payload_sha256: to_hex(&payload_digest(&record.payload)),
        });
        hashes.push(record.hash);
        payloads.insert(record.index, record.payload);
        entries.push((record.index, events));
    }
    // A log that starts past entry 1 (an export of a purged log) cannot be folded from the
    // start: which events the whole state refused is not known.
    let refusals_known = entries.first().is_none_or(|(start, _)| *start == 1);
    let state_refused = match entries.first() {
        Some((start, _)) if *start > 1 => {
            eprintln!(
                "warning: {} starts at entry {start}: which events the whole state refused is \
                 unknown without the entries before it; the facts fold the scoring projection \
                 alone (export the log before it is purged for a full audit)",
                log.display()
            );
            BTreeSet::new()
        }
        _ => refused_by_state(&entries),
    };
    let Extracted {
        facts,
        cited,
        skipped,
    } = extract(&entries, execution, &state_refused);
    // A proxy's own event file (`gyre proxy --log`) has model calls but no scheduler events:
    // its bundle carries the calls and `started: null`.
    let Some(&first) = cited.iter().next() else {
        bail!(
            "execution {execution} never started and made no model call in {}",
            log.display()
        );
    };
    let position = links
        .iter()
        .position(|l| l.index == first)
        .expect("cited entries come from the log");
    let base_hash = if position == 0 {
        base
    } else {
        hashes[position - 1]
    };
    let head = *hashes.last().expect("the log has entries");
    let head_index = links.last().map_or(first, |link| link.index);
    let consumed = !facts["consumed_by"].is_null();
    let bundle = Bundle {
        format: BUNDLE_FORMAT.to_string(),
        execution: execution.to_string(),
        facts,
        base_hash: hex(&base_hash),
        chain: links.split_off(position),
        head: hex(&head),
        payloads: {
            // Through the step that consumed the group; while none has, to the head (a later
            // entry could still add to the group's facts).
            let last = if complete && !consumed {
                head_index
            } else {
                cited.last().copied().unwrap_or(first)
            };
            payloads
                .into_iter()
                .filter(|(index, _)| {
                    cited.contains(index) || (complete && (first..=last).contains(index))
                })
                .map(|(index, payload)| (index, to_hex(&payload)))
                .collect()
        },
        state_refused: refusals_known.then(|| skipped.iter().copied().collect()),
    };
    std::fs::write(out, serde_json::to_string_pretty(&bundle)?)
        .with_context(|| format!("writing {}", out.display()))?;
    outln!(
        "bundle {}: execution {execution}, {} cited entries, chained to head {}",
        out.display(),
        bundle.payloads.len(),
        bundle.head
    );
    Ok(())
}

fn verify(
    path: &std::path::Path,
    trusted_head: &str,
    require_complete: bool,
) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let bundle: Bundle = serde_json::from_str(&text)
        .with_context(|| format!("{} is not an audit bundle", path.display()))?;
    if bundle.format != BUNDLE_FORMAT {
        bail!(
            "unknown bundle format `{}` (expected {BUNDLE_FORMAT})",
            bundle.format
        );
    }
    let trusted = hash_from_hex(trusted_head).context("--head")?;
    let mut hash = hash_from_hex(&bundle.base_hash).context("base_hash")?;
    let mut entries = Vec::new();
    for link in &bundle.chain {
        let digest =
            hash_from_hex(&link.payload_sha256).with_context(|| format!("entry {}", link.index))?;
        if let Some(payload_hex) = bundle.payloads.get(&link.index) {
            let payload = from_hex(payload_hex)
                .with_context(|| format!("payload of entry {}", link.index))?;
            if payload_digest(&payload) != digest {
                bail!(
                    "entry {}: payload does not match its digest in the chain",
                    link.index
                );
            }
            let events = decode_batch(&payload)
                .with_context(|| format!("entry {} does not decode", link.index))?;
            entries.push((link.index, events));
        }
        hash = chain_hash_of_digest(&hash, link.index, link.term, &digest);
    }
    if bundle
        .payloads
        .keys()
        .any(|index| !bundle.chain.iter().any(|l| l.index == *index))
    {
        bail!("the bundle carries a payload that is not on its chain");
    }
    if hash != trusted {
        bail!("the chain ends at {} but the trusted head is {}: the bundle does not belong to that log", hex(&hash), trusted_head);
    }
    if hex(&hash) != bundle.head {
        bail!(
            "the bundle's stated head {} differs from its chain",
            bundle.head
        );
    }
    let execution = parse_execution(&bundle.execution)?;
    let claimed: BTreeSet<(u64, usize)> = bundle.state_refused.iter().flatten().copied().collect();
    let Extracted { facts, skipped, .. } = extract(&entries, execution, &claimed);
    if let Some((entry, position)) = claimed.difference(&skipped).next() {
        bail!(
            "the bundle lists event {position} of entry {entry} as refused by the whole state, \
             but the carried entries hold no event about the execution or its group there"
        );
    }
    if facts != bundle.facts {
        bail!("the bundle's facts differ from what its cited entries say");
    }
    let closed = facts["closed"]["status"].as_str().unwrap_or("open");
    outln!(
        "ok: {} facts verified from {} carried entries, chained to head {} ({} links); closed {closed}, advantage {}",
        bundle.execution,
        entries.len(),
        bundle.head,
        bundle.chain.len(),
        facts["advantage"]
    );
    if bundle.state_refused.is_none() {
        outln!(
            "refusals by the whole state: unknown (the bundle was built from a log that starts \
             past entry 1); an event no replica applied could be among the facts"
        );
    } else if claimed.is_empty() {
        outln!(
            "refusals by the whole state: none, as the bundle claims (a verifier cannot \
             recompute them from the carried entries, only `gyre audit` on the whole log can)"
        );
    } else {
        outln!(
            "taken from the bundle: {} event(s) of the group the whole state refused ({}); a \
             verifier cannot recompute those from the carried entries, only `gyre audit` on \
             the whole log can",
            claimed.len(),
            claimed
                .iter()
                .map(|(entry, position)| format!("entry {entry} #{position}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let completeness = completeness(&bundle, &facts);
    outln!("{completeness}");
    if require_complete && !completeness.starts_with("complete") {
        bail!("--require-complete: the bundle is partial");
    }
    if require_complete && bundle.state_refused.is_none() {
        bail!("--require-complete: which events the whole state refused is unknown");
    }
    Ok(())
}

/// What a verifier can say about entries the bundle does not carry. With every entry from the
/// group's dispatch (before which none of its events can be) to the last carried one, nothing
/// relevant was left out in that span; when the step that consumed the group is in it, later
/// entries cannot change what training used.
fn completeness(bundle: &Bundle, facts: &Value) -> String {
    let (Some(&first), Some(&last)) =
        (bundle.payloads.keys().next(), bundle.payloads.keys().last())
    else {
        return "partial: the bundle carries no entry".into();
    };
    let gaps = bundle
        .chain
        .iter()
        .filter(|link| (first..=last).contains(&link.index))
        .filter(|link| !bundle.payloads.contains_key(&link.index))
        .count();
    let from_dispatch = facts["group_dispatched_in"].as_u64() == Some(first);
    if gaps > 0 || !from_dispatch {
        return format!(
            "partial: the facts are recomputed from the carried entries only; {gaps} entries \
             between entry {first} and entry {last} are not carried{}, so an event in one of them \
             is not checked (build the bundle with --complete to carry them)",
            if from_dispatch {
                ""
            } else {
                " and the first carried entry is not the group's dispatch"
            }
        );
    }
    let head = bundle.chain.last().map_or(last, |link| link.index);
    match facts["consumed_by"]["entry"].as_u64() {
        Some(step) => format!(
            "complete: every entry from the group's dispatch (entry {first}) to entry {last} is \
             carried, through the optimizer step that consumed the group (entry {step}): no \
             later entry changes what training used"
        ),
        None if last == head => format!(
            "complete: every entry from the group's dispatch (entry {first}) to the head (entry \
             {head}) is carried; no optimizer step has consumed the group"
        ),
        None => format!(
            "partial: every entry from the group's dispatch (entry {first}) to entry {last} is \
             carried, but the group had not been consumed there and entries {} to {head} are \
             not carried",
            last + 1
        ),
    }
}
