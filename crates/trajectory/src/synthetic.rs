//! Seeded synthetic executions shaped like Claude Code runs, for tests and benchmarks.
//!
//! A main agent takes turns (tool result in, assistant turn out); when its context passes a
//! threshold it sends a summary request and continues from its system prompt plus the summary
//! (a compaction: a branch from the root); it spawns sub-agents, each with its own system
//! prompt (its own root), their own compactions, and a final answer that returns to the main
//! agent as a tool result; any call may be retried (same context, another output: a sibling
//! leaf). The default configuration matches the paper's Appendix C case in size (≈636 calls,
//! ≈1.3k message-like segments, ≈1M lifecycle tokens). Everything is drawn from [`SplitMix64`].

use gyre_event::CallKind;

use crate::SplitMix64;

/// Shape of a synthetic execution.
#[derive(Clone, Debug, PartialEq)]
pub struct SyntheticConfig {
    /// Total calls of the main agent (sub-agent calls come on top).
    pub main_calls: u32,
    pub sub_agents: u32,
    pub sub_agent_calls: u32,
    pub system_prompt_tokens: u32,
    /// Tool result / user input per turn, inclusive range.
    pub input_tokens: (u32, u32),
    /// Sampled output per turn, inclusive range.
    pub output_tokens: (u32, u32),
    pub summary_output_tokens: u32,
    /// A context longer than this triggers a summary request.
    pub compaction_context_tokens: u64,
    /// Chance of a retry per call, in per mille.
    pub retry_per_mille: u32,
}

impl SyntheticConfig {
    /// The paper's Appendix C case in size.
    pub fn appendix_c() -> Self {
        Self {
            main_calls: 430,
            sub_agents: 3,
            sub_agent_calls: 64,
            system_prompt_tokens: 3_000,
            input_tokens: (250, 1_700),
            output_tokens: (80, 1_250),
            summary_output_tokens: 2_000,
            compaction_context_tokens: 160_000,
            retry_per_mille: 15,
        }
    }

    /// A small execution for property tests.
    pub fn small(main_calls: u32, sub_agents: u32) -> Self {
        Self {
            main_calls,
            sub_agents,
            sub_agent_calls: 6,
            system_prompt_tokens: 6,
            input_tokens: (1, 6),
            output_tokens: (1, 5),
            summary_output_tokens: 3,
            compaction_context_tokens: 40,
            retry_per_mille: 150,
        }
    }
}

/// One generated call with its full context.
#[derive(Clone, Debug, PartialEq)]
pub struct SyntheticCall {
    /// Position of this call in the execution (0-based); also its call number.
    pub index: u32,
    pub agent: String,
    pub kind: CallKind,
    /// Index of the call that spawned this call's agent.
    pub spawned_by: Option<u32>,
    pub context: Vec<u32>,
    pub output_ids: Vec<u32>,
    pub output_logprobs: Vec<f32>,
}

struct Agent {
    name: String,
    system: Vec<u32>,
    context: Vec<u32>,
    spawned_by: Option<u32>,
}

/// Generates an execution call by call, handing each call to a sink (full contexts of a large
/// execution add up to tens of millions of tokens, so they are not kept).
pub struct Generator<'a> {
    config: SyntheticConfig,
    rng: SplitMix64,
    calls_count: u32,
    sink: Box<dyn FnMut(SyntheticCall) + 'a>,
}

const VOCABULARY: u64 = 50_000;

impl<'a> Generator<'a> {
    pub fn new(config: SyntheticConfig, seed: u64, sink: impl FnMut(SyntheticCall) + 'a) -> Self {
        Self {
            config,
            rng: SplitMix64::new(seed),
            calls_count: 0,
            sink: Box::new(sink),
        }
    }

    fn tokens(&mut self, count: u32) -> Vec<u32> {
        (0..count)
            .map(|_| 1 + self.rng.below(VOCABULARY) as u32)
            .collect()
    }

    fn between(&mut self, (low, high): (u32, u32)) -> u32 {
        low + self.rng.below((high - low + 1) as u64) as u32
    }

