//! The `Control` gRPC service: appends (through the proposer, forwarded to the leader when this
//! node is not it), subscriptions and export read from the local log, status, membership.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use gyre_log::raft::openraft::{BasicNode, EntryPayload, RaftLogReader};
use gyre_log::raft::{read_meta, LogStoreHandle, NodeId, Raft, StateMachineStore};
use gyre_proto::control as pb;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::error::ControlError;
use crate::network::{channel, ENTRY_BYTES_MAX, MESSAGE_BYTES_MAX};
use crate::projection::ControlProjection;
use crate::proposer::AppendJob;
use crate::status::{from_status, to_status};

/// Metadata key set on a forwarded append, so a request is forwarded at most once.
const FORWARDED: &str = "gyre-forwarded";
/// Entries read from the log per step of a subscription or export.
const READ_ENTRIES_MAX: u64 = 256;
/// Buffered messages per subscription stream.
const STREAM_BUFFER: usize = 64;

pub struct ControlService {
    pub id: NodeId,
    pub raft: Raft,
    pub state_machine: StateMachineStore<ControlProjection>,
    pub log: LogStoreHandle,
    pub data_dir: std::path::PathBuf,
    pub jobs: mpsc::Sender<AppendJob>,
    pub leader_channels: Arc<std::sync::Mutex<BTreeMap<String, Channel>>>,
    pub fatal: Arc<std::sync::Mutex<Option<String>>>,
}

pub fn control_client(channel: Channel) -> pb::control_client::ControlClient<Channel> {
    pb::control_client::ControlClient::new(channel)
        .max_decoding_message_size(MESSAGE_BYTES_MAX)
        .max_encoding_message_size(MESSAGE_BYTES_MAX)
}

/// How long a read of "everything committed so far" waits for this node to confirm its
/// leadership and apply up to the read index.
const LINEARIZABLE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

