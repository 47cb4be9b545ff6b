//! The scripted engine: a JSONL script of Anthropic content blocks, replayed as the model's own
//! output tokens, so the whole proxy path (ids → text → output parser → API shape → record) is
//! real in tests and in `gyre proxy --engine scripted --script FILE`.
//!
//! Script lines: `{"agent": "main" | "sub", "blocks": [ … ]}` with blocks
//! `{"type": "thinking", "thinking": …}`, `{"type": "text", "text": …}` and
//! `{"type": "tool_use", "name": …, "input": {…}}` (`signature` on thinking and `id` on
//! tool_use are accepted and ignored). Blank lines are skipped; any other key is an error that
//! names the line and the field.
//!
//! Each line is rendered in the [`OutputFormat`] (reasoning in its tags, tool calls in its
//! syntax with the input serialised once, compactly, then the end-of-turn text), checked to
//! parse back into exactly its blocks, and tokenized with [`ChatModel::encode`] when the engine
//! is built. Each `generate` takes the next line of the request's agent: `None` and `"main"`
//! read the main queue, any other agent name the `"sub"` queue (the CLIs' sub-agents share one
//! queue, in arrival order). An exhausted queue answers `done.`. A line is consumed only when
//! its stream finishes (`Stop` / `Length`); an aborted, failed or dropped stream gives the line
//! back to the front of its queue, so the retry on another engine replays it. Engines made
//! with [`ScriptedEngine::sibling`] share the queues, as the source and destination of a
//! failover do.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value};

use super::playback::{Outcome, Output, Player};
use super::{
    BoxFuture, ChunkStream, EngineFailure, EngineRequest, Fault, FinishKind, PlaybackOptions,
    TokenEngine, MAIN_AGENT,
};
use crate::output::{parse_output, OutputBlock, OutputFormat};
use crate::ChatModel;

/// The queue every agent other than `"main"` reads.
pub const SUB_AGENT: &str = "sub";

/// The answer once an agent's lines are used up.
pub const EXHAUSTED_TEXT: &str = "done.";

/// One Anthropic content block of a script line.
#[derive(Clone, Debug, PartialEq)]
pub enum ScriptBlock {
    Thinking(String),
    Text(String),
    /// `input` is a JSON object.
    ToolUse {
        name: String,
        input: Value,
    },
}

/// One script line: what one model call of `agent` answers.
#[derive(Clone, Debug, PartialEq)]
pub struct ScriptLine {
    /// `"main"` or `"sub"`.
    pub agent: String,
    pub blocks: Vec<ScriptBlock>,
    /// 1-based line number in the script file.
    pub line: usize,
}

/// A script that failed to parse or render; names the line and the field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}:{line}: {field}: {message}", path.as_deref().map_or_else(|| "script".to_string(), |p| p.display().to_string()))]
pub struct ScriptError {
    pub path: Option<PathBuf>,
    /// 1-based; 0 when the file itself could not be read.
    pub line: usize,
    /// The field path in the line, e.g. `blocks[2].input`.
    pub field: String,
    pub message: String,
}

/// A parsed script.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Script {
    pub path: Option<PathBuf>,
    pub lines: Vec<ScriptLine>,
}

impl Script {
    /// Reads and parses a JSONL script file.
    pub fn load(path: &Path) -> Result<Self, ScriptError> {
        let text = std::fs::read_to_string(path).map_err(|error| ScriptError {
            path: Some(path.to_path_buf()),
            line: 0,
            field: "file".into(),
            message: error.to_string(),
        })?;
        Self::parse(&text, Some(path))
    }

    /// Parses JSONL text; `path` only labels errors.
    pub fn parse(text: &str, path: Option<&Path>) -> Result<Self, ScriptError> {
        let mut lines = Vec::new();
        for (index, raw) in text.lines().enumerate() {
            let line = index + 1;
            if raw.trim().is_empty() {
                continue;
            }
            let error = |field: &str, message: String| ScriptError {
                path: path.map(Path::to_path_buf),
                line,
                field: field.to_string(),
                message,
            };
            let value: Value = serde_json::from_str(raw)
                .map_err(|parse| error("line", format!("not JSON: {parse}")))?;
            let Value::Object(object) = value else {
                return Err(error("line", "expected a JSON object".into()));
            };
            lines
                .push(parse_line(object, line).map_err(|(field, message)| error(&field, message))?);
        }
        Ok(Self {
            path: path.map(Path::to_path_buf),
            lines,
        })
    }
}

type FieldError = (String, String);

