//! Partial scoring: the per-execution and per-group state machine, and group advantages.
//!
//! Per execution: `Running` → closed with a [`CloseStatus`] → evaluation attempts → resolved.
//! Each attempt is bound to (execution, artifact version, branch ref) when requested; a
//! completion must carry the same binding, and an attempt is never overwritten (a second
//! outcome for the same attempt is rejected).
//!
//! **The designated result is frozen.** It is chosen once, at the first event after which the
//! execution is closed and has a valid completion: the valid completion with the highest
//! artifact version completed so far (among completions of one version, the earliest attempt).
//! Completions folded later are kept for the audit trail but never replace it, so a reward a
//! group was ready (and perhaps trained) with is the reward every later reader sees. This
//! projection is the one authority on resolutions: `gyre-state` hands each resolution it
//! reaches to the scheduler projection, which keeps no rule of its own.
//!
//! Failure classes (DESIGN.md §6): an evaluator failure (or an invalid completion) leaves the
//! execution *pending*; [`Scoring::decide`] retries it on the same state while the execution's
//! evaluation budget lasts and excludes it once the budget is spent (pending is not a valid
//! zero). A total failure with nothing to evaluate is resolved by `DummyInserted`: a valid zero
//! reward, so the group keeps N members. Overall timeouts, cancellations and surplus executions
//! are excluded on close (no valid reward is expected); surplus executions also leave the group.
//!
//! A group is ready when it has N members and every member is closed and resolved (valid,
//! dummy or excluded; a surplus or cancelled member is excluded, like the scheduler counts
//! it). Its advantages use the valid rewards only; excluded members get none.

use std::collections::{BTreeMap, BTreeSet};

use gyre_event::{
    CloseStatus, Duration, Event, EventBody, ExecutionId, GroupId, PolicyVersion, Timestamp,
};

use crate::TrajectoryError;

/// ε added to the group's standard deviation before dividing, so that a group whose valid
/// rewards are all equal gets zero advantages instead of a division by zero.
pub const ADVANTAGE_STD_EPSILON: f64 = 1e-6;

/// How group-relative advantages are normalised.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum AdvantageNormalization {
    /// Â_i = (r_i − mean) / (std + ε), std the population standard deviation of valid rewards.
    StdNormalized { epsilon: f64 },
    /// Â_i = r_i − mean.
    MeanOnly,
}

impl Default for AdvantageNormalization {
    fn default() -> Self {
        AdvantageNormalization::StdNormalized {
            epsilon: ADVANTAGE_STD_EPSILON,
        }
    }
}

/// Group-relative advantages of the valid rewards, in input order.
pub fn group_advantages(rewards: &[f64], normalization: AdvantageNormalization) -> Vec<f64> {
    if rewards.is_empty() {
        return Vec::new();
    }
    let count = rewards.len() as f64;
    let mean = rewards.iter().sum::<f64>() / count;
    match normalization {
        AdvantageNormalization::MeanOnly => rewards.iter().map(|reward| reward - mean).collect(),
        AdvantageNormalization::StdNormalized { epsilon } => {
            let variance = rewards
                .iter()
                .map(|reward| (reward - mean).powi(2))
                .sum::<f64>()
                / count;
            let scale = variance.sqrt() + epsilon;
            rewards
                .iter()
                .map(|reward| (reward - mean) / scale)
                .collect()
        }
    }
}

/// Limits of the scoring state machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScoringConfig {
    /// Time from an execution's start until pending evaluations are given up.
    pub evaluation_budget: Duration,
    /// Most evaluation attempts per execution.
    pub attempts_max: u32,
}

impl Default for ScoringConfig {
    fn default() -> Self {
        Self {
            evaluation_budget: Duration::from_secs(6 * 3600),
            attempts_max: 8,
        }
    }
}

/// The outcome of one evaluation attempt.
#[derive(Clone, Debug, PartialEq)]
pub enum AttemptOutcome {
    Completed {
        score: f64,
        valid: bool,
        evaluated_state_ref: String,
        evaluator: String,
    },
    Failed {
        reason: String,
    },
}

/// One evaluation attempt and its binding.
#[derive(Clone, Debug, PartialEq)]
pub struct EvaluationAttempt {
    pub artifact_version: u64,
    pub branch_ref: String,
    pub requested_at: Timestamp,
    pub outcome: Option<AttemptOutcome>,
}

