//! The fake SGLang server: `POST /generate` (`input_ids` only; streaming with cumulative
//! events by default, or not streaming), `POST /abort_request`, `GET /health` and
//! `GET /health_generate`, as SGLang's `http_server.py` serves them.
//!
//! A streamed request answers one event per chunk of the backing engine, then a final event
//! with `meta_info.finish_reason` (`{"type": "stop", "matched": <id>}`, `{"type": "length",
//! "length": <n>}` or `{"type": "abort", "message": …}`), then `data: [DONE]`. If the backing
//! engine fails mid-stream the connection is dropped, as when SGLang's process dies.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::{get, post};
use axum::Extension;
use axum::Router;
use serde::Serialize;
use serde_json::{json, Value};

use super::{
    error_response, json_response, number_field, parse_object, parse_object_with_ids, sse_response,
    start_generation, ConnectionKill, Shared, SseSender,
};
use crate::engine::{
    collect, ChunkStream, EngineChunk, EngineFailure, EngineRequest, FinishKind, JsonConstraint,
    AGENT_HEADER,
};

pub(crate) fn router() -> Router<Arc<Shared>> {
    Router::new()
        .route("/generate", post(generate))
        .route("/abort_request", post(abort_request))
        .route("/health", get(health))
        .route("/health_generate", get(health))
}

/// A parsed `/generate` body.
struct Generate {
    request: EngineRequest,
    return_logprob: bool,
    stream: bool,
}

fn parse_generate(shared: &Shared, body: &[u8], headers: &HeaderMap) -> Result<Generate, String> {
    let (object, ids) = parse_object_with_ids(body, "input_ids")?;
    if object.contains_key("text") || object.contains_key("input_embeds") {
        return Err("this fake serves input_ids only".into());
    }
    let input_ids: Vec<u32> = ids
        .ok_or_else(|| "Either text, input_ids or input_embeds should be provided.".to_string())?;
    let rid = match object.get("rid") {
        None | Some(Value::Null) => shared.mint_id("fake-rid-"),
        Some(Value::String(rid)) => rid.clone(),
        Some(other) => return Err(format!("rid: expected a string, got {other}")),
    };
    let empty = serde_json::Map::new();
    let sampling = match object.get("sampling_params") {
        None | Some(Value::Null) => &empty,
        Some(Value::Object(sampling)) => sampling,
        Some(other) => return Err(format!("sampling_params: expected an object, got {other}")),
    };
    let field = |name: &str| format!("sampling_params.{name}");
    let mut request = EngineRequest::new(
        rid,
        input_ids,
        number_field(sampling, "max_new_tokens")
            .map_err(|e| field(&e))?
            .unwrap_or(128),
    );
    request.temperature = number_field(sampling, "temperature")
        .map_err(|e| field(&e))?
        .unwrap_or(1.0);
    request.top_p = number_field(sampling, "top_p")
        .map_err(|e| field(&e))?
        .unwrap_or(1.0);
    request.top_k = number_field(sampling, "top_k").map_err(|e| field(&e))?;
    request.stop_token_ids = number_field(sampling, "stop_token_ids")
        .map_err(|e| field(&e))?
        .unwrap_or_default();
    request.seed = number_field(sampling, "sampling_seed").map_err(|e| field(&e))?;
    request.json = match sampling.get("json_schema") {
        None | Some(Value::Null) => None,
        Some(Value::String(schema)) => {
            // SGLang compiles the schema before it accepts the request.
            match serde_json::from_str::<Value>(schema) {
                Ok(Value::Object(_)) => {}
                _ => return Err(field("json_schema: not a JSON Schema object")),
            }
            Some(JsonConstraint::Schema(schema.as_str().into()))
        }
        Some(other) => {
            return Err(field(&format!(
                "json_schema: expected a string, got {other}"
            )))
        }
    };
    request.agent = agent_from(headers);
    let flag = |name: &str| -> Result<bool, String> {
        Ok(number_field::<bool>(&object, name)?.unwrap_or(false))
    };
    request.reasoning_first = flag("require_reasoning")?;
    Ok(Generate {
        request,
        return_logprob: flag("return_logprob")?,
        stream: flag("stream")?,
    })
}

/// The agent a Gyre adapter named in its request header, if any.
pub(crate) fn agent_from(headers: &HeaderMap) -> Option<String> {
    headers
        .get(AGENT_HEADER)
        .and_then(|value| value.to_str().ok())
        .map(str::to_string)
}

/// The status a fake answers when its backing engine refuses a request.
pub(crate) fn status_for(failure: &EngineFailure) -> u16 {
    match failure {
        EngineFailure::Rejected { .. } => 400,
        EngineFailure::Status { code, .. } => *code,
        _ => 503,
    }
}

#[derive(Serialize)]
struct Event<'a> {
    text: String,
    output_ids: &'a [u32],
    meta_info: MetaInfo<'a>,
}

#[derive(Serialize)]
struct MetaInfo<'a> {
    id: &'a str,
    finish_reason: Value,
    prompt_tokens: usize,
    completion_tokens: usize,
    cached_tokens: usize,
    weight_version: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    output_token_logprobs: Option<Vec<(f32, u32, Option<()>)>>,
}

/// Everything generated so far for one request, and how to write an event of it.
struct Progress<'a> {
    shared: &'a Shared,
    generate: &'a Generate,
    ids: Vec<u32>,
    logprobs: Vec<f32>,
}

