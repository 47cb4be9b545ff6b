//! A stable digest of the scheduler projection.
//!
//! Replicas and `gyre replay` compare these at `ProjectionDigest` checkpoints, so the encoding is
//! explicit and ordered: every field is fed in a fixed order, collections in their `BTreeMap`
//! order, floats by their bit pattern. Changing this encoding changes every digest; old logs carry
//! old digests, so a change needs a digest-version bump in the log format.

use sha2::{Digest, Sha256};

use crate::{state::Resolution, SchedulerState};
use gyre_event::Role;

struct Feed(Sha256);

impl Feed {
    fn u64(&mut self, value: u64) {
        self.0.update(value.to_le_bytes());
    }
    fn flag(&mut self, value: bool) {
        self.0.update([value as u8]);
    }
    fn opt(&mut self, value: Option<u64>) {
        match value {
            Some(v) => {
                self.flag(true);
                self.u64(v);
            }
            None => self.flag(false),
        }
    }
}

fn role_code(role: Role) -> u64 {
    match role {
        Role::Rollout => 1,
        Role::Training => 2,
    }
}

impl SchedulerState {
    /// SHA-256 over the projection's canonical encoding.
    pub fn digest(&self) -> [u8; 32] {
        let mut feed = Feed(Sha256::new());
        feed.0.update(b"gyre-scheduler-digest-v1");
        feed.flag(self.config.is_some());
        if let Some(config) = &self.config {
            feed.u64(config.run_seed);
            feed.u64(config.mode as u64);
            feed.flag(config.streaming);
            feed.u64(config.phi.to_bits());
            feed.u64(config.mu as u64);
            feed.u64(config.n as u64);
            feed.u64(config.b as u64);
            feed.u64(config.steps as u64);
            feed.u64(config.rho_min.to_bits());
            feed.u64(config.tau.nanos());
            feed.u64(config.j_max as u64);
            feed.u64(config.async_training_cells as u64);
        }
        feed.u64(self.next_group);
        feed.u64(self.next_execution);
        feed.u64(self.next_micro_step);
        feed.u64(self.now.nanos());
        feed.u64(self.dispatched);
        feed.u64(self.started);
        feed.u64(self.finished);
        feed.u64(self.cells.len() as u64);
        for cell in &self.cells {
            feed.u64(cell.id.get() as u64);
            feed.u64(role_code(cell.role));
            feed.opt(cell.switching_to.map(role_code));
            feed.u64(cell.role_since.nanos());
        }
        feed.u64(self.engines.len() as u64);
        for engine in self.engines.values() {
            feed.u64(engine.id.get() as u64);
            feed.flag(engine.ready);
            feed.flag(engine.accepting);
            feed.u64(engine.running.len() as u64);
            for execution in &engine.running {
                feed.u64(execution.get());
            }
        }
        feed.u64(self.groups.len() as u64);
        for group in self.groups.values() {
            feed.u64(group.id.get());
            feed.u64(group.dispatched_version.get());
            feed.u64(group.started as u64);
            feed.u64(group.closed as u64);
            feed.u64(group.resolved as u64);
            feed.opt(group.packed_into.map(|s| s.get()));
        }
        feed.u64(self.executions.len() as u64);
        for (id, execution) in &self.executions {
            feed.u64(id.get());
            feed.opt(execution.engine.map(|e| e.get() as u64));
            feed.opt(execution.closed.map(|s| s as u64));
            feed.u64(match execution.resolution {
                Resolution::Pending => 0,
                Resolution::Valid => 1,
                Resolution::Dummy => 2,
                Resolution::Excluded => 3,
            });
        }
        feed.u64(self.dispatch_owed_groups);
        feed.u64(self.training_version.get());
        feed.u64(self.published_version.get());
        feed.u64(self.burst);
        feed.u64(self.steps_in_burst as u64);
        feed.flag(self.burst_end_pending);
        feed.flag(self.awaiting_publish);
        feed.flag(self.core_decision_pending);
        feed.opt(self.supply_ok_since.map(|t| t.nanos()));
        feed.flag(self.batch.is_some());
        if let Some(batch) = &self.batch {
            feed.u64(batch.step.get());
            feed.u64(batch.groups.len() as u64);
            for group in &batch.groups {
                feed.u64(group.get());
            }
            for (id, micro_step) in &batch.micro_steps {
                feed.u64(id.get());
                feed.opt(micro_step.claimed_by.map(|c| c.get() as u64));
                feed.flag(micro_step.done);
            }
            feed.flag(batch.stream_closed);
            feed.flag(batch.join_window_closed);
        }
        feed.u64(self.staleness.len() as u64);
        for record in &self.staleness {
            feed.u64(record.group.get());
            feed.u64(record.staleness);
        }
        feed.u64(self.rejected_claims);
        feed.0.finalize().into()
    }
}