/// How an execution's reward was settled.
#[derive(Clone, Debug, PartialEq)]
pub enum Resolution {
    Valid {
        reward: f64,
        attempt: u32,
    },
    /// A zero-reward placeholder for a total failure.
    Dummy,
    Excluded {
        reason: String,
    },
}

/// The scoring state of one execution.
#[derive(Clone, Debug, PartialEq)]
pub struct ExecutionScore {
    pub group: GroupId,
    pub started_at: Timestamp,
    pub closed: Option<(CloseStatus, Timestamp)>,
    pub attempts: BTreeMap<u32, EvaluationAttempt>,
    pub dummy: bool,
    pub excluded: Option<String>,
    /// The attempt whose valid completion is the designated result, frozen when chosen (see
    /// the module documentation).
    pub designated: Option<u32>,
}

impl ExecutionScore {
    /// The designated valid result (attempt, score): frozen once chosen.
    pub fn designated(&self) -> Option<(u32, f64)> {
        let attempt = self.designated?;
        match &self.attempts.get(&attempt)?.outcome {
            Some(AttemptOutcome::Completed {
                score, valid: true, ..
            }) => Some((attempt, *score)),
            _ => None,
        }
    }

    /// The valid completion a designation made now would choose: highest artifact version,
    /// then earliest attempt. Before designation this is the candidate; after it, completions
    /// folded since may make it differ from [`ExecutionScore::designated`].
    pub fn best_valid(&self) -> Option<(u32, f64)> {
        let mut best: Option<(u64, u32, f64)> = None;
        for (attempt, record) in &self.attempts {
            if let Some(AttemptOutcome::Completed {
                score, valid: true, ..
            }) = &record.outcome
            {
                let better = match best {
                    None => true,
                    Some((version, _, _)) => record.artifact_version > version,
                };
                if better {
                    best = Some((record.artifact_version, *attempt, *score));
                }
            }
        }
        best.map(|(_, attempt, score)| (attempt, score))
    }

    /// Whether [`ExecutionScore::resolution`] is `Some` (without building it).
    pub fn is_resolved(&self) -> bool {
        self.excluded.is_some()
            || (self.closed.is_some() && (self.dummy || self.designated.is_some()))
    }

    /// `None` while running or pending.
    pub fn resolution(&self) -> Option<Resolution> {
        if let Some(reason) = &self.excluded {
            return Some(Resolution::Excluded {
                reason: reason.clone(),
            });
        }
        self.closed?;
        if self.dummy {
            return Some(Resolution::Dummy);
        }
        self.designated()
            .map(|(attempt, reward)| Resolution::Valid { reward, attempt })
    }

    pub fn is_surplus(&self) -> bool {
        matches!(self.closed, Some((CloseStatus::Surplus, _)))
    }

    /// The designation a fold would freeze now if none were frozen yet: the best valid
    /// completion of a closed execution that is neither a dummy nor excluded.
    pub fn fresh_designation(&self) -> Option<u32> {
        if self.closed.is_some() && !self.dummy && self.excluded.is_none() {
            self.best_valid().map(|(attempt, _)| attempt)
        } else {
            None
        }
    }

    /// The frozen designation where it differs from [`ExecutionScore::fresh_designation`]
    /// (a completion of a higher artifact version folded after it was frozen): the only case
    /// in which the designation is not implied by the rest of the state, so the only one a
    /// snapshot and the state digest record explicitly.
    #[inline]
    pub fn designation_override(&self) -> Option<u32> {
        // With one attempt there is nothing else the rule could pick (the common case, and the
        // digest asks this of every execution at every checkpoint).
        if self.attempts.len() < 2 {
            return None;
        }
        self.designated
            .filter(|_| self.designated != self.fresh_designation())
    }

    /// Closed and not resolved.
    pub fn awaits_resolution(&self) -> bool {
        self.closed.is_some() && !self.is_resolved()
    }

    /// Freezes the designated result if this execution has just become able to have one.
    fn settle(&mut self) {
        if self.designated.is_none() {
            self.designated = self.fresh_designation();
        }
    }
}

/// A group's members and dispatch version.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupScore {
    /// N.
    pub executions_per_group: u32,
    /// v_d: the published version when the group was dispatched.
    pub policy_version: PolicyVersion,
    pub members: Vec<ExecutionId>,
}

