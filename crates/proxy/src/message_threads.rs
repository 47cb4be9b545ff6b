//! Anthropic Message Threads (`thread`, beta `message-threads-2026-08-12`): a request may ask
//! the server to hold its conversation (`{"type": "create"}`) and a later one continue from a
//! response (`{"type": "continue", "previous_message_id": …}`) sending only the new turn's
//! messages. Claude Code does so when `CLAUDE_CODE_TETHER_LIVE` is set, and the Anthropic
//! SDKs' tool runners by default.
//!
//! The proxy holds each execution's threads in memory ([`ThreadStore`], per execution, within a
//! budget over all executions) and on the log (each response's [`ThreadTurn`], committed before
//! its id is handed over, from which a restarted proxy holds them again): a
//! response to a request with a `thread` is held under its id as the whole conversation that
//! produced it (`system`, `tools`, `messages` and the answer as an assistant message), and a
//! `continue` becomes the body a stateless client would have sent: the held conversation, then
//! the request's own messages (its own `system` / `tools` when it sends them, else the held
//! ones), without `thread` ([`expand`]). So the model sees, the tree records and a capture
//! keeps whole conversations, exactly as from a client that re-sends everything. As the API
//! does, a response is continued once (`thread_already_continued`, 400), not while another
//! request continues it (`thread_continue_in_flight`, 400); one no longer in memory (given up
//! for room, or older than a restart held again) is read back from the log ([`read_back`]),
//! and one neither holds (never made, or larger than the whole store) is `thread_not_found`
//! (404). On each of those errors (`error.details.error_code`) the SDKs and Claude Code send
//! the turn again with the whole conversation under a new `create`.
//!
//! Pure but for the store's lock: request bytes and held threads in, bodies and verdicts out.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use serde_json::{json, Map, Value};

use crate::{Api, ApiError, ApiErrorKind};

/// Threads an execution holds, not yet continued (a linear conversation holds one; each
/// sub-agent its own). Beyond this, or beyond [`HELD_BYTES_MAX`], one is given up: first a
/// thread whose agent has held a newer one since (a finished sub-agent's, a side branch), else
/// the one held longest. A later `continue` of it reads it back from the log ([`read_back`]).
pub const HELD_MAX: usize = 16;

/// The JSON bytes an execution's held threads may take together.
pub const HELD_BYTES_MAX: usize = 64 << 20;

/// A held thread's share of the proxy's memory for threads over all executions, given back
/// when the thread is dropped (continued, given up for room, or its execution gone).
pub type Charge = Box<dyn std::any::Any + Send + Sync>;

/// Charges a thread's JSON bytes against the proxy's budget over all executions, making room
/// if it can (see the server's `--thread-store-mib`); `None` when it cannot, and the thread is
/// not held (a later `continue` of it reads it back from the log, where the same charge
/// decides again).
pub type Charger = Arc<dyn Fn(usize) -> Option<Charge> + Send + Sync>;

/// Continued ids an execution remembers, to answer a second `continue` of one with
/// `thread_already_continued` rather than `thread_not_found`.
const CONTINUED_REMEMBERED: usize = 64;

/// What a request's `thread` asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ThreadParam {
    /// Hold this conversation under the response's id.
    Create,
    /// Continue from the response `previous_message_id`, with only the new messages.
    Continue { previous_message_id: String },
}

/// A continue's id and its body, parsed.
pub type Continue = (String, Map<String, Value>);

/// A Messages body's `continue`, read from the raw bytes before the body is expanded: the id
/// it continues and the body parsed. Only a body that mentions `previous_message_id` is parsed
/// here (a continue's body holds only the new turn, so this parse is small); a `create` is
/// read from the parsed body ([`thread_of`]), so it costs no second parse of the whole
/// conversation. `None` when the body holds no continue; a 400 naming the field when its
/// `thread` is malformed.
pub fn read_continue(body: &[u8]) -> Result<Option<Continue>, ApiError> {
    if memchr::memmem::find(body, b"\"previous_message_id\"").is_none() {
        return Ok(None);
    }
    // A JS harness may send lone surrogate escapes; the ordinary parse reads them this way.
    let fixed = crate::body::lone_surrogates_replaced(body);
    // A body that is not an object is named by the ordinary parse.
    let Ok(object) = serde_json::from_slice::<Map<String, Value>>(fixed.as_deref().unwrap_or(body))
    else {
        return Ok(None);
    };
    match thread_of(object.get("thread"))? {
        Some(ThreadParam::Continue {
            previous_message_id,
        }) => Ok(Some((previous_message_id, object))),
        Some(ThreadParam::Create) | None => Ok(None),
    }
}

/// The `thread` a parsed Messages body asks for (`body.get("thread")`).
pub fn thread_of(thread: Option<&Value>) -> Result<Option<ThreadParam>, ApiError> {
    let thread = match thread {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(thread)) => thread,
        Some(_) => return Err(invalid("must be an object with a `type`")),
    };
    match thread.get("type").and_then(Value::as_str) {
        Some("create") => Ok(Some(ThreadParam::Create)),
        Some("continue") => match thread.get("previous_message_id") {
            Some(Value::String(id)) if !id.is_empty() => Ok(Some(ThreadParam::Continue {
                previous_message_id: id.clone(),
            })),
            _ => Err(ApiError::invalid_field(
                Api::Anthropic,
                "thread.previous_message_id",
                "a `continue` names the response it continues by its id (a string)",
            )),
        },
        Some(other) => Err(invalid(&format!(
            "unknown type `{}`, expected `create` or `continue`",
            other.chars().take(64).collect::<String>()
        ))),
        None => Err(invalid("must have a `type`: `create` or `continue`")),
    }
}

/// Whether `error` is one of the API's answers about a thread (`thread_…`): the request it
/// refuses carried nothing a model saw.
pub fn is_thread_error(error: &ApiError) -> bool {
    error.code.is_some_and(|code| code.starts_with("thread_"))
}

/// Whether `error` is [`thread_not_found`] (the log may still hold the thread).
pub fn is_thread_not_found(error: &ApiError) -> bool {
    error.code == Some("thread_not_found")
}

fn invalid(problem: &str) -> ApiError {
    ApiError::invalid_field(Api::Anthropic, "thread", problem)
}

fn thread_error(kind: ApiErrorKind, code: &'static str, message: String) -> ApiError {
    let mut error = ApiError::new(Api::Anthropic, kind, message);
    error.code = Some(code);
    error
}

fn shown(id: &str) -> String {
    id.chars().take(100).collect()
}