fn parse_line(object: Map<String, Value>, line: usize) -> Result<ScriptLine, FieldError> {
    let mut agent = None;
    let mut blocks = None;
    for (key, value) in object {
        match key.as_str() {
            "agent" => match value {
                Value::String(name) if name == MAIN_AGENT || name == SUB_AGENT => {
                    agent = Some(name)
                }
                other => {
                    return Err((
                        "agent".into(),
                        format!("expected \"main\" or \"sub\", got {other}"),
                    ))
                }
            },
            "blocks" => {
                let Value::Array(items) = value else {
                    return Err((
                        "blocks".into(),
                        "expected an array of content blocks".into(),
                    ));
                };
                let parsed = items
                    .into_iter()
                    .enumerate()
                    .map(|(index, item)| parse_block(item, index))
                    .collect::<Result<Vec<_>, _>>()?;
                blocks = Some(parsed);
            }
            other => return Err((other.to_string(), "unknown field".into())),
        }
    }
    Ok(ScriptLine {
        agent: agent.ok_or_else(|| ("agent".to_string(), "missing".to_string()))?,
        blocks: blocks.ok_or_else(|| ("blocks".to_string(), "missing".to_string()))?,
        line,
    })
}

fn parse_block(value: Value, index: usize) -> Result<ScriptBlock, FieldError> {
    let at = |field: &str| format!("blocks[{index}].{field}");
    let Value::Object(mut object) = value else {
        return Err((format!("blocks[{index}]"), "expected an object".into()));
    };
    let kind = match object.remove("type") {
        Some(Value::String(kind)) => kind,
        Some(other) => return Err((at("type"), format!("expected a string, got {other}"))),
        None => return Err((at("type"), "missing".into())),
    };
    let take_string = |object: &mut Map<String, Value>, field: &str| match object.remove(field) {
        Some(Value::String(text)) => Ok(text),
        Some(other) => Err((at(field), format!("expected a string, got {other}"))),
        None => Err((at(field), "missing".into())),
    };
    let (block, allowed): (ScriptBlock, &[&str]) = match kind.as_str() {
        "thinking" => (
            ScriptBlock::Thinking(take_string(&mut object, "thinking")?),
            &["signature"],
        ),
        "text" => (ScriptBlock::Text(take_string(&mut object, "text")?), &[]),
        "tool_use" => {
            let name = take_string(&mut object, "name")?;
            let input = match object.remove("input") {
                Some(input @ Value::Object(_)) => input,
                Some(other) => {
                    return Err((at("input"), format!("expected an object, got {other}")))
                }
                None => return Err((at("input"), "missing".into())),
            };
            (ScriptBlock::ToolUse { name, input }, &["id"])
        }
        other => {
            return Err((
                at("type"),
                format!("expected \"thinking\", \"text\" or \"tool_use\", got {other:?}"),
            ))
        }
    };
    if let Some(unknown) = object.keys().find(|key| !allowed.contains(&key.as_str())) {
        return Err((at(unknown), "unknown field".into()));
    }
    Ok(block)
}

/// Renders blocks as the model would write them in `format`, ending with its end-of-turn
/// text. A block the format cannot express is an error naming the block (`blocks[i]`).
pub fn render_blocks(blocks: &[ScriptBlock], format: &OutputFormat) -> Result<String, FieldError> {
    let mut text = String::new();
    for (index, block) in blocks.iter().enumerate() {
        match block {
            ScriptBlock::Thinking(thinking) => {
                let Some((start, end)) = &format.reasoning_tags else {
                    return Err((
                        format!("blocks[{index}]"),
                        "a thinking block, but the output format has no reasoning tags".into(),
                    ));
                };
                if !(index == 0 && format.reasoning_open_at_start) {
                    text.push_str(start);
                }
                text.push_str(thinking);
                text.push_str(end);
            }
            ScriptBlock::Text(body) => text.push_str(body),
            ScriptBlock::ToolUse { name, input } => {
                let Some(call) = &format.tool_call else {
                    return Err((
                        format!("blocks[{index}]"),
                        "a tool_use block, but the output format has no tool-call syntax".into(),
                    ));
                };
                let json = |value: &str| Value::String(value.to_string()).to_string();
                text.push_str(&call.start);
                text.push('{');
                text.push_str(&json(&call.name_key));
                text.push_str(": ");
                text.push_str(&json(name));
                text.push_str(", ");
                text.push_str(&json(&call.arguments_key));
                text.push_str(": ");
                text.push_str(&input.to_string());
                text.push('}');
                text.push_str(&call.end);
            }
        }
    }
    if let Some(end_of_turn) = format.end_of_turn.first() {
        text.push_str(end_of_turn);
    }
    Ok(text)
}

