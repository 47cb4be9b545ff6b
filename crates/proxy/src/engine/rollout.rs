//! [`RolloutTokenEngine`]: any [`gyre_engine::RolloutEngine`] (the embedded CPU policy of
//! `gyre-model`) behind the proxy's [`TokenEngine`] trait, so `gyre proxy --engine embedded`
//! serves a real model that samples on this machine, with the policy's own behaviour
//! log-probs, to any harness.
//!
//! A rollout engine answers a request whole (it decodes a batch of sequences together and
//! replies when a sequence ends), so the stream carries one `Tokens` chunk and the finish. The
//! wait runs on tokio's blocking pool; [`TokenEngine::abort`] cancels the request, and its
//! stream ends with [`FinishKind::Abort`] (no partial output: the engine keeps none).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use gyre_engine::{
    CancelToken, EngineError, FinishReason, GenerationRequest, RolloutEngine, SamplingParams,
};

use super::{ChunkStream, EngineChunk, EngineFailure, EngineRequest, FinishKind, TokenEngine};

/// A [`RolloutEngine`] as a [`TokenEngine`]. Cheap to clone.
#[derive(Clone)]
pub struct RolloutTokenEngine {
    name: Arc<str>,
    engine: Arc<dyn RolloutEngine>,
    /// Cancel handles of the requests in flight, by rid.
    in_flight: Arc<Mutex<HashMap<String, CancelToken>>>,
    /// The engine said it stopped (its worker is gone): health fails from then on.
    stopped: Arc<AtomicBool>,
}

impl RolloutTokenEngine {
    /// `name` appears in every failure (e.g. `embedded@smollm2-135m`).
    pub fn new(name: impl Into<String>, engine: Arc<dyn RolloutEngine>) -> Self {
        RolloutTokenEngine {
            name: name.into().into(),
            engine,
            in_flight: Arc::new(Mutex::new(HashMap::new())),
            stopped: Arc::new(AtomicBool::new(false)),
        }
    }

    fn rejected(&self, message: impl Into<String>) -> EngineFailure {
        EngineFailure::Rejected {
            engine: self.name.to_string(),
            message: message.into(),
        }
    }

    /// The engine's sampling settings for `request`, or why it cannot sample them.
    fn sampling(&self, request: &EngineRequest) -> Result<SamplingParams, EngineFailure> {
        if request.top_k.is_some() {
            return Err(self.rejected("top_k: the embedded engine samples without a top-k cut"));
        }
        let greedy = request.temperature == 0.0;
        Ok(SamplingParams {
            temperature: if greedy {
                1.0
            } else {
                f64::from(request.temperature)
            },
            top_p: f64::from(request.top_p),
            new_tokens_max: request.max_new_tokens,
            stop_tokens: request.stop_token_ids.clone(),
            seed: request.seed.unwrap_or_else(|| default_seed(request)),
            greedy,
        })
    }
}

