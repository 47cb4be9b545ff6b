//! What an answer sampled before its tool call and a harness leaves out when it sends the
//! answer back: whitespace (Claude Code drops a whitespace-only text block) and reasoning
//! (Chat Completions clients send `content` and `tool_calls` only, never `reasoning_content`).
//! The proxy puts both back before rendering: otherwise the re-rendered answer would differ
//! from its sampled tokens right after the assistant header, and the next call would encode
//! the whole answer again as input instead of extending it.

use std::sync::Arc;

use gyre_proxy::engine::TokenEngine;
use gyre_proxy::output::OutputFormat;
use gyre_proxy::server::ServerConfig;
use serde_json::json;

use crate::in_process::{model, proxy_with, serve_state, Proxy};

#[test]
fn a_dropped_blank_text_block_before_a_tool_call_is_restored() {
    blank_text_scenario(false);
}

/// The same, with the proxy restarted between the two calls: the session rebuilt from the
/// records knows the blank text the answer began with.
#[test]
fn a_dropped_blank_text_block_is_restored_after_a_restart() {
    blank_text_scenario(true);
}

fn blank_text_scenario(restart: bool) {
    let runtime = crate::support::runtime();
    let engine = crate::in_process::scripted(concat!(
        r#"{"agent": "main", "blocks": [{"type": "text", "text": "\n\n"}, "#,
        r#"{"type": "tool_use", "name": "Bash", "input": {"command": "echo a"}}]}"#,
        "\n",
        r#"{"agent": "main", "blocks": [{"type": "text", "text": "Done."}]}"#,
    ));
    let dir = tempfile::tempdir().expect("tempdir");
    let config = ServerConfig {
        credentials: Some(dir.path().join("credentials")),
        ..ServerConfig::default()
    };
    let mut proxy = proxy_with(&runtime, engine.clone(), config.clone());
    let tools = json!([{"name": "Bash", "description": "Runs a command.",
                        "input_schema": {"type": "object",
                                         "properties": {"command": {"type": "string"}}}}]);
    let ask = json!({"role": "user", "content": "Run it."});
    let (status, first) = proxy.post(
        "/v1/messages",
        &json!({"model": "m", "max_tokens": 256, "tools": tools, "messages": [ask]}),
    );
    assert_eq!(status, 200, "{first}");
    let blocks = first["content"].as_array().expect("content");
    assert_eq!(blocks[0]["text"], "\n\n", "{first}");
    let call = blocks[1].clone();
    assert_eq!(call["type"], "tool_use", "{first}");

    let mut records = proxy.sink.records();
    if restart {
        proxy = restarted(&runtime, engine, config, proxy, &records);
    }

    // As Claude Code re-sends it: the tool call without the blank text before it.
    let history = json!([
        ask,
        {"role": "assistant", "content": [call]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"],
                                      "content": "a"}]},
    ]);
    let (status, second) = proxy.post(
        "/v1/messages",
        &json!({"model": "m", "max_tokens": 256, "tools": tools, "messages": history}),
    );
    assert_eq!(status, 200, "{second}");

    // The restarted proxy's sink holds only the second call; the first proxy's holds both.
    if restart {
        records.extend(proxy.sink.records());
    } else {
        records = proxy.sink.records();
    }
    assert_eq!(records.len(), 2);
    let (c0, c1) = (&records[0], &records[1]);
    assert_eq!(c1.parent_call, Some(c0.call));
    assert_eq!(
        c1.reused_prefix_tokens_count,
        (c0.input_ids.len() + c0.output_ids.len()) as u64,
        "the second call extends the first's prompt and its whole sampled answer"
    );

    // `gyre replay` counts answers the next call did not reuse whole: none here, one when the
    // second call re-encodes the first's answer (as before the blank text was restored).
    let replayed = |records: &[gyre_event::ModelCallRecord], name: &str| {
        let path = dir.path().join(name);
        let mut writer = gyre_log::EventFileWriter::create(&path).expect("event file");
        for event in as_events(records) {
            writer.append_batch(&[event]).expect("appended");
        }
        writer.sync().expect("synced");
        let (code, stdout, stderr) =
            crate::support::gyre(&["replay", path.to_str().expect("utf-8"), "--json"]);
        assert_eq!(code, 0, "{stderr}");
        let report: serde_json::Value = serde_json::from_str(&stdout).expect("JSON report");
        report["model_calls"].clone()
    };
    let calls = replayed(&records, "extended.log");
    assert_eq!(calls["answers_not_reused_whole"], 0, "{calls}");
    let mut re_encoded = records.clone();
    let answer = c0.output_ids.len();
    let moved: Vec<u32> = c0.output_ids.clone();
    re_encoded[1].reused_prefix_tokens_count -= answer as u64;
    re_encoded[1].input_ids.splice(0..0, moved);
    re_encoded[1].input_provenance.insert(
        0,
        gyre_event::ProvenanceSpan {
            provenance: gyre_event::Provenance::HarnessAssistant,
            tokens_count: answer as u32,
        },
    );
    let calls = replayed(&re_encoded, "re-encoded.log");
    assert_eq!(calls["answers_not_reused_whole"], 1, "{calls}");
    assert_eq!(calls["answer_tokens_re_encoded"], answer, "{calls}");
}

