//! Admission: at most J_max trajectories per execution, by role priority (DESIGN.md §6).
//!
//! Repeatedly: take the highest-priority class that still has unmasked trainable tokens; draw
//! one of its leaves with probability ∝ the unmasked trainable tokens on its root-to-leaf path;
//! fix that trajectory's targets = exactly those tokens; mask the whole path. Stop at J_max or
//! when nothing trainable is left. Target sets are disjoint by construction because a fixed
//! target is masked before the next draw.
//!
//! Every path covers a prefix of each node's segment (see `tree.rs`), so the mask of a node is
//! one integer, `masked[node]`: its first `masked` segment tokens are masked. The unmasked
//! trainable tokens a path piece `(node, cut)` carries are the output positions in
//! `[max(masked, trainable_from), cut)`, where `trainable_from` is the input length plus the
//! leading outputs an engine sampled under an answer-format grammar (their log-probs are of the
//! masked distribution, so they stay context) — one contiguous range, so each node contributes at most one
//! `TargetRange` per trajectory. Leaf weights are recomputed after each draw in one pass over
//! the nodes (parents precede children): O(J_max · nodes).
//!
//! The draw uses [`SplitMix64`] seeded from the run seed and the execution key, both in the log,
//! so replay draws the same leaves.

use gyre_event::{AdmittedTrajectory, TargetRange};

use crate::{NodeId, RoleClasses, SplitMix64, Tree};

/// J_max's default (the paper's setting).
pub const J_MAX_DEFAULT: u32 = 5;

/// A candidate trajectory: a leaf with a role class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub leaf: NodeId,
    pub class: u32,
}

/// The admission decision for one execution.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Admission {
    /// Candidate leaves (leaves that have a class), in node order.
    pub candidates: Vec<Candidate>,
    /// Leaves no class accepts.
    pub unclassified_leaves: u32,
    /// Admitted trajectories in admission order.
    pub trajectories: Vec<AdmittedTrajectory>,
    /// L_i: total admitted targets.
    pub targets_count: u64,
    /// For each admitted trajectory: the unmasked trainable tokens each class had just before its
    /// draw (audit trail for the priority rule).
    pub class_unmasked_before: Vec<Vec<u64>>,
}

/// Unmasked trainable tokens of `node`'s segment prefix `[0, cut)`.
fn unmasked_in(tree: &Tree, masked: &[u64], node: NodeId, cut: u64) -> u64 {
    let low = masked[node.index()].max(tree.node(node).trainable_from());
    cut.saturating_sub(low)
}

/// Unmasked trainable tokens on every node's root-to-node path, in one pass (parents first).
fn path_weights(tree: &Tree, masked: &[u64]) -> Vec<u64> {
    // bases[n]: unmasked trainable tokens on the path strictly before n's own segment.
    let mut bases = vec![0u64; tree.len()];
    let mut weights = vec![0u64; tree.len()];
    for id in tree.node_ids() {
        let node = tree.node(id);
        if let Some(parent) = node.parent {
            let cut = node.start - tree.node(parent).start;
            bases[id.index()] = bases[parent.index()] + unmasked_in(tree, masked, parent, cut);
        }
        weights[id.index()] = bases[id.index()] + unmasked_in(tree, masked, id, node.segment_len());
    }
    weights
}

/// Runs admission for one execution.
pub fn admit(tree: &Tree, classes: &RoleClasses, j_max: u32, rng: &mut SplitMix64) -> Admission {
    let candidates: Vec<Candidate> = tree
        .leaves()
        .filter_map(|leaf| {
            let node = tree.node(leaf);
            classes
                .classify(&node.agent, node.kind)
                .map(|class| Candidate { leaf, class })
        })
        .collect();
    let unclassified_leaves = (tree.leaves().count() - candidates.len()) as u32;
    let mut masked = vec![0u64; tree.len()];
    let mut trajectories = Vec::new();
    let mut class_unmasked_before = Vec::new();
    let mut targets_count = 0u64;
    while (trajectories.len() as u32) < j_max {
        let weights = path_weights(tree, &masked);
        let mut per_class = vec![0u64; classes.len()];
        for candidate in &candidates {
            per_class[candidate.class as usize] += weights[candidate.leaf.index()];
        }
        let Some(class) = per_class.iter().position(|total| *total > 0) else {
            break;
        };
        // Draw a leaf of `class` with probability ∝ its unmasked trainable tokens.
        let mut remaining = rng.below(per_class[class]);
        let leaf = candidates
            .iter()
            .filter(|candidate| candidate.class as usize == class)
            .find(|candidate| {
                let weight = weights[candidate.leaf.index()];
                if remaining < weight {
                    true
                } else {
                    remaining -= weight;
                    false
                }
            })
            .expect("the draw lies below the class total, so some leaf holds it")
            .leaf;
        let mut targets = Vec::new();
        for piece in tree.path(leaf) {
            let node = tree.node(piece.node);
            let low = masked[piece.node.index()].max(node.trainable_from());
            if piece.cut > low {
                targets.push(TargetRange {
                    call: node.call,
                    start: (low - node.input_len()) as u32,
                    end: (piece.cut - node.input_len()) as u32,
                });
                targets_count += piece.cut - low;
            }
            let mask = &mut masked[piece.node.index()];
            *mask = (*mask).max(piece.cut);
        }
        class_unmasked_before.push(per_class);
        trajectories.push(AdmittedTrajectory {
            leaf_call: tree.node(leaf).call,
            class: class as u32,
            targets,
        });
    }
    Admission {
        candidates,
        unclassified_leaves,
        trajectories,
        targets_count,
        class_unmasked_before,
    }
}

/// L_r / L_i for each admitted trajectory: the trajectory weights of eq (6), summing to 1 (or
/// all zero when L_i = 0).
pub fn trajectory_weights(trajectories: &[AdmittedTrajectory]) -> Vec<f64> {
    let counts: Vec<u64> = trajectories.iter().map(trajectory_targets_count).collect();
    let total: u64 = counts.iter().sum();
    counts
        .iter()
        .map(|count| {
            if total == 0 {
                0.0
            } else {
                *count as f64 / total as f64
            }
        })
        .collect()
}

/// L_r: the number of targets of one trajectory.
pub fn trajectory_targets_count(trajectory: &AdmittedTrajectory) -> u64 {
    trajectory
        .targets
        .iter()
        .map(|range| (range.end - range.start) as u64)
        .sum()
}
