//! The scripted engine: script errors name the line and field, rendered lines parse back
//! into exactly their blocks (tool input serialised once), agents and exhaustion, limits,
//! chunking, faults, and interrupted lines given back for the retry.

use gyre_proxy::engine::scripted::{render_blocks, ScriptedOptions, EXHAUSTED_TEXT};
use gyre_proxy::engine::{
    collect, EngineChunk, EngineFailure, Fault, FinishKind, PlaybackOptions, Script, ScriptBlock,
    ScriptedEngine, TokenEngine,
};
use gyre_proxy::output::{parse_output, OutputBlock, OutputEvent, OutputFormat, OutputParser};
use serde_json::json;

use crate::engine_support::{
    model, options, request, scripted, with_logprobs, within, FINAL_TEXT, SCRIPT,
};

fn parse_error(script: &str) -> (usize, String, String) {
    let error = Script::parse(script, None).expect_err("the script is malformed");
    (error.line, error.field, error.message)
}

#[test]
fn script_errors_name_the_line_and_field() {
    let cases: &[(&str, usize, &str)] = &[
        ("{\"agent\": \"main\", \"blocks\": []}\nnot json", 2, "line"),
        ("[1, 2]", 1, "line"),
        ("{\"agent\": \"boss\", \"blocks\": []}", 1, "agent"),
        ("{\"agent\": 3, \"blocks\": []}", 1, "agent"),
        ("{\"blocks\": []}", 1, "agent"),
        ("{\"agent\": \"main\"}", 1, "blocks"),
        ("{\"agent\": \"main\", \"blocks\": {}}", 1, "blocks"),
        ("{\"agent\": \"main\", \"blocks\": [], \"model\": \"x\"}", 1, "model"),
        (
            "\n\n{\"agent\": \"main\", \"blocks\": [{\"type\": \"text\", \"text\": \"a\"}, {\"type\": \"tool_use\", \"name\": \"x\", \"input\": \"ls\"}]}",
            3,
            "blocks[1].input",
        ),
        ("{\"agent\": \"main\", \"blocks\": [{\"type\": \"image\"}]}", 1, "blocks[0].type"),
        ("{\"agent\": \"main\", \"blocks\": [{\"text\": \"a\"}]}", 1, "blocks[0].type"),
        ("{\"agent\": \"main\", \"blocks\": [{\"type\": \"text\"}]}", 1, "blocks[0].text"),
        ("{\"agent\": \"main\", \"blocks\": [{\"type\": \"thinking\", \"thinking\": 1}]}", 1, "blocks[0].thinking"),
        ("{\"agent\": \"main\", \"blocks\": [{\"type\": \"tool_use\", \"input\": {}}]}", 1, "blocks[0].name"),
        ("{\"agent\": \"main\", \"blocks\": [{\"type\": \"text\", \"text\": \"a\", \"citations\": []}]}", 1, "blocks[0].citations"),
        ("{\"agent\": \"main\", \"blocks\": [7]}", 1, "blocks[0]"),
    ];
    for (script, line, field) in cases {
        let (got_line, got_field, message) = parse_error(script);
        assert_eq!(
            (got_line, got_field.as_str()),
            (*line, *field),
            "{script:?}: {message}"
        );
    }
    let error = Script::parse(
        "{\"agent\": \"main\", \"blocks\": 1}",
        Some("s.jsonl".as_ref()),
    )
    .expect_err("blocks is not an array");
    assert_eq!(
        error.to_string(),
        "s.jsonl:1: blocks: expected an array of content blocks"
    );
    // Accepted Anthropic extras on their blocks.
    let script = Script::parse(
        "{\"agent\": \"main\", \"blocks\": [{\"type\": \"thinking\", \"thinking\": \"t\", \"signature\": \"s\"}, {\"type\": \"tool_use\", \"id\": \"toolu_1\", \"name\": \"f\", \"input\": {}}]}",
        None,
    )
    .expect("signature and id are accepted");
    assert_eq!(script.lines[0].blocks.len(), 2);
}

#[test]
fn script_files_are_read_and_errors_carry_the_path() {
    let directory = tempfile::tempdir().expect("a temporary directory");
    let path = directory.path().join("script.jsonl");
    std::fs::write(&path, format!("{SCRIPT}{{\"agent\": \"sub\"}}\n")).expect("write the script");
    let error = Script::load(&path).expect_err("the last line has no blocks");
    assert_eq!((error.line, error.field.as_str()), (5, "blocks"));
    assert!(error
        .to_string()
        .starts_with(&format!("{}:5: blocks:", path.display())));
    let missing = Script::load(&directory.path().join("missing.jsonl")).expect_err("no file");
    assert_eq!((missing.line, missing.field.as_str()), (0, "file"));
}

