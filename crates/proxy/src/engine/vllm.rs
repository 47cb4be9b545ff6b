//! The vLLM adapter: the token-in/token-out `POST /inference/v1/generate` (vLLM's
//! `ServingTokens`, `vllm/entrypoints/serve/disagg/`), streaming.
//!
//! Request: `{request_id, token_ids, sampling_params: {max_tokens, temperature, top_p, top_k?,
//! logprobs: 0, stop_token_ids, skip_special_tokens: false, seed?, structured_outputs?},
//! stream: true}`; `structured_outputs` is `{"json": <schema>}` or `{"json_object": true}`. `logprobs:
//! 0` asks for the sampled token's log-prob only. The stream is SSE `data: {…}` events ending
//! with `data: [DONE]`, each a **delta** (`RequestOutputKind.DELTA`): `{request_id, choices:
//! [{index, token_ids, logprobs: {content: [{token: "token_id:<id>", logprob, top_logprobs}]},
//! finish_reason}]}`; `finish_reason` is `null` until the last event, then `"stop"`,
//! `"length"` or `"abort"` (`"error"` and an in-band `{"error": {…}}` event are
//! [`EngineFailure::Failed`]). vLLM echoes the request id as `generate-tokens-<request_id>`;
//! that is the id its engine knows, so aborts use it.
//!
//! Abort: `POST /abort_requests {"request_ids": [<engine id>]}` (served when vLLM runs with
//! `--tokens-only`). vLLM skips events with no new tokens, so an aborted request's final
//! `finish_reason: "abort"` often never arrives and the stream just ends with `[DONE]`: the
//! adapter reports `[DONE]` without a finish as [`FinishKind::Abort`] (a pause with
//! `mode=abort` ends streams the same way). Health: `GET /health`.
//!
//! vLLM reports no weight version in the stream; `Finished.policy_version` is what
//! [`VllmEngine::set_policy_version`] was last told (the runtime that loads weights knows).
//!
//! Unverified against a running server (no GPU here): the endpoint's availability per release
//! (documented from v0.11.2), the `generate-tokens-` prefix in older releases (the adapter
//! aborts with the id the stream echoed, and before the first event with the prefixed form),
//! and whether the stop token is always in `token_ids` (vLLM keeps stop ids in token output,
//! trimming only text).

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use hyper::Method;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::http::{
    mark_aborted, spawn_stream, EventParser, HttpEngine, HttpEngineConfig, InFlightEntry,
    ParseProblem, Parsed, Registration,
};
use super::{BoxFuture, ChunkStream, EngineFailure, EngineRequest, FinishKind, TokenEngine};

/// The prefix vLLM puts before the caller's `request_id`.
pub const REQUEST_ID_PREFIX: &str = "generate-tokens-";

/// Settings of a [`VllmEngine`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VllmConfig {
    pub http: HttpEngineConfig,
}

/// A handle to one vLLM server.
#[derive(Clone)]
pub struct VllmEngine {
    engine: Arc<HttpEngine>,
    policy_version: Arc<AtomicU64>,
}

impl VllmEngine {
    /// `address` is `host:port` or `http://host:port[/prefix]`; nothing is contacted yet.
    pub fn new(address: &str, config: VllmConfig) -> Result<Self, EngineFailure> {
        Ok(Self {
            engine: Arc::new(HttpEngine::new("vllm", address, config.http)?),
            policy_version: Arc::new(AtomicU64::new(0)),
        })
    }

    /// The policy version reported when streams finish from now on.
    pub fn set_policy_version(&self, version: u64) {
        self.policy_version.store(version, Ordering::SeqCst);
    }

    /// Requests streaming now.
    pub fn in_flight_count(&self) -> usize {
        self.engine.in_flight.count()
    }
}

#[derive(Serialize)]
struct GenerateBody<'a> {
    request_id: &'a str,
    sampling_params: SamplingParams<'a>,
    stream: bool,
}

#[derive(Serialize)]
struct SamplingParams<'a> {
    max_tokens: u32,
    temperature: f32,
    top_p: f32,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_k: Option<u32>,
    /// 0 top alternatives: only the sampled token's log-prob.
    logprobs: u32,
    stop_token_ids: &'a [u32],
    skip_special_tokens: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    seed: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    structured_outputs: Option<StructuredOutputs>,
}

/// vLLM's `StructuredOutputsParams`: a schema (as a JSON object) or any JSON object.
#[derive(Serialize)]
struct StructuredOutputs {
    #[serde(skip_serializing_if = "Option::is_none")]
    json: Option<Box<RawValue>>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    json_object: bool,
}

