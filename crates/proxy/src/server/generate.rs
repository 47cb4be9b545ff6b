//! One model call from parsed request to recorded answer: engine streaming with transparent
//! failover, output parsing, response building, and the commit of the TITO record before the
//! end of the answer is released.

use std::sync::Arc;
use std::time::Instant;

use gyre_event::{Duration as EventDuration, EngineId, Event, EventBody, PolicyVersion};
use serde_json::Value;
use tokio::sync::mpsc;

use crate::engine::{EngineChunk, EngineFailure, EngineRequest, FinishKind};
use crate::messages::{Api, ChatRequest};
use crate::output::anthropic::AnthropicResponse;
use crate::output::openai_chat::ChatCompletionResponse;
use crate::output::openai_responses::ResponsesResponse;
use crate::output::sse::SseEvent;
use crate::output::{
    EngineFinish, OutputEvent, OutputParser, ResponseMeta, StopReason, StreamItem, Usage,
};
use crate::{ApiError, ApiErrorKind};

use super::output_ids::OutputIds;
use super::session::{Prepared, Sampled};
use super::{wall_clock, AppState, ExecutionHandle, Stage};

/// The per-API response builder.
enum Builder {
    Anthropic(AnthropicResponse),
    Chat(ChatCompletionResponse),
    Responses(ResponsesResponse),
}