/// The blocks as the output parser reports them (tool input as compact JSON text).
fn expected_output_blocks(blocks: &[ScriptBlock]) -> Vec<OutputBlock> {
    blocks
        .iter()
        .map(|block| match block {
            ScriptBlock::Thinking(thinking) => OutputBlock::Reasoning(thinking.clone()),
            ScriptBlock::Text(text) => OutputBlock::Text(text.clone()),
            ScriptBlock::ToolUse { name, input } => OutputBlock::ToolCall {
                name: name.clone(),
                arguments: input.to_string(),
            },
        })
        .collect()
}

/// A line ready to stream.
#[derive(Debug)]
struct Prepared {
    ids: Vec<u32>,
}

/// Queues shared by an engine and its siblings.
#[derive(Debug, Default)]
struct Queues {
    by_agent: BTreeMap<&'static str, VecDeque<Arc<Prepared>>>,
}

/// Options of a [`ScriptedEngine`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScriptedOptions {
    /// [`TokenEngine::name`].
    pub name: String,
    pub playback: PlaybackOptions,
    /// A fault for every request (see also [`ScriptedEngine::inject`]).
    pub fault: Option<Fault>,
}

impl Default for ScriptedOptions {
    fn default() -> Self {
        Self {
            name: "scripted".into(),
            playback: PlaybackOptions::default(),
            fault: None,
        }
    }
}

/// See the module docs.
#[derive(Clone)]
pub struct ScriptedEngine {
    inner: Arc<Inner>,
}

struct Inner {
    player: Arc<Player>,
    queues: Arc<Mutex<Queues>>,
    exhausted: Arc<Prepared>,
    policy_version: AtomicU64,
}

impl ScriptedEngine {
    /// Renders, checks and tokenizes every line of `script`.
    pub fn new(
        script: &Script,
        model: &ChatModel,
        format: &OutputFormat,
        options: ScriptedOptions,
    ) -> Result<Self, ScriptError> {
        let error = |line: usize, field: String, message: String| ScriptError {
            path: script.path.clone(),
            line,
            field,
            message,
        };
        let prepare = |line: usize, blocks: &[ScriptBlock]| -> Result<Prepared, ScriptError> {
            let text = render_blocks(blocks, format)
                .map_err(|(field, message)| error(line, field, message))?;
            let parsed = parse_output(format, &text);
            if parsed != expected_output_blocks(blocks) {
                return Err(error(
                    line,
                    "blocks".into(),
                    format!(
                        "the rendered output {text:?} parses back as {parsed:?}, not as the \
                         script's blocks (adjacent text blocks, a tag inside text, or padding \
                         the format trims?)"
                    ),
                ));
            }
            let ids = model
                .encode(&text)
                .map_err(|tokenizer| error(line, "blocks".into(), tokenizer.to_string()))?;
            Ok(Prepared { ids })
        };
        let mut queues = Queues::default();
        queues.by_agent.insert(MAIN_AGENT, VecDeque::new());
        queues.by_agent.insert(SUB_AGENT, VecDeque::new());
        for line in &script.lines {
            let prepared = Arc::new(prepare(line.line, &line.blocks)?);
            queues
                .by_agent
                .get_mut(queue_name(&line.agent))
                .expect("both queues exist")
                .push_back(prepared);
        }
        let exhausted = Arc::new(prepare(0, &[ScriptBlock::Text(EXHAUSTED_TEXT.into())])?);
        Ok(Self {
            inner: Arc::new(Inner {
                player: Arc::new(Player::new(options.name, options.playback, options.fault)),
                queues: Arc::new(Mutex::new(queues)),
                exhausted,
                policy_version: AtomicU64::new(0),
            }),
        })
    }

    /// Another engine (own name, options, faults and in-flight requests) reading the same
    /// queues.
    pub fn sibling(&self, options: ScriptedOptions) -> Self {
        Self {
            inner: Arc::new(Inner {
                player: Arc::new(Player::new(options.name, options.playback, options.fault)),
                queues: Arc::clone(&self.inner.queues),
                exhausted: Arc::clone(&self.inner.exhausted),
                policy_version: AtomicU64::new(self.inner.policy_version.load(Ordering::SeqCst)),
            }),
        }
    }

    /// Queues a fault for the next request this engine starts.
    pub fn inject(&self, fault: Fault) {
        self.inner.player.inject(fault);
    }

    /// The policy version reported in `Finished` from now on.
    pub fn set_policy_version(&self, version: u64) {
        self.inner.policy_version.store(version, Ordering::SeqCst);
    }

    /// Lines not yet consumed for `agent` (`"main"`, or any other name for the sub queue).
    pub fn remaining(&self, agent: &str) -> usize {
        let queues = self.inner.queues.lock().expect("queues are never poisoned");
        queues
            .by_agent
            .get(queue_name(agent))
            .map_or(0, VecDeque::len)
    }

    /// Requests streaming now.
    pub fn in_flight_count(&self) -> usize {
        self.inner.player.in_flight_count()
    }

