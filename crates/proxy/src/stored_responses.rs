//! Stored responses for `previous_response_id` (OpenAI Responses).
//!
//! A Responses client may send only its new input items and name the response it continues
//! (`previous_response_id`); the API keeps the conversation of every response created with
//! `store` (true by default). Codex sends `store: false` and the whole input every turn; the
//! OpenAI Agents SDK, LangChain and other Responses clients can chain instead.
//!
//! The proxy turns a chained request into the one a stateless client would have sent — the
//! previous response's input items, its output items as the client received them, then the
//! new items, with the request's own settings (`instructions`, `tools`, … are not carried
//! over, as the API documents) — before anything else reads it. Parsing, the tool-call and
//! reasoning caches, rendering and the trajectory tree then work exactly as for Codex's full
//! re-sends: the previous call's tokens are reused, nothing is re-encoded.
//!
//! A [`StoredResponse`] holds its own items as JSON text and shares its parent's, so a chain
//! of n turns holds the conversation once. The server keeps the last few per execution under
//! a memory budget. A response becomes durable — a `ResponseStored` event on the log, holding
//! its own items and naming its parent — where a client can chain: a response that continues
//! another is committed before its answer is handed over, and so is one that opens a
//! conversation (it continues nothing and its input holds no assistant output); any other
//! response a chain starts from is committed when the first request naming it arrives, before
//! that request is answered. So a chaining client's next id survives a proxy restart (the
//! proxy rebuilds its stored responses from the log), while a client that never chains (any
//! client re-sending the whole conversation) writes one small response for its first request
//! and nothing after: its conversations are not written to the log once per call.
//!
//! Pure: bytes and values in, bytes out.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use serde_json::{Map, Value};

use crate::api_error::ApiError;
use crate::messages::Api;

const API: Api = Api::OpenAiResponses;

/// One stored response: its own items and the conversation before it.
pub struct StoredResponse {
    /// The id the client was given.
    id: String,
    parent: Option<Arc<StoredResponse>>,
    /// Committed to the log as a `ResponseStored` event (its parents are, too).
    persisted: AtomicBool,
    /// This response's request items that were new, then its output items: JSON values
    /// separated by commas (empty when there are none).
    items: Vec<u8>,
    /// Bytes of the whole conversation through this response.
    conversation_bytes: usize,
    /// Held as long as this response is (the server's charge against its memory budget, so
    /// a parent still shared by a later response stays counted).
    guard: Option<Box<dyn std::any::Any + Send + Sync>>,
}

impl Drop for StoredResponse {
    /// A chain is dropped turn by turn, not by recursion: a long-horizon agent chaining
    /// thousands of turns would otherwise overflow the dropping thread's stack.
    fn drop(&mut self) {
        let mut parent = self.parent.take();
        while let Some(turn) = parent {
            match Arc::try_unwrap(turn) {
                Ok(mut turn) => parent = turn.parent.take(),
                // Still shared (a later response or a call in flight holds it).
                Err(_) => break,
            }
        }
    }
}

impl std::fmt::Debug for StoredResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredResponse")
            .field("items_bytes", &self.items.len())
            .field("conversation_bytes", &self.conversation_bytes)
            .field("id", &self.id)
            .field("has_parent", &self.parent.is_some())
            .field("persisted", &self.persisted.load(Ordering::Relaxed))
            .finish()
    }
}

impl StoredResponse {
    /// A response to a request whose new input items are `input_items` (comma-separated
    /// JSON, as [`input_items`] writes them), continuing `parent` (`None` for a request that
    /// sent the whole conversation), that answered with `output` items.
    pub fn new(
        id: &str,
        parent: Option<Arc<StoredResponse>>,
        input_items: &[u8],
        output: &[Value],
    ) -> Self {
        let mut items = input_items.to_vec();
        for item in output {
            if !items.is_empty() {
                items.push(b',');
            }
            // A `Value` always serializes.
            items.extend(serde_json::to_vec(item).unwrap_or_default());
        }
        Self::from_items(id, parent, items, false)
    }

