//! The response store is a cache of the log: when it is full, the execution holding the most
//! of it gives up its oldest stored responses, and a client that later names one of them
//! (`previous_response_id`) gets it read back from the log — from the event file or from the
//! quorum — instead of a `previous_response_not_found` that would end its run.

use std::sync::Arc;

use axum::body::Body;
use axum::http::Request;
use gyre_proxy::engine::{DeterministicEngine, DeterministicOptions, TokenEngine};
use gyre_proxy::output::OutputFormat;
use gyre_proxy::server::{router, AppState, ControlSink, FileSink, RecordSink, ServerConfig};
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::support::InProcessCluster;

/// A conversation's first input: about 2.5 KB of text, so the store below holds two
/// conversations and not three.
fn input(tag: &str) -> String {
    format!(
        "{tag}: {}",
        "the quick brown fox jumps over the lazy dog; ".repeat(56)
    )
}

const STORE_BYTES: usize = 6_000;

async fn post(app: &axum::Router, token: &str, body: Value) -> (u16, Value) {
    let request = Request::post("/v1/responses")
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .expect("request");
    // No wait without a deadline (a hang fails naming the call instead of stalling CI).
    let (status, bytes) = tokio::time::timeout(std::time::Duration::from_secs(60), async {
        let response = app.clone().oneshot(request).await.expect("infallible");
        let status = response.status().as_u16();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .expect("body");
        (status, bytes)
    })
    .await
    .expect("the proxy answers within 60 s");
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| json!({"raw": String::from_utf8_lossy(&bytes)}));
    (status, value)
}

/// A proxy state with `config` in front of a deterministic engine, recording into `sink`.
fn state_with(config: ServerConfig, sink: Arc<dyn RecordSink>) -> Arc<AppState> {
    let model = crate::in_process::model();
    let end = model.token_id("<|im_end|>").expect("end token");
    let engine: Arc<dyn TokenEngine> = Arc::new(DeterministicEngine::new(DeterministicOptions {
        output_tokens: 8,
        end_token_id: Some(end),
        ..DeterministicOptions::default()
    }));
    AppState::new(
        config,
        model,
        OutputFormat::test_model(),
        vec![engine],
        sink,
    )
    .expect("state")
}

fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} in {text}"))
}

/// Three executions chain turns through a store that holds two conversations: every chained
/// request is answered (given-up responses read back), each extending its own conversation.
async fn chains_continue_through_a_full_store(sink: Arc<dyn RecordSink>) -> Vec<u64> {
    let config = ServerConfig {
        response_store_bytes_max: STORE_BYTES,
        ..ServerConfig::default()
    };
    let state = state_with(config, sink);
    let app = router(state.clone());
    let (executions, tokens): (Vec<u64>, Vec<String>) = (0..3)
        .map(|_| state.open_execution(None, None).expect("open"))
        .unzip();

    let turn = |token: &str, previous: Option<&Value>, text: String| {
        let mut body = json!({"model": "m", "input": text});
        if let Some(previous) = previous {
            body["previous_response_id"] = previous["id"].clone();
        }
        let (app, token) = (app.clone(), token.to_string());
        async move {
            let (status, answer) = post(&app, &token, body).await;
            assert_eq!(status, 200, "{answer}");
            answer
        }
    };
    let mut last = Vec::new();
    for (index, token) in tokens.iter().enumerate() {
        last.push(turn(token, None, input(&format!("conversation {index}"))).await);
    }
    for round in 0..3 {
        for (index, token) in tokens.iter().enumerate() {
            let answer = turn(token, Some(&last[index]), format!("go on ({round})")).await;
            assert_eq!(
                answer["previous_response_id"], last[index]["id"],
                "{answer}"
            );
            assert!(
                answer["usage"]["input_tokens_details"]["cached_tokens"]
                    .as_u64()
                    .expect("cached tokens")
                    > 0,
                "the chained call extends its conversation: {answer}"
            );
            last[index] = answer;
        }
    }
    let (a, b3) = (&tokens[0], &last[1]);
    let metrics = {
        let request = Request::get("/metrics")
            .body(Body::empty())
            .expect("request");
        let response = app.clone().oneshot(request).await.expect("infallible");
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .expect("body");
        String::from_utf8(bytes.to_vec()).expect("text")
    };
    assert!(
        metric(&metrics, "gyre_proxy_responses_given_up_total") >= 2,
        "{metrics}"
    );
    assert!(
        metric(&metrics, "gyre_proxy_responses_read_back_total") >= 2,
        "{metrics}"
    );
    // A response the log never held is still not found.
    let (status, answer) = post(
        &app,
        a,
        json!({"model": "m", "input": "x", "previous_response_id": "resp_never_issued"}),
    )
    .await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["error"]["code"], "previous_response_not_found");
    // Another execution's response is not this one's to continue.
    let (status, answer) = post(
        &app,
        a,
        json!({"model": "m", "input": "x", "previous_response_id": b3["id"]}),
    )
    .await;
    assert_eq!(status, 400, "{answer}");
    executions
}

