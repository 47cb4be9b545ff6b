//! The trajectory buffer's snapshot encoding: trees, scoring, admissions and packed groups,
//! every field, with `gyre_event::wire`.
//!
//! `gyre-state` frames this (magic, format version, checksum) together with the scheduler
//! projection; a change here is a change of that format version. Maps and sets are written in
//! their `BTreeMap` order with increasing keys, so equal buffers give equal bytes and the
//! decoder refuses repeats and any other order.
//!
//! A tree stores its nodes in arena order with what each record contributed (the normalised
//! prefix parent as a backward distance, the start position, tokens, provenance, log-probs);
//! children, children-at-end counts, depths, the call index and the child indexes are rebuilt on
//! decode by the same code `Tree::apply` uses, after checks that make the rebuild unable to
//! panic. Agent names are written once per tree and referred to by their order of first use.
//! Token ids are varints; log-probs and scores are written by their bits.

use std::collections::{BTreeMap, BTreeSet};

use gyre_event::wire::{Reader, WireError, WireErrorKind, Writer};
use gyre_event::{
    AdmittedTrajectory, CallId, CallKind, CloseStatus, Duration, EngineId, ExecutionId, GroupId,
    PolicyVersion, Provenance, ProvenanceSpan, StepId, TargetRange, Timestamp,
};

use crate::tree::NodeParts;
use crate::{
    AttemptOutcome, EvaluationAttempt, ExecutionScore, GroupScore, NodeId, RetiredTree, Scoring,
    ScoringConfig, TrajectoryBuffer, Tree, TreeConfig,
};

fn kind_code(kind: CallKind) -> u8 {
    match kind {
        CallKind::Turn => 0,
        CallKind::Summary => 1,
        CallKind::Aborted => 2,
    }
}

fn provenance_code(provenance: Provenance) -> u8 {
    match provenance {
        Provenance::System => 0,
        Provenance::User => 1,
        Provenance::ToolResult => 2,
        Provenance::HarnessAssistant => 3,
        Provenance::EvaluatorCritique => 4,
        Provenance::Template => 5,
        Provenance::Sampled => 6,
    }
}

fn close_status_code(status: CloseStatus) -> u8 {
    match status {
        CloseStatus::Completed => 0,
        CloseStatus::Failed => 1,
        CloseStatus::HarnessTimeout => 2,
        CloseStatus::OverallTimeout => 3,
        CloseStatus::Cancelled => 4,
        CloseStatus::Surplus => 5,
    }
}

fn read_code<T>(
    reader: &mut Reader<'_>,
    field: &'static str,
    decode: impl Fn(u8) -> Option<T>,
) -> Result<T, WireError> {
    let start = reader.offset();
    let code = reader.u8(field)?;
    decode(code).ok_or_else(|| {
        reader.error_at(start, field, WireErrorKind::UnknownTag { tag: code as u64 })
    })
}

fn inconsistent(
    reader: &Reader<'_>,
    offset: usize,
    field: &'static str,
    message: String,
) -> WireError {
    reader.error_at(offset, field, WireErrorKind::Inconsistent(message))
}

fn write_tree_config(writer: &mut Writer, config: &TreeConfig) {
    let TreeConfig {
        nodes_max,
        path_tokens_max,
        root_shared_tokens_min,
    } = config;
    writer.u32(*nodes_max);
    writer.varint(*path_tokens_max);
    writer.varint(*root_shared_tokens_min);
}

fn read_tree_config(reader: &mut Reader<'_>, field: &'static str) -> Result<TreeConfig, WireError> {
    Ok(TreeConfig {
        nodes_max: reader.u32(field)?,
        path_tokens_max: reader.varint(field)?,
        root_shared_tokens_min: reader.varint(field)?,
    })
}

