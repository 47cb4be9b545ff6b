//! Helpers for the engine tests: the test model, a script with every block kind, the expected
//! stream of a scripted line, a bounded wait, and a minimal HTTP client for the fakes' wire.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use gyre_proxy::engine::scripted::ScriptedOptions;
use gyre_proxy::engine::{
    playback_logprob, EngineRequest, PlaybackOptions, Script, ScriptedEngine,
};
use gyre_proxy::output::OutputFormat;
use gyre_proxy::ChatModel;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::support;

/// Main agent: thinking, text and a tool call; a sub-agent line; a final main answer.
pub const SCRIPT: &str = concat!(
    r#"{"agent": "main", "blocks": [{"type": "thinking", "thinking": "The user wants the files listed; run ls first."}, {"type": "text", "text": "Let me look at the directory."}, {"type": "tool_use", "id": "toolu_01", "name": "Bash", "input": {"command": "ls -la /tmp/work", "description": "List files"}}]}"#,
    "\n",
    r#"{"agent": "sub", "blocks": [{"type": "text", "text": "Sub-agent report: three files, hello.txt among them."}]}"#,
    "\n\n",
    r#"{"agent": "main", "blocks": [{"type": "text", "text": "All done. The directory has three files."}]}"#,
    "\n",
);

/// The text of the last main line (what a text-only client sees).
pub const FINAL_TEXT: &str = "All done. The directory has three files.";

pub fn model() -> Arc<ChatModel> {
    Arc::new(support::test_model())
}

/// A scripted engine over `script` in the test model's format.
pub fn scripted(script: &str, options: ScriptedOptions) -> ScriptedEngine {
    let script = Script::parse(script, None).expect("the test script parses");
    ScriptedEngine::new(&script, &model(), &OutputFormat::test_model(), options)
        .expect("the test script renders")
}

/// Small chunks so every stream has several.
pub fn options(name: &str) -> ScriptedOptions {
    ScriptedOptions {
        name: name.into(),
        playback: PlaybackOptions {
            chunk_tokens: 3,
            ..PlaybackOptions::default()
        },
        fault: None,
    }
}

/// A prompt in the test model's chat format.
pub fn prompt_ids() -> Vec<u32> {
    model()
        .encode("<|im_start|>user\nList the files.<|im_end|>\n<|im_start|>assistant\n")
        .expect("the prompt encodes")
}

/// A request for `agent` with room for any script line, stopping at `<|im_end|>`.
pub fn request(rid: &str, agent: Option<&str>) -> EngineRequest {
    let mut request = EngineRequest::new(rid, prompt_ids(), 4096);
    request.agent = agent.map(str::to_string);
    request.stop_token_ids = vec![model().token_id("<|im_end|>").expect("im_end exists")];
    request.temperature = 0.7;
    request.top_p = 0.95;
    request
}

/// The ids and log-probs the in-process engines stream for `ids`.
pub fn with_logprobs(ids: &[u32]) -> (Vec<u32>, Vec<f32>) {
    let logprobs = ids
        .iter()
        .enumerate()
        .map(|(position, &id)| playback_logprob(position, id))
        .collect();
    (ids.to_vec(), logprobs)
}

/// Fails the test instead of hanging when `future` does not finish in time.
pub async fn within<F: Future>(future: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(20), future)
        .await
        .expect("the engine test finished in time")
}

/// Sends a request to a fake and returns the status and the whole body.
pub async fn http(method: &str, url: &str, body: &str) -> (u16, String) {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let request = hyper::Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("a valid request");
    let response = client.request(request).await.expect("the fake answers");
    let status = response.status().as_u16();
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("the body arrives whole")
        .to_bytes();
    (
        status,
        String::from_utf8(bytes.to_vec()).expect("utf-8 body"),
    )
}

/// The `data:` payloads of an SSE body.
pub fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|event| event.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}
