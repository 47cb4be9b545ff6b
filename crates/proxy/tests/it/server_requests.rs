//! The HTTP server through its router in process (no socket): route errors that must not echo
//! a credential, a Responses `generate` that is not a boolean, `/metrics` counting
//! `count_tokens` requests with their rejections, a re-sent call whose token limit the
//! committed answer exceeds, and an error in a chained request named in the client's terms.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::http::Request;
use gyre_event::Event;
use gyre_proxy::engine::{DeterministicEngine, DeterministicOptions};
use gyre_proxy::output::OutputFormat;
use gyre_proxy::server::{router, AppState, RecordSink, ServerConfig};
use gyre_proxy::{ChatModel, ToolArgumentsForm};
use hyper::service::Service;
use serde_json::{json, Value};

use crate::support::NoSink;

/// The length of every answer the engine samples (when the call's limit allows it).
const ANSWER_TOKENS: u32 = 25;

/// A sink that can hold a commit open: the record is in the log, and the harness can go away
/// before its answer ends.
#[derive(Default)]
struct GatedSink {
    records: AtomicUsize,
    hold: AtomicBool,
    arrived: tokio::sync::Notify,
    release: Arc<tokio::sync::Notify>,
}

impl RecordSink for GatedSink {
    fn commit(
        &self,
        events: Vec<Event>,
    ) -> futures_util::future::BoxFuture<'static, Result<(), gyre_proxy::server::CommitFailure>>
    {
        for event in &events {
            if matches!(event.body, gyre_event::EventBody::ModelCall(_)) {
                self.records.fetch_add(1, Ordering::SeqCst);
            }
        }
        let held = self.hold.load(Ordering::SeqCst);
        if held {
            self.arrived.notify_one();
        }
        let release = self.release.clone();
        Box::pin(async move {
            if held {
                release.notified().await;
            }
            Ok(())
        })
    }

    fn describe(&self) -> String {
        "gated memory".into()
    }
}

/// A proxy over the test model and a deterministic engine.
fn state() -> Arc<AppState> {
    state_with(Arc::new(NoSink))
}

/// [`state`] recording to `sink`.
fn state_with(sink: Arc<dyn RecordSink>) -> Arc<AppState> {
    let model = Arc::new(
        ChatModel::load(
            &gyre_proxy::test_model::directory(),
            ToolArgumentsForm::RawText,
        )
        .expect("the test model loads"),
    );
    let engine = DeterministicEngine::new(DeterministicOptions {
        output_tokens: ANSWER_TOKENS,
        end_token_id: model.token_id("<|im_end|>"),
        vocabulary: 9..2048,
        ..DeterministicOptions::default()
    });
    AppState::new(
        ServerConfig::default(),
        model,
        OutputFormat::test_model(),
        vec![Arc::new(engine)],
        sink,
    )
    .expect("state")
}

/// Sends `request` through the router; the status and the body as text.
async fn send(state: &Arc<AppState>, request: Request<Body>) -> (u16, String) {
    let service = hyper_util::service::TowerToHyperService::new(router(state.clone()));
    let answer = async {
        let response = service.call(request).await.expect("infallible");
        let status = response.status().as_u16();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .expect("body");
        (status, String::from_utf8_lossy(&bytes).into_owned())
    };
    tokio::time::timeout(std::time::Duration::from_secs(60), answer)
        .await
        .expect("answered within 60 s")
}

fn request(method: &str, path: &str, body: &Value) -> Request<Body> {
    Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .expect("a request")
}

/// An answer that must be a 200 with a JSON body: the body parsed, and as text for messages.
fn ok_json((status, text): (u16, String)) -> (Value, String) {
    assert_eq!(status, 200, "{text}");
    let value = serde_json::from_str(&text).expect("JSON");
    (value, text)
}

/// The value of one series in the `/metrics` text.
fn metric(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{series} missing from:\n{text}"))
}

