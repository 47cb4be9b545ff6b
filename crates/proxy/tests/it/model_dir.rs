//! Loading model directories: the files, the two `chat_template` forms, special tokens, and
//! errors that name the file and the field.

use std::path::Path;

use gyre_proxy::messages::{Message, Role, Tool};
use gyre_proxy::{ChatModel, ProxyError, RenderInput, ToolArgumentsForm};
use serde_json::json;

use crate::support::{reference_now, test_model_dir};

fn directory_with(config: &serde_json::Value) -> tempfile::TempDir {
    let directory = tempfile::tempdir().expect("temp dir");
    std::fs::copy(
        test_model_dir().join("tokenizer.json"),
        directory.path().join("tokenizer.json"),
    )
    .expect("copy tokenizer");
    std::fs::write(
        directory.path().join("tokenizer_config.json"),
        config.to_string(),
    )
    .expect("write config");
    directory
}

fn load(path: &Path) -> Result<ChatModel, ProxyError> {
    ChatModel::load(path, ToolArgumentsForm::RawText)
}

fn error_text(path: &Path) -> String {
    load(path).expect_err("loading fails").to_string()
}

fn render(model: &ChatModel, tools: &[Tool]) -> String {
    model
        .render(&RenderInput {
            messages: &[Message::new(Role::User, "hi")],
            tools,
            add_generation_prompt: false,
            now: reference_now(),
            extra: None,
        })
        .expect("renders")
}

#[test]
fn missing_files_are_named() {
    let directory = tempfile::tempdir().expect("temp dir");
    let message = error_text(directory.path());
    assert!(message.contains("tokenizer.json: cannot read"), "{message}");
    std::fs::copy(
        test_model_dir().join("tokenizer.json"),
        directory.path().join("tokenizer.json"),
    )
    .expect("copy");
    let message = error_text(directory.path());
    assert!(
        message.contains("tokenizer_config.json: cannot read"),
        "{message}"
    );
}

#[test]
fn a_broken_tokenizer_file_is_named() {
    let directory = directory_with(&json!({"chat_template": "x"}));
    std::fs::write(directory.path().join("tokenizer.json"), "{\"model\": 3}").expect("write");
    let message = error_text(directory.path());
    assert!(
        message.contains("tokenizer.json: not a valid tokenizers file"),
        "{message}"
    );
}

#[test]
fn config_errors_name_the_field() {
    let cases = [
        (json!({}), "field `chat_template`: missing"),
        (
            json!({"chat_template": 7}),
            "field `chat_template`: expected a string or a list",
        ),
        (
            json!({"chat_template": [{"name": "x"}]}),
            "field `chat_template[0]`: expected an object",
        ),
        (
            json!({"chat_template": [{"name": "tool_use", "template": "t"}]}),
            "no template named `default`",
        ),
        (
            json!({"chat_template": "x", "bos_token": 3}),
            "field `bos_token`",
        ),
        (
            json!({"chat_template": "x", "additional_special_tokens": "<a>"}),
            "field `additional_special_tokens`: expected a list",
        ),
        (
            json!({"chat_template": "{% if %}"}),
            "chat template does not compile",
        ),
    ];
    for (config, wanted) in cases {
        let directory = directory_with(&config);
        let message = error_text(directory.path());
        assert!(message.contains("tokenizer_config.json"), "{message}");
        assert!(message.contains(wanted), "{config}: {message}");
    }
    let directory = tempfile::tempdir().expect("temp dir");
    std::fs::copy(
        test_model_dir().join("tokenizer.json"),
        directory.path().join("tokenizer.json"),
    )
    .expect("copy");
    std::fs::write(directory.path().join("tokenizer_config.json"), "{not json").expect("write");
    let message = error_text(directory.path());
    assert!(
        message.contains("tokenizer_config.json: not valid JSON"),
        "{message}"
    );
}

#[test]
fn named_templates_pick_tool_use_when_there_are_tools() {
    let directory = directory_with(&json!({
        "chat_template": [
            {"name": "default", "template": "D{{ messages | length }}"},
            {"name": "tool_use", "template": "T{{ tools | length }}"},
        ],
    }));
    let model = load(directory.path()).expect("loads");
    assert_eq!(render(&model, &[]), "D1");
    let tool = Tool {
        name: "f".into(),
        description: None,
        parameters: json!({"type": "object"}),
    };
    assert_eq!(render(&model, &[tool]), "T1");
}

#[test]
fn chat_template_jinja_file_wins_and_special_tokens_accept_both_forms() {
    let directory = directory_with(&json!({
        "chat_template": "from config",
        "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": false},
        "eos_token": "</s>",
        "additional_special_tokens": ["<a>", {"content": "<b>"}],
    }));
    std::fs::write(
        directory.path().join("chat_template.jinja"),
        "{{ bos_token }}|{{ eos_token }}|{{ additional_special_tokens | join(',') }}|{{ unk_token is defined }}\n",
    )
    .expect("write");
    let model = load(directory.path()).expect("loads");
    assert_eq!(render(&model, &[]), "<s>|</s>|<a>,<b>|False");
}

