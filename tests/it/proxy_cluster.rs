//! The proxy on the replicated log: a call's TITO record is committed to a three-node control
//! quorum before the harness gets its answer, every node folds it into the execution's tree, and
//! the scheduler's `RoutesUpdated` event, appended to the log, moves the execution's next call.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use gyre_control::Sequence;
use gyre_event::{CallId, EngineId, Event, EventBody, ExecutionId, RouteMove, Timestamp};
use gyre_proxy::engine::{DeterministicEngine, DeterministicOptions, TokenEngine};
use gyre_proxy::output::OutputFormat;
use gyre_proxy::server::{follow_routes, router, AppState, ControlSink, ServerConfig};
use gyre_proxy::{ChatModel, ToolArgumentsForm};
use tower::ServiceExt;

use crate::support::InProcessCluster;

/// The repository's test model and a deterministic engine factory for it.
fn model_and_engines() -> (Arc<ChatModel>, impl Fn(&str) -> Arc<dyn TokenEngine>) {
    let model = Arc::new(
        ChatModel::load(
            &gyre_proxy::test_model::directory(),
            ToolArgumentsForm::RawText,
        )
        .expect("test model"),
    );
    let end = model.token_id("<|im_end|>").expect("end token");
    let engine = move |name: &str| -> Arc<dyn TokenEngine> {
        Arc::new(DeterministicEngine::new(DeterministicOptions {
            name: name.into(),
            end_token_id: Some(end),
            ..DeterministicOptions::default()
        }))
    };
    (model, engine)
}

#[test]
fn records_commit_to_the_quorum_and_routes_follow_the_log() {
    let runtime = crate::support::runtime();
    runtime.block_on(async {
        let cluster = InProcessCluster::start().await;
        let addresses = cluster.addresses.join(",");
        let mut client = cluster.client.clone();
        let nodes = &cluster.nodes;

        let (model, engine) = model_and_engines();
        let sink = Arc::new(ControlSink::new(&addresses).expect("control sink"));
        let state = AppState::new(
            ServerConfig::default(),
            model,
            OutputFormat::test_model(),
            vec![engine("e0"), engine("e1")],
            sink,
        )
        .expect("state");
        let app = router(state.clone());
        let (execution, token) = state.open_execution(Some(77), Some(0)).expect("open");
        let call = |text: &str| {
            let request = Request::post("/v1/messages")
                .header("x-api-key", &token)
                .header("content-type", "application/json")
                .body(Body::from(
                    serde_json::json!({
                        "model": "gyre-test",
                        "max_tokens": 50,
                        "messages": [{"role": "user", "content": text}],
                    })
                    .to_string(),
                ))
                .expect("request");
            let app = app.clone();
            async move {
                let response = app.oneshot(request).await.expect("infallible");
                let status = response.status().as_u16();
                let body = axum::body::to_bytes(response.into_body(), usize::MAX)
                    .await
                    .expect("body");
                assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
            }
        };
        call("first question").await;
        // Answered means committed: the leader folded it; wait for every node to apply it.
        cluster.every_node_applied().await;
        for node in nodes {
            let present = node.raft.state_machine.with_projection(|projection, _| {
                projection
                    .state
                    .trajectories
                    .trees
                    .get(&ExecutionId(execution))
                    .and_then(|tree| tree.node_of_call(CallId(0)))
                    .is_some()
            });
            assert!(
                present,
                "node {} holds the call in execution {execution}'s tree",
                node.id
            );
        }

        // The scheduler moves the execution to engine 1 through the log.
        let mut applied = state.routes_applied();
        let follower = tokio::spawn(follow_routes(
            state.clone(),
            addresses.clone(),
            Some(Sequence {
                index: 1,
                position: 0,
            }),
        ));
        client
            .append(&[Event::new(
                Timestamp::ZERO,
                EventBody::RoutesUpdated {
                    source: EngineId(0),
                    moves: vec![RouteMove {
                        execution: ExecutionId(execution),
                        from: EngineId(0),
                        to: EngineId(1),
                    }],
                },
            )])
            .await
            .expect("route appended");
        tokio::time::timeout(
            Duration::from_secs(30),
            applied.wait_for(|count| *count >= 1),
        )
        .await
        .expect("the route event reaches the proxy")
        .expect("watch");
        assert_eq!(state.execution(&token).expect("open").engine(), 1);
        call("second question").await;
        follower.abort();
        cluster.shutdown().await;
    });
}

