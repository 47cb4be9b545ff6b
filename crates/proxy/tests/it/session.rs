//! `Session::prepare` hands the agent's previous context buffers to the new prompt (cut to
//! the reused tokens, extended in place). Whatever the order of calls (two agents interleaved,
//! calls that fail after `prepare` and are never finished, new messages of any size), every
//! prepared prompt must be the exact tokens of its rendered text (the test model's answers are
//! canonical and end at a special token, so reuse and a fresh encode agree), and its ids JSON
//! must be those ids.

use gyre_event::ExecutionId;
use gyre_proxy::server::session::{Sampled, Session};
use gyre_proxy::{
    Api, ChatModel, ChatRequest, Message, RenderInput, Role, Tool, ToolArgumentsForm,
};
use proptest::prelude::*;

use crate::support::reference_now;

fn model() -> ChatModel {
    ChatModel::load(
        &gyre_proxy::test_model::directory(),
        ToolArgumentsForm::RawText,
    )
    .expect("the test model loads")
}

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

/// What happens around one call.
#[derive(Clone, Copy, Debug)]
enum Turn {
    /// The answer is re-sent as it was sampled.
    Plain,
    /// The call fails after `prepare` (no answer, nothing added to the history).
    Fails,
    /// The harness re-sends a different text than the model sampled.
    Rewritten,
    /// The harness drops the last exchange before asking (an edit, a branch).
    Rewind,
    /// The harness sends its tool list with the schema's keys in the other order (`==` on
    /// JSON objects ignores order; the rendered text does not).
    ToolsReordered,
    /// The harness stops sending tools (the template without tools renders).
    NoTools,
}

/// One step: which agent (0 main, 1 a sub-agent), how long its new user message is, and what
/// happens around the call.
fn step() -> impl Strategy<Value = (usize, usize, Turn)> {
    (
        0..2usize,
        0..400usize,
        prop_oneof![
            5 => Just(Turn::Plain),
            1 => Just(Turn::Fails),
            1 => Just(Turn::Rewritten),
            1 => Just(Turn::Rewind),
            1 => Just(Turn::ToolsReordered),
            1 => Just(Turn::NoTools),
        ],
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn prepared_prompts_are_the_exact_tokens_of_their_text(
        steps in proptest::collection::vec(step(), 1..14),
    ) {
        let model = model();
        let mut session = Session::new(ExecutionId(7), &model, 0);
        let agents = ["main", "explorer"];
        let mut histories: Vec<ChatRequest> = agents
            .iter()
            .map(|name| {
                let mut request = ChatRequest::new(Api::Anthropic, "gyre-test");
                request.messages.push(Message::new(Role::System, format!("You are {name}.")));
                request
            })
            .collect();
        for (call, (agent, size, turn)) in steps.into_iter().enumerate() {
            let request = &mut histories[agent];
            if matches!(turn, Turn::Rewind) && request.messages.len() >= 3 {
                request.messages.truncate(request.messages.len() - 2);
            }
            let a = r#""a":{"type":"string"}"#;
            let b = r#""b":{"type":"number","minimum":0}"#;
            let (first, second) = if matches!(turn, Turn::ToolsReordered) { (b, a) } else { (a, b) };
            request.tools = if matches!(turn, Turn::NoTools) {
                Vec::new()
            } else {
                let parameters: serde_json::Value = serde_json::from_str(&format!(
                    r#"{{"type":"object","properties":{{{first},{second}}}}}"#
                ))
                .expect("a schema");
                vec![Tool { name: "probe".into(), description: Some("Probes.".into()), parameters }]
            };
            let words: String = (0..size).map(|i| format!("w{} ", (i * 31 + call) % 97)).collect();
            request.messages.push(Message::new(Role::User, words));
            let prepared = session
                .prepare(&model, request, Some(agents[agent]), reference_now())
                .expect("prepares");
            let text = model
                .render(&RenderInput {
                    messages: &request.messages,
                    tools: &request.tools,
                    add_generation_prompt: true,
                    now: reference_now(),
                    extra: None,
                })
                .expect("renders");
            prop_assert_eq!(&prepared.text, &text);
            prop_assert_eq!(&*prepared.context_ids, &model.encode(&text).expect("encodes"));
            let mut json = Vec::new();
            prepared.context_json.write_array(&mut json);
            prop_assert_eq!(
                String::from_utf8(json).expect("ascii"),
                serde_json::to_string(&*prepared.context_ids).expect("serialises")
            );
            if matches!(turn, Turn::Fails) {
                // The engine failed: the prepared prompt is dropped, the harness retries later
                // with the same history.
                request.messages.pop();
                drop(prepared);
                continue;
            }
            let answer = format!("answer {call}");
            session.finish_call(prepared, sampled(&model, &answer)).expect("finishes");
            let re_sent = match turn {
                Turn::Rewritten => format!("a rewritten answer {call}"),
                _ => answer,
            };
            request.messages.push(Message::new(Role::Assistant, re_sent));
        }
    }
}

/// The second call of an agent reuses the first call's tokens instead of encoding them.
#[test]
fn a_growing_conversation_encodes_only_its_new_tokens() {
    let model = model();
    let mut session = Session::new(ExecutionId(8), &model, 0);
    let mut request = ChatRequest::new(Api::Anthropic, "gyre-test");
    request
        .messages
        .push(Message::new(Role::User, "first question ".repeat(50)));
    let first = session
        .prepare(&model, &request, None, reference_now())
        .expect("prepares");
    let first_len = first.context_ids.len();
    session
        .finish_call(first, sampled(&model, "first answer"))
        .expect("finishes");
    request
        .messages
        .push(Message::new(Role::Assistant, "first answer"));
    request.messages.push(Message::new(Role::User, "second"));
    let second = session
        .prepare(&model, &request, None, reference_now())
        .expect("prepares");
    assert!(
        second.reused_by_text > first_len,
        "reused {} of a first context of {first_len}",
        second.reused_by_text
    );
    assert!(second.encoded < 16, "encoded {}", second.encoded);
}
