//! The Responses API's WebSocket mode: `GET /v1/responses` (or `/x/<token>/v1/responses`)
//! upgraded to a WebSocket on which the client sends `response.create` messages (the body of
//! `POST /v1/responses` plus `"type": "response.create"`) and receives each response's stream
//! events as JSON text messages, one per event, in the order the SSE stream would carry them.
//! Codex uses this transport first when pointed at OpenAI's own provider (`openai_base_url`),
//! and chains each turn to the previous one with `previous_response_id` and only the new input
//! items, even with `store: false`, because the server keeps the connection's last responses.
//!
//! Every message is served by the same path as an HTTP call (`model_call`): the credential is
//! checked at the handshake (a bad one is a 401 before the upgrade), each answer is recorded and
//! committed before its `response.completed` event is sent, and every answer is kept for
//! chaining whatever its `store` says. A message that cannot be served gets an `error` event
//! (`{"type": "error", "status": …, "error": {type, code, message, param}}`) and the connection
//! stays open for the next one. An answer that fails midway (no engine could finish it, its
//! record could not be committed) ends with an error event of the same shape, not the SSE
//! stream's (`{"type": "error", "code", …}`): its status and type are read back from the code,
//! and it keeps the stream's `sequence_number`. Messages are served one at a time, in order. At most
//! `--max-connections` sockets are open at once; one more is refused at the handshake. When the
//! proxy stops (SIGTERM, Ctrl-C), a socket finishes the answer it is serving (its record
//! committed, `response.completed` sent) and then closes with 1001 (going away), as an idle one
//! does at once; a message that arrives after the stop is not served. The client reconnects to
//! the proxy's successor and continues its chain, which the log holds.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use serde_json::{json, Value};

use super::{authenticate, rejected, serve_call, AppState};
use crate::messages::Api;
use crate::{ApiError, ApiErrorKind};

const API: Api = Api::OpenAiResponses;

/// A `response.create` message: the body of `POST /v1/responses` to serve, and its
/// `stream_id` lane (echoed in every event of its answer).
pub(crate) struct Create {
    pub body: Bytes,
    pub stream_id: Option<Value>,
}

pub(super) async fn responses_socket(
    State(app): State<Arc<AppState>>,
    uri: Uri,
    headers: HeaderMap,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    open(app, None, uri, headers, upgrade)
}

pub(super) async fn responses_socket_at(
    State(app): State<Arc<AppState>>,
    Path(token): Path<String>,
    uri: Uri,
    headers: HeaderMap,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    open(app, Some(token), uri, headers, upgrade)
}

fn open(
    app: Arc<AppState>,
    token: Option<String>,
    uri: Uri,
    headers: HeaderMap,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    let upgrade = match upgrade {
        Ok(upgrade) => upgrade,
        Err(rejection) => {
            // A plain GET: say what this path serves, in OpenAI's error shape.
            let body = json!({"error": {
                "message": format!(
                    "GET {} opens the Responses WebSocket ({}); create a response over HTTP \
                     with POST",
                    uri.path(),
                    rejection.body_text()
                ),
                "type": "invalid_request_error",
                "param": null,
                "code": "websocket_upgrade_required",
            }});
            let mut response = (rejection.status(), body.to_string()).into_response();
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            return response;
        }
    };
    // Checked at the handshake, as OpenAI does: a client with a bad key never gets a socket.
    if let Err(error) = authenticate(&app, API, &headers, token.as_deref()) {
        return rejected(&app, &error);
    }
    // An upgraded connection leaves the accept loop's count: sockets have a cap of their own,
    // the same number (checked here, so a burst of handshakes may pass it by a few).
    let max = app.config.max_connections.max(1);
    if app.metrics.websockets_open() >= max as u64 {
        let error = ApiError::new(
            API,
            ApiErrorKind::Overloaded,
            format!(
                "the proxy is serving its maximum of {max} Responses WebSockets \
                 (--max-connections); retry shortly"
            ),
        );
        return rejected(&app, &error);
    }
    let limit = app.config.body_bytes_max;
    let stop = app.socket_stop();
    upgrade
        .max_message_size(limit)
        .max_frame_size(limit)
        .on_upgrade(move |socket| serve(app, token, uri, call_headers(headers), socket, stop))
}

