//! gyre-event: the vocabulary of Gyre's replicated log.
//!
//! Every fact in Gyre is an [`Event`] on one Raft-replicated log; every other piece of state is a
//! projection (a pure fold) of that log. This crate holds only domain types: ids, timestamps and
//! the [`EventBody`] enum. It has no dependencies, does no IO and knows nothing about the log's encoding;
//! the on-disk form (`proto/events.proto`, prost bodies in a versioned envelope) lives in
//! `gyre-log`, so that pure crates never depend on generated code. The one exception is
//! [`wire`], the dependency-free varint writer and reader that the projections use to encode
//! their snapshots (`gyre-state` frames them).

mod body;
mod config;
mod ids;
mod tito;
pub mod wire;

pub use body::*;
pub use config::*;
pub use ids::*;
pub use tito::*;

/// One event as it sits on the log: the leader-stamped time and the body.
///
/// `at` is stamped exactly once, by the leader (or the simulator's virtual clock) before the
/// event is proposed; projections read time only from here.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub at: Timestamp,
    pub body: EventBody,
}

impl Event {
    pub fn new(at: Timestamp, body: EventBody) -> Self {
        Self { at, body }
    }

    /// The stable name of this event's kind, used in post-mortems and error messages.
    pub fn kind_name(&self) -> &'static str {
        self.body.kind_name()
    }
}