impl Tree {
    /// Appends the tree's canonical snapshot encoding (its execution id is the caller's key).
    pub fn encode_into(&self, writer: &mut Writer) {
        write_tree_config(writer, self.config());
        writer.count(self.len());
        let mut agents: BTreeMap<&str, u64> = BTreeMap::new();
        for (index, node) in self.nodes().iter().enumerate() {
            writer.varint(node.call.get());
            match agents.get(node.agent.as_str()) {
                Some(position) => writer.varint(*position),
                None => {
                    writer.varint(0);
                    writer.str(&node.agent);
                    let position = agents.len() as u64 + 1;
                    agents.insert(&node.agent, position);
                }
            }
            writer.u8(kind_code(node.kind));
            writer.u32(node.engine.get());
            writer.varint(node.policy_version.get());
            writer.option_varint(node.spawned_by.map(CallId::get));
            writer.varint(
                node.parent
                    .map_or(0, |parent| (index - parent.index()) as u64),
            );
            writer.varint(node.start);
            writer.count(node.input_ids.len());
            writer.u32s(&node.input_ids);
            writer.count(node.input_provenance.len());
            for span in &node.input_provenance {
                writer.u8(provenance_code(span.provenance));
                writer.u32(span.tokens_count);
            }
            // One count for both: every output token has its log-prob.
            writer.count(node.output_ids.len());
            writer.u32s(&node.output_ids);
            writer.f32s(&node.output_logprobs);
        }
    }

    /// Reads what [`Tree::encode_into`] wrote for `execution`, rebuilding every index. Never
    /// panics; refuses a node that could not have been applied (a parent that does not precede
    /// it, a start outside its parent's tokens, a repeated call, no output).
    pub fn decode_from(reader: &mut Reader<'_>, execution: ExecutionId) -> Result<Tree, WireError> {
        let config = read_tree_config(reader, "trajectory.trees.config")?;
        let mut tree = Tree::new(execution, config);
        let count = reader.count("trajectory.trees.nodes", 14)?;
        let mut agents: Vec<String> = Vec::new();
        for index in 0..count {
            let start_offset = reader.offset();
            let call = CallId(reader.varint("trajectory.trees.nodes.call")?);
            let agent_offset = reader.offset();
            let agent = match reader.varint("trajectory.trees.nodes.agent")? {
                0 => {
                    let agent = reader.string("trajectory.trees.nodes.agent")?;
                    if agents.contains(&agent) {
                        return Err(inconsistent(
                            reader,
                            agent_offset,
                            "trajectory.trees.nodes.agent",
                            format!("agent `{agent}` written twice instead of referred to"),
                        ));
                    }
                    agents.push(agent.clone());
                    agent
                }
                position => usize::try_from(position - 1)
                    .ok()
                    .and_then(|index| agents.get(index))
                    .cloned()
                    .ok_or_else(|| {
                        reader.error_at(
                            agent_offset,
                            "trajectory.trees.nodes.agent",
                            WireErrorKind::OutOfRange {
                                value: position,
                                max: agents.len() as u64,
                            },
                        )
                    })?,
            };
            let kind = read_code(reader, "trajectory.trees.nodes.kind", |code| match code {
                0 => Some(CallKind::Turn),
                1 => Some(CallKind::Summary),
                2 => Some(CallKind::Aborted),
                _ => None,
            })?;
            let engine = EngineId(reader.u32("trajectory.trees.nodes.engine")?);
            let policy_version =
                PolicyVersion(reader.varint("trajectory.trees.nodes.policy_version")?);
            let spawned_by = reader
                .option_varint("trajectory.trees.nodes.spawned_by")?
                .map(CallId);
            let parent_offset = reader.offset();
            let parent = match reader.varint("trajectory.trees.nodes.parent")? {
                0 => None,
                distance if distance <= index as u64 => {
                    Some(NodeId((index as u64 - distance) as u32))
                }
                distance => {
                    return Err(reader.error_at(
                        parent_offset,
                        "trajectory.trees.nodes.parent",
                        WireErrorKind::OutOfRange {
                            value: distance,
                            max: index as u64,
                        },
                    ))
                }
            };
            let start = reader.varint("trajectory.trees.nodes.start")?;
            let inputs = reader.count("trajectory.trees.nodes.input_ids", 1)?;
            let input_ids = reader.u32s("trajectory.trees.nodes.input_ids", inputs)?;
            let spans = reader.count("trajectory.trees.nodes.input_provenance", 2)?;
            let mut input_provenance = Vec::with_capacity(spans);
            for _ in 0..spans {
                let provenance =
                    read_code(reader, "trajectory.trees.nodes.input_provenance", |code| {
                        Provenance::ALL
                            .iter()
                            .copied()
                            .find(|provenance| provenance_code(*provenance) == code)
                    })?;
                let tokens_count = reader.u32("trajectory.trees.nodes.input_provenance")?;
                input_provenance.push(ProvenanceSpan {
                    provenance,
                    tokens_count,
                });
            }
            let outputs = reader.count("trajectory.trees.nodes.output_ids", 5)?;
            let output_ids = reader.u32s("trajectory.trees.nodes.output_ids", outputs)?;
            let output_logprobs = reader.f32s("trajectory.trees.nodes.output_logprobs", outputs)?;
            tree.restore_node(NodeParts {
                call,
                agent,
                kind,
                engine,
                policy_version,
                spawned_by,
                parent,
                start,
                input_ids,
                input_provenance,
                output_ids,
                output_logprobs,
                // In the buffer's own section (format 4), set after every tree is read.
                context_outputs: 0,
                // In the buffer's own section (format 3), set after every tree is read.
                stop_sequences: Vec::new(),
            })
            .map_err(|message| {
                inconsistent(reader, start_offset, "trajectory.trees.nodes", message)
            })?;
        }
        Ok(tree)
    }
}

