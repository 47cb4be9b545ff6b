//! The engine conformance suite (STYLE.md rule 13): the same cases against the scripted engine
//! called directly, the SGLang adapter in front of a fake SGLang (cumulative and incremental
//! streaming) and the vLLM adapter in front of a fake vLLM, all backed by the same script.
//! Tokens and log-probs must equal the backing engine's exactly, whatever the wire format.

use std::sync::Arc;

use gyre_proxy::engine::fake::{FakeFault, FakeOptions, FakeServer};
use gyre_proxy::engine::{
    collect, playback_logprob, DeterministicEngine, DeterministicOptions, EngineChunk,
    EngineFailure, EngineRequest, Fault, FinishKind, PlaybackOptions, ScriptedEngine, SglangConfig,
    SglangEngine, TokenEngine, VllmConfig, VllmEngine,
};

use crate::engine_support::{options, request, scripted, with_logprobs, within, SCRIPT};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Direct,
    SglangCumulative,
    SglangIncremental,
    Vllm,
}

const KINDS: [Kind; 4] = [
    Kind::Direct,
    Kind::SglangCumulative,
    Kind::SglangIncremental,
    Kind::Vllm,
];

struct Setup {
    engine: Arc<dyn TokenEngine>,
    vllm: Option<VllmEngine>,
    fake: Option<FakeServer>,
}

async fn setup_with(kind: Kind, backing: Arc<dyn TokenEngine>) -> Setup {
    let incremental = kind == Kind::SglangIncremental;
    let fake_options = FakeOptions {
        incremental_streaming_output: incremental,
        ..FakeOptions::default()
    };
    match kind {
        Kind::Direct => Setup {
            engine: backing,
            vllm: None,
            fake: None,
        },
        Kind::SglangCumulative | Kind::SglangIncremental => {
            let fake = FakeServer::sglang(backing, fake_options)
                .await
                .expect("the fake binds");
            let config = SglangConfig {
                incremental_streaming_output: incremental,
                ..SglangConfig::default()
            };
            let engine = SglangEngine::new(&fake.address().to_string(), config).expect("valid");
            assert_eq!(engine.name(), format!("sglang@{}", fake.address()));
            Setup {
                engine: Arc::new(engine),
                vllm: None,
                fake: Some(fake),
            }
        }
        Kind::Vllm => {
            let fake = FakeServer::vllm(backing, fake_options)
                .await
                .expect("the fake binds");
            let engine = VllmEngine::new(&fake.url(), VllmConfig::default()).expect("valid");
            assert_eq!(engine.name(), format!("vllm@{}", fake.address()));
            Setup {
                engine: Arc::new(engine.clone()),
                vllm: Some(engine),
                fake: Some(fake),
            }
        }
    }
}

async fn setup(kind: Kind) -> (Setup, ScriptedEngine) {
    let scripted = scripted(SCRIPT, options("scripted"));
    (setup_with(kind, Arc::new(scripted.clone())).await, scripted)
}

impl Setup {
    fn set_policy_version(&self, scripted: &ScriptedEngine, version: u64) {
        scripted.set_policy_version(version);
        if let Some(vllm) = &self.vllm {
            vllm.set_policy_version(version);
        }
    }

    /// The engine dies after `tokens` tokens of the next request.
    fn inject_death(&self, scripted: &ScriptedEngine, tokens: u32) {
        match &self.fake {
            Some(fake) => fake.inject(FakeFault::CutAfterTokens(tokens)),
            None => scripted.inject(Fault::DieAfterTokens(tokens)),
        }
    }
}

#[tokio::test]
async fn streams_equal_the_backing_engine() {
    for kind in KINDS {
        let (setup, scripted) = setup(kind).await;
        setup.set_policy_version(&scripted, 7);
        for (index, agent) in [Some("main"), Some("sub"), None, None]
            .into_iter()
            .enumerate()
        {
            let expected = with_logprobs(&scripted.peek_ids(agent.unwrap_or("main")));
            let stream = within(setup.engine.generate(request(&format!("r{index}"), agent)))
                .await
                .expect("starts");
            let collected = within(collect(stream)).await;
            assert_eq!(
                (collected.ids.clone(), collected.logprobs.clone()),
                expected,
                "{kind:?} line {index}"
            );
            assert_eq!(collected.end, Some(Ok((FinishKind::Stop, 7))), "{kind:?}");
            assert_eq!(
                collected.chunks_count,
                expected.0.len().div_ceil(3),
                "{kind:?}: one delta per backing chunk"
            );
        }
        within(scripted.wait_idle()).await;
        assert_eq!(
            (scripted.remaining("main"), scripted.remaining("sub")),
            (0, 0)
        );
    }
}

