//! One model call from parsed request to recorded answer: engine streaming with transparent
//! failover, output parsing, response building, and the commit of the TITO record before the
//! end of the answer is released.

use std::sync::Arc;
use std::time::Instant;

use gyre_event::{CallId, Duration as EventDuration, EngineId, Event, EventBody, PolicyVersion};
use serde_json::Value;
use tokio::sync::mpsc;

use crate::answer_format::AnswerFormat;
use crate::engine::{EngineChunk, EngineFailure, EngineRequest, FinishKind};
use crate::messages::{Api, ChatRequest, ToolChoice};
use crate::output::anthropic::AnthropicResponse;
use crate::output::openai_chat::ChatCompletionResponse;
use crate::output::openai_responses::ResponsesResponse;
use crate::output::sse::SseEvent;
use crate::output::{
    EngineFinish, OutputEvent, OutputParser, ResponseMeta, StopReason, StopStrings, StreamItem,
    Usage,
};
use crate::{ApiError, ApiErrorKind};

use super::output_ids::OutputIds;
use super::session::{Prepared, Sampled};
use super::{wall_clock, AppState, ExecutionHandle, SamplingPolicy, Stage};

/// The per-API response builder.
enum Builder {
    Anthropic(AnthropicResponse),
    Chat(ChatCompletionResponse),
    Responses(ResponsesResponse),
}

impl Builder {
    /// The `sequence_number` an error event sent now carries (Responses streams number their
    /// events; the other APIs do not).
    fn sequence_number(&self) -> u64 {
        match self {
            Builder::Responses(responses) => responses.sequence_number(),
            Builder::Anthropic(_) | Builder::Chat(_) => 0,
        }
    }

    fn new(api: Api, meta: ResponseMeta, usage: Usage, include_usage: bool) -> Self {
        match api {
            Api::Anthropic => Builder::Anthropic(AnthropicResponse::new(meta, usage)),
            Api::OpenAiChat => Builder::Chat(ChatCompletionResponse::new(meta, include_usage)),
            Api::OpenAiResponses => Builder::Responses(ResponsesResponse::new(meta)),
        }
    }

    fn start(&mut self) -> Vec<SseEvent> {
        match self {
            Builder::Anthropic(b) => b.start(),
            Builder::Chat(b) => b.start(),
            Builder::Responses(b) => b.start(),
        }
    }

    fn push(&mut self, item: StreamItem<'_>) -> Vec<SseEvent> {
        match self {
            Builder::Anthropic(b) => b.push(item),
            Builder::Chat(b) => b.push(item),
            Builder::Responses(b) => b.push(item),
        }
    }

    fn finish(&mut self, stop: &StopReason, usage: &Usage) -> Vec<SseEvent> {
        match self {
            Builder::Anthropic(b) => b.finish(stop, usage),
            Builder::Chat(b) => b.finish(stop, usage),
            Builder::Responses(b) => b.finish(stop, usage),
        }
    }

    fn body(&self, stop: &StopReason, usage: &Usage) -> Value {
        match self {
            Builder::Anthropic(b) => b.message_json(stop, usage),
            Builder::Chat(b) => b.completion_json(stop, usage),
            Builder::Responses(b) => b.response_json(stop, usage),
        }
    }
}

/// What the caller gets: SSE frames as they are produced, then either the final JSON body
/// (non-streaming) or nothing more. An `Err` is an error to put in the API's shape.
pub enum Piece {
    Frames(String),
    Body(Value),
    /// The call failed; on a stream, the error event carries this `sequence_number`.
    Failed(ApiError, u64),
}

fn random_id(prefix: &str, length: usize) -> String {
    use rand::Rng;
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    let tail: String = (0..length)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect();
    format!("{prefix}{tail}")
}

/// A request id for the `request-id` / `x-request-id` headers (the SDKs expose it for
/// support and logs).
pub fn request_id() -> String {
    random_id("req_", 24)
}

/// What is wrong with an engine's chunk of sampled tokens, if anything: an id the model's
/// tokenizer does not know, a log-prob that is not a finite number at most zero (rounding
/// may give a hair over zero for a certain token), or tokens past the call's limit
/// (`produced` already sampled, `max_new` in all).
fn engine_output_problem(
    model: &crate::ChatModel,
    ids: &[u32],
    logprobs: &[f32],
    produced: usize,
    max_new: u32,
) -> Option<String> {
    if ids.len() != logprobs.len() {
        return Some(format!(
            "a chunk of {} token ids with {} log-probs",
            ids.len(),
            logprobs.len()
        ));
    }
    if let Some(id) = ids.iter().find(|id| !model.knows_id(**id)) {
        return Some(format!("token id {id} is not in the model's vocabulary"));
    }
    if let Some(logprob) = logprobs
        .iter()
        .find(|logprob| !logprob.is_finite() || **logprob > 1e-3)
    {
        return Some(format!(
            "log-prob {logprob} is not a log-probability (a finite number at most 0)"
        ));
    }
    if produced + ids.len() > max_new as usize {
        return Some(format!(
            "{} tokens sampled, past the call's max_new_tokens of {max_new}",
            produced + ids.len()
        ));
    }
    None
}

/// Chat Completions `logprobs.content`: every sampled token with its exact bytes and the
/// behaviour log-prob the engine reported.
fn set_logprobs(builder: &mut Builder, model: &crate::ChatModel, ids: &[u32], logprobs: &[f32]) {
    if let Builder::Chat(chat) = builder {
        chat.set_logprobs(
            ids.iter()
                .zip(logprobs)
                .map(|(id, logprob)| {
                    crate::output::openai_chat::logprob_entry(&model.token_bytes(*id), *logprob)
                })
                .collect(),
        );
    }
}

/// An execution credential: 32 random alphanumerics.
pub fn random_token() -> String {
    random_id("gx-", 32)
}

