//! The proposer: the single task on a node that turns append requests into Raft entries.
//!
//! Requests queue on a bounded channel. The task takes the first, then keeps collecting for a
//! short window (`window`; zero by default: measured on the 3-node loopback benchmark, a 1 ms
//! window cost 30–40% of throughput at every writer count, because the pipeline already batches:
//! requests that arrive while `in_flight_max` entries are outstanding form the next entry) or
//! until `events_max` events / `bytes_max` bytes,
//! stamps every event's `at` with the leader's clock (never earlier than anything already
//! folded or stamped, so time is monotonic across leader changes), wraps the records (bodies
//! as the client sent them, validated by the control service) in one
//! `EventBatch` and hands it to `client_write` on its own task, so up to `in_flight_max` entries
//! pipeline. Each request's events stay contiguous in one batch, so a decision commits
//! atomically. When the entry is applied, each request gets its sequence numbers
//! (raft index, position) and any per-event refusal.
//!
//! Every `digest_every_entries` entries, or more as the state grows
//! (`gyre_state::digest_interval`: a checkpoint hashes the whole state, so its cadence follows
//! the state's size and its cost stays a bounded share per entry), the proposer drains the
//! pipeline and, if the node's log
//! holds nothing beyond what it applied, appends a `ProjectionDigest` of the applied state in an
//! entry of its own: the digest of the state just before that entry, which every replica checks.
//!
//! On a node that is not the leader `client_write` refuses with the leader's id; the request gets
//! `NotLeader` and the control service forwards it.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gyre_event::{Event, EventBody, LogIndex, Timestamp};
use gyre_log::raft::{EventBatchBytes, LogStoreHandle, Raft, StateMachineStore};
use gyre_proto::events::EventRecord;
use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::error::ControlError;
use crate::network::ENTRY_BYTES_MAX;
use crate::projection::{refused_positions, ControlProjection};

/// What an append got back.
#[derive(Clone, Debug, Default)]
pub struct AppendOutcome {
    /// (raft index, position in batch), one per event.
    pub sequences: Vec<(u64, u32)>,
    /// Per event: `None` if folded, else the projection's refusal.
    pub rejected: Vec<Option<String>>,
}

/// Events to append, as their records (validated: they decode; bodies at the current schema
/// version). The proposer only re-stamps `at`, so bodies are never re-encoded on the leader.
pub struct AppendJob {
    pub records: Vec<EventRecord>,
    pub reply: oneshot::Sender<Result<AppendOutcome, ControlError>>,
}

#[derive(Clone, Copy, Debug)]
pub struct ProposerOptions {
    pub window: Duration,
    pub events_max: usize,
    pub bytes_max: usize,
    pub in_flight_max: usize,
    pub digest_every_entries: u64,
    pub queue_max: usize,
}

impl Default for ProposerOptions {
    fn default() -> Self {
        ProposerOptions {
            window: Duration::ZERO,
            events_max: 4096,
            bytes_max: 4 << 20,
            in_flight_max: 4,
            digest_every_entries: 256,
            queue_max: 4096,
        }
    }
}

/// The leader's clock, in nanoseconds since the Unix epoch.
pub fn wall_clock() -> Timestamp {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
        });
    Timestamp(nanos)
}

pub struct Proposer {
    pub raft: Raft,
    pub state_machine: StateMachineStore<ControlProjection>,
    pub log: LogStoreHandle,
    pub leader_address: Arc<dyn Fn(u64) -> Option<String> + Send + Sync>,
    pub options: ProposerOptions,
}

/// A record's encoded size, about, for batch limits.
pub(crate) fn record_bytes(record: &EventRecord) -> usize {
    16 + record.body.len()
}

/// A cheap estimate of an event's encoded size, for batch limits.
pub(crate) fn approximate_bytes(event: &Event) -> usize {
    match &event.body {
        EventBody::ModelCall(record) => {
            64 + 4
                * (record.input_ids.len() + record.output_ids.len() + record.output_logprobs.len())
        }
        _ => 64,
    }
}