#[tokio::test]
async fn max_new_tokens_ends_with_length() {
    for kind in KINDS {
        let (setup, scripted) = setup(kind).await;
        let full = scripted.peek_ids("main");
        let mut limited = request("r1", None);
        limited.max_new_tokens = 7;
        let collected = within(collect(
            setup.engine.generate(limited).await.expect("starts"),
        ))
        .await;
        assert_eq!(
            (collected.ids.clone(), collected.logprobs.clone()),
            with_logprobs(&full[..7])
        );
        assert_eq!(collected.finish(), Some(FinishKind::Length), "{kind:?}");
    }
}

#[tokio::test]
async fn abort_mid_stream_returns_the_partial_output() {
    for kind in KINDS {
        let (setup, scripted) = setup(kind).await;
        let full = scripted.peek_ids("main");
        scripted.inject(Fault::StallAfterTokens(6));
        let mut stream = setup
            .engine
            .generate(request("r1", None))
            .await
            .expect("starts");
        let Some(Ok(EngineChunk::Tokens { mut ids, .. })) = within(stream.recv()).await else {
            panic!("{kind:?}: the first chunk arrives");
        };
        within(setup.engine.abort("r1"))
            .await
            .expect("abort is accepted");
        let rest = within(collect(stream)).await;
        ids.extend_from_slice(&rest.ids);
        assert!(
            (3..=6).contains(&ids.len()) && ids == full[..ids.len()],
            "{kind:?}: {ids:?}"
        );
        assert_eq!(
            rest.finish(),
            Some(FinishKind::Abort),
            "{kind:?}: {:?}",
            rest.end
        );
        within(scripted.wait_idle()).await;
        assert_eq!(
            scripted.remaining("main"),
            2,
            "{kind:?}: the line is given back"
        );
        if let Some(fake) = &setup.fake {
            assert_eq!(fake.stats().abort_requests, 1, "{kind:?}");
        }
        // The retry replays the line in full.
        let retried = within(collect(
            setup
                .engine
                .generate(request("r2", None))
                .await
                .expect("starts"),
        ))
        .await;
        assert_eq!(
            (retried.ids, retried.logprobs),
            with_logprobs(&full),
            "{kind:?}"
        );
    }
}

#[tokio::test]
async fn dropping_the_stream_cancels_the_request() {
    for kind in KINDS {
        let (setup, scripted) = setup(kind).await;
        scripted.inject(Fault::StallAfterTokens(6));
        let mut stream = setup
            .engine
            .generate(request("r1", None))
            .await
            .expect("starts");
        assert!(matches!(
            within(stream.recv()).await,
            Some(Ok(EngineChunk::Tokens { .. }))
        ));
        drop(stream);
        within(scripted.wait_idle()).await;
        assert_eq!(scripted.remaining("main"), 2, "{kind:?}");
        if let Some(fake) = &setup.fake {
            // The adapter also tells the engine explicitly.
            within(fake.wait_for_stats(|stats| stats.abort_requests >= 1)).await;
        }
    }
}

#[tokio::test]
async fn an_engine_dying_mid_stream_is_unreachable() {
    for kind in KINDS {
        let (setup, scripted) = setup(kind).await;
        let full = scripted.peek_ids("main");
        setup.inject_death(&scripted, 4);
        let collected = within(collect(
            setup
                .engine
                .generate(request("r1", None))
                .await
                .expect("starts"),
        ))
        .await;
        assert_eq!(collected.ids, full[..4], "{kind:?}");
        match collected.failure() {
            Some(failure @ EngineFailure::Unreachable { engine, .. }) => {
                assert_eq!(engine, setup.engine.name(), "{kind:?}");
                assert!(failure.is_retryable());
            }
            other => panic!("{kind:?}: expected Unreachable, got {other:?}"),
        }
        within(scripted.wait_idle()).await;
        assert_eq!(
            scripted.remaining("main"),
            2,
            "{kind:?}: the line is given back"
        );
        if let Some(fake) = &setup.fake {
            assert_eq!(fake.stats().streams_cut, 1);
        }
    }
}

#[tokio::test]
async fn an_engine_abort_is_a_finish() {
    for kind in KINDS {
        let (setup, scripted) = setup(kind).await;
        let full = scripted.peek_ids("main");
        scripted.inject(Fault::AbortAfterTokens(6));
        let collected = within(collect(
            setup
                .engine
                .generate(request("r1", None))
                .await
                .expect("starts"),
        ))
        .await;
        assert_eq!(collected.ids, full[..6], "{kind:?}");
        assert_eq!(collected.finish(), Some(FinishKind::Abort), "{kind:?}");
    }
}