/// Harnesses log the error bodies they get: a 404 or 405 on a path that carries the
/// execution's credential (`/x/<token>/…`, or an admin route naming it) must not put the
/// token in the harness's logs.
#[tokio::test]
async fn route_errors_do_not_echo_the_path_credential() {
    let state = state();
    let (_, token) = state.open_execution(None, None).expect("open");
    for (method, path, status, shown) in [
        (
            "GET",
            format!("/x/{token}/v1/files"),
            404,
            "no such route: GET /x/<credential>/v1/files",
        ),
        (
            "POST",
            format!("/x/{token}"),
            404,
            "no such route: POST /x/<credential>",
        ),
        (
            "DELETE",
            format!("/x/{token}/v1/messages"),
            405,
            "/x/<credential>/v1/messages does not take DELETE requests",
        ),
        (
            "GET",
            format!("/admin/executions/{token}/close"),
            405,
            "/admin/executions/<credential>/close does not take GET requests",
        ),
    ] {
        let (got, body) = send(&state, request(method, &path, &json!({}))).await;
        assert_eq!(got, status, "{method} {path}: {body}");
        assert!(
            !body.contains(&token),
            "{method}: the credential leaks: {body}"
        );
        assert!(body.contains(shown), "{method} {path}: {body}");
        let _: Value = serde_json::from_str(&body).expect("the API's JSON error");
    }
    // Paths without a credential are shown as they are.
    let (got, body) = send(&state, request("GET", "/v1/files", &json!({}))).await;
    assert_eq!(got, 404);
    assert!(body.contains("no such route: GET /v1/files"), "{body}");
}

/// `"generate": false` is Codex's warm-up; any other value that is not a boolean is a 400
/// naming the field, not a generation.
#[tokio::test]
async fn a_responses_generate_that_is_not_a_boolean_is_refused() {
    let state = state();
    let (_, token) = state.open_execution(None, None).expect("open");
    let path = format!("/x/{token}/v1/responses");
    let body = |generate: Value| json!({"model": "m", "input": "hi", "max_output_tokens": 16, "generate": generate});
    for bad in [json!("no"), json!(0), json!({})] {
        let (status, text) = send(&state, request("POST", &path, &body(bad.clone()))).await;
        assert_eq!(status, 400, "{bad}: {text}");
        let error: Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(error["error"]["param"], "generate", "{text}");
        assert!(
            error["error"]["message"]
                .as_str()
                .is_some_and(|message| message.starts_with("generate: expected a boolean")),
            "{text}"
        );
    }
    assert_eq!(state.metrics.recorded_count(), 0, "nothing was sampled");
    // The warm-up and a real call still answer.
    let (status, text) = send(&state, request("POST", &path, &body(json!(false)))).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        state.metrics.recorded_count(),
        0,
        "a warm-up samples nothing"
    );
    let (status, text) = send(&state, request("POST", &path, &body(json!(true)))).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(state.metrics.recorded_count(), 1);
}