impl Proposer {
    /// Runs until every sender is gone.
    pub async fn run(self, mut jobs: mpsc::Receiver<AppendJob>) {
        let in_flight = Arc::new(Semaphore::new(self.options.in_flight_max));
        let mut last_stamp = Timestamp::ZERO;
        // The term whose committed past this proposer has seen applied (see below).
        let mut stamped_term: Option<u64> = None;
        let mut entries_since_digest = 0u64;
        // A request that would have made the entry too large for one replication message
        // (`ENTRY_BYTES_MAX`): it opens the next entry.
        let mut carried: Option<AppendJob> = None;
        loop {
            let first = match carried.take() {
                Some(job) => job,
                None => match jobs.recv().await {
                    Some(job) => job,
                    None => return,
                },
            };
            // Wait for a pipeline slot before closing the batch: while the pipeline is full,
            // requests queue up and the next entry carries all of them (adaptive batching).
            let Ok(permit) = in_flight.clone().acquire_owned().await else {
                return;
            };
            let mut batch = vec![first];
            let mut events = batch[0].records.len();
            let mut bytes: usize = batch[0].records.iter().map(record_bytes).sum();
            let deadline = tokio::time::Instant::now() + self.options.window;
            while events < self.options.events_max && bytes < self.options.bytes_max {
                if let Ok(job) = jobs.try_recv() {
                    let job_bytes = job.records.iter().map(record_bytes).sum::<usize>();
                    if bytes + job_bytes > ENTRY_BYTES_MAX {
                        carried = Some(job);
                        break;
                    }
                    events += job.records.len();
                    bytes += job_bytes;
                    batch.push(job);
                    continue;
                }
                // A zero window never touches the timer: tokio's timer wheel has a 1 ms
                // resolution, so even an already-expired deadline could park the batch for up
                // to a millisecond (measured: 1 ms of the 2.3 ms single-writer commit).
                if self.options.window.is_zero() {
                    break;
                }
                match tokio::time::timeout_at(deadline, jobs.recv()).await {
                    Ok(Some(job)) => {
                        let job_bytes = job.records.iter().map(record_bytes).sum::<usize>();
                        if bytes + job_bytes > ENTRY_BYTES_MAX {
                            carried = Some(job);
                            break;
                        }
                        events += job.records.len();
                        bytes += job_bytes;
                        batch.push(job);
                    }
                    Ok(None) | Err(_) => break,
                }
            }
            // `at` never goes back: a new leader's first stamp waits until everything committed
            // before its term is applied, so `folded_at` covers it (another host's clock may
            // be ahead of this one's). Once per term; bounded, since the write itself finds
            // out whether this node still leads.
            let term = self.raft.metrics().borrow().current_term;
            if stamped_term != Some(term) {
                let applied =
                    tokio::time::timeout(Duration::from_secs(2), self.raft.ensure_linearizable())
                        .await;
                if matches!(applied, Ok(Ok(_))) {
                    stamped_term = Some(term);
                }
            }
            let folded_at = self
                .state_machine
                .with_projection(|projection, _| projection.last_at);
            let now = wall_clock().max(folded_at).max(last_stamp);
            last_stamp = now;
            let raft = self.raft.clone();
            let leader_address = self.leader_address.clone();
            // Task "client-write": owned by the semaphore permit it holds; the proposer drains
            // all permits before a digest and at shutdown.
            tokio::spawn(async move {
                write_batch(raft, batch, now, leader_address).await;
                drop(permit);
            });
            entries_since_digest += 1;
            let items = self
                .state_machine
                .with_projection(|projection, _| projection.state.digest_items());
            if entries_since_digest
                >= gyre_state::digest_interval(self.options.digest_every_entries, items)
            {
                entries_since_digest = 0;
                let all = u32::try_from(self.options.in_flight_max).unwrap_or(u32::MAX);
                // Drain the pipeline: with no own entry in flight the applied state is the state
                // just before the next entry, unless another leader's entries are still pending.
                let Ok(drained) = in_flight.clone().acquire_many_owned(all).await else {
                    return;
                };
                self.propose_digest(now).await;
                drop(drained);
            }
        }
    }

    async fn propose_digest(&self, now: Timestamp) {
        let checkpoint = self
            .state_machine
            .with_projection(|projection, last_applied| {
                let applied = last_applied.map_or(0, |log_id| log_id.index);
                let last_log = self.log.last_log_id().map_or(0, |log_id| log_id.index);
                (applied == last_log).then(|| (applied, projection.state.digest()))
            });
        let Some((upto, hash)) = checkpoint else {
            tracing::debug!("log holds unapplied entries; digest checkpoint postponed");
            return;
        };
        let event = Event::new(
            now,
            EventBody::ProjectionDigest {
                upto: LogIndex(upto),
                hash,
                rules: gyre_state::FOLD_RULES,
            },
        );
        match self
            .raft
            .client_write(EventBatchBytes::encode(&[event]))
            .await
        {
            Ok(response) => tracing::debug!(
                index = response.log_id.index,
                upto,
                "digest checkpoint committed"
            ),
            Err(error) => tracing::debug!(%error, "digest checkpoint not committed"),
        }
    }
}

