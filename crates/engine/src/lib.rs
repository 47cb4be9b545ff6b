//! gyre-engine: the rollout-engine trait and the weight-buffer manifest.
//!
//! Architecture invariant: this crate is pure and tiny (std, `gyre-event`, `crc32c`,
//! `thiserror`). It names what every rollout engine does — sample with behaviour log-probs,
//! take a new policy version between requests, abort in-flight work on a role switch — and what
//! a weight buffer looks like on the wire, so that the proxy, the weight transport and the
//! publish step depend on this crate and never on an ML framework. Engines (the embedded CPU
//! policy in `gyre-model`, later SGLang / vLLM adapters) implement [`RolloutEngine`] higher up.

mod error;
mod manifest;
mod request;

pub use error::*;
pub use manifest::*;
pub use request::*;

use gyre_event::PolicyVersion;

/// A rollout engine: samples completions for concurrent requests and swaps weights between them.
///
/// Calls are synchronous and cheap (they enqueue work); results arrive through the returned
/// [`PendingGeneration`]. Implementations must be usable from several threads at once.
pub trait RolloutEngine: Send + Sync {
    /// Queues one generation request. A full queue is a rejection ([`EngineError::QueueFull`]),
    /// not unbounded growth.
    fn submit(&self, request: GenerationRequest) -> Result<PendingGeneration, EngineError>;

    /// Installs new weights as `update.version`. Requests submitted before the call finish on
    /// the old weights (their results carry the old version); every request submitted after it
    /// samples from the new one. Returns once the new weights are live.
    fn update_weights(&self, update: WeightUpdate) -> Result<PolicyVersion, EngineError>;

    /// Aborts every queued and in-flight request (a role switch); each of their pendings
    /// resolves to [`EngineError::Aborted`]. Returns how many were aborted.
    fn abort_all(&self) -> Result<usize, EngineError>;

    /// The policy version that newly submitted requests sample from.
    fn policy_version(&self) -> PolicyVersion;
}