/// The API's answer to a `continue` from a thread it does not hold: a 404 whose
/// `error.details.error_code` is `thread_not_found`, on which clients send the turn again with
/// the whole conversation under a new `create`.
pub fn thread_not_found(previous_message_id: &str) -> ApiError {
    thread_error(
        ApiErrorKind::NotFound,
        "thread_not_found",
        format!(
            "No usable Thread state was found for previous_message_id `{}` in this execution \
             (neither this proxy's memory nor its log holds it). Replay the full conversation with `thread: {{\"type\": \"create\"}}`.",
            shown(previous_message_id)
        ),
    )
}

/// A conversation held under a response's id: what a `continue` from it starts with, as JSON
/// text (compact: a held conversation costs its bytes once).
#[derive(Debug, PartialEq)]
pub struct HeldThread {
    pub system: Option<String>,
    pub tools: Option<String>,
    /// The request's messages, then the response as an assistant message: JSON texts joined
    /// with commas (the inside of the `messages` array).
    pub messages: String,
    pub messages_count: usize,
}

impl HeldThread {
    /// The JSON bytes it holds (what it is charged).
    pub fn bytes(&self) -> usize {
        self.messages.len()
            + self.system.as_ref().map_or(0, String::len)
            + self.tools.as_ref().map_or(0, String::len)
    }
}

struct Held {
    thread: Arc<HeldThread>,
    agent: String,
    /// When it was held (the store's count).
    order: u64,
    /// Its share of the proxy's budget (`None`: not charged, as in a store without one).
    charge: Option<Charge>,
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Held")
            .field("bytes", &self.thread.bytes())
            .field("agent", &self.agent)
            .field("order", &self.order)
            .field("charged", &self.charge.is_some())
            .finish()
    }
}

/// One execution's threads.
#[derive(Debug, Default)]
pub struct ThreadStore {
    held: HashMap<String, Held>,
    next_order: u64,
    /// Bytes of the held threads.
    bytes: usize,
    /// Ids being continued, with the charge of the thread each took (held until the continue
    /// ends: the thread is still in memory).
    in_flight: HashMap<String, Option<Charge>>,
    continued: VecDeque<String>,
    /// Threads given up for this execution's own limits since the server last counted them
    /// ([`ThreadStore::take_given_up`]).
    given_up: u64,
    /// Ids in flight from a read-back's own copy ([`ThreadStore::begin_pinned`]): uncharged,
    /// so a failed continue lets the copy go instead of holding it outside the budget.
    pinned: std::collections::HashSet<String>,
}

impl ThreadStore {
    /// Takes the thread held under `id` for a `continue` (it is in flight until the continue
    /// ends: [`ThreadStore::hold`] or [`ThreadStore::abandon`]); the API's error otherwise.
    pub fn begin_continue(&mut self, id: &str) -> Result<Arc<HeldThread>, ApiError> {
        if let Some(held) = self.held.remove(id) {
            self.bytes -= held.thread.bytes();
            self.in_flight.insert(id.to_string(), held.charge);
            return Ok(held.thread);
        }
        Err(self.refusal(id))
    }

    /// Why a continue of `id`, which is not held, is refused.
    fn refusal(&self, id: &str) -> ApiError {
        if self.in_flight.contains_key(id) {
            return thread_error(
                ApiErrorKind::InvalidRequest,
                "thread_continue_in_flight",
                format!(
                    "Another request is still continuing from previous_message_id `{}`. Wait \
                     for it to complete and continue from its response `id`, or replay the full \
                     conversation with `thread: {{\"type\": \"create\"}}`.",
                    shown(id)
                ),
            );
        }
        if self.continued.iter().any(|continued| continued == id) {
            return thread_error(
                ApiErrorKind::InvalidRequest,
                "thread_already_continued",
                format!(
                    "The response `{}` has already been continued, and each response can be \
                     continued only once. Continue from the Thread's most recent response `id`.",
                    shown(id)
                ),
            );
        }
        thread_not_found(id)
    }

    /// The thread a continue of `id` would start from, left held (a `count_tokens` request
    /// naming one counts the whole conversation); the error a continue of it would get.
    pub fn peek(&self, id: &str) -> Result<Arc<HeldThread>, ApiError> {
        match self.held.get(id) {
            Some(held) => Ok(held.thread.clone()),
            None => Err(self.refusal(id)),
        }
    }

    /// A continue of `id` (by `agent`) that produced no response: the thread can be continued
    /// again.
    pub fn abandon(&mut self, id: &str, thread: Arc<HeldThread>, agent: &str) {
        if self.pinned.remove(id) {
            // Continued from an uncharged copy: a retry reads it back again, charged.
            self.in_flight.remove(id);
            return;
        }
        if let Some(charge) = self.in_flight.remove(id) {
            self.insert(id.to_string(), thread, agent, charge);
        }
    }

    /// Holds `thread` under the response id `id`, answered to `agent`, uncharged; `continued`:
    /// the id the request continued, which can be continued no more.
    pub fn hold(&mut self, id: String, thread: HeldThread, agent: &str, continued: Option<&str>) {
        self.settle(continued);
        self.insert(id, Arc::new(thread), agent, None);
    }

    /// [`ThreadStore::hold`] with the thread's share of the proxy's budget.
    pub fn hold_charged(
        &mut self,
        id: String,
        thread: HeldThread,
        charge: Charge,
        agent: &str,
        continued: Option<&str>,
    ) {
        self.settle(continued);
        self.insert(id, Arc::new(thread), agent, Some(charge));
    }

    /// The continue of `continued` ended with a response (held or not): that id can be
    /// continued no more, and the thread it took is let go.
    pub fn settle(&mut self, continued: Option<&str>) {
        if let Some(continued) = continued {
            self.in_flight.remove(continued);
            self.pinned.remove(continued);
            self.continued.push_back(continued.to_string());
            while self.continued.len() > CONTINUED_REMEMBERED {
                self.continued.pop_front();
            }
        }
    }

    /// Gives back the charge of the thread a continue of `id` took, before the continue's own
    /// (longer) conversation is charged: the new conversation holds the old one.
    pub fn release_in_flight_charge(&mut self, id: &str) -> Option<Charge> {
        self.in_flight.get_mut(id).and_then(Option::take)
    }