/// Where a write refused with "forward to leader" should go. A follower can know the leader's
/// id (from its vote) before the membership entry naming the leader's address has reached it:
/// that is "no leader yet" to a writer (retryable), never an address made up from the id.
fn forward_target(
    leader_id: Option<u64>,
    leader_node: Option<&gyre_log::raft::Node>,
    leader_address: &(dyn Fn(u64) -> Option<String> + Send + Sync),
) -> ControlError {
    match leader_node
        .map(|node| node.addr.clone())
        .or_else(|| leader_id.and_then(leader_address))
    {
        Some(leader) => ControlError::NotLeader { leader },
        None => ControlError::NoLeader,
    }
}

async fn write_batch(
    raft: Raft,
    mut jobs: Vec<AppendJob>,
    now: Timestamp,
    leader_address: Arc<dyn Fn(u64) -> Option<String> + Send + Sync>,
) {
    let mut all = Vec::with_capacity(jobs.iter().map(|job| job.records.len()).sum());
    let counts: Vec<usize> = jobs.iter().map(|job| job.records.len()).collect();
    for job in &mut jobs {
        for record in &mut job.records {
            record.at_nanos = now.nanos();
        }
        all.append(&mut job.records);
    }
    let all_count = all.len();
    // The records' bodies are the bytes the client sent (validated by the control service);
    // only the envelope is written here.
    let batch = EventBatchBytes(bytes::Bytes::from(gyre_log::encode_envelope(all)));
    let result = raft.client_write(batch).await;
    match result {
        Ok(response) => {
            let index = response.log_id.index;
            let mut refused: Vec<Option<String>> = vec![None; all_count];
            for (at, reason) in response
                .data
                .rejected
                .as_deref()
                .map(refused_positions)
                .unwrap_or_default()
            {
                if let Some(slot) = refused.get_mut(at) {
                    *slot = Some(reason);
                }
            }
            let mut position = 0usize;
            for (job, count) in jobs.into_iter().zip(counts) {
                let mut outcome = AppendOutcome::default();
                for _ in 0..count {
                    outcome
                        .sequences
                        .push((index, u32::try_from(position).unwrap_or(u32::MAX)));
                    outcome
                        .rejected
                        .push(refused.get_mut(position).and_then(Option::take));
                    position += 1;
                }
                let _ = job.reply.send(Ok(outcome));
            }
        }
        Err(error) => {
            let failure = || match error.forward_to_leader() {
                Some(forward) => forward_target(
                    forward.leader_id,
                    forward.leader_node.as_ref(),
                    &*leader_address,
                ),
                // A node that stops (shutdown, or a restart under way) hands its writes back as
                // retryable: another node takes over and the client's retry finds it.
                None if matches!(
                    error,
                    gyre_log::raft::openraft::error::RaftError::Fatal(
                        gyre_log::raft::openraft::error::Fatal::Stopped
                    )
                ) =>
                {
                    ControlError::ShuttingDown
                }
                None => ControlError::Raft(error.to_string()),
            };
            for job in jobs {
                let _ = job.reply.send(Err(failure()));
            }
        }
    }
}

#[cfg(test)]
mod forward_tests {
    use super::*;

    #[test]
    fn a_leader_whose_address_is_not_known_yet_is_no_leader() {
        let unknown = |_: u64| None;
        assert!(matches!(
            forward_target(Some(1), None, &unknown),
            ControlError::NoLeader
        ));
        assert!(matches!(
            forward_target(None, None, &unknown),
            ControlError::NoLeader
        ));
        let known = |id: u64| (id == 1).then(|| "127.0.0.1:7001".to_string());
        match forward_target(Some(1), None, &known) {
            ControlError::NotLeader { leader } => assert_eq!(leader, "127.0.0.1:7001"),
            other => panic!("expected NotLeader, got {other:?}"),
        }
        let node = gyre_log::raft::Node::new("127.0.0.1:7002");
        match forward_target(Some(2), Some(&node), &unknown) {
            ControlError::NotLeader { leader } => assert_eq!(leader, "127.0.0.1:7002"),
            other => panic!("expected NotLeader, got {other:?}"),
        }
    }
}
