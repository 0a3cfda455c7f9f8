//! The step-level scheduler on the built-in demo model (CPU backend, and the GPU, where the
//! requests of a round share one batched pass): a request's tokens and log-probabilities are the
//! same bits whether it runs alone or interleaved with others, and the reported
//! log-probabilities are the log-softmax of the model's raw logits.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

mod common;

use strata::cli::load::{BackendChoice, load_backend, open_gguf};
use strata::engine::Backend;
use strata::engine::generate::{GenOutput, GenerateRequest};
use strata::engine::generation::GenerationOptions;
use strata::engine::scheduler::{Scheduler, SchedulerConfig, SchedulerStats, Submission};
use strata::gpu::backend::GpuBackend;
use strata::sampler::SamplingParams;
use strata::tokenizer::{StreamDecoder, Tokenizer};

fn demo() -> (Arc<dyn Backend>, Tokenizer) {
    let gguf = open_gguf(None).expect("demo model");
    let tokenizer = Tokenizer::from_gguf(&gguf).expect("tokenizer");
    let backend = load_backend(gguf, BackendChoice::Cpu, 0).expect("cpu backend");
    (backend, tokenizer)
}

fn request(tokenizer: &Tokenizer, i: u64) -> GenerateRequest {
    let text = format!(
        "request number {i} asks about {}",
        "rivers ".repeat(i as usize % 5)
    );
    GenerateRequest {
        prompt: tokenizer.encode(&text, false).expect("encode"),
        max_tokens: 12 + (i as usize % 4),
        sampling: SamplingParams {
            temperature: 0.9,
            top_k: 40,
            top_p: 0.95,
            seed: Some(1000 + i),
            ..SamplingParams::default()
        },
        stop_ids: Vec::new(),
        stop_strings: Vec::new(),
        checkpoint: None,
    }
}

/// Submit every request at once to a scheduler with `parallel` slots; outputs in request order.
fn run(
    backend: &Arc<dyn Backend>,
    tokenizer: &Tokenizer,
    parallel: usize,
    requests: &[GenerateRequest],
) -> Vec<GenOutput> {
    let config = SchedulerConfig {
        parallel,
        queue: 64,
        cache_entries: 0,
        ..SchedulerConfig::default()
    };
    let stats = Arc::new(SchedulerStats::default());
    let scheduler = Scheduler::start(backend.clone(), config, stats.clone()).expect("scheduler");
    let (sender, receiver) = mpsc::channel();
    for (i, r) in requests.iter().enumerate() {
        let sender = sender.clone();
        scheduler
            .submit(Submission {
                request: r.clone(),
                // Half the requests without log-probabilities: their decode steps ask the backend
                // for sampling candidates only.
                options: GenerationOptions {
                    logprobs: (r.sampling.seed.unwrap_or(0) % 2 == 0).then_some(3),
                    constraint: None,
                },
                decoder: Box::new(StreamDecoder::new(tokenizer)),
                cancel: Arc::new(AtomicBool::new(false)),
                on_event: Box::new(|_| {}),
                on_done: Box::new(move |result| {
                    let _ = sender.send((i, result));
                }),
            })
            .expect("submit");
    }
    let mut outputs: Vec<Option<GenOutput>> = (0..requests.len()).map(|_| None).collect();
    for _ in requests {
        let (i, result) = receiver
            .recv_timeout(Duration::from_secs(120))
            .expect("a result");
        outputs[i] = Some(result.expect("generation"));
    }
    // What /metrics reports: the backend's batched passes, as of the last round.
    let (passes, steps) = backend.batched_passes();
    assert_eq!(stats.batched_passes.load(Ordering::Relaxed), passes);
    assert_eq!(stats.batched_steps.load(Ordering::Relaxed), steps);
    outputs
        .into_iter()
        .map(|o| o.expect("every output"))
        .collect()
}

#[test]
fn a_request_gives_the_same_bits_alone_and_among_seven_others() {
    let (backend, tokenizer) = demo();
    alone_and_among_seven_others(&backend, &tokenizer);
}

/// The same on the GPU, where the requests of a round share batched passes.
#[test]
fn a_request_gives_the_same_bits_alone_and_batched_with_seven_others_on_the_gpu() {
    let Some(ctx) = common::gpu_context() else {
        return;
    };
    let gguf = open_gguf(None).expect("demo model");
    let tokenizer = Tokenizer::from_gguf(&gguf).expect("tokenizer");
    let gpu = Arc::new(GpuBackend::load(ctx, gguf, 1024).expect("GPU backend"));
    let backend: Arc<dyn Backend> = gpu.clone();
    alone_and_among_seven_others(&backend, &tokenizer);
    let (passes, steps) = gpu.batched_passes();
    println!("{passes} batched passes carried {steps} steps");
    // Eight requests of 12 to 15 tokens decode side by side for at least 11 rounds.
    assert!(passes >= 11, "{passes} batched passes");
    assert!(steps >= 8 * 11, "{steps} steps in batched passes");
}

