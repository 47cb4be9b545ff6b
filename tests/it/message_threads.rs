//! Anthropic Message Threads through the proxy (see `gyre_proxy::message_threads`).

use serde_json::json;

/// Anthropic Message Threads: a `create` is served and its answer held; a `continue` sends
/// only the new turn and is answered as the whole conversation would be (the call extends the
/// tree whole, streamed or not); a response is continued once (`thread_already_continued`), an
/// id the execution does not hold is `thread_not_found` (404), and neither samples or records
/// anything.
#[test]
fn a_continue_is_served_as_the_whole_conversation_and_continued_once() {
    let runtime = crate::support::runtime();
    let engine = crate::in_process::scripted(concat!(
        r#"{"agent": "main", "blocks": [{"type": "tool_use", "name": "Bash", "input": {"command": "echo a"}}]}"#,
        "\n",
        r#"{"agent": "main", "blocks": [{"type": "tool_use", "name": "Bash", "input": {"command": "echo b"}}]}"#,
        "\n",
        r#"{"agent": "main", "blocks": [{"type": "text", "text": "Done."}]}"#,
    ));
    let proxy = crate::in_process::proxy(&runtime, engine);
    let tools = json!([{"name": "Bash", "description": "Runs a command.",
                        "input_schema": {"type": "object",
                                         "properties": {"command": {"type": "string"}}}}]);
    let ask = json!({"role": "user", "content": "Run them."});
    let (status, first) = proxy.post(
        "/v1/messages",
        &json!({"model": "m", "max_tokens": 256, "system": "Be brief.", "tools": tools,
                "messages": [ask], "thread": {"type": "create"}}),
    );
    assert_eq!(status, 200, "{first}");
    let result = |answer: &serde_json::Value, output: &str| {
        json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": answer["content"][0]["id"], "content": output}]})
    };
    // The new turn only: no system, no tools, no history.
    let continue_from = |answer: &serde_json::Value, output: &str, stream: bool| {
        json!({"model": "m", "max_tokens": 256, "stream": stream,
               "messages": [result(answer, output)],
               "thread": {"type": "continue", "previous_message_id": answer["id"]}})
    };
    let (status, second) = proxy.post("/v1/messages", &continue_from(&first, "a", false));
    assert_eq!(status, 200, "{second}");
    assert_eq!(
        second["content"][0]["input"]["command"], "echo b",
        "{second}"
    );
    // Continued once: the same continue again is refused, sampling nothing.
    let (status, again) = proxy.post("/v1/messages", &continue_from(&first, "a", false));
    assert_eq!(status, 400, "{again}");
    assert_eq!(
        again["error"]["details"]["error_code"], "thread_already_continued",
        "{again}"
    );
    let mut unknown = continue_from(&first, "a", false);
    unknown["thread"]["previous_message_id"] = json!("msg_unknown");
    let (status, lost) = proxy.post("/v1/messages", &unknown);
    assert_eq!(status, 404, "{lost}");
    assert_eq!(lost["error"]["type"], "not_found_error", "{lost}");
    assert_eq!(
        lost["error"]["details"]["error_code"], "thread_not_found",
        "{lost}"
    );
    let (status, bad) = proxy.post(
        "/v1/messages",
        &json!({"model": "m", "max_tokens": 256, "messages": [ask],
                "thread": {"type": "resume"}}),
    );
    assert_eq!(status, 400, "{bad}");
    assert!(
        bad["error"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("thread")),
        "{bad}"
    );
    assert_eq!(proxy.sink.records().len(), 2, "no refused request sampled");
    // A streamed continue from the second answer.
    let (status, third) = proxy.post_raw("/v1/messages", &continue_from(&second, "b", true));
    assert_eq!(status, 200, "{third}");
    assert!(third.contains("message_stop"), "{third}");
    assert!(third.contains("\"stop_reason\":\"end_turn\""), "{third}");
    let records = proxy.sink.records();
    assert_eq!(records.len(), 3);
    assert_eq!(records[0].parent_call, None);
    for pair in records.windows(2) {
        assert_eq!(pair[1].parent_call, Some(pair[0].call));
        assert_eq!(
            pair[1].reused_prefix_tokens_count,
            pair[0].reused_prefix_tokens_count
                + (pair[0].input_ids.len() + pair[0].output_ids.len()) as u64,
            "each continue extends the whole conversation before it"
        );
    }
}

/// The thread store of the tests below: one ~10 KB thread fits, two do not.
const STORE_MAX: usize = 15_000;

