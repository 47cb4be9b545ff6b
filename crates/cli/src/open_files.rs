//! The process's open-file limit: servers raise the soft limit to the hard one at start (the
//! soft default, often 1024, is far below what hundreds of harness connections, their engine
//! connections and the log's files need).

use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

/// Raises the soft open-file limit to the hard limit where it is lower, and returns the limit
/// now in force (`u64::MAX` for unlimited). A refused raise keeps the old limit.
pub fn raise_limit() -> u64 {
    let limit = getrlimit(Resource::Nofile);
    let Some(current) = limit.current else {
        return u64::MAX;
    };
    let wanted = limit.maximum.unwrap_or(u64::MAX);
    if wanted <= current {
        return current;
    }
    let raised = Rlimit {
        current: Some(wanted),
        maximum: limit.maximum,
    };
    match setrlimit(Resource::Nofile, raised) {
        Ok(()) => wanted,
        Err(error) => {
            tracing::warn!(%error, current, wanted, "raising the open-file limit");
            current
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_after_raising_is_the_hard_limit_and_in_force() {
        let raised = raise_limit();
        let now = getrlimit(Resource::Nofile);
        assert_eq!(now.current.unwrap_or(u64::MAX), raised);
        assert!(raised <= now.maximum.unwrap_or(u64::MAX));
        // Idempotent.
        assert_eq!(raise_limit(), raised);
    }
}
