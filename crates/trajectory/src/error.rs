//! The one error type of `gyre-trajectory`: a rejected input, named precisely.
//!
//! Every rejection is a value (STYLE rule 7): records that do not fit the tree, evaluation
//! events that would overwrite an earlier attempt, claims of an already-claimed micro-step.
//! Impossible states are assertions in `validate`, not errors.

use std::fmt;

use gyre_event::{CallId, ExecutionId, GroupId, MicroStepId};

/// What a [`TrajectoryError::DuplicateCall`] says; [`is_duplicate_call_refusal`] reads it back.
const DUPLICATE_CALL_PHRASE: &str = "was already recorded";

/// Whether a refusal the log sent back (the text of a projection error) says the call was
/// already recorded: to a writer whose appends are retried, an earlier attempt's commit.
pub fn is_duplicate_call_refusal(reason: &str) -> bool {
    reason.contains(DUPLICATE_CALL_PHRASE)
}

/// Why the trajectory processor rejected an input.
#[derive(Clone, Debug, PartialEq)]
pub enum TrajectoryError {
    /// A record failed its structural checks (length mismatch, bad log-prob, empty outputs).
    InvalidRecord { call: CallId, message: String },
    /// The record belongs to another execution than the tree it was applied to.
    WrongExecution {
        expected: ExecutionId,
        found: ExecutionId,
        call: CallId,
    },
    /// A call id was applied twice to the same execution.
    DuplicateCall {
        execution: ExecutionId,
        call: CallId,
    },
    /// A record names a prefix parent the tree does not hold.
    UnknownParent { call: CallId, parent: CallId },
    /// A record reuses more tokens than its parent's path holds.
    ReusedPrefixTooLong {
        call: CallId,
        reused: u64,
        parent_path_tokens: u64,
    },
    /// A per-execution limit (`*_max`) was exceeded.
    LimitExceeded { what: &'static str, limit: u64 },
    /// A scoring event does not fit the execution's or group's state.
    Scoring {
        execution: ExecutionId,
        message: String,
    },
    /// A group-level inconsistency.
    Group { group: GroupId, message: String },
    /// A micro-step event that does not fit the queue (for example a second claim).
    MicroStep {
        micro_step: MicroStepId,
        message: String,
    },
    /// A configuration value that cannot be used.
    Config {
        field: &'static str,
        message: String,
    },
    /// A packing request that cannot be satisfied.
    Packing { message: String },
}

impl fmt::Display for TrajectoryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TrajectoryError::InvalidRecord { call, message } => {
                write!(f, "invalid record for call {call}: {message}")
            }
            TrajectoryError::WrongExecution {
                expected,
                found,
                call,
            } => write!(
                f,
                "call {call} belongs to execution {found}, applied to the tree of {expected}"
            ),
            TrajectoryError::DuplicateCall { execution, call } => {
                write!(
                    f,
                    "call {call} {DUPLICATE_CALL_PHRASE} for execution {execution}"
                )
            }
            TrajectoryError::UnknownParent { call, parent } => {
                write!(f, "call {call} extends unknown call {parent}")
            }
            TrajectoryError::ReusedPrefixTooLong {
                call,
                reused,
                parent_path_tokens,
            } => write!(
                f,
                "call {call} reuses {reused} tokens but its parent's path holds only \
                 {parent_path_tokens}"
            ),
            TrajectoryError::LimitExceeded { what, limit } => {
                write!(f, "{what} exceeds its limit of {limit}")
            }
            TrajectoryError::Scoring { execution, message } => {
                write!(f, "execution {execution}: {message}")
            }
            TrajectoryError::Group { group, message } => write!(f, "group {group}: {message}"),
            TrajectoryError::MicroStep {
                micro_step,
                message,
            } => {
                write!(f, "micro-step {micro_step}: {message}")
            }
            TrajectoryError::Config { field, message } => {
                write!(f, "invalid `{field}`: {message}")
            }
            TrajectoryError::Packing { message } => write!(f, "cannot pack: {message}"),
        }
    }
}

impl std::error::Error for TrajectoryError {}
