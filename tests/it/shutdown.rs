//! Graceful stops.
//!
//! A control node stops promptly whatever its peers do. The last node of a quorum, left alone
//! with a write in flight that can never commit (no quorum), shuts down within a bound, and
//! the write is refused, never acknowledged. Before the fix, its shutdown waited forever for
//! the proposer's commit (`deploy/local/quorum.sh stop` timed out on the last node).
//!
//! A stopping proxy finishes the answer a Responses WebSocket is serving (recorded, then
//! `response.completed`) and closes every socket with 1001 (going away) before it returns.
//! Before the fix the server returned with sockets open and the process exited under them,
//! cutting an answer in flight.

use std::time::Duration;

use gyre_control::ClusterClient;
use gyre_event::{Event, EventBody, Timestamp};

use crate::support::InProcessCluster;

#[test]
fn the_last_node_stops_with_a_write_in_flight() {
    let runtime = crate::support::runtime();
    runtime.block_on(async {
        let cluster = InProcessCluster::start().await;
        let leader = cluster.leader_id().await;
        let InProcessCluster {
            _dir,
            nodes,
            addresses,
            ..
        } = cluster;
        let mut leader_node = None;
        for node in nodes {
            if node.id == leader {
                leader_node = Some(node);
            } else {
                node.shutdown().await.expect("a follower stops");
            }
        }
        let leader_node = leader_node.expect("the leader is one of the nodes");
        let address = addresses[usize::try_from(leader - 1).unwrap()].clone();
        let before = leader_node.raft.raft.metrics().borrow().last_log_index;

        // A write the leader appends but can never commit.
        let mut client = ClusterClient::new(&address).expect("client");
        client.retry_deadline = Duration::from_secs(2);
        let write = tokio::spawn(async move {
            client
                .append(&[Event::new(Timestamp::ZERO, EventBody::Tick)])
                .await
        });
        leader_node
            .raft
            .raft
            .wait(Some(Duration::from_secs(20)))
            .metrics(
                |metrics| metrics.last_log_index > before,
                "the leader appends the write",
            )
            .await
            .expect("the write reaches the leader's log");

        tokio::time::timeout(Duration::from_secs(15), leader_node.shutdown())
            .await
            .expect("the last node stops within 15 s (its server drain is 5 s)")
            .expect("a clean shutdown");
        let outcome = tokio::time::timeout(Duration::from_secs(15), write)
            .await
            .expect("the writer hears back")
            .expect("the writer task");
        assert!(
            outcome.is_err(),
            "a write without a quorum is never acknowledged: {outcome:?}"
        );
    });
}

/// An engine that tells the test when a generation starts and holds it until the test lets
/// it go: an answer provably in flight while the proxy stops.
struct GatedEngine {
    inner: std::sync::Arc<dyn gyre_proxy::engine::TokenEngine>,
    started: std::sync::Mutex<std::sync::mpsc::Sender<()>>,
    gate: std::sync::Arc<tokio::sync::Semaphore>,
}

impl GatedEngine {
    fn gate_and_generate(
        &self,
        request: gyre_proxy::engine::EngineRequest,
    ) -> futures_util::future::BoxFuture<
        'static,
        Result<gyre_proxy::engine::ChunkStream, gyre_proxy::engine::EngineFailure>,
    > {
        let _ = self.started.lock().expect("started lock").send(());
        let inner = self.inner.clone();
        let gate = self.gate.clone();
        Box::pin(async move {
            gate.acquire().await.expect("gate open").forget();
            inner.generate(request).await
        })
    }
}

crate::in_process::wrapping_engine!(GatedEngine, gate_and_generate);

