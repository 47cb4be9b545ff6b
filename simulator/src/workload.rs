//! The rollout workload model: how long each execution runs and how it ends.
//!
//! An execution of query q runs for X = S_q · E, where S_q (the query's difficulty scale) and E
//! (the execution's own noise) are log-normal. Executions of one query are therefore correlated,
//! which reproduces the paper's clustered completions and its observation that long executions
//! concentrate in a few queries. X is capped by the harness timeout (status harness-timeout, still
//! scored); a fraction of those also exhaust the overall budget (status overall-timeout, excluded
//! from training). A small fraction fail totally (nothing to evaluate; a zero-reward dummy).
//!
//! Every draw comes from a ChaCha stream keyed by (seed, stream kind, entity id), so durations do
//! not depend on the order in which the simulation asks for them.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use serde::Serialize;

use gyre_event::{CloseStatus, ExecutionId, QueryId};

use crate::WorkloadConfig;

const STREAM_QUERY: u64 = 0x5155_4552_5900_0001;
const STREAM_EXECUTION: u64 = 0x4558_4543_0000_0002;

/// How one execution ends.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ExecutionOutcome {
    pub duration_s: f64,
    pub status: CloseStatus,
    /// A total failure: nothing to evaluate, the group gets a zero-reward dummy.
    pub dummy: bool,
    pub score: f64,
}

/// A seeded view of a [`WorkloadConfig`].
#[derive(Clone, Debug)]
pub struct Workload {
    config: WorkloadConfig,
    seed: u64,
}

/// SplitMix64 finaliser: decorrelates (seed, stream, id) into one 64-bit seed.
fn mix(seed: u64, stream: u64, id: u64) -> u64 {
    let mut z = seed ^ stream.rotate_left(17) ^ id.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Workload {
    pub fn new(config: WorkloadConfig, seed: u64) -> Self {
        Self { config, seed }
    }

    /// S_q in hours.
    pub fn query_scale_h(&self, query: QueryId) -> f64 {
        let mut rng = ChaCha8Rng::seed_from_u64(mix(self.seed, STREAM_QUERY, query.get()));
        let z: f64 = StandardNormal.sample(&mut rng);
        self.config.query_median_h * (self.config.query_sigma * z).exp()
    }

    pub fn outcome(&self, query: QueryId, execution_index: u64) -> ExecutionOutcome {
        let key = query.get().wrapping_mul(1 << 20) ^ execution_index;
        let mut rng = ChaCha8Rng::seed_from_u64(mix(self.seed, STREAM_EXECUTION, key));
        let z: f64 = StandardNormal.sample(&mut rng);
        let failure_draw: f64 = rng.random();
        let overall_draw: f64 = rng.random();
        let score_draw: f64 = rng.random();
        let config = &self.config;
        if failure_draw < config.total_failure_rate {
            // A total failure (an image pull, say) ends within minutes.
            return ExecutionOutcome {
                duration_s: 120.0 + 480.0 * score_draw,
                status: CloseStatus::Failed,
                dummy: true,
                score: 0.0,
            };
        }
        let hours = self.query_scale_h(query) * (config.execution_sigma * z).exp();
        if hours < config.harness_timeout_h {
            return ExecutionOutcome {
                duration_s: hours * 3600.0,
                status: CloseStatus::Completed,
                dummy: false,
                score: score_draw,
            };
        }
        if overall_draw < config.overall_given_harness_timeout {
            ExecutionOutcome {
                duration_s: config.overall_timeout_h * 3600.0,
                status: CloseStatus::OverallTimeout,
                dummy: false,
                score: 0.0,
            }
        } else {
            ExecutionOutcome {
                duration_s: config.harness_timeout_h * 3600.0,
                status: CloseStatus::HarnessTimeout,
                dummy: false,
                score: score_draw * 0.5,
            }
        }
    }

    /// The outcome of a specific execution: its index within the group is its offset from the
    /// group's first execution, which the simulator knows.
    pub fn outcome_for(
        &self,
        query: QueryId,
        execution: ExecutionId,
        first: ExecutionId,
    ) -> ExecutionOutcome {
        self.outcome(query, execution.get() - first.get())
    }
}

/// Summary statistics of a workload, in the paper's terms, from `queries` sampled queries.
#[derive(Clone, Debug, Serialize)]
pub struct WorkloadStats {
    pub queries: u64,
    pub execution_mean_h: f64,
    pub query_mean_h: f64,
    pub query_over_4h_fraction: f64,
    pub harness_timeout_fraction: f64,
    pub overall_timeout_fraction: f64,
    pub longest_execution_overall_timeout_fraction: f64,
}

pub fn sample_stats(config: &WorkloadConfig, n: u32, seed: u64, queries: u64) -> WorkloadStats {
    let workload = Workload::new(config.clone(), seed);
    let (mut execution_sum, mut query_sum) = (0.0, 0.0);
    let (mut over4, mut harness, mut overall, mut longest_overall) = (0u64, 0u64, 0u64, 0u64);
    for q in 0..queries {
        let mut longest = (0.0f64, CloseStatus::Completed);
        for index in 0..n as u64 {
            let outcome = workload.outcome(QueryId(q), index);
            let hours = outcome.duration_s / 3600.0;
            execution_sum += hours;
            match outcome.status {
                CloseStatus::HarnessTimeout => harness += 1,
                CloseStatus::OverallTimeout => overall += 1,
                _ => {}
            }
            if hours > longest.0 {
                longest = (hours, outcome.status);
            }
        }
        query_sum += longest.0;
        if longest.0 > 4.0 {
            over4 += 1;
        }
        if longest.1 == CloseStatus::OverallTimeout {
            longest_overall += 1;
        }
    }
    let executions = (queries * n as u64) as f64;
    WorkloadStats {
        queries,
        execution_mean_h: execution_sum / executions,
        query_mean_h: query_sum / queries as f64,
        query_over_4h_fraction: over4 as f64 / queries as f64,
        harness_timeout_fraction: harness as f64 / executions,
        overall_timeout_fraction: overall as f64 / executions,
        longest_execution_overall_timeout_fraction: longest_overall as f64 / queries as f64,
    }
}
