//! What the SGLang and vLLM adapters share: an HTTP/1 client (hyper-util's pooled client,
//! `TCP_NODELAY`, connect timeout), request helpers that turn transport trouble and non-2xx
//! statuses into [`EngineFailure`]s, the registry of in-flight rids, and the task that reads an
//! SSE body and turns each event into [`EngineChunk`]s through an adapter's [`EventParser`].

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::mpsc;

use super::sse::SseDecoder;
use super::{ChunkStream, EngineChunk, EngineFailure, FinishKind};

/// Transport settings of an HTTP engine adapter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpEngineConfig {
    pub connect_timeout_ms: u64,
    /// From sending a request to its response head (the engines send the head of a stream at
    /// once, before the first token).
    pub response_timeout_ms: u64,
    /// Longest wait for the next token on an open stream (the first token of a long prompt
    /// under load comes late, so this is generous). SSE comments and events that carry no new
    /// token do not count as progress.
    pub idle_timeout_ms: u64,
    /// Capacity of each request's [`ChunkStream`].
    pub channel_capacity: usize,
    /// Largest SSE event accepted (SGLang's cumulative events grow with the output).
    pub event_bytes_max: usize,
    /// How much of an error response body is kept in [`EngineFailure::Status`].
    pub error_body_bytes_max: usize,
}

impl Default for HttpEngineConfig {
    fn default() -> Self {
        Self {
            connect_timeout_ms: 2_000,
            response_timeout_ms: 60_000,
            idle_timeout_ms: 600_000,
            channel_capacity: 64,
            event_bytes_max: 64 << 20,
            error_body_bytes_max: 4 << 10,
        }
    }
}

type HttpClient = Client<HttpConnector, super::PiecesBody>;

/// One engine endpoint: its name, base URL and pooled client.
pub(crate) struct HttpEngine {
    pub name: String,
    /// `http://host:port` plus an optional path prefix, without a trailing `/`.
    base: String,
    client: HttpClient,
    pub config: HttpEngineConfig,
    pub in_flight: InFlight,
}

/// Splits `address` (`host:port`, `http://host:port`, optionally with a path prefix) into the
/// base URL and the `host:port` used in the engine's name.
pub(crate) fn parse_address(address: &str) -> Result<(String, String), String> {
    let trimmed = address.trim().trim_end_matches('/');
    let with_scheme = if trimmed.contains("://") {
        trimmed.to_string()
    } else {
        format!("http://{trimmed}")
    };
    let uri: Uri = with_scheme
        .parse()
        .map_err(|error| format!("engine address {address:?}: {error}"))?;
    if uri.scheme_str() != Some("http") {
        return Err(format!(
            "engine address {address:?}: only http:// is supported (engines are on the cluster network)"
        ));
    }
    let authority = uri
        .authority()
        .ok_or_else(|| format!("engine address {address:?}: no host"))?;
    if authority.port_u16().is_none() {
        return Err(format!("engine address {address:?}: no port"));
    }
    Ok((with_scheme, authority.as_str().to_string()))
}

/// `error` and its sources, `: `-joined (hyper-util's top-level message alone is vague).
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

impl HttpEngine {
    pub fn new(kind: &str, address: &str, config: HttpEngineConfig) -> Result<Self, EngineFailure> {
        let (base, authority) =
            parse_address(address).map_err(|message| EngineFailure::Rejected {
                engine: format!("{kind}@{address}"),
                message,
            })?;
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_millis(config.connect_timeout_ms)));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Ok(Self {
            name: format!("{kind}@{authority}"),
            base,
            client,
            config,
            in_flight: InFlight::default(),
        })
    }

    pub fn unreachable(&self, message: impl Into<String>) -> EngineFailure {
        EngineFailure::Unreachable {
            engine: self.name.clone(),
            message: message.into(),
        }
    }

    pub fn protocol(&self, message: impl Into<String>) -> EngineFailure {
        EngineFailure::Protocol {
            engine: self.name.clone(),
            message: message.into(),
        }
    }

    /// Sends a request and waits for a 2xx response head.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        json_body: Option<super::PiecesBody>,
        accept_event_stream: bool,
        agent: Option<&str>,
    ) -> Result<Response<Incoming>, EngineFailure> {
        let mut builder = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        if json_body.is_some() {
            builder = builder.header(hyper::header::CONTENT_TYPE, "application/json");
        }
        if accept_event_stream {
            builder = builder.header(hyper::header::ACCEPT, "text/event-stream");
        }
        if let Some(agent) = agent {
            builder = builder.header(super::AGENT_HEADER, agent);
        }
        let request = builder
            .body(json_body.unwrap_or_default())
            .map_err(|error| self.protocol(format!("building the request for {path}: {error}")))?;
        let timeout = Duration::from_millis(self.config.response_timeout_ms);
        let response = match tokio::time::timeout(timeout, self.client.request(request)).await {
            Err(_) => {
                return Err(EngineFailure::TimedOut {
                    engine: self.name.clone(),
                    waiting_for: "the response head",
                    after_ms: self.config.response_timeout_ms,
                })
            }
            Ok(Err(error)) => {
                return Err(self.unreachable(format!("{path}: {}", error_chain(&error))))
            }
            Ok(Ok(response)) => response,
        };
        let status = response.status();
        if !status.is_success() {
            let body = read_truncated(
                response.into_body(),
                self.config.error_body_bytes_max,
                timeout,
            )
            .await;
            return Err(EngineFailure::Status {
                engine: self.name.clone(),
                code: status.as_u16(),
                body,
            });
        }
        Ok(response)
    }

    /// A request whose answer only matters by its status (abort, health); the body is read
    /// and dropped so the connection can be reused.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        json_body: Option<super::PiecesBody>,
    ) -> Result<(), EngineFailure> {
        let response = self.send(method, path, json_body, false, None).await?;
        read_truncated(
            response.into_body(),
            self.config.error_body_bytes_max,
            Duration::from_millis(self.config.response_timeout_ms),
        )
        .await;
        Ok(())
    }
}

