//! Role switches and engine deaths under load, in process: many executions stream calls
//! through the proxy's router while their engine dies or aborts mid-answer. Every call must
//! reach the harness as one well-formed answer (no error events, `message_stop` last), and the
//! log must hold exactly one record per call (none lost, none duplicated), each with the full
//! answer's tokens and a log-prob per token.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::Request;
use gyre_event::{Event, EventBody};
use gyre_proxy::engine::{DeterministicEngine, DeterministicOptions, Fault, TokenEngine};
use gyre_proxy::output::OutputFormat;
use gyre_proxy::server::{router, AppState, RecordSink, ServerConfig};
use gyre_proxy::{ChatModel, ToolArgumentsForm};
use tower::ServiceExt;

use crate::support::runtime;

/// The log, in memory: what was committed, in order.
#[derive(Default)]
struct MemorySink {
    events: Mutex<Vec<Event>>,
}

impl RecordSink for MemorySink {
    fn commit(
        &self,
        events: Vec<Event>,
    ) -> futures_util::future::BoxFuture<'static, Result<(), gyre_proxy::server::CommitFailure>>
    {
        self.events.lock().expect("sink lock").extend(events);
        Box::pin(async { Ok(()) })
    }

    fn describe(&self) -> String {
        "memory".into()
    }
}

fn test_model() -> Arc<ChatModel> {
    Arc::new(
        ChatModel::load(
            &gyre_proxy::test_model::directory(),
            ToolArgumentsForm::RawText,
        )
        .expect("test model"),
    )
}

const ANSWER_TOKENS: u32 = 24;
const EXECUTIONS: usize = 48;
const CALLS_PER_EXECUTION: usize = 3;

fn engine(name: &str, fault: Option<Fault>, end: u32) -> Arc<dyn TokenEngine> {
    versioned_engine(name, fault, end, 0)
}

/// [`engine`] whose answers and aborts report policy version `version`.
fn versioned_engine(
    name: &str,
    fault: Option<Fault>,
    end: u32,
    version: u64,
) -> Arc<dyn TokenEngine> {
    Arc::new(DeterministicEngine::new(DeterministicOptions {
        name: name.into(),
        output_tokens: ANSWER_TOKENS,
        end_token_id: Some(end),
        vocabulary: 9..2048,
        fault,
        policy_version: version,
        ..DeterministicOptions::default()
    }))
}

/// A proxy state over one healthy engine, recording to `sink`.
fn one_engine_state(config: ServerConfig, sink: Arc<MemorySink>) -> Arc<AppState> {
    let model = test_model();
    let end = model.token_id("<|im_end|>").expect("end token");
    AppState::new(
        config,
        model,
        OutputFormat::test_model(),
        vec![engine("e", None, end)],
        sink,
    )
    .expect("state")
}

/// Awaits `future`, failing the test if it takes over two minutes: a regression (or a slow,
/// loaded machine taking a path a fast one never does) fails instead of hanging CI.
async fn bounded<F: std::future::Future>(future: F) -> F::Output {
    tokio::time::timeout(std::time::Duration::from_secs(120), future)
        .await
        .expect("finished within 120 s")
}

/// POSTs `body` to `path` with `token` as the API key; the status and the body's text.
async fn post(state: &Arc<AppState>, path: &str, token: &str, body: String) -> (u16, String) {
    post_body(state, path, token, Body::from(body)).await
}

/// `post` with any body (a stream that stalls or fails part-way).
async fn post_body(state: &Arc<AppState>, path: &str, token: &str, body: Body) -> (u16, String) {
    let request = Request::post(path)
        .header("x-api-key", token)
        .header("content-type", "application/json")
        .body(body)
        .expect("request");
    bounded(async {
        let response = router(state.clone())
            .oneshot(request)
            .await
            .expect("infallible");
        let status = response.status().as_u16();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .expect("body");
        (status, String::from_utf8_lossy(&bytes).to_string())
    })
    .await
}

fn body(turn: usize) -> String {
    let mut messages = Vec::new();
    for earlier in 0..turn {
        messages
            .push(serde_json::json!({"role": "user", "content": format!("question {earlier}")}));
        messages.push(serde_json::json!({"role": "assistant", "content": "earlier answer"}));
    }
    messages.push(serde_json::json!({"role": "user", "content": format!("question {turn}")}));
    serde_json::json!({
        "model": "gyre-test",
        "max_tokens": 200,
        "stream": true,
        "system": "You are a test agent.",
        "messages": messages,
    })
    .to_string()
}

/// `fault` cuts the source's answer after `partial` tokens; the destination then produces a
/// whole answer of its own after them (it continues from the prompt plus the partial tokens).
fn scenario(fault: Fault, partial: usize) {
    let dies = matches!(fault, Fault::DieAfterTokens(_));
    runtime().block_on(async move {
        let model = test_model();
        let end = model.token_id("<|im_end|>").expect("end-of-turn token");
        let sink = Arc::new(MemorySink::default());
        // The source still serves policy version 4, the destination already 5.
        let engines = vec![
            versioned_engine("source", Some(fault), end, 4),
            versioned_engine("destination", None, end, 5),
        ];
        let state = AppState::new(
            ServerConfig::default(),
            model,
            OutputFormat::test_model(),
            engines,
            sink.clone(),
        )
        .expect("state");
        let app = router(state.clone());
        let mut tasks = Vec::new();
        for _ in 0..EXECUTIONS {
            // Every execution starts pinned to the engine that fails mid-answer.
            let (_, token) = state.open_execution(None, Some(0)).expect("open");
            let app = app.clone();
            tasks.push(tokio::spawn(async move {
                let mut answers = Vec::new();
                for turn in 0..CALLS_PER_EXECUTION {
                    let request = Request::post("/v1/messages")
                        .header("x-api-key", &token)
                        .header("content-type", "application/json")
                        .body(Body::from(body(turn)))
                        .expect("request");
                    let response = bounded(app.clone().oneshot(request))
                        .await
                        .expect("infallible");
                    let status = response.status().as_u16();
                    let bytes = bounded(axum::body::to_bytes(response.into_body(), usize::MAX))
                        .await
                        .expect("body");
                    answers.push((status, String::from_utf8(bytes.to_vec()).expect("utf-8")));
                }
                answers
            }));
        }
        let mut answers = Vec::new();
        for task in tasks {
            answers.extend(task.await.expect("client task"));
        }
        for (status, text) in &answers {
            assert_eq!(*status, 200, "{text}");
            assert!(
                !text.contains("event: error"),
                "a harness-visible error: {text}"
            );
            assert!(
                text.trim_end()
                    .ends_with("data: {\"type\":\"message_stop\"}"),
                "{text}"
            );
            assert_eq!(text.matches("event: message_start").count(), 1);
        }
        let events = sink.events.lock().expect("sink").clone();
        let mut seen = BTreeSet::new();
        let mut calls = 0;
        let mut aborted = 0;
        for event in &events {
            let EventBody::ModelCall(record) = &event.body else {
                panic!("only model calls are recorded");
            };
            assert!(
                seen.insert((record.execution, record.call)),
                "duplicated record"
            );
            if record.kind == gyre_event::CallKind::Aborted {
                // The failed attempt's partial output, kept for audit: exactly the tokens the
                // source engine streamed before it failed, from that engine.
                aborted += 1;
                assert_eq!(record.output_ids.len(), partial, "the partial output");
                assert_eq!(record.output_ids.len(), record.output_logprobs.len());
                assert_eq!(record.engine, gyre_event::EngineId(0));
                // The source's version: reported with its abort, or (an engine that died says
                // nothing) the last it reported — on a call's first failover, before the
                // source finished anything, 0, as nothing was ever heard from it.
                assert!(
                    record.policy_version == gyre_event::PolicyVersion(4)
                        || (dies && record.policy_version == gyre_event::PolicyVersion(0)),
                    "the aborted attempt's version: {:?}",
                    record.policy_version
                );
                assert!(
                    gyre_trajectory::RoleClasses::claude_code()
                        .classify(&record.agent, record.kind)
                        .is_none(),
                    "an aborted attempt is never trainable"
                );
                continue;
            }
            calls += 1;
            // Every answer ended on the destination, which reported its version.
            assert_eq!(record.policy_version, gyre_event::PolicyVersion(5));
            let length = record.output_ids.len();
            assert!(
                length == ANSWER_TOKENS as usize || length == partial + ANSWER_TOKENS as usize,
                "the whole answer: {length} tokens"
            );
            assert_eq!(record.output_ids.len(), record.output_logprobs.len());
            assert_eq!(record.output_ids.last(), Some(&end));
        }
        assert_eq!(
            calls,
            EXECUTIONS * CALLS_PER_EXECUTION,
            "one record per call"
        );
        assert_eq!(
            aborted, EXECUTIONS,
            "one audit record per failed attempt (each execution's first call)"
        );
        assert!(
            state.metrics.failovers_count() >= EXECUTIONS as u64,
            "every execution's first call failed over"
        );
        // `/metrics` times every call's steps: one observation per call and stage.
        let response = app
            .clone()
            .oneshot(
                Request::get("/metrics")
                    .body(Body::empty())
                    .expect("request"),
            )
            .await
            .expect("infallible");
        let text = String::from_utf8(
            axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .expect("body")
                .to_vec(),
        )
        .expect("utf-8");
        // Every call's body was kept for its execution's next call, within the budget.
        let gauge = text
            .lines()
            .find_map(|line| line.strip_prefix("gyre_proxy_body_cache_bytes "))
            .and_then(|value| value.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("gyre_proxy_body_cache_bytes missing from:\n{text}"));
        assert!(gauge > 0, "bodies are kept: {text}");
        assert!(
            text.contains("gyre_proxy_body_cache_bytes_max 268435456"),
            "{text}"
        );
        for stage in ["wait", "parse", "prepare", "engine"] {
            let line = format!(
                "gyre_proxy_stage_seconds_count{{stage=\"{stage}\"}} {}",
                EXECUTIONS * CALLS_PER_EXECUTION
            );
            assert!(text.contains(&line), "{line} missing from:\n{text}");
            assert!(text.contains(&format!(
                "gyre_proxy_stage_seconds_bucket{{stage=\"{stage}\",le=\"+Inf\"}}"
            )));
        }
    });
}

