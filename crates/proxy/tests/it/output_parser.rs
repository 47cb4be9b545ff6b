//! The streaming output parser: blocks, malformed calls, limits, end of turn, held-back tags,
//! and independence from chunking (property test).

use gyre_proxy::output::{
    parse_output, EngineFinish, OutputBlock, OutputEvent, OutputFormat, OutputParser, StopReason,
};
use proptest::prelude::*;

fn text(value: &str) -> OutputBlock {
    OutputBlock::Text(value.into())
}

fn reasoning(value: &str) -> OutputBlock {
    OutputBlock::Reasoning(value.into())
}

fn call(name: &str, arguments: &str) -> OutputBlock {
    OutputBlock::ToolCall {
        name: name.into(),
        arguments: arguments.into(),
    }
}

#[test]
fn test_model_format_blocks() {
    let format = OutputFormat::test_model();
    let cases: Vec<(&str, Vec<OutputBlock>)> = vec![
        ("Hello!<|im_end|>", vec![text("Hello!")]),
        ("<think>a plan</think>Answer<|im_end|>ignored", vec![reasoning("a plan"), text("Answer")]),
        (
            "<think>p</think>Now:\n<tool_call>{\"name\": \"Bash\", \"arguments\": {\"b\":  2, \"a\": \"caf\\u00e9\"}}</tool_call><tool_call>{\"arguments\": {}, \"name\": \"Read\"}</tool_call><|im_end|>",
            vec![reasoning("p"), text("Now:\n"), call("Bash", "{\"b\":  2, \"a\": \"caf\\u00e9\"}"), call("Read", "{}")],
        ),
        (
            "<tool_call>{\"name\": \"x\", \"arguments\": \"not an object\"}</tool_call>",
            vec![text("<tool_call>{\"name\": \"x\", \"arguments\": \"not an object\"}</tool_call>")],
        ),
        ("<tool_call>{broken</tool_call>tail", vec![text("<tool_call>{broken</tool_call>tail")]),
        // The end tag inside a JSON string is the call's text (a call writing a template file).
        (
            "<tool_call>{\"name\": \"Write\", \"arguments\": {\"content\": \"a </tool_call> b\"}}</tool_call>done",
            vec![call("Write", "{\"content\": \"a </tool_call> b\"}"), text("done")],
        ),
        (
            "<tool_call>{\"name\": \"x\", \"arguments\": {\"s\": \"\\\"</tool_call>\\\\\"}}</tool_call>",
            vec![call("x", "{\"s\": \"\\\"</tool_call>\\\\\"}")],
        ),
        // The output stopped inside a call (the token limit, a stop sequence) whose end tag was
        // inside a string: a cut call with what was written of its arguments.
        (
            "<tool_call>{\"name\": \"x\", \"arguments\": {\"s\": \"open</tool_call>tail",
            vec![call("x", "{\"s\": \"open</tool_call>tail\"}")],
        ),
        ("<think>cut off by the limit", vec![reasoning("cut off by the limit")]),
        ("text <tool_call>{\"name\": \"x\"", vec![text("text "), call("x", "{}")]),
        (
            "<tool_call>{\"name\": \"Write\", \"arguments\": {\"path\": \"a.txt\", \"content\": \"hel",
            vec![call("Write", "{\"path\": \"a.txt\", \"content\": \"hel\"}")],
        ),
        ("<tool_call>{\"name\": \"x\", \"argu", vec![call("x", "{}")]),
        ("<tool_call>{\"name\": \"x\", \"arguments\": {\"a\": 1}}", vec![call("x", "{\"a\": 1}")]),
        // The name itself was cut, or the body is not name-first: not a call.
        ("<tool_call>{\"name\": \"Wri", vec![text("<tool_call>{\"name\": \"Wri")]),
        (
            "<tool_call>{\"arguments\": {\"a\": 1}, \"name\": \"x\"",
            vec![text("<tool_call>{\"arguments\": {\"a\": 1}, \"name\": \"x\"")],
        ),
        ("<tool_call>{\"name\":\"x\"<|im_end|>", vec![text("<tool_call>{\"name\":\"x\"")]),
        ("<think></think>", vec![reasoning("")]),
        ("a < b <th", vec![text("a < b <th")]),
        ("", vec![]),
        ("<|endoftext|>", vec![]),
    ];
    for (output, blocks) in cases {
        assert_eq!(parse_output(&format, output), blocks, "{output:?}");
    }
}

