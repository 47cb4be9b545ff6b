//! Stream packing: admitted trajectories → token rows → micro-steps under a token budget.
//!
//! A row is one admitted trajectory materialised: the full root-to-leaf tokens, the target
//! spans (row positions of its targets), the behaviour log-prob of each target, the execution's
//! advantage and the per-target weight 1/(L_i·B·N). Row positions equal absolute path positions,
//! so a target range `[start, end)` of call c maps to `node(c).start + input_len + [start, end)`.
//!
//! A micro-step is one packed buffer of `tokens_max` tokens (variable-length attention over the
//! concatenated rows); its padding is the unused tail. Rows are packed first-fit-decreasing
//! (by length, ties by row order), which is within 11/9 of the optimal number of micro-steps;
//! the naive alternative puts each row in its own micro-step. The packer takes the ready group
//! with the oldest policy version and closes the stream once the batch's B groups are enqueued.

use gyre_event::{
    AdmittedTrajectory, CallId, EventBody, ExecutionId, GroupId, MicroStepId, PolicyVersion, StepId,
};

use crate::{TrajectoryError, Tree};

/// One admitted trajectory as training input.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub execution: ExecutionId,
    pub leaf_call: CallId,
    pub class: u32,
    /// Root-to-leaf tokens.
    pub tokens: Vec<u32>,
    /// Row positions `[start, end)` of the targets, ascending.
    pub target_spans: Vec<(u64, u64)>,
    /// Behaviour log-prob of each target token, in span order.
    pub behaviour_logprobs: Vec<f32>,
    /// Â_i of the execution.
    pub advantage: f64,
    /// 1/(L_i·B·N) for every target of this row.
    pub target_weight: f64,
}

impl Row {
    pub fn len(&self) -> u64 {
        self.tokens.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    pub fn targets_count(&self) -> u64 {
        self.target_spans
            .iter()
            .map(|(start, end)| end - start)
            .sum()
    }
}

/// Materialises one admitted trajectory of `tree`.
pub fn materialise(
    tree: &Tree,
    trajectory: &AdmittedTrajectory,
    advantage: f64,
    target_weight: f64,
) -> Result<Row, TrajectoryError> {
    let leaf = tree
        .node_of_call(trajectory.leaf_call)
        .ok_or(TrajectoryError::UnknownParent {
            call: trajectory.leaf_call,
            parent: trajectory.leaf_call,
        })?;
    let tokens = tree.path_tokens(leaf);
    // Each target's span in the row with its log-probs, kept together so that sorting the
    // spans keeps every log-prob beside its token.
    let mut pieces = Vec::with_capacity(trajectory.targets.len());
    for range in &trajectory.targets {
        let node_id = tree
            .node_of_call(range.call)
            .ok_or(TrajectoryError::InvalidRecord {
                call: range.call,
                message: "target names a call the tree does not hold".into(),
            })?;
        let node = tree.node(node_id);
        if range.start >= range.end || range.end as usize > node.output_ids.len() {
            return Err(TrajectoryError::InvalidRecord {
                call: range.call,
                message: format!(
                    "target [{}, {}) is outside its output",
                    range.start, range.end
                ),
            });
        }
        let start = node.start + node.input_len() + range.start as u64;
        let end = start + (range.end - range.start) as u64;
        if end > tokens.len() as u64
            || tokens[start as usize..end as usize]
                != node.output_ids[range.start as usize..range.end as usize]
        {
            return Err(TrajectoryError::InvalidRecord {
                call: range.call,
                message: format!(
                    "target [{}, {}) is not on the path of leaf {}",
                    range.start, range.end, trajectory.leaf_call
                ),
            });
        }
        pieces.push((
            (start, end),
            range.call,
            &node.output_logprobs[range.start as usize..range.end as usize],
        ));
    }
    pieces.sort_unstable_by_key(|(span, ..)| *span);
    // A token trained twice would count twice in the loss's denominator L_i.
    if let Some(pair) = pieces.windows(2).find(|pair| pair[0].0 .1 > pair[1].0 .0) {
        return Err(TrajectoryError::InvalidRecord {
            call: pair[1].1,
            message: format!(
                "targets of leaf {} overlap at row tokens [{}, {})",
                trajectory.leaf_call,
                pair[1].0 .0,
                pair[0].0 .1.min(pair[1].0 .1)
            ),
        });
    }
    let target_spans: Vec<(u64, u64)> = pieces.iter().map(|(span, ..)| *span).collect();
    let behaviour_logprobs = pieces
        .iter()
        .flat_map(|(_, _, logprobs)| logprobs.iter().copied())
        .collect();
    Ok(Row {
        execution: tree.execution(),
        leaf_call: trajectory.leaf_call,
        class: trajectory.class,
        tokens,
        target_spans,
        behaviour_logprobs,
        advantage,
        target_weight,
    })
}

/// First-fit-decreasing packing of row lengths into micro-steps of `tokens_max` tokens.
/// Returns row indices per micro-step. A row longer than `tokens_max` is rejected.
pub fn pack_rows(lengths: &[u64], tokens_max: u64) -> Result<Vec<Vec<usize>>, TrajectoryError> {
    if tokens_max == 0 {
        return Err(TrajectoryError::Config {
            field: "tokens_max",
            message: "must be positive".into(),
        });
    }
    if let Some((index, length)) = lengths
        .iter()
        .enumerate()
        .find(|(_, length)| **length > tokens_max)
    {
        return Err(TrajectoryError::Packing {
            message: format!(
                "row {index} has {length} tokens, more than the micro-step budget of {tokens_max}"
            ),
        });
    }
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    order.sort_by_key(|index| (std::cmp::Reverse(lengths[*index]), *index));
    let mut bins: Vec<(u64, Vec<usize>)> = Vec::new();
    for index in order {
        let length = lengths[index];
        match bins
            .iter_mut()
            .find(|(used, _)| used + length <= tokens_max)
        {
            Some((used, rows)) => {
                *used += length;
                rows.push(index);
            }
            None => bins.push((length, vec![index])),
        }
    }
    Ok(bins.into_iter().map(|(_, rows)| rows).collect())
}

/// Fraction of micro-step capacity that is padding: 1 − used / (micro-steps · tokens_max).
pub fn padding_fraction(total_tokens: u64, micro_steps: u64, tokens_max: u64) -> f64 {
    if micro_steps == 0 {
        return 0.0;
    }
    1.0 - total_tokens as f64 / (micro_steps as f64 * tokens_max as f64)
}

/// One packed micro-step.
#[derive(Clone, Debug, PartialEq)]
pub struct MicroStep {
    pub id: MicroStepId,
    pub group: GroupId,
    /// Indices into the group's rows, in packing order.
    pub rows: Vec<usize>,
    pub tokens_count: u64,
}

/// The stream packing buffer of one optimizer step.
#[derive(Clone, Debug, PartialEq)]
pub struct StreamPacker {
    pub step: StepId,
    /// B.
    pub groups_per_batch: u32,
    pub tokens_max: u64,
    next_micro_step: u64,
    enqueued_groups: Vec<GroupId>,
}

impl StreamPacker {
    pub fn new(
        step: StepId,
        groups_per_batch: u32,
        tokens_max: u64,
        first_micro_step: MicroStepId,
    ) -> Self {
        Self {
            step,
            groups_per_batch,
            tokens_max,
            next_micro_step: first_micro_step.get(),
            enqueued_groups: Vec::new(),
        }
    }

