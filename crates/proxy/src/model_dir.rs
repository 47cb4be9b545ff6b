//! A chat model's text side: its tokenizer and chat template, loaded from a model directory
//! (`tokenizer.json`, `tokenizer_config.json`, optionally `chat_template.jinja`) or built
//! from parts (SmolLM2 from GGUF metadata).
//!
//! Template choice follows transformers: a `chat_template.jinja` file wins over the config's
//! `chat_template`; a list of named templates uses `tool_use` when the request has tools and
//! that template exists, `default` otherwise. Encoding never adds special tokens (the template
//! writes them), as `apply_chat_template(tokenize=True)` does.

use std::path::{Path, PathBuf};

use crate::fast_bpe::{FastBpe, IdsAndOffsets};
use serde_json::Value;
use tokenizers::Tokenizer;

use crate::template::{ChatTemplate, RenderInput, SpecialTokens, ToolArgumentsForm};
use crate::ProxyError;

pub const TOKENIZER_FILE: &str = "tokenizer.json";
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";
pub const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";

/// The tokenizer and chat template(s) of one model.
pub struct ChatModel {
    tokenizer: Tokenizer,
    /// Exact, faster encoding for byte-level BPE tokenizers (see [`crate::fast_bpe`]).
    fast: Option<FastBpe>,
    template: ChatTemplate,
    /// The `tool_use` named template, used when a request has tools.
    tool_use_template: Option<ChatTemplate>,
    /// One past the largest id the tokenizer knows (added tokens included).
    ids_end: u32,
}

/// One past the largest id `tokenizer` knows, added tokens included (computed once: the
/// tokenizer builds its whole vocabulary map to answer).
fn ids_end(tokenizer: &Tokenizer) -> u32 {
    tokenizer
        .get_vocab(true)
        .values()
        .max()
        .map_or(0, |id| id.saturating_add(1))
}

impl std::fmt::Debug for ChatModel {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("ChatModel")
            .field("vocab_size", &self.tokenizer.get_vocab_size(true))
            .field("template", &self.template)
            .field("tool_use_template", &self.tool_use_template.is_some())
            .finish()
    }
}

fn read_file(path: &Path) -> Result<String, ProxyError> {
    std::fs::read_to_string(path).map_err(|error| ProxyError::ModelFile {
        path: path.to_path_buf(),
        message: format!("cannot read: {error}"),
    })
}

fn field_error(path: &Path, field: &str, message: impl Into<String>) -> ProxyError {
    ProxyError::ModelField {
        path: path.to_path_buf(),
        field: field.to_string(),
        message: message.into(),
    }
}

/// A special-token entry: a string, or an `AddedToken` object with `content`.
fn token_text(path: &Path, field: &str, value: &Value) -> Result<Option<String>, ProxyError> {
    match value {
        Value::Null => Ok(None),
        Value::String(text) => Ok(Some(text.clone())),
        Value::Object(object) => match object.get("content") {
            Some(Value::String(text)) => Ok(Some(text.clone())),
            _ => Err(field_error(
                path,
                field,
                "expected a string or an object with a string `content`",
            )),
        },
        _ => Err(field_error(
            path,
            field,
            "expected a string or an object with a string `content`",
        )),
    }
}

/// The special tokens of `tokenizer_config.json`.
pub fn special_tokens_from_config(
    path: &Path,
    config: &Value,
) -> Result<SpecialTokens, ProxyError> {
    let get = |field: &str| -> Result<Option<String>, ProxyError> {
        match config.get(field) {
            None => Ok(None),
            Some(value) => token_text(path, field, value),
        }
    };
    let additional_special_tokens = match config.get("additional_special_tokens") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(index, item)| {
                token_text(path, &format!("additional_special_tokens[{index}]"), item)
                    .map(Option::unwrap_or_default)
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(field_error(
                path,
                "additional_special_tokens",
                "expected a list",
            ))
        }
    };
    Ok(SpecialTokens {
        bos_token: get("bos_token")?,
        eos_token: get("eos_token")?,
        unk_token: get("unk_token")?,
        sep_token: get("sep_token")?,
        pad_token: get("pad_token")?,
        cls_token: get("cls_token")?,
        mask_token: get("mask_token")?,
        additional_special_tokens,
    })
}

