//! Whose sampling settings a call is drawn with. A harness's `temperature`, `top_p` or `top_k`
//! changes the distribution the engine samples from, and so the behaviour log-probs it
//! reports (SGLang and vLLM report the log-probs of the distribution they sampled); a trainer
//! recomputes the policy's own. By default the proxy samples every call from the policy
//! (`--sampling policy`); with `--sampling harness` the harness's settings reach the engine's
//! wire, the record keeps them, and the call is context for training, never targets.

use gyre_event::SamplingSettings;
use gyre_proxy::server::{SamplingPolicy, ServerConfig};
use gyre_trajectory::{admit, RoleClasses, SplitMix64, Tree, TreeConfig};
use serde_json::{json, Value};

use crate::in_process::{behind_a_fake, AskedSampling};

/// Requests of each API that ask for their own settings, then one that asks for none.
fn requests() -> Vec<(&'static str, Value)> {
    vec![
        (
            "/v1/chat/completions",
            json!({"model": "m", "max_tokens": 16, "temperature": 0.2, "top_p": 0.9,
                   "messages": [{"role": "user", "content": "Fix the failing test."}]}),
        ),
        (
            "/v1/messages",
            json!({"model": "m", "max_tokens": 16, "temperature": 0.5, "top_k": 5,
                   "messages": [{"role": "user", "content": "Now the other one."}]}),
        ),
        (
            "/v1/responses",
            json!({"model": "m", "max_output_tokens": 16, "top_p": 0.8, "input": "And run them."}),
        ),
        (
            "/v1/messages",
            json!({"model": "m", "max_tokens": 16,
                   "messages": [{"role": "user", "content": "Thanks."}]}),
        ),
    ]
}

/// What each request of [`requests`] asked for.
fn asked() -> Vec<AskedSampling> {
    vec![
        AskedSampling {
            temperature: 0.2,
            top_p: 0.9,
            top_k: None,
        },
        AskedSampling {
            temperature: 0.5,
            top_p: 1.0,
            top_k: Some(5),
        },
        AskedSampling {
            temperature: 1.0,
            top_p: 0.8,
            top_k: None,
        },
        AskedSampling {
            temperature: 1.0,
            top_p: 1.0,
            top_k: None,
        },
    ]
}

fn config(sampling: SamplingPolicy) -> ServerConfig {
    ServerConfig {
        sampling,
        ..ServerConfig::default()
    }
}

fn metric(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} in /metrics:\n{metrics}"))
}

#[test]
fn every_call_samples_from_the_policy_whatever_the_harness_asks() {
    let runtime = crate::support::runtime();
    for sglang in [true, false] {
        let protocol = if sglang { "sglang" } else { "vllm" };
        let (proxy, backing, _fake) =
            behind_a_fake(&runtime, sglang, config(SamplingPolicy::Policy));
        for (path, body) in requests() {
            let (status, answer) = proxy.post(path, &body);
            assert_eq!(status, 200, "{protocol} {path}: {answer}");
        }
        let policy = AskedSampling {
            temperature: 1.0,
            top_p: 1.0,
            top_k: None,
        };
        assert_eq!(
            *backing.sampling.lock().expect("sampling"),
            vec![policy; 4],
            "{protocol}: the engine's wire carried the policy's own settings"
        );
        let records = proxy.sink.records();
        assert_eq!(records.len(), 4);
        for record in &records {
            assert_eq!(record.sampling, SamplingSettings::POLICY);
            assert_eq!(record.context_output_tokens(), 0, "every output trainable");
        }
        assert_eq!(
            metric(&proxy.metrics(), "gyre_proxy_sampling_overridden_total"),
            3,
            "{protocol}: the three requests that asked for their own settings are counted"
        );
    }
}

#[test]
fn a_harnesss_settings_reach_the_engine_and_keep_the_call_out_of_training() {
    let runtime = crate::support::runtime();
    for sglang in [true, false] {
        let protocol = if sglang { "sglang" } else { "vllm" };
        let (proxy, backing, _fake) =
            behind_a_fake(&runtime, sglang, config(SamplingPolicy::Harness));
        for (path, body) in requests() {
            let (status, answer) = proxy.post(path, &body);
            assert_eq!(status, 200, "{protocol} {path}: {answer}");
        }
        assert_eq!(
            *backing.sampling.lock().expect("sampling"),
            asked(),
            "{protocol}: each request's own settings crossed the engine's wire"
        );
        let records = proxy.sink.records();
        let kept: Vec<AskedSampling> = records
            .iter()
            .map(|record| AskedSampling {
                temperature: record.sampling.temperature,
                top_p: record.sampling.top_p,
                top_k: record.sampling.top_k,
            })
            .collect();
        assert_eq!(kept, asked(), "{protocol}: each record keeps its settings");
        assert_eq!(
            metric(&proxy.metrics(), "gyre_proxy_sampling_overridden_total"),
            0
        );

        // The records fold into the execution's tree; only the last call, drawn from the
        // policy itself, has targets.
        let mut tree = Tree::new(records[0].execution, TreeConfig::default());
        for record in &records {
            tree.apply(record).expect("the records fold");
        }
        let admission = admit(
            &tree,
            &RoleClasses::claude_code(),
            5,
            &mut SplitMix64::for_execution(1, 1),
        );
        let targeted: Vec<u64> = admission
            .trajectories
            .iter()
            .flat_map(|trajectory| trajectory.targets.iter().map(|range| range.call.get()))
            .collect();
        assert_eq!(
            targeted,
            vec![records[3].call.get()],
            "{protocol}: only the call sampled from the policy is trained on"
        );
        assert_eq!(admission.targets_count, records[3].output_ids.len() as u64);
    }
}

/// Settings an engine cannot sample with are the API's 400 naming them when they would be
/// sent (`--sampling harness`), before anything is sampled or recorded; the policy ignores them.
#[test]
fn settings_an_engine_cannot_sample_with_are_refused_when_they_would_be_sent() {
    let runtime = crate::support::runtime();
    let bad = [
        (json!({"temperature": -0.5}), "temperature"),
        (json!({"top_p": 0.0}), "top_p"),
        (json!({"temperature": 1e300}), "temperature"),
    ];
    for (policy, refused) in [
        (SamplingPolicy::Harness, true),
        (SamplingPolicy::Policy, false),
    ] {
        let (proxy, backing, _fake) = behind_a_fake(&runtime, true, config(policy));
        for (settings, field) in &bad {
            let mut body = json!({"model": "m", "max_tokens": 8,
                                  "messages": [{"role": "user", "content": "Hi."}]});
            for (key, value) in settings.as_object().expect("settings") {
                body[key] = value.clone();
            }
            let (status, answer) = proxy.post("/v1/chat/completions", &body);
            if refused {
                assert_eq!(status, 400, "{settings}: {answer}");
                assert_eq!(answer["error"]["type"], "invalid_request_error", "{answer}");
                let message = answer["error"]["message"].as_str().expect("message");
                assert!(message.contains(field), "{message}");
            } else {
                assert_eq!(status, 200, "{settings}: {answer}");
            }
        }
        let sampled = backing.sampling.lock().expect("sampling").len();
        assert_eq!(sampled, if refused { 0 } else { bad.len() });
        assert_eq!(
            proxy.sink.records().len(),
            sampled,
            "nothing recorded for a refusal"
        );
    }
}
