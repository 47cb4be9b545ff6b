//! The fake vLLM server: `POST /inference/v1/generate` (token-in/token-out, streaming deltas
//! or not), `POST /abort_requests` and `GET /health`, as vLLM's `ServingTokens` and its
//! `--tokens-only` router serve them.
//!
//! Faithful details: the request id becomes `generate-tokens-<request_id>` (echoed in every
//! event and the id `/abort_requests` takes); `logprobs.content` entries name tokens as
//! `token_id:<id>`, log-probs clamped at -9999; an event carries the `finish_reason` of its
//! last token, and outputs with no new tokens are not sent at all, so an aborted request
//! usually ends with just `data: [DONE]`. If the backing engine fails mid-stream the
//! connection is dropped.

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

use super::sglang::{agent_from, status_for};
use super::{
    error_response, json_response, number_field, parse_object, parse_object_with_ids, sse_response,
    start_generation, ConnectionKill, Shared, SseSender,
};
use crate::engine::vllm::REQUEST_ID_PREFIX;
use crate::engine::{collect, ChunkStream, EngineChunk, EngineRequest, FinishKind, JsonConstraint};

pub(crate) fn router() -> Router<Arc<Shared>> {
    Router::new()
        .route("/inference/v1/generate", post(generate))
        .route("/abort_requests", post(abort_requests))
        .route("/health", get(health))
}

struct Generate {
    /// `generate-tokens-<request_id>`; also the backing engine's rid.
    request: EngineRequest,
    /// `sampling_params.logprobs` was given (0 = the sampled token only).
    logprobs: bool,
    stream: bool,
}

fn parse_generate(shared: &Shared, body: &[u8], headers: &HeaderMap) -> Result<Generate, String> {
    let (object, ids) = parse_object_with_ids(body, "token_ids")?;
    let token_ids: Vec<u32> = ids.ok_or_else(|| "token_ids: Field required".to_string())?;
    let request_id = match object.get("request_id") {
        None | Some(Value::Null) => shared.mint_id("fake-"),
        Some(Value::String(id)) => id.clone(),
        Some(other) => return Err(format!("request_id: expected a string, got {other}")),
    };
    let Some(Value::Object(sampling)) = object.get("sampling_params") else {
        return Err("sampling_params: Field required (an object)".into());
    };
    let field = |error: String| format!("sampling_params.{error}");
    let mut request = EngineRequest::new(
        format!("{REQUEST_ID_PREFIX}{request_id}"),
        token_ids,
        number_field(sampling, "max_tokens")
            .map_err(field)?
            .unwrap_or(65_536),
    );
    request.temperature = number_field(sampling, "temperature")
        .map_err(field)?
        .unwrap_or(1.0);
    request.top_p = number_field(sampling, "top_p")
        .map_err(field)?
        .unwrap_or(1.0);
    request.top_k = number_field(sampling, "top_k").map_err(field)?;
    request.stop_token_ids = number_field(sampling, "stop_token_ids")
        .map_err(field)?
        .unwrap_or_default();
    request.seed = number_field(sampling, "seed").map_err(field)?;
    request.json = structured_outputs(sampling.get("structured_outputs"))
        .map_err(|error| format!("sampling_params.structured_outputs{error}"))?;
    request.agent = agent_from(headers);
    let logprobs = number_field::<u32>(sampling, "logprobs")
        .map_err(field)?
        .is_some();
    let stream = number_field::<bool>(&object, "stream")?.unwrap_or(false);
    Ok(Generate {
        request,
        logprobs,
        stream,
    })
}

/// `StructuredOutputsParams`: exactly one constraint; this fake serves `json` (a schema as
/// an object or as JSON text) and `json_object`, the kinds a Gyre adapter sends.
fn structured_outputs(value: Option<&Value>) -> Result<Option<JsonConstraint>, String> {
    let params = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(params)) => params,
        Some(other) => return Err(format!(": expected an object, got {other}")),
    };
    let given: Vec<(&String, &Value)> = params
        .iter()
        .filter(|(_, value)| !matches!(value, Value::Null | Value::Bool(false)))
        .collect();
    let [(kind, value)] = given.as_slice() else {
        return Err(": give exactly one structured outputs constraint".into());
    };
    match (kind.as_str(), value) {
        ("json", Value::Object(_)) => Ok(Some(JsonConstraint::Schema(value.to_string().into()))),
        ("json", Value::String(text)) => match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(_)) => Ok(Some(JsonConstraint::Schema(text.as_str().into()))),
            _ => Err(".json: not a JSON Schema object".into()),
        },
        ("json", other) => Err(format!(
            ".json: expected an object or a string, got {other}"
        )),
        ("json_object", Value::Bool(true)) => Ok(Some(JsonConstraint::Object)),
        (other, _) => Err(format!(
            ".{other}: this fake serves json and json_object only"
        )),
    }
}