/// `chat_template` as `(default, tool_use)` sources: a string, or a list of
/// `{"name", "template"}` objects.
pub fn chat_templates_from_config(
    path: &Path,
    config: &Value,
) -> Result<(String, Option<String>), ProxyError> {
    match config.get("chat_template") {
        None | Some(Value::Null) => Err(field_error(
            path,
            "chat_template",
            "missing: the model has no chat template (add one, or a chat_template.jinja file)",
        )),
        Some(Value::String(source)) => Ok((source.clone(), None)),
        Some(Value::Array(entries)) => {
            let mut named = Vec::new();
            for (index, entry) in entries.iter().enumerate() {
                let field = format!("chat_template[{index}]");
                let name = entry.get("name").and_then(Value::as_str);
                let template = entry.get("template").and_then(Value::as_str);
                match (name, template) {
                    (Some(name), Some(template)) => {
                        named.push((name.to_string(), template.to_string()))
                    }
                    _ => {
                        return Err(field_error(
                            path,
                            &field,
                            "expected an object with string `name` and `template`",
                        ))
                    }
                }
            }
            let find = |wanted: &str| {
                named
                    .iter()
                    .find(|(name, _)| name == wanted)
                    .map(|(_, template)| template.clone())
            };
            let default = find("default").ok_or_else(|| {
                field_error(
                    path,
                    "chat_template",
                    format!(
                        "no template named `default` among {:?}",
                        named
                            .iter()
                            .map(|(name, _)| name.as_str())
                            .collect::<Vec<_>>()
                    ),
                )
            })?;
            Ok((default, find("tool_use")))
        }
        Some(_) => Err(field_error(
            path,
            "chat_template",
            "expected a string or a list of {name, template} objects",
        )),
    }
}

/// One model file's text and where it came from (named in errors).
#[derive(Clone, Copy)]
pub struct ModelText<'a> {
    pub text: &'a str,
    pub origin: &'a Path,
}

impl ChatModel {
    /// Loads `directory`: `tokenizer.json`, `tokenizer_config.json`, and `chat_template.jinja`
    /// if present.
    pub fn load(directory: &Path, tool_arguments: ToolArgumentsForm) -> Result<Self, ProxyError> {
        let tokenizer_path = directory.join(TOKENIZER_FILE);
        let config_path = directory.join(TOKENIZER_CONFIG_FILE);
        let template_path: PathBuf = directory.join(CHAT_TEMPLATE_FILE);
        let template = if template_path.is_file() {
            Some(read_file(&template_path)?)
        } else {
            None
        };
        Self::from_texts(
            ModelText {
                text: &read_file(&tokenizer_path)?,
                origin: &tokenizer_path,
            },
            ModelText {
                text: &read_file(&config_path)?,
                origin: &config_path,
            },
            template.as_deref().map(|text| ModelText {
                text,
                origin: &template_path,
            }),
            tool_arguments,
        )
    }

    /// A model from the texts of its files (`origin`: the path named in errors): what
    /// [`ChatModel::load`] reads, or files built into the binary ([`crate::test_model`]).
    pub fn from_texts(
        tokenizer: ModelText<'_>,
        config: ModelText<'_>,
        chat_template: Option<ModelText<'_>>,
        tool_arguments: ToolArgumentsForm,
    ) -> Result<Self, ProxyError> {
        let tokenizer_path = tokenizer.origin;
        let tokenizer = Tokenizer::from_bytes(tokenizer.text.as_bytes()).map_err(|error| {
            ProxyError::ModelFile {
                path: tokenizer_path.to_path_buf(),
                message: format!("not a valid tokenizers file: {error}"),
            }
        })?;
        let config_path = config.origin;
        let config: Value =
            serde_json::from_str(config.text).map_err(|error| ProxyError::ModelFile {
                path: config_path.to_path_buf(),
                message: format!("not valid JSON: {error}"),
            })?;
        if !config.is_object() {
            return Err(ProxyError::ModelFile {
                path: config_path.to_path_buf(),
                message: "expected a JSON object".into(),
            });
        }
        let special_tokens = special_tokens_from_config(config_path, &config)?;
        let (default, tool_use, origin) = match chat_template {
            Some(template) => (template.text.to_string(), None, template.origin),
            None => {
                let (default, tool_use) = chat_templates_from_config(config_path, &config)?;
                (default, tool_use, config_path)
            }
        };
        let compile = |source: &str| {
            ChatTemplate::new(source, special_tokens.clone(), tool_arguments).map_err(|error| {
                ProxyError::ModelFile {
                    path: origin.to_path_buf(),
                    message: error.to_string(),
                }
            })
        };
        let template = compile(&default)?;
        let tool_use_template = tool_use.map(|source| compile(&source)).transpose()?;
        Ok(Self {
            fast: FastBpe::for_tokenizer(&tokenizer),
            ids_end: ids_end(&tokenizer),
            tokenizer,
            template,
            tool_use_template,
        })
    }