impl ControlService {
    /// The applied index a linearizable read of "everything committed so far" ends at: this
    /// node must be the leader, confirmed by a quorum's heartbeat replies, and have applied
    /// everything committed before the call.
    async fn linearizable_end(&self) -> Result<u64, ControlError> {
        use gyre_log::raft::openraft::error::{CheckIsLeaderError, Fatal, RaftError};
        // openraft waits without a bound for the state machine to reach the read index (a
        // leader that loses its quorum before its first entry commits would hold the request
        // forever): past the bound it is "no leader", which the client retries elsewhere.
        let confirmed = tokio::time::timeout(LINEARIZABLE_WAIT, self.raft.ensure_linearizable())
            .await
            .map_err(|_| ControlError::NoLeader)?;
        match confirmed {
            Ok(_) => Ok(self
                .state_machine
                .with_projection(|_, last| last.map_or(0, |log_id| log_id.index))),
            Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(forward))) => {
                Err(match forward.leader_node {
                    Some(node) => ControlError::NotLeader { leader: node.addr },
                    None => ControlError::NoLeader,
                })
            }
            Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(_))) => {
                Err(ControlError::NoLeader)
            }
            Err(RaftError::Fatal(Fatal::Stopped)) => Err(ControlError::ShuttingDown),
            Err(error) => Err(ControlError::Raft(error.to_string())),
        }
    }

    pub fn server(self) -> pb::control_server::ControlServer<Self> {
        pb::control_server::ControlServer::new(self)
            .max_decoding_message_size(MESSAGE_BYTES_MAX)
            .max_encoding_message_size(MESSAGE_BYTES_MAX)
    }

    fn leader_client(
        &self,
        address: &str,
    ) -> Result<pb::control_client::ControlClient<Channel>, ControlError> {
        let mut channels = self
            .leader_channels
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let made = match channels.get(address) {
            Some(channel) => channel.clone(),
            None => {
                let made = channel(address).map_err(ControlError::BadRequest)?;
                channels.insert(address.to_string(), made.clone());
                made
            }
        };
        Ok(control_client(made))
    }

    async fn append(
        &self,
        batch: bytes::Bytes,
        forwarded: bool,
    ) -> Result<pb::AppendEventsReply, ControlError> {
        // Decoded in place: record bodies and token arrays are slices of the request's bytes
        // (which are themselves a slice of the gRPC message buffer).
        // Validated here (every record decodes); the proposer then only re-stamps `at`.
        let records = gyre_log::validated_records(&batch)?;
        if records.is_empty() {
            return Err(ControlError::BadRequest(
                "the batch holds no events".to_string(),
            ));
        }
        let entry_bytes: usize = records.iter().map(crate::proposer::record_bytes).sum();
        if entry_bytes > ENTRY_BYTES_MAX {
            return Err(ControlError::BadRequest(format!(
                "the batch of {} events is {entry_bytes} bytes as a log entry; one append \
                 carries at most {ENTRY_BYTES_MAX} (a Raft entry must fit one replication \
                 message): send its events in smaller appends",
                records.len()
            )));
        }
        // Every replica checks a digest against its own projection and halts on a mismatch; one
        // from a client (a tail of another cluster piped into `gyre log append`, or a made-up
        // hash) would stop the whole quorum, again on every restart. Only the leader's proposer
        // writes them.
        if let Some(position) = records.iter().position(|record| {
            gyre_log::codec::kind_from_number(record.kind)
                == Some(gyre_log::codec::EventKind::ProjectionDigest)
        }) {
            return Err(ControlError::BadRequest(format!(
                "event {position}: `projection_digest` events are written by the leader only, \
                 never appended by a client"
            )));
        }
        let (reply, answer) = oneshot::channel();
        self.jobs
            .send(AppendJob { records, reply })
            .await
            .map_err(|_| ControlError::ShuttingDown)?;
        match answer.await.map_err(|_| ControlError::ShuttingDown)? {
            Ok(outcome) => Ok(pb::AppendEventsReply {
                sequences: outcome
                    .sequences
                    .iter()
                    .map(|(index, position)| pb::Sequence {
                        index: *index,
                        position: *position,
                    })
                    .collect(),
                rejected: outcome
                    .rejected
                    .into_iter()
                    .map(Option::unwrap_or_default)
                    .collect(),
            }),
            Err(ControlError::NotLeader { leader }) if !forwarded => {
                let mut request = Request::new(pb::AppendEventsRequest {
                    batch: batch.clone(),
                });
                request
                    .metadata_mut()
                    .insert(FORWARDED, tonic::metadata::MetadataValue::from_static("1"));
                self.leader_client(&leader)?
                    .append_events(request)
                    .await
                    .map(Response::into_inner)
                    .map_err(|status| from_status(&leader, status))
            }
            Err(error) => Err(error),
        }
    }

    fn status(&self) -> pb::StatusReply {
        let metrics = self.raft.metrics().borrow().clone();
        let (last_applied, digest, events_applied) =
            self.state_machine.with_projection(|projection, last| {
                (
                    last.map_or(0, |log_id| log_id.index),
                    gyre_log::file::hex(&gyre_log::raft::Projection::digest(projection)),
                    projection.state.events_applied,
                )
            });
        let membership = metrics.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let members = membership
            .nodes()
            .map(|(id, node)| pb::Member {
                id: *id,
                address: node.addr.clone(),
                voter: voters.contains(id),
            })
            .collect();
        let leader_address = metrics
            .current_leader
            .and_then(|leader| membership.get_node(&leader).map(|node| node.addr.clone()))
            .unwrap_or_default();
        let commit_index = read_meta(&self.data_dir)
            .ok()
            .and_then(|meta| meta.committed)
            .map_or(0, |log_id| log_id.index)
            .max(last_applied);
        let mut fatal = self
            .fatal
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .unwrap_or_default();
        if let Err(error) = &metrics.running_state {
            fatal = error.to_string();
        }
        pb::StatusReply {
            node_id: self.id,
            leader_id: metrics.current_leader.unwrap_or(0),
            leader_address,
            term: metrics.current_term,
            commit_index,
            last_applied_index: last_applied,
            last_log_index: metrics.last_log_index.unwrap_or(0),
            digest_hex: digest,
            server_state: format!("{:?}", metrics.state),
            members,
            events_applied,
            fatal,
            purged_index: metrics.purged.map_or(0, |log_id| log_id.index),
            archive_bytes: self.log.stats().archive_bytes,
            archive_segments: self.log.stats().archive_segments,
            archive_segments_deleted: self.log.stats().archive_segments_deleted,
        }
    }

    fn applied_index(&self) -> u64 {
        self.state_machine
            .with_projection(|_, last| last.map_or(0, |log_id| log_id.index))
    }
}

