//! Anthropic Message Threads (`thread`, beta `message-threads-2026-08-12`): a request may ask
//! the server to hold its conversation (`{"type": "create"}`) and a later one continue from a
//! response (`{"type": "continue", "previous_message_id": …}`) sending only the new turn's
//! messages. Claude Code does so when `CLAUDE_CODE_TETHER_LIVE` is set, and the Anthropic
//! SDKs' tool runners by default.
//!
//! The proxy holds each execution's threads in memory ([`ThreadStore`], per execution): a
//! response to a request with a `thread` is held under its id as the whole conversation that
//! produced it (`system`, `tools`, `messages` and the answer as an assistant message), and a
//! `continue` becomes the body a stateless client would have sent: the held conversation, then
//! the request's own messages (its own `system` / `tools` when it sends them, else the held
//! ones), without `thread` ([`expand`]). So the model sees, the tree records and a capture
//! keeps whole conversations, exactly as from a client that re-sends everything. As the API
//! does, a response is continued once (`thread_already_continued`, 400), not while another
//! request continues it (`thread_continue_in_flight`, 400), and one the proxy does not hold
//! (never made, given up for room, or held by a proxy that restarted) is `thread_not_found`
//! (404). On each of those errors (`error.details.error_code`) the SDKs and Claude Code send
//! the turn again with the whole conversation under a new `create`.
//!
//! Pure but for the store's lock: request bytes and held threads in, bodies and verdicts out.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use serde_json::{json, Map, Value};

use crate::{Api, ApiError, ApiErrorKind};

/// Threads an execution holds, not yet continued (a linear conversation holds one; each
/// sub-agent its own); beyond, the one held longest is given up (a later `continue` of it gets
/// `thread_not_found` and is sent again whole).
pub const HELD_MAX: usize = 8;

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

/// The `thread` a Messages body asks for, read from the raw bytes: only a body that may hold a
/// `continue` (it mentions `previous_message_id`; a continue's body holds only the new turn,
/// so this parse is small) is parsed here, before the body is expanded. Everything else is
/// read from the parsed body ([`thread_of`]), so a `create` costs no second parse of the whole
/// conversation. `None` when it names none; a 400 naming the field when it is malformed.
pub fn thread_param(body: &[u8]) -> Result<Option<ThreadParam>, ApiError> {
    if memchr::memmem::find(body, b"\"previous_message_id\"").is_none() {
        return Ok(None);
    }
    #[derive(serde::Deserialize)]
    struct Head {
        #[serde(default)]
        thread: Option<Value>,
    }
    // A body that is not an object is named by the ordinary parse.
    let Ok(Head { thread }) = serde_json::from_slice::<Head>(body) else {
        return Ok(None);
    };
    thread_of(thread.as_ref())
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
             (this proxy holds the last {HELD_MAX} threads of each execution in memory, not \
             across a restart). Replay the full conversation with `thread: {{\"type\": \"create\"}}`.",
            shown(previous_message_id)
        ),
    )
}

/// A conversation held under a response's id: what a `continue` from it starts with.
#[derive(Debug, PartialEq)]
pub struct HeldThread {
    pub system: Option<Value>,
    pub tools: Option<Value>,
    /// The request's messages, then the response as an assistant message.
    pub messages: Vec<Value>,
}

/// One execution's threads.
#[derive(Debug, Default)]
pub struct ThreadStore {
    held: HashMap<String, Arc<HeldThread>>,
    /// Held ids, the one held longest first (ids no longer held are skipped).
    order: VecDeque<String>,
    in_flight: HashSet<String>,
    continued: VecDeque<String>,
}

impl ThreadStore {
    /// Takes the thread held under `id` for a `continue` (it is in flight until the continue
    /// ends: [`ThreadStore::hold`] or [`ThreadStore::abandon`]); the API's error otherwise.
    pub fn begin_continue(&mut self, id: &str) -> Result<Arc<HeldThread>, ApiError> {
        if let Some(held) = self.held.remove(id) {
            self.in_flight.insert(id.to_string());
            return Ok(held);
        }
        if self.in_flight.contains(id) {
            return Err(thread_error(
                ApiErrorKind::InvalidRequest,
                "thread_continue_in_flight",
                format!(
                    "Another request is still continuing from previous_message_id `{}`. Wait \
                     for it to complete and continue from its response `id`, or replay the full \
                     conversation with `thread: {{\"type\": \"create\"}}`.",
                    shown(id)
                ),
            ));
        }
        if self.continued.iter().any(|continued| continued == id) {
            return Err(thread_error(
                ApiErrorKind::InvalidRequest,
                "thread_already_continued",
                format!(
                    "The response `{}` has already been continued, and each response can be \
                     continued only once. Continue from the Thread's most recent response `id`.",
                    shown(id)
                ),
            ));
        }
        Err(thread_not_found(id))
    }

