//! The proxy's HTTP server: the IO shell around the pure core (axum on tokio).
//!
//! Routes (each model route also under `/x/<token>/…`, so a harness that can only set a base
//! URL is pointed at its own execution):
//! - `POST /v1/messages` (`?beta=true` accepted), `POST /v1/messages/count_tokens` — Anthropic;
//! - `POST /v1/chat/completions` — OpenAI Chat Completions; `POST /v1/responses` — Responses;
//! - `HEAD|GET /api/hello` — Claude Code's preflight; `GET /health`; `GET /metrics` (Prometheus);
//! - `POST /admin/executions` `{"execution"?: n, "engine"?: i}` → a credential and base URLs;
//!   `POST /admin/executions/<token>/close`; `POST /admin/executions/<token>/route {"engine": i}`.
//!
//! Execution identity: the credential is the API key (`x-api-key` or `Authorization: Bearer`)
//! or the `/x/<token>` path prefix. Unknown or closed credentials get 401 in the API's shape.
//! Bodies over `body_bytes_max` get 413 in the API's shape; nothing is recorded for a rejected
//! call. A call's TITO record is committed to the sink before the end of its answer is sent.

mod capture;
pub mod credentials;
mod generate;
mod metrics;
pub mod output_ids;
pub mod session;
pub mod sink;
mod websocket;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use gyre_event::{ExecutionId, SamplingSettings, Timestamp};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::body::ParsedBody;
use crate::engine::TokenEngine;
use crate::messages::Api;
use crate::model_dir::ChatModel;
use crate::output::OutputFormat;
use crate::stored_responses::{self, StoredResponse};
use crate::template::CivilDateTime;
use crate::{ApiError, ApiErrorKind};

pub use metrics::{Metrics, Stage};
use session::Session;
pub use sink::{CommitFailure, ControlSink, FileSink, RecordSink};

/// Server settings (the `gyre proxy` flags).
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Request bodies above this get 413.
    pub body_bytes_max: usize,
    /// A request body with no byte for this long gets 408.
    pub body_idle_timeout: std::time::Duration,
    /// A client gets this long to send a request's headers; then its connection is closed (one
    /// that opens and sends nothing, or stops inside its headers, is not held forever).
    pub header_read_timeout: std::time::Duration,
    /// Most client connections served at once. One more is answered "overloaded" (529 /
    /// 503, `retry-after: 1`) and closed, so a client opening connections without end cannot
    /// take the descriptors the log, the engines' connections and the other harnesses need.
    pub max_connections: usize,
    /// Cap on new tokens per call (a request's `max_tokens` is clipped to it).
    pub max_new_tokens: u32,
    /// The engines' context window in tokens (prompt and answer), when known: a prompt that
    /// leaves no room for one answer token is refused as each API words it (the harnesses
    /// compact their conversation on it), and an answer is cut to the room left.
    pub context_tokens_max: Option<u32>,
    /// Engines tried for one call before the harness gets an overloaded error.
    pub engine_attempts_max: usize,
    /// Base URL printed in credentials (`http://host:port`).
    pub public_url: String,
    /// When set, `/admin/*` answers only requests with `Authorization: Bearer <this>` (401
    /// otherwise); `None` leaves them open to whoever reaches the port.
    pub admin_token: Option<String>,
    /// An unknown credential opens a new execution under that credential instead of getting
    /// 401 (for replaying captured harness traffic, or harnesses with a fixed key).
    pub auto_open: bool,
    /// Memory, over all executions, for each agent's last request body kept parsed so that
    /// the next body parses only its new part (counted as 3× the body's bytes: the bytes
    /// and the parsed document). Beyond it, bodies parse whole. 0 turns reuse off.
    pub body_cache_bytes_max: usize,
    /// Memory, over all executions, for stored OpenAI Responses (`store` not false) that a
    /// later request may continue with `previous_response_id` (each charged the bytes it
    /// holds itself, for as long as a later response in its chain shares them). Beyond it, a
    /// response is not stored and continuing it is the API's 400 "not found".
    pub response_store_bytes_max: usize,
    /// Memory, over all executions, for the Anthropic Message Threads the proxy holds (each
    /// thread charged its conversation's JSON bytes; see [`crate::message_threads`]). When it
    /// is spent, the execution holding the most gives up its oldest thread (a later `continue`
    /// of it is the API's `thread_not_found`, on which clients send the turn again whole).
    pub thread_store_bytes_max: usize,
    /// Append every authenticated model-API request (exact body, secrets redacted) to this
    /// JSON-lines file (`capture.rs`).
    pub capture: Option<std::path::PathBuf>,
    /// Keep issued credentials (their hashes) here, so executions resume after a restart
    /// (`credentials.rs`). Without it credentials live as long as the process.
    pub credentials: Option<std::path::PathBuf>,
    /// Which ids this proxy gives the executions it numbers itself.
    pub numbering: ExecutionNumbering,
    /// Images, audio and files in requests: placeholders, or refused (`crate::media`).
    pub media: crate::media::MediaPolicy,
    /// Whose sampling settings the engine samples with.
    pub sampling: SamplingPolicy,
    /// The model id `GET /v1/models` lists (calls are answered whatever model they name).
    pub served_model: String,
}

/// Whose sampling settings (`temperature`, `top_p`, `top_k`) an engine samples a call with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SamplingPolicy {
    /// The policy's own distribution (temperature 1, no truncation), whatever the harness
    /// asks: the behaviour log-probs are then the ones a trainer recomputes, so every output is
    /// trainable. A harness's own settings are ignored (counted on `/metrics`). For training.
    #[default]
    Policy,
    /// The harness's settings go to the engine (for serving or evaluating a checkpoint). The
    /// record keeps them; a call sampled with anything but the policy's own settings is
    /// context for training, never targets, since its log-probs are of another distribution.
    Harness,
}

impl SamplingPolicy {
    /// The settings a call with the request's `sampling` is drawn with.
    pub fn settings(&self, sampling: &crate::messages::SamplingParams) -> SamplingSettings {
        match self {
            SamplingPolicy::Policy => SamplingSettings::POLICY,
            SamplingPolicy::Harness => SamplingSettings {
                temperature: sampling.temperature.unwrap_or(1.0) as f32,
                top_p: sampling.top_p.unwrap_or(1.0) as f32,
                top_k: sampling.top_k,
            },
        }
    }
}

/// The ids a proxy gives the executions it numbers itself (opened without an id, or by
/// `--auto-open`): those `n ≥ 1` with `n ≡ offset (mod stride)`, in order. Proxies that record
/// to one control quorum are given one stride and distinct offsets, so their executions never
/// share an id. Executions opened with an explicit id (the scheduler's) are not affected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExecutionNumbering {
    stride: u64,
    offset: u64,
}

impl Default for ExecutionNumbering {
    fn default() -> Self {
        ExecutionNumbering {
            stride: 1,
            offset: 0,
        }
    }
}

impl ExecutionNumbering {
    /// A numbering, or why not (the error names the field).
    pub fn new(stride: u64, offset: u64) -> Result<Self, String> {
        if stride == 0 {
            return Err("field `execution_stride` must be at least 1".into());
        }
        if offset >= stride {
            return Err(format!(
                "field `execution_offset` ({offset}) must be below `execution_stride` ({stride})"
            ));
        }
        Ok(ExecutionNumbering { stride, offset })
    }

    pub fn stride(&self) -> u64 {
        self.stride
    }

    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The first of this numbering's ids at or after `from` (`u64::MAX` past the last one).
    pub fn first_from(&self, from: u64) -> u64 {
        let from = from.max(1);
        let at = from % self.stride;
        let ahead = if at <= self.offset {
            self.offset - at
        } else {
            self.stride - (at - self.offset)
        };
        from.saturating_add(ahead)
    }

    pub fn owns(&self, id: u64) -> bool {
        id >= 1 && id % self.stride == self.offset
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            body_bytes_max: 32 << 20,
            body_idle_timeout: std::time::Duration::from_secs(60),
            header_read_timeout: std::time::Duration::from_secs(30),
            max_connections: 4096,
            max_new_tokens: 32768,
            context_tokens_max: None,
            engine_attempts_max: 4,
            public_url: String::new(),
            admin_token: None,
            auto_open: false,
            body_cache_bytes_max: 256 << 20,
            response_store_bytes_max: 256 << 20,
            thread_store_bytes_max: 256 << 20,
            capture: None,
            credentials: None,
            numbering: ExecutionNumbering::default(),
            media: crate::media::MediaPolicy::default(),
            sampling: SamplingPolicy::default(),
            served_model: DEFAULT_SERVED_MODEL.into(),
        }
    }
}

/// The model id listed by `GET /v1/models` unless the proxy is told another.
pub const DEFAULT_SERVED_MODEL: &str = "gyre-policy";

/// One execution's session, shared by its concurrent calls (sub-agents run in parallel).
#[derive(Clone)]
pub struct ExecutionHandle(Arc<Execution>);

/// What a credential names.
#[derive(Clone)]
pub enum Credential {
    Open(ExecutionHandle),
    /// Closed: its calls get 401. The session is freed once the calls in flight finish.
    Closed(ClosedCredential),
}

#[derive(Clone, Debug)]
pub struct ClosedCredential {
    pub execution: ExecutionId,
    /// Why the session could not be rebuilt after a restart; `None` for a close.
    pub lost: Option<Arc<str>>,
}

impl Credential {
    /// The open execution, if it is one.
    pub fn open(self) -> Option<ExecutionHandle> {
        match self {
            Credential::Open(handle) => Some(handle),
            Credential::Closed(_) => None,
        }
    }

    pub fn execution(&self) -> ExecutionId {
        match self {
            Credential::Open(handle) => handle.id(),
            Credential::Closed(closed) => closed.execution,
        }
    }
}

struct Execution {
    /// The execution's id (its session's, kept here so nothing needs the session's lock for it).
    id: ExecutionId,
    /// Index of the engine the execution is pinned to. Outside the session's lock: a route
    /// event moves an execution while a call of it renders and tokenizes under that lock.
    engine: AtomicUsize,
    /// Closed (by the scheduler, an operator or a restart that could not rebuild it): its
    /// credential accepts no more calls. The credential then maps to a [`ClosedCredential`];
    /// calls in flight hold this handle and finish.
    closed: AtomicBool,
    session: Mutex<Session>,
    /// Each agent's last request body, parsed: the next body of that agent parses only the
    /// bytes after what the two share (see [`crate::body`]).
    bodies: Mutex<Vec<KeptBody>>,
    /// The last [`RESPONSES_KEPT`] stored Responses answers, oldest first.
    responses: Mutex<std::collections::VecDeque<KeptResponse>>,
    /// Bytes of the response store this execution's stored responses hold (kept ones and the
    /// parents they share): who makes room first when the store is full.
    response_bytes: Arc<AtomicUsize>,
    /// Anthropic Message Threads the execution holds (see [`crate::message_threads`]).
    threads: Arc<Mutex<crate::message_threads::ThreadStore>>,
}

/// Stored responses kept per execution for `previous_response_id` (a chaining client
/// continues the latest; older ones are shared by it as its parents).
const RESPONSES_KEPT: usize = 8;

struct KeptResponse {
    id: String,
    response: Arc<StoredResponse>,
}

/// What a Responses call stores when its answer ends (its `store` was not false): the
/// response it continued and its own input items.
pub(crate) struct StoreOnEnd {
    parent: Option<Arc<StoredResponse>>,
    input_items: Vec<u8>,
    /// A conversation over the body limit could never be continued: not kept.
    body_bytes_max: usize,
    /// Where a chained response is committed before it is handed over.
    sink: Arc<dyn RecordSink>,
    /// Whose stored responses make room when the store is full.
    app: Arc<AppState>,
    /// The request starts a conversation (it continues no response and its input holds no
    /// assistant output): its answer is committed before it is handed over, like a chained
    /// one, so a chaining client's first `previous_response_id` survives a restart too. Small
    /// (instructions are not items), and once per conversation: a client re-sending whole
    /// conversations writes nothing after its first request.
    opens_conversation: bool,
}

impl StoreOnEnd {
    /// Stores the answer `id` with its `output` items in `execution`, before the harness can
    /// name it; returns it when kept.
    pub(crate) fn store(
        &self,
        execution: &ExecutionHandle,
        id: &str,
        output: &[Value],
    ) -> Option<Arc<StoredResponse>> {
        let response = StoredResponse::new(id, self.parent.clone(), &self.input_items, output);
        if response.conversation_bytes() > self.body_bytes_max {
            tracing::warn!(
                id,
                bytes = response.conversation_bytes(),
                "a stored response's conversation is over the body limit; not kept"
            );
            return None;
        }
        // Each response is charged what it holds itself, for as long as it lives (a parent
        // shared by later responses stays charged).
        let Some(charge) = self.app.charge_response(execution, response.own_bytes()) else {
            tracing::warn!(
                id,
                bytes = response.own_bytes(),
                "the response store is full (--response-store-mib); this response is not kept"
            );
            return None;
        };
        let response = Arc::new(response.with_guard(charge));
        execution.keep_response(id, response.clone());
        Some(response)
    }

    /// Whether the answer is committed before it is handed over: it continues another (then
    /// with whatever of its chain the log lacks) or it opens a conversation.
    pub(crate) fn durable_before_handover(&self, response: &StoredResponse) -> bool {
        response.is_chained() || self.opens_conversation
    }

    /// Commits `response` and whatever of its chain the log lacks, oldest first, as
    /// `ResponseStored` events in one batch: after this a restarted proxy still resolves its
    /// id. (A call's answer goes with its record instead: [`UnpersistedTurns::of`].)
    pub(crate) async fn persist(
        &self,
        execution: ExecutionId,
        response: &Arc<StoredResponse>,
    ) -> Result<(), String> {
        let mut turns = UnpersistedTurns::of(execution, response);
        match self.sink.commit(std::mem::take(&mut turns.events)).await {
            Ok(()) => {
                turns.committed();
                Ok(())
            }
            Err(failure) => {
                turns.committed_at(&failure.durable, 0);
                Err(failure.message)
            }
        }
    }
}

/// A stored response and whatever of its chain the log lacks, as `ResponseStored` events
/// (oldest first) to commit in the same batch as the call's record.
pub(crate) struct UnpersistedTurns {
    pub(crate) events: Vec<gyre_event::Event>,
    responses: Vec<Arc<StoredResponse>>,
}

impl UnpersistedTurns {
    pub(crate) fn of(execution: ExecutionId, response: &Arc<StoredResponse>) -> Self {
        let responses = response.unpersisted_chain();
        let events = responses
            .iter()
            .map(|turn| {
                gyre_event::Event::new(
                    wall_clock(),
                    gyre_event::EventBody::ResponseStored(Box::new(turn.record(execution))),
                )
            })
            .collect();
        UnpersistedTurns { events, responses }
    }

    /// The events are durable: the log holds these responses now.
    pub(crate) fn committed(self) {
        for turn in self.responses {
            turn.set_persisted();
        }
    }

    /// A batch whose events from position `first` on were these turns' failed to commit
    /// whole: those at the `durable` positions are in the log all the same.
    pub(crate) fn committed_at(&self, durable: &[usize], first: usize) {
        for (at, turn) in self.responses.iter().enumerate() {
            if durable.contains(&(first + at)) {
                turn.set_persisted();
            }
        }
    }
}