/// What a finished stream may still send before its connection is dropped rather than drained.
const DRAIN_BYTES_MAX: usize = 64 << 10;

/// Up to `bytes_max` bytes of `body` as (lossy) text, read for at most `within`; the rest is
/// dropped (an engine or gateway that sends a head and then stalls cannot hold the caller).
async fn read_truncated(mut body: Incoming, bytes_max: usize, within: Duration) -> String {
    let deadline = tokio::time::Instant::now() + within;
    let mut bytes = Vec::new();
    while bytes.len() < bytes_max {
        let Ok(frame) = tokio::time::timeout_at(deadline, body.frame()).await else {
            break;
        };
        match frame {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    bytes.extend_from_slice(&data);
                }
            }
            Some(Err(_)) | None => break,
        }
    }
    bytes.truncate(bytes_max);
    String::from_utf8_lossy(&bytes).into_owned()
}

/// One in-flight request of an adapter.
#[derive(Default)]
pub(crate) struct InFlightEntry {
    pub abort_requested: AtomicBool,
    /// The id the engine itself uses, when it differs from the rid (vLLM prefixes it).
    pub engine_request_id: Mutex<Option<String>>,
}

/// The rids an adapter has in flight (to refuse duplicates and to map aborts).
#[derive(Default)]
pub(crate) struct InFlight {
    entries: Mutex<BTreeMap<String, Arc<InFlightEntry>>>,
}

impl InFlight {
    pub fn register(&self, rid: &str) -> Option<Arc<InFlightEntry>> {
        let mut entries = self
            .entries
            .lock()
            .expect("in-flight map is never poisoned");
        if entries.contains_key(rid) {
            return None;
        }
        let entry = Arc::new(InFlightEntry::default());
        entries.insert(rid.to_string(), Arc::clone(&entry));
        Some(entry)
    }

    pub fn get(&self, rid: &str) -> Option<Arc<InFlightEntry>> {
        self.entries
            .lock()
            .expect("in-flight map is never poisoned")
            .get(rid)
            .cloned()
    }

    /// Removes `rid` if it still maps to `entry` (a later request may reuse a finished rid).
    pub fn remove(&self, rid: &str, entry: &Arc<InFlightEntry>) {
        let mut entries = self
            .entries
            .lock()
            .expect("in-flight map is never poisoned");
        if entries
            .get(rid)
            .is_some_and(|current| Arc::ptr_eq(current, entry))
        {
            entries.remove(rid);
        }
    }

    pub fn count(&self) -> usize {
        self.entries
            .lock()
            .expect("in-flight map is never poisoned")
            .len()
    }
}

/// A rid registered for one `generate` call; dropping it before the stream starts (an error,
/// or the caller dropped the future) frees the rid.
pub(crate) struct Registration {
    engine: Arc<HttpEngine>,
    rid: String,
    entry: Arc<InFlightEntry>,
    armed: bool,
}

impl Registration {
    /// Registers `rid`, refusing one already in flight.
    pub fn new(engine: &Arc<HttpEngine>, rid: &str) -> Result<Self, EngineFailure> {
        let entry = engine
            .in_flight
            .register(rid)
            .ok_or_else(|| EngineFailure::Rejected {
                engine: engine.name.clone(),
                message: format!("request {rid:?} is already in flight"),
            })?;
        Ok(Self {
            engine: Arc::clone(engine),
            rid: rid.to_string(),
            entry,
            armed: true,
        })
    }