#[test]
fn a_full_store_reads_given_up_responses_back_from_the_event_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sink = Arc::new(FileSink::open(&dir.path().join("proxy.log")).expect("event file"));
    crate::support::runtime().block_on(chains_continue_through_a_full_store(sink));
}

#[test]
fn a_full_store_reads_given_up_responses_back_from_the_quorum() {
    let runtime = crate::support::runtime();
    runtime.block_on(async {
        let cluster = InProcessCluster::start().await;
        let sink = Arc::new(ControlSink::new(&cluster.addresses.join(",")).expect("control sink"));
        let executions = chains_continue_through_a_full_store(sink).await;
        // What a read-back asks each node for: the stored responses, not the tree.
        let mut client = cluster.client.clone();
        let kinds = |events: &[gyre_event::Event]| {
            events
                .iter()
                .map(|event| event.body.kind_name())
                .collect::<std::collections::BTreeSet<_>>()
        };
        let (part, _) = client
            .read_execution_part(&cluster.addresses[0], executions[0], true)
            .await
            .expect("read");
        assert_eq!(kinds(&part), ["response_stored"].into());
        let (whole, _) = client
            .read_execution(&cluster.addresses[0], executions[0])
            .await
            .expect("read");
        assert_eq!(kinds(&whole), ["model_call", "response_stored"].into());
        cluster.shutdown().await;
    });
}

/// After a restart on the same event file, a response written by the earlier process is read
/// back from the part of the file the new one has not indexed yet.
#[test]
fn a_response_from_before_a_restart_is_read_back_from_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("proxy.log");
    let runtime = crate::support::runtime();
    let record = |id: &str, previous: Option<&str>, items: &str| {
        gyre_event::Event::new(
            gyre_event::Timestamp::ZERO,
            gyre_event::EventBody::ResponseStored(Box::new(gyre_event::StoredResponseRecord {
                execution: gyre_event::ExecutionId(7),
                response_id: id.to_string(),
                previous_response_id: previous.map(str::to_string),
                items: items.as_bytes().to_vec(),
            })),
        )
    };
    let commit = |sink: &FileSink, id: &str, previous: Option<&str>| {
        let event = record(id, previous, r#"{"role":"user","content":"hi"}"#);
        let committed = sink.commit(vec![event]);
        async move { committed.await.expect("committed") }
    };
    runtime.block_on(async {
        let first = FileSink::open(&path).expect("event file");
        commit(&first, "resp_1", None).await;
        commit(&first, "resp_2", Some("resp_1")).await;
    });
    runtime.block_on(async {
        let second = FileSink::open(&path).expect("event file");
        commit(&second, "resp_3", Some("resp_2")).await;
        let records = second
            .stored_responses(7, "resp_2")
            .await
            .expect("read back");
        let ids: Vec<&str> = records.iter().map(|r| r.response_id.as_str()).collect();
        assert_eq!(ids, ["resp_1", "resp_2", "resp_3"], "in commit order");
        assert!(second
            .stored_responses(8, "resp_1")
            .await
            .expect("read back")
            .is_empty());
    });
}

/// A client may fork from any turn it was given: a turn older than the last 8 kept is still
/// held as an earlier turn of the newest one's chain, and found there (no read-back; this
/// sink cannot read back at all).
#[test]
fn a_fork_from_an_early_turn_of_a_long_chain_is_found_in_memory() {
    crate::support::runtime().block_on(async {
        let sink = Arc::new(crate::support::MemorySink::default());
        let state = state_with(ServerConfig::default(), sink);
        let app = router(state.clone());
        let (_, token) = state.open_execution(None, None).expect("open");
        let mut turns: Vec<Value> = Vec::new();
        for turn in 0..12 {
            let mut body = json!({"model": "m", "input": format!("turn {turn}")});
            if let Some(previous) = turns.last() {
                body["previous_response_id"] = previous["id"].clone();
            }
            let (status, answer) = post(&app, &token, body).await;
            assert_eq!(status, 200, "{answer}");
            turns.push(answer);
        }
        let (status, fork) = post(
            &app,
            &token,
            json!({"model": "m", "input": "another way", "previous_response_id": turns[1]["id"]}),
        )
        .await;
        assert_eq!(status, 200, "{fork}");
        assert_eq!(fork["previous_response_id"], turns[1]["id"]);
    });
}
