//! Generation requests, results and the handle a caller waits on or cancels.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

use gyre_event::PolicyVersion;

use crate::{EngineError, WeightManifest};

/// How to sample. The behaviour log-prob of each token is taken under exactly this
/// distribution (temperature-scaled, top-p-truncated and renormalised).
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// Logits are divided by this; must be positive (greedy decoding: [`Self::greedy`]).
    pub temperature: f64,
    /// Nucleus mass in `(0, 1]`; 1 keeps the whole vocabulary.
    pub top_p: f64,
    /// Generation stops after this many new tokens.
    pub new_tokens_max: u32,
    /// Generation stops after emitting any of these (the stop token is included in the output).
    pub stop_tokens: Vec<u32>,
    /// Seeds this request's sampling stream: same weights, prompt and seed ⇒ same tokens.
    pub seed: u64,
    /// Argmax decoding; the reported log-prob is then the model's (temperature 1) log-prob.
    pub greedy: bool,
}

impl SamplingParams {
    pub fn greedy(new_tokens_max: u32, stop_tokens: Vec<u32>) -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            new_tokens_max,
            stop_tokens,
            seed: 0,
            greedy: true,
        }
    }

    pub fn validate(&self) -> Result<(), EngineError> {
        if !(self.temperature.is_finite() && self.temperature > 0.0) {
            return Err(EngineError::InvalidRequest {
                field: "temperature",
                message: format!("must be positive and finite, got {}", self.temperature),
            });
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(EngineError::InvalidRequest {
                field: "top_p",
                message: format!("must be in (0, 1], got {}", self.top_p),
            });
        }
        Ok(())
    }
}

/// One request: a prompt of token ids and how to continue it.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerationRequest {
    pub prompt: Vec<u32>,
    pub sampling: SamplingParams,
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token was sampled.
    Stop,
    /// `new_tokens_max` tokens were produced.
    Length,
    /// The model's context is full.
    Context,
}

/// A finished generation: the sampled ids, the behaviour log-prob of each, and the policy
/// version that produced every one of them.
#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    pub output_ids: Vec<u32>,
    pub output_logprobs: Vec<f32>,
    pub policy_version: PolicyVersion,
    pub finish_reason: FinishReason,
}

/// A cancellation flag shared between a caller and the engine.
#[derive(Clone, Debug, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Release);
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// The caller's side of a submitted request.
#[derive(Debug)]
pub struct PendingGeneration {
    receiver: Receiver<Result<Generation, EngineError>>,
    cancel: CancelToken,
}

impl PendingGeneration {
    pub fn new(receiver: Receiver<Result<Generation, EngineError>>, cancel: CancelToken) -> Self {
        Self { receiver, cancel }
    }

    /// Asks the engine to stop this request; [`Self::wait`] then returns
    /// [`EngineError::Aborted`] (or the result, if it finished first).
    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    pub fn cancel_token(&self) -> CancelToken {
        self.cancel.clone()
    }

    /// Blocks until the engine answers.
    pub fn wait(self) -> Result<Generation, EngineError> {
        self.receiver.recv().unwrap_or(Err(EngineError::Stopped))
    }

    /// Blocks at most `timeout`; `None` when nothing arrived yet.
    pub fn wait_timeout(&self, timeout: Duration) -> Option<Result<Generation, EngineError>> {
        match self.receiver.recv_timeout(timeout) {
            Ok(result) => Some(result),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => Some(Err(EngineError::Stopped)),
        }
    }
}

/// New weights for an engine: a flat little-endian buffer laid out by its manifest.
#[derive(Clone, Debug, PartialEq)]
pub struct WeightUpdate {
    pub version: PolicyVersion,
    pub manifest: WeightManifest,
    pub buffer: Vec<u8>,
}
