//! The control crate's one error type. `status` maps it to `tonic::Status` for the servers;
//! the client maps `tonic::Status` back into it, naming the node it talked to.

use gyre_log::raft::RaftStoreError;

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("bad request: {0}")]
    BadRequest(String),
    /// A setting given to a tool or a node (node lists, addresses): said as it is, since it is
    /// not a request any node refused.
    #[error("{0}")]
    Invalid(String),
    #[error("events do not decode: {0}")]
    Decode(#[from] gyre_log::CodecError),
    #[error("not the leader; the leader is {leader}")]
    NotLeader { leader: String },
    #[error("no leader is known yet (election in progress?)")]
    NoLeader,
    #[error("raft: {0}")]
    Raft(String),
    #[error("storage: {0}")]
    Storage(#[from] RaftStoreError),
    #[error("the node is shutting down")]
    ShuttingDown,
    #[error("the node halted: {0}")]
    Halted(String),
    #[error("{address}: {detail}")]
    Rpc { address: String, detail: String },
    #[error("cannot reach {address}: {detail}")]
    Unreachable { address: String, detail: String },
    /// The error is shown in the message, not chained as a source, so it is printed once.
    #[error("{address}: listen: {error}")]
    Listen {
        address: String,
        error: std::io::Error,
    },
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("entry {index} was purged from this node's log (earliest kept: {first})")]
    Purged { index: u64, first: u64 },
}

impl ControlError {
    /// The same error for another waiter (variants holding non-cloneable sources become text).
    pub fn duplicate(&self) -> ControlError {
        match self {
            ControlError::BadRequest(detail) => ControlError::BadRequest(detail.clone()),
            ControlError::Invalid(detail) => ControlError::Invalid(detail.clone()),
            ControlError::NotLeader { leader } => ControlError::NotLeader {
                leader: leader.clone(),
            },
            ControlError::NoLeader => ControlError::NoLeader,
            ControlError::ShuttingDown => ControlError::ShuttingDown,
            ControlError::Halted(detail) => ControlError::Halted(detail.clone()),
            ControlError::Rpc { address, detail } => ControlError::Rpc {
                address: address.clone(),
                detail: detail.clone(),
            },
            ControlError::Unreachable { address, detail } => ControlError::Unreachable {
                address: address.clone(),
                detail: detail.clone(),
            },
            ControlError::Purged { index, first } => ControlError::Purged {
                index: *index,
                first: *first,
            },
            other => ControlError::Raft(other.to_string()),
        }
    }
}