/// A proxy whose thread store holds [`STORE_MAX`] bytes, recording into `sink`, with two
/// executions (number and credential; the proxy calls as the first by default).
fn two_executions_sharing_a_store(
    runtime: &tokio::runtime::Runtime,
    sink: std::sync::Arc<crate::support::MemorySink>,
) -> (crate::in_process::Proxy, (u64, String), (u64, String)) {
    let answer = r#"{"agent": "main", "blocks": [{"type": "text", "text": "ok"}]}"#;
    let engine = crate::in_process::scripted(&[answer; 8].join("\n"));
    let state = gyre_proxy::server::AppState::new(
        gyre_proxy::server::ServerConfig {
            thread_store_bytes_max: STORE_MAX,
            ..Default::default()
        },
        crate::in_process::model(),
        gyre_proxy::output::OutputFormat::test_model(),
        vec![engine],
        sink.clone(),
    )
    .expect("state");
    let first = state.open_execution(None, None).expect("open");
    let second = state.open_execution(None, None).expect("open");
    let proxy = crate::in_process::serve_state(runtime, state, first.1.clone(), sink);
    (proxy, first, second)
}

/// A `create` with `system` and one user message.
fn create(system: &str) -> serde_json::Value {
    json!({"model": "m", "max_tokens": 64, "system": system,
           "messages": [{"role": "user", "content": "hi"}], "thread": {"type": "create"}})
}

/// A `continue` of `answer` with one user message.
fn continue_from(answer: &serde_json::Value) -> serde_json::Value {
    json!({"model": "m", "max_tokens": 64,
           "messages": [{"role": "user", "content": "more"}],
           "thread": {"type": "continue", "previous_message_id": answer["id"]}})
}

/// A `create` larger than the whole store is answered; a continue of it is a 404 (its answer).
fn a_thread_larger_than_the_store(
    proxy: &crate::in_process::Proxy,
    token: &str,
) -> serde_json::Value {
    let (status, huge) = proxy.post_as(token, "/v1/messages", &create(&"y".repeat(STORE_MAX)));
    assert_eq!(status, 200, "{huge}");
    let (status, lost) = proxy.post_as(token, "/v1/messages", &continue_from(&huge));
    assert_eq!(status, 404, "{lost}");
    lost
}

/// The value of the metric `name` on `proxy`'s `/metrics`.
fn metric(proxy: &crate::in_process::Proxy, name: &str) -> usize {
    let text = proxy.metrics();
    text.lines()
        .find_map(|line| line.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("{name} in {text}"))
        .trim()
        .parse()
        .expect("a number")
}

/// The threads held over all executions fit `thread_store_bytes_max`: when a new thread does not
/// fit, the execution holding the most gives up its oldest (with a sink that cannot read it
/// back, a later continue of it is `thread_not_found`, and the client sends the turn again
/// whole; see the next test for one that can); a continue's new thread is
/// charged in place of the one it continued, so a conversation over half the store still goes
/// on; a thread larger than the whole store is answered but not held. The gauge and the
/// given-up counter say so.
#[test]
fn held_threads_fit_the_store_over_all_executions() {
    let runtime = crate::support::runtime();
    let sink = std::sync::Arc::new(crate::support::MemorySink::default());
    let (proxy, (_, first_token), (_, second_token)) =
        two_executions_sharing_a_store(&runtime, sink);
    let store_max = STORE_MAX;
    // ~10 KB of conversation: one thread fits the store, two do not.
    let system = "x".repeat(10_000);
    let gauge = |name: &str| metric(&proxy, name);
    let (status, first) = proxy.post_as(&first_token, "/v1/messages", &create(&system));
    assert_eq!(status, 200, "{first}");
    let held_one = gauge("gyre_proxy_thread_store_bytes");
    assert!(held_one > 10_000 && held_one <= store_max, "{held_one}");
    // The second execution's thread makes room: the first's is given up.
    let (status, second) = proxy.post_as(&second_token, "/v1/messages", &create(&system));
    assert_eq!(status, 200, "{second}");
    assert_eq!(gauge("gyre_proxy_threads_given_up_total"), 1);
    assert!(gauge("gyre_proxy_thread_store_bytes") <= store_max);
    let (status, lost) = proxy.post_as(&first_token, "/v1/messages", &continue_from(&first));
    assert_eq!(status, 404, "{lost}");
    assert_eq!(
        lost["error"]["details"]["error_code"], "thread_not_found",
        "{lost}"
    );
    // The second goes on twice: each new thread replaces the one it continued in the store.
    let (status, third) = proxy.post_as(&second_token, "/v1/messages", &continue_from(&second));
    assert_eq!(status, 200, "{third}");
    let (status, fourth) = proxy.post_as(&second_token, "/v1/messages", &continue_from(&third));
    assert_eq!(status, 200, "{fourth}");
    let held_now = gauge("gyre_proxy_thread_store_bytes");
    assert!(
        held_now > held_one && held_now <= store_max,
        "one longer thread held: {held_now}"
    );
    assert_eq!(gauge("gyre_proxy_threads_given_up_total"), 1);
    // Larger than the whole store: answered, not held, nothing else given up.
    let lost = a_thread_larger_than_the_store(&proxy, &first_token);
    assert_eq!(lost["error"]["details"]["error_code"], "thread_not_found");
    assert_eq!(gauge("gyre_proxy_thread_store_bytes"), held_now);
    assert_eq!(gauge("gyre_proxy_threads_given_up_total"), 1);
    let (status, fifth) = proxy.post_as(&second_token, "/v1/messages", &continue_from(&fourth));
    assert_eq!(status, 200, "{fifth}");
}

