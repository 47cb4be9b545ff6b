//! [`ClusterClient`]: what `gyre log` / `gyre control` use to talk to a cluster. It keeps one
//! channel per node address, sends appends to the last known leader and, on an unreachable node
//! or an election, tries the others until a deadline.
//!
//! Retries make appends at-least-once: an append whose answer was lost (the node died after
//! committing) may be committed twice if retried. Callers that need exactly-once put an id in
//! their events.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use gyre_event::Event;
use gyre_proto::control as pb;
use tonic::transport::Channel;

use crate::control_service::control_client;
use crate::error::ControlError;
use crate::network::channel;
use crate::status::from_status;

/// An event's place in the log: (raft index, position in that entry's batch).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Sequence {
    pub index: u64,
    pub position: u32,
}

impl std::fmt::Display for Sequence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.index, self.position)
    }
}

impl std::str::FromStr for Sequence {
    type Err = String;

    /// `INDEX` or `INDEX.POSITION`.
    fn from_str(text: &str) -> Result<Self, String> {
        let (index, position) = text.split_once('.').unwrap_or((text, "0"));
        Ok(Sequence {
            index: index
                .parse()
                .map_err(|_| format!("sequence {text:?}: index is not an integer"))?,
            position: position
                .parse()
                .map_err(|_| format!("sequence {text:?}: position is not an integer"))?,
        })
    }
}

/// Cloning is cheap: clones share the channels' connections and the last known leader.
#[derive(Clone)]
pub struct ClusterClient {
    addresses: Vec<String>,
    channels: BTreeMap<String, Channel>,
    preferred: Arc<AtomicUsize>,
    pub retry_deadline: Duration,
}

impl ClusterClient {
    /// A client for the nodes at `addresses` (`host:port`, comma-separated lists are split).
    pub fn new(addresses: &str) -> Result<Self, ControlError> {
        let addresses: Vec<String> = addresses
            .split(',')
            .map(|address| address.trim().to_string())
            .filter(|address| !address.is_empty())
            .collect();
        if addresses.is_empty() {
            return Err(ControlError::Invalid("no node addresses given".to_string()));
        }
        let mut channels = BTreeMap::new();
        for address in &addresses {
            channels.insert(
                address.clone(),
                channel(address).map_err(ControlError::Invalid)?,
            );
        }
        Ok(ClusterClient {
            addresses,
            channels,
            preferred: Arc::new(AtomicUsize::new(0)),
            retry_deadline: Duration::from_secs(15),
        })
    }

    pub fn addresses(&self) -> &[String] {
        &self.addresses
    }

    fn client(
        &mut self,
        address: &str,
    ) -> Result<pb::control_client::ControlClient<Channel>, ControlError> {
        if !self.channels.contains_key(address) {
            let made = channel(address).map_err(ControlError::BadRequest)?;
            self.channels.insert(address.to_string(), made);
        }
        let channel = self
            .channels
            .get(address)
            .cloned()
            .ok_or(ControlError::NoLeader)?;
        Ok(control_client(channel))
    }

    /// Appends `events` as one request; returns one sequence per event and per-event refusals
    /// (empty string: folded). Retries other nodes on unreachable nodes and elections.
    pub async fn append(
        &mut self,
        events: &[Event],
    ) -> Result<(Vec<Sequence>, Vec<String>), ControlError> {
        self.append_encoded(gyre_log::encode_batch(events)).await
    }

    /// [`ClusterClient::append`] for an already encoded `EventBatch`.
    pub async fn append_encoded(
        &mut self,
        batch: Vec<u8>,
    ) -> Result<(Vec<Sequence>, Vec<String>), ControlError> {
        // Shared by every attempt (a retry does not copy a multi-megabyte batch).
        let batch = bytes::Bytes::from(batch);
        let started = tokio::time::Instant::now();
        let mut attempt = 0usize;
        loop {
            let preferred = self.preferred.load(Ordering::Relaxed);
            let address = self.addresses[(preferred + attempt) % self.addresses.len()].clone();
            let mut client = self.client(&address)?;
            let mut request = tonic::Request::new(pb::AppendEventsRequest {
                batch: batch.clone(),
            });
            request.set_timeout(Duration::from_secs(10));
            let error = match client.append_events(request).await {
                Ok(reply) => {
                    self.preferred.store(
                        (preferred + attempt) % self.addresses.len(),
                        Ordering::Relaxed,
                    );
                    let reply = reply.into_inner();
                    let sequences = reply
                        .sequences
                        .iter()
                        .map(|s| Sequence {
                            index: s.index,
                            position: s.position,
                        })
                        .collect();
                    return Ok((sequences, reply.rejected));
                }
                Err(status) => from_status(&address, status),
            };
            let retry = matches!(
                error,
                ControlError::Unreachable { .. } | ControlError::NoLeader
            ) || matches!(&error, ControlError::Rpc { detail, .. } if detail.contains("leader"));
            if !retry || started.elapsed() > self.retry_deadline {
                return Err(error);
            }
            attempt += 1;
            if attempt.is_multiple_of(self.addresses.len()) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }

    /// Status of one node.
    pub async fn status_of(&mut self, address: &str) -> Result<pb::StatusReply, ControlError> {
        let mut request = tonic::Request::new(pb::StatusRequest {});
        request.set_timeout(Duration::from_secs(3));
        self.client(address)?
            .status(request)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|status| from_status(address, status))
    }

