//! The repository's own test model (`crates/proxy/assets/test-model/`): how its tokenizer is
//! trained, so the example that writes the file and the test that checks it share one
//! definition.
//!
//! A byte-level BPE (GPT-2 pre-tokenizer without prefix space, like Qwen and SmolLM) with a
//! 2,048-token vocabulary, trained with the `tokenizers` crate's BPE trainer on
//! `assets/test-model/corpus.txt`. Its nine special tokens come first (ids 0–8) and are matched
//! whole, never merged with neighbouring text. Training is deterministic: merges are chosen by
//! count, ties broken by pair ids, and ids follow the sorted byte alphabet.

use std::collections::HashSet;

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::models::TrainerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer};

use crate::ProxyError;

/// Vocabulary size of the test tokenizer, special tokens included.
pub const VOCAB_SIZE: usize = 2048;

/// The special tokens, in id order.
pub const SPECIAL_TOKENS: [&str; 9] = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
];

fn tokenizer_error(error: impl std::fmt::Display) -> ProxyError {
    ProxyError::Tokenizer {
        message: error.to_string(),
    }
}

/// Trains the test tokenizer on `corpus` (one training sequence per paragraph, newlines kept)
/// and returns its `tokenizer.json` text (pretty-printed, newline-terminated).
pub fn train_tokenizer(corpus: &str) -> Result<String, ProxyError> {
    let special_tokens: Vec<AddedToken> = SPECIAL_TOKENS
        .iter()
        .map(|token| AddedToken::from(*token, true))
        .collect();
    let alphabet: HashSet<char> = ByteLevel::alphabet().into_iter().collect();
    let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
        .vocab_size(VOCAB_SIZE)
        .min_frequency(2)
        .show_progress(false)
        .special_tokens(special_tokens.clone())
        .initial_alphabet(alphabet)
        .build()
        .into();
    let mut tokenizer = Tokenizer::new(BPE::default());
    tokenizer.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
    tokenizer.with_decoder(Some(ByteLevelDecoder::default()));
    // Registered before training so the trainer never sees them as ordinary text.
    tokenizer
        .add_special_tokens(special_tokens.clone())
        .map_err(tokenizer_error)?;
    tokenizer
        .train(&mut trainer, corpus.split_inclusive("\n\n"))
        .map_err(tokenizer_error)?;
    let mut text = tokenizer.to_string(true).map_err(tokenizer_error)?;
    text.push('\n');
    Ok(text)
}

/// The test model's `tokenizer_config.json` text around `chat_template` (the source of
/// `testdata/templates/test_model.jinja`).
pub fn tokenizer_config(chat_template: &str) -> String {
    let config = serde_json::json!({
        "model_max_length": 32768,
        "bos_token": null,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": null,
        "additional_special_tokens": SPECIAL_TOKENS[1..],
        "chat_template": chat_template,
    });
    let mut text = serde_json::to_string_pretty(&config).expect("a JSON value always serialises");
    text.push('\n');
    text
}

/// The repository's test model directory (`crates/proxy/assets/test-model`) in the source tree
/// this binary was built from: for tests and the files' own tooling. A binary serves the copy
/// built into it ([`model`]), which needs no source tree.
pub fn directory() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/test-model")
}

/// The test model's `tokenizer.json`, as built into this binary.
const TOKENIZER_JSON: &str = include_str!("../assets/test-model/tokenizer.json");
/// The test model's `tokenizer_config.json` (with its chat template), as built into this binary.
const TOKENIZER_CONFIG_JSON: &str = include_str!("../assets/test-model/tokenizer_config.json");

/// Where errors about the built-in model point: the built-in copy, not a path on this host.
pub const BUILT_IN: &str = "(built-in test model)";

/// The test model from the files built into this binary: what `gyre proxy` serves when no
/// `--model-dir` is given, wherever the binary runs (a container, another host).
pub fn model(tool_arguments: crate::ToolArgumentsForm) -> Result<crate::ChatModel, ProxyError> {
    let origin = std::path::Path::new(BUILT_IN);
    crate::ChatModel::from_texts(
        crate::model_dir::ModelText {
            text: TOKENIZER_JSON,
            origin,
        },
        crate::model_dir::ModelText {
            text: TOKENIZER_CONFIG_JSON,
            origin,
        },
        None,
        tool_arguments,
    )
}