/// A continue whose call the log could not take (its record and its turn go in one batch)
/// fails as overloaded and holds nothing: the continued response is given back, so the
/// client's retry of the same continue is served, and the log has each turn once.
#[test]
fn a_continue_whose_commit_failed_is_served_on_its_retry() {
    let runtime = crate::support::runtime();
    let engine = crate::in_process::scripted(concat!(
        r#"{"agent": "main", "blocks": [{"type": "text", "text": "One."}]}"#,
        "\n",
        r#"{"agent": "main", "blocks": [{"type": "text", "text": "Two."}]}"#,
        "\n",
        r#"{"agent": "main", "blocks": [{"type": "text", "text": "Two."}]}"#,
    ));
    let proxy = crate::in_process::proxy(&runtime, engine);
    let (status, first) = proxy.post(
        "/v1/messages",
        &json!({"model": "m", "max_tokens": 256,
                "messages": [{"role": "user", "content": "Count."}],
                "thread": {"type": "create"}}),
    );
    assert_eq!(status, 200, "{first}");
    let next = json!({"model": "m", "max_tokens": 256,
                      "messages": [{"role": "user", "content": "Again."}],
                      "thread": {"type": "continue", "previous_message_id": first["id"]}});
    proxy
        .sink
        .fail_next
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let (status, failed) = proxy.post("/v1/messages", &next);
    assert_eq!(status, 529, "{failed}");
    assert_eq!(failed["error"]["type"], "overloaded_error", "{failed}");
    let (status, second) = proxy.post("/v1/messages", &next);
    assert_eq!(status, 200, "the retry continues the thread: {second}");
    assert_eq!(second["content"][0]["text"], "Two.", "{second}");
    let events = proxy.sink.events.lock().expect("sink lock");
    let kinds: Vec<&str> = events
        .iter()
        .map(|event| match &event.body {
            gyre_event::EventBody::ModelCall(_) => "call",
            gyre_event::EventBody::ResponseStored(_) => "turn",
            _ => "other",
        })
        .collect();
    assert_eq!(
        kinds,
        ["call", "turn", "call", "turn"],
        "nothing of the failed batch"
    );
    let gyre_event::EventBody::ResponseStored(turn) = &events[3].body else {
        panic!("a turn");
    };
    assert_eq!(
        turn.previous_response_id.as_ref(),
        first["id"].as_str().map(str::to_string).as_ref()
    );
}

