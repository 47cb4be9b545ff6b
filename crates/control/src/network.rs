//! openraft's network over tonic: [`Network`] is the factory (one cached `Channel` per peer
//! address, shared by every client openraft makes), [`PeerClient`] sends one RPC at a time.
//!
//! Wire form (`proto/control.proto`, service `Raft`): openraft's types as JSON, except entry
//! payloads, which travel as protobuf bytes. Errors map as openraft expects: a transport failure
//! or a `Unavailable` status is `Unreachable` (back off), a message over the size limit is
//! `PayloadTooLarge` (openraft retries with fewer entries), the remote's `RaftError` is a
//! `RemoteError`, anything else a `NetworkError`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gyre_log::raft::openraft::error::{
    Fatal, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError, ReplicationClosed,
    StreamingError, Unreachable,
};
use gyre_log::raft::openraft::network::RPCOption;
use gyre_log::raft::openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use gyre_log::raft::openraft::{EntryPayload, RaftNetwork, RaftNetworkFactory};
use gyre_log::raft::{log_id, Entry, EventBatchBytes, Node, NodeId, Snapshot, TypeConfig, Vote};
use gyre_proto::control as pb;
use tonic::transport::{Channel, Endpoint};
use tonic::Code;

/// Largest gRPC message either side accepts: well above the log store's 8 MiB replication read
/// batch, so a batch of TITO records of a few MiB each fits.
pub const MESSAGE_BYTES_MAX: usize = 64 << 20;
/// Largest log entry, about (16 bytes of envelope per event plus its body); an append larger
/// than this is refused, never proposed. One entry must fit one AppendEntries message alone:
/// an entry no follower can take would be re-sent on every heartbeat, the followers would time
/// out and elect, and the client's retry would carry it to the next leader (an election storm
/// that stalls every other writer). Well under that: on a loaded 2-core host a follower busy
/// writing and syncing a 56 MiB entry missed heartbeats long enough to elect. 16 MiB holds a
/// TITO record of a 1M-token context.
pub const ENTRY_BYTES_MAX: usize = 16 << 20;
/// Snapshot data chunk size in a `FullSnapshot` stream.
pub const SNAPSHOT_CHUNK_BYTES: usize = 1 << 20;
/// Chunks read ahead of the stream when sending a snapshot.
const SNAPSHOT_CHUNKS_AHEAD: usize = 4;
/// Deadline for sending a whole snapshot (a large body on a slow disk).
pub const SNAPSHOT_DEADLINE: Duration = Duration::from_secs(120);

/// HTTP/2 flow-control window per stream, both directions. hyper's defaults (1 MiB on a server,
/// 2 MiB on a client) are below one replication batch of TITO records, so a batch waited for
/// window updates mid-message.
pub const STREAM_WINDOW_BYTES: u32 = 16 << 20;
/// HTTP/2 flow-control window per connection: one connection carries every writer's appends
/// and, towards a follower, every AppendEntries.
pub const CONNECTION_WINDOW_BYTES: u32 = 64 << 20;
/// Largest HTTP/2 DATA frame a peer may send us. hyper's default (16 KiB) split a 1 MiB record
/// into 64 frames, each its own buffer to copy into the message.
pub const FRAME_BYTES_MAX: u32 = 1 << 20;

/// A lazily connected channel to `address` (`host:port`).
pub fn channel(address: &str) -> Result<Channel, String> {
    let endpoint = Endpoint::from_shared(format!("http://{address}"))
        .map_err(|error| format!("bad address {address:?}: {error}"))?
        .connect_timeout(Duration::from_millis(500))
        .tcp_nodelay(true)
        .initial_stream_window_size(STREAM_WINDOW_BYTES)
        .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
        .max_frame_size(FRAME_BYTES_MAX)
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(5));
    Ok(endpoint.connect_lazy())
}

pub fn raft_client(channel: Channel) -> pb::raft_client::RaftClient<Channel> {
    pb::raft_client::RaftClient::new(channel)
        .max_decoding_message_size(MESSAGE_BYTES_MAX)
        .max_encoding_message_size(MESSAGE_BYTES_MAX)
}

/// The network factory: one channel per peer address, reused by every client.
#[derive(Clone)]
pub struct Network {
    channels: Arc<Mutex<BTreeMap<String, Channel>>>,
    /// Data bytes per `FullSnapshot` chunk.
    snapshot_chunk_bytes: usize,
}

