//! Text ⇄ token ids, built from the GGUF's `tokenizer.ggml.*` metadata.
//!
//! The GGUF carries the vocabulary, the BPE merges, per-token types and the name of the
//! pre-tokenizer (`tokenizer.ggml.pre`); the normaliser and split regex that name stands for are
//! fixed by the model family (model-spec §4). The BPE itself is the Hugging Face `tokenizers`
//! crate, the same implementation transformers uses, so ids match the reference exactly.

use std::sync::Arc;

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

use crate::gguf::{Gguf, Value};

pub const KEY_MODEL: &str = "tokenizer.ggml.model";
pub const KEY_PRE: &str = "tokenizer.ggml.pre";
pub const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
pub const KEY_TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
pub const KEY_MERGES: &str = "tokenizer.ggml.merges";
pub const KEY_BOS_ID: &str = "tokenizer.ggml.bos_token_id";
pub const KEY_EOS_ID: &str = "tokenizer.ggml.eos_token_id";
pub const KEY_EOT_ID: &str = "tokenizer.ggml.eot_token_id";

/// Split regex of the Qwen3.5/3.8 tokenizer (llama.cpp pre-tokenizer `qwen35`): unlike Qwen2 it
/// keeps combining marks (`\p{M}`) inside words.
const QWEN35_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2/Qwen3 split regex (llama.cpp `qwen2`).
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Llama 3 split regex (llama.cpp `llama3` / `llama-bpe`): digits in groups of up to three.
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// llama.cpp token types (`llama_token_type`).
const TOKEN_TYPE_CONTROL: i64 = 3;
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("GGUF has no `{0}`: not a GGUF with an embedded tokenizer")]
    MissingKey(&'static str),
    #[error("GGUF key `{key}` should be {expected}")]
    WrongType {
        key: &'static str,
        expected: &'static str,
    },
    #[error(
        "tokenizer model `{0}` is not supported (only byte-level BPE, `tokenizer.ggml.model = gpt2`)"
    )]
    UnsupportedModel(String),
    #[error(
        "pre-tokenizer `{0}` is not supported (supported: qwen35, qwen2, llama3, llama-bpe, gpt2, default)"
    )]
    UnsupportedPre(String),
    #[error("`{KEY_TOKEN_TYPE}` has {types} entries but the vocabulary has {tokens}")]
    TokenTypeCount { types: usize, tokens: usize },
    #[error("merge rule {index} ({text:?}) is not two tokens separated by a space")]
    BadMerge { index: usize, text: String },
    #[error("cannot build the tokenizer: {0}")]
    Build(String),
    #[error("cannot tokenize: {0}")]
    Encode(String),
}

/// A tokenizer. Cheap to clone (shared), `Send + Sync`.
#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<Inner>,
}

struct Inner {
    /// Matches special (control) tokens written in the text: for rendered templates.
    with_special: tokenizers::Tokenizer,
    /// The same, but control-token text is tokenized as ordinary text: for untrusted input,
    /// so a user typing `<|im_end|>` cannot end their turn.
    without_special: tokenizers::Tokenizer,
    token_types: Vec<i64>,
    bos_id: Option<u32>,
    eos_id: Option<u32>,
    eot_id: Option<u32>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("eos_id", &self.inner.eos_id)
            .finish()
    }
}

fn string_array<'a>(gguf: &'a Gguf, key: &'static str) -> Result<Vec<&'a str>, TokenizerError> {
    let values = gguf
        .get(key)
        .ok_or(TokenizerError::MissingKey(key))?
        .as_array()
        .ok_or(TokenizerError::WrongType {
            key,
            expected: "an array of strings",
        })?;
    values
        .iter()
        .map(|v| {
            v.as_str().ok_or(TokenizerError::WrongType {
                key,
                expected: "an array of strings",
            })
        })
        .collect()
}

/// A token id key, ignored when it does not name a token of the vocabulary.
fn token_id_key(gguf: &Gguf, key: &str, vocab_size: usize) -> Option<u32> {
    let id = gguf.get(key).and_then(Value::as_u64)?;
    u32::try_from(id)
        .ok()
        .filter(|&id| (id as usize) < vocab_size)
}