    pub fn entry(&self) -> &Arc<InFlightEntry> {
        &self.entry
    }

    /// Hands the rid to the stream task, which frees it when the stream ends.
    pub fn into_stream(mut self) -> (String, Arc<InFlightEntry>) {
        self.armed = false;
        (self.rid.clone(), Arc::clone(&self.entry))
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if self.armed {
            self.engine.in_flight.remove(&self.rid, &self.entry);
        }
    }
}

/// Marks `rid` aborted (if in flight) and returns its entry.
pub(crate) fn mark_aborted(in_flight: &InFlight, rid: &str) -> Option<Arc<InFlightEntry>> {
    let entry = in_flight.get(rid)?;
    entry.abort_requested.store(true, Ordering::SeqCst);
    Some(entry)
}

/// What an adapter's parser made of one SSE event.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Parsed {
    pub ids: Vec<u32>,
    pub logprobs: Vec<f32>,
    pub finish: Option<(FinishKind, u64)>,
}

/// A parser's complaint about an event.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ParseProblem {
    /// Breaks the protocol; the message starts with the field path.
    Protocol(String),
    /// The engine reported a failure in-band.
    Failed(String),
}

/// Turns one engine's SSE events into chunks.
pub(crate) trait EventParser: Send + 'static {
    /// One event's data (never `[DONE]`).
    fn event(&mut self, data: &[u8]) -> Result<Parsed, ParseProblem>;

    /// The stream ended (`done_marker`: by `[DONE]`; else by a clean end of the body) before
    /// any finish; `abort_requested`: [`super::TokenEngine::abort`] was called for it.
    fn ended_without_finish(
        &mut self,
        done_marker: bool,
        abort_requested: bool,
    ) -> Result<(FinishKind, u64), ParseProblem>;
}

/// How [`drive`] ended, for the adapter's clean-up.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum DriveEnd {
    /// A terminal item (finish or failure) was delivered or the stream failed on the engine's
    /// side; nothing to abort.
    Ended,
    /// The consumer dropped the stream, or the engine went silent: abort on the engine.
    AbortOnEngine,
}

/// Reads `body` as SSE, sends chunks to `sender`, and always ends with a terminal item unless
/// the consumer is gone.
pub(crate) async fn drive(
    engine: &HttpEngine,
    body: Incoming,
    sender: &mpsc::Sender<Result<EngineChunk, EngineFailure>>,
    parser: &mut dyn EventParser,
    rid: &str,
    entry: &Arc<InFlightEntry>,
) -> DriveEnd {
    let mut reader = EventReader {
        body,
        decoder: SseDecoder::new(engine.config.event_bytes_max),
        events: VecDeque::new(),
        idle: Duration::from_millis(engine.config.idle_timeout_ms),
        progress_by: tokio::time::Instant::now()
            + Duration::from_millis(engine.config.idle_timeout_ms),
    };
    loop {
        let next = tokio::select! {
            biased;
            _ = sender.closed() => return DriveEnd::AbortOnEngine,
            next = reader.next(engine) => next,
        };
        let step = match next {
            Err(error @ EngineFailure::TimedOut { .. }) => {
                terminal(engine, rid, entry, sender, Err(error)).await;
                return DriveEnd::AbortOnEngine;
            }
            Err(error) => {
                terminal(engine, rid, entry, sender, Err(error)).await;
                return DriveEnd::Ended;
            }
            Ok(ReadEvent::Data(data)) => parser.event(&data),
            Ok(end @ (ReadEvent::Done | ReadEvent::Eof)) => {
                let abort_requested = entry.abort_requested.load(Ordering::SeqCst);
                parser
                    .ended_without_finish(end == ReadEvent::Done, abort_requested)
                    .map(|finish| Parsed {
                        finish: Some(finish),
                        ..Parsed::default()
                    })
            }
        };
        let parsed = match step {
            Ok(parsed) => parsed,
            Err(problem) => {
                let error = match problem {
                    ParseProblem::Protocol(message) => engine.protocol(message),
                    ParseProblem::Failed(message) => EngineFailure::Failed {
                        engine: engine.name.clone(),
                        message,
                    },
                };
                terminal(engine, rid, entry, sender, Err(error)).await;
                // The engine may still be generating for a stream we stopped reading.
                return DriveEnd::AbortOnEngine;
            }
        };
        if !parsed.ids.is_empty() {
            let chunk = EngineChunk::Tokens {
                ids: parsed.ids,
                logprobs: parsed.logprobs,
            };
            if sender.send(Ok(chunk)).await.is_err() {
                return DriveEnd::AbortOnEngine;
            }
            // From here: time waiting on the consumer (a slow harness) is not the engine's.
            reader.progressed();
        }
        if let Some((kind, policy_version)) = parsed.finish {
            let finished = EngineChunk::Finished {
                kind,
                policy_version,
            };
            terminal(engine, rid, entry, sender, Ok(finished)).await;
            // Read the rest (normally just `[DONE]`) so the connection goes back to the pool.
            reader.drain().await;
            return DriveEnd::Ended;
        }
    }
}

