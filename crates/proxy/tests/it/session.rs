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
    /// The harness never got the last answer of this agent and sends its request again.
    Resend,
    /// The call is answered but its record is not committed (the sink failed): the harness
    /// gets an error and will send the same request again.
    CommitFails,
    /// The harness received the last answer of this agent whole and asks the same again on
    /// purpose: a new question, sampled anew.
    ReAsk,
    /// A harness side call under the agent's name with its own conversation (Claude Code's
    /// WebFetch summariser): the agent's own conversation goes on after it.
    SideCall,
}

/// An agent's last finished call, as the test tracks it.
#[derive(Clone)]
struct LastCall {
    call: gyre_event::CallId,
    delivered: bool,
    prompt: String,
    answer: String,
    output_ids: Vec<u32>,
    committed: bool,
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
            2 => Just(Turn::Resend),
            1 => Just(Turn::CommitFails),
            1 => Just(Turn::ReAsk),
            2 => Just(Turn::SideCall),
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
        let mut session = Session::new(ExecutionId(7), &model);
        let agents = ["main", "explorer"];
        // Each agent's last finished call while its context is intact (a call that fails after
        // `prepare` empties it).
        let mut last: [Option<LastCall>; 2] = [None, None];
        // The agent whose last call got an error: its next step sends the same request.
        let mut owed: [bool; 2] = [false, false];
        let mut histories: Vec<ChatRequest> = agents
            .iter()
            .map(|name| {
                let mut request = ChatRequest::new(Api::Anthropic, "gyre-test");
                request.messages.push(Message::new(Role::System, format!("You are {name}.")));
                request
            })
            .collect();
        // Side calls of each agent since its own last call: at most two in a row here (the
        // agent's set-aside context is kept through two; after more it may be dropped, and
        // then a re-send is sampled anew).
        let mut side_calls = [0u32; 2];
        for (call, (agent, size, turn)) in steps.into_iter().enumerate() {
            let turn = if matches!(turn, Turn::SideCall) && side_calls[agent] >= 2 {
                Turn::Plain
            } else {
                turn
            };
            if matches!(turn, Turn::SideCall) {
                let mut side = ChatRequest::new(Api::Anthropic, "gyre-test");
                side.messages.push(Message::new(Role::System, "Summarise the page."));
                let words: String = (0..size).map(|i| format!("p{} ", (i * 7 + call) % 89)).collect();
                side.messages.push(Message::new(Role::User, format!("page {call}: {words}")));
                let prepared = session
                    .prepare(&model, &side, Some(agents[agent]), reference_now())
                    .expect("prepares");
                prop_assert!(prepared.replay.is_none());
                prop_assert_eq!(&*prepared.context_ids, &model.encode(&prepared.text).expect("encodes"));
                let record = session
                    .finish_call(prepared, sampled(&model, &format!("summary {call}")))
                    .expect("finishes");
                session.record_committed(&record);
                side_calls[agent] += 1;
                continue;
            }
            side_calls[agent] = 0;
            let request = &mut histories[agent];
            let resend = owed[agent]
                || (matches!(turn, Turn::Resend | Turn::ReAsk) && last[agent].is_some());
            if resend && !owed[agent] && matches!(turn, Turn::ReAsk) {
                let delivered = last[agent].as_mut().expect("a last call");
                session.mark_delivered(agents[agent], delivered.call, true);
                delivered.delivered = true;
            }
            if resend {
                // The same request again: without the answer the harness never received.
                if !owed[agent] {
                    request.messages.pop();
                }
                owed[agent] = false;
            } else if matches!(turn, Turn::Rewind) && request.messages.len() >= 3 {
                request.messages.truncate(request.messages.len() - 2);
            }
            if !resend {
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
            }
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
            // A re-send is answered from the record exactly when the agent's last call is
            // committed, its answer was not delivered, and this is its prompt again.
            let expected = last[agent]
                .as_ref()
                .filter(|call| call.committed && !call.delivered && call.prompt == text);
            prop_assert_eq!(prepared.replay.is_some(), expected.is_some(), "{:?}", turn);
            if let (Some(replay), Some(expected)) = (&prepared.replay, expected) {
                prop_assert_eq!(&replay.output_ids, &expected.output_ids);
                prop_assert_eq!(prepared.encoded, 0);
                prop_assert!(session.finish_call(prepared, sampled(&model, "x")).is_err());
                request.messages.push(Message::new(Role::Assistant, expected.answer.clone()));
                continue;
            }
            prop_assert_eq!(&*prepared.context_ids, &model.encode(&text).expect("encodes"));
            let mut json = Vec::new();
            prepared.context_json.write_array(&mut json);
            prop_assert_eq!(
                String::from_utf8(json).expect("ascii"),
                serde_json::to_string(&*prepared.context_ids).expect("serialises")
            );
            if matches!(turn, Turn::Fails) {
                // The engine failed: the prepared prompt goes back to its agent (as the call's
                // lease does), the harness retries later with the same history.
                request.messages.pop();
                session.give_back(prepared);
                last[agent] = None;
                continue;
            }
            let answer = format!("answer {call}");
            let record = session.finish_call(prepared, sampled(&model, &answer)).expect("finishes");
            let committed = !matches!(turn, Turn::CommitFails);
            if committed {
                session.record_committed(&record);
            }
            last[agent] = Some(LastCall {
                call: record.call,
                delivered: false,
                prompt: text,
                answer: answer.clone(),
                output_ids: record.output_ids,
                committed,
            });
            if !committed {
                // The harness got an error: its next call of this agent is the same request.
                owed[agent] = true;
                continue;
            }
            let re_sent = match turn {
                Turn::Rewritten => format!("a rewritten answer {call}"),
                _ => answer,
            };
            request.messages.push(Message::new(Role::Assistant, re_sent));
        }
    }
}

