//! Token-in/token-out (TITO) records: the exact tokens of one model call.
//!
//! A record stores only what is new relative to the parent node of the execution's trajectory
//! tree (the proxy matched the rest), so a 636-call execution does not store its context 636
//! times. Provenance says, per input token, where it came from; only engine-sampled output tokens
//! are ever trainable.

use crate::{CallId, Duration, EngineId, ExecutionId, PolicyVersion, Timestamp};

/// Where an input token came from. Only `Sampled` tokens (re-fed outputs) can be targets, and
/// only when they sit in a record's `output_ids`; everything else is context.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Provenance {
    System,
    User,
    ToolResult,
    /// Assistant text the harness injected rather than the engine sampled.
    HarnessAssistant,
    /// An evaluator critique consumed as input; never a policy target.
    EvaluatorCritique,
    /// Chat-template scaffolding (role markers, special tokens).
    Template,
    /// A token the engine sampled earlier, fed back as context.
    Sampled,
}

impl Provenance {
    pub const ALL: [Provenance; 7] = [
        Provenance::System,
        Provenance::User,
        Provenance::ToolResult,
        Provenance::HarnessAssistant,
        Provenance::EvaluatorCritique,
        Provenance::Template,
        Provenance::Sampled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Provenance::System => "system",
            Provenance::User => "user",
            Provenance::ToolResult => "tool_result",
            Provenance::HarnessAssistant => "harness_assistant",
            Provenance::EvaluatorCritique => "evaluator_critique",
            Provenance::Template => "template",
            Provenance::Sampled => "sampled",
        }
    }
}

/// A run of consecutive input tokens sharing one provenance (run-length encoded).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProvenanceSpan {
    pub provenance: Provenance,
    pub tokens_count: u32,
}

/// What kind of request the harness sent, as far as the proxy can tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CallKind {
    /// An ordinary agent turn.
    Turn,
    /// A summary / compaction request.
    Summary,
    /// The partial output of an attempt the engine abandoned (it died, timed out, or aborted
    /// in-flight requests for a role switch) before the proxy continued the same answer on
    /// another engine. Kept for audit (exact tokens, log-probs, engine, policy version); never
    /// trainable: no role class admits it.
    Aborted,
}

/// One model call, recorded by the proxy and committed before the harness gets its answer.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelCallRecord {
    pub execution: ExecutionId,
    pub call: CallId,
    /// Agent id as sent by the harness ("main" or a sub-agent id).
    pub agent: String,
    pub kind: CallKind,
    /// The call whose node this call's context extends (prefix sharing); `None` = a new root.
    pub parent_call: Option<CallId>,
    /// How many tokens of the parent path's full context this call reuses.
    pub reused_prefix_tokens_count: u64,
    /// The call that spawned this call's agent (causal parentage, not prefix sharing).
    pub spawned_by: Option<CallId>,
    /// New input tokens beyond the reused prefix.
    pub input_ids: Vec<u32>,
    /// Provenance of `input_ids`, run-length encoded; spans sum to `input_ids.len()`.
    pub input_provenance: Vec<ProvenanceSpan>,
    /// Tokens the engine sampled.
    pub output_ids: Vec<u32>,
    /// Behaviour log-probability of each output token under the engine's policy.
    pub output_logprobs: Vec<f32>,
    pub engine: EngineId,
    pub policy_version: PolicyVersion,
    pub requested_at: Timestamp,
    pub first_token_after: Duration,
    pub completed_after: Duration,
    /// The request's stop sequences (Anthropic `stop_sequences`, OpenAI `stop`), empty when
    /// it gave none. When one of them occurs in the decoded output, the harness got the text
    /// before its first occurrence; `output_ids` still holds every sampled token through the one
    /// that completed it. Kept so that a reader of the log (a restarted proxy, an audit) knows
    /// where the answer the harness saw ended and why.
    pub stop_sequences: Vec<String>,
    /// The format the request constrained its answer to (OpenAI Chat `response_format`,
    /// Responses `text.format`, Anthropic `output_config.format`); `None` for plain text. Kept
    /// so a reward or a dispute can tell a format the policy was asked for from one it was
    /// held to.
    pub output_constraint: Option<OutputConstraint>,
    /// The sampling settings the engine drew `output_ids` with; their log-probs are of that
    /// distribution. [`SamplingSettings::POLICY`] (temperature 1, no truncation) is the policy
    /// itself, the distribution a trainer recomputes; a call sampled otherwise (a harness's own
    /// temperature or top-p under `gyre proxy --sampling harness`) is context for training.
    pub sampling: SamplingSettings,
}