fn write_outcome(writer: &mut Writer, outcome: &Option<AttemptOutcome>) {
    match outcome {
        None => writer.u8(0),
        Some(AttemptOutcome::Completed {
            score,
            valid,
            evaluated_state_ref,
            evaluator,
        }) => {
            writer.u8(1);
            writer.f64(*score);
            writer.bool(*valid);
            writer.str(evaluated_state_ref);
            writer.str(evaluator);
        }
        Some(AttemptOutcome::Failed { reason }) => {
            writer.u8(2);
            writer.str(reason);
        }
    }
}

fn read_outcome(reader: &mut Reader<'_>) -> Result<Option<AttemptOutcome>, WireError> {
    const FIELD: &str = "trajectory.scoring.attempts.outcome";
    let start = reader.offset();
    match reader.u8(FIELD)? {
        0 => Ok(None),
        1 => Ok(Some(AttemptOutcome::Completed {
            score: reader.f64(FIELD)?,
            valid: reader.bool(FIELD)?,
            evaluated_state_ref: reader.string(FIELD)?,
            evaluator: reader.string(FIELD)?,
        })),
        2 => Ok(Some(AttemptOutcome::Failed {
            reason: reader.string(FIELD)?,
        })),
        tag => Err(reader.error_at(start, FIELD, WireErrorKind::UnknownTag { tag: tag as u64 })),
    }
}

fn write_execution_score(writer: &mut Writer, score: &ExecutionScore) {
    let ExecutionScore {
        group,
        started_at,
        closed,
        attempts,
        dummy,
        excluded,
        // Written apart, only where it is not implied (see `TrajectoryBuffer::encode_into`).
        designated: _,
    } = score;
    writer.varint(group.get());
    writer.varint(started_at.nanos());
    match closed {
        None => writer.u8(0),
        Some((status, at)) => {
            writer.u8(1 + close_status_code(*status));
            writer.varint(at.nanos());
        }
    }
    writer.count(attempts.len());
    let mut previous = None;
    for (attempt, record) in attempts {
        let EvaluationAttempt {
            artifact_version,
            branch_ref,
            requested_at,
            outcome,
        } = record;
        writer.increasing(previous, *attempt as u64);
        previous = Some(*attempt as u64);
        writer.varint(*artifact_version);
        writer.str(branch_ref);
        writer.varint(requested_at.nanos());
        write_outcome(writer, outcome);
    }
    writer.bool(*dummy);
    writer.bool(excluded.is_some());
    if let Some(reason) = excluded {
        writer.str(reason);
    }
}