/// The handshake's headers as those of each call: the credential, agent and session headers
/// stay; what described the upgrade request's own body and connection goes, and so does
/// Codex's `x-codex-turn-metadata` (at the handshake it describes the socket, not a turn; each
/// message carries its own in `client_metadata`, which is what says a call is a compaction).
fn call_headers(mut headers: HeaderMap) -> HeaderMap {
    headers.remove("x-codex-turn-metadata");
    for name in [
        header::CONTENT_LENGTH,
        header::CONTENT_ENCODING,
        header::TRANSFER_ENCODING,
        header::CONNECTION,
        header::UPGRADE,
        header::SEC_WEBSOCKET_KEY,
        header::SEC_WEBSOCKET_VERSION,
        header::SEC_WEBSOCKET_EXTENSIONS,
        header::SEC_WEBSOCKET_PROTOCOL,
    ] {
        headers.remove(name);
    }
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers
}

/// Task "responses-socket" (spawned by the upgrade, owned by its connection): serves the
/// connection's messages in order until the client closes it, it breaks, or the proxy stops.
async fn serve(
    app: Arc<AppState>,
    token: Option<String>,
    uri: Uri,
    headers: HeaderMap,
    mut socket: WebSocket,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    app.metrics.websocket_opened();
    loop {
        // Between answers: the stop first, so a stopping proxy serves nothing new.
        let received = tokio::select! {
            biased;
            _ = async { drop(stop.wait_for(|stopping| *stopping).await) } => {
                going_away(&mut socket).await;
                break;
            }
            received = socket.recv() => received,
        };
        let Some(received) = received else {
            break;
        };
        let text = match received {
            Ok(Message::Text(text)) => text,
            Ok(Message::Binary(_)) => {
                let error = ApiError::new(
                    API,
                    ApiErrorKind::InvalidRequest,
                    "binary messages are not read: send each client event as JSON text",
                );
                if send_error(&mut socket, &error, None).await.is_err() {
                    break;
                }
                continue;
            }
            Ok(Message::Ping(_) | Message::Pong(_)) => continue,
            // The socket has queued its answer to the client's close frame; the next read
            // sends it and then ends.
            Ok(Message::Close(_)) => continue,
            Err(error) => {
                refuse_and_close(&mut socket, &error.to_string()).await;
                break;
            }
        };
        let Create { body, stream_id } = match create_body(text.as_bytes()) {
            Ok(create) => create,
            Err((error, stream_id)) => {
                app.metrics.rejected(error.status());
                if send_error(&mut socket, &error, stream_id.as_ref())
                    .await
                    .is_err()
                {
                    break;
                }
                continue;
            }
        };
        let response = serve_call(
            app.clone(),
            API,
            token.clone(),
            &uri,
            headers.clone(),
            Body::from(body),
            true,
        )
        .await;
        if forward(&mut socket, response, stream_id.as_ref())
            .await
            .is_err()
        {
            break;
        }
    }
    app.metrics.websocket_closed();
    drop(stop);
}

/// How long a closing socket waits for the client's close frame before it drops the
/// connection anyway (a client that never answers must not hold the proxy's stop).
const CLOSE_REPLY_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Closes the socket with 1001 (going away) and waits, within [`CLOSE_REPLY_WAIT`], for the
/// client's close frame, so the close handshake completes before the connection is dropped.
async fn going_away(socket: &mut WebSocket) {
    let frame = axum::extract::ws::CloseFrame {
        code: axum::extract::ws::close_code::AWAY,
        reason: "the proxy is stopping; reconnect to continue".into(),
    };
    if socket.send(Message::Close(Some(frame))).await.is_err() {
        return;
    }
    let _ = tokio::time::timeout(CLOSE_REPLY_WAIT, async {
        while let Some(Ok(message)) = socket.recv().await {
            if matches!(message, Message::Close(_)) {
                break;
            }
        }
    })
    .await;
}