/// The stream a request without a seed of its own draws from: named by the execution, call
/// and attempt its rid starts with (`e<execution>-<call>-<attempt>-<tag>.<n>`, the tag and
/// counter unique to the proxy process and so left out) and its prompt's length, so a run
/// replayed against the embedded engine samples the same tokens, and two requests in flight
/// at once (a sub-agent's beside the main agent's) do not share a stream.
fn default_seed(request: &EngineRequest) -> u64 {
    let rid = request.rid.as_str();
    let stable = rid.rsplit_once('-').map_or(rid, |(stable, _)| stable);
    gyre_trajectory::fnv1a64(&format!("{stable}/{}", request.input_ids.len()))
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl TokenEngine for RolloutTokenEngine {
    fn name(&self) -> &str {
        &self.name
    }

    fn generate(
        &self,
        request: EngineRequest,
    ) -> BoxFuture<'static, Result<ChunkStream, EngineFailure>> {
        let this = self.clone();
        async move {
            if request.input_ids.is_empty() {
                return Err(this.rejected("an empty prompt"));
            }
            let sampling = this.sampling(&request)?;
            let pending = this
                .engine
                .submit(GenerationRequest {
                    prompt: request.input_ids.as_ref().clone(),
                    sampling,
                })
                .map_err(|error| match error {
                    // A full queue may drain, or another engine may take the call.
                    EngineError::QueueFull { .. } | EngineError::Stopped => {
                        if error == EngineError::Stopped {
                            this.stopped.store(true, Ordering::Release);
                        }
                        EngineFailure::Failed {
                            engine: this.name.to_string(),
                            message: error.to_string(),
                        }
                    }
                    other => this.rejected(other.to_string()),
                })?;
            {
                let mut in_flight = lock(&this.in_flight);
                if in_flight.contains_key(&request.rid) {
                    pending.cancel();
                    return Err(this.rejected(format!("rid {} is already in flight", request.rid)));
                }
                in_flight.insert(request.rid.clone(), pending.cancel_token());
            }
            let (sender, receiver) = tokio::sync::mpsc::channel(2);
            let rid = request.rid;
            // Task "rollout-wait": owned by the stream's receiver; ends when the engine answers.
            tokio::task::spawn_blocking(move || {
                let result = pending.wait();
                lock(&this.in_flight).remove(&rid);
                let chunks: Vec<Result<EngineChunk, EngineFailure>> = match result {
                    Ok(generation) => {
                        let kind = match generation.finish_reason {
                            FinishReason::Stop => FinishKind::Stop,
                            // The model's context is full: no more tokens, as at the limit.
                            FinishReason::Length | FinishReason::Context => FinishKind::Length,
                        };
                        let mut chunks = Vec::with_capacity(2);
                        if !generation.output_ids.is_empty() {
                            chunks.push(Ok(EngineChunk::Tokens {
                                ids: generation.output_ids,
                                logprobs: generation.output_logprobs,
                            }));
                        }
                        chunks.push(Ok(EngineChunk::Finished {
                            kind,
                            policy_version: generation.policy_version.get(),
                        }));
                        chunks
                    }
                    Err(EngineError::Aborted) => vec![Ok(EngineChunk::Finished {
                        kind: FinishKind::Abort,
                        policy_version: this.engine.policy_version().get(),
                    })],
                    Err(error) => {
                        if error == EngineError::Stopped {
                            this.stopped.store(true, Ordering::Release);
                        }
                        vec![Err(EngineFailure::Failed {
                            engine: this.name.to_string(),
                            message: error.to_string(),
                        })]
                    }
                };
                for chunk in chunks {
                    if sender.blocking_send(chunk).is_err() {
                        break;
                    }
                }
            });
            Ok(receiver)
        }
        .boxed()
    }

    fn abort(&self, rid: &str) -> BoxFuture<'static, Result<(), EngineFailure>> {
        if let Some(cancel) = lock(&self.in_flight).get(rid) {
            cancel.cancel();
        }
        async { Ok(()) }.boxed()
    }

    fn health(&self) -> BoxFuture<'static, Result<(), EngineFailure>> {
        let result = if self.stopped.load(Ordering::Acquire) {
            Err(EngineFailure::Unreachable {
                engine: self.name.to_string(),
                message: "the engine's worker stopped".into(),
            })
        } else {
            Ok(())
        };
        async move { result }.boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(rid: &str, prompt: usize) -> EngineRequest {
        EngineRequest::new(rid, vec![1; prompt], 8)
    }

    #[test]
    fn the_default_seed_is_the_same_for_a_replayed_call_and_differs_between_calls() {
        let first = default_seed(&request("e7-3-0-m1x2k9.41", 100));
        assert_eq!(
            first,
            default_seed(&request("e7-3-0-n0q1z2.5", 100)),
            "another proxy process replaying the call draws the same stream"
        );
        assert_ne!(first, default_seed(&request("e7-4-0-m1x2k9.42", 100)));
        assert_ne!(first, default_seed(&request("e7-3-1-m1x2k9.43", 100)));
        assert_ne!(first, default_seed(&request("e8-3-0-m1x2k9.44", 100)));
        assert_ne!(
            first,
            default_seed(&request("e7-3-0-m1x2k9.45", 120)),
            "a sub-agent's call in flight beside it"
        );
    }
}