    /// The address of the leader, asking each node in turn: a node that says it leads, else the
    /// leader's address as a follower knows it (so a client given only a follower finds the
    /// leader); `None` when no node knows one.
    async fn leader_address(&mut self) -> Option<String> {
        let mut named = None;
        for address in self.addresses.clone() {
            if let Ok(status) = self.status_of(&address).await {
                if status.leader_id != 0 && status.leader_id == status.node_id {
                    return Some(address);
                }
                if status.leader_id != 0 && !status.leader_address.is_empty() {
                    named.get_or_insert(status.leader_address);
                }
            }
        }
        named
    }

    /// One execution's trajectory tree as `address`'s projection holds it, as the records that
    /// rebuild it (in apply order), and whether the scheduler closed the execution.
    pub async fn read_execution(
        &mut self,
        address: &str,
        execution: u64,
    ) -> Result<(Vec<gyre_event::Event>, bool), ControlError> {
        self.read_execution_part(address, execution, false).await
    }

    /// [`ClusterClient::read_execution`], or with `responses_only` just the execution's
    /// `ResponseStored` events.
    pub async fn read_execution_part(
        &mut self,
        address: &str,
        execution: u64,
        responses_only: bool,
    ) -> Result<(Vec<gyre_event::Event>, bool), ControlError> {
        let reply = self
            .client(address)?
            .read_execution(pb::ReadExecutionRequest {
                execution,
                responses_only,
            })
            .await
            .map(tonic::Response::into_inner)
            .map_err(|status| from_status(address, status))?;
        if reply.batch.is_empty() {
            return Ok((Vec::new(), reply.closed));
        }
        let events = gyre_log::decode_batch(&reply.batch).map_err(|error| {
            ControlError::BadRequest(format!(
                "{address} sent an undecodable tree of execution {execution}: {error}"
            ))
        })?;
        Ok((events, reply.closed))
    }

    /// Status of every node, in the order given (an unreachable node is an `Err` entry).
    pub async fn status_all(&mut self) -> Vec<(String, Result<pb::StatusReply, ControlError>)> {
        let mut all = Vec::new();
        for address in self.addresses.clone() {
            let status = self.status_of(&address).await;
            all.push((address, status));
        }
        all
    }

    /// Committed entries from `from` on. Following (`stop_at_end` false), any node that
    /// answers streams what it applies. Otherwise the stream ends at everything committed
    /// before the call, which only the leader can vouch for (the node checks its leadership
    /// with a quorum and refuses if it cannot); the leader is asked first, and while an
    /// election is under way the nodes are tried again until the retry deadline.
    pub async fn subscribe(
        &mut self,
        from: Sequence,
        stop_at_end: bool,
    ) -> Result<tonic::Streaming<pb::CommittedEntry>, ControlError> {
        let started = tokio::time::Instant::now();
        loop {
            let mut addresses = self.addresses.clone();
            if stop_at_end {
                if let Some(leader) = self.leader_address().await {
                    addresses.retain(|address| *address != leader);
                    addresses.insert(0, leader);
                }
            }
            let mut last_error = ControlError::NoLeader;
            for address in addresses {
                let request = pb::SubscribeRequest {
                    from_index: from.index,
                    from_position: from.position,
                    stop_at_end,
                };
                match self.client(&address)?.subscribe(request).await {
                    Ok(stream) => return Ok(stream.into_inner()),
                    Err(status) => last_error = from_status(&address, status),
                }
            }
            let retry = matches!(
                last_error,
                ControlError::Unreachable { .. } | ControlError::NoLeader
            );
            if !stop_at_end || !retry || started.elapsed() > self.retry_deadline {
                return Err(last_error);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn export(
        &mut self,
        address: &str,
        from_index: u64,
    ) -> Result<tonic::Streaming<pb::ExportedEntry>, ControlError> {
        self.client(address)?
            .export_log(pb::ExportRequest { from_index })
            .await
            .map(tonic::Response::into_inner)
            .map_err(|status| from_status(address, status))
    }

    pub async fn initialize(
        &mut self,
        address: &str,
        members: &BTreeMap<u64, String>,
    ) -> Result<pb::StatusReply, ControlError> {
        let request = pb::MembershipRequest {
            members: members
                .iter()
                .map(|(id, address)| pb::Member {
                    id: *id,
                    address: address.clone(),
                    voter: true,
                })
                .collect(),
        };
        self.client(address)?
            .initialize(request)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|status| from_status(address, status))
    }
}