    /// A continue of `id` that produced no response: the thread can be continued again.
    pub fn abandon(&mut self, id: &str, held: Arc<HeldThread>) {
        if self.in_flight.remove(id) {
            self.insert(id.to_string(), held);
        }
    }

    /// Holds `thread` under the response id `id`; `continued`: the id the request continued,
    /// which can be continued no more.
    pub fn hold(&mut self, id: String, thread: HeldThread, continued: Option<&str>) {
        if let Some(continued) = continued {
            self.in_flight.remove(continued);
            self.continued.push_back(continued.to_string());
            while self.continued.len() > CONTINUED_REMEMBERED {
                self.continued.pop_front();
            }
        }
        self.insert(id, Arc::new(thread));
    }

    fn insert(&mut self, id: String, held: Arc<HeldThread>) {
        self.order.push_back(id.clone());
        self.held.insert(id, held);
        while self.held.len() > HELD_MAX {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            self.held.remove(&oldest);
        }
        // Ids given up or continued leave `order` as they come to its front.
        while self
            .order
            .front()
            .is_some_and(|front| !self.held.contains_key(front))
        {
            self.order.pop_front();
        }
    }

    /// How many threads are held (not in flight).
    pub fn held_count(&self) -> usize {
        self.held.len()
    }
}

/// The body a stateless client would have sent for a `continue` from `held`: `object` (the
/// request, parsed) with the held messages before its own, the held `system` and `tools` where
/// it sends none, and no `thread`. `bytes_max`: the body limit (a longer conversation is a 413,
/// as it would be sent whole).
pub fn expand(
    mut object: Map<String, Value>,
    held: &HeldThread,
    bytes_max: usize,
) -> Result<Bytes, ApiError> {
    let own = match object.remove("messages") {
        Some(Value::Array(own)) => own,
        // The ordinary parse names what is wrong: the held messages alone go on to it.
        Some(other) => vec![other],
        None => Vec::new(),
    };
    let mut messages = Vec::with_capacity(held.messages.len() + own.len());
    messages.extend(held.messages.iter().cloned());
    messages.extend(own);
    object.insert("messages".into(), Value::Array(messages));
    for (field, value) in [("system", &held.system), ("tools", &held.tools)] {
        if let (false, Some(value)) = (object.contains_key(field), value) {
            object.insert(field.into(), value.clone());
        }
    }
    object.remove("thread");
    let bytes = Value::Object(object).to_string();
    if bytes.len() > bytes_max {
        return Err(ApiError::new(
            Api::Anthropic,
            ApiErrorKind::RequestTooLarge,
            format!("the conversation continued in this thread exceeds the body limit of {bytes_max} bytes"),
        ));
    }
    Ok(Bytes::from(bytes))
}

/// What a request with a `thread` holds when its response ends (see [`ThreadHold::hold`]);
/// dropped without holding (the call failed or was refused), it gives the thread it continued
/// back, so the client's retry can continue it.
pub struct ThreadHold {
    store: Arc<Mutex<ThreadStore>>,
    continued: Option<(String, Arc<HeldThread>)>,
    /// The request's whole conversation, until its answer is held.
    conversation: Mutex<Option<HeldThread>>,
    held: std::sync::atomic::AtomicBool,
}