/// Bodies kept per execution (agents beyond this parse their next body whole).
const BODIES_KEPT: usize = 4;

struct KeptBody {
    api: Api,
    agent: String,
    body: ParsedBody,
    _charge: Charge,
}

/// The memory all kept bodies may use ([`ServerConfig::body_cache_bytes_max`]).
struct BodyBudget {
    used: AtomicUsize,
    max: usize,
}

/// A kept body's share of the [`BodyBudget`], returned when the body is dropped.
struct Charge {
    budget: Arc<BodyBudget>,
    bytes: usize,
    /// The holder's own count of what it is charged, if it keeps one.
    owner: Option<Arc<AtomicUsize>>,
}

impl Charge {
    fn take(budget: &Arc<BodyBudget>, bytes: usize) -> Option<Charge> {
        Charge::take_for(budget, bytes, None)
    }

    fn take_for(
        budget: &Arc<BodyBudget>,
        bytes: usize,
        owner: Option<&Arc<AtomicUsize>>,
    ) -> Option<Charge> {
        budget
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                (used + bytes <= budget.max).then_some(used + bytes)
            })
            .ok()?;
        Some(Charge::counted(budget, bytes, owner))
    }

    /// Charges `bytes` even past the budget: for memory that is held anyway (see
    /// [`AppState::charge_response`]); the next charges make room again.
    fn force(budget: &Arc<BodyBudget>, bytes: usize, owner: Option<&Arc<AtomicUsize>>) -> Charge {
        budget.used.fetch_add(bytes, Ordering::AcqRel);
        Charge::counted(budget, bytes, owner)
    }

    fn counted(budget: &Arc<BodyBudget>, bytes: usize, owner: Option<&Arc<AtomicUsize>>) -> Charge {
        if let Some(owner) = owner {
            owner.fetch_add(bytes, Ordering::AcqRel);
        }
        Charge {
            budget: budget.clone(),
            bytes,
            owner: owner.cloned(),
        }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
        if let Some(owner) = &self.owner {
            owner.fetch_sub(self.bytes, Ordering::AcqRel);
        }
    }
}

impl ExecutionHandle {
    fn new(session: Session, engine: usize) -> Self {
        ExecutionHandle(Arc::new(Execution {
            id: session.execution,
            engine: AtomicUsize::new(engine),
            closed: AtomicBool::new(false),
            session: Mutex::new(session),
            bodies: Mutex::new(Vec::new()),
            responses: Mutex::new(std::collections::VecDeque::new()),
            response_bytes: Arc::new(AtomicUsize::new(0)),
            threads: Arc::new(Mutex::new(Default::default())),
        }))
    }

    pub fn id(&self) -> ExecutionId {
        self.0.id
    }

    /// The Anthropic Message Threads this execution holds.
    fn threads(&self) -> Arc<Mutex<crate::message_threads::ThreadStore>> {
        self.0.threads.clone()
    }

    /// The engine this execution's next call goes to.
    pub fn engine(&self) -> usize {
        self.0.engine.load(Ordering::Acquire)
    }

    pub(crate) fn pin(&self, engine: usize) {
        self.0.engine.store(engine, Ordering::Release);
    }

    /// Moves the execution from engine `from` to `to`; false when it was not on `from`.
    fn move_off(&self, from: usize, to: usize) -> bool {
        self.0
            .engine
            .compare_exchange(from, to, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    pub fn is_closed(&self) -> bool {
        self.0.closed.load(Ordering::Acquire)
    }

    /// Marks the execution closed; true for the caller that closed it.
    fn mark_closed(&self) -> bool {
        !self.0.closed.swap(true, Ordering::AcqRel)
    }

    pub fn lock(&self) -> MutexGuard<'_, Session> {
        self.0
            .session
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn responses(&self) -> MutexGuard<'_, std::collections::VecDeque<KeptResponse>> {
        self.0
            .responses
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn response_bytes(&self) -> usize {
        self.0.response_bytes.load(Ordering::Acquire)
    }

    /// Keeps `response` as this execution's newest stored response (the oldest of the last
    /// [`RESPONSES_KEPT`] goes).
    fn keep_response(&self, id: &str, response: Arc<StoredResponse>) {
        let mut kept = self.responses();
        if kept.len() >= RESPONSES_KEPT {
            kept.pop_front();
        }
        kept.push_back(KeptResponse {
            id: id.to_string(),
            response,
        });
    }

    /// Rebuilds the stored response `id` from `records` (this execution's `ResponseStored`
    /// records, read back from the log in commit order) with the chain it continues, and keeps
    /// it as the newest. A parent still in memory is shared, not rebuilt. Each rebuilt response
    /// is charged like a new one (making room if need be). Returns it, for the request that
    /// asked to use even if another execution's charge gives it up meanwhile; `None` when
    /// `records` do not hold `id` and its whole chain, or the store cannot hold it.
    fn restore_chain(
        &self,
        app: &AppState,
        records: Vec<gyre_event::StoredResponseRecord>,
        id: &str,
    ) -> Option<Arc<StoredResponse>> {
        let mut by_id: HashMap<String, gyre_event::StoredResponseRecord> = HashMap::new();
        // A Message Thread's turn is not a Responses answer, whatever id a client names.
        for record in records
            .into_iter()
            .filter(|record| !crate::message_threads::is_thread_record(&record.response_id))
        {
            by_id.entry(record.response_id.clone()).or_insert(record);
        }
        // Every response in memory (kept ones and their earlier turns), each visited once.
        let mut in_memory: HashMap<String, Arc<StoredResponse>> = HashMap::new();
        let kept: Vec<Arc<StoredResponse>> = self
            .responses()
            .iter()
            .map(|kept| kept.response.clone())
            .collect();
        for response in kept {
            let mut at = Some(response);
            while let Some(turn) = at {
                if in_memory.contains_key(turn.id()) {
                    break;
                }
                at = turn.parent().cloned();
                in_memory.insert(turn.id().to_string(), turn);
            }
        }
        // From `id` back to the root, or to a response still in memory.
        let mut chain = Vec::new();
        let mut parent = None;
        let mut next = Some(id.to_string());
        while let Some(wanted) = next.take() {
            if let Some(held) = in_memory.get(&wanted) {
                parent = Some(held.clone());
                break;
            }
            let Some(record) = by_id.remove(&wanted) else {
                tracing::warn!(
                    id,
                    missing = wanted,
                    "a stored response's chain is not in the log"
                );
                return None;
            };
            next.clone_from(&record.previous_response_id);
            chain.push(record);
        }
        if chain.is_empty() {
            return parent;
        }
        for record in chain.into_iter().rev() {
            let response =
                StoredResponse::from_items(&record.response_id, parent, record.items, true);
            let Some(charge) = app.charge_response(self, response.own_bytes()) else {
                tracing::warn!(
                    id = record.response_id,
                    "the response store is full (--response-store-mib); a stored response read \
                     back from the log is not kept"
                );
                return None;
            };
            parent = Some(Arc::new(response.with_guard(charge)));
        }
        parent.map(|response| self.keep_restored(id, response))
    }

    /// Keeps `response`, read back as `id`, unless a concurrent read-back of the same id kept
    /// one meanwhile: then that one is returned and this copy dropped (its charge with it), so
    /// an id takes one of the kept slots and is charged once.
    fn keep_restored(&self, id: &str, response: Arc<StoredResponse>) -> Arc<StoredResponse> {
        let mut kept = self.responses();
        if let Some(found) = kept.iter().find(|kept| kept.id == id) {
            return found.response.clone();
        }
        if kept.len() >= RESPONSES_KEPT {
            kept.pop_front();
        }
        kept.push_back(KeptResponse {
            id: id.to_string(),
            response: response.clone(),
        });
        response
    }

    /// The stored response `id` of this execution.
    /// Rebuilds the stored responses a restarted proxy read from the log (`records` in
    /// commit order): every chain is rebuilt, the last [`RESPONSES_KEPT`] are kept, each
    /// charged its own bytes. A record naming a response that is not rebuilt (not in the log,
    /// or refused for want of budget) is skipped, as is a second record under one id.
    /// Returns how many are kept.
    fn restore_responses(
        &self,
        records: Vec<gyre_event::StoredResponseRecord>,
        budget: &Arc<BodyBudget>,
    ) -> usize {
        let mut built: HashMap<String, Arc<StoredResponse>> = HashMap::new();
        let mut order = Vec::new();
        for record in records {
            if built.contains_key(&record.response_id) {
                continue;
            }
            let parent = match &record.previous_response_id {
                None => None,
                Some(previous) => match built.get(previous) {
                    Some(parent) => Some(parent.clone()),
                    None => {
                        tracing::warn!(
                            id = record.response_id,
                            previous,
                            "a stored response whose parent was not rebuilt is skipped"
                        );
                        continue;
                    }
                },
            };
            let response =
                StoredResponse::from_items(&record.response_id, parent, record.items, true);
            let Some(charge) =
                Charge::take_for(budget, response.own_bytes(), Some(&self.0.response_bytes))
            else {
                tracing::warn!(
                    id = record.response_id,
                    "the response store is full (--response-store-mib); a stored response \
                     read from the log is not kept"
                );
                continue;
            };
            order.push(record.response_id.clone());
            built.insert(record.response_id, Arc::new(response.with_guard(charge)));
        }
        let mut kept = self.responses();
        for id in order
            .iter()
            .skip(order.len().saturating_sub(RESPONSES_KEPT))
        {
            if let Some(response) = built.get(id) {
                kept.push_back(KeptResponse {
                    id: id.clone(),
                    response: response.clone(),
                });
            }
        }
        kept.len()
    }

    /// The item with `id` in the execution's stored responses, newest first.
    fn stored_item(&self, id: &str) -> Option<Value> {
        let kept: Vec<Arc<StoredResponse>> = self
            .responses()
            .iter()
            .rev()
            .map(|kept| kept.response.clone())
            .collect();
        kept.iter().find_map(|response| response.find_item(id))
    }

    /// The stored response `id` of this execution in memory: a kept one, or an earlier turn
    /// of a kept one's chain (a client may fork from any turn it was given).
    fn stored_response(&self, id: &str) -> Option<Arc<StoredResponse>> {
        let kept: Vec<Arc<StoredResponse>> = {
            let kept = self.responses();
            if let Some(found) = kept.iter().rev().find(|kept| kept.id == id) {
                return Some(found.response.clone());
            }
            kept.iter().map(|kept| kept.response.clone()).collect()
        };
        kept.iter()
            .rev()
            .find_map(|response| response.find_in_chain(id))
    }

    fn bodies(&self) -> MutexGuard<'_, Vec<KeptBody>> {
        self.0
            .bodies
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Takes `agent`'s last body (a concurrent call of the same agent parses whole).
    fn take_body(&self, api: Api, agent: &str) -> Option<ParsedBody> {
        let mut bodies = self.bodies();
        let at = bodies
            .iter()
            .position(|kept| kept.api == api && kept.agent == agent)?;
        Some(bodies.remove(at).body)
    }

    /// Keeps `body` as `agent`'s last one, dropping the least recently kept beyond the
    /// per-execution bound; not kept when the budget is spent.
    fn keep_body(&self, budget: &Arc<BodyBudget>, api: Api, agent: String, body: ParsedBody) {
        let mut bodies = self.bodies();
        bodies.retain(|kept| !(kept.api == api && kept.agent == agent));
        if bodies.len() >= BODIES_KEPT {
            bodies.remove(0);
        }
        if let Some(charge) = Charge::take(budget, body.len().saturating_mul(3)) {
            bodies.push(KeptBody {
                api,
                agent,
                body,
                _charge: charge,
            });
        }
    }
}

pub struct AppState {
    pub config: ServerConfig,
    pub model: Arc<ChatModel>,
    pub output_format: OutputFormat,
    pub engines: Vec<Arc<dyn TokenEngine>>,
    pub stop_token_ids: Vec<u32>,
    pub sink: Arc<dyn RecordSink>,
    /// Every credential this process served or was asked about: its open execution, or what
    /// a closed one leaves (a few words: a long run closes an execution per rollout).
    executions: Mutex<HashMap<String, Credential>>,
    next_execution: AtomicU64,
    /// Execution ids this proxy opened, was issued credentials for before a restart, or found
    /// records of in its log: an id is opened once, whoever names it (two sessions under one
    /// id would record the same call ids twice).
    taken: Mutex<HashSet<u64>>,
    next_engine: AtomicU64,
    /// Numbers every engine request this process sends: calls of one execution can be in
    /// flight together (parallel sub-agents), so the call count alone does not tell their
    /// requests apart, and engines refuse a request id that is already in flight.
    next_request: AtomicU64,
    /// Tells this process's request ids from an earlier process's (whose requests an engine
    /// may still be running after a restart): the start time, in base 36.
    request_tag: String,
    /// Engines the log says are down.
    down: Mutex<std::collections::BTreeSet<usize>>,
    /// The policy version each engine last reported (at the end of an answer or an abort):
    /// the version of an attempt cut by the engine's death, which reports none.
    engine_versions: Vec<AtomicU64>,
    routes_applied: tokio::sync::watch::Sender<u64>,
    /// Bounds the calls being parsed, rendered and tokenized at once to the cores there are:
    /// more threads would only add switching, and the async workers must keep a core.
    preparing: tokio::sync::Semaphore,
    bodies: Arc<BodyBudget>,
    responses: Arc<BodyBudget>,
    /// The Anthropic Message Threads held over all executions.
    threads: Arc<BodyBudget>,
    capture: Option<capture::Capture>,
    credentials: Option<credentials::CredentialFile>,
    /// Credentials issued before this process started, and the sessions rebuilt for them.
    issued: Mutex<Issued>,
    pub metrics: Metrics,
    /// The Responses WebSockets' part in a graceful stop: `true` once the server stops. Each
    /// socket holds a receiver from its handshake on and closes with 1001 (going away) at the
    /// first moment no answer of its is in flight; the server returns once none is held.
    sockets_stop: tokio::sync::watch::Sender<bool>,
}

/// Why an execution could not be opened.
#[derive(Debug)]
pub enum OpenError {
    /// The id was opened before (by this process, under a credential issued before a restart,
    /// or its records are in the log).
    Taken(u64),
    /// The proxy's numbering is used up.
    Numbering(String),
    /// The credential file could not record the new credential.
    Credential(String),
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpenError::Taken(id) => write!(
                f,
                "execution {id} was already opened on this proxy (an id is opened once: a \
                 second session under it would record its call ids again)"
            ),
            OpenError::Numbering(message) => f.write_str(message),
            OpenError::Credential(message) => {
                write!(f, "the credential could not be kept: {message}")
            }
        }
    }
}

impl std::error::Error for OpenError {}

/// What a restarted proxy knows of the credentials and executions it had before.
#[derive(Default)]
struct Issued {
    credentials: credentials::IssuedCredentials,
    /// Sessions rebuilt from the log ([`AppState::recover`]), until their credential is used.
    sessions: HashMap<u64, Session>,
    /// Executions whose sessions could not be rebuilt, and why.
    lost: HashMap<u64, String>,
    /// Handles already given to an earlier credential of the same execution.
    handles: HashMap<u64, ExecutionHandle>,
    /// Executions of `handles` closed since: their other credentials are closed too.
    closed: HashSet<u64>,
    /// Stored responses read from the log ([`AppState::recover`]), in commit order, until
    /// their execution's credential is used.
    responses: HashMap<u64, Vec<gyre_event::StoredResponseRecord>>,
}

