//! The trajectory tree of one execution, built by applying model-call records.
//!
//! A node is one model call: the input tokens that are new relative to the path it extends,
//! their provenance, the engine-sampled output tokens and their behaviour log-probs, and the
//! call's metadata. A node hangs from its prefix parent at an arbitrary position of the parent's
//! own tokens (`start` is the absolute path position of the node's first token), so a branch
//! inside a call (a compaction that keeps only the system prompt, a retry of the same context)
//! never splits an existing node. A node whose context matched nothing is a root; the main agent
//! and each sub-agent (different system prompts) get their own roots.
//!
//! Two facts follow from this representation and keep admission cheap: every root-to-leaf path
//! covers a *prefix* of each node's own tokens, and so the admission mask of a node is a single
//! integer (see `admission.rs`). Causal parentage (`spawned_by`) is stored next to, and never
//! mixed with, prefix parentage.

use std::collections::BTreeMap;

use smallvec::SmallVec;

use gyre_event::{
    CallId, CallKind, EngineId, ExecutionId, ModelCallRecord, PolicyVersion, ProvenanceSpan,
};

use crate::TrajectoryError;

/// Index of a node in its tree's arena; parents always have smaller indices than children.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeId(pub u32);

impl NodeId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Limits of one execution's tree (STYLE rule 9: a limit on everything).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TreeConfig {
    /// Most calls (nodes) one execution may record.
    pub nodes_max: u32,
    /// Longest root-to-leaf path, in tokens.
    pub path_tokens_max: u64,
    /// A context that shares fewer tokens than this with every existing path starts a new root.
    /// With real chat templates every context begins with the same few template tokens; a value
    /// a little above the template header keeps the main agent and each sub-agent on their own
    /// roots. The default of 1 is the pure token rule.
    pub root_shared_tokens_min: u64,
}

impl Default for TreeConfig {
    fn default() -> Self {
        Self {
            nodes_max: 1 << 20,
            path_tokens_max: 1 << 26,
            root_shared_tokens_min: 1,
        }
    }
}

/// One recorded model call in the tree.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub call: CallId,
    pub agent: String,
    pub kind: CallKind,
    pub engine: EngineId,
    pub policy_version: PolicyVersion,
    /// Causal parent: the call that spawned this call's agent. Not prefix sharing.
    pub spawned_by: Option<CallId>,
    /// Prefix parent; `None` for a root.
    pub parent: Option<NodeId>,
    /// Absolute path position of this node's first token: the number of reused tokens.
    pub start: u64,
    /// Input tokens new relative to the reused prefix (context only, never targets).
    pub input_ids: Vec<u32>,
    pub input_provenance: Vec<ProvenanceSpan>,
    /// Engine-sampled tokens: the only trainable tokens.
    pub output_ids: Vec<u32>,
    pub output_logprobs: Vec<f32>,
    /// How many leading output tokens are context, never targets (see `trainable_from`):
    /// their behaviour log-probs are not of the policy a trainer recomputes — those an engine
    /// sampled under an answer-format grammar (structured outputs: a masked distribution), or
    /// all of them when the call was sampled with other settings than the policy's own
    /// ([`ModelCallRecord::context_output_tokens`]).
    pub context_outputs: u32,
    /// The record's stop sequences (empty for most calls): a proxy that rebuilds its session
    /// from the tree cuts a stopped output where the harness saw it end.
    pub stop_sequences: Vec<String>,
    /// Children in insertion order. Most nodes have one (a turn extending its context), so
    /// the list is inline up to two: no allocation per node on the fold's hot path.
    pub children: SmallVec<[NodeId; 2]>,
    /// How many children attach at this node's end (a node with none is a leaf).
    pub children_at_end: u32,
    /// Nodes on the root-to-node path, this one included.
    pub depth: u32,
}

impl Node {
    /// Tokens this node adds to its path: new input then output.
    pub fn segment_len(&self) -> u64 {
        (self.input_ids.len() + self.output_ids.len()) as u64
    }

    /// Absolute path position one past this node's last token (its full path length).
    pub fn end(&self) -> u64 {
        self.start + self.segment_len()
    }

    /// The token at `offset` within this node's own segment.
    pub fn token(&self, offset: u64) -> u32 {
        let offset = offset as usize;
        if offset < self.input_ids.len() {
            self.input_ids[offset]
        } else {
            self.output_ids[offset - self.input_ids.len()]
        }
    }

    pub fn is_leaf(&self) -> bool {
        self.children_at_end == 0
    }