    fn insert(&mut self, id: String, thread: Arc<HeldThread>, agent: &str, charge: Option<Charge>) {
        self.bytes += thread.bytes();
        let order = self.next_order;
        self.next_order += 1;
        if let Some(replaced) = self.held.insert(
            id.clone(),
            Held {
                thread,
                agent: agent.to_string(),
                order,
                charge,
            },
        ) {
            self.bytes -= replaced.thread.bytes();
        }
        while self.held.len() > HELD_MAX || (self.bytes > HELD_BYTES_MAX && self.held.len() > 1) {
            let Some(victim) = self.victim(Some(&id)) else {
                break;
            };
            if let Some(given_up) = self.held.remove(&victim) {
                self.bytes -= given_up.thread.bytes();
                self.given_up += 1;
            }
        }
    }

    /// How many threads this execution's own limits ([`HELD_MAX`], [`HELD_BYTES_MAX`]) gave
    /// up since the last call (for the proxy's counter of threads given up).
    pub fn take_given_up(&mut self) -> u64 {
        std::mem::take(&mut self.given_up)
    }

    /// Gives up one held thread to make room in the proxy's budget (the one [`insert`] would
    /// give up first); false when none is held. A later `continue` of it reads it back from the
    /// log ([`read_back`]).
    ///
    /// [`insert`]: ThreadStore::hold
    pub fn give_up_one(&mut self) -> bool {
        let Some(victim) = self.victim(None) else {
            return false;
        };
        match self.held.remove(&victim) {
            Some(given_up) => {
                self.bytes -= given_up.thread.bytes();
                true
            }
            None => false,
        }
    }

    /// The thread to give up for room (never `keep`): the oldest of those whose agent holds a
    /// newer one, else the oldest.
    fn victim(&self, keep: Option<&str>) -> Option<String> {
        let newest: HashMap<&str, u64> =
            self.held.values().fold(HashMap::new(), |mut newest, held| {
                let entry = newest.entry(held.agent.as_str()).or_insert(held.order);
                *entry = (*entry).max(held.order);
                newest
            });
        let candidates = self.held.iter().filter(|(id, _)| Some(id.as_str()) != keep);
        let superseded = candidates
            .clone()
            .filter(|(_, held)| newest[held.agent.as_str()] > held.order)
            .min_by_key(|(_, held)| held.order);
        superseded
            .or_else(|| candidates.min_by_key(|(_, held)| held.order))
            .map(|(id, _)| id.clone())
    }

    /// How many threads are held (not in flight).
    pub fn held_count(&self) -> usize {
        self.held.len()
    }

    /// The JSON bytes the held threads take.
    pub fn held_bytes(&self) -> usize {
        self.bytes
    }
}

fn json_text(value: &Value) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

/// The body a stateless client would have sent for a `continue` from `held`: `object` (the
/// request, parsed) with the held messages before its own, the held `system` and `tools` where
/// it sends none (absent or null), and no `thread`; with it, the conversation it makes, which
/// its answer is held with. `bytes_max`: the body limit (a longer conversation is a 413, as it
/// would be sent whole).
pub fn expand(
    mut object: Map<String, Value>,
    held: &HeldThread,
    bytes_max: usize,
) -> Result<(Bytes, HeldThread), ApiError> {
    let own = match object.remove("messages") {
        Some(Value::Array(own)) => own,
        // The ordinary parse names what is wrong with it, after the held messages.
        Some(other) => vec![other],
        None => Vec::new(),
    };
    object.remove("thread");
    let mut messages = held.messages.clone();
    for message in &own {
        if !messages.is_empty() {
            messages.push(',');
        }
        messages.push_str(&json_text(message));
    }
    let mut body = String::with_capacity(messages.len() + 1024);
    body.push_str("{\"messages\":[");
    body.push_str(&messages);
    body.push(']');
    let mut kept = [None, None];
    for ((field, held_value), kept) in [("system", &held.system), ("tools", &held.tools)]
        .into_iter()
        .zip(&mut kept)
    {
        match object.get(field).filter(|value| !value.is_null()) {
            Some(own) => *kept = Some(json_text(own)),
            None => {
                object.remove(field);
                if let Some(held_value) = held_value {
                    body.push_str(&format!(",\"{field}\":{held_value}"));
                }
                kept.clone_from(held_value);
            }
        }
    }
    for (key, value) in &object {
        body.push(',');
        body.push_str(&json_text(&Value::String(key.clone())));
        body.push(':');
        body.push_str(&json_text(value));
    }
    body.push('}');
    if body.len() > bytes_max {
        return Err(ApiError::new(
            Api::Anthropic,
            ApiErrorKind::RequestTooLarge,
            format!("the conversation continued in this thread exceeds the body limit of {bytes_max} bytes"),
        ));
    }
    let [system, tools] = kept;
    let conversation = HeldThread {
        system,
        tools,
        messages,
        messages_count: held.messages_count + own.len(),
    };
    Ok((Bytes::from(body), conversation))
}

/// An error about a continue's expanded `messages` (the held conversation's `held_count`
/// messages, then the request's own), said in the client's terms: `messages[i]` counts from
/// its own first message; a held message is named as such.
pub fn rebase_error(error: ApiError, held_count: usize, previous: &str) -> ApiError {
    error.rebased("messages", held_count, "thread.messages", |index| {
        format!(
            "message {index} of the conversation held as thread {}",
            shown(previous)
        )
    })
}

/// What a request with a `thread` holds when its response ends (see [`ThreadHold::hold`]);
/// dropped without holding (the call failed or was refused), it gives the thread it continued
/// back, so the client's retry can continue it.
pub struct ThreadHold {
    store: Arc<Mutex<ThreadStore>>,
    agent: String,
    continued: Option<(String, Arc<HeldThread>)>,
    /// The request's whole conversation, until its answer is held.
    conversation: Mutex<Option<HeldThread>>,
    held: std::sync::atomic::AtomicBool,
    /// Charges the answer's thread against the proxy's budget (`None`: uncharged).
    charger: Option<Charger>,
}

impl Drop for ThreadHold {
    fn drop(&mut self) {
        if self.held.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        if let Some((id, thread)) = self.continued.take() {
            lock(&self.store).abandon(&id, thread, &self.agent);
        }
    }
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl std::fmt::Debug for ThreadHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadHold")
            .field("agent", &self.agent)
            .field("continued", &self.continued_id())
            .finish_non_exhaustive()
    }
}

impl PartialEq for ThreadHold {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

impl ThreadHold {
    /// For a request of `agent` with a `thread`: `continued`, the thread a `continue` took
    /// ([`ThreadStore::begin_continue`]).
    pub fn new(
        store: Arc<Mutex<ThreadStore>>,
        agent: &str,
        continued: Option<(String, Arc<HeldThread>)>,
    ) -> Self {
        Self {
            store,
            agent: agent.to_string(),
            continued,
            conversation: Mutex::new(None),
            held: std::sync::atomic::AtomicBool::new(false),
            charger: None,
        }
    }

