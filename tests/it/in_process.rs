//! A proxy served in this process over loopback HTTP, in front of an engine that keeps what
//! each request asked of it, and recording into memory: for tests of what reaches the engine's
//! wire and what a record says (`structured_output`, `sampling`).

use std::sync::{Arc, Mutex};

use gyre_proxy::engine::fake::{FakeOptions, FakeServer};
use gyre_proxy::engine::{
    ChunkStream, DeterministicEngine, DeterministicOptions, EngineFailure, EngineRequest,
    JsonConstraint, SglangEngine, TokenEngine, VllmEngine,
};
use gyre_proxy::server::{AppState, ServerConfig};
use serde_json::Value;

use crate::support::{http, MemorySink};

/// Implements `TokenEngine` for a test engine wrapping another one in its `inner` field: the
/// name, aborts and health checks are the inner engine's, and requests go to `$generate`.
macro_rules! wrapping_engine {
    ($engine:ty, $generate:ident) => {
        impl gyre_proxy::engine::TokenEngine for $engine {
            fn name(&self) -> &str {
                self.inner.name()
            }

            fn generate(
                &self,
                request: gyre_proxy::engine::EngineRequest,
            ) -> futures_util::future::BoxFuture<
                'static,
                Result<gyre_proxy::engine::ChunkStream, gyre_proxy::engine::EngineFailure>,
            > {
                self.$generate(request)
            }

            fn abort(
                &self,
                rid: &str,
            ) -> futures_util::future::BoxFuture<
                'static,
                Result<(), gyre_proxy::engine::EngineFailure>,
            > {
                self.inner.abort(rid)
            }

            fn health(
                &self,
            ) -> futures_util::future::BoxFuture<
                'static,
                Result<(), gyre_proxy::engine::EngineFailure>,
            > {
                self.inner.health()
            }
        }
    };
}
pub(crate) use wrapping_engine;

/// What one request asked the engine to sample with.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AskedSampling {
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: Option<u32>,
}

/// The engine behind a fake: keeps the constraint and the sampling settings of every request
/// it gets.
pub struct Recording {
    pub inner: DeterministicEngine,
    pub constraints: Mutex<Vec<Option<JsonConstraint>>>,
    /// `reasoning_first` of each request (SGLang's `require_reasoning` on the wire).
    pub reasoning_first: Mutex<Vec<bool>>,
    pub sampling: Mutex<Vec<AskedSampling>>,
    /// `max_new_tokens` of each request.
    pub max_new_tokens: Mutex<Vec<u32>>,
}

impl Recording {
    fn record_and_generate(
        &self,
        request: EngineRequest,
    ) -> futures_util::future::BoxFuture<'static, Result<ChunkStream, EngineFailure>> {
        self.constraints
            .lock()
            .expect("constraints lock")
            .push(request.json.clone());
        self.reasoning_first
            .lock()
            .expect("reasoning lock")
            .push(request.reasoning_first);
        self.sampling
            .lock()
            .expect("sampling lock")
            .push(AskedSampling {
                temperature: request.temperature,
                top_p: request.top_p,
                top_k: request.top_k,
            });
        self.max_new_tokens
            .lock()
            .expect("max_new_tokens lock")
            .push(request.max_new_tokens);
        self.inner.generate(request)
    }
}

wrapping_engine!(Recording, record_and_generate);

/// A recording engine answering 12 tokens, the last the model's end of turn.
pub fn recording() -> Arc<Recording> {
    let end = model().token_id("<|im_end|>").expect("end token");
    Arc::new(Recording {
        inner: DeterministicEngine::new(DeterministicOptions {
            output_tokens: 12,
            end_token_id: Some(end),
            ..Default::default()
        }),
        constraints: Mutex::new(Vec::new()),
        reasoning_first: Mutex::new(Vec::new()),
        sampling: Mutex::new(Vec::new()),
        max_new_tokens: Mutex::new(Vec::new()),
    })
}

pub struct Proxy {
    pub address: String,
    pub token: String,
    pub sink: Arc<MemorySink>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Proxy {
    /// POSTs `body` with the execution's credential; the status and the JSON answer.
    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let (status, body) = self.post_raw(path, body);
        let value = serde_json::from_str(&body)
            .unwrap_or_else(|error| panic!("a JSON answer ({error}): {body}"));
        (status, value)
    }