    fn emit(
        &mut self,
        agent: &Agent,
        kind: CallKind,
        context: Vec<u32>,
        output_ids: Vec<u32>,
    ) -> u32 {
        let index = self.calls_count;
        self.calls_count += 1;
        let output_logprobs = output_ids
            .iter()
            .map(|_| -((self.rng.below(5_000) as f32) / 1_000.0))
            .collect();
        (self.sink)(SyntheticCall {
            index,
            agent: agent.name.clone(),
            kind,
            spawned_by: agent.spawned_by,
            context,
            output_ids,
            output_logprobs,
        });
        index
    }

    /// One agent turn (with possible retry and compaction); returns the output that continues.
    fn turn(&mut self, agent: &mut Agent) -> (u32, Vec<u32>) {
        if agent.context.len() as u64 > self.config.compaction_context_tokens {
            let mut context = agent.context.clone();
            context.extend(self.tokens(3)); // the summary instruction
            let summary = self.tokens(self.config.summary_output_tokens);
            self.emit(agent, CallKind::Summary, context, summary.clone());
            agent.context = agent.system.clone();
            agent.context.extend(self.tokens(2)); // "continue from this summary" header
            agent.context.extend(summary);
        }
        if self.rng.below(1_000) < self.config.retry_per_mille as u64 {
            let count = self.between(self.config.output_tokens);
            let abandoned = self.tokens(count);
            self.emit(agent, CallKind::Turn, agent.context.clone(), abandoned);
        }
        let count = self.between(self.config.output_tokens);
        let output = self.tokens(count);
        let index = self.emit(agent, CallKind::Turn, agent.context.clone(), output.clone());
        agent.context.extend_from_slice(&output);
        (index, output)
    }

    fn new_agent(&mut self, name: String, spawned_by: Option<u32>) -> Agent {
        let system = self.tokens(self.config.system_prompt_tokens);
        let mut context = system.clone();
        let count = self.between(self.config.input_tokens);
        context.extend(self.tokens(count));
        Agent {
            name,
            system,
            context,
            spawned_by,
        }
    }

    /// Generates a whole execution; returns the number of calls.
    pub fn run(mut self) -> u32 {
        let mut main = self.new_agent("main".into(), None);
        let spawn_every = self.config.main_calls / (self.config.sub_agents + 1).max(1);
        let mut spawned = 0;
        for turn in 0..self.config.main_calls {
            let (index, _) = self.turn(&mut main);
            if spawned < self.config.sub_agents && spawn_every > 0 && (turn + 1) % spawn_every == 0
            {
                spawned += 1;
                let mut sub = self.new_agent(format!("agent-{spawned}"), Some(index));
                let mut answer = Vec::new();
                for _ in 0..self.config.sub_agent_calls {
                    let (_, output) = self.turn(&mut sub);
                    answer = output;
                    let count = self.between(self.config.input_tokens);
                    let tool_result = self.tokens(count);
                    sub.context.extend(tool_result);
                }
                // The sub-agent's final answer returns to the main agent as a tool result.
                main.context.extend(answer);
            } else {
                let count = self.between(self.config.input_tokens);
                let tool_result = self.tokens(count);
                main.context.extend(tool_result);
            }
        }
        self.calls_count
    }
}

/// Generates one execution and keeps every call (for small executions).
pub fn generate(config: SyntheticConfig, seed: u64) -> Vec<SyntheticCall> {
    let mut calls = Vec::new();
    Generator::new(config, seed, |call| calls.push(call)).run();
    calls
}

/// Builds the tree of generated calls through the matcher (call `i` gets `CallId(i)`).
pub fn build_tree(
    execution: gyre_event::ExecutionId,
    calls: &[SyntheticCall],
    config: crate::TreeConfig,
) -> Result<crate::Tree, crate::TrajectoryError> {
    let mut tree = crate::Tree::new(execution, config);
    for call in calls {
        let record = crate::record_from_context(&tree, &context_call(call));
        tree.apply(&record)?;
    }
    Ok(tree)
}

/// The matcher's view of a generated call.
pub fn context_call(call: &SyntheticCall) -> crate::ContextCall<'_> {
    crate::ContextCall {
        call: gyre_event::CallId(call.index as u64),
        agent: &call.agent,
        kind: call.kind,
        spawned_by: call
            .spawned_by
            .map(|index| gyre_event::CallId(index as u64)),
        context: &call.context,
        context_provenance: gyre_event::Provenance::User,
        output_ids: &call.output_ids,
        output_logprobs: &call.output_logprobs,
        engine: gyre_event::EngineId(0),
        policy_version: gyre_event::PolicyVersion(0),
    }
}