    /// The thread the answer makes is charged with `charger` before it is held, and not held
    /// when that finds no room.
    pub fn charged_by(mut self, charger: Charger) -> Self {
        self.charger = Some(charger);
        self
    }

    /// The id of the response the request continues (`None` for a `create`).
    pub fn continued_id(&self) -> Option<&str> {
        self.continued.as_ref().map(|(id, _)| id.as_str())
    }

    /// The continued thread's id and how many messages it held (`None` for a `create`).
    pub fn continued_messages(&self) -> Option<(&str, usize)> {
        self.continued
            .as_ref()
            .map(|(id, thread)| (id.as_str(), thread.messages_count))
    }

    /// The request's whole conversation: a continue's, as [`expand`] made it.
    pub fn set_conversation(&self, conversation: HeldThread) {
        *lock(&self.conversation) = Some(conversation);
    }

    /// The request's whole conversation, read from a `create`'s parsed body.
    pub fn read_conversation(&self, body: &Value) {
        let field = |name: &str| {
            body.get(name)
                .filter(|value| !value.is_null())
                .map(json_text)
        };
        let (messages, messages_count) = match body.get("messages") {
            Some(Value::Array(messages)) => (
                messages.iter().map(json_text).collect::<Vec<_>>().join(","),
                messages.len(),
            ),
            _ => (String::new(), 0),
        };
        *lock(&self.conversation) = Some(HeldThread {
            system: field("system"),
            tools: field("tools"),
            messages,
            messages_count,
        });
    }

    /// The response `id` ended with `content` (its blocks as the API returned them): held
    /// under `id`, the thread it continued used up. Returns what the response adds to the
    /// conversation it continues, for the log (see [`ThreadTurn`]). Once; later calls do
    /// nothing and return `None`.
    pub fn hold(&self, id: &str, content: &Value) -> Option<ThreadTurn> {
        let (turn, answer) = self.answer(content)?;
        self.hold_answered(id, answer);
        Some(turn)
    }

    /// What the response ending with `content` adds to the thread, before it is held: the
    /// caller commits the turn together with the call's record, then holds the answer with
    /// [`ThreadHold::hold_answered`] (a failed commit holds nothing, and the continued thread
    /// goes back to its store when this drops). `None` once the answer was held.
    pub fn answer(&self, content: &Value) -> Option<(ThreadTurn, HeldAnswer)> {
        let conversation = lock(&self.conversation);
        let thread = conversation.as_ref()?;
        let answer = json_text(&json!({"role": "assistant", "content": content}));
        let turn = self.turn(thread, &answer);
        Some((turn, HeldAnswer(answer)))
    }

    /// Holds the response `id`, whose turn is durable, as [`ThreadHold::hold`].
    pub fn hold_answered(&self, id: &str, HeldAnswer(answer): HeldAnswer) {
        let Some(mut thread) = lock(&self.conversation).take() else {
            return;
        };
        if !thread.messages.is_empty() {
            thread.messages.push(',');
        }
        thread.messages.push_str(&answer);
        thread.messages_count += 1;
        let continued = self.continued.as_ref().map(|(id, _)| id.as_str());
        match &self.charger {
            None => lock(&self.store).hold(id.to_string(), thread, &self.agent, continued),
            Some(charger) => {
                // The new conversation holds the continued one: charged for it alone. The
                // charger may make room in any execution's store, this one's too, so no store
                // is locked while it runs.
                if let Some(continued) = continued {
                    drop(lock(&self.store).release_in_flight_charge(continued));
                }
                match charger(thread.bytes()) {
                    Some(charge) => lock(&self.store).hold_charged(
                        id.to_string(),
                        thread,
                        charge,
                        &self.agent,
                        continued,
                    ),
                    None => {
                        tracing::warn!(
                            id,
                            bytes = thread.bytes(),
                            "the thread store is full (--thread-store-mib); this response's \
                             thread is not held, a continue of it reads it back from the log"
                        );
                        lock(&self.store).settle(continued);
                    }
                }
            }
        }
        self.held.store(true, std::sync::atomic::Ordering::Release);
    }

    /// What the answer `answer` (JSON text) to `conversation` adds to the thread this request
    /// continued (all of it for a `create`).
    fn turn(&self, conversation: &HeldThread, answer: &str) -> ThreadTurn {
        let (previous, before) = match &self.continued {
            Some((id, held)) => (Some(id.clone()), Some(held.as_ref())),
            None => (None, None),
        };
        let mut items = String::from("{");
        for (name, own, held) in [
            (
                "system",
                &conversation.system,
                before.and_then(|b| b.system.as_ref()),
            ),
            (
                "tools",
                &conversation.tools,
                before.and_then(|b| b.tools.as_ref()),
            ),
        ] {
            if let Some(own) = own.as_ref().filter(|own| Some(*own) != held) {
                if items.len() > 1 {
                    items.push(',');
                }
                items.push_str(&format!("\"{name}\":{own}"));
            }
        }
        items.push('}');
        let held_len = before.map_or(0, |before| before.messages.len());
        let own = conversation
            .messages
            .get(held_len..)
            .unwrap_or_default()
            .trim_start_matches(',');
        for piece in [own, answer] {
            if !piece.is_empty() {
                items.push(',');
                items.push_str(piece);
            }
        }
        ThreadTurn {
            previous,
            items: items.into_bytes(),
        }
    }
}

/// A response's answer as an assistant message (JSON text), made before it is held
/// ([`ThreadHold::answer`]).
#[derive(Debug)]
pub struct HeldAnswer(String);

/// What one response of a thread adds to the conversation it continues, as the log keeps it
/// (a `ResponseStored` event under the response's `msg_…` id, naming the response it
/// continues): a settings object (`system` / `tools` where this turn set them, else `{}`),
/// then the turn's own messages and the answer as an assistant message — JSON values joined
/// with commas. A thread of n turns is on the log once, and a restarted proxy rebuilds its
/// threads from these ([`ThreadStore::restore`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadTurn {
    pub previous: Option<String>,
    pub items: Vec<u8>,
}

/// Whether a stored response record is a Message Thread's (its id is an Anthropic message id)
/// rather than an OpenAI Responses answer.
pub fn is_thread_record(response_id: &str) -> bool {
    response_id.starts_with("msg_")
}

