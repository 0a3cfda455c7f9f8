//! The HTTP server end to end over loopback, with the tiny model's tokenizer and chat template and
//! a deterministic fake backend (hash logits, or a script of tokens to force tool-call output).

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use strata::engine::Backend;
use strata::gguf::Gguf;
use strata::server::testing::{FakeBackend, FakeOptions};
use strata::server::{AppState, LoadedModel, ServerConfig, serve_on};

const TINY: &str = "tests/fixtures/tiny/tiny-F16.gguf";
const IM_END: u32 = 511;

fn tiny() -> Gguf {
    Gguf::open(TINY).expect("tiny fixture model")
}

fn tokenize(text: &str) -> Vec<u32> {
    let tokenizer = strata::tokenizer::Tokenizer::from_gguf(&tiny()).expect("tokenizer");
    tokenizer.encode(text, false).expect("encode")
}

struct TestServer {
    base: String,
    state: AppState,
    client: reqwest::Client,
}

impl TestServer {
    async fn start(backend: Arc<dyn Backend>, config: ServerConfig) -> TestServer {
        let state = AppState::new(config);
        let model = LoadedModel::from_gguf(&tiny(), backend).expect("model");
        state.set_model(model);
        Self::start_with_state(state).await
    }

    async fn start_with_state(state: AppState) -> TestServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(serve_on(listener, state.clone()));
        TestServer {
            base,
            state,
            client: reqwest::Client::new(),
        }
    }

    async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let resp = self
            .client
            .post(format!("{}{path}", self.base))
            .json(body)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        let value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{path}: body is not JSON ({e}): {text}"));
        (status, value)
    }

    async fn post_raw(&self, path: &str, body: impl Into<reqwest::Body>) -> (u16, Value) {
        let resp = self
            .client
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        let value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{path}: error body is not JSON ({e}): {text}"));
        (status, value)
    }

    /// A streaming request, read to the end: (event name, data) pairs.
    async fn stream(&self, path: &str, body: &Value) -> Vec<(Option<String>, String)> {
        let resp = self
            .client
            .post(format!("{}{path}", self.base))
            .json(body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        assert!(
            resp.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/event-stream")
        );
        parse_sse(&resp.text().await.unwrap())
    }

    async fn metrics(&self) -> String {
        self.client
            .get(format!("{}/metrics", self.base))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    async fn metric(&self, name: &str) -> f64 {
        let text = self.metrics().await;
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("metric {name} missing in:\n{text}"))
    }
}

fn parse_sse(text: &str) -> Vec<(Option<String>, String)> {
    text.split("\n\n")
        .filter(|block| !block.trim().is_empty())
        .filter_map(|block| {
            let mut event = None;
            let mut data = Vec::new();
            for line in block.lines() {
                if let Some(e) = line.strip_prefix("event:") {
                    event = Some(e.trim().to_string());
                } else if let Some(d) = line.strip_prefix("data:") {
                    data.push(d.strip_prefix(' ').unwrap_or(d).to_string());
                }
            }
            // Keep-alive comments carry no data.
            (!data.is_empty()).then(|| (event, data.join("\n")))
        })
        .collect()
}

/// The tiny tokenizer's stop ids: kept out of the hash logits so a run lasts `max_tokens`.
fn stop_ids() -> Vec<u32> {
    strata::tokenizer::Tokenizer::from_gguf(&tiny())
        .expect("tokenizer")
        .stop_ids()
}

fn hash_backend() -> Arc<FakeBackend> {
    Arc::new(FakeBackend::new(
        512,
        2048,
        FakeOptions {
            suppressed: stop_ids(),
            ..FakeOptions::default()
        },
    ))
}

fn scripted(text: &str) -> Arc<FakeBackend> {
    Arc::new(FakeBackend::new(
        512,
        2048,
        FakeOptions {
            script: tokenize(text),
            script_end: Some(IM_END),
            ..FakeOptions::default()
        },
    ))
}

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

