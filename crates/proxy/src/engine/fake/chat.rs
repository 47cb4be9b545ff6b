//! `POST /v1/chat/completions` on the fakes: an OpenAI-compatible front (text only) on the
//! same backing engine, for third-party gateways (LiteLLM, `smg`) that need a plain
//! OpenAI backend. The request is parsed with the crate's Chat Completions parser, rendered
//! with the model's template, encoded, generated with the model's end-of-turn tokens as stop
//! ids, and decoded; tool calls and reasoning are not parsed out (the text is the raw output
//! before the end-of-turn token). Streaming sends `chat.completion.chunk` events and
//! `data: [DONE]`; a backing engine that fails mid-stream drops the connection.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::Extension;
use serde_json::{json, Value};

use super::sglang::{agent_from, status_for};
use super::{error_response, json_response, sse_response, ChatBackend, ConnectionKill, Shared};
use crate::engine::{collect, EngineChunk, EngineRequest, FinishKind};
use crate::template::CivilDateTime;
use crate::{openai_chat, RenderInput};

/// Output budget when the request names none.
const DEFAULT_MAX_TOKENS: u32 = 1024;

fn unix_seconds() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs())
}

fn finish_reason(kind: FinishKind) -> &'static str {
    match kind {
        FinishKind::Length => "length",
        FinishKind::Stop | FinishKind::Abort => "stop",
    }
}

/// The end-of-turn token ids of the backend's output format.
fn end_ids(backend: &ChatBackend) -> Vec<u32> {
    backend
        .format
        .end_of_turn
        .iter()
        .filter_map(|text| backend.model.token_id(text))
        .collect()
}

pub(crate) async fn chat_completions(
    State(shared): State<Arc<Shared>>,
    Extension(connection): Extension<ConnectionKill>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    shared.count_chat();
    let Some(backend) = shared.options.chat.clone() else {
        return error_response(
            404,
            "this fake serves no /v1/chat/completions (no model given)",
        );
    };
    let chat = match openai_chat::parse(&body) {
        Ok(chat) => chat,
        Err(error) => return json_response(error.status(), &error.body_json()),
    };
    let created = unix_seconds();
    let prompt = backend.model.render(&RenderInput {
        messages: &chat.messages,
        tools: &chat.tools,
        add_generation_prompt: true,
        now: CivilDateTime::from_unix_seconds(i64::try_from(created).unwrap_or(0)),
        extra: None,
    });
    let input_ids = match prompt.and_then(|prompt| backend.model.encode(&prompt)) {
        Ok(ids) => ids,
        Err(error) => return error_response(400, error.to_string()),
    };
    let end_ids = end_ids(&backend);
    let id = shared.mint_id("chatcmpl-fake-");
    let mut request = EngineRequest::new(
        id.clone(),
        input_ids,
        chat.sampling.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
    );
    request.temperature = chat.sampling.temperature.unwrap_or(1.0) as f32;
    request.top_p = chat.sampling.top_p.unwrap_or(1.0) as f32;
    request.top_k = chat.sampling.top_k;
    request.stop_token_ids = end_ids.clone();
    request.seed = chat.sampling.seed.and_then(|seed| u64::try_from(seed).ok());
    request.agent = agent_from(&headers);
    let prompt_tokens = request.input_ids.len();
    let mut stream = match shared.engine.generate(request).await {
        Ok(stream) => stream,
        Err(failure) => return error_response(status_for(&failure), failure.to_string()),
    };
    let model_name = chat.model.clone();
    if !chat.stream {
        let collected = collect(stream).await;
        let Some(Ok((kind, _))) = collected.end else {
            let message = collected
                .failure()
                .map_or_else(|| "the engine stopped".to_string(), ToString::to_string);
            return error_response(500, message);
        };
        let text_ids: Vec<u32> = collected
            .ids
            .iter()
            .copied()
            .filter(|id| !end_ids.contains(id))
            .collect();
        let text = backend.model.decode(&text_ids).unwrap_or_default();
        return json_response(
            200,
            &json!({
                "id": id,
                "object": "chat.completion",
                "created": created,
                "model": model_name,
                "choices": [{
                    "index": 0,
                    "message": { "role": "assistant", "content": text },
                    "logprobs": null,
                    "finish_reason": finish_reason(kind),
                }],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": collected.ids.len(),
                    "total_tokens": prompt_tokens + collected.ids.len(),
                },
            }),
        );
    }
    let include_usage = chat.stream_include_usage;
    let (sender, response) = sse_response(connection);
    // Owned by the response body: it ends when the stream ends or the client goes away.
    tokio::spawn(async move {
        let chunk = |delta: Value, finish: Option<&str>| {
            json!({
                "id": id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model_name,
                "choices": [{ "index": 0, "delta": delta, "logprobs": null, "finish_reason": finish }],
            })
            .to_string()
        };
        if !sender
            .data(&chunk(json!({ "role": "assistant", "content": "" }), None))
            .await
        {
            return;
        }
        let mut text_stream = backend.model.text_stream();
        let mut completion_tokens = 0usize;
        loop {
            let item = tokio::select! {
                _ = sender.closed() => return,
                item = stream.recv() => item,
            };
            match item {
                Some(Ok(EngineChunk::Tokens { ids, .. })) => {
                    completion_tokens += ids.len();
                    let mut text = String::new();
                    for id in ids.into_iter().filter(|id| !end_ids.contains(id)) {
                        if let Ok(Some(piece)) = text_stream.push(id) {
                            text.push_str(&piece);
                        }
                    }
                    if !text.is_empty()
                        && !sender.data(&chunk(json!({ "content": text }), None)).await
                    {
                        return;
                    }
                }
                Some(Ok(EngineChunk::Finished { kind, .. })) => {
                    if !sender
                        .data(&chunk(json!({}), Some(finish_reason(kind))))
                        .await
                    {
                        return;
                    }
                    if include_usage {
                        let usage = json!({
                            "id": id,
                            "object": "chat.completion.chunk",
                            "created": created,
                            "model": model_name,
                            "choices": [],
                            "usage": {
                                "prompt_tokens": prompt_tokens,
                                "completion_tokens": completion_tokens,
                                "total_tokens": prompt_tokens + completion_tokens,
                            },
                        });
                        if !sender.data(&usage.to_string()).await {
                            return;
                        }
                    }
                    sender.data("[DONE]").await;
                    return;
                }
                Some(Err(_)) | None => {
                    sender.cut().await;
                    return;
                }
            }
        }
    });
    response
}