fn alone_and_among_seven_others(backend: &Arc<dyn Backend>, tokenizer: &Tokenizer) {
    let requests: Vec<GenerateRequest> = (0..8).map(|i| request(tokenizer, i)).collect();
    let together = run(backend, tokenizer, 8, &requests);
    for (i, r) in requests.iter().enumerate() {
        let alone = run(backend, tokenizer, 1, std::slice::from_ref(r));
        assert_eq!(alone[0].tokens, together[i].tokens, "request {i} tokens");
        assert_eq!(alone[0].text, together[i].text, "request {i} text");
        // Bit-identical logits give bit-identical log-probabilities.
        let bits = |o: &GenOutput| -> Vec<u32> {
            o.logprobs
                .iter()
                .flat_map(|t| std::iter::once(&t.chosen).chain(&t.top))
                .map(|t| t.logprob.to_bits())
                .collect()
        };
        assert_eq!(bits(&alone[0]), bits(&together[i]), "request {i} logprobs");
        assert_eq!(together[i].tokens.len(), r.max_tokens);
    }
    // Different seeds really did give different outputs (the comparison above means something).
    assert_ne!(together[0].tokens, together[1].tokens);
}

#[test]
fn logprobs_are_the_log_softmax_of_the_raw_logits() {
    let (backend, tokenizer) = demo();
    // An even seed: `run` asks for log-probabilities.
    let r = request(&tokenizer, 4);
    let output = run(&backend, &tokenizer, 2, std::slice::from_ref(&r)).remove(0);
    assert_eq!(output.logprobs.len(), output.tokens.len());
    let mut sequence = backend.clone().new_sequence().expect("sequence");
    let mut logits = sequence.feed(&r.prompt, false).expect("prefill");
    for (step, (&token, reported)) in output.tokens.iter().zip(&output.logprobs).enumerate() {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let z: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
        let direct = |id: u32| (logits[id as usize] as f64 - max - z.ln()) as f32;
        assert_eq!(reported.chosen.id, token);
        assert!(
            (reported.chosen.logprob - direct(token)).abs() < 1e-5,
            "step {step}: {} vs {}",
            reported.chosen.logprob,
            direct(token)
        );
        assert_eq!(reported.top.len(), 3);
        let best = (0..logits.len() as u32)
            .max_by(|&a, &b| {
                logits[a as usize]
                    .total_cmp(&logits[b as usize])
                    .then(b.cmp(&a))
            })
            .expect("non-empty");
        assert_eq!(reported.top[0].id, best, "step {step}: most likely token");
        assert!(
            reported
                .top
                .windows(2)
                .all(|w| w[0].logprob >= w[1].logprob)
        );
        assert!((reported.top[0].logprob - direct(best)).abs() < 1e-5);
        logits = sequence.feed(&[token], false).expect("decode");
    }
}

/// Run requests one after another through one scheduler (so the prompt cache carries over).
fn run_in_turn(scheduler: &Scheduler, tokenizer: &Tokenizer, r: &GenerateRequest) -> GenOutput {
    let (sender, receiver) = mpsc::channel();
    scheduler
        .submit(Submission {
            request: r.clone(),
            options: GenerationOptions {
                logprobs: Some(1),
                constraint: None,
            },
            decoder: Box::new(StreamDecoder::new(tokenizer)),
            cancel: Arc::new(AtomicBool::new(false)),
            on_event: Box::new(|_| {}),
            on_done: Box::new(move |result| {
                let _ = sender.send(result);
            }),
        })
        .expect("submit");
    receiver
        .recv_timeout(Duration::from_secs(120))
        .expect("a result")
        .expect("generation")
}

#[test]
fn interleaved_conversations_keep_their_cached_prefixes_and_reuse_is_exact() {
    let (backend, tokenizer) = demo();
    let scheduler = |entries| {
        let config = SchedulerConfig {
            parallel: 2,
            queue: 8,
            cache_entries: entries,
            ..SchedulerConfig::default()
        };
        Scheduler::start(backend.clone(), config, Arc::new(SchedulerStats::default()))
            .expect("scheduler")
    };
    let cached = scheduler(12);
    let a1 = request(&tokenizer, 1);
    let b1 = request(&tokenizer, 2);
    let out_a1 = run_in_turn(&cached, &tokenizer, &a1);
    let _ = run_in_turn(&cached, &tokenizer, &b1);
    // Turn 2 of conversation A, after B ran: A's first turn is still cached (all of it but the
    // last generated token, which was sampled and never fed).
    let mut a2 = a1.clone();
    a2.prompt.extend(&out_a1.tokens);
    a2.prompt
        .extend(tokenizer.encode(" and then?", false).expect("encode"));
    let warm = run_in_turn(&cached, &tokenizer, &a2);
    assert_eq!(
        warm.usage.cached_tokens,
        a1.prompt.len() + out_a1.tokens.len() - 1
    );
    let cold = run_in_turn(&scheduler(0), &tokenizer, &a2);
    assert_eq!(cold.usage.cached_tokens, 0);
    assert_eq!(warm.tokens, cold.tokens);
    let bits = |o: &GenOutput| -> Vec<u32> {
        o.logprobs
            .iter()
            .map(|t| t.chosen.logprob.to_bits())
            .collect()
    };
    assert_eq!(
        bits(&warm),
        bits(&cold),
        "cached reuse must be bit-identical"
    );
}
