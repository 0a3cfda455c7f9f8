//! The generation loop on a deterministic fake backend: seeds, prompt cache, chunked prefill,
//! stops, cancellation, engine errors, context checks.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use strata::engine::generate::{
    FinishReason, GenEvent, GenOutput, GenerateError, GenerateRequest, Generator, PREFILL_CHUNK,
    TokenDecoder,
};
use strata::engine::generation::CHECKPOINT_EVERY;
use strata::sampler::SamplingParams;
use strata::server::testing::{FakeBackend, FakeOptions};

/// Token id → one letter (a–z), so text is easy to reason about.
struct LetterDecoder;
impl TokenDecoder for LetterDecoder {
    fn push(&mut self, id: u32) -> Option<String> {
        Some(((b'a' + (id % 26) as u8) as char).to_string())
    }
    fn finish(&mut self) -> Option<String> {
        None
    }
}

fn request(prompt: Vec<u32>, max_tokens: usize, seed: u64) -> GenerateRequest {
    GenerateRequest {
        prompt,
        max_tokens,
        sampling: SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            seed: Some(seed),
            ..SamplingParams::default()
        },
        stop_ids: vec![],
        stop_strings: vec![],
        checkpoint: None,
    }
}

fn run(generator: &mut Generator, req: &GenerateRequest) -> Result<GenOutput, GenerateError> {
    let cancel = AtomicBool::new(false);
    generator.generate(req, &mut LetterDecoder, &cancel, &mut |_| {})
}

fn fake(options: FakeOptions) -> Arc<FakeBackend> {
    Arc::new(FakeBackend::new(512, 4096, options))
}

#[test]
fn same_seed_same_tokens_other_seed_other_tokens() {
    let mut g = Generator::new(fake(FakeOptions::default())).with_prompt_cache(false);
    let a = run(&mut g, &request(vec![1, 2, 3], 40, 7)).unwrap();
    let b = run(&mut g, &request(vec![1, 2, 3], 40, 7)).unwrap();
    let c = run(&mut g, &request(vec![1, 2, 3], 40, 8)).unwrap();
    assert_eq!(a.tokens, b.tokens);
    assert_eq!(a.text, b.text);
    assert_ne!(a.tokens, c.tokens);
    assert_eq!(a.finish, FinishReason::Length);
    assert_eq!(a.tokens.len(), 40);
    assert_eq!(a.seed, 7);
}

#[test]
fn prompt_cache_reuses_exact_prefixes_and_changes_nothing() {
    let backend = fake(FakeOptions::default());
    let mut cached = Generator::new(backend.clone());
    let mut fresh = Generator::new(fake(FakeOptions::default())).with_prompt_cache(false);

    let prompt: Vec<u32> = (0..300).map(|i| (i * 7 % 500) as u32).collect();
    let first = run(&mut cached, &request(prompt.clone(), 10, 1)).unwrap();
    assert_eq!(first.usage.cached_tokens, 0);

    // Next turn: the whole previous sequence (prompt + generated but the last token) + more.
    let mut second_prompt = prompt.clone();
    second_prompt.extend_from_slice(&first.tokens[..first.tokens.len() - 1]);
    second_prompt.extend_from_slice(&[5, 6, 7]);
    let fed_before = backend.tokens_fed.load(Ordering::SeqCst);
    let second = run(&mut cached, &request(second_prompt.clone(), 10, 2)).unwrap();
    let fed = backend.tokens_fed.load(Ordering::SeqCst) - fed_before;
    assert_eq!(
        second.usage.cached_tokens,
        prompt.len() + first.tokens.len() - 1
    );
    assert_eq!(second.usage.prompt_tokens, second_prompt.len());
    // Only the 3 new prompt tokens and the generated ones (minus the unfed last) were computed.
    assert_eq!(fed, 3 + second.tokens.len() - 1);
    let reference = run(&mut fresh, &request(second_prompt, 10, 2)).unwrap();
    assert_eq!(second.tokens, reference.tokens);

    // A prompt that diverges from everything cached starts afresh; an exact repeat of the
    // post-prefill prompt is served entirely from the cache.
    let third = run(&mut cached, &request(vec![9, 9, 9], 5, 3)).unwrap();
    assert_eq!(third.usage.cached_tokens, 0);
    let again = run(&mut cached, &request(vec![9, 9, 9], 5, 3)).unwrap();
    assert_eq!(again.usage.cached_tokens, 3);
    assert_eq!(again.tokens, third.tokens);
}

