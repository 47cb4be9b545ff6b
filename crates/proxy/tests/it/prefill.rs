//! Anthropic's assistant prefill: a request whose last message is an assistant message has the
//! model continue that message (the prompt ends right after its text, as Hugging Face's
//! `continue_final_message` renders it), the answer is the continuation only, and the next
//! turn, whose history holds the prefill and the continuation as one assistant message,
//! extends the prefilled call with its tokens reused. OpenAI Chat's final assistant message is
//! history, as before.

use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::Request;
use gyre_event::{Event, EventBody, ExecutionId, ModelCallRecord};
use gyre_proxy::engine::scripted::ScriptedOptions;
use gyre_proxy::engine::PlaybackOptions;
use gyre_proxy::output::OutputFormat;
use gyre_proxy::server::session::{Sampled, Session};
use gyre_proxy::server::{router, AppState, RecordSink, ServerConfig};
use gyre_proxy::{Api, ChatModel, ChatRequest, Message, Role, SpecialTokens, ToolArgumentsForm};
use hyper::service::Service;
use serde_json::{json, Value};

use crate::support::reference_now;

const ASSISTANT_OPENS: &str = "<|im_start|>assistant\n";

fn model() -> ChatModel {
    crate::support::test_model()
}

/// `answer` as the engine samples it, ending the turn.
fn sampled(model: &ChatModel, answer: &str) -> Sampled {
    let text = format!("{answer}<|im_end|>");
    let ids = model.encode(&text).expect("encodes");
    let mut ends = Vec::new();
    let mut so_far = String::new();
    for id in &ids {
        so_far.push_str(&model.decode(&[*id]).expect("decodes"));
        ends.push(so_far.len() as u32);
    }
    Sampled {
        output_logprobs: vec![-0.25; ids.len()],
        output_ids: ids,
        output_ends: ends,
        output_text: text,
        ..Sampled::default()
    }
}

fn prefilled(api: Api) -> ChatRequest {
    let mut request = ChatRequest::new(api, "gyre-test");
    request.messages.push(Message::new(
        Role::User,
        "What is six times seven? Answer in one sentence. ".repeat(8),
    ));
    request
        .messages
        .push(Message::new(Role::Assistant, "The answer is"));
    request
}

#[test]
fn a_prefilled_answer_is_continued_and_the_next_turn_reuses_it() {
    let model = model();
    let mut session = Session::new(ExecutionId(31), &model);
    let mut request = prefilled(Api::Anthropic);
    let first = session
        .prepare(&model, &request, None, reference_now())
        .expect("prepares");
    assert!(first.continues_final_message);
    assert!(
        first
            .text
            .ends_with(&format!("{ASSISTANT_OPENS}The answer is")),
        "the prompt ends inside the prefill: {:?}",
        first.text
    );
    assert_eq!(
        first.context_ids[..],
        model.encode(&first.text).expect("encodes")[..],
        "the prompt's tokens are its text's"
    );
    let prompt_tokens = first.context_ids.len();
    let record = session
        .finish_call(first, sampled(&model, " 42."))
        .expect("finishes");
    session.record_committed(&record);
    let input = model.decode(&record.input_ids).expect("decodes");
    assert!(
        input.ends_with("The answer is"),
        "the record's input holds the prefill: {input:?}"
    );

    // A re-send of the prefilled request whose answer never arrived is answered from the log.
    let again = session
        .prepare(&model, &request, None, reference_now())
        .expect("prepares");
    let replay = again.replay.expect("the committed continuation replays");
    assert_eq!(replay.call, record.call);
    assert_eq!(replay.prompt_tokens, prompt_tokens);

    // The next turn holds the prefill and its continuation as one assistant message: the
    // prefilled call's prompt and answer are reused whole, and it is the record's parent.
    request.messages.pop();
    request
        .messages
        .push(Message::new(Role::Assistant, "The answer is 42."));
    request
        .messages
        .push(Message::new(Role::User, "And six times eight?"));
    let encoded_before = session.tokens_encoded;
    let second = session
        .prepare(&model, &request, None, reference_now())
        .expect("prepares");
    assert!(!second.continues_final_message);
    assert!(second.text.ends_with(ASSISTANT_OPENS), "{:?}", second.text);
    let whole_first = prompt_tokens + record.output_ids.len();
    assert!(
        second.reused_by_text >= whole_first,
        "reused {} of {whole_first}",
        second.reused_by_text
    );
    assert_eq!(second.tree_reused as usize, whole_first);
    assert_eq!(
        second.encoded + whole_first,
        second.context_ids.len(),
        "only the new turn is encoded"
    );
    assert_eq!(
        session.tokens_encoded - encoded_before,
        second.encoded as u64
    );
    let next = session
        .finish_call(second, sampled(&model, "48."))
        .expect("finishes");
    assert_eq!(next.parent_call, Some(record.call));
    assert_eq!(next.reused_prefix_tokens_count as usize, whole_first);
}

/// OpenAI Chat has no prefill: a final assistant message is history, and a new turn opens.
#[test]
fn a_final_assistant_message_in_chat_is_history() {
    let model = model();
    let mut session = Session::new(ExecutionId(32), &model);
    let prepared = session
        .prepare(&model, &prefilled(Api::OpenAiChat), None, reference_now())
        .expect("prepares");
    assert!(!prepared.continues_final_message);
    assert!(
        prepared
            .text
            .ends_with(&format!("The answer is<|im_end|>\n{ASSISTANT_OPENS}")),
        "{:?}",
        prepared.text
    );
}

