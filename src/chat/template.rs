//! Renders a model's Jinja chat template the way Hugging Face `transformers`
//! (`apply_chat_template`) does, so prompts match the ones the model was trained on byte for byte.
//!
//! transformers runs Jinja2 with `trim_blocks` and `lstrip_blocks`, adds `raise_exception`,
//! `strftime_now` and a `tojson` filter that is Python's `json.dumps` (`", "` / `": "`
//! separators, non-ASCII kept as is, no HTML escaping), and lets templates call Python string and
//! dict methods. minijinja with minijinja-contrib's `pycompat` provides the rest.

use minijinja::value::{Kwargs, Serde, Value as JinjaValue, ValueKind};
use minijinja::{Environment, ErrorKind};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::gguf::Gguf;

/// GGUF metadata key holding the default chat template.
pub const KEY_CHAT_TEMPLATE: &str = "tokenizer.chat_template";

const TEMPLATE_NAME: &str = "chat_template";
/// Marks errors produced by the template's own `raise_exception(...)` calls.
const REFUSAL_MARK: &str = "template refused the conversation: ";

#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error("the model has no chat template (GGUF key `{KEY_CHAT_TEMPLATE}` is missing)")]
    NoTemplate,
    #[error("GGUF key `{KEY_CHAT_TEMPLATE}` is not a string")]
    TemplateNotString,
    #[error("chat template does not compile: {0}")]
    Syntax(String),
    /// The template rejected the conversation (`raise_exception`), e.g. a misplaced system
    /// message or an unknown reasoning effort: the client's input is at fault.
    #[error("{0}")]
    Refused(String),
    #[error("chat template failed to render: {0}")]
    Render(String),
}

/// One chat message, as the server receives it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: Option<String>,
    pub reasoning_content: Option<String>,
    #[serde(default)]
    pub tool_calls: Vec<ToolCall>,
    pub tool_call_id: Option<String>,
    pub name: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// A JSON object.
    pub arguments: Value,
}

#[derive(Debug, Clone, Default)]
pub struct RenderOptions {
    pub add_generation_prompt: bool,
    pub enable_thinking: Option<bool>,
    pub reasoning_effort: Option<String>,
    /// OpenAI tool objects `{"type":"function","function":{...}}`, in the client's key order.
    pub tools: Option<Vec<Value>>,
    /// Further template variables; they override everything above.
    pub extra: Map<String, Value>,
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    /// Variables transformers adds from the tokenizer's special tokens (`bos_token`, `eos_token`).
    special_tokens: Map<String, Value>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_bytes", &self.source.len())
            .finish()
    }
}

impl ChatTemplate {
    /// The template stored in the GGUF (`tokenizer.chat_template`). A model without one is an
    /// error: guessing a format would silently produce prompts the model was not trained on.
    pub fn from_gguf(gguf: &Gguf) -> Result<ChatTemplate, ChatError> {
        let source = match gguf.get(KEY_CHAT_TEMPLATE) {
            None => return Err(ChatError::NoTemplate),
            Some(value) => value.as_str().ok_or(ChatError::TemplateNotString)?,
        };
        let mut template = ChatTemplate::from_source(source)?;
        for (variable, id_key) in [
            ("bos_token", "tokenizer.ggml.bos_token_id"),
            ("eos_token", "tokenizer.ggml.eos_token_id"),
        ] {
            if let Some(text) = special_token_text(gguf, id_key) {
                template
                    .special_tokens
                    .insert(variable.to_string(), Value::String(text));
            }
        }
        Ok(template)
    }

    pub fn from_source(source: &str) -> Result<ChatTemplate, ChatError> {
        let mut env = Environment::new();
        // transformers' Jinja2 settings; trailing newline of the source is dropped as in Jinja2.
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(false)
            .build()
            .map_err(|e| ChatError::Syntax(describe(&e)))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", python_tojson);
        // Jinja2's `sequence` test is true for anything with a length and indexing: strings and
        // dicts too (minijinja's is true for lists only).
        env.add_test("sequence", |value: &JinjaValue| {
            matches!(
                value.kind(),
                ValueKind::Seq | ValueKind::Map | ValueKind::String
            )
        });
        env.add_template_owned(TEMPLATE_NAME, strip_generation_tags(source))
            .map_err(|e| ChatError::Syntax(describe(&e)))?;
        Ok(ChatTemplate {
            env,
            source: source.to_string(),
            special_tokens: Map::new(),
        })
    }

