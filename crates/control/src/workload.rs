//! The benchmark workload shared by `gyre bench log` and `cargo bench -p gyre-control --bench
//! fold`: model-call records shaped like an agent's turns, so a benchmark folds real trees.

use gyre_event::{
    CallId, CallKind, EngineId, Event, EventBody, ExecutionId, ModelCallRecord, PolicyVersion,
    Provenance, ProvenanceSpan, Timestamp,
};

/// Calls per execution before a writer starts a new one (a long execution has ~600).
pub const CALLS_PER_EXECUTION: u64 = 512;
pub const SMALL_INPUT_TOKENS: usize = 16;
pub const SMALL_OUTPUT_TOKENS: usize = 12;

/// A `ModelCall` record of execution `execution`, call `call`, extending `parent_call`'s context
/// after `reused` tokens with `input` new input tokens and `output` sampled ones.
pub fn record(
    execution: u64,
    call: u64,
    parent_call: Option<u64>,
    reused: u64,
    input: usize,
    output: usize,
) -> Event {
    Event::new(
        Timestamp::ZERO,
        EventBody::ModelCall(Box::new(ModelCallRecord {
            execution: ExecutionId(execution),
            call: CallId(call),
            agent: "main".to_string(),
            kind: CallKind::Turn,
            parent_call: parent_call.map(CallId),
            reused_prefix_tokens_count: reused,
            spawned_by: None,
            input_ids: (0..input as u32).map(|i| 1000 + i).collect(),
            input_provenance: vec![ProvenanceSpan {
                provenance: Provenance::ToolResult,
                tokens_count: input as u32,
            }],
            output_ids: (0..output as u32).map(|i| 2000 + i).collect(),
            output_logprobs: (0..output).map(|i| -0.25 - i as f32 * 0.01).collect(),
            engine: EngineId(0),
            policy_version: PolicyVersion(0),
            requested_at: Timestamp::ZERO,
            first_token_after: gyre_event::Duration(0),
            completed_after: gyre_event::Duration(0),
            stop_sequences: Vec::new(),
            output_constraint: None,
            sampling: gyre_event::SamplingSettings::POLICY,
        })),
    )
}

/// A small control event (~256 B encoded): writer `writer`'s `sequence`-th TITO record, one
/// agent turn extending the previous turn of the same execution (16 new input tokens, 12
/// sampled tokens with log-probs), so the projection folds it into a real tree.
pub fn small_event(writer: u64, sequence: u64) -> Event {
    let call = sequence % CALLS_PER_EXECUTION;
    let execution = (writer << 32) | (sequence / CALLS_PER_EXECUTION);
    let per_call = (SMALL_INPUT_TOKENS + SMALL_OUTPUT_TOKENS) as u64;
    record(
        execution,
        call,
        call.checked_sub(1),
        call * per_call,
        SMALL_INPUT_TOKENS,
        SMALL_OUTPUT_TOKENS,
    )
}

/// A token record of about `bytes` encoded bytes: a new root (a fresh context) of writer
/// `writer`'s execution, call `call`.
pub fn token_event(bytes: usize, writer: u64, call: u64) -> Event {
    // Varint ids of ~2 bytes and 4-byte log-probs: input 2 B/token, output 6 B/token.
    let output = bytes / 16;
    let input = (bytes - output * 6) / 2;
    record(1 << 40 | writer, call, None, 0, input, output)
}