#[test]
fn lines_the_format_cannot_express_are_refused_at_construction() {
    let model = model();
    let cases: &[(&str, OutputFormat, &str)] = &[
        (
            "{\"agent\": \"main\", \"blocks\": [{\"type\": \"text\", \"text\": \"ok\"}]}\n{\"agent\": \"main\", \"blocks\": [{\"type\": \"thinking\", \"thinking\": \"t\"}]}",
            OutputFormat::chatml_plain(),
            "blocks[0]",
        ),
        (
            "{\"agent\": \"main\", \"blocks\": [{\"type\": \"text\", \"text\": \"ok\"}]}\n{\"agent\": \"main\", \"blocks\": [{\"type\": \"tool_use\", \"name\": \"f\", \"input\": {}}]}",
            OutputFormat::chatml_plain(),
            "blocks[0]",
        ),
        (
            "{\"agent\": \"main\", \"blocks\": [{\"type\": \"text\", \"text\": \"ok\"}]}\n{\"agent\": \"main\", \"blocks\": [{\"type\": \"text\", \"text\": \"a\"}, {\"type\": \"text\", \"text\": \"b\"}]}",
            OutputFormat::test_model(),
            "blocks",
        ),
        (
            "{\"agent\": \"main\", \"blocks\": [{\"type\": \"text\", \"text\": \"ok\"}]}\n{\"agent\": \"main\", \"blocks\": [{\"type\": \"text\", \"text\": \"a <think>b</think>\"}]}",
            OutputFormat::test_model(),
            "blocks",
        ),
    ];
    for (text, format, field) in cases {
        let script = Script::parse(text, None).expect("the script parses");
        let error = ScriptedEngine::new(&script, &model, format, ScriptedOptions::default())
            .expect_err("the line cannot be rendered faithfully");
        assert_eq!((error.line, error.field.as_str()), (2, *field), "{error}");
    }
}

fn expected_blocks(blocks: &[ScriptBlock]) -> Vec<OutputBlock> {
    blocks
        .iter()
        .map(|block| match block {
            ScriptBlock::Thinking(text) => OutputBlock::Reasoning(text.clone()),
            ScriptBlock::Text(text) => OutputBlock::Text(text.clone()),
            ScriptBlock::ToolUse { name, input } => OutputBlock::ToolCall {
                name: name.clone(),
                arguments: serde_json::to_string(input).expect("JSON values serialise"),
            },
        })
        .collect()
}

/// Streams every line and parses the output the way the server does (ids → text stream →
/// output parser), expecting exactly the script's blocks.
#[tokio::test]
async fn rendered_output_parses_back_into_the_scripts_blocks() {
    let script_text = concat!(
        r#"{"agent": "main", "blocks": [{"type": "thinking", "thinking": "Plan:\n1. read\n2. edit"}, {"type": "text", "text": "Reading café.txt — with \"quotes\"."}, {"type": "tool_use", "name": "Read", "input": {"path": "/tmp/café \"q\".txt", "limits": [1, 2.5, {"k": null, "z": true}], "a": "\n\t"}}, {"type": "tool_use", "name": "Bash", "input": {}}]}"#,
        "\n",
        r#"{"agent": "main", "blocks": [{"type": "tool_use", "name": "Glob", "input": {"pattern": "**/*.rs"}}]}"#,
        "\n",
        r#"{"agent": "main", "blocks": []}"#,
        "\n",
    );
    let model = model();
    for format in [OutputFormat::test_model(), OutputFormat::qwen()] {
        let script = Script::parse(&format!("{script_text}{SCRIPT}"), None).expect("parses");
        let engine =
            ScriptedEngine::new(&script, &model, &format, options("scripted")).expect("renders");
        for (index, line) in script.lines.iter().enumerate() {
            let agent = Some(line.agent.as_str());
            let collected = within(collect(
                within(engine.generate(request(&format!("r{index}"), agent)))
                    .await
                    .expect("starts"),
            ))
            .await;
            assert_eq!(collected.finish(), Some(FinishKind::Stop));
            let mut text_stream = model.text_stream();
            let mut parser = OutputParser::new(format.clone());
            let mut events = Vec::new();
            for &id in &collected.ids {
                if let Some(piece) = text_stream.push(id).expect("ids decode") {
                    events.extend(parser.push(&piece));
                }
            }
            events.extend(parser.finish());
            let mut blocks: Vec<OutputBlock> = Vec::new();
            for event in events {
                match event {
                    OutputEvent::ReasoningDelta(delta) => match blocks.last_mut() {
                        Some(OutputBlock::Reasoning(text)) => text.push_str(&delta),
                        _ => blocks.push(OutputBlock::Reasoning(delta)),
                    },
                    OutputEvent::ReasoningEnd => {
                        if !matches!(blocks.last(), Some(OutputBlock::Reasoning(_))) {
                            blocks.push(OutputBlock::Reasoning(String::new()));
                        }
                    }
                    OutputEvent::TextDelta(delta) => match blocks.last_mut() {
                        Some(OutputBlock::Text(text)) => text.push_str(&delta),
                        _ => blocks.push(OutputBlock::Text(delta)),
                    },
                    OutputEvent::ToolCall { name, arguments } => {
                        blocks.push(OutputBlock::ToolCall { name, arguments })
                    }
                }
            }
            assert_eq!(blocks, expected_blocks(&line.blocks), "line {}", line.line);
            let text = model.decode(&collected.ids).expect("decodes");
            assert_eq!(parse_output(&format, &text), expected_blocks(&line.blocks));
            assert!(text.ends_with("<|im_end|>"), "{text:?}");
        }
    }
}