#[tokio::test]
async fn chat_non_streaming_and_streaming_agree_for_a_seed() {
    let server = TestServer::start(hash_backend(), ServerConfig::default()).await;
    let body =
        json!({"messages": user("hello there"), "max_tokens": 12, "seed": 42, "temperature": 0.9});
    let resp = server
        .client
        .post(format!("{}/v1/chat/completions", server.base))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(resp.headers()["x-strata-seed"].to_str().unwrap(), "42");
    let a: Value = resp.json().await.unwrap();
    assert_eq!(a["object"], "chat.completion");
    let choice = &a["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    assert!(["length", "stop"].contains(&choice["finish_reason"].as_str().unwrap()));
    let usage = &a["usage"];
    assert!(usage["prompt_tokens"].as_u64().unwrap() > 5);
    assert!(usage["completion_tokens"].as_u64().unwrap() >= 1);
    assert_eq!(
        usage["total_tokens"].as_u64().unwrap(),
        usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap()
    );

    // Same seed again: same text; the repeat is served from the prompt cache.
    let (_, b) = server.post("/v1/chat/completions", &body).await;
    assert_eq!(a["choices"][0]["message"], b["choices"][0]["message"]);
    assert_eq!(
        b["usage"]["prompt_tokens_details"]["cached_tokens"],
        b["usage"]["prompt_tokens"]
    );

    // Streaming with the same seed: same text, [DONE] last, usage chunk when asked.
    let mut stream_body = body.clone();
    stream_body["stream"] = json!(true);
    stream_body["stream_options"] = json!({"include_usage": true});
    let events = server.stream("/v1/chat/completions", &stream_body).await;
    assert_eq!(events.last().unwrap().1, "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|(_, d)| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let mut content = String::new();
    let mut reasoning = String::new();
    for c in &chunks {
        if let Some(d) = c["choices"].get(0).map(|c| &c["delta"]) {
            content.push_str(d["content"].as_str().unwrap_or(""));
            reasoning.push_str(d["reasoning_content"].as_str().unwrap_or(""));
        }
    }
    let message = &a["choices"][0]["message"];
    assert_eq!(content, message["content"].as_str().unwrap_or(""));
    assert_eq!(
        reasoning,
        message["reasoning_content"].as_str().unwrap_or("")
    );
    let finish_chunk = &chunks[chunks.len() - 2];
    assert_eq!(
        finish_chunk["choices"][0]["finish_reason"],
        choice["finish_reason"]
    );
    let usage_chunk = chunks.last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(
        usage_chunk["usage"]["completion_tokens"],
        usage["completion_tokens"]
    );

    // A different seed gives different text (12 tokens from 512 near-uniform choices).
    let mut other = body.clone();
    other["seed"] = json!(43);
    let (_, c) = server.post("/v1/chat/completions", &other).await;
    assert_ne!(a["choices"][0]["message"], c["choices"][0]["message"]);
}

#[tokio::test]
async fn next_chat_turn_reuses_the_conversation_from_the_prompt_cache() {
    let server = TestServer::start(hash_backend(), ServerConfig::default()).await;
    let first = json!({"messages": user("hello there"), "max_tokens": 6, "seed": 1});
    let (_, a) = server.post("/v1/chat/completions", &first).await;
    let reply = a["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let second = json!({"messages": [
        {"role": "user", "content": "hello there"},
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "and more"},
    ], "max_tokens": 6, "seed": 1});
    let (_, b) = server.post("/v1/chat/completions", &second).await;
    let cached = b["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    let prompt = b["usage"]["prompt_tokens"].as_u64().unwrap();
    // Everything before turn 1's generation prompt came from the cache.
    assert!(cached > 0 && cached < prompt, "cached {cached} of {prompt}");
    let turn_one_prompt = a["usage"]["prompt_tokens"].as_u64().unwrap();
    // (the generation prompt is a few tokens; the conversation before it most of the prompt).
    assert!(
        cached < turn_one_prompt && 2 * cached > turn_one_prompt,
        "cached {cached}, turn 1 prompt {turn_one_prompt}"
    );
}

