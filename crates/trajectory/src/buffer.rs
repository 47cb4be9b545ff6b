//! The trajectory buffer: records, trees, rewards and admissions by group, as one projection.
//!
//! It folds the log's `ModelCall` records into one [`Tree`] per execution, the scoring events
//! into [`Scoring`], and `TrajectoriesAdmitted` into stored admissions. Its controller side
//! ([`TrajectoryBuffer::decide_admissions`]) admits trajectories for executions of ready groups,
//! seeded from the run seed and the execution id, and [`TrajectoryBuffer::rows`] materialises a
//! ready group for the stream packer. Packed groups are marked by `MicroStepsEnqueued`.
//!
//! **Retirement.** Once an `OptimizerStepped` consumes a group, the trees of its members are
//! never read again (training took their rows; the audit trail reads the log, not this
//! projection), yet they hold every token of every call. Each closed member's tree is replaced
//! by a [`RetiredTree`]: the three counts the state digest reads and the step that consumed it
//! (a member still running, a surplus execution, is retired when it closes). So
//! the projection, and every snapshot of it, stays bounded by the executions in flight rather
//! than growing with the run, and the digest is the one the whole tree gave (a log replays to
//! the same checkpoints). A model call for an execution whose group an optimizer step consumed
//! is refused, whether or not it had a tree: training has already consumed that execution.
//! (Before retirement existed such a call was folded into a tree nobody read; a log holding one
//! stops verifying at its next checkpoint. Upgrade a quorum across this change all at once.)

use std::collections::{BTreeMap, BTreeSet};

use gyre_event::{
    AdmittedTrajectory, Event, EventBody, ExecutionId, GroupId, PolicyVersion, StepId,
};

use crate::{
    admit, materialise, target_weight, trajectory_targets_count, AdvantageNormalization,
    Resolution, RoleClasses, Row, Scoring, ScoringConfig, SplitMix64, TrajectoryError, Tree,
    TreeConfig,
};

/// Records, rewards and admissions of every execution, grouped.
#[derive(Clone, Debug, PartialEq)]
pub struct TrajectoryBuffer {
    pub tree_config: TreeConfig,
    pub trees: BTreeMap<ExecutionId, Tree>,
    pub scoring: Scoring,
    pub admissions: BTreeMap<ExecutionId, Vec<AdmittedTrajectory>>,
    pub packed_groups: BTreeSet<GroupId>,
    /// Executions whose group an optimizer step consumed: their trees, reduced to what the
    /// digest reads. An execution is in `trees` or here, never both.
    pub retired: BTreeMap<ExecutionId, RetiredTree>,
    /// Members of consumed groups that were still running then: retired when they close.
    pub retiring: BTreeMap<ExecutionId, StepId>,
    /// Groups an optimizer step consumed, with the step.
    pub consumed_groups: BTreeMap<GroupId, StepId>,
}

/// What is kept of a consumed execution's tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetiredTree {
    pub nodes: u64,
    pub leaves: u64,
    pub tokens: u64,
    /// The optimizer step that consumed the execution's group.
    pub step: StepId,
}

/// One execution's tree as the state digest sees it: (nodes, leaves, tokens).
pub type TreeCounts = (u64, u64, u64);

impl TrajectoryBuffer {
    pub fn new(tree_config: TreeConfig, scoring_config: ScoringConfig) -> Self {
        Self {
            tree_config,
            trees: BTreeMap::new(),
            scoring: Scoring::new(scoring_config),
            admissions: BTreeMap::new(),
            packed_groups: BTreeSet::new(),
            retired: BTreeMap::new(),
            retiring: BTreeMap::new(),
            consumed_groups: BTreeMap::new(),
        }
    }

    /// Brings a buffer restored from a snapshot written before retirement existed (format 1:
    /// every tree live) to the state a fold of the same log reaches now: each group the
    /// scheduler records as consumed is marked so and its closed members' trees retire.
    pub fn retire_consumed(&mut self, consumed: impl IntoIterator<Item = (GroupId, StepId)>) {
        for (group, step) in consumed {
            if let std::collections::btree_map::Entry::Vacant(entry) =
                self.consumed_groups.entry(group)
            {
                entry.insert(step);
                self.retire_group(group, step);
            }
        }
    }