/// After a read failed: closes with the code that names why (1009 for a message over
/// `--body-limit`, 1007 for text that is not UTF-8, 1002 for a frame that breaks the protocol)
/// rather than dropping the connection without a word. Sending may fail on a broken
/// connection; there is nothing more to tell then.
async fn refuse_and_close(socket: &mut WebSocket, error: &str) {
    use axum::extract::ws::close_code;
    let code = if error.contains("Space limit exceeded") || error.contains("too long") {
        close_code::SIZE
    } else if error.contains("UTF-8") || error.contains("utf-8") {
        close_code::INVALID
    } else {
        close_code::PROTOCOL
    };
    let reason: String = error.chars().take(120).collect();
    let frame = axum::extract::ws::CloseFrame {
        code,
        reason: reason.into(),
    };
    let _ = tokio::time::timeout(CLOSE_REPLY_WAIT, socket.send(Message::Close(Some(frame)))).await;
}

/// The longest string `stream_id` a client event may carry.
const STREAM_ID_BYTES_MAX: usize = 256;

/// A client event as the body of `POST /v1/responses` with `stream: true` (`stream` is
/// implicit on a socket; `stream_id` is taken out), or the error that names what is wrong with
/// it (with the event's `stream_id`, when it has one).
pub(crate) fn create_body(message: &[u8]) -> Result<Create, (Box<ApiError>, Option<Value>)> {
    let invalid = |message: String| ApiError::new(API, ApiErrorKind::InvalidRequest, message);
    let value: Value = serde_json::from_slice(message).map_err(|error| {
        let error = invalid(format!(
            "the message is not JSON: {error} (each client event is one JSON object)"
        ));
        (Box::new(error), None)
    })?;
    let Value::Object(mut event) = value else {
        let error = invalid(
            "the message is not a JSON object (each client event is one JSON object)".into(),
        );
        return Err((Box::new(error), None));
    };
    let stream_id = event.shift_remove("stream_id");
    // The lane is echoed in every event of the answer: a short string or a number, never a
    // value that would be copied into each of thousands of events.
    let lane_ok = match &stream_id {
        None | Some(Value::Number(_)) => true,
        Some(Value::String(lane)) => lane.len() <= STREAM_ID_BYTES_MAX,
        Some(_) => false,
    };
    if !lane_ok {
        return Err((
            Box::new(ApiError::invalid_field(
                API,
                "stream_id",
                format!(
                    "a stream_id is a string of at most {STREAM_ID_BYTES_MAX} bytes or a number"
                ),
            )),
            None,
        ));
    }
    let refuse = |error: ApiError| Err((Box::new(error), stream_id.clone()));
    match event.get("type") {
        Some(Value::String(kind)) if kind == "response.create" => {}
        Some(Value::String(kind)) => {
            let shown: String = kind.chars().take(100).collect();
            return refuse(ApiError::invalid_field(
                API,
                "type",
                format!(
                    "client event '{shown}' is not supported; this proxy serves 'response.create'"
                ),
            ));
        }
        Some(_) => return refuse(ApiError::invalid_field(API, "type", "expected a string")),
        None => {
            return refuse(ApiError::invalid_field(
                API,
                "type",
                "missing; a response is created with {\"type\": \"response.create\", …}",
            ))
        }
    }
    if matches!(event.get("background"), Some(Value::Bool(true))) {
        return refuse(ApiError::invalid_field(
            API,
            "background",
            crate::openai_responses::BACKGROUND_REFUSED,
        ));
    }
    for field in ["type", "stream", "background"] {
        event.shift_remove(field);
    }
    event.insert("stream".into(), Value::Bool(true));
    Ok(Create {
        body: Bytes::from(Value::Object(event).to_string()),
        stream_id,
    })
}

/// Sends a call's answer: each SSE event's data as one text message, or the refusal as an
/// `error` event. Err when the socket is gone.
async fn forward(
    socket: &mut WebSocket,
    response: Response,
    stream_id: Option<&Value>,
) -> Result<(), ()> {
    let status = response.status();
    let mut body = response.into_body();
    if status != StatusCode::OK {
        let bytes = body
            .collect()
            .await
            .map(|collected| collected.to_bytes())
            .unwrap_or_default();
        let error = serde_json::from_slice::<Value>(&bytes)
            .ok()
            .and_then(|mut value| value.get_mut("error").map(Value::take))
            .unwrap_or_else(|| {
                json!({"type": "server_error", "code": null, "param": null,
                       "message": String::from_utf8_lossy(&bytes)})
            });
        return send_event(socket, &error_event(status.as_u16(), error, stream_id)).await;
    }
    let mut events = SseEvents::default();
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            // The answer's stream broke before its end: the generator already sent the
            // error event it had; nothing more to forward.
            return Ok(());
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        events.push(&data);
        while let Some(SseData { name, data: event }) = events.next_event() {
            let event = if name.as_deref() == Some("error") {
                stream_error_event(&event, stream_id).to_string()
            } else {
                match stream_id {
                    None => event,
                    Some(lane) => match serde_json::from_str::<Value>(&event) {
                        Ok(Value::Object(mut fields)) => {
                            fields.insert("stream_id".into(), lane.clone());
                            Value::Object(fields).to_string()
                        }
                        _ => event,
                    },
                }
            };
            socket
                .send(Message::Text(event.into()))
                .await
                .map_err(drop)?;
        }
    }
    Ok(())
}

