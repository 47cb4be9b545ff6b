//! Protocol-faithful fake engine servers, backed by any [`TokenEngine`]: SGLang's native API
//! ([`sglang`]) and vLLM's token-in/token-out API ([`vllm`]), each with an OpenAI-compatible
//! `/v1/chat/completions` ([`chat`], text only, rendered and decoded with a [`ChatModel`]) so
//! third-party gateways (LiteLLM, SGLang's `smg`) can be benchmarked in front of the same
//! engine.
//!
//! A fake binds `127.0.0.1:0` (or a given address), serves HTTP/1 on its own accept loop, and
//! can be told to misbehave: [`FakeFault`] for the next generate request (cut the stream after
//! some tokens, answer an HTTP error, send a raw event) and [`FakeServer::kill`], which closes
//! the listener and every open connection at once, as a crashed engine. [`FakeStats`] counts
//! what it served.

pub mod chat;
pub mod sglang;
pub mod vllm;

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::response::Response;
use axum::Router;
use bytes::Bytes;
use hyper::StatusCode;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch, Notify};

use super::TokenEngine;
use crate::output::OutputFormat;
use crate::ChatModel;

/// Which protocol a fake speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FakeProtocol {
    Sglang,
    Vllm,
}

/// What `/v1/chat/completions` needs: the model to render prompts and decode output, and the
/// output format (its end-of-turn texts end the answer).
#[derive(Clone)]
pub struct ChatBackend {
    pub model: Arc<ChatModel>,
    pub format: OutputFormat,
}

/// Options of a fake server.
#[derive(Clone, Default)]
pub struct FakeOptions {
    /// Serves `/v1/chat/completions` when set (404 otherwise); SGLang events then also carry
    /// the decoded `text`.
    pub chat: Option<ChatBackend>,
    /// SGLang: events carry only new ids (`--incremental-streaming-output`).
    pub incremental_streaming_output: bool,
    /// SGLang: the `meta_info.weight_version` string; by default the backing engine's policy
    /// version in the final event and `"default"` before it.
    pub weight_version: Option<String>,
    /// Where to listen; `127.0.0.1:0` when unset.
    pub address: Option<SocketAddr>,
}

/// A misbehaviour for the next generate request (queued, one per request).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FakeFault {
    /// Stream this many tokens, then drop the connection without ending the response (the
    /// engine died mid-stream).
    CutAfterTokens(u32),
    /// Answer with this status and body instead of generating.
    Status { code: u16, body: String },
    /// Answer a 200 stream holding just these events' data, then `data: [DONE]`.
    RawEvents(Vec<String>),
    /// Answer a 200 stream that never sends a token: an SSE comment (`: keep-alive`) every
    /// this many milliseconds until the client goes away, as a stuck engine behind a gateway
    /// that keeps idle streams alive.
    KeepAliveOnly { every_ms: u64 },
    /// Answer this status with a body that starts and never ends (a gateway that stalls after
    /// the head) until the client goes away.
    StatusThenStall { code: u16 },
}

/// What a fake served so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FakeStats {
    pub generate_requests: u64,
    pub abort_requests: u64,
    pub health_requests: u64,
    pub chat_requests: u64,
    /// Streams cut by [`FakeFault::CutAfterTokens`].
    pub streams_cut: u64,
}

/// State every handler of a fake sees.
pub(crate) struct Shared {
    pub engine: Arc<dyn TokenEngine>,
    pub options: FakeOptions,
    faults: Mutex<VecDeque<FakeFault>>,
    stats: watch::Sender<FakeStats>,
    /// For request ids the client did not give.
    next_id: AtomicU64,
}

impl Shared {
    pub fn next_fault(&self) -> Option<FakeFault> {
        self.faults
            .lock()
            .expect("fault queue is never poisoned")
            .pop_front()
    }