/// A recovery in progress ([`AppState::begin_recovery`]).
pub struct Recovering<'a> {
    state: &'a AppState,
    /// Executions with an open credential, and their engines.
    open: std::collections::BTreeMap<u64, usize>,
    max_execution: u64,
    /// The execution of the last record fed (consecutive records mostly share one).
    last_taken: Option<u64>,
    sessions: HashMap<u64, Session>,
    lost: HashMap<u64, String>,
    calls: u64,
    responses: HashMap<u64, Vec<gyre_event::StoredResponseRecord>>,
}

impl Recovering<'_> {
    /// Executions with an open credential (the ones worth rebuilding).
    pub fn open_executions(&self) -> Vec<u64> {
        self.open.keys().copied().collect()
    }

    /// Folds one committed event of the sink's history.
    pub fn feed(&mut self, event: &gyre_event::Event) {
        let record = match &event.body {
            gyre_event::EventBody::ModelCall(record) => record,
            gyre_event::EventBody::ExecutionClosed { execution, .. } => {
                if self.open.contains_key(&execution.get()) {
                    self.closed_by_scheduler(execution.get());
                }
                return;
            }
            gyre_event::EventBody::ResponseStored(record) => {
                let id = record.execution.get();
                if self.open.contains_key(&id) && !self.lost.contains_key(&id) {
                    self.responses
                        .entry(id)
                        .or_default()
                        .push((**record).clone());
                }
                return;
            }
            _ => return,
        };
        let id = record.execution.get();
        self.max_execution = self.max_execution.max(id);
        if self.last_taken != Some(id) {
            self.last_taken = Some(id);
            self.state.taken().insert(id);
        }
        if !self.open.contains_key(&id) || self.lost.contains_key(&id) {
            return;
        }
        let state = self.state;
        let session = self
            .sessions
            .entry(id)
            .or_insert_with(|| Session::new(ExecutionId(id), &state.model));
        match session.recover_record(record, &state.model, &state.output_format) {
            Ok(()) => self.calls += 1,
            Err(error) => {
                self.sessions.remove(&id);
                self.lost.insert(
                    id,
                    format!("its records in the log do not rebuild its session: {error}"),
                );
            }
        }
    }

    /// The scheduler closed `execution` while this proxy was down: its credential stays closed.
    pub fn closed_by_scheduler(&mut self, execution: u64) {
        self.sessions.remove(&execution);
        self.responses.remove(&execution);
        self.lost.insert(
            execution,
            "the scheduler closed this execution (ExecutionClosed in the log)".into(),
        );
    }

    /// The history could not be read to its end: no execution with an open credential can
    /// be trusted to resume (its next call would reuse call ids the log holds).
    pub fn history_unreadable(&mut self, reason: &str) {
        for id in self.open.keys() {
            self.lost
                .insert(*id, format!("the log could not be read back: {reason}"));
        }
        self.sessions.clear();
    }

    /// Finishes the sessions and hands them to the proxy.
    pub fn finish(mut self) -> Recovery {
        let state = self.state;
        // Each session decodes its agents' contexts on its first call (`Session::prepare`),
        // so the proxy serves as soon as the trees are folded.
        let lost = &self.lost;
        self.sessions.retain(|id, _| !lost.contains_key(id));
        self.responses.retain(|id, _| !lost.contains_key(id));
        let after_log = state
            .config
            .numbering
            .first_from(self.max_execution.saturating_add(1));
        let next = state
            .next_execution
            .fetch_max(after_log, Ordering::Relaxed)
            .max(after_log);
        let mut executions_lost: Vec<(u64, String)> = self
            .lost
            .iter()
            .map(|(id, why)| (*id, why.clone()))
            .collect();
        executions_lost.sort();
        let mut issued = state.issued();
        let entries = issued.credentials.by_hash.values();
        let closed = entries.filter(|entry| entry.closed).count();
        let recovery = Recovery {
            credentials_open: issued.credentials.by_hash.len() - closed,
            credentials_closed: closed,
            executions_resumed: self.sessions.len(),
            calls_recovered: self.calls,
            responses_recovered: self.responses.values().map(Vec::len).sum(),
            executions_lost,
            next_execution: next,
        };
        issued.sessions = self.sessions;
        issued.lost = self.lost;
        issued.responses = self.responses;
        recovery
    }
}

/// What [`AppState::recover`] found in the log.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Recovery {
    /// Open credentials from the credential file.
    pub credentials_open: usize,
    pub credentials_closed: usize,
    /// Executions whose sessions were rebuilt, and their calls.
    pub executions_resumed: usize,
    pub calls_recovered: u64,
    /// `ResponseStored` records of those executions (stored Responses answers a chaining
    /// client may still name).
    pub responses_recovered: usize,
    /// Executions that cannot resume (their records do not fold), with the reason.
    pub executions_lost: Vec<(u64, String)>,
    /// The id the next execution opened without one gets.
    pub next_execution: u64,
}

impl AppState {
    /// Notes the policy version engine `index` reported.
    pub(crate) fn engine_reported(&self, index: usize, version: u64) {
        // Versions only grow: an older call's late end, or an engine that reports 0 because it
        // stopped before saying (an SGLang abort before any event), never moves it back.
        if let Some(slot) = self.engine_versions.get(index) {
            slot.fetch_max(version, Ordering::Relaxed);
        }
    }

    /// The policy version engine `index` last reported (0 before it reported any).
    pub(crate) fn engine_version(&self, index: usize) -> u64 {
        self.engine_versions
            .get(index)
            .map_or(0, |slot| slot.load(Ordering::Relaxed))
    }