fn response_id(api: Api) -> String {
    match api {
        Api::Anthropic => random_id("msg_", 24),
        Api::OpenAiChat => random_id("chatcmpl-", 24),
        Api::OpenAiResponses => random_id("resp_", 24),
    }
}

/// Where a call's pieces go: SSE frames while streaming, the body or an error at the end.
struct Outlet {
    out: mpsc::Sender<Piece>,
    streaming: bool,
    /// A Responses answer to store for `previous_response_id` before it is handed over.
    store_on_end: Option<super::StoreOnEnd>,
    /// An Anthropic answer to hold for a Message Threads `continue` before it is handed over.
    thread: Option<Arc<crate::message_threads::ThreadHold>>,
    /// Where a thread's turn is committed before it is handed over.
    sink: Arc<dyn super::RecordSink>,
}

impl Outlet {
    /// Sends frames (when streaming); `false` when the harness went away.
    async fn frames(&self, events: Vec<SseEvent>) -> bool {
        if self.streaming && !events.is_empty() {
            let wire: String = events.iter().map(SseEvent::to_wire).collect();
            self.out.send(Piece::Frames(wire)).await.is_ok()
        } else {
            !self.out.is_closed()
        }
    }

    /// Sends the call's failure; on a stream, numbered after `builder`'s events.
    async fn failed(&self, api: Api, kind: ApiErrorKind, message: String, builder: &Builder) {
        self.failed_at(api, kind, message, builder.sequence_number())
            .await;
    }

    /// [`Outlet::failed`] numbered `sequence` (the events sent before an unsent end).
    async fn failed_at(&self, api: Api, kind: ApiErrorKind, message: String, sequence: u64) {
        let failure = ApiError::new(api, kind, message);
        let _ = self.out.send(Piece::Failed(failure, sequence)).await;
    }

    /// Builds the end of the answer (the closing frames, or the whole body) and what it hands
    /// over that must be durable first: a chained Responses answer with whatever of its chain
    /// the log lacks, a Message Threads turn. The caller commits [`Ending::events`] in the same
    /// batch as the call's record (one `fdatasync` or one quorum entry; see
    /// [`super::CommitFailure`] for a quorum that folds one and refuses the other),
    /// then [`Outlet::hand_over`]. `None` when the harness went away: the answer is never handed
    /// over, so nothing of it is stored or held, and a re-send is answered from the record.
    fn ending(
        &self,
        builder: &mut Builder,
        stop: &StopReason,
        usage: &Usage,
        execution: &ExecutionHandle,
    ) -> Option<Ending> {
        if self.out.is_closed() {
            return None;
        }
        if let Builder::Responses(responses) = builder {
            responses.set_completed_at(wall_clock().nanos() / 1_000_000_000);
        }
        // Stored before the harness has the id, so its next request can name it.
        let store = |builder: &Builder, body: Option<&Value>| {
            let (Some(store), Builder::Responses(responses)) = (&self.store_on_end, builder) else {
                return None;
            };
            let output = match body.and_then(|body| body.get("output")) {
                Some(Value::Array(items)) => items.as_slice(),
                _ => responses.output(),
            };
            store.store(execution, responses.id(), output)
        };
        let (frames, body, kept) = if self.streaming {
            let frames = builder.finish(stop, usage);
            let kept = store(builder, None);
            (frames, None, kept)
        } else {
            let body = builder.body(stop, usage);
            let kept = store(builder, Some(&body));
            (Vec::new(), Some(body), kept)
        };
        // A response that continues another is durable before its id is handed over, with
        // whatever of its chain the log lacks, and so is one that opens a conversation (see
        // `crate::stored_responses`).
        let mut stored = match (&self.store_on_end, kept) {
            (Some(store), Some(kept)) if store.durable_before_handover(&kept) => {
                Some(super::UnpersistedTurns::of(execution.id(), &kept))
            }
            _ => None,
        };
        let mut events = stored
            .as_mut()
            .map(|stored| std::mem::take(&mut stored.events))
            .unwrap_or_default();
        // A thread's turn is durable before its id is handed over, so a restarted proxy
        // still serves a `continue` from it (see `crate::message_threads::ThreadTurn`); it
        // is held once durable.
        let mut thread = None;
        if let (Some(hold), Builder::Anthropic(anthropic)) = (&self.thread, &*builder) {
            let streamed;
            let message = match &body {
                Some(body) => body,
                None => {
                    streamed = anthropic.message_json(stop, usage);
                    &streamed
                }
            };
            if let Some(id) = message.get("id").and_then(Value::as_str) {
                if let Some((turn, answer)) = hold.answer(&message["content"]) {
                    let record = gyre_event::StoredResponseRecord {
                        execution: execution.id(),
                        response_id: id.to_string(),
                        previous_response_id: turn.previous,
                        items: turn.items,
                    };
                    events.push(gyre_event::Event::new(
                        wall_clock(),
                        gyre_event::EventBody::ResponseStored(Box::new(record)),
                    ));
                    thread = Some((id.to_string(), answer));
                }
            }
        }
        Some(Ending {
            frames,
            body,
            events,
            stored,
            thread,
        })
    }

    /// Hands `ending` over once its events are durable: the stored turns are marked so, the
    /// thread is held, and the answer's end is sent. The call counts as delivered
    /// ([`super::session::Session::mark_delivered`]) from just before the hand-over, since the
    /// harness may have the answer and re-ask before this task runs again; a failed hand-over
    /// (the harness went away) clears it.
    async fn hand_over(
        &self,
        ending: Ending,
        execution: &ExecutionHandle,
        (agent, call): (&str, CallId),
        metrics: &super::metrics::Metrics,
    ) {
        if let Some(stored) = ending.stored {
            stored.committed();
        }
        if self.out.is_closed() {
            // Never handed over, so a re-send of the call is answered from its record. Marked
            // delivered only while a hand-over can still succeed: a re-send racing this task
            // must not see a delivery that the failed hand-over below would take back. The
            // thread is not held: the continued one goes back as the hold drops, for the
            // re-send to continue.
            return;
        }
        if let (Some(hold), Some((id, answer))) = (&self.thread, ending.thread) {
            hold.hold_answered(&id, answer);
            metrics.threads_given_up_by(
                crate::message_threads::lock(&execution.threads()).take_given_up(),
            );
        }
        execution.lock().mark_delivered(agent, call, true);
        let handed = match ending.body {
            None => self.frames(ending.frames).await,
            Some(body) => self.out.send(Piece::Body(body)).await.is_ok(),
        };
        if !handed {
            execution.lock().mark_delivered(agent, call, false);
        }
    }

