//! Errors of the engine contract: rejected requests and broken buffers are values.

/// Everything an engine call or a weight buffer can reject.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum EngineError {
    #[error("request rejected: {field}: {message}")]
    InvalidRequest {
        field: &'static str,
        message: String,
    },
    #[error("engine queue is full ({capacity} requests)")]
    QueueFull { capacity: usize },
    #[error("request aborted")]
    Aborted,
    #[error("engine stopped")]
    Stopped,
    #[error("weight buffer rejected: {message}")]
    InvalidWeights { message: String },
    #[error("engine failure: {message}")]
    Backend { message: String },
}