/// Two proxies record to one quorum and number their own executions: with one stride and
/// distinct offsets (`--execution-stride 2 --execution-offset 0|1`) their ids interleave and
/// never collide, so every tree on every node holds exactly one proxy's calls.
#[test]
fn proxies_sharing_a_quorum_number_executions_apart() {
    use gyre_proxy::server::ExecutionNumbering;
    let runtime = crate::support::runtime();
    runtime.block_on(async {
        let cluster = InProcessCluster::start().await;
        let addresses = cluster.addresses.join(",");
        let (model, engine) = model_and_engines();
        let proxy = |offset: u64| {
            AppState::new(
                ServerConfig {
                    numbering: ExecutionNumbering::new(2, offset).expect("numbering"),
                    ..ServerConfig::default()
                },
                model.clone(),
                OutputFormat::test_model(),
                vec![engine(&format!("e{offset}"))],
                Arc::new(ControlSink::new(&addresses).expect("control sink")),
            )
            .expect("state")
        };
        let proxies = [proxy(1), proxy(0)];
        let mut opened = Vec::new();
        for (index, state) in proxies.iter().enumerate() {
            for _ in 0..2 {
                let (execution, token) = state.open_execution(None, None).expect("open");
                let request = Request::post("/v1/messages")
                    .header("x-api-key", &token)
                    .header("content-type", "application/json")
                    .body(Body::from(
                        serde_json::json!({
                            "model": "gyre-test",
                            "max_tokens": 20,
                            "messages": [{"role": "user", "content": format!("from proxy {index}")}],
                        })
                        .to_string(),
                    ))
                    .expect("request");
                let response = router(state.clone())
                    .oneshot(request)
                    .await
                    .expect("infallible");
                assert_eq!(response.status().as_u16(), 200);
                opened.push(execution);
            }
        }
        assert_eq!(opened, [1, 3, 2, 4], "odd ids from offset 1, even from offset 0");
        cluster.every_node_applied().await;
        for node in &cluster.nodes {
            let sizes: Vec<(u64, usize)> = node.raft.state_machine.with_projection(|projection, _| {
                projection
                    .state
                    .trajectories
                    .trees
                    .iter()
                    .map(|(id, tree)| (id.get(), tree.len()))
                    .collect()
            });
            assert_eq!(
                sizes,
                [(1, 1), (2, 1), (3, 1), (4, 1)],
                "node {}: one call in each execution, none refused",
                node.id
            );
        }
        cluster.shutdown().await;
    });
}

