//! One execution's proxy-side state: its trajectory tree (the same fold the log's projection
//! runs), each agent's last context as text and tokens, and the caches that undo what harnesses
//! change when they re-send history.
//!
//! **Incremental encoding.** A request is rendered with the chat template to text `R`. The
//! agent's last context (previous prompt + the tokens the engine sampled, with the byte end of
//! every token) is compared with `R` byte by byte; the tokens of the longest common prefix are
//! reused, backed off to a safe boundary: just after a special token (byte-level BPE merges
//! across any other boundary, research/tokenize-anchor-report.md) or the end of a sampled output
//! that matched completely. Sampled ids are never re-encoded. Only the rest of `R` is tokenized.
//! The tree matcher (`gyre_trajectory::match_context`) then decides the record's parent and
//! reused count, so the record is exactly what the log's projection will fold; a match that
//! shares only system-prompt and template tokens (a sub-agent, the conversation after a
//! compaction) becomes a new root instead.
//!
//! **Caches.** Claude Code re-serialises `tool_use.input` (keys reordered, escapes normalised);
//! the exact generated arguments text is restored by tool-call id before rendering. Reasoning is
//! restored from the handle (Anthropic `signature`, Responses `encrypted_content`) the proxy
//! minted when it produced it.
//!
//! Everything here is synchronous and deterministic given its inputs; the server holds a
//! session behind a mutex.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use gyre_event::{
    CallId, CallKind, Duration, EngineId, ExecutionId, ModelCallRecord, OutputConstraint,
    PolicyVersion, Provenance, ProvenanceSpan, SamplingSettings, Timestamp,
};
use gyre_trajectory::{match_context, NodeId, Tree, TreeConfig};

use super::output_ids::{tool_call_prefix, OutputIds};
use crate::engine::IdsJson;
use crate::messages::{Api, ChatRequest, Role};
use crate::model_dir::ChatModel;
use crate::output::stop::StopStrings;
use crate::output::{OutputEvent, OutputFormat, OutputParser};
use crate::template::{CivilDateTime, RenderInput};
use crate::ProxyError;

/// Text a harness puts in the last user message of a compaction request: Claude Code's
/// instructions (two phrasings), Codex's (`codex` 0.171, its local "memento" compaction), and
/// opencode's (1.18: its summarization agent is sent the conversation as text in one user
/// message, with its own system prompt and no tools).
const COMPACTION_MARKERS: [&str; 4] = [
    "CRITICAL: Respond with TEXT ONLY",
    "Your task is to create a detailed summary of the conversation",
    "You are performing a CONTEXT CHECKPOINT COMPACTION",
    "Create a new anchored summary from the conversation history",
];

/// Calls of an agent after which a set-aside context, not come back to, is dropped.
const SIDE_CONTEXT_CALLS_MAX: u32 = 3;

/// Set-aside contexts kept per agent (beyond, the one set aside longest ago goes).
const SIDE_CONTEXTS_MAX: usize = 3;

/// Tokens of room left after a prepared context for the answer appended to it.
const ANSWER_ROOM_TOKENS: usize = 4096;
/// Agent contexts one session keeps (Claude Code and Codex run tens of sub-agents in a long
/// session); see [`Session::evict_agents_over_the_cap`].
const AGENTS_MAX: usize = 256;
/// Content pieces not found in the rendered text, in a row, after which
/// `Session::content_spans` stops looking.
const CONTENT_MISSES_MAX: usize = 64;

/// An agent's last full context: what the engine saw plus what it sampled.
#[derive(Clone, Debug, Default)]
struct AgentContext {
    call: Option<CallId>,
    text: String,
    ids: Vec<u32>,
    /// `ids` as JSON text, for the next call's engine body.
    ids_json: IdsJson,
    /// Byte end in `text` of each token.
    ends: Vec<u32>,
    provenance: Vec<Provenance>,
    /// Token index where the last call's sampled output starts (`ids.len()` if none).
    output_start: usize,
    /// Bytes of `text` that are the last call's prompt (the rest is its output).
    prompt_len: usize,
    /// The last call's record is in the log (the sink confirmed it, or the context was rebuilt
    /// from the log): only then is a re-send of its prompt answered from it.
    committed: bool,
    /// The last call's answer was handed whole to the harness's connection: a re-send of its
    /// prompt is then a new question (a harness asking again on purpose), not a retry. Unknown
    /// (false) for contexts rebuilt after a restart.
    delivered: bool,
    /// The stop sequences the last call ran with; `None` when unknown (rebuilt after a
    /// restart).
    stops: Option<Vec<String>>,
}

/// The token buffers of an agent context, handed from one call to the next.
#[derive(Debug, Default)]
struct ContextBuffers {
    ids: Vec<u32>,
    ids_json: IdsJson,
    ends: Vec<u32>,
    provenance: Vec<Provenance>,
}

impl AgentContext {
    /// Takes the token buffers, leaving an empty context that keeps the last call id.
    fn take_buffers(&mut self) -> ContextBuffers {
        self.text = String::new();
        self.output_start = 0;
        self.prompt_len = 0;
        self.committed = false;
        self.delivered = false;
        self.stops = None;
        ContextBuffers {
            ids: std::mem::take(&mut self.ids),
            ids_json: std::mem::take(&mut self.ids_json),
            ends: std::mem::take(&mut self.ends),
            provenance: std::mem::take(&mut self.provenance),
        }
    }
}

/// What a request becomes before it is sent to an engine.
#[derive(Clone, Debug)]
pub struct Prepared {
    pub agent: String,
    pub kind: CallKind,
    pub spawned_by: Option<CallId>,
    /// The full prompt, rendered.
    pub text: String,
    /// The full prompt as token ids: reused prefix + newly encoded tail (shared with the
    /// engine request; the agent's next context when the call finishes).
    pub context_ids: Arc<Vec<u32>>,
    /// `context_ids` as JSON text: the previous context's text cut to the reused tokens plus
    /// the new ones (what the engine adapters send).
    pub context_json: Arc<IdsJson>,
    ends: Vec<u32>,
    provenance: Vec<Provenance>,
    /// Tokens taken from the agent's previous context instead of being encoded.
    pub reused_by_text: usize,
    /// Tokens encoded for this request.
    pub encoded: usize,
    /// Input tokens the tree already holds (reported as cached prompt tokens).
    pub tree_reused: u64,
    parent_call: Option<CallId>,
    /// The prompt ends inside the request's final assistant message, which the harness
    /// pre-filled ([`ChatRequest::continues_final_message`]): the output continues its text
    /// (never opening in reasoning).
    pub continues_final_message: bool,
    /// The request is the prompt of the agent's last committed call, which nothing has
    /// extended: a harness re-sending a call whose answer it never received (the proxy was
    /// killed, or the connection dropped, after the record was committed). The committed answer
    /// is sent again instead of sampling a second one, so the tree keeps one node per answer
    /// the harness acted on.
    pub replay: Option<Replay>,
}

