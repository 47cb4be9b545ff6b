//! The shared micro-step queue as a projection: enqueues, claims and completions.
//!
//! Training cells claim micro-steps through committed `MicroStepClaimed` events; a claim of a
//! micro-step that is unknown or already claimed is rejected, so a micro-step is claimed at most
//! once. [`MicroStepQueue::decide_claim`] proposes the next unclaimed micro-step for a cell;
//! faster cells simply ask more often.

use std::collections::{BTreeMap, BTreeSet};

use gyre_event::{CellId, EventBody, GroupId, MicroStepId, StepId};

use crate::TrajectoryError;

/// The queue of one optimizer step.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepQueue {
    /// Micro-steps in enqueue order, with their group.
    pub enqueued: Vec<(MicroStepId, GroupId)>,
    pub claims: BTreeMap<MicroStepId, CellId>,
    pub done: BTreeSet<MicroStepId>,
    /// The stream closed: all B groups are enqueued.
    pub stream_closed: bool,
}

/// Micro-step queues by step.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MicroStepQueue {
    pub steps: BTreeMap<StepId, StepQueue>,
}

impl MicroStepQueue {
    pub fn apply(&mut self, body: &EventBody) -> Result<(), TrajectoryError> {
        match body {
            EventBody::MicroStepsEnqueued {
                step,
                group,
                micro_steps,
                closes_stream,
            } => {
                let queue = self.steps.entry(*step).or_default();
                if queue.stream_closed {
                    return Err(TrajectoryError::Group {
                        group: *group,
                        message: format!("enqueued after the stream of {step} closed"),
                    });
                }
                for micro_step in micro_steps {
                    if queue
                        .enqueued
                        .iter()
                        .any(|(existing, _)| existing == micro_step)
                    {
                        return Err(TrajectoryError::MicroStep {
                            micro_step: *micro_step,
                            message: "enqueued twice".into(),
                        });
                    }
                    queue.enqueued.push((*micro_step, *group));
                }
                queue.stream_closed = *closes_stream;
            }
            EventBody::MicroStepClaimed {
                step,
                micro_step,
                cell,
            } => {
                let queue = self.queue_with(*step, *micro_step)?;
                if let Some(holder) = queue.claims.get(micro_step) {
                    return Err(TrajectoryError::MicroStep {
                        micro_step: *micro_step,
                        message: format!(
                            "already claimed by {holder}; {cell} cannot claim it again"
                        ),
                    });
                }
                queue.claims.insert(*micro_step, *cell);
            }
            EventBody::MicroStepDone {
                step,
                micro_step,
                cell,
            } => {
                let queue = self.queue_with(*step, *micro_step)?;
                if queue.claims.get(micro_step) != Some(cell) {
                    return Err(TrajectoryError::MicroStep {
                        micro_step: *micro_step,
                        message: format!("done by {cell}, which does not hold its claim"),
                    });
                }
                if !queue.done.insert(*micro_step) {
                    return Err(TrajectoryError::MicroStep {
                        micro_step: *micro_step,
                        message: "done twice".into(),
                    });
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn queue_with(
        &mut self,
        step: StepId,
        micro_step: MicroStepId,
    ) -> Result<&mut StepQueue, TrajectoryError> {
        let queue = self
            .steps
            .get_mut(&step)
            .filter(|queue| queue.enqueued.iter().any(|(id, _)| *id == micro_step));
        queue.ok_or(TrajectoryError::MicroStep {
            micro_step,
            message: format!("not enqueued for {step}"),
        })
    }

    /// The claim event for the oldest unclaimed micro-step of `step`, if any.
    pub fn decide_claim(&self, step: StepId, cell: CellId) -> Option<EventBody> {
        let queue = self.steps.get(&step)?;
        let (micro_step, _) = queue
            .enqueued
            .iter()
            .find(|(id, _)| !queue.claims.contains_key(id))?;
        Some(EventBody::MicroStepClaimed {
            step,
            micro_step: *micro_step,
            cell,
        })
    }

    /// Whether every micro-step of a closed stream is done.
    pub fn step_complete(&self, step: StepId) -> bool {
        self.steps
            .get(&step)
            .is_some_and(|queue| queue.stream_closed && queue.done.len() == queue.enqueued.len())
    }

    pub fn validate(&self) {
        for queue in self.steps.values() {
            for (micro_step, _) in &queue.enqueued {
                assert!(
                    queue
                        .enqueued
                        .iter()
                        .filter(|(id, _)| id == micro_step)
                        .count()
                        == 1,
                    "unique micro-steps"
                );
            }
            for done in &queue.done {
                assert!(queue.claims.contains_key(done), "done implies claimed");
            }
            for claimed in queue.claims.keys() {
                assert!(
                    queue.enqueued.iter().any(|(id, _)| id == claimed),
                    "claimed implies enqueued"
                );
            }
        }
    }
}
