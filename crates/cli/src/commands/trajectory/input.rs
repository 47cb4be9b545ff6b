//! JSONL input of `gyre trajectory`: one model call per line, in call order.
//!
//! Lines are parsed field by field so that every rejection names the line and the field:
//! logprob/output length mismatches, empty ids, non-monotone call order, unknown kinds,
//! duplicate calls, out-of-range token ids. Nothing is guessed. Each call is matched against its
//! execution's tree as it is read (the tree stores only the new suffix).

use std::collections::BTreeMap;
use std::io::BufRead;

use anyhow::{anyhow, bail, Context, Result};
use gyre_event::{CallId, CallKind, EngineId, ExecutionId, PolicyVersion, Provenance};
use gyre_trajectory::{fnv1a64, record_from_context, ContextCall, Tree, TreeConfig};
use serde_json::{Map, Value};

/// A reward as given in the input: a number, or `null` for "no valid result" (excluded).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RewardInput {
    Valid(f64),
    Invalid,
}

/// Everything read for one execution.
pub struct ExecutionInput {
    pub name: String,
    pub tree: Tree,
    /// Call names by call id (call ids are assigned in order of appearance).
    pub call_names: Vec<String>,
    pub group: Option<String>,
    pub reward: Option<RewardInput>,
    pub policy_version: Option<u64>,
    last_numbered_call: Option<(u64, String)>,
    last_call_of_other_agent: BTreeMap<String, CallId>,
}

impl ExecutionInput {
    pub fn call_name(&self, call: CallId) -> String {
        self.call_names[call.get() as usize].clone()
    }
}

/// All executions of one input, in order of first appearance.
pub struct Input {
    pub executions: Vec<ExecutionInput>,
}

fn field_error(line: usize, field: &str, message: impl std::fmt::Display) -> anyhow::Error {
    anyhow!("line {line}: field `{field}`: {message}")
}

fn string_field(object: &Map<String, Value>, line: usize, field: &str) -> Result<String> {
    match object.get(field) {
        None => Err(field_error(line, field, "missing")),
        Some(Value::String(text)) if text.is_empty() => Err(field_error(line, field, "empty id")),
        Some(Value::String(text)) => Ok(text.clone()),
        Some(other) => Err(field_error(
            line,
            field,
            format!("expected a string, got {other}"),
        )),
    }
}

fn ids_field(object: &Map<String, Value>, line: usize, field: &str) -> Result<Vec<u32>> {
    let Some(value) = object.get(field) else {
        return Err(field_error(line, field, "missing"));
    };
    let Value::Array(items) = value else {
        return Err(field_error(line, field, "expected an array of token ids"));
    };
    if items.is_empty() {
        return Err(field_error(line, field, "empty ids"));
    }
    items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            item.as_u64()
                .filter(|id| *id <= u32::MAX as u64)
                .map(|id| id as u32)
                .ok_or_else(|| {
                    field_error(
                        line,
                        field,
                        format!("element {index} ({item}) is not a token id in 0..=4294967295"),
                    )
                })
        })
        .collect()
}

fn logprobs_field(object: &Map<String, Value>, line: usize, outputs: usize) -> Result<Vec<f32>> {
    let field = "output_logprobs";
    let Some(Value::Array(items)) = object.get(field) else {
        return Err(field_error(line, field, "missing or not an array"));
    };
    if items.len() != outputs {
        return Err(field_error(
            line,
            field,
            format!(
                "{} log-probs for {outputs} output ids (lengths must match)",
                items.len()
            ),
        ));
    }
    items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            let value = item.as_f64().ok_or_else(|| {
                field_error(
                    line,
                    field,
                    format!("element {index} ({item}) is not a number"),
                )
            })?;
            if !value.is_finite() || value > 0.0 {
                return Err(field_error(
                    line,
                    field,
                    format!("element {index} ({value}) is not a finite log-prob ≤ 0"),
                ));
            }
            Ok(value as f32)
        })
        .collect()
}

/// The trailing decimal number of a call id (`c17` → 17), used for the order check.
fn call_number(call: &str) -> Option<u64> {
    let digits: String = call
        .chars()
        .rev()
        .take_while(char::is_ascii_digit)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    if digits.is_empty() {
        None
    } else {
        digits.parse().ok()
    }
}

impl Input {
    /// Reads and matches every line of `reader`.
    pub fn read(reader: impl BufRead, tree_config: TreeConfig) -> Result<Input> {
        let mut executions: Vec<ExecutionInput> = Vec::new();
        let mut by_name: BTreeMap<String, usize> = BTreeMap::new();
        let mut by_key: BTreeMap<u64, String> = BTreeMap::new();
        for (index, text) in reader.lines().enumerate() {
            let line = index + 1;
            let text = text.with_context(|| format!("line {line}: cannot read input"))?;
            if text.trim().is_empty() {
                continue;
            }
            let value: Value = serde_json::from_str(&text)
                .map_err(|error| anyhow!("line {line}: invalid JSON: {error}"))?;
            let Value::Object(object) = value else {
                bail!("line {line}: expected a JSON object");
            };
            let name = string_field(&object, line, "execution")?;
            let position = match by_name.get(&name) {
                Some(position) => *position,
                None => {
                    let key = fnv1a64(&name);
                    if let Some(other) = by_key.insert(key, name.clone()) {
                        bail!("line {line}: field `execution`: `{name}` and `{other}` hash to the same seed key");
                    }
                    by_name.insert(name.clone(), executions.len());
                    executions.push(ExecutionInput {
                        name: name.clone(),
                        tree: Tree::new(ExecutionId(key), tree_config),
                        call_names: Vec::new(),
                        group: None,
                        reward: None,
                        policy_version: None,
                        last_numbered_call: None,
                        last_call_of_other_agent: BTreeMap::new(),
                    });
                    executions.len() - 1
                }
            };
            let execution = &mut executions[position];
            read_extras(execution, &object, line)?;
            if object.contains_key("call") {
                read_call(execution, &object, line)?;
            } else if !object.contains_key("reward") {
                bail!("line {line}: field `call`: missing (a line without a call must carry a `reward`)");
            }
        }
        Ok(Input { executions })
    }
}

