//! Acceptance regressions found by driving the server with the official OpenAI / Anthropic
//! Python clients, curl and malformed requests (see `scripts/client_check.py`): CORS for browser
//! chat UIs, content-type handling, and error messages a person can act on.
//!
//! `serve_scripted_fake` (ignored) serves a fake model that always answers with reasoning, text
//! and two tool calls, so the Python clients' parsing of tool-call shapes can be checked:
//! `STRATA_FAKE_ADDR=127.0.0.1:8099 cargo test --test accept_server -- --ignored serve_scripted_fake`
//! then `python scripts/client_check.py --base http://127.0.0.1:8099 --tools`.

use std::sync::Arc;

use serde_json::{Value, json};
use strata::gguf::Gguf;
use strata::server::testing::{FakeBackend, FakeOptions};
use strata::server::{AppState, LoadedModel, ServerConfig, serve_on};

const TINY: &str = "tests/fixtures/tiny/tiny-F16.gguf";
const IM_END: u32 = 511;
const KEY: &str = "sekret";

/// Reasoning, text, then two parallel calls, in the model's XML tool-call format.
const TWO_CALLS: &str = "Need the weather.\n</think>\n\nLet me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nLyon\n</parameter>\n</function>\n</tool_call>";

fn tiny() -> Gguf {
    Gguf::open(TINY).expect("tiny fixture model")
}

fn backend(script: &str) -> Arc<FakeBackend> {
    let tokenizer = strata::tokenizer::Tokenizer::from_gguf(&tiny()).expect("tokenizer");
    let options = if script.is_empty() {
        FakeOptions {
            suppressed: tokenizer.stop_ids(),
            ..FakeOptions::default()
        }
    } else {
        FakeOptions {
            script: tokenizer.encode(script, false).expect("encode"),
            script_end: Some(IM_END),
            ..FakeOptions::default()
        }
    };
    Arc::new(FakeBackend::new(512, 2048, options))
}

async fn start(listener: tokio::net::TcpListener, script: &str, api_key: Option<&str>) -> String {
    let state = AppState::new(ServerConfig {
        api_key: api_key.map(str::to_string),
        ..ServerConfig::default()
    });
    state.set_model(LoadedModel::from_gguf(&tiny(), backend(script)).expect("model"));
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(serve_on(listener, state));
    base
}

async fn start_local(script: &str, api_key: Option<&str>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    start(listener, script, api_key).await
}

async fn json_of(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    let text = response.text().await.expect("body");
    let value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (status, value)
}

#[tokio::test]
#[ignore = "serves until killed; for scripts/client_check.py --tools"]
async fn serve_scripted_fake() {
    let addr = std::env::var("STRATA_FAKE_ADDR").unwrap_or_else(|_| "127.0.0.1:8099".into());
    let listener = tokio::net::TcpListener::bind(&addr).await.expect("bind");
    let base = start(listener, TWO_CALLS, None).await;
    eprintln!("scripted fake server on {base}");
    std::future::pending::<()>().await;
}

#[tokio::test]
async fn cors_preflight_is_answered_without_the_api_key_and_errors_carry_cors_headers() {
    let base = start_local("", Some(KEY)).await;
    let client = reqwest::Client::new();
    let preflight = client
        .request(
            reqwest::Method::OPTIONS,
            format!("{base}/v1/chat/completions"),
        )
        .header("Origin", "http://localhost:3000")
        .header("Access-Control-Request-Method", "POST")
        .header(
            "Access-Control-Request-Headers",
            "authorization,content-type",
        )
        .send()
        .await
        .expect("preflight");
    assert_eq!(preflight.status().as_u16(), 200);
    let headers = preflight.headers();
    assert_eq!(headers["access-control-allow-origin"], "*");
    let methods = headers["access-control-allow-methods"]
        .to_str()
        .expect("ascii");
    assert!(methods == "*" || methods.contains("POST"), "{methods}");

    // A request without the key is refused, and the browser can still read why.
    let refused = client
        .get(format!("{base}/v1/models"))
        .header("Origin", "http://localhost:3000")
        .send()
        .await
        .expect("models");
    assert_eq!(refused.status().as_u16(), 401);
    assert_eq!(refused.headers()["access-control-allow-origin"], "*");
    let allowed = client
        .get(format!("{base}/v1/models"))
        .header("Origin", "http://localhost:3000")
        .bearer_auth(KEY)
        .send()
        .await
        .expect("models");
    assert_eq!(allowed.status().as_u16(), 200);
    assert_eq!(allowed.headers()["access-control-allow-origin"], "*");
}