fn read_execution_score(reader: &mut Reader<'_>) -> Result<ExecutionScore, WireError> {
    let group = GroupId(reader.varint("trajectory.scoring.executions.group")?);
    let started_at = Timestamp(reader.varint("trajectory.scoring.executions.started_at")?);
    let closed = match read_code(
        reader,
        "trajectory.scoring.executions.closed",
        |code| match code {
            0 => Some(None),
            code => CloseStatus::ALL
                .iter()
                .copied()
                .find(|status| close_status_code(*status) + 1 == code)
                .map(Some),
        },
    )? {
        None => None,
        Some(status) => Some((
            status,
            Timestamp(reader.varint("trajectory.scoring.executions.closed_at")?),
        )),
    };
    let count = reader.count("trajectory.scoring.attempts", 5)?;
    let mut attempts = BTreeMap::new();
    let mut previous = None;
    for _ in 0..count {
        let start = reader.offset();
        let attempt = reader.increasing("trajectory.scoring.attempts.attempt", previous)?;
        previous = Some(attempt);
        let attempt = u32::try_from(attempt).map_err(|_| {
            reader.error_at(
                start,
                "trajectory.scoring.attempts.attempt",
                WireErrorKind::OutOfRange {
                    value: attempt,
                    max: u32::MAX as u64,
                },
            )
        })?;
        let record = EvaluationAttempt {
            artifact_version: reader.varint("trajectory.scoring.attempts.artifact_version")?,
            branch_ref: reader.string("trajectory.scoring.attempts.branch_ref")?,
            requested_at: Timestamp(reader.varint("trajectory.scoring.attempts.requested_at")?),
            outcome: read_outcome(reader)?,
        };
        attempts.insert(attempt, record);
    }
    let dummy = reader.bool("trajectory.scoring.executions.dummy")?;
    let excluded = if reader.bool("trajectory.scoring.executions.excluded")? {
        Some(reader.string("trajectory.scoring.executions.excluded")?)
    } else {
        None
    };
    let mut score = ExecutionScore {
        group,
        started_at,
        closed,
        attempts,
        dummy,
        excluded,
        designated: None,
    };
    // Implied by the rest; a frozen designation that differs is in the buffer's format-5
    // section.
    score.designated = score.fresh_designation();
    Ok(score)
}

/// Every group member has a score in that group and every score is listed by its group,
/// exactly once: `Scoring::apply` keeps this, and `group_ready` and `validate` index by it.
fn check_membership(scoring: &Scoring) -> Result<(), String> {
    let mut listed: BTreeSet<ExecutionId> = BTreeSet::new();
    for (group, state) in &scoring.groups {
        for member in &state.members {
            match scoring.executions.get(member) {
                None => return Err(format!("{group} lists {member}, which has no score")),
                Some(score) if score.group != *group => {
                    return Err(format!(
                        "{group} lists {member}, which belongs to {}",
                        score.group
                    ))
                }
                Some(_) => {}
            }
            if !listed.insert(*member) {
                return Err(format!("{member} is listed twice"));
            }
        }
    }
    if listed.len() != scoring.executions.len() {
        return Err(format!(
            "{} executions have scores but {} are group members",
            scoring.executions.len(),
            listed.len()
        ));
    }
    Ok(())
}

impl Scoring {
    pub fn encode_into(&self, writer: &mut Writer) {
        let Scoring {
            config,
            executions,
            groups,
            awaiting: _, // derived: rebuilt by `from_parts`
        } = self;
        let ScoringConfig {
            evaluation_budget,
            attempts_max,
        } = config;
        writer.varint(evaluation_budget.nanos());
        writer.u32(*attempts_max);
        writer.count(executions.len());
        let mut previous = None;
        for (execution, score) in executions {
            writer.increasing(previous, execution.get());
            previous = Some(execution.get());
            write_execution_score(writer, score);
        }
        writer.count(groups.len());
        let mut previous = None;
        for (group, state) in groups {
            let GroupScore {
                executions_per_group,
                policy_version,
                members,
            } = state;
            writer.increasing(previous, group.get());
            previous = Some(group.get());
            writer.u32(*executions_per_group);
            writer.varint(policy_version.get());
            writer.count(members.len());
            for member in members {
                writer.varint(member.get());
            }
        }
    }