/// A failure in the middle of an answer, which the stream carries as the Responses SSE
/// `error` event (`{"type": "error", "code", "message", "param", "sequence_number"}`), in the
/// socket's shape, as every other error on the socket: the status and type derived from the
/// code, `code` as a refusal before the stream would carry it, and the event's
/// `sequence_number` kept.
fn stream_error_event(data: &str, stream_id: Option<&Value>) -> Value {
    let mut fields = match serde_json::from_str::<Value>(data) {
        Ok(Value::Object(fields)) => fields,
        _ => serde_json::Map::new(),
    };
    let code = fields
        .get("code")
        .and_then(Value::as_str)
        .unwrap_or("server_error")
        .to_string();
    let reference = ApiError::new(API, ApiErrorKind::from_openai_code(&code), "");
    let type_name = reference.type_name();
    let message = match fields.shift_remove("message") {
        Some(Value::String(message)) => message,
        // Not the proxy's own event: pass on what it said.
        _ => data.to_string(),
    };
    let error = json!({
        "type": type_name,
        // A kind without a code of its own names its type in the stream's `code`.
        "code": (code != type_name).then_some(code),
        "message": message,
        "param": fields.shift_remove("param").unwrap_or(Value::Null),
    });
    let mut event = error_event(reference.status(), error, stream_id);
    if let Some(sequence_number) = fields.shift_remove("sequence_number") {
        event["sequence_number"] = sequence_number;
    }
    event
}

fn error_event(status: u16, error: Value, stream_id: Option<&Value>) -> Value {
    let mut event = json!({"type": "error", "status": status, "error": error});
    if let Some(lane) = stream_id {
        event["stream_id"] = lane.clone();
    }
    event
}

async fn send_error(
    socket: &mut WebSocket,
    error: &ApiError,
    stream_id: Option<&Value>,
) -> Result<(), ()> {
    let mut body = error.body_json();
    let inner = body
        .get_mut("error")
        .map(Value::take)
        .unwrap_or(Value::Null);
    send_event(socket, &error_event(error.status(), inner, stream_id)).await
}

async fn send_event(socket: &mut WebSocket, event: &Value) -> Result<(), ()> {
    socket
        .send(Message::Text(event.to_string().into()))
        .await
        .map_err(drop)
}

/// One event of an SSE stream: its `event:` name, if any, and its data.
#[derive(Debug, PartialEq)]
pub(crate) struct SseData {
    pub name: Option<String>,
    pub data: String,
}

/// An SSE byte stream cut into its events (the `data:` lines of each event, joined by
/// newlines, with the event's name; events without data and the `[DONE]` sentinel are
/// dropped).
#[derive(Default)]
pub(crate) struct SseEvents {
    pending: Vec<u8>,
}

impl SseEvents {
    pub(crate) fn push(&mut self, bytes: &[u8]) {
        self.pending.extend_from_slice(bytes);
    }