    pub fn new(
        config: ServerConfig,
        model: Arc<ChatModel>,
        output_format: OutputFormat,
        engines: Vec<Arc<dyn TokenEngine>>,
        sink: Arc<dyn RecordSink>,
    ) -> Result<Arc<AppState>, String> {
        if engines.is_empty() {
            return Err("at least one engine is needed".into());
        }
        if config.response_store_bytes_max < config.body_bytes_max {
            tracing::warn!(
                response_store_bytes = config.response_store_bytes_max,
                body_limit = config.body_bytes_max,
                "the response store is smaller than the body limit: a Responses conversation \
                 longer than the store cannot be continued with previous_response_id"
            );
        }
        let stop_token_ids = output_format
            .end_of_turn
            .iter()
            .filter_map(|token| model.token_id(token))
            .collect();
        let bodies = Arc::new(BodyBudget {
            used: AtomicUsize::new(0),
            max: config.body_cache_bytes_max,
        });
        let responses = Arc::new(BodyBudget {
            used: AtomicUsize::new(0),
            max: config.response_store_bytes_max,
        });
        let threads = Arc::new(BodyBudget {
            used: AtomicUsize::new(0),
            max: config.thread_store_bytes_max,
        });
        let capture = config
            .capture
            .as_deref()
            .map(capture::Capture::open)
            .transpose()?;
        let (credentials, issued) = match config.credentials.as_deref() {
            Some(path) => {
                let (file, issued) = credentials::CredentialFile::open(path)?;
                (Some(file), issued)
            }
            None => (None, credentials::IssuedCredentials::default()),
        };
        let next_execution = config
            .numbering
            .first_from(issued.max_execution.saturating_add(1));
        let taken: HashSet<u64> = issued.executions().collect();
        Ok(Arc::new(AppState {
            bodies,
            responses,
            threads,
            capture,
            credentials,
            issued: Mutex::new(Issued {
                credentials: issued,
                ..Issued::default()
            }),
            config,
            model,
            output_format,
            // Before `engines` moves in: one slot per engine.
            engine_versions: std::iter::repeat_with(|| AtomicU64::new(0))
                .take(engines.len())
                .collect(),
            engines,
            stop_token_ids,
            sink,
            executions: Mutex::new(HashMap::new()),
            next_execution: AtomicU64::new(next_execution),
            taken: Mutex::new(taken),
            next_engine: AtomicU64::new(0),
            next_request: AtomicU64::new(0),
            request_tag: base36(
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |since| since.as_millis() as u64),
            ),
            preparing: tokio::sync::Semaphore::new(
                std::thread::available_parallelism().map_or(2, |cores| cores.get()),
            ),
            down: Mutex::new(std::collections::BTreeSet::new()),
            routes_applied: tokio::sync::watch::Sender::new(0),
            metrics: Metrics::default(),
            sockets_stop: tokio::sync::watch::Sender::new(false),
        }))
    }

    /// Whether the server has begun its graceful stop (it accepts nothing new; answers in
    /// flight finish).
    pub fn stopping(&self) -> bool {
        *self.sockets_stop.borrow()
    }

    /// A socket's view of the stop, taken at its handshake (while its connection still counts
    /// in the accept loop, so no socket can begin after the server waited for them all).
    pub(crate) fn socket_stop(&self) -> tokio::sync::watch::Receiver<bool> {
        self.sockets_stop.subscribe()
    }

    /// Charges `bytes` of a stored response of `execution` to the response store, making room
    /// ([`AppState::give_up_responses`]) until the charge fits. A response the log holds is
    /// read back when a client names it again (`ExecutionHandle::restore_chain`), so a full
    /// store costs a read, not a run. When nothing is left to give up, what is charged is held
    /// by calls in flight (a call keeps the chain it continues until it ends), and the charge
    /// is taken past the budget: the response is needed now, it is at most a conversation under
    /// the body limit, and the next charges make room again. `None` only for a response larger
    /// than the whole store.
    fn charge_response(&self, execution: &ExecutionHandle, bytes: usize) -> Option<Charge> {
        let owner = Some(&execution.0.response_bytes);
        if bytes > self.responses.max {
            return None;
        }
        loop {
            if let Some(charge) = Charge::take_for(&self.responses, bytes, owner) {
                return Some(charge);
            }
            if !self.give_up_responses(execution) {
                tracing::debug!(bytes, "the response store is over its budget for a while");
                return Some(Charge::force(&self.responses, bytes, owner));
            }
        }
    }

    /// Charges a Message Thread of `bytes` against the thread store, making room: while it is
    /// full, the execution holding the most held threads gives up its oldest (see
    /// `ThreadStore::give_up_one`). `None` when the thread is larger than the store, or no
    /// held thread is left to give up (the rest are being continued).
    fn charge_thread(&self, bytes: usize) -> Option<Charge> {
        if bytes > self.threads.max {
            return None;
        }
        loop {
            if let Some(charge) = Charge::take(&self.threads, bytes) {
                return Some(charge);
            }
            // One store locked at a time: the caller holds none.
            let holders: Vec<(usize, ExecutionHandle)> = self
                .execution_handles()
                .into_iter()
                .map(|(_, handle)| {
                    let held = crate::message_threads::lock(&handle.0.threads).held_bytes();
                    (held, handle)
                })
                .filter(|(held, _)| *held > 0)
                .collect();
            // Threads being continued keep their charge and cannot be given up: when giving
            // up every held one would still not make room, none is given up.
            let givable: usize = holders.iter().map(|(held, _)| held).sum();
            let used = self.threads.used.load(Ordering::Acquire);
            if used.saturating_sub(givable) + bytes > self.threads.max {
                return None;
            }
            let (_, victim) = holders.into_iter().max_by_key(|(held, _)| *held)?;
            if !crate::message_threads::lock(&victim.0.threads).give_up_one() {
                // Continued meanwhile: look again.
                continue;
            }
            self.metrics.threads_given_up();
        }
    }

    /// What a request's thread hold charges its answer's thread with.
    fn thread_charger(self: &Arc<Self>) -> crate::message_threads::Charger {
        let app = Arc::downgrade(self);
        Arc::new(move |bytes| {
            let app = app.upgrade()?;
            let charge = app.charge_thread(bytes)?;
            Some(Box::new(charge) as crate::message_threads::Charge)
        })
    }

    /// Makes room in the response store. The execution holding the most of it, other than
    /// `requester` (whose new response holds its own chain, so giving that up frees nothing),
    /// gives up every kept response the log holds: all its memory, unless a call in flight
    /// holds a chain. Where no other execution keeps one the log holds, the largest other
    /// holder gives up what it keeps all the same (those are lost), and last the requester
    /// its oldest. False when nothing is left to give up.
    fn give_up_responses(&self, requester: &ExecutionHandle) -> bool {
        let others: Vec<ExecutionHandle> = self
            .execution_handles()
            .into_iter()
            .map(|(_, handle)| handle)
            .filter(|handle| !Arc::ptr_eq(&handle.0, &requester.0))
            .collect();
        let largest = |persisted_only: bool| {
            others
                .iter()
                .filter(|handle| {
                    handle
                        .responses()
                        .iter()
                        .any(|kept| !persisted_only || kept.response.is_persisted())
                })
                .max_by_key(|handle| handle.response_bytes())
        };
        let mut found_victim = true;
        let given_up: Vec<KeptResponse> = if let Some(victim) = largest(true) {
            let mut kept = victim.responses();
            let mut given_up = Vec::new();
            for entry in std::mem::take(&mut *kept) {
                if entry.response.is_persisted() {
                    given_up.push(entry);
                } else {
                    kept.push_back(entry);
                }
            }
            given_up
        } else if let Some(victim) = largest(false) {
            let given_up: Vec<KeptResponse> = std::mem::take(&mut *victim.responses()).into();
            tracing::warn!(
                responses = given_up.len(),
                "the response store is full (--response-store-mib); stored responses the log \
                 does not hold are dropped"
            );
            given_up
        } else {
            found_victim = false;
            requester.responses().pop_front().into_iter().collect()
        };
        self.metrics.responses_given_up(given_up.len());
        // Dropped here, outside every lock. A victim that another charge emptied between the
        // look and the take gave nothing: the caller looks again (the next look skips it).
        !given_up.is_empty() || found_victim
    }

    fn executions(&self) -> MutexGuard<'_, HashMap<String, Credential>> {
        self.executions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Every open execution's credential and handle, with the map's lock already released:
    /// a caller that locks the sessions (a call's `prepare` holds one through render and
    /// tokenize) must not hold the map meanwhile, or every request's authentication waits.
    fn execution_handles(&self) -> Vec<(String, ExecutionHandle)> {
        self.executions()
            .iter()
            .filter_map(|(token, credential)| match credential {
                Credential::Open(handle) if !handle.is_closed() => {
                    Some((token.clone(), handle.clone()))
                }
                _ => None,
            })
            .collect()
    }

    /// How many executions are open.
    pub fn executions_open(&self) -> usize {
        self.executions()
            .values()
            .filter(
                |credential| matches!(credential, Credential::Open(handle) if !handle.is_closed()),
            )
            .count()
    }

    fn taken(&self) -> MutexGuard<'_, HashSet<u64>> {
        self.taken
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn issued(&self) -> MutexGuard<'_, Issued> {
        self.issued
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Rebuilds what this proxy held before a restart from the records it committed (the
    /// sink's history, in log order): the session of every execution with an open credential
    /// (its tree, call counter, agent contexts and tool-call and reasoning caches), so its
    /// harness continues where it was; and the numbering, so a new execution never reuses an
    /// id the log already holds. Call before serving.
    pub fn recover(&self, history: impl IntoIterator<Item = gyre_event::Event>) -> Recovery {
        let mut recovering = self.begin_recovery();
        for event in history {
            recovering.feed(&event);
        }
        recovering.finish()
    }

    /// [`AppState::recover`] fed piece by piece (a history streamed from the control log).
    pub fn begin_recovery(&self) -> Recovering<'_> {
        let issued = self.issued();
        let open = issued
            .credentials
            .by_hash
            .values()
            .filter(|entry| !entry.closed)
            .map(|entry| (entry.execution, entry.engine))
            .collect();
        let max_execution = issued.credentials.max_execution;
        drop(issued);
        Recovering {
            state: self,
            open,
            max_execution,
            last_taken: None,
            sessions: HashMap::new(),
            lost: HashMap::new(),
            calls: 0,
            responses: HashMap::new(),
        }
    }

    /// Opens an execution; returns its credential (durable in the credential file, if there
    /// is one, before it is returned).
    pub fn open_execution(
        &self,
        execution: Option<u64>,
        engine: Option<usize>,
    ) -> Result<(u64, String), OpenError> {
        let id = match execution {
            Some(id) => {
                if !self.taken().insert(id) {
                    return Err(OpenError::Taken(id));
                }
                id
            }
            None => self.number_execution().map_err(OpenError::Numbering)?,
        };
        let engine = engine.unwrap_or_else(|| {
            let start = self.next_engine.fetch_add(1, Ordering::Relaxed) as usize;
            let start = start % self.engines.len();
            if self.down().contains(&start) {
                self.next_up(start).unwrap_or(start)
            } else {
                start
            }
        }) % self.engines.len();
        let token = generate::random_token();
        if let Some(file) = &self.credentials {
            if let Err(message) = file.record_open(&credentials::token_hash(&token), id, engine) {
                // Nothing was opened: a retry with the same id must not be told it is taken.
                self.taken().remove(&id);
                return Err(OpenError::Credential(message));
            }
        }
        self.open_execution_as(id, engine, &token);
        Ok((id, token))
    }

    /// The next id of this proxy's numbering that is not taken (claimed for the caller).
    fn number_execution(&self) -> Result<u64, String> {
        let stride = self.config.numbering.stride;
        loop {
            let id = self
                .next_execution
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |next| {
                    next.checked_add(stride)
                })
                .map_err(|_| "this proxy has numbered every execution id it owns".to_string())?;
            if self.taken().insert(id) {
                return Ok(id);
            }
        }
    }

    /// Records `token` as opening `id` (auto-open) in the credential file, if there is one.
    fn record_auto_open(&self, token: &str, id: u64, engine: usize) -> Result<(), String> {
        match &self.credentials {
            Some(file) => file.record_open(&credentials::token_hash(token), id, engine),
            None => Ok(()),
        }
    }

    /// Closes the execution under `token` (durably, if there is a credential file). The
    /// credential then maps to a [`ClosedCredential`]: the execution's tree, contexts, caches
    /// and kept bodies (its records are in the log) are freed once the calls still in flight
    /// on it finish, so a long run's memory does not grow with every execution it closed.
    fn close_execution(&self, token: &str, handle: &ExecutionHandle) -> Result<(), String> {
        handle.mark_closed();
        let execution = handle.id();
        self.executions().insert(
            token.to_string(),
            Credential::Closed(ClosedCredential {
                execution,
                lost: None,
            }),
        );
        let mut issued = self.issued();
        if issued.handles.remove(&execution.get()).is_some() {
            issued.closed.insert(execution.get());
        }
        drop(issued);
        self.sink.forget_execution(execution.get());
        match &self.credentials {
            Some(file) => file.record_close(&credentials::token_hash(token)),
            None => Ok(()),
        }
    }

    /// A request id no other request of this process (nor, by its start time, of an earlier
    /// one) carries: `e<execution>-c<call>-<attempt>-<tag>.<n>`, so an engine's logs still
    /// name the execution and call.
    pub(crate) fn request_id(&self, execution: ExecutionId, call: u64, attempt: usize) -> String {
        let n = self.next_request.fetch_add(1, Ordering::Relaxed);
        format!("{execution}-{call}-{attempt}-{}.{n}", self.request_tag)
    }

    /// The execution under `token`, opened as `id` on `engine` if the credential names none
    /// yet (two concurrent first calls with one credential share one execution).
    fn open_execution_as(&self, id: u64, engine: usize, token: &str) -> Credential {
        self.executions()
            .entry(token.to_string())
            .or_insert_with(|| {
                Credential::Open(ExecutionHandle::new(
                    Session::new(ExecutionId(id), &self.model),
                    engine,
                ))
            })
            .clone()
    }

    /// The open execution under `token` (see [`AppState::credential`]).
    pub fn execution(&self, token: &str) -> Option<ExecutionHandle> {
        self.credential(token)?.open()
    }

    /// What `token` names: an execution opened by this process, or one issued before a
    /// restart (its session rebuilt from the log, or new if it made no call yet), open or
    /// closed. `None` for a credential this proxy never issued.
    pub fn credential(&self, token: &str) -> Option<Credential> {
        let found = self.executions().get(token).cloned();
        match found {
            Some(Credential::Open(handle)) if handle.is_closed() => {
                return Some(Credential::Closed(ClosedCredential {
                    execution: handle.id(),
                    lost: None,
                }))
            }
            Some(found) => return Some(found),
            None => {}
        }
        self.credentials.as_ref()?;
        let mut issued = self.issued();
        let entry = *issued
            .credentials
            .by_hash
            .get(&credentials::token_hash(token))?;
        let execution = ExecutionId(entry.execution);
        let credential = if let Some(reason) = issued.lost.get(&entry.execution) {
            Credential::Closed(ClosedCredential {
                execution,
                lost: Some(reason.as_str().into()),
            })
        } else if entry.closed || issued.closed.contains(&entry.execution) {
            Credential::Closed(ClosedCredential {
                execution,
                lost: None,
            })
        } else {
            let handle = match issued.handles.get(&entry.execution) {
                Some(handle) => handle.clone(),
                None => {
                    let session = issued
                        .sessions
                        .remove(&entry.execution)
                        .unwrap_or_else(|| Session::new(execution, &self.model));
                    let handle = ExecutionHandle::new(session, entry.engine % self.engines.len());
                    if let Some(records) = issued.responses.remove(&entry.execution) {
                        let (threads, responses): (Vec<_>, Vec<_>) =
                            records.into_iter().partition(|record| {
                                crate::message_threads::is_thread_record(&record.response_id)
                            });
                        handle.restore_responses(responses, &self.responses);
                        if !threads.is_empty() {
                            let threads = threads
                                .into_iter()
                                .map(|record| {
                                    (
                                        record.response_id,
                                        record.previous_response_id,
                                        record.items,
                                    )
                                })
                                .collect();
                            // The plain budget, no room made: other stores are not locked
                            // while the credentials are.
                            let budget = self.threads.clone();
                            let mut store = crate::message_threads::lock(&handle.0.threads);
                            store.restore(threads, "", |bytes| {
                                Charge::take(&budget, bytes).map(|charge| {
                                    Box::new(charge) as crate::message_threads::Charge
                                })
                            });
                            self.metrics.threads_given_up_by(store.take_given_up());
                        }
                    }
                    issued.handles.insert(entry.execution, handle.clone());
                    handle
                }
            };
            Credential::Open(handle)
        };
        drop(issued);
        Some(
            self.executions()
                .entry(token.to_string())
                .or_insert(credential)
                .clone(),
        )
    }

    /// Follows the scheduler's routing facts from the log. Engine ids are the engines' indexes
    /// (the order of `--engine-url`). `RoutesUpdated` moves the named executions (their next
    /// call goes to the destination; a call in flight on the source is aborted by the source
    /// and continues on the destination through failover); `EngineDown` moves every execution
    /// pinned to that engine to the next engine that is up and keeps new executions off it;
    /// `EngineReady` brings it back; `ExecutionClosed` (the scheduler finished, cancelled or
    /// dropped it) closes its credentials, so its harness's next call gets 401 and its session
    /// is freed. Returns how many executions moved or closed.
    pub fn apply_route_event(&self, body: &gyre_event::EventBody) -> usize {
        use gyre_event::EventBody;
        let moved = self.apply_route_body(body);
        // Counted once the event took effect, so a watcher that sees the count also sees the
        // executions where the event put them.
        if matches!(
            body,
            EventBody::RoutesUpdated { .. }
                | EventBody::EngineDown { .. }
                | EventBody::EngineReady { .. }
                | EventBody::ExecutionClosed { .. }
        ) {
            self.routes_applied.send_modify(|count| *count += 1);
        }
        moved
    }

    fn apply_route_body(&self, body: &gyre_event::EventBody) -> usize {
        use gyre_event::EventBody;
        let engines = self.engines.len();
        match body {
            EventBody::RoutesUpdated { moves, .. } => {
                // The last move of an execution wins, as if applied in order.
                let destinations: HashMap<ExecutionId, usize> = moves
                    .iter()
                    .map(|route| (route.execution, route.to.get() as usize))
                    .filter(|(_, to)| *to < engines)
                    .collect();
                let mut moved = 0;
                for (_, handle) in self.execution_handles() {
                    if let Some(to) = destinations.get(&handle.id()) {
                        handle.pin(*to);
                        moved += 1;
                    }
                }
                moved
            }
            EventBody::EngineDown { engine, .. } => {
                let down = engine.get() as usize;
                self.down().insert(down);
                let Some(next) = self.next_up(down) else {
                    return 0;
                };
                let mut moved = 0;
                for (_, handle) in self.execution_handles() {
                    if handle.move_off(down, next) {
                        moved += 1;
                    }
                }
                moved
            }
            EventBody::EngineReady { engine } => {
                self.down().remove(&(engine.get() as usize));
                0
            }
            EventBody::ExecutionClosed { execution, status } => {
                let open: Vec<(String, ExecutionHandle)> = self
                    .execution_handles()
                    .into_iter()
                    .filter(|(_, handle)| handle.id() == *execution)
                    .collect();
                for (token, handle) in &open {
                    if let Err(error) = self.close_execution(token, handle) {
                        tracing::warn!(%error, execution = execution.get(), ?status, "closed, but not durably");
                    }
                }
                // Credentials issued before a restart and not used since live only in
                // `issued`: closed there too, or the harness's next call would rebuild the
                // session and be recorded after the close.
                let mut issued = self.issued();
                let hashes: Vec<credentials::TokenHash> = issued
                    .credentials
                    .by_hash
                    .iter()
                    .filter(|(_, entry)| entry.execution == execution.get() && !entry.closed)
                    .map(|(hash, _)| *hash)
                    .collect();
                for hash in &hashes {
                    if let Some(entry) = issued.credentials.by_hash.get_mut(hash) {
                        entry.closed = true;
                    }
                    if let Some(file) = &self.credentials {
                        if let Err(error) = file.record_close(hash) {
                            tracing::warn!(%error, execution = execution.get(), ?status, "closed, but not durably");
                        }
                    }
                }
                if !hashes.is_empty() {
                    issued.sessions.remove(&execution.get());
                    issued.responses.remove(&execution.get());
                }
                open.len() + hashes.len()
            }
            _ => 0,
        }
    }

    /// Route events applied so far (tests and operators wait on it).
    pub fn routes_applied(&self) -> tokio::sync::watch::Receiver<u64> {
        self.routes_applied.subscribe()
    }

    /// The engines the log says are down (`EngineDown` without a later `EngineReady`), by
    /// index; `/health` lists them.
    pub fn engines_down(&self) -> Vec<usize> {
        self.down().iter().copied().collect()
    }

    fn down(&self) -> MutexGuard<'_, std::collections::BTreeSet<usize>> {
        self.down
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The first engine after `from` (cyclically) that is not down.
    fn next_up(&self, from: usize) -> Option<usize> {
        let down = self.down();
        (1..=self.engines.len())
            .map(|step| (from + step) % self.engines.len())
            .find(|index| !down.contains(index))
    }
}

/// The leader-independent wall clock, for record times.
pub fn wall_clock() -> Timestamp {
    Timestamp(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos() as u64),
    )
}

fn now_civil() -> CivilDateTime {
    CivilDateTime::from_unix_seconds((wall_clock().nanos() / 1_000_000_000) as i64)
}

/// The router over `state`.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/messages", post(anthropic_messages))
        .route("/x/{token}/v1/messages", post(anthropic_messages_at))
        .route("/v1/messages/count_tokens", post(count_tokens))
        .route("/x/{token}/v1/messages/count_tokens", post(count_tokens_at))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/x/{token}/v1/chat/completions", post(chat_completions_at))
        .route(
            "/v1/responses",
            post(responses).get(websocket::responses_socket),
        )
        .route(
            "/x/{token}/v1/responses",
            post(responses_at).get(websocket::responses_socket_at),
        )
        .route("/v1/models", get(list_models))
        .route("/x/{token}/v1/models", get(list_models))
        .route("/v1/models/{model}", get(one_model))
        .route("/x/{token}/v1/models/{model}", get(one_model))
        .route("/api/hello", get(hello).head(hello))
        .route("/x/{token}/api/hello", get(hello).head(hello))
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .merge(
            Router::new()
                .route("/admin/executions", post(admin_open))
                .route("/admin/executions/{token}/close", post(admin_close))
                .route("/admin/executions/{token}/route", post(admin_route))
                .route_layer(axum::middleware::from_fn_with_state(
                    state.clone(),
                    admin_guard,
                )),
        )
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::map_response(with_request_id))
        .with_state(state)
}

/// Every answer carries a request id under both APIs' header names (`request-id`, Anthropic;
/// `x-request-id`, OpenAI), as the SDKs expect for their `_request_id`.
async fn with_request_id(mut response: Response) -> Response {
    if let Ok(id) = HeaderValue::from_str(&generate::request_id()) {
        let headers = response.headers_mut();
        headers.insert("x-request-id", id.clone());
        headers.insert("request-id", id);
    }
    response
}

/// Binds `listen` and serves until `shutdown` resolves. Returns the bound address at once.
pub async fn serve(
    state: Arc<AppState>,
    listen: SocketAddr,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<std::io::Result<()>>)> {
    let listener = gyre_control::bind_listener(listen)?;
    let address = listener.local_addr()?;
    // Task "proxy-http": owned by the returned handle.
    let task = tokio::spawn(accept_loop(listener, state, shutdown));
    Ok((address, task))
}

/// Connections over the cap that may be pending their "overloaded" answer at once; beyond
/// them a new connection is closed as soon as it is accepted.
const REFUSALS_PENDING_MAX: usize = 64;

