//! The upcaster registry: how a body written at an old schema version becomes today's.
//!
//! An upcaster is keyed by `(kind, from_version)` and rewrites a body's bytes from version
//! `from_version` to `from_version + 1`. Decoding walks the chain until it reaches the kind's
//! current version, then decodes that. Rewriting bytes (rather than typed messages) keeps every
//! step the same shape, so the chain for a kind can grow one version at a time without touching
//! older steps. Only old records pay for it.
//!
//! Protobuf alone already tolerates added and removed fields; upcasters exist for changes of
//! meaning or representation, which protobuf would silently misread. Example: a v1 `RunStarted`
//! decoded directly as v2 would read τ as 0 (its `tau_seconds` tag is reserved in v2).

use gyre_event::Duration;
use gyre_proto::events::{self as pb, EventKind};
use prost::Message;

use super::BodyError;

/// One step of a kind's upcast chain: `from_version` → `from_version + 1`.
#[derive(Clone, Copy, Debug)]
pub struct Upcaster {
    pub kind: EventKind,
    pub from_version: u32,
    /// What changed, in one sentence (also written in `proto/events.proto`).
    pub change: &'static str,
    pub upcast: fn(&[u8]) -> Result<Vec<u8>, BodyError>,
}

/// Every upcaster this build knows. Append only; a step, once released, never changes.
pub const UPCASTERS: &[Upcaster] = &[Upcaster {
    kind: EventKind::RunStarted,
    from_version: 1,
    change: "tau_seconds (f64 seconds) became tau_nanos (u64 nanoseconds); j_max added, \
             defaulting to 5, the value v1 runs had hard-wired",
    upcast: run_started_v1_to_v2,
}];

/// The upcaster for `(kind, from_version)`, if there is one.
pub fn upcaster(kind: EventKind, from_version: u32) -> Option<&'static Upcaster> {
    UPCASTERS
        .iter()
        .find(|upcaster| upcaster.kind == kind && upcaster.from_version == from_version)
}

/// J_max before it became configurable (schema v1 of `RunStarted`): the paper's default.
pub const RUN_STARTED_V1_J_MAX: u32 = 5;

fn run_started_v1_to_v2(bytes: &[u8]) -> Result<Vec<u8>, BodyError> {
    let old = pb::RunStartedV1::decode(bytes)?;
    if !old.tau_seconds.is_finite() || old.tau_seconds < 0.0 {
        return Err(BodyError::InvalidValue {
            field: "run_started_v1.tau_seconds",
            detail: format!("must be a finite number ≥ 0, got {}", old.tau_seconds),
        });
    }
    let new = pb::RunStarted {
        run_seed: old.run_seed,
        mode: old.mode,
        streaming: old.streaming,
        phi: old.phi,
        mu: old.mu,
        n: old.n,
        b: old.b,
        steps: old.steps,
        rho_min: old.rho_min,
        async_training_cells: old.async_training_cells,
        j_max: RUN_STARTED_V1_J_MAX,
        tau_nanos: Duration::from_secs_f64(old.tau_seconds).nanos(),
    };
    Ok(new.encode_to_vec())
}