impl StructuredOutputs {
    fn of(constraint: &super::JsonConstraint) -> Self {
        match constraint {
            super::JsonConstraint::Object => StructuredOutputs {
                json: None,
                json_object: true,
            },
            super::JsonConstraint::Schema(schema) => StructuredOutputs {
                // The proxy wrote the schema as JSON text; a text that is not JSON (from a
                // caller outside the proxy) goes as a string, for vLLM to refuse by name.
                json: Some(
                    RawValue::from_string(schema.to_string()).unwrap_or_else(|_| {
                        RawValue::from_string(
                            serde_json::to_string(&**schema).expect("a string serializes"),
                        )
                        .expect("a JSON string is JSON")
                    }),
                ),
                json_object: false,
            },
        }
    }
}

fn generate_body(request: &EngineRequest) -> super::PiecesBody {
    super::json_body_with_ids(
        "token_ids",
        request,
        &GenerateBody {
            request_id: &request.rid,
            sampling_params: SamplingParams {
                max_tokens: request.max_new_tokens,
                temperature: request.temperature,
                top_p: request.top_p,
                top_k: request.top_k,
                logprobs: 0,
                stop_token_ids: &request.stop_token_ids,
                skip_special_tokens: false,
                seed: request.seed,
                structured_outputs: request.json.as_ref().map(StructuredOutputs::of),
            },
            stream: true,
        },
    )
}

/// The id vLLM's engine knows for `rid`: the one its stream echoed, else the prefixed form.
fn engine_request_id(entry: Option<&InFlightEntry>, rid: &str) -> String {
    entry
        .and_then(|entry| {
            entry
                .engine_request_id
                .lock()
                .expect("engine request id is never poisoned")
                .clone()
        })
        .unwrap_or_else(|| format!("{REQUEST_ID_PREFIX}{rid}"))
}

async fn abort_on_engine(
    engine: &HttpEngine,
    engine_request_id: String,
) -> Result<(), EngineFailure> {
    let body = serde_json::json!({ "request_ids": [engine_request_id] })
        .to_string()
        .into_bytes();
    engine
        .call(Method::POST, "/abort_requests", Some(body.into()))
        .await
}

impl TokenEngine for VllmEngine {
    fn name(&self) -> &str {
        &self.engine.name
    }

    fn constrains_output(&self) -> bool {
        true
    }

    fn generate(
        &self,
        request: EngineRequest,
    ) -> BoxFuture<'static, Result<ChunkStream, EngineFailure>> {
        let engine = Arc::clone(&self.engine);
        let policy_version = Arc::clone(&self.policy_version);
        Box::pin(async move {
            if request.input_ids.is_empty() {
                return Err(EngineFailure::Rejected {
                    engine: engine.name.clone(),
                    message: "token_ids is empty".into(),
                });
            }
            let registration = Registration::new(&engine, &request.rid)?;
            let parser = VllmParser {
                entry: Arc::clone(registration.entry()),
                policy_version,
            };
            let body = generate_body(&request);
            let response = engine
                .send(
                    Method::POST,
                    "/inference/v1/generate",
                    Some(body),
                    true,
                    request.agent.as_deref(),
                )
                .await?;
            let rid = request.rid;
            Ok(spawn_stream(
                Arc::clone(&engine),
                registration,
                response.into_body(),
                parser,
                move |engine, entry| {
                    Box::pin(async move {
                        let id = engine_request_id(Some(&entry), &rid);
                        if let Err(error) = abort_on_engine(&engine, id).await {
                            tracing::debug!(%error, rid, "abort after an abandoned stream failed");
                        }
                    })
                },
            ))
        })
    }

    fn abort(&self, rid: &str) -> BoxFuture<'static, Result<(), EngineFailure>> {
        let engine = Arc::clone(&self.engine);
        let rid = rid.to_string();
        Box::pin(async move {
            let entry = mark_aborted(&engine.in_flight, &rid);
            let id = engine_request_id(entry.as_deref(), &rid);
            abort_on_engine(&engine, id).await
        })
    }

    fn health(&self) -> BoxFuture<'static, Result<(), EngineFailure>> {
        let engine = Arc::clone(&self.engine);
        Box::pin(async move { engine.call(Method::GET, "/health", None).await })
    }
}

#[derive(Deserialize)]
struct Event<'a> {
    #[serde(borrow, default)]
    request_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    choices: Option<&'a RawValue>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
    /// Older vLLM error events are flat: `{"object": "error", "message": …}`.
    #[serde(borrow, default)]
    object: Option<Cow<'a, str>>,
    #[serde(default)]
    message: Option<String>,
}

#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(borrow, default)]
    token_ids: Option<&'a RawValue>,
    #[serde(borrow, default)]
    logprobs: Option<&'a RawValue>,
    #[serde(borrow, default)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct Logprobs<'a> {
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct ContentEntry<'a> {
    #[serde(borrow, default)]
    token: Option<Cow<'a, str>>,
    logprob: f64,
}

#[derive(Deserialize)]
struct ErrorBody {
    #[serde(default)]
    message: Option<String>,
}

fn field<'a, T: Deserialize<'a>>(raw: Option<&'a RawValue>, path: &str) -> Result<T, ParseProblem> {
    let raw = raw.ok_or_else(|| ParseProblem::Protocol(format!("{path}: missing")))?;
    serde_json::from_str(raw.get())
        .map_err(|error| ParseProblem::Protocol(format!("{path}: {error}")))
}