    /// From an already built tokenizer and a template source (SmolLM2 from GGUF metadata).
    pub fn from_parts(
        tokenizer: Tokenizer,
        chat_template: &str,
        special_tokens: SpecialTokens,
        tool_arguments: ToolArgumentsForm,
    ) -> Result<Self, ProxyError> {
        Ok(Self {
            fast: FastBpe::for_tokenizer(&tokenizer),
            ids_end: ids_end(&tokenizer),
            tokenizer,
            template: ChatTemplate::new(chat_template, special_tokens, tool_arguments)?,
            tool_use_template: None,
        })
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Whether `id` is a token of this model's tokenizer (an engine that answers another id
    /// serves another model, or misbehaves).
    pub fn knows_id(&self, id: u32) -> bool {
        id < self.ids_end
    }

    /// The template a request uses: `tool_use` when it has tools and the model has one.
    pub fn template_for(&self, has_tools: bool) -> &ChatTemplate {
        match (&self.tool_use_template, has_tools) {
            (Some(template), true) => template,
            _ => &self.template,
        }
    }

    /// Renders the prompt text with the right template.
    pub fn render(&self, input: &RenderInput<'_>) -> Result<String, ProxyError> {
        self.template_for(!input.tools.is_empty()).render(input)
    }

    /// Renders a prompt in which the model continues the final message of `input` (an
    /// assistant message the harness pre-filled) instead of starting a new turn: rendered
    /// without the generation prompt and cut right after that message's content
    /// ([`crate::template::continue_final_message`]).
    pub fn render_continuing(&self, input: &RenderInput<'_>) -> Result<String, ProxyError> {
        let content = input
            .messages
            .last()
            .map_or("", |message| message.content.as_str());
        let rendered = self.render(&RenderInput {
            add_generation_prompt: false,
            ..*input
        })?;
        crate::template::continue_final_message(rendered, content)
    }

    /// Token ids and their (start, end) byte offsets in `text`, exactly as
    /// `tokenizer().encode(text, false)` gives them; through the fast path when the tokenizer
    /// and the text allow it.
    ///
    /// A text with a run of one class of characters longer than
    /// [`crate::long_runs::RUN_BYTES_MAX`] is encoded in pieces cut inside that run, which
    /// bounds the tokenizer's memory (see [`crate::long_runs`]).
    pub fn encode_with_offsets(&self, text: &str) -> Result<IdsAndOffsets, ProxyError> {
        crate::long_runs::encode_in_pieces(text, crate::long_runs::RUN_BYTES_MAX, |piece| {
            self.encode_whole(piece)
        })
    }

    fn encode_whole(&self, text: &str) -> Result<IdsAndOffsets, ProxyError> {
        let tokenizer_error = |message: String| ProxyError::Tokenizer { message };
        if let Some(fast) = &self.fast {
            return fast
                .encode_by_lines(&self.tokenizer, text)
                .map_err(tokenizer_error);
        }
        let encoding = self
            .tokenizer
            .encode(text, false)
            .map_err(|error| tokenizer_error(error.to_string()))?;
        Ok((encoding.get_ids().to_vec(), encoding.get_offsets().to_vec()))
    }

    /// Whether [`ChatModel::encode_with_offsets`] has a fast path for this tokenizer.
    pub fn has_fast_path(&self) -> bool {
        self.fast.is_some()
    }

    /// Token ids of `text`; special-token text becomes the special token, nothing is added.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, ProxyError> {
        if text.len() > crate::long_runs::RUN_BYTES_MAX
            && !crate::long_runs::cuts(text, crate::long_runs::RUN_BYTES_MAX).is_empty()
        {
            return self.encode_with_offsets(text).map(|(ids, _)| ids);
        }
        if let Some(fast) = &self.fast {
            return fast
                .encode_by_lines(&self.tokenizer, text)
                .map(|(ids, _)| ids)
                .map_err(|message| ProxyError::Tokenizer { message });
        }
        Ok(self
            .tokenizer
            .encode_fast(text, false)
            .map_err(|error| ProxyError::Tokenizer {
                message: error.to_string(),
            })?
            .get_ids()
            .to_vec())
    }