/// Partial-scoring projection over the log.
///
/// `executions` and `groups` change only through [`Scoring::apply`] (they are public to be
/// read): the projection keeps an index of the executions [`Scoring::decide`] has to look at,
/// which `apply` maintains and [`Scoring::from_parts`] rebuilds.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Scoring {
    pub config: ScoringConfig,
    pub executions: BTreeMap<ExecutionId, ExecutionScore>,
    pub groups: BTreeMap<GroupId, GroupScore>,
    /// Executions closed and not resolved, the only ones `decide` can act on. A run keeps
    /// every execution it ever started, so without this every decision (the leader asks on
    /// each tick and each applied entry) would walk all of them. Derived: not encoded, not in
    /// the digest.
    pub(crate) awaiting: BTreeSet<ExecutionId>,
}

impl Scoring {
    pub fn new(config: ScoringConfig) -> Self {
        Self {
            config,
            ..Self::default()
        }
    }

    /// The projection holding `executions` and `groups` (a decoded snapshot), its index of
    /// executions awaiting a resolution rebuilt.
    pub fn from_parts(
        config: ScoringConfig,
        executions: BTreeMap<ExecutionId, ExecutionScore>,
        groups: BTreeMap<GroupId, GroupScore>,
    ) -> Self {
        let awaiting = executions
            .iter()
            .filter(|(_, state)| state.awaits_resolution())
            .map(|(execution, _)| *execution)
            .collect();
        Self {
            config,
            executions,
            groups,
            awaiting,
        }
    }