/// `/metrics` reports what the prompt cache holds; a zero byte budget turns the cache off.
#[tokio::test]
async fn prompt_cache_is_bounded_by_bytes_and_reported() {
    let server = TestServer::start(hash_backend(), ServerConfig::default()).await;
    let body = json!({"messages": user("hello there"), "max_tokens": 6, "seed": 1});
    server.post("/v1/chat/completions", &body).await;
    assert!(server.metric("strata_prompt_cache_entries").await >= 1.0);
    assert!(server.metric("strata_prompt_cache_bytes").await > 0.0);

    let off = ServerConfig {
        prompt_cache_bytes: 0,
        ..ServerConfig::default()
    };
    let server = TestServer::start(hash_backend(), off).await;
    server.post("/v1/chat/completions", &body).await;
    let (_, again) = server.post("/v1/chat/completions", &body).await;
    assert_eq!(again["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(server.metric("strata_prompt_cache_entries").await, 0.0);
    assert_eq!(server.metric("strata_prompt_cache_bytes").await, 0.0);
}

#[tokio::test]
async fn seed_is_drawn_and_reported_when_absent() {
    let server = TestServer::start(hash_backend(), ServerConfig::default()).await;
    let body = json!({"messages": user("hi"), "max_tokens": 8});
    let (_, a) = server.post("/v1/chat/completions", &body).await;
    let (_, b) = server.post("/v1/chat/completions", &body).await;
    let seed = a["seed"].as_u64().expect("seed reported");
    assert_ne!(Some(seed), b["seed"].as_u64());
    // Replaying with the reported seed reproduces the text.
    let mut replay = body.clone();
    replay["seed"] = json!(seed as i64);
    let (_, c) = server.post("/v1/chat/completions", &replay).await;
    assert_eq!(a["choices"][0]["message"], c["choices"][0]["message"]);
}

const TOOL_OUTPUT: &str = "Need the weather.\n</think>\n\nLet me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";

fn weather_tools() -> Value {
    json!([{"type": "function", "function": {
        "name": "get_weather",
        "description": "Weather forecast",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}
    }}])
}

#[tokio::test]
async fn openai_tool_calls_are_parsed_and_streamed_as_deltas() {
    let server = TestServer::start(scripted(TOOL_OUTPUT), ServerConfig::default()).await;
    let body =
        json!({"messages": user("weather in Paris?"), "tools": weather_tools(), "max_tokens": 200});
    let (status, resp) = server.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{resp}");
    let choice = &resp["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    let message = &choice["message"];
    assert_eq!(message["reasoning_content"], "Need the weather.");
    assert_eq!(message["content"], "Let me check.");
    let call = &message["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert!(call["id"].as_str().unwrap().starts_with("call_"));
    assert_eq!(call["function"]["name"], "get_weather");
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"city": "Paris", "days": 3}));

    let mut stream_body = body.clone();
    stream_body["stream"] = json!(true);
    let events = server.stream("/v1/chat/completions", &stream_body).await;
    let mut content = String::new();
    let mut arguments = String::new();
    let mut starts = Vec::new();
    let mut finish = None;
    for (_, data) in &events {
        if data == "[DONE]" {
            continue;
        }
        let chunk: Value = serde_json::from_str(data).unwrap();
        let choice = &chunk["choices"][0];
        if let Some(r) = choice["finish_reason"].as_str() {
            finish = Some(r.to_string());
        }
        let delta = &choice["delta"];
        content.push_str(delta["content"].as_str().unwrap_or(""));
        if let Some(calls) = delta["tool_calls"].as_array() {
            for c in calls {
                if c.get("id").is_some() {
                    assert_eq!(c["type"], "function");
                    starts.push(c["function"]["name"].as_str().unwrap().to_string());
                    assert!(
                        arguments.is_empty(),
                        "arguments came before the call's first delta"
                    );
                }
                arguments.push_str(c["function"]["arguments"].as_str().unwrap_or(""));
            }
        }
    }
    assert_eq!(starts, ["get_weather"]);
    assert!(
        !content.contains("tool_call") && !content.contains("<function"),
        "{content:?}"
    );
    assert_eq!(content.trim(), "Let me check.");
    assert_eq!(serde_json::from_str::<Value>(&arguments).unwrap(), args);
    assert_eq!(finish.as_deref(), Some("tool_calls"));
}

