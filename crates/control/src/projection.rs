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
//! - **Snapshot body.** `GYRE-CP2`, then `last_at`, `last_index`, `events_folded` (u64 LE each),
//!   then `ControlState::encode_snapshot` (its own magic, version and checksum). Restore decodes
//!   the state directly: no refold, memory O(state). A diverged (halted) replica never builds
//!   a snapshot: the state machine stops first.

use gyre_event::{Event, EventBody, Timestamp};
use gyre_log::raft::Projection;
use gyre_state::ControlState;

const BODY_MAGIC: &[u8; 8] = b"GYRE-CP2";

/// The replicated projection of a control node.
#[derive(Clone, Debug)]
pub struct ControlProjection {
    pub state: ControlState,
    /// The latest `at` folded, so a new leader stamps monotonic times.
    pub last_at: Timestamp,
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
            halted: None,
            last_index: 0,
            events_folded: 0,
        }
    }

    fn fold(&mut self, index: u64, events: Vec<Event>) -> Vec<String> {
        let mut refused = Vec::new();
        for (position, event) in events.into_iter().enumerate() {
            if let EventBody::ProjectionDigest { upto, hash, rules } = &event.body {
                if let Some(why) = gyre_state::fold_rules_mismatch(*rules) {
                    let detail = format!("fold rules mismatch at entry {index}: {why}");
                    tracing::error!(index, detail = %detail, "replica folds by other rules; halting");
                    self.halted = Some(detail);
                    return refused;
                }
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
            let kind = event.body.kind_name();
            if let Err(error) = self.state.apply_owned(event) {
                refused.push(refusal_line(position, kind, &error.to_string()));
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
    fn apply_events(
        &mut self,
        index: u64,
        _batch: &[u8],
        events: Vec<Event>,
    ) -> Result<(), String> {
        if self.halted.is_some() {
            return Err("node halted".to_string());
        }
        self.events_folded += events.len() as u64;
        let refused = self.fold(index, events);
        self.last_index = index;
        if refused.is_empty() {
            Ok(())
        } else {
            Err(refused.join("\n"))
        }
    }

    fn snapshot_body(&self) -> Vec<u8> {
        let state = self.state.encode_snapshot();
        let mut body = Vec::with_capacity(BODY_MAGIC.len() + 24 + state.len());
        body.extend_from_slice(BODY_MAGIC);
        body.extend_from_slice(&self.last_at.nanos().to_le_bytes());
        body.extend_from_slice(&self.last_index.to_le_bytes());
        body.extend_from_slice(&self.events_folded.to_le_bytes());
        body.extend_from_slice(&state);
        body
    }

    fn restore(body: &[u8]) -> Result<Self, String> {
        let Some(rest) = body.strip_prefix(BODY_MAGIC.as_slice()) else {
            let found = body
                .get(..8)
                .map(String::from_utf8_lossy)
                .unwrap_or_default();
            return Err(format!(
                "snapshot body starts with {found:?}, not GYRE-CP2 (a snapshot from another format; \
                 remove the node's snapshot directory to rebuild it from the log and peers)"
            ));
        };
        if rest.len() < 24 {
            return Err(format!(
                "snapshot body header is cut short ({} bytes)",
                rest.len()
            ));
        }
        let word = |at: usize| -> Result<u64, String> {
            rest.get(at..at + 8)
                .and_then(|bytes| bytes.try_into().ok())
                .map(u64::from_le_bytes)
                .ok_or_else(|| "snapshot body header is cut short".to_string())
        };
        let state = ControlState::decode_snapshot(&rest[24..])
            .map_err(|error| format!("snapshot body: {error}"))?;
        Ok(ControlProjection {
            state,
            last_at: Timestamp(word(0)?),
            halted: None,
            last_index: word(8)?,
            events_folded: word(16)?,
        })
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

/// One refusal of an `Applied::rejected` text. A reason may quote a client's text (a branch
/// ref), whose line breaks would otherwise read as refusals of other positions.
fn refusal_line(position: usize, kind: &str, reason: &str) -> String {
    let reason = reason.replace(['\n', '\r'], " ");
    format!("#{position}: {kind} refused: {reason}")
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_quoting_line_breaks_is_one_refusal() {
        let text = [
            refusal_line(
                1,
                "evaluation_completed",
                "branch x\n#0: refused: forged\r\n",
            ),
            refusal_line(3, "engine_ready", "unknown engine"),
        ]
        .join("\n");
        let positions: Vec<usize> = refused_positions(&text)
            .into_iter()
            .map(|(position, _)| position)
            .collect();
        assert_eq!(positions, vec![1, 3], "{text}");
    }

    /// A checkpoint of this build's rules (or of none stated) is compared; one of other rules
    /// halts the replica naming both versions, and nothing after it is folded.
    #[test]
    fn a_checkpoint_of_other_fold_rules_halts_the_replica() {
        let tick = || Event::new(Timestamp(1), EventBody::Tick);
        let checkpoint = |projection: &ControlProjection, rules: u32| {
            Event::new(
                Timestamp(2),
                EventBody::ProjectionDigest {
                    upto: gyre_event::LogIndex(1),
                    hash: projection.state.digest(),
                    rules,
                },
            )
        };
        for rules in [0, gyre_state::FOLD_RULES] {
            let mut projection = ControlProjection::new();
            projection
                .apply_events(1, &[], vec![tick()])
                .expect("folds");
            let digest = checkpoint(&projection, rules);
            projection
                .apply_events(2, &[], vec![digest])
                .expect("compared, equal");
            assert!(projection.halted().is_none(), "rules {rules}");
        }
        let mut projection = ControlProjection::new();
        projection
            .apply_events(1, &[], vec![tick()])
            .expect("folds");
        let other = gyre_state::FOLD_RULES + 1;
        let digest = checkpoint(&projection, other);
        let _ = projection.apply_events(2, &[], vec![digest, tick()]);
        let why = projection.halted().expect("halted");
        assert!(
            why.contains("fold rules mismatch at entry 2")
                && why.contains(&format!("rules {other}"))
                && why.contains(&format!("rules {}", gyre_state::FOLD_RULES)),
            "{why}"
        );
        assert_eq!(
            projection.state.events_applied, 1,
            "nothing after it folded"
        );
    }
}
