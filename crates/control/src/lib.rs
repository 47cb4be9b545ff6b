//! gyre-control: the control quorum node (DESIGN.md §2–§3).
//!
//! A node runs openraft over Gyre's log store (`gyre-log::raft`) with [`ControlProjection`]
//! (a newtype around `gyre_state::ControlState`) as its state machine, and serves two tonic
//! services on one address (`proto/control.proto`): `Raft` (node to node) and `Control`
//! (clients). Pieces:
//!
//! - `projection`: the state machine's fold, snapshot body and digest checkpoints.
//! - `network`: openraft's `RaftNetwork` over tonic, one cached channel per peer.
//! - `raft_service` / `control_service`: the two gRPC servers; `status` maps every error to a
//!   `tonic::Status` in one place.
//! - `proposer`: the single task on the leader that coalesces appends into one `EventBatch` per
//!   Raft entry and stamps `at`.
//! - `controller`: the leader's loop: scheduler decisions, idle `Tick`s, `ProjectionDigest`s.
//! - `producer`: a shared append handle that coalesces many writers' appends into few RPCs.
//! - `node`: starts and owns all of the above; `client`: the operator-side client; `json`: the
//!   JSON form of events used by `gyre log append/tail`.
//!
//! Architecture invariant: domain logic stays in the pure crates; this crate only moves events
//! between sockets, the log and the projection, and stamps time at the edge.

mod client;
mod control_service;
mod controller;
mod error;
pub mod json;
mod listen;
mod network;
mod node;
mod producer;
mod projection;
mod proposer;
mod raft_service;
mod status;
pub mod workload;

pub use client::{ClusterClient, Sequence};
pub use controller::ControllerOptions;
pub use error::ControlError;
pub use gyre_proto::control as pb;
pub use listen::{bind_listener, LISTEN_BACKLOG};
pub use network::ENTRY_BYTES_MAX;
pub use node::{parse_nodes, ControlNode, NodeOptions};
pub use producer::{Appended, Producer, ProducerOptions};
pub use projection::ControlProjection;
pub use proposer::ProposerOptions;