    /// The template text as stored in the model.
    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn render(&self, messages: &[Message], opts: &RenderOptions) -> Result<String, ChatError> {
        let mut context = self.special_tokens.clone();
        context.insert(
            "messages".to_string(),
            Value::Array(messages.iter().map(message_for_template).collect()),
        );
        // transformers always passes `tools` and `documents`, as None when there are none.
        let tools = opts.tools.clone().map(Value::Array).unwrap_or(Value::Null);
        context.insert("tools".to_string(), tools);
        context.insert("documents".to_string(), Value::Null);
        context.insert(
            "add_generation_prompt".to_string(),
            Value::Bool(opts.add_generation_prompt),
        );
        if let Some(enable) = opts.enable_thinking {
            context.insert("enable_thinking".to_string(), Value::Bool(enable));
        }
        if let Some(effort) = &opts.reasoning_effort {
            context.insert(
                "reasoning_effort".to_string(),
                Value::String(effort.clone()),
            );
        }
        for (key, value) in &opts.extra {
            context.insert(key.clone(), value.clone());
        }
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| ChatError::Render(describe(&e)))?;
        template
            .render(JinjaValue::from(Serde(&context)))
            .map_err(|e| match refusal_message(&e) {
                Some(message) => ChatError::Refused(message),
                None => ChatError::Render(describe(&e)),
            })
    }
}

/// The text of a special token given by its id key, from the GGUF vocabulary.
fn special_token_text(gguf: &Gguf, id_key: &str) -> Option<String> {
    let id = usize::try_from(gguf.get_u64(id_key)?).ok()?;
    let tokens = gguf.get_array("tokenizer.ggml.tokens")?;
    tokens.get(id)?.as_str().map(str::to_string)
}

/// The message as a Hugging Face template expects it: absent fields are absent (undefined), tool
/// calls use the OpenAI shape with the arguments as a mapping.
fn message_for_template(message: &Message) -> Value {
    let mut map = Map::new();
    map.insert("role".to_string(), Value::String(message.role.clone()));
    map.insert(
        "content".to_string(),
        message
            .content
            .clone()
            .map(Value::String)
            .unwrap_or(Value::Null),
    );
    if let Some(reasoning) = &message.reasoning_content {
        map.insert(
            "reasoning_content".to_string(),
            Value::String(reasoning.clone()),
        );
    }
    if !message.tool_calls.is_empty() {
        let calls = message
            .tool_calls
            .iter()
            .map(|call| {
                let mut entry = Map::new();
                entry.insert("type".to_string(), Value::String("function".to_string()));
                if !call.id.is_empty() {
                    entry.insert("id".to_string(), Value::String(call.id.clone()));
                }
                let mut function = Map::new();
                function.insert("name".to_string(), Value::String(call.name.clone()));
                function.insert("arguments".to_string(), arguments_mapping(&call.arguments));
                entry.insert("function".to_string(), Value::Object(function));
                Value::Object(entry)
            })
            .collect();
        map.insert("tool_calls".to_string(), Value::Array(calls));
    }
    if let Some(id) = &message.tool_call_id {
        map.insert("tool_call_id".to_string(), Value::String(id.clone()));
    }
    if let Some(name) = &message.name {
        map.insert("name".to_string(), Value::String(name.clone()));
    }
    Value::Object(map)
}

/// Templates render arguments given as a mapping (`arguments | items`); OpenAI clients send
/// them JSON-encoded in a string, so a string holding a JSON object is decoded.
fn arguments_mapping(arguments: &Value) -> Value {
    match arguments {
        Value::String(encoded) => match serde_json::from_str::<Value>(encoded) {
            Ok(object @ Value::Object(_)) => object,
            _ => arguments.clone(),
        },
        other => other.clone(),
    }
}

fn raise_exception(message: String) -> Result<JinjaValue, minijinja::Error> {
    Err(minijinja::Error::new(
        ErrorKind::InvalidOperation,
        format!("{REFUSAL_MARK}{message}"),
    ))
}