#[test]
fn prefill_is_chunked_with_progress() {
    let backend = fake(FakeOptions::default());
    let mut g = Generator::new(backend.clone()).with_prompt_cache(false);
    let prompt: Vec<u32> = (0..(2 * PREFILL_CHUNK + 10) as u32)
        .map(|i| i % 500)
        .collect();
    let mut progress = Vec::new();
    let cancel = AtomicBool::new(false);
    let out = g
        .generate(
            &request(prompt.clone(), 2, 1),
            &mut LetterDecoder,
            &cancel,
            &mut |e| {
                if let GenEvent::PromptProgress { done, .. } = e {
                    progress.push(done)
                }
            },
        )
        .unwrap();
    assert_eq!(
        progress,
        vec![0, PREFILL_CHUNK, 2 * PREFILL_CHUNK, prompt.len()]
    );
    // 3 prefill feeds + 1 decode feed (the second generated token is not fed).
    assert_eq!(backend.feeds.load(Ordering::SeqCst), 4);
    assert_eq!(out.tokens.len(), 2);
}

#[test]
fn stop_tokens_and_stop_strings_end_generation() {
    let script = vec![7, 4, 11, 11, 14]; // "hello"
    let backend = fake(FakeOptions {
        script: script.clone(),
        script_end: Some(500),
        ..FakeOptions::default()
    });
    let mut g = Generator::new(backend).with_prompt_cache(false);
    let mut req = request(vec![1], 50, 1);
    req.stop_ids = vec![500];
    let out = run(&mut g, &req).unwrap();
    assert_eq!(out.text, "hello");
    assert_eq!(out.tokens, script);
    assert_eq!(out.finish, FinishReason::StopToken(500));

    req.stop_strings = vec!["ll".into()];
    let mut streamed = String::new();
    let cancel = AtomicBool::new(false);
    let out = g
        .generate(&req, &mut LetterDecoder, &cancel, &mut |e| match e {
            GenEvent::Token { text, .. } | GenEvent::TrailingText(text) => streamed.push_str(&text),
            _ => {}
        })
        .unwrap();
    assert_eq!(out.text, "he");
    assert_eq!(streamed, "he", "the stop string never reaches the stream");
    assert_eq!(out.finish, FinishReason::StopString("ll".into()));
}

#[test]
fn cancellation_stops_within_one_token() {
    let backend = fake(FakeOptions::default());
    let mut g = Generator::new(backend.clone()).with_prompt_cache(false);
    let cancel = AtomicBool::new(false);
    let mut seen = 0;
    let out = g
        .generate(
            &request(vec![1, 2], 1000, 1),
            &mut LetterDecoder,
            &cancel,
            &mut |e| {
                if let GenEvent::Token { .. } = e {
                    seen += 1;
                    if seen == 3 {
                        cancel.store(true, Ordering::SeqCst);
                    }
                }
            },
        )
        .unwrap();
    assert_eq!(out.finish, FinishReason::Cancelled);
    assert_eq!(out.tokens.len(), 3);
}