/// A thread given up for room is still on the log (each turn is committed with its call): a
/// continue of it (or a count of one) reads it back, holds it again (making room in turn) and is served as the
/// whole conversation, extending its execution's tree; the read-back is counted, and the
/// response it continued is continued once, as any other. A thread larger than the whole store
/// cannot be held again: still `thread_not_found`.
#[test]
fn a_thread_given_up_for_room_is_read_back_from_the_log() {
    let runtime = crate::support::runtime();
    let sink = std::sync::Arc::new(crate::support::MemorySink::default());
    sink.reads_back
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let (proxy, (first_execution, first_token), (_, second_token)) =
        two_executions_sharing_a_store(&runtime, sink.clone());
    let store_max = STORE_MAX;
    let system = "x".repeat(10_000);
    let counter = |name: &str| metric(&proxy, name);
    let (status, first) = proxy.post_as(&first_token, "/v1/messages", &create(&system));
    assert_eq!(status, 200, "{first}");
    let (status, second) = proxy.post_as(&second_token, "/v1/messages", &create(&system));
    assert_eq!(status, 200, "{second}");
    assert_eq!(counter("gyre_proxy_threads_given_up_total"), 1);
    // The first's thread left memory; counting its continue reads it back (the second's makes
    // room), and the continue finds it held.
    let (status, counted) = proxy.post_as(
        &first_token,
        "/v1/messages/count_tokens",
        &continue_from(&first),
    );
    assert_eq!(status, 200, "read back for the count: {counted}");
    assert!(counted["input_tokens"].as_u64() > Some(2_000), "{counted}");
    assert_eq!(counter("gyre_proxy_threads_read_back_total"), 1);
    let (status, resumed) = proxy.post_as(&first_token, "/v1/messages", &continue_from(&first));
    assert_eq!(status, 200, "read back: {resumed}");
    assert_eq!(counter("gyre_proxy_threads_read_back_total"), 1);
    assert_eq!(counter("gyre_proxy_threads_given_up_total"), 2);
    assert!(counter("gyre_proxy_thread_store_bytes") <= store_max);
    let first_calls: Vec<_> = sink
        .records()
        .into_iter()
        .filter(|record| record.execution.get() == first_execution)
        .collect();
    assert_eq!(first_calls.len(), 2, "{first_calls:?}");
    assert_eq!(
        first_calls[1].parent_call,
        Some(first_calls[0].call),
        "the continue extends the first call: the whole conversation was rebuilt"
    );
    assert!(
        first_calls[1].reused_prefix_tokens_count > 2_000,
        "{:?}",
        first_calls[1]
    );
    // Continued once, read back or not.
    let (status, again) = proxy.post_as(&first_token, "/v1/messages", &continue_from(&first));
    assert_eq!(status, 400, "{again}");
    assert_eq!(
        again["error"]["details"]["error_code"], "thread_already_continued",
        "{again}"
    );
    // The second's thread, given up for the read-back, is read back in turn.
    let (status, third) = proxy.post_as(&second_token, "/v1/messages", &continue_from(&second));
    assert_eq!(status, 200, "{third}");
    assert_eq!(counter("gyre_proxy_threads_read_back_total"), 2);
    // Larger than the whole store: answered, never held, and not held when read back either.
    let lost = a_thread_larger_than_the_store(&proxy, &first_token);
    assert_eq!(
        lost["error"]["details"]["error_code"], "thread_not_found",
        "{lost}"
    );
    assert_eq!(counter("gyre_proxy_threads_read_back_total"), 2);
}

/// `count_tokens` with a thread `continue` counts the whole conversation the continue would
/// send (what a stateless client's count would be), and leaves the thread to continue; an id
/// not held is `thread_not_found`, as for a continue.
#[test]
fn count_tokens_counts_a_continue_as_the_whole_conversation() {
    let runtime = crate::support::runtime();
    let engine = crate::in_process::scripted(concat!(
        r#"{"agent": "main", "blocks": [{"type": "text", "text": "One."}]}"#,
        "\n",
        r#"{"agent": "main", "blocks": [{"type": "text", "text": "Two."}]}"#,
    ));
    let proxy = crate::in_process::proxy(&runtime, engine);
    let ask = json!({"role": "user", "content": "Count."});
    let (status, first) = proxy.post(
        "/v1/messages",
        &json!({"model": "m", "max_tokens": 256, "system": "Be brief.",
                "messages": [ask], "thread": {"type": "create"}}),
    );
    assert_eq!(status, 200, "{first}");
    let next = json!({"role": "user", "content": "Again, with more words this time."});
    let (status, threaded) = proxy.post(
        "/v1/messages/count_tokens",
        &json!({"model": "m", "messages": [next],
                "thread": {"type": "continue", "previous_message_id": first["id"]}}),
    );
    assert_eq!(status, 200, "{threaded}");
    let (status, whole) = proxy.post(
        "/v1/messages/count_tokens",
        &json!({"model": "m", "system": "Be brief.", "messages": [
            ask, {"role": "assistant", "content": first["content"]}, next]}),
    );
    assert_eq!(status, 200, "{whole}");
    assert_eq!(threaded["input_tokens"], whole["input_tokens"]);
    let (status, short) = proxy.post(
        "/v1/messages/count_tokens",
        &json!({"model": "m", "messages": [next]}),
    );
    assert_eq!(status, 200, "{short}");
    assert!(
        short["input_tokens"].as_u64() < whole["input_tokens"].as_u64(),
        "{short} vs {whole}"
    );
    // Counting continued nothing.
    let (status, second) = proxy.post(
        "/v1/messages",
        &json!({"model": "m", "max_tokens": 256, "messages": [next],
                "thread": {"type": "continue", "previous_message_id": first["id"]}}),
    );
    assert_eq!(status, 200, "{second}");
    let (status, lost) = proxy.post(
        "/v1/messages/count_tokens",
        &json!({"model": "m", "messages": [next],
                "thread": {"type": "continue", "previous_message_id": "msg_unknown"}}),
    );
    assert_eq!(status, 404, "{lost}");
    assert_eq!(
        lost["error"]["details"]["error_code"], "thread_not_found",
        "{lost}"
    );
}

