//! The prefix matcher: where does a new call's context attach to an execution's tree?
//!
//! The tree is a radix tree whose edges are call segments, so matching is a descent. At a node
//! the matcher compares the context with the node's own tokens until they differ (position
//! `m`), then follows the canonical child indexed by `(node, m, context[m])`, plus any rare
//! shadow children attached before `m` (see `Tree::shadow_children`). It returns the longest
//! match: the prefix parent and the number of reused tokens, exactly the pair a
//! `ModelCallRecord` stores.
//!
//! Cost, honestly: tree work is O(depth · log fan-out) index look-ups plus one token comparison
//! per reused token. The comparison runs over contiguous slices in blocks of 64 tokens (the
//! compiler turns each block into a vectorised `memcmp`), so for a full-context caller it costs
//! a few tens of microseconds per 100k reused tokens; no hashing, tokenising or copying of the
//! reused prefix happens. A caller that already knows where its context attaches (the proxy,
//! whose message-level cache tells it which messages are unchanged) uses [`match_extension`]:
//! it checks the anchor and stores only the suffix, so its cost is O(new tokens) and flat in
//! the context length. Both are measured by `gyre trajectory bench`.

use gyre_event::{
    CallId, CallKind, Duration, EngineId, ModelCallRecord, PolicyVersion, Provenance,
    ProvenanceSpan, Timestamp,
};

use crate::{NodeId, Tree};

/// Where a context attaches: the record's `parent_call` and `reused_prefix_tokens_count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefixMatch {
    pub parent: Option<NodeId>,
    pub parent_call: Option<CallId>,
    /// Tokens of the context already held by the parent's path.
    pub reused_tokens_count: u64,
}

impl PrefixMatch {
    pub const ROOT: PrefixMatch = PrefixMatch {
        parent: None,
        parent_call: None,
        reused_tokens_count: 0,
    };
}

const BLOCK_TOKENS: usize = 64;

/// Length of the common prefix of two slices, compared block by block.
fn common_prefix(left: &[u32], right: &[u32]) -> usize {
    let length = left.len().min(right.len());
    let mut at = 0;
    while at + BLOCK_TOKENS <= length && left[at..at + BLOCK_TOKENS] == right[at..at + BLOCK_TOKENS]
    {
        at += BLOCK_TOKENS;
    }
    while at < length && left[at] == right[at] {
        at += 1;
    }
    at
}

/// Matched length of `context` against `node`'s own segment, starting at the node's start.
fn match_segment(tree: &Tree, node: NodeId, context: &[u32]) -> u64 {
    let node = tree.node(node);
    let start = node.start as usize;
    if start >= context.len() {
        return 0;
    }
    let rest = &context[start..];
    let in_input = common_prefix(&node.input_ids, rest);
    if in_input < node.input_ids.len() {
        return in_input as u64;
    }
    (in_input + common_prefix(&node.output_ids, &rest[in_input..])) as u64
}

/// Finds the longest existing path that `context` extends.
pub fn match_context(tree: &Tree, context: &[u32]) -> PrefixMatch {
    let Some(first) = context.first() else {
        return PrefixMatch::ROOT;
    };
    let mut best = PrefixMatch::ROOT;
    let mut stack: Vec<NodeId> = Vec::new();
    if let Some(roots) = tree.child_index.get(&(None, 0, *first)) {
        stack.extend(roots.iter().rev());
    }
    while let Some(id) = stack.pop() {
        let node = tree.node(id);
        let matched = match_segment(tree, id, context);
        if matched == 0 {
            continue;
        }
        let matched_end = node.start + matched;
        if matched_end > best.reused_tokens_count {
            best = PrefixMatch {
                parent: Some(id),
                parent_call: Some(node.call),
                reused_tokens_count: matched_end,
            };
        }
        let mut next: Vec<NodeId> = Vec::new();
        if let Some(token) = context.get(matched_end as usize) {
            if let Some(children) = tree.child_index.get(&(Some(id), matched, *token)) {
                next.extend(children.iter());
            }
        }
        if let Some(shadows) = tree.shadow_children.get(&id) {
            next.extend(
                shadows
                    .iter()
                    .filter(|child| tree.node(**child).start < matched_end),
            );
        }
        stack.extend(next.iter().rev());
    }
    if best.reused_tokens_count < tree.config().root_shared_tokens_min {
        return PrefixMatch::ROOT;
    }
    best
}

