//! The SGLang adapter: native `POST /generate` with `input_ids`, streaming.
//!
//! Request: `{rid, input_ids, sampling_params: {max_new_tokens, temperature, top_p, top_k?,
//! stop_token_ids, no_stop_trim: true, skip_special_tokens: false, sampling_seed?,
//! json_schema?}, return_logprob: true, stream: true, require_reasoning?}`; `json_schema`
//! (structured outputs) is the schema as JSON text, as SGLang takes it, and `require_reasoning`
//! (sent with it for a model that reasons) starts the grammar after the reasoning. The stream is SSE `data: {…}` events ending with
//! `data: [DONE]`; each event carries `output_ids` and `meta_info.output_token_logprobs`
//! (`[[logprob, id, text|null], …]`), **cumulative** unless the server runs with
//! `--incremental-streaming-output` ([`SglangConfig::incremental_streaming_output`]); the
//! adapter turns them into deltas and checks that the ids in both fields agree and that a
//! cumulative stream only grows. `meta_info.finish_reason` is `null` until the end, then
//! `{"type": "stop" | "length" | "abort", …}`; `meta_info.weight_version` (a string, `"default"`
//! unless set) becomes the policy version when it is an integer, else 0. An in-band
//! `{"error": {"message": …}}` event is [`EngineFailure::Failed`].
//!
//! Abort: `POST /abort_request {"rid": …}`; SGLang ends the stream with `finish_reason.type:
//! "abort"` after the tokens so far. Health: `GET /health`.
//!
//! Unverified against a running server (no GPU here): `sampling_seed` (recent SGLang versions
//! name the per-request seed so; older ones ignore or reject it, so it is only sent when set),
//! and whether every release keeps `output_token_logprobs` the same length as `output_ids` in
//! each event (the adapter treats a mismatch as a protocol error).

use std::sync::Arc;

use hyper::Method;
use serde::de::{self, IgnoredAny, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;

use super::http::{
    mark_aborted, spawn_stream, EventParser, HttpEngine, HttpEngineConfig, ParseProblem, Parsed,
    Registration,
};
use super::{BoxFuture, ChunkStream, EngineFailure, EngineRequest, FinishKind, TokenEngine};

/// Settings of a [`SglangEngine`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SglangConfig {
    pub http: HttpEngineConfig,
    /// The server runs with `--incremental-streaming-output` (events carry only new ids).
    pub incremental_streaming_output: bool,
}

/// A handle to one SGLang server.
#[derive(Clone)]
pub struct SglangEngine {
    engine: Arc<HttpEngine>,
    incremental: bool,
}

impl SglangEngine {
    /// `address` is `host:port` or `http://host:port[/prefix]`; nothing is contacted yet.
    pub fn new(address: &str, config: SglangConfig) -> Result<Self, EngineFailure> {
        Ok(Self {
            engine: Arc::new(HttpEngine::new("sglang", address, config.http)?),
            incremental: config.incremental_streaming_output,
        })
    }

    /// Requests streaming now.
    pub fn in_flight_count(&self) -> usize {
        self.engine.in_flight.count()
    }
}

#[derive(Serialize)]
struct GenerateBody<'a> {
    rid: &'a str,
    sampling_params: SamplingParams<'a>,
    return_logprob: bool,
    stream: bool,
    /// With a `json_schema`: the model reasons first and the grammar starts after it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    require_reasoning: bool,
}

#[derive(Serialize)]
struct SamplingParams<'a> {
    max_new_tokens: u32,
    temperature: f32,
    top_p: f32,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_k: Option<u32>,
    stop_token_ids: &'a [u32],
    /// Keep the stop token in the output: the record needs every sampled id.
    no_stop_trim: bool,
    skip_special_tokens: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    sampling_seed: Option<u64>,
    /// Structured outputs: the JSON Schema's text (any object: `{"type":"object"}`).
    #[serde(skip_serializing_if = "Option::is_none")]
    json_schema: Option<&'a str>,
}

/// The JSON body of a generate request (also what the fake parses).
pub(crate) fn generate_body(request: &EngineRequest) -> super::PiecesBody {
    super::json_body_with_ids(
        "input_ids",
        request,
        &GenerateBody {
            rid: &request.rid,
            sampling_params: SamplingParams {
                max_new_tokens: request.max_new_tokens,
                temperature: request.temperature,
                top_p: request.top_p,
                top_k: request.top_k,
                stop_token_ids: &request.stop_token_ids,
                no_stop_trim: true,
                skip_special_tokens: false,
                sampling_seed: request.seed,
                json_schema: request
                    .json
                    .as_ref()
                    .map(super::JsonConstraint::schema_text),
            },
            return_logprob: true,
            stream: true,
            require_reasoning: request.json.is_some() && request.reasoning_first,
        },
    )
}

async fn abort_on_engine(engine: &HttpEngine, rid: &str) -> Result<(), EngineFailure> {
    let body = serde_json::json!({ "rid": rid }).to_string().into_bytes();
    engine
        .call(Method::POST, "/abort_request", Some(body.into()))
        .await
}