/// `count_tokens` requests count in `gyre_proxy_requests_total` as their rejections count in
/// `gyre_proxy_rejected_total`: rejections never outnumber requests.
#[tokio::test]
async fn count_tokens_requests_are_counted_with_their_rejections() {
    let state = state();
    let (_, token) = state.open_execution(None, None).expect("open");
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    let (status, text) = send(
        &state,
        request(
            "POST",
            "/x/not-a-credential/v1/messages/count_tokens",
            &body,
        ),
    )
    .await;
    assert_eq!(status, 401, "{text}");
    let (status, text) = send(
        &state,
        request(
            "POST",
            &format!("/x/{token}/v1/messages/count_tokens"),
            &json!({"model": 1}),
        ),
    )
    .await;
    assert_eq!(status, 400, "{text}");
    let (status, text) = send(
        &state,
        request(
            "POST",
            &format!("/x/{token}/v1/messages/count_tokens"),
            &body,
        ),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let text = state.metrics.render();
    let requests = metric(&text, "gyre_proxy_requests_total{api=\"anthropic\"}");
    let rejected = metric(&text, "gyre_proxy_rejected_total{class=\"4xx\"}")
        + metric(&text, "gyre_proxy_rejected_total{class=\"5xx\"}");
    assert_eq!((requests, rejected), (3, 2), "{text}");
}

/// A harness re-sends a call whose answer it never received (it went away after the record
/// was committed) but asks for fewer tokens than that answer holds: the committed answer is
/// not replayed past the re-send's limit, the call is sampled anew within it.
#[tokio::test]
async fn a_re_send_with_a_smaller_token_limit_is_sampled_anew() {
    let sink = Arc::new(GatedSink::default());
    let state = state_with(sink.clone());
    let (_, token) = state.open_execution(None, None).expect("open");
    let path = format!("/x/{token}/v1/messages");
    let body = |max_tokens: u32| {
        json!({"model": "m", "max_tokens": max_tokens, "system": "You are a test agent.",
               "messages": [{"role": "user", "content": "What is it?"}]})
    };
    // The first call is committed, then its harness goes away before the answer ends.
    sink.hold.store(true, Ordering::SeqCst);
    let call = tokio::spawn({
        let (state, request) = (state.clone(), request("POST", &path, &body(200)));
        async move { send(&state, request).await }
    });
    tokio::time::timeout(std::time::Duration::from_secs(60), sink.arrived.notified())
        .await
        .expect("the record reached the sink");
    call.abort();
    assert!(call.await.is_err(), "the harness went away");
    sink.hold.store(false, Ordering::SeqCst);
    sink.release.notify_one();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while state.metrics.recorded_count() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the call never finished"
        );
        tokio::task::yield_now().await;
    }
    assert_eq!(sink.records.load(Ordering::SeqCst), 1);

    let (answer, text) = ok_json(send(&state, request("POST", &path, &body(3))).await);
    assert_eq!(answer["usage"]["output_tokens"], 3, "{text}");
    assert_eq!(answer["stop_reason"], "max_tokens", "{text}");
    assert_eq!(
        state.metrics.replayed_count(),
        0,
        "not the committed answer"
    );
    assert_eq!(sink.records.load(Ordering::SeqCst), 2, "a new sample");
}

/// A request continuing a stored response is expanded to the stored conversation plus its own
/// items before it is read; an error about one of its own items still names the item as the
/// client numbered it (`input[0]`, not its place in the expanded conversation).
#[tokio::test]
async fn an_error_in_a_chained_request_names_the_clients_own_item() {
    let state = state();
    let (_, token) = state.open_execution(None, None).expect("open");
    let path = format!("/x/{token}/v1/responses");
    let (first, _) = ok_json(
        send(
            &state,
            request(
                "POST",
                &path,
                &json!({"model": "m", "input": [
                {"role": "user", "content": "first"},
                {"role": "user", "content": "second"},
            ], "max_output_tokens": 16}),
            ),
        )
        .await,
    );
    let id = first["id"].as_str().expect("a response id").to_string();
    let (status, text) = send(
        &state,
        request(
            "POST",
            &path,
            &json!({"model": "m", "previous_response_id": id, "max_output_tokens": 16, "input": [
                {"type": "function_call_output", "call_id": "call_nope", "output": "x"},
            ]}),
        ),
    )
    .await;
    assert_eq!(status, 400, "{text}");
    let error: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(error["error"]["param"], "input[0].call_id", "{text}");
    assert!(
        error["error"]["message"]
            .as_str()
            .is_some_and(|message| message.starts_with("input[0].call_id")),
        "{text}"
    );
}

/// A proxy over the test model whose engine plays `script` (one JSONL line per call).
fn scripted_state(script: &str) -> Arc<AppState> {
    use gyre_proxy::engine::scripted::{Script, ScriptedEngine, ScriptedOptions};
    let model = Arc::new(
        ChatModel::load(
            &gyre_proxy::test_model::directory(),
            ToolArgumentsForm::RawText,
        )
        .expect("the test model loads"),
    );
    let script = Script::parse(script, None).expect("the script parses");
    let format = OutputFormat::test_model();
    let engine = ScriptedEngine::new(&script, &model, &format, ScriptedOptions::default())
        .expect("the script renders");
    AppState::new(
        ServerConfig::default(),
        model,
        format,
        vec![Arc::new(engine)],
        Arc::new(NoSink),
    )
    .expect("state")
}