    /// Text of `ids`, special tokens included.
    pub fn decode(&self, ids: &[u32]) -> Result<String, ProxyError> {
        self.tokenizer
            .decode(ids, false)
            .map_err(|error| ProxyError::Tokenizer {
                message: error.to_string(),
            })
    }

    /// The exact bytes of one token, as OpenAI's `logprobs.content[].bytes` gives them: for a
    /// byte-level tokenizer the bytes its piece stands for (a piece may hold part of a UTF-8
    /// character), otherwise the token decoded alone.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        if matches!(
            self.tokenizer.get_decoder(),
            Some(tokenizers::DecoderWrapper::ByteLevel(_))
        ) {
            if let Some(bytes) = self
                .tokenizer
                .id_to_token(id)
                .and_then(|piece| byte_level_bytes(&piece))
            {
                return bytes;
            }
        }
        self.tokenizer
            .decode(&[id], false)
            .map(String::into_bytes)
            .unwrap_or_default()
    }

    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.tokenizer.token_to_id(token)
    }

    /// An incremental decoder for output ids as the engine samples them.
    pub fn text_stream(&self) -> TextStream<'_> {
        TextStream {
            model: self,
            ids: Vec::new(),
            prefix: String::new(),
            prefix_index: 0,
        }
    }

    /// The bytes token `id` stands for, as the stream decodes them: a byte-level piece's
    /// bytes, a byte-fallback piece `<0xHH>`'s byte, anything else decoded alone.
    fn raw_bytes(&self, id: u32) -> Vec<u8> {
        let byte_fallback = self.tokenizer.id_to_token(id).and_then(|piece| {
            let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
            (hex.len() == 2).then(|| u8::from_str_radix(hex, 16).ok())?
        });
        match byte_fallback {
            Some(byte) => vec![byte],
            None => self.token_bytes(id),
        }
    }
}

/// The bytes a byte-level (GPT-2 style) piece stands for: printable bytes are their own
/// character, the other 68 bytes are the characters from U+0100 on, in byte order. `None`
/// when a character is outside that alphabet (an added token written with raw whitespace).
fn byte_level_bytes(piece: &str) -> Option<Vec<u8>> {
    let printable = |byte: u8| matches!(byte, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    piece
        .chars()
        .map(|character| {
            let code = u32::from(character);
            if code < 256 {
                let byte = code as u8;
                return printable(byte).then_some(byte);
            }
            let shifted = usize::try_from(code - 256).ok()?;
            (0..=255u8).filter(|byte| !printable(*byte)).nth(shifted)
        })
        .collect()
}

/// Output ids → text deltas, special tokens included. A character whose UTF-8 bytes span
/// several byte-level tokens is emitted once all of them arrived; the deltas concatenate to
/// `decode(ids)`. (`tokenizers`' own `DecodeStream` steps, with its state kept here.)
///
/// A policy can sample any byte sequence, including bytes that never complete a character.
/// The decoder holds such tokens back and decodes all of them again at every step, so a long
/// invalid run cost time quadratic in its length (8,000 lone continuation bytes took 5 s).
/// After [`HELD_IDS_MAX`] tokens without text, the held text is emitted, but for the tokens
/// of a character still arriving (a lead byte among the last 3 bytes with fewer bytes after
/// it than it announces); invalid bytes come out as U+FFFD, exactly as `decode` gives them. The decoding context is kept, so spacing rules that look at the
/// previous token (SentencePiece's `▁`) are unaffected.
pub struct TextStream<'a> {
    model: &'a ChatModel,
    /// The decoding context, then the held ids (from `prefix_index`).
    ids: Vec<u32>,
    /// The text of `ids[..prefix_index]`.
    prefix: String,
    prefix_index: usize,
}

