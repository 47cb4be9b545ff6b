//! Structured outputs end to end: a format asked for in each API's own field reaches the
//! engine's grammar over SGLang's and vLLM's wire (through the protocol fakes), only when the
//! answer must be that JSON and only from the output's first token, and every record says
//! which format was asked for and whether sampling was held to it.

use gyre_proxy::engine::fake::FakeFault;
use gyre_proxy::engine::JsonConstraint;
use gyre_proxy::server::ServerConfig;
use serde_json::{json, Value};

use crate::in_process::{behind_a_fake, proxy, recording};

const SCHEMA: &str = r#"{"type":"object","properties":{"verdict":{"type":"string","enum":["pass","fail"]},"score":{"type":"number"}},"required":["verdict","score"],"additionalProperties":false}"#;

fn schema() -> Value {
    serde_json::from_str(SCHEMA).expect("the schema is JSON")
}

fn weather_tool_chat() -> Value {
    json!([{"type": "function", "function": {"name": "weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])
}

/// Each API's request for the same format; `tools` adds a tool the model could call instead.
fn requests(tools: bool) -> Vec<(&'static str, Value)> {
    let mut chat = json!({
        "model": "m", "max_tokens": 32,
        "messages": [{"role": "user", "content": "Grade the patch."}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "grade", "schema": schema(), "strict": true}},
    });
    let mut responses = json!({
        "model": "m", "max_output_tokens": 32, "store": false,
        "input": [{"role": "user", "content": "Grade the patch."}],
        "text": {"format": {"type": "json_schema", "name": "grade", "schema": schema(), "strict": true}, "verbosity": "low"},
    });
    let mut messages = json!({
        "model": "m", "max_tokens": 32,
        "messages": [{"role": "user", "content": "Grade the patch."}],
        "output_config": {"format": {"type": "json_schema", "schema": schema()}},
    });
    if tools {
        chat["tools"] = weather_tool_chat();
        responses["tools"] = json!([{"type": "function", "name": "weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
        messages["tools"] = json!([{"name": "weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
    }
    vec![
        ("/v1/chat/completions", chat),
        ("/v1/responses", responses),
        ("/v1/messages", messages),
    ]
}

/// What a record says of a call whose `outputs` tokens were all held to `schema`.
fn constrained_by(schema: &str, outputs: usize) -> gyre_event::OutputConstraint {
    gyre_event::OutputConstraint {
        schema: Some(schema.to_string()),
        enforced: true,
        constrained_tokens: outputs as u32,
    }
}

#[test]
fn a_schema_reaches_the_engines_grammar_over_sglang_and_vllm_and_the_record_says_so() {
    let runtime = crate::support::runtime();
    for sglang in [true, false] {
        let (proxy, backing, fake) = behind_a_fake(&runtime, sglang, ServerConfig::default());
        let protocol = if sglang { "sglang" } else { "vllm" };

        // No tool to call instead: the whole answer is the JSON, so the engine is held to it.
        for (path, body) in requests(false) {
            let (status, answer) = proxy.post(path, &body);
            assert_eq!(status, 200, "{protocol} {path}: {answer}");
        }
        // A tool the model may call instead: the format is the final answer's, not the
        // output's, so no grammar; the record says the format was asked for, not enforced.
        for (path, body) in requests(true) {
            let (status, answer) = proxy.post(path, &body);
            assert_eq!(status, 200, "{protocol} {path} with tools: {answer}");
        }
        // `json_object` is any object; on SGLang's wire that is the schema `{"type":"object"}`.
        let (status, answer) = proxy.post(
            "/v1/chat/completions",
            &json!({"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "JSON please."}], "response_format": {"type": "json_object"}}),
        );
        assert_eq!(status, 200, "{answer}");
        // Plain text asks for nothing.
        let (status, answer) = proxy.post(
            "/v1/chat/completions",
            &json!({"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "Hi."}], "response_format": {"type": "text"}}),
        );
        assert_eq!(status, 200, "{answer}");

        let schema = JsonConstraint::Schema(SCHEMA.into());
        let any_object = if sglang {
            JsonConstraint::Schema(r#"{"type":"object"}"#.into())
        } else {
            JsonConstraint::Object
        };
        assert_eq!(
            *backing.constraints.lock().expect("constraints"),
            vec![
                Some(schema.clone()),
                Some(schema.clone()),
                Some(schema.clone()),
                None,
                None,
                None,
                Some(any_object),
                None,
            ],
            "what {protocol}'s engine was held to, request by request"
        );
        // The test model reasons in `<think>` tags: SGLang is asked to start the grammar after
        // the reasoning (vLLM does so by its server's reasoning parser; nothing on its wire).
        let reasoning_first = backing.reasoning_first.lock().expect("reasoning").clone();
        let constrained: Vec<bool> = backing
            .constraints
            .lock()
            .expect("constraints")
            .iter()
            .map(|json| sglang && json.is_some())
            .collect();
        assert_eq!(
            reasoning_first, constrained,
            "{protocol}: require_reasoning with a grammar"
        );
        let records = proxy.sink.records();
        let constraints: Vec<_> = records
            .iter()
            .map(|record| record.output_constraint.clone())
            .collect();
        // `held`: every sampled token was held to the format (all of them counted), else none.
        let asked = |held: bool, record: &gyre_event::ModelCallRecord| {
            Some(gyre_event::OutputConstraint {
                schema: Some(SCHEMA.to_string()),
                enforced: held,
                constrained_tokens: if held {
                    record.output_ids.len() as u32
                } else {
                    0
                },
            })
        };
        assert_eq!(
            constraints,
            vec![
                asked(true, &records[0]),
                asked(true, &records[1]),
                asked(true, &records[2]),
                asked(false, &records[3]),
                asked(false, &records[4]),
                asked(false, &records[5]),
                Some(gyre_event::OutputConstraint {
                    schema: None,
                    enforced: true,
                    constrained_tokens: records[6].output_ids.len() as u32,
                }),
                None,
            ],
            "{protocol}: each record says what was asked for and how many tokens it held"
        );
        assert_eq!(
            records[0].output_constraint,
            Some(constrained_by(SCHEMA, records[0].output_ids.len())),
            "the schema is kept as the client wrote it"
        );
        assert!(records[0].constrained_output_tokens() > 0);

        // A failover that continues a partial answer cannot restart the grammar: the
        // continuation goes unconstrained and the record says the answer was not held to it.
        fake.inject(FakeFault::CutAfterTokens(4));
        let (path, body) = requests(false).remove(0);
        let (status, answer) = proxy.post(path, &body);
        assert_eq!(
            status, 200,
            "{protocol}: the harness sees one answer: {answer}"
        );
        let seen = backing.constraints.lock().expect("constraints").clone();
        assert_eq!(
            seen[seen.len() - 2..],
            [Some(schema), None],
            "{protocol}: the first attempt was constrained, its continuation could not be"
        );
        let records = proxy.sink.records();
        let last = records.last().expect("the continued call is recorded");
        // The tokens sampled before the cut were held to the grammar, the continuation's were
        // not: the record counts the first, so a trainer keeps their masked log-probs out of
        // the loss.
        let cut = records
            .iter()
            .rev()
            .find(|record| record.kind == gyre_event::CallKind::Aborted)
            .expect("the cut attempt is kept for audit");
        let before_cut = cut.output_ids.len() as u32;
        assert!(
            before_cut > 0,
            "{protocol}: the first attempt sampled tokens"
        );
        assert!((before_cut as usize) < last.output_ids.len());
        assert_eq!(
            last.output_constraint,
            Some(gyre_event::OutputConstraint {
                schema: Some(SCHEMA.to_string()),
                enforced: false,
                constrained_tokens: before_cut,
            })
        );
        assert_eq!(last.constrained_output_tokens(), before_cut);
        assert!(
            records
                .iter()
                .any(|record| record.kind == gyre_event::CallKind::Aborted),
            "{protocol}: the cut attempt is kept for audit"
        );
    }
}

#[test]
fn an_engine_without_a_grammar_records_the_format_as_not_enforced() {
    let runtime = crate::support::runtime();
    let backing = recording();
    let proxy = proxy(&runtime, backing.clone());
    for (path, body) in requests(false) {
        let (status, answer) = proxy.post(path, &body);
        assert_eq!(status, 200, "{path}: {answer}");
    }
    assert_eq!(
        *backing.constraints.lock().expect("constraints"),
        vec![None, None, None],
        "an engine that cannot constrain is sent no grammar"
    );
    for record in proxy.sink.records() {
        assert_eq!(
            record.output_constraint,
            Some(gyre_event::OutputConstraint {
                schema: Some(SCHEMA.to_string()),
                enforced: false,
                constrained_tokens: 0,
            })
        );
    }
}

#[test]
fn a_bad_format_is_refused_in_the_apis_shape_and_nothing_is_recorded() {
    let runtime = crate::support::runtime();
    let backing = recording();
    let proxy = proxy(&runtime, backing.clone());
    let cases = [
        (
            "/v1/chat/completions",
            json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", "json_schema": {"name": "grade", "schema": "not an object"}}}),
            "response_format.json_schema.schema",
        ),
        (
            "/v1/responses",
            json!({"model": "m", "input": "x", "text": {"format": {"type": "json_schema", "schema": {}}}}),
            "text.format.name",
        ),
        (
            "/v1/messages",
            json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}], "output_config": {"format": {"type": "xml"}}}),
            "output_config.format",
        ),
        // A schema no engine's grammar compiler can read is refused before any engine is
        // asked, naming the keyword (the engine's own refusal named nothing).
        (
            "/v1/chat/completions",
            json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", "json_schema": {"name": "grade", "schema": {"type": "object", "properties": {"score": {"type": "float"}}}}}}),
            "response_format.json_schema.schema.properties.score.type",
        ),
        (
            "/v1/responses",
            json!({"model": "m", "input": "x", "text": {"format": {"type": "json_schema", "name": "g", "schema": {"type": "object", "required": "score"}}}}),
            "text.format.schema.required",
        ),
        (
            "/v1/messages",
            json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}], "output_config": {"format": {"type": "json_schema", "schema": {"items": {"$ref": "#/$defs/row"}}}}}),
            "output_config.format.schema.items.$ref",
        ),
    ];
    for (path, body, field) in cases {
        let (status, answer) = proxy.post(path, &body);
        assert_eq!(status, 400, "{path}: {answer}");
        let text = answer.to_string();
        assert!(
            text.contains(field),
            "{path}: the error names {field}: {text}"
        );
        let shape_ok = if path == "/v1/messages" {
            answer["type"] == "error" && answer["error"]["type"] == "invalid_request_error"
        } else {
            answer["error"]["type"] == "invalid_request_error"
        };
        assert!(shape_ok, "{path}: the API's own error shape: {text}");
    }
    assert!(proxy.sink.records().is_empty(), "nothing recorded");
    assert!(
        backing.constraints.lock().expect("constraints").is_empty(),
        "the engine was never called"
    );
}