/// How long a connection over the cap gets to send its request's headers.
const REFUSAL_HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The API a request is addressed to, from its path and headers (for errors outside a route:
/// an unknown path, a connection over the cap).
fn api_of_request(path: &str, headers: &HeaderMap) -> Api {
    if headers.contains_key("anthropic-version") {
        Api::Anthropic
    } else if path.contains("/responses") {
        Api::OpenAiResponses
    } else if ["/chat/", "/completions", "/models", "/embeddings"]
        .iter()
        .any(|part| path.contains(part))
        && !path.contains("/messages")
    {
        Api::OpenAiChat
    } else if headers.contains_key("authorization") && !headers.contains_key("x-api-key") {
        // OpenAI's SDKs send a bearer token; Anthropic's send `x-api-key` (and Claude Code,
        // bearer or not, sends `anthropic-version`).
        Api::OpenAiChat
    } else {
        Api::Anthropic
    }
}

/// The answer to every request on a connection over `--max-connections`: overloaded, in the
/// API's own format, with `retry-after` (the harnesses retry it) and `connection: close`.
/// The body (up to 1 MiB, for at most the header timeout) is read first: closing a socket
/// with unread bytes resets it, and the client could lose the answer.
async fn over_capacity(
    request: axum::http::Request<hyper::body::Incoming>,
    max: usize,
) -> Response {
    let api = api_of_request(request.uri().path(), request.headers());
    let body = axum::body::Body::new(request.into_body());
    let _ = tokio::time::timeout(REFUSAL_HEADER_TIMEOUT, axum::body::to_bytes(body, 1 << 20)).await;
    let error = ApiError::new(
        api,
        ApiErrorKind::Overloaded,
        format!(
            "the proxy is serving its maximum of {max} connections (--max-connections); retry shortly"
        ),
    );
    let mut response = error_response(&error);
    let headers = response.headers_mut();
    headers.insert("retry-after", HeaderValue::from_static("1"));
    headers.insert("connection", HeaderValue::from_static("close"));
    response
}

/// Accepts connections until `shutdown`; then stops accepting, asks every connection to finish
/// its request in flight (an SSE answer included) and close, and every Responses WebSocket to
/// finish its answer in flight and close with 1001 (going away), and returns once all have.
///
/// Each connection is hyper's HTTP/1 with a timer, so `header_read_timeout` holds (axum's own
/// server gives hyper no timer, and then no header timeout applies).
///
/// At most `max_connections` connections are served; one more is answered "overloaded" and
/// closed (at most [`REFUSALS_PENDING_MAX`] of those pending; beyond them a connection is
/// closed as soon as it is accepted), so the descriptors the log and the engine connections
/// need stay free.
async fn accept_loop(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let header_read_timeout = state.config.header_read_timeout;
    let max_connections = state.config.max_connections.max(1);
    let slots = Arc::new(tokio::sync::Semaphore::new(max_connections));
    let refusals = Arc::new(tokio::sync::Semaphore::new(REFUSALS_PENDING_MAX));
    let mut warned_full = false;
    let app = router(state.clone());
    // TCP keepalive: a harness host that vanishes without closing its connections (a node
    // lost mid-run) frees them within about two minutes instead of holding them forever.
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(std::time::Duration::from_secs(60))
        .with_interval(std::time::Duration::from_secs(10))
        .with_retries(6);
    let (stop, stopping) = tokio::sync::watch::channel(false);
    // Every connection task holds a receiver; `closed()` resolves when the last one ends.
    let (all_closed, connection_open) = tokio::sync::watch::channel(());
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            Err(error) => {
                // Out of descriptors or a connection reset before accept: not fatal. Wait a
                // moment instead of spinning on a full descriptor table.
                tracing::warn!(%error, "accepting a connection");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        // SSE frames are small writes: without TCP_NODELAY, Nagle holds each one until the
        // harness ACKs the previous (a delayed ACK: up to 40 ms per frame).
        let _ = stream.set_nodelay(true);
        let _ = socket2::SockRef::from(&stream).set_tcp_keepalive(&keepalive);
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            state.metrics.connection_refused();
            if !warned_full {
                warned_full = true;
                tracing::warn!(
                    max_connections,
                    "serving the maximum number of connections; new ones are answered overloaded"
                );
            }
            // Over the cap: answer the request "overloaded" and close; when too many of those
            // are pending already, close at once (the kernel resets the connection).
            let Ok(refusal) = refusals.clone().try_acquire_owned() else {
                drop(stream);
                continue;
            };
            // Owned by the accept loop: ends after one answer or the short header timeout.
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request| async move {
                    Ok::<_, std::convert::Infallible>(over_capacity(request, max_connections).await)
                });
                let mut http = hyper::server::conn::http1::Builder::new();
                http.timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(REFUSAL_HEADER_TIMEOUT)
                    .keep_alive(false);
                let _ = http
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
                drop(refusal);
            });
            continue;
        };
        if warned_full && slots.available_permits() > max_connections / 10 {
            warned_full = false;
        }
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let mut stopping = stopping.clone();
        let open = connection_open.clone();
        let served = state.clone();
        served.metrics.connection_opened();
        // Owned by the accept loop: it ends with its connection; after a stop, once the
        // request in flight is answered.
        tokio::spawn(async move {
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(header_read_timeout);
            let connection = http
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .with_upgrades();
            let mut connection = std::pin::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                _ = async { drop(stopping.wait_for(|stop| *stop).await) } => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
            served.metrics.connection_closed();
            drop(slot);
            drop(open);
        });
    }
    drop(listener);
    let _ = stop.send(true);
    state.sockets_stop.send_replace(true);
    drop(connection_open);
    all_closed.closed().await;
    // Sockets subscribe at their handshake, inside a connection counted above, so every socket
    // that will ever open holds a receiver by now.
    state.sockets_stop.closed().await;
    Ok(())
}

fn error_response(error: &ApiError) -> Response {
    let status = StatusCode::from_u16(error.status()).unwrap_or(StatusCode::BAD_REQUEST);
    let mut response = (status, error.body()).into_response();
    response
        .headers_mut()
        .insert("content-type", HeaderValue::from_static("application/json"));
    if error.kind == ApiErrorKind::UnsupportedMediaType {
        // RFC 9110 §15.5.16: a 415 for a content coding says which codings are accepted.
        response.headers_mut().insert(
            "accept-encoding",
            HeaderValue::from_static(crate::content_encoding::SUPPORTED),
        );
    }
    response
}

fn credential(headers: &HeaderMap, path_token: Option<&str>) -> Option<String> {
    if let Some(token) = path_token {
        return Some(token.to_string());
    }
    if let Some(key) = headers.get("x-api-key").and_then(|v| v.to_str().ok()) {
        return Some(key.trim().to_string());
    }
    headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(|v| v.trim().to_string())
}

fn authenticate(
    app: &AppState,
    api: Api,
    headers: &HeaderMap,
    path_token: Option<&str>,
) -> Result<ExecutionHandle, ApiError> {
    let Some(token) = credential(headers, path_token) else {
        return Err(ApiError::new(
            api,
            ApiErrorKind::Authentication,
            "no execution credential: send the execution's token as the API key or use the base URL /x/<token>",
        ));
    };
    let closed = |closed: ClosedCredential| {
        ApiError::new(
            api,
            ApiErrorKind::Authentication,
            match closed.lost {
                Some(reason) => {
                    format!("this execution cannot resume after the proxy restarted: {reason}")
                }
                None => "this execution is closed; its credential no longer accepts calls".into(),
            },
        )
    };
    match app.credential(&token) {
        Some(Credential::Open(handle)) => Ok(handle),
        Some(Credential::Closed(found)) => Err(closed(found)),
        None if app.config.auto_open => {
            let id = app
                .number_execution()
                .map_err(|message| ApiError::new(api, ApiErrorKind::Overloaded, message))?;
            let engine =
                app.next_engine.fetch_add(1, Ordering::Relaxed) as usize % app.engines.len();
            let handle = match app.open_execution_as(id, engine, &token) {
                Credential::Open(handle) => handle,
                // Closed between the look and the open.
                Credential::Closed(found) => return Err(closed(found)),
            };
            // Two first calls with one credential share one execution: only the one whose
            // execution it is records the credential.
            if handle.id() == ExecutionId(id) {
                if let Err(error) = app.record_auto_open(&token, id, engine) {
                    return Err(ApiError::new(
                        api,
                        ApiErrorKind::Overloaded,
                        format!("the new execution's credential could not be kept: {error}"),
                    ));
                }
            }
            Ok(handle)
        }
        None => Err(ApiError::new(
            api,
            ApiErrorKind::Authentication,
            "unknown execution credential",
        )),
    }
}

/// The whole request body, decoded when the client compressed it (`Content-Encoding`, see
/// [`crate::content_encoding`]): 413 past `body_bytes_max`, compressed or decoded (at once
/// when the announced length is over it), 415 for a coding the proxy does not decode, 400 for
/// a stream that is not the coding it claims, 408 when the client sends nothing for
/// `body_idle_timeout`, 400 when the connection ends before the body does.
async fn read_body(
    app: &AppState,
    api: Api,
    headers: &HeaderMap,
    body: Body,
) -> Result<Bytes, ApiError> {
    let bytes = read_body_bytes(app, api, body).await?;
    // Every `Content-Encoding` line, in order (a list may be split over several).
    let coding = headers
        .get_all(hyper::header::CONTENT_ENCODING)
        .iter()
        .map(HeaderValue::as_bytes)
        .collect::<Vec<_>>()
        .join(&b","[..]);
    if coding.is_empty() {
        return Ok(bytes);
    }
    let limit = app.config.body_bytes_max;
    let decode = move || {
        crate::content_encoding::decode(&coding, &bytes, limit)
            .map(|decoded| decoded.map_or(bytes, Bytes::from))
    };
    // Inflating is CPU work up to the body limit per request: on the blocking pool, as many
    // at once as calls being prepared (the semaphore is never closed).
    let _permit = app.preparing.acquire().await;
    let decoded = tokio::task::spawn_blocking(decode).await.map_err(|error| {
        ApiError::new(
            api,
            ApiErrorKind::Internal,
            format!("decoding the body: {error}"),
        )
    })?;
    decoded.map_err(|error| {
        use crate::content_encoding::DecodeError;
        let kind = match &error {
            DecodeError::Unsupported(_) => ApiErrorKind::UnsupportedMediaType,
            DecodeError::TooLarge { .. } => ApiErrorKind::RequestTooLarge,
            DecodeError::Corrupt { .. } => ApiErrorKind::InvalidRequest,
        };
        ApiError::new(api, kind, error.to_string())
    })
}

async fn read_body_bytes(app: &AppState, api: Api, body: Body) -> Result<Bytes, ApiError> {
    use http_body_util::BodyExt;
    let limit = app.config.body_bytes_max;
    let idle = app.config.body_idle_timeout;
    let hint = hyper::body::Body::size_hint(&body);
    if hint.lower() > limit as u64 {
        return Err(ApiError::request_too_large(api, limit));
    }
    let mut body = body;
    let mut bytes = bytes::BytesMut::with_capacity(hint.lower() as usize);
    loop {
        let frame = match tokio::time::timeout(idle, body.frame()).await {
            Err(_) => {
                return Err(ApiError::new(
                    api,
                    ApiErrorKind::RequestTimeout,
                    format!(
                        "the request body stalled: no bytes for {} s after {} received",
                        idle.as_secs(),
                        bytes.len()
                    ),
                ))
            }
            Ok(None) => return Ok(bytes.freeze()),
            Ok(Some(Err(error))) => {
                return Err(ApiError::new(
                    api,
                    ApiErrorKind::InvalidRequest,
                    format!(
                        "the request body ended early after {} bytes: {error}",
                        bytes.len()
                    ),
                ))
            }
            Ok(Some(Ok(frame))) => frame,
        };
        if let Ok(data) = frame.into_data() {
            if bytes.len() + data.len() > limit {
                return Err(ApiError::request_too_large(api, limit));
            }
            bytes.extend_from_slice(&data);
        }
    }
}

/// The agent a call belongs to. Claude Code marks sub-agent calls with `x-claude-code-agent-id`.
/// Codex (0.171) sends a spawned sub-agent's calls with `x-openai-subagent: collab_spawn`,
/// `x-codex-parent-thread-id` and the sub-agent's own thread id (`thread-id`, also the part of
/// `x-codex-window-id` before `:`); its `x-codex-turn-metadata` still says `agent_name: "/root"`.
/// That is agent `sub:<thread>`; another `x-openai-subagent` kind (a side thread the harness
/// starts itself, not the model) is `side:<kind>:<thread>`. opencode (1.18) sends every call
/// with its session's `x-session-id`, and a sub-agent's (its `task` tool) with the spawning
/// session's `x-parent-session-id` too: agent `sub:<session>`. Anything else is the main agent.
fn agent_of(headers: &HeaderMap) -> Option<String> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(agent) = header("x-claude-code-agent-id") {
        return Some(format!("sub:{agent}"));
    }
    if header("x-parent-session-id").is_some_and(|parent| !parent.is_empty()) {
        if let Some(session) = header("x-session-id").filter(|session| !session.is_empty()) {
            return Some(format!("sub:{session}"));
        }
    }
    let kind = header("x-openai-subagent");
    if kind.is_none() && header("x-codex-parent-thread-id").is_none() {
        return None;
    }
    let thread = header("thread-id")
        .or_else(|| header("x-codex-window-id").and_then(|window| window.split(':').next()))
        .filter(|thread| !thread.is_empty())?;
    Some(match kind {
        None | Some("collab_spawn") => format!("sub:{thread}"),
        Some(kind) => format!("side:{kind}:{thread}"),
    })
}

/// Whether the harness's headers mark the call as a context compaction: Codex sends
/// `x-codex-turn-metadata` (JSON) with `request_kind: "compaction"` on its compaction call.
/// A header that is not JSON, or has no such field, says nothing.
fn compaction_requested(headers: &HeaderMap) -> bool {
    headers
        .get("x-codex-turn-metadata")
        .is_some_and(|value| turn_metadata_is_compaction(value.as_bytes()))
}

/// Codex's turn metadata (a header over HTTP; `client_metadata` in the body over its
/// WebSocket) says `request_kind: "compaction"`.
fn turn_metadata_is_compaction(metadata: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(metadata).is_ok_and(|metadata| {
        metadata
            .get("request_kind")
            .and_then(serde_json::Value::as_str)
            == Some("compaction")
    })
}