/// The second call of an agent reuses the first call's tokens instead of encoding them.
/// A session after one finished, committed turn, and the request of the second turn (the
/// first answer and a new question appended); also the first prompt's length in tokens.
fn after_a_first_turn(model: &ChatModel) -> (Session, ChatRequest, usize) {
    let mut session = Session::new(ExecutionId(8), model);
    let mut request = ChatRequest::new(Api::Anthropic, "gyre-test");
    request
        .messages
        .push(Message::new(Role::User, "first question ".repeat(50)));
    let first = session
        .prepare(model, &request, None, reference_now())
        .expect("prepares");
    let first_len = first.context_ids.len();
    let record = session
        .finish_call(first, sampled(model, "first answer"))
        .expect("finishes");
    session.record_committed(&record);
    request
        .messages
        .push(Message::new(Role::Assistant, "first answer"));
    request.messages.push(Message::new(Role::User, "second"));
    (session, request, first_len)
}

#[test]
fn a_growing_conversation_encodes_only_its_new_tokens() {
    let model = model();
    let (mut session, request, first_len) = after_a_first_turn(&model);
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

/// A call that fails after `prepare` (the harness went away, every engine failed) gives its
/// prompt's tokens back to the agent: the retry encodes only what is new again, rather than the
/// whole conversation with its sampled answers (whose tokens a fresh encode may not give back).
#[test]
fn a_failed_calls_retry_reuses_its_prompt_tokens() {
    let model = model();
    let (mut session, mut request, _) = after_a_first_turn(&model);
    let failed = session
        .prepare(&model, &request, None, reference_now())
        .expect("prepares");
    let prompt = failed.context_ids.clone();
    session.give_back(failed);
    let retry = session
        .prepare(&model, &request, None, reference_now())
        .expect("prepares");
    assert_eq!(retry.context_ids, prompt, "the same prompt tokens");
    assert!(retry.encoded < 16, "encoded {} again", retry.encoded);
    // Two calls of the agent in flight together: the one that finishes keeps its context, and
    // the other's late give-back leaves it alone.
    let overlapping = session
        .prepare(&model, &request, None, reference_now())
        .expect("prepares");
    let record = session
        .finish_call(retry, sampled(&model, "second answer"))
        .expect("finishes");
    session.record_committed(&record);
    session.give_back(overlapping);
    request
        .messages
        .push(Message::new(Role::Assistant, "second answer"));
    request.messages.push(Message::new(Role::User, "third"));
    let third = session
        .prepare(&model, &request, None, reference_now())
        .expect("prepares");
    assert!(third.encoded < 16, "encoded {}", third.encoded);
}

/// A call the harness marks as a compaction in its headers is a summary call even when its
/// instructions carry none of the known compaction wordings; an unmarked one is a turn.
#[test]
fn a_harness_marked_compaction_is_a_summary_call() {
    use gyre_event::CallKind;
    let model = model();
    let mut session = Session::new(ExecutionId(9), &model);
    let mut request = ChatRequest::new(Api::OpenAiResponses, "gyre-test");
    request
        .messages
        .push(Message::new(Role::User, "Condense everything so far."));
    let plain = session
        .prepare(&model, &request, None, reference_now())
        .expect("prepares");
    assert_eq!(plain.kind, CallKind::Turn);
    request.harness_compaction = true;
    let marked = session
        .prepare(&model, &request, None, reference_now())
        .expect("prepares");
    assert_eq!(marked.kind, CallKind::Summary);
}

/// A session rebuilt from its records (a proxy restart) prepares the next request of every
/// agent exactly as the session that recorded them: same tokens, same reuse, same parent, and
/// the tool-call text and reasoning behind the ids the proxy minted are restored.
#[test]
fn a_session_rebuilt_from_its_records_prepares_what_the_original_would() {
    use gyre_proxy::messages::Reasoning;
    use gyre_proxy::output::OutputFormat;
    use gyre_proxy::server::output_ids::OutputIds;
    use gyre_proxy::ToolCall;

    let model = model();
    let format = OutputFormat::test_model();
    let mut live = Session::new(ExecutionId(11), &model);
    let mut records = Vec::new();
    let mut histories: Vec<(Option<&str>, ChatRequest)> = [None, Some("sub:explorer")]
        .into_iter()
        .map(|agent| {
            let mut request = ChatRequest::new(Api::Anthropic, "gyre-test");
            request
                .messages
                .push(Message::new(Role::System, "You are careful."));
            (agent, request)
        })
        .collect();
    let arguments = r#"{"zeta": 1, "alpha": "x\u00e9"}"#;
    for round in 0..3u64 {
        for (slot, (agent, request)) in histories.iter_mut().enumerate() {
            request
                .messages
                .push(Message::new(Role::User, format!("step {round} of {slot}")));
            // As the server does with every request: the exact reasoning and arguments back
            // first (the history then extends the agent's last context; one that diverged
            // early would be set aside live, which a rebuilt session cannot know).
            let mut restored = request.clone();
            live.restore(&mut restored);
            let prepared = live
                .prepare(&model, &restored, *agent, reference_now())
                .expect("prepares");
            let mut ids = OutputIds::new(
                ExecutionId(11),
                &prepared.agent,
                prepared.context_ids.len() as u64,
            );
            let reasoning = format!("think {round}");
            let answer = format!(
                "<think>{reasoning}</think><tool_call>{{\"name\": \"probe\", \"arguments\": {arguments}}}</tool_call>"
            );
            let sampled = sampled(&model, &answer);
            // What the server does while streaming: mint each id when its block ends (the
            // output up to the closing tag's token), fill the caches.
            let upto = |tag: &str| {
                let tag = model
                    .token_id(tag)
                    .expect("the closing tags are single tokens");
                let at = sampled
                    .output_ids
                    .iter()
                    .position(|id| *id == tag)
                    .expect("tag");
                &sampled.output_ids[..=at]
            };
            let handle = ids.next_reasoning(upto("</think>"));
            let call_id = ids.next_tool_call(Api::Anthropic, upto("</tool_call>"));
            live.remember_reasoning(&handle, &reasoning);
            live.remember_tool_call(&call_id, arguments);
            let record = live.finish_call(prepared, sampled).expect("finishes");
            live.record_committed(&record);
            records.push(record);
            // The harness re-sends the output with the arguments re-serialised.
            let mut message = Message::new(Role::Assistant, "");
            message.reasoning.push(Reasoning {
                text: String::new(),
                handle: Some(handle),
                redacted: true,
            });
            message.tool_calls.push(ToolCall {
                id: call_id.clone(),
                name: "probe".into(),
                arguments: r#"{"alpha":"xé","zeta":1}"#.into(),
            });
            request.messages.push(message);
            let mut result = Message::new(Role::Tool, "ok");
            result.tool_call_id = Some(call_id);
            request.messages.push(result);
        }
    }
    let mut rebuilt = Session::new(ExecutionId(11), &model);
    for record in &records {
        rebuilt
            .recover_record(record, &model, &format)
            .expect("every record folds");
    }
    rebuilt.finish_recovery(&model).expect("contexts rebuild");
    assert_eq!(rebuilt.tree, live.tree);
    assert_eq!(rebuilt.calls(), live.calls());
    for (agent, request) in &histories {
        let mut for_live = request.clone();
        let mut for_rebuilt = request.clone();
        assert_eq!(live.restore(&mut for_live), 6);
        assert_eq!(
            rebuilt.restore(&mut for_rebuilt),
            6,
            "every tool call and reasoning block is restored after the rebuild"
        );
        assert_eq!(for_live, for_rebuilt);
        let expected = live
            .prepare(&model, &for_live, *agent, reference_now())
            .expect("prepares");
        let got = rebuilt
            .prepare(&model, &for_rebuilt, *agent, reference_now())
            .expect("prepares");
        assert_eq!(got.context_ids, expected.context_ids);
        assert_eq!(got.tree_reused, expected.tree_reused);
        assert_eq!(got.reused_by_text, expected.reused_by_text, "{agent:?}");
        assert_eq!(got.encoded, expected.encoded);
        assert_eq!(got.spawned_by, expected.spawned_by);
        assert_eq!(got.kind, expected.kind);
    }
    assert_eq!(rebuilt.sampled_divergences, 0);
}

/// What the server makes of an answer that a stop sequence cuts: every token through the one
/// that completes `stop`, the text before `stop` (what the harness gets), ends clamped to it.
fn sampled_stopped(model: &ChatModel, answer: &str, stop: &str) -> Sampled {
    let ids = model.encode(answer).expect("encodes");
    let cut = answer
        .find(stop)
        .expect("the answer holds the stop sequence");
    let mut kept = Vec::new();
    let mut ends = Vec::new();
    let mut so_far = String::new();
    for id in &ids {
        so_far.push_str(&model.decode(&[*id]).expect("decodes"));
        kept.push(*id);
        ends.push(so_far.len().min(cut) as u32);
        if so_far.len() >= cut + stop.len() {
            break;
        }
    }
    Sampled {
        output_logprobs: vec![-0.5; kept.len()],
        output_ids: kept,
        output_ends: ends,
        output_text: answer[..cut].to_string(),
        stop_sequences: vec!["never".to_string(), stop.to_string()],
        ..Sampled::default()
    }
}

/// Calls that a stop sequence cut keep their stop sequences in the record, so a session
/// rebuilt after a restart cuts those outputs where the harness saw them end: the next turn
/// (which sends the cut text back) extends every sampled token, through two cut calls in a
/// row, exactly as the live session does.
#[test]
fn a_rebuilt_session_cuts_stopped_outputs_where_the_harness_saw_them_end() {
    use gyre_proxy::output::OutputFormat;

    let model = model();
    let mut live = Session::new(ExecutionId(14), &model);
    let mut request = ChatRequest::new(Api::Anthropic, "gyre-test");
    request.messages.push(Message::new(
        Role::User,
        "Think aloud, then stop.".repeat(4),
    ));
    let mut records = Vec::new();
    for round in 0..2 {
        let prepared = live
            .prepare(&model, &request, None, reference_now())
            .expect("prepares");
        let answer = format!("Thought {round}: look around.\nObservation: more text");
        let sampled = sampled_stopped(&model, &answer, "\nObservation:");
        let seen = sampled.output_text.clone();
        let record = live.finish_call(prepared, sampled).expect("finishes");
        assert_eq!(record.stop_sequences.len(), 2, "the record keeps the stops");
        live.record_committed(&record);
        records.push(record);
        request.messages.push(Message::new(Role::Assistant, seen));
        request.messages.push(Message::new(
            Role::User,
            format!("Observation {round}: a file."),
        ));
    }
    let mut rebuilt = Session::new(ExecutionId(14), &model);
    for record in &records {
        rebuilt
            .recover_record(record, &model, &OutputFormat::test_model())
            .expect("every record folds");
    }
    rebuilt.finish_recovery(&model).expect("contexts rebuild");
    let expected = live
        .prepare(&model, &request, None, reference_now())
        .expect("prepares");
    let got = rebuilt
        .prepare(&model, &request, None, reference_now())
        .expect("prepares");
    assert_eq!(got.context_ids, expected.context_ids);
    assert_eq!(got.tree_reused, expected.tree_reused);
    let cut_call = &records[1];
    assert_eq!(
        got.tree_reused,
        cut_call.reused_prefix_tokens_count
            + (cut_call.input_ids.len() + cut_call.output_ids.len()) as u64,
        "the turn extends every token of the cut call"
    );
    assert_eq!(got.reused_by_text, expected.reused_by_text);
    assert_eq!(got.encoded, expected.encoded);
    assert_eq!(rebuilt.sampled_divergences, 0);
    assert_eq!(live.sampled_divergences, 0);
}

/// A harness that re-sends a call whose answer it never received (the proxy was killed, or
/// the connection dropped, after the record was committed) gets the committed answer again:
/// `prepare` says so, takes nothing from the agent's context and records nothing; the next
/// real turn still reuses the whole context. A session rebuilt from the records (a restart)
/// does the same.
#[test]
fn a_re_sent_call_replays_its_committed_answer() {
    use gyre_proxy::output::OutputFormat;

    let model = model();
    let mut session = Session::new(ExecutionId(12), &model);
    let mut request = ChatRequest::new(Api::Anthropic, "gyre-test");
    request
        .messages
        .push(Message::new(Role::User, "a question ".repeat(40)));
    let first = session
        .prepare(&model, &request, None, reference_now())
        .expect("prepares");
    assert!(first.replay.is_none());
    let prompt = first.context_ids.clone();
    let record = session
        .finish_call(first, sampled(&model, "the answer"))
        .expect("finishes");
    // Not before the sink confirms the record: until then a re-send is a new call.
    let mut unconfirmed = Session::new(ExecutionId(13), &model);
    let call = unconfirmed
        .prepare(&model, &request, None, reference_now())
        .expect("prepares");
    unconfirmed
        .finish_call(call, sampled(&model, "the answer"))
        .expect("finishes");
    let resent = unconfirmed
        .prepare(&model, &request, None, reference_now())
        .expect("prepares");
    assert!(
        resent.replay.is_none(),
        "an uncommitted answer is never replayed"
    );
    session.record_committed(&record);
    let again = session
        .prepare(&model, &request, None, reference_now())
        .expect("prepares");
    let replay = again.replay.clone().expect("the same prompt replays");
    assert_eq!(replay.call, record.call);
    assert_eq!(replay.output_ids, record.output_ids);
    assert_eq!(replay.output_logprobs, record.output_logprobs);
    assert_eq!(
        replay.prompt_tokens,
        prompt.len(),
        "usage and ids are of the same prompt"
    );
    assert_eq!(again.encoded, 0);
    assert!(
        session.finish_call(again, sampled(&model, "x")).is_err(),
        "a replayed call records nothing"
    );
    assert_eq!(session.calls(), 1);
    // The conversation goes on from the replayed answer: the whole context is reused.
    request
        .messages
        .push(Message::new(Role::Assistant, "the answer"));
    request.messages.push(Message::new(Role::User, "next"));
    let next = session
        .prepare(&model, &request, None, reference_now())
        .expect("prepares");
    assert!(next.replay.is_none());
    assert!(next.reused_by_text >= prompt.len() + record.output_ids.len());
    // After a restart, from the record alone.
    let mut rebuilt = Session::new(ExecutionId(12), &model);
    rebuilt
        .recover_record(&record, &model, &OutputFormat::test_model())
        .expect("folds");
    rebuilt.finish_recovery(&model).expect("contexts rebuild");
    request.messages.truncate(1);
    let after_restart = rebuilt
        .prepare(&model, &request, None, reference_now())
        .expect("prepares");
    // The same answer; which stop sequences it ran with is not in the record.
    assert_eq!(
        after_restart.replay,
        Some(gyre_proxy::server::session::Replay {
            stops: None,
            ..replay
        })
    );
    // A different question is a new call.
    request.messages[0] = Message::new(Role::User, "another question");
    let other = rebuilt
        .prepare(&model, &request, None, reference_now())
        .expect("prepares");
    assert!(other.replay.is_none());
}

/// A harness side call under the agent's name (Claude Code's WebFetch summariser: its own
/// system prompt, a page to summarise) shares little with the agent's conversation: the
/// conversation's context is set aside, not consumed, and the agent's next turn reuses all of
/// its own tokens instead of re-encoding its history (where re-tokenising sampled text could
/// drift from what the model produced).
#[test]
fn a_side_call_under_the_agents_name_does_not_cost_the_conversation_its_tokens() {
    let model = model();
    let mut session = Session::new(ExecutionId(9), &model);
    let (mut request, _, [record, _]) = first_turn_then_side_call(&mut session, &model);

    request
        .messages
        .push(Message::new(Role::User, "the summary, as a tool result"));
    let next = session
        .prepare(&model, &request, None, reference_now())
        .expect("prepares");
    assert_eq!(
        &*next.context_ids,
        &model.encode(&next.text).expect("encodes")
    );
    assert!(
        next.encoded < 40,
        "the conversation's history is reused, not re-encoded: encoded {} of {}",
        next.encoded,
        next.context_ids.len()
    );
    let record_next = committed(&mut session, &model, next, "second answer");
    assert_eq!(record_next.parent_call, Some(record.call));

    // The conversation goes on from its own context; the side call's is dropped after a few
    // calls that did not come back to it.
    request
        .messages
        .push(Message::new(Role::Assistant, "second answer"));
    for turn in 0..4 {
        request
            .messages
            .push(Message::new(Role::User, format!("turn {turn}")));
        let prepared = session
            .prepare(&model, &request, None, reference_now())
            .expect("prepares");
        assert!(
            prepared.encoded < 40,
            "turn {turn}: encoded {}",
            prepared.encoded
        );
        let answer = format!("answer {turn}");
        committed(&mut session, &model, prepared, &answer);
        request.messages.push(Message::new(Role::Assistant, answer));
    }
}

/// A restart right after a side call under the agent's name (Claude Code's WebFetch
/// summariser) must not cost the interrupted conversation its tokens: the rebuilt session
/// brings back the conversation's context as well as the side call's, so the next turn reuses
/// the history instead of re-encoding (and possibly re-tokenising differently) it.
#[test]
fn a_rebuilt_session_keeps_the_conversation_a_side_call_interrupted() {
    use gyre_proxy::output::OutputFormat;

    let model = model();
    let mut live = Session::new(ExecutionId(15), &model);
    let (mut request, mut side, records) = first_turn_then_side_call(&mut live, &model);

    let mut rebuilt = Session::new(ExecutionId(15), &model);
    for record in &records {
        rebuilt
            .recover_record(record, &model, &OutputFormat::test_model())
            .expect("every record folds");
    }
    rebuilt.finish_recovery(&model).expect("contexts rebuild");

    request
        .messages
        .push(Message::new(Role::User, "the summary, as a tool result"));
    let expected = live
        .prepare(&model, &request, None, reference_now())
        .expect("prepares");
    let got = rebuilt
        .prepare(&model, &request, None, reference_now())
        .expect("prepares");
    assert!(
        got.encoded < 40,
        "the conversation's history is reused after the restart, not re-encoded: encoded {} of {}",
        got.encoded,
        got.context_ids.len()
    );
    assert_eq!(got.context_ids, expected.context_ids);
    assert_eq!(got.tree_reused, expected.tree_reused);
    assert_eq!(got.encoded, expected.encoded);
    let record = committed(&mut rebuilt, &model, got, "second answer");
    assert_eq!(record.parent_call, Some(records[0].call));

    // The side call's own context came back as well: its next call (the summariser asked
    // again about the same page) reuses it.
    side.messages
        .push(Message::new(Role::Assistant, "a summary"));
    side.messages
        .push(Message::new(Role::User, "shorter, please"));
    let again = rebuilt
        .prepare(&model, &side, None, reference_now())
        .expect("prepares");
    assert!(
        again.encoded < 20,
        "the side call's context is reused: encoded {} of {}",
        again.encoded,
        again.context_ids.len()
    );
    let record = committed(&mut rebuilt, &model, again, "short");
    assert_eq!(record.parent_call, Some(records[1].call));
}

/// The agent's first turn, then a side call under its name (Claude Code's WebFetch
/// summariser: its own system prompt, a page to summarise), both committed. Returns the
/// conversation's request (ready for its next user message), the side call's request, and the
/// two records.
fn first_turn_then_side_call(
    session: &mut Session,
    model: &ChatModel,
) -> (ChatRequest, ChatRequest, [gyre_event::ModelCallRecord; 2]) {
    let mut request = ChatRequest::new(Api::Anthropic, "gyre-test");
    request
        .messages
        .push(Message::new(Role::System, "You are the main agent."));
    request
        .messages
        .push(Message::new(Role::User, "first question ".repeat(80)));
    let first = session
        .prepare(model, &request, None, reference_now())
        .expect("prepares");
    let first = committed(session, model, first, "first answer");
    request
        .messages
        .push(Message::new(Role::Assistant, "first answer"));
    request.messages.push(Message::new(Role::User, "fetch it"));

    let mut side = ChatRequest::new(Api::Anthropic, "gyre-test");
    side.messages
        .push(Message::new(Role::System, "Summarise the page."));
    side.messages
        .push(Message::new(Role::User, "page text ".repeat(40)));
    let summary = session
        .prepare(model, &side, None, reference_now())
        .expect("prepares");
    assert_eq!(
        &*summary.context_ids,
        &model.encode(&summary.text).expect("encodes")
    );
    let summary = committed(session, model, summary, "a summary");
    (request, side, [first, summary])
}

/// Finishes `prepared` with `answer` and commits its record, as the server does once the log
/// holds it.
fn committed(
    session: &mut Session,
    model: &ChatModel,
    prepared: gyre_proxy::server::session::Prepared,
    answer: &str,
) -> gyre_event::ModelCallRecord {
    let record = session
        .finish_call(prepared, sampled(model, answer))
        .expect("finishes");
    session.record_committed(&record);
    record
}

/// A harness naming a new agent on every call cannot grow the session without bound: beyond
/// 256 agent contexts the oldest is dropped (never the main agent's), and a dropped agent's
/// next call still prepares its exact tokens, encoded from scratch.
#[test]
fn agent_contexts_are_capped_and_a_dropped_agent_still_prepares_exactly() {
    let model = model();
    let mut session = Session::new(ExecutionId(9), &model);
    let call = |session: &mut Session, agent: Option<&str>, text: &str| {
        let mut request = ChatRequest::new(Api::Anthropic, "gyre-test");
        request.messages.push(Message::new(Role::User, text));
        let prepared = session
            .prepare(&model, &request, agent, reference_now())
            .expect("prepares");
        let ids = prepared.context_ids.clone();
        let record = session
            .finish_call(prepared, sampled(&model, "ok"))
            .expect("finishes");
        session.record_committed(&record);
        ids
    };
    call(&mut session, None, "the main conversation");
    for agent in 0..300 {
        call(
            &mut session,
            Some(&format!("side:{agent}")),
            &format!("question {agent}"),
        );
    }
    assert_eq!(session.agent_contexts_count(), 256);
    let again = call(&mut session, Some("side:0"), "question 0, again");
    let rendered = model
        .render(&RenderInput {
            messages: &[Message::new(Role::User, "question 0, again")],
            tools: &[],
            add_generation_prompt: true,
            now: reference_now(),
            extra: None,
        })
        .expect("renders");
    assert_eq!(*again, model.encode(&rendered).expect("encodes"));
    assert!(session.agent_contexts_count() <= 256);
}

/// A re-send of a committed call is replayed only when its bounds admit the committed answer:
/// a smaller token limit than the answer's length (a harness retrying a cut stream, asking for
/// less), or a new stop sequence the answer holds, is sampled anew instead of handing over an
/// answer past what the re-send asked for. A limit the answer fits, a stop it does not hold,
/// or the answer's own stop left out still replay.
#[test]
fn a_re_send_is_replayed_only_within_its_own_bounds() {
    let model = model();
    let session_with_answer = |id: u64| {
        let mut session = Session::new(ExecutionId(id), &model);
        let mut request = ChatRequest::new(Api::Anthropic, "gyre-test");
        request
            .messages
            .push(Message::new(Role::User, "a question ".repeat(40)));
        let first = session
            .prepare(&model, &request, None, reference_now())
            .expect("prepares");
        let mut answer = sampled(&model, "the whole answer, in many tokens");
        answer.stop_sequences = vec!["STOP".into()];
        let record = session.finish_call(first, answer).expect("finishes");
        session.record_committed(&record);
        (session, request, record.output_ids.len())
    };
    let replayed = |session: &mut Session, request: &ChatRequest| {
        session
            .prepare(&model, request, None, reference_now())
            .expect("prepares")
            .replay
            .is_some()
    };

    let (mut session, request, answer_tokens) = session_with_answer(20);
    assert!(answer_tokens > 3, "an answer of {answer_tokens} tokens");
    assert!(replayed(&mut session, &request), "no limit given");
    let mut bounded = request.clone();
    bounded.sampling.max_tokens = Some(answer_tokens as u32);
    assert!(
        replayed(&mut session, &bounded),
        "the answer fits the limit exactly"
    );
    let mut other_stop = request.clone();
    other_stop.sampling.stop = vec!["never in the answer".into()];
    assert!(
        replayed(&mut session, &other_stop),
        "a stop the answer does not hold"
    );
    let mut own_stop = request.clone();
    own_stop.sampling.stop = vec!["STOP".into()];
    assert!(replayed(&mut session, &own_stop), "the answer's own stop");
    let mut smaller = request.clone();
    smaller.sampling.max_tokens = Some(3);
    let anew = session
        .prepare(&model, &smaller, None, reference_now())
        .expect("prepares");
    assert!(
        anew.replay.is_none(),
        "an answer past the re-send's limit is sampled anew"
    );
    assert_eq!(
        &*anew.context_ids,
        &model.encode(&anew.text).expect("encodes"),
        "a prompt to sample from"
    );

    let (mut session, request, _) = session_with_answer(21);
    let mut cutting = request.clone();
    cutting.sampling.stop = vec!["answer".into()];
    assert!(
        !replayed(&mut session, &cutting),
        "a new stop sequence the answer holds would have cut it"
    );
}