    /// The end of an answer with no record to commit (a re-sent call answered from its
    /// record): what it hands over is committed alone, then handed over.
    async fn end(
        &self,
        api: Api,
        builder: &mut Builder,
        (stop, usage): (&StopReason, &Usage),
        execution: &ExecutionHandle,
        (agent, call): (&str, CallId),
        metrics: &super::metrics::Metrics,
    ) {
        let sequence = builder.sequence_number();
        let Some(mut ending) = self.ending(builder, stop, usage, execution) else {
            return;
        };
        let events = std::mem::take(&mut ending.events);
        if let Err(failure) = self.sink.commit(events).await {
            tracing::error!(%failure, "an answer's stored turn was not committed; the call fails");
            if let Some(stored) = &ending.stored {
                stored.committed_at(&failure.durable, 0);
            }
            let message = format!("the answer's stored turn could not be committed: {failure}");
            self.failed_at(api, ApiErrorKind::Overloaded, message, sequence)
                .await;
            return;
        }
        self.hand_over(ending, execution, (agent, call), metrics)
            .await;
    }
}

/// The end of an answer, built before anything of it is durable ([`Outlet::ending`]).
struct Ending {
    frames: Vec<SseEvent>,
    body: Option<Value>,
    /// `ResponseStored` events to commit before the hand-over: the stored response's chain,
    /// the thread's turn.
    events: Vec<Event>,
    stored: Option<super::UnpersistedTurns>,
    /// The thread's answer under its response id, held once its turn is durable.
    thread: Option<(String, crate::message_threads::HeldAnswer)>,
}

/// Sampled tokens → the API's stream: detokenized, parsed, tool-call ids and reasoning handles
/// minted (and cached in the session), built into frames.
struct Answer<'m> {
    text_stream: crate::model_dir::TextStream<'m>,
    /// The request's stop sequences, between the detokenizer and the parser.
    stop: StopStrings,
    parser: OutputParser,
    reasoning_text: String,
    /// The answer's text, and its reasoning handles, before its first tool call.
    before_calls: BeforeCalls,
    reasoning_tokens: u64,
    tool_calls: usize,
    /// The answer calls a tool that starts a sub-agent (see [`is_spawn_tool`]).
    spawns_agent: bool,
    output_ids: OutputIds,
}

impl<'m> Answer<'m> {
    /// `prompt_tokens`: the call's prompt length (tool-call ids and reasoning handles are
    /// derived from it).
    fn new(
        app: &AppState,
        model: &'m crate::ChatModel,
        execution: &ExecutionHandle,
        stops: &[String],
        prepared: &Prepared,
        prompt_tokens: usize,
    ) -> Self {
        let mut format = app.output_format.clone();
        // A pre-filled answer is continued after its text: whatever the generation prompt
        // would have opened (Qwen3-thinking's `<think>`), the output starts as text.
        format.reasoning_open_at_start &= !prepared.continues_final_message;
        Answer {
            text_stream: model.text_stream(),
            stop: StopStrings::new(stops),
            parser: OutputParser::new(format),
            reasoning_text: String::new(),
            before_calls: BeforeCalls::default(),
            reasoning_tokens: 0,
            tool_calls: 0,
            spawns_agent: false,
            output_ids: OutputIds::new(execution.id(), &prepared.agent, prompt_tokens as u64),
        }
    }

    /// The stop sequence the output reached, if any: the answer ends there (the text before
    /// it is out; the token that completed it is the output's last).
    fn stopped(&self) -> Option<&str> {
        self.stop.matched()
    }

    /// After a stop sequence: the byte offset in the output text where the harness's text
    /// ends.
    fn stop_cut(&self) -> Option<usize> {
        self.stop.cut()
    }

    /// One output token (`so_far`: the output up to and including it): the text it completes,
    /// if any (all of it: the record keeps every sampled token's text), and the frames that
    /// text produces (none past a stop sequence).
    fn token(
        &mut self,
        app: &AppState,
        execution: &ExecutionHandle,
        api: Api,
        builder: &mut Builder,
        id: u32,
        so_far: &[u32],
    ) -> Result<Option<(String, Vec<SseEvent>)>, String> {
        let Some(delta) = self
            .text_stream
            .push(id)
            .map_err(|error| format!("detokenizing the engine's output: {error}"))?
        else {
            return Ok(None);
        };
        let events = if self.stop.is_empty() {
            self.parser.push(&delta)
        } else {
            let release = self.stop.push(&delta).release;
            self.parser.push(&release)
        };
        if events
            .iter()
            .any(|event| matches!(event, OutputEvent::ReasoningDelta(_)))
        {
            self.reasoning_tokens += 1;
        }
        let frames = self.emit(app, execution, api, builder, events, so_far);
        Ok(Some((delta, frames)))
    }

    /// The frames of whatever the parser still holds at the end of the output.
    fn finish(
        &mut self,
        app: &AppState,
        execution: &ExecutionHandle,
        api: Api,
        builder: &mut Builder,
        output: &[u32],
    ) -> Vec<SseEvent> {
        // Text held as a possible stop sequence's start is ordinary text after all.
        let tail = self.stop.finish();
        let mut events = if tail.is_empty() {
            Vec::new()
        } else {
            self.parser.push(&tail)
        };
        events.extend(self.parser.finish());
        self.emit(app, execution, api, builder, events, output)
    }

