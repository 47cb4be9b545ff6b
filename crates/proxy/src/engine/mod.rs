//! Engines behind one trait: token ids in, token ids and behaviour log-probs out.
//!
//! The proxy renders and tokenizes; an engine only samples. [`TokenEngine`] is what the server
//! holds per engine, object-safe (`Arc<dyn TokenEngine>`) with boxed futures:
//! - [`sglang::SglangEngine`]: SGLang's native `POST /generate` with `input_ids`;
//! - [`vllm::VllmEngine`]: vLLM's token-in/token-out `POST /inference/v1/generate`;
//! - [`scripted::ScriptedEngine`]: replays a JSONL script of Anthropic content blocks rendered
//!   in the model's output format (tests and `gyre proxy --engine scripted`);
//! - [`deterministic::DeterministicEngine`]: a fixed-length pseudo-random output per request
//!   (benchmarks, fakes);
//! - [`fake`]: protocol-faithful SGLang and vLLM HTTP servers backed by any engine.
//!
//! The embedded CPU engine of a later issue implements the same trait.
//!
//! Stream contract ([`ChunkStream`]): zero or more `Ok(EngineChunk::Tokens)`, then exactly one
//! terminal item, `Ok(EngineChunk::Finished)` or `Err(EngineFailure)`, then the channel closes.
//! A channel that closes without a terminal item means the engine task is gone: treat it as
//! [`EngineFailure::Unreachable`]. Dropping the receiver cancels the request (the adapters then
//! abort it on the engine). An abort is not a failure: the stream ends with
//! `Finished { kind: FinishKind::Abort, .. }` after the tokens produced so far.

pub mod deterministic;
pub mod fake;
mod http;
pub mod ids_json;
mod playback;
pub mod rollout;
pub mod scripted;
pub mod sglang;
mod sse;
pub mod vllm;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

pub use deterministic::{DeterministicEngine, DeterministicOptions};
pub use http::HttpEngineConfig;
pub use ids_json::IdsJson;
pub use playback::{playback_logprob, Fault, PlaybackOptions};
pub use scripted::{
    render_blocks, Script, ScriptBlock, ScriptError, ScriptLine, ScriptedEngine, ScriptedOptions,
};
pub use sglang::{SglangConfig, SglangEngine};
pub use vllm::{VllmConfig, VllmEngine};

/// A boxed, sendable future (what `async fn` in an object-safe trait becomes).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The agent a request is for when [`EngineRequest::agent`] is `None`.
pub const MAIN_AGENT: &str = "main";

/// HTTP header the adapters put [`EngineRequest::agent`] in. Real engines ignore it; the
/// [`fake`] servers hand it to their backing engine (so a scripted engine behind a fake still
/// knows main from sub-agent calls).
pub const AGENT_HEADER: &str = "x-gyre-agent";

/// One generation: the full prompt as token ids and the sampling parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineRequest {
    /// The request id, unique among this engine's in-flight requests; [`TokenEngine::abort`]
    /// names it. Sent to the engine as SGLang `rid` / vLLM `request_id`.
    pub rid: String,
    /// Which agent of the execution calls (`"main"`, a sub-agent id). Only the scripted engine
    /// reads it; `None` means [`MAIN_AGENT`].
    pub agent: Option<String>,
    /// The prompt's ids, shared with the proxy's prepared context (a 128K-token prompt is
    /// not copied per call).
    pub input_ids: Arc<Vec<u32>>,
    /// `input_ids` already written as JSON (the session keeps it per agent context, so only
    /// new ids are written per call). Adapters that send JSON use it when its length matches
    /// `input_ids`; it must hold exactly those ids.
    pub input_ids_json: Option<Arc<IdsJson>>,
    pub max_new_tokens: u32,
    pub temperature: f32,
    pub top_p: f32,
    /// Sample among the `k` likeliest tokens only; `None`: no top-k cut (the engine's default).
    pub top_k: Option<u32>,
    /// The engine stops after sampling one of these (the id is kept in the output).
    pub stop_token_ids: Vec<u32>,
    pub seed: Option<u64>,
    /// The output must be JSON of this kind (structured outputs: SGLang
    /// `sampling_params.json_schema`, vLLM `sampling_params.structured_outputs`). Only engines
    /// whose [`TokenEngine::constrains_output`] is true are sent one.
    pub json: Option<JsonConstraint>,
    /// The model may reason before its answer (its output format has reasoning tags): a
    /// [`EngineRequest::json`] grammar applies from the end of the reasoning (SGLang
    /// `require_reasoning`, which needs the server's `--reasoning-parser`; vLLM does so when
    /// it runs with its reasoning parser).
    pub reasoning_first: bool,
}