/// A tool call the token limit cuts is answered as the real APIs answer it: a `tool_use` /
/// `tool_calls` entry with the arguments written so far (closed into an object) and the
/// limit's stop reason, never the call's raw markup as text and never `tool_use` as the stop
/// reason. Streamed, the same call arrives as a well-formed block.
#[tokio::test]
async fn a_tool_call_cut_by_the_token_limit_stays_a_tool_call() {
    let content = "line of the file\n".repeat(40);
    let line = json!({"agent": "main", "blocks": [
        {"type": "text", "text": "Writing."},
        {"type": "tool_use", "name": "Write", "input": {"file_path": "/tmp/a.txt", "content": content}}
    ]})
    .to_string();
    let script = [line.as_str(); 3].join("\n");
    let state = scripted_state(&script);
    let messages = json!([{"role": "user", "content": "Write the file."}]);

    let (_, token) = state.open_execution(None, None).expect("open");
    let body = json!({"model": "m", "max_tokens": 40, "messages": messages});
    let (answer, text) = ok_json(
        send(
            &state,
            request("POST", &format!("/x/{token}/v1/messages"), &body),
        )
        .await,
    );
    assert_eq!(answer["stop_reason"], "max_tokens", "{text}");
    let content_blocks = answer["content"].as_array().expect("content");
    assert_eq!(content_blocks[0]["text"], "Writing.", "{text}");
    let call = &content_blocks[1];
    assert_eq!(call["type"], "tool_use", "{text}");
    assert_eq!(call["name"], "Write");
    assert_eq!(call["input"]["file_path"], "/tmp/a.txt", "{text}");
    let written = call["input"]["content"].as_str().unwrap_or_default();
    assert!(
        content.starts_with(written) && written.len() < content.len(),
        "the content written before the cut: {text}"
    );
    assert!(!text.contains("<tool_call>"), "no raw markup: {text}");

    // Streamed: a tool_use block whose input_json_delta parts add up to the same object.
    let (_, token) = state.open_execution(None, None).expect("open");
    let body = json!({"model": "m", "max_tokens": 40, "stream": true, "messages": messages});
    let (status, text) = send(
        &state,
        request("POST", &format!("/x/{token}/v1/messages"), &body),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let mut partial = String::new();
    let mut stop_reason = None;
    for data in text.lines().filter_map(|line| line.strip_prefix("data: ")) {
        let event: Value = serde_json::from_str(data).expect("event JSON");
        if event["delta"]["type"] == "input_json_delta" {
            partial.push_str(
                event["delta"]["partial_json"]
                    .as_str()
                    .expect("partial json"),
            );
        }
        if event["type"] == "message_delta" {
            stop_reason = event["delta"]["stop_reason"].as_str().map(str::to_string);
        }
    }
    let streamed: Value = serde_json::from_str(&partial).expect("the deltas add up to JSON");
    assert_eq!(streamed, call["input"], "{text}");
    assert_eq!(stop_reason.as_deref(), Some("max_tokens"));

    // OpenAI Chat: `tool_calls` with the arguments so far, `finish_reason: length`.
    let (_, token) = state.open_execution(None, None).expect("open");
    let body = json!({"model": "m", "max_tokens": 40, "messages": messages});
    let (answer, text) = ok_json(
        send(
            &state,
            request("POST", &format!("/x/{token}/v1/chat/completions"), &body),
        )
        .await,
    );
    let choice = &answer["choices"][0];
    assert_eq!(choice["finish_reason"], "length", "{text}");
    let arguments = choice["message"]["tool_calls"][0]["function"]["arguments"]
        .as_str()
        .expect("arguments");
    let arguments: Value = serde_json::from_str(arguments).expect("arguments are JSON");
    assert_eq!(arguments["file_path"], "/tmp/a.txt", "{text}");
}

/// Chat Completions `custom` (freeform) tools, as GPT-5 clients send them: the model is shown
/// each as a function taking one string, a call of it comes back as a `type: "custom"` tool
/// call carrying that string (streamed too), `tool_choice` may name it, and the call in the
/// next request's history renders as it was sampled (its tokens are reused).
#[tokio::test]
async fn chat_custom_tools_are_shown_answered_and_replayed() {
    let line = json!({"agent": "main", "blocks": [
        {"type": "tool_use", "name": "cx", "input": {"input": "print(1)\n"}}
    ]})
    .to_string();
    let done = json!({"agent": "main", "blocks": [{"type": "text", "text": "Done."}]}).to_string();
    let script = [line.as_str(), done.as_str(), line.as_str(), line.as_str()].join("\n");
    let state = scripted_state(&script);
    let custom = json!({"type": "custom", "custom": {
        "name": "cx", "description": "Runs Python.",
        "format": {"type": "grammar", "grammar": {"syntax": "lark", "definition": "start: /.+/"}}
    }});
    let user = json!({"role": "user", "content": "Run it."});

    let (_, token) = state.open_execution(None, None).expect("open");
    let path = format!("/x/{token}/v1/chat/completions");
    let body = json!({"model": "m", "max_tokens": 200, "messages": [user], "tools": [custom]});
    let (answer, text) = ok_json(send(&state, request("POST", &path, &body)).await);
    let choice = &answer["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{text}");
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["type"], "custom", "{text}");
    assert_eq!(call["custom"]["name"], "cx");
    assert_eq!(call["custom"]["input"], "print(1)\n");
    let first_prompt = answer["usage"]["prompt_tokens"].as_u64().expect("usage");

    // The call and its output in the history: rendered as sampled, so the prompt reuses the
    // first call's tokens.
    let history = json!([
        user,
        {"role": "assistant", "content": null, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "1"}
    ]);
    let body = json!({"model": "m", "max_tokens": 200, "messages": history, "tools": [custom]});
    let (answer, text) = ok_json(send(&state, request("POST", &path, &body)).await);
    assert_eq!(
        answer["choices"][0]["message"]["content"], "Done.",
        "{text}"
    );
    let cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .expect("cached tokens");
    assert!(
        cached > first_prompt,
        "the first call's tokens are reused: {text}"
    );

    // The tool is in the prompt: without it the same request has fewer prompt tokens.
    let (_, token) = state.open_execution(None, None).expect("open");
    let body = json!({"model": "m", "max_tokens": 200, "messages": [user],
                      "tool_choice": {"type": "custom", "custom": {"name": "cx"}},
                      "tools": [custom], "stream": true});
    let (status, text) = send(
        &state,
        request("POST", &format!("/x/{token}/v1/chat/completions"), &body),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let streamed: Vec<Value> = text
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .filter(|data| *data != "[DONE]")
        .map(|data| serde_json::from_str(data).expect("chunk JSON"))
        .collect();
    let calls: Vec<&Value> = streamed
        .iter()
        .filter_map(|chunk| chunk["choices"][0]["delta"]["tool_calls"].get(0))
        .collect();
    assert_eq!(calls.len(), 1, "{text}");
    assert_eq!(calls[0]["type"], "custom");
    assert_eq!(calls[0]["custom"]["input"], "print(1)\n");
    let (_, token) = state.open_execution(None, None).expect("open");
    let body = json!({"model": "m", "max_tokens": 200, "messages": [user]});
    let (answer, _) = ok_json(
        send(
            &state,
            request("POST", &format!("/x/{token}/v1/chat/completions"), &body),
        )
        .await,
    );
    let bare_prompt = answer["usage"]["prompt_tokens"].as_u64().expect("usage");
    assert!(
        first_prompt > bare_prompt + 10,
        "the tool is shown to the model"
    );
}

/// `GET /v1/models` lists the served model in the shape of the API the client speaks, with or
/// without an execution's path prefix, and any model a harness names exists.
#[tokio::test]
async fn the_models_route_lists_the_served_model_in_each_apis_shape() {
    let state = state();
    let (_, token) = state.open_execution(None, None).expect("open");
    for path in ["/v1/models".to_string(), format!("/x/{token}/v1/models")] {
        let get = Request::builder()
            .uri(path.as_str())
            .body(Body::empty())
            .expect("request");
        let (listed, text) = ok_json(send(&state, get).await);
        assert_eq!(listed["object"], "list", "{text}");
        assert_eq!(listed["data"][0]["id"], "gyre-policy");
        assert_eq!(listed["data"][0]["object"], "model");

        let get = Request::builder()
            .uri(path.as_str())
            .header("anthropic-version", "2023-06-01")
            .body(Body::empty())
            .expect("request");
        let (listed, text) = ok_json(send(&state, get).await);
        assert_eq!(listed["data"][0]["type"], "model", "{text}");
        assert_eq!(listed["has_more"], false);
        assert_eq!(listed["first_id"], "gyre-policy");
    }
    let get = Request::builder()
        .uri("/v1/models/claude-sonnet-4-5")
        .header("anthropic-version", "2023-06-01")
        .body(Body::empty())
        .expect("request");
    let (model, text) = ok_json(send(&state, get).await);
    assert_eq!(model["id"], "claude-sonnet-4-5", "{text}");
}

/// GPT-5.1's typed client-run tools, `shell` and `apply_patch` (the OpenAI Agents SDK's
/// `ShellTool` and `ApplyPatchTool`): the model is shown both, its calls go out as a
/// `shell_call` with an `action` of commands and an `apply_patch_call` with a file
/// `operation` (streamed as the item's events), and each next request's history of the calls
/// and their outputs renders as sampled (every earlier call's tokens are reused).
#[tokio::test]
async fn the_shell_and_apply_patch_tools_are_shown_called_and_replayed() {
    let shell = json!({"agent": "main", "blocks": [
        {"type": "tool_use", "name": "shell", "input": {"commands": ["ls", "cat a.txt"], "timeout_ms": 5000}}
    ]})
    .to_string();
    let patch = json!({"agent": "main", "blocks": [
        {"type": "tool_use", "name": "apply_patch", "input": {"type": "create_file", "path": "b.txt", "diff": "+hello\n"}}
    ]})
    .to_string();
    let done = json!({"agent": "main", "blocks": [{"type": "text", "text": "Done."}]}).to_string();
    let script = [
        shell.as_str(),
        patch.as_str(),
        done.as_str(),
        shell.as_str(),
    ]
    .join("\n");
    let state = scripted_state(&script);
    let user = json!({"type": "message", "role": "user", "content": "Copy a.txt to b.txt."});
    let tools =
        json!([{"type": "shell", "environment": {"type": "local"}}, {"type": "apply_patch"}]);

    let (_, token) = state.open_execution(None, None).expect("open");
    let path = format!("/x/{token}/v1/responses");
    let body = json!({"model": "m", "input": [user], "tools": tools, "store": false});
    let (answer, text) = ok_json(send(&state, request("POST", &path, &body)).await);
    let shell_call = answer["output"][0].clone();
    assert_eq!(shell_call["type"], "shell_call", "{text}");
    assert_eq!(shell_call["status"], "completed");
    assert_eq!(
        shell_call["action"],
        json!({"commands": ["ls", "cat a.txt"], "timeout_ms": 5000, "max_output_length": null}),
        "{text}"
    );
    assert!(
        shell_call["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("sh_")),
        "{text}"
    );
    let mut prompt = answer["usage"]["input_tokens"].as_u64().expect("usage");

    let mut history = vec![
        user.clone(),
        shell_call.clone(),
        json!({"type": "shell_call_output", "call_id": shell_call["call_id"], "status": "completed",
               "output": [{"stdout": "a.txt\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}},
                          {"stdout": "hello\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}]}),
    ];
    let body = json!({"model": "m", "input": history, "tools": tools, "store": false});
    let (answer, text) = ok_json(send(&state, request("POST", &path, &body)).await);
    let patch_call = answer["output"][0].clone();
    assert_eq!(patch_call["type"], "apply_patch_call", "{text}");
    assert_eq!(
        patch_call["operation"],
        json!({"type": "create_file", "path": "b.txt", "diff": "+hello\n"}),
        "{text}"
    );
    assert!(
        patch_call["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("apc_")),
        "{text}"
    );
    let cached = answer["usage"]["input_tokens_details"]["cached_tokens"]
        .as_u64()
        .expect("cached tokens");
    assert!(
        cached > prompt,
        "the shell call's tokens are reused: {text}"
    );
    prompt = answer["usage"]["input_tokens"].as_u64().expect("usage");

    history.push(patch_call.clone());
    history.push(
        json!({"type": "apply_patch_call_output", "call_id": patch_call["call_id"],
                        "status": "completed", "output": "Created b.txt"}),
    );
    let body = json!({"model": "m", "input": history, "tools": tools, "store": false});
    let (answer, text) = ok_json(send(&state, request("POST", &path, &body)).await);
    assert_eq!(answer["output"][0]["content"][0]["text"], "Done.", "{text}");
    let cached = answer["usage"]["input_tokens_details"]["cached_tokens"]
        .as_u64()
        .expect("cached tokens");
    assert!(
        cached > prompt,
        "the patch call's tokens are reused: {text}"
    );

    // Streamed: the item's added and done events carry the call.
    let body = json!({"model": "m", "input": [user], "tools": tools, "store": false,
                      "stream": true});
    let items = streamed_items_done(&state, &body).await;
    assert_eq!(items.len(), 1, "{items:?}");
    assert_eq!(items[0]["type"], "shell_call");
    assert_eq!(items[0]["action"]["commands"], json!(["ls", "cat a.txt"]));
}

/// The items of the `response.output_item.done` events of a streamed Responses request in a
/// new execution (the request must answer 200).
async fn streamed_items_done(state: &Arc<AppState>, body: &Value) -> Vec<Value> {
    let (_, token) = state.open_execution(None, None).expect("open");
    let (status, text) = send(
        state,
        request("POST", &format!("/x/{token}/v1/responses"), body),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    text.lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .map(|data| serde_json::from_str::<Value>(data).expect("event JSON"))
        .filter(|event| event["type"] == "response.output_item.done")
        .map(|event| event["item"].clone())
        .collect()
}

/// The Responses API's client-run `local_shell` tool (Codex's, for its codex-mini models): the
/// model is shown it, its call goes out as a `local_shell_call` item with an `exec` action
/// (streamed as the item's events), and the next request's history of that call and its
/// output renders as sampled (the first call's tokens are reused).
#[tokio::test]
async fn the_local_shell_tool_is_shown_called_and_replayed() {
    let line = json!({"agent": "main", "blocks": [
        {"type": "tool_use", "name": "local_shell", "input": {"command": ["ls", "-la"], "timeout_ms": 5000}}
    ]})
    .to_string();
    let done =
        json!({"agent": "main", "blocks": [{"type": "text", "text": "Listed."}]}).to_string();
    let script = [line.as_str(), done.as_str(), line.as_str()].join("\n");
    let state = scripted_state(&script);
    let user = json!({"type": "message", "role": "user", "content": "List the files."});

    let (_, token) = state.open_execution(None, None).expect("open");
    let path = format!("/x/{token}/v1/responses");
    let body = json!({"model": "m", "input": [user], "tools": [{"type": "local_shell"}],
                      "store": false});
    let (answer, text) = ok_json(send(&state, request("POST", &path, &body)).await);
    let call = &answer["output"][0];
    assert_eq!(call["type"], "local_shell_call", "{text}");
    assert_eq!(call["status"], "completed");
    assert_eq!(
        call["action"],
        json!({"type": "exec", "command": ["ls", "-la"], "timeout_ms": 5000, "env": {}}),
        "{text}"
    );
    assert!(
        call["id"].as_str().is_some_and(|id| id.starts_with("lsh_")),
        "{text}"
    );
    let first_prompt = answer["usage"]["input_tokens"].as_u64().expect("usage");

    let history = json!([
        user,
        call,
        {"type": "local_shell_call_output", "id": call["call_id"], "output": "a.txt\n"}
    ]);
    let body = json!({"model": "m", "input": history, "tools": [{"type": "local_shell"}],
                      "store": false});
    let (answer, text) = ok_json(send(&state, request("POST", &path, &body)).await);
    assert_eq!(
        answer["output"][0]["content"][0]["text"], "Listed.",
        "{text}"
    );
    let cached = answer["usage"]["input_tokens_details"]["cached_tokens"]
        .as_u64()
        .expect("cached tokens");
    assert!(
        cached > first_prompt,
        "the first call's tokens are reused: {text}"
    );

    // Streamed: the item's added and done events carry the call.
    let body = json!({"model": "m", "input": [user], "tools": [{"type": "local_shell"}],
                      "store": false, "stream": true});
    let items = streamed_items_done(&state, &body).await;
    assert_eq!(items.len(), 1, "{items:?}");
    assert_eq!(items[0]["type"], "local_shell_call");
    assert_eq!(items[0]["action"]["command"], json!(["ls", "-la"]));
}