    pub fn mint_id(&self, prefix: &str) -> String {
        format!("{prefix}{}", self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    pub fn count_generate(&self) {
        self.stats.send_modify(|stats| stats.generate_requests += 1);
    }

    pub fn count_abort(&self) {
        self.stats.send_modify(|stats| stats.abort_requests += 1);
    }

    pub fn count_health(&self) {
        self.stats.send_modify(|stats| stats.health_requests += 1);
    }

    pub fn count_chat(&self) {
        self.stats.send_modify(|stats| stats.chat_requests += 1);
    }

    pub fn count_cut(&self) {
        self.stats.send_modify(|stats| stats.streams_cut += 1);
    }
}

/// A running fake; dropping it kills it.
pub struct FakeServer {
    address: SocketAddr,
    protocol: FakeProtocol,
    shared: Arc<Shared>,
    kill: watch::Sender<bool>,
}

impl FakeServer {
    /// A fake SGLang server (`/generate`, `/abort_request`, `/health`, `/health_generate`,
    /// `/v1/chat/completions`).
    pub async fn sglang(engine: Arc<dyn TokenEngine>, options: FakeOptions) -> io::Result<Self> {
        Self::start(FakeProtocol::Sglang, engine, options).await
    }

    /// A fake vLLM server (`/inference/v1/generate`, `/abort_requests`, `/health`,
    /// `/v1/chat/completions`).
    pub async fn vllm(engine: Arc<dyn TokenEngine>, options: FakeOptions) -> io::Result<Self> {
        Self::start(FakeProtocol::Vllm, engine, options).await
    }

    pub async fn start(
        protocol: FakeProtocol,
        engine: Arc<dyn TokenEngine>,
        options: FakeOptions,
    ) -> io::Result<Self> {
        let listen = options
            .address
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)));
        let listener = gyre_control::bind_listener(listen)?;
        let address = listener.local_addr()?;
        let shared = Arc::new(Shared {
            engine,
            options,
            faults: Mutex::new(VecDeque::new()),
            stats: watch::Sender::new(FakeStats::default()),
            next_id: AtomicU64::new(0),
        });
        let router = match protocol {
            FakeProtocol::Sglang => sglang::router(),
            FakeProtocol::Vllm => vllm::router(),
        }
        .route(
            "/v1/chat/completions",
            axum::routing::post(chat::chat_completions),
        )
        .with_state(Arc::clone(&shared));
        let (kill, killed) = watch::channel(false);
        tokio::spawn(accept_loop(listener, router, killed));
        Ok(Self {
            address,
            protocol,
            shared,
            kill,
        })
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    pub fn protocol(&self) -> FakeProtocol {
        self.protocol
    }

    /// Queues a fault for the next generate request.
    pub fn inject(&self, fault: FakeFault) {
        self.shared
            .faults
            .lock()
            .expect("fault queue is never poisoned")
            .push_back(fault);
    }

    pub fn stats(&self) -> FakeStats {
        *self.shared.stats.borrow()
    }

    /// Resolves with the stats once `predicate` holds for them (counts are updated when a
    /// request arrives, before it is handled).
    pub async fn wait_for_stats(&self, predicate: impl FnMut(&FakeStats) -> bool) -> FakeStats {
        let mut stats = self.shared.stats.subscribe();
        // The sender lives in `self.shared`, so the channel cannot close while we wait.
        let seen = stats
            .wait_for(predicate)
            .await
            .expect("the stats sender outlives this borrow of the fake");
        *seen
    }