/// A grammar an engine holds a whole output to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JsonConstraint {
    /// Any JSON object.
    Object,
    /// JSON matching this JSON Schema (its text).
    Schema(Arc<str>),
}

impl JsonConstraint {
    /// As a JSON Schema's text (`{"type":"object"}` for any object).
    pub fn schema_text(&self) -> &str {
        match self {
            JsonConstraint::Object => r#"{"type":"object"}"#,
            JsonConstraint::Schema(schema) => schema,
        }
    }
}

impl EngineRequest {
    /// A request with neutral sampling (temperature 1, top-p 1, no stop ids, no seed).
    pub fn new(rid: impl Into<String>, input_ids: Vec<u32>, max_new_tokens: u32) -> Self {
        Self {
            rid: rid.into(),
            agent: None,
            input_ids: Arc::new(input_ids),
            input_ids_json: None,
            max_new_tokens,
            temperature: 1.0,
            top_p: 1.0,
            top_k: None,
            stop_token_ids: Vec::new(),
            seed: None,
            json: None,
            reasoning_first: false,
        }
    }

    /// The agent name, [`MAIN_AGENT`] when unset.
    pub fn agent_name(&self) -> &str {
        self.agent.as_deref().unwrap_or(MAIN_AGENT)
    }
}

/// Why a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FinishKind {
    /// An end-of-turn / EOS token or one of the request's stop ids (the last output id).
    Stop,
    /// `max_new_tokens` reached.
    Length,
    /// Aborted (by [`TokenEngine::abort`], the engine's own pause/abort, or an injected fault)
    /// after the tokens streamed so far. Not a trainable output; the proxy retries elsewhere.
    Abort,
}

impl FinishKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishKind::Stop => "stop",
            FinishKind::Length => "length",
            FinishKind::Abort => "abort",
        }
    }
}

/// One item of a [`ChunkStream`].
#[derive(Clone, Debug, PartialEq)]
pub enum EngineChunk {
    /// Newly sampled ids and the behaviour log-prob of each (`ids.len() == logprobs.len()`,
    /// never empty).
    Tokens { ids: Vec<u32>, logprobs: Vec<f32> },
    /// The end of the stream. `policy_version` is the engine's weight version when it
    /// finished (SGLang `meta_info.weight_version` as an integer, else 0; engines without one
    /// report what they were told, see [`vllm::VllmEngine::set_policy_version`]).
    Finished {
        kind: FinishKind,
        policy_version: u64,
    },
}

/// Why an engine call failed. Every variant names the engine ([`TokenEngine::name`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EngineFailure {
    /// Connection refused or reset, or the stream was cut before its end (the engine died).
    #[error("{engine}: unreachable: {message}")]
    Unreachable { engine: String, message: String },
    /// No response head, or no bytes on an open stream, within the configured time.
    #[error("{engine}: timed out after {after_ms} ms waiting for {waiting_for}")]
    TimedOut {
        engine: String,
        waiting_for: &'static str,
        after_ms: u64,
    },
    /// A non-2xx HTTP status (body truncated to a few KiB).
    #[error("{engine}: HTTP {code}: {body}")]
    Status {
        engine: String,
        code: u16,
        body: String,
    },
    /// The engine answered something that breaks its protocol; the message names the field.
    #[error("{engine}: protocol: {message}")]
    Protocol { engine: String, message: String },
    /// The engine reported a failure of this request inside a 200 stream (`{"error": …}`,
    /// vLLM `finish_reason: "error"`).
    #[error("{engine}: failed: {message}")]
    Failed { engine: String, message: String },
    /// Refused before anything was sent: an empty prompt, a rid already in flight, a bad
    /// engine address.
    #[error("{engine}: rejected: {message}")]
    Rejected { engine: String, message: String },
}

impl EngineFailure {
    /// The engine's name as [`TokenEngine::name`] gives it.
    pub fn engine(&self) -> &str {
        match self {
            EngineFailure::Unreachable { engine, .. }
            | EngineFailure::TimedOut { engine, .. }
            | EngineFailure::Status { engine, .. }
            | EngineFailure::Protocol { engine, .. }
            | EngineFailure::Failed { engine, .. }
            | EngineFailure::Rejected { engine, .. } => engine,
        }
    }

    /// Whether the same request may succeed on another engine (or later on this one): the
    /// engine is gone, slow, overloaded (5xx, 429) or misbehaved. A 4xx or a rejection would
    /// fail the same way anywhere.
    pub fn is_retryable(&self) -> bool {
        match self {
            EngineFailure::Unreachable { .. }
            | EngineFailure::TimedOut { .. }
            | EngineFailure::Protocol { .. }
            | EngineFailure::Failed { .. } => true,
            EngineFailure::Status { code, .. } => *code >= 500 || *code == 429,
            EngineFailure::Rejected { .. } => false,
        }
    }
}