impl Default for Network {
    fn default() -> Self {
        Network::with_snapshot_chunk_bytes(SNAPSHOT_CHUNK_BYTES)
    }
}

impl Network {
    /// A network sending snapshots in chunks of `bytes` (at least 1) of data.
    pub fn with_snapshot_chunk_bytes(bytes: usize) -> Self {
        Network {
            channels: Arc::default(),
            snapshot_chunk_bytes: bytes.max(1),
        }
    }

    fn channel_for(&self, address: &str) -> Result<Channel, String> {
        let mut channels = lock(&self.channels);
        if let Some(channel) = channels.get(address) {
            return Ok(channel.clone());
        }
        let made = channel(address)?;
        channels.insert(address.to_string(), made.clone());
        Ok(made)
    }
}

pub struct PeerClient {
    target: NodeId,
    address: String,
    client: Result<pb::raft_client::RaftClient<Channel>, String>,
    snapshot_chunk_bytes: usize,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &Node) -> Self::Network {
        PeerClient {
            target,
            address: node.addr.clone(),
            client: self.channel_for(&node.addr).map(raft_client),
            snapshot_chunk_bytes: self.snapshot_chunk_bytes,
        }
    }
}

type RpcError<E = RaftError<NodeId>> = RPCError<NodeId, Node, E>;

fn unreachable(detail: String) -> Unreachable {
    Unreachable::new(&std::io::Error::other(detail))
}

fn network_error(detail: String) -> NetworkError {
    NetworkError::new(&std::io::Error::other(detail))
}

fn to_json<T: serde::Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("openraft's message types always serialise")
}

/// openraft entries as protobuf entries: payload bytes stay bytes.
pub fn entries_to_proto(entries: &[Entry]) -> Vec<pb::RaftEntry> {
    entries
        .iter()
        .map(|entry| pb::RaftEntry {
            term: entry.log_id.leader_id.term,
            leader_node_id: entry.log_id.leader_id.node_id,
            index: entry.log_id.index,
            payload: Some(match &entry.payload {
                EntryPayload::Blank => pb::raft_entry::Payload::Blank(true),
                EntryPayload::Membership(membership) => {
                    pb::raft_entry::Payload::MembershipJson(to_json(membership))
                }
                EntryPayload::Normal(batch) => pb::raft_entry::Payload::Batch(batch.0.clone()),
            }),
        })
        .collect()
}

/// Back to openraft entries; a malformed entry is an error, never a panic.
pub fn entries_from_proto(entries: Vec<pb::RaftEntry>) -> Result<Vec<Entry>, String> {
    entries
        .into_iter()
        .map(|entry| {
            let payload = match entry.payload {
                Some(pb::raft_entry::Payload::Blank(_)) => EntryPayload::Blank,
                Some(pb::raft_entry::Payload::MembershipJson(json)) => EntryPayload::Membership(
                    serde_json::from_slice(&json)
                        .map_err(|error| format!("entry {}: membership: {error}", entry.index))?,
                ),
                Some(pb::raft_entry::Payload::Batch(bytes)) => {
                    EntryPayload::Normal(EventBatchBytes(bytes))
                }
                None => return Err(format!("entry {} has no payload", entry.index)),
            };
            Ok(Entry {
                log_id: log_id(entry.term, entry.leader_node_id, entry.index),
                payload,
            })
        })
        .collect()
}

impl PeerClient {
    fn client(&self) -> Result<pb::raft_client::RaftClient<Channel>, Unreachable> {
        self.client.clone().map_err(unreachable)
    }

    /// A reply's JSON `Result<T, E>` as the openraft result.
    fn reply<T, E>(&self, reply: pb::RaftReply) -> Result<Result<T, E>, NetworkError>
    where
        T: serde::de::DeserializeOwned,
        E: serde::de::DeserializeOwned,
    {
        serde_json::from_slice(&reply.result_json).map_err(|error| {
            network_error(format!(
                "node {} sent a reply that does not parse: {error}",
                self.target
            ))
        })
    }