    fn emit(
        &mut self,
        app: &AppState,
        execution: &ExecutionHandle,
        api: Api,
        builder: &mut Builder,
        events: Vec<OutputEvent>,
        so_far: &[u32],
    ) -> Vec<SseEvent> {
        emit(
            app,
            execution,
            api,
            builder,
            events,
            &mut self.reasoning_text,
            &mut self.before_calls,
            &mut self.tool_calls,
            &mut self.spawns_agent,
            &mut self.output_ids,
            so_far,
        )
    }
}

/// The builder for a call of `prompt_tokens` prompt tokens, its opening frames already
/// produced.
fn builder_for(
    request: &ChatRequest,
    prepared: &Prepared,
    prompt_tokens: usize,
    requested_at: gyre_event::Timestamp,
) -> (Builder, Vec<SseEvent>) {
    let api = request.api;
    let usage_start = Usage {
        input_tokens: prompt_tokens as u64,
        cached_input_tokens: prepared.tree_reused,
        output_tokens: 0,
        reasoning_tokens: 0,
    };
    let meta = ResponseMeta {
        id: response_id(api),
        model: request.model.clone(),
        created_unix_s: requested_at.nanos() / 1_000_000_000,
    };
    let mut builder = Builder::new(api, meta, usage_start, request.stream_include_usage);
    if let Builder::Chat(chat) = builder {
        builder = Builder::Chat(chat.with_freeform_tools(request.freeform_tools.clone()));
    } else if let Builder::Responses(responses) = builder {
        builder = Builder::Responses(
            responses
                .with_freeform_tools(request.freeform_tools.clone())
                .with_search_tools(request.search_tools.clone())
                .with_typed_tools(request.typed_tools)
                .with_settings(request.response_settings.clone())
                .with_compaction(request.remote_compaction),
        );
    }
    let start = builder.start();
    (builder, start)
}

/// A Responses warm-up (`"generate": false`, which Codex sends first on each new WebSocket
/// conversation): the answer is a completed response with no output and no usage, the engine is
/// not called and no call is recorded (no tokens were sampled, so there is nothing to train
/// on). The response is kept for `previous_response_id` like any other, and committed as a
/// `ResponseStored` event before its id is handed over when a client may chain from it.
pub async fn warmup(
    execution: ExecutionHandle,
    request: ChatRequest,
    store_on_end: Option<super::StoreOnEnd>,
    out: mpsc::Sender<Piece>,
) {
    let now = wall_clock().nanos() / 1_000_000_000;
    let meta = ResponseMeta {
        id: response_id(Api::OpenAiResponses),
        model: request.model.clone(),
        created_unix_s: now,
    };
    let mut responses = ResponsesResponse::new(meta).with_settings(request.response_settings);
    responses.set_completed_at(now);
    let (stop, usage) = (StopReason::EndTurn, Usage::default());
    // Kept and, where a chaining client may name it next, committed before its id is handed
    // over, as any other stored answer (see `crate::stored_responses`).
    if let Some(store) = &store_on_end {
        if let Some(kept) = store.store(&execution, responses.id(), &[]) {
            if store.durable_before_handover(&kept) {
                let id = execution.id();
                if let Err(error) = store.persist(id, &kept).await {
                    tracing::error!(%error, "a warm-up's stored response was not committed");
                    let message = format!("the stored response could not be committed: {error}");
                    let failure =
                        ApiError::new(Api::OpenAiResponses, ApiErrorKind::Overloaded, message);
                    let _ = out.send(Piece::Failed(failure, 0)).await;
                    return;
                }
            }
        }
    }
    let piece = if request.stream {
        let mut events = responses.start();
        events.extend(responses.finish(&stop, &usage));
        Piece::Frames(events.iter().map(SseEvent::to_wire).collect())
    } else {
        Piece::Body(responses.response_json(&stop, &usage))
    };
    let _ = out.send(piece).await;
}

/// The prompt of a call in flight. Its tokens are the agent's context, taken by `prepare`: a
/// call that ends without a record (any early return below, or a panic) gives them back when
/// the lease drops ([`Session::give_back`]); `finish_call` takes them for good.
struct PromptLease {
    execution: ExecutionHandle,
    prepared: Option<Prepared>,
}

impl PromptLease {
    fn take(&mut self) -> Prepared {
        self.prepared
            .take()
            .expect("a prompt is taken once, at the end of its call")
    }
}

impl std::ops::Deref for PromptLease {
    type Target = Prepared;

    fn deref(&self) -> &Prepared {
        self.prepared
            .as_ref()
            .expect("the prompt is read only before the call finishes")
    }
}

impl Drop for PromptLease {
    fn drop(&mut self) {
        if let Some(prepared) = self.prepared.take() {
            self.execution.lock().give_back(prepared);
        }
    }
}

