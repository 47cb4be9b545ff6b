//! The fakes' OpenAI-compatible `/v1/chat/completions` (what LiteLLM or `smg` would call):
//! non-streaming and streaming text equal to the scripted line, usage, and errors in OpenAI's
//! shape.

use std::sync::Arc;

use gyre_proxy::engine::fake::{ChatBackend, FakeOptions, FakeServer};
use gyre_proxy::output::OutputFormat;
use serde_json::{json, Value};

use crate::engine_support::{http, model, options, scripted, sse_data, FINAL_TEXT};

const TEXT_SCRIPT: &str = concat!(
    r#"{"agent": "main", "blocks": [{"type": "text", "text": "All done. The directory has three files."}]}"#,
    "\n",
    r#"{"agent": "main", "blocks": [{"type": "text", "text": "All done. The directory has three files."}]}"#,
    "\n",
);

async fn fake(sglang: bool) -> FakeServer {
    let backing = Arc::new(scripted(TEXT_SCRIPT, options("scripted")));
    let options = FakeOptions {
        chat: Some(ChatBackend {
            model: model(),
            format: OutputFormat::test_model(),
        }),
        ..FakeOptions::default()
    };
    let fake = if sglang {
        FakeServer::sglang(backing, options).await
    } else {
        FakeServer::vllm(backing, options).await
    };
    fake.expect("the fake binds")
}

#[tokio::test]
async fn chat_completions_answer_the_scripted_text() {
    for sglang in [true, false] {
        let fake = fake(sglang).await;
        let url = format!("{}/v1/chat/completions", fake.url());
        let body = json!({
            "model": "test-model",
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "List the files."}],
            "max_tokens": 200,
        });
        let (status, text) = http("POST", &url, &body.to_string()).await;
        assert_eq!(status, 200, "{text}");
        let answer: Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(answer["object"], "chat.completion");
        assert_eq!(answer["model"], "test-model");
        assert_eq!(answer["choices"][0]["message"]["content"], FINAL_TEXT);
        assert_eq!(answer["choices"][0]["finish_reason"], "stop");
        let usage = &answer["usage"];
        assert!(usage["prompt_tokens"].as_u64().expect("a count") > 5);
        assert_eq!(
            usage["total_tokens"].as_u64(),
            Some(
                usage["prompt_tokens"].as_u64().expect("a count")
                    + usage["completion_tokens"].as_u64().expect("a count")
            )
        );

        let mut streaming = body.clone();
        streaming["stream"] = json!(true);
        streaming["stream_options"] = json!({"include_usage": true});
        let (status, text) = http("POST", &url, &streaming.to_string()).await;
        assert_eq!(status, 200, "{text}");
        let data = sse_data(&text);
        assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
        let chunks: Vec<Value> = data[..data.len() - 1]
            .iter()
            .map(|chunk| serde_json::from_str(chunk).expect("JSON chunks"))
            .collect();
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        let content: String = chunks
            .iter()
            .filter_map(|chunk| chunk["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(content, FINAL_TEXT);
        let finish = &chunks[chunks.len() - 2]["choices"][0];
        assert_eq!(finish["finish_reason"], "stop");
        let usage = &chunks[chunks.len() - 1];
        assert_eq!(usage["choices"], json!([]));
        assert!(
            usage["usage"]["completion_tokens"]
                .as_u64()
                .expect("a count")
                > 3
        );
        assert_eq!(fake.stats().chat_requests, 2);
    }
}

#[tokio::test]
async fn chat_completion_errors_use_openais_shape() {
    let fake = fake(true).await;
    let url = format!("{}/v1/chat/completions", fake.url());
    let (status, text) = http(
        "POST",
        &url,
        &json!({"model": "m", "messages": []}).to_string(),
    )
    .await;
    assert_eq!(status, 400);
    let error: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(error["error"]["type"], "invalid_request_error");

    let bare = FakeServer::sglang(
        Arc::new(scripted(TEXT_SCRIPT, options("scripted"))),
        FakeOptions::default(),
    )
    .await
    .expect("the fake binds");
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    let (status, _) = http(
        "POST",
        &format!("{}/v1/chat/completions", bare.url()),
        &body.to_string(),
    )
    .await;
    assert_eq!(status, 404, "no model, no chat endpoint");
}