#[test]
fn qwen_format_trims_padding() {
    let format = OutputFormat::qwen();
    let output = "<think>\nplan\n\n</think>\n\nThe answer.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n</tool_call><|im_end|>";
    assert_eq!(
        parse_output(&format, output),
        vec![
            reasoning("plan"),
            text("The answer."),
            call("f", "{\"x\": 1}"),
            call("g", "{}")
        ]
    );
    let mut opened = OutputFormat::qwen();
    opened.reasoning_open_at_start = true;
    assert_eq!(
        parse_output(&opened, "\nplan\n</think>\n\nok"),
        vec![reasoning("plan"), text("ok")]
    );
}

#[test]
fn plain_format_is_text_until_end_of_turn() {
    let format = OutputFormat::chatml_plain();
    assert_eq!(
        parse_output(&format, "<think>not special here</think><|im_end|>"),
        vec![text("<think>not special here</think>")]
    );
}

#[test]
fn partial_tags_are_held_back_until_decided() {
    let mut parser = OutputParser::new(OutputFormat::test_model());
    assert_eq!(
        parser.push("Hi <thi"),
        vec![OutputEvent::TextDelta("Hi ".into())]
    );
    assert_eq!(
        parser.push("nk>r"),
        vec![OutputEvent::ReasoningDelta("r".into())]
    );
    assert_eq!(
        parser.push("</think><|im_e"),
        vec![OutputEvent::ReasoningEnd]
    );
    assert!(!parser.ended());
    assert_eq!(parser.push("nd|>more"), vec![]);
    assert!(parser.ended());
    assert_eq!(parser.finish(), vec![]);
}

#[test]
fn stop_reasons_map_to_each_api() {
    let cases = [
        (EngineFinish::EndOfTurn, false, "end_turn", "stop"),
        (EngineFinish::EndOfTurn, true, "tool_use", "tool_calls"),
        (EngineFinish::Length, true, "max_tokens", "length"),
        (
            EngineFinish::StopSequence("END".into()),
            false,
            "stop_sequence",
            "stop",
        ),
    ];
    for (finish, has_calls, anthropic, openai) in cases {
        let stop = StopReason::from_finish(&finish, has_calls);
        assert_eq!(stop.anthropic(), anthropic);
        assert_eq!(stop.openai_chat(), openai);
    }
}

