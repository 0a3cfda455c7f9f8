//! The whole tiny model on the GPU (lavapipe in CI) against the transformers oracle.
//!
//! Per fixture type and prompt: prompt logits within 1e-3 of `refs/<TYPE>/<prompt>.prompt_logits.npy`
//! at every position whose QSA margin (`refs/F32/<prompt>.qsa_margin_prompt.npy`) is >= 1e-3, and
//! bit-identical logits across two runs and across prefill chunk sizes 1, 7, 64 and whole prompt.
//! Without an adapter the test fails when `CI` is set and is skipped otherwise.

use std::sync::Arc;

mod common;
use common::{
    fixtures, gpu_context as context, margins, prompt_ids, read, run, same_bits, tiny_model,
};

use strata::engine::Backend;
use strata::gguf::Gguf;
use strata::gpu::GpuContext;
use strata::gpu::backend::GpuBackend;

const TOLERANCE: f32 = 1e-3;
const MIN_QSA_MARGIN: f32 = 1e-3;

fn load(ctx: &Arc<GpuContext>, ty: &str) -> Arc<GpuBackend> {
    let path = tiny_model(ty);
    let gguf = Arc::new(Gguf::open(&path).expect("fixture GGUF opens"));
    Arc::new(GpuBackend::load(ctx.clone(), gguf, 1024).expect("model loads on the GPU"))
}

/// Positions checked token by token (the tiny model's QSA budget is 32 tokens).
const DECODE_PREFIX: usize = 128;

fn check_type(ctx: &Arc<GpuContext>, ty: &str, prompts: &[&str]) {
    let backend = load(ctx, ty);
    let vocab = backend.info().vocab_size;
    for prompt in prompts {
        let ids = prompt_ids(prompt);
        let whole = run(&backend, &ids, ids.len());
        let reference = read(&fixtures().join(format!(
            "refs/{ty_ref}/{prompt}.prompt_logits.npy",
            ty_ref = ref_dir(ty)
        )));
        let margin = margins(&fixtures().join(format!("refs/F32/{prompt}.qsa_margin_prompt.npy")));
        let mut worst = 0f32;
        let mut checked = 0;
        for (pos, m) in margin.iter().enumerate().take(ids.len()) {
            if *m < MIN_QSA_MARGIN {
                continue;
            }
            let got = &whole[pos * vocab..(pos + 1) * vocab];
            let want = reference.row(pos);
            let d = got
                .iter()
                .zip(want)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            worst = worst.max(d);
            checked += 1;
        }
        println!(
            "{ty} {prompt}: {checked}/{} positions checked, max |diff| {worst:.2e}",
            ids.len()
        );
        assert!(
            checked > 0,
            "{ty} {prompt}: no position passed the margin filter"
        );
        assert!(
            worst <= TOLERANCE,
            "{ty} {prompt}: max |diff| {worst} > {TOLERANCE}"
        );
        let again = run(&backend, &ids, ids.len());
        assert!(same_bits(&whole, &again), "{ty} {prompt}: two runs differ");
        for chunk in [1, 7, 64] {
            if chunk >= ids.len() {
                continue;
            }
            // Token by token over the first DECODE_PREFIX positions only (well past the QSA
            // budget, so block selection is exercised): the rest costs CI minutes, not coverage.
            let n = if chunk == 1 {
                ids.len().min(DECODE_PREFIX)
            } else {
                ids.len()
            };
            let chunked = run(&backend, &ids[..n], chunk);
            assert!(
                same_bits(&whole[..n * vocab], &chunked),
                "{ty} {prompt}: chunk {chunk} differs from whole-prompt prefill"
            );
        }
        // The prompt but its last token in one chunk without logits (the grouped-expert prefill
        // path at full chunk size), then the last token: the same bits as the last row above.
        let (last, head) = ids.split_last().expect("prompt has tokens");
        let mut seq = Arc::clone(&backend).new_sequence().expect("sequence");
        seq.feed(head, false).expect("prefill");
        let tail = seq.feed(&[*last], true).expect("last token");
        assert!(
            same_bits(&whole[(ids.len() - 1) * vocab..], &tail),
            "{ty} {prompt}: one-chunk prefill then decode differs"
        );
        println!("{ty} {prompt}: bit-identical across 2 runs and chunk sizes 1, 7, 64, whole");
    }
}

/// F16 holds the F32 weights exactly, so it is checked against the F32 references.
fn ref_dir(ty: &str) -> &str {
    if ty == "F16" { "F32" } else { ty }
}