/// A template that does not render the prefill's text as it is cannot continue it: the call
/// is refused (the server answers a 400), not answered as a new turn.
#[test]
fn a_template_that_cannot_continue_the_prefill_refuses_it() {
    let test_model = model();
    let template = "{%- for message in messages %}<|im_start|>{{ message.role }}\n\
                    {{ message.content | upper }}<|im_end|>\n{%- endfor %}\
                    {%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}";
    let model = ChatModel::from_parts(
        test_model.tokenizer().clone(),
        template,
        SpecialTokens::default(),
        ToolArgumentsForm::RawText,
    )
    .expect("the template compiles");
    let mut session = Session::new(ExecutionId(33), &model);
    let error = session
        .prepare(&model, &prefilled(Api::Anthropic), None, reference_now())
        .expect_err("refused");
    assert!(
        error
            .to_string()
            .contains("cannot continue a final assistant message"),
        "{error}"
    );
}

/// A sink that keeps the records it commits.
#[derive(Default)]
struct Records(Mutex<Vec<ModelCallRecord>>);

impl RecordSink for Records {
    fn commit(
        &self,
        events: Vec<Event>,
    ) -> futures_util::future::BoxFuture<'static, Result<(), gyre_proxy::server::CommitFailure>>
    {
        for event in events {
            if let EventBody::ModelCall(record) = event.body {
                self.0.lock().expect("not poisoned").push(*record);
            }
        }
        Box::pin(async { Ok(()) })
    }

    fn describe(&self) -> String {
        "memory".into()
    }
}

async fn post(state: &Arc<AppState>, path: &str, body: &Value) -> (u16, Value) {
    let service = hyper_util::service::TowerToHyperService::new(router(state.clone()));
    let request = Request::builder()
        .method("POST")
        .uri(path)
        .header("content-type", "application/json")
        .header("anthropic-version", "2023-06-01")
        .body(Body::from(body.to_string()))
        .expect("a request");
    let answer = async {
        let response = service.call(request).await.expect("infallible");
        let status = response.status().as_u16();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .expect("body");
        (status, serde_json::from_slice(&bytes).expect("a JSON body"))
    };
    tokio::time::timeout(std::time::Duration::from_secs(60), answer)
        .await
        .expect("answered within 60 s")
}

/// Through the server: the answer is the continuation only, a tool call after the prefilled
/// text included; the record's input holds the prefill; the next turn extends the call.
#[tokio::test]
async fn the_server_answers_a_prefill_with_its_continuation() {
    let script = concat!(
        r#"{"agent": "main", "blocks": [{"type": "text", "text": " 42. Let me check."}, {"type": "tool_use", "name": "Bash", "input": {"command": "echo $((6*7))"}}]}"#,
        "\n",
        r#"{"agent": "main", "blocks": [{"type": "text", "text": "Checked: 42."}]}"#,
        "\n",
    );
    let engine = crate::engine_support::scripted(
        script,
        ScriptedOptions {
            playback: PlaybackOptions {
                chunk_tokens: 3,
                ..PlaybackOptions::default()
            },
            ..ScriptedOptions::default()
        },
    );
    let records = Arc::new(Records::default());
    let state = AppState::new(
        ServerConfig::default(),
        Arc::new(model()),
        OutputFormat::test_model(),
        vec![Arc::new(engine)],
        records.clone(),
    )
    .expect("state");
    let (_, token) = state.open_execution(None, None).expect("open");
    let path = format!("/x/{token}/v1/messages");
    let tools = json!([{"name": "Bash", "description": "Run a command.",
                        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}]);
    let question = json!({"role": "user", "content": "What is six times seven?"});
    let first = json!({"model": "m", "max_tokens": 200, "tools": tools, "messages": [
        question, {"role": "assistant", "content": [{"type": "text", "text": "The answer is"}]},
    ]});
    let (status, answer) = post(&state, &path, &first).await;
    assert_eq!(status, 200, "{answer}");
    let content = answer["content"].as_array().expect("content");
    assert_eq!(content.len(), 2, "{answer}");
    assert_eq!(content[0]["type"], "text");
    assert_eq!(
        content[0]["text"], " 42. Let me check.",
        "only the continuation"
    );
    assert_eq!(content[1]["type"], "tool_use", "{answer}");
    assert_eq!(content[1]["input"], json!({"command": "echo $((6*7))"}));
    assert_eq!(answer["stop_reason"], "tool_use");
    let first_record = records.0.lock().expect("not poisoned")[0].clone();
    let model = model();
    let input = model.decode(&first_record.input_ids).expect("decodes");
    assert!(
        input.ends_with(&format!("{ASSISTANT_OPENS}The answer is")),
        "{input:?}"
    );

    // The harness sends the prefill and the continuation back as one assistant message.
    let call_id = content[1]["id"].clone();
    let second = json!({"model": "m", "max_tokens": 200, "tools": tools, "messages": [
        question,
        {"role": "assistant", "content": [
            {"type": "text", "text": "The answer is 42. Let me check."},
            {"type": "tool_use", "id": call_id, "name": "Bash", "input": {"command": "echo $((6*7))"}},
        ]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id, "content": "42"}]},
    ]});
    let (status, answer) = post(&state, &path, &second).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["content"][0]["text"], "Checked: 42.");
    let second_record = records.0.lock().expect("not poisoned")[1].clone();
    assert_eq!(second_record.parent_call, Some(first_record.call));
    assert_eq!(
        second_record.reused_prefix_tokens_count as usize,
        first_record.input_ids.len() + first_record.output_ids.len(),
        "the prefilled call's prompt and answer are reused whole"
    );
    assert_eq!(
        answer["usage"]["cache_read_input_tokens"],
        second_record.reused_prefix_tokens_count
    );
}
