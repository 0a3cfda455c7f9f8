//! Many concurrent clients against `strata serve` on the built-in demo model (CPU backend):
//! nobody gets an error, and every streamed answer is the same as the same request run alone.

use serde_json::{Value, json};
use strata::cli::load::{BackendChoice, load_backend, open_gguf};
use strata::server::{AppState, LoadedModel, ServerConfig, serve_on};

async fn start(parallel: usize, queue: usize) -> String {
    let gguf = open_gguf(None).expect("demo model");
    let backend = load_backend(gguf.clone(), BackendChoice::Cpu, 0).expect("cpu backend");
    let state = AppState::new(ServerConfig {
        parallel,
        queue_capacity: queue,
        ..ServerConfig::default()
    });
    state.set_model(LoadedModel::from_gguf(&gguf, backend).expect("model"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(serve_on(listener, state));
    base
}

fn body(i: u64, stream: bool) -> Value {
    json!({
        "messages": [{"role": "user", "content": format!("client {i}: tell me about rivers")}],
        "max_tokens": 12,
        "temperature": 0.9,
        "seed": 7000 + i,
        "stream": stream,
        "logprobs": true,
    })
}

/// (content, logprobs of every token) from an SSE chat stream.
fn read_stream(text: &str) -> Result<(String, Vec<Value>), String> {
    let mut reasoning = String::new();
    let mut content = String::new();
    let mut logprobs = Vec::new();
    let mut finished = false;
    for line in text.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            finished = true;
            continue;
        }
        let chunk: Value = serde_json::from_str(data).map_err(|e| e.to_string())?;
        if chunk.get("error").is_some() {
            return Err(chunk.to_string());
        }
        let choice = &chunk["choices"][0];
        if let Some(t) = choice["delta"]["reasoning_content"].as_str() {
            reasoning.push_str(t);
        }
        if let Some(t) = choice["delta"]["content"].as_str() {
            content.push_str(t);
        }
        if let Some(list) = choice["logprobs"]["content"].as_array() {
            logprobs.extend(list.iter().cloned());
        }
    }
    if !finished {
        return Err("the stream ended without [DONE]".into());
    }
    Ok((format!("{reasoning}{content}"), logprobs))
}

async fn stream_one(
    client: reqwest::Client,
    base: String,
    i: u64,
) -> Result<(String, Vec<Value>), String> {
    let resp = client
        .post(format!("{base}/v1/chat/completions"))
        .json(&body(i, true))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if resp.status() != 200 {
        return Err(format!("status {}", resp.status()));
    }
    let text = resp.text().await.map_err(|e| e.to_string())?;
    read_stream(&text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_two_streaming_clients_all_get_what_they_would_get_alone() {
    let base = start(8, 256).await;
    let client = reqwest::Client::new();
    let tasks: Vec<_> = (0..32)
        .map(|i| tokio::spawn(stream_one(client.clone(), base.clone(), i)))
        .collect();
    let mut together = Vec::new();
    for t in tasks {
        together.push(t.await.expect("task"));
    }
    let errors: Vec<&String> = together.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(errors.is_empty(), "{} errors: {errors:?}", errors.len());
    for (i, result) in together.iter().enumerate() {
        let (content, logprobs) = result.as_ref().expect("checked");
        let alone: Value = client
            .post(format!("{base}/v1/chat/completions"))
            .json(&body(i as u64, false))
            .send()
            .await
            .expect("post")
            .json()
            .await
            .expect("json");
        let message = &alone["choices"][0]["message"];
        let alone_text = format!(
            "{}{}",
            message["reasoning_content"].as_str().unwrap_or(""),
            message["content"].as_str().unwrap_or("")
        );
        assert_eq!(&alone_text, content, "client {i}: text differs");
        let alone_logprobs = alone["choices"][0]["logprobs"]["content"]
            .as_array()
            .expect("logprobs");
        assert_eq!(alone_logprobs, logprobs, "client {i}: logprobs differ");
        let tokens = alone["usage"]["completion_tokens"].as_u64().expect("usage") as usize;
        assert_eq!(logprobs.len(), tokens, "client {i}: one logprob per token");
    }
}

#[tokio::test]
async fn past_the_wait_queue_the_answer_is_503_with_retry_after() {
    let base = start(1, 0).await;
    let client = reqwest::Client::new();
    let long = json!({"prompt": "x", "max_tokens": 400, "stream": true, "temperature": 1.0});
    let first = client
        .post(format!("{base}/v1/completions"))
        .json(&long)
        .send()
        .await
        .expect("post");
    assert_eq!(first.status(), 200);
    // Wait until the first request holds the only slot.
    for _ in 0..200 {
        let metrics = client
            .get(format!("{base}/metrics"))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("text");
        if metrics.contains("strata_requests_running 1") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let refused = client
        .post(format!("{base}/v1/completions"))
        .json(&json!({"prompt": "y", "max_tokens": 2}))
        .send()
        .await
        .expect("post");
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers()["retry-after"], "1");
    let err: Value = refused.json().await.expect("json");
    assert_eq!(err["error"]["code"], "queue_full");
    drop(first);
}