#[test]
fn tiny_f16_matches_reference_and_is_chunk_invariant() {
    let Some(ctx) = context() else { return };
    check_type(&ctx, "F16", &["p1", "p7", "p64eos", "p300"]);
}

/// The limb arithmetic (docs/tensor-cores.md, the groundwork of tensor-core prefill): the same
/// oracle tolerance and the same bits across runs and chunk sizes as today's arithmetic.
#[test]
fn limb_arithmetic_matches_reference_and_is_chunk_invariant() {
    let Some(ctx) = common::gpu_context_limb() else {
        return;
    };
    check_type(&ctx, "IQ3_S", &["p300"]);
}

/// The integer-digit arithmetic (docs/int-arith.md, `STRATA_ARITH=int`): the same oracle
/// tolerance and the same bits across runs and chunk sizes.
#[test]
fn integer_digit_arithmetic_matches_reference_and_is_chunk_invariant() {
    let Some(ctx) = context() else { return };
    ctx.set_idot(true);
    check_type(&ctx, "IQ3_S", &["p300"]);
}

#[test]
fn tiny_iq3_s_matches_reference_and_is_chunk_invariant() {
    let Some(ctx) = context() else { return };
    check_type(&ctx, "IQ3_S", &["p1", "p300"]);
}

/// Sequences share the backend's chunk buffers: two prompts fed in alternating chunks give the
/// same bits as each fed alone (nothing of one sequence survives in the shared buffers into the
/// other's feed).
#[test]
fn interleaved_sequences_match_sequences_fed_alone() {
    let Some(ctx) = context() else { return };
    let backend = load(&ctx, "IQ3_S");
    let a = prompt_ids("p300");
    let b = prompt_ids("p64eos");
    let alone_a = run(&backend, &a, 16);
    let alone_b = run(&backend, &b, 16);
    let mut sa = Arc::clone(&backend).new_sequence().expect("sequence a");
    let mut sb = Arc::clone(&backend).new_sequence().expect("sequence b");
    let (mut got_a, mut got_b) = (Vec::new(), Vec::new());
    let mut chunks_b = b.chunks(16);
    for chunk in a.chunks(16) {
        got_a.extend(sa.feed(chunk, true).expect("a"));
        if let Some(cb) = chunks_b.next() {
            got_b.extend(sb.feed(cb, true).expect("b"));
        }
    }
    assert!(
        same_bits(&got_a, &alone_a),
        "prompt a differs when interleaved"
    );
    assert!(
        same_bits(&got_b, &alone_b),
        "prompt b differs when interleaved"
    );
}

/// A forked sequence continues exactly like the original (and like one uninterrupted run).
#[test]
fn fork_continues_bit_identically() {
    let Some(ctx) = context() else { return };
    let backend = load(&ctx, "IQ3_S");
    let ids = prompt_ids("p64eos");
    let whole = run(&backend, &ids, ids.len());
    let vocab = backend.info().vocab_size;
    let split = 30;
    let mut seq = Arc::clone(&backend).new_sequence().expect("sequence");
    seq.feed(&ids[..split], false).expect("prefix");
    let mut fork = seq.fork().expect("GPU sequences can fork");
    assert_eq!(fork.tokens(), &ids[..split]);
    // The prompt cache's budget counts what a fork holds: as much VRAM as the original, and at
    // least the key and value caches of the whole context.
    assert_eq!(fork.state_bytes(), seq.state_bytes());
    assert!(seq.state_bytes() > 2 * backend.info().context_length * 4);
    let from_original = seq.feed(&ids[split..], true).expect("original continues");
    let from_fork = fork.feed(&ids[split..], true).expect("fork continues");
    let expected = &whole[split * vocab..];
    assert!(
        same_bits(&from_original, expected),
        "original after fork differs from one run"
    );
    assert!(same_bits(&from_fork, expected), "fork differs from one run");
}

/// Decode steps recorded ahead, while the GPU runs the step before (`forward::Prepared`, forced
/// on here: a CPU adapter does not take them by default), give the bits of the prompt fed whole:
/// token by token with the logits read back, with the GPU's candidates now and then (a step
/// prepared for the other kind of readback is dropped and recorded anew), and with another
/// sequence fed between the steps (it shares the chunk buffers the prepared step binds).
#[test]
fn steps_recorded_ahead_give_the_same_bits() {
    let Some(ctx) = context() else { return };
    let backend = load(&ctx, "IQ3_S");
    backend.set_prepare_ahead(true);
    let ids = prompt_ids("p64eos");
    let other = prompt_ids("p7");
    let whole = run(&backend, &ids, ids.len());
    let vocab = backend.info().vocab_size;
    let split = 40;
    let mut seq = Arc::clone(&backend).new_sequence().expect("sequence");
    seq.feed(&ids[..split], false).expect("prefix");
    let mut interloper = Arc::clone(&backend).new_sequence().expect("other sequence");
    for (i, &id) in ids.iter().enumerate().skip(split) {
        let row = &whole[i * vocab..(i + 1) * vocab];
        if i % 6 == 3 {
            let top = seq.feed_top(&[id], 8).expect("candidates");
            assert_eq!(top, strata::sampler::top_candidates(row, 8), "position {i}");
        } else {
            let got = seq.feed(&[id], false).expect("decode");
            assert!(
                same_bits(&got, row),
                "position {i} differs from the prompt fed whole"
            );
        }
        if i % 5 == 0 {
            interloper.feed(&other, false).expect("other sequence");
        }
    }
}