    /// A response rebuilt from its `ResponseStored` event (`persisted`), or made from items.
    pub fn from_items(
        id: &str,
        parent: Option<Arc<StoredResponse>>,
        items: Vec<u8>,
        persisted: bool,
    ) -> Self {
        let before = parent
            .as_ref()
            .map_or(0, |parent| parent.conversation_bytes);
        let comma = usize::from(before > 0 && !items.is_empty());
        StoredResponse {
            id: id.to_string(),
            parent,
            persisted: AtomicBool::new(persisted),
            conversation_bytes: before + comma + items.len(),
            items,
            guard: None,
        }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// This response or the ancestor with `id`, if either has it.
    pub fn find_in_chain(self: &Arc<Self>, id: &str) -> Option<Arc<StoredResponse>> {
        let mut at = Some(self);
        while let Some(turn) = at {
            if turn.id == id {
                return Some(turn.clone());
            }
            at = turn.parent.as_ref();
        }
        None
    }

    /// The response this one continues.
    pub fn parent(&self) -> Option<&Arc<StoredResponse>> {
        self.parent.as_ref()
    }

    /// Whether this response continues another.
    pub fn is_chained(&self) -> bool {
        self.parent.is_some()
    }

    /// Whether this response is committed to the log (and so can be read back from it).
    pub fn is_persisted(&self) -> bool {
        self.persisted.load(Ordering::Acquire)
    }

    /// Marks this response as committed to the log.
    pub fn set_persisted(&self) {
        self.persisted.store(true, Ordering::Release);
    }

    /// This response and its ancestors that the log does not hold yet, oldest first (what
    /// must be committed, in this order, before a client may rely on this id after a
    /// restart).
    pub fn unpersisted_chain(self: &Arc<Self>) -> Vec<Arc<StoredResponse>> {
        let mut chain = Vec::new();
        let mut at = Some(self);
        while let Some(turn) = at {
            if turn.persisted.load(Ordering::Acquire) {
                break;
            }
            chain.push(turn.clone());
            at = turn.parent.as_ref();
        }
        chain.reverse();
        chain
    }

    /// The `ResponseStored` record of this response in `execution`.
    pub fn record(&self, execution: gyre_event::ExecutionId) -> gyre_event::StoredResponseRecord {
        gyre_event::StoredResponseRecord {
            execution,
            response_id: self.id.clone(),
            previous_response_id: self.parent.as_ref().map(|parent| parent.id.clone()),
            items: self.items.clone(),
        }
    }

    /// Bytes this response holds itself (its parents hold the rest of its conversation).
    pub fn own_bytes(&self) -> usize {
        self.items.len()
    }

    /// Keeps `guard` alive as long as this response.
    pub fn with_guard(mut self, guard: impl std::any::Any + Send + Sync) -> Self {
        self.guard = Some(Box::new(guard));
        self
    }

    /// Bytes of the whole conversation through this response (what continuing it holds).
    pub fn conversation_bytes(&self) -> usize {
        self.conversation_bytes
    }

    /// The conversation through this response: its items, first to last, separated by
    /// commas.
    pub fn conversation_items(&self) -> Vec<u8> {
        let mut chain = Vec::new();
        let mut at = Some(self);
        while let Some(turn) = at {
            chain.push(&turn.items);
            at = turn.parent.as_deref();
        }
        let mut out = Vec::with_capacity(self.conversation_bytes);
        for items in chain.into_iter().rev().filter(|items| !items.is_empty()) {
            if !out.is_empty() {
                out.push(b',');
            }
            out.extend_from_slice(items);
        }
        out
    }
}

impl StoredResponse {
    /// The item with `id` among this response's conversation (its own items first, then its
    /// parents', newest first): what an `item_reference` names.
    pub fn find_item(&self, id: &str) -> Option<Value> {
        let needle = serde_json::to_vec(id).ok()?;
        let mut at = Some(self);
        while let Some(turn) = at {
            // Only a conversation that mentions the id is parsed.
            if memchr::memmem::find(&turn.items, &needle).is_some() {
                let mut list = Vec::with_capacity(turn.items.len() + 2);
                list.push(b'[');
                list.extend_from_slice(&turn.items);
                list.push(b']');
                if let Ok(Value::Array(items)) = serde_json::from_slice::<Value>(&list) {
                    if let Some(item) = items
                        .into_iter()
                        .rev()
                        .find(|item| item.get("id").and_then(Value::as_str) == Some(id))
                    {
                        return Some(item);
                    }
                }
            }
            at = turn.parent.as_deref();
        }
        None
    }
}

/// `body` with each `{"type": "item_reference", "id": …}` of its `input` replaced by the item
/// `lookup` finds for that id (an item of a stored response, as the API resolves it), or
/// `None` when the body has none. An id `lookup` does not find is a 400 naming the element.
/// Each id is looked up once however often it is referenced, and a body that would grow past
/// `bytes_max` resolved is a 413 as soon as it does (what a client sending those items itself
/// would get), so a few bytes of references cannot expand into gigabytes.
pub fn resolve_item_references(
    body: &[u8],
    bytes_max: usize,
    lookup: impl Fn(&str) -> Option<Value>,
) -> Result<Option<Bytes>, ApiError> {
    if memchr::memmem::find(body, b"\"item_reference\"").is_none() {
        return Ok(None);
    }
    let fixed = crate::body::lone_surrogates_replaced(body);
    let body = fixed.as_deref().unwrap_or(body);
    let Ok(Value::Object(mut object)) = serde_json::from_slice::<Value>(body) else {
        // The ordinary parse names what is wrong with the body.
        return Ok(None);
    };
    let Some(Value::Array(items)) = object.get_mut("input") else {
        return Ok(None);
    };
    let mut replaced = false;
    // Found items by id, with how many bytes each adds to the body in place of its reference.
    let mut found_by_id: std::collections::HashMap<String, (Value, usize)> =
        std::collections::HashMap::new();
    let mut resolved_bytes = body.len();
    for (index, item) in items.iter_mut().enumerate() {
        if item.get("type").and_then(Value::as_str) != Some("item_reference") {
            continue;
        }
        let Some(id) = item.get("id").and_then(Value::as_str) else {
            return Err(ApiError::invalid_field(
                API,
                format!("input[{index}].id"),
                "an item_reference names the item by a string id",
            ));
        };
        if let Some((found, added)) = found_by_id.get(id) {
            resolved_bytes = resolved_bytes.saturating_add(*added);
            if resolved_bytes > bytes_max {
                return Err(references_too_large(bytes_max));
            }
            *item = found.clone();
            replaced = true;
            continue;
        }
        let Some(found) = lookup(id) else {
            let shown: String = id.chars().take(100).collect();
            return Err(ApiError::invalid_field(
                API,
                format!("input[{index}].id"),
                format!(
                    "no item with id '{shown}' in this execution's stored responses (this proxy \
                     keeps the last stored responses of each execution in memory, and those a \
                     client chained on in the log)"
                ),
            ));
        };
        let added = serde_json::to_vec(&found).map_or(0, |bytes| bytes.len());
        resolved_bytes = resolved_bytes.saturating_add(added);
        if resolved_bytes > bytes_max {
            return Err(references_too_large(bytes_max));
        }
        found_by_id.insert(id.to_string(), (found.clone(), added));
        *item = found;
        replaced = true;
    }
    Ok(replaced.then(|| Bytes::from(Value::Object(object).to_string())))
}

fn references_too_large(bytes_max: usize) -> ApiError {
    ApiError::new(
        API,
        crate::ApiErrorKind::RequestTooLarge,
        format!(
            "the input with its item_references resolved exceeds the body limit of {bytes_max} bytes"
        ),
    )
}

/// The id a body continues and the body parsed into an object.
pub type Chained = (String, Map<String, Value>);

/// The `previous_response_id` a Responses body names, with the body parsed into an object;
/// `None` when it names none (absent or null). Only a body that mentions the key is parsed.
pub fn previous_response_id(body: &[u8]) -> Result<Option<Chained>, ApiError> {
    if memchr::memmem::find(body, b"\"previous_response_id\"").is_none() {
        return Ok(None);
    }
    // As the ordinary parse does: a JS client's lone UTF-16 surrogate escape is replaced.
    let fixed = crate::body::lone_surrogates_replaced(body);
    let body = fixed.as_deref().unwrap_or(body);
    let Ok(Value::Object(object)) = serde_json::from_slice::<Value>(body) else {
        // The ordinary parse names what is wrong with the body.
        return Ok(None);
    };
    match object.get("previous_response_id") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(id)) if !id.is_empty() => Ok(Some((id.clone(), object))),
        Some(_) => Err(previous_id_error("must be a non-empty string")),
    }
}