#[tokio::test]
async fn tool_history_round_trips_and_tool_choice_is_checked() {
    let server = TestServer::start(hash_backend(), ServerConfig::default()).await;
    let messages = json!([
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]);
    let body = json!({"messages": messages, "tools": weather_tools(), "max_tokens": 4,
                      "tool_choice": {"type": "function", "function": {"name": "get_weather"}}});
    let (status, resp) = server.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{resp}");
    // The hash model never calls the tool it was told to call: the response says so.
    let warnings = resp["warnings"].to_string();
    assert!(
        warnings.contains("tool_choice required a tool call"),
        "{resp}"
    );
    // Tools double-encoded as JSON strings are accepted.
    let mut encoded = body.clone();
    encoded["tools"] = json!([weather_tools()[0].to_string()]);
    let (status, resp) = server.post("/v1/chat/completions", &encoded).await;
    assert_eq!(status, 200, "{resp}");
    let mut unknown = body.clone();
    unknown["tool_choice"] = json!({"type": "function", "function": {"name": "nope"}});
    let (status, resp) = server.post("/v1/chat/completions", &unknown).await;
    assert_eq!(status, 400);
    assert_eq!(resp["error"]["param"], "tool_choice");
    let mut bad_args = body.clone();
    bad_args["messages"][2]["tool_calls"][0]["function"]["arguments"] = json!("{not json");
    let (status, resp) = server.post("/v1/chat/completions", &bad_args).await;
    assert_eq!(status, 400);
    assert!(
        resp["error"]["message"]
            .as_str()
            .unwrap()
            .contains("arguments")
    );
}

#[tokio::test]
async fn anthropic_messages_blocks_and_stream_event_order() {
    let server = TestServer::start(scripted(TOOL_OUTPUT), ServerConfig::default()).await;
    let body = json!({
        "model": "whatever", "max_tokens": 200, "system": [{"type": "text", "text": "be brief"}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "weather in Paris?"}]}],
        "tools": [{"name": "get_weather", "description": "Weather", "input_schema":
            {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}],
    });
    let (status, resp) = server.post("/v1/messages?beta=true", &body).await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(resp["type"], "message");
    assert_eq!(resp["stop_reason"], "tool_use");
    let kinds: Vec<&str> = resp["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["thinking", "text", "tool_use"]);
    assert_eq!(resp["content"][0]["thinking"], "Need the weather.");
    assert_eq!(resp["content"][2]["name"], "get_weather");
    assert_eq!(
        resp["content"][2]["input"],
        json!({"city": "Paris", "days": 3})
    );
    let usage = &resp["usage"];
    let input = usage["input_tokens"].as_u64().unwrap()
        + usage["cache_read_input_tokens"].as_u64().unwrap();

    // count_tokens agrees with what generation fed.
    let (status, counted) = server.post("/v1/messages/count_tokens", &body).await;
    assert_eq!(status, 200);
    assert_eq!(counted["input_tokens"].as_u64().unwrap(), input);

    let mut stream_body = body.clone();
    stream_body["stream"] = json!(true);
    let events = server.stream("/v1/messages", &stream_body).await;
    let names: Vec<String> = events.iter().map(|(e, _)| e.clone().unwrap()).collect();
    // Collapse runs of deltas to check the shape.
    let mut shape: Vec<String> = Vec::new();
    for n in &names {
        if n == "content_block_delta" && shape.last() == Some(n) {
            continue;
        }
        shape.push(n.clone());
    }
    assert_eq!(
        shape,
        [
            "message_start",
            "ping",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ]
    );
    let datas: Vec<Value> = events
        .iter()
        .map(|(_, d)| serde_json::from_str(d).unwrap())
        .collect();
    for (name, data) in names.iter().zip(&datas) {
        assert_eq!(
            data["type"],
            name.as_str(),
            "event name and data type agree"
        );
    }
    let starts: Vec<&Value> = datas
        .iter()
        .filter(|d| d["type"] == "content_block_start")
        .map(|d| &d["content_block"])
        .collect();
    assert_eq!(starts[0]["type"], "thinking");
    assert_eq!(starts[1]["type"], "text");
    assert_eq!(starts[2]["type"], "tool_use");
    assert_eq!(starts[2]["name"], "get_weather");
    let partial: String = datas
        .iter()
        .filter(|d| d["delta"]["type"] == "input_json_delta")
        .map(|d| d["delta"]["partial_json"].as_str().unwrap())
        .collect();
    assert_eq!(
        serde_json::from_str::<Value>(&partial).unwrap(),
        json!({"city": "Paris", "days": 3})
    );
    let delta = datas.iter().find(|d| d["type"] == "message_delta").unwrap();
    assert_eq!(delta["delta"]["stop_reason"], "tool_use");
}