/// Runs the call and sends its pieces to `out` (dropped receiver = the harness went away: the
/// engine request is aborted and nothing is recorded).
pub async fn run(
    app: Arc<AppState>,
    execution: ExecutionHandle,
    request: ChatRequest,
    mut prepared: Prepared,
    store_on_end: Option<super::StoreOnEnd>,
    out: mpsc::Sender<Piece>,
) {
    if let Some(replay) = prepared.replay.take() {
        return run_replay(app, execution, request, prepared, replay, store_on_end, out).await;
    }
    let mut prepared = PromptLease {
        execution: execution.clone(),
        prepared: Some(prepared),
    };
    let started = Instant::now();
    let requested_at = wall_clock();
    let api = request.api;
    let outlet = Outlet {
        out,
        streaming: request.stream,
        store_on_end,
        thread: request.thread_hold.clone(),
        sink: app.sink.clone(),
    };
    let prompt_tokens = prepared.context_ids.len();
    // A prompt the engines' context cannot hold with one answer token is refused before
    // anything is sent or recorded (the harness sees the vendor's words and compacts).
    if let Some(window) = app.config.context_tokens_max {
        let prompt_tokens_max = (window as usize).saturating_sub(1);
        if prompt_tokens > prompt_tokens_max {
            app.metrics.context_too_long();
            let _ = outlet
                .out
                .send(Piece::Failed(
                    ApiError::context_too_long(api, prompt_tokens, prompt_tokens_max),
                    0,
                ))
                .await;
            return;
        }
    }
    let (mut builder, start) = builder_for(&request, &prepared, prompt_tokens, requested_at);
    if !outlet.frames(start).await {
        return;
    }
    let model = app.model.clone();
    let mut answer = Answer::new(
        &app,
        &model,
        &execution,
        &request.sampling.stop,
        &prepared,
        prompt_tokens,
    );
    let mut sampled = Sampled {
        requested_at,
        stop_sequences: request.sampling.stop.clone(),
        ..Sampled::default()
    };
    let max_new = max_new_tokens(&app, &request, prompt_tokens);
    // Structured output: the engine's grammar holds the answer to the format only when the
    // model may not call a tool instead (a grammar over the whole output would forbid the
    // call), and only from the output's first token (an engine starts its grammar there, so a
    // failover that continues a partial answer goes unconstrained). The record says how many
    // leading sampled tokens were constrained: their log-probs are of the masked distribution.
    let json_constraint = request
        .answer_format
        .as_ref()
        .filter(|_| request.tools.is_empty() || request.tool_choice == ToolChoice::None)
        .map(AnswerFormat::engine_constraint);
    let mut constrained_tokens = 0usize;
    // The settings every attempt samples with (the record keeps them): the policy's own unless
    // this proxy passes a harness's on.
    let sampling = app.config.sampling.settings(&request.sampling);
    let harness_asked = SamplingPolicy::Harness.settings(&request.sampling);
    if sampling != harness_asked {
        app.metrics.sampling_overridden();
    }
    sampled.sampling = sampling;
    let mut engine_index = execution.engine();
    let mut attempts = 0usize;
    let mut first_token: Option<std::time::Duration> = None;
    // The engine of the attempt before this one, which sampled the answer's latest tokens.
    let mut previous_engine = engine_index % app.engines.len();
    let finish = 'engines: loop {
        attempts += 1;
        let engine = app.engines[engine_index % app.engines.len()].clone();
        let produced = sampled.output_ids.len() as u32;
        if produced >= max_new {
            // An engine sampled the whole answer and failed before saying it ended: the
            // answer is complete at its limit (asking another engine for more would go past
            // it). The policy version is the one that engine last reported.
            sampled.policy_version = PolicyVersion(app.engine_version(previous_engine));
            sampled.engine = EngineId(previous_engine as u32);
            break 'engines FinishKind::Length;
        }
        previous_engine = engine_index % app.engines.len();
        let (input_ids, input_ids_json) = if sampled.output_ids.is_empty() {
            (prepared.context_ids.clone(), prepared.context_json.clone())
        } else {
            // A retry continues the partial answer: its ids follow the prompt.
            let mut ids = Vec::with_capacity(prepared.context_ids.len() + sampled.output_ids.len());
            ids.extend_from_slice(&prepared.context_ids);
            ids.extend_from_slice(&sampled.output_ids);
            let mut json = (*prepared.context_json).clone();
            json.extend(&sampled.output_ids);
            (Arc::new(ids), Arc::new(json))
        };
        let rid = {
            let session = execution.lock();
            app.request_id(session.execution, session.calls(), attempts)
        };
        let constrained = json_constraint.is_some()
            && sampled.output_ids.is_empty()
            && engine.constrains_output();
        let engine_request = EngineRequest {
            json: json_constraint.clone().filter(|_| constrained),
            reasoning_first: app.output_format.reasoning_tags.is_some(),
            rid: rid.clone(),
            input_ids,
            input_ids_json: Some(input_ids_json),
            max_new_tokens: max_new.saturating_sub(produced).max(1),
            temperature: sampling.temperature,
            top_p: sampling.top_p,
            top_k: sampling.top_k,
            stop_token_ids: app.stop_token_ids.clone(),
            seed: request.sampling.seed.map(|seed| seed as u64),
            agent: Some(if prepared.agent == "main" {
                "main".to_string()
            } else {
                "sub".to_string()
            }),
        };
        let failure = match engine.generate(engine_request).await {
            Err(failure) => failure,
            Ok(mut chunks) => loop {
                let chunk = tokio::select! {
                    chunk = chunks.recv() => chunk,
                    () = outlet.out.closed() => {
                        let _ = engine.abort(&rid).await;
                        app.metrics.harness_gone();
                        return;
                    }
                };
                match chunk {
                    None => {
                        break EngineFailure::Unreachable {
                            engine: engine.name().to_string(),
                            message: "the engine's stream ended without a finish".into(),
                        }
                    }
                    Some(Err(failure)) => break failure,
                    // A role switch (the source engine aborts its in-flight requests): the
                    // partial output continues on the destination.
                    Some(Ok(EngineChunk::Finished {
                        kind: FinishKind::Abort,
                        policy_version,
                    })) => {
                        app.engine_reported(engine_index % app.engines.len(), policy_version);
                        break EngineFailure::Failed {
                            engine: engine.name().to_string(),
                            message: "aborted (role switch or engine pause)".into(),
                        };
                    }
                    Some(Ok(EngineChunk::Finished {
                        kind,
                        policy_version,
                    })) => {
                        app.engine_reported(engine_index % app.engines.len(), policy_version);
                        sampled.policy_version = PolicyVersion(policy_version);
                        sampled.engine = EngineId(engine_index as u32);
                        break 'engines kind;
                    }
                    Some(Ok(EngineChunk::Tokens { ids, logprobs })) => {
                        if let Some(problem) = engine_output_problem(
                            &app.model,
                            &ids,
                            &logprobs,
                            sampled.output_ids.len(),
                            max_new,
                        ) {
                            // Nothing of this chunk is kept: the answer so far continues on
                            // the next engine (or ends in an error), never with tokens the
                            // trainer could not use.
                            let _ = engine.abort(&rid).await;
                            break EngineFailure::Protocol {
                                engine: engine.name().to_string(),
                                message: problem,
                            };
                        }
                        if first_token.is_none() {
                            first_token = Some(started.elapsed());
                        }
                        for (id, logprob) in ids.iter().zip(logprobs.iter()) {
                            sampled.output_ids.push(*id);
                            sampled.output_logprobs.push(*logprob);
                            if constrained {
                                constrained_tokens = sampled.output_ids.len();
                            }
                            let pushed = answer.token(
                                &app,
                                &execution,
                                api,
                                &mut builder,
                                *id,
                                &sampled.output_ids,
                            );
                            match pushed {
                                Err(message) => {
                                    outlet
                                        .failed(api, ApiErrorKind::Internal, message, &builder)
                                        .await;
                                    return;
                                }
                                Ok(None) => {}
                                Ok(Some((delta, frames))) => {
                                    sampled.output_text.push_str(&delta);
                                    if !outlet.frames(frames).await {
                                        let _ = engine.abort(&rid).await;
                                        app.metrics.harness_gone();
                                        return;
                                    }
                                }
                            }
                            sampled.output_ends.push(sampled.output_text.len() as u32);
                            if let Some(cut) = answer.stop_cut() {
                                // A stop sequence ends the answer. The agent's context keeps
                                // the text the harness saw (it sends that back next turn) and
                                // every sampled token, those past the cut ending at it.
                                sampled.output_text.truncate(cut);
                                for end in &mut sampled.output_ends {
                                    *end = (*end).min(cut as u32);
                                }
                                // The engine stops here; its end reports the policy version
                                // (without one: the version the engine last reported).
                                let index = engine_index % app.engines.len();
                                if let Some(version) = stop_engine(&*engine, &rid, chunks).await {
                                    app.engine_reported(index, version.get());
                                }
                                sampled.policy_version = PolicyVersion(app.engine_version(index));
                                sampled.engine = EngineId(engine_index as u32);
                                break 'engines FinishKind::Stop;
                            }
                        }
                    }
                }
            },
        };
        // The engine failed, died or was aborted (a role switch): continue the same answer on
        // another engine from the tokens already produced; the harness sees one response.
        app.metrics.failover();
        // The attempt's partial output is kept for audit as its own (never trainable) record.
        let produced = produced as usize;
        if sampled.output_ids.len() > produced {
            let aborted = execution.lock().record_aborted(
                &prepared,
                &sampled.output_ids[..produced],
                &sampled.output_ids[produced..],
                &sampled.output_logprobs[produced..],
                EngineId((engine_index % app.engines.len()) as u32),
                // The version the engine reported with its abort, or (an engine that died says
                // nothing) the one it last reported.
                PolicyVersion(app.engine_version(engine_index % app.engines.len())),
                requested_at,
                EventDuration(started.elapsed().as_nanos() as u64),
                sampling,
            );
            let committed = match aborted {
                Ok(record) => {
                    let event =
                        Event::new(wall_clock(), EventBody::ModelCall(Box::new(record.clone())));
                    let result = app.sink.commit(vec![event]).await;
                    if result.is_ok() {
                        execution.lock().record_committed(&record);
                    }
                    result.map_err(|error| error.to_string())
                }
                Err(error) => Err(error.to_string()),
            };
            if let Err(error) = committed {
                tracing::warn!(%error, "the aborted attempt's audit record was not committed");
            }
        }
        tracing::warn!(
            engine = %engine.name(),
            %failure,
            produced = sampled.output_ids.len(),
            "engine failed mid-call; continuing on the next engine"
        );
        if sampled.output_ids.len() as u32 >= max_new {
            // The whole answer was sampled before the engine failed: it is complete at its
            // limit whatever the failure or the attempts left (the loop's top ends it).
            continue 'engines;
        }
        if !failure.is_retryable() {
            // A 4xx or a refusal fails the same way on any engine and on a retry of the same
            // body: the harness is told it is its request (a 400), not asked to retry (529).
            let message = format!("the engine refused the call: {failure}");
            outlet
                .failed(api, ApiErrorKind::InvalidRequest, message, &builder)
                .await;
            return;
        }
        if attempts >= app.config.engine_attempts_max.max(1) {
            let message =
                format!("no engine could finish the call after {attempts} attempts: {failure}");
            outlet
                .failed(api, ApiErrorKind::Overloaded, message, &builder)
                .await;
            return;
        }
        engine_index = (engine_index + 1) % app.engines.len();
        execution.pin(engine_index);
    };
    let finish = match (answer.stopped(), finish) {
        (Some(sequence), _) => EngineFinish::StopSequence(sequence.to_string()),
        (None, FinishKind::Stop) => EngineFinish::EndOfTurn,
        (None, FinishKind::Length | FinishKind::Abort) => EngineFinish::Length,
    };
    let frames = answer.finish(&app, &execution, api, &mut builder, &sampled.output_ids);
    if !outlet.frames(frames).await {
        app.metrics.harness_gone();
        return;
    }
    if request.logprobs {
        set_logprobs(
            &mut builder,
            &app.model,
            &sampled.output_ids,
            &sampled.output_logprobs,
        );
    }
    // A call the output stopped inside is shown, but never as a finished turn's `tool_use`.
    let stop = StopReason::from_finish(
        &finish,
        answer.tool_calls > 0 && !answer.parser.cut_tool_call(),
    );
    let usage = Usage {
        input_tokens: prepared.context_ids.len() as u64,
        cached_input_tokens: prepared.tree_reused,
        output_tokens: sampled.output_ids.len() as u64,
        reasoning_tokens: answer.reasoning_tokens,
    };
    sampled.first_token_after = EventDuration(first_token.unwrap_or_default().as_nanos() as u64);
    sampled.completed_after = EventDuration(started.elapsed().as_nanos() as u64);
    app.metrics
        .stage(Stage::Engine, started.elapsed().as_secs_f64());
    let encoded = prepared.encoded as u64;
    let reused = prepared.reused_by_text as u64;
    // Record, then commit, then release the end of the answer.
    sampled.spawns_agent = answer.spawns_agent;
    sampled.output_constraint = request.answer_format.as_ref().map(|format| {
        format.record(
            u32::try_from(constrained_tokens).unwrap_or(u32::MAX),
            u32::try_from(sampled.output_ids.len()).unwrap_or(u32::MAX),
        )
    });
    let prepared = prepared.take();
    let finished = execution.lock().finish_call(prepared, sampled);
    let record = match finished {
        Ok(record) => record,
        Err(error) => {
            let message = format!("recording the call: {error}");
            outlet
                .failed(api, ApiErrorKind::Internal, message, &builder)
                .await;
            return;
        }
    };
    // The answer's end is built now and sent only once the record, and whatever stored turns
    // it hands over, are durable: all in one batch.
    let sequence = builder.sequence_number();
    let mut ending = outlet.ending(&mut builder, &stop, &usage, &execution);
    let mut events = vec![Event::new(
        wall_clock(),
        EventBody::ModelCall(Box::new(record.clone())),
    )];
    if let Some(ending) = &mut ending {
        events.append(&mut ending.events);
    }
    let commit_started = Instant::now();
    let committed = app.sink.commit(events).await;
    app.metrics
        .commit_seconds(commit_started.elapsed().as_secs_f64());
    if let Err(failure) = committed {
        // A quorum folds the batch's events one by one: what it took stays taken. The record
        // in the log is the session's too (the tree and the log never disagree), so the
        // harness's re-send of the call is answered from it; stored turns it took are marked
        // so, and the others go with the re-send's answer.
        if failure.durable.contains(&0) {
            execution.lock().record_committed(&record);
            app.metrics
                .recorded(encoded, reused, started.elapsed().as_secs_f64());
            tracing::error!(%failure, "an answer's stored turn was not committed beside its record; the call fails");
        } else {
            tracing::error!(%failure, "a TITO record was not committed; the call fails");
        }
        if let Some(stored) = ending.as_ref().and_then(|ending| ending.stored.as_ref()) {
            stored.committed_at(&failure.durable, 1);
        }
        let message = format!("the call's record could not be committed: {failure}");
        outlet
            .failed_at(api, ApiErrorKind::Overloaded, message, sequence)
            .await;
        return;
    }
    // The session's tree takes the record now that the log holds it; from now on a re-send
    // of this prompt is answered from it.
    execution.lock().record_committed(&record);
    app.metrics
        .recorded(encoded, reused, started.elapsed().as_secs_f64());
    if let Some(ending) = ending {
        outlet
            .hand_over(
                ending,
                &execution,
                (&record.agent, record.call),
                &app.metrics,
            )
            .await;
    }
}

