//! ASCII rendering of a tree: the dump that scenario tests snapshot and `gyre trajectory build`
//! prints.
//!
//! One line per node: `call agent/kind @start +in N +out M`, then `leaf:<class>` for leaves and
//! `spawned-by:<call>` when causal parentage is known. Children are listed by attach position,
//! then by call order; `@start` is the absolute path position where the node's tokens begin, so
//! a child with `@start` below its parent's end is a branch inside the parent's call.

use std::fmt::Write;

use gyre_event::{CallId, CallKind};

use crate::{NodeId, RoleClasses, Tree};

fn kind_name(kind: CallKind) -> &'static str {
    match kind {
        CallKind::Turn => "turn",
        CallKind::Summary => "summary",
        CallKind::Aborted => "aborted",
    }
}

/// Renders `tree`; `call_name` turns a call id into the name to print.
pub fn render_tree(
    tree: &Tree,
    classes: &RoleClasses,
    call_name: &dyn Fn(CallId) -> String,
) -> String {
    let mut out = String::new();
    let roots: Vec<NodeId> = tree.roots().collect();
    for root in roots {
        render_node(tree, classes, call_name, root, "", None, &mut out);
    }
    out
}

fn render_node(
    tree: &Tree,
    classes: &RoleClasses,
    call_name: &dyn Fn(CallId) -> String,
    id: NodeId,
    prefix: &str,
    last: Option<bool>,
    out: &mut String,
) {
    let node = tree.node(id);
    let (branch, child_prefix) = match last {
        None => (String::new(), String::new()),
        Some(true) => (format!("{prefix}└─ "), format!("{prefix}   ")),
        Some(false) => (format!("{prefix}├─ "), format!("{prefix}│  ")),
    };
    let mut line = format!(
        "{branch}{} {}/{} @{} +in {} +out {}",
        call_name(node.call),
        node.agent,
        kind_name(node.kind),
        node.start,
        node.input_ids.len(),
        node.output_ids.len()
    );
    if node.is_leaf() {
        match classes.classify(&node.agent, node.kind) {
            Some(class) => write!(line, " leaf:{}", classes.name(class)),
            None => write!(line, " leaf:unclassified"),
        }
        .expect("writing to a String cannot fail");
    }
    if let Some(spawner) = node.spawned_by {
        write!(line, " spawned-by:{}", call_name(spawner))
            .expect("writing to a String cannot fail");
    }
    out.push_str(&line);
    out.push('\n');
    let mut children = node.children.clone();
    children.sort_by_key(|child| (tree.node(*child).start, *child));
    for (index, child) in children.iter().enumerate() {
        let is_last = index + 1 == children.len();
        render_node(
            tree,
            classes,
            call_name,
            *child,
            &child_prefix,
            Some(is_last),
            out,
        );
    }
}