#[test]
fn engine_death_mid_stream_is_invisible_to_many_harnesses() {
    scenario(Fault::DieAfterTokens(5), 5);
}

#[test]
fn role_switch_abort_mid_stream_is_invisible_to_many_harnesses() {
    scenario(Fault::AbortAfterTokens(7), 7);
}

/// The scheduler's routing facts from the log move executions: `RoutesUpdated` sends an
/// execution's next call to the destination engine, `EngineDown` moves everything off an engine
/// and keeps new executions away, `EngineReady` brings it back.
#[test]
fn route_events_from_the_log_move_executions() {
    use gyre_event::{EngineId, ExecutionId, RouteMove};
    runtime().block_on(async {
        let model = test_model();
        let end = model.token_id("<|im_end|>").expect("end-of-turn token");
        let sink = Arc::new(MemorySink::default());
        let engines = vec![
            engine("e0", None, end),
            engine("e1", None, end),
            engine("e2", None, end),
        ];
        let state = AppState::new(
            ServerConfig::default(),
            model,
            OutputFormat::test_model(),
            engines,
            sink.clone(),
        )
        .expect("state");
        let app = router(state.clone());
        let (execution, token) = state.open_execution(None, Some(0)).expect("open");
        let call = |turn: usize| {
            let app = app.clone();
            let token = token.clone();
            async move {
                let request = Request::post("/v1/messages")
                    .header("x-api-key", &token)
                    .header("content-type", "application/json")
                    .body(Body::from(body(turn)))
                    .expect("request");
                let response = bounded(app.oneshot(request)).await.expect("infallible");
                assert_eq!(response.status().as_u16(), 200);
                bounded(axum::body::to_bytes(response.into_body(), usize::MAX))
                    .await
                    .expect("body");
            }
        };
        let last_engine = || {
            let events = sink.events.lock().expect("sink");
            match &events.last().expect("a record").body {
                EventBody::ModelCall(record) => record.engine,
                _ => panic!("a model call"),
            }
        };
        call(0).await;
        assert_eq!(last_engine(), EngineId(0));
        let moved = state.apply_route_event(&EventBody::RoutesUpdated {
            source: EngineId(0),
            moves: vec![RouteMove {
                execution: ExecutionId(execution),
                from: EngineId(0),
                to: EngineId(2),
            }],
        });
        assert_eq!(moved, 1);
        call(1).await;
        assert_eq!(last_engine(), EngineId(2));
        let moved = state.apply_route_event(&EventBody::EngineDown {
            engine: EngineId(2),
            reason: "lost".into(),
        });
        assert_eq!(moved, 1);
        call(2).await;
        assert_eq!(
            last_engine(),
            EngineId(0),
            "moved to the next engine that is up"
        );
        // New executions avoid the engine that is down.
        let pinned = |token: &str| state.execution(token).expect("open").engine();
        for _ in 0..6 {
            let (_, opened) = state.open_execution(None, None).expect("open");
            assert_ne!(
                pinned(&opened),
                2,
                "a new execution was pinned to an engine that is down"
            );
        }
        state.apply_route_event(&EventBody::EngineReady {
            engine: EngineId(2),
        });
        let engines: Vec<usize> = (0..3)
            .map(|_| pinned(&state.open_execution(None, None).expect("open").1))
            .collect();
        assert!(
            engines.contains(&2),
            "the engine is back in rotation: {engines:?}"
        );
        // The scheduler cancels the execution: its credential closes.
        let closed = state.apply_route_event(&EventBody::ExecutionClosed {
            execution: ExecutionId(execution),
            status: gyre_event::CloseStatus::Cancelled,
        });
        assert_eq!(closed, 1);
        let (status, text) = post(&state, "/v1/messages", &token, body(3)).await;
        assert_eq!(status, 401, "a closed execution takes no calls: {text}");
    });
}

/// Without `auto_open` an unknown credential gets 401 in the API's shape and nothing is
/// recorded; with it, the credential opens an execution of its own.
#[test]
fn unknown_credentials_are_refused_unless_auto_open() {
    runtime().block_on(async {
        for auto_open in [false, true] {
            let sink = Arc::new(MemorySink::default());
            let config = ServerConfig {
                auto_open,
                ..ServerConfig::default()
            };
            let state = one_engine_state(config, sink.clone());
            let (status, text) = post(&state, "/v1/messages", "sk-ant-captured-key", body(0)).await;
            if auto_open {
                assert_eq!(status, 200, "{text}");
                assert_eq!(sink.events.lock().expect("sink").len(), 1);
                assert!(state.execution("sk-ant-captured-key").is_some());
            } else {
                assert_eq!(status, 401, "{text}");
                assert!(text.contains("\"authentication_error\""), "{text}");
                assert!(
                    sink.events.lock().expect("sink").is_empty(),
                    "nothing recorded"
                );
            }
        }
    });
}