/// A thread turn's items split: its settings and its messages (JSON texts joined with commas)
/// with how many there are. `None` when they are not what [`ThreadHold::turn`] writes.
fn read_turn(items: &[u8]) -> Option<(Option<String>, Option<String>, String, usize)> {
    #[derive(serde::Deserialize)]
    struct Settings<'a> {
        #[serde(borrow)]
        system: Option<&'a serde_json::value::RawValue>,
        #[serde(borrow)]
        tools: Option<&'a serde_json::value::RawValue>,
    }
    let mut list = Vec::with_capacity(items.len() + 2);
    list.push(b'[');
    list.extend_from_slice(items);
    list.push(b']');
    let values: Vec<&serde_json::value::RawValue> = serde_json::from_slice(&list).ok()?;
    let (settings, messages) = values.split_first()?;
    let settings: Settings<'_> = serde_json::from_str(settings.get()).ok()?;
    let text = messages
        .iter()
        .map(|message| message.get())
        .collect::<Vec<_>>()
        .join(",");
    Some((
        settings.system.map(|raw| raw.get().to_string()),
        settings.tools.map(|raw| raw.get().to_string()),
        text,
        messages.len(),
    ))
}

/// The whole conversation of the thread `head` from its records (by id: the id it continues
/// and what it adds), back to its `create` and then forward; `None` (logged) when the chain
/// is not all there or a record does not read back.
fn rebuild(by_id: &HashMap<String, (Option<String>, Vec<u8>)>, head: &str) -> Option<HeldThread> {
    let mut chain = Vec::new();
    let mut at = Some(head.to_string());
    while let Some(id) = at.take() {
        let Some((previous, items)) = by_id.get(&id) else {
            tracing::warn!(
                id = head,
                missing = id,
                "a thread's chain is not in the log; not held"
            );
            return None;
        };
        chain.push(items);
        at.clone_from(previous);
        if chain.len() > by_id.len() {
            return None;
        }
    }
    let mut thread = HeldThread {
        system: None,
        tools: None,
        messages: String::new(),
        messages_count: 0,
    };
    for items in chain.into_iter().rev() {
        let Some((system, tools, messages, count)) = read_turn(items) else {
            tracing::warn!(id = head, "a thread record does not read back; not held");
            return None;
        };
        if system.is_some() {
            thread.system = system;
        }
        if tools.is_some() {
            thread.tools = tools;
        }
        if !messages.is_empty() {
            if !thread.messages.is_empty() {
                thread.messages.push(',');
            }
            thread.messages.push_str(&messages);
        }
        thread.messages_count += count;
    }
    Some(thread)
}

/// What the log says of a thread a `continue` named that this proxy no longer holds
/// ([`read_back`]).
#[derive(Debug, PartialEq)]
pub enum ReadBack {
    /// A later turn continues it: continued already.
    Continued,
    /// Its whole conversation, to hold again.
    Thread(HeldThread),
    /// The log does not hold it (or not all of its chain).
    Missing,
}

/// The thread `id` read back from `records` (an execution's thread records in commit order,
/// `(id, previous, items)`): a thread given up for room, or older than the newest held after
/// a restart, is on the log, so its continue is served rather than sent again whole.
pub fn read_back(records: Vec<(String, Option<String>, Vec<u8>)>, id: &str) -> ReadBack {
    let mut by_id: HashMap<String, (Option<String>, Vec<u8>)> = HashMap::new();
    for (record, previous, items) in records {
        if previous.as_deref() == Some(id) {
            return ReadBack::Continued;
        }
        by_id.entry(record).or_insert((previous, items));
    }
    if !by_id.contains_key(id) {
        return ReadBack::Missing;
    }
    rebuild(&by_id, id).map_or(ReadBack::Missing, ReadBack::Thread)
}

impl ThreadStore {
    /// The thread `id`, read back from the log ([`read_back`]), is held again for `agent`
    /// (charged `charge`), unless a request meanwhile held, took or continued it. Returns it
    /// when held, for the request that read it back ([`ThreadStore::begin_pinned`]).
    pub fn hold_read_back(
        &mut self,
        id: &str,
        thread: HeldThread,
        agent: &str,
        charge: Option<Charge>,
    ) -> Option<Arc<HeldThread>> {
        if self.held.contains_key(id)
            || self.in_flight.contains_key(id)
            || self.continued.iter().any(|continued| continued == id)
        {
            return None;
        }
        let thread = Arc::new(thread);
        self.insert(id.to_string(), thread.clone(), agent, charge);
        Some(thread)
    }

    /// [`ThreadStore::begin_continue`] for the request that read `id` back as `pinned`: when
    /// another execution's charge gave it up again meanwhile, the request continues from its
    /// copy (uncharged while in flight) rather than answering `thread_not_found`.
    pub fn begin_pinned(
        &mut self,
        id: &str,
        pinned: &Arc<HeldThread>,
    ) -> Result<Arc<HeldThread>, ApiError> {
        if self.held.contains_key(id)
            || self.in_flight.contains_key(id)
            || self.continued.iter().any(|continued| continued == id)
        {
            return self.begin_continue(id);
        }
        self.in_flight.insert(id.to_string(), None);
        self.pinned.insert(id.to_string());
        Ok(pinned.clone())
    }

    /// The log says `id` was continued ([`ReadBack::Continued`]): a continue of it is
    /// `thread_already_continued`.
    pub fn note_continued(&mut self, id: &str) {
        if !self.continued.iter().any(|continued| continued == id) {
            self.continued.push_back(id.to_string());
            while self.continued.len() > CONTINUED_REMEMBERED {
                self.continued.pop_front();
            }
        }
    }

