//! The repository's test model: reproducible from its script, loadable, and consistent with its
//! output format (what the template renders for an assistant turn is what the parser reads).

use gyre_proxy::messages::{Message, Reasoning, Role, Tool, ToolCall};
use gyre_proxy::output::{parse_output, OutputBlock, OutputFormat};
use gyre_proxy::test_model::{tokenizer_config, train_tokenizer, SPECIAL_TOKENS, VOCAB_SIZE};
use gyre_proxy::RenderInput;
use serde_json::Value;

use crate::support::{read_testdata, reference_now, test_model, test_model_dir};

#[test]
fn assets_are_reproducible_from_the_script() {
    let corpus = read_testdata("tokenizer_corpus.txt");
    let trained = train_tokenizer(&corpus).expect("training succeeds");
    let committed =
        std::fs::read_to_string(test_model_dir().join("tokenizer.json")).expect("asset");
    assert!(
        trained == committed,
        "assets/test-model/tokenizer.json is stale: run `cargo run -p gyre-proxy --example train_test_tokenizer`"
    );
    let config = tokenizer_config(&read_testdata("templates/test_model.jinja"));
    let committed =
        std::fs::read_to_string(test_model_dir().join("tokenizer_config.json")).expect("asset");
    assert_eq!(
        config, committed,
        "tokenizer_config.json is stale: re-run the example"
    );
}

#[test]
fn special_tokens_have_the_first_ids_and_encode_whole() {
    let model = test_model();
    assert_eq!(model.tokenizer().get_vocab_size(true), VOCAB_SIZE);
    for (id, token) in SPECIAL_TOKENS.iter().enumerate() {
        assert_eq!(model.token_id(token), Some(id as u32), "{token}");
        assert_eq!(model.encode(token).expect("encodes"), vec![id as u32]);
    }
    let ids = model
        .encode("<|im_start|>user\nhi<|im_end|>")
        .expect("encodes");
    assert_eq!(ids.first(), Some(&1));
    assert_eq!(ids.last(), Some(&2));
}

#[test]
fn decode_inverts_encode_for_any_text() {
    let model = test_model();
    for text in [
        "plain words",
        "  two leading spaces\n\n\ttab",
        "café 日本語 😀 \u{0}\u{7f}",
        "<think>r</think>t<tool_call>{\"name\": \"x\", \"arguments\": {}}</tool_call><|im_end|>",
        "",
    ] {
        let ids = model.encode(text).expect("encodes");
        assert_eq!(model.decode(&ids).expect("decodes"), text);
    }
}

#[test]
fn streamed_decoding_concatenates_to_the_full_decoding() {
    let model = test_model();
    let text = "<think>é😀 日本</think>ok<tool_call>{\"name\": \"x\", \"arguments\": {}}</tool_call><|im_end|>";
    let ids = model.encode(text).expect("encodes");
    let mut stream = model.text_stream();
    let mut streamed = String::new();
    for id in &ids {
        if let Some(delta) = stream.push(*id).expect("decodes") {
            assert!(!delta.contains('\u{fffd}'), "no half characters: {delta:?}");
            streamed.push_str(&delta);
        }
    }
    assert_eq!(streamed, text);
}

fn conversation() -> Vec<Message> {
    let mut assistant = Message::new(Role::Assistant, "I'll create the file first.\n");
    assistant.reasoning.push(Reasoning {
        text: "The user wants a file.".into(),
        handle: Some("sig-1".into()),
        redacted: false,
    });
    assistant.tool_calls = vec![
        ToolCall {
            id: "toolu_01".into(),
            name: "write_file".into(),
            arguments: r#"{"content": "caf\u00e9 \/ line1\nline2\n",  "path":"hello.txt"}"#.into(),
        },
        ToolCall {
            id: "toolu_02".into(),
            name: "run_shell".into(),
            arguments: r#"{"command": "ls -la"}"#.into(),
        },
    ];
    vec![
        Message::new(Role::System, "You are a coding agent."),
        Message::new(Role::User, "Create hello.txt, then list the directory."),
        assistant,
        Message::tool_result(
            "toolu_02",
            Some("run_shell".into()),
            "total 8\n-rw-r--r-- 1 root root 18 hello.txt",
            false,
        ),
        Message::tool_result(
            "toolu_01",
            Some("write_file".into()),
            "wrote 18 bytes",
            false,
        ),
        Message::new(Role::System, "Reminder: be brief."),
        Message::new(Role::User, "Thanks!"),
        Message::new(Role::Assistant, "Done."),
        Message::new(Role::User, "One more: read it back."),
    ]
}