/// Three executions continue their threads in turn through a store that holds one: every
/// continue is answered, the threads given up for room read back from `sink`'s log, each
/// continue extending its own conversation.
async fn threads_continue_through_a_full_store(
    sink: std::sync::Arc<dyn gyre_proxy::server::RecordSink>,
) {
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;
    let model = crate::in_process::model();
    let end = model.token_id("<|im_end|>").expect("end token");
    let engine: std::sync::Arc<dyn gyre_proxy::engine::TokenEngine> = std::sync::Arc::new(
        gyre_proxy::engine::DeterministicEngine::new(gyre_proxy::engine::DeterministicOptions {
            output_tokens: 8,
            end_token_id: Some(end),
            ..Default::default()
        }),
    );
    let state = gyre_proxy::server::AppState::new(
        gyre_proxy::server::ServerConfig {
            thread_store_bytes_max: 15_000,
            ..Default::default()
        },
        model,
        gyre_proxy::output::OutputFormat::test_model(),
        vec![engine],
        sink,
    )
    .expect("state");
    let app = gyre_proxy::server::router(state.clone());
    let tokens: Vec<String> = (0..3)
        .map(|_| state.open_execution(None, None).expect("open").1)
        .collect();
    let call = |token: &str, path: &str, body: Option<serde_json::Value>| {
        let request = match body {
            Some(body) => Request::post(path)
                .header("x-api-key", token)
                .header("content-type", "application/json")
                .body(Body::from(body.to_string())),
            None => Request::get(path).body(Body::empty()),
        }
        .expect("request");
        let app = app.clone();
        async move {
            let response =
                tokio::time::timeout(std::time::Duration::from_secs(60), app.oneshot(request))
                    .await
                    .expect("the proxy answers within 60 s")
                    .expect("infallible");
            let status = response.status().as_u16();
            let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .expect("body");
            (status, String::from_utf8_lossy(&bytes).into_owned())
        }
    };
    let post = |token: &str, body: serde_json::Value| {
        let answer = call(token, "/v1/messages", Some(body));
        async move {
            let (status, text) = answer.await;
            assert_eq!(status, 200, "{text}");
            serde_json::from_str::<serde_json::Value>(&text).expect("JSON")
        }
    };
    let mut last = Vec::new();
    for (index, token) in tokens.iter().enumerate() {
        let system = format!("conversation {index}: {}", "x".repeat(10_000));
        last.push(
            post(
                token,
                json!({"model": "m", "max_tokens": 16, "system": system,
                       "messages": [{"role": "user", "content": "hi"}],
                       "thread": {"type": "create"}}),
            )
            .await,
        );
    }
    for round in 0..2 {
        for (index, token) in tokens.iter().enumerate() {
            let answer = post(
                token,
                json!({"model": "m", "max_tokens": 16,
                       "messages": [{"role": "user", "content": format!("go on ({round})")}],
                       "thread": {"type": "continue", "previous_message_id": last[index]["id"]}}),
            )
            .await;
            assert!(
                answer["usage"]["cache_read_input_tokens"]
                    .as_u64()
                    .expect("cache read")
                    > 2_000,
                "the continue extends its whole conversation: {answer}"
            );
            last[index] = answer;
        }
    }
    let (_, metrics) = call("", "/metrics", None).await;
    let counter = |name: &str| -> u64 {
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(&format!("{name} "))?.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} in {metrics}"))
    };
    assert!(
        counter("gyre_proxy_threads_given_up_total") >= 5,
        "{metrics}"
    );
    assert!(
        counter("gyre_proxy_threads_read_back_total") >= 5,
        "{metrics}"
    );
}

#[test]
fn threads_given_up_for_room_are_read_back_from_the_event_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sink = std::sync::Arc::new(
        gyre_proxy::server::FileSink::open(&dir.path().join("proxy.log")).expect("event file"),
    );
    crate::support::runtime().block_on(threads_continue_through_a_full_store(sink));
}

#[test]
fn threads_given_up_for_room_are_read_back_from_the_quorum() {
    crate::support::runtime().block_on(async {
        let cluster = crate::support::InProcessCluster::start().await;
        let sink = std::sync::Arc::new(
            gyre_proxy::server::ControlSink::new(&cluster.addresses.join(","))
                .expect("control sink"),
        );
        threads_continue_through_a_full_store(sink).await;
        cluster.shutdown().await;
    });
}