    fn transport<E: std::error::Error>(
        &self,
        status: tonic::Status,
        entries: usize,
    ) -> RPCError<NodeId, Node, E> {
        let detail = format!(
            "node {} at {}: {}",
            self.target,
            self.address,
            status.message()
        );
        match status.code() {
            Code::OutOfRange | Code::ResourceExhausted if entries > 1 => {
                RPCError::PayloadTooLarge(PayloadTooLarge::new_entries_hint((entries / 2) as u64))
            }
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown => {
                RPCError::Unreachable(unreachable(detail))
            }
            _ => RPCError::Network(network_error(detail)),
        }
    }
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RpcError> {
        let entries_count = rpc.entries.len();
        let request = pb::AppendEntriesRequest {
            vote_json: to_json(&rpc.vote),
            prev_log_id_json: to_json(&rpc.prev_log_id),
            leader_commit_json: to_json(&rpc.leader_commit),
            entries: entries_to_proto(&rpc.entries),
        };
        let mut request = tonic::Request::new(request);
        request.set_timeout(option.hard_ttl());
        let reply = self
            .client()?
            .append_entries(request)
            .await
            .map_err(|status| self.transport(status, entries_count))?
            .into_inner();
        self.reply::<_, RaftError<NodeId>>(reply)?
            .map_err(|error| RPCError::RemoteError(RemoteError::new(self.target, error)))
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RpcError> {
        let mut request = tonic::Request::new(pb::JsonMessage {
            json: to_json(&rpc),
        });
        request.set_timeout(option.hard_ttl());
        let reply = self
            .client()?
            .vote(request)
            .await
            .map_err(|status| self.transport(status, 0))?
            .into_inner();
        self.reply::<_, RaftError<NodeId>>(reply)?
            .map_err(|error| RPCError::RemoteError(RemoteError::new(self.target, error)))
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        _cancel: impl std::future::Future<Output = ReplicationClosed> + Send + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<NodeId>, StreamingError<TypeConfig, Fatal<NodeId>>> {
        // The file is read a chunk at a time on a blocking thread while the stream sends, a
        // few chunks ahead at most: a snapshot of gigabytes is never in memory whole (it was,
        // twice, when read up front and then cut into chunks).
        let file = snapshot.snapshot.clone();
        let (chunks, queued) = tokio::sync::mpsc::channel(SNAPSHOT_CHUNKS_AHEAD);
        let read_failed: Arc<Mutex<Option<String>>> = Arc::default();
        let runtime = tokio::runtime::Handle::current();
        let chunk_bytes = self.snapshot_chunk_bytes;
        {
            let read_failed = read_failed.clone();
            tokio::task::spawn_blocking(move || {
                let failed = |detail: String| *lock(&read_failed) = Some(detail);
                let reader = match file.chunks(chunk_bytes) {
                    Ok(reader) => reader,
                    Err(error) => return failed(error.to_string()),
                };
                for chunk in reader {
                    let data = match chunk {
                        Ok(data) => data,
                        Err(error) => return failed(error.to_string()),
                    };
                    let chunk = pb::SnapshotChunk {
                        vote_json: Vec::new(),
                        meta_json: Vec::new(),
                        data,
                    };
                    // Bounded by the send's own deadline: a stream that stopped being read
                    // (the call failed) does not hold this thread.
                    let sent = runtime
                        .block_on(tokio::time::timeout(SNAPSHOT_DEADLINE, chunks.send(chunk)));
                    if !matches!(sent, Ok(Ok(()))) {
                        return;
                    }
                }
            });
        }
        let first = pb::SnapshotChunk {
            vote_json: to_json(&vote),
            meta_json: to_json(&snapshot.meta),
            data: Vec::new(),
        };
        let stream = tokio_stream::StreamExt::chain(
            tokio_stream::once(first),
            tokio_stream::wrappers::ReceiverStream::new(queued),
        );
        let mut request = tonic::Request::new(stream);
        request.set_timeout(SNAPSHOT_DEADLINE);
        let sent = self.client()?.full_snapshot(request).await;
        // A read that failed cut the stream short (the receiver refuses the short file): the
        // read is the error to report.
        if let Some(detail) = lock(&read_failed).take() {
            return Err(StreamingError::Network(network_error(format!(
                "reading snapshot to send: {detail}"
            ))));
        }
        let reply = sent
            .map_err(|status| match self.transport::<Fatal<NodeId>>(status, 0) {
                RPCError::Unreachable(error) => StreamingError::Unreachable(error),
                RPCError::Timeout(error) => StreamingError::Timeout(error),
                RPCError::Network(error) => StreamingError::Network(error),
                other => StreamingError::Network(network_error(other.to_string())),
            })?
            .into_inner();
        self.reply::<_, Fatal<NodeId>>(reply)?
            .map_err(|error| StreamingError::RemoteError(RemoteError::new(self.target, error)))
    }
}

/// Locks `mutex`, taking the data of a poisoned one (a panic elsewhere must not stop
/// replication).
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