/// `strftime_now(format)`: the current UTC time in a Python `strftime` format.
fn strftime_now(format: String) -> Result<String, minijinja::Error> {
    use std::fmt::Write as _;
    let mut out = String::new();
    write!(out, "{}", jiff::Timestamp::now().strftime(&format)).map_err(|_| {
        minijinja::Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: unsupported format {format:?}"),
        )
    })?;
    Ok(out)
}

/// `tojson` as transformers defines it: `json.dumps(x, ensure_ascii=False, indent=indent,
/// separators=separators, sort_keys=sort_keys)`.
fn python_tojson(value: &JinjaValue, kwargs: Kwargs) -> Result<JinjaValue, minijinja::Error> {
    let indent: Option<JinjaValue> = kwargs.get("indent")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<JinjaValue> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;

    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(match v.as_str() {
            Some(s) => s.to_string(),
            None => {
                let n = i64::try_from(v.clone()).map_err(|_| {
                    minijinja::Error::new(ErrorKind::InvalidOperation, "tojson: bad indent")
                })?;
                " ".repeat(usize::try_from(n.clamp(0, 64)).unwrap_or(0))
            }
        }),
    };
    let (item_separator, key_separator) = match separators {
        Some(seps) if !seps.is_none() => {
            let item = seps.get_item(&JinjaValue::from(0))?;
            let key = seps.get_item(&JinjaValue::from(1))?;
            match (item.as_str(), key.as_str()) {
                (Some(item), Some(key)) => (item.to_string(), key.to_string()),
                _ => {
                    return Err(minijinja::Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be two strings",
                    ));
                }
            }
        }
        // Python's defaults: "," with indentation, ", " without; ": " always.
        _ if indent.is_some() => (",".to_string(), ": ".to_string()),
        _ => (", ".to_string(), ": ".to_string()),
    };
    let formatter = PythonJsonFormatter {
        indent,
        item_separator,
        key_separator,
        ensure_ascii: ensure_ascii.unwrap_or(false),
        depth: 0,
        has_items: false,
    };
    let mut out = Vec::new();
    let mut serializer = serde_json::Serializer::with_formatter(&mut out, formatter);
    if sort_keys.unwrap_or(false) {
        let mut plain: Value = serde_json::to_value(value)
            .map_err(|e| minijinja::Error::new(ErrorKind::BadSerialization, e.to_string()))?;
        sort_object_keys(&mut plain);
        plain.serialize(&mut serializer)
    } else {
        value.serialize(&mut serializer)
    }
    .map_err(|e| minijinja::Error::new(ErrorKind::BadSerialization, e.to_string()))?;
    let text = String::from_utf8(out)
        .map_err(|e| minijinja::Error::new(ErrorKind::BadSerialization, e.to_string()))?;
    Ok(JinjaValue::from_safe_string(text))
}

fn sort_object_keys(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.sort_keys();
            map.values_mut().for_each(sort_object_keys);
        }
        Value::Array(items) => items.iter_mut().for_each(sort_object_keys),
        _ => {}
    }
}

/// serde_json output in Python `json.dumps` layout.
struct PythonJsonFormatter {
    indent: Option<String>,
    item_separator: String,
    key_separator: String,
    ensure_ascii: bool,
    depth: usize,
    /// The innermost open container has items (decides the newline before its closer).
    has_items: bool,
}

impl PythonJsonFormatter {
    fn newline_and_indent<W: ?Sized + std::io::Write>(&self, w: &mut W) -> std::io::Result<()> {
        if let Some(unit) = &self.indent {
            w.write_all(b"\n")?;
            for _ in 0..self.depth {
                w.write_all(unit.as_bytes())?;
            }
        }
        Ok(())
    }

    fn open<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        bracket: &[u8],
    ) -> std::io::Result<()> {
        self.depth += 1;
        self.has_items = false;
        w.write_all(bracket)
    }

    fn close<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        bracket: &[u8],
    ) -> std::io::Result<()> {
        self.depth = self.depth.saturating_sub(1);
        if self.has_items {
            self.newline_and_indent(w)?;
        }
        // The enclosing container necessarily has at least this item.
        self.has_items = true;
        w.write_all(bracket)
    }

    fn item<W: ?Sized + std::io::Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
        if !first {
            w.write_all(self.item_separator.as_bytes())?;
        }
        self.has_items = true;
        self.newline_and_indent(w)
    }
}