#[test]
fn the_server_can_share_models_and_move_builders_across_tasks() {
    fn shared<T: Send + Sync>() {}
    fn movable<T: Send>() {}
    shared::<ChatModel>();
    shared::<gyre_proxy::ChatTemplate>();
    movable::<gyre_proxy::output::OutputParser>();
    movable::<gyre_proxy::output::anthropic::AnthropicResponse>();
    movable::<gyre_proxy::output::openai_chat::ChatCompletionResponse>();
    movable::<gyre_proxy::output::openai_responses::ResponsesResponse>();
    movable::<gyre_proxy::TextStream<'static>>();
}

/// An over-long word (a tool printed megabytes of one letter) is encoded in pieces: every
/// token still decodes to the text, offsets tile it, and the text around the run encodes as
/// it does alone.
#[test]
fn an_over_long_word_is_encoded_in_pieces_that_still_spell_the_text() {
    let model = crate::support::test_model();
    let run = "é".repeat(gyre_proxy::long_runs::RUN_BYTES_MAX); // twice the limit in bytes
    let text = format!("before the run {run} after the run\n");
    assert!(!gyre_proxy::long_runs::cuts(&text, gyre_proxy::long_runs::RUN_BYTES_MAX).is_empty());
    let (ids, offsets) = model.encode_with_offsets(&text).expect("encodes");
    assert_eq!(model.encode(&text).expect("encodes"), ids);
    assert_eq!(model.decode(&ids).expect("decodes"), text);
    assert_eq!(offsets.first().map(|o| o.0), Some(0));
    assert_eq!(offsets.last().map(|o| o.1), Some(text.len()));
    assert!(offsets.windows(2).all(|pair| pair[0].0 <= pair[1].0));
    let head = model.encode("before the").expect("encodes");
    assert_eq!(ids[..head.len()], head[..]);
    // Ordinary text of the same size is encoded whole, exactly as `tokenizers` does.
    let prose = "une phrase déjà écrite, ".repeat(6_000);
    let whole = model
        .tokenizer()
        .encode(prose.as_str(), false)
        .expect("encodes");
    assert_eq!(model.encode(&prose).expect("encodes"), whole.get_ids());
}

/// A policy sampling bytes that never complete a character (here 20,000 lone continuation
/// bytes, 5 s for 8,000 before the bound) gets its text out in pieces of at most
/// `HELD_IDS_MAX` tokens, each decoded once: the deltas still concatenate to the whole
/// output's text, and valid text after the run streams as before.
#[test]
fn an_invalid_byte_run_streams_in_bounded_pieces() {
    let model = crate::support::test_model();
    let lone = (0..100_000u32)
        .find(|id| model.token_bytes(*id) == vec![0xA9])
        .expect("a byte token");
    let mut ids = vec![lone; 20_000];
    ids.extend(model.encode("then plain text").expect("encodes"));
    let mut stream = model.text_stream();
    let mut text = String::new();
    let mut longest_wait = 0;
    let mut waiting = 0;
    for id in &ids {
        match stream.push(*id).expect("decodes") {
            Some(delta) => {
                text.push_str(&delta);
                waiting = 0;
            }
            None => waiting += 1,
        }
        longest_wait = longest_wait.max(waiting);
    }
    assert!(
        longest_wait < gyre_proxy::model_dir::HELD_IDS_MAX,
        "{longest_wait}"
    );
    assert_eq!(text, model.decode(&ids).expect("decodes"));
    assert!(
        text.ends_with("then plain text"),
        "{}",
        &text[text.len() - 40..]
    );

    // A character arriving byte by byte across the point where held text is emitted stays
    // whole, and a long run of literal U+FFFD (valid text) is emitted exactly.
    let byte = |value: u8| {
        (0..100_000u32)
            .find(|id| model.token_bytes(*id) == vec![value])
            .expect("a byte token")
    };
    let mut ids = vec![lone; gyre_proxy::model_dir::HELD_IDS_MAX - 2];
    ids.extend([0xF0, 0x9F, 0x98, 0x80].map(byte));
    for _ in 0..12 {
        ids.extend([0xEF, 0xBF, 0xBD].map(byte));
    }
    ids.extend(model.encode(" done").expect("encodes"));
    let mut stream = model.text_stream();
    let mut text = String::new();
    for id in &ids {
        if let Some(delta) = stream.push(*id).expect("decodes") {
            text.push_str(&delta);
        }
    }
    let expected = format!(
        "{}\u{1F600}{} done",
        "\u{FFFD}".repeat(gyre_proxy::model_dir::HELD_IDS_MAX - 2),
        "\u{FFFD}".repeat(12)
    );
    assert_eq!(text, expected);
    assert_eq!(text, model.decode(&ids).expect("decodes"));
}