    /// Executions closed and not yet resolved, in id order: those waiting for an evaluation
    /// (or for [`Scoring::decide`] to retry or exclude them).
    pub fn awaiting(&self) -> impl Iterator<Item = ExecutionId> + '_ {
        self.awaiting.iter().copied()
    }

    /// Files `execution` in the index, or takes it out, by its state now.
    fn track(&mut self, execution: ExecutionId) {
        if self
            .executions
            .get(&execution)
            .is_some_and(ExecutionScore::awaits_resolution)
        {
            self.awaiting.insert(execution);
        } else {
            self.awaiting.remove(&execution);
        }
    }

    fn execution_mut(
        &mut self,
        execution: ExecutionId,
    ) -> Result<&mut ExecutionScore, TrajectoryError> {
        self.executions
            .get_mut(&execution)
            .ok_or_else(|| TrajectoryError::Scoring {
                execution,
                message: "never started".into(),
            })
    }

    /// Folds one event; events this projection does not track are ignored.
    pub fn apply(&mut self, event: &Event) -> Result<(), TrajectoryError> {
        let result = self.fold(event);
        // Every event that can close or resolve an execution names it. Tracked whether or not
        // the event was refused: the index follows the state, whatever the state is.
        match &event.body {
            EventBody::ExecutionClosed { execution, .. }
            | EventBody::EvaluationRequested { execution, .. }
            | EventBody::EvaluationCompleted { execution, .. }
            | EventBody::EvaluationFailed { execution, .. }
            | EventBody::DummyInserted { execution, .. }
            | EventBody::ExecutionExcluded { execution, .. } => self.track(*execution),
            _ => {}
        }
        result
    }

    fn fold(&mut self, event: &Event) -> Result<(), TrajectoryError> {
        let reject =
            |execution, message: String| Err(TrajectoryError::Scoring { execution, message });
        match &event.body {
            EventBody::GroupsDispatched {
                groups,
                executions_per_group,
                policy_version,
            } => {
                for dispatched in groups {
                    if self.groups.contains_key(&dispatched.group) {
                        return Err(TrajectoryError::Group {
                            group: dispatched.group,
                            message: "dispatched twice".into(),
                        });
                    }
                    self.groups.insert(
                        dispatched.group,
                        GroupScore {
                            executions_per_group: *executions_per_group,
                            policy_version: *policy_version,
                            members: Vec::new(),
                        },
                    );
                }
            }
            EventBody::ExecutionStarted {
                execution, group, ..
            } => {
                if self.executions.contains_key(execution) {
                    return reject(*execution, "started twice".into());
                }
                let group_state =
                    self.groups
                        .get_mut(group)
                        .ok_or_else(|| TrajectoryError::Group {
                            group: *group,
                            message: format!(
                                "execution {execution} started in an undispatched group"
                            ),
                        })?;
                group_state.members.push(*execution);
                self.executions.insert(
                    *execution,
                    ExecutionScore {
                        group: *group,
                        started_at: event.at,
                        closed: None,
                        attempts: BTreeMap::new(),
                        dummy: false,
                        excluded: None,
                        designated: None,
                    },
                );
            }
            EventBody::ExecutionClosed { execution, status } => {
                let state = self.execution_mut(*execution)?;
                if state.closed.is_some() {
                    return reject(*execution, "closed twice".into());
                }
                state.closed = Some((*status, event.at));
                let excluded = match status {
                    CloseStatus::OverallTimeout => Some("overall timeout: budget exhausted"),
                    CloseStatus::Cancelled => Some("cancelled"),
                    CloseStatus::Surplus => Some("surplus: not needed by its group"),
                    CloseStatus::Completed | CloseStatus::Failed | CloseStatus::HarnessTimeout => {
                        None
                    }
                };
                if let Some(reason) = excluded {
                    state.excluded = Some(reason.into());
                }
                state.settle();
            }
            EventBody::EvaluationRequested {
                execution,
                attempt,
                artifact_version,
                branch_ref,
            } => {
                let attempts_max = self.config.attempts_max;
                let state = self.execution_mut(*execution)?;
                if state.attempts.contains_key(attempt) {
                    return reject(
                        *execution,
                        format!("evaluation attempt {attempt} requested twice"),
                    );
                }
                if state
                    .attempts
                    .keys()
                    .next_back()
                    .is_some_and(|last| last > attempt)
                {
                    return reject(
                        *execution,
                        format!("evaluation attempt {attempt} is older than the last one"),
                    );
                }
                if state.attempts.len() as u32 >= attempts_max {
                    return Err(TrajectoryError::LimitExceeded {
                        what: "evaluation attempts per execution",
                        limit: attempts_max as u64,
                    });
                }
                state.attempts.insert(
                    *attempt,
                    EvaluationAttempt {
                        artifact_version: *artifact_version,
                        branch_ref: branch_ref.clone(),
                        requested_at: event.at,
                        outcome: None,
                    },
                );
            }
            EventBody::EvaluationCompleted {
                execution,
                attempt,
                score,
                valid,
                evaluated_state_ref,
                artifact_version,
                branch_ref,
                evaluator,
            } => {
                let state = self.execution_mut(*execution)?;
                let Some(record) = state.attempts.get_mut(attempt) else {
                    return reject(
                        *execution,
                        format!("evaluation attempt {attempt} was never requested"),
                    );
                };
                if record.outcome.is_some() {
                    return reject(
                        *execution,
                        format!("evaluation attempt {attempt} already has an outcome"),
                    );
                }
                if record.artifact_version != *artifact_version || record.branch_ref != *branch_ref
                {
                    return reject(
                        *execution,
                        format!(
                            "attempt {attempt} was bound to artifact {} on `{}`, completed for {} on `{}`",
                            record.artifact_version, record.branch_ref, artifact_version, branch_ref
                        ),
                    );
                }
                if *valid && !score.is_finite() {
                    return reject(
                        *execution,
                        format!("valid evaluation with non-finite score {score}"),
                    );
                }
                record.outcome = Some(AttemptOutcome::Completed {
                    score: *score,
                    valid: *valid,
                    evaluated_state_ref: evaluated_state_ref.clone(),
                    evaluator: evaluator.clone(),
                });
                state.settle();
            }
            EventBody::EvaluationFailed {
                execution,
                attempt,
                reason,
            } => {
                let state = self.execution_mut(*execution)?;
                let Some(record) = state.attempts.get_mut(attempt) else {
                    return reject(
                        *execution,
                        format!("evaluation attempt {attempt} was never requested"),
                    );
                };
                if record.outcome.is_some() {
                    return reject(
                        *execution,
                        format!("evaluation attempt {attempt} already has an outcome"),
                    );
                }
                record.outcome = Some(AttemptOutcome::Failed {
                    reason: reason.clone(),
                });
            }
            EventBody::DummyInserted { execution, group } => {
                let state = self.execution_mut(*execution)?;
                if state.group != *group {
                    return reject(
                        *execution,
                        format!("dummy for group {group}, but it belongs to {}", state.group),
                    );
                }
                if state.closed.is_none() {
                    return reject(*execution, "dummy inserted before close".into());
                }
                if state.best_valid().is_some() || state.excluded.is_some() {
                    return reject(
                        *execution,
                        "dummy inserted for an already resolved execution".into(),
                    );
                }
                state.dummy = true;
            }
            EventBody::ExecutionExcluded { execution, reason } => {
                let state = self.execution_mut(*execution)?;
                if state.best_valid().is_some() || state.dummy {
                    return reject(*execution, "excluded although it has a valid result".into());
                }
                if state.excluded.is_none() {
                    state.excluded = Some(reason.clone());
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Retries and exclusions due at `now`: a pending execution whose last attempt failed is
    /// re-evaluated on the same artifact version and branch while its budget lasts; once the
    /// budget (or the attempt limit) is spent it is excluded.
    pub fn decide(&self, now: Timestamp) -> Vec<EventBody> {
        let mut decisions = Vec::new();
        for execution in &self.awaiting {
            let Some(state) = self.executions.get(execution) else {
                continue;
            };
            let deadline = state.started_at.plus(self.config.evaluation_budget);
            let last = state.attempts.iter().next_back();
            let last_settled = last.is_some_and(|(_, record)| record.outcome.is_some());
            // An attempt numbered u32::MAX leaves no number for a retry: out of attempts too.
            let next_attempt = last.and_then(|(attempt, _)| attempt.checked_add(1));
            let out_of_attempts = state.attempts.len() as u32 >= self.config.attempts_max
                || (last.is_some() && next_attempt.is_none());
            if now >= deadline || (last_settled && out_of_attempts) {
                decisions.push(EventBody::ExecutionExcluded {
                    execution: *execution,
                    reason: "evaluation budget exhausted without a valid result".into(),
                });
            } else if let (Some((_, record)), Some(attempt)) =
                (last.filter(|_| last_settled), next_attempt)
            {
                decisions.push(EventBody::EvaluationRequested {
                    execution: *execution,
                    attempt,
                    artifact_version: record.artifact_version,
                    branch_ref: record.branch_ref.clone(),
                });
            }
        }
        decisions
    }

    /// Whether `group` has its N members and every one is closed and resolved (the rule the
    /// scheduler's `GroupState::ready` counts: a surplus member is an excluded member).
    pub fn group_ready(&self, group: GroupId) -> bool {
        let Some(state) = self.groups.get(&group) else {
            return false;
        };
        state.members.len() as u32 >= state.executions_per_group
            && state.members.iter().all(|member| {
                self.executions
                    .get(member)
                    .is_some_and(|score| score.closed.is_some() && score.is_resolved())
            })
    }

    /// Advantages of a ready group's valid members (dummies count as valid zeros); `None` if the
    /// group is not ready.
    pub fn advantages(
        &self,
        group: GroupId,
        normalization: AdvantageNormalization,
    ) -> Option<BTreeMap<ExecutionId, f64>> {
        if !self.group_ready(group) {
            return None;
        }
        let mut valid: Vec<(ExecutionId, f64)> = Vec::new();
        for member in &self.groups[&group].members {
            match self.executions[member].resolution() {
                Some(Resolution::Valid { reward, .. }) => valid.push((*member, reward)),
                Some(Resolution::Dummy) => valid.push((*member, 0.0)),
                _ => {}
            }
        }
        let rewards: Vec<f64> = valid.iter().map(|(_, reward)| *reward).collect();
        let advantages = group_advantages(&rewards, normalization);
        Some(
            valid
                .iter()
                .map(|(member, _)| *member)
                .zip(advantages)
                .collect(),
        )
    }

    /// Checks invariants (STYLE rule 8).
    pub fn validate(&self) {
        for (execution, state) in &self.executions {
            let group = self
                .groups
                .get(&state.group)
                .expect("an execution's group is dispatched");
            assert!(group.members.contains(execution), "group lists its members");
            assert!(
                !(state.dummy && state.designated().is_some()),
                "a dummy has no valid result"
            );
            if state.dummy {
                assert!(state.excluded.is_none(), "a dummy is not excluded");
            }
            if let Some(attempt) = state.designated {
                assert!(
                    state.designated().is_some(),
                    "designated attempt {attempt} of {execution} is a valid completion"
                );
                assert!(
                    state.closed.is_some(),
                    "only a closed execution is designated"
                );
            }
            assert_eq!(
                self.awaiting.contains(execution),
                state.awaits_resolution(),
                "execution {execution} is indexed as awaiting a resolution iff it is closed and \
                 unresolved"
            );
        }
        for execution in &self.awaiting {
            assert!(
                self.executions.contains_key(execution),
                "awaiting execution {execution} was started"
            );
        }
    }
}