fn case_tools() -> Vec<Tool> {
    let cases: Vec<Value> =
        serde_json::from_str(&read_testdata("template_cases.json")).expect("cases parse");
    let case = cases
        .iter()
        .find(|case| case["name"] == "test_model_full")
        .expect("the case exists");
    case["context"]["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|tool| Tool {
            name: tool["function"]["name"].as_str().expect("name").into(),
            description: tool["function"]["description"].as_str().map(str::to_string),
            parameters: tool["function"]["parameters"].clone(),
        })
        .collect()
}

fn expected_output(name: &str) -> String {
    let expected: Value =
        serde_json::from_str(&read_testdata("template_expected.json")).expect("parses");
    expected[name]["output"]
        .as_str()
        .expect("an output")
        .to_string()
}

#[test]
fn internal_messages_render_like_the_jinja2_reference() {
    // The same conversation as the `test_model_full` case, built as internal messages: the
    // template view must hand the template exactly what the Python side got.
    let model = test_model();
    let messages = conversation();
    let tools = case_tools();
    let rendered = model
        .render(&RenderInput {
            messages: &messages,
            tools: &tools,
            add_generation_prompt: true,
            now: reference_now(),
            extra: None,
        })
        .expect("renders");
    assert_eq!(rendered, expected_output("test_model_full"));
}

#[test]
fn an_assistant_turn_parses_back_into_what_rendered_it() {
    let model = test_model();
    let messages = conversation();
    let prefix = model
        .render(&RenderInput {
            messages: &messages[..2],
            tools: &[],
            add_generation_prompt: true,
            now: reference_now(),
            extra: None,
        })
        .expect("renders");
    let full = model
        .render(&RenderInput {
            messages: &messages[..3],
            tools: &[],
            add_generation_prompt: false,
            now: reference_now(),
            extra: None,
        })
        .expect("renders");
    let generated = full.strip_prefix(&prefix).expect("the prompt is a prefix");
    let blocks = parse_output(&OutputFormat::test_model(), generated);
    let assistant = &messages[2];
    let mut expected = vec![
        OutputBlock::Reasoning(assistant.reasoning[0].text.clone()),
        OutputBlock::Text(assistant.content.clone()),
    ];
    for call in &assistant.tool_calls {
        expected.push(OutputBlock::ToolCall {
            name: call.name.clone(),
            arguments: call.arguments.clone(),
        });
    }
    assert_eq!(blocks, expected);
}

#[test]
fn encoding_a_suffix_from_a_special_token_matches_the_full_encoding() {
    // The incremental-encoding boundary rule: text split right after a special token encodes
    // to the same ids in two parts as in one.
    let model = test_model();
    let messages = conversation();
    let full = model
        .render(&RenderInput {
            messages: &messages,
            tools: &case_tools(),
            add_generation_prompt: true,
            now: reference_now(),
            extra: None,
        })
        .expect("renders");
    let full_ids = model.encode(&full).expect("encodes");
    for (split, _) in full.match_indices("<|im_end|>") {
        let split = split + "<|im_end|>".len();
        let mut ids = model.encode(&full[..split]).expect("encodes");
        ids.extend(model.encode(&full[split..]).expect("encodes"));
        assert_eq!(ids, full_ids, "split at byte {split}");
    }
}

/// The copy built into the binary (what `gyre proxy` serves without `--model-dir`, wherever the
/// binary runs) is the directory's model: same vocabulary, same ids, same rendering.
#[test]
fn the_built_in_model_is_the_directorys() {
    let built_in = gyre_proxy::test_model::model(gyre_proxy::ToolArgumentsForm::RawText)
        .expect("the built-in model loads");
    let loaded = test_model();
    assert_eq!(
        built_in.tokenizer().get_vocab_size(true),
        loaded.tokenizer().get_vocab_size(true)
    );
    let text = "<|im_start|>user\nlist the files, then café 日本語<|im_end|>\n";
    assert_eq!(
        built_in.encode(text).expect("encodes"),
        loaded.encode(text).expect("encodes")
    );
    let messages = conversation();
    let tools = case_tools();
    let rendered = built_in
        .render(&RenderInput {
            messages: &messages,
            tools: &tools,
            add_generation_prompt: true,
            now: reference_now(),
            extra: None,
        })
        .expect("renders");
    assert_eq!(rendered, expected_output("test_model_full"));
}
