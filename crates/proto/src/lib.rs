//! gyre-proto: code generated from `proto/*.proto` by prost-build, and nothing else.
//!
//! Domain types live in `gyre-event`; conversions between them and these messages live at the
//! edge, in `gyre-log` (module `codec`). Keeping generated code in this one crate means pure
//! crates never compile prost, and a schema change rebuilds exactly one crate.

/// `proto/events.proto`: the event envelope (`EventBatch`, `EventRecord`) and one body message
/// per event kind.
#[allow(clippy::all, missing_docs)]
pub mod events {
    include!(concat!(env!("OUT_DIR"), "/gyre.events.rs"));
}

/// `proto/control.proto`: the Raft transport and the control API (tonic clients and servers).
#[allow(clippy::all, missing_docs)]
pub mod control {
    include!(concat!(env!("OUT_DIR"), "/gyre.control.rs"));
}
