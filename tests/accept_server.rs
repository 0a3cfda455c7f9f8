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
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).to_string();
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
    assert!(message.contains("expected an integer"), "{message}");
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
    let (status, err) = json_of(post("/v1/messages", "{\"messages\": [").await.expect("post")).await;
    assert_eq!(status, 400);
    let message = err["error"]["message"].as_str().expect("message");
    assert!(message.contains("not valid JSON") && message.contains("column"), "{message}");
}