    /// The ready group the packer takes next: the oldest policy version, then the lowest id.
    pub fn choose_group(ready: &[(GroupId, PolicyVersion)]) -> Option<GroupId> {
        ready
            .iter()
            .min_by_key(|(group, version)| (*version, *group))
            .map(|(group, _)| *group)
    }

    pub fn is_closed(&self) -> bool {
        self.enqueued_groups.len() as u32 >= self.groups_per_batch
    }

    pub fn enqueued_groups(&self) -> &[GroupId] {
        &self.enqueued_groups
    }

    /// Packs one group's rows; returns the enqueue event and the micro-steps it names.
    pub fn pack_group(
        &mut self,
        group: GroupId,
        rows: &[Row],
    ) -> Result<(EventBody, Vec<MicroStep>), TrajectoryError> {
        if self.is_closed() {
            return Err(TrajectoryError::Group {
                group,
                message: format!("stream of {} is already closed", self.step),
            });
        }
        if self.enqueued_groups.contains(&group) {
            return Err(TrajectoryError::Group {
                group,
                message: "already enqueued".into(),
            });
        }
        let lengths: Vec<u64> = rows.iter().map(Row::len).collect();
        let bins = pack_rows(&lengths, self.tokens_max)?;
        let mut micro_steps = Vec::with_capacity(bins.len());
        for bin in bins {
            let id = MicroStepId(self.next_micro_step);
            self.next_micro_step += 1;
            let tokens_count = bin.iter().map(|index| lengths[*index]).sum();
            micro_steps.push(MicroStep {
                id,
                group,
                rows: bin,
                tokens_count,
            });
        }
        self.enqueued_groups.push(group);
        let event = EventBody::MicroStepsEnqueued {
            step: self.step,
            group,
            micro_steps: micro_steps.iter().map(|micro_step| micro_step.id).collect(),
            closes_stream: self.is_closed(),
        };
        Ok((event, micro_steps))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_fit_decreasing_fills_bins() {
        let bins = pack_rows(&[6, 5, 4, 3, 2], 10).expect("all rows fit");
        assert_eq!(bins, vec![vec![0, 2], vec![1, 3, 4]]);
        assert!(pack_rows(&[11], 10).is_err());
    }
}