#[derive(Serialize)]
struct Event<'a> {
    request_id: &'a str,
    choices: [Choice<'a>; 1],
}

#[derive(Serialize)]
struct Choice<'a> {
    index: u32,
    logprobs: Option<Logprobs>,
    finish_reason: Option<&'static str>,
    token_ids: &'a [u32],
}

#[derive(Serialize)]
struct Logprobs {
    content: Vec<Content>,
}

#[derive(Serialize)]
struct Content {
    token: String,
    logprob: f32,
    bytes: Option<Vec<u8>>,
    top_logprobs: Vec<TopLogprob>,
}

#[derive(Serialize)]
struct TopLogprob {
    token: String,
    logprob: f32,
    bytes: Option<Vec<u8>>,
}

fn event(generate: &Generate, ids: &[u32], logprobs: &[f32], finish: Option<FinishKind>) -> String {
    let content = generate.logprobs.then(|| Logprobs {
        content: ids
            .iter()
            .zip(logprobs)
            .map(|(&id, &logprob)| {
                let logprob = logprob.max(-9999.0);
                Content {
                    token: format!("token_id:{id}"),
                    logprob,
                    bytes: None,
                    top_logprobs: vec![TopLogprob {
                        token: format!("token_id:{id}"),
                        logprob,
                        bytes: None,
                    }],
                }
            })
            .collect(),
    });
    let event = Event {
        request_id: &generate.request.rid,
        choices: [Choice {
            index: 0,
            logprobs: content,
            finish_reason: finish.map(FinishKind::as_str),
            token_ids: ids,
        }],
    };
    serde_json::to_string(&event).expect("serialising numbers and strings cannot fail")
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
        let Some(Ok((kind, _))) = collected.end else {
            let message = collected
                .failure()
                .map_or_else(|| "the engine stopped".to_string(), ToString::to_string);
            return error_response(500, message);
        };
        let mut body: Value = serde_json::from_str(&event(
            &generate,
            &collected.ids,
            &collected.logprobs,
            Some(kind),
        ))
        .expect("the event just serialised is JSON");
        body["prompt_logprobs"] = Value::Null;
        body["kv_transfer_params"] = Value::Null;
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
    if cut_after == Some(0) {
        shared.count_cut();
        sender.cut().await;
        return;
    }
    let mut streamed = 0usize;
    // vLLM puts the finish reason on the event of the last token, so one chunk is held back
    // until the next item says whether it was the last.
    let mut held: Option<(Vec<u32>, Vec<f32>)> = None;
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
                    let room = limit.saturating_sub(streamed);
                    ids.truncate(room);
                    logprobs.truncate(room);
                    streamed + ids.len() >= limit
                });
                streamed += ids.len();
                if let Some((previous_ids, previous_logprobs)) = held.take() {
                    if !sender
                        .data(&event(&generate, &previous_ids, &previous_logprobs, None))
                        .await
                    {
                        return;
                    }
                }
                if cut_now {
                    if !ids.is_empty()
                        && !sender.data(&event(&generate, &ids, &logprobs, None)).await
                    {
                        return;
                    }
                    shared.count_cut();
                    sender.cut().await;
                    return;
                }
                held = Some((ids, logprobs));
            }
            Some(Ok(EngineChunk::Finished { kind, .. })) => {
                if let Some((ids, logprobs)) = held.take() {
                    // An abort's final output has no new tokens and is never sent.
                    let finish = (kind != FinishKind::Abort).then_some(kind);
                    if !sender
                        .data(&event(&generate, &ids, &logprobs, finish))
                        .await
                    {
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
}

async fn abort_requests(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    shared.count_abort();
    let object = match parse_object(&body) {
        Ok(object) => object,
        Err(message) => return json_response(400, &json!({ "detail": message })),
    };
    let Some(Value::Array(ids)) = object.get("request_ids") else {
        return json_response(
            400,
            &json!({ "detail": "Missing 'request_ids' in request body" }),
        );
    };
    for id in ids.iter().filter_map(Value::as_str) {
        if let Err(failure) = shared.engine.abort(id).await {
            return error_response(status_for(&failure), failure.to_string());
        }
    }
    Response::new(axum::body::Body::empty())
}

async fn health(State(shared): State<Arc<Shared>>) -> Response {
    shared.count_health();
    match shared.engine.health().await {
        Ok(()) => Response::new(axum::body::Body::empty()),
        Err(failure) => error_response(503, failure.to_string()),
    }
}