/// Tokens without text after which the held text is emitted (see [`TextStream`]).
pub const HELD_IDS_MAX: usize = 16;

impl TextStream<'_> {
    /// Feeds one id; returns the new text, if any is complete.
    pub fn push(&mut self, id: u32) -> Result<Option<String>, ProxyError> {
        let failed = |error: tokenizers::Error| ProxyError::Tokenizer {
            message: error.to_string(),
        };
        let tokenizer = &self.model.tokenizer;
        let text = tokenizers::tokenizer::step_decode_stream(
            tokenizer,
            vec![id],
            false,
            &mut self.ids,
            &mut self.prefix,
            &mut self.prefix_index,
        )
        .map_err(failed)?;
        if text.is_some() || self.ids.len() - self.prefix_index < HELD_IDS_MAX {
            return Ok(text);
        }
        // Emit all held tokens but those holding a character that is still arriving: the last
        // lead byte among the final 3 bytes, with fewer bytes after it than it announces.
        let cut = match self.cut_before_partial_character() {
            // Always progress: a character cannot hold back every held token.
            cut if cut == self.prefix_index => self.ids.len(),
            cut => cut,
        };
        let head = tokenizer.decode(&self.ids[..cut], false).map_err(failed)?;
        let new_text = match head.strip_prefix(self.prefix.as_str()) {
            Some(new_text) => new_text.to_string(),
            None => {
                return Err(ProxyError::Tokenizer {
                    message: format!(
                        "decoding token {id}: the held text does not continue the text before it"
                    ),
                })
            }
        };
        // The emitted tokens become the context of what follows.
        self.ids.drain(..self.prefix_index);
        let cut = cut - self.prefix_index;
        self.prefix = tokenizer.decode(&self.ids[..cut], false).map_err(failed)?;
        self.prefix_index = cut;
        Ok((!new_text.is_empty()).then_some(new_text))
    }

    /// Where the held tokens end, or the start of the token holding the lead byte of an
    /// incomplete character at their end.
    fn cut_before_partial_character(&self) -> usize {
        let mut after = 0usize; // bytes after the one looked at, in later tokens or this one
        for at in (self.prefix_index..self.ids.len()).rev() {
            let bytes = self.model.raw_bytes(self.ids[at]);
            for byte in bytes.iter().rev() {
                if after >= 3 {
                    return self.ids.len();
                }
                let announced = match byte {
                    0xC0..=0xDF => 2,
                    0xE0..=0xEF => 3,
                    0xF0..=0xF7 => 4,
                    _ => 0,
                };
                if announced > 0 {
                    return if after + 1 < announced {
                        at
                    } else {
                        self.ids.len()
                    };
                }
                after += 1;
            }
        }
        self.ids.len()
    }
}

#[cfg(test)]
mod tests {
    use super::byte_level_bytes;

    #[test]
    fn byte_level_pieces_stand_for_their_bytes() {
        // Printable bytes are themselves; space, newline and the rest start at U+0100.
        assert_eq!(byte_level_bytes("Hi!"), Some(b"Hi!".to_vec()));
        assert_eq!(byte_level_bytes("\u{120}a"), Some(b" a".to_vec()));
        assert_eq!(byte_level_bytes("\u{10a}"), Some(b"\n".to_vec()));
        // Half of "é" (0xC3 0xA9): a piece may hold part of a character.
        assert_eq!(byte_level_bytes("\u{c3}"), Some(vec![0xC3]));
        assert_eq!(
            byte_level_bytes("\u{c3}\u{a9}"),
            Some("é".as_bytes().to_vec())
        );
        // The last of the 68 shifted bytes, and characters outside the alphabet.
        assert_eq!(byte_level_bytes("\u{143}"), Some(vec![0xAD]));
        assert_eq!(byte_level_bytes("\u{144}"), None);
        assert_eq!(byte_level_bytes(" "), None);
    }
}