/// vLLM delta events → chunks.
pub(crate) struct VllmParser {
    entry: Arc<InFlightEntry>,
    policy_version: Arc<AtomicU64>,
}

impl EventParser for VllmParser {
    fn event(&mut self, data: &[u8]) -> Result<Parsed, ParseProblem> {
        if data.trim_ascii_start().first() != Some(&b'{') {
            return Err(ParseProblem::Protocol("event: not a JSON object".into()));
        }
        let event: Event<'_> = serde_json::from_slice(data).map_err(|error| {
            ParseProblem::Protocol(format!("event: not a JSON object: {error}"))
        })?;
        if let Some(error) = event.error {
            let message = serde_json::from_str::<ErrorBody>(error.get())
                .ok()
                .and_then(|body| body.message)
                .unwrap_or_else(|| error.get().to_string());
            return Err(ParseProblem::Failed(message));
        }
        if event.object.as_deref() == Some("error") {
            return Err(ParseProblem::Failed(
                event
                    .message
                    .unwrap_or_else(|| "error event without a message".into()),
            ));
        }
        if let Some(id) = event.request_id {
            let mut known = self
                .entry
                .engine_request_id
                .lock()
                .expect("engine request id is never poisoned");
            if known.is_none() {
                *known = Some(id.into_owned());
            }
        }
        let choices: Vec<Choice<'_>> = field(event.choices, "choices")?;
        let choice = match choices.len() {
            // A usage-only event.
            0 => return Ok(Parsed::default()),
            1 => &choices[0],
            count => {
                return Err(ParseProblem::Protocol(format!(
                    "choices: {count} choices, expected 1"
                )))
            }
        };
        let ids: Vec<u32> = match choice.token_ids {
            None => Vec::new(),
            Some(_) => field(choice.token_ids, "choices[0].token_ids")?,
        };
        let logprobs = if ids.is_empty() {
            Vec::new()
        } else {
            let Some(raw) = choice.logprobs.filter(|raw| raw.get() != "null") else {
                return Err(ParseProblem::Protocol(
                    "choices[0].logprobs: missing (the request asked for logprobs: 0)".into(),
                ));
            };
            let logprobs: Logprobs<'_> = field(Some(raw), "choices[0].logprobs")?;
            let content: Vec<ContentEntry<'_>> =
                field(logprobs.content, "choices[0].logprobs.content")?;
            if content.len() != ids.len() {
                return Err(ParseProblem::Protocol(format!(
                    "choices[0].logprobs.content: {} entries for {} token_ids",
                    content.len(),
                    ids.len()
                )));
            }
            for (index, (entry, &id)) in content.iter().zip(&ids).enumerate() {
                let named = entry
                    .token
                    .as_deref()
                    .and_then(|token| token.strip_prefix("token_id:"))
                    .map(str::parse::<u32>);
                match named {
                    Some(Ok(named)) if named != id => {
                        return Err(ParseProblem::Protocol(format!(
                            "choices[0].logprobs.content[{index}].token: token_id:{named} but \
                             token_ids[{index}] is {id}"
                        )))
                    }
                    Some(Err(_)) => {
                        return Err(ParseProblem::Protocol(format!(
                            "choices[0].logprobs.content[{index}].token: not token_id:<integer>"
                        )))
                    }
                    _ => {}
                }
            }
            content.iter().map(|entry| entry.logprob as f32).collect()
        };
        let finish = match choice.finish_reason.as_deref() {
            None => None,
            Some("stop") => Some(FinishKind::Stop),
            Some("length") => Some(FinishKind::Length),
            Some("abort") => Some(FinishKind::Abort),
            Some("error") => {
                return Err(ParseProblem::Failed(
                    "choices[0].finish_reason: error".into(),
                ))
            }
            Some(other) => {
                return Err(ParseProblem::Protocol(format!(
                    "choices[0].finish_reason: unknown value {other:?}"
                )))
            }
        };
        Ok(Parsed {
            ids,
            logprobs,
            finish: finish.map(|kind| (kind, self.policy_version.load(Ordering::SeqCst))),
        })
    }

    fn ended_without_finish(
        &mut self,
        done_marker: bool,
        abort_requested: bool,
    ) -> Result<(FinishKind, u64), ParseProblem> {
        if done_marker || abort_requested {
            return Ok((
                FinishKind::Abort,
                self.policy_version.load(Ordering::SeqCst),
            ));
        }
        Err(ParseProblem::Protocol(
            "choices[0].finish_reason: the stream ended without [DONE] or a finish_reason".into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `top_k` reaches the engine when the request gives it; without it the engine's default
    /// (no top-k cut) stands.
    #[test]
    fn top_k_is_sent_only_when_set() {
        crate::engine::top_k_is_sent_only_when_set(generate_body);
    }
}
