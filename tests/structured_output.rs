//! Structured output on the built-in demo model: its weights are random, so only the token mask
//! can make the output valid. 200 seeded generations over 10 bounded schemas must all finish and
//! validate; a schema the grammar engine cannot enforce is a 400 that names the problem.

use serde_json::{Value, json};
use strata::cli::load::{BackendChoice, load_backend, open_gguf};
use strata::server::{AppState, LoadedModel, ServerConfig, serve_on};

async fn start() -> String {
    let gguf = open_gguf(None).expect("demo model");
    let backend = load_backend(gguf.clone(), BackendChoice::Cpu, 0).expect("cpu backend");
    let state = AppState::new(ServerConfig {
        parallel: 8,
        ..ServerConfig::default()
    });
    state.set_model(LoadedModel::from_gguf(&gguf, backend).expect("model"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(serve_on(listener, state));
    base
}

fn object(properties: Value) -> Value {
    let required: Vec<String> = properties
        .as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default();
    json!({"type": "object", "properties": properties, "required": required,
           "additionalProperties": false})
}

fn schemas() -> Vec<Value> {
    vec![
        object(json!({"name": {"type": "string", "maxLength": 12},
                      "age": {"type": "integer", "minimum": 0, "maximum": 120}})),
        object(json!({"color": {"enum": ["red", "green", "blue"]}})),
        object(
            json!({"tags": {"type": "array", "items": {"type": "string", "maxLength": 6},
                               "maxItems": 3}}),
        ),
        object(json!({"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}})),
        object(
            json!({"price": {"type": "integer", "minimum": 0, "maximum": 100},
                      "in_stock": {"type": "boolean"}}),
        ),
        object(json!({"ok": {"type": "boolean"},
                      "point": object(json!({"x": {"type": "integer", "minimum": -5, "maximum": 5},
                                             "y": {"type": "integer", "minimum": -5, "maximum": 5}}))})),
        json!({"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 4}),
        object(json!({"id": {"type": "string", "minLength": 2, "maxLength": 5}})),
        json!({"type": "integer", "minimum": 10, "maximum": 99}),
        object(
            json!({"note": {"anyOf": [{"type": "string", "maxLength": 8}, {"type": "null"}]},
                      "count": {"type": "integer", "minimum": 0, "maximum": 9}}),
        ),
    ]
}

fn check_pattern(pattern: &str, s: &str) -> Result<(), String> {
    match pattern {
        "^[A-Z]{3}-[0-9]{2}$" => {
            let b = s.as_bytes();
            let ok = b.len() == 6
                && b[..3].iter().all(u8::is_ascii_uppercase)
                && b[3] == b'-'
                && b[4..].iter().all(u8::is_ascii_digit);
            if ok {
                Ok(())
            } else {
                Err(format!("{s:?} does not match {pattern}"))
            }
        }
        other => Err(format!("the test knows no pattern {other}")),
    }
}

fn type_ok(kind: &str, v: &Value) -> bool {
    match kind {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        // JSON Schema: an integer is a number with no fractional part (so `-0` is one).
        "integer" => v.as_f64().is_some_and(|x| x.fract() == 0.0),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        _ => false,
    }
}

/// A validator for the keywords these schemas use.
fn validate(schema: &Value, v: &Value) -> Result<(), String> {
    if let Some(kind) = schema["type"].as_str()
        && !type_ok(kind, v)
    {
        return Err(format!("{v} is not of type {kind}"));
    }
    if let Some(options) = schema["enum"].as_array()
        && !options.contains(v)
    {
        return Err(format!("{v} is not one of {options:?}"));
    }
    if let Some(any) = schema["anyOf"].as_array()
        && !any.iter().any(|s| validate(s, v).is_ok())
    {
        return Err(format!("{v} matches no anyOf branch"));
    }
    let number = |key: &str| schema[key].as_f64();
    if let Some(x) = v.as_f64()
        && (number("minimum").is_some_and(|m| x < m) || number("maximum").is_some_and(|m| x > m))
    {
        return Err(format!("{x} is out of range"));
    }
    let count = |key: &str| schema[key].as_u64().map(|n| n as usize);
    if let Some(s) = v.as_str() {
        let n = s.chars().count();
        if count("maxLength").is_some_and(|m| n > m) || count("minLength").is_some_and(|m| n < m) {
            return Err(format!("{s:?} has a length out of bounds"));
        }
        if let Some(p) = schema["pattern"].as_str() {
            check_pattern(p, s)?;
        }
    }
    if let Some(items) = v.as_array() {
        if count("maxItems").is_some_and(|m| items.len() > m)
            || count("minItems").is_some_and(|m| items.len() < m)
        {
            return Err(format!("{v} has an item count out of bounds"));
        }
        for item in items {
            validate(&schema["items"], item)?;
        }
    }
    if let Some(map) = v.as_object() {
        let properties = schema["properties"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        for key in schema["required"].as_array().into_iter().flatten() {
            let key = key.as_str().unwrap_or_default();
            if !map.contains_key(key) {
                return Err(format!("{v} lacks {key}"));
            }
        }
        for (key, value) in map {
            match properties.get(key) {
                Some(s) => validate(s, value)?,
                None => return Err(format!("{v} has an extra property {key}")),
            }
        }
    }
    Ok(())
}

async fn generate(client: &reqwest::Client, base: &str, schema: &Value, seed: u64) -> Value {
    let body = json!({
        "messages": [{"role": "user", "content": "Answer in JSON."}],
        "max_tokens": 200,
        "temperature": 1.0,
        "top_k": 0,
        "top_p": 1.0,
        "seed": seed,
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "answer", "schema": schema, "strict": true}},
    });
    let resp = client
        .post(format!("{base}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .expect("post");
    let status = resp.status();
    let answer: Value = resp.json().await.expect("json");
    assert_eq!(status, 200, "{answer}");
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_seeded_generations_over_ten_schemas_all_validate() {
    let base = start().await;
    let client = reqwest::Client::new();
    let mut tasks = Vec::new();
    for (k, schema) in schemas().into_iter().enumerate() {
        for seed in 0..20u64 {
            let (client, base, schema) = (client.clone(), base.clone(), schema.clone());
            tasks.push(tokio::spawn(async move {
                let answer = generate(&client, &base, &schema, seed).await;
                (k, seed, schema, answer)
            }));
        }
    }
    let mut distinct = std::collections::BTreeSet::new();
    for task in tasks {
        let (k, seed, schema, answer) = task.await.expect("task");
        let choice = &answer["choices"][0];
        assert_eq!(
            choice["finish_reason"], "stop",
            "schema {k} seed {seed}: {answer}"
        );
        let text = choice["message"]["content"].as_str().expect("content");
        let value: Value = serde_json::from_str(text)
            .unwrap_or_else(|e| panic!("schema {k} seed {seed}: {text:?} is not JSON: {e}"));
        if let Err(e) = validate(&schema, &value) {
            panic!("schema {k} seed {seed}: {text} does not validate: {e}");
        }
        distinct.insert(text.to_string());
    }
    // Random weights and different seeds: the mask leaves room, so answers vary.
    assert!(
        distinct.len() > 50,
        "only {} distinct answers",
        distinct.len()
    );
}

#[tokio::test]
async fn a_schema_that_cannot_be_enforced_is_a_400_naming_the_problem() {
    let base = start().await;
    let client = reqwest::Client::new();
    let schema = json!({"type": "object", "properties": {"a": {"type": "string"}},
                        "if": {"required": ["a"]}, "then": {"required": ["a"]}});
    let body = json!({
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 8,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
    });
    let resp = client
        .post(format!("{base}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .expect("post");
    assert_eq!(resp.status(), 400);
    let err: Value = resp.json().await.expect("json");
    let message = err["error"]["message"].as_str().expect("message");
    assert!(message.contains("if"), "{message}");
    assert_eq!(err["error"]["param"], "response_format");

    // The regex extension and json_object mode are enforced too.
    let body = json!({"prompt": "code:", "max_tokens": 20, "regex": "[a-f]{4}-[0-9]{3}",
                      "temperature": 1.0, "seed": 3});
    let answer: Value = client
        .post(format!("{base}/v1/completions"))
        .json(&body)
        .send()
        .await
        .expect("post")
        .json()
        .await
        .expect("json");
    let text = answer["choices"][0]["text"].as_str().expect("text");
    let b = text.as_bytes();
    assert!(
        b.len() == 8 && b[..4].iter().all(|c| (b'a'..=b'f').contains(c)) && b[4] == b'-',
        "{text:?}"
    );
}
