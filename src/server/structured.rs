//! Structured output, enforced: `response_format` (JSON object / JSON schema), a forced tool's
//! input schema, or the `grammar` (Lark) / `regex` extension fields are compiled by llguidance
//! into a token constraint; the sampler then only picks tokens the grammar allows, so the output
//! is valid whatever the weights. A schema llguidance cannot enforce is a 400 naming the problem.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::{Value, json};
use toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};

use super::ApiError;
use crate::engine::generation::TokenConstraint;
use crate::tokenizer::Tokenizer;

/// What the output must match.
#[derive(Debug, Clone, PartialEq)]
pub enum OutputFormat {
    /// Any JSON object.
    JsonObject,
    JsonSchema(Value),
    /// A Lark grammar (llguidance dialect).
    Lark(String),
    Regex(String),
}

/// Compiles grammars against one tokenizer's vocabulary (the token trie is built once).
pub struct Grammars {
    factory: ParserFactory,
}

impl Grammars {
    pub fn new(tokenizer: &Tokenizer) -> Result<Grammars, String> {
        let vocab = tokenizer.vocab_size();
        let eos = tokenizer
            .stop_ids()
            .first()
            .copied()
            .ok_or("the vocabulary has no end-of-turn token")?;
        let decoder = byte_decoder();
        let words: Vec<Vec<u8>> = (0..vocab as u32)
            .map(|id| token_bytes(tokenizer, id, &decoder))
            .collect();
        let trie = TokTrie::from(&TokRxInfo::new(vocab as u32, eos), &words);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
        factory.quiet();
        Ok(Grammars { factory })
    }

    /// A fresh constraint for one request. `param` names the request field in errors.
    pub fn constraint(
        &self,
        format: &OutputFormat,
        param: &str,
    ) -> Result<Box<dyn TokenConstraint>, ApiError> {
        let grammar = top_level_grammar(format);
        let parser = self.factory.create_parser(grammar).map_err(|e| {
            ApiError::invalid_param(param, format!("{param} cannot be enforced: {e}"))
        })?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(ApiError::invalid_param(
                param,
                format!("{param} cannot be enforced: {e}"),
            ));
        }
        Ok(Box::new(LlgConstraint { matcher }))
    }
}

fn top_level_grammar(format: &OutputFormat) -> TopLevelGrammar {
    match format {
        OutputFormat::JsonObject => TopLevelGrammar::from_json_schema(compact(json!({
            "type": "object"
        }))),
        OutputFormat::JsonSchema(schema) => {
            TopLevelGrammar::from_json_schema(compact(schema.clone()))
        }
        OutputFormat::Lark(text) => TopLevelGrammar::from_lark(text.clone()),
        OutputFormat::Regex(rx) => TopLevelGrammar::from_regex(rx),
    }
}

/// Compact JSON (no free whitespace between tokens) unless the schema chose its own options:
/// free whitespace lets a model pad forever without ever finishing the object.
fn compact(mut schema: Value) -> Value {
    if let Value::Object(map) = &mut schema
        && !map.contains_key("x-guidance")
    {
        map.insert(
            "x-guidance".into(),
            json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
        );
    }
    schema
}

struct LlgConstraint {
    matcher: Matcher,
}

impl TokenConstraint for LlgConstraint {
    fn allowed(&mut self, vocab: usize) -> Result<Vec<bool>, String> {
        let mask = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| format!("structured output: {e}"))?;
        Ok((0..vocab as u32).map(|t| mask.is_allowed(t)).collect())
    }

    fn accept(&mut self, token: u32) -> Result<(), String> {
        self.matcher
            .consume_token(token)
            .map_err(|e| format!("structured output: {e}"))
    }
}

/// GPT-2's byte-level alphabet, reversed: the character a vocabulary entry uses → the byte.
fn byte_decoder() -> std::collections::HashMap<char, u8> {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    let mut map = std::collections::HashMap::new();
    let mut next = 0u32;
    for b in 0..=255u8 {
        let c = if printable(b) {
            b as u32
        } else {
            next += 1;
            255 + next
        };
        if let Some(c) = char::from_u32(c) {
            map.insert(c, b);
        }
    }
    map
}