fn lock_missing(missing: &Mutex<Option<String>>) -> MutexGuard<'_, Option<String>> {
    missing
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Reads the stored response `id` of `execution` back from the log and keeps it again (a
/// full store gave it up, or it is older than the last few), returned when it is.
async fn restore_from_log(
    app: &Arc<AppState>,
    execution: &ExecutionHandle,
    id: &str,
) -> Option<Arc<StoredResponse>> {
    let number = execution.id().get();
    let records = match app.sink.stored_responses(number, id).await {
        Ok(records) => records,
        Err(error) => {
            tracing::warn!(%error, id, "reading a stored response back from the log failed");
            return None;
        }
    };
    if records.is_empty() {
        return None;
    }
    let (app, execution, id) = (app.clone(), execution.clone(), id.to_string());
    // Rebuilding copies the chain's items: off the async workers.
    let restored = tokio::task::spawn_blocking(move || {
        let restored = execution.restore_chain(&app, records, &id);
        if restored.is_some() {
            app.metrics.response_read_back();
        }
        restored
    })
    .await;
    restored.ok().flatten()
}

/// A Message Thread read back for a request, by id: held for its retry.
type PinnedThread = (String, Arc<crate::message_threads::HeldThread>);

/// Reads the Message Thread `id` of `execution` back from the log (a full thread store gave
/// it up, or a restart held newer ones) and holds it again for `agent`, charged like a new
/// one, returning it for the request's retry; or, when the log shows it continued, remembers
/// that. The request is then prepared again, and finds it (or is refused as before).
async fn restore_thread_from_log(
    app: &Arc<AppState>,
    execution: &ExecutionHandle,
    id: &str,
    agent: &str,
) -> Option<Arc<crate::message_threads::HeldThread>> {
    use crate::message_threads::{is_thread_record, lock, read_back, ReadBack};
    let number = execution.id().get();
    let records = match app.sink.stored_responses(number, id).await {
        Ok(records) => records,
        Err(error) => {
            tracing::warn!(%error, id, "reading a thread back from the log failed");
            return None;
        }
    };
    let records: Vec<_> = records
        .into_iter()
        .filter(|record| is_thread_record(&record.response_id))
        .map(|record| {
            (
                record.response_id,
                record.previous_response_id,
                record.items,
            )
        })
        .collect();
    if records.is_empty() {
        return None;
    }
    let (app, execution) = (app.clone(), execution.clone());
    let (id, agent) = (id.to_string(), agent.to_string());
    // Rebuilding copies the thread's conversation: off the async workers.
    tokio::task::spawn_blocking(move || match read_back(records, &id) {
        ReadBack::Missing => None,
        ReadBack::Continued => {
            lock(&execution.threads()).note_continued(&id);
            None
        }
        ReadBack::Thread(thread) => {
            // The charger may make room in any execution's store: none is locked meanwhile.
            let Some(charge) = (app.thread_charger())(thread.bytes()) else {
                tracing::warn!(
                    id,
                    "the thread store is full (--thread-store-mib); a thread read back from \
                     the log is not held"
                );
                return None;
            };
            let threads = execution.threads();
            let mut store = lock(&threads);
            let held = store.hold_read_back(&id, thread, &agent, Some(charge));
            app.metrics.threads_given_up_by(store.take_given_up());
            drop(store);
            if held.is_some() {
                app.metrics.thread_read_back();
            }
            held
        }
    })
    .await
    .ok()
    .flatten()
}

/// An Anthropic request's `thread` (see [`crate::message_threads`]): `None` without one; a
/// `create`'s hold; a `continue`'s hold (the thread it took) and its expanded body. A refused
/// continue gives its thread back when the hold drops.
fn begin_thread(
    app: &Arc<AppState>,
    execution: &ExecutionHandle,
    agent: &str,
    bytes: &Bytes,
    (missing, pinned): (&Mutex<Option<String>>, Option<&PinnedThread>),
) -> Result<Option<(crate::message_threads::ThreadHold, Bytes)>, ApiError> {
    use crate::message_threads::{expand, is_thread_not_found, read_continue, ThreadHold};
    let Some((previous_message_id, object)) = read_continue(bytes)? else {
        return Ok(None);
    };
    let store = execution.threads();
    let begun = match pinned.filter(|(id, _)| *id == previous_message_id) {
        Some((_, thread)) => {
            crate::message_threads::lock(&store).begin_pinned(&previous_message_id, thread)
        }
        None => crate::message_threads::lock(&store).begin_continue(&previous_message_id),
    };
    let held = begun.inspect_err(|error| {
        if is_thread_not_found(error) {
            // Given up for room, or older than what a restart held again: the caller may
            // read it back from the log and try again (`restore_thread_from_log`).
            *lock_missing(missing) = Some(previous_message_id.clone());
        }
    })?;
    // From here on, a refusal gives the thread back as the hold drops.
    let hold = ThreadHold::new(store, agent, Some((previous_message_id, held.clone())))
        .charged_by(app.thread_charger());
    let (expanded, conversation) = expand(object, &held, app.config.body_bytes_max)?;
    hold.set_conversation(conversation);
    Ok(Some((hold, expanded)))
}

/// A `thread` read from the parsed body of a request whose raw bytes held no `continue` (see
/// `crate::message_threads::read_continue`): a `create`'s hold.
fn read_thread_after_parse(
    app: &Arc<AppState>,
    execution: &ExecutionHandle,
    agent: &str,
    body: &Value,
) -> Result<Option<crate::message_threads::ThreadHold>, ApiError> {
    use crate::message_threads::{thread_not_found, thread_of, ThreadHold, ThreadParam};
    match thread_of(body.get("thread"))? {
        None => Ok(None),
        Some(ThreadParam::Create) => {
            let hold =
                ThreadHold::new(execution.threads(), agent, None).charged_by(app.thread_charger());
            hold.read_conversation(body);
            Ok(Some(hold))
        }
        // Only a body the raw read could not parse: the client sends the turn again whole.
        Some(ThreadParam::Continue {
            previous_message_id,
        }) => Err(thread_not_found(&previous_message_id)),
    }
}

/// A Responses request that continues a stored response (`previous_response_id`), as the
/// body a stateless client would have sent (see [`crate::stored_responses`]), with the id,
/// the response it continues and its own input items; `None` when it continues none.
#[allow(clippy::type_complexity)]
fn expand_chained(
    app: &AppState,
    api: Api,
    execution: &ExecutionHandle,
    bytes: &[u8],
    (missing, read_back): (&Mutex<Option<String>>, Option<&Arc<StoredResponse>>),
) -> Result<Option<(Bytes, (String, Arc<StoredResponse>, Vec<u8>))>, ApiError> {
    let Some((id, object)) = stored_responses::previous_response_id(bytes)? else {
        return Ok(None);
    };
    let in_memory = execution
        .stored_response(&id)
        .or_else(|| read_back.and_then(|response| response.find_in_chain(&id)));
    let previous = in_memory.ok_or_else(|| {
        // The caller may read it back from the log and try again.
        *lock_missing(missing) = Some(id.clone());
        stored_responses::not_found(
            &id,
            "neither this proxy's memory nor its log holds a stored response of this \
             execution with that id",
        )
    })?;
    let (expanded, own) = stored_responses::expand(object, &previous)?;
    if expanded.len() > app.config.body_bytes_max {
        // What a stateless client sending the same conversation would get.
        return Err(ApiError::new(
            api,
            ApiErrorKind::RequestTooLarge,
            format!(
                "the conversation continued from {id} exceeds the body limit of {} bytes",
                app.config.body_bytes_max
            ),
        ));
    }
    Ok(Some((expanded, (id, previous, own))))
}

/// How many items a comma-joined list of input items (`stored_responses::input_items`) holds.
fn items_in(items: &[u8]) -> usize {
    if items.is_empty() {
        return 0;
    }
    let mut list = Vec::with_capacity(items.len() + 2);
    list.push(b'[');
    list.extend_from_slice(items);
    list.push(b']');
    serde_json::from_slice::<Vec<serde::de::IgnoredAny>>(&list).map_or(0, |items| items.len())
}

/// An error about a chained request's expanded `input` (the stored conversation's `offset`
/// items, then the request's own), said in the client's terms: `input[i]` of its own items
/// counts from its own first item; an item of the stored conversation is named as such.
fn rebase_input_path(error: ApiError, offset: usize, previous: &str) -> ApiError {
    error.rebased("input", offset, "previous_response_id.input", |index| {
        format!("item {index} of the conversation stored as {previous}")
    })
}

/// One model call over HTTP: a Responses answer is kept for chaining unless `store` is false.
async fn model_call(
    app: Arc<AppState>,
    api: Api,
    path_token: Option<String>,
    uri: &Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    serve_call(app, api, path_token, uri, headers, body, false).await
}

/// One model call; `keep_answer`: a Responses answer is kept for chaining whatever its `store`
/// says (a WebSocket's, see `websocket`).
async fn serve_call(
    app: Arc<AppState>,
    api: Api,
    path_token: Option<String>,
    uri: &Uri,
    headers: HeaderMap,
    body: Body,
    keep_answer: bool,
) -> Response {
    app.metrics.request(api);
    let execution = match authenticate(&app, api, &headers, path_token.as_deref()) {
        Ok(execution) => execution,
        Err(error) => return rejected(&app, &error),
    };
    let bytes = match read_body(&app, api, &headers, body).await {
        Ok(bytes) => bytes,
        Err(error) => return rejected(&app, &error),
    };
    let agent = agent_of(&headers);
    let harness_compaction = compaction_requested(&headers);
    let capture_head = app.capture.as_ref().map(|_| {
        let path = uri.path_and_query().map_or(uri.path(), |p| p.as_str());
        capture::Capture::head(path, &headers)
    });
    // Parsing, rendering and tokenizing are CPU work proportional to the body and the new
    // tail (milliseconds for a long context): they run on the blocking pool so the async
    // workers keep streaming other executions' answers meanwhile.
    // A `previous_response_id` no longer in memory is read back from the log once, then the
    // request is prepared again (see `ExecutionHandle::restore_chain`).
    let missing: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
    let mut read_back = false;
    let mut pinned: Option<Arc<StoredResponse>> = None;
    let mut pinned_thread: Option<PinnedThread> = None;
    let work = loop {
        let waiting = std::time::Instant::now();
        // Held until the blocking work is done (the semaphore is never closed).
        let permit = app.preparing.acquire().await;
        let attempt = {
            let (app, execution) = (app.clone(), execution.clone());
            let (bytes, capture_head, agent) = (bytes.clone(), capture_head.clone(), agent.clone());
            let (missing, pinned) = (missing.clone(), pinned.clone());
            let pinned_thread = pinned_thread.clone();
            tokio::task::spawn_blocking(move || {
                if !read_back {
                    app.metrics
                        .stage(Stage::Wait, waiting.elapsed().as_secs_f64());
                }
                let parsing = std::time::Instant::now();
                let agent_key = agent.as_deref().unwrap_or("main");
                // `item_reference`s become the stored items they name, before anything else reads
                // the body (so a stored answer's own items hold the items, not the references).
                let (bytes, resolving) = match api {
                    Api::OpenAiResponses => {
                        match stored_responses::resolve_item_references(
                            &bytes,
                            app.config.body_bytes_max,
                            |id| {
                                execution.stored_item(id).or_else(|| {
                                    pinned.as_ref().and_then(|response| response.find_item(id))
                                })
                            },
                        ) {
                            Ok(Some(resolved)) => (resolved, Ok(())),
                            Ok(None) => (bytes, Ok(())),
                            Err(error) => (bytes, Err(error)),
                        }
                    }
                    _ => (bytes, Ok(())),
                };
                // A Responses request continuing a stored response becomes the body a stateless
                // client would have sent (see `crate::stored_responses`).
                let expansion = match (api, resolving) {
                    (_, Err(error)) => {
                        // An item the request references may be in a stored response that
                        // left memory: the one it continues is read back first, if missing.
                        if let Ok(Some((id, _))) = stored_responses::previous_response_id(&bytes) {
                            if execution.stored_response(&id).is_none() {
                                *lock_missing(&missing) = Some(id);
                            }
                        }
                        Err(error)
                    }
                    (Api::OpenAiResponses, Ok(())) => {
                        expand_chained(&app, api, &execution, &bytes, (&missing, pinned.as_ref()))
                    }
                    _ => Ok(None),
                };
                let (bytes, mut chained, refused) = match expansion {
                    Ok(Some((expanded, chained))) => (expanded, Some(chained), None),
                    Ok(None) => (bytes, None, None),
                    Err(error) => (bytes, None, Some(error)),
                };
                // An Anthropic Message Threads `continue` becomes the body a stateless client
                // would have sent (see `crate::message_threads`).
                let (bytes, thread_hold, refused) = match (api, refused) {
                    (Api::Anthropic, None) => {
                        let pinned = pinned_thread.as_ref();
                        match begin_thread(&app, &execution, agent_key, &bytes, (&missing, pinned))
                        {
                            Ok(None) => (bytes, None, None),
                            Ok(Some((hold, expanded))) => (expanded, Some(hold), None),
                            Err(error) => (bytes, None, Some(error)),
                        }
                    }
                    (_, refused) => (bytes, None, refused),
                };
                // Refused for now, to be prepared again once the response it continues is read
                // back from the log: not captured yet (the retry is).
                if let Some(error) = refused.as_ref() {
                    if !read_back && lock_missing(&missing).is_some() {
                        return Err(error.clone());
                    }
                }
                // A chained request is captured expanded, as a stateless client sends it, so a
                // replay does not depend on this process's stored responses.
                // A refusal about a thread is not captured: the request carried nothing a model
                // saw, and its turn comes again whole.
                let thread_refused = refused
                    .as_ref()
                    .is_some_and(crate::message_threads::is_thread_error);
                if let (Some(capture), Some(mut head), false) =
                    (&app.capture, capture_head, thread_refused)
                {
                    if let Some((previous, ..)) = &chained {
                        capture::Capture::note(&mut head, "x-gyre-previous-response-id", previous);
                    }
                    if let Some(previous) =
                        thread_hold.as_ref().and_then(|hold| hold.continued_id())
                    {
                        capture::Capture::note(&mut head, "x-gyre-previous-message-id", previous);
                    }
                    let id = execution.id().get();
                    capture.write(head, api, id, agent.as_deref(), &bytes);
                }
                if let Some(error) = refused {
                    return Err(error);
                }
                let previous = execution.take_body(api, agent_key);
                let body = crate::body::parse_body(api, bytes, previous)?;
                let mut request =
                    crate::read_parsed_request(api, &body).map_err(|error| match &chained {
                        Some((id, _, own)) => {
                            let total = body
                                .value()
                                .get("input")
                                .and_then(Value::as_array)
                                .map_or(0, Vec::len);
                            rebase_input_path(error, total - items_in(own).min(total), id)
                        }
                        None => match thread_hold
                            .as_ref()
                            .and_then(crate::message_threads::ThreadHold::continued_messages)
                        {
                            Some((id, held)) => {
                                crate::message_threads::rebase_error(error, held, id)
                            }
                            None => error,
                        },
                    })?;
                let thread_hold = match (api, thread_hold) {
                    (Api::Anthropic, None) => {
                        read_thread_after_parse(&app, &execution, agent_key, body.value())?
                    }
                    (_, hold) => hold,
                };
                request.thread_hold = thread_hold.map(Arc::new);
                if let (Some((id, ..)), Some(settings)) =
                    (&chained, request.response_settings.as_mut())
                {
                    // The answer echoes the response it continued.
                    Arc::make_mut(settings)
                        .insert("previous_response_id".into(), Value::String(id.clone()));
                }
                // A WebSocket keeps its answers for chaining whatever `store` says (`keep_answer`).
                let stored = api == Api::OpenAiResponses
                    && (keep_answer || body.value().get("store") != Some(&Value::Bool(false)));
                let store_on_end = stored.then(|| {
                    let (parent, input_items) = match chained.take() {
                        Some((_, previous, own)) => (Some(previous), own),
                        None => (
                            None,
                            body.conversation_items()
                                .map(<[u8]>::to_vec)
                                .unwrap_or_else(|| {
                                    stored_responses::input_items(body.value().get("input"))
                                }),
                        ),
                    };
                    let opens_conversation = parent.is_none()
                        && !request
                            .messages
                            .iter()
                            .any(|message| message.role == crate::messages::Role::Assistant);
                    StoreOnEnd {
                        parent,
                        input_items,
                        body_bytes_max: app.config.body_bytes_max,
                        sink: app.sink.clone(),
                        app: app.clone(),
                        opens_conversation,
                    }
                });
                if app.config.media == crate::media::MediaPolicy::Reject {
                    if let Some((path, kind)) = crate::media::first_media_part(api, body.value()) {
                        return Err(crate::media::rejected(api, path, &kind));
                    }
                }
                // Settings the engine would be asked to sample with (`--sampling harness`) must be
                // ones it can: refused here, before anything is sent or sampled.
                if let Err(message) = app.config.sampling.settings(&request.sampling).check() {
                    return Err(ApiError::new(api, ApiErrorKind::InvalidRequest, message));
                }
                request.harness_compaction |= harness_compaction
                    || api == Api::OpenAiResponses
                        && body
                            .value()
                            .get("client_metadata")
                            .and_then(|metadata| metadata.get("x-codex-turn-metadata"))
                            .and_then(Value::as_str)
                            .is_some_and(|metadata| {
                                turn_metadata_is_compaction(metadata.as_bytes())
                            });
                // `"generate": false`: a warm-up that samples nothing (see `generate::warmup`).
                let warmup = api == Api::OpenAiResponses
                    && body.value().get("generate") == Some(&Value::Bool(false));
                app.metrics
                    .body_elements(body.elements(), body.reused_elements());
                execution.keep_body(&app.bodies, api, agent_key.to_string(), body);
                app.metrics
                    .stage(Stage::Parse, parsing.elapsed().as_secs_f64());
                if warmup {
                    return Ok::<_, ApiError>((request, None, store_on_end));
                }
                let preparing = std::time::Instant::now();
                let prepared = {
                    let mut session = execution.lock();
                    session.restore(&mut request);
                    session.prepare(&app.model, &request, agent.as_deref(), now_civil())
                };
                app.metrics
                    .stage(Stage::Prepare, preparing.elapsed().as_secs_f64());
                Ok::<_, ApiError>((request, Some(prepared), store_on_end))
            })
            .await
        };
        drop(permit);
        if let (Ok(Err(_)), false) = (&attempt, read_back) {
            let id = lock_missing(&missing).take();
            if let Some(id) = id {
                // Prepared again whatever the read-back finds: the second attempt is the one
                // captured, and refuses the request itself if the log lacks the id too. The
                // response read back is held for it (another execution's charge may give it up
                // meanwhile).
                read_back = true;
                if api == Api::Anthropic {
                    let agent = agent.as_deref().unwrap_or("main");
                    pinned_thread = restore_thread_from_log(&app, &execution, &id, agent)
                        .await
                        .map(|thread| (id, thread));
                } else {
                    pinned = restore_from_log(&app, &execution, &id).await;
                }
                continue;
            }
        }
        break attempt;
    };
    let (request, prepared, store_on_end) = match work {
        Ok(Ok(done)) => done,
        Ok(Err(error)) => return rejected(&app, &error),
        Err(join) => {
            return rejected(
                &app,
                &ApiError::new(
                    api,
                    ApiErrorKind::Internal,
                    format!("preparing the call failed: {join}"),
                ),
            )
        }
    };
    let streaming = request.stream;
    let (sender, receiver) = mpsc::channel(64);
    let Some(prepared) = prepared else {
        // Task "warm-up": owned by the response, ends after one piece.
        tokio::spawn(generate::warmup(execution, request, store_on_end, sender));
        return answer(&app, api, streaming, receiver).await;
    };
    if let (Ok(prepared), Some(dir)) = (&prepared, std::env::var_os("GYRE_PROXY_DUMP_DIR")) {
        // Debugging aid: every rendered prompt, as the engine will see it.
        // The agent's name comes from a request header: only safe characters reach the path.
        let agent: String = prepared
            .agent
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let name = format!("{agent}-{}.txt", execution.lock().calls());
        let _ = std::fs::write(std::path::Path::new(&dir).join(name), &prepared.text);
    }
    let prepared = match prepared {
        Ok(prepared) => prepared,
        Err(error) => {
            return rejected(
                &app,
                &ApiError::new(
                    api,
                    ApiErrorKind::InvalidRequest,
                    format!("the request cannot be rendered for this model: {error}"),
                ),
            )
        }
    };
    // Task "model-call": owned by the response; it notices a dropped receiver. Its
    // supervisor turns a panic (a bug) into an error the harness can act on, rather than an
    // answer or stream that just stops.
    let on_panic = sender.clone();
    let call = tokio::spawn(generate::run(
        app.clone(),
        execution,
        request,
        prepared,
        store_on_end,
        sender,
    ));
    tokio::spawn(async move {
        if let Err(join) = call.await {
            if join.is_panic() {
                tracing::error!("a model call's task panicked; the harness gets an error");
                let failure = ApiError::new(
                    api,
                    ApiErrorKind::Internal,
                    "the proxy failed while answering this call (a bug, logged); retry it",
                );
                let _ = on_panic.send(generate::Piece::Failed(failure, 0)).await;
            }
        }
    });
    answer(&app, api, streaming, receiver).await
}

/// The HTTP answer of a call whose pieces arrive on `receiver`: an SSE stream, or the body.
async fn answer(
    app: &Arc<AppState>,
    api: Api,
    streaming: bool,
    mut receiver: mpsc::Receiver<generate::Piece>,
) -> Response {
    if streaming {
        let first = receiver.recv().await;
        let head = match first {
            Some(generate::Piece::Failed(error, _)) => return rejected(app, &error),
            Some(generate::Piece::Frames(frames)) => frames,
            Some(generate::Piece::Body(_)) | None => String::new(),
        };
        let app_for_stream = app.clone();
        let stream = futures_util::stream::unfold(
            (Some(head), receiver, false),
            move |(head, mut receiver, done)| {
                let app = app_for_stream.clone();
                async move {
                    if let Some(head) = head {
                        return Some((
                            Ok::<_, std::io::Error>(Bytes::from(head)),
                            (None, receiver, done),
                        ));
                    }
                    if done {
                        return None;
                    }
                    match receiver.recv().await {
                        Some(generate::Piece::Frames(frames)) => {
                            Some((Ok(Bytes::from(frames)), (None, receiver, false)))
                        }
                        Some(generate::Piece::Failed(error, sequence_number)) => {
                            app.metrics.stream_error();
                            // A well-formed error event (numbered after the events before
                            // it, on a Responses stream): harnesses retry the identical body.
                            let event = error.sse_event(sequence_number).to_wire();
                            Some((Ok(Bytes::from(event)), (None, receiver, true)))
                        }
                        Some(generate::Piece::Body(_)) | None => None,
                    }
                }
            },
        );
        let mut response = Response::new(Body::from_stream(stream));
        let headers = response.headers_mut();
        headers.insert(
            "content-type",
            HeaderValue::from_static("text/event-stream"),
        );
        headers.insert("cache-control", HeaderValue::from_static("no-cache"));
        response
    } else {
        loop {
            match receiver.recv().await {
                Some(generate::Piece::Frames(_)) => continue,
                Some(generate::Piece::Body(body)) => {
                    let mut response = (StatusCode::OK, body.to_string()).into_response();
                    response
                        .headers_mut()
                        .insert("content-type", HeaderValue::from_static("application/json"));
                    return response;
                }
                Some(generate::Piece::Failed(error, _)) => return rejected(app, &error),
                None => {
                    return rejected(
                        app,
                        &ApiError::new(
                            api,
                            ApiErrorKind::Internal,
                            "the call ended without an answer",
                        ),
                    )
                }
            }
        }
    }
}

fn rejected(app: &AppState, error: &ApiError) -> Response {
    app.metrics.rejected(error.status());
    error_response(error)
}

async fn anthropic_messages(
    State(app): State<Arc<AppState>>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    model_call(app, Api::Anthropic, None, &uri, headers, body).await
}

async fn anthropic_messages_at(
    State(app): State<Arc<AppState>>,
    Path(token): Path<String>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    model_call(app, Api::Anthropic, Some(token), &uri, headers, body).await
}

async fn chat_completions(
    State(app): State<Arc<AppState>>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    model_call(app, Api::OpenAiChat, None, &uri, headers, body).await
}

async fn chat_completions_at(
    State(app): State<Arc<AppState>>,
    Path(token): Path<String>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    model_call(app, Api::OpenAiChat, Some(token), &uri, headers, body).await
}

async fn responses(
    State(app): State<Arc<AppState>>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    model_call(app, Api::OpenAiResponses, None, &uri, headers, body).await
}

async fn responses_at(
    State(app): State<Arc<AppState>>,
    Path(token): Path<String>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    model_call(app, Api::OpenAiResponses, Some(token), &uri, headers, body).await
}

async fn count_tokens_inner(
    app: Arc<AppState>,
    path_token: Option<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let api = Api::Anthropic;
    // Counted with the model-API requests, as its rejections are counted with theirs.
    app.metrics.request(api);
    let execution = match authenticate(&app, api, &headers, path_token.as_deref()) {
        Ok(execution) => execution,
        Err(error) => return rejected(&app, &error),
    };
    let bytes = match read_body(&app, api, &headers, body).await {
        Ok(bytes) => bytes,
        Err(error) => return rejected(&app, &error),
    };
    // Parsing, rendering and tokenizing a whole conversation is CPU work proportional to the
    // body: on the blocking pool, within the calls' preparing slots, as a call's is (the async
    // workers keep serving `/health`, `/metrics` and other executions' answers meanwhile). A
    // thread the count continues that left memory is read back from the log, then the count
    // runs again, as a call's preparation does.
    let mut pinned: Option<PinnedThread> = None;
    let mut read_back = false;
    let counted = loop {
        let permit = app.preparing.acquire().await;
        let (counting, counted_in, bytes, pinned_now) = (
            app.clone(),
            execution.clone(),
            bytes.clone(),
            pinned.clone(),
        );
        let attempt = tokio::task::spawn_blocking(move || {
            count_prompt(&counting, &counted_in, bytes, pinned_now)
        })
        .await
        .unwrap_or_else(|join| {
            Err((
                ApiError::new(
                    api,
                    ApiErrorKind::Internal,
                    format!("counting tokens failed: {join}"),
                ),
                None,
            ))
        });
        drop(permit);
        match attempt {
            Err((_, Some(id))) if !read_back => {
                read_back = true;
                let agent = agent_of(&headers);
                let agent = agent.as_deref().unwrap_or("main");
                pinned = restore_thread_from_log(&app, &execution, &id, agent)
                    .await
                    .map(|thread| (id, thread));
            }
            attempt => break attempt.map_err(|(error, _)| error),
        }
    };
    match counted {
        Ok(tokens) => axum::Json(json!({ "input_tokens": tokens })).into_response(),
        Err(error) => rejected(&app, &error),
    }
}

/// The prompt tokens of a `count_tokens` body. A Message Threads `continue` counts the whole
/// conversation it would send, from the thread held (left held: counting continues nothing)
/// or `pinned` (read back for it); a thread not held fails with its id, to be read back.
fn count_prompt(
    app: &AppState,
    execution: &ExecutionHandle,
    bytes: Bytes,
    pinned: Option<PinnedThread>,
) -> Result<usize, (ApiError, Option<String>)> {
    let api = Api::Anthropic;
    let bytes = match crate::message_threads::read_continue(&bytes)
        .map_err(|error| (error, None))?
    {
        None => bytes,
        Some((id, object)) => {
            let peeked = crate::message_threads::lock(&execution.threads()).peek(&id);
            let held = match (peeked, pinned) {
                (Ok(held), _) => held,
                (Err(_), Some((pinned_id, thread))) if pinned_id == id => thread,
                (Err(error), _) => {
                    let missing = crate::message_threads::is_thread_not_found(&error).then_some(id);
                    return Err((error, missing));
                }
            };
            crate::message_threads::expand(object, &held, app.config.body_bytes_max)
                .map_err(|error| (error, None))?
                .0
        }
    };
    let request = crate::anthropic::parse_count_tokens_with(&bytes, app.config.media)
        .and_then(|r| r.to_chat())
        .map_err(|error| (error, None))?;
    // A pre-filled answer counts the prompt it is continued from.
    let continues_final_message = request.continues_final_message();
    let input = crate::template::RenderInput {
        messages: &request.messages,
        tools: &request.tools,
        add_generation_prompt: !continues_final_message,
        now: now_civil(),
        extra: None,
    };
    let rendered = if continues_final_message {
        app.model.render_continuing(&input)
    } else {
        app.model.render(&input)
    };
    rendered
        .and_then(|text| app.model.encode(&text))
        .map(|ids| ids.len())
        .map_err(|error| {
            (
                ApiError::new(api, ApiErrorKind::InvalidRequest, error.to_string()),
                None,
            )
        })
}

async fn count_tokens(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    count_tokens_inner(app, None, headers, body).await
}

async fn count_tokens_at(
    State(app): State<Arc<AppState>>,
    Path(token): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    count_tokens_inner(app, Some(token), headers, body).await
}

async fn hello() -> StatusCode {
    StatusCode::OK
}

/// A model as `GET /v1/models` lists it, in the shape of the API the client speaks (an
/// `anthropic-version` header: Anthropic's; otherwise OpenAI's).
fn model_entry(id: &str, anthropic: bool) -> Value {
    if anthropic {
        json!({"type": "model", "id": id, "display_name": id,
               "created_at": "1970-01-01T00:00:00Z"})
    } else {
        json!({"id": id, "object": "model", "created": 0, "owned_by": "gyre"})
    }
}

/// `GET /v1/models`: the served model (`ServerConfig::served_model`), for clients that check
/// the list first (OpenAI SDK users, model pickers, gateways' health checks).
async fn list_models(State(app): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    let anthropic = headers.contains_key("anthropic-version");
    let id = app.config.served_model.as_str();
    let entry = model_entry(id, anthropic);
    let body = if anthropic {
        json!({"data": [entry], "has_more": false, "first_id": id, "last_id": id})
    } else {
        json!({"object": "list", "data": [entry]})
    };
    axum::Json(body).into_response()
}

/// `GET /v1/models/{model}`: the proxy answers calls naming any model (the policy answers
/// them all), so whatever model a harness is configured with exists here.
async fn one_model(
    axum::extract::Path(params): axum::extract::Path<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let model = params.get("model").map(String::as_str).unwrap_or_default();
    axum::Json(model_entry(
        model,
        headers.contains_key("anthropic-version"),
    ))
    .into_response()
}

async fn health(State(app): State<Arc<AppState>>) -> Response {
    axum::Json(json!({
        "status": "ok",
        "engines": app.engines.iter().map(|engine| engine.name().to_string()).collect::<Vec<_>>(),
        "records": app.sink.describe(),
        "engines_down": app.engines_down(),
        "executions_open": app.executions_open(),
    }))
    .into_response()
}

async fn metrics_text(State(app): State<Arc<AppState>>) -> Response {
    let mut text = app.metrics.render();
    text.push_str(&format!(
        "# HELP gyre_proxy_body_cache_bytes Memory charged to kept request bodies (3x their \
         bytes), and its bound (--body-cache-mib).\n# TYPE gyre_proxy_body_cache_bytes gauge\n\
         gyre_proxy_body_cache_bytes {}\n# TYPE gyre_proxy_body_cache_bytes_max gauge\n\
         gyre_proxy_body_cache_bytes_max {}\n",
        app.bodies.used.load(Ordering::Acquire),
        app.bodies.max,
    ));
    text.push_str(&format!(
        "# HELP gyre_proxy_response_store_bytes Memory charged to stored Responses answers \
         kept for previous_response_id (a chain holds its conversation once), and its bound \
         (--response-store-mib).\n# TYPE gyre_proxy_response_store_bytes gauge\n\
         gyre_proxy_response_store_bytes {}\n# TYPE gyre_proxy_response_store_bytes_max gauge\n\
         gyre_proxy_response_store_bytes_max {}\n",
        app.responses.used.load(Ordering::Acquire),
        app.responses.max,
    ));
    text.push_str(&format!(
        "# HELP gyre_proxy_thread_store_bytes Memory charged to the Anthropic Message Threads \
         held for a later continue (each thread its conversation's JSON bytes), and its bound \
         (--thread-store-mib).\n# TYPE gyre_proxy_thread_store_bytes gauge\n\
         gyre_proxy_thread_store_bytes {}\n# TYPE gyre_proxy_thread_store_bytes_max gauge\n\
         gyre_proxy_thread_store_bytes_max {}\n",
        app.threads.used.load(Ordering::Acquire),
        app.threads.max,
    ));
    let mut response = text.into_response();
    response.headers_mut().insert(
        "content-type",
        HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    response
}

/// 404 in the error shape of the API the client speaks: Anthropic's when it sends
/// `anthropic-version`, else the one the path belongs to (an OpenAI client reads OpenAI's
/// shape, e.g. for `/v1/responses/compact` or `/v1/models`, which this proxy does not serve).
async fn not_found(
    method: axum::http::Method,
    uri: axum::http::Uri,
    headers: HeaderMap,
) -> Response {
    route_error(ApiErrorKind::NotFound, &uri, &headers, |path| {
        format!("no such route: {method} {path}")
    })
}

/// 405 in the error shape of the API the client speaks (see [`not_found`]).
async fn method_not_allowed(
    method: axum::http::Method,
    uri: axum::http::Uri,
    headers: HeaderMap,
) -> Response {
    route_error(ApiErrorKind::MethodNotAllowed, &uri, &headers, |path| {
        format!("{path} does not take {method} requests")
    })
}

/// An error about the route itself, in its client's API shape; `message` gets the path (at
/// most 200 characters of it) with any path credential redacted: harnesses log the error
/// bodies they get, and a `/x/<token>/…` path would put the execution's secret in their logs.
fn route_error(
    kind: ApiErrorKind,
    uri: &axum::http::Uri,
    headers: &HeaderMap,
    message: impl FnOnce(&str) -> String,
) -> Response {
    let path = uri.path();
    let api = api_of_request(path, headers);
    let shown: String = credential_redacted(path).chars().take(200).collect();
    error_response(&ApiError::new(api, kind, message(&shown)))
}

/// `path` with the credential segment of a path that carries one (`/x/<token>/…`,
/// `/admin/executions/<token>/…`) replaced by `<credential>`; any other path unchanged.
fn credential_redacted(path: &str) -> std::borrow::Cow<'_, str> {
    for prefix in ["/x/", "/admin/executions/"] {
        if let Some(rest) = path.strip_prefix(prefix) {
            return match rest.split_once('/') {
                Some((_, tail)) => format!("{prefix}<credential>/{tail}").into(),
                None => format!("{prefix}<credential>").into(),
            };
        }
    }
    path.into()
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct OpenRequest {
    execution: Option<u64>,
    engine: Option<usize>,
}

fn admin_error(status: StatusCode, message: String) -> Response {
    (status, axum::Json(json!({ "error": message }))).into_response()
}

/// With `ServerConfig::admin_token` set, the admin routes answer only a request carrying it
/// (`Authorization: Bearer <token>`): the agents a harness runs execute arbitrary commands and
/// reach this port, and must not open, close or reroute executions.
async fn admin_guard(
    State(app): State<Arc<AppState>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if let Some(expected) = &app.config.admin_token {
        let given = request
            .headers()
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "))
            .unwrap_or("");
        if !same_secret(given.as_bytes(), expected.as_bytes()) {
            return admin_error(
                StatusCode::UNAUTHORIZED,
                "the admin routes need `Authorization: Bearer <the proxy's admin token>`".into(),
            );
        }
    }
    next.run(request).await
}

/// Compares two secrets in time that depends only on their lengths.
fn same_secret(given: &[u8], expected: &[u8]) -> bool {
    given.len() == expected.len()
        && given
            .iter()
            .zip(expected)
            .fold(0u8, |differ, (a, b)| differ | (a ^ b))
            == 0
}

async fn admin_open(State(app): State<Arc<AppState>>, body: Bytes) -> Response {
    let request: OpenRequest = if body.is_empty() {
        OpenRequest::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(request) => request,
            Err(error) => return admin_error(StatusCode::BAD_REQUEST, format!("body: {error}")),
        }
    };
    if let Some(engine) = request.engine {
        if engine >= app.engines.len() {
            return admin_error(
                StatusCode::BAD_REQUEST,
                format!(
                    "engine: {engine} is not one of the {} engines",
                    app.engines.len()
                ),
            );
        }
    }
    let (execution, token) = match app.open_execution(request.execution, request.engine) {
        Ok(opened) => opened,
        Err(error @ OpenError::Taken(_)) => {
            return admin_error(StatusCode::CONFLICT, format!("execution: {error}"))
        }
        Err(error) => return admin_error(StatusCode::SERVICE_UNAVAILABLE, error.to_string()),
    };
    let base = &app.config.public_url;
    axum::Json(json!({
        "execution": execution,
        "token": token,
        "anthropic_base_url": format!("{base}/x/{token}"),
        "openai_base_url": format!("{base}/x/{token}/v1"),
    }))
    .into_response()
}

async fn admin_close(State(app): State<Arc<AppState>>, Path(token): Path<String>) -> Response {
    match app.credential(&token) {
        // Closing twice is not an error: an operator's retry gets the same answer's shape.
        Some(Credential::Closed(closed)) => axum::Json(json!({
            "execution": closed.execution.get(),
            "already_closed": true,
        }))
        .into_response(),
        Some(Credential::Open(handle)) => {
            if let Err(error) = app.close_execution(&token, &handle) {
                return admin_error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("closed in this process, but the close could not be kept: {error}"),
                );
            }
            let session = handle.lock();
            axum::Json(json!({
                "execution": session.execution.get(),
                "already_closed": false,
                "calls": session.calls(),
                "tokens_encoded": session.tokens_encoded,
                "tokens_reused": session.tokens_reused,
                "sampled_divergences": session.sampled_divergences,
            }))
            .into_response()
        }
        None => admin_error(StatusCode::NOT_FOUND, "unknown execution credential".into()),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RouteRequest {
    engine: usize,
}

async fn admin_route(
    State(app): State<Arc<AppState>>,
    Path(token): Path<String>,
    body: Bytes,
) -> Response {
    let request: RouteRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(error) => return admin_error(StatusCode::BAD_REQUEST, format!("body: {error}")),
    };
    if request.engine >= app.engines.len() {
        return admin_error(
            StatusCode::BAD_REQUEST,
            format!(
                "engine: {} is not one of the {} engines",
                request.engine,
                app.engines.len()
            ),
        );
    }
    match app.credential(&token) {
        Some(Credential::Open(handle)) => {
            handle.pin(request.engine);
            axum::Json(json!({ "engine": request.engine })).into_response()
        }
        Some(Credential::Closed(_)) => admin_error(
            StatusCode::CONFLICT,
            "this execution is closed; there is nothing to route".into(),
        ),
        None => admin_error(StatusCode::NOT_FOUND, "unknown execution credential".into()),
    }
}

/// Applies the log's routing facts (`RoutesUpdated`, `EngineDown`, `EngineReady`) to `state`,
/// from `from` (`None`: the committed end of the control log) on; resubscribes after the last
/// seen entry when the stream fails. Runs until the task is dropped.
pub async fn follow_routes(
    state: Arc<AppState>,
    addresses: String,
    from: Option<gyre_control::Sequence>,
) {
    let mut next = from.unwrap_or(gyre_control::Sequence {
        index: 0,
        position: 0,
    });
    loop {
        let result: Result<(), String> = async {
            let mut client =
                gyre_control::ClusterClient::new(&addresses).map_err(|e| e.to_string())?;
            if next.index == 0 {
                // Start at the committed end: earlier routes concern earlier executions.
                let status = client.status_all().await;
                let commit = status
                    .iter()
                    .filter_map(|(_, reply)| reply.as_ref().ok())
                    .map(|reply| reply.commit_index)
                    .max()
                    .unwrap_or(0);
                next = gyre_control::Sequence {
                    index: commit + 1,
                    position: 0,
                };
            }
            let mut stream = client
                .subscribe(next, false)
                .await
                .map_err(|e| e.to_string())?;
            while let Some(entry) = stream.message().await.map_err(|e| e.to_string())? {
                let events = gyre_log::decode_batch(&entry.batch).map_err(|e| e.to_string())?;
                for event in &events {
                    let moved = state.apply_route_event(&event.body);
                    if moved > 0 {
                        tracing::info!(
                            moved,
                            kind = event.body.kind_name(),
                            "routes followed from the log"
                        );
                    }
                }
                next = gyre_control::Sequence {
                    index: entry.index + 1,
                    position: 0,
                };
            }
            Ok(())
        }
        .await;
        if let Err(error) = result {
            tracing::warn!(%error, "following routes from the log; retrying in 1 s");
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

/// `value` in base 36 (digits, then lower-case letters).
fn base36(mut value: u64) -> String {
    let mut digits = Vec::new();
    loop {
        digits.push(b"0123456789abcdefghijklmnopqrstuvwxyz"[(value % 36) as usize]);
        value /= 36;
        if value == 0 {
            break;
        }
    }
    digits.reverse();
    String::from_utf8(digits).expect("ascii digits")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two read-backs of one id that left memory, racing: the second to finish keeps the
    /// first's copy, so the id takes one kept slot and one charge.
    #[test]
    fn a_response_read_back_twice_at_once_is_kept_once() {
        let model = crate::ChatModel::load(
            &crate::test_model::directory(),
            crate::ToolArgumentsForm::RawText,
        )
        .expect("the test model loads");
        let handle = ExecutionHandle::new(Session::new(ExecutionId(1), &model), 0);
        let first = Arc::new(StoredResponse::from_items(
            "resp_1",
            None,
            b"[]".to_vec(),
            true,
        ));
        let second = Arc::new(StoredResponse::from_items(
            "resp_1",
            None,
            b"[]".to_vec(),
            true,
        ));
        let kept = handle.keep_restored("resp_1", first.clone());
        assert!(Arc::ptr_eq(&kept, &first));
        let kept = handle.keep_restored("resp_1", second);
        assert!(
            Arc::ptr_eq(&kept, &first),
            "the copy kept first is the one used"
        );
        assert_eq!(handle.responses().len(), 1);
    }

    /// Every stride and offset, from every start: the first owned id at or after the start,
    /// and nothing owned skipped.
    #[test]
    fn execution_numbering_takes_the_first_owned_id() {
        for stride in 1..7u64 {
            for offset in 0..stride {
                let numbering = ExecutionNumbering::new(stride, offset).expect("valid");
                for from in 0..50u64 {
                    let first = numbering.first_from(from);
                    assert!(numbering.owns(first), "{stride} {offset} {from}: {first}");
                    assert!(first >= from.max(1));
                    assert!((from.max(1)..first).all(|id| !numbering.owns(id)));
                }
            }
        }
        // Near the end of the id space: no overflow, and nothing past the last id.
        let wide = ExecutionNumbering::new(u64::MAX, u64::MAX - 1).expect("valid");
        assert_eq!(wide.first_from(1), u64::MAX - 1);
        let half = ExecutionNumbering::new((1 << 63) + 5, 3).expect("valid");
        assert_eq!(half.first_from(4), (1 << 63) + 8);
        assert_eq!(half.first_from(u64::MAX), u64::MAX);
        assert!(ExecutionNumbering::new(0, 0)
            .unwrap_err()
            .contains("`execution_stride`"));
        assert!(ExecutionNumbering::new(4, 4)
            .unwrap_err()
            .contains("field `execution_offset` (4) must be below `execution_stride` (4)"));
    }

    #[test]
    fn kept_bodies_stay_within_their_budget_and_return_it_when_dropped() {
        let budget = Arc::new(BodyBudget {
            used: AtomicUsize::new(0),
            max: 100,
        });
        let first = Charge::take(&budget, 60).expect("within the budget");
        assert!(Charge::take(&budget, 60).is_none(), "beyond the budget");
        let second = Charge::take(&budget, 40).expect("exactly the budget");
        assert_eq!(budget.used.load(Ordering::Acquire), 100);
        drop(first);
        assert_eq!(budget.used.load(Ordering::Acquire), 40);
        drop(second);
        assert_eq!(budget.used.load(Ordering::Acquire), 0);
        let off = Arc::new(BodyBudget {
            used: AtomicUsize::new(0),
            max: 0,
        });
        assert!(Charge::take(&off, 1).is_none(), "0 turns reuse off");
    }

    /// Codex's turn metadata (as Codex 0.171 sends it, ids shortened) marks its compaction call.
    #[test]
    fn a_codex_compaction_is_told_by_its_turn_metadata() {
        let with = |value: &'static str| {
            let mut map = HeaderMap::new();
            map.insert("x-codex-turn-metadata", HeaderValue::from_static(value));
            map
        };
        assert!(compaction_requested(&with(
            r#"{"agent_name":"/root","window_number":0,"request_kind":"compaction","compaction":{"trigger":"auto","reason":"context_limit","strategy":"memento"}}"#
        )));
        assert!(!compaction_requested(&with(
            r#"{"agent_name":"/root","request_kind":"turn"}"#
        )));
        assert!(!compaction_requested(&with("not json")));
        assert!(!compaction_requested(&with(r#"{"request_kind":7}"#)));
        assert!(!compaction_requested(&HeaderMap::new()));
    }

    /// Claude Code's and Codex's sub-agent headers, as the real CLIs send them.
    #[test]
    fn agents_are_told_apart_by_the_harnesses_headers() {
        let headers = |pairs: &[(&'static str, &'static str)]| {
            let mut map = HeaderMap::new();
            for (name, value) in pairs {
                map.insert(*name, HeaderValue::from_static(value));
            }
            map
        };
        let main_codex = headers(&[("thread-id", "t0"), ("session-id", "t0")]);
        assert_eq!(agent_of(&main_codex), None);
        assert_eq!(
            agent_of(&headers(&[("x-claude-code-agent-id", "a7")])).as_deref(),
            Some("sub:a7")
        );
        let spawned = headers(&[
            ("thread-id", "t1"),
            ("x-openai-subagent", "collab_spawn"),
            ("x-codex-parent-thread-id", "t0"),
        ]);
        assert_eq!(agent_of(&spawned).as_deref(), Some("sub:t1"));
        let review = headers(&[("thread-id", "t2"), ("x-openai-subagent", "review")]);
        assert_eq!(agent_of(&review).as_deref(), Some("side:review:t2"));
        let windowed = headers(&[
            ("x-codex-window-id", "t3:0"),
            ("x-codex-parent-thread-id", "t0"),
        ]);
        assert_eq!(agent_of(&windowed).as_deref(), Some("sub:t3"));
        // A sub-agent header without any thread id names no agent rather than one shared name.
        assert_eq!(
            agent_of(&headers(&[("x-openai-subagent", "collab_spawn")])),
            None
        );
        // opencode: every call names its session; a sub-agent's its parent's too.
        let opencode_main = headers(&[("x-session-id", "ses_a"), ("x-session-affinity", "ses_a")]);
        assert_eq!(agent_of(&opencode_main), None);
        let opencode_sub = headers(&[("x-session-id", "ses_b"), ("x-parent-session-id", "ses_a")]);
        assert_eq!(agent_of(&opencode_sub).as_deref(), Some("sub:ses_b"));
        assert_eq!(
            agent_of(&headers(&[("x-parent-session-id", "ses_a")])),
            None
        );
    }
}