/// How an engine sampled a call's output tokens.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingSettings {
    /// Logits are divided by it; 0 is greedy decoding.
    pub temperature: f32,
    /// Nucleus mass in `(0, 1]`; 1 keeps the whole vocabulary.
    pub top_p: f32,
    /// Only the `k` most likely tokens are kept; `None` keeps all.
    pub top_k: Option<u32>,
}

impl SamplingSettings {
    /// The policy's own distribution: what every record written before the field existed
    /// reads, and what `gyre proxy` samples with unless told to pass a harness's settings on.
    pub const POLICY: SamplingSettings = SamplingSettings {
        temperature: 1.0,
        top_p: 1.0,
        top_k: None,
    };

    /// Whether tokens drawn with these settings have the policy's own log-probs.
    pub fn is_policy(&self) -> bool {
        *self == Self::POLICY
    }

    /// Why these are not settings an engine could have sampled with, if they are not.
    pub fn check(&self) -> Result<(), String> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(format!(
                "sampling temperature {} is not a finite value ≥ 0",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("sampling top_p {} is not in (0, 1]", self.top_p));
        }
        if self.top_k == Some(0) {
            return Err("sampling top_k 0: at least 1, or none".into());
        }
        Ok(())
    }
}

impl Default for SamplingSettings {
    fn default() -> Self {
        Self::POLICY
    }
}

/// An answer format a request asked for: JSON, optionally matching a schema.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputConstraint {
    /// The JSON Schema's text as the request sent it (`json_schema`); `None`: any JSON object
    /// (`json_object`).
    pub schema: Option<String>,
    /// The engine sampled under the constraint (its grammar masked every token), so
    /// `output_logprobs` are those of the constrained policy. False when the engine cannot
    /// constrain (the scripted and deterministic engines), when the request also offered
    /// tools (a constraint on the whole output would forbid calling them), or when a failover
    /// continued a partial answer (an engine starts its grammar at the output's first token).
    pub enforced: bool,
    /// How many leading output tokens were sampled under the engine's grammar: every one when
    /// `enforced`, fewer when a failover continued a partial answer without it. Their
    /// log-probs are of the masked distribution, not of the policy a trainer recomputes, so
    /// the trajectory processor keeps them out of the loss
    /// ([`ModelCallRecord::constrained_output_tokens`]). A record written before the field
    /// existed reads 0 here and stays trainable, as it was when it was folded.
    pub constrained_tokens: u32,
}

/// Bound on [`OutputConstraint::schema`] (the proxy refuses larger schemas).
pub const OUTPUT_SCHEMA_BYTES_MAX: usize = 256 * 1024;

/// Bounds on [`ModelCallRecord::stop_sequences`] (the proxy refuses requests beyond them): far
/// above any real use (OpenAI allows 4).
pub const STOP_SEQUENCES_MAX: usize = 64;
pub const STOP_SEQUENCE_BYTES_MAX: usize = 1024;

impl ModelCallRecord {
    /// How many leading output tokens were sampled under an engine's grammar (their
    /// log-probs are of the masked distribution): 0 for a call without an enforced answer
    /// format.
    pub fn constrained_output_tokens(&self) -> u32 {
        // A record written before `constrained_tokens` existed reads 0 here, as its call was
        // folded then (trainable): a snapshot of that time and a replay of its log agree.
        self.output_constraint
            .as_ref()
            .map_or(0, |constraint| constraint.constrained_tokens)
    }