#[test]
fn tool_input_is_serialised_once_in_the_models_syntax() {
    let blocks = vec![
        ScriptBlock::Thinking("t".into()),
        ScriptBlock::Text("x".into()),
        ScriptBlock::ToolUse {
            name: "Bash".into(),
            input: json!({"command": "echo \"hi\"", "timeout": 5}),
        },
    ];
    assert_eq!(
        render_blocks(&blocks, &OutputFormat::test_model()).expect("renders"),
        "<think>t</think>x<tool_call>{\"name\": \"Bash\", \"arguments\": {\"command\":\"echo \\\"hi\\\"\",\"timeout\":5}}</tool_call><|im_end|>"
    );
    let mut opened = OutputFormat::qwen();
    opened.reasoning_open_at_start = true;
    assert_eq!(
        render_blocks(&blocks[..2], &opened).expect("renders"),
        "t</think>x<|im_end|>"
    );
}

#[tokio::test]
async fn agents_read_their_own_queues_until_done() {
    let engine = scripted(SCRIPT, options("scripted"));
    let model = model();
    let text = |ids: &[u32]| model.decode(ids).expect("decodes");
    assert_eq!((engine.remaining("main"), engine.remaining("sub")), (2, 1));
    let sub = within(collect(
        engine
            .generate(request("s1", Some("agent-a1b2")))
            .await
            .expect("starts"),
    ))
    .await;
    assert!(text(&sub.ids).starts_with("Sub-agent report"));
    let first = within(collect(
        engine.generate(request("m1", None)).await.expect("starts"),
    ))
    .await;
    assert!(text(&first.ids).starts_with("<think>"));
    let second = within(collect(
        engine
            .generate(request("m2", Some("main")))
            .await
            .expect("starts"),
    ))
    .await;
    assert_eq!(text(&second.ids), format!("{FINAL_TEXT}<|im_end|>"));
    for (rid, agent) in [("m3", None), ("s2", Some("sub"))] {
        let done = within(collect(
            engine.generate(request(rid, agent)).await.expect("starts"),
        ))
        .await;
        assert_eq!(text(&done.ids), format!("{EXHAUSTED_TEXT}<|im_end|>"));
        assert_eq!(done.finish(), Some(FinishKind::Stop));
    }
    assert_eq!((engine.remaining("main"), engine.remaining("sub")), (0, 0));
}