fn members_map(members: &[pb::Member]) -> Result<BTreeMap<NodeId, BasicNode>, ControlError> {
    if members.is_empty() {
        return Err(ControlError::BadRequest("no members given".to_string()));
    }
    let mut map = BTreeMap::new();
    for member in members {
        if member.id == 0 {
            return Err(ControlError::BadRequest(
                "node id 0 is reserved; ids start at 1".to_string(),
            ));
        }
        if member.address.is_empty() {
            return Err(ControlError::BadRequest(format!(
                "node {} has no address",
                member.id
            )));
        }
        if map
            .insert(member.id, BasicNode::new(member.address.clone()))
            .is_some()
        {
            return Err(ControlError::BadRequest(format!(
                "node {} is listed twice",
                member.id
            )));
        }
    }
    Ok(map)
}

/// Streams the entries `[from, before)`, which the log store no longer serves (purged behind a
/// snapshot), from the node's segment files (`gyre_log::raft::archive::read_entries`: the
/// archive and the live log's first segment) to `sender`, each made a message by `to_message`
/// (given the index, term and the event batch, `None` for a blank or membership entry; it
/// returns `None` to send nothing). With `exact` the files must hold entry `from` itself (a
/// subscription names where it starts); otherwise they may begin later (an export of what is
/// left). Returns the index after the last entry read (`from` when the files hold none of
/// them), or `None` once the stream is over: the client went away, or the files could not be
/// read, do not reach back to `from` with `exact`, or end before `before` (an error was sent).
async fn stream_purged<M: Send + 'static>(
    data_dir: std::path::PathBuf,
    from: u64,
    before: u64,
    exact: bool,
    sender: mpsc::Sender<Result<M, Status>>,
    mut to_message: impl FnMut(u64, u64, Option<&[u8]>) -> Option<M> + Send + 'static,
) -> Option<u64> {
    use gyre_log::raft::record::{split_payload, RecordKind};

    let files = sender.clone();
    let read = tokio::task::spawn_blocking(move || {
        let mut first = None;
        let read = gyre_log::raft::archive::read_entries(&data_dir, from, before, |entry| {
            if exact && *first.get_or_insert(entry.index) != from {
                return false;
            }
            let body = match split_payload(entry.payload) {
                Ok((RecordKind::Events, _, body)) => Some(body),
                _ => None,
            };
            match to_message(entry.index, entry.term, body) {
                Some(message) => files.blocking_send(Ok(message)).is_ok(),
                None => !files.is_closed(),
            }
        });
        (read, first)
    })
    .await;
    let problem = match read {
        Ok((Ok(_), first)) if exact && first.is_none_or(|first| first != from) => {
            to_status(ControlError::Purged {
                index: from,
                first: first.unwrap_or(before),
            })
        }
        Ok((Ok(after), _)) if after > from && after < before => Status::data_loss(format!(
            "the segment files end at entry {after}, before entry {before} where the log \
             store's entries begin"
        )),
        Ok((Ok(after), _)) => return (!sender.is_closed()).then_some(after),
        Ok((Err(error), _)) => Status::data_loss(format!(
            "reading purged entries from the segment files: {error}"
        )),
        Err(error) => Status::internal(format!("reading purged entries: {error}")),
    };
    let _ = sender.send(Err(problem)).await;
    None
}