#[test]
fn a_dropped_reasoning_content_before_a_tool_call_is_restored() {
    dropped_reasoning_scenario(false);
}

/// The same, with the proxy restarted between the two calls: the session rebuilt from the
/// records knows the reasoning the answer began with.
#[test]
fn a_dropped_reasoning_content_is_restored_after_a_restart() {
    dropped_reasoning_scenario(true);
}

fn dropped_reasoning_scenario(restart: bool) {
    let runtime = crate::support::runtime();
    let engine = crate::in_process::scripted(concat!(
        r#"{"agent": "main", "blocks": [{"type": "thinking", "thinking": "The tool knows."}, "#,
        r#"{"type": "tool_use", "name": "get_weather", "input": {"city": "Paris"}}]}"#,
        "\n",
        r#"{"agent": "main", "blocks": [{"type": "text", "text": "Sunny."}]}"#,
    ));
    let dir = tempfile::tempdir().expect("tempdir");
    let config = ServerConfig {
        credentials: Some(dir.path().join("credentials")),
        ..ServerConfig::default()
    };
    let mut proxy = proxy_with(&runtime, engine.clone(), config.clone());
    let tools = json!([{"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let ask = json!({"role": "user", "content": "Weather in Paris?"});
    let (status, first) = proxy.post(
        "/v1/chat/completions",
        &json!({"model": "m", "tools": tools, "messages": [ask]}),
    );
    assert_eq!(status, 200, "{first}");
    let message = &first["choices"][0]["message"];
    assert_eq!(message["reasoning_content"], "The tool knows.", "{first}");
    let call = message["tool_calls"][0].clone();
    assert_eq!(call["function"]["name"], "get_weather", "{first}");

    let mut records = proxy.sink.records();
    if restart {
        proxy = restarted(&runtime, engine, config, proxy, &records);
    }

    // As the OpenAI SDK's clients send it back: no `reasoning_content`, no content.
    let history = json!([
        ask,
        {"role": "assistant", "content": null, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "sunny in Paris"},
    ]);
    let (status, second) = proxy.post(
        "/v1/chat/completions",
        &json!({"model": "m", "tools": tools, "messages": history}),
    );
    assert_eq!(status, 200, "{second}");
    assert_eq!(
        second["choices"][0]["message"]["content"], "Sunny.",
        "{second}"
    );

    if restart {
        records.extend(proxy.sink.records());
    } else {
        records = proxy.sink.records();
    }
    assert_eq!(records.len(), 2);
    let (c0, c1) = (&records[0], &records[1]);
    assert_eq!(c1.parent_call, Some(c0.call));
    assert_eq!(
        c1.reused_prefix_tokens_count,
        (c0.input_ids.len() + c0.output_ids.len()) as u64,
        "the second call extends the first's prompt and its whole sampled answer, reasoning \
         included"
    );
}

/// `records` as the log holds them: one `ModelCall` event each.
fn as_events(records: &[gyre_event::ModelCallRecord]) -> Vec<gyre_event::Event> {
    records
        .iter()
        .map(|record| {
            gyre_event::Event::new(
                record.requested_at,
                gyre_event::EventBody::ModelCall(Box::new(record.clone())),
            )
        })
        .collect()
}

/// A second proxy on `config`'s credential file that rebuilt its sessions from `history`
/// (what the first one recorded), serving `token`'s execution.
fn restarted(
    runtime: &tokio::runtime::Runtime,
    engine: Arc<dyn TokenEngine>,
    config: ServerConfig,
    before: Proxy,
    records: &[gyre_event::ModelCallRecord],
) -> Proxy {
    let token = before.token.clone();
    drop(before);
    let history = as_events(records);
    let sink = Arc::new(crate::support::MemorySink::default());
    let state = gyre_proxy::server::AppState::new(
        config,
        model(),
        OutputFormat::test_model(),
        vec![engine],
        sink.clone(),
    )
    .expect("state");
    let recovery = state.recover(history);
    assert_eq!(recovery.executions_resumed, 1, "{recovery:?}");
    serve_state(runtime, state, token, sink)
}