impl Builder {
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
    Failed(ApiError),
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

/// Runs the call and sends its pieces to `out` (dropped receiver = the harness went away: the
/// engine request is aborted and nothing is recorded).
pub async fn run(
    app: Arc<AppState>,
    execution: ExecutionHandle,
    request: ChatRequest,
    prepared: Prepared,
    out: mpsc::Sender<Piece>,
) {
    let started = Instant::now();
    let requested_at = wall_clock();
    let api = request.api;
    let usage_start = Usage {
        input_tokens: prepared.context_ids.len() as u64,
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
    let streaming = request.stream;
    let send_frames = |events: Vec<SseEvent>| {
        let out = out.clone();
        async move {
            if streaming && !events.is_empty() {
                let wire: String = events.iter().map(SseEvent::to_wire).collect();
                out.send(Piece::Frames(wire)).await.is_ok()
            } else {
                !out.is_closed()
            }
        }
    };
    if !send_frames(builder.start()).await {
        return;
    }
    let model = app.model.clone();
    let mut text_stream = model.text_stream();
    let mut parser = OutputParser::new(app.output_format.clone());
    let mut sampled = Sampled {
        requested_at,
        ..Sampled::default()
    };
    let mut reasoning_text = String::new();
    let mut reasoning_tokens = 0u64;
    let mut tool_calls = 0usize;
    let mut output_ids = OutputIds::new(
        execution.lock().execution,
        &prepared.agent,
        prepared.context_ids.len() as u64,
    );
    let max_new = request
        .sampling
        .max_tokens
        .unwrap_or(app.config.max_new_tokens)
        .min(app.config.max_new_tokens)
        .max(1);
    let mut engine_index = execution.lock().engine;
    let mut attempts = 0usize;
    let mut first_token: Option<std::time::Duration> = None;
    let finish = 'engines: loop {
        attempts += 1;
        let engine = app.engines[engine_index % app.engines.len()].clone();
        let produced = sampled.output_ids.len() as u32;
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
            format!("{}-{}-{attempts}", session.execution, session.calls())
        };
        let engine_request = EngineRequest {
            rid: rid.clone(),
            input_ids,
            input_ids_json: Some(input_ids_json),
            max_new_tokens: max_new.saturating_sub(produced).max(1),
            temperature: request.sampling.temperature.unwrap_or(1.0) as f32,
            top_p: request.sampling.top_p.unwrap_or(1.0) as f32,
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
                    () = out.closed() => {
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
                        ..
                    })) => {
                        break EngineFailure::Failed {
                            engine: engine.name().to_string(),
                            message: "aborted (role switch or engine pause)".into(),
                        }
                    }
                    Some(Ok(EngineChunk::Finished {
                        kind,
                        policy_version,
                    })) => {
                        sampled.policy_version = PolicyVersion(policy_version);
                        sampled.engine = EngineId(engine_index as u32);
                        break 'engines kind;
                    }
                    Some(Ok(EngineChunk::Tokens { ids, logprobs })) => {
                        if first_token.is_none() {
                            first_token = Some(started.elapsed());
                        }
                        for (id, logprob) in ids.iter().zip(logprobs.iter()) {
                            sampled.output_ids.push(*id);
                            sampled.output_logprobs.push(*logprob);
                            let delta = match text_stream.push(*id) {
                                Ok(delta) => delta,
                                Err(error) => {
                                    let _ = out
                                        .send(Piece::Failed(ApiError::new(
                                            api,
                                            ApiErrorKind::Internal,
                                            format!("detokenizing the engine's output: {error}"),
                                        )))
                                        .await;
                                    return;
                                }
                            };
                            if let Some(delta) = delta {
                                sampled.output_text.push_str(&delta);
                                let events = parser.push(&delta);
                                if events
                                    .iter()
                                    .any(|event| matches!(event, OutputEvent::ReasoningDelta(_)))
                                {
                                    reasoning_tokens += 1;
                                }
                                let frames = emit(
                                    &app,
                                    &execution,
                                    api,
                                    &mut builder,
                                    events,
                                    &mut reasoning_text,
                                    &mut tool_calls,
                                    &mut output_ids,
                                    &sampled.output_ids,
                                );
                                if !send_frames(frames).await {
                                    let _ = engine.abort(&rid).await;
                                    app.metrics.harness_gone();
                                    return;
                                }
                            }
                            sampled.output_ends.push(sampled.output_text.len() as u32);
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
                sampled.policy_version,
                requested_at,
                EventDuration(started.elapsed().as_nanos() as u64),
            );
            let committed = match aborted {
                Ok(record) => app
                    .sink
                    .commit(Event::new(
                        wall_clock(),
                        EventBody::ModelCall(Box::new(record)),
                    ))
                    .await
                    .map_err(|error| error.to_string()),
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
        if !failure.is_retryable() || attempts >= app.config.engine_attempts_max.max(1) {
            let _ = out
                .send(Piece::Failed(ApiError::new(
                    api,
                    ApiErrorKind::Overloaded,
                    format!("no engine could finish the call after {attempts} attempts: {failure}"),
                )))
                .await;
            return;
        }
        engine_index = (engine_index + 1) % app.engines.len();
        {
            execution.lock().engine = engine_index;
        }
    };
    let finish = match finish {
        FinishKind::Stop => EngineFinish::EndOfTurn,
        FinishKind::Length => EngineFinish::Length,
        FinishKind::Abort => EngineFinish::Length,
    };
    let events = parser.finish();
    let frames = emit(
        &app,
        &execution,
        api,
        &mut builder,
        events,
        &mut reasoning_text,
        &mut tool_calls,
        &mut output_ids,
        &sampled.output_ids,
    );
    if !send_frames(frames).await {
        app.metrics.harness_gone();
        return;
    }
    let stop = StopReason::from_finish(&finish, tool_calls > 0);
    let usage = Usage {
        input_tokens: prepared.context_ids.len() as u64,
        cached_input_tokens: prepared.tree_reused,
        output_tokens: sampled.output_ids.len() as u64,
        reasoning_tokens,
    };
    sampled.first_token_after = EventDuration(first_token.unwrap_or_default().as_nanos() as u64);
    sampled.completed_after = EventDuration(started.elapsed().as_nanos() as u64);
    app.metrics
        .stage(Stage::Engine, started.elapsed().as_secs_f64());
    let encoded = prepared.encoded as u64;
    let reused = prepared.reused_by_text as u64;
    // Record, then commit, then release the end of the answer.
    let finished = execution.lock().finish_call(prepared, sampled);
    let record = match finished {
        Ok(record) => record,
        Err(error) => {
            let _ = out
                .send(Piece::Failed(ApiError::new(
                    api,
                    ApiErrorKind::Internal,
                    format!("recording the call: {error}"),
                )))
                .await;
            return;
        }
    };
    let commit_started = Instant::now();
    let committed = app
        .sink
        .commit(Event::new(
            wall_clock(),
            EventBody::ModelCall(Box::new(record)),
        ))
        .await;
    app.metrics
        .commit_seconds(commit_started.elapsed().as_secs_f64());
    if let Err(error) = committed {
        tracing::error!(%error, "a TITO record was not committed; the call fails");
        let _ = out
            .send(Piece::Failed(ApiError::new(
                api,
                ApiErrorKind::Overloaded,
                format!("the call's record could not be committed: {error}"),
            )))
            .await;
        return;
    }
    app.metrics
        .recorded(encoded, reused, started.elapsed().as_secs_f64());
    if streaming {
        let _ = send_frames(builder.finish(&stop, &usage)).await;
    } else {
        let _ = out.send(Piece::Body(builder.body(&stop, &usage))).await;
    }
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
    tool_calls: &mut usize,
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
            }
            OutputEvent::TextDelta(text) => {
                frames.extend(builder.push(StreamItem::TextDelta(&text)));
            }
            OutputEvent::ToolCall { name, arguments } => {
                let id = output_ids.next_tool_call(api, sampled_so_far);
                execution.lock().remember_tool_call(&id, &arguments);
                *tool_calls += 1;
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