    /// POSTs `body` with the execution's credential; the status and the answer as text (a
    /// stream's events).
    pub fn post_raw(&self, path: &str, body: &Value) -> (u16, String) {
        let auth = format!("Bearer {}", self.token);
        http(
            &self.address,
            "POST",
            path,
            &[
                ("content-type", "application/json"),
                ("authorization", &auth),
                ("x-api-key", &self.token),
            ],
            &body.to_string(),
        )
    }

    /// POSTs `body` with another execution's credential `token`; the status and the JSON
    /// answer.
    pub fn post_as(&self, token: &str, path: &str, body: &Value) -> (u16, Value) {
        let auth = format!("Bearer {token}");
        let (status, body) = http(
            &self.address,
            "POST",
            path,
            &[
                ("content-type", "application/json"),
                ("authorization", &auth),
                ("x-api-key", token),
            ],
            &body.to_string(),
        );
        let value = serde_json::from_str(&body)
            .unwrap_or_else(|error| panic!("a JSON answer ({error}): {body}"));
        (status, value)
    }

    /// The proxy's `/metrics` text.
    pub fn metrics(&self) -> String {
        http(&self.address, "GET", "/metrics", &[], "").1
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

pub fn model() -> Arc<gyre_proxy::ChatModel> {
    Arc::new(
        gyre_proxy::ChatModel::load(
            &gyre_proxy::test_model::directory(),
            gyre_proxy::ToolArgumentsForm::RawText,
        )
        .expect("test model"),
    )
}

/// The scripted engine answering `script` (JSON lines, see `gyre proxy --script`) in the test
/// model's output format.
pub fn scripted(script: &str) -> Arc<dyn TokenEngine> {
    use gyre_proxy::engine::{Script, ScriptedEngine, ScriptedOptions};
    let script = Script::parse(script, None).expect("script");
    Arc::new(
        ScriptedEngine::new(
            &script,
            &model(),
            &gyre_proxy::output::OutputFormat::test_model(),
            ScriptedOptions::default(),
        )
        .expect("engine"),
    )
}

/// A proxy with the default settings and one open execution, in front of `engine`.
pub fn proxy(runtime: &tokio::runtime::Runtime, engine: Arc<dyn TokenEngine>) -> Proxy {
    proxy_with(runtime, engine, ServerConfig::default())
}

/// [`proxy`] with `config`.
pub fn proxy_with(
    runtime: &tokio::runtime::Runtime,
    engine: Arc<dyn TokenEngine>,
    config: ServerConfig,
) -> Proxy {
    let sink = Arc::new(MemorySink::default());
    let state = AppState::new(
        config,
        model(),
        gyre_proxy::output::OutputFormat::test_model(),
        vec![engine],
        sink.clone(),
    )
    .expect("state");
    let (_, token) = state.open_execution(None, None).expect("open");
    serve_state(runtime, state, token, sink)
}

/// Serves `state` (recording into `sink`) as a [`Proxy`] calling with `token`.
pub fn serve_state(
    runtime: &tokio::runtime::Runtime,
    state: Arc<AppState>,
    token: String,
    sink: Arc<MemorySink>,
) -> Proxy {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (address, _server) = runtime
        .block_on(gyre_proxy::server::serve(
            state,
            "127.0.0.1:0".parse().expect("address"),
            async move {
                let _ = stopped.await;
            },
        ))
        .expect("serving");
    Proxy {
        address: address.to_string(),
        token,
        sink,
        stop: Some(stop),
    }
}

/// A proxy with `config` in front of the SGLang (`sglang`) or vLLM protocol fake, which hands
/// each request to a [`recording`] engine as it read it from the wire. The fake lives as long
/// as the returned value.
pub fn behind_a_fake(
    runtime: &tokio::runtime::Runtime,
    sglang: bool,
    config: ServerConfig,
) -> (Proxy, Arc<Recording>, FakeServer) {
    let backing = recording();
    let fake = runtime
        .block_on(async {
            if sglang {
                FakeServer::sglang(backing.clone(), FakeOptions::default()).await
            } else {
                FakeServer::vllm(backing.clone(), FakeOptions::default()).await
            }
        })
        .expect("the fake listens");
    let engine: Arc<dyn TokenEngine> = if sglang {
        Arc::new(SglangEngine::new(&fake.url(), Default::default()).expect("adapter"))
    } else {
        Arc::new(VllmEngine::new(&fake.url(), Default::default()).expect("adapter"))
    };
    (proxy_with(runtime, engine, config), backing, fake)
}