impl serde_json::ser::Formatter for PythonJsonFormatter {
    fn begin_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.open(w, b"[")
    }
    fn end_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.close(w, b"]")
    }
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.item(w, first)
    }
    fn begin_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.open(w, b"{")
    }
    fn end_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.close(w, b"}")
    }
    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.item(w, first)
    }
    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(self.key_separator.as_bytes())
    }
    fn write_string_fragment<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        if !self.ensure_ascii {
            return w.write_all(fragment.as_bytes());
        }
        let mut units = [0u16; 2];
        for c in fragment.chars() {
            if c.is_ascii() {
                w.write_all(&[c as u8])?;
            } else {
                for unit in c.encode_utf16(&mut units) {
                    write!(w, "\\u{unit:04x}")?;
                }
            }
        }
        Ok(())
    }
}

/// transformers' `{% generation %}` marks the assistant spans for training masks and renders
/// nothing; minijinja has no such tag, so the markers are removed before compiling.
fn strip_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        let Some(end) = rest[start..].find("%}").map(|e| start + e + 2) else {
            break;
        };
        let inner = rest[start + 2..end - 2]
            .trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
        out.push_str(&rest[..start]);
        if inner != "generation" && inner != "endgeneration" {
            out.push_str(&rest[start..end]);
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

fn refusal_message(error: &minijinja::Error) -> Option<String> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = current {
        if let Some(jinja) = e.downcast_ref::<minijinja::Error>()
            && let Some(detail) = jinja.detail()
            && let Some(message) = detail.strip_prefix(REFUSAL_MARK)
        {
            return Some(message.to_string());
        }
        current = e.source();
    }
    None
}

/// The error with its template line, which minijinja keeps out of `Display`.
fn describe(error: &minijinja::Error) -> String {
    match error.line() {
        Some(line) => format!("{error} (template line {line})"),
        None => error.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render_expr(expr: &str) -> String {
        let template = ChatTemplate::from_source(&format!("{{{{ {expr} }}}}")).expect("compiles");
        template
            .render(&[], &RenderOptions::default())
            .expect("renders")
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        assert_eq!(
            render_expr(r#"{"a": 1, "b": [1, 2], "c": "é<&>'"} | tojson"#),
            r#"{"a": 1, "b": [1, 2], "c": "é<&>'"}"#
        );
        assert_eq!(
            render_expr(r#"{"b": {}, "a": []} | tojson(indent=2)"#),
            "{\n  \"b\": {},\n  \"a\": []\n}"
        );
        assert_eq!(
            render_expr(
                r#"{"b": [1, {"x": 2}], "a": "é"} | tojson(sort_keys=true, ensure_ascii=true)"#
            ),
            r#"{"a": "\u00e9", "b": [1, {"x": 2}]}"#
        );
        assert_eq!(
            render_expr(r#"[1, 2] | tojson(separators=(",", ":"))"#),
            "[1,2]"
        );
    }

    #[test]
    fn python_string_methods_and_refusals() {
        assert_eq!(render_expr(r#""a,b".split(",")[-1] ~ " x ".strip()"#), "bx");
        assert_eq!(render_expr(r#""<think>".startswith("<th")"#), "True");
        assert_eq!(
            render_expr(r#"["s" is sequence, {} is sequence, [1] is sequence, 1 is sequence]"#),
            "[True, True, True, False]"
        );
        let template =
            ChatTemplate::from_source("{{ raise_exception('no way') }}").expect("compiles");
        match template.render(&[], &RenderOptions::default()) {
            Err(ChatError::Refused(message)) => assert_eq!(message, "no way"),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn generation_markers_are_ignored() {
        let template = ChatTemplate::from_source("a{% generation %}b{%- endgeneration -%}c")
            .expect("compiles");
        assert_eq!(
            template
                .render(&[], &RenderOptions::default())
                .expect("renders"),
            "abc"
        );
    }
}