    /// Rebuilds the threads a restarted proxy held, from this execution's thread records in
    /// commit order (`(id, previous, items)`, see [`ThreadTurn`]): every response no later
    /// record continues is held again as its whole conversation (the newest [`HELD_MAX`]),
    /// each charged by `charge` (not held when it finds no room), and the continued ones are
    /// remembered as such. A record whose chain is not all there is skipped. Returns how many
    /// threads are held.
    pub fn restore(
        &mut self,
        records: Vec<(String, Option<String>, Vec<u8>)>,
        agent: &str,
        mut charge: impl FnMut(usize) -> Option<Charge>,
    ) -> usize {
        let mut by_id: HashMap<String, (Option<String>, Vec<u8>)> = HashMap::new();
        let mut order = Vec::new();
        let mut continued: Vec<String> = Vec::new();
        for (id, previous, items) in records {
            if by_id.contains_key(&id) {
                continue;
            }
            if let Some(previous) = &previous {
                continued.push(previous.clone());
            }
            order.push(id.clone());
            by_id.insert(id, (previous, items));
        }
        let continued_set: std::collections::HashSet<&str> =
            continued.iter().map(String::as_str).collect();
        let heads: Vec<&String> = order
            .iter()
            .filter(|id| !continued_set.contains(id.as_str()))
            .collect();
        let heads = &heads[heads.len().saturating_sub(HELD_MAX)..];
        let rebuilt: Vec<(String, HeldThread)> = heads
            .iter()
            .filter_map(|head| Some((head.to_string(), rebuild(&by_id, head)?)))
            .collect();
        for id in continued
            .iter()
            .skip(continued.len().saturating_sub(CONTINUED_REMEMBERED))
        {
            if !self.continued.contains(id) {
                self.continued.push_back(id.clone());
            }
        }
        while self.continued.len() > CONTINUED_REMEMBERED {
            self.continued.pop_front();
        }
        for (id, thread) in rebuilt {
            let Some(granted) = charge(thread.bytes()) else {
                tracing::warn!(id, "the thread store is full (--thread-store-mib); a thread read back from the log is not held");
                continue;
            };
            self.insert(id, Arc::new(thread), agent, Some(granted));
        }
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_continue_is_read_from_the_raw_body() {
        assert_eq!(
            read_continue(br#"{"model":"m","messages":[]}"#).unwrap(),
            None
        );
        // The word in a message is not the field.
        assert_eq!(
            read_continue(br#"{"messages":[{"role":"user","content":"\"previous_message_id\""}]}"#)
                .unwrap(),
            None
        );
        // A create is read from the parsed body.
        assert_eq!(
            read_continue(br#"{"thread":{"type":"create"},"messages":[]}"#).unwrap(),
            None
        );
        assert_eq!(thread_of(None).unwrap(), None);
        assert_eq!(thread_of(Some(&Value::Null)).unwrap(), None);
        assert_eq!(
            thread_of(Some(&json!({"type": "create"}))).unwrap(),
            Some(ThreadParam::Create)
        );
        let (id, object) =
            read_continue(br#"{"thread":{"type":"continue","previous_message_id":"msg_1"}}"#)
                .unwrap()
                .unwrap();
        assert_eq!(id, "msg_1");
        assert!(object.contains_key("thread"));
    }

    #[test]
    fn a_malformed_thread_is_a_400_naming_the_field() {
        for (thread, param) in [
            (json!("create"), "thread"),
            (json!({}), "thread"),
            (json!({"type": "fork"}), "thread"),
            (json!({"type": "continue"}), "thread.previous_message_id"),
            (
                json!({"type": "continue", "previous_message_id": 7}),
                "thread.previous_message_id",
            ),
        ] {
            let error = thread_of(Some(&thread)).unwrap_err();
            assert_eq!(error.status(), 400, "{thread}");
            assert_eq!(error.param.as_deref(), Some(param));
            assert!(error.body_json()["error"].get("details").is_none());
            assert!(!is_thread_error(&error));
        }
        let error = read_continue(br#"{"thread":{"type":"continue","previous_message_id":7}}"#)
            .unwrap_err();
        assert_eq!(error.param.as_deref(), Some("thread.previous_message_id"));
    }

    fn conversation(turns: usize) -> HeldThread {
        let messages: Vec<String> = (0..turns)
            .map(|turn| json_text(&json!({"role": "user", "content": format!("turn {turn}")})))
            .collect();
        HeldThread {
            system: Some(json_text(&json!("Be brief."))),
            tools: Some(json_text(
                &json!([{"name": "t", "input_schema": {"type": "object"}}]),
            )),
            messages: messages.join(","),
            messages_count: turns,
        }
    }

    fn code(error: &ApiError) -> (u16, String) {
        let body = error.body_json();
        (
            error.status(),
            body["error"]["details"]["error_code"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        )
    }

    #[test]
    fn a_held_thread_is_continued_once_and_given_back_by_a_failed_continue() {
        let store = Arc::new(Mutex::new(ThreadStore::default()));
        assert_eq!(
            code(&lock(&store).begin_continue("msg_0").unwrap_err()),
            (404, "thread_not_found".into())
        );
        lock(&store).hold("msg_1".into(), conversation(1), "main", None);
        let held = lock(&store).begin_continue("msg_1").unwrap();
        assert_eq!(held.messages_count, 1);
        assert_eq!(
            code(&lock(&store).begin_continue("msg_1").unwrap_err()),
            (400, "thread_continue_in_flight".into())
        );
        // A continue that fails gives the thread back.
        drop(ThreadHold::new(
            store.clone(),
            "main",
            Some(("msg_1".into(), held)),
        ));
        let held = lock(&store).begin_continue("msg_1").unwrap();
        let hold = ThreadHold::new(store.clone(), "main", Some(("msg_1".into(), held)));
        let body = json!({"system": "Be brief.", "messages": [{"role": "user", "content": "turn 0"},
                          {"role": "user", "content": "turn 1"}]});
        hold.read_conversation(&body);
        hold.hold("msg_2", &json!([{"type": "text", "text": "ok"}]));
        drop(hold);
        assert_eq!(
            code(&lock(&store).begin_continue("msg_1").unwrap_err()),
            (400, "thread_already_continued".into())
        );
        let next = lock(&store).begin_continue("msg_2").unwrap();
        assert_eq!(
            next.messages_count, 3,
            "the request's messages and the answer"
        );
        let messages: Value = serde_json::from_str(&format!("[{}]", next.messages)).unwrap();
        assert_eq!(messages[2]["role"], "assistant");
        assert_eq!(messages[2]["content"][0]["text"], "ok");
        assert_eq!(next.tools, None, "what the request sent");
        assert_eq!(
            lock(&store).held_bytes(),
            0,
            "nothing held while it is in flight"
        );
    }

    /// A charged store: each held thread keeps its charge until it is given up or continued;
    /// a continue's thread keeps its charge while in flight, lets it go before the new one is
    /// charged, and a continue whose answer finds no room still uses its thread up.
    #[test]
    fn charges_live_as_long_as_their_threads() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        struct Counted(Arc<AtomicUsize>, usize);
        impl Drop for Counted {
            fn drop(&mut self) {
                self.0.fetch_sub(self.1, Ordering::SeqCst);
            }
        }
        let used = Arc::new(AtomicUsize::new(0));
        let room = Arc::new(AtomicUsize::new(usize::MAX));
        let charger: Charger = {
            let (used, room) = (used.clone(), room.clone());
            Arc::new(move |bytes| {
                (used.load(Ordering::SeqCst) + bytes <= room.load(Ordering::SeqCst)).then(|| {
                    used.fetch_add(bytes, Ordering::SeqCst);
                    Box::new(Counted(used.clone(), bytes)) as Charge
                })
            })
        };
        let store = Arc::new(Mutex::new(ThreadStore::default()));
        let create = |id: &str, agent: &str| {
            let hold = ThreadHold::new(store.clone(), agent, None).charged_by(charger.clone());
            hold.read_conversation(&json!({"messages": [{"role": "user", "content": "hi"}]}));
            hold.hold(id, &json!([{"type": "text", "text": "ok"}]));
        };
        create("msg_1", "main");
        create("msg_2", "sub");
        let two = used.load(Ordering::SeqCst);
        assert_eq!(two, lock(&store).held_bytes());
        // In flight: still charged (the thread is in memory), no longer held.
        let held = lock(&store).begin_continue("msg_1").unwrap();
        assert_eq!(used.load(Ordering::SeqCst), two);
        // The new conversation is charged in place of the old: room for exactly it suffices.
        let hold = ThreadHold::new(store.clone(), "main", Some(("msg_1".into(), held.clone())))
            .charged_by(charger.clone());
        let conversation = HeldThread {
            messages: format!(
                "{},{}",
                held.messages, r#"{"role":"user","content":"more"}"#
            ),
            messages_count: held.messages_count + 1,
            system: None,
            tools: None,
        };
        let after = lock(&store).held_bytes()
            + conversation.bytes()
            + json_text(&json!({"role": "assistant", "content": [{"type": "text", "text": "ok"}]}))
                .len()
            + 1;
        room.store(after, Ordering::SeqCst);
        hold.set_conversation(conversation);
        hold.hold("msg_3", &json!([{"type": "text", "text": "ok"}]));
        drop(hold);
        assert_eq!(used.load(Ordering::SeqCst), after);
        assert_eq!(lock(&store).held_count(), 2);
        // Given up for room: its charge goes with it.
        assert!(lock(&store).give_up_one());
        assert_eq!(used.load(Ordering::SeqCst), lock(&store).held_bytes());
        assert!(lock(&store).give_up_one());
        assert!(!lock(&store).give_up_one());
        assert_eq!(used.load(Ordering::SeqCst), 0);
        // No room: answered, not held, and the continued thread is used up all the same.
        room.store(usize::MAX, Ordering::SeqCst);
        create("msg_4", "main");
        let held = lock(&store).begin_continue("msg_4").unwrap();
        room.store(0, Ordering::SeqCst);
        let hold = ThreadHold::new(store.clone(), "main", Some(("msg_4".into(), held)))
            .charged_by(charger.clone());
        hold.read_conversation(&json!({"messages": [{"role": "user", "content": "again"}]}));
        hold.hold("msg_5", &json!([{"type": "text", "text": "ok"}]));
        drop(hold);
        assert_eq!(used.load(Ordering::SeqCst), 0);
        assert_eq!(
            code(&lock(&store).begin_continue("msg_4").unwrap_err()).1,
            "thread_already_continued"
        );
        assert_eq!(
            code(&lock(&store).begin_continue("msg_5").unwrap_err()).1,
            "thread_not_found"
        );
    }

    /// What each turn commits rebuilds the thread whole: a fresh store restored from the turns
    /// holds the same conversation (the continue's own `tools` replacing the held ones, the
    /// held `system` kept), and the continued response stays continued.
    #[test]
    fn committed_turns_rebuild_the_thread_after_a_restart() {
        let store = Arc::new(Mutex::new(ThreadStore::default()));
        let create = ThreadHold::new(store.clone(), "main", None);
        create.read_conversation(&json!({"system": "Be brief.",
            "tools": [{"name": "a", "input_schema": {"type": "object"}}],
            "messages": [{"role": "user", "content": "hi"}]}));
        let first = create
            .hold("msg_1", &json!([{"type": "text", "text": "one"}]))
            .unwrap();
        assert_eq!(first.previous, None);
        assert_eq!(create.hold("msg_1", &json!([])), None, "once");
        let held = lock(&store).begin_continue("msg_1").unwrap();
        let next = ThreadHold::new(store.clone(), "main", Some(("msg_1".into(), held.clone())));
        let own = json!({"tools": [{"name": "b", "input_schema": {"type": "object"}}],
                         "messages": [{"role": "user", "content": "more"}]});
        let (_, conversation) = expand(own.as_object().unwrap().clone(), &held, 1 << 20).unwrap();
        next.set_conversation(conversation);
        let second = next
            .hold("msg_2", &json!([{"type": "text", "text": "two"}]))
            .unwrap();
        assert_eq!(second.previous.as_deref(), Some("msg_1"));
        let second_items = String::from_utf8(second.items.clone()).unwrap();
        assert!(
            second_items.starts_with(r#"{"tools":[{"name":"b""#)
                && !second_items.contains("Be brief")
                && !second_items.contains("\"hi\""),
            "only what the turn adds: {second_items}"
        );
        let original = lock(&store).begin_continue("msg_2").unwrap();
        let mut restored = ThreadStore::default();
        let first_items = first.items.clone();
        let records = vec![
            ("msg_1".to_string(), None, first.items),
            ("msg_2".to_string(), Some("msg_1".to_string()), second.items),
        ];
        let records_again = records.clone();
        assert_eq!(
            restored.restore(records, "", |_| Some(Box::new(()) as Charge)),
            1
        );
        assert_eq!(
            code(&restored.begin_continue("msg_1").unwrap_err()).1,
            "thread_already_continued"
        );
        let rebuilt = restored.begin_continue("msg_2").unwrap();
        assert_eq!(*rebuilt, *original);
        assert_eq!(rebuilt.messages_count, 4);
        // One thread read back on demand: the same conversation; a continued one is known as
        // such; one the records lack is missing.
        assert_eq!(
            read_back(records_again.clone(), "msg_2"),
            ReadBack::Thread(HeldThread {
                system: original.system.clone(),
                tools: original.tools.clone(),
                messages: original.messages.clone(),
                messages_count: original.messages_count,
            })
        );
        assert_eq!(
            read_back(records_again.clone(), "msg_1"),
            ReadBack::Continued
        );
        assert_eq!(read_back(records_again, "msg_9"), ReadBack::Missing);
        let mut fresh = ThreadStore::default();
        fresh.note_continued("msg_1");
        assert_eq!(
            code(&fresh.begin_continue("msg_1").unwrap_err()).1,
            "thread_already_continued"
        );
        let ReadBack::Thread(thread) = read_back(
            vec![("msg_1".to_string(), None, first_items.clone())],
            "msg_1",
        ) else {
            panic!("the create alone reads back");
        };
        fresh.hold_read_back("msg_1", thread, "main", None);
        assert!(
            fresh.begin_continue("msg_1").is_err(),
            "a continued id is not held again"
        );
        // A chain with a turn missing, or a turn that does not read back, is not held.
        let mut partial = ThreadStore::default();
        let orphan = vec![(
            "msg_3".to_string(),
            Some("msg_0".to_string()),
            b"{}".to_vec(),
        )];
        assert_eq!(
            partial.restore(orphan, "", |_| Some(Box::new(()) as Charge)),
            0
        );
        let garbled = vec![("msg_4".to_string(), None, b"not json".to_vec())];
        assert_eq!(
            partial.restore(garbled, "", |_| Some(Box::new(()) as Charge)),
            0
        );
    }

    #[test]
    fn a_pinned_copy_serves_its_continue_and_is_not_held_uncharged() {
        let mut store = ThreadStore::default();
        let copy = Arc::new(conversation(1));
        // Given up between its read-back and the continue: the copy serves it.
        let taken = store.begin_pinned("msg_1", &copy).unwrap();
        assert!(Arc::ptr_eq(&taken, &copy));
        assert_eq!(
            code(&store.begin_pinned("msg_1", &copy).unwrap_err()).1,
            "thread_continue_in_flight"
        );
        // A failed continue lets the uncharged copy go; a retry reads it back again.
        store.abandon("msg_1", taken, "main");
        assert_eq!(store.held_count(), 0);
        assert_eq!(
            code(&store.begin_continue("msg_1").unwrap_err()).1,
            "thread_not_found"
        );
        // Held (charged) meanwhile: the store's own thread is taken, and given back on failure.
        store.hold("msg_2".into(), conversation(1), "main", None);
        let held = store.begin_pinned("msg_2", &copy).unwrap();
        assert!(!Arc::ptr_eq(&held, &copy));
        store.abandon("msg_2", held, "main");
        assert_eq!(store.held_count(), 1);
    }

    #[test]
    fn room_is_made_from_superseded_threads_first_then_the_oldest() {
        let mut store = ThreadStore::default();
        // The main agent's thread, then more sub-agent turns than the cap.
        store.hold("main_1".into(), conversation(1), "main", None);
        for n in 0..HELD_MAX + 3 {
            store.hold(format!("sub_{n}"), conversation(1), "sub", None);
        }
        assert_eq!(store.held_count(), HELD_MAX);
        assert_eq!(store.take_given_up(), 4, "counted for the proxy's metric");
        assert_eq!(store.take_given_up(), 0, "once");
        assert!(
            store.begin_continue("main_1").is_ok(),
            "the main agent's only thread outlives the sub-agent's superseded ones"
        );
        assert_eq!(
            code(&store.begin_continue("sub_0").unwrap_err()).1,
            "thread_not_found"
        );
        // With every thread its agent's newest, the oldest goes.
        let mut store = ThreadStore::default();
        for n in 0..HELD_MAX + 1 {
            store.hold(
                format!("msg_{n}"),
                conversation(1),
                &format!("agent {n}"),
                None,
            );
        }
        assert_eq!(store.held_count(), HELD_MAX);
        assert!(store.begin_continue("msg_0").is_err());
        assert!(store.begin_continue("msg_1").is_ok());
    }

    #[test]
    fn held_bytes_are_bounded() {
        let mut store = ThreadStore::default();
        let big = HeldThread {
            system: None,
            tools: None,
            messages: "x".repeat(HELD_BYTES_MAX / 3),
            messages_count: 1,
        };
        for n in 0..5 {
            store.hold(
                format!("msg_{n}"),
                HeldThread {
                    messages: big.messages.clone(),
                    ..conversation(0)
                },
                "main",
                None,
            );
        }
        assert!(
            store.held_bytes() <= HELD_BYTES_MAX,
            "{}",
            store.held_bytes()
        );
        assert!(store.begin_continue("msg_4").is_ok(), "the newest is kept");
        drop(big);
    }

    #[test]
    fn a_continue_expands_into_the_whole_conversation_without_the_thread() {
        let held = conversation(2);
        let object = match json!({"model": "m", "max_tokens": 9, "system": null,
                                   "thread": {"type": "continue", "previous_message_id": "msg_1"},
                                   "messages": [{"role": "user", "content": "new"}]})
        {
            Value::Object(object) => object,
            _ => unreachable!(),
        };
        let (bytes, conversation) = expand(object.clone(), &held, 1 << 20).unwrap();
        let expanded: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(expanded.get("thread"), None);
        // The conversation its answer is held with is the expanded body's.
        assert_eq!(conversation.messages_count, 3);
        let messages: Value =
            serde_json::from_str(&format!("[{}]", conversation.messages)).unwrap();
        assert_eq!(messages, expanded["messages"]);
        assert_eq!(conversation.system.as_deref(), Some("\"Be brief.\""));
        assert_eq!(conversation.tools, held.tools);
        assert_eq!(
            expanded["system"], "Be brief.",
            "a null system is the held one"
        );
        assert_eq!(expanded["tools"][0]["name"], "t");
        assert_eq!(expanded["max_tokens"], 9);
        let contents: Vec<&str> = expanded["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|message| message["content"].as_str().unwrap())
            .collect();
        assert_eq!(contents, ["turn 0", "turn 1", "new"]);
        // The request's own system is kept.
        let mut own = object.clone();
        own.insert("system".into(), json!("Other."));
        let (bytes, conversation) = expand(own, &held, 1 << 20).unwrap();
        let expanded: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(expanded["system"], "Other.");
        assert_eq!(conversation.system.as_deref(), Some("\"Other.\""));
        let error = expand(object, &held, 64).unwrap_err();
        assert_eq!(error.status(), 413);
        // An error in the expanded body names the client's own message.
        let error = ApiError::invalid_field(Api::Anthropic, "messages[2].content", "bad");
        let rebased = rebase_error(error, 2, "msg_1");
        assert_eq!(rebased.param.as_deref(), Some("messages[0].content"));
        assert!(
            rebased.message.starts_with("messages[0].content"),
            "{}",
            rebased.message
        );
        let error = ApiError::invalid_field(Api::Anthropic, "messages[1].content", "bad");
        let rebased = rebase_error(error, 2, "msg_1");
        assert_eq!(rebased.param.as_deref(), Some("thread.messages[1].content"));
    }
}