fn read_extras(
    execution: &mut ExecutionInput,
    object: &Map<String, Value>,
    line: usize,
) -> Result<()> {
    if let Some(value) = object.get("group") {
        let Value::String(group) = value else {
            return Err(field_error(line, "group", "expected a string"));
        };
        if group.is_empty() {
            return Err(field_error(line, "group", "empty id"));
        }
        match &execution.group {
            Some(existing) if existing != group => {
                return Err(field_error(
                    line,
                    "group",
                    format!(
                        "execution `{}` was put in group `{existing}` before",
                        execution.name
                    ),
                ))
            }
            _ => execution.group = Some(group.clone()),
        }
    }
    if let Some(value) = object.get("reward") {
        let reward = match value {
            Value::Null => RewardInput::Invalid,
            other => match other.as_f64().filter(|reward| reward.is_finite()) {
                Some(reward) => RewardInput::Valid(reward),
                None => {
                    return Err(field_error(
                        line,
                        "reward",
                        format!("expected a finite number or null, got {other}"),
                    ))
                }
            },
        };
        if execution.reward.is_some_and(|existing| existing != reward) {
            return Err(field_error(
                line,
                "reward",
                format!(
                    "execution `{}` already has another reward (attempts never overwrite)",
                    execution.name
                ),
            ));
        }
        execution.reward = Some(reward);
    }
    if let Some(value) = object.get("policy_version") {
        let version = value.as_u64().ok_or_else(|| {
            field_error(line, "policy_version", "expected a non-negative integer")
        })?;
        execution.policy_version = Some(
            execution
                .policy_version
                .map_or(version, |existing| existing.min(version)),
        );
    }
    Ok(())
}

fn read_call(
    execution: &mut ExecutionInput,
    object: &Map<String, Value>,
    line: usize,
) -> Result<()> {
    let call = string_field(object, line, "call")?;
    if let Some(previous) = execution.call_names.iter().position(|name| *name == call) {
        return Err(field_error(
            line,
            "call",
            format!(
                "call `{call}` appears twice in execution `{}` (first as call #{previous})",
                execution.name
            ),
        ));
    }
    if let Some(number) = call_number(&call) {
        if let Some((last, last_name)) = &execution.last_numbered_call {
            if number <= *last {
                return Err(field_error(
                    line,
                    "call",
                    format!(
                        "non-monotone call order: `{call}` after `{last_name}` in execution `{}`",
                        execution.name
                    ),
                ));
            }
        }
        execution.last_numbered_call = Some((number, call.clone()));
    }
    let agent = string_field(object, line, "agent")?;
    let kind = match object.get("kind") {
        None | Some(Value::Null) => CallKind::Turn,
        Some(Value::String(kind)) if kind == "turn" => CallKind::Turn,
        Some(Value::String(kind)) if kind == "summary" => CallKind::Summary,
        Some(other) => {
            return Err(field_error(
                line,
                "kind",
                format!("unknown kind {other} (expected \"turn\" or \"summary\")"),
            ))
        }
    };
    let input_ids = ids_field(object, line, "input_ids")?;
    let output_ids = ids_field(object, line, "output_ids")?;
    let output_logprobs = logprobs_field(object, line, output_ids.len())?;
    let spawned_by = match object.get("spawned_by") {
        None | Some(Value::Null) => {
            // Inferred: a new agent's first call was spawned by the latest call of another agent.
            let first_of_agent = !execution
                .tree
                .nodes()
                .iter()
                .any(|node| node.agent == agent);
            if first_of_agent {
                execution
                    .last_call_of_other_agent
                    .iter()
                    .filter(|(other, _)| **other != agent)
                    .map(|(_, call)| *call)
                    .max()
            } else {
                execution
                    .tree
                    .nodes()
                    .iter()
                    .rev()
                    .find(|node| node.agent == agent)
                    .and_then(|node| node.spawned_by)
            }
        }
        Some(Value::String(spawner)) => {
            match execution.call_names.iter().position(|name| name == spawner) {
                Some(index) => Some(CallId(index as u64)),
                None => {
                    return Err(field_error(
                        line,
                        "spawned_by",
                        format!(
                            "`{spawner}` is not an earlier call of execution `{}`",
                            execution.name
                        ),
                    ))
                }
            }
        }
        Some(other) => {
            return Err(field_error(
                line,
                "spawned_by",
                format!("expected a call id string, got {other}"),
            ))
        }
    };
    let call_id = CallId(execution.call_names.len() as u64);
    let record = record_from_context(
        &execution.tree,
        &ContextCall {
            call: call_id,
            agent: &agent,
            kind,
            spawned_by,
            context: &input_ids,
            context_provenance: Provenance::User,
            output_ids: &output_ids,
            output_logprobs: &output_logprobs,
            engine: EngineId(0),
            policy_version: PolicyVersion(execution.policy_version.unwrap_or(0)),
        },
    );
    execution
        .tree
        .apply(&record)
        .map_err(|error| anyhow!("line {line}: {error}"))?;
    execution.call_names.push(call);
    execution.last_call_of_other_agent.insert(agent, call_id);
    Ok(())
}
