//! `gyre trajectory`: build trajectory trees from recorded model calls, admit trajectories,
//! pack micro-steps, and benchmark the processor.
//!
//! Input is JSONL on stdin, one model call per line, in call order (see `docs/trajectory.md`):
//! `{"execution", "call", "agent", "kind"?, "input_ids", "output_ids", "output_logprobs"}`.
//! All logic lives in `gyre-trajectory`; this module parses, calls it and prints.

mod bench;
mod classes;
mod input;

use std::path::PathBuf;

use anyhow::{anyhow, bail, Result};
use clap::{Args, Subcommand};
use gyre_event::{GroupId, MicroStepId, PolicyVersion, StepId};
use gyre_trajectory::{
    admit, group_advantages, materialise, padding_fraction, render_tree, statistics, target_weight,
    trajectory_targets_count, Admission, AdvantageNormalization, RoleClasses, SplitMix64,
    StreamPacker, TreeConfig, ADVANTAGE_STD_EPSILON, J_MAX_DEFAULT,
};
use serde_json::{json, Value};

use input::{ExecutionInput, Input, RewardInput};

/// Arguments of `gyre trajectory`.
#[derive(Args)]
pub struct TrajectoryArgs {
    #[command(subcommand)]
    command: TrajectoryCommand,
}

#[derive(Subcommand)]
enum TrajectoryCommand {
    /// Print each execution's trajectory tree (ASCII) and its Appendix C statistics.
    Build(BuildArgs),
    /// Admit at most J_max trajectories per execution; one JSON object per execution.
    Admit(AdmitArgs),
    /// Admit, compute group advantages and pack micro-steps; one JSON object.
    Pack(PackArgs),
    /// Time build + admit, the matcher and packing on synthetic Appendix-C-sized executions.
    Bench(bench::BenchArgs),
}

#[derive(Args)]
struct TreeArgs {
    /// Role classes TOML (default: Claude Code's main > main-summary > sub-agent > sub-agent-summary).
    #[arg(long)]
    classes: Option<PathBuf>,
    /// A context sharing fewer tokens than this with every existing path starts a new root.
    #[arg(long, default_value_t = 1)]
    root_tokens_min: u64,
}

impl TreeArgs {
    fn tree_config(&self) -> TreeConfig {
        TreeConfig {
            root_shared_tokens_min: self.root_tokens_min.max(1),
            ..TreeConfig::default()
        }
    }
}

