//! Turns the raw text of a `<parameter=P>` value into a JSON value, typed by the tool's schema.
//!
//! The template tells the model to write string values verbatim and everything else as JSON,
//! so the schema decides: a `string` parameter keeps its text even when it looks like a number,
//! while `integer`/`number`/`boolean`/`object`/`array` values are parsed, forgiving the slips
//! models make (`True`, trailing blanks, single quotes, trailing commas).

use serde_json::Value;

/// How a parameter's value has to be read, from its JSON schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ValueKind {
    /// Verbatim text (schema type `string`, possibly nullable). Can be streamed as it arrives.
    Text,
    /// JSON of one of these schema types (in schema order; may include "string" as fallback).
    Typed(Vec<String>),
    /// No schema for this parameter (unknown tool or parameter): JSON if it parses, else text.
    Unknown,
}

impl ValueKind {
    pub(crate) fn for_parameter(tool_parameters: Option<&Value>, parameter: &str) -> ValueKind {
        let Some(schema) = tool_parameters
            .and_then(|p| p.get("properties"))
            .and_then(|props| props.get(parameter))
        else {
            return ValueKind::Unknown;
        };
        let mut types = Vec::new();
        collect_schema_types(schema, &mut types, 0);
        if types.is_empty() {
            return ValueKind::Unknown;
        }
        if types.iter().all(|t| t == "string" || t == "null") && types.iter().any(|t| t == "string")
        {
            return ValueKind::Text;
        }
        ValueKind::Typed(types)
    }
}

/// Gathers the `type`s a schema allows, looking through `anyOf`/`oneOf`/`allOf` and `enum`.
fn collect_schema_types(schema: &Value, types: &mut Vec<String>, depth: usize) {
    // Schemas come from clients; a self-nesting one must not recurse without bound.
    if depth > 16 {
        return;
    }
    let mut add = |t: &str| {
        if !types.iter().any(|known| known == t) {
            types.push(t.to_string());
        }
    };
    match schema.get("type") {
        Some(Value::String(t)) => add(t),
        Some(Value::Array(list)) => list.iter().filter_map(Value::as_str).for_each(&mut add),
        _ => {}
    }
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        for v in values {
            add(json_type_name(v));
        }
    }
    if let Some(v) = schema.get("const") {
        add(json_type_name(v));
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(list) = schema.get(key).and_then(Value::as_array) {
            for sub in list {
                collect_schema_types(sub, types, depth + 1);
            }
        }
    }
}

fn json_type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Converts a finished value. `text` is the value with the format's framing newlines removed.
/// Returns the value and, when the text did not fit the schema, a note for the caller's report.
pub(crate) fn convert_value(text: &str, kind: &ValueKind) -> (Value, Option<String>) {
    match kind {
        ValueKind::Text => (Value::String(text.to_string()), None),
        ValueKind::Unknown => {
            match serde_json::from_str::<Value>(text.trim()) {
                // A bare JSON string literal keeps its quotes: the format writes strings raw.
                Ok(v) if !v.is_string() => (v, None),
                _ => (Value::String(text.to_string()), None),
            }
        }
        ValueKind::Typed(types) => {
            let trimmed = text.trim();
            for t in types.iter().filter(|t| *t != "string") {
                if let Some(v) = parse_as(trimmed, t) {
                    return (v, None);
                }
            }
            if types.iter().any(|t| t == "string") {
                return (Value::String(text.to_string()), None);
            }
            let note = format!("value {trimmed:?} does not match schema type {types:?}");
            match lenient_json(trimmed) {
                Some(v) => (v, Some(note)),
                None => (Value::String(text.to_string()), Some(note)),
            }
        }
    }
}

fn parse_as(text: &str, schema_type: &str) -> Option<Value> {
    match schema_type {
        "integer" => parse_integer(text),
        "number" => parse_number(text),
        "boolean" => match text.to_ascii_lowercase().as_str() {
            "true" => Some(Value::Bool(true)),
            "false" => Some(Value::Bool(false)),
            _ => None,
        },
        "null" => match text.to_ascii_lowercase().as_str() {
            "null" | "none" => Some(Value::Null),
            _ => None,
        },
        "object" => lenient_json(text).filter(Value::is_object),
        "array" => lenient_json(text).filter(Value::is_array),
        _ => None,
    }
}

fn parse_integer(text: &str) -> Option<Value> {
    let digits = text.strip_prefix('+').unwrap_or(text);
    if let Ok(i) = digits.parse::<i64>() {
        return Some(Value::from(i));
    }
    if let Ok(u) = digits.parse::<u64>() {
        return Some(Value::from(u));
    }
    // `10.0` or `1e3` for an integer parameter: accept when it is a whole number in range.
    let f = parse_finite_f64(digits)?;
    let in_range = f.fract() == 0.0 && f.abs() < 9.007_199_254_740_992e15;
    in_range.then(|| Value::from(f as i64))
}