impl TokenEngine for SglangEngine {
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
        let incremental = self.incremental;
        Box::pin(async move {
            if request.input_ids.is_empty() {
                return Err(EngineFailure::Rejected {
                    engine: engine.name.clone(),
                    message: "input_ids is empty".into(),
                });
            }
            let registration = Registration::new(&engine, &request.rid)?;
            let body = generate_body(&request);
            let response = engine
                .send(
                    Method::POST,
                    "/generate",
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
                SglangParser::new(incremental),
                move |engine, _entry| {
                    Box::pin(async move {
                        if let Err(error) = abort_on_engine(&engine, &rid).await {
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
            mark_aborted(&engine.in_flight, &rid);
            abort_on_engine(&engine, &rid).await
        })
    }

    fn health(&self) -> BoxFuture<'static, Result<(), EngineFailure>> {
        let engine = Arc::clone(&self.engine);
        Box::pin(async move { engine.call(Method::GET, "/health", None).await })
    }
}

/// One `[logprob, token_id, text|null]` entry of `output_token_logprobs`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct LogprobEntry {
    pub logprob: f32,
    pub id: u32,
}

impl<'de> Deserialize<'de> for LogprobEntry {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct EntryVisitor;
        impl<'de> Visitor<'de> for EntryVisitor {
            type Value = LogprobEntry;
            fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                formatter.write_str("[logprob, token_id, text|null]")
            }
            fn visit_seq<A: SeqAccess<'de>>(
                self,
                mut sequence: A,
            ) -> Result<Self::Value, A::Error> {
                let logprob: f64 = sequence
                    .next_element()?
                    .ok_or_else(|| de::Error::invalid_length(0, &self))?;
                let id: u32 = sequence
                    .next_element()?
                    .ok_or_else(|| de::Error::invalid_length(1, &self))?;
                while sequence.next_element::<IgnoredAny>()?.is_some() {}
                Ok(LogprobEntry {
                    logprob: logprob as f32,
                    id,
                })
            }
        }
        deserializer.deserialize_seq(EntryVisitor)
    }
}

#[derive(Deserialize)]
struct Event<'a> {
    #[serde(borrow, default)]
    output_ids: Option<&'a RawValue>,
    #[serde(borrow, default)]
    meta_info: Option<&'a RawValue>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct MetaInfo<'a> {
    #[serde(borrow, default)]
    finish_reason: Option<&'a RawValue>,
    #[serde(borrow, default)]
    weight_version: Option<&'a RawValue>,
    #[serde(borrow, default)]
    output_token_logprobs: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct FinishReason {
    #[serde(rename = "type")]
    kind: String,
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

/// `weight_version` as a policy version: an integer (or a string holding one), else 0.
pub(crate) fn policy_version(raw: Option<&RawValue>) -> u64 {
    let Some(raw) = raw else {
        return 0;
    };
    match serde_json::from_str::<serde_json::Value>(raw.get()) {
        Ok(serde_json::Value::String(text)) => text.trim().parse().unwrap_or(0),
        Ok(serde_json::Value::Number(number)) => number.as_u64().unwrap_or(0),
        _ => 0,
    }
}

/// Cumulative (or incremental) SGLang events → deltas.
pub(crate) struct SglangParser {
    incremental: bool,
    /// Ids delivered so far (a cumulative event must start with them).
    streamed: Vec<u32>,
    policy_version: u64,
}

impl SglangParser {
    pub fn new(incremental: bool) -> Self {
        Self {
            incremental,
            streamed: Vec::new(),
            policy_version: 0,
        }
    }
}

impl EventParser for SglangParser {
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
        let output_ids: Vec<u32> = field(event.output_ids, "output_ids")?;
        let meta_info: MetaInfo<'_> = field(event.meta_info, "meta_info")?;
        let entries: Vec<LogprobEntry> = field(
            meta_info.output_token_logprobs,
            "meta_info.output_token_logprobs",
        )?;
        if entries.len() != output_ids.len() {
            return Err(ParseProblem::Protocol(format!(
                "meta_info.output_token_logprobs: {} entries for {} output_ids",
                entries.len(),
                output_ids.len()
            )));
        }
        if let Some(index) =
            (0..entries.len()).find(|&index| entries[index].id != output_ids[index])
        {
            return Err(ParseProblem::Protocol(format!(
                "meta_info.output_token_logprobs[{index}]: token id {} but output_ids[{index}] is {}",
                entries[index].id, output_ids[index]
            )));
        }
        self.policy_version = policy_version(meta_info.weight_version);
        let start = if self.incremental {
            0
        } else {
            let streamed = self.streamed.len();
            if output_ids.len() < streamed {
                return Err(ParseProblem::Protocol(format!(
                    "output_ids: a cumulative event has {} ids after {streamed} were streamed",
                    output_ids.len()
                )));
            }
            if output_ids[..streamed] != self.streamed[..] {
                return Err(ParseProblem::Protocol(
                    "output_ids: a cumulative event changed ids already streamed".into(),
                ));
            }
            streamed
        };
        let ids = output_ids[start..].to_vec();
        let logprobs = entries[start..].iter().map(|entry| entry.logprob).collect();
        self.streamed.extend_from_slice(&ids);
        let finish = match meta_info.finish_reason {
            None => None,
            Some(raw) => {
                let reason: FinishReason = serde_json::from_str(raw.get()).map_err(|error| {
                    ParseProblem::Protocol(format!("meta_info.finish_reason: {error}"))
                })?;
                let kind = match reason.kind.as_str() {
                    "stop" => FinishKind::Stop,
                    "length" => FinishKind::Length,
                    "abort" => FinishKind::Abort,
                    other => {
                        return Err(ParseProblem::Protocol(format!(
                            "meta_info.finish_reason.type: unknown value {other:?}"
                        )))
                    }
                };
                Some((kind, self.policy_version))
            }
        };
        Ok(Parsed {
            ids,
            logprobs,
            finish,
        })
    }

    fn ended_without_finish(
        &mut self,
        done_marker: bool,
        abort_requested: bool,
    ) -> Result<(FinishKind, u64), ParseProblem> {
        if abort_requested {
            return Ok((FinishKind::Abort, self.policy_version));
        }
        let how = if done_marker {
            "[DONE]"
        } else {
            "the end of the body"
        };
        Err(ParseProblem::Protocol(format!(
            "meta_info.finish_reason: the stream ended ({how}) before a finish_reason"
        )))
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