/// Stops request `rid` after the output reached a stop sequence, and reads its stream to the
/// end (the tokens the engine sent meanwhile are dropped) for the policy version its end
/// reports; `None` if the stream fails instead (the answer is complete either way).
async fn stop_engine(
    engine: &dyn crate::engine::TokenEngine,
    rid: &str,
    mut chunks: crate::engine::ChunkStream,
) -> Option<PolicyVersion> {
    if let Err(error) = engine.abort(rid).await {
        // Dropping the stream closes the request's connection, which ends it on the engine.
        tracing::warn!(%error, rid, "abort after a stop sequence failed; the engine's last policy version");
        return None;
    }
    let drained = tokio::time::timeout(STOP_DRAIN, async {
        while let Some(chunk) = chunks.recv().await {
            match chunk {
                Ok(EngineChunk::Tokens { .. }) => {}
                Ok(EngineChunk::Finished { policy_version, .. }) => {
                    return Some(PolicyVersion(policy_version))
                }
                Err(failure) => {
                    tracing::warn!(%failure, rid, "stream failed after a stop sequence");
                    return None;
                }
            }
        }
        None
    })
    .await;
    let version = drained.ok().flatten();
    if version.is_none() {
        tracing::warn!(
            rid,
            "no end after a stop sequence's abort; the engine's last policy version"
        );
    }
    version
}