/// Blocks from feeding `text` in the given chunks.
fn parse_chunked(format: &OutputFormat, text: &str, cuts: &[usize]) -> Vec<OutputBlock> {
    let mut parser = OutputParser::new(format.clone());
    let mut events = Vec::new();
    let mut start = 0;
    let mut boundaries: Vec<usize> = cuts
        .iter()
        .map(|cut| cut % (text.len() + 1))
        .filter(|cut| text.is_char_boundary(*cut))
        .collect();
    boundaries.sort_unstable();
    boundaries.push(text.len());
    for end in boundaries {
        if end >= start {
            events.extend(parser.push(&text[start..end]));
            start = end;
        }
    }
    events.extend(parser.finish());
    let mut blocks: Vec<OutputBlock> = Vec::new();
    let mut reasoning_open = false;
    for event in events {
        match event {
            OutputEvent::ReasoningDelta(delta) => match blocks.last_mut() {
                Some(OutputBlock::Reasoning(text)) if reasoning_open => text.push_str(&delta),
                _ => {
                    blocks.push(OutputBlock::Reasoning(delta));
                    reasoning_open = true;
                }
            },
            OutputEvent::ReasoningEnd => {
                if !reasoning_open {
                    blocks.push(OutputBlock::Reasoning(String::new()));
                }
                reasoning_open = false;
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
    blocks
}

/// Generated-looking text: a mix of words, whitespace, tags (whole and broken) and JSON.
fn output_text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("<think>".to_string()),
        Just("</think>".to_string()),
        Just("<tool_call>".to_string()),
        Just("</tool_call>".to_string()),
        Just("<|im_end|>".to_string()),
        Just(
            "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": [1, \"</x>\"]}}</tool_call>"
                .to_string()
        ),
        Just(
            "<tool_call>{\"name\": \"g\", \"arguments\": {\"a\": \"</tool_call>\\\"\"}}</tool_call>"
                .to_string()
        ),
        Just("\"".to_string()),
        Just("<thi".to_string()),
        Just("</tool".to_string()),
        Just("\n\n".to_string()),
        Just("  ".to_string()),
        Just("é😀".to_string()),
        "[a-z <>{}\":,\n]{0,12}",
    ];
    proptest::collection::vec(piece, 0..12).prop_map(|pieces| pieces.concat())
}

proptest! {
    #[test]
    fn chunking_never_changes_the_blocks(
        text in output_text(),
        cuts in proptest::collection::vec(0usize..400, 0..8),
        qwen in any::<bool>(),
    ) {
        let format = if qwen { OutputFormat::qwen() } else { OutputFormat::test_model() };
        prop_assert_eq!(parse_chunked(&format, &text, &cuts), parse_output(&format, &text));
    }

    #[test]
    fn without_trimming_every_byte_before_the_end_is_kept(text in output_text()) {
        // Text, reasoning and calls re-assembled with their tags give back the input (up to
        // the end-of-turn marker): the parser never drops or invents a byte.
        let format = OutputFormat::test_model();
        let visible = text.split("<|im_end|>").next().unwrap_or_default();
        let mut rebuilt = String::new();
        let blocks = parse_output(&format, &text);
        for (index, block) in blocks.iter().enumerate() {
            match block {
                OutputBlock::Reasoning(reasoning) => {
                    rebuilt.push_str("<think>");
                    rebuilt.push_str(reasoning);
                    let closed = visible[rebuilt.len()..].starts_with("</think>")
                        || index + 1 < blocks.len();
                    if closed {
                        rebuilt.push_str("</think>");
                    }
                }
                OutputBlock::Text(text) => rebuilt.push_str(text),
                OutputBlock::ToolCall { arguments, .. } => {
                    // The call's exact bytes are in the input; skip past them (its end tag is
                    // the first one after its arguments, which may hold the tag as text).
                    let rest = &visible[rebuilt.len()..];
                    let after = rest.find(arguments.as_str()).expect("arguments as written")
                        + arguments.len();
                    let end = after
                        + rest[after..].find("</tool_call>").expect("a parsed call was closed");
                    rebuilt.push_str(&rest[..end + "</tool_call>".len()]);
                }
            }
        }
        prop_assert_eq!(rebuilt, visible);
    }
}

/// A call the output stopped inside is flagged, so the stop reason never says `tool_use`; a
/// finished call is not.
#[test]
fn a_cut_call_is_flagged_and_a_finished_one_is_not() {
    let format = OutputFormat::test_model();
    let mut parser = OutputParser::new(format.clone());
    let mut events =
        parser.push("<tool_call>{\"name\": \"Bash\", \"arguments\": {\"command\": \"ls -");
    events.extend(parser.finish());
    assert!(parser.cut_tool_call());
    assert_eq!(
        events,
        vec![OutputEvent::ToolCall {
            name: "Bash".into(),
            arguments: "{\"command\": \"ls -\"}".into()
        }]
    );
    let mut parser = OutputParser::new(format);
    parser.push("<tool_call>{\"name\": \"Bash\", \"arguments\": {}}</tool_call><|im_end|>");
    parser.finish();
    assert!(!parser.cut_tool_call());
}

proptest! {
    /// Whatever prefix of an output with tool calls the engine stops at, every call the parser
    /// emits has arguments that are a JSON object, and each cut call's arguments are what was
    /// written (the complete arguments, or a closed prefix of their text).
    #[test]
    fn every_cut_of_a_call_gives_object_arguments(
        arguments in proptest::collection::btree_map("[a-z]{1,6}", prop_oneof![
            any::<i64>().prop_map(serde_json::Value::from),
            "[ -~]{0,12}".prop_map(serde_json::Value::from),
            Just(serde_json::Value::Bool(true)),
            Just(serde_json::Value::Null),
            proptest::collection::vec(any::<u8>(), 0..4).prop_map(|v| serde_json::json!(v)),
        ], 0..5),
        cut in 0usize..400,
    ) {
        let arguments = serde_json::to_string(&arguments).expect("serialises");
        let output = format!("Let me check.<tool_call>{{\"name\": \"Run\", \"arguments\": {arguments}}}</tool_call><|im_end|>");
        let cut = cut.min(output.len());
        let cut = (0..=cut).rev().find(|at| output.is_char_boundary(*at)).unwrap_or(0);
        for block in parse_output(&OutputFormat::test_model(), &output[..cut]) {
            if let OutputBlock::ToolCall { name, arguments: written } = block {
                prop_assert_eq!(name, "Run");
                let value: serde_json::Value = serde_json::from_str(&written).expect("arguments are JSON");
                prop_assert!(value.is_object(), "{}", written);
                let prefix = written.trim_end_matches(['}', ']', '"']);
                prop_assert!(arguments.starts_with(prefix), "{} is not a prefix of {}", written, arguments);
            }
        }
    }
}