    /// Stops listening and drops every open connection mid-whatever, as a crashed engine.
    pub fn kill(&self) {
        self.kill.send_replace(true);
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Drops one connection (handlers find it in their request's extensions).
#[derive(Clone, Default)]
pub(crate) struct ConnectionKill(Arc<Notify>);

impl ConnectionKill {
    fn fire(&self) {
        // notify_one keeps a permit if the connection task is busy polling right now.
        self.0.notify_one();
    }
}

/// Accepts until killed; each connection is served until it ends, its [`ConnectionKill`]
/// fires, or the fake is killed.
async fn accept_loop(listener: TcpListener, router: Router, mut killed: watch::Receiver<bool>) {
    loop {
        let accepted = tokio::select! {
            _ = killed.wait_for(|killed| *killed) => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((stream, _peer)) = accepted else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let connection_kill = ConnectionKill::default();
        let service = TowerToHyperService::new(
            router
                .clone()
                .layer(axum::Extension(connection_kill.clone())),
        );
        let mut killed = killed.clone();
        // Owned by the accept loop's kill signal: it ends with its connection or on kill.
        tokio::spawn(async move {
            let connection = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service);
            // Dropping the connection between two of its polls loses nothing it flushed: hyper
            // flushes before a poll returns pending.
            tokio::select! {
                _ = killed.wait_for(|killed| *killed) => {}
                _ = connection_kill.0.notified() => {}
                _ = connection => {}
            }
        });
    }
}

/// A JSON response.
pub(crate) fn json_response(status: u16, body: &serde_json::Value) -> Response {
    Response::builder()
        .status(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .expect("a status and a fixed header make a valid response")
}

/// An error in the shape SGLang and vLLM's FastAPI handlers use.
pub(crate) fn error_response(status: u16, message: impl Into<String>) -> Response {
    let message = message.into();
    json_response(
        status,
        &serde_json::json!({ "error": { "message": message, "type": "BadRequestError", "code": status } }),
    )
}

/// The writing end of a streamed SSE body.
pub(crate) struct SseSender {
    sender: mpsc::Sender<Result<Bytes, io::Error>>,
    connection: ConnectionKill,
}

/// A 200 `text/event-stream` response on `connection` and the sender that feeds it.
pub(crate) fn sse_response(connection: ConnectionKill) -> (SseSender, Response) {
    // Capacity 1: a free slot means hyper took the previous event (see `SseSender::cut`).
    let (sender, receiver) = mpsc::channel::<Result<Bytes, io::Error>>(1);
    let stream = futures_util::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|item| (item, receiver))
    });
    let response = Response::builder()
        .status(StatusCode::OK)
        .header(hyper::header::CONTENT_TYPE, "text/event-stream")
        .header(hyper::header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(stream))
        .expect("a status and fixed headers make a valid response");
    (SseSender { sender, connection }, response)
}

impl SseSender {
    /// Sends `data: <data>\n\n`; false when the client is gone.
    pub async fn data(&self, data: &str) -> bool {
        let mut bytes = Vec::with_capacity(data.len() + 8);
        bytes.extend_from_slice(b"data: ");
        bytes.extend_from_slice(data.as_bytes());
        bytes.extend_from_slice(b"\n\n");
        self.sender.send(Ok(Bytes::from(bytes))).await.is_ok()
    }

    /// Sends the SSE comment `: <text>\n\n`; false when the client is gone.
    pub async fn comment(&self, text: &str) -> bool {
        let bytes = format!(": {text}\n\n");
        self.sender.send(Ok(Bytes::from(bytes))).await.is_ok()
    }

    /// Ends the response abruptly, as a dying engine: the connection is dropped without the
    /// final chunk, after the events already sent reached the socket. (A body error would
    /// make hyper drop events it buffered but had not flushed yet.)
    pub async fn cut(self) {
        // Once hyper took the last event, the connection's current poll flushes it before the
        // kill can be seen.
        let _ = self.sender.reserve().await;
        self.connection.fire();
        // Keep the body open until the connection is gone: dropping the sender first would
        // let hyper end the response cleanly.
        self.sender.closed().await;
    }

    /// Resolves when the client went away.
    pub async fn closed(&self) {
        self.sender.closed().await;
    }
}

/// Reads a JSON object body or explains what is wrong with it.
pub(crate) fn parse_object(
    body: &[u8],
) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(serde_json::Value::Object(object)) => Ok(object),
        Ok(_) => Err("the body must be a JSON object".into()),
        Err(error) => Err(format!("JSON decode error: {error}")),
    }
}

/// Like [`parse_object`], but the token-id array `ids_field` is read straight into a
/// `Vec<u32>` (null or absent: `None`) instead of through a tree of JSON values: a 128K
/// context is 128K array elements, and the engine's parse must not dwarf the work the
/// benchmarks measure around it.
#[allow(clippy::type_complexity)]
pub(crate) fn parse_object_with_ids(
    body: &[u8],
    ids_field: &str,
) -> Result<(serde_json::Map<String, serde_json::Value>, Option<Vec<u32>>), String> {
    use serde_json::value::RawValue;
    let fields: Vec<(String, &RawValue)> = match serde_json::from_slice::<RawObject<'_>>(body) {
        Ok(RawObject(fields)) => fields,
        // Not an object (or not JSON): the plain reader names the problem.
        Err(_) => return parse_object(body).map(|object| (object, None)),
    };
    let mut object = serde_json::Map::new();
    let mut ids = None;
    for (name, raw) in fields {
        if name == ids_field {
            ids = serde_json::from_str::<Option<Vec<u32>>>(raw.get())
                .map_err(|error| format!("{ids_field}: {error}"))?;
        } else {
            let value = serde_json::from_str(raw.get())
                .map_err(|error| format!("JSON decode error: {error}"))?;
            object.insert(name, value);
        }
    }
    Ok((object, ids))
}