#[tokio::test]
async fn a_body_declared_as_not_json_is_415_with_a_hint_and_undeclared_json_is_read() {
    let base = start_local("", None).await;
    let client = reqwest::Client::new();
    let body =
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).to_string();
    for (path, anthropic) in [
        ("/v1/chat/completions", false),
        ("/v1/messages", true),
        ("/v1/completions", false),
    ] {
        for content_type in ["text/plain", "application/x-www-form-urlencoded"] {
            let (status, err) = json_of(
                client
                    .post(format!("{base}{path}"))
                    .header("content-type", content_type)
                    .body(body.clone())
                    .send()
                    .await
                    .expect("post"),
            )
            .await;
            assert_eq!(status, 415, "{path} {content_type}: {err}");
            let message = if anthropic {
                assert_eq!(err["type"], "error");
                err["error"]["message"].as_str()
            } else {
                err["error"]["message"].as_str()
            }
            .expect("message");
            assert!(message.contains("application/json"), "{message}");
        }
    }
    // JSON with parameters, a +json type, and no declared type at all are all read.
    for content_type in [
        Some("application/json; charset=utf-8"),
        Some("application/vnd.api+json"),
        None,
    ] {
        let mut request = client
            .post(format!("{base}/v1/chat/completions"))
            .body(body.clone());
        if let Some(ct) = content_type {
            request = request.header("content-type", ct);
        }
        let (status, resp) = json_of(request.send().await.expect("post")).await;
        assert_eq!(status, 200, "{content_type:?}: {resp}");
        assert_eq!(resp["object"], "chat.completion");
    }
}

