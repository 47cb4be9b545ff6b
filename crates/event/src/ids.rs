//! Newtype ids and the log's notion of time.
//!
//! Each id is its own type so that an execution id can never be passed where a group id is
//! expected. All ids are plain integers assigned deterministically (by the controller or by the
//! edge that first sees the entity) and are never reused within a run.

use std::fmt;

macro_rules! id_type {
    ($(#[$meta:meta])* $name:ident, $inner:ty, $prefix:literal) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        pub struct $name(pub $inner);

        impl $name {
            pub const fn get(self) -> $inner {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }

        impl From<$inner> for $name {
            fn from(value: $inner) -> Self {
                Self(value)
            }
        }
    };
}

id_type!(
    /// One harness execution (one rollout of one query).
    ExecutionId, u64, "e"
);
id_type!(
    /// One rollout group: the N executions of one query that share a group-relative advantage.
    GroupId, u64, "g"
);
id_type!(
    /// One task (prompt) from the dataset; a group samples N executions of one query.
    QueryId, u64, "q"
);
id_type!(
    /// One elastic cell. Cell 0 is the core (authoritative weights, the only optimizer owner).
    CellId, u32, "cell"
);
id_type!(
    /// One rollout engine: a cell's engine while it is in rollout role, or a standalone engine.
    EngineId, u32, "engine"
);
id_type!(
    /// A policy version. Training version v_t advances by one per optimizer step; the published
    /// version moves to v_t at each burst end.
    PolicyVersion, u64, "v"
);
id_type!(
    /// A Raft log index.
    LogIndex, u64, "#"
);
id_type!(
    /// One model call (request) inside an execution; unique within the run.
    CallId, u64, "c"
);
id_type!(
    /// One optimizer step (training step); step s consumes batch s.
    StepId, u64, "step"
);
id_type!(
    /// One micro-step of a batch: a packed set of token rows a training cell processes at once.
    MicroStepId, u64, "ms"
);

impl PolicyVersion {
    pub const INITIAL: PolicyVersion = PolicyVersion(0);

    pub const fn next(self) -> PolicyVersion {
        PolicyVersion(self.0 + 1)
    }
}

/// Nanoseconds since the start of the run, stamped by the leader. Never read from a clock inside a
/// projection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(pub u64);

impl Timestamp {
    pub const ZERO: Timestamp = Timestamp(0);
    pub const NANOS_PER_SECOND: u64 = 1_000_000_000;

    pub const fn from_secs(seconds: u64) -> Self {
        Timestamp(seconds * Self::NANOS_PER_SECOND)
    }

    /// Converts fractional seconds, saturating at zero for negative input.
    pub fn from_secs_f64(seconds: f64) -> Self {
        if seconds <= 0.0 || !seconds.is_finite() {
            return Timestamp(0);
        }
        Timestamp((seconds * Self::NANOS_PER_SECOND as f64).round() as u64)
    }

    pub const fn nanos(self) -> u64 {
        self.0
    }

    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / Self::NANOS_PER_SECOND as f64
    }

    pub fn as_hours_f64(self) -> f64 {
        self.as_secs_f64() / 3600.0
    }

    pub const fn saturating_sub(self, other: Timestamp) -> Duration {
        Duration(self.0.saturating_sub(other.0))
    }

    pub const fn plus(self, duration: Duration) -> Timestamp {
        Timestamp(self.0.saturating_add(duration.0))
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.3}s", self.as_secs_f64())
    }
}

/// A span of time in nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Duration(pub u64);

impl Duration {
    pub const ZERO: Duration = Duration(0);

    pub const fn from_secs(seconds: u64) -> Self {
        Duration(seconds * Timestamp::NANOS_PER_SECOND)
    }

    pub fn from_secs_f64(seconds: f64) -> Self {
        Duration(Timestamp::from_secs_f64(seconds).0)
    }

    pub const fn nanos(self) -> u64 {
        self.0
    }

    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / Timestamp::NANOS_PER_SECOND as f64
    }
}