/// How long a stopped request's stream may take to end after its abort.
const STOP_DRAIN: std::time::Duration = std::time::Duration::from_secs(5);

/// The new-token limit of a call: the request's, capped by the proxy's.
/// A call's answer limit: the request's `max_tokens`, within `--max-new-tokens` and the room
/// the context window leaves after the prompt (`run` refused a prompt that leaves none).
fn max_new_tokens(app: &AppState, request: &ChatRequest, prompt_tokens: usize) -> u32 {
    let room = app.config.context_tokens_max.map_or(u32::MAX, |window| {
        u32::try_from((window as usize).saturating_sub(prompt_tokens)).unwrap_or(u32::MAX)
    });
    request
        .sampling
        .max_tokens
        .unwrap_or(app.config.max_new_tokens)
        .min(app.config.max_new_tokens)
        .min(room)
        .max(1)
}

/// Answers a re-sent call with its committed answer (see `Prepared::replay`): the recorded
/// tokens go through the same detokenizer, parser and builder as when they were sampled, so
/// the harness gets the same text, the same tool-call ids and the same reasoning handles.
/// Nothing is recorded: the call is already in the log.
async fn run_replay(
    app: Arc<AppState>,
    execution: ExecutionHandle,
    request: ChatRequest,
    prepared: Prepared,
    replay: super::session::Replay,
    store_on_end: Option<super::StoreOnEnd>,
    out: mpsc::Sender<Piece>,
) {
    let api = request.api;
    let outlet = Outlet {
        out,
        streaming: request.stream,
        store_on_end,
        thread: request.thread_hold.clone(),
        sink: app.sink.clone(),
    };
    let (mut builder, start) = builder_for(&request, &prepared, replay.prompt_tokens, wall_clock());
    if !outlet.frames(start).await {
        return;
    }
    let model = app.model.clone();
    // The stops the answer ran with (a re-send normally carries the same ones); after a
    // restart they are unknown and the re-send's are used.
    let stops = replay
        .stops
        .clone()
        .unwrap_or_else(|| request.sampling.stop.clone());
    let mut answer = Answer::new(
        &app,
        &model,
        &execution,
        &stops,
        &prepared,
        replay.prompt_tokens,
    );
    let output = &replay.output_ids;
    for at in 0..output.len() {
        match answer.token(
            &app,
            &execution,
            api,
            &mut builder,
            output[at],
            &output[..=at],
        ) {
            Err(message) => {
                outlet
                    .failed(api, ApiErrorKind::Internal, message, &builder)
                    .await;
                return;
            }
            Ok(None) => {}
            Ok(Some((_, frames))) => {
                if !outlet.frames(frames).await {
                    app.metrics.harness_gone();
                    return;
                }
            }
        }
        if answer.stopped().is_some() {
            // The answer's stop sequence ends the replay where it ended the answer (its
            // token is the record's last).
            break;
        }
    }
    let frames = answer.finish(&app, &execution, api, &mut builder, output);
    if !outlet.frames(frames).await {
        app.metrics.harness_gone();
        return;
    }
    if request.logprobs {
        set_logprobs(&mut builder, &app.model, output, &replay.output_logprobs);
    }
    // The same request has the same token limit: an output that ends in a stop token or stops
    // short of the limit ended its turn; one that reached the limit without a stop token was
    // cut there.
    let finish = if let Some(sequence) = answer.stopped() {
        EngineFinish::StopSequence(sequence.to_string())
    } else if output.len() < max_new_tokens(&app, &request, replay.prompt_tokens) as usize
        || output
            .last()
            .is_some_and(|id| app.stop_token_ids.contains(id))
    {
        EngineFinish::EndOfTurn
    } else {
        EngineFinish::Length
    };
    // A call the output stopped inside is shown, but never as a finished turn's `tool_use`.
    let stop = StopReason::from_finish(
        &finish,
        answer.tool_calls > 0 && !answer.parser.cut_tool_call(),
    );
    let usage = Usage {
        input_tokens: replay.prompt_tokens as u64,
        cached_input_tokens: prepared.tree_reused,
        output_tokens: output.len() as u64,
        reasoning_tokens: answer.reasoning_tokens,
    };
    tracing::info!(
        call = %replay.call,
        engine = replay.engine.0,
        policy_version = replay.policy_version.0,
        "a re-sent call was answered with its committed answer"
    );
    app.metrics.replayed();
    outlet
        .end(
            api,
            &mut builder,
            (&stop, &usage),
            &execution,
            (&prepared.agent, replay.call),
            &app.metrics,
        )
        .await;
}