#[test]
fn a_stopping_proxy_finishes_the_answer_on_a_socket_then_closes_it_going_away() {
    use std::sync::Arc;
    use tungstenite::protocol::frame::coding::CloseCode;
    use tungstenite::Message;

    let runtime = crate::support::runtime();
    let model = Arc::new(
        gyre_proxy::ChatModel::load(
            &gyre_proxy::test_model::directory(),
            gyre_proxy::ToolArgumentsForm::RawText,
        )
        .expect("test model"),
    );
    let end = model.token_id("<|im_end|>").expect("end token");
    let (started, generation_started) = std::sync::mpsc::channel();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let engine = GatedEngine {
        inner: Arc::new(gyre_proxy::engine::DeterministicEngine::new(
            gyre_proxy::engine::DeterministicOptions {
                output_tokens: 24,
                end_token_id: Some(end),
                ..Default::default()
            },
        )),
        started: std::sync::Mutex::new(started),
        gate: gate.clone(),
    };
    let sink = Arc::new(crate::support::MemorySink::default());
    let state = gyre_proxy::server::AppState::new(
        gyre_proxy::server::ServerConfig::default(),
        model,
        gyre_proxy::output::OutputFormat::test_model(),
        vec![Arc::new(engine)],
        sink.clone(),
    )
    .expect("state");
    let (_, token) = state.open_execution(None, None).expect("open");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (address, server) = runtime
        .block_on(gyre_proxy::server::serve(
            state.clone(),
            "127.0.0.1:0".parse().expect("address"),
            async move {
                let _ = stopped.await;
            },
        ))
        .expect("serving");
    let url = format!("ws://{address}/x/{token}/v1/responses");

    // One socket with an answer in flight, one idle.
    let (mut busy, _) = tungstenite::connect(&url).expect("the socket opens");
    let (mut idle, _) = tungstenite::connect(&url).expect("the socket opens");
    busy.send(Message::text(
        serde_json::json!({
            "type": "response.create", "model": "m", "store": false,
            "input": [{"role": "user", "content": "hello"}],
        })
        .to_string(),
    ))
    .expect("sent");
    generation_started
        .recv_timeout(Duration::from_secs(60))
        .expect("the engine receives the call");

    stop.send(()).expect("the server is running");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !state.stopping() {
        assert!(std::time::Instant::now() < deadline, "the stop never began");
        std::thread::yield_now();
    }
    // The idle socket is closed going away at once.
    let close_code = |socket: &mut tungstenite::WebSocket<_>| loop {
        match socket.read().expect("a message before the close") {
            Message::Close(frame) => return frame.map(|frame| frame.code),
            Message::Text(text) => panic!("an event after the stop: {text}"),
            _ => continue,
        }
    };
    assert_eq!(close_code(&mut idle), Some(CloseCode::Away));

    // The busy socket's answer completes, then the socket closes going away.
    gate.add_permits(1);
    let mut events = Vec::new();
    let close = loop {
        match busy.read().expect("an event") {
            Message::Text(text) => {
                let event: serde_json::Value = serde_json::from_str(&text).expect("JSON event");
                events.push(event["type"].as_str().expect("type").to_string());
            }
            Message::Close(frame) => break frame.map(|frame| frame.code),
            _ => {}
        }
    };
    assert_eq!(events.first().map(String::as_str), Some("response.created"));
    assert_eq!(
        events.last().map(String::as_str),
        Some("response.completed"),
        "{events:?}"
    );
    assert_eq!(close, Some(CloseCode::Away));
    // Both clients answer the close; the server then returns.
    let _ = busy.flush();
    let _ = idle.flush();
    runtime
        .block_on(async { tokio::time::timeout(Duration::from_secs(30), server).await })
        .expect("the server returns once its sockets closed")
        .expect("the server task")
        .expect("a clean stop");
    let records = sink
        .events
        .lock()
        .expect("sink lock")
        .iter()
        .filter(|event| matches!(event.body, EventBody::ModelCall(_)))
        .count();
    assert_eq!(records, 1, "the answer in flight was recorded once");
    assert_eq!(state.metrics.websockets_open(), 0);
}