/// Frees the rid (it may be reused once the consumer sees the end), then sends the terminal
/// item; a consumer that is gone no longer needs it.
async fn terminal(
    engine: &HttpEngine,
    rid: &str,
    entry: &Arc<InFlightEntry>,
    sender: &mpsc::Sender<Result<EngineChunk, EngineFailure>>,
    item: Result<EngineChunk, EngineFailure>,
) {
    engine.in_flight.remove(rid, entry);
    let _ = sender.send(item).await;
}

#[derive(Debug, PartialEq, Eq)]
enum ReadEvent {
    Data(Vec<u8>),
    Done,
    Eof,
}

struct EventReader {
    body: Incoming,
    decoder: SseDecoder,
    events: VecDeque<Vec<u8>>,
    idle: Duration,
    /// When the stream times out unless a token comes first. Only tokens move it: an engine
    /// (or a gateway in front of it) that is stuck but keeps the connection alive with SSE
    /// comments or events carrying nothing new must not hold the harness forever.
    progress_by: tokio::time::Instant,
}

impl EventReader {
    /// A token arrived: the stream has `idle` again for the next.
    fn progressed(&mut self) {
        self.progress_by = tokio::time::Instant::now() + self.idle;
    }

    async fn next(&mut self, engine: &HttpEngine) -> Result<ReadEvent, EngineFailure> {
        loop {
            if let Some(data) = self.events.pop_front() {
                if data.as_slice() == b"[DONE]" {
                    return Ok(ReadEvent::Done);
                }
                return Ok(ReadEvent::Data(data));
            }
            let frame = match tokio::time::timeout_at(self.progress_by, self.body.frame()).await {
                Err(_) => {
                    return Err(EngineFailure::TimedOut {
                        engine: engine.name.clone(),
                        waiting_for: "the next token",
                        after_ms: engine.config.idle_timeout_ms,
                    })
                }
                Ok(frame) => frame,
            };
            match frame {
                None if self.decoder.is_mid_event() => {
                    return Err(engine.unreachable("the stream ended in the middle of an event"))
                }
                None => return Ok(ReadEvent::Eof),
                Some(Err(error)) => {
                    return Err(engine.unreachable(format!("stream cut: {}", error_chain(&error))))
                }
                Some(Ok(frame)) => {
                    let Ok(data) = frame.into_data() else {
                        continue;
                    };
                    let mut events = Vec::new();
                    self.decoder
                        .push(&data, &mut events)
                        .map_err(|message| engine.protocol(message))?;
                    self.events.extend(events);
                }
            }
        }
    }

    /// Reads to the end of the body (normally a `[DONE]`) so the connection can be reused, for
    /// at most the idle timeout in all and [`DRAIN_BYTES_MAX`] bytes; errors are irrelevant
    /// now. An engine that keeps sending after its finish loses the connection instead of
    /// holding this task for ever.
    async fn drain(&mut self) {
        let deadline = tokio::time::Instant::now() + self.idle;
        let mut bytes = 0usize;
        while bytes <= DRAIN_BYTES_MAX {
            match tokio::time::timeout_at(deadline, self.body.frame()).await {
                Ok(Some(Ok(frame))) => {
                    bytes += frame.data_ref().map_or(0, |data| data.len());
                }
                _ => return,
            }
        }
    }
}

/// Spawns the reader task of one stream and returns the stream. `abort_on_engine` runs when
/// the consumer went away or the engine went silent.
pub(crate) fn spawn_stream<P, A>(
    engine: Arc<HttpEngine>,
    registration: Registration,
    body: Incoming,
    mut parser: P,
    abort_on_engine: A,
) -> ChunkStream
where
    P: EventParser,
    A: FnOnce(Arc<HttpEngine>, Arc<InFlightEntry>) -> super::BoxFuture<'static, ()>
        + Send
        + 'static,
{
    let (rid, entry) = registration.into_stream();
    let (sender, receiver) = mpsc::channel(engine.config.channel_capacity.max(1));
    // The task is owned by the returned stream: it ends when the terminal item is sent or the
    // receiver is dropped.
    tokio::spawn(async move {
        let end = drive(&engine, body, &sender, &mut parser, &rid, &entry).await;
        engine.in_flight.remove(&rid, &entry);
        if end == DriveEnd::AbortOnEngine {
            abort_on_engine(engine, entry).await;
        }
    });
    receiver
}