    /// Reads what [`Scoring::encode_into`] wrote; refuses members without a score and scores
    /// outside their group.
    pub fn decode_from(reader: &mut Reader<'_>) -> Result<Scoring, WireError> {
        let config = ScoringConfig {
            evaluation_budget: Duration(reader.varint("trajectory.scoring.evaluation_budget")?),
            attempts_max: reader.u32("trajectory.scoring.attempts_max")?,
        };
        let count = reader.count("trajectory.scoring.executions", 7)?;
        let mut executions = BTreeMap::new();
        let mut previous = None;
        for _ in 0..count {
            let execution = reader.increasing("trajectory.scoring.executions.id", previous)?;
            previous = Some(execution);
            executions.insert(ExecutionId(execution), read_execution_score(reader)?);
        }
        let count = reader.count("trajectory.scoring.groups", 4)?;
        let mut groups = BTreeMap::new();
        let mut previous = None;
        for _ in 0..count {
            let group = reader.increasing("trajectory.scoring.groups.id", previous)?;
            previous = Some(group);
            let executions_per_group =
                reader.u32("trajectory.scoring.groups.executions_per_group")?;
            let policy_version =
                PolicyVersion(reader.varint("trajectory.scoring.groups.policy_version")?);
            let members_count = reader.count("trajectory.scoring.groups.members", 1)?;
            let mut members = Vec::with_capacity(members_count);
            for _ in 0..members_count {
                members.push(ExecutionId(
                    reader.varint("trajectory.scoring.groups.members")?,
                ));
            }
            groups.insert(
                GroupId(group),
                GroupScore {
                    executions_per_group,
                    policy_version,
                    members,
                },
            );
        }
        let scoring = Scoring::from_parts(config, executions, groups);
        check_membership(&scoring).map_err(|message| {
            inconsistent(
                reader,
                reader.offset(),
                "trajectory.scoring.groups.members",
                message,
            )
        })?;
        Ok(scoring)
    }
}

fn write_admitted(writer: &mut Writer, trajectory: &AdmittedTrajectory) {
    let AdmittedTrajectory {
        leaf_call,
        class,
        targets,
    } = trajectory;
    writer.varint(leaf_call.get());
    writer.u32(*class);
    writer.count(targets.len());
    for TargetRange { call, start, end } in targets {
        writer.varint(call.get());
        writer.u32(*start);
        writer.u32(*end);
    }
}

fn read_admitted(reader: &mut Reader<'_>) -> Result<AdmittedTrajectory, WireError> {
    let leaf_call = CallId(reader.varint("trajectory.admissions.leaf_call")?);
    let class = reader.u32("trajectory.admissions.class")?;
    let count = reader.count("trajectory.admissions.targets", 3)?;
    let mut targets = Vec::with_capacity(count);
    for _ in 0..count {
        targets.push(TargetRange {
            call: CallId(reader.varint("trajectory.admissions.targets.call")?),
            start: reader.u32("trajectory.admissions.targets.start")?,
            end: reader.u32("trajectory.admissions.targets.end")?,
        });
    }
    Ok(AdmittedTrajectory {
        leaf_call,
        class,
        targets,
    })
}

/// Writes a section of per-call entries that [`read_call_section`] reads: the live trees'
/// calls whose node `carries` something, by execution then in node order, each as its
/// execution, call and what `value` writes.
fn write_call_section(
    writer: &mut Writer,
    trees: &BTreeMap<ExecutionId, Tree>,
    carries: impl Fn(&crate::tree::Node) -> bool,
    mut value: impl FnMut(&mut Writer, &crate::tree::Node),
) {
    let entries: Vec<(ExecutionId, &crate::tree::Node)> = trees
        .iter()
        .flat_map(|(execution, tree)| {
            tree.nodes()
                .iter()
                .filter(|node| carries(node))
                .map(move |node| (*execution, node))
        })
        .collect();
    writer.count(entries.len());
    for (execution, node) in entries {
        writer.varint(execution.get());
        writer.varint(node.call.get());
        value(writer, node);
    }
}

