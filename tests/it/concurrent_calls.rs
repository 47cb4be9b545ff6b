//! Calls of one execution in flight together: Claude Code's and Codex's sub-agents call while
//! the main agent's answer is still being generated. Each call's engine request must carry
//! its own id (engines refuse an id already in flight, and an abort names one request), and
//! both calls are recorded.

use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use gyre_proxy::engine::fake::{FakeOptions, FakeServer};
use gyre_proxy::engine::{ChunkStream, EngineFailure, EngineRequest, SglangEngine, TokenEngine};
use gyre_proxy::server::ServerConfig;
use serde_json::json;

use crate::in_process::{proxy_with, recording, wrapping_engine, Recording};
use crate::support::http;

/// Holds the first request it gets until released; later ones go straight through.
struct HoldFirst {
    inner: Arc<Recording>,
    received: Mutex<Option<mpsc::Sender<()>>>,
    release: Arc<tokio::sync::Notify>,
}

impl HoldFirst {
    fn hold_first_and_generate(
        &self,
        request: EngineRequest,
    ) -> futures_util::future::BoxFuture<'static, Result<ChunkStream, EngineFailure>> {
        let first = self.received.lock().expect("received lock").take();
        let release = self.release.clone();
        let answer = self.inner.generate(request);
        Box::pin(async move {
            if let Some(received) = first {
                let released = release.notified();
                let _ = received.send(());
                released.await;
            }
            answer.await
        })
    }
}

wrapping_engine!(HoldFirst, hold_first_and_generate);

#[test]
fn a_sub_agent_calls_while_the_main_agents_answer_is_generated() {
    let runtime = crate::support::runtime();
    let (received, main_held) = mpsc::channel();
    let release = Arc::new(tokio::sync::Notify::new());
    let held = Arc::new(HoldFirst {
        inner: recording(),
        received: Mutex::new(Some(received)),
        release: release.clone(),
    });
    // Through the SGLang adapter, which (as the engine does) refuses an id already in flight.
    let fake = runtime
        .block_on(FakeServer::sglang(held, FakeOptions::default()))
        .expect("the fake listens");
    let engine = Arc::new(SglangEngine::new(&fake.url(), Default::default()).expect("adapter"));
    let proxy = proxy_with(&runtime, engine, ServerConfig::default());

    let main = json!({"model": "m", "max_tokens": 16,
                      "messages": [{"role": "user", "content": "Split the work."}]});
    let sub = json!({"model": "m", "max_tokens": 16,
                     "messages": [{"role": "user", "content": "Read the tests."}]});
    let (main_answer, sub_answer) = std::thread::scope(|scope| {
        let main_call = scope.spawn(|| proxy.post("/v1/messages", &main));
        main_held
            .recv_timeout(Duration::from_secs(60))
            .expect("the main agent's call reached the engine");
        // The main call is in flight on the engine; the sub-agent calls now.
        let sub_answer = http(
            &proxy.address,
            "POST",
            "/v1/messages",
            &[
                ("content-type", "application/json"),
                ("x-api-key", &proxy.token),
                ("x-claude-code-agent-id", "agent-7"),
            ],
            &sub.to_string(),
        );
        release.notify_one();
        (main_call.join().expect("main call thread"), sub_answer)
    });
    assert_eq!(sub_answer.0, 200, "the sub-agent's call: {}", sub_answer.1);
    assert_eq!(
        main_answer.0, 200,
        "the main agent's call: {}",
        main_answer.1
    );

    let records = proxy.sink.records();
    assert_eq!(records.len(), 2, "both calls are recorded");
    let agent_of = |agent: &str| {
        records
            .iter()
            .find(|record| record.agent == agent)
            .unwrap_or_else(|| panic!("a record of agent {agent}: {records:?}"))
    };
    let (main_record, sub_record) = (agent_of("main"), agent_of("sub:agent-7"));
    assert_ne!(main_record.call, sub_record.call);
    assert!(main_record.parent_call.is_none() && sub_record.parent_call.is_none());
    assert!(!main_record.output_ids.is_empty() && !sub_record.output_ids.is_empty());
}