/// The GPU greedy path (argmax on the GPU, 8 bytes read back) picks the argmax of the logits
/// the normal path returns, over a 20-token greedy continuation.
#[test]
fn greedy_on_gpu_matches_logits_argmax() {
    let Some(ctx) = context() else { return };
    let backend = load(&ctx, "IQ3_S");
    let ids = prompt_ids("p7");
    let mut greedy = backend.sequence().expect("sequence");
    let mut reference = Arc::clone(&backend).new_sequence().expect("sequence");
    let mut next = greedy.feed_greedy(&ids).expect("greedy prefill");
    let mut logits = reference.feed(&ids, false).expect("prefill");
    for step in 0..20 {
        let mut best = 0;
        for (i, v) in logits.iter().enumerate() {
            if *v > logits[best] {
                best = i;
            }
        }
        assert_eq!(next, best as u32, "step {step}");
        logits = reference.feed(&[next], false).expect("decode");
        next = greedy.feed_greedy(&[next]).expect("greedy decode");
    }
}

/// Sampled decoding from the GPU's candidates (`Sequence::feed_top`: about half a kilobyte read
/// back, the row never leaves the GPU) gives the tokens that sampling from the whole logits row
/// gives, over a 24-token continuation at the default settings (top-k 20, top-p 0.95,
/// temperature 0.6) and at top-k 64 with min-p.
#[test]
fn sampling_from_gpu_candidates_matches_the_logits_row() {
    use strata::sampler::{Sampler, SamplingParams};
    let Some(ctx) = context() else { return };
    let backend = load(&ctx, "IQ3_S");
    let ids = prompt_ids("p7");
    for params in [
        SamplingParams {
            seed: Some(11),
            ..SamplingParams::default()
        },
        SamplingParams {
            seed: Some(12),
            temperature: 1.5,
            top_k: 64,
            top_p: 1.0,
            min_p: 0.02,
            ..SamplingParams::default()
        },
    ] {
        let mut on_gpu = Arc::clone(&backend).new_sequence().expect("sequence");
        let mut reference = Arc::clone(&backend).new_sequence().expect("sequence");
        let mut fast = Sampler::new(&params, &ids).expect("sampler");
        let mut slow = Sampler::new(&params, &ids).expect("sampler");
        let k = fast
            .top_only()
            .expect("these settings sample from the first candidates");
        let mut logits = reference.feed(&ids, false).expect("prefill");
        let mut next = slow.sample(&logits, ids.len()).expect("first token");
        assert_eq!(fast.sample(&logits, ids.len()).expect("first token"), next);
        on_gpu.feed(&ids, false).expect("prefill");
        for step in 1..24 {
            let position = ids.len() + step;
            let top = on_gpu.feed_top(&[next], k).expect("candidates");
            assert_eq!(top.len(), k, "step {step}");
            logits = reference.feed(&[next], false).expect("decode");
            let want = slow.sample(&logits, position).expect("sample");
            let got = fast
                .sample_top(&top, position)
                .expect("sample from candidates");
            assert_eq!(got, want, "step {step}");
            next = want;
        }
    }
}

/// The stage-checking diagnostic mode (one submission per layer, residual read back and checked)
/// computes the same bits as the one-pass path.
#[test]
fn stage_check_mode_gives_the_same_bits() {
    let Some(ctx) = context() else { return };
    let path = fixtures().join("tiny-IQ3_S.gguf");
    let gguf = Arc::new(Gguf::open(&path).expect("fixture GGUF opens"));
    let mut checked = GpuBackend::load(ctx.clone(), gguf, 1024).expect("loads");
    checked.set_check_stages(true);
    let checked = Arc::new(checked);
    let normal = load(&ctx, "IQ3_S");
    let ids = prompt_ids("p64eos");
    let a = run(&checked, &ids, 7);
    let b = run(&normal, &ids, 7);
    assert!(same_bits(&a, &b), "stage-checked run differs");
}