/// A token's bytes: control tokens as toktrie's special marker + name (never matched by
/// grammar text), others through the byte-level alphabet (characters outside it as UTF-8).
fn token_bytes(
    tokenizer: &Tokenizer,
    id: u32,
    decoder: &std::collections::HashMap<char, u8>,
) -> Vec<u8> {
    let Some(text) = tokenizer.token_text(id) else {
        return Vec::new();
    };
    if tokenizer.is_special(id) {
        let mut bytes = vec![TokTrie::SPECIAL_TOKEN_MARKER];
        bytes.extend_from_slice(text.as_bytes());
        return bytes;
    }
    let mut bytes = Vec::with_capacity(text.len());
    for c in text.chars() {
        match decoder.get(&c) {
            Some(&b) => bytes.push(b),
            None => {
                let mut buf = [0u8; 4];
                bytes.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    bytes
}

/// Token bytes for `logprobs` (`bytes` fields): the raw bytes the token stands for.
pub fn token_bytes_of(tokenizer: &Tokenizer, id: u32) -> Vec<u8> {
    thread_local! {
        static DECODER: std::collections::HashMap<char, u8> = byte_decoder();
    }
    if tokenizer.is_special(id) {
        return tokenizer.token_text(id).unwrap_or_default().into_bytes();
    }
    DECODER.with(|d| token_bytes(tokenizer, id, d))
}

/// `response_format`: absent / `text` ⇒ none; `json_object`; `json_schema` with its `schema`.
pub fn parse_response_format(value: Option<&Value>) -> Result<Option<OutputFormat>, ApiError> {
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let kind = value.get("type").and_then(Value::as_str).ok_or_else(|| {
        ApiError::invalid_param(
            "response_format.type",
            "response_format must be an object with a \"type\": text, json_object or json_schema",
        )
    })?;
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(Some(OutputFormat::JsonObject)),
        "json_schema" => {
            let schema = value
                .get("json_schema")
                .and_then(|s| s.get("schema"))
                .filter(|s| s.is_object() || s.is_boolean())
                .ok_or_else(|| {
                    ApiError::invalid_param(
                        "response_format.json_schema.schema",
                        "response_format json_schema needs json_schema.schema (a JSON Schema object)",
                    )
                })?;
            Ok(Some(OutputFormat::JsonSchema(schema.clone())))
        }
        other => Err(ApiError::invalid_param(
            "response_format.type",
            format!(
                "response_format type {other:?} is not supported; use text, json_object or json_schema"
            ),
        )),
    }
}

/// The `grammar` (Lark) and `regex` extension fields; at most one output constraint in all.
pub fn parse_extensions(
    grammar: Option<&Value>,
    regex: Option<&Value>,
) -> Result<Option<(OutputFormat, &'static str)>, ApiError> {
    let text = |v: Option<&Value>, name: &str| -> Result<Option<String>, ApiError> {
        match v {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(ApiError::invalid_param(
                name,
                format!("{name} must be a string"),
            )),
        }
    };
    match (text(grammar, "grammar")?, text(regex, "regex")?) {
        (Some(_), Some(_)) => Err(ApiError::bad_request(
            "give at most one of grammar and regex",
        )),
        (Some(g), None) => Ok(Some((OutputFormat::Lark(g), "grammar"))),
        (None, Some(r)) => Ok(Some((OutputFormat::Regex(r), "regex"))),
        (None, None) => Ok(None),
    }
}

/// The grammar for a forced call of the tool called `name` among `tools` (OpenAI
/// `function.parameters` or Anthropic `input_schema`); None when no such tool is offered.
pub fn forced_tool(tools: &[Value], name: &str) -> Option<OutputFormat> {
    let tool = tools
        .iter()
        .find(|t| super::prompt::tool_name(t) == Some(name))?;
    let schema = tool
        .get("function")
        .and_then(|f| f.get("parameters"))
        .or_else(|| tool.get("input_schema"))
        .or_else(|| tool.get("parameters"))
        .cloned()
        .unwrap_or_else(|| json!({"type": "object"}));
    Some(forced_tool_grammar(name, &schema))
}

/// The Lark grammar for a forced call of tool `name` whose arguments match `schema`, in the
/// `<tool_call>` JSON form the output parser reads.
pub fn forced_tool_grammar(name: &str, schema: &Value) -> OutputFormat {
    let name_json = Value::String(name.to_string()).to_string();
    let lark = format!(
        "start: \"<tool_call>\\n{{\\\"name\\\": \" NAME \", \\\"arguments\\\": \" args \"}}\\n</tool_call>\"\nNAME: {}\nargs: %json {}\n",
        Value::String(name_json),
        compact(schema.clone())
    );
    OutputFormat::Lark(lark)
}