fn previous_id_error(problem: &str) -> ApiError {
    ApiError::invalid_field(API, "previous_response_id", problem)
}

/// The API's answer to an id the proxy does not hold.
pub fn not_found(id: &str, why: &str) -> ApiError {
    let mut error = ApiError::invalid_field(
        API,
        "previous_response_id",
        format!("Previous response with id '{id}' not found ({why})."),
    );
    error.code = Some("previous_response_not_found");
    error
}

/// A body's `input` as comma-separated JSON items: a string is one user message, as the API
/// reads it; an absent input is no items.
pub fn input_items(input: Option<&Value>) -> Vec<u8> {
    match input {
        Some(Value::String(text)) => serde_json::to_vec(&serde_json::json!({
            "type": "message", "role": "user", "content": text,
        }))
        .unwrap_or_default(),
        Some(Value::Array(items)) => {
            let mut out = Vec::new();
            for item in items {
                if !out.is_empty() {
                    out.push(b',');
                }
                out.extend(serde_json::to_vec(item).unwrap_or_default());
            }
            out
        }
        _ => Vec::new(),
    }
}

/// The body a stateless client would have sent instead of `body`, which continues
/// `previous`: the same members without `previous_response_id`, and `input` (last, so the
/// next expanded body shares this one's bytes up to the new items) holding the previous
/// conversation and then the request's own items. Also returns those own items.
pub fn expand(
    mut body: Map<String, Value>,
    previous: &StoredResponse,
) -> Result<(Bytes, Vec<u8>), ApiError> {
    let own = input_items(body.get("input"));
    if let Some(input) = body.get("input") {
        if !input.is_string() && !input.is_array() {
            return Err(ApiError::invalid_field(
                API,
                "input",
                "must be a string or an array of items",
            ));
        }
    }
    body.remove("input");
    body.remove("previous_response_id");
    let members = serde_json::to_vec(&Value::Object(body)).unwrap_or_else(|_| b"{}".to_vec());
    let conversation = previous.conversation_items();
    let mut out = Vec::with_capacity(members.len() + conversation.len() + own.len() + 16);
    // `members` is `{…}`: reopen it and append `input`.
    out.extend_from_slice(&members[..members.len() - 1]);
    if members.len() > 2 {
        out.push(b',');
    }
    out.extend_from_slice(b"\"input\":[");
    out.extend_from_slice(&conversation);
    if !conversation.is_empty() && !own.is_empty() {
        out.push(b',');
    }
    out.extend_from_slice(&own);
    out.extend_from_slice(b"]}");
    Ok((Bytes::from(out), own))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn object(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(object) => object,
            _ => unreachable!(),
        }
    }

    /// A chain of 200,000 turns (a long-horizon agent chaining small turns) is dropped on a
    /// thread with a 256 KiB stack: turn by turn, not one stack frame per turn.
    #[test]
    fn a_long_chain_drops_without_deep_recursion() {
        let dropped = std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(|| {
                let mut head = Arc::new(StoredResponse::new("resp_0", None, b"{}", &[]));
                for turn in 1..200_000 {
                    let id = format!("resp_{turn}");
                    head = Arc::new(StoredResponse::new(&id, Some(head), b"{}", &[]));
                }
                // A shared turn stays alive for whoever shares it.
                let kept = head.find_in_chain("resp_5").expect("in the chain");
                drop(head);
                assert_eq!(kept.id(), "resp_5");
                assert!(kept.find_in_chain("resp_0").is_some());
            })
            .expect("thread")
            .join();
        assert!(dropped.is_ok());
    }

    #[test]
    fn item_references_resolve_along_a_chain_and_unknown_ones_are_named() {
        let root = Arc::new(StoredResponse::new(
            "resp_1",
            None,
            &input_items(Some(&json!("hello"))),
            &[json!({"id": "msg_1", "type": "message", "role": "assistant", "content": "hi"})],
        ));
        let next = StoredResponse::new(
            "resp_2",
            Some(root),
            br#"{"type":"message","role":"user","content":"more"}"#,
            &[
                json!({"id": "fc_2", "type": "function_call", "call_id": "c", "name": "ls", "arguments": "{}"}),
            ],
        );
        assert_eq!(next.find_item("fc_2").unwrap()["call_id"], "c");
        assert_eq!(
            next.find_item("msg_1").unwrap()["content"],
            "hi",
            "found in the parent"
        );
        assert_eq!(next.find_item("msg_9"), None);

        let lookup = |id: &str| next.find_item(id);
        let body = br#"{"model":"m","input":[{"type":"item_reference","id":"msg_1"},{"role":"user","content":"go"}]}"#;
        let resolved = resolve_item_references(body, 1 << 20, lookup)
            .unwrap()
            .unwrap();
        assert_eq!(
            std::str::from_utf8(&resolved).unwrap(),
            r#"{"model":"m","input":[{"id":"msg_1","type":"message","role":"assistant","content":"hi"},{"role":"user","content":"go"}]}"#
        );
        assert_eq!(
            resolve_item_references(
                br#"{"model":"m","input":"item_reference"}"#,
                1 << 20,
                lookup
            )
            .unwrap(),
            None,
            "a body that only mentions the word is left alone"
        );
        let error = resolve_item_references(
            br#"{"input":[{"role":"user","content":"x"},{"type":"item_reference","id":"msg_9"}]}"#,
            1 << 20,
            lookup,
        )
        .unwrap_err();
        assert_eq!(error.param.as_deref(), Some("input[1].id"));
        assert!(error.message.contains("'msg_9'"), "{}", error.message);
        let error =
            resolve_item_references(br#"{"input":[{"type":"item_reference"}]}"#, 1 << 20, lookup)
                .unwrap_err();
        assert_eq!(error.param.as_deref(), Some("input[0].id"));

        // Many references to one item: looked up once, and refused (413) once the resolved
        // body would pass the limit.
        let looked_up = std::cell::Cell::new(0);
        let counting = |id: &str| {
            looked_up.set(looked_up.get() + 1);
            next.find_item(id)
        };
        let reference = r#"{"type":"item_reference","id":"msg_1"}"#;
        let many = format!(
            r#"{{"model":"m","input":[{}]}}"#,
            vec![reference; 100].join(",")
        );
        let resolved = resolve_item_references(many.as_bytes(), 1 << 20, counting)
            .unwrap()
            .unwrap();
        assert_eq!(looked_up.get(), 1);
        assert_eq!(
            resolved.windows(7).filter(|w| w == b"\"msg_1\"").count(),
            100
        );
        let error =
            resolve_item_references(many.as_bytes(), many.len() + 100, counting).unwrap_err();
        assert_eq!(error.status(), 413, "{}", error.message);
        assert!(error.message.contains("body limit"), "{}", error.message);
    }

    #[test]
    fn a_chain_expands_to_the_stateless_body() {
        let first = json!({"model": "m", "input": "hello", "store": true});
        let own = input_items(first.get("input"));
        let output =
            [json!({"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}"})];
        let one = Arc::new(StoredResponse::new("resp_1", None, &own, &output));
        let second = json!({
            "model": "m", "instructions": "be brief", "previous_response_id": "resp_1",
            "input": [{"type": "function_call_output", "call_id": "c1", "output": "a b"}],
        });
        let (body, own) = expand(object(second), &one).unwrap();
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            body,
            json!({
                "model": "m", "instructions": "be brief",
                "input": [
                    {"type": "message", "role": "user", "content": "hello"},
                    {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}"},
                    {"type": "function_call_output", "call_id": "c1", "output": "a b"},
                ],
            })
        );
        // Input is the last member.
        assert_eq!(
            body.as_object().unwrap().keys().next_back().unwrap(),
            "input"
        );
        let output = [
            json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done"}]}),
        ];
        let two = Arc::new(StoredResponse::new(
            "resp_2",
            Some(one.clone()),
            &own,
            &output,
        ));
        let conversation = two.conversation_items();
        assert_eq!(conversation.len(), two.conversation_bytes());
        let items: Value =
            serde_json::from_slice(&[b"[", &conversation[..], b"]"].concat()).unwrap();
        assert_eq!(items.as_array().unwrap().len(), 4);
        assert_eq!(items[3]["content"][0]["text"], "done");
    }

    #[test]
    fn what_the_log_lacks_is_committed_oldest_first() {
        let root = Arc::new(StoredResponse::new("resp_1", None, b"{}", &[]));
        let child = Arc::new(StoredResponse::new(
            "resp_2",
            Some(root.clone()),
            b"",
            &[json!(1)],
        ));
        let ids = |chain: Vec<Arc<StoredResponse>>| {
            chain.iter().map(|r| r.id().to_string()).collect::<Vec<_>>()
        };
        assert_eq!(ids(child.unpersisted_chain()), ["resp_1", "resp_2"]);
        root.set_persisted();
        assert_eq!(ids(child.unpersisted_chain()), ["resp_2"]);
        let record = child.record(gyre_event::ExecutionId(3));
        assert_eq!(record.previous_response_id.as_deref(), Some("resp_1"));
        assert_eq!(record.items, b"1");
        // Rebuilt from its record, it holds the same conversation and is durable already.
        let rebuilt = Arc::new(StoredResponse::from_items(
            "resp_2",
            Some(root.clone()),
            record.items,
            true,
        ));
        assert_eq!(rebuilt.conversation_items(), child.conversation_items());
        assert!(rebuilt.unpersisted_chain().is_empty());
    }

    #[test]
    fn empty_pieces_leave_no_stray_commas() {
        let none = Arc::new(StoredResponse::new("r", None, b"", &[]));
        assert_eq!(none.conversation_items(), b"");
        let after = StoredResponse::new("r2", Some(none.clone()), b"", &[json!({"a": 1})]);
        assert_eq!(after.conversation_items(), br#"{"a":1}"#);
        let (body, own) = expand(object(json!({"previous_response_id": "r"})), &none).unwrap();
        assert!(own.is_empty());
        assert_eq!(&body[..], br#"{"input":[]}"#);
        let (body, _) = expand(object(json!({"model": "m", "input": []})), &after).unwrap();
        assert_eq!(&body[..], br#"{"model":"m","input":[{"a":1}]}"#);
    }

    #[test]
    fn the_id_is_read_only_from_bodies_that_name_it() {
        assert_eq!(
            previous_response_id(br#"{"model":"m","input":"x"}"#).unwrap(),
            None
        );
        assert_eq!(
            previous_response_id(br#"{"previous_response_id":null,"input":"x"}"#).unwrap(),
            None
        );
        let (id, body) = previous_response_id(br#"{"previous_response_id":"resp_9","input":"x"}"#)
            .unwrap()
            .unwrap();
        assert_eq!(id, "resp_9");
        assert_eq!(body["input"], "x");
        for bad in [
            r#"{"previous_response_id":7}"#,
            r#"{"previous_response_id":""}"#,
        ] {
            let error = previous_response_id(bad.as_bytes()).unwrap_err();
            assert_eq!(error.status(), 400);
            assert_eq!(error.param.as_deref(), Some("previous_response_id"));
        }
        // Not JSON: left to the ordinary parse, which names the problem.
        assert_eq!(
            previous_response_id(br#"{"previous_response_id": "#).unwrap(),
            None
        );
        let error = not_found("resp_x", "never issued");
        assert!(error
            .message
            .contains("Previous response with id 'resp_x' not found"));
        assert_eq!(
            error.body_json()["error"]["code"],
            "previous_response_not_found"
        );
        // A JS client's lone surrogate does not hide the id.
        let (id, body) =
            previous_response_id(br#"{"previous_response_id":"resp_2","input":"a \ud83d b"}"#)
                .unwrap()
                .unwrap();
        assert_eq!(id, "resp_2");
        assert!(body["input"].as_str().unwrap().contains('\u{fffd}'));
    }

    #[test]
    fn a_bad_input_is_named() {
        let none = StoredResponse::new("r", None, b"", &[]);
        let error = expand(object(json!({"input": 3})), &none).unwrap_err();
        assert_eq!(error.param.as_deref(), Some("input"));
    }
}
