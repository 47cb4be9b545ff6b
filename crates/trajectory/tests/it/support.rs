//! Shared helpers: a tiny call script language and tree builders.
//!
//! A script line is `call agent kind: context tokens -> output tokens`, for example
//! `c1 main turn: 1 2 3 -> 4 5`. Call names are `c<number>`; the number is the call id. A
//! `spawned_by=cN` word before the colon records causal parentage.

use gyre_event::{CallId, CallKind, EngineId, ExecutionId, PolicyVersion, Provenance};
use gyre_trajectory::{record_from_context, ContextCall, Tree, TreeConfig};

pub struct ScriptCall {
    pub call: CallId,
    pub agent: String,
    pub kind: CallKind,
    pub spawned_by: Option<CallId>,
    pub context: Vec<u32>,
    pub output: Vec<u32>,
}

fn call_id(word: &str) -> CallId {
    CallId(
        word.trim_start_matches('c')
            .parse()
            .expect("call names are c<number>"),
    )
}

pub fn parse(script: &str) -> Vec<ScriptCall> {
    script
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .map(|line| {
            let (head, body) = line.split_once(':').expect("a script line has a colon");
            let words: Vec<&str> = head.split_whitespace().collect();
            let (context, output) = body.split_once("->").expect("a script line has an arrow");
            let numbers = |text: &str| -> Vec<u32> {
                text.split_whitespace()
                    .map(|word| word.parse().expect("token ids are numbers"))
                    .collect()
            };
            ScriptCall {
                call: call_id(words[0]),
                agent: words[1].to_string(),
                kind: if words[2] == "summary" {
                    CallKind::Summary
                } else {
                    CallKind::Turn
                },
                spawned_by: words
                    .iter()
                    .find_map(|word| word.strip_prefix("spawned_by="))
                    .map(call_id),
                context: numbers(context),
                output: numbers(output),
            }
        })
        .collect()
}

pub fn build(script: &str) -> Tree {
    let mut tree = Tree::new(ExecutionId(1), TreeConfig::default());
    for call in parse(script) {
        let logprobs = vec![-0.5f32; call.output.len()];
        let record = record_from_context(
            &tree,
            &ContextCall {
                call: call.call,
                agent: &call.agent,
                kind: call.kind,
                spawned_by: call.spawned_by,
                context: &call.context,
                context_provenance: Provenance::User,
                output_ids: &call.output,
                output_logprobs: &logprobs,
                engine: EngineId(0),
                policy_version: PolicyVersion(0),
            },
        );
        tree.apply(&record).expect("script calls apply");
        tree.validate();
    }
    tree
}

pub fn name(call: CallId) -> String {
    call.to_string()
}