/// Claude Code re-sends the identical body when a stream is cut. The cut call (the harness went
/// away mid-answer) is aborted on the engine and records nothing; the retry records one call.
#[test]
fn a_harness_retry_after_a_cut_stream_records_one_call() {
    use futures_util::StreamExt;
    runtime().block_on(async {
        let model = test_model();
        let end = model.token_id("<|im_end|>").expect("end token");
        let deterministic = DeterministicEngine::new(DeterministicOptions {
            name: "e".into(),
            output_tokens: ANSWER_TOKENS,
            end_token_id: Some(end),
            ..DeterministicOptions::default()
        });
        // The first request stalls after 3 tokens until it is aborted.
        deterministic.inject(Fault::StallAfterTokens(3));
        let sink = Arc::new(MemorySink::default());
        let state = AppState::new(
            ServerConfig::default(),
            model,
            OutputFormat::test_model(),
            vec![Arc::new(deterministic.clone())],
            sink.clone(),
        )
        .expect("state");
        let (_, token) = state.open_execution(None, None).expect("open");
        let request = || {
            Request::post("/v1/messages")
                .header("x-api-key", &token)
                .header("content-type", "application/json")
                .body(Body::from(body(0)))
                .expect("request")
        };
        let response = router(state.clone())
            .oneshot(request())
            .await
            .expect("infallible");
        assert_eq!(response.status().as_u16(), 200);
        let mut stream = response.into_body().into_data_stream();
        let first = bounded(stream.next())
            .await
            .expect("a first frame")
            .expect("bytes");
        assert!(String::from_utf8_lossy(&first).contains("message_start"));
        // `message_start` leaves the proxy before its engine request starts. Cut only once the
        // engine holds the request (it took the stall fault and stays in flight until aborted):
        // cutting earlier let the retry's request take the fault and stall for ever.
        tokio::time::timeout(std::time::Duration::from_secs(30), async {
            while deterministic.in_flight_count() == 0 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the first call reached the engine");
        drop(stream); // the harness's connection is cut
                      // The proxy aborts the engine request (bounded: a regression fails instead of hanging).
        tokio::time::timeout(
            std::time::Duration::from_secs(30),
            deterministic.wait_idle(),
        )
        .await
        .expect("the cut call's engine request was aborted");
        assert!(
            sink.events.lock().expect("sink").is_empty(),
            "a cut call records nothing"
        );

        let retry = async {
            let response = router(state.clone())
                .oneshot(request())
                .await
                .expect("infallible");
            axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .expect("body")
        };
        let bytes = tokio::time::timeout(std::time::Duration::from_secs(60), retry)
            .await
            .expect("the retry is answered");
        let text = String::from_utf8_lossy(&bytes);
        assert!(
            text.trim_end()
                .ends_with("data: {\"type\":\"message_stop\"}"),
            "{text}"
        );
        let events = sink.events.lock().expect("sink");
        assert_eq!(events.len(), 1, "the retry records exactly one call");
        let EventBody::ModelCall(record) = &events[0].body else {
            panic!("a model call");
        };
        assert_eq!(
            record.parent_call, None,
            "the retry is the execution's first call"
        );
    });
}

/// Closing an execution leaves its credential answering "closed" from an empty session: the
/// tree and contexts (already in the log) are not kept for the rest of the run.
#[test]
fn a_closed_execution_frees_its_session_and_stays_closed() {
    runtime().block_on(async {
        let sink = Arc::new(MemorySink::default());
        let state = one_engine_state(ServerConfig::default(), sink.clone());
        let (_, token) = state.open_execution(None, None).expect("open");
        let (status, text) = post(&state, "/v1/messages", &token, body(0)).await;
        assert_eq!(status, 200, "{text}");
        let before = state.execution(&token).expect("open");
        assert_eq!(before.lock().tree.len(), 1);
        let close = format!("/admin/executions/{token}/close");
        let (status, text) = post(&state, &close, &token, "{}".into()).await;
        assert_eq!(status, 200, "{text}");
        assert!(text.contains("\"calls\":1"), "{text}");
        assert!(before.is_closed());
        assert!(
            matches!(
                state.credential(&token),
                Some(gyre_proxy::server::Credential::Closed(closed)) if closed.execution == before.id()
            ),
            "the credential keeps only what says it is closed"
        );
        assert!(state.execution(&token).is_none());
        let (status, text) = post(&state, &close, &token, "{}".into()).await;
        assert_eq!(status, 200, "closing again is not an error: {text}");
        assert!(text.contains("\"already_closed\":true"), "{text}");
        assert_eq!(
            before.lock().tree.len(),
            1,
            "a holder of the old session still sees it"
        );
        drop(before);
        let (status, text) = post(&state, "/v1/messages", &token, body(1)).await;
        assert_eq!(status, 401, "{text}");
        assert!(text.contains("closed"), "{text}");
        assert_eq!(
            sink.events.lock().expect("sink").len(),
            1,
            "nothing recorded after close"
        );
    });
}

/// Default settings with a credentials file in a fresh directory (kept while the guard lives),
/// so a second `AppState` on the same config is the first one restarted.
fn with_a_credentials_file() -> (tempfile::TempDir, ServerConfig) {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = ServerConfig {
        credentials: Some(dir.path().join("credentials")),
        ..ServerConfig::default()
    };
    (dir, config)
}

/// A restarted proxy keeps the credential of an execution the scheduler closed while it was
/// down closed (the `ExecutionClosed` it reads back), and says why.
#[test]
fn an_execution_closed_while_the_proxy_was_down_stays_closed() {
    runtime().block_on(async {
        let (_dir, config) = with_a_credentials_file();
        let start = || one_engine_state(config.clone(), Arc::new(MemorySink::default()));
        let (execution, token) = start().open_execution(None, None).expect("open");
        let restarted = start();
        let recovery = restarted.recover([Event::new(
            gyre_event::Timestamp::ZERO,
            EventBody::ExecutionClosed {
                execution: gyre_event::ExecutionId(execution),
                status: gyre_event::CloseStatus::Cancelled,
            },
        )]);
        assert_eq!(recovery.credentials_open, 1);
        assert_eq!(recovery.executions_lost.len(), 1, "{recovery:?}");
        let (status, text) = post(&restarted, "/v1/messages", &token, body(0)).await;
        assert_eq!(status, 401, "{text}");
        assert!(
            text.contains("the scheduler closed this execution"),
            "{text}"
        );
    });
}

/// A restarted proxy whose harness has not called yet since the restart: an `ExecutionClosed`
/// that arrives then (the scheduler finished or cancelled the execution) closes that
/// credential too, durably, so the harness's next call is refused instead of recorded after the
/// close.
#[test]
fn an_execution_closed_after_a_restart_before_its_next_call_is_closed() {
    runtime().block_on(async {
        let (_dir, config) = with_a_credentials_file();
        let start = || one_engine_state(config.clone(), Arc::new(MemorySink::default()));
        let (execution, token) = start().open_execution(None, None).expect("open");
        let sink = Arc::new(MemorySink::default());
        let restarted = one_engine_state(config.clone(), sink.clone());
        let recovery = restarted.recover([]);
        assert_eq!(recovery.credentials_open, 1);
        let closed = restarted.apply_route_event(&EventBody::ExecutionClosed {
            execution: gyre_event::ExecutionId(execution),
            status: gyre_event::CloseStatus::Completed,
        });
        assert_eq!(closed, 1, "the recovered credential is closed");
        let (status, text) = post(&restarted, "/v1/messages", &token, body(0)).await;
        assert_eq!(status, 401, "{text}");
        assert!(
            sink.events.lock().expect("sink").is_empty(),
            "nothing recorded"
        );
        // Durably: another restart still refuses it.
        let again = start();
        again.recover([]);
        let (status, text) = post(&again, "/v1/messages", &token, body(0)).await;
        assert_eq!(status, 401, "{text}");
    });
}

/// A sink that can hold a commit open: the record is written, then the commit waits until the
/// test releases it (a harness can go away meanwhile, after its record reached the log).
#[derive(Default)]
struct GatedSink {
    memory: MemorySink,
    gate: Arc<Gate>,
}

#[derive(Default)]
struct Gate {
    hold: std::sync::atomic::AtomicBool,
    arrived: tokio::sync::Notify,
    release: tokio::sync::Notify,
}

impl RecordSink for GatedSink {
    fn commit(
        &self,
        events: Vec<Event>,
    ) -> futures_util::future::BoxFuture<'static, Result<(), gyre_proxy::server::CommitFailure>>
    {
        self.memory.events.lock().expect("sink lock").extend(events);
        let held = self.gate.hold.load(std::sync::atomic::Ordering::SeqCst);
        let gate = self.gate.clone();
        Box::pin(async move {
            if held {
                gate.arrived.notify_one();
                gate.release.notified().await;
            }
            Ok(())
        })
    }

    fn describe(&self) -> String {
        "gated memory".into()
    }
}

impl GatedSink {
    /// Model-call records committed.
    fn records(&self) -> usize {
        self.memory
            .events
            .lock()
            .expect("sink lock")
            .iter()
            .filter(|event| matches!(event.body, EventBody::ModelCall(_)))
            .count()
    }

    /// Stored Responses answers committed: (id, the id it continues).
    fn stored_responses(&self) -> Vec<(String, Option<String>)> {
        self.memory
            .events
            .lock()
            .expect("sink lock")
            .iter()
            .filter_map(|event| match &event.body {
                EventBody::ResponseStored(record) => Some((
                    record.response_id.clone(),
                    record.previous_response_id.clone(),
                )),
                _ => None,
            })
            .collect()
    }
}

/// A proxy over a scripted engine recording to a gated sink.
fn gated_scripted_state(script: &str) -> (Arc<AppState>, Arc<GatedSink>) {
    gated_scripted_state_with(script, ServerConfig::default())
}

fn gated_scripted_state_with(
    script: &str,
    config: ServerConfig,
) -> (Arc<AppState>, Arc<GatedSink>) {
    use gyre_proxy::engine::{Script, ScriptedEngine, ScriptedOptions};
    let model = test_model();
    let script = Script::parse(script, None).expect("script");
    let engine = ScriptedEngine::new(
        &script,
        &model,
        &OutputFormat::test_model(),
        ScriptedOptions::default(),
    )
    .expect("engine");
    let sink = Arc::new(GatedSink::default());
    let state = AppState::new(
        config,
        model,
        OutputFormat::test_model(),
        vec![Arc::new(engine)],
        sink.clone(),
    )
    .expect("state");
    (state, sink)
}

/// Sends a call and goes away while its record is being committed: the record reaches the log,
/// the answer never reaches the harness.
async fn call_then_vanish(
    state: &Arc<AppState>,
    sink: &Arc<GatedSink>,
    path: &'static str,
    token: &str,
    body: String,
) {
    let recorded = state.metrics.recorded_count();
    sink.gate
        .hold
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let call = tokio::spawn({
        let (state, token) = (state.clone(), token.to_string());
        async move { post(&state, path, &token, body).await }
    });
    bounded(sink.gate.arrived.notified()).await;
    call.abort();
    assert!(
        call.await.is_err(),
        "the harness went away before the answer ended"
    );
    sink.gate
        .hold
        .store(false, std::sync::atomic::Ordering::SeqCst);
    sink.gate.release.notify_one();
    // The call finishes without its harness: committed, taken by the session, never delivered.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while state.metrics.recorded_count() == recorded {
        assert!(
            std::time::Instant::now() < deadline,
            "the call never finished"
        );
        tokio::task::yield_now().await;
    }
}

/// A script line: thinking, text and two parallel tool calls.
const TWO_TOOLS: &str = r#"{"agent": "main", "blocks": [{"type": "thinking", "thinking": "Two listings at once."}, {"type": "text", "text": "Looking."}, {"type": "tool_use", "id": "a", "name": "Bash", "input": {"command": "ls /a"}}, {"type": "tool_use", "id": "b", "name": "Bash", "input": {"command": "ls /b"}}]}"#;
/// A script line: the final text.
const BOTH_EMPTY: &str =
    r#"{"agent": "main", "blocks": [{"type": "text", "text": "Both are empty."}]}"#;

fn messages_body(messages: &[serde_json::Value], stream: bool) -> String {
    serde_json::json!({"model": "gyre-test", "max_tokens": 400, "stream": stream,
                       "system": "You are a test agent.", "messages": messages})
    .to_string()
}

/// A harness that re-sends a call whose answer it never received (it went away, or the proxy
/// was killed, after the record was committed) gets the committed answer, streamed or not:
/// thinking, text and both tool calls, and nothing new in the log. The engine is not asked, so
/// the next script line answers the next real turn, which extends the first call with the whole
/// replayed answer reused.
#[test]
fn a_re_sent_call_gets_its_committed_answer_again() {
    use serde_json::{json, Value};
    let script = format!("{TWO_TOOLS}\n{TWO_TOOLS}\n{BOTH_EMPTY}\n");
    runtime().block_on(async {
        let (state, sink) = gated_scripted_state(&script);
        let messages = vec![json!({"role": "user", "content": "List /a and /b."})];
        // Streamed: the re-send streams the same blocks to the end.
        let (_, streaming) = state.open_execution(None, None).expect("open");
        call_then_vanish(&state, &sink, "/v1/messages", &streaming, messages_body(&messages, true))
            .await;
        let (status, streamed) =
            post(&state, "/v1/messages", &streaming, messages_body(&messages, true)).await;
        assert_eq!(status, 200, "{streamed}");
        assert!(
            streamed.trim_end().ends_with("data: {\"type\":\"message_stop\"}"),
            "{streamed}"
        );
        assert_eq!(streamed.matches("\"type\":\"tool_use\"").count(), 2, "{streamed}");
        assert!(streamed.contains("\"type\":\"thinking\""), "{streamed}");
        // Not streamed (Claude Code's fallback after a broken stream).
        let (_, token) = state.open_execution(None, None).expect("open");
        call_then_vanish(&state, &sink, "/v1/messages", &token, messages_body(&messages, false))
            .await;
        assert_eq!(sink.records(), 2);
        let (status, answer) =
            post(&state, "/v1/messages", &token, messages_body(&messages, false)).await;
        assert_eq!(status, 200, "{answer}");
        let answer: Value = serde_json::from_str(&answer).expect("json");
        let kinds: Vec<&str> = answer["content"]
            .as_array()
            .expect("content")
            .iter()
            .map(|block| block["type"].as_str().expect("type"))
            .collect();
        assert_eq!(kinds, ["thinking", "text", "tool_use", "tool_use"], "{answer}");
        assert_eq!(answer["stop_reason"], "tool_use");
        assert_eq!(sink.records(), 2, "one record per answer");
        assert_eq!(state.metrics.replayed_count(), 2);
        // The harness goes on, sending the answer back with both results.
        let mut messages = messages;
        messages.push(json!({"role": "assistant", "content": answer["content"].clone()}));
        let results: Vec<Value> = answer["content"]
            .as_array()
            .expect("content")
            .iter()
            .filter(|block| block["type"] == "tool_use")
            .map(|block| json!({"type": "tool_result", "tool_use_id": block["id"], "content": "(empty)"}))
            .collect();
        messages.push(json!({"role": "user", "content": results}));
        let (status, next) =
            post(&state, "/v1/messages", &token, messages_body(&messages, false)).await;
        assert_eq!(status, 200, "{next}");
        let next: Value = serde_json::from_str(&next).expect("json");
        assert_eq!(next["content"][0]["text"], "Both are empty.", "the script's next line");
        let events = sink.memory.events.lock().expect("sink");
        assert_eq!(events.len(), 3);
        let (EventBody::ModelCall(first), EventBody::ModelCall(record)) =
            (&events[1].body, &events[2].body)
        else {
            panic!("model calls");
        };
        assert_eq!(record.execution, first.execution);
        assert_eq!(record.parent_call, Some(first.call), "extends the first call");
        assert_eq!(
            record.reused_prefix_tokens_count,
            (first.input_ids.len() + first.output_ids.len()) as u64,
            "the replayed answer came back as the recorded tokens"
        );
    });
}

/// An answer the harness received whole: the same question again is asked on purpose and is
/// sampled anew (a second record), not replayed.
#[test]
fn the_same_question_after_a_delivered_answer_is_sampled_anew() {
    use serde_json::json;
    runtime().block_on(async {
        let (state, sink) = gated_scripted_state(&format!("{TWO_TOOLS}\n{BOTH_EMPTY}\n"));
        let (_, token) = state.open_execution(None, None).expect("open");
        let messages = vec![json!({"role": "user", "content": "List /a and /b."})];
        let (status, first) = post(
            &state,
            "/v1/messages",
            &token,
            messages_body(&messages, false),
        )
        .await;
        assert_eq!(status, 200, "{first}");
        let (status, again) = post(
            &state,
            "/v1/messages",
            &token,
            messages_body(&messages, false),
        )
        .await;
        assert_eq!(status, 200, "{again}");
        assert!(
            again.contains("Both are empty."),
            "the script's next line: {again}"
        );
        assert_eq!(state.metrics.replayed_count(), 0);
        assert_eq!(sink.records(), 2);
    });
}

/// The same through the OpenAI APIs: a re-sent Chat Completions or Responses call whose answer
/// never reached the harness gets the committed answer (its tool call, and for Responses its
/// encrypted reasoning) and records nothing.
#[test]
fn re_sent_openai_calls_get_their_committed_answers_again() {
    use serde_json::{json, Value};
    const LINE: &str = r#"{"agent": "main", "blocks": [{"type": "thinking", "thinking": "List it."}, {"type": "tool_use", "id": "a", "name": "exec_command", "input": {"cmd": "ls"}}]}"#;
    runtime().block_on(async {
        let (state, sink) = gated_scripted_state(&format!("{LINE}\n{LINE}\n"));
        let tool = json!({"type": "function", "function": {"name": "exec_command", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}});
        let chat = json!({"model": "m", "max_tokens": 200, "tools": [tool],
                          "messages": [{"role": "user", "content": "List."}]})
        .to_string();
        let responses = json!({"model": "m", "max_output_tokens": 200, "store": false,
            "include": ["reasoning.encrypted_content"],
            "tools": [{"type": "function", "name": "exec_command", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}],
            "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "List."}]}]})
        .to_string();
        for (path, body, expected) in [
            ("/v1/chat/completions", chat, "\"tool_calls\""),
            ("/v1/responses", responses, "\"encrypted_content\""),
        ] {
            let (_, token) = state.open_execution(None, None).expect("open");
            call_then_vanish(&state, &sink, path, &token, body.clone()).await;
            let (status, again) = post(&state, path, &token, body).await;
            assert_eq!(status, 200, "{again}");
            assert!(again.contains("exec_command") && again.contains(expected), "{path}: {again}");
            let _: Value = serde_json::from_str(&again).expect("json");
        }
        assert_eq!(sink.records(), 2, "one record per execution");
        assert_eq!(state.metrics.replayed_count(), 2);
    });
}

/// A harness that stops sending its body mid-request gets 408 once the body has been idle for
/// `body_idle_timeout`; one whose connection ends before the announced body does gets 400
/// (not the 413 of an oversized body). Both in the API's shape, nothing recorded.
#[test]
fn a_stalled_or_cut_request_body_is_refused_by_what_happened() {
    use futures_util::StreamExt;
    runtime().block_on(async {
        let sink = Arc::new(MemorySink::default());
        let config = ServerConfig {
            body_idle_timeout: std::time::Duration::from_millis(200),
            ..ServerConfig::default()
        };
        let state = one_engine_state(config, sink.clone());
        let (_, token) = state.open_execution(None, None).expect("open");
        let start: Result<axum::body::Bytes, std::io::Error> = Ok(axum::body::Bytes::from_static(
            b"{\"model\": \"m\", \"max_tokens\": 8, ",
        ));
        let stalled =
            futures_util::stream::once(async { start }).chain(futures_util::stream::pending());
        let (status, error) =
            post_body(&state, "/v1/messages", &token, Body::from_stream(stalled)).await;
        let error: serde_json::Value = serde_json::from_str(&error).expect("json");
        assert_eq!(status, 408, "{error}");
        assert_eq!(error["error"]["type"], "timeout_error");
        let message = error["error"]["message"].as_str().expect("message");
        assert!(message.starts_with("the request body stalled"), "{message}");

        let start: Result<axum::body::Bytes, std::io::Error> =
            Ok(axum::body::Bytes::from_static(b"{"));
        let cut = futures_util::stream::iter([
            start,
            Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "connection closed",
            )),
        ]);
        let (status, error) = post_body(
            &state,
            "/v1/chat/completions",
            &token,
            Body::from_stream(cut),
        )
        .await;
        let error: serde_json::Value = serde_json::from_str(&error).expect("json");
        assert_eq!(status, 400, "{error}");
        let message = error["error"]["message"].as_str().expect("message");
        assert!(
            message.starts_with("the request body ended early after 1 bytes"),
            "{message}"
        );
        assert!(error["error"].get("code").is_some(), "OpenAI's shape");
        assert!(
            sink.events.lock().expect("sink").is_empty(),
            "nothing recorded"
        );
    });
}

/// Codex's freeform `apply_patch` through the proxy: the model's call of it (a patch that adds
/// a file holding the tool-call end tag as text) reaches the harness as one `custom_tool_call`
/// with the patch text, and the next turn, with Codex's `custom_tool_call` and its output in
/// history, extends the first call's record with the whole first context reused.
#[test]
fn a_freeform_tool_call_goes_out_as_custom_and_the_next_turn_extends_it() {
    use serde_json::{json, Value};
    let patch = "*** Begin Patch\n*** Add File: t.jinja\n+{{ x }}</tool_call>\n*** End Patch\n";
    let line = json!({"agent": "main", "blocks": [
        {"type": "tool_use", "id": "a", "name": "apply_patch", "input": {"input": patch}}]});
    let done = json!({"agent": "main", "blocks": [{"type": "text", "text": "Added."}]});
    let tools = json!([{"type": "custom", "name": "apply_patch", "description": "Edit files.",
        "format": {"type": "grammar", "syntax": "lark", "definition": "start: patch"}}]);
    runtime().block_on(async {
        let (state, sink) = gated_scripted_state(&format!("{line}\n{done}\n"));
        let (_, token) = state.open_execution(None, None).expect("open");
        let user = json!({"type": "message", "role": "user",
                          "content": [{"type": "input_text", "text": "Add t.jinja."}]});
        let first = json!({"model": "gpt-5.5", "max_output_tokens": 400, "stream": false,
                           "tools": tools, "input": [user]});
        let (status, answer) = post(&state, "/v1/responses", &token, first.to_string()).await;
        assert_eq!(status, 200, "{answer}");
        let answer: Value = serde_json::from_str(&answer).expect("json");
        let item = &answer["output"][0];
        assert_eq!(item["type"], "custom_tool_call", "{answer}");
        assert_eq!(item["name"], "apply_patch");
        assert_eq!(item["input"], patch);
        let call_id = item["call_id"].as_str().expect("call_id").to_string();
        let first_record = last_record(&sink);

        let second = json!({"model": "gpt-5.5", "max_output_tokens": 400, "stream": true,
            "tools": tools, "input": [user,
                {"type": "custom_tool_call", "id": item["id"], "call_id": call_id,
                 "name": "apply_patch", "input": patch, "status": "completed"},
                {"type": "custom_tool_call_output", "call_id": call_id, "output": "Success."}]});
        let (status, streamed) = post(&state, "/v1/responses", &token, second.to_string()).await;
        assert_eq!(status, 200, "{streamed}");
        assert!(streamed.contains("Added."), "{streamed}");
        let second_record = last_record(&sink);
        assert_eq!(second_record.parent_call, Some(first_record.call));
        assert_eq!(
            second_record.reused_prefix_tokens_count as usize,
            first_record.input_ids.len() + first_record.output_ids.len(),
            "the whole first context, its sampled call included, is reused"
        );
    });
}

/// An OpenAI Responses client that chains with `previous_response_id` (the Agents SDK,
/// LangChain) instead of re-sending the conversation: each request sends only its new items,
/// the proxy continues the stored response (reasoning and tool call as the client received
/// them), the record extends the previous call's with its whole context reused, and the
/// answer echoes the id it continued. An id the proxy never issued, or that of a `store:
/// false` answer, is a 400 naming `previous_response_id`, and nothing is recorded.
#[test]
fn a_chained_responses_client_extends_the_previous_call() {
    use serde_json::{json, Value};
    let script = [
        json!({"agent": "main", "blocks": [
            {"type": "thinking", "thinking": "Look first."},
            {"type": "tool_use", "id": "a", "name": "ls", "input": {"path": "."}}]}),
        json!({"agent": "main", "blocks": [{"type": "text", "text": "Two files."}]}),
        json!({"agent": "main", "blocks": [{"type": "text", "text": "Bye."}]}),
        json!({"agent": "main", "blocks": [{"type": "text", "text": "Not kept."}]}),
    ]
    .iter()
    .map(|line| format!("{line}\n"))
    .collect::<String>();
    let tools = json!([{"type": "function", "name": "ls", "description": "List files.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}]);
    runtime().block_on(async {
        let (state, sink) = gated_scripted_state(&script);
        let (_, token) = state.open_execution(None, None).expect("open");
        let first = json!({"model": "gpt-5.5", "instructions": "Be brief.", "stream": false,
                           "tools": tools, "input": "What is here?"});
        let (status, answer) = post(&state, "/v1/responses", &token, first.to_string()).await;
        assert_eq!(status, 200, "{answer}");
        let answer: Value = serde_json::from_str(&answer).expect("json");
        assert_eq!(answer["previous_response_id"], Value::Null);
        assert_eq!(answer["output"][0]["type"], "reasoning", "{answer}");
        let call = &answer["output"][1];
        assert_eq!(call["type"], "function_call", "{answer}");
        let first_id = answer["id"].as_str().expect("id").to_string();
        let first_record = last_record(&sink);

        // Streamed: the stored output is the one the stream's items closed with.
        let second = json!({"model": "gpt-5.5", "instructions": "Be brief.", "stream": true,
            "tools": tools, "previous_response_id": first_id,
            "input": [{"type": "function_call_output", "call_id": call["call_id"], "output": "a b"}]});
        let (status, streamed) = post(&state, "/v1/responses", &token, second.to_string()).await;
        assert_eq!(status, 200, "{streamed}");
        let completed: Value = streamed
            .lines()
            .filter_map(|line| line.strip_prefix("data: "))
            .filter_map(|data| serde_json::from_str::<Value>(data).ok())
            .find(|event| event["type"] == "response.completed")
            .expect("a response.completed event");
        let answer = &completed["response"];
        assert_eq!(answer["output"][0]["content"][0]["text"], "Two files.", "{answer}");
        assert_eq!(answer["previous_response_id"], first_id.as_str());
        let second_id = answer["id"].as_str().expect("id").to_string();
        let second_record = last_record(&sink);
        assert_eq!(second_record.parent_call, Some(first_record.call));
        assert_eq!(
            second_record.reused_prefix_tokens_count as usize,
            first_record.input_ids.len() + first_record.output_ids.len(),
            "the whole first context, its reasoning and call included, is reused"
        );

        // Streaming, continuing the continuation.
        let third = json!({"model": "gpt-5.5", "instructions": "Be brief.", "stream": true,
            "tools": tools, "previous_response_id": second_id, "input": "Thanks.", "store": false});
        let (status, streamed) = post(&state, "/v1/responses", &token, third.to_string()).await;
        assert_eq!(status, 200, "{streamed}");
        assert!(streamed.contains("Bye."), "{streamed}");
        assert!(
            streamed.contains(&format!("\"previous_response_id\":\"{second_id}\"")),
            "{streamed}"
        );
        let third_record = last_record(&sink);
        assert_eq!(third_record.parent_call, Some(second_record.call));
        assert_eq!(
            third_record.reused_prefix_tokens_count as usize,
            second_record.reused_prefix_tokens_count as usize
                + second_record.input_ids.len()
                + second_record.output_ids.len()
        );
        let third_id = streamed
            .split("\"id\":\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .expect("the response id")
            .to_string();
        assert!(third_id.starts_with("resp_"), "{third_id}");

        // The first answer became durable when the second continued it, the second before it
        // was handed over; the third (`store: false`) is not kept.
        assert_eq!(
            sink.stored_responses(),
            [
                (first_id.clone(), None),
                (second_id.clone(), Some(first_id.clone()))
            ]
        );
        let records = sink.memory.events.lock().expect("sink").len();
        for (id, why) in [
            (third_id.as_str(), "a store: false answer is not kept"),
            ("resp_unknown", "an id never issued"),
        ] {
            let next = json!({"model": "gpt-5.5", "stream": false, "previous_response_id": id,
                              "input": "More?"});
            let (status, error) = post(&state, "/v1/responses", &token, next.to_string()).await;
            assert_eq!(status, 400, "{why}: {error}");
            let error: Value = serde_json::from_str(&error).expect("json");
            assert_eq!(error["error"]["param"], "previous_response_id", "{why}");
            assert_eq!(error["error"]["code"], "previous_response_not_found", "{why}");
            let message = error["error"]["message"].as_str().expect("message");
            assert!(
                message.contains(&format!("Previous response with id '{id}' not found")),
                "{why}: {message}"
            );
        }
        assert_eq!(
            sink.memory.events.lock().expect("sink").len(),
            records,
            "nothing recorded for a refused call"
        );
    });
}

/// The proxy's `/metrics` text.
async fn metrics_of(state: &Arc<AppState>) -> String {
    let request = Request::get("/metrics")
        .body(Body::empty())
        .expect("request");
    let response = router(state.clone())
        .oneshot(request)
        .await
        .expect("infallible");
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .expect("body");
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The value of metric `name` (a line `name value`).
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from /metrics:\n{text}"))
}

/// The response store's bounds: a chain of turns is charged the memory it holds (each turn
/// its own items; the newest shares the rest), not each kept response's whole conversation,
/// so a budget under twice the conversation keeps every turn the client names; a
/// conversation continued past `--body-limit` is a 413, as the same conversation sent whole
/// would be.
#[test]
fn a_chain_is_charged_what_it_holds_and_ends_at_the_body_limit() {
    use serde_json::{json, Value};
    let filler = "x".repeat(600);
    let line = json!({"agent": "main", "blocks": [{"type": "text", "text": "ok"}]});
    let script: String = (0..12).map(|_| format!("{line}\n")).collect();
    let config = ServerConfig {
        response_store_bytes_max: 10_000,
        body_bytes_max: 6_000,
        ..ServerConfig::default()
    };
    runtime().block_on(async {
        let (state, sink) = gated_scripted_state_with(&script, config);
        let (_, token) = state.open_execution(None, None).expect("open");
        let mut previous: Option<String> = None;
        let mut refused = None;
        for turn in 0..12 {
            let body = json!({"model": "m", "stream": false, "previous_response_id": previous,
                              "input": format!("{turn} {filler}")});
            let (status, answer) = post(&state, "/v1/responses", &token, body.to_string()).await;
            if status == 413 {
                refused = Some((turn, answer));
                break;
            }
            assert_eq!(status, 200, "turn {turn}: {answer}");
            let answer: Value = serde_json::from_str(&answer).expect("json");
            previous = Some(answer["id"].as_str().expect("id").to_string());
        }
        let (turn, answer) = refused.expect("the conversation outgrew the body limit");
        assert!(turn >= 4, "{turn}");
        assert!(
            answer.contains("exceeds the body limit of 6000 bytes"),
            "{answer}"
        );
        let records = sink.records();
        assert_eq!(
            records, turn,
            "every answered turn recorded, the refused one not"
        );
        let metrics = metrics_of(&state).await;
        let used = metric(&metrics, "gyre_proxy_response_store_bytes");
        assert!(
            (3_000.0..=6_000.0).contains(&used),
            "the chain's own bytes, once: {used}"
        );
    });
}

/// The log refuses a call's record: the harness gets an overloaded error, and its re-send is a
/// new call sampled anew (never the answer the log does not hold), which commits.
#[test]
fn a_re_sent_call_whose_record_failed_to_commit_is_sampled_anew() {
    /// Fails the first commit, then records in memory.
    #[derive(Default)]
    struct FailsOnce {
        failed: std::sync::atomic::AtomicBool,
        events: Mutex<Vec<Event>>,
    }
    impl RecordSink for FailsOnce {
        fn commit(
            &self,
            events: Vec<Event>,
        ) -> futures_util::future::BoxFuture<'static, Result<(), gyre_proxy::server::CommitFailure>>
        {
            if !self.failed.swap(true, std::sync::atomic::Ordering::SeqCst) {
                return Box::pin(async {
                    Err(gyre_proxy::server::CommitFailure::of("the disk is full"))
                });
            }
            self.events.lock().expect("sink lock").extend(events);
            Box::pin(async { Ok(()) })
        }

        fn describe(&self) -> String {
            "fails once".into()
        }
    }
    runtime().block_on(async {
        let model = test_model();
        let end = model.token_id("<|im_end|>").expect("end token");
        let sink = Arc::new(FailsOnce::default());
        let state = AppState::new(
            ServerConfig::default(),
            model,
            OutputFormat::test_model(),
            vec![engine("e", None, end)],
            sink.clone(),
        )
        .expect("state");
        let (_, token) = state.open_execution(None, None).expect("open");
        let body = body(0).replace("\"stream\":true", "\"stream\":false");
        let (status, failed) = post(&state, "/v1/messages", &token, body.clone()).await;
        assert_eq!(status, 529, "{failed}");
        assert!(failed.contains("could not be committed"), "{failed}");
        let (status, answered) = post(&state, "/v1/messages", &token, body).await;
        assert_eq!(status, 200, "{answered}");
        assert_eq!(state.metrics.replayed_count(), 0, "nothing replayed");
        let events = sink.events.lock().expect("sink");
        assert_eq!(events.len(), 1, "the re-send is recorded");
        let EventBody::ModelCall(record) = &events[0].body else {
            panic!("a model call");
        };
        assert_eq!(
            record.parent_call, None,
            "a sibling of the failed call, not its child"
        );
    });
}

/// A script line whose text holds a stop sequence part-way.
const STOPPED: &str = r#"{"agent": "main", "blocks": [{"type": "text", "text": "The answer is 42. END of story, and more after it."}]}"#;

/// The record committed last.
fn last_record(sink: &GatedSink) -> gyre_event::ModelCallRecord {
    let events = sink.memory.events.lock().expect("sink lock");
    // The last model call (a chained Responses answer is followed by its `ResponseStored`).
    events
        .iter()
        .rev()
        .find_map(|event| match &event.body {
            EventBody::ModelCall(record) => Some((**record).clone()),
            _ => None,
        })
        .expect("a record")
}

/// Stop sequences (Anthropic `stop_sequences`, OpenAI `stop`) end the answer where the first
/// one is complete: the harness gets the text before it and the API's stop reason, the engine
/// is stopped, and the record holds every sampled token through the one that completed the
/// sequence (what the policy produced), none after. A re-send of the call whose answer never
/// arrived replays the same cut answer.
#[test]
fn stop_sequences_end_the_answer_and_its_record_there() {
    use serde_json::{json, Value};
    runtime().block_on(async {
        let (state, sink) = gated_scripted_state(&format!("{STOPPED}\n").repeat(6));
        let model = test_model();
        let messages = vec![json!({"role": "user", "content": "What is it?"})];
        let mut anthropic: Value =
            serde_json::from_str(&messages_body(&messages, false)).expect("json");
        anthropic["stop_sequences"] = json!(["NEVER", "END"]);

        let (_, token) = state.open_execution(None, None).expect("open");
        let (status, text) = post(&state, "/v1/messages", &token, anthropic.to_string()).await;
        assert_eq!(status, 200, "{text}");
        let answer: Value = serde_json::from_str(&text).expect("json");
        assert_eq!(answer["stop_reason"], "stop_sequence", "{text}");
        assert_eq!(answer["stop_sequence"], "END", "{text}");
        let content = answer["content"][0]["text"].as_str().expect("a text block");
        assert!(
            content.starts_with("The answer is 42.") && !content.contains("EN"),
            "{text}"
        );
        let record = last_record(&sink);
        let sampled = model.decode(&record.output_ids).expect("decode");
        assert!(
            sampled.starts_with("The answer is 42. ")
                && sampled.contains("END")
                && !sampled.contains("more after"),
            "the record ends with the token that completed the sequence: {sampled:?}"
        );
        assert_eq!(record.output_ids.len(), record.output_logprobs.len());
        assert_eq!(
            answer["usage"]["output_tokens"].as_u64(),
            Some(record.output_ids.len() as u64)
        );
        // The next turn sends the cut text back and extends the whole sampled answer: the
        // model's context keeps every sampled token (the stop's included), then the template.
        let mut next = anthropic.clone();
        next["messages"] = json!([
            {"role": "user", "content": "What is it?"},
            {"role": "assistant", "content": content},
            {"role": "user", "content": "And then?"},
        ]);
        let (status, text) = post(&state, "/v1/messages", &token, next.to_string()).await;
        assert_eq!(status, 200, "{text}");
        let second = last_record(&sink);
        assert_eq!(
            second.parent_call,
            Some(record.call),
            "the next turn extends the cut call"
        );
        assert_eq!(
            second.reused_prefix_tokens_count as usize,
            record.input_ids.len() + record.output_ids.len(),
            "the whole sampled answer is reused, never re-encoded"
        );

        // OpenAI Chat, streamed, `stop` as one string.
        let (_, token) = state.open_execution(None, None).expect("open");
        let chat = json!({"model": "m", "max_tokens": 200, "stream": true, "stop": "END",
                          "messages": [{"role": "user", "content": "What is it?"}]});
        let (status, text) = post(&state, "/v1/chat/completions", &token, chat.to_string()).await;
        assert_eq!(status, 200, "{text}");
        let chunks = chat_chunks(&text);
        let streamed: String = chunks
            .iter()
            .filter_map(|chunk| chunk["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert!(
            streamed.starts_with("The answer is 42.") && !streamed.contains("EN"),
            "{text}"
        );
        assert!(
            chunks
                .iter()
                .any(|chunk| chunk["choices"][0]["finish_reason"] == "stop"),
            "{text}"
        );
        assert_eq!(
            model
                .decode(&last_record(&sink).output_ids)
                .expect("decode"),
            sampled,
            "the same line cut at the same token"
        );

        // The answer never reached the harness: its re-send replays the answer cut where it
        // was cut, even when the re-send leaves the stop sequences out.
        let (_, token) = state.open_execution(None, None).expect("open");
        let mut streaming = anthropic.clone();
        streaming["stream"] = json!(true);
        call_then_vanish(&state, &sink, "/v1/messages", &token, streaming.to_string()).await;
        let records = sink.records();
        streaming
            .as_object_mut()
            .expect("an object")
            .remove("stop_sequences");
        let (status, text) = post(&state, "/v1/messages", &token, streaming.to_string()).await;
        assert_eq!(status, 200, "{text}");
        assert_eq!(state.metrics.replayed_count(), 1);
        assert_eq!(sink.records(), records, "a replay records nothing");
        let replayed: String = text
            .lines()
            .filter_map(|line| line.strip_prefix("data: "))
            .map(|data| serde_json::from_str::<Value>(data).expect("a JSON event"))
            .filter_map(|event| event["delta"]["text"].as_str().map(str::to_string))
            .collect();
        assert_eq!(replayed, content, "the same cut text");
        assert!(
            text.contains("\"stop_reason\":\"stop_sequence\"")
                && text.contains("\"stop_sequence\":\"END\""),
            "{text}"
        );

        // Bad stop lists are refused in the API's format, naming the field.
        let (_, token) = state.open_execution(None, None).expect("open");
        for (field, value, problem) in [
            (
                "stop_sequences",
                json!([""]),
                "stop_sequences[0]: a stop sequence must not be empty",
            ),
            (
                "stop_sequences",
                json!([7]),
                "stop_sequences[0]: expected a string",
            ),
            (
                "stop_sequences",
                json!(vec!["x"; 65]),
                "at most 64 stop sequences",
            ),
            (
                "stop_sequences",
                json!(["y".repeat(1025)]),
                "at most 1024 bytes",
            ),
            ("top_k", json!(0), "top_k: must be at least 1"),
        ] {
            let mut bad = anthropic.clone();
            bad[field] = value;
            let (status, text) = post(&state, "/v1/messages", &token, bad.to_string()).await;
            assert_eq!(status, 400, "{text}");
            assert!(
                text.contains("invalid_request_error") && text.contains(problem),
                "{problem}: {text}"
            );
        }
    });
}

/// OpenAI Chat `logprobs: true`: the answer lists every sampled token with its exact bytes and
/// the behaviour log-prob the record holds, in the body and on the stream's finish chunk (the
/// SDKs' accumulators gather `logprobs.content` from the chunks); `top_logprobs` above 0 is a
/// 400 naming it (the engines report the sampled token only).
#[test]
fn chat_logprobs_are_the_records_tokens_and_log_probs() {
    use serde_json::{json, Value};
    runtime().block_on(async {
        let line =
            r#"{"agent": "main", "blocks": [{"type": "text", "text": "Caf\u00e9 \u2014 ok."}]}"#;
        let (state, sink) = gated_scripted_state(&format!("{line}\n").repeat(3));
        let check = |content: &Value| {
            let record = last_record(&sink);
            let entries = content.as_array().expect("logprobs.content");
            assert_eq!(entries.len(), record.output_ids.len());
            let mut bytes = Vec::new();
            for (entry, logprob) in entries.iter().zip(&record.output_logprobs) {
                assert_eq!(entry["logprob"].as_f64(), Some(f64::from(*logprob)));
                assert_eq!(entry["top_logprobs"], json!([]));
                for byte in entry["bytes"].as_array().expect("bytes") {
                    bytes.push(byte.as_u64().expect("a byte") as u8);
                }
            }
            let text = String::from_utf8(bytes).expect("the tokens' bytes make UTF-8");
            assert_eq!(
                text,
                test_model().decode(&record.output_ids).expect("decode"),
                "the bytes are exactly the sampled text"
            );
            assert!(text.starts_with("Café — ok."), "{text}");
        };
        let (_, token) = state.open_execution(None, None).expect("open");
        let body = json!({"model": "m", "logprobs": true,
                          "messages": [{"role": "user", "content": "Hi"}]});
        let (status, text) = post(&state, "/v1/chat/completions", &token, body.to_string()).await;
        assert_eq!(status, 200, "{text}");
        let answer: Value = serde_json::from_str(&text).expect("json");
        check(&answer["choices"][0]["logprobs"]["content"]);

        let (_, token) = state.open_execution(None, None).expect("open");
        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        let (status, text) =
            post(&state, "/v1/chat/completions", &token, streamed.to_string()).await;
        assert_eq!(status, 200, "{text}");
        let chunks = chat_chunks(&text);
        let with_logprobs: Vec<&Value> = chunks
            .iter()
            .filter(|chunk| !chunk["choices"][0]["logprobs"].is_null())
            .collect();
        assert_eq!(with_logprobs.len(), 1, "{text}");
        assert_eq!(with_logprobs[0]["choices"][0]["finish_reason"], "stop");
        check(&with_logprobs[0]["choices"][0]["logprobs"]["content"]);

        let recorded = sink.records();
        let mut top = body.clone();
        top["top_logprobs"] = json!(3);
        let (status, text) = post(&state, "/v1/chat/completions", &token, top.to_string()).await;
        assert_eq!(status, 400, "{text}");
        let error: Value = serde_json::from_str(&text).expect("json");
        assert_eq!(error["error"]["param"], "top_logprobs", "{text}");
        assert_eq!(
            sink.records(),
            recorded,
            "nothing recorded for a refused call"
        );
    });
}

/// The JSON chunks of an OpenAI Chat stream (`data:` lines before `[DONE]`).
fn chat_chunks(text: &str) -> Vec<serde_json::Value> {
    text.lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .filter(|data| *data != "[DONE]")
        .map(|data| serde_json::from_str(data).expect("a JSON chunk"))
        .collect()
}

/// A call's `prepare` holds its session's lock through render and tokenize (100 ms at 128K
/// tokens). Route events, authentication and `/health` never take a session's lock: an
/// execution whose session is busy is still moved off an engine that went down, and other
/// harnesses are authenticated meanwhile.
#[test]
fn a_route_event_moves_an_execution_whose_session_is_busy() {
    let model = test_model();
    let end = model.token_id("<|im_end|>").expect("end token");
    let state = AppState::new(
        ServerConfig::default(),
        model,
        OutputFormat::test_model(),
        vec![engine("a", None, end), engine("b", None, end)],
        Arc::new(MemorySink::default()),
    )
    .expect("state");
    let (_, busy) = state.open_execution(None, Some(0)).expect("open");
    let (_, other) = state.open_execution(None, Some(0)).expect("open");
    let busy = state.execution(&busy).expect("known");
    let preparing = busy.lock();
    // All of it on this thread while the lock is held: a wait on the session would hang here.
    let moved = state.apply_route_event(&EventBody::EngineDown {
        engine: gyre_event::EngineId(0),
        reason: "test".into(),
    });
    assert_eq!(moved, 2, "both executions leave the engine that is down");
    assert_eq!(busy.engine(), 1);
    assert_eq!(state.execution(&other).expect("open").engine(), 1);
    assert_eq!(state.executions_open(), 2);
    let moved = state.apply_route_event(&EventBody::RoutesUpdated {
        source: gyre_event::EngineId(1),
        moves: vec![gyre_event::RouteMove {
            execution: busy.id(),
            from: gyre_event::EngineId(1),
            to: gyre_event::EngineId(0),
        }],
    });
    assert_eq!(moved, 1);
    assert_eq!(
        busy.engine(),
        0,
        "the busy execution's next call goes to its destination"
    );
    drop(preparing);
}