/// Run the strata binary; it must succeed (else its stderr is the failure). Its stdout.
fn strata_stdout(command: &mut std::process::Command) -> Vec<u8> {
    let out = command.output().expect("spawn strata");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// `strata bench --ablate 2` on the tiny model: the decode step timed again without each of the
/// two kernels the profile ranks first (their labels, in that order), every timing positive; and
/// `bench --synthetic small` times the empty dispatch and both router entry points.
#[test]
fn bench_ablation_and_small_kernels_report() {
    if context().is_none() {
        return;
    }
    let json = std::env::temp_dir().join(format!("strata-ablate-{}.json", std::process::id()));
    let model = fixtures().join("tiny-F16.gguf");
    strata_stdout(
        std::process::Command::new(env!("CARGO_BIN_EXE_strata"))
            .args(["bench", "--prefill", "8", "--decode", "2", "--ablate", "2"])
            .arg("--model")
            .arg(&model)
            .arg("--json")
            .arg(&json),
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("report")).expect("json");
    let _ = std::fs::remove_file(&json);
    let ranked: Vec<&str> = report["decode_step_kernels"]["by_kernel"]
        .as_array()
        .expect("profile")
        .iter()
        .take(2)
        .map(|k| k["kernel"].as_str().expect("label"))
        .collect();
    let ablation = &report["ablation"];
    assert!(ablation["full_step_ms"].as_f64().expect("full step") > 0.0);
    let rows = ablation["without"].as_array().expect("rows");
    let labels: Vec<&str> = rows
        .iter()
        .map(|r| r["kernel"].as_str().expect("kernel"))
        .collect();
    assert_eq!(labels, ranked, "the profile's first two kernels, in order");
    for r in rows {
        assert!(r["step_ms"].as_f64().expect("timed") > 0.0, "{r}");
    }

    let report: serde_json::Value = serde_json::from_slice(&strata_stdout(
        std::process::Command::new(env!("CARGO_BIN_EXE_strata")).args([
            "bench",
            "--synthetic",
            "small",
        ]),
    ))
    .expect("json");
    let kernels: Vec<&str> = report["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|r| r["kernel"].as_str().expect("kernel"))
        .collect();
    assert_eq!(kernels.len(), 10, "{kernels:?}");
    assert_eq!(kernels[0], "empty dispatch");
    assert!(kernels.iter().any(|k| k.starts_with("empty grid of 4096")));
    assert!(kernels.iter().any(|k| k.starts_with("read 2.7 MB")));
    assert!(kernels.iter().any(|k| k.starts_with("moe_router_wide")));
    assert!(kernels.iter().any(|k| k.starts_with("moe_router ")));
}

/// The (quant, arith) rows of `strata bench --synthetic matvec --arith int`, each timed on the GPU.
fn matvec_bench_rows(quant: &str, shape: &str) -> Vec<(String, String)> {
    let report: serde_json::Value = serde_json::from_slice(&strata_stdout(
        std::process::Command::new(env!("CARGO_BIN_EXE_strata"))
            .args(["bench", "--synthetic", "matvec", "--arith", "int"])
            .args(["--quant", quant, "--shapes", shape]),
    ))
    .expect("json");
    report["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|r| {
            assert!(r["gpu_microseconds"].as_f64().expect("timed") > 0.0, "{r}");
            let apart = r["independent_microseconds"].as_f64().expect("independent");
            let share = r["independent_fraction_of_streaming_read"]
                .as_f64()
                .expect("share");
            assert!(apart > 0.0 && share > 0.0 && share.is_finite(), "{r}");
            let field = |k: &str| r[k].as_str().expect("field").to_string();
            (field("quant"), field("arith"))
        })
        .collect()
}

/// `strata bench --synthetic matvec --arith int` labels each row with the arithmetic it took: the
/// integer digits for a type with integer codes (IQ4_NL; at this shape a decode mat-vec splits x
/// inside its workgroups, with no dispatch of its own), the default for one without (Q4_K, whose
/// weights have mins).
#[test]
fn bench_matvec_labels_the_arithmetic_each_type_took() {
    if context().is_none() {
        return;
    }
    let pair = |q: &str, a: &str| vec![(q.to_string(), a.to_string())];
    assert_eq!(
        matvec_bench_rows("IQ4_NL", "10240x2560"),
        pair("IQ4_NL", "int")
    );
    assert_eq!(
        matvec_bench_rows("Q4_K", "320x10240"),
        pair("Q4_K", "default")
    );
}