    pub fn input_len(&self) -> u64 {
        self.input_ids.len() as u64
    }

    /// The first offset of this node's segment that may be a target: past the new input and
    /// past the outputs whose log-probs are not the policy's. Every later output token is
    /// trainable.
    pub fn trainable_from(&self) -> u64 {
        self.input_len() + u64::from(self.context_outputs)
    }
}

/// What a node holds apart from what is derived from the other nodes (children, the
/// children-at-end count, depth): the record's fields with the prefix parent normalised.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct NodeParts {
    pub call: CallId,
    pub agent: String,
    pub kind: CallKind,
    pub engine: EngineId,
    pub policy_version: PolicyVersion,
    pub spawned_by: Option<CallId>,
    pub parent: Option<NodeId>,
    pub start: u64,
    pub input_ids: Vec<u32>,
    pub input_provenance: Vec<ProvenanceSpan>,
    pub output_ids: Vec<u32>,
    pub output_logprobs: Vec<f32>,
    pub context_outputs: u32,
    pub stop_sequences: Vec<String>,
}

/// One node's share of a root-to-leaf path: the first `cut` tokens of its segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathPiece {
    pub node: NodeId,
    pub cut: u64,
}

/// Call id → node. The proxy numbers an execution's calls 0, 1, 2, … as they arrive, so they
/// mostly commit in that order: those sit in a vector indexed by call id (the fold's hot path:
/// no search, no allocation per call), any other in a map, moved to the vector once the calls
/// before it have arrived.
#[derive(Clone, Debug, Default, PartialEq)]
struct CallIndex {
    /// `dense[c]` is the node of call `c`, for every call below `dense.len()`.
    dense: Vec<NodeId>,
    /// Calls above `dense.len()`.
    sparse: BTreeMap<CallId, NodeId>,
}

impl CallIndex {
    fn get(&self, call: CallId) -> Option<NodeId> {
        usize::try_from(call.get())
            .ok()
            .and_then(|at| self.dense.get(at))
            .copied()
            .or_else(|| self.sparse.get(&call).copied())
    }

    /// Records a call the caller has checked is absent.
    fn insert(&mut self, call: CallId, id: NodeId) {
        if call.get() != self.dense.len() as u64 {
            self.sparse.insert(call, id);
            return;
        }
        self.dense.push(id);
        while !self.sparse.is_empty() {
            match self.sparse.remove(&CallId(self.dense.len() as u64)) {
                Some(next) => self.dense.push(next),
                None => break,
            }
        }
    }

    fn len(&self) -> usize {
        self.dense.len() + self.sparse.len()
    }
}

/// The trajectory tree of one execution.
#[derive(Clone, Debug, PartialEq)]
pub struct Tree {
    execution: ExecutionId,
    config: TreeConfig,
    nodes: Vec<Node>,
    by_call: CallIndex,
    /// Canonical children by (parent, offset in the parent's segment, first token); roots under
    /// `None` at offset 0. A child is canonical when its first token differs from the parent's
    /// own token at that offset, which the matcher guarantees for everything it attaches.
    /// Almost every key has one child, kept inline.
    pub(crate) child_index: BTreeMap<(Option<NodeId>, u64, u32), SmallVec<[NodeId; 1]>>,
    /// Children whose first token equals the parent's own token at the attach offset (a retry
    /// that sampled the same first tokens, or records attached by another matcher). The matcher
    /// explores them explicitly; they are rare.
    pub(crate) shadow_children: BTreeMap<NodeId, Vec<NodeId>>,
    /// Nodes without a child at their end, kept as nodes attach (the state digest reads it
    /// every few hundred entries; counting would walk every node of every tree).
    leaf_count: u64,
    /// Sum of the nodes' segment lengths, kept likewise.
    tokens_count: u64,
}

impl Tree {
    pub fn new(execution: ExecutionId, config: TreeConfig) -> Self {
        Self {
            execution,
            config,
            nodes: Vec::new(),
            by_call: CallIndex::default(),
            child_index: BTreeMap::new(),
            shadow_children: BTreeMap::new(),
            leaf_count: 0,
            tokens_count: 0,
        }
    }

    pub fn execution(&self) -> ExecutionId {
        self.execution
    }