/// Why an anchored extension was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExtensionError {
    UnknownAnchor,
    /// The anchor's path is shorter than the claimed reused prefix.
    BeyondAnchor,
}

/// The incremental path: the caller claims its context is `anchor`'s path up to
/// `reused_tokens_count` followed by new tokens. Only the claim's shape is checked (the anchor
/// exists and is long enough); the caller vouches for the reused tokens, which it took from the
/// tree in the first place. O(1) here, O(new tokens) to store the record.
pub fn match_extension(
    tree: &Tree,
    anchor: CallId,
    reused_tokens_count: u64,
) -> Result<PrefixMatch, ExtensionError> {
    let id = tree
        .node_of_call(anchor)
        .ok_or(ExtensionError::UnknownAnchor)?;
    if reused_tokens_count > tree.node(id).end() {
        return Err(ExtensionError::BeyondAnchor);
    }
    Ok(PrefixMatch {
        parent: Some(id),
        parent_call: Some(anchor),
        reused_tokens_count,
    })
}

/// A model call given with its full context, as the CLI and offline tools see it.
#[derive(Clone, Copy, Debug)]
pub struct ContextCall<'a> {
    pub call: CallId,
    pub agent: &'a str,
    pub kind: CallKind,
    pub spawned_by: Option<CallId>,
    /// The full context as the engine saw it.
    pub context: &'a [u32],
    /// Provenance recorded for the new (unmatched) context tokens. The full-context form does not
    /// say where each token came from; input tokens are never targets either way.
    pub context_provenance: Provenance,
    pub output_ids: &'a [u32],
    pub output_logprobs: &'a [f32],
    pub engine: EngineId,
    pub policy_version: PolicyVersion,
}

/// Matches `call`'s context against `tree` and returns the incremental record to apply.
pub fn record_from_context(tree: &Tree, call: &ContextCall<'_>) -> ModelCallRecord {
    let found = match_context(tree, call.context);
    let new_input = &call.context[found.reused_tokens_count as usize..];
    let input_provenance = if new_input.is_empty() {
        Vec::new()
    } else {
        vec![ProvenanceSpan {
            provenance: call.context_provenance,
            tokens_count: new_input.len() as u32,
        }]
    };
    ModelCallRecord {
        execution: tree.execution(),
        call: call.call,
        agent: call.agent.to_string(),
        kind: call.kind,
        parent_call: found.parent_call,
        reused_prefix_tokens_count: found.reused_tokens_count,
        spawned_by: call.spawned_by,
        input_ids: new_input.to_vec(),
        input_provenance,
        output_ids: call.output_ids.to_vec(),
        output_logprobs: call.output_logprobs.to_vec(),
        engine: call.engine,
        policy_version: call.policy_version,
        requested_at: Timestamp::ZERO,
        first_token_after: Duration::ZERO,
        completed_after: Duration::ZERO,
        stop_sequences: Vec::new(),
        output_constraint: None,
        sampling: gyre_event::SamplingSettings::POLICY,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_prefix_crosses_blocks() {
        let left: Vec<u32> = (0..300).collect();
        let mut right = left.clone();
        right[200] = 9999;
        assert_eq!(common_prefix(&left, &right), 200);
        assert_eq!(common_prefix(&left, &left[..130]), 130);
        assert_eq!(common_prefix(&[], &left), 0);
    }
}