/// Reads a section of per-call entries — its count, then each entry's execution, call and
/// value — that the live trees' calls carry apart from their nodes (so older formats' node
/// layout stays unchanged). Entries come once each, in (execution, node) order; `restore`
/// applies a value to its call's node. `names`: the section, its execution and call fields.
fn read_call_section<T>(
    reader: &mut Reader<'_>,
    trees: &mut BTreeMap<ExecutionId, Tree>,
    names: [&'static str; 3],
    mut read_value: impl FnMut(&mut Reader<'_>) -> Result<T, WireError>,
    mut restore: impl FnMut(&mut Tree, CallId, T) -> Result<NodeId, String>,
) -> Result<(), WireError> {
    let [section, execution_field, call_field] = names;
    let count = reader.count(section, 3)?;
    // (execution, node index) of the last entry.
    let mut previous: Option<(u64, NodeId)> = None;
    for _ in 0..count {
        let start_offset = reader.offset();
        let execution = reader.varint(execution_field)?;
        let call = CallId(reader.varint(call_field)?);
        let value = read_value(reader)?;
        let restored = trees
            .get_mut(&ExecutionId(execution))
            .ok_or_else(|| format!("execution {execution} has no live tree"))
            .and_then(|tree| {
                let node = tree
                    .node_of_call(call)
                    .ok_or_else(|| format!("call {call} is not in the tree"))?;
                if previous.is_some_and(|last| last >= (execution, node)) {
                    return Err(format!(
                        "call {call} of execution {execution} is out of order"
                    ));
                }
                restore(tree, call, value)
            });
        let node =
            restored.map_err(|message| inconsistent(reader, start_offset, section, message))?;
        previous = Some((execution, node));
    }
    Ok(())
}

/// Reads the format-5 section: each entry must name a closed, scored execution and a valid
/// completion other than the one the rule implies (anything else is not what an encoder
/// writes).
fn read_designation_overrides(
    reader: &mut Reader<'_>,
    scoring: &mut Scoring,
) -> Result<(), WireError> {
    const SECTION: &str = "trajectory.designations";
    let count = reader.count(SECTION, 2)?;
    let mut previous = None;
    for _ in 0..count {
        let start = reader.offset();
        let execution = reader.increasing("trajectory.designations.execution", previous)?;
        previous = Some(execution);
        let attempt = reader.varint("trajectory.designations.attempt")?;
        let checked = (|| {
            let score = scoring
                .executions
                .get_mut(&ExecutionId(execution))
                .ok_or_else(|| format!("execution e{execution} has no score"))?;
            let attempt =
                u32::try_from(attempt).map_err(|_| format!("attempt {attempt} is out of range"))?;
            let implied = score.fresh_designation();
            if implied.is_none() || implied == Some(attempt) {
                return Err(format!(
                    "e{execution}: attempt {attempt} is not an override of the implied designation"
                ));
            }
            score.designated = Some(attempt);
            if score.designated().is_none() {
                return Err(format!(
                    "e{execution}: attempt {attempt} is not a valid completion"
                ));
            }
            Ok(())
        })();
        checked.map_err(|message| inconsistent(reader, start, SECTION, message))?;
    }
    Ok(())
}

/// The trajectory part's layout that [`TrajectoryBuffer::encode_into`] writes (the control
/// snapshot's format version; see [`TrajectoryBuffer::decode_versioned`]).
pub const TRAJECTORY_FORMAT: u32 = 5;

impl TrajectoryBuffer {
    /// Appends the canonical snapshot encoding of the whole buffer.
    pub fn encode_into(&self, writer: &mut Writer) {
        // Destructured so that a new field cannot be forgotten here.
        let TrajectoryBuffer {
            tree_config,
            trees,
            scoring,
            admissions,
            packed_groups,
            retired,
            retiring,
            consumed_groups,
        } = self;
        write_tree_config(writer, tree_config);
        writer.count(trees.len());
        let mut previous = None;
        for (execution, tree) in trees {
            writer.increasing(previous, execution.get());
            previous = Some(execution.get());
            tree.encode_into(writer);
        }
        scoring.encode_into(writer);
        writer.count(admissions.len());
        let mut previous = None;
        for (execution, trajectories) in admissions {
            writer.increasing(previous, execution.get());
            previous = Some(execution.get());
            writer.count(trajectories.len());
            for trajectory in trajectories {
                write_admitted(writer, trajectory);
            }
        }
        writer.count(packed_groups.len());
        let mut previous = None;
        for group in packed_groups {
            writer.increasing(previous, group.get());
            previous = Some(group.get());
        }
        writer.count(retired.len());
        let mut previous = None;
        for (execution, tree) in retired {
            writer.increasing(previous, execution.get());
            previous = Some(execution.get());
            writer.varint(tree.nodes);
            writer.varint(tree.leaves);
            writer.varint(tree.tokens);
            writer.varint(tree.step.get());
        }
        writer.count(retiring.len());
        let mut previous = None;
        for (execution, step) in retiring {
            writer.increasing(previous, execution.get());
            previous = Some(execution.get());
            writer.varint(step.get());
        }
        writer.count(consumed_groups.len());
        let mut previous = None;
        for (group, step) in consumed_groups {
            writer.increasing(previous, group.get());
            previous = Some(group.get());
            writer.varint(step.get());
        }
        // Format 3: the stop sequences of the live trees' calls that ran with some, by
        // execution, then in node order (apart from the nodes, so the tree layout of formats 1
        // and 2 is unchanged).
        write_call_section(
            writer,
            trees,
            |node| !node.stop_sequences.is_empty(),
            |writer, node| {
                writer.count(node.stop_sequences.len());
                for stop in &node.stop_sequences {
                    writer.str(stop);
                }
            },
        );
        // Format 4: the live trees' calls with context-only outputs (sampled under an
        // answer-format grammar, or with other settings than the policy's), by execution, then
        // in node order, each with how many.
        write_call_section(
            writer,
            trees,
            |node| node.context_outputs > 0,
            |writer, node| writer.varint(u64::from(node.context_outputs)),
        );
        // Format 5: designations frozen before a completion of a higher artifact version was
        // folded (`ExecutionScore::designation_override`), by execution.
        let overrides: Vec<(ExecutionId, u32)> = scoring
            .executions
            .iter()
            .filter_map(|(execution, score)| {
                score
                    .designation_override()
                    .map(|attempt| (*execution, attempt))
            })
            .collect();
        writer.count(overrides.len());
        let mut previous = None;
        for (execution, attempt) in overrides {
            writer.increasing(previous, execution.get());
            previous = Some(execution.get());
            writer.varint(u64::from(attempt));
        }
    }

    /// Reads what [`TrajectoryBuffer::encode_into`] wrote. Never panics.
    pub fn decode_from(reader: &mut Reader<'_>) -> Result<TrajectoryBuffer, WireError> {
        Self::decode_versioned(reader, TRAJECTORY_FORMAT)
    }

    /// [`TrajectoryBuffer::decode_from`] for what an older build wrote: `format` 1 has no
    /// retirement sections (every tree is live), 2 has them, 3 adds the calls' stop
    /// sequences, 4 the counts of context-only outputs (`Node::context_outputs`), 5 (current)
    /// the designations frozen before a later, higher-version completion (older formats had
    /// no freezing: each designation is the one the old rule gives).
    pub fn decode_versioned(
        reader: &mut Reader<'_>,
        format: u32,
    ) -> Result<TrajectoryBuffer, WireError> {
        let with_retired = format >= 2;
        let tree_config = read_tree_config(reader, "trajectory.tree_config")?;
        let count = reader.count("trajectory.trees", 5)?;
        let mut trees = BTreeMap::new();
        let mut previous = None;
        for _ in 0..count {
            let execution = reader.increasing("trajectory.trees.execution", previous)?;
            previous = Some(execution);
            let execution = ExecutionId(execution);
            trees.insert(execution, Tree::decode_from(reader, execution)?);
        }
        let mut scoring = Scoring::decode_from(reader)?;
        let count = reader.count("trajectory.admissions", 2)?;
        let mut admissions = BTreeMap::new();
        let mut previous = None;
        for _ in 0..count {
            let execution = reader.increasing("trajectory.admissions.execution", previous)?;
            previous = Some(execution);
            let trajectories_count = reader.count("trajectory.admissions.trajectories", 3)?;
            let mut trajectories = Vec::with_capacity(trajectories_count);
            for _ in 0..trajectories_count {
                trajectories.push(read_admitted(reader)?);
            }
            admissions.insert(ExecutionId(execution), trajectories);
        }
        let count = reader.count("trajectory.packed_groups", 1)?;
        let mut packed_groups = BTreeSet::new();
        let mut previous = None;
        for _ in 0..count {
            let group = reader.increasing("trajectory.packed_groups", previous)?;
            previous = Some(group);
            packed_groups.insert(GroupId(group));
        }
        // Format 2 only: retired trees, members retiring when they close, consumed groups.
        let mut retired = BTreeMap::new();
        let mut retiring = BTreeMap::new();
        let mut consumed_groups = BTreeMap::new();
        if with_retired {
            let count = reader.count("trajectory.retired", 5)?;
            let mut previous = None;
            for _ in 0..count {
                let start_offset = reader.offset();
                let execution = reader.increasing("trajectory.retired.execution", previous)?;
                previous = Some(execution);
                let execution = ExecutionId(execution);
                let tree = RetiredTree {
                    nodes: reader.varint("trajectory.retired.nodes")?,
                    leaves: reader.varint("trajectory.retired.leaves")?,
                    tokens: reader.varint("trajectory.retired.tokens")?,
                    step: StepId(reader.varint("trajectory.retired.step")?),
                };
                if trees.contains_key(&execution) || !scoring.executions.contains_key(&execution) {
                    return Err(inconsistent(
                        reader,
                        start_offset,
                        "trajectory.retired",
                        format!("execution {execution} is live or was never started"),
                    ));
                }
                retired.insert(execution, tree);
            }
            let count = reader.count("trajectory.retiring", 2)?;
            let mut previous = None;
            for _ in 0..count {
                let start_offset = reader.offset();
                let execution = reader.increasing("trajectory.retiring.execution", previous)?;
                previous = Some(execution);
                let execution = ExecutionId(execution);
                let step = StepId(reader.varint("trajectory.retiring.step")?);
                let running = scoring
                    .executions
                    .get(&execution)
                    .is_some_and(|score| score.closed.is_none());
                if retired.contains_key(&execution) || !running {
                    return Err(inconsistent(
                        reader,
                        start_offset,
                        "trajectory.retiring",
                        format!("execution {execution} is retired, closed or was never started"),
                    ));
                }
                retiring.insert(execution, step);
            }
            let count = reader.count("trajectory.consumed_groups", 2)?;
            let mut previous = None;
            for _ in 0..count {
                let group = reader.increasing("trajectory.consumed_groups.group", previous)?;
                previous = Some(group);
                let step = StepId(reader.varint("trajectory.consumed_groups.step")?);
                consumed_groups.insert(GroupId(group), step);
            }
        }
        if format >= 3 {
            read_call_section(
                reader,
                &mut trees,
                [
                    "trajectory.stop_sequences",
                    "trajectory.stop_sequences.execution",
                    "trajectory.stop_sequences.call",
                ],
                |reader| {
                    let stops_count = reader.count("trajectory.stop_sequences.stops", 1)?;
                    let mut stops = Vec::with_capacity(stops_count);
                    for _ in 0..stops_count {
                        stops.push(reader.string("trajectory.stop_sequences.stops")?);
                    }
                    Ok(stops)
                },
                |tree, call, stops| tree.restore_stop_sequences(call, stops),
            )?;
        }
        if format >= 4 {
            read_call_section(
                reader,
                &mut trees,
                [
                    "trajectory.context_outputs",
                    "trajectory.context_outputs.execution",
                    "trajectory.context_outputs.call",
                ],
                |reader| reader.varint("trajectory.context_outputs.count"),
                |tree, call, count| {
                    let count = u32::try_from(count).map_err(|_| {
                        format!("call {call} is listed with {count} context outputs")
                    })?;
                    tree.restore_context_outputs(call, count)
                },
            )?;
        }
        if format >= 5 {
            read_designation_overrides(reader, &mut scoring)?;
        }
        Ok(TrajectoryBuffer {
            tree_config,
            trees,
            scoring,
            admissions,
            packed_groups,
            retired,
            retiring,
            consumed_groups,
        })
    }
}
