//! The one place where errors become `tonic::Status` (servers) and back (clients).

use tonic::{Code, Status};

use crate::error::ControlError;

/// Server side: a `ControlError` as the status a client sees.
pub(crate) fn to_status(error: ControlError) -> Status {
    let code = match &error {
        ControlError::BadRequest(_) | ControlError::Invalid(_) | ControlError::Decode(_) => {
            Code::InvalidArgument
        }
        ControlError::NotLeader { .. } | ControlError::NoLeader => Code::Unavailable,
        ControlError::ShuttingDown | ControlError::Unreachable { .. } => Code::Unavailable,
        ControlError::Halted(_) => Code::Aborted,
        ControlError::Purged { .. } => Code::OutOfRange,
        ControlError::Raft(_)
        | ControlError::Storage(_)
        | ControlError::Rpc { .. }
        | ControlError::Listen { .. }
        | ControlError::Io(_) => Code::Internal,
    };
    Status::new(code, error.to_string())
}

/// Client side: a status from `address` as a `ControlError`; transport failures are
/// `Unreachable`, so a client knows to try another node.
pub(crate) fn from_status(address: &str, status: Status) -> ControlError {
    match status.code() {
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown => {
            ControlError::Unreachable {
                address: address.to_string(),
                detail: status.message().to_string(),
            }
        }
        Code::InvalidArgument => {
            // The node's message already says "bad request" (`to_status`); said once.
            let message = status.message();
            let message = message.strip_prefix("bad request: ").unwrap_or(message);
            ControlError::BadRequest(format!("{address}: {message}"))
        }
        _ => ControlError::Rpc {
            address: address.to_string(),
            detail: format!("{:?}: {}", status.code(), status.message()),
        },
    }
}

/// A bad JSON body from a peer: never a panic, an `InvalidArgument`.
pub(crate) fn bad_json(what: &str, error: serde_json::Error) -> Status {
    Status::invalid_argument(format!("{what} does not parse: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_says_bad_request_once_and_names_the_node() {
        let status = to_status(ControlError::BadRequest("event 0: unknown kind".into()));
        let error = from_status("127.0.0.1:7001", status);
        assert_eq!(
            error.to_string(),
            "bad request: 127.0.0.1:7001: event 0: unknown kind"
        );
    }
}
