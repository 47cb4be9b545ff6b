//! Scenario tests as data: a call script in, the ASCII tree and statistics out.

use expect_test::{expect, Expect};
use gyre_trajectory::{admit, render_tree, statistics, RoleClasses, SplitMix64};

use crate::support::{build, name};

fn check(script: &str, expected: Expect) {
    let tree = build(script);
    let classes = RoleClasses::claude_code();
    let mut out = render_tree(&tree, &classes, &name);
    let stats = statistics(&tree, &classes);
    out.push_str(&format!(
        "requests {} nodes {} segments {} roots {} leaves {} unrolled {} repeated {}\n",
        stats.requests,
        stats.nodes,
        stats.segments,
        stats.roots,
        stats.leaves,
        stats.node_occurrences_unrolled,
        stats.node_occurrences_repeated()
    ));
    for prefix in &stats.shared_prefixes {
        out.push_str(&format!(
            "shared prefix of {}: {} nodes, {} tokens\n",
            name(tree.node(prefix.root).call),
            prefix.nodes,
            prefix.tokens
        ));
    }
    let admission = admit(&tree, &classes, 5, &mut SplitMix64::for_execution(7, 1));
    for trajectory in &admission.trajectories {
        let targets: Vec<String> = trajectory
            .targets
            .iter()
            .map(|range| format!("{}[{},{})", name(range.call), range.start, range.end))
            .collect();
        out.push_str(&format!(
            "admit {} {}: {}\n",
            name(trajectory.leaf_call),
            classes.name(trajectory.class),
            targets.join(" ")
        ));
    }
    out.push_str(&format!("L_i {}\n", admission.targets_count));
    expected.assert_eq(&out);
}

#[test]
fn linear_conversation_is_one_path() {
    check(
        "
        c1 main turn: 1 2 3 -> 10 11
        c2 main turn: 1 2 3 10 11 4 -> 12
        c3 main turn: 1 2 3 10 11 4 12 5 6 -> 13 14 15
        ",
        expect![[r#"
            c1 main/turn @0 +in 3 +out 2
            └─ c2 main/turn @5 +in 1 +out 1
               └─ c3 main/turn @7 +in 2 +out 3 leaf:main
            requests 3 nodes 3 segments 6 roots 1 leaves 1 unrolled 3 repeated 0
            shared prefix of c1: 3 nodes, 12 tokens
            admit c3 main: c1[0,2) c2[0,1) c3[0,3)
            L_i 6
        "#]],
    );
}

#[test]
fn compaction_branches_from_the_system_prompt() {
    check(
        "
        c1 main turn: 1 2 3 -> 10 11
        c2 main summary: 1 2 3 10 11 4 -> 20 21
        c3 main turn: 1 2 9 20 21 -> 30 31
        c4 main turn: 1 2 9 20 21 30 31 5 -> 32
        ",
        expect![[r#"
            c1 main/turn @0 +in 3 +out 2
            ├─ c3 main/turn @2 +in 3 +out 2
            │  └─ c4 main/turn @7 +in 1 +out 1 leaf:main
            └─ c2 main/summary @5 +in 1 +out 2 leaf:main-summary
            requests 4 nodes 4 segments 8 roots 1 leaves 2 unrolled 5 repeated 1
            shared prefix of c1: 1 nodes, 2 tokens
            admit c4 main: c3[0,2) c4[0,1)
            admit c2 main-summary: c1[0,2) c2[0,2)
            L_i 7
        "#]],
    );
}

#[test]
fn sub_agent_gets_its_own_root_and_retry_a_sibling_leaf() {
    check(
        "
        c1 main turn: 1 2 -> 10 11
        c2 sub1 turn spawned_by=c1: 7 8 -> 40 41
        c3 sub1 turn spawned_by=c1: 7 8 40 41 9 -> 42
        c4 sub1 turn spawned_by=c1: 7 8 40 41 9 -> 43 44
        c5 main turn: 1 2 10 11 42 -> 12
        ",
        expect![[r#"
            c1 main/turn @0 +in 2 +out 2
            └─ c5 main/turn @4 +in 1 +out 1 leaf:main
            c2 sub1/turn @0 +in 2 +out 2 spawned-by:c1
            └─ c3 sub1/turn @4 +in 1 +out 1 leaf:sub-agent spawned-by:c1
               └─ c4 sub1/turn @5 +in 0 +out 2 leaf:sub-agent spawned-by:c1
            requests 5 nodes 5 segments 9 roots 2 leaves 3 unrolled 7 repeated 2
            shared prefix of c1: 2 nodes, 6 tokens
            shared prefix of c2: 2 nodes, 5 tokens
            admit c5 main: c1[0,2) c5[0,1)
            admit c4 sub-agent: c2[0,2) c4[0,2)
            admit c3 sub-agent: c3[0,1)
            L_i 8
        "#]],
    );
}
