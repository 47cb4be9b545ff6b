//! The trajectory buffer: records, trees, rewards and admissions by group, as one projection.
//!
//! It folds the log's `ModelCall` records into one [`Tree`] per execution, the scoring events
//! into [`Scoring`], and `TrajectoriesAdmitted` into stored admissions. Its controller side
//! ([`TrajectoryBuffer::decide_admissions`]) admits trajectories for executions of ready groups,
//! seeded from the run seed and the execution id, and [`TrajectoryBuffer::rows`] materialises a
//! ready group for the stream packer. Packed groups are marked by `MicroStepsEnqueued`.

use std::collections::{BTreeMap, BTreeSet};

use gyre_event::{AdmittedTrajectory, Event, EventBody, ExecutionId, GroupId, PolicyVersion};

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
}

impl TrajectoryBuffer {
    pub fn new(tree_config: TreeConfig, scoring_config: ScoringConfig) -> Self {
        Self {
            tree_config,
            trees: BTreeMap::new(),
            scoring: Scoring::new(scoring_config),
            admissions: BTreeMap::new(),
            packed_groups: BTreeSet::new(),
        }
    }

    /// [`TrajectoryBuffer::apply`] taking the event by value: a model call's tokens move into
    /// the tree instead of being copied.
    pub fn apply_owned(&mut self, event: Event) -> Result<(), TrajectoryError> {
        match event.body {
            EventBody::ModelCall(record) => {
                let config = self.tree_config;
                self.trees
                    .entry(record.execution)
                    .or_insert_with(|| Tree::new(record.execution, config))
                    .apply_owned(*record)?;
                Ok(())
            }
            body => self.apply(&Event { at: event.at, body }),
        }
    }

    pub fn apply(&mut self, event: &Event) -> Result<(), TrajectoryError> {
        match &event.body {
            EventBody::ModelCall(record) => {
                let config = self.tree_config;
                self.trees
                    .entry(record.execution)
                    .or_insert_with(|| Tree::new(record.execution, config))
                    .apply(record)?;
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
                if self.admissions.contains_key(member) {
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
        self.scoring.validate();
    }
}