impl Tokenizer {
    pub fn from_gguf(gguf: &Gguf) -> Result<Tokenizer, TokenizerError> {
        let model = gguf
            .get(KEY_MODEL)
            .ok_or(TokenizerError::MissingKey(KEY_MODEL))?
            .as_str()
            .ok_or(TokenizerError::WrongType {
                key: KEY_MODEL,
                expected: "a string",
            })?;
        if model != "gpt2" {
            return Err(TokenizerError::UnsupportedModel(model.to_string()));
        }
        let pre = match gguf.get(KEY_PRE) {
            None => "default",
            Some(v) => v.as_str().ok_or(TokenizerError::WrongType {
                key: KEY_PRE,
                expected: "a string",
            })?,
        };
        let tokens = string_array(gguf, KEY_TOKENS)?;
        let merges = string_array(gguf, KEY_MERGES)?;
        let token_types: Vec<i64> = match gguf.get(KEY_TOKEN_TYPE) {
            None => vec![1; tokens.len()],
            Some(v) => {
                let wrong = TokenizerError::WrongType {
                    key: KEY_TOKEN_TYPE,
                    expected: "an array of integers",
                };
                let list = v.as_array().ok_or(wrong)?;
                list.iter()
                    .map(|t| {
                        t.as_i64().ok_or(TokenizerError::WrongType {
                            key: KEY_TOKEN_TYPE,
                            expected: "an array of integers",
                        })
                    })
                    .collect::<Result<_, _>>()?
            }
        };
        if token_types.len() != tokens.len() {
            return Err(TokenizerError::TokenTypeCount {
                types: token_types.len(),
                tokens: tokens.len(),
            });
        }
        if u32::try_from(tokens.len()).is_err() {
            return Err(TokenizerError::Build(format!(
                "{} tokens do not fit 32-bit ids",
                tokens.len()
            )));
        }

        let mut vocab = Vocab::default();
        for (id, token) in tokens.iter().enumerate() {
            // A repeated string keeps its first id, as llama.cpp's vocabulary does.
            vocab.entry(token.to_string()).or_insert(id as u32);
        }
        let merges = merges
            .iter()
            .enumerate()
            .map(|(index, text)| match text.split_once(' ') {
                Some((a, b)) if !a.is_empty() && !b.is_empty() && !b.contains(' ') => {
                    Ok((a.to_string(), b.to_string()))
                }
                _ => Err(TokenizerError::BadMerge {
                    index,
                    text: text.to_string(),
                }),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(|e| TokenizerError::Build(e.to_string()))?;

        let mut tokenizer = tokenizers::Tokenizer::new(bpe);
        let (split, normalize_nfc) = match pre {
            "qwen35" => (Some(QWEN35_SPLIT), true),
            "qwen2" => (Some(QWEN2_SPLIT), true),
            "llama3" | "llama-bpe" => (Some(LLAMA3_SPLIT), false),
            "gpt2" | "default" => (None, false),
            other => return Err(TokenizerError::UnsupportedPre(other.to_string())),
        };
        if normalize_nfc {
            tokenizer
                .with_normalizer(Some(NFC))
                .map_err(|e| TokenizerError::Build(e.to_string()))?;
        }
        let pre_tokenizer: PreTokenizerWrapper = match split {
            Some(pattern) => {
                let split = Split::new(
                    SplitPattern::Regex(pattern.to_string()),
                    SplitDelimiterBehavior::Isolated,
                    false,
                )
                .map_err(|e| TokenizerError::Build(e.to_string()))?;
                Sequence::new(vec![
                    split.into(),
                    ByteLevel::new(false, false, false).into(),
                ])
                .into()
            }
            // GPT-2's own regex lives inside the byte-level pre-tokenizer.
            None => ByteLevel::new(false, true, true).into(),
        };
        tokenizer.with_pre_tokenizer(Some(pre_tokenizer));
        tokenizer.with_decoder(Some(ByteLevelDecoder::default()));

        // Control and user-defined tokens are matched whole before BPE, never merged into.
        let added: Vec<AddedToken> = tokens
            .iter()
            .zip(&token_types)
            .filter(|(_, t)| matches!(**t, TOKEN_TYPE_CONTROL | TOKEN_TYPE_USER_DEFINED))
            .map(|(text, t)| {
                AddedToken::from(text.to_string(), *t == TOKEN_TYPE_CONTROL).normalized(false)
            })
            .collect();
        let (special, plain): (Vec<AddedToken>, Vec<AddedToken>) =
            added.into_iter().partition(|t| t.special);
        tokenizer
            .add_special_tokens(special)
            .map_err(|e| TokenizerError::Build(e.to_string()))?;
        tokenizer
            .add_tokens(plain)
            .map_err(|e| TokenizerError::Build(e.to_string()))?;

        let mut without_special = tokenizer.clone();
        without_special.set_encode_special_tokens(true);
        let vocab_size = tokens.len();
        Ok(Tokenizer {
            inner: Arc::new(Inner {
                with_special: tokenizer,
                without_special,
                token_types,
                bos_id: token_id_key(gguf, KEY_BOS_ID, vocab_size),
                eos_id: token_id_key(gguf, KEY_EOS_ID, vocab_size),
                eot_id: token_id_key(gguf, KEY_EOT_ID, vocab_size),
            }),
        })
    }

    /// Token ids of `text`. With `parse_special`, control tokens written in the text
    /// (`<|im_start|>`) become their ids — for rendered templates; without, they are plain text —
    /// for anything a user typed. No BOS is added.
    pub fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>, TokenizerError> {
        let tokenizer = if parse_special {
            &self.inner.with_special
        } else {
            &self.inner.without_special
        };
        let encoding = tokenizer
            .encode_fast(text, false)
            .map_err(|e| TokenizerError::Encode(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Text of `ids`; bytes that do not form valid UTF-8 become U+FFFD. Unknown ids are skipped.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> String {
        self.inner
            .with_special
            .decode(ids, skip_special)
            .unwrap_or_else(|_| {
                // Decoding fails only for ids outside the vocabulary: drop those and retry.
                let known: Vec<u32> = ids
                    .iter()
                    .copied()
                    .filter(|&id| (id as usize) < self.vocab_size())
                    .collect();
                self.inner
                    .with_special
                    .decode(&known, skip_special)
                    .unwrap_or_default()
            })
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.token_types.len()
    }

    /// Id of a vocabulary entry, written as the vocabulary stores it (`"Ġworld"`, `"<|im_end|>"`).
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.with_special.token_to_id(token)
    }

    /// The vocabulary entry of `id` as stored (byte-level form; see [`Tokenizer::decode`] for text).
    pub fn token_text(&self, id: u32) -> Option<String> {
        self.inner.with_special.id_to_token(id)
    }

    /// Whether `id` is a control token (`<|im_start|>`, `<|endoftext|>`, …).
    pub fn is_special(&self, id: u32) -> bool {
        self.inner.token_types.get(id as usize).copied() == Some(TOKEN_TYPE_CONTROL)
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.inner.bos_id
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.inner.eos_id
    }

    /// Ids that end a generated turn: EOS, EOT, and `<|im_end|>` / `<|endoftext|>` when the
    /// vocabulary has them (ChatML models end turns with `<|im_end|>` whatever EOS says).
    pub fn stop_ids(&self) -> Vec<u32> {
        let mut ids = Vec::new();
        let named = ["<|im_end|>", "<|endoftext|>"]
            .iter()
            .filter_map(|t| self.token_id(t));
        for id in [self.inner.eos_id, self.inner.eot_id]
            .into_iter()
            .flatten()
            .chain(named)
        {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        ids
    }
}

/// Incremental detokenizer: returns text only once it is complete UTF-8, so a multi-byte
/// character split over several tokens is never emitted half (or as U+FFFD) mid-stream.
///
/// Special tokens are kept by default: the output parser needs `<think>` and `<tool_call>`,
/// which are single special tokens in the Qwen vocabularies.
pub struct StreamDecoder {
    tokenizer: Tokenizer,
    skip_special: bool,
    /// Ids not yet fully turned into emitted text (plus the few before them for context).
    ids: Vec<u32>,
    /// Text of `ids[..prefix_index]`, already emitted.
    prefix: String,
    prefix_index: usize,
}

impl StreamDecoder {
    pub fn new(tokenizer: &Tokenizer) -> StreamDecoder {
        StreamDecoder {
            tokenizer: tokenizer.clone(),
            skip_special: false,
            ids: Vec::new(),
            prefix: String::new(),
            prefix_index: 0,
        }
    }

    /// Drop special tokens from the text (for plain completions that should not show them).
    pub fn skipping_special(mut self) -> StreamDecoder {
        self.skip_special = true;
        self
    }

    /// Text completed by `id`, if any.
    pub fn push(&mut self, id: u32) -> Option<String> {
        let step = tokenizers::tokenizer::step_decode_stream(
            &self.tokenizer.inner.with_special,
            vec![id],
            self.skip_special,
            &mut self.ids,
            &mut self.prefix,
            &mut self.prefix_index,
        );
        match step {
            Ok(text) => text,
            Err(_) => {
                // The decoded window no longer starts with what was emitted (cannot happen with
                // byte-level BPE); emit the window's text whole and start afresh.
                let text = self.tokenizer.decode(&self.ids, self.skip_special);
                let fresh = text
                    .strip_prefix(self.prefix.as_str())
                    .map(str::to_string)
                    .unwrap_or(text);
                self.ids.clear();
                self.prefix.clear();
                self.prefix_index = 0;
                (!fresh.is_empty()).then_some(fresh)
            }
        }
    }

    /// Whatever is still held (an incomplete character at the very end comes out as U+FFFD).
    pub fn finish(&mut self) -> Option<String> {
        let text = self.tokenizer.decode(&self.ids, self.skip_special);
        let rest = match text.strip_prefix(self.prefix.as_str()) {
            Some(rest) => rest.to_string(),
            None => text,
        };
        self.ids.clear();
        self.prefix.clear();
        self.prefix_index = 0;
        (!rest.is_empty()).then_some(rest)
    }
}

impl crate::engine::generate::TokenDecoder for StreamDecoder {
    fn push(&mut self, id: u32) -> Option<String> {
        StreamDecoder::push(self, id)
    }

    fn finish(&mut self) -> Option<String> {
        StreamDecoder::finish(self)
    }
}