/// A committed answer to send again (see [`Prepared::replay`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Replay {
    pub call: CallId,
    /// Tokens of the call's prompt (for usage and the ids derived from the prompt length).
    pub prompt_tokens: usize,
    pub output_ids: Vec<u32>,
    pub output_logprobs: Vec<f32>,
    pub engine: EngineId,
    pub policy_version: PolicyVersion,
    /// The stop sequences the call ran with (a replay cuts where the answer was cut); `None`
    /// when unknown (the context was rebuilt after a restart).
    pub stops: Option<Vec<String>>,
}

/// Whether the re-sent `request` admits `replay`'s committed answer: the prompts are the same,
/// but a harness may re-send with a smaller token limit (a retry after a cut stream, asking
/// for less), or with a stop sequence the answer did not run with. An answer longer than the
/// re-send's limit, or holding one of its new stop sequences, is not what the re-send asks for:
/// it is sampled anew rather than handed over past the bounds the harness set. (The answer's
/// own stop sequences cut the replay where they cut the answer, so a re-send that leaves them
/// out still gets the same cut answer.)
fn admits(model: &ChatModel, request: &ChatRequest, replay: &Replay) -> bool {
    if request
        .sampling
        .max_tokens
        .is_some_and(|limit| replay.output_ids.len() > limit as usize)
    {
        return false;
    }
    // Without the answer's stops (a rebuilt context) the re-send's cut the replay itself.
    let Some(ran_with) = &replay.stops else {
        return true;
    };
    let mut new_stops = request
        .sampling
        .stop
        .iter()
        .filter(|stop| !stop.is_empty() && !ran_with.contains(stop))
        .peekable();
    if new_stops.peek().is_none() {
        return true;
    }
    // The raw text, markup included, as stop sequences are matched; text that cannot be
    // decoded is not replayed.
    let Ok(text) = model.decode(&replay.output_ids) else {
        return false;
    };
    new_stops.all(|stop| !text.contains(stop.as_str()))
}

/// What the engine produced for a call.
#[derive(Clone, Debug, Default)]
pub struct Sampled {
    pub output_ids: Vec<u32>,
    pub output_logprobs: Vec<f32>,
    /// Byte end of each output token within `output_text`.
    pub output_ends: Vec<u32>,
    /// The output as the harness saw it: cut where a stop sequence started (the ends of the
    /// tokens past the cut are clamped to it), so the next turn, which sends the cut text
    /// back, extends the whole sampled output.
    pub output_text: String,
    /// The request's stop sequences.
    pub stop_sequences: Vec<String>,
    /// The answer format the request asked for, and whether the engine was held to it.
    pub output_constraint: Option<OutputConstraint>,
    /// The settings the engine sampled with.
    pub sampling: SamplingSettings,
    pub engine: EngineId,
    pub policy_version: PolicyVersion,
    pub requested_at: Timestamp,
    pub first_token_after: Duration,
    pub completed_after: Duration,
    /// The answer called a tool that starts a sub-agent.
    pub spawns_agent: bool,
}

#[derive(Debug)]
pub struct Session {
    pub execution: ExecutionId,
    pub tree: Tree,
    agents: BTreeMap<String, AgentContext>,
    /// Each agent's other recent contexts. A call that shares less than half of the agent's
    /// context (a harness side call under the same agent, such as Claude Code's WebFetch
    /// summariser; a rewritten history) leaves that context here instead of consuming it, and
    /// the request that continues it makes it the agent's context again: the conversation
    /// then reuses its own tokens instead of re-encoding its history. With each, the agent's
    /// calls since it was set aside: after [`SIDE_CONTEXT_CALLS_MAX`] calls that did not come
    /// back to it (a compaction's new root goes on without the old conversation) it is
    /// dropped, and at most [`SIDE_CONTEXTS_MAX`] are kept, so an agent holds a few contexts
    /// for a short while only.
    side: BTreeMap<String, Vec<(AgentContext, u32)>>,
    tool_calls: HashMap<String, String>,
    /// Whitespace-only text an answer sampled before its first tool call, by that call's id.
    /// Claude Code leaves such a text block out of the history it sends back; rendered without
    /// it, the answer would no longer match its sampled tokens and the next call would encode
    /// it again instead of extending it.
    blank_text_before: HashMap<String, String>,
    /// The reasoning handles of what an answer sampled before its first tool call, by that
    /// call's id. Chat Completions clients (the OpenAI SDK's, LiteLLM's, the Agents SDK's)
    /// send an answer back as its text and `tool_calls` only, without `reasoning_content`:
    /// rendered without it, the answer would no longer match its sampled tokens and the next
    /// call would encode it again instead of extending it.
    reasoning_before: HashMap<String, Vec<String>>,
    reasoning: HashMap<String, String>,
    special: HashSet<u32>,
    next_call: u64,
    /// The main agent's last call whose answer started a sub-agent: what a new sub-agent's
    /// first call is spawned by (unknown after a restart: then the main agent's last call).
    last_spawn: Option<CallId>,
    /// Rebuilt from records whose agent contexts are not decoded yet: the first `prepare`
    /// does it ([`Session::finish_recovery`]), so a restarted proxy serves at once.
    contexts_pending: bool,
    /// Recovery: the stop sequences of each recovered call that ran with some.
    recovered_stops: BTreeMap<CallId, Vec<String>>,
    pub tokens_encoded: u64,
    pub tokens_reused: u64,
    /// Requests whose rendered history diverged from the agent's last context inside a sampled
    /// output (a template that does not re-render outputs exactly; counted, never hidden).
    pub sampled_divergences: u64,
}