#[tokio::test]
async fn rids_in_flight_are_unique() {
    for kind in KINDS {
        let (setup, scripted) = setup(kind).await;
        scripted.inject(Fault::StallAfterTokens(3));
        let stream = setup
            .engine
            .generate(request("r1", None))
            .await
            .expect("starts");
        let duplicate = setup
            .engine
            .generate(request("r1", None))
            .await
            .expect_err("r1 is in flight");
        assert!(
            matches!(&duplicate, EngineFailure::Rejected { .. }),
            "{kind:?}: {duplicate}"
        );
        assert!(!duplicate.is_retryable());
        let empty = setup
            .engine
            .generate(EngineRequest::new("r2", Vec::new(), 4))
            .await
            .expect_err("an empty prompt");
        assert!(matches!(empty, EngineFailure::Rejected { .. }), "{kind:?}");
        setup.engine.abort("r1").await.expect("abort is accepted");
        assert_eq!(
            within(collect(stream)).await.finish(),
            Some(FinishKind::Abort)
        );
        // The rid is free again.
        let again = within(collect(
            setup
                .engine
                .generate(request("r1", None))
                .await
                .expect("starts"),
        ))
        .await;
        assert_eq!(again.finish(), Some(FinishKind::Stop), "{kind:?}");
        setup.engine.health().await.expect("healthy");
    }
}

#[tokio::test]
async fn a_killed_engine_is_unreachable() {
    for kind in [Kind::SglangCumulative, Kind::Vllm] {
        let (setup, scripted) = setup(kind).await;
        let fake = setup.fake.as_ref().expect("an HTTP kind");
        setup.engine.health().await.expect("healthy while alive");
        assert_eq!(fake.stats().health_requests, 1);
        scripted.inject(Fault::StallAfterTokens(6));
        let mut stream = setup
            .engine
            .generate(request("r1", None))
            .await
            .expect("starts");
        assert!(matches!(
            within(stream.recv()).await,
            Some(Ok(EngineChunk::Tokens { .. }))
        ));
        fake.kill();
        let rest = within(collect(stream)).await;
        assert!(
            matches!(rest.failure(), Some(EngineFailure::Unreachable { .. })),
            "{kind:?}: {:?}",
            rest.end
        );
        let refused = within(setup.engine.generate(request("r2", None)))
            .await
            .expect_err("nothing listens");
        assert!(
            matches!(refused, EngineFailure::Unreachable { .. }),
            "{kind:?}: {refused}"
        );
        let health = within(setup.engine.health())
            .await
            .expect_err("nothing listens");
        assert!(
            matches!(health, EngineFailure::Unreachable { .. }),
            "{kind:?}: {health}"
        );
        within(scripted.wait_idle()).await;
        assert_eq!(scripted.remaining("main"), 2);
    }
}

#[tokio::test]
async fn concurrent_streams_stay_separate() {
    let deterministic = DeterministicEngine::new(DeterministicOptions {
        output_tokens: 40,
        end_token_id: Some(2),
        playback: PlaybackOptions {
            chunk_tokens: 5,
            ..PlaybackOptions::default()
        },
        ..DeterministicOptions::default()
    });
    for kind in KINDS {
        let setup = setup_with(kind, Arc::new(deterministic.clone())).await;
        let mut tasks = Vec::new();
        for index in 0..24u32 {
            let engine = Arc::clone(&setup.engine);
            let mut request =
                EngineRequest::new(format!("c{index}"), vec![100 + index, 7, index], 64);
            request.stop_token_ids = vec![2];
            tasks.push(tokio::spawn(async move {
                let prompt = request.input_ids.clone();
                let collected = collect(engine.generate(request).await.expect("starts")).await;
                (prompt, collected)
            }));
        }
        for task in tasks {
            let (prompt, collected) = within(task).await.expect("the task completes");
            let expected = deterministic.output_for(&prompt);
            assert_eq!(collected.ids, expected, "{kind:?}");
            let logprobs: Vec<f32> = expected
                .iter()
                .enumerate()
                .map(|(position, &id)| playback_logprob(position, id))
                .collect();
            assert_eq!(collected.logprobs, logprobs, "{kind:?}");
            assert_eq!(collected.finish(), Some(FinishKind::Stop), "{kind:?}");
        }
        within(deterministic.wait_idle()).await;
    }
}