impl Progress<'_> {
    /// The event for ids `from..` (cumulative: `from` is 0) and an optional finish.
    fn event(&self, from: usize, finish: Option<(FinishKind, u64)>) -> String {
        let ids = &self.ids[from..];
        let text = match &self.shared.options.chat {
            Some(chat) => chat.model.decode(ids).unwrap_or_default(),
            None => String::new(),
        };
        let finish_reason = match finish {
            None => Value::Null,
            Some((FinishKind::Stop, _)) => {
                json!({ "type": "stop", "matched": self.ids.last().copied() })
            }
            Some((FinishKind::Length, _)) => json!({ "type": "length", "length": self.ids.len() }),
            Some((FinishKind::Abort, _)) => {
                json!({ "type": "abort", "message": "Abort request by the client" })
            }
        };
        let weight_version = match (&self.shared.options.weight_version, finish) {
            (Some(version), _) => version.clone(),
            (None, Some((_, policy_version))) => policy_version.to_string(),
            (None, None) => "default".into(),
        };
        let output_token_logprobs = self.generate.return_logprob.then(|| {
            ids.iter()
                .zip(&self.logprobs[from..])
                .map(|(&id, &logprob)| (logprob, id, None))
                .collect()
        });
        let event = Event {
            text,
            output_ids: ids,
            meta_info: MetaInfo {
                id: &self.generate.request.rid,
                finish_reason,
                prompt_tokens: self.generate.request.input_ids.len(),
                completion_tokens: self.ids.len(),
                cached_tokens: 0,
                weight_version,
                output_token_logprobs,
            },
        };
        serde_json::to_string(&event).expect("serialising numbers and strings cannot fail")
    }
}

async fn generate(
    State(shared): State<Arc<Shared>>,
    Extension(connection): Extension<ConnectionKill>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    shared.count_generate();
    let generate = match parse_generate(&shared, &body, &headers) {
        Ok(generate) => generate,
        Err(message) => return error_response(400, message),
    };
    let (stream, cut_after) =
        match start_generation(&shared, connection.clone(), &generate.request).await {
            Ok(started) => started,
            Err(response) => return response,
        };
    if !generate.stream {
        let collected = collect(stream).await;
        let Some(Ok((kind, policy_version))) = collected.end else {
            let message = collected
                .failure()
                .map_or_else(|| "the engine stopped".to_string(), ToString::to_string);
            return error_response(500, message);
        };
        let progress = Progress {
            shared: &shared,
            generate: &generate,
            ids: collected.ids,
            logprobs: collected.logprobs,
        };
        let body: Value = serde_json::from_str(&progress.event(0, Some((kind, policy_version))))
            .expect("the event just serialised is JSON");
        return json_response(200, &body);
    }
    let (sender, response) = sse_response(connection);
    // Owned by the response body: it ends when the stream ends or the client goes away.
    tokio::spawn(relay(shared, generate, stream, sender, cut_after));
    response
}

async fn relay(
    shared: Arc<Shared>,
    generate: Generate,
    mut stream: ChunkStream,
    sender: SseSender,
    cut_after: Option<usize>,
) {
    let incremental = shared.options.incremental_streaming_output;
    let mut progress = Progress {
        shared: &shared,
        generate: &generate,
        ids: Vec::new(),
        logprobs: Vec::new(),
    };
    if cut_after == Some(0) {
        shared.count_cut();
        sender.cut().await;
        return;
    }
    loop {
        let item = tokio::select! {
            _ = sender.closed() => return,
            item = stream.recv() => item,
        };
        match item {
            Some(Ok(EngineChunk::Tokens {
                mut ids,
                mut logprobs,
            })) => {
                let cut_now = cut_after.is_some_and(|limit| {
                    let room = limit.saturating_sub(progress.ids.len());
                    ids.truncate(room);
                    logprobs.truncate(room);
                    progress.ids.len() + ids.len() >= limit
                });
                let from = progress.ids.len();
                progress.ids.extend_from_slice(&ids);
                progress.logprobs.extend_from_slice(&logprobs);
                if !ids.is_empty() {
                    let event = progress.event(if incremental { from } else { 0 }, None);
                    if !sender.data(&event).await {
                        return;
                    }
                }
                if cut_now {
                    shared.count_cut();
                    sender.cut().await;
                    return;
                }
            }
            Some(Ok(EngineChunk::Finished {
                kind,
                policy_version,
            })) => {
                let from = if incremental { progress.ids.len() } else { 0 };
                let event = progress.event(from, Some((kind, policy_version)));
                if sender.data(&event).await {
                    sender.data("[DONE]").await;
                }
                return;
            }
            // The backing engine died: so does this stream.
            Some(Err(_)) | None => {
                sender.cut().await;
                return;
            }
        }
    }
}

async fn abort_request(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    shared.count_abort();
    let object = match parse_object(&body) {
        Ok(object) => object,
        Err(message) => return error_response(400, message),
    };
    if let Some(Value::String(rid)) = object.get("rid") {
        if let Err(failure) = shared.engine.abort(rid).await {
            return error_response(status_for(&failure), failure.to_string());
        }
    }
    json_response(200, &json!({}))
}

async fn health(State(shared): State<Arc<Shared>>) -> Response {
    shared.count_health();
    match shared.engine.health().await {
        Ok(()) => json_response(200, &json!({})),
        Err(failure) => error_response(503, failure.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_map_to_statuses() {
        let engine = "e".to_string();
        let rejected = EngineFailure::Rejected {
            engine: engine.clone(),
            message: "m".into(),
        };
        assert_eq!(status_for(&rejected), 400);
        let gone = EngineFailure::Unreachable {
            engine,
            message: "m".into(),
        };
        assert_eq!(status_for(&gone), 503);
    }
}