/// A JSON object's members in order, values left unparsed (duplicate keys: the last wins, as
/// in [`parse_object`]).
struct RawObject<'a>(Vec<(String, &'a serde_json::value::RawValue)>);

impl<'de: 'a, 'a> serde::Deserialize<'de> for RawObject<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Members<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Members<'a> {
            type Value = RawObject<'a>;
            fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
                formatter.write_str("a JSON object")
            }
            fn visit_map<M: serde::de::MapAccess<'de>>(
                self,
                mut map: M,
            ) -> Result<Self::Value, M::Error> {
                let mut members: Vec<(String, &'a serde_json::value::RawValue)> = Vec::new();
                while let Some((name, value)) =
                    map.next_entry::<String, &'de serde_json::value::RawValue>()?
                {
                    members.retain(|(existing, _)| *existing != name);
                    members.push((name, value));
                }
                Ok(RawObject(members))
            }
        }
        deserializer.deserialize_map(Members(std::marker::PhantomData))
    }
}

/// An optional number field; an error names the field.
pub(crate) fn number_field<T: serde::de::DeserializeOwned>(
    object: &serde_json::Map<String, serde_json::Value>,
    name: &str,
) -> Result<Option<T>, String> {
    match object.get(name) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(value) => T::deserialize(value)
            .map(Some)
            .map_err(|error| format!("{name}: {error}")),
    }
}

/// The start every fake `generate` shares: applies the fault queued for this request (a status
/// or raw events answer at once, as `Err`), then starts the backing engine. Returns its stream
/// and, for a `CutAfterTokens` fault, after how many tokens to cut the connection.
pub(crate) async fn start_generation(
    shared: &Shared,
    connection: ConnectionKill,
    request: &super::EngineRequest,
) -> Result<(super::ChunkStream, Option<usize>), Response> {
    let mut cut_after = None;
    match shared.next_fault() {
        Some(FakeFault::Status { code, body }) => return Err(error_response(code, body)),
        Some(FakeFault::RawEvents(events)) => {
            let (sender, response) = sse_response(connection);
            // Task "fake-raw-events": owned by the response stream; ends when it is sent.
            tokio::spawn(async move {
                for event in events {
                    if !sender.data(&event).await {
                        return;
                    }
                }
                sender.data("[DONE]").await;
            });
            return Err(response);
        }
        Some(FakeFault::KeepAliveOnly { every_ms }) => {
            let (sender, response) = sse_response(connection);
            let every = std::time::Duration::from_millis(every_ms.max(1));
            // Task "fake-keep-alive": owned by the response stream; ends when the client left.
            tokio::spawn(async move {
                while sender.comment("keep-alive").await {
                    tokio::select! {
                        _ = sender.closed() => return,
                        _ = tokio::time::sleep(every) => {}
                    }
                }
            });
            return Err(response);
        }
        Some(FakeFault::StatusThenStall { code }) => {
            let (sender, receiver) = mpsc::channel::<Result<Bytes, io::Error>>(1);
            let stream = futures_util::stream::unfold(receiver, |mut receiver| async move {
                receiver.recv().await.map(|item| (item, receiver))
            });
            let status = StatusCode::from_u16(code).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
            // Task "fake-stall": owned by the response body; ends when the client left.
            tokio::spawn(async move {
                if sender
                    .send(Ok(Bytes::from_static(b"{\"error\": ")))
                    .await
                    .is_ok()
                {
                    sender.closed().await;
                }
            });
            return Err(Response::builder()
                .status(status)
                .header(hyper::header::CONTENT_TYPE, "application/json")
                .body(Body::from_stream(stream))
                .expect("a status and a fixed header make a valid response"));
        }
        Some(FakeFault::CutAfterTokens(tokens)) => cut_after = Some(tokens as usize),
        None => {}
    }
    match shared.engine.generate(request.clone()).await {
        Ok(stream) => Ok((stream, cut_after)),
        Err(failure) => Err(error_response(
            sglang::status_for(&failure),
            failure.to_string(),
        )),
    }
}
