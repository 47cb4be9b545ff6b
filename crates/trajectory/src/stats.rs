//! Statistics of one execution's tree in the paper's Appendix C terms.
//!
//! Appendix C counts *message* nodes (636 requests, 1,347 unique message nodes, 10 candidate
//! trajectories, shared prefixes of 168 and 193 nodes, 1,716 node occurrences if unrolled, 369
//! of them repeats). Gyre's node is a call; the closest analogue of a message node is a
//! non-empty *segment*: a call's new input (the tool result or user turn it adds) and its output
//! (the assistant turn). Both counts are reported, together with the token counts that actually
//! drive training cost.

use crate::{NodeId, RoleClasses, Tree};

/// The common prefix of every path under one root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedPrefix {
    pub root: NodeId,
    /// Nodes the shared prefix touches.
    pub nodes: u32,
    /// Segments (message-node analogue) the shared prefix touches.
    pub segments: u32,
    pub tokens: u64,
}

/// Appendix C statistics of one execution.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeStatistics {
    /// Model calls recorded (requests).
    pub requests: u64,
    /// Unique nodes (one per call).
    pub nodes: u64,
    /// Unique non-empty segments: the message-node analogue.
    pub segments: u64,
    pub roots: u64,
    pub leaves: u64,
    /// Candidate leaves per class, in priority order.
    pub candidates_per_class: Vec<(String, u64)>,
    pub unclassified_leaves: u64,
    pub shared_prefixes: Vec<SharedPrefix>,
    /// Σ over leaves of the nodes on the root-to-leaf path.
    pub node_occurrences_unrolled: u64,
    /// Node occurrences in the shared tree: every node once.
    pub node_occurrences_tree: u64,
    pub segment_occurrences_unrolled: u64,
    /// Tokens stored in the tree (lifecycle tokens).
    pub tokens_tree: u64,
    /// Σ over leaves of the root-to-leaf path length.
    pub tokens_unrolled: u64,
    /// Engine-sampled (trainable) tokens in the tree.
    pub trainable_tokens: u64,
    /// Longest root-to-leaf path, in nodes and tokens.
    pub path_nodes_max: u64,
    pub path_tokens_max: u64,
}

impl TreeStatistics {
    pub fn node_occurrences_repeated(&self) -> u64 {
        self.node_occurrences_unrolled - self.node_occurrences_tree
    }
}

fn segments_of(tree: &Tree, id: NodeId) -> u64 {
    let node = tree.node(id);
    (!node.input_ids.is_empty()) as u64 + (!node.output_ids.is_empty()) as u64
}

/// Segments on a path: each piece counts its input segment if it covers any of it, and its
/// output segment if it covers any of that.
fn segments_on_path(tree: &Tree, id: NodeId) -> u64 {
    tree.path(id)
        .iter()
        .map(|piece| {
            let input = tree.node(piece.node).input_len();
            (input > 0 && piece.cut > 0) as u64 + (piece.cut > input) as u64
        })
        .sum()
}

fn shared_prefix(tree: &Tree, root: NodeId) -> SharedPrefix {
    let mut current = root;
    loop {
        let node = tree.node(current);
        let single_child_at_end = !node.is_leaf()
            && node.children.len() == 1
            && tree.node(node.children[0]).start == node.end();
        if single_child_at_end {
            current = node.children[0];
            continue;
        }
        let mut tokens = node.end();
        for child in &node.children {
            tokens = tokens.min(tree.node(*child).start);
        }
        let cut = tokens - node.start;
        let covers_own = cut > 0;
        let nodes = node.depth - 1 + covers_own as u32;
        let mut segments = 0u32;
        for piece in tree.path(current) {
            let piece_node = tree.node(piece.node);
            let piece_cut = if piece.node == current {
                cut
            } else {
                piece.cut
            };
            let input = piece_node.input_len();
            segments += (input > 0 && piece_cut > 0) as u32 + (piece_cut > input) as u32;
        }
        return SharedPrefix {
            root,
            nodes,
            segments,
            tokens,
        };
    }
}

/// Computes the statistics of one tree under the given role classes.
pub fn statistics(tree: &Tree, classes: &RoleClasses) -> TreeStatistics {
    let mut candidates_per_class: Vec<(String, u64)> = classes
        .classes()
        .iter()
        .map(|class| (class.name.clone(), 0))
        .collect();
    let mut stats = TreeStatistics {
        requests: tree.len() as u64,
        nodes: tree.len() as u64,
        segments: tree.node_ids().map(|id| segments_of(tree, id)).sum(),
        roots: tree.roots().count() as u64,
        leaves: 0,
        candidates_per_class: Vec::new(),
        unclassified_leaves: 0,
        shared_prefixes: tree.roots().map(|root| shared_prefix(tree, root)).collect(),
        node_occurrences_unrolled: 0,
        node_occurrences_tree: tree.len() as u64,
        segment_occurrences_unrolled: 0,
        tokens_tree: tree.nodes().iter().map(|node| node.segment_len()).sum(),
        tokens_unrolled: 0,
        trainable_tokens: tree
            .nodes()
            .iter()
            .map(|node| node.segment_len() - node.trainable_from())
            .sum(),
        path_nodes_max: 0,
        path_tokens_max: 0,
    };
    for leaf in tree.leaves() {
        let node = tree.node(leaf);
        stats.leaves += 1;
        stats.node_occurrences_unrolled += node.depth as u64;
        stats.segment_occurrences_unrolled += segments_on_path(tree, leaf);
        stats.tokens_unrolled += node.end();
        stats.path_nodes_max = stats.path_nodes_max.max(node.depth as u64);
        stats.path_tokens_max = stats.path_tokens_max.max(node.end());
        match classes.classify(&node.agent, node.kind) {
            Some(class) => candidates_per_class[class as usize].1 += 1,
            None => stats.unclassified_leaves += 1,
        }
    }
    stats.candidates_per_class = candidates_per_class;
    stats
}
