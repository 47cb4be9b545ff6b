//! A stand-in for the scoring projection, for tests that drive the scheduler alone.
//!
//! The scheduler keeps no rule for resolutions: `gyre-state` folds every event into the scoring
//! projection (`gyre_trajectory::Scoring`) too and hands each resolution scoring reaches to
//! `SchedulerState::resolve`. These tests fold events into the scheduler only, so after each
//! one they hand on what scoring would reach for the simple evaluations they write (one
//! attempt per execution): a valid completion of a closed execution (or a close after one) is
//! valid, a dummy is a dummy, an exclusion, and a close as an overall timeout, cancelled or
//! surplus, is excluded. `gyre-state`'s tests check the real hand-over.

use std::collections::BTreeSet;

use gyre_event::{CloseStatus, Event, EventBody, ExecutionId};
use gyre_scheduler::{ApplyError, Resolution, SchedulerState};

#[derive(Clone, Debug, Default)]
pub struct Resolutions {
    /// Valid completions of executions that were still open.
    valid_open: BTreeSet<ExecutionId>,
}

impl Resolutions {
    /// Hands on the resolution `event` (already folded into `state`) reaches, if any.
    pub fn after(&mut self, state: &mut SchedulerState, event: &Event) -> Result<(), ApplyError> {
        let closed = |state: &SchedulerState, execution: &ExecutionId| {
            state
                .executions
                .get(execution)
                .is_some_and(|execution| execution.closed.is_some())
        };
        let reached = match &event.body {
            EventBody::ExecutionClosed { execution, status } => match status {
                CloseStatus::OverallTimeout | CloseStatus::Cancelled | CloseStatus::Surplus => {
                    Some((*execution, Resolution::Excluded))
                }
                _ if self.valid_open.remove(execution) => Some((*execution, Resolution::Valid)),
                _ => None,
            },
            EventBody::EvaluationCompleted {
                execution,
                valid: true,
                ..
            } => {
                if closed(state, execution) {
                    Some((*execution, Resolution::Valid))
                } else {
                    self.valid_open.insert(*execution);
                    None
                }
            }
            EventBody::DummyInserted { execution, .. } => Some((*execution, Resolution::Dummy)),
            EventBody::ExecutionExcluded { execution, .. } => {
                Some((*execution, Resolution::Excluded))
            }
            _ => None,
        };
        match reached {
            Some((execution, resolution)) => {
                state.resolve(execution, resolution)?;
                state.refresh_supply_timer(event.at);
                Ok(())
            }
            None => Ok(()),
        }
    }
}