/// Reads up to `READ_ENTRIES_MAX` entries from `next` to `upto` (inclusive); an index below the
/// first kept entry is `Purged`.
async fn read_entries(
    log: &LogStoreHandle,
    next: u64,
    upto: u64,
) -> Result<Vec<gyre_log::raft::Entry>, ControlError> {
    let end = upto
        .saturating_add(1)
        .min(next.saturating_add(READ_ENTRIES_MAX));
    let mut reader = log.reader();
    let entries = reader
        .try_get_log_entries(next..end)
        .await
        .map_err(|error| ControlError::Raft(error.to_string()))?;
    if let Some(first) = entries.first() {
        if first.log_id.index > next && next > 0 {
            return Err(ControlError::Purged {
                index: next,
                first: first.log_id.index,
            });
        }
    } else if next < end {
        return Err(ControlError::Purged {
            index: next,
            first: end,
        });
    }
    Ok(entries)
}

#[tonic::async_trait]
impl pb::control_server::Control for ControlService {
    async fn append_events(
        &self,
        request: Request<pb::AppendEventsRequest>,
    ) -> Result<Response<pb::AppendEventsReply>, Status> {
        let forwarded = request.metadata().contains_key(FORWARDED);
        self.append(request.into_inner().batch, forwarded)
            .await
            .map(Response::new)
            .map_err(to_status)
    }

    type SubscribeStream = ReceiverStream<Result<pb::CommittedEntry, Status>>;