    /// Every execution's tree counts in execution order, live and retired trees merged: what
    /// the state digest feeds, the same whether or not a tree has been retired.
    pub fn tree_counts(&self) -> impl Iterator<Item = (ExecutionId, TreeCounts)> + '_ {
        let mut live = self
            .trees
            .iter()
            .map(|(execution, tree)| {
                let counts = (tree.len() as u64, tree.leaf_count(), tree.tokens_count());
                (*execution, counts)
            })
            .peekable();
        let mut retired = self
            .retired
            .iter()
            .map(|(execution, tree)| (*execution, (tree.nodes, tree.leaves, tree.tokens)))
            .peekable();
        std::iter::from_fn(move || match (live.peek(), retired.peek()) {
            (Some((a, _)), Some((b, _))) if b < a => retired.next(),
            (Some(_), _) => live.next(),
            (None, _) => retired.next(),
        })
    }

    /// Replaces the trees of a consumed group's closed members by their counts; members still
    /// running are retired when they close.
    fn retire_group(&mut self, group: GroupId, step: StepId) {
        let Some(state) = self.scoring.groups.get(&group) else {
            return;
        };
        let members = state.members.clone();
        for member in members {
            let closed = self
                .scoring
                .executions
                .get(&member)
                .is_some_and(|score| score.closed.is_some());
            if closed {
                self.retire(member, step);
            } else {
                self.retiring.insert(member, step);
            }
        }
    }

    fn retire(&mut self, execution: ExecutionId, step: StepId) {
        if let Some(tree) = self.trees.remove(&execution) {
            self.retired.insert(
                execution,
                RetiredTree {
                    nodes: tree.len() as u64,
                    leaves: tree.leaf_count(),
                    tokens: tree.tokens_count(),
                    step,
                },
            );
        }
    }

    /// Refuses a model call for an execution whose records are frozen: one that closed (partial
    /// scoring evaluates what was committed by then; a call still in flight at the close is
    /// not part of it), or whose group an optimizer step consumed.
    fn refuse_frozen(&self, execution: ExecutionId) -> Result<(), TrajectoryError> {
        let score = self.scoring.executions.get(&execution);
        if let Some(step) = score.and_then(|score| self.consumed_groups.get(&score.group)) {
            return Err(TrajectoryError::Scoring {
                execution,
                message: format!(
                    "model call after optimizer step {step} consumed this execution's group (its tree is retired)"
                ),
            });
        }
        match score.and_then(|score| score.closed) {
            Some((status, _)) => Err(TrajectoryError::Scoring {
                execution,
                message: format!(
                    "model call after the execution closed ({}): its records were frozen at close",
                    status.as_str()
                ),
            }),
            None => Ok(()),
        }
    }

    /// [`TrajectoryBuffer::apply`] taking the event by value: a model call's tokens move into
    /// the tree instead of being copied.
    pub fn apply_owned(&mut self, event: Event) -> Result<(), TrajectoryError> {
        match event.body {
            EventBody::ModelCall(record) => {
                self.refuse_frozen(record.execution)?;
                let execution = record.execution;
                match self.trees.get_mut(&execution) {
                    Some(tree) => {
                        tree.apply_owned(*record)?;
                    }
                    // A first call's tree is kept only if the call is: a refused one leaves
                    // nothing behind (the digest reads every tree).
                    None => {
                        let mut tree = Tree::new(execution, self.tree_config);
                        tree.apply_owned(*record)?;
                        self.trees.insert(execution, tree);
                    }
                }
                Ok(())
            }
            body => self.apply(&Event { at: event.at, body }),
        }
    }

    pub fn apply(&mut self, event: &Event) -> Result<(), TrajectoryError> {
        match &event.body {
            EventBody::ModelCall(record) => {
                self.refuse_frozen(record.execution)?;
                match self.trees.get_mut(&record.execution) {
                    Some(tree) => {
                        tree.apply(record)?;
                    }
                    None => {
                        let mut tree = Tree::new(record.execution, self.tree_config);
                        tree.apply(record)?;
                        self.trees.insert(record.execution, tree);
                    }
                }
            }
            EventBody::TrajectoriesAdmitted {
                execution,
                trajectories,
            } => {
                if self.admissions.contains_key(execution) {
                    return Err(TrajectoryError::Scoring {
                        execution: *execution,
                        message: "admitted twice".into(),
                    });
                }
                self.admissions.insert(*execution, trajectories.clone());
            }
            EventBody::MicroStepsEnqueued { group, .. } => {
                self.packed_groups.insert(*group);
            }
            EventBody::ExecutionClosed { execution, .. } => {
                self.scoring.apply(event)?;
                if let Some(step) = self.retiring.remove(execution) {
                    self.retire(*execution, step);
                }
            }
            EventBody::OptimizerStepped { step, consumed, .. } => {
                self.scoring.apply(event)?;
                self.retire_consumed(consumed.iter().map(|c| (c.group, *step)));
            }
            _ => self.scoring.apply(event)?,
        }
        Ok(())
    }

    /// Admission decisions for every valid member of a ready group not yet admitted. Dummies and
    /// executions without records are admitted with no trajectories (L_i = 0).
    pub fn decide_admissions(
        &self,
        run_seed: u64,
        j_max: u32,
        classes: &RoleClasses,
    ) -> Vec<EventBody> {
        let mut decisions = Vec::new();
        for (group, state) in &self.scoring.groups {
            if !self.scoring.group_ready(*group) {
                continue;
            }
            for member in &state.members {
                // A retired member's group was consumed already: nothing is left to admit.
                if self.admissions.contains_key(member) || self.retired.contains_key(member) {
                    continue;
                }
                let trajectories = match (
                    self.scoring.executions[member].resolution(),
                    self.trees.get(member),
                ) {
                    (Some(Resolution::Valid { .. }), Some(tree)) => {
                        admit(
                            tree,
                            classes,
                            j_max,
                            &mut SplitMix64::for_execution(run_seed, member.get()),
                        )
                        .trajectories
                    }
                    (Some(Resolution::Valid { .. }) | Some(Resolution::Dummy), _) => Vec::new(),
                    _ => continue,
                };
                decisions.push(EventBody::TrajectoriesAdmitted {
                    execution: *member,
                    trajectories,
                });
            }
        }
        decisions
    }

    /// Ready groups whose valid members are all admitted and that are not yet packed, with v_d.
    pub fn packable_groups(&self) -> Vec<(GroupId, PolicyVersion)> {
        self.scoring
            .groups
            .iter()
            .filter(|(group, state)| {
                !self.packed_groups.contains(group)
                    && self.scoring.group_ready(**group)
                    && state.members.iter().all(|member| {
                        self.admissions.contains_key(member)
                            || !matches!(
                                self.scoring.executions[member].resolution(),
                                Some(Resolution::Valid { .. } | Resolution::Dummy)
                            )
                    })
            })
            .map(|(group, state)| (*group, state.policy_version))
            .collect()
    }

    /// The rows of a packable group, members in start order, trajectories in admission order.
    pub fn rows(
        &self,
        group: GroupId,
        groups_per_batch: u32,
        normalization: AdvantageNormalization,
    ) -> Result<Vec<Row>, TrajectoryError> {
        let advantages =
            self.scoring
                .advantages(group, normalization)
                .ok_or(TrajectoryError::Group {
                    group,
                    message: "not ready".into(),
                })?;
        let executions_per_group = self.scoring.groups[&group].executions_per_group;
        let mut rows = Vec::new();
        for member in &self.scoring.groups[&group].members {
            let (Some(advantage), Some(trajectories), Some(tree)) = (
                advantages.get(member),
                self.admissions.get(member),
                self.trees.get(member),
            ) else {
                continue;
            };
            let targets_count: u64 = trajectories.iter().map(trajectory_targets_count).sum();
            let weight = target_weight(targets_count, groups_per_batch, executions_per_group);
            for trajectory in trajectories {
                rows.push(materialise(tree, trajectory, *advantage, weight)?);
            }
        }
        Ok(rows)
    }

    pub fn validate(&self) {
        for tree in self.trees.values() {
            tree.validate();
        }
        for execution in self.retired.keys() {
            assert!(
                !self.trees.contains_key(execution),
                "execution {execution} is both retired and live"
            );
            assert!(
                !self.retiring.contains_key(execution),
                "execution {execution} is retired and still waiting to retire"
            );
        }
        self.scoring.validate();
    }
}