/// The incremental output of one request; see the module docs for the contract.
pub type ChunkStream = tokio::sync::mpsc::Receiver<Result<EngineChunk, EngineFailure>>;

/// An inference engine. Implementations are cheap handles (`Arc` inside); every future they
/// return owns what it needs (`'static`) so the server can spawn it.
pub trait TokenEngine: Send + Sync + 'static {
    /// Kind and address, e.g. `sglang@127.0.0.1:30000`; used in every [`EngineFailure`].
    fn name(&self) -> &str;

    /// Starts a generation. Resolves once the engine accepted it (for HTTP engines: the
    /// response head arrived with a 2xx status), then tokens flow on the returned stream.
    fn generate(
        &self,
        request: EngineRequest,
    ) -> BoxFuture<'static, Result<ChunkStream, EngineFailure>>;

    /// Asks the engine to stop request `rid`; its stream then ends with
    /// [`FinishKind::Abort`] after the partial output. Unknown or finished rids are not an
    /// error (the request may have just ended).
    fn abort(&self, rid: &str) -> BoxFuture<'static, Result<(), EngineFailure>>;

    /// Whether the engine answers its health check.
    fn health(&self) -> BoxFuture<'static, Result<(), EngineFailure>>;

    /// Whether the engine holds an output to [`EngineRequest::json`] (its own grammar masks
    /// every token). Engines that cannot ignore the field.
    fn constrains_output(&self) -> bool {
        false
    }
}

/// Reads a whole [`ChunkStream`]: all ids and log-probs, then the finish or the failure.
/// Tests, benchmarks and non-streaming callers use it.
pub async fn collect(mut stream: ChunkStream) -> Collected {
    let mut collected = Collected::default();
    while let Some(item) = stream.recv().await {
        match item {
            Ok(EngineChunk::Tokens { ids, logprobs }) => {
                collected.chunks_count += 1;
                collected.ids.extend_from_slice(&ids);
                collected.logprobs.extend_from_slice(&logprobs);
            }
            Ok(EngineChunk::Finished {
                kind,
                policy_version,
            }) => {
                collected.end = Some(Ok((kind, policy_version)));
                return collected;
            }
            Err(failure) => {
                collected.end = Some(Err(failure));
                return collected;
            }
        }
    }
    collected
}

/// What [`collect`] read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Collected {
    pub ids: Vec<u32>,
    pub logprobs: Vec<f32>,
    /// How many `Tokens` chunks carried them.
    pub chunks_count: usize,
    /// `Ok((kind, policy_version))` or the failure; `None` when the channel closed without a
    /// terminal item.
    pub end: Option<Result<(FinishKind, u64), EngineFailure>>,
}

impl Collected {
    /// The finish kind, if the stream finished.
    pub fn finish(&self) -> Option<FinishKind> {
        match &self.end {
            Some(Ok((kind, _))) => Some(*kind),
            _ => None,
        }
    }

    /// The failure, if the stream failed.
    pub fn failure(&self) -> Option<&EngineFailure> {
        match &self.end {
            Some(Err(failure)) => Some(failure),
            _ => None,
        }
    }
}

/// A request body as JSON: `{"<ids_key>":[...ids],` followed by the members of `rest` (a
/// struct without the ids). The ids come from the request's [`IdsJson`] when it has one for
/// exactly these ids (a copy of text written when the ids were tokenized), else they are
/// written here. The buffer is sized up front: a 128K context is about 700 KB of digits, and
/// growing it by doubling would copy it ~17 times.
pub(crate) fn json_body_with_ids<T: serde::Serialize>(
    ids_key: &str,
    request: &EngineRequest,
    rest: &T,
) -> PiecesBody {
    let ids = match &request.input_ids_json {
        // The session's own text of this context: shared with the body, never copied (at
        // 128K tokens it is ~0.8 MB, and a copy is as many fresh pages on the call's path).
        Some(json) if json.len() == request.input_ids.len() => {
            debug_assert!(**json == IdsJson::of(&request.input_ids));
            bytes::Bytes::from_owner(SharedIdsText(Arc::clone(json)))
        }
        _ => bytes::Bytes::from(IdsJson::of(&request.input_ids).text().to_vec()),
    };
    let members = serde_json::to_vec(rest).expect("serialising numbers and strings cannot fail");
    let head = format!("{{\"{ids_key}\":[").into_bytes();
    // `members` is `{...}`; an empty object adds nothing but the closing brace.
    let tail = match members.get(1..) {
        Some(b"}") | None => b"]}".to_vec(),
        Some(rest) => {
            let mut tail = b"],".to_vec();
            tail.extend_from_slice(rest);
            tail
        }
    };
    PiecesBody::new(vec![head.into(), ids, tail.into()])
}