    /// How many leading output tokens are context for training, never targets: their
    /// behaviour log-probs are not the policy's own — every output of a call sampled with other
    /// settings than [`SamplingSettings::POLICY`], else those sampled under an answer-format
    /// grammar.
    pub fn context_output_tokens(&self) -> u32 {
        if self.sampling.is_policy() {
            self.constrained_output_tokens()
        } else {
            u32::try_from(self.output_ids.len()).unwrap_or(u32::MAX)
        }
    }

    /// Structural checks the log applies before accepting a record.
    pub fn validate(&self) -> Result<(), String> {
        if self.output_ids.len() != self.output_logprobs.len() {
            return Err(format!(
                "call {}: {} output ids but {} log-probs",
                self.call,
                self.output_ids.len(),
                self.output_logprobs.len()
            ));
        }
        let provenance_total: u64 = self
            .input_provenance
            .iter()
            .map(|span| span.tokens_count as u64)
            .sum();
        if provenance_total != self.input_ids.len() as u64 {
            return Err(format!(
                "call {}: provenance spans cover {} tokens but there are {} new input ids",
                self.call,
                provenance_total,
                self.input_ids.len()
            ));
        }
        if self.stop_sequences.len() > STOP_SEQUENCES_MAX {
            return Err(format!(
                "call {}: {} stop sequences (at most {STOP_SEQUENCES_MAX})",
                self.call,
                self.stop_sequences.len()
            ));
        }
        if let Some(bad) = self
            .stop_sequences
            .iter()
            .find(|stop| stop.is_empty() || stop.len() > STOP_SEQUENCE_BYTES_MAX)
        {
            return Err(format!(
                "call {}: a stop sequence of {} bytes (1 to {STOP_SEQUENCE_BYTES_MAX})",
                self.call,
                bad.len()
            ));
        }
        if let Some(OutputConstraint {
            schema: Some(schema),
            ..
        }) = &self.output_constraint
        {
            if schema.is_empty() || schema.len() > OUTPUT_SCHEMA_BYTES_MAX {
                return Err(format!(
                    "call {}: an output schema of {} bytes (1 to {OUTPUT_SCHEMA_BYTES_MAX})",
                    self.call,
                    schema.len()
                ));
            }
        }
        self.sampling
            .check()
            .map_err(|message| format!("call {}: {message}", self.call))?;
        if let Some(constraint) = &self.output_constraint {
            let outputs = self.output_ids.len() as u64;
            let constrained = u64::from(constraint.constrained_tokens);
            if constrained > outputs {
                return Err(format!(
                    "call {}: {constrained} output tokens constrained by the answer format, but \
                     it sampled {outputs}",
                    self.call
                ));
            }
            if constraint.enforced && constrained != 0 && constrained != outputs {
                return Err(format!(
                    "call {}: the answer format was enforced on every output token, but only \
                     {constrained} of {outputs} are counted as constrained",
                    self.call
                ));
            }
        }
        if let Some(bad) = self
            .output_logprobs
            .iter()
            .find(|lp| !(lp.is_finite() && **lp <= 0.0))
        {
            return Err(format!(
                "call {}: log-prob {bad} is not a finite value ≤ 0",
                self.call
            ));
        }
        Ok(())
    }
}

/// A stored OpenAI Responses answer (`previous_response_id`): what this response adds to the
/// conversation of the one it continues. The proxy commits it before the client can name the
/// id, so a restarted proxy still resolves it. An Anthropic Message Thread's turn is kept the
/// same way under its `msg_…` id (see `gyre_proxy::message_threads::ThreadTurn`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredResponseRecord {
    pub execution: ExecutionId,
    /// The id the client was given (`resp_…`).
    pub response_id: String,
    /// The stored response this one continues (`None`: the conversation's first).
    pub previous_response_id: Option<String>,
    /// JSON values separated by commas, without brackets: this response's own input items,
    /// then its output items as the client received them.
    pub items: Vec<u8>,
}