    pub fn config(&self) -> &TreeConfig {
        &self.config
    }

    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.index()]
    }

    pub fn node_of_call(&self, call: CallId) -> Option<NodeId> {
        // A turn's parent is most often the node attached just before it.
        match self.nodes.last() {
            Some(last) if last.call == call => Some(NodeId(self.nodes.len() as u32 - 1)),
            _ => self.by_call.get(call),
        }
    }

    fn has_call(&self, call: CallId) -> bool {
        self.by_call.get(call).is_some()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn roots(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.node_ids().filter(|id| self.node(*id).parent.is_none())
    }

    /// How many nodes [`Tree::leaves`] yields, without walking them.
    pub fn leaf_count(&self) -> u64 {
        self.leaf_count
    }

    /// Tokens over all nodes' own segments (each token once, however many paths share it).
    pub fn tokens_count(&self) -> u64 {
        self.tokens_count
    }

    pub fn leaves(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.node_ids().filter(|id| self.node(*id).is_leaf())
    }

    pub fn node_ids(&self) -> impl Iterator<Item = NodeId> {
        (0..self.nodes.len() as u32).map(NodeId)
    }

    /// Applies one model-call record. The record's `parent_call` / `reused_prefix_tokens_count`
    /// pair is normalised: if the reused prefix ends before the parent's own tokens, the node
    /// attaches to the ancestor that owns the last reused token.
    pub fn apply(&mut self, record: &ModelCallRecord) -> Result<NodeId, TrajectoryError> {
        let parent = self.check(record)?;
        Ok(self.attach(NodeParts {
            call: record.call,
            agent: record.agent.clone(),
            kind: record.kind,
            engine: record.engine,
            policy_version: record.policy_version,
            spawned_by: record.spawned_by,
            parent,
            start: record.reused_prefix_tokens_count,
            input_ids: record.input_ids.clone(),
            input_provenance: record.input_provenance.clone(),
            output_ids: record.output_ids.clone(),
            output_logprobs: record.output_logprobs.clone(),
            context_outputs: record.context_output_tokens(),
            stop_sequences: record.stop_sequences.clone(),
        }))
    }

    /// [`Tree::apply`] taking the record by value: its token vectors move into the node (the
    /// replay and state-machine path, which own their decoded events).
    pub fn apply_owned(&mut self, record: ModelCallRecord) -> Result<NodeId, TrajectoryError> {
        let parent = self.check(&record)?;
        let context_outputs = record.context_output_tokens();
        Ok(self.attach(NodeParts {
            call: record.call,
            agent: record.agent,
            kind: record.kind,
            engine: record.engine,
            policy_version: record.policy_version,
            spawned_by: record.spawned_by,
            parent,
            start: record.reused_prefix_tokens_count,
            input_ids: record.input_ids,
            input_provenance: record.input_provenance,
            output_ids: record.output_ids,
            output_logprobs: record.output_logprobs,
            context_outputs,
            stop_sequences: record.stop_sequences,
        }))
    }

    /// Whether [`Tree::apply`] would accept `record`, without applying it (a proxy checks a
    /// record before committing it and applies it once the log holds it).
    pub fn check_record(&self, record: &ModelCallRecord) -> Result<(), TrajectoryError> {
        self.check(record).map(|_| ())
    }

    /// Every check `apply` makes; returns the prefix parent the record's node hangs from.
    fn check(&self, record: &ModelCallRecord) -> Result<Option<NodeId>, TrajectoryError> {
        let call = record.call;
        if record.execution != self.execution {
            return Err(TrajectoryError::WrongExecution {
                expected: self.execution,
                found: record.execution,
                call,
            });
        }
        record
            .validate()
            .map_err(|message| TrajectoryError::InvalidRecord { call, message })?;
        if record.output_ids.is_empty() {
            return Err(TrajectoryError::InvalidRecord {
                call,
                message: "no output tokens: a call that sampled nothing is not a node".into(),
            });
        }
        if self.has_call(call) {
            return Err(TrajectoryError::DuplicateCall {
                execution: self.execution,
                call,
            });
        }
        if self.nodes.len() as u64 >= self.config.nodes_max as u64 {
            return Err(TrajectoryError::LimitExceeded {
                what: "calls per execution",
                limit: self.config.nodes_max as u64,
            });
        }
        let reused = record.reused_prefix_tokens_count;
        let mut parent = match record.parent_call {
            None if reused > 0 => {
                return Err(TrajectoryError::InvalidRecord {
                    call,
                    message: format!("reuses {reused} tokens but names no parent call"),
                })
            }
            None => None,
            Some(parent_call) => {
                let id = self
                    .node_of_call(parent_call)
                    .ok_or(TrajectoryError::UnknownParent {
                        call,
                        parent: parent_call,
                    })?;
                let parent_path_tokens = self.node(id).end();
                if reused > parent_path_tokens {
                    return Err(TrajectoryError::ReusedPrefixTooLong {
                        call,
                        reused,
                        parent_path_tokens,
                    });
                }
                Some(id)
            }
        };
        // Normalise: the owner of the last reused token is the prefix parent.
        while let Some(id) = parent {
            if reused > self.node(id).start {
                break;
            }
            parent = self.node(id).parent;
        }
        let segment_len = (record.input_ids.len() + record.output_ids.len()) as u64;
        if reused + segment_len > self.config.path_tokens_max {
            return Err(TrajectoryError::LimitExceeded {
                what: "path tokens",
                limit: self.config.path_tokens_max,
            });
        }
        Ok(parent)
    }

    /// Appends a checked node and maintains everything derived from it: the parent's children
    /// and children-at-end count, the depth, the call index and the child indexes. Shared by
    /// `apply` and snapshot restore, so a restored tree is the tree the records built.
    fn attach(&mut self, parts: NodeParts) -> NodeId {
        let id = NodeId(self.nodes.len() as u32);
        let first_token = parts
            .input_ids
            .first()
            .copied()
            .unwrap_or(parts.output_ids[0]);
        let depth = match parts.parent {
            None => {
                self.child_index
                    .entry((None, 0, first_token))
                    .or_default()
                    .push(id);
                1
            }
            Some(parent_id) => {
                let parent_node = &mut self.nodes[parent_id.index()];
                let offset = parts.start - parent_node.start;
                parent_node.children.push(id);
                if offset == parent_node.segment_len() {
                    if parent_node.children_at_end == 0 {
                        self.leaf_count -= 1;
                    }
                    parent_node.children_at_end += 1;
                }
                let shadows =
                    offset < parent_node.segment_len() && parent_node.token(offset) == first_token;
                let depth = parent_node.depth + 1;
                if shadows {
                    self.shadow_children.entry(parent_id).or_default().push(id);
                } else {
                    self.child_index
                        .entry((Some(parent_id), offset, first_token))
                        .or_default()
                        .push(id);
                }
                depth
            }
        };
        self.by_call.insert(parts.call, id);
        self.leaf_count += 1;
        self.tokens_count += (parts.input_ids.len() + parts.output_ids.len()) as u64;
        self.nodes.push(Node {
            call: parts.call,
            agent: parts.agent,
            kind: parts.kind,
            engine: parts.engine,
            policy_version: parts.policy_version,
            spawned_by: parts.spawned_by,
            parent: parts.parent,
            start: parts.start,
            input_ids: parts.input_ids,
            input_provenance: parts.input_provenance,
            output_ids: parts.output_ids,
            output_logprobs: parts.output_logprobs,
            context_outputs: parts.context_outputs,
            stop_sequences: parts.stop_sequences,
            children: SmallVec::new(),
            children_at_end: 0,
            depth,
        });
        id
    }

    /// Sets a restored node's stop sequences (a snapshot keeps them apart from the nodes, in
    /// a section of its own, so that older formats' node layout is unchanged).
    pub(crate) fn restore_stop_sequences(
        &mut self,
        call: CallId,
        stops: Vec<String>,
    ) -> Result<NodeId, String> {
        let id = self
            .node_of_call(call)
            .ok_or_else(|| format!("call {call} is not in the tree"))?;
        let node = &mut self.nodes[id.index()];
        if !node.stop_sequences.is_empty() {
            return Err(format!("call {call}'s stop sequences appear twice"));
        }
        if stops.is_empty() || stops.len() > gyre_event::STOP_SEQUENCES_MAX {
            return Err(format!(
                "call {call} is listed with {} stop sequences (1 to {})",
                stops.len(),
                gyre_event::STOP_SEQUENCES_MAX
            ));
        }
        if let Some(bad) = stops
            .iter()
            .find(|stop| stop.is_empty() || stop.len() > gyre_event::STOP_SEQUENCE_BYTES_MAX)
        {
            return Err(format!(
                "call {call} has a stop sequence of {} bytes (1 to {})",
                bad.len(),
                gyre_event::STOP_SEQUENCE_BYTES_MAX
            ));
        }
        node.stop_sequences = stops;
        Ok(id)
    }

    /// Sets a restored node's count of context-only outputs (a snapshot keeps them in a
    /// section of their own, like the stop sequences).
    pub(crate) fn restore_context_outputs(
        &mut self,
        call: CallId,
        count: u32,
    ) -> Result<NodeId, String> {
        let id = self
            .node_of_call(call)
            .ok_or_else(|| format!("call {call} is not in the tree"))?;
        let node = &mut self.nodes[id.index()];
        if node.context_outputs != 0 {
            return Err(format!("call {call}'s context outputs appear twice"));
        }
        if count == 0 || u64::from(count) > node.output_ids.len() as u64 {
            return Err(format!(
                "call {call} is listed with {count} context outputs (1 to its {})",
                node.output_ids.len()
            ));
        }
        node.context_outputs = count;
        Ok(id)
    }

    /// Appends a node read from a snapshot after checking, without panicking, every structural
    /// fact `attach` and `validate` rely on. Limits (`nodes_max`, `path_tokens_max`) are not
    /// re-checked: they guarded the records when they were applied.
    pub(crate) fn restore_node(&mut self, parts: NodeParts) -> Result<NodeId, String> {
        if self.has_call(parts.call) {
            return Err(format!("call {} appears twice", parts.call));
        }
        if parts.output_ids.is_empty() {
            return Err(format!("call {} has no output tokens", parts.call));
        }
        if parts.output_ids.len() != parts.output_logprobs.len() {
            return Err(format!(
                "call {} has {} outputs but {} log-probs",
                parts.call,
                parts.output_ids.len(),
                parts.output_logprobs.len()
            ));
        }
        let provenance: u64 = parts
            .input_provenance
            .iter()
            .map(|span| span.tokens_count as u64)
            .sum();
        if provenance != parts.input_ids.len() as u64 {
            return Err(format!(
                "call {}: provenance covers {provenance} tokens of {} new inputs",
                parts.call,
                parts.input_ids.len()
            ));
        }
        match parts.parent {
            None if parts.start != 0 => {
                return Err(format!(
                    "root call {} starts at {}, not 0",
                    parts.call, parts.start
                ))
            }
            None => {}
            Some(parent) => {
                let Some(parent_node) = self.nodes.get(parent.index()) else {
                    return Err(format!(
                        "call {} hangs from node {} that does not precede it",
                        parts.call, parent.0
                    ));
                };
                if !(parent_node.start < parts.start && parts.start <= parent_node.end()) {
                    return Err(format!(
                        "call {} starts at {}, outside its parent's tokens {}..={}",
                        parts.call,
                        parts.start,
                        parent_node.start + 1,
                        parent_node.end()
                    ));
                }
            }
        }
        Ok(self.attach(parts))
    }

    /// The root-to-node path as pieces (root first): every ancestor contributes the prefix of
    /// its segment up to where the next node attaches; the node itself contributes everything.
    pub fn path(&self, id: NodeId) -> Vec<PathPiece> {
        let mut pieces = Vec::with_capacity(self.node(id).depth as usize);
        let mut cut = self.node(id).segment_len();
        let mut current = Some(id);
        while let Some(node_id) = current {
            let node = self.node(node_id);
            pieces.push(PathPiece { node: node_id, cut });
            if let Some(parent) = node.parent {
                cut = node.start - self.node(parent).start;
            }
            current = node.parent;
        }
        pieces.reverse();
        pieces
    }

    /// The full token sequence of the root-to-node path (what the engine saw plus the output).
    pub fn path_tokens(&self, id: NodeId) -> Vec<u32> {
        let mut tokens = Vec::with_capacity(self.node(id).end() as usize);
        for piece in self.path(id) {
            let node = self.node(piece.node);
            let cut = piece.cut as usize;
            let input_cut = cut.min(node.input_ids.len());
            tokens.extend_from_slice(&node.input_ids[..input_cut]);
            if cut > node.input_ids.len() {
                tokens.extend_from_slice(&node.output_ids[..cut - node.input_ids.len()]);
            }
        }
        tokens
    }

    /// Records that rebuild this tree when applied to an empty one, in the order the nodes
    /// were applied (a proxy that restarts after the log was purged rebuilds an execution's
    /// session from the projection's tree). The tree keeps no times (they read 0), no
    /// answer-format schemas and no sampling settings, only how many outputs are context: a
    /// call with some gives them back as an output constraint of that many tokens (`schema`
    /// `None`; the log's records keep what the call really asked for). Everything else is the
    /// record's.
    pub fn records(&self) -> Vec<ModelCallRecord> {
        self.nodes
            .iter()
            .map(|node| ModelCallRecord {
                execution: self.execution,
                call: node.call,
                agent: node.agent.clone(),
                kind: node.kind,
                parent_call: node.parent.map(|parent| self.node(parent).call),
                reused_prefix_tokens_count: node.start,
                spawned_by: node.spawned_by,
                input_ids: node.input_ids.clone(),
                input_provenance: node.input_provenance.clone(),
                output_ids: node.output_ids.clone(),
                output_logprobs: node.output_logprobs.clone(),
                engine: node.engine,
                policy_version: node.policy_version,
                requested_at: gyre_event::Timestamp::ZERO,
                first_token_after: gyre_event::Duration(0),
                completed_after: gyre_event::Duration(0),
                stop_sequences: node.stop_sequences.clone(),
                output_constraint: (node.context_outputs > 0).then(|| {
                    gyre_event::OutputConstraint {
                        schema: None,
                        enforced: u64::from(node.context_outputs) == node.output_ids.len() as u64,
                        constrained_tokens: node.context_outputs,
                    }
                }),
                sampling: gyre_event::SamplingSettings::POLICY,
            })
            .collect()
    }

    /// The context the engine saw for `id`'s call: its path without its own output.
    pub fn context_tokens(&self, id: NodeId) -> Vec<u32> {
        let mut tokens = self.path_tokens(id);
        tokens.truncate((self.node(id).start + self.node(id).input_len()) as usize);
        tokens
    }

    /// Checks every structural invariant; tests call it after each `apply` (STYLE rule 8).
    pub fn validate(&self) {
        assert_eq!(
            self.by_call.len(),
            self.nodes.len(),
            "one index entry per node"
        );
        assert_eq!(
            self.leaf_count,
            self.nodes.iter().filter(|node| node.is_leaf()).count() as u64,
            "kept leaf count"
        );
        assert_eq!(
            self.tokens_count,
            self.nodes.iter().map(Node::segment_len).sum::<u64>(),
            "kept token count"
        );
        for (index, node) in self.nodes.iter().enumerate() {
            let id = NodeId(index as u32);
            assert_eq!(
                self.by_call.get(node.call),
                Some(id),
                "call index points at node"
            );
            assert_eq!(
                node.output_ids.len(),
                node.output_logprobs.len(),
                "log-prob per output"
            );
            assert!(!node.output_ids.is_empty(), "every node sampled something");
            assert!(
                node.context_outputs as usize <= node.output_ids.len(),
                "constrained outputs are a prefix of the outputs"
            );
            let provenance: u64 = node
                .input_provenance
                .iter()
                .map(|s| s.tokens_count as u64)
                .sum();
            assert_eq!(
                provenance,
                node.input_len(),
                "provenance covers the new input"
            );
            let at_end = node
                .children
                .iter()
                .filter(|child| self.node(**child).start == node.end())
                .count();
            assert_eq!(at_end as u32, node.children_at_end, "children-at-end count");
            match node.parent {
                None => {
                    assert_eq!(node.start, 0, "a root starts at position 0");
                    assert_eq!(node.depth, 1, "a root has depth 1");
                }
                Some(parent) => {
                    assert!(parent < id, "parents precede children");
                    let parent_node = self.node(parent);
                    assert!(
                        parent_node.start < node.start && node.start <= parent_node.end(),
                        "a child attaches inside its parent's own tokens"
                    );
                    assert!(parent_node.children.contains(&id), "parent lists the child");
                    assert_eq!(
                        node.depth,
                        parent_node.depth + 1,
                        "depth is parent's plus one"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod call_index_tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::{CallIndex, NodeId};
    use gyre_event::CallId;

    proptest! {
        /// The index answers like a plain map whatever order calls arrive in (in order, shuffled,
        /// with gaps, huge ids).
        #[test]
        fn the_call_index_is_a_map(
            calls in proptest::collection::vec(
                prop_oneof![4 => 0u64..40, 1 => any::<u64>()], 0..60),
        ) {
            let mut index = CallIndex::default();
            let mut model = BTreeMap::new();
            for (position, call) in calls.into_iter().enumerate() {
                let call = CallId(call);
                if model.contains_key(&call) {
                    prop_assert!(index.get(call).is_some());
                    continue;
                }
                prop_assert_eq!(index.get(call), None);
                let id = NodeId(position as u32);
                index.insert(call, id);
                model.insert(call, id);
                prop_assert_eq!(index.len(), model.len());
                for (call, id) in &model {
                    prop_assert_eq!(index.get(*call), Some(*id));
                }
            }
            prop_assert!(index.sparse.keys().all(|call| call.get() > index.dense.len() as u64));
        }
    }
}