#[tokio::test]
async fn limits_stop_ids_chunking_and_logprobs() {
    let engine = scripted(SCRIPT, options("scripted"));
    let first = engine.peek_ids("main");
    assert!(first.len() > 20);

    // A stop id inside the output ends it there, kept (and the line is consumed).
    let think_end = model().token_id("</think>").expect("</think> exists");
    let at = first
        .iter()
        .position(|&id| id == think_end)
        .expect("the line has reasoning");
    let mut stopping = request("r1", None);
    stopping.stop_token_ids.push(think_end);
    let collected = within(collect(engine.generate(stopping).await.expect("starts"))).await;
    assert_eq!(collected.ids, first[..=at]);
    assert_eq!(collected.finish(), Some(FinishKind::Stop));

    let second = engine.peek_ids("main");
    assert_ne!(second, first);
    let mut limited = request("r2", None);
    limited.max_new_tokens = 7;
    let collected = within(collect(engine.generate(limited).await.expect("starts"))).await;
    assert_eq!(collected.finish(), Some(FinishKind::Length));
    assert_eq!(collected.chunks_count, 3, "7 tokens in chunks of 3");
    assert!(collected
        .logprobs
        .iter()
        .all(|&logprob| (-3.0..0.0).contains(&logprob)));
    assert_eq!(
        (collected.ids, collected.logprobs),
        with_logprobs(&second[..7])
    );

    let one_chunk = ScriptedOptions {
        playback: PlaybackOptions {
            chunk_tokens: 10_000,
            ..PlaybackOptions::default()
        },
        ..options("big")
    };
    let engine = scripted(SCRIPT, one_chunk);
    let collected = within(collect(
        engine.generate(request("r3", None)).await.expect("starts"),
    ))
    .await;
    assert_eq!(collected.chunks_count, 1);
    assert_eq!((collected.ids, collected.logprobs), with_logprobs(&first));
}

#[tokio::test]
async fn faults_end_streams_and_give_the_line_back() {
    let engine = scripted(SCRIPT, options("scripted"));
    let full = engine.peek_ids("main");

    engine.inject(Fault::DieAfterTokens(4));
    let died = within(collect(
        engine.generate(request("r1", None)).await.expect("starts"),
    ))
    .await;
    assert_eq!(died.ids, full[..4]);
    assert!(
        matches!(died.failure(), Some(EngineFailure::Unreachable { engine, .. }) if engine == "scripted"),
        "{:?}",
        died.end
    );
    within(engine.wait_idle()).await;
    assert_eq!(engine.remaining("main"), 2, "the interrupted line is back");

    engine.inject(Fault::AbortAfterTokens(5));
    let aborted = within(collect(
        engine.generate(request("r2", None)).await.expect("starts"),
    ))
    .await;
    assert_eq!(aborted.ids, full[..5]);
    assert_eq!(aborted.finish(), Some(FinishKind::Abort));
    within(engine.wait_idle()).await;

    // A sibling (the failover destination) replays the same line in full.
    let sibling = engine.sibling(options("scripted-2"));
    let replayed = within(collect(
        sibling.generate(request("r3", None)).await.expect("starts"),
    ))
    .await;
    assert_eq!(replayed.finish(), Some(FinishKind::Stop));
    assert_eq!((replayed.ids, replayed.logprobs), with_logprobs(&full));
    assert_eq!(engine.remaining("main"), 1, "siblings share the queues");
}

#[tokio::test]
async fn aborts_and_drops_interrupt_at_a_known_point() {
    let engine = scripted(SCRIPT, options("scripted"));
    let full = engine.peek_ids("main");

    // One chunk of 3, then a stall: the abort lands at a known point.
    engine.inject(Fault::StallAfterTokens(3));
    let mut stream = engine.generate(request("r1", None)).await.expect("starts");
    let Some(Ok(EngineChunk::Tokens { ids, .. })) = within(stream.recv()).await else {
        panic!("the first chunk arrives");
    };
    assert_eq!(ids, full[..3]);
    let duplicate = engine
        .generate(request("r1", None))
        .await
        .expect_err("r1 is in flight");
    assert!(
        matches!(duplicate, EngineFailure::Rejected { .. }),
        "{duplicate}"
    );
    engine.abort("r1").await.expect("abort is accepted");
    engine
        .abort("unknown")
        .await
        .expect("unknown rids are not an error");
    let rest = within(collect(stream)).await;
    assert_eq!(rest.ids, Vec::<u32>::new());
    assert_eq!(rest.finish(), Some(FinishKind::Abort));
    within(engine.wait_idle()).await;
    assert_eq!(engine.remaining("main"), 2, "an aborted line is given back");

    engine.inject(Fault::StallAfterTokens(2));
    let mut stream = engine.generate(request("r2", None)).await.expect("starts");
    assert!(matches!(
        within(stream.recv()).await,
        Some(Ok(EngineChunk::Tokens { .. }))
    ));
    drop(stream);
    within(engine.wait_idle()).await;
    assert_eq!(engine.in_flight_count(), 0);
    assert_eq!(engine.remaining("main"), 2, "nothing was consumed");
    let rejected = engine
        .generate(gyre_proxy::engine::EngineRequest::new("r3", Vec::new(), 4))
        .await
        .expect_err("an empty prompt");
    assert!(matches!(rejected, EngineFailure::Rejected { .. }));
}