#[tokio::test]
async fn health_reports_loading_then_ready() {
    let state = AppState::new(ServerConfig::default());
    let server = TestServer::start_with_state(state.clone()).await;
    let resp = server
        .client
        .get(format!("{}/health", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 503);
    assert_eq!(resp.json::<Value>().await.unwrap()["status"], "loading");
    let (status, body) = server
        .post("/v1/chat/completions", &json!({"messages": user("hi")}))
        .await;
    assert_eq!(status, 503);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("loading")
    );
    state.set_model(LoadedModel::from_gguf(&tiny(), hash_backend()).unwrap());
    let resp = server
        .client
        .get(format!("{}/health", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(resp.json::<Value>().await.unwrap()["status"], "ok");
    let models: Value = server
        .client
        .get(format!("{}/v1/models", server.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["object"], "model");
}

#[tokio::test]
async fn api_key_is_required_everywhere_but_health() {
    let config = ServerConfig {
        api_key: Some("sekret".into()),
        ..ServerConfig::default()
    };
    let server = TestServer::start(hash_backend(), config).await;
    let url = |p: &str| format!("{}{p}", server.base);
    let body = json!({"messages": user("hi"), "max_tokens": 2});
    let resp = server
        .client
        .post(url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    let err: Value = resp.json().await.unwrap();
    assert_eq!(err["error"]["type"], "authentication_error");
    let resp = server
        .client
        .post(url("/v1/messages"))
        .header("x-api-key", "wrong")
        .json(&json!({"max_tokens": 2, "messages": user("hi")}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    let err: Value = resp.json().await.unwrap();
    assert_eq!(err["type"], "error");
    assert_eq!(err["error"]["type"], "authentication_error");
    let resp = server.client.get(url("/metrics")).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    let resp = server.client.get(url("/health")).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let resp = server
        .client
        .post(url("/v1/chat/completions"))
        .bearer_auth("sekret")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let resp = server
        .client
        .post(url("/v1/messages"))
        .header("x-api-key", "sekret")
        .json(&json!({"max_tokens": 2, "messages": user("hi")}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
}

#[tokio::test]
async fn malformed_requests_get_clear_4xx_errors_and_the_server_keeps_serving() {
    let backend = Arc::new(FakeBackend::new(512, 256, FakeOptions::default()));
    let server = TestServer::start(backend, ServerConfig::default()).await;
    let chat = "/v1/chat/completions";
    let long_prompt = "word ".repeat(400);
    let cases: Vec<(&str, Value, u16, &str)> = vec![
        (
            chat,
            json!({"messages": user("hi"), "temperature": "hot"}),
            400,
            "temperature",
        ),
        (chat, json!({"model": "x"}), 400, "messages"),
        (chat, json!({"messages": []}), 400, "messages"),
        (
            chat,
            json!({"messages": [{"role": "wizard", "content": "hi"}]}),
            400,
            "wizard",
        ),
        (chat, json!({"messages": [{"content": "hi"}]}), 400, "role"),
        (
            chat,
            json!({"messages": user("hi"), "max_tokens": 0}),
            400,
            "max_tokens",
        ),
        (
            chat,
            json!({"messages": user("hi"), "max_completion_tokens": -5}),
            400,
            "max_completion_tokens",
        ),
        (chat, json!({"messages": user("hi"), "n": 2}), 400, "n = 2"),
        (
            chat,
            json!({"messages": user("hi"), "top_p": 1.5}),
            400,
            "top_p",
        ),
        (
            chat,
            json!({"messages": user("hi"), "stop": 5}),
            400,
            "stop",
        ),
        (
            chat,
            json!({"messages": user("hi"), "tool_choice": "sometimes", "tools": weather_tools()}),
            400,
            "tool_choice",
        ),
        (
            chat,
            json!({"messages": [{"role": "user", "content": 5}]}),
            400,
            "content",
        ),
        (
            chat,
            json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}),
            400,
            "image",
        ),
        (
            chat,
            json!({"messages": user("hi"), "reasoning_effort": "extreme"}),
            400,
            "reasoning_effort",
        ),
        (
            chat,
            json!({"messages": user(&long_prompt)}),
            400,
            "context",
        ),
        (
            chat,
            json!({"messages": user("hi"), "max_tokens": 100000}),
            400,
            "context",
        ),
        (
            "/v1/completions",
            json!({"prompt": [1, 2, 99999]}),
            400,
            "vocabulary",
        ),
        (
            "/v1/completions",
            json!({"prompt": {"a": 1}}),
            400,
            "prompt",
        ),
    ];
    for (path, body, status, needle) in cases {
        let (got, err) = server.post(path, &body).await;
        assert_eq!(got, status, "{body} → {err}");
        let message = err["error"]["message"]
            .as_str()
            .unwrap_or_else(|| panic!("no error object: {err}"));
        assert!(
            message.to_lowercase().contains(&needle.to_lowercase()),
            "{body}: message {message:?} should mention {needle:?}"
        );
        assert!(err["error"]["type"].is_string());
    }
    // Prompt over context names the token counts.
    let (_, err) = server
        .post(chat, &json!({"messages": user(&long_prompt)}))
        .await;
    assert!(
        err["error"]["message"].as_str().unwrap().contains("256"),
        "{err}"
    );

    // Not JSON at all, and an empty body.
    let (status, err) = server.post_raw(chat, "{\"messages\": [").await;
    assert_eq!(status, 400);
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not valid JSON")
    );
    let (status, err) = server.post_raw(chat, "").await;
    assert_eq!(status, 400);
    assert!(err["error"]["message"].is_string());
    // Oversized body: 413 with an error object.
    let huge = format!(
        "{{\"messages\": [{{\"role\":\"user\",\"content\":\"{}\"}}]}}",
        "x".repeat(9 << 20)
    );
    let (status, err) = server.post_raw(chat, huge).await;
    assert_eq!(status, 413);
    assert!(err["error"]["message"].as_str().unwrap().contains("MiB"));

    // Anthropic routes answer in Anthropic's shape.
    for body in [
        json!({"messages": user("hi")}),
        json!({"max_tokens": 0, "messages": user("hi")}),
        json!({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}),
        json!({"max_tokens": 5, "messages": user("hi"), "thinking": {"type": "sometimes"}}),
        json!({"max_tokens": 5, "messages": user("hi"), "tool_choice": {"type": "tool"}}),
    ] {
        let (status, err) = server.post("/v1/messages", &body).await;
        assert_eq!(status, 400, "{body} → {err}");
        assert_eq!(err["type"], "error");
        assert_eq!(err["error"]["type"], "invalid_request_error");
        assert!(err["error"]["message"].is_string());
    }
    let (status, err) = server.post_raw("/v1/messages", "nope").await;
    assert_eq!(status, 400);
    assert_eq!(err["type"], "error");

    // Unknown route: JSON 404.
    let (status, err) = server.post("/v1/nothing", &json!({})).await;
    assert_eq!(status, 404);
    assert!(err["error"]["message"].is_string());

    // Still serving.
    let (status, ok) = server
        .post(chat, &json!({"messages": user("hi"), "max_tokens": 3}))
        .await;
    assert_eq!(status, 200, "{ok}");
    let metrics = server.metrics().await;
    assert!(
        metrics.contains("strata_requests_total{endpoint=\"/v1/chat/completions\",status=\"400\"}"),
        "{metrics}"
    );
}

#[tokio::test]
async fn engine_errors_are_500_and_the_next_request_works() {
    // The sequence fails once it holds 6 tokens: prompt [1,2,3] + 3 generated.
    let backend = Arc::new(FakeBackend::new(
        512,
        2048,
        FakeOptions {
            fail_at_length: Some(6),
            suppressed: stop_ids(),
            ..FakeOptions::default()
        },
    ));
    let server = TestServer::start(backend, ServerConfig::default()).await;
    let (status, err) = server
        .post(
            "/v1/completions",
            &json!({"prompt": [1, 2, 3], "max_tokens": 10}),
        )
        .await;
    assert_eq!(status, 500);
    let message = err["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("non-finite") && message.contains("fake backend output"),
        "{message}"
    );
    let (status, ok) = server
        .post(
            "/v1/completions",
            &json!({"prompt": [1, 2, 3], "max_tokens": 2}),
        )
        .await;
    assert_eq!(status, 200, "{ok}");
    assert_eq!(ok["usage"]["completion_tokens"], 2);
    assert_eq!(ok["object"], "text_completion");
    // Streaming failure: an error object in the stream, then [DONE].
    let events = server
        .stream(
            "/v1/completions",
            &json!({"prompt": [1, 2, 3], "max_tokens": 10, "stream": true}),
        )
        .await;
    assert_eq!(events.last().unwrap().1, "[DONE]");
    let err: Value = serde_json::from_str(&events[events.len() - 2].1).unwrap();
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("non-finite")
    );
}

fn slow_backend() -> Arc<FakeBackend> {
    Arc::new(FakeBackend::new(
        512,
        4096,
        FakeOptions {
            feed_delay: Duration::from_millis(20),
            suppressed: stop_ids(),
            ..FakeOptions::default()
        },
    ))
}

async fn wait_for(server: &TestServer, metric: &str, value: f64) {
    for _ in 0..200 {
        if server.metric(metric).await == value {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{metric} never reached {value}");
}

#[tokio::test]
async fn full_queue_answers_503_and_requests_run_in_order() {
    let config = ServerConfig {
        queue_capacity: 1,
        parallel: 1,
        ..ServerConfig::default()
    };
    let server = Arc::new(TestServer::start(slow_backend(), config).await);
    let body = json!({"prompt": [1, 2, 3], "max_tokens": 15});
    let first = {
        let s = server.clone();
        let b = body.clone();
        tokio::spawn(async move { s.post("/v1/completions", &b).await })
    };
    wait_for(&server, "strata_requests_running", 1.0).await;
    let second = {
        let s = server.clone();
        let b = body.clone();
        tokio::spawn(async move { s.post("/v1/completions", &b).await })
    };
    wait_for(&server, "strata_queue_depth", 1.0).await;
    let (status, err) = server.post("/v1/completions", &body).await;
    assert_eq!(status, 503, "{err}");
    assert!(err["error"]["message"].as_str().unwrap().contains("busy"));
    assert_eq!(err["error"]["code"], "queue_full");
    let (s1, a) = first.await.unwrap();
    let (s2, b) = second.await.unwrap();
    assert_eq!((s1, s2), (200, 200));
    assert_eq!(a["usage"]["completion_tokens"], 15);
    assert_eq!(b["usage"]["completion_tokens"], 15);
    assert!(
        server
            .state
            .metrics()
            .render()
            .contains("strata_queue_depth 0")
    );
}

#[tokio::test]
async fn client_disconnect_stops_generation() {
    let server = TestServer::start(slow_backend(), ServerConfig::default()).await;
    let body = json!({"prompt": [1, 2, 3], "max_tokens": 2000, "stream": true});
    let mut resp = server
        .client
        .post(format!("{}/v1/completions", server.base))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let mut received = 0;
    while received < 3 {
        let chunk = resp.chunk().await.unwrap().expect("stream ended early");
        received += String::from_utf8_lossy(&chunk).matches("data:").count();
    }
    drop(resp);
    wait_for(&server, "strata_generations_cancelled_total", 1.0).await;
    wait_for(&server, "strata_requests_running", 0.0).await;
    let generated = server.metric("strata_generated_tokens_total").await;
    assert!(
        generated < 100.0,
        "generation went on after the disconnect: {generated} tokens"
    );

    // Non-streaming: the client gives up waiting.
    let plain = json!({"prompt": [1, 2, 3], "max_tokens": 2000});
    let request = server
        .client
        .post(format!("{}/v1/completions", server.base))
        .json(&plain)
        .send();
    assert!(
        tokio::time::timeout(Duration::from_millis(200), request)
            .await
            .is_err()
    );
    wait_for(&server, "strata_generations_cancelled_total", 2.0).await;
    wait_for(&server, "strata_requests_running", 0.0).await;
    let (status, _) = server
        .post("/v1/completions", &json!({"prompt": [1], "max_tokens": 2}))
        .await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn metrics_count_tokens_and_latency() {
    let server = TestServer::start(hash_backend(), ServerConfig::default()).await;
    let (status, _) = server
        .post(
            "/v1/completions",
            &json!({"prompt": "hello", "max_tokens": 5}),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(server.metric("strata_generated_tokens_total").await, 5.0);
    assert!(server.metric("strata_prompt_tokens_total").await >= 1.0);
    let text = server.metrics().await;
    assert!(text.contains("# TYPE strata_request_duration_seconds histogram"));
    assert!(text.contains("strata_request_duration_seconds_bucket{le=\"+Inf\"}"));
    assert!(text.contains("strata_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 1"));
    assert!(text.contains("strata_generation_tokens_per_second"));
}
