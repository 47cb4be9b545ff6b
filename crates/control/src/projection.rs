//! [`ControlProjection`]: the control node's state machine fold, a newtype around
//! `gyre_state::ControlState`.
//!
//! - **Digest checkpoints.** A `ProjectionDigest { upto, hash }` event carries the digest of the
//!   state just before it (the convention `gyre replay` and the simulator use). Every replica
//!   compares on apply; a mismatch halts the node: [`Projection::halted`] makes the state
//!   machine return a storage error, openraft stops the node, and `gyre control run` exits
//!   non-zero. A diverged replica must not keep serving.
//! - **Refused events.** `ControlState::apply` may refuse an event (a bad client event). The
//!   refusal is deterministic, so every replica refuses it too; the other events of the batch
//!   are still folded. Refusals are reported as lines `#<position>: <reason>` in
//!   `Applied::rejected`, which the proposer hands back to the client that sent that event.
//! - **Snapshot body (a known gap).** `ControlState` has no binary encoding yet, so the body is
//!   every applied batch, re-encoded, and restore refolds them: correct and simple, but the
//!   snapshot grows with the log (memory and disk O(log)) and restore costs a full replay
//!   (about 1M events/s). A compact encoding of `ControlState` replaces this later.

use gyre_event::{Event, EventBody, Timestamp};
use gyre_log::raft::Projection;
use gyre_state::ControlState;

const BODY_MAGIC: &[u8; 8] = b"GYRE-CP1";

/// The replicated projection of a control node.
#[derive(Clone, Debug)]
pub struct ControlProjection {
    pub state: ControlState,
    /// The latest `at` folded, so a new leader stamps monotonic times.
    pub last_at: Timestamp,
    /// Batches folded so far, as `[index u64 LE][len u32 LE][EventBatch]` (the snapshot body).
    batches: Vec<u8>,
    /// Why the node must stop (a digest mismatch); never cleared.
    halted: Option<String>,
    /// Raft index of the last folded batch.
    pub last_index: u64,
    /// Events folded, refused ones included.
    pub events_folded: u64,
}

impl ControlProjection {
    pub fn new() -> Self {
        ControlProjection {
            state: ControlState::new(),
            last_at: Timestamp::ZERO,
            batches: Vec::new(),
            halted: None,
            last_index: 0,
            events_folded: 0,
        }
    }

    /// Bytes held for the snapshot body.
    pub fn body_bytes(&self) -> usize {
        self.batches.len()
    }

    fn fold(&mut self, index: u64, events: &[Event]) -> Vec<String> {
        let mut refused = Vec::new();
        for (position, event) in events.iter().enumerate() {
            if let EventBody::ProjectionDigest { upto, hash } = &event.body {
                let ours = self.state.digest();
                if &ours != hash {
                    let detail = format!(
                        "projection digest mismatch at entry {index} (checkpoint upto {}): the log says {} but this replica computes {}",
                        upto.get(),
                        gyre_log::file::hex(hash),
                        gyre_log::file::hex(&ours)
                    );
                    tracing::error!(index, detail = %detail, "replica diverged; halting");
                    self.halted = Some(detail);
                    return refused;
                }
            }
            if event.at > self.last_at {
                self.last_at = event.at;
            }
            if let Err(error) = self.state.apply(event) {
                refused.push(format!(
                    "#{position}: {} refused: {error}",
                    event.kind_name()
                ));
            }
        }
        refused
    }
}

impl Default for ControlProjection {
    fn default() -> Self {
        Self::new()
    }
}

impl Projection for ControlProjection {
    fn apply_events(&mut self, index: u64, batch: &[u8], events: &[Event]) -> Result<(), String> {
        if self.halted.is_some() {
            return Err("node halted".to_string());
        }
        let refused = self.fold(index, events);
        self.events_folded += events.len() as u64;
        let encoded = batch;
        self.batches.extend_from_slice(&index.to_le_bytes());
        self.batches.extend_from_slice(
            &u32::try_from(encoded.len())
                .unwrap_or(u32::MAX)
                .to_le_bytes(),
        );
        self.batches.extend_from_slice(encoded);
        self.last_index = index;
        if refused.is_empty() {
            Ok(())
        } else {
            Err(refused.join("\n"))
        }
    }

    fn snapshot_body(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(BODY_MAGIC.len() + self.batches.len());
        body.extend_from_slice(BODY_MAGIC);
        body.extend_from_slice(&self.batches);
        body
    }

    fn restore(body: &[u8]) -> Result<Self, String> {
        let Some(mut rest) = body.strip_prefix(BODY_MAGIC.as_slice()) else {
            return Err("snapshot body does not start with GYRE-CP1".to_string());
        };
        let mut projection = ControlProjection::new();
        while !rest.is_empty() {
            if rest.len() < 12 {
                return Err(format!("{} trailing bytes in snapshot body", rest.len()));
            }
            let (head, tail) = rest.split_at(12);
            let index = u64::from_le_bytes(head[..8].try_into().map_err(|_| "index bytes")?);
            let len =
                u32::from_le_bytes(head[8..].try_into().map_err(|_| "length bytes")?) as usize;
            if tail.len() < len {
                return Err(format!("batch of entry {index} is cut short"));
            }
            let (batch, after) = tail.split_at(len);
            let events = gyre_log::decode_batch(batch)
                .map_err(|error| format!("batch of entry {index}: {error}"))?;
            // Refusals were recorded when the batch was first applied; refolding repeats them.
            let _ = projection.apply_events(index, batch, &events);
            if let Some(detail) = &projection.halted {
                return Err(detail.clone());
            }
            rest = after;
        }
        Ok(projection)
    }

    fn digest(&self) -> [u8; 32] {
        self.state.digest()
    }

    fn empty() -> Self {
        ControlProjection::new()
    }

    fn halted(&self) -> Option<String> {
        self.halted.clone()
    }
}

/// Positions refused in an `Applied::rejected` text, with their reasons.
pub(crate) fn refused_positions(rejected: &str) -> Vec<(usize, String)> {
    rejected
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix('#')?;
            let (position, reason) = rest.split_once(": ")?;
            Some((position.parse().ok()?, reason.to_string()))
        })
        .collect()
}
