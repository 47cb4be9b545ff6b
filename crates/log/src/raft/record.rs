//! A Raft entry as the payload of a log record.
//!
//! ```text
//! payload = kind u8                0 blank, 1 normal (events), 2 membership
//!           leader_node_id u64 LE  the node that proposed it: with the term, the entry's leader id
//!           body                   kind 1: one encoded EventBatch, verbatim
//!                                  kind 2: the membership as JSON
//!                                  kind 0: empty
//! ```
//! The record frame around it (`[len][crc32c(index‖term‖payload)][index][term][payload]`) and the
//! hash chain are those of the event file ([`crate::file`]). Blank and membership entries stay
//! in the log and the chain because they take Raft indexes: an event's sequence number is
//! `(raft index, position in batch)`.

use bytes::Bytes;
use openraft::EntryPayload;

use super::types::{log_id, Entry, EventBatchBytes, Membership};

pub const KIND_BLANK: u8 = 0;
pub const KIND_NORMAL: u8 = 1;
pub const KIND_MEMBERSHIP: u8 = 2;
/// Bytes of the payload before the body.
pub const PAYLOAD_HEADER_LEN: usize = 9;

/// What a record's payload holds, without decoding the body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordKind {
    Blank,
    /// One `EventBatch`.
    Events,
    Membership,
}

/// Appends `entry`'s payload encoding to `out`.
pub fn encode_payload(entry: &Entry, out: &mut Vec<u8>) {
    let leader = entry.log_id.leader_id.node_id;
    match &entry.payload {
        EntryPayload::Blank => {
            out.push(KIND_BLANK);
            out.extend_from_slice(&leader.to_le_bytes());
        }
        EntryPayload::Normal(batch) => {
            out.push(KIND_NORMAL);
            out.extend_from_slice(&leader.to_le_bytes());
            out.extend_from_slice(&batch.0);
        }
        EntryPayload::Membership(membership) => {
            out.push(KIND_MEMBERSHIP);
            out.extend_from_slice(&leader.to_le_bytes());
            serde_json::to_writer(&mut *out, membership)
                .expect("a membership of u64 ids and string addresses always serialises");
        }
    }
}

/// The encoded payload length of `entry` (for byte budgets), without encoding it.
pub fn payload_len_hint(entry: &Entry) -> usize {
    PAYLOAD_HEADER_LEN
        + match &entry.payload {
            EntryPayload::Blank => 0,
            EntryPayload::Normal(batch) => batch.len(),
            EntryPayload::Membership(_) => 256,
        }
}

/// Splits a payload into its kind, proposing leader and body; `Err` says what is wrong.
pub fn split_payload(payload: &[u8]) -> Result<(RecordKind, u64, &[u8]), String> {
    if payload.len() < PAYLOAD_HEADER_LEN {
        return Err(format!(
            "payload of {} bytes is shorter than its {PAYLOAD_HEADER_LEN}-byte header",
            payload.len()
        ));
    }
    let kind = match payload[0] {
        KIND_BLANK => RecordKind::Blank,
        KIND_NORMAL => RecordKind::Events,
        KIND_MEMBERSHIP => RecordKind::Membership,
        other => return Err(format!("unknown entry kind {other}")),
    };
    let leader = crate::file::read_u64(&payload[1..9]);
    let body = &payload[PAYLOAD_HEADER_LEN..];
    if kind == RecordKind::Blank && !body.is_empty() {
        return Err(format!("blank entry carries {} body bytes", body.len()));
    }
    Ok((kind, leader, body))
}

/// Rebuilds the entry a record holds; `Err` says what is wrong with the payload.
pub fn decode_entry(index: u64, term: u64, payload: &[u8]) -> Result<Entry, String> {
    let (kind, leader, body) = split_payload(payload)?;
    let payload = match kind {
        RecordKind::Blank => EntryPayload::Blank,
        RecordKind::Events => EntryPayload::Normal(EventBatchBytes(Bytes::copy_from_slice(body))),
        RecordKind::Membership => {
            let membership: Membership = serde_json::from_slice(body)
                .map_err(|error| format!("membership body does not parse: {error}"))?;
            EntryPayload::Membership(membership)
        }
    };
    Ok(Entry {
        log_id: log_id(term, leader, index),
        payload,
    })
}
