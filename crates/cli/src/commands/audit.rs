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

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use gyre_event::{Event, EventBody, ExecutionId, GroupId};
use gyre_log::file::{chain_hash_of_digest, hex, payload_digest};
use gyre_log::{decode_batch, EventFileReader};
use gyre_trajectory::{group_advantages, AdvantageNormalization};

const BUNDLE_FORMAT: &str = "gyre-audit-bundle-v1";

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
}

pub fn run(args: AuditArgs) -> anyhow::Result<()> {
    match args.command {
        Some(AuditCommand::Verify { bundle, head }) => verify(&bundle, &head),
        None => {
            let (Some(log), Some(execution), Some(out)) = (args.log, args.execution, args.out)
            else {
                bail!("usage: gyre audit LOG --execution E --out bundle.json, or gyre audit verify BUNDLE --head HASH");
            };
            build(&log, &execution, &out)
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

/// Everything the bundle claims about `execution`, extracted from `(entry index, events)` pairs.
/// The same function builds the bundle and verifies it.
fn extract(entries: &[(u64, Vec<Event>)], execution: ExecutionId) -> (Value, BTreeSet<u64>) {
    let mut cited = BTreeSet::new();
    let mut group: Option<GroupId> = None;
    for (_, events) in entries {
        for event in events {
            if let EventBody::ExecutionStarted {
                execution: e,
                group: g,
                ..
            } = &event.body
            {
                if *e == execution {
                    group = Some(*g);
                }
            }
        }
    }
    let mut members: BTreeSet<ExecutionId> = BTreeSet::new();
    if let Some(group) = group {
        for (_, events) in entries {
            for event in events {
                if let EventBody::ExecutionStarted {
                    execution: e,
                    group: g,
                    ..
                } = &event.body
                {
                    if *g == group {
                        members.insert(*e);
                    }
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
    // Designated result per member: the first valid evaluation, a dummy (0), or exclusion.
    let mut member_results: BTreeMap<ExecutionId, Option<f64>> = BTreeMap::new();
    for (index, events) in entries {
        for event in events {
            let at_s = event.at.as_secs_f64();
            let mut cite = false;
            match &event.body {
                EventBody::ExecutionStarted {
                    execution: e,
                    group: g,
                    engine,
                } if *e == execution => {
                    started = json!({"entry": index, "at_s": at_s, "group": g.to_string(), "engine": engine.to_string()});
                    cite = true;
                }
                EventBody::ExecutionClosed {
                    execution: e,
                    status,
                } if *e == execution => {
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
                } if *e == execution => {
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
                } => {
                    if members.contains(e) && *valid {
                        member_results.entry(*e).or_insert(Some(*score));
                        cite = true;
                    }
                    if *e == execution {
                        evaluations.push(json!({"entry": index, "at_s": at_s, "kind": "completed", "attempt": attempt, "score": score, "valid": valid, "evaluated_state_ref": evaluated_state_ref, "artifact_version": artifact_version, "branch_ref": branch_ref, "evaluator": evaluator}));
                        cite = true;
                    }
                }
                EventBody::EvaluationFailed {
                    execution: e,
                    attempt,
                    reason,
                } if *e == execution => {
                    evaluations.push(json!({"entry": index, "at_s": at_s, "kind": "failed", "attempt": attempt, "reason": reason}));
                    cite = true;
                }
                EventBody::DummyInserted { execution: e, .. } if members.contains(e) => {
                    member_results.entry(*e).or_insert(Some(0.0));
                    dummy |= *e == execution;
                    cite = true;
                }
                EventBody::ExecutionExcluded {
                    execution: e,
                    reason,
                } if members.contains(e) => {
                    member_results.entry(*e).or_insert(None);
                    if *e == execution {
                        excluded = json!({"entry": index, "reason": reason});
                    }
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
    let valid: Vec<(ExecutionId, f64)> = member_results
        .iter()
        .filter_map(|(e, r)| r.map(|score| (*e, score)))
        .collect();
    let rewards: Vec<f64> = valid.iter().map(|(_, r)| *r).collect();
    let normalization = AdvantageNormalization::default();
    let advantages = group_advantages(&rewards, normalization);
    let advantage = valid
        .iter()
        .zip(&advantages)
        .find(|((e, _), _)| *e == execution)
        .map(|(_, a)| *a);
    let facts = json!({
        "execution": execution.to_string(),
        "group": group.map(|g| g.to_string()),
        "started": started,
        "closed": closed,
        "model_calls": calls,
        "evaluations": evaluations,
        "dummy": dummy,
        "excluded": excluded,
        "group_rewards": valid.iter().map(|(e, r)| json!([e.to_string(), r])).collect::<Vec<_>>(),
        "group_members_without_reward": member_results.iter().filter(|(_, r)| r.is_none()).map(|(e, _)| e.to_string()).collect::<Vec<_>>(),
        "advantage": advantage,
        "advantage_normalization": format!("{normalization:?}"),
        "admitted": admitted,
        "consumed_by": consumed_by,
    });
    (facts, cited)
}

fn build(log: &std::path::Path, execution: &str, out: &std::path::Path) -> anyhow::Result<()> {
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
    let (facts, cited) = extract(&entries, execution);
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
    let bundle = Bundle {
        format: BUNDLE_FORMAT.to_string(),
        execution: execution.to_string(),
        facts,
        base_hash: hex(&base_hash),
        chain: links.split_off(position),
        head: hex(&head),
        payloads: payloads
            .into_iter()
            .filter(|(index, _)| cited.contains(index))
            .map(|(index, payload)| (index, to_hex(&payload)))
            .collect(),
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

fn verify(path: &std::path::Path, trusted_head: &str) -> anyhow::Result<()> {
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
    let (facts, _) = extract(&entries, execution);
    if facts != bundle.facts {
        bail!("the bundle's facts differ from what its cited entries say");
    }
    let closed = facts["closed"]["status"].as_str().unwrap_or("open");
    outln!(
        "ok: {} facts verified from {} cited entries, chained to head {} ({} links); closed {closed}, advantage {}",
        bundle.execution,
        entries.len(),
        bundle.head,
        bundle.chain.len(),
        facts["advantage"]
    );
    Ok(())
}