/// A retried append can commit a record twice over (the first attempt committed, its answer
/// was lost with a leader or a connection): the log refuses the second as already recorded, and
/// the sink reads the record back and accepts, since the log holds exactly that record. A
/// different record under the same call id stays an error.
#[test]
fn a_record_the_log_already_holds_commits_and_a_conflicting_one_does_not() {
    use gyre_event::{CallKind, Duration as EventDuration, ModelCallRecord, PolicyVersion};
    use gyre_event::{Provenance, ProvenanceSpan};
    use gyre_proxy::server::RecordSink;

    let runtime = crate::support::runtime();
    runtime.block_on(async {
        let cluster = InProcessCluster::start().await;
        let sink = ControlSink::new(&cluster.addresses.join(",")).expect("control sink");
        let record = ModelCallRecord {
            execution: ExecutionId(91),
            call: CallId(0),
            agent: "main".into(),
            kind: CallKind::Turn,
            parent_call: None,
            reused_prefix_tokens_count: 0,
            spawned_by: None,
            input_ids: vec![1, 2, 3],
            input_provenance: vec![ProvenanceSpan {
                provenance: Provenance::User,
                tokens_count: 3,
            }],
            output_ids: vec![4, 5],
            output_logprobs: vec![-0.5, -0.25],
            engine: EngineId(0),
            policy_version: PolicyVersion(0),
            requested_at: Timestamp(5),
            first_token_after: EventDuration(6),
            completed_after: EventDuration(7),
            stop_sequences: vec!["\nObservation:".into()],
            output_constraint: None,
            sampling: gyre_event::SamplingSettings::POLICY,
        };
        let event = |record: &ModelCallRecord| {
            vec![Event::new(
                Timestamp::ZERO,
                EventBody::ModelCall(Box::new(record.clone())),
            )]
        };
        sink.commit(event(&record)).await.expect("first commit");
        sink.commit(event(&record))
            .await
            .expect("the same record again: already in the log, accepted");
        // The tree a node answers from keeps neither the answer format's schema nor the
        // sampling settings: a record that has them is still the one the log holds.
        let mut structured = record.clone();
        structured.call = CallId(1);
        structured.parent_call = Some(CallId(0));
        structured.reused_prefix_tokens_count = 5;
        structured.output_constraint = Some(gyre_event::OutputConstraint {
            schema: Some(r#"{"type":"object"}"#.into()),
            enforced: true,
            constrained_tokens: 2,
        });
        structured.sampling = gyre_event::SamplingSettings {
            temperature: 0.7,
            top_p: 0.9,
            top_k: Some(40),
        };
        sink.commit(event(&structured)).await.expect("first commit");
        sink.commit(event(&structured))
            .await
            .expect("a structured, harness-sampled record again: accepted");
        let mut other = record.clone();
        other.output_ids = vec![4, 6];
        let refused = sink
            .commit(event(&other))
            .await
            .expect_err("a different record under the same call id");
        assert!(
            refused.message.contains("already recorded")
                && refused.message.contains("a different record"),
            "{refused}"
        );
        assert_eq!(refused.durable, Vec::<usize>::new(), "nothing of it folded");
        cluster.shutdown().await;
    });
}

/// A quorum restarted after snapshotting and purging past an execution's records restores
/// that execution's tree from snapshot format 3, stop sequences included: every node's
/// `ReadExecution` (what a restarted proxy rebuilds its session from) gives back the calls as
/// they were recorded, and the nodes agree on the projection's digest.
#[test]
fn a_restarted_quorum_restores_stop_sequences_from_its_snapshots() {
    use gyre_event::{CallKind, Duration as EventDuration, ModelCallRecord, PolicyVersion};
    use gyre_event::{Provenance, ProvenanceSpan};

    let runtime = crate::support::runtime();
    runtime.block_on(async {
        let mut cluster = InProcessCluster::start_with(|options| {
            options.snapshot_every_entries = 4;
            options.entries_kept_behind_snapshot = 0;
        })
        .await;
        let call = |call: u64, parent: Option<u64>, stops: &[&str]| {
            let reused = if parent.is_some() { 5 * call } else { 0 };
            ModelCallRecord {
                execution: ExecutionId(92),
                call: CallId(call),
                agent: "main".into(),
                kind: CallKind::Turn,
                parent_call: parent.map(CallId),
                reused_prefix_tokens_count: reused,
                spawned_by: None,
                input_ids: vec![10 + call as u32, 11, 12],
                input_provenance: vec![ProvenanceSpan {
                    provenance: Provenance::User,
                    tokens_count: 3,
                }],
                output_ids: vec![20 + call as u32, 21],
                output_logprobs: vec![-0.5, -0.25],
                engine: EngineId(0),
                policy_version: PolicyVersion(0),
                requested_at: Timestamp(5),
                first_token_after: EventDuration(6),
                completed_after: EventDuration(7),
                stop_sequences: stops.iter().map(|stop| stop.to_string()).collect(),
                output_constraint: None,
                sampling: gyre_event::SamplingSettings::POLICY,
            }
        };
        let recorded = [
            call(0, None, &["\nObservation:", "</answer>"]),
            call(1, Some(0), &[]),
            call(2, Some(1), &["STOP"]),
        ];
        let mut client = cluster.client.clone();
        let mut last = 0;
        for record in &recorded {
            let (sequences, refused) = client
                .append(&[Event::new(
                    Timestamp::ZERO,
                    EventBody::ModelCall(Box::new(record.clone())),
                )])
                .await
                .expect("appends");
            assert!(refused.iter().all(String::is_empty), "{refused:?}");
            last = sequences[0].index;
        }
        cluster.purge_past(last).await;

        cluster.restart_all().await;
        cluster.every_node_applied().await;
        let mut digests = std::collections::BTreeSet::new();
        for address in cluster.addresses.clone() {
            let (events, _) = client
                .read_execution(&address, 92)
                .await
                .expect("the tree reads");
            let read: Vec<ModelCallRecord> = events
                .into_iter()
                .map(|event| match event.body {
                    EventBody::ModelCall(record) => *record,
                    other => panic!("a model call, not {other:?}"),
                })
                .collect();
            assert_eq!(read.len(), recorded.len(), "{address}: every call");
            for (got, want) in read.iter().zip(&recorded) {
                assert_eq!(
                    (
                        got.call,
                        got.parent_call,
                        &got.input_ids,
                        &got.output_ids,
                        &got.stop_sequences
                    ),
                    (
                        want.call,
                        want.parent_call,
                        &want.input_ids,
                        &want.output_ids,
                        &want.stop_sequences
                    ),
                    "{address}: the call as recorded"
                );
            }
            let status = client.status_of(&address).await.expect("status");
            assert!(
                status.purged_index >= last,
                "{address} restarted from a snapshot past the records"
            );
            digests.insert((status.last_applied_index, status.digest_hex));
        }
        let applied: std::collections::BTreeSet<u64> = digests.iter().map(|(at, _)| *at).collect();
        if applied.len() == 1 {
            assert_eq!(
                digests.len(),
                1,
                "equal digests at equal index: {digests:?}"
            );
        }
        cluster.shutdown().await;
    });
}

/// A quorum folds an entry's events one by one: a call's record can be folded while the stored
/// turn committed beside it is refused. The proxy's tree then takes the record all the same
/// (the tree and the log never disagree): the call fails as overloaded, the harness's re-send
/// is answered from the record (not sampled again), its turn is committed then, and the thread
/// goes on.
#[test]
fn a_record_folded_beside_a_refused_turn_is_answered_again_from_the_log() {
    /// The quorum's sink, but the first stored turn that continues another is sent naming a
    /// response the log never held (so the quorum refuses it and folds the record).
    struct RefusesOneTurn {
        sink: ControlSink,
        refused: std::sync::atomic::AtomicBool,
    }
    impl gyre_proxy::server::RecordSink for RefusesOneTurn {
        fn commit(
            &self,
            mut events: Vec<Event>,
        ) -> futures_util::future::BoxFuture<'static, Result<(), gyre_proxy::server::CommitFailure>>
        {
            for event in &mut events {
                if let EventBody::ResponseStored(turn) = &mut event.body {
                    if turn.previous_response_id.is_some()
                        && !self.refused.swap(true, std::sync::atomic::Ordering::SeqCst)
                    {
                        turn.previous_response_id = Some("msg_never_stored".into());
                    }
                }
            }
            self.sink.commit(events)
        }

        fn describe(&self) -> String {
            self.sink.describe()
        }
    }
    let runtime = crate::support::runtime();
    runtime.block_on(async {
        let cluster = InProcessCluster::start().await;
        let (model, engine) = model_and_engines();
        let sink = Arc::new(RefusesOneTurn {
            sink: ControlSink::new(&cluster.addresses.join(",")).expect("control sink"),
            refused: std::sync::atomic::AtomicBool::new(false),
        });
        let state = AppState::new(
            ServerConfig::default(),
            model,
            OutputFormat::test_model(),
            vec![engine("e0")],
            sink,
        )
        .expect("state");
        let (execution, token) = state.open_execution(None, None).expect("open");
        let app = router(state.clone());
        let post = |body: serde_json::Value| {
            let request = Request::post("/v1/messages")
                .header("x-api-key", &token)
                .header("content-type", "application/json")
                .body(Body::from(body.to_string()))
                .expect("request");
            let app = app.clone();
            async move {
                let response = tokio::time::timeout(Duration::from_secs(60), app.oneshot(request))
                    .await
                    .expect("answered within 60 s")
                    .expect("infallible");
                let status = response.status().as_u16();
                let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
                    .await
                    .expect("body");
                (
                    status,
                    serde_json::from_slice::<serde_json::Value>(&bytes).expect("JSON"),
                )
            }
        };
        let (status, first) = post(serde_json::json!({"model": "m", "max_tokens": 16,
            "messages": [{"role": "user", "content": "Count."}], "thread": {"type": "create"}}))
        .await;
        assert_eq!(status, 200, "{first}");
        let next = serde_json::json!({"model": "m", "max_tokens": 16,
            "messages": [{"role": "user", "content": "Again."}],
            "thread": {"type": "continue", "previous_message_id": first["id"]}});
        let (status, failed) = post(next.clone()).await;
        assert_eq!(status, 529, "{failed}");
        let (status, second) = post(next).await;
        assert_eq!(status, 200, "the re-send is answered: {second}");
        assert_eq!(state.metrics.replayed_count(), 1, "from the folded record");
        let (status, third) = post(serde_json::json!({"model": "m", "max_tokens": 16,
            "messages": [{"role": "user", "content": "Once more."}],
            "thread": {"type": "continue", "previous_message_id": second["id"]}}))
        .await;
        assert_eq!(status, 200, "the thread goes on: {third}");
        // The log holds one record per prompt: nothing sampled twice.
        let mut client = cluster.client.clone();
        let (events, _) = client
            .read_execution(&cluster.addresses[0], execution)
            .await
            .expect("read");
        let calls = events
            .iter()
            .filter(|event| matches!(event.body, EventBody::ModelCall(_)))
            .count();
        assert_eq!(calls, 3, "{events:?}");
        cluster.shutdown().await;
    });
}