impl Drop for ThreadHold {
    fn drop(&mut self) {
        if self.held.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        if let Some((id, thread)) = self.continued.take() {
            lock(&self.store).abandon(&id, thread);
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl std::fmt::Debug for ThreadHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadHold")
            .field("continued", &self.continued.as_ref().map(|(id, _)| id))
            .finish_non_exhaustive()
    }
}

impl PartialEq for ThreadHold {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

impl ThreadHold {
    /// For a request with a `thread`: `continued`, the thread a `continue` took
    /// ([`ThreadStore::begin_continue`]).
    pub fn new(
        store: Arc<Mutex<ThreadStore>>,
        continued: Option<(String, Arc<HeldThread>)>,
    ) -> Self {
        Self {
            store,
            continued,
            conversation: Mutex::new(None),
            held: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The id of the response the request continues (`None` for a `create`).
    pub fn continued_id(&self) -> Option<&str> {
        self.continued.as_ref().map(|(id, _)| id.as_str())
    }

    /// The request's whole conversation (a continue's expanded body), read from its body.
    pub fn set_conversation(&self, body: &Value) {
        let field = |name: &str| body.get(name).filter(|value| !value.is_null()).cloned();
        let messages = match body.get("messages") {
            Some(Value::Array(messages)) => messages.clone(),
            _ => Vec::new(),
        };
        *lock(&self.conversation) = Some(HeldThread {
            system: field("system"),
            tools: field("tools"),
            messages,
        });
    }

    /// The response `id` ended with `content` (its blocks as the API returned them): held
    /// under `id`, the thread it continued used up. Once; later calls do nothing.
    pub fn hold(&self, id: &str, content: &Value) {
        let Some(mut thread) = lock(&self.conversation).take() else {
            return;
        };
        thread
            .messages
            .push(json!({"role": "assistant", "content": content}));
        let continued = self.continued.as_ref().map(|(id, _)| id.as_str());
        lock(&self.store).hold(id.to_string(), thread, continued);
        self.held.store(true, std::sync::atomic::Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_thread_param_is_read_only_from_the_field() {
        assert_eq!(
            thread_param(br#"{"model":"m","messages":[]}"#).unwrap(),
            None
        );
        assert_eq!(thread_param(br#"{"thread":null}"#).unwrap(), None);
        // The word in a message is not the field.
        assert_eq!(
            thread_param(br#"{"messages":[{"role":"user","content":"\"thread\""}]}"#).unwrap(),
            None
        );
        // A create is read from the parsed body.
        assert_eq!(
            thread_param(br#"{"thread":{"type":"create"},"messages":[]}"#).unwrap(),
            None
        );
        assert_eq!(
            thread_of(Some(&json!({"type": "create"}))).unwrap(),
            Some(ThreadParam::Create)
        );
        assert_eq!(
            thread_param(br#"{"thread":{"type":"continue","previous_message_id":"msg_1"}}"#)
                .unwrap(),
            Some(ThreadParam::Continue {
                previous_message_id: "msg_1".into()
            })
        );
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
        let error =
            thread_param(br#"{"thread":{"type":"continue","previous_message_id":7}}"#).unwrap_err();
        assert_eq!(error.param.as_deref(), Some("thread.previous_message_id"));
    }

    fn conversation(turns: usize) -> HeldThread {
        HeldThread {
            system: Some(json!("Be brief.")),
            tools: Some(json!([{"name": "t", "input_schema": {"type": "object"}}])),
            messages: (0..turns)
                .map(|turn| json!({"role": "user", "content": format!("turn {turn}")}))
                .collect(),
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
        lock(&store).hold("msg_1".into(), conversation(1), None);
        let held = lock(&store).begin_continue("msg_1").unwrap();
        assert_eq!(held.messages.len(), 1);
        assert_eq!(
            code(&lock(&store).begin_continue("msg_1").unwrap_err()),
            (400, "thread_continue_in_flight".into())
        );
        // A continue that fails gives the thread back.
        drop(ThreadHold::new(store.clone(), Some(("msg_1".into(), held))));
        let held = lock(&store).begin_continue("msg_1").unwrap();
        let hold = ThreadHold::new(store.clone(), Some(("msg_1".into(), held.clone())));
        let body = json!({"system": "Be brief.", "messages": [{"role": "user", "content": "turn 0"},
                          {"role": "user", "content": "turn 1"}]});
        hold.set_conversation(&body);
        hold.hold("msg_2", &json!([{"type": "text", "text": "ok"}]));
        drop(hold);
        assert_eq!(
            code(&lock(&store).begin_continue("msg_1").unwrap_err()),
            (400, "thread_already_continued".into())
        );
        let next = lock(&store).begin_continue("msg_2").unwrap();
        assert_eq!(
            next.messages.len(),
            3,
            "the request's messages and the answer"
        );
        assert_eq!(next.messages[2]["role"], "assistant");
        assert_eq!(next.tools, None, "what the request sent");
    }

    #[test]
    fn the_threads_held_longest_are_given_up_past_the_cap() {
        let mut store = ThreadStore::default();
        for n in 0..HELD_MAX + 3 {
            store.hold(format!("msg_{n}"), conversation(1), None);
        }
        assert_eq!(store.held_count(), HELD_MAX);
        assert_eq!(
            code(&store.begin_continue("msg_0").unwrap_err()).1,
            "thread_not_found"
        );
        assert!(store
            .begin_continue(&format!("msg_{}", HELD_MAX + 2))
            .is_ok());
        assert!(store.order.len() <= HELD_MAX + 1, "{:?}", store.order);
    }

    #[test]
    fn a_continue_expands_into_the_whole_conversation_without_the_thread() {
        let held = conversation(2);
        let object = match json!({"model": "m", "max_tokens": 9,
                                   "thread": {"type": "continue", "previous_message_id": "msg_1"},
                                   "messages": [{"role": "user", "content": "new"}]})
        {
            Value::Object(object) => object,
            _ => unreachable!(),
        };
        let expanded: Value =
            serde_json::from_slice(&expand(object.clone(), &held, 1 << 20).unwrap()).unwrap();
        assert_eq!(expanded.get("thread"), None);
        assert_eq!(expanded["system"], "Be brief.");
        assert_eq!(expanded["tools"], held.tools.clone().unwrap());
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
        let expanded: Value =
            serde_json::from_slice(&expand(own, &held, 1 << 20).unwrap()).unwrap();
        assert_eq!(expanded["system"], "Other.");
        let error = expand(object, &held, 64).unwrap_err();
        assert_eq!(error.status(), 413);
    }
}
