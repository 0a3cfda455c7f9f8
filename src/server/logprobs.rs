//! `logprobs` in OpenAI's two shapes: chat (`{"content": [{token, logprob, bytes, top_logprobs}]}`)
//! and legacy completions (`{tokens, token_logprobs, top_logprobs, text_offset}`). The values are
//! the model's raw distribution (see [`crate::sampler::logprobs`]).

use serde_json::{Map, Value, json};

use super::structured::token_bytes_of;
use crate::sampler::logprobs::{TokenLogprob, TokenLogprobs};
use crate::tokenizer::Tokenizer;

fn token_string(tokenizer: &Tokenizer, id: u32) -> String {
    String::from_utf8_lossy(&token_bytes_of(tokenizer, id)).into_owned()
}

fn chat_entry(tokenizer: &Tokenizer, t: &TokenLogprob) -> Value {
    json!({
        "token": token_string(tokenizer, t.id),
        "logprob": t.logprob,
        "bytes": token_bytes_of(tokenizer, t.id),
    })
}

/// Chat `logprobs` object for some tokens.
pub fn chat_logprobs(tokenizer: &Tokenizer, tokens: &[TokenLogprobs]) -> Value {
    let content: Vec<Value> = tokens
        .iter()
        .map(|t| {
            let mut entry = chat_entry(tokenizer, &t.chosen);
            entry["top_logprobs"] = t.top.iter().map(|c| chat_entry(tokenizer, c)).collect();
            entry
        })
        .collect();
    json!({ "content": content, "refusal": null })
}

/// Completions `logprobs` object; `offset` is the text length before these tokens.
pub fn completion_logprobs(
    tokenizer: &Tokenizer,
    tokens: &[TokenLogprobs],
    offset: usize,
) -> Value {
    let mut text_offset = Vec::with_capacity(tokens.len());
    let mut at = offset;
    let mut strings = Vec::with_capacity(tokens.len());
    for t in tokens {
        let s = token_string(tokenizer, t.chosen.id);
        text_offset.push(at);
        at += s.len();
        strings.push(s);
    }
    let top: Vec<Value> = tokens
        .iter()
        .map(|t| {
            let map: Map<String, Value> = t
                .top
                .iter()
                .map(|c| (token_string(tokenizer, c.id), json!(c.logprob)))
                .collect();
            Value::Object(map)
        })
        .collect();
    json!({
        "tokens": strings,
        "token_logprobs": tokens.iter().map(|t| t.chosen.logprob).collect::<Vec<f32>>(),
        "top_logprobs": top,
        "text_offset": text_offset,
    })
}