    pub(crate) fn next_event(&mut self) -> Option<SseData> {
        loop {
            let end = self.pending.windows(2).position(|pair| pair == b"\n\n")?;
            let event: Vec<u8> = self.pending.drain(..end + 2).collect();
            let text = String::from_utf8_lossy(&event[..end]);
            let mut data = String::new();
            let mut name = None;
            for line in text.split('\n') {
                if let Some(value) = line.strip_prefix("event:") {
                    name = Some(value.strip_prefix(' ').unwrap_or(value).to_string());
                    continue;
                }
                let Some(value) = line.strip_prefix("data:") else {
                    continue;
                };
                if !data.is_empty() {
                    data.push('\n');
                }
                data.push_str(value.strip_prefix(' ').unwrap_or(value));
            }
            if !data.is_empty() && data != "[DONE]" {
                return Some(SseData { name, data });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_create_event_becomes_a_streamed_body_in_the_same_key_order() {
        let Ok(create) = create_body(
            br#"{"type":"response.create","stream_id":"lane-2","model":"m","input":[{"role":"user","content":"hi"}],"stream":false,"background":false,"store":false}"#,
        ) else {
            panic!("refused")
        };
        assert_eq!(
            std::str::from_utf8(&create.body).unwrap(),
            r#"{"model":"m","input":[{"role":"user","content":"hi"}],"store":false,"stream":true}"#
        );
        assert_eq!(create.stream_id, Some(json!("lane-2")));
    }

    #[test]
    fn other_events_and_bad_messages_are_refused_naming_the_problem() {
        for (message, expected) in [
            (&b"not json"[..], "not JSON"),
            (b"[1]", "not a JSON object"),
            (br#"{"model":"m"}"#, "type: missing"),
            (br#"{"type":7}"#, "type: expected a string"),
            (
                br#"{"type":"response.steer"}"#,
                "'response.steer' is not supported",
            ),
            (
                br#"{"type":"response.create","background":true}"#,
                "background: background responses are not served",
            ),
            (
                br#"{"type":"response.create","stream_id":{"echoed":["in","every","event"]}}"#,
                "stream_id: a stream_id is a string of at most 256 bytes or a number",
            ),
        ] {
            let Err((error, _)) = create_body(message) else {
                panic!("accepted {}", String::from_utf8_lossy(message))
            };
            assert_eq!(error.status(), 400);
            assert!(
                error.message.contains(expected),
                "{}: {}",
                String::from_utf8_lossy(message),
                error.message
            );
        }
    }

    /// An error in the middle of an answer reads on the socket as the same error refused
    /// before the answer would: the socket's shape, its status, type, code and param, with
    /// the stream's `sequence_number` (and the lane) kept.
    #[test]
    fn a_stream_error_on_the_socket_has_the_sockets_shape() {
        let mut errors: Vec<ApiError> = [
            ApiErrorKind::InvalidRequest,
            ApiErrorKind::Internal,
            ApiErrorKind::Overloaded,
            ApiErrorKind::RateLimited,
        ]
        .into_iter()
        .map(|kind| ApiError::new(API, kind, "it failed"))
        .collect();
        errors.push(ApiError::context_too_long(API, 10, 5));
        errors.push(ApiError::invalid_field(API, "input[2].id", "no such item"));
        for lane in [None, Some(json!("lane-a"))] {
            for error in &errors {
                let data = error.sse_event(12).data;
                let got = stream_error_event(&data, lane.as_ref());
                let mut expected = error.body_json();
                let inner = expected["error"].take();
                let mut expected = error_event(error.status(), inner, lane.as_ref());
                expected["sequence_number"] = json!(12);
                assert_eq!(got, expected, "{data}");
            }
        }
        let got = stream_error_event(
            &ApiError::new(API, ApiErrorKind::Overloaded, "m")
                .sse_event(3)
                .data,
            None,
        );
        assert_eq!(got["status"], 503, "{got}");
        assert_eq!(got["error"]["type"], "server_error", "{got}");
        assert_eq!(got["error"]["code"], "overloaded", "{got}");
    }

    #[test]
    fn sse_bytes_split_anywhere_give_each_event_data_once() {
        let stream = b"event: response.created\ndata: {\"a\":1}\n\n: comment\n\nevent: x\ndata: {\"b\":\ndata: 2}\n\ndata: [DONE]\n\n";
        for cut in 0..stream.len() {
            let mut events = SseEvents::default();
            let mut seen = Vec::new();
            for part in [&stream[..cut], &stream[cut..]] {
                events.push(part);
                while let Some(SseData { name, data }) = events.next_event() {
                    seen.push((name, data));
                }
            }
            assert_eq!(
                seen,
                [
                    (Some("response.created".into()), "{\"a\":1}".into()),
                    (Some("x".into()), "{\"b\":\n2}".into())
                ],
                "cut at {cut}"
            );
        }
    }
}