#[tokio::test]
async fn body_shape_errors_speak_json_not_rust() {
    let base = start_local("", None).await;
    let client = reqwest::Client::new();
    let post = |path: &str, body: &'static str| {
        client
            .post(format!("{base}{path}"))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let (status, err) = json_of(post("/v1/chat/completions", "[1,2]").await.expect("post")).await;
    assert_eq!(status, 400);
    assert_eq!(
        err["error"]["message"],
        "the request body must be a JSON object, got an array"
    );
    let (status, err) = json_of(post("/v1/messages", "\"hi\"").await.expect("post")).await;
    assert_eq!(status, 400);
    assert_eq!(err["type"], "error");
    assert_eq!(
        err["error"]["message"],
        "the request body must be a JSON object, got a string"
    );
    let (status, err) = json_of(
        post(
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":"10"}"#,
        )
        .await
        .expect("post"),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(err["error"]["param"], "max_tokens");
    let message = err["error"]["message"].as_str().expect("message");
    assert!(message.contains("integer"), "{message}");
    assert!(!message.contains("i64"), "{message}");
    let (status, err) = json_of(
        post("/v1/chat/completions", r#"{"messages":{"role":"user"}}"#)
            .await
            .expect("post"),
    )
    .await;
    assert_eq!(status, 400);
    let message = err["error"]["message"].as_str().expect("message");
    assert!(message.contains("expected an array"), "{message}");
    // Syntax errors still carry the position.
    let (status, err) = json_of(
        post("/v1/messages", "{\"messages\": [")
            .await
            .expect("post"),
    )
    .await;
    assert_eq!(status, 400);
    let message = err["error"]["message"].as_str().expect("message");
    assert!(
        message.contains("not valid JSON") && message.contains("column"),
        "{message}"
    );
}

#[tokio::test]
async fn bearer_scheme_is_case_insensitive() {
    let base = start_local("", Some(KEY)).await;
    let client = reqwest::Client::new();
    for (header, expected) in [
        (format!("Bearer {KEY}"), 200),
        (format!("bearer {KEY}"), 200),
        (format!("BEARER {KEY}"), 200),
        (format!("Basic {KEY}"), 401),
        (KEY.to_string(), 401),
        ("Bearer wrong".to_string(), 401),
    ] {
        let status = client
            .get(format!("{base}/v1/models"))
            .header("authorization", &header)
            .send()
            .await
            .expect("models")
            .status()
            .as_u16();
        assert_eq!(status, expected, "Authorization: {header}");
    }
}

#[tokio::test]
async fn models_retrieve_answers_for_the_served_model_only() {
    let base = start_local("", None).await;
    let client = reqwest::Client::new();
    let (status, list) = json_of(
        client
            .get(format!("{base}/v1/models"))
            .send()
            .await
            .expect("list"),
    )
    .await;
    assert_eq!(status, 200);
    let name = list["data"][0]["id"].as_str().expect("id").to_string();
    let (status, model) = json_of(
        client
            .get(format!("{base}/v1/models/{name}"))
            .send()
            .await
            .expect("retrieve"),
    )
    .await;
    assert_eq!(status, 200, "{model}");
    assert_eq!(model, list["data"][0]);
    let (status, err) = json_of(
        client
            .get(format!("{base}/v1/models/gpt-4o"))
            .send()
            .await
            .expect("retrieve"),
    )
    .await;
    assert_eq!(status, 404);
    assert_eq!(err["error"]["code"], "model_not_found");
    let message = err["error"]["message"].as_str().expect("message");
    assert!(
        message.contains("gpt-4o") && message.contains(&name),
        "{message}"
    );
}

#[tokio::test]
async fn any_reported_seed_can_be_replayed_and_sampling_errors_name_their_param() {
    let base = start_local("", None).await;
    let client = reqwest::Client::new();
    let post = |path: &'static str, body: Value| {
        let client = client.clone();
        let url = format!("{base}{path}");
        async move { json_of(client.post(url).json(&body).send().await.expect("post")).await }
    };
    let messages = json!([{"role": "user", "content": "hello"}]);
    // Seeds above i64::MAX are what the server itself reports for half of all drawn seeds.
    for (seed, same_as) in [
        (json!(u64::MAX), json!(-1)),
        (
            json!(9_876_543_210_987_654_321u64),
            json!(-8_570_200_862_721_897_295i64),
        ),
    ] {
        let (status, first) = post(
            "/v1/chat/completions",
            json!({"messages": messages, "max_tokens": 6, "temperature": 1.0, "seed": seed}),
        )
        .await;
        assert_eq!(status, 200, "{first}");
        assert_eq!(first["seed"], seed);
        let (status, again) = post(
            "/v1/chat/completions",
            json!({"messages": messages, "max_tokens": 6, "temperature": 1.0, "seed": first["seed"]}),
        )
        .await;
        assert_eq!(status, 200, "{again}");
        assert_eq!(again["choices"], first["choices"]);
        // The signed spelling of the same 64 bits is the same seed.
        let (status, signed) = post(
            "/v1/chat/completions",
            json!({"messages": messages, "max_tokens": 6, "temperature": 1.0, "seed": same_as}),
        )
        .await;
        assert_eq!(status, 200, "{signed}");
        assert_eq!(signed["choices"], first["choices"]);
        assert_eq!(signed["seed"], seed);
        let (status, anthropic) = post(
            "/v1/messages",
            json!({"messages": messages, "max_tokens": 2, "seed": seed}),
        )
        .await;
        assert_eq!(status, 200, "{anthropic}");
    }
    for bad in [json!("abc"), json!(1.5), json!(1e30)] {
        let (status, err) = post(
            "/v1/chat/completions",
            json!({"messages": messages, "max_tokens": 2, "seed": bad}),
        )
        .await;
        assert_eq!(status, 400, "{bad}: {err}");
        assert_eq!(err["error"]["param"], "seed");
        let message = err["error"]["message"].as_str().expect("message");
        assert!(message.contains("seed must be an integer"), "{message}");
    }
    for (field, value) in [
        ("temperature", json!(-1)),
        ("top_p", json!(2)),
        ("presence_penalty", json!(5)),
    ] {
        let mut body = json!({"messages": messages, "max_tokens": 2});
        body[field] = value;
        let (status, err) = post("/v1/chat/completions", body).await;
        assert_eq!(status, 400, "{err}");
        assert_eq!(err["error"]["param"], field, "{err}");
    }
}

#[tokio::test]
async fn anthropic_message_with_no_blocks_is_named_not_reported_as_no_messages() {
    let base = start_local("", None).await;
    let body = json!({"max_tokens": 4, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": []},
    ]});
    let (status, err) = json_of(
        reqwest::Client::new()
            .post(format!("{base}/v1/messages"))
            .json(&body)
            .send()
            .await
            .expect("post"),
    )
    .await;
    assert_eq!(status, 400, "{err}");
    assert_eq!(err["type"], "error");
    assert_eq!(err["error"]["type"], "invalid_request_error");
    let message = err["error"]["message"].as_str().expect("message");
    assert!(
        message.starts_with("messages[2].content is empty"),
        "{message}"
    );
}

