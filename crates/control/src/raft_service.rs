//! The `Raft` gRPC service: hands peers' requests to the local `Raft` and answers with the JSON
//! of openraft's `Result`. Bytes from the network are parsed, never trusted: anything malformed
//! is an `InvalidArgument` status.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use gyre_log::raft::openraft::raft::{AppendEntriesRequest, VoteRequest};
use gyre_log::raft::{
    NodeId, Raft, RaftStoreError, ReceivingSnapshot, Snapshot, SnapshotMeta, TypeConfig, Vote,
};
use gyre_proto::control as pb;
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status, Streaming};

use crate::network::{entries_from_proto, MESSAGE_BYTES_MAX};
use crate::status::bad_json;

/// Largest snapshot this node accepts over the network.
const SNAPSHOT_BYTES_MAX: u64 = 16 << 30;

pub struct RaftService {
    raft: Raft,
    snapshot_dir: PathBuf,
    received: Arc<AtomicU64>,
    /// The state machine's gate: a received snapshot is pending there until it settles.
    installs: Arc<gyre_log::raft::InstallGate>,
}

impl RaftService {
    pub fn new(raft: Raft, data_dir: PathBuf, installs: Arc<gyre_log::raft::InstallGate>) -> Self {
        RaftService {
            raft,
            snapshot_dir: data_dir.join("snapshots"),
            received: Arc::new(AtomicU64::new(0)),
            installs,
        }
    }

    pub fn server(self) -> pb::raft_server::RaftServer<Self> {
        pb::raft_server::RaftServer::new(self)
            .max_decoding_message_size(MESSAGE_BYTES_MAX)
            .max_encoding_message_size(MESSAGE_BYTES_MAX)
    }
}

fn reply<T: serde::Serialize>(result: &T) -> Result<Response<pb::RaftReply>, Status> {
    let result_json = serde_json::to_vec(result)
        .map_err(|error| Status::internal(format!("reply does not serialise: {error}")))?;
    Ok(Response::new(pb::RaftReply { result_json }))
}

#[tonic::async_trait]
impl pb::raft_server::Raft for RaftService {
    async fn append_entries(
        &self,
        request: Request<pb::AppendEntriesRequest>,
    ) -> Result<Response<pb::RaftReply>, Status> {
        let request = request.into_inner();
        let rpc = AppendEntriesRequest::<TypeConfig> {
            vote: serde_json::from_slice(&request.vote_json).map_err(|e| bad_json("vote", e))?,
            prev_log_id: serde_json::from_slice(&request.prev_log_id_json)
                .map_err(|e| bad_json("prev_log_id", e))?,
            leader_commit: serde_json::from_slice(&request.leader_commit_json)
                .map_err(|e| bad_json("leader_commit", e))?,
            entries: entries_from_proto(request.entries).map_err(Status::invalid_argument)?,
        };
        reply(&self.raft.append_entries(rpc).await)
    }

    async fn vote(
        &self,
        request: Request<pb::JsonMessage>,
    ) -> Result<Response<pb::RaftReply>, Status> {
        let rpc: VoteRequest<NodeId> = serde_json::from_slice(&request.into_inner().json)
            .map_err(|e| bad_json("vote request", e))?;
        reply(&self.raft.vote(rpc).await)
    }

    async fn full_snapshot(
        &self,
        request: Request<Streaming<pb::SnapshotChunk>>,
    ) -> Result<Response<pb::RaftReply>, Status> {
        let mut stream = request.into_inner();
        let first = stream
            .next()
            .await
            .ok_or_else(|| Status::invalid_argument("empty snapshot stream"))??;
        let vote: Vote =
            serde_json::from_slice(&first.vote_json).map_err(|e| bad_json("snapshot vote", e))?;
        let meta: SnapshotMeta =
            serde_json::from_slice(&first.meta_json).map_err(|e| bad_json("snapshot meta", e))?;
        let sequence = self.received.fetch_add(1, Ordering::Relaxed);
        // `incoming-` files in the snapshot directory are the state machine's own: it moves
        // them into place once the snapshot is installed, and removes them at the next open if
        // the node died meanwhile (or when the handle drops, if a transfer is cut short).
        let path = self.snapshot_dir.join(format!(
            "incoming-rpc-{}-{sequence}.snap",
            std::process::id()
        ));
        let installs = self.installs.clone();
        let mut receiving = blocking(move || ReceivingSnapshot::create(path, &installs)).await?;
        // Each chunk is written as it arrives: the snapshot is never in memory whole here.
        let mut next = first.data;
        loop {
            if receiving.len().saturating_add(next.len() as u64) > SNAPSHOT_BYTES_MAX {
                return Err(Status::resource_exhausted("snapshot larger than 16 GiB"));
            }
            if !next.is_empty() {
                receiving = blocking(move || receiving.write(&next).map(|()| receiving)).await?;
            }
            match stream.next().await {
                Some(chunk) => next = chunk?.data,
                None => break,
            }
        }
        let file = blocking(move || receiving.finish()).await?;
        let snapshot = Snapshot {
            meta,
            snapshot: Box::new(file),
        };
        reply(&self.raft.install_full_snapshot(vote, snapshot).await)
    }
}

/// Runs a step of storing a received snapshot on the blocking pool; its failure is a status
/// naming it: `DataLoss` for a snapshot that arrived cut short or damaged (the sender tries
/// again; nothing is installed), `Internal` for this node's own trouble.
async fn blocking<T: Send + 'static>(
    step: impl FnOnce() -> Result<T, RaftStoreError> + Send + 'static,
) -> Result<T, Status> {
    tokio::task::spawn_blocking(step)
        .await
        .map_err(|join| Status::internal(format!("snapshot writer task failed: {join}")))?
        .map_err(|error| match error {
            RaftStoreError::BadSnapshot { .. } => {
                Status::data_loss(format!("received snapshot refused: {error}"))
            }
            error => Status::internal(format!("storing received snapshot: {error}")),
        })
}