#[test]
fn engine_errors_fail_the_request_and_the_next_one_works() {
    let backend = fake(FakeOptions {
        fail_at_length: Some(20),
        ..FakeOptions::default()
    });
    let mut g = Generator::new(backend);
    let err = run(&mut g, &request(vec![1, 2, 3], 50, 1)).unwrap_err();
    assert!(
        matches!(
            err,
            GenerateError::Engine(strata::engine::EngineError::NonFinite { .. })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("non-finite"), "{err}");
    let ok = run(&mut g, &request(vec![1, 2, 3], 5, 1)).unwrap();
    assert_eq!(ok.tokens.len(), 5);
    assert_eq!(
        ok.usage.cached_tokens, 0,
        "the failed sequence was not cached"
    );
}

#[test]
fn context_overflow_is_refused_before_any_compute() {
    let backend = Arc::new(FakeBackend::new(512, 64, FakeOptions::default()));
    let mut g = Generator::new(backend.clone());
    let err = run(&mut g, &request(vec![1; 60], 10, 1)).unwrap_err();
    assert!(matches!(
        err,
        GenerateError::ContextOverflow {
            prompt: 60,
            max_tokens: 10,
            ctx: 64
        }
    ));
    let err = run(&mut g, &request(vec![1; 100], 1, 1)).unwrap_err();
    assert!(matches!(err, GenerateError::ContextOverflow { .. }));
    assert!(matches!(
        run(&mut g, &request(vec![], 1, 1)),
        Err(GenerateError::EmptyPrompt)
    ));
    assert!(matches!(
        run(&mut g, &request(vec![1], 0, 1)),
        Err(GenerateError::ZeroMaxTokens)
    ));
    assert_eq!(backend.feeds.load(Ordering::SeqCst), 0);
}

#[test]
fn checkpoint_lets_a_later_prompt_reuse_the_shared_part() {
    let backend = fake(FakeOptions::default());
    let mut cached = Generator::new(backend.clone());
    let mut fresh = Generator::new(fake(FakeOptions::default())).with_prompt_cache(false);
    // Turn 1: conversation (20 tokens) + generation prompt (3 tokens).
    let conversation: Vec<u32> = (100..120).collect();
    let mut first = request([conversation.clone(), vec![1, 2, 3]].concat(), 6, 1);
    first.checkpoint = Some(conversation.len());
    run(&mut cached, &first).unwrap();
    // Turn 2 re-renders turn 1 differently after the conversation: only the checkpoint matches.
    let second_prompt = [conversation.clone(), vec![7, 8, 9, 1, 2, 3]].concat();
    let second = run(&mut cached, &request(second_prompt.clone(), 6, 2)).unwrap();
    assert_eq!(second.usage.cached_tokens, conversation.len());
    let reference = run(&mut fresh, &request(second_prompt, 6, 2)).unwrap();
    assert_eq!(second.tokens, reference.tokens);
}

/// A long prompt leaves prompt-cache entries every `CHECKPOINT_EVERY` tokens: a later prompt
/// that edits it after the second such point resumes there, with the same tokens as a fresh run.
#[test]
fn long_prompts_leave_periodic_checkpoints() {
    let n = 2 * CHECKPOINT_EVERY + 300;
    let backend = Arc::new(FakeBackend::new(512, n + 64, FakeOptions::default()));
    let mut cached = Generator::new(backend.clone());
    let mut fresh = Generator::new(Arc::new(FakeBackend::new(
        512,
        n + 64,
        FakeOptions::default(),
    )))
    .with_prompt_cache(false);
    let prompt: Vec<u32> = (0..n).map(|i| (i * 13 % 500) as u32).collect();
    run(&mut cached, &request(prompt.clone(), 2, 1)).unwrap();
    // Edited 100 tokens after the second periodic checkpoint.
    let mut edited = prompt.clone();
    edited[2 * CHECKPOINT_EVERY + 100] = 501;
    let second = run(&mut cached, &request(edited.clone(), 4, 2)).unwrap();
    assert_eq!(second.usage.cached_tokens, 2 * CHECKPOINT_EVERY);
    let reference = run(&mut fresh, &request(edited, 4, 2)).unwrap();
    assert_eq!(second.tokens, reference.tokens);
}