#[tokio::test]
async fn wrong_method_is_405_with_an_error_object() {
    let base = start_local("", None).await;
    let client = reqwest::Client::new();
    for (method, path, expected, anthropic) in [
        (reqwest::Method::GET, "/v1/chat/completions", "POST", false),
        (reqwest::Method::PUT, "/v1/messages", "POST", true),
        (reqwest::Method::POST, "/v1/models", "GET", false),
        (reqwest::Method::DELETE, "/health", "GET", false),
    ] {
        let response = client
            .request(method.clone(), format!("{base}{path}"))
            .send()
            .await
            .expect("request");
        let allow = response
            .headers()
            .get("allow")
            .map(|v| v.to_str().unwrap_or_default().to_string());
        let (status, err) = json_of(response).await;
        assert_eq!(status, 405, "{method} {path}: {err}");
        let message = if anthropic {
            assert_eq!(err["type"], "error");
            &err["error"]["message"]
        } else {
            &err["error"]["message"]
        };
        let message = message.as_str().expect("message");
        assert!(message.contains(&format!("use {expected}")), "{message}");
        if let Some(allow) = allow {
            assert!(allow.contains(expected), "{allow}");
        }
    }
}

#[tokio::test]
async fn unavailable_answers_carry_retry_after() {
    let state = AppState::new(ServerConfig::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(serve_on(listener, state));
    let response = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .json(&json!({"messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("post");
    assert_eq!(response.headers()["retry-after"], "1");
    let (status, err) = json_of(response).await;
    assert_eq!(status, 503);
    assert_eq!(err["error"]["code"], "model_loading");
}

#[tokio::test]
async fn openai_routes_answer_without_the_v1_prefix_too() {
    let base = start_local("", None).await;
    let client = reqwest::Client::new();
    let (status, models) = json_of(
        client
            .get(format!("{base}/models"))
            .send()
            .await
            .expect("models"),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(models["object"], "list");
    let (status, chat) = json_of(
        client
            .post(format!("{base}/chat/completions"))
            .json(&json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}))
            .send()
            .await
            .expect("chat"),
    )
    .await;
    assert_eq!(status, 200, "{chat}");
    assert_eq!(chat["object"], "chat.completion");
    let (status, completion) = json_of(
        client
            .post(format!("{base}/completions"))
            .json(&json!({"prompt": "hi", "max_tokens": 2}))
            .send()
            .await
            .expect("completion"),
    )
    .await;
    assert_eq!(status, 200, "{completion}");
    assert_eq!(completion["object"], "text_completion");
    let metrics = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        metrics.contains("endpoint=\"/v1/chat/completions\""),
        "aliases are counted under their /v1 endpoint:\n{metrics}"
    );
}

#[tokio::test]
async fn a_utf8_byte_order_mark_before_the_json_is_skipped() {
    let base = start_local("", None).await;
    let mut body = b"\xEF\xBB\xBF".to_vec();
    body.extend_from_slice(br#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}"#);
    let (status, resp) = json_of(
        reqwest::Client::new()
            .post(format!("{base}/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("post"),
    )
    .await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(resp["object"], "chat.completion");
}

async fn metric(client: &reqwest::Client, base: &str, name: &str) -> f64 {
    let text = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("metric {name} missing in:\n{text}"))
}

#[tokio::test]
async fn a_dropped_stream_stops_generation_within_a_token_or_two() {
    let tokenizer = strata::tokenizer::Tokenizer::from_gguf(&tiny()).expect("tokenizer");
    let slow = Arc::new(FakeBackend::new(
        512,
        4096,
        FakeOptions {
            feed_delay: std::time::Duration::from_millis(40),
            suppressed: tokenizer.stop_ids(),
            ..FakeOptions::default()
        },
    ));
    let state = AppState::new(ServerConfig::default());
    state.set_model(LoadedModel::from_gguf(&tiny(), slow).expect("model"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(serve_on(listener, state));
    let client = reqwest::Client::new();
    let mut response = client
        .post(format!("{base}/v1/chat/completions"))
        .json(
            &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1000,
                      "stream": true}),
        )
        .send()
        .await
        .expect("post");
    let mut seen = String::new();
    while seen.matches("data:").count() < 6 {
        let chunk = response.chunk().await.expect("chunk").expect("stream open");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    let at_drop = metric(&client, &base, "strata_generated_tokens_total").await;
    drop(response);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while metric(&client, &base, "strata_requests_running").await != 0.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "generation never stopped"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let after = metric(&client, &base, "strata_generated_tokens_total").await;
    // The token being computed when the client left, and at most one more before the failed
    // write is seen: 40 ms per token, so a generation that went on would add many.
    assert!(
        after - at_drop <= 2.0,
        "{} tokens were generated after the client left",
        after - at_drop
    );
    assert_eq!(
        metric(&client, &base, "strata_generations_cancelled_total").await,
        1.0
    );
}

#[tokio::test]
async fn anthropic_trailing_assistant_message_is_continued_not_restarted() {
    let base = start_local("", None).await;
    let client = reqwest::Client::new();
    let count = |messages: Value| {
        let client = client.clone();
        let url = format!("{base}/v1/messages/count_tokens");
        // Thinking off on both sides: a prefill turns it off, and it changes the prompt.
        let body = json!({"messages": messages, "thinking": {"type": "disabled"}});
        async move {
            let (status, body) =
                json_of(client.post(url).json(&body).send().await.expect("count")).await;
            assert_eq!(status, 200, "{body}");
            body["input_tokens"].as_u64().expect("input_tokens")
        }
    };
    let question = json!({"role": "user", "content": "Name a colour."});
    let prefill = "The colour is";
    let without = count(json!([question])).await;
    let with = count(json!([question, {"role": "assistant", "content": prefill}])).await;
    let tokenizer = strata::tokenizer::Tokenizer::from_gguf(&tiny()).expect("tokenizer");
    let prefill_tokens = tokenizer.encode(prefill, false).expect("encode").len() as u64;
    // Continuing adds the prefill's own tokens (one more or less where it joins the prompt), not
    // a finished assistant turn followed by a second generation prompt.
    assert!(
        with + 1 >= without + prefill_tokens && with <= without + prefill_tokens + 1,
        "without {without}, with prefill {with}, prefill alone {prefill_tokens}"
    );

    let (status, reply) = json_of(
        client
            .post(format!("{base}/v1/messages"))
            .json(&json!({"max_tokens": 3, "messages": [question,
                {"role": "assistant", "content": prefill}]}))
            .send()
            .await
            .expect("messages"),
    )
    .await;
    assert_eq!(status, 200, "{reply}");
    // Thinking is off for a prefill unless asked for: the continuation is answer text.
    let kinds: Vec<&str> = reply["content"]
        .as_array()
        .expect("content")
        .iter()
        .filter_map(|b| b["type"].as_str())
        .collect();
    assert!(!kinds.contains(&"thinking"), "{reply}");
}