/// Tools that start a sub-agent: Claude Code's `Agent` (`Task` before it) and Codex's
/// `multi_agent_v1.spawn_agent`. A sub-agent's first call is recorded as spawned by the
/// agent's last call that called one (Codex's spawn returns at once, so the main agent has
/// often made another call before the sub-agent's first request arrives).
fn is_spawn_tool(name: &str) -> bool {
    matches!(name, "Agent" | "Task")
        || name
            .rsplit(crate::openai_responses::NAMESPACE_SEPARATOR)
            .next()
            == Some("spawn_agent")
}

/// What an answer sampled before its first tool call: the session keys both by that call's id
/// (see `Session::restore`).
#[derive(Default)]
struct BeforeCalls {
    text: String,
    reasoning_handles: Vec<String>,
}

/// Parser events → builder items (minting ids and handles, filling the caches) → SSE frames.
#[allow(clippy::too_many_arguments)]
fn emit(
    app: &AppState,
    execution: &ExecutionHandle,
    api: Api,
    builder: &mut Builder,
    events: Vec<OutputEvent>,
    reasoning_text: &mut String,
    before_calls: &mut BeforeCalls,
    tool_calls: &mut usize,
    spawns_agent: &mut bool,
    output_ids: &mut OutputIds,
    sampled_so_far: &[u32],
) -> Vec<SseEvent> {
    let mut frames = Vec::new();
    for event in events {
        match event {
            OutputEvent::ReasoningDelta(text) => {
                reasoning_text.push_str(&text);
                frames.extend(builder.push(StreamItem::ReasoningDelta(&text)));
            }
            OutputEvent::ReasoningEnd => {
                let handle = output_ids.next_reasoning(sampled_so_far);
                execution.lock().remember_reasoning(&handle, reasoning_text);
                reasoning_text.clear();
                frames.extend(builder.push(StreamItem::ReasoningEnd { handle: &handle }));
                if *tool_calls == 0 {
                    before_calls.reasoning_handles.push(handle);
                }
            }
            OutputEvent::TextDelta(text) => {
                if *tool_calls == 0 {
                    before_calls.text.push_str(&text);
                }
                frames.extend(builder.push(StreamItem::TextDelta(&text)));
            }
            OutputEvent::ToolCall { name, arguments } => {
                let id = output_ids.next_tool_call(api, sampled_so_far);
                let mut session = execution.lock();
                session.remember_tool_call(&id, &arguments);
                if *tool_calls == 0 {
                    if before_calls.text.trim().is_empty() {
                        // Claude Code drops a whitespace-only text block from the history it
                        // sends back; the session puts it back before rendering.
                        session.remember_blank_text_before(&id, &before_calls.text);
                    }
                    // Chat Completions clients send an answer back without its
                    // `reasoning_content`; the session puts it back before rendering.
                    session.remember_reasoning_before(
                        &id,
                        std::mem::take(&mut before_calls.reasoning_handles),
                    );
                }
                drop(session);
                *tool_calls += 1;
                *spawns_agent |= is_spawn_tool(&name);
                frames.extend(builder.push(StreamItem::ToolCall {
                    id: &id,
                    name: &name,
                    arguments: &arguments,
                }));
            }
        }
    }
    let _ = app;
    frames
}