    /// Resolves once this engine has no request in flight and every ended stream's line is
    /// back in its queue or consumed.
    pub async fn wait_idle(&self) {
        self.inner.player.wait_idle().await;
    }

    /// The ids the next request of `agent` would stream (before limits), for tests.
    pub fn peek_ids(&self, agent: &str) -> Vec<u32> {
        let queues = self.inner.queues.lock().expect("queues are never poisoned");
        queues
            .by_agent
            .get(queue_name(agent))
            .and_then(|queue| queue.front())
            .unwrap_or(&self.inner.exhausted)
            .ids
            .clone()
    }
}

fn queue_name(agent: &str) -> &'static str {
    if agent == MAIN_AGENT {
        MAIN_AGENT
    } else {
        SUB_AGENT
    }
}

/// Cuts `ids` at the first stop id (kept) or at `max_new_tokens`.
pub(crate) fn apply_limits(ids: &[u32], request: &EngineRequest) -> (Vec<u32>, FinishKind) {
    let limit = request.max_new_tokens as usize;
    let stop_end = ids
        .iter()
        .position(|id| request.stop_token_ids.contains(id))
        .map(|index| index + 1);
    match stop_end {
        Some(end) if end <= limit => (ids[..end].to_vec(), FinishKind::Stop),
        _ if ids.len() > limit => (ids[..limit].to_vec(), FinishKind::Length),
        _ => (ids.to_vec(), FinishKind::Stop),
    }
}

impl TokenEngine for ScriptedEngine {
    fn name(&self) -> &str {
        self.inner.player.name()
    }

    fn generate(
        &self,
        request: EngineRequest,
    ) -> BoxFuture<'static, Result<ChunkStream, EngineFailure>> {
        let inner = Arc::clone(&self.inner);
        Box::pin(async move {
            if request.input_ids.is_empty() {
                return Err(EngineFailure::Rejected {
                    engine: inner.player.name().to_string(),
                    message: "input_ids is empty".into(),
                });
            }
            let queue = queue_name(request.agent_name());
            let taken = inner
                .queues
                .lock()
                .expect("queues are never poisoned")
                .by_agent
                .get_mut(queue)
                .and_then(VecDeque::pop_front);
            let prepared = taken
                .clone()
                .unwrap_or_else(|| Arc::clone(&inner.exhausted));
            let (ids, finish) = apply_limits(&prepared.ids, &request);
            let output = Output {
                ids,
                finish,
                policy_version: inner.policy_version.load(Ordering::SeqCst),
            };
            let queues = Arc::clone(&inner.queues);
            let give_back = taken.clone();
            let on_end = Box::new(move |outcome: Outcome| {
                if matches!(outcome, Outcome::Finished(_)) {
                    return;
                }
                if let Some(line) = give_back {
                    queues
                        .lock()
                        .expect("queues are never poisoned")
                        .by_agent
                        .get_mut(queue)
                        .expect("both queues exist")
                        .push_front(line);
                }
            });
            let started = inner.player.start(request.rid, output, on_end);
            if started.is_err() {
                if let Some(line) = taken {
                    inner
                        .queues
                        .lock()
                        .expect("queues are never poisoned")
                        .by_agent
                        .get_mut(queue)
                        .expect("both queues exist")
                        .push_front(line);
                }
            }
            started
        })
    }

    fn abort(&self, rid: &str) -> BoxFuture<'static, Result<(), EngineFailure>> {
        self.inner.player.abort(rid);
        Box::pin(async { Ok(()) })
    }

    fn health(&self) -> BoxFuture<'static, Result<(), EngineFailure>> {
        Box::pin(async { Ok(()) })
    }
}

impl std::fmt::Debug for ScriptedEngine {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("ScriptedEngine")
            .field("name", &self.inner.player.name())
            .field("main_remaining", &self.remaining(MAIN_AGENT))
            .field("sub_remaining", &self.remaining(SUB_AGENT))
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_keep_the_stop_id_and_cut_at_length() {
        let mut request = EngineRequest::new("r", vec![1], 10);
        assert_eq!(
            apply_limits(&[5, 6, 7], &request),
            (vec![5, 6, 7], FinishKind::Stop)
        );
        request.stop_token_ids = vec![6];
        assert_eq!(
            apply_limits(&[5, 6, 7], &request),
            (vec![5, 6], FinishKind::Stop)
        );
        request.max_new_tokens = 1;
        assert_eq!(
            apply_limits(&[5, 6, 7], &request),
            (vec![5], FinishKind::Length)
        );
        request.max_new_tokens = 2;
        assert_eq!(
            apply_limits(&[5, 6, 7], &request),
            (vec![5, 6], FinishKind::Stop)
        );
    }
}
