//! The server and generation loop on the real tiny model (CPU backend): the path a user takes,
//! checked for determinism and prompt-cache exactness.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use serde_json::{Value, json};
use strata::cli::load::{BackendChoice, load_backend, open_gguf};
use strata::engine::Backend;
use strata::engine::generate::{GenerateRequest, Generator};
use strata::sampler::SamplingParams;
use strata::server::{AppState, LoadedModel, ServerConfig, serve_on};
use strata::tokenizer::{StreamDecoder, Tokenizer};

const TINY: &str = "tests/fixtures/tiny/tiny-F16.gguf";

fn tiny_backend() -> (Arc<strata::gguf::Gguf>, Arc<dyn Backend>) {
    let gguf = open_gguf(Some(std::path::Path::new(TINY))).expect("tiny model");
    let backend = load_backend(gguf.clone(), BackendChoice::Cpu, 0).expect("cpu backend");
    (gguf, backend)
}

async fn start() -> String {
    let (gguf, backend) = tiny_backend();
    let state = AppState::new(ServerConfig::default());
    state.set_model(LoadedModel::from_gguf(&gguf, backend).expect("model"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(serve_on(listener, state));
    base
}

async fn post(base: &str, path: &str, body: &Value) -> Value {
    let resp = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    resp.json().await.unwrap()
}

#[tokio::test]
async fn tiny_model_chat_is_reproducible_by_seed_and_streams_the_same_text() {
    let base = start().await;
    let body =
        json!({"messages": [{"role": "user", "content": "hello"}], "max_tokens": 16, "seed": 5});
    let a = post(&base, "/v1/chat/completions", &body).await;
    let b = post(&base, "/v1/chat/completions", &body).await;
    assert_eq!(a["choices"][0]["message"], b["choices"][0]["message"]);
    assert_eq!(
        a["usage"]["completion_tokens"],
        b["usage"]["completion_tokens"]
    );
    // The second identical prompt came from the prompt cache, and changed nothing.
    assert_eq!(
        b["usage"]["prompt_tokens_details"]["cached_tokens"],
        b["usage"]["prompt_tokens"]
    );

    let mut stream = body.clone();
    stream["stream"] = json!(true);
    let text = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .json(&stream)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let mut reasoning = String::new();
    let mut content = String::new();
    let mut done = false;
    for line in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if line == "[DONE]" {
            done = true;
            continue;
        }
        let chunk: Value = serde_json::from_str(line).unwrap();
        let delta = &chunk["choices"][0]["delta"];
        reasoning.push_str(delta["reasoning_content"].as_str().unwrap_or(""));
        content.push_str(delta["content"].as_str().unwrap_or(""));
    }
    assert!(done);
    let message = &a["choices"][0]["message"];
    assert_eq!(
        reasoning,
        message["reasoning_content"].as_str().unwrap_or("")
    );
    assert_eq!(content, message["content"].as_str().unwrap_or(""));

    // Anthropic route on the same model.
    let m = post(
        &base,
        "/v1/messages",
        &json!({"max_tokens": 8, "messages": [{"role": "user", "content": "hello"}], "thinking": {"type": "disabled"}}),
    )
    .await;
    assert_eq!(m["type"], "message");
    assert!(["end_turn", "max_tokens"].contains(&m["stop_reason"].as_str().unwrap()));
}

fn generate(
    generator: &mut Generator,
    tokenizer: &Tokenizer,
    request: &GenerateRequest,
) -> Vec<u32> {
    let cancel = AtomicBool::new(false);
    let mut decoder = StreamDecoder::new(tokenizer);
    generator
        .generate(request, &mut decoder, &cancel, &mut |_| {})
        .expect("generate")
        .tokens
}

#[test]
fn tiny_model_prompt_cache_extension_is_bit_identical_to_a_fresh_run() {
    let (gguf, backend) = tiny_backend();
    let tokenizer = Tokenizer::from_gguf(&gguf).unwrap();
    let mut cached = Generator::new(backend.clone());
    let mut fresh = Generator::new(backend).with_prompt_cache(false);
    let request = |prompt: Vec<u32>| GenerateRequest {
        prompt,
        max_tokens: 12,
        sampling: SamplingParams {
            seed: Some(99),
            ..SamplingParams::default()
        },
        stop_ids: vec![],
        stop_strings: vec![],
        checkpoint: None,
    };
    let first_prompt = tokenizer.encode("the quick brown fox", false).unwrap();
    let first = generate(&mut cached, &tokenizer, &request(first_prompt.clone()));
    let mut second_prompt = first_prompt.clone();
    second_prompt.extend_from_slice(&first[..first.len() - 1]);
    second_prompt.extend(tokenizer.encode(" jumps over", false).unwrap());
    let cancel = AtomicBool::new(false);
    let mut decoder = StreamDecoder::new(&tokenizer);
    let reused = cached
        .generate(
            &request(second_prompt.clone()),
            &mut decoder,
            &cancel,
            &mut |_| {},
        )
        .unwrap();
    assert_eq!(
        reused.usage.cached_tokens,
        first_prompt.len() + first.len() - 1
    );
    let reference = generate(&mut fresh, &tokenizer, &request(second_prompt));
    assert_eq!(reused.tokens, reference);
}