#[derive(Args)]
struct BuildArgs {
    #[command(flatten)]
    tree: TreeArgs,
    /// Print statistics and nodes as JSON, one object per execution.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct AdmitArgs {
    #[command(flatten)]
    tree: TreeArgs,
    /// J_max: trajectories admitted per execution.
    #[arg(long, default_value_t = J_MAX_DEFAULT)]
    jmax: u32,
    /// Run seed; each execution's draw is seeded from it and the execution id.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

#[derive(Args)]
struct PackArgs {
    #[command(flatten)]
    admit: AdmitArgs,
    /// B: groups per optimizer step.
    #[arg(long)]
    b: u32,
    /// N: executions per group.
    #[arg(long)]
    n: u32,
    /// Token budget of one micro-step.
    #[arg(long = "tokens-max")]
    tokens_max: u64,
    /// Advantage = reward − group mean, without dividing by the group's std.
    #[arg(long)]
    mean_only: bool,
    /// Include each row's tokens and target behaviour log-probs.
    #[arg(long)]
    tokens: bool,
}

pub fn run(args: TrajectoryArgs) -> Result<()> {
    match args.command {
        TrajectoryCommand::Build(args) => build(args),
        TrajectoryCommand::Admit(args) => admit_command(args),
        TrajectoryCommand::Pack(args) => pack(args),
        TrajectoryCommand::Bench(args) => bench::run(args),
    }
}

fn read_input(tree: &TreeArgs) -> Result<(Input, RoleClasses)> {
    let classes = classes::load(tree.classes.as_deref())?;
    let input = Input::read(std::io::stdin().lock(), tree.tree_config())?;
    Ok((input, classes))
}

fn print_line(value: &Value) -> Result<()> {
    outln!("{}", serde_json::to_string(value)?);
    Ok(())
}

fn build(args: BuildArgs) -> Result<()> {
    let (input, classes) = read_input(&args.tree)?;
    for execution in &input.executions {
        let tree = &execution.tree;
        let stats = statistics(tree, &classes);
        let name = |call| execution.call_name(call);
        let candidates: serde_json::Map<String, Value> = stats
            .candidates_per_class
            .iter()
            .map(|(class, count)| (class.clone(), json!(count)))
            .collect();
        let shared: Vec<Value> = stats
            .shared_prefixes
            .iter()
            .map(|prefix| json!({"root_call": name(tree.node(prefix.root).call), "nodes": prefix.nodes, "segments": prefix.segments, "tokens": prefix.tokens}))
            .collect();
        if args.json {
            let nodes: Vec<Value> = tree
                .nodes()
                .iter()
                .map(|node| {
                    json!({
                        "call": name(node.call),
                        "agent": node.agent,
                        "kind": if node.kind == gyre_event::CallKind::Summary { "summary" } else { "turn" },
                        "parent_call": node.parent.map(|parent| name(tree.node(parent).call)),
                        "reused_tokens": node.start,
                        "new_input_tokens": node.input_ids.len(),
                        "output_tokens": node.output_ids.len(),
                        "spawned_by": node.spawned_by.map(name),
                        "leaf": node.is_leaf(),
                        "class": if node.is_leaf() { classes.classify(&node.agent, node.kind).map(|class| classes.name(class).to_string()) } else { None },
                    })
                })
                .collect();
            print_line(&json!({
                "execution": execution.name,
                "requests": stats.requests,
                "nodes": stats.nodes,
                "segments": stats.segments,
                "roots": stats.roots,
                "leaves": stats.leaves,
                "candidates_per_class": candidates,
                "unclassified_leaves": stats.unclassified_leaves,
                "shared_prefixes": shared,
                "node_occurrences_unrolled": stats.node_occurrences_unrolled,
                "node_occurrences_tree": stats.node_occurrences_tree,
                "node_occurrences_repeated": stats.node_occurrences_repeated(),
                "segment_occurrences_unrolled": stats.segment_occurrences_unrolled,
                "tokens_tree": stats.tokens_tree,
                "tokens_unrolled": stats.tokens_unrolled,
                "trainable_tokens": stats.trainable_tokens,
                "path_nodes_max": stats.path_nodes_max,
                "path_tokens_max": stats.path_tokens_max,
                "tree": nodes,
            }))?;
        } else {
            outln!("execution {}", execution.name);
            out!("{}", render_tree(tree, &classes, &name));
            outln!(
                "requests {}  nodes {}  segments {}  roots {}  leaves {}",
                stats.requests,
                stats.nodes,
                stats.segments,
                stats.roots,
                stats.leaves
            );
            let per_class: Vec<String> = stats
                .candidates_per_class
                .iter()
                .map(|(class, count)| format!("{class} {count}"))
                .collect();
            outln!(
                "candidates  {}  (unclassified {})",
                per_class.join(", "),
                stats.unclassified_leaves
            );
            for prefix in &stats.shared_prefixes {
                outln!(
                    "shared prefix of root {}: {} nodes, {} segments, {} tokens",
                    name(tree.node(prefix.root).call),
                    prefix.nodes,
                    prefix.segments,
                    prefix.tokens
                );
            }
            outln!(
                "node occurrences: {} if unrolled, {} in the tree, {} repeated",
                stats.node_occurrences_unrolled,
                stats.node_occurrences_tree,
                stats.node_occurrences_repeated()
            );
            outln!(
                "tokens: {} in the tree, {} if unrolled, {} trainable",
                stats.tokens_tree,
                stats.tokens_unrolled,
                stats.trainable_tokens
            );
            outln!();
        }
    }
    Ok(())
}

fn check_jmax(jmax: u32) -> Result<()> {
    if jmax == 0 {
        bail!("--jmax must be at least 1");
    }
    Ok(())
}

fn admit_execution(
    execution: &ExecutionInput,
    classes: &RoleClasses,
    args: &AdmitArgs,
) -> Admission {
    admit(
        &execution.tree,
        classes,
        args.jmax,
        &mut SplitMix64::for_execution(args.seed, execution.tree.execution().get()),
    )
}

fn admission_json(
    execution: &ExecutionInput,
    classes: &RoleClasses,
    admission: &Admission,
) -> Value {
    let trajectories: Vec<Value> = admission
        .trajectories
        .iter()
        .map(|trajectory| {
            let targets: Vec<Value> = trajectory
                .targets
                .iter()
                .map(|range| json!([execution.call_name(range.call), range.start, range.end]))
                .collect();
            json!({
                "leaf_call": execution.call_name(trajectory.leaf_call),
                "class": classes.name(trajectory.class),
                "class_rank": trajectory.class,
                "targets": targets,
                "target_count": trajectory_targets_count(trajectory),
            })
        })
        .collect();
    let mut per_class = serde_json::Map::new();
    for class in classes.classes() {
        per_class.insert(class.name.clone(), json!(0));
    }
    for candidate in &admission.candidates {
        let entry = per_class
            .entry(classes.name(candidate.class).to_string())
            .or_insert(json!(0));
        *entry = json!(entry.as_u64().unwrap_or(0) + 1);
    }
    json!({
        "execution": execution.name,
        "candidates": admission.candidates.len(),
        "candidates_per_class": per_class,
        "L_i": admission.targets_count,
        "trajectories": trajectories,
    })
}

fn admit_command(args: AdmitArgs) -> Result<()> {
    check_jmax(args.jmax)?;
    let (input, classes) = read_input(&args.tree)?;
    for execution in &input.executions {
        let admission = admit_execution(execution, &classes, &args);
        print_line(&admission_json(execution, &classes, &admission))?;
    }
    Ok(())
}

/// Groups by explicit `group` field, else consecutive chunks of N in order of appearance.
fn form_groups(input: &Input, n: u32) -> Result<Vec<(String, Vec<usize>)>> {
    let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
    let mut ungrouped = Vec::new();
    for (index, execution) in input.executions.iter().enumerate() {
        match &execution.group {
            Some(group) => match groups.iter_mut().find(|(name, _)| name == group) {
                Some((_, members)) => members.push(index),
                None => groups.push((group.clone(), vec![index])),
            },
            None => ungrouped.push(index),
        }
    }
    for (chunk_index, chunk) in ungrouped.chunks(n as usize).enumerate() {
        groups.push((format!("group-{chunk_index}"), chunk.to_vec()));
    }
    // In input order (by each group's first line), named and unnamed alike: the packer breaks
    // policy-version ties by it.
    groups.sort_by_key(|(_, members)| members[0]);
    for (name, members) in &groups {
        if members.len() != n as usize {
            bail!(
                "group `{name}` has {} executions but --n is {n}",
                members.len()
            );
        }
    }
    Ok(groups)
}

fn pack(args: PackArgs) -> Result<()> {
    check_jmax(args.admit.jmax)?;
    if args.b == 0 || args.n == 0 || args.tokens_max == 0 {
        bail!("--b, --n and --tokens-max must be positive");
    }
    let (input, classes) = read_input(&args.admit.tree)?;
    let groups = form_groups(&input, args.n)?;
    let normalization = if args.mean_only {
        AdvantageNormalization::MeanOnly
    } else {
        AdvantageNormalization::StdNormalized {
            epsilon: ADVANTAGE_STD_EPSILON,
        }
    };
    // Ready groups: every member has a reward (a number, or null = excluded).
    let mut ready: Vec<(GroupId, PolicyVersion)> = Vec::new();
    let mut pending = Vec::new();
    for (index, (name, members)) in groups.iter().enumerate() {
        if members
            .iter()
            .all(|member| input.executions[*member].reward.is_some())
        {
            let version = group_version(members, &input);
            ready.push((GroupId(index as u64), PolicyVersion(version)));
        } else {
            pending.push(json!(name));
        }
    }
    let mut packer = StreamPacker::new(StepId(0), args.b, args.tokens_max, MicroStepId(0));
    let mut group_values = Vec::new();
    let mut micro_step_values = Vec::new();
    let (mut rows_count, mut tokens_count) = (0u64, 0u64);
    while !packer.is_closed() {
        let Some(group) = StreamPacker::choose_group(&ready) else {
            break;
        };
        ready.retain(|(candidate, _)| *candidate != group);
        let (group_name, members) = &groups[group.get() as usize];
        let valid: Vec<(usize, f64)> = members
            .iter()
            .filter_map(|member| match input.executions[*member].reward {
                Some(RewardInput::Valid(reward)) => Some((*member, reward)),
                _ => None,
            })
            .collect();
        let advantages = group_advantages(
            &valid.iter().map(|(_, reward)| *reward).collect::<Vec<_>>(),
            normalization,
        );
        let mut rows = Vec::new();
        let mut row_meta = Vec::new();
        let mut executions_json = Vec::new();
        for member in members {
            let execution = &input.executions[*member];
            let advantage = valid
                .iter()
                .position(|(index, _)| index == member)
                .map(|position| advantages[position]);
            let Some(advantage) = advantage else {
                executions_json
                    .push(json!({"execution": execution.name, "reward": null, "excluded": true}));
                continue;
            };
            let admission = admit_execution(execution, &classes, &args.admit);
            let weight = target_weight(admission.targets_count, args.b, args.n);
            for trajectory in &admission.trajectories {
                rows.push(
                    materialise(&execution.tree, trajectory, advantage, weight)
                        .map_err(|error| anyhow!("{error}"))?,
                );
                row_meta.push((*member, classes.name(trajectory.class).to_string()));
            }
            let mut admitted = admission_json(execution, &classes, &admission);
            admitted["reward"] = json!(valid
                .iter()
                .find(|(index, _)| index == member)
                .map(|(_, reward)| *reward));
            admitted["advantage"] = json!(advantage);
            admitted["target_weight"] = json!(weight);
            executions_json.push(admitted);
        }
        let (_, micro_steps) = packer
            .pack_group(group, &rows)
            .map_err(|error| anyhow!("group `{group_name}`: {error} (raise --tokens-max)"))?;
        for micro_step in micro_steps {
            let row_values: Vec<Value> = micro_step
                .rows
                .iter()
                .map(|index| {
                    let row = &rows[*index];
                    let execution = &input.executions[row_meta[*index].0];
                    let mut value = json!({
                        "execution": execution.name,
                        "leaf_call": execution.call_name(row.leaf_call),
                        "class": row_meta[*index].1,
                        "length": row.len(),
                        "target_spans": row.target_spans.iter().map(|(start, end)| json!([start, end])).collect::<Vec<_>>(),
                        "target_count": row.targets_count(),
                        "advantage": row.advantage,
                        "weight": row.target_weight,
                    });
                    if args.tokens {
                        value["tokens"] = json!(row.tokens);
                        value["behaviour_logprobs"] = json!(row.behaviour_logprobs);
                    }
                    value
                })
                .collect();
            rows_count += micro_step.rows.len() as u64;
            tokens_count += micro_step.tokens_count;
            micro_step_values.push(json!({
                "micro_step": micro_step.id.get(),
                "group": group_name,
                "lengths": micro_step.rows.iter().map(|index| rows[*index].len()).collect::<Vec<_>>(),
                "tokens": micro_step.tokens_count,
                "padding_tokens": args.tokens_max - micro_step.tokens_count,
                "padding_fraction": padding_fraction(micro_step.tokens_count, 1, args.tokens_max),
                "rows": row_values,
            }));
        }
        group_values.push(json!({"group": group_name, "policy_version": packer_version(&groups, group, &input), "executions": executions_json}));
    }
    let micro_steps_count = micro_step_values.len() as u64;
    print_line(&json!({
        "b": args.b,
        "n": args.n,
        "tokens_max": args.tokens_max,
        "stream_closed": packer.is_closed(),
        "groups": group_values,
        "pending_groups": pending,
        "rows_count": rows_count,
        "tokens_count": tokens_count,
        "micro_steps_count": micro_steps_count,
        "padding_fraction": padding_fraction(tokens_count, micro_steps_count, args.tokens_max),
        "naive_micro_steps_count": rows_count,
        "naive_padding_fraction": padding_fraction(tokens_count, rows_count, args.tokens_max),
        "micro_steps": micro_step_values,
    }))
}

/// A group's policy version: the oldest of its lines' (a line without one counts as 0).
fn group_version(members: &[usize], input: &Input) -> u64 {
    members
        .iter()
        .map(|member| input.executions[*member].policy_version.unwrap_or(0))
        .min()
        .unwrap_or(0)
}

fn packer_version(groups: &[(String, Vec<usize>)], group: GroupId, input: &Input) -> u64 {
    group_version(&groups[group.get() as usize].1, input)
}