/// Run-length provenance of a token slice.
pub fn spans(provenance: &[Provenance]) -> Vec<ProvenanceSpan> {
    let mut spans: Vec<ProvenanceSpan> = Vec::new();
    for item in provenance {
        match spans.last_mut() {
            Some(last) if last.provenance == *item => last.tokens_count += 1,
            _ => spans.push(ProvenanceSpan {
                provenance: *item,
                tokens_count: 1,
            }),
        }
    }
    spans
}

/// `buffer` cut to `keep` items with room for `room` more.
fn cut_with_room<T: Copy>(mut buffer: Vec<T>, keep: usize, room: usize) -> Vec<T> {
    buffer.truncate(keep);
    crate::engine::ids_json::with_room(buffer, room)
}

fn common_prefix_bytes(left: &str, right: &str) -> usize {
    let (left, right) = (left.as_bytes(), right.as_bytes());
    let length = left.len().min(right.len());
    let mut at = 0;
    while at + 64 <= length && left[at..at + 64] == right[at..at + 64] {
        at += 64;
    }
    while at < length && left[at] == right[at] {
        at += 1;
    }
    at
}

impl Session {
    pub fn new(execution: ExecutionId, model: &ChatModel) -> Self {
        let special = model
            .tokenizer()
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, token)| token.special)
            .map(|(id, _)| id)
            .collect();
        Session::with_special(execution, special)
    }

    fn with_special(execution: ExecutionId, special: HashSet<u32>) -> Self {
        Session {
            execution,
            tree: Tree::new(execution, TreeConfig::default()),
            agents: BTreeMap::new(),
            side: BTreeMap::new(),
            tool_calls: HashMap::new(),
            blank_text_before: HashMap::new(),
            reasoning_before: HashMap::new(),
            reasoning: HashMap::new(),
            special,
            next_call: 0,
            last_spawn: None,
            contexts_pending: false,
            recovered_stops: BTreeMap::new(),
            tokens_encoded: 0,
            tokens_reused: 0,
            sampled_divergences: 0,
        }
    }

    /// Remembers what the model produced so a re-sent history can be restored exactly.
    pub fn remember_tool_call(&mut self, id: &str, arguments: &str) {
        self.tool_calls
            .insert(id.to_string(), arguments.to_string());
    }

    /// Remembers `text` (whitespace only, possibly empty: nothing to restore) as what the
    /// answer sampled before its first tool call `id`.
    pub fn remember_blank_text_before(&mut self, id: &str, text: &str) {
        if !text.is_empty() {
            self.blank_text_before
                .insert(id.to_string(), text.to_string());
        }
    }

    /// Remembers the handles of the reasoning an answer sampled before its first tool call
    /// `id` (none: nothing to restore).
    pub fn remember_reasoning_before(&mut self, id: &str, handles: Vec<String>) {
        if !handles.is_empty() {
            self.reasoning_before.insert(id.to_string(), handles);
        }
    }

    pub fn remember_reasoning(&mut self, handle: &str, text: &str) {
        self.reasoning.insert(handle.to_string(), text.to_string());
    }

    /// Restores exact tool-call arguments and reasoning text in a re-sent history. Returns how
    /// many pieces were restored.
    pub fn restore(&self, request: &mut ChatRequest) -> usize {
        let mut restored = 0;
        for message in &mut request.messages {
            if message.role != Role::Assistant {
                continue;
            }
            if message.content.is_empty() {
                if let Some(blank) = message
                    .tool_calls
                    .first()
                    .and_then(|call| self.blank_text_before.get(&call.id))
                {
                    message.content = blank.clone();
                    restored += 1;
                }
            }
            if message.reasoning.is_empty() {
                // An answer sent back without its reasoning: the reasoning it sampled before
                // its first call, as if the harness had sent it (each piece with its handle,
                // counted as restored by the handle loop below).
                let handles = message
                    .tool_calls
                    .first()
                    .and_then(|call| self.reasoning_before.get(&call.id));
                for handle in handles.into_iter().flatten() {
                    if let Some(text) = self.reasoning.get(handle) {
                        message.reasoning.push(crate::messages::Reasoning {
                            text: text.clone(),
                            handle: Some(handle.clone()),
                            redacted: false,
                        });
                    }
                }
            }
            for call in &mut message.tool_calls {
                if let Some(exact) = self.tool_calls.get(&call.id) {
                    if call.arguments != *exact {
                        call.arguments = exact.clone();
                    }
                    restored += 1;
                }
            }
            for reasoning in &mut message.reasoning {
                if let Some(exact) = reasoning
                    .handle
                    .as_ref()
                    .and_then(|handle| self.reasoning.get(handle))
                {
                    reasoning.text = exact.clone();
                    reasoning.redacted = false;
                    restored += 1;
                }
            }
        }
        restored
    }

    fn known_output(&self, message: &crate::messages::Message) -> bool {
        message
            .tool_calls
            .iter()
            .any(|call| self.tool_calls.contains_key(&call.id))
            || message.reasoning.iter().any(|reasoning| {
                reasoning
                    .handle
                    .as_ref()
                    .is_some_and(|handle| self.reasoning.contains_key(handle))
            })
    }

    /// Provenance of each byte range of `text` that holds a message's content and ends after
    /// `from`, in order. Pieces are located from the end of the text backwards (each one before
    /// the piece that follows it), so the work is proportional to the new tail, not to the
    /// whole context: tokens before `from` keep the provenance they were given when encoded.
    fn content_spans(
        &self,
        request: &ChatRequest,
        text: &str,
        from: usize,
    ) -> Vec<(usize, usize, Provenance)> {
        let mut spans = Vec::new();
        let mut limit = text.len();
        // A piece the template does not show word for word (reasoning some templates drop
        // from history, arguments they re-serialise) costs a search of everything before it:
        // after this many misses in a row the rest of the tail keeps the template's
        // provenance, so a history of many such pieces cannot make a call quadratic.
        let mut misses = 0;
        'messages: for message in request.messages.iter().rev() {
            let provenance = match message.role {
                Role::System => Provenance::System,
                Role::User => Provenance::User,
                Role::Tool => Provenance::ToolResult,
                Role::Assistant if self.known_output(message) => Provenance::Sampled,
                Role::Assistant => Provenance::HarnessAssistant,
            };
            let pieces = message
                .reasoning
                .iter()
                .map(|r| r.text.as_str())
                .chain(std::iter::once(message.content.as_str()))
                .chain(message.tool_calls.iter().map(|c| c.arguments.as_str()));
            let pieces: Vec<&str> = pieces.filter(|piece| !piece.is_empty()).collect();
            for piece in pieces.into_iter().rev() {
                if let Some(start) = text.get(..limit).and_then(|head| head.rfind(piece)) {
                    let end = start + piece.len();
                    if end <= from {
                        break 'messages;
                    }
                    spans.push((start, end, provenance));
                    limit = start;
                    misses = 0;
                } else {
                    misses += 1;
                    if misses >= CONTENT_MISSES_MAX {
                        break 'messages;
                    }
                }
            }
        }
        spans.reverse();
        spans
    }

    /// Renders, reuses and encodes `request` for `agent` (`None`: the main agent).
    pub fn prepare(
        &mut self,
        model: &ChatModel,
        request: &ChatRequest,
        agent: Option<&str>,
        now: CivilDateTime,
    ) -> Result<Prepared, ProxyError> {
        if self.contexts_pending {
            self.finish_recovery(model)
                .map_err(|message| ProxyError::Tokenizer { message })?;
        }
        let agent = agent.unwrap_or("main").to_string();
        // A pre-filled answer is continued: the prompt ends inside the final assistant
        // message, and the next turn's history, which holds that message with the sampled
        // continuation, extends this call's prompt and answer like any other turn.
        let continues_final_message = request.continues_final_message();
        let input = RenderInput {
            messages: &request.messages,
            tools: &request.tools,
            add_generation_prompt: !continues_final_message,
            now,
            extra: None,
        };
        let text = if continues_final_message {
            model.render_continuing(&input)?
        } else {
            model.render(&input)?
        };
        self.resume_side_context(&agent, &text);
        let empty = AgentContext::default();
        let previous = self.agents.get(&agent).unwrap_or(&empty);
        let matched = common_prefix_bytes(&previous.text, &text);
        if let Some(replay) = self
            .committed_answer(previous, &text, matched)
            .filter(|replay| admits(model, request, replay))
        {
            // Nothing is sent to an engine: no prompt ids are copied.
            let node = self
                .tree
                .node_of_call(replay.call)
                .map(|id| self.tree.node(id));
            return Ok(Prepared {
                kind: node.map_or(CallKind::Turn, |node| node.kind),
                spawned_by: node.and_then(|node| node.spawned_by),
                tree_reused: node.map_or(0, |node| node.start),
                context_ids: Arc::default(),
                context_json: Arc::default(),
                ends: Vec::new(),
                provenance: Vec::new(),
                reused_by_text: replay.prompt_tokens,
                encoded: 0,
                parent_call: None,
                agent,
                text,
                continues_final_message,
                replay: Some(replay),
            });
        }
        // Tokens wholly inside the matched bytes.
        let mut keep = previous
            .ends
            .partition_point(|end| *end as usize <= matched);
        // A sampled output that matched completely is kept whole; otherwise back off to just
        // after a special token, never into the middle of a sampled output.
        let whole_output = keep == previous.ids.len() && keep > previous.output_start;
        if !whole_output {
            if keep > previous.output_start && keep < previous.ids.len() {
                self.sampled_divergences += 1;
                keep = previous.output_start;
            }
            while keep > 0 && !self.special.contains(&previous.ids[keep - 1]) {
                keep -= 1;
            }
        }
        let tail_start = if keep == 0 {
            0
        } else {
            previous.ends[keep - 1] as usize
        };
        let tail = &text[tail_start..];
        let (encoded_ids, encoded_offsets) = model.encode_with_offsets(tail)?;
        // The previous context's buffers become this prompt's: cut to the reused tokens and
        // extended in place, never copied (at 128K tokens that is ~2 MB of ids, byte ends,
        // provenance and ids JSON, and as many fresh pages). The agent keeps its last call id;
        // its context is empty until this call finishes, so a concurrent call of the same
        // agent encodes from scratch, which is slower but exact.
        // A request sharing less than half of the agent's context is another conversation
        // (a side call, a rewritten history): that context is set aside whole and this prompt
        // starts from copies of the tokens the two share.
        let set_aside = matched * 2 < previous.text.len();
        let mut buffers = if set_aside {
            let previous = self.agents.remove(&agent).unwrap_or_default();
            let buffers = ContextBuffers {
                ids: previous.ids[..keep].to_vec(),
                ids_json: IdsJson::of(&previous.ids[..keep]),
                ends: previous.ends[..keep].to_vec(),
                provenance: previous.provenance[..keep].to_vec(),
            };
            self.agents.insert(
                agent.clone(),
                AgentContext {
                    call: previous.call,
                    ..AgentContext::default()
                },
            );
            self.set_aside(&agent, previous);
            buffers
        } else {
            self.agents
                .get_mut(&agent)
                .map(AgentContext::take_buffers)
                .unwrap_or_default()
        };
        let mut context_json = std::mem::take(&mut buffers.ids_json);
        context_json.truncate(&buffers.ids, keep);
        // Room for the prompt and an answer (`finish_call` appends the sampled tokens).
        let room = encoded_ids.len() + ANSWER_ROOM_TOKENS;
        let mut context_ids = cut_with_room(buffers.ids, keep, room);
        let mut ends = cut_with_room(buffers.ends, keep, room);
        let mut provenance = cut_with_room(buffers.provenance, keep, room);
        context_json.reserve(room);
        context_json.extend(&encoded_ids);
        let spans_of_content = self.content_spans(request, &text, tail_start);
        let mut span_at = spans_of_content.partition_point(|(_, end, _)| *end <= tail_start);
        for (id, (start, end)) in encoded_ids.iter().zip(&encoded_offsets) {
            let absolute_start = tail_start + start;
            context_ids.push(*id);
            ends.push((tail_start + end) as u32);
            while span_at < spans_of_content.len() && spans_of_content[span_at].1 <= absolute_start
            {
                span_at += 1;
            }
            let inside = spans_of_content
                .get(span_at)
                .filter(|(span_start, _, _)| *span_start <= absolute_start);
            provenance.push(if self.special.contains(id) {
                Provenance::Template
            } else {
                inside.map_or(Provenance::Template, |(_, _, provenance)| *provenance)
            });
        }
        // Offsets of tokens that merge bytes past the end of a text are clamped by the
        // tokenizer; keep the ends monotonic and inside the text.
        let mut floor = if keep == 0 { 0 } else { ends[keep - 1] };
        for end in &mut ends[keep..] {
            *end = (*end).max(floor).min(text.len() as u32);
            floor = *end;
        }
        let encoded = encoded_ids.len();
        self.tokens_encoded += encoded as u64;
        self.tokens_reused += keep as u64;
        let mut found = match_context(&self.tree, &context_ids);
        // Sharing only the system prompt and tool list (a sub-agent, or the conversation that
        // restarts after a compaction) starts a new root: the tree's roots are conversations.
        let shares_conversation = provenance[..found.reused_tokens_count as usize]
            .iter()
            .any(|item| !matches!(item, Provenance::System | Provenance::Template));
        if !shares_conversation {
            found = gyre_trajectory::PrefixMatch::ROOT;
        }
        let last_user = request
            .messages
            .iter()
            .rev()
            .find(|message| message.role == Role::User);
        let kind = if request.harness_compaction
            || last_user.is_some_and(|message| {
                COMPACTION_MARKERS
                    .iter()
                    .any(|marker| message.content.contains(marker))
            }) {
            CallKind::Summary
        } else {
            CallKind::Turn
        };
        // Only spawned sub-agents (`sub:`) are spawned by a call; a harness's side threads
        // (`side:`, e.g. a Codex review) are not.
        let spawned_by = if agent.starts_with("sub:") && !self.agents.contains_key(&agent) {
            self.last_spawn
                .or_else(|| self.agents.get("main").and_then(|main| main.call))
        } else {
            None
        };
        Ok(Prepared {
            agent,
            kind,
            spawned_by,
            text,
            context_ids: Arc::new(context_ids),
            context_json: Arc::new(context_json),
            ends,
            provenance,
            reused_by_text: keep,
            encoded,
            tree_reused: found.reused_tokens_count,
            parent_call: found.parent_call,
            continues_final_message,
            replay: None,
        })
    }

    /// The agent's last call, when its record is in the log, `text` (the rendered request,
    /// sharing `matched` bytes with the agent's last context) is exactly that call's prompt and
    /// no call has extended it.
    /// When `text` shares more with one of the agent's set-aside contexts than with its
    /// current one (the main conversation after a side call), the two trade places. The other
    /// set-aside contexts age by one call and are dropped when old enough.
    fn resume_side_context(&mut self, agent: &str, text: &str) {
        let Some(side) = self.side.get_mut(agent) else {
            return;
        };
        let current = self
            .agents
            .get(agent)
            .map_or(0, |context| common_prefix_bytes(&context.text, text));
        let best = side
            .iter()
            .enumerate()
            .map(|(at, (context, _))| (common_prefix_bytes(&context.text, text), at))
            .max()
            .filter(|(shared, _)| *shared > current)
            .map(|(_, at)| at);
        let resumed = best.map(|at| side.remove(at).0);
        side.retain_mut(|(_, age)| {
            *age += 1;
            *age < SIDE_CONTEXT_CALLS_MAX
        });
        if side.is_empty() {
            self.side.remove(agent);
        }
        if let Some(resumed) = resumed {
            if let Some(current) = self.agents.insert(agent.to_string(), resumed) {
                if !current.text.is_empty() {
                    self.set_aside(agent, current);
                }
            }
        }
    }

    /// Keeps `context` among the agent's set-aside contexts; beyond [`SIDE_CONTEXTS_MAX`] the
    /// one set aside longest ago (of those, the smallest: the cheapest to encode again) is
    /// dropped.
    fn set_aside(&mut self, agent: &str, context: AgentContext) {
        let side = self.side.entry(agent.to_string()).or_default();
        side.push((context, 0));
        if side.len() > SIDE_CONTEXTS_MAX {
            let oldest = side
                .iter()
                .enumerate()
                .max_by_key(|(_, (context, age))| (*age, std::cmp::Reverse(context.ids.len())))
                .map(|(at, _)| at);
            if let Some(at) = oldest {
                side.remove(at);
            }
        }
    }

    fn committed_answer(
        &self,
        previous: &AgentContext,
        text: &str,
        matched: usize,
    ) -> Option<Replay> {
        let call = previous.call?;
        let prompt = previous.output_start;
        if !previous.committed || previous.delivered || prompt == 0 || prompt >= previous.ids.len()
        {
            return None;
        }
        if text.len() != previous.prompt_len || matched < previous.prompt_len {
            return None;
        }
        let node = self.tree.node(self.tree.node_of_call(call)?);
        if !node.children.is_empty() || node.kind == CallKind::Aborted {
            return None;
        }
        if node.output_ids[..] != previous.ids[prompt..] {
            return None;
        }
        Some(Replay {
            call,
            prompt_tokens: prompt,
            output_ids: node.output_ids.clone(),
            output_logprobs: node.output_logprobs.clone(),
            engine: node.engine,
            policy_version: node.policy_version,
            stops: previous.stops.clone(),
        })
    }

    /// The record of a finished call, checked against the session's tree (which takes it once
    /// the log holds it: [`Session::record_committed`]); it becomes the agent's last context.
    /// The caller commits the record to the log (and must not answer the harness before that
    /// succeeds).
    pub fn finish_call(
        &mut self,
        prepared: Prepared,
        sampled: Sampled,
    ) -> Result<ModelCallRecord, ProxyError> {
        if let Some(replay) = &prepared.replay {
            return Err(ProxyError::Engine {
                message: format!(
                    "call {} is already recorded; a re-sent call is answered from it",
                    replay.call
                ),
            });
        }
        let call = CallId(self.next_call);
        let reused = prepared.tree_reused as usize;
        let record = ModelCallRecord {
            execution: self.execution,
            call,
            agent: prepared.agent.clone(),
            kind: prepared.kind,
            parent_call: prepared.parent_call,
            reused_prefix_tokens_count: prepared.tree_reused,
            spawned_by: prepared.spawned_by,
            input_ids: prepared.context_ids[reused..].to_vec(),
            input_provenance: spans(&prepared.provenance[reused..]),
            output_ids: sampled.output_ids.clone(),
            output_logprobs: sampled.output_logprobs.clone(),
            engine: sampled.engine,
            policy_version: sampled.policy_version,
            requested_at: sampled.requested_at,
            first_token_after: sampled.first_token_after,
            completed_after: sampled.completed_after,
            stop_sequences: sampled.stop_sequences.clone(),
            output_constraint: sampled.output_constraint.clone(),
            sampling: sampled.sampling,
        };
        if record.output_ids.is_empty() {
            return Err(ProxyError::Engine {
                message: "the engine returned no tokens".into(),
            });
        }
        self.spend_call_id(&record, "record")?;
        if sampled.spawns_agent && prepared.agent == "main" {
            self.last_spawn = Some(call);
        }
        let mut context = AgentContext {
            call: Some(call),
            output_start: prepared.context_ids.len(),
            prompt_len: prepared.text.len(),
            committed: false,
            delivered: false,
            stops: Some(sampled.stop_sequences),
            text: prepared.text,
            ids: Arc::try_unwrap(prepared.context_ids).unwrap_or_else(|shared| (*shared).clone()),
            ids_json: Arc::try_unwrap(prepared.context_json)
                .unwrap_or_else(|shared| (*shared).clone()),
            ends: prepared.ends,
            provenance: prepared.provenance,
        };
        let base = context.text.len() as u32;
        context.text.push_str(&sampled.output_text);
        context.ids.extend_from_slice(&sampled.output_ids);
        context.ids_json.extend(&sampled.output_ids);
        context
            .ends
            .extend(sampled.output_ends.iter().map(|end| base + end));
        context.provenance.extend(std::iter::repeat_n(
            Provenance::Sampled,
            sampled.output_ids.len(),
        ));
        let agent = prepared.agent;
        self.agents.insert(agent.clone(), context);
        self.evict_agents_over_the_cap(&agent);
        Ok(record)
    }

    /// A call that ends without a record (the harness went away, every engine failed, a 4xx
    /// from the engine) gives its prompt's tokens back to its agent, whose context `prepare`
    /// emptied: the next call (often the harness's retry of this one) then reuses them rather
    /// than encoding the whole conversation again, which would re-encode the sampled answers
    /// in its history. Nothing happens when another call of the agent finished meanwhile (its
    /// context is newer), for a re-sent call answered from the log (it took nothing), or for an
    /// agent whose first call this was (its history holds no sampled answer, and an unknown
    /// agent's first call is what ties a sub-agent to the call that spawned it).
    pub fn give_back(&mut self, prepared: Prepared) {
        if prepared.replay.is_some() {
            return;
        }
        let Some(current) = self.agents.get_mut(&prepared.agent) else {
            return;
        };
        if !current.ids.is_empty() || !current.text.is_empty() {
            return;
        }
        let ids = Arc::try_unwrap(prepared.context_ids).unwrap_or_else(|shared| (*shared).clone());
        let ids_json =
            Arc::try_unwrap(prepared.context_json).unwrap_or_else(|shared| (*shared).clone());
        *current = AgentContext {
            call: current.call,
            output_start: ids.len(),
            prompt_len: prepared.text.len(),
            committed: false,
            delivered: false,
            stops: None,
            text: prepared.text,
            ids,
            ids_json,
            ends: prepared.ends,
            provenance: prepared.provenance,
        };
    }

    /// How many agents' contexts the session holds.
    pub fn agent_contexts_count(&self) -> usize {
        self.agents.len()
    }

    /// Beyond [`AGENTS_MAX`] agent contexts, drops the one whose last call is oldest (never
    /// the main agent's, `kept`'s, or one whose call is in flight, which holds no buffers):
    /// a harness naming a new agent on every call cannot grow the session without bound. A
    /// dropped agent's next call encodes its prompt from scratch and still finds its place
    /// in the tree by its tokens.
    fn evict_agents_over_the_cap(&mut self, kept: &str) {
        while self.agents.len() > AGENTS_MAX {
            let oldest = self
                .agents
                .iter()
                .filter(|(name, context)| {
                    name.as_str() != "main" && name.as_str() != kept && !context.ids.is_empty()
                })
                .min_by_key(|(_, context)| context.call)
                .map(|(name, _)| name.clone());
            let Some(oldest) = oldest else {
                return;
            };
            self.agents.remove(&oldest);
            self.side.remove(&oldest);
        }
    }

    /// The sink confirmed that `record` is in the log: the session's tree takes it (so later
    /// calls may extend it), and a re-send of its prompt is answered from it from now on. A
    /// record whose commit failed is never applied: the tree stays the log's, and the
    /// harness's re-send is sampled anew.
    pub fn record_committed(&mut self, record: &ModelCallRecord) {
        if let Err(error) = self.tree.apply(record) {
            // Checked before the commit; only a limit reached by a concurrent call of the same
            // execution can refuse it now. The log holds it; later calls cannot extend it.
            tracing::warn!(call = %record.call, %error, "a committed record does not fit the proxy's tree");
            return;
        }
        let side = self.side.get_mut(&record.agent).into_iter().flatten();
        let contexts = self
            .agents
            .get_mut(&record.agent)
            .into_iter()
            .chain(side.map(|(context, _)| context));
        for context in contexts {
            if context.call == Some(record.call) {
                context.committed = true;
            }
        }
    }

    /// Whether the answer of `call` of `agent` was handed whole to the harness's connection:
    /// once it was, a re-send of its prompt is sampled anew. Set just before the hand-over
    /// (so a harness that re-asks the moment it has the answer never races it) and cleared
    /// again when the hand-over fails.
    pub fn mark_delivered(&mut self, agent: &str, call: CallId, delivered: bool) {
        let side = self.side.get_mut(agent).into_iter().flatten();
        let contexts = self
            .agents
            .get_mut(agent)
            .into_iter()
            .chain(side.map(|(context, _)| context));
        for context in contexts {
            if context.call == Some(call) {
                context.delivered = delivered;
            }
        }
    }

    /// The audit record of an attempt an engine abandoned mid-answer: its input is the prompt
    /// plus what earlier attempts of the same call produced (`earlier`), its output the tokens
    /// this attempt streamed before it was cut. `CallKind::Aborted`: no role class admits it,
    /// so it is never trained on. Once committed ([`Session::record_committed`]) it is a sibling
    /// branch of the call that continues the answer; the agent's context is untouched.
    #[allow(clippy::too_many_arguments)]
    pub fn record_aborted(
        &mut self,
        prepared: &Prepared,
        earlier: &[u32],
        output_ids: &[u32],
        output_logprobs: &[f32],
        engine: EngineId,
        policy_version: PolicyVersion,
        requested_at: Timestamp,
        completed_after: Duration,
        sampling: SamplingSettings,
    ) -> Result<ModelCallRecord, ProxyError> {
        let reused = prepared.tree_reused as usize;
        let mut input_ids = prepared.context_ids[reused..].to_vec();
        input_ids.extend_from_slice(earlier);
        let mut provenance = prepared.provenance[reused..].to_vec();
        provenance.extend(std::iter::repeat_n(Provenance::Sampled, earlier.len()));
        let record = ModelCallRecord {
            execution: self.execution,
            call: CallId(self.next_call),
            agent: prepared.agent.clone(),
            kind: CallKind::Aborted,
            parent_call: prepared.parent_call,
            reused_prefix_tokens_count: prepared.tree_reused,
            spawned_by: None,
            input_ids,
            input_provenance: spans(&provenance),
            output_ids: output_ids.to_vec(),
            output_logprobs: output_logprobs.to_vec(),
            engine,
            policy_version,
            requested_at,
            first_token_after: Duration(0),
            completed_after,
            // The call that continues the attempt keeps the request's stop sequences.
            stop_sequences: Vec::new(),
            // Likewise its output constraint.
            output_constraint: None,
            sampling,
        };
        self.spend_call_id(&record, "aborted attempt")?;
        Ok(record)
    }

    /// Checks a record against the session's tree and spends its call id.
    fn spend_call_id(&mut self, record: &ModelCallRecord, what: &str) -> Result<(), ProxyError> {
        self.tree
            .check_record(record)
            .map_err(|error| ProxyError::Engine {
                message: format!("{what} does not fit the execution's tree: {error}"),
            })?;
        self.next_call += 1;
        Ok(())
    }

    /// Calls recorded so far.
    pub fn calls(&self) -> u64 {
        self.next_call
    }

    /// Recovery after a proxy restart, step 1 (once per committed record of this execution,
    /// in log order): folds the record into the tree, spends its call id, and refills the
    /// tool-call and reasoning caches from its output under the ids the proxy minted when it
    /// streamed that output ([`OutputIds`] derives them from the record). Aborted attempts
    /// only join the tree: the call that continued them holds their output.
    pub fn recover_record(
        &mut self,
        record: &ModelCallRecord,
        model: &ChatModel,
        format: &OutputFormat,
    ) -> Result<(), String> {
        self.tree
            .apply(record)
            .map_err(|error| format!("call {}: {error}", record.call.get()))?;
        self.next_call = self.next_call.max(record.call.get() + 1);
        self.contexts_pending = true;
        if record.kind == CallKind::Aborted {
            return Ok(());
        }
        let mut ids = OutputIds::new(
            self.execution,
            &record.agent,
            record.reused_prefix_tokens_count + record.input_ids.len() as u64,
        );
        // Streamed as the server streamed it (one detokenized delta per token into the
        // parser), so each event fires at the token it fired at then: the ids derive from the
        // output up to that token.
        // Through the call's stop sequences, as the server ran them: a tool call the output
        // stopped inside gets its id at the end, as it did live (a cut call,
        // `OutputParser::cut_tool_call`).
        let mut stream = model.text_stream();
        let mut stop = StopStrings::new(&record.stop_sequences);
        if !record.stop_sequences.is_empty() {
            self.recovered_stops
                .insert(record.call, record.stop_sequences.clone());
        }
        let mut parser = OutputParser::new(format.clone());
        let mut reasoning = String::new();
        let (mut text_before_calls, mut calls) = (String::new(), 0usize);
        let mut reasoning_before_calls = Vec::new();
        let output = &record.output_ids;
        for at in 0..=output.len() {
            let events = if at < output.len() {
                match stream.push(output[at]).map_err(|error| {
                    format!("call {}: decoding its output: {error}", record.call.get())
                })? {
                    Some(delta) if stop.is_empty() => parser.push(&delta),
                    Some(delta) => parser.push(&stop.push(&delta).release),
                    None => continue,
                }
            } else {
                let tail = stop.finish();
                let mut events = if tail.is_empty() {
                    Vec::new()
                } else {
                    parser.push(&tail)
                };
                events.extend(parser.finish());
                events
            };
            let so_far = &output[..(at + 1).min(output.len())];
            for event in events {
                match event {
                    OutputEvent::ReasoningDelta(delta) => reasoning.push_str(&delta),
                    OutputEvent::ReasoningEnd => {
                        let handle = ids.next_reasoning(so_far);
                        if calls == 0 {
                            reasoning_before_calls.push(handle.clone());
                        }
                        self.reasoning
                            .insert(handle, std::mem::take(&mut reasoning));
                    }
                    OutputEvent::TextDelta(delta) => {
                        if calls == 0 {
                            text_before_calls.push_str(&delta);
                        }
                    }
                    OutputEvent::ToolCall { arguments, .. } => {
                        // The record does not say which API answered: both forms are kept.
                        let suffix = ids.next_tool_call_suffix(so_far);
                        for api in [Api::Anthropic, Api::OpenAiChat] {
                            let id = format!("{}{suffix}", tool_call_prefix(api));
                            if calls == 0 {
                                if text_before_calls.trim().is_empty() {
                                    self.remember_blank_text_before(&id, &text_before_calls);
                                }
                                self.remember_reasoning_before(&id, reasoning_before_calls.clone());
                            }
                            self.tool_calls.insert(id, arguments.clone());
                        }
                        calls += 1;
                    }
                }
            }
        }
        Ok(())
    }

    /// Recovery, step 2 (after every record; `prepare` calls it when it was not called): each
    /// agent's last context is the path of its last answered call, as tokens (never
    /// re-encoded), with text and byte ends decoded from them and provenance from the records.
    /// The next request of each agent then reuses that context exactly as if the proxy had
    /// never stopped. The agent's set-aside contexts come back too: the paths of its recent
    /// calls that no later call of the agent extended (a side call under the agent's name, or
    /// the conversation it interrupted), newest first, within [`SIDE_CONTEXTS_MAX`] and
    /// [`SIDE_CONTEXT_CALLS_MAX`], so the conversation after a side call reuses its own tokens
    /// after a restart as well. (A context is only ever reused where the request's text matches
    /// it, so one kept that the live proxy had dropped costs memory, never tokens.) Decoding is
    /// ~0.7 µs per token here: a 128K context costs its execution's first call after the
    /// restart ~90 ms, instead of every execution waiting for all.
    pub fn finish_recovery(&mut self, model: &ChatModel) -> Result<(), String> {
        self.contexts_pending = false;
        // Each agent's answered calls, oldest first.
        let mut calls: BTreeMap<String, Vec<NodeId>> = BTreeMap::new();
        for id in self.tree.node_ids() {
            let node = self.tree.node(id);
            if node.kind != CallKind::Aborted {
                calls.entry(node.agent.clone()).or_default().push(id);
            }
        }
        for (agent, mut ids) in calls {
            ids.sort_by_key(|id| self.tree.node(*id).call);
            // Newest first: a call no later call of the agent extended ends a context.
            let mut extended: std::collections::BTreeSet<NodeId> = Default::default();
            let mut contexts: Vec<(NodeId, u32)> = Vec::new();
            for (newer, &id) in ids.iter().rev().enumerate() {
                if !extended.contains(&id) {
                    // Live, a set-aside context ages with each later call but the one that
                    // set it aside.
                    let age = (newer as u32).saturating_sub(1);
                    let keep = contexts.is_empty()
                        || (contexts.len() <= SIDE_CONTEXTS_MAX && age < SIDE_CONTEXT_CALLS_MAX);
                    if keep {
                        contexts.push((id, age));
                    }
                }
                extended.extend(self.tree.path(id).iter().map(|piece| piece.node));
            }
            let mut contexts = contexts.into_iter();
            if let Some((current, _)) = contexts.next() {
                let context = self.rebuilt_context(model, &agent, current)?;
                self.agents.insert(agent.clone(), context);
            }
            // Oldest first, as `set_aside` keeps them.
            let side: Vec<(NodeId, u32)> = contexts.rev().collect();
            for (id, age) in side {
                let context = self.rebuilt_context(model, &agent, id)?;
                self.side
                    .entry(agent.clone())
                    .or_default()
                    .push((context, age));
            }
        }
        Ok(())
    }

    /// The context that ends with `id`'s answer, rebuilt from the tree (see
    /// [`Session::finish_recovery`]).
    fn rebuilt_context(
        &self,
        model: &ChatModel,
        agent: &str,
        id: NodeId,
    ) -> Result<AgentContext, String> {
        let ids = self.tree.path_tokens(id);
        let mut provenance = Vec::with_capacity(ids.len());
        // Outputs of calls that ran with stop sequences: (first token in `ids`, tokens, the
        // sequences). Where one matches, the text is cut, as the live context's was.
        let mut stopped: Vec<(usize, usize, &[String])> = Vec::new();
        for piece in self.tree.path(id) {
            let node = self.tree.node(piece.node);
            let cut = piece.cut as usize;
            if cut > node.input_ids.len() {
                if let Some(stops) = self.recovered_stops.get(&node.call) {
                    let first = provenance.len() + node.input_ids.len();
                    stopped.push((first, cut - node.input_ids.len(), stops));
                }
            }
            let mut left = cut.min(node.input_ids.len());
            for span in &node.input_provenance {
                let take = (span.tokens_count as usize).min(left);
                provenance.extend(std::iter::repeat_n(span.provenance, take));
                left -= take;
            }
            // Spans shorter than the input (never written so) read as template tokens.
            provenance.extend(std::iter::repeat_n(Provenance::Template, left));
            let outputs = cut.saturating_sub(node.input_ids.len());
            provenance.extend(std::iter::repeat_n(Provenance::Sampled, outputs));
        }
        let mut stream = model.text_stream();
        let mut text = String::new();
        let mut ends: Vec<u32> = Vec::with_capacity(ids.len());
        let mut stopped = stopped.into_iter().peekable();
        // The output being decoded that ran with stop sequences: (its end and start in
        // `ids`, where its text starts, the matcher). The matcher sees the same deltas as the text.
        let mut matching: Option<(usize, usize, usize, StopStrings)> = None;
        for (at, token) in ids.iter().enumerate() {
            if let Some((first, count, stops)) = stopped.next_if(|(first, ..)| *first == at) {
                matching = Some((first + count, first, text.len(), StopStrings::new(stops)));
            }
            if matching.as_ref().is_some_and(|(end, ..)| at >= *end) {
                matching = None;
            }
            if let Some(delta) = stream
                .push(*token)
                .map_err(|error| format!("decoding agent {agent}'s context: {error}"))?
            {
                match &mut matching {
                    // Past a match nothing more of this output reached the harness.
                    Some((.., matcher)) if matcher.matched().is_some() => {}
                    Some((_, first, start, matcher)) => {
                        matcher.push(&delta);
                        text.push_str(&delta);
                        if let Some(cut) = matcher.cut() {
                            text.truncate(*start + cut);
                            // Tokens of the held-back sequence end where the text does.
                            for end in &mut ends[*first..] {
                                *end = (*end).min(text.len() as u32);
                            }
                        }
                    }
                    None => text.push_str(&delta),
                }
            }
            ends.push(text.len() as u32);
        }
        let node = self.tree.node(id);
        let output_start = ids.len() - node.output_ids.len();
        let prompt_len = match output_start {
            0 => 0,
            start => ends[start - 1] as usize,
        };
        Ok(AgentContext {
            call: Some(node.call),
            text,
            ids_json: IdsJson::of(&ids),
            ids,
            ends,
            provenance,
            output_start,
            prompt_len,
            // Rebuilt from the log: every record here is committed; whether its answer
            // reached the harness before the restart is unknown.
            committed: true,
            delivered: false,
            // Records written before they kept their stop sequences read as none: then a
            // re-sent call's own stops are used.
            stops: self.recovered_stops.get(&node.call).cloned(),
        })
    }
}