    async fn subscribe(
        &self,
        request: Request<pb::SubscribeRequest>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let request = request.into_inner();
        // "Everything committed so far" is a linearizable read: only a leader that a quorum
        // still follows knows where that ends, and it streams up to what it has applied once
        // everything committed before the request is applied. A follower, or a deposed leader
        // that has not noticed yet, refuses, and the client asks another node.
        let end = if request.stop_at_end {
            Some(self.linearizable_end().await.map_err(to_status)?)
        } else {
            None
        };
        let (sender, receiver) = mpsc::channel(STREAM_BUFFER);
        let log = self.log.clone();
        let state_machine = self.state_machine.clone();
        let mut metrics = self.raft.metrics();
        let first_kept = metrics.borrow().purged.map_or(1, |log_id| log_id.index + 1);
        let data_dir = self.data_dir.clone();
        // Task "subscribe": owned by its stream; it ends when the client goes away.
        tokio::spawn(async move {
            let mut next = request.from_index.max(1);
            let mut skip = request.from_position;
            let (from_index, from_position) = (request.from_index, request.from_position);
            let to_message = move |index, _term, body: Option<&[u8]>| {
                let body = body?;
                if index == from_index && from_position > 0 {
                    let events = gyre_log::decode_batch(body).ok()?;
                    let from = (from_position as usize).min(events.len());
                    return Some(pb::CommittedEntry {
                        index,
                        first_position: u32::try_from(from).unwrap_or(u32::MAX),
                        batch: gyre_log::encode_batch(&events[from..]),
                    });
                }
                Some(pb::CommittedEntry {
                    index,
                    first_position: 0,
                    batch: body.to_vec(),
                })
            };
            let mut first_kept = first_kept;
            loop {
                if next < first_kept {
                    // Purged behind a snapshot: from the segment files (the archive, and the
                    // live log's first segment), which must hold `next` itself.
                    let sent = stream_purged(
                        data_dir.clone(),
                        next,
                        first_kept,
                        true,
                        sender.clone(),
                        to_message,
                    );
                    match sent.await {
                        Some(after) if after > next => {
                            next = after;
                            skip = 0;
                        }
                        Some(_) => {}
                        None => return,
                    }
                }
                let applied =
                    state_machine.with_projection(|_, last| last.map_or(0, |log_id| log_id.index));
                let applied = end.unwrap_or(applied);
                if next > applied {
                    if end.is_some() {
                        return;
                    }
                    tokio::select! {
                        changed = metrics.changed() => if changed.is_err() { return },
                        _ = sender.closed() => return,
                    }
                    continue;
                }
                let entries = match read_entries(&log, next, applied).await {
                    Ok(entries) => entries,
                    // A purge ran since the last read: what it removed is read from the files.
                    Err(ControlError::Purged { first, .. }) if first > next => {
                        first_kept = first;
                        continue;
                    }
                    Err(error) => {
                        let _ = sender.send(Err(to_status(error))).await;
                        return;
                    }
                };
                for entry in entries {
                    next = entry.log_id.index + 1;
                    // The position counts within the entry the client named, never the next
                    // one (the named entry may be blank, a membership change or unreadable).
                    if entry.log_id.index != request.from_index {
                        skip = 0;
                    }
                    let EntryPayload::Normal(batch) = entry.payload else {
                        continue;
                    };
                    let message = if skip > 0 {
                        let Ok(events) = gyre_log::decode_batch(&batch.0) else {
                            continue;
                        };
                        let from = (skip as usize).min(events.len());
                        let message = pb::CommittedEntry {
                            index: entry.log_id.index,
                            first_position: u32::try_from(from).unwrap_or(u32::MAX),
                            batch: gyre_log::encode_batch(&events[from..]),
                        };
                        skip = 0;
                        message
                    } else {
                        pb::CommittedEntry {
                            index: entry.log_id.index,
                            first_position: 0,
                            batch: batch.0.to_vec(),
                        }
                    };
                    if sender.send(Ok(message)).await.is_err() {
                        return;
                    }
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(receiver)))
    }

    async fn status(
        &self,
        _request: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusReply>, Status> {
        Ok(Response::new(self.status()))
    }

    async fn read_execution(
        &self,
        request: Request<pb::ReadExecutionRequest>,
    ) -> Result<Response<pb::ReadExecutionReply>, Status> {
        let request = request.into_inner();
        let (execution, responses_only) = (
            gyre_event::ExecutionId(request.execution),
            request.responses_only,
        );
        let (applied_index, records, responses, closed) =
            self.state_machine.with_projection(|projection, last| {
                let records = projection
                    .state
                    .trajectories
                    .trees
                    .get(&execution)
                    .filter(|_| !responses_only)
                    .map(|tree| tree.records())
                    .unwrap_or_default();
                // The scheduler drops an execution once an optimizer step consumed its group;
                // scoring keeps every execution's close for the run.
                let closed = projection.state.execution_closed(execution);
                let responses = projection
                    .state
                    .responses
                    .executions
                    .get(&execution)
                    .map(|held| held.records.clone())
                    .unwrap_or_default();
                (
                    last.map_or(0, |log_id| log_id.index),
                    records,
                    responses,
                    closed,
                )
            });
        let events: Vec<gyre_event::Event> = records
            .into_iter()
            .map(|record| gyre_event::EventBody::ModelCall(Box::new(record)))
            .chain(
                responses
                    .into_iter()
                    .map(|record| gyre_event::EventBody::ResponseStored(Box::new(record))),
            )
            .map(|body| gyre_event::Event::new(gyre_event::Timestamp::ZERO, body))
            .collect();
        let batch = if events.is_empty() {
            Vec::new()
        } else {
            gyre_log::encode_batch(&events)
        };
        Ok(Response::new(pb::ReadExecutionReply {
            applied_index,
            batch,
            closed,
        }))
    }

    async fn initialize(
        &self,
        request: Request<pb::MembershipRequest>,
    ) -> Result<Response<pb::StatusReply>, Status> {
        let members = members_map(&request.into_inner().members).map_err(to_status)?;
        self.raft
            .initialize(members)
            .await
            .map_err(|error| to_status(ControlError::Raft(error.to_string())))?;
        Ok(Response::new(self.status()))
    }

    async fn change_membership(
        &self,
        request: Request<pb::MembershipRequest>,
    ) -> Result<Response<pb::StatusReply>, Status> {
        let request = request.into_inner();
        let members = members_map(&request.members).map_err(to_status)?;
        let known: BTreeSet<NodeId> = self
            .raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .nodes()
            .map(|(id, _)| *id)
            .collect();
        for (id, node) in &members {
            if !known.contains(id) {
                self.raft
                    .add_learner(*id, node.clone(), true)
                    .await
                    .map_err(|error| to_status(ControlError::Raft(error.to_string())))?;
            }
        }
        let voters: BTreeSet<NodeId> = request
            .members
            .iter()
            .filter(|m| m.voter)
            .map(|m| m.id)
            .collect();
        if !voters.is_empty() {
            self.raft
                .change_membership(voters, false)
                .await
                .map_err(|error| to_status(ControlError::Raft(error.to_string())))?;
        }
        Ok(Response::new(self.status()))
    }

    type ExportLogStream = ReceiverStream<Result<pb::ExportedEntry, Status>>;

    async fn export_log(
        &self,
        request: Request<pb::ExportRequest>,
    ) -> Result<Response<Self::ExportLogStream>, Status> {
        let mut first_kept = self
            .raft
            .metrics()
            .borrow()
            .purged
            .map_or(1, |log_id| log_id.index + 1);
        // Entry 0 is openraft's initial membership, never exported.
        let from = request.into_inner().from_index.max(1);
        let mut next = from;
        let upto = self.applied_index();
        let log = self.log.clone();
        let data_dir = self.data_dir.clone();
        let (sender, receiver) = mpsc::channel(STREAM_BUFFER);
        // Task "export": owned by its stream; it ends at the applied index of the request time.
        tokio::spawn(async move {
            let empty = gyre_log::encode_batch(&[]);
            let to_message = {
                let empty = empty.clone();
                move |index, term, body: Option<&[u8]>| {
                    Some(pb::ExportedEntry {
                        index,
                        term,
                        batch: body.map_or_else(|| empty.clone(), <[u8]>::to_vec),
                    })
                }
            };
            'purged: loop {
                if next < first_kept {
                    // Entries purged behind a snapshot: from the segment files (the archive,
                    // and the live log's first segment, which may still hold purged entries).
                    // The first read may begin later than asked (a node without an archive
                    // exports what it holds); a later one continues what was sent, exactly.
                    let before = first_kept.min(upto.saturating_add(1));
                    let exact = next > from;
                    let sent = stream_purged(
                        data_dir.clone(),
                        next,
                        before,
                        exact,
                        sender.clone(),
                        to_message.clone(),
                    );
                    match sent.await {
                        Some(after) => next = after.max(before),
                        None => return,
                    }
                }
                while next <= upto {
                    let entries = match read_entries(&log, next, upto).await {
                        Ok(entries) => entries,
                        // A purge ran since: read what it removed from the files, go on.
                        Err(ControlError::Purged { first, .. }) if first > next => {
                            first_kept = first;
                            continue 'purged;
                        }
                        Err(error) => {
                            let _ = sender.send(Err(to_status(error))).await;
                            return;
                        }
                    };
                    for entry in entries {
                        next = entry.log_id.index + 1;
                        let batch = match entry.payload {
                            EntryPayload::Normal(batch) => batch.0.to_vec(),
                            EntryPayload::Blank | EntryPayload::Membership(_) => empty.clone(),
                        };
                        let message = pb::ExportedEntry {
                            index: entry.log_id.index,
                            term: entry.log_id.leader_id.term,
                            batch,
                        };
                        if sender.send(Ok(message)).await.is_err() {
                            return;
                        }
                    }
                }
                return;
            }
        });
        Ok(Response::new(ReceiverStream::new(receiver)))
    }
}