/// An `IdsJson` shared with a request body.
struct SharedIdsText(Arc<IdsJson>);

impl AsRef<[u8]> for SharedIdsText {
    fn as_ref(&self) -> &[u8] {
        self.0.text()
    }
}

/// A request body sent as its pieces, in order, with its exact length (so hyper sends a
/// `Content-Length`): a prompt's ids go out from the session's own text, and a retry on another
/// engine re-sends the same pieces by reference.
#[derive(Clone, Debug, Default)]
pub struct PiecesBody {
    pieces: std::collections::VecDeque<bytes::Bytes>,
    remaining: u64,
}

impl PiecesBody {
    pub fn new(pieces: Vec<bytes::Bytes>) -> Self {
        let pieces: std::collections::VecDeque<bytes::Bytes> = pieces
            .into_iter()
            .filter(|piece| !piece.is_empty())
            .collect();
        let remaining = pieces.iter().map(|piece| piece.len() as u64).sum();
        PiecesBody { pieces, remaining }
    }

    /// The whole body in one buffer (tests, fakes).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.remaining as usize);
        for piece in &self.pieces {
            out.extend_from_slice(piece);
        }
        out
    }
}

impl From<Vec<u8>> for PiecesBody {
    fn from(bytes: Vec<u8>) -> Self {
        PiecesBody::new(vec![bytes.into()])
    }
}

impl hyper::body::Body for PiecesBody {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, Self::Error>>> {
        let piece = self.pieces.pop_front();
        if let Some(piece) = &piece {
            self.remaining -= piece.len() as u64;
        }
        std::task::Poll::Ready(piece.map(|piece| Ok(hyper::body::Frame::data(piece))))
    }

    fn is_end_stream(&self) -> bool {
        self.pieces.is_empty()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        hyper::body::SizeHint::with_exact(self.remaining)
    }
}

/// Checks an adapter's body builder: `sampling_params.top_k` is present exactly when the
/// request sets it.
#[cfg(test)]
pub(crate) fn top_k_is_sent_only_when_set(generate_body: fn(&EngineRequest) -> PiecesBody) {
    let mut request = EngineRequest::new("r", vec![1, 2], 8);
    let body: serde_json::Value =
        serde_json::from_slice(&generate_body(&request).to_vec()).expect("json");
    assert!(body["sampling_params"].get("top_k").is_none(), "{body}");
    request.top_k = Some(20);
    let body: serde_json::Value =
        serde_json::from_slice(&generate_body(&request).to_vec()).expect("json");
    assert_eq!(body["sampling_params"]["top_k"], 20, "{body}");
}

#[cfg(test)]
mod body_tests {
    use super::*;
    use hyper::body::Body;

    /// The body built from the session's shared ids text is byte for byte the body built from
    /// the ids alone, it is sent as pieces whose lengths add up to its announced length, and the
    /// shared text is not copied.
    #[test]
    fn a_pieces_body_is_the_json_of_the_request() {
        let ids: Vec<u32> = (0..1000).map(|i| i * 7919 % 50_000).collect();
        let mut request = EngineRequest::new("r-1", ids.clone(), 8);
        let rest = serde_json::json!({"rid": "r-1", "stream": true});
        let written = json_body_with_ids("input_ids", &request, &rest).to_vec();
        let shared = Arc::new(IdsJson::of(&ids));
        request.input_ids_json = Some(Arc::clone(&shared));
        let body = json_body_with_ids("input_ids", &request, &rest);
        assert_eq!(body.to_vec(), written);
        let parsed: serde_json::Value = serde_json::from_slice(&written).expect("json");
        assert_eq!(
            parsed,
            serde_json::json!({"input_ids": ids, "rid": "r-1", "stream": true})
        );
        assert_eq!(body.size_hint().exact(), Some(written.len() as u64));
        assert!(
            body.pieces
                .iter()
                .any(|piece| piece.as_ptr() == shared.text().as_ptr()),
            "the ids go out from the shared text"
        );
        let empty = json_body_with_ids("token_ids", &request, &serde_json::json!({}));
        let parsed: serde_json::Value = serde_json::from_slice(&empty.to_vec()).expect("json");
        assert_eq!(parsed, serde_json::json!({"token_ids": ids}));
    }
}