fn parse_number(text: &str) -> Option<Value> {
    let digits = text.strip_prefix('+').unwrap_or(text);
    if let Ok(v @ Value::Number(_)) = serde_json::from_str::<Value>(digits) {
        return Some(v);
    }
    parse_finite_f64(digits).and_then(|f| serde_json::Number::from_f64(f).map(Value::Number))
}

fn parse_finite_f64(text: &str) -> Option<f64> {
    // Rust's parser accepts "inf" and "NaN"; JSON has no such numbers.
    text.parse::<f64>().ok().filter(|f| f.is_finite())
}

/// Parses JSON, and failing that a repaired form: Python literals (`True`, `False`, `None`),
/// single-quoted strings and trailing commas, the usual slips when models write JSON.
pub(crate) fn lenient_json(text: &str) -> Option<Value> {
    let text = text.trim();
    if let Ok(v) = serde_json::from_str::<Value>(text) {
        return Some(v);
    }
    serde_json::from_str::<Value>(&repair_json(text)).ok()
}

fn repair_json(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' | '\'' => {
                // Copy a string literal, re-quoting single-quoted ones with double quotes.
                out.push('"');
                i += 1;
                while i < chars.len() && chars[i] != c {
                    match chars[i] {
                        '\\' if i + 1 < chars.len() => {
                            if chars[i + 1] == '\'' {
                                out.push('\'');
                            } else {
                                out.push('\\');
                                out.push(chars[i + 1]);
                            }
                            i += 2;
                            continue;
                        }
                        '"' => out.push_str("\\\""),
                        other => out.push(other),
                    }
                    i += 1;
                }
                out.push('"');
                i += 1;
            }
            ',' => {
                // Drop a trailing comma before `}` or `]`.
                let next = chars[i + 1..].iter().find(|c| !c.is_whitespace());
                if !matches!(next, Some('}') | Some(']')) {
                    out.push(',');
                }
                i += 1;
            }
            c if c.is_ascii_alphabetic() => {
                let start = i;
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                out.push_str(match word.as_str() {
                    "True" => "true",
                    "False" => "false",
                    "None" => "null",
                    other => other,
                });
            }
            other => {
                out.push(other);
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn kind(schema: Value) -> ValueKind {
        ValueKind::for_parameter(Some(&json!({"properties": {"p": schema}})), "p")
    }

    #[test]
    fn schema_decides_the_kind() {
        assert_eq!(kind(json!({"type": "string"})), ValueKind::Text);
        assert_eq!(kind(json!({"type": ["string", "null"]})), ValueKind::Text);
        assert_eq!(kind(json!({"enum": ["a", "b"]})), ValueKind::Text);
        assert_eq!(
            kind(json!({"anyOf": [{"type": "integer"}, {"type": "null"}]})),
            ValueKind::Typed(vec!["integer".into(), "null".into()])
        );
        assert_eq!(kind(json!({"description": "no type"})), ValueKind::Unknown);
        assert_eq!(
            ValueKind::for_parameter(Some(&json!({"properties": {}})), "p"),
            ValueKind::Unknown
        );
    }

    #[test]
    fn typed_values_are_parsed_leniently() {
        let int = ValueKind::Typed(vec!["integer".into()]);
        assert_eq!(convert_value("10\n", &int).0, json!(10));
        assert_eq!(convert_value("10.0", &int).0, json!(10));
        let boolean = ValueKind::Typed(vec!["boolean".into()]);
        assert_eq!(convert_value("True", &boolean).0, json!(true));
        assert_eq!(convert_value("false ", &boolean).0, json!(false));
        let obj = ValueKind::Typed(vec!["object".into()]);
        assert_eq!(
            convert_value("{'a': True, 'b': [1, 2,],}", &obj).0,
            json!({"a": true, "b": [1, 2]})
        );
        let (v, note) = convert_value("ten", &int);
        assert_eq!(v, json!("ten"));
        assert!(note.is_some());
    }

    #[test]
    fn strings_stay_strings() {
        assert_eq!(convert_value("00123", &ValueKind::Text).0, json!("00123"));
        assert_eq!(convert_value("42", &ValueKind::Text).0, json!("42"));
        assert_eq!(convert_value("42", &ValueKind::Unknown).0, json!(42));
        assert_eq!(
            convert_value("\"quoted\"", &ValueKind::Unknown).0,
            json!("\"quoted\"")
        );
    }
}
