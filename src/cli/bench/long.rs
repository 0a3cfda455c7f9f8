//! `strata bench --long`: one long prompt prefilled once, then decode at its depth. The regular
//! bench prefills every prompt twice (a warm-up, then the timed run) and again for the decode
//! prompt, which at 262K tokens would take most of an hour; here the pipelines are built on a
//! prompt of two chunks and a remainder, the long prompt is fed once with its progress printed,
//! and decode continues that same sequence. Reports the VRAM the process uses at the end and the
//! per-kernel GPU time of one more decode step.

use std::sync::Arc;
use std::time::Instant;

use super::{bench_tokens, gpu_context, host_rss_bytes, profile_feed, streaming_read_gbps};
use crate::engine::{Backend, Sequence};
use crate::gpu::backend::GpuBackend;

/// Tokens fed per progress line.
const PROGRESS_TOKENS: usize = 16384;

/// Prefill `tokens` tokens into one sequence of a GPU backend loaded from `gguf` (context
/// `tokens + decode + 1`), then decode `decode` tokens after one untimed step.
pub fn run(
    gguf: Arc<crate::gguf::Gguf>,
    tokens: usize,
    decode: usize,
    prefill_chunk: usize,
    tiers: &crate::tiers::TierArgs,
) -> anyhow::Result<serde_json::Value> {
    let ctx = gpu_context()?;
    let read_gbps = streaming_read_gbps(&ctx)?;
    let ctx_len = tokens + decode + 3;
    let mut loaded = GpuBackend::load_with(ctx.clone(), gguf, ctx_len, tiers)?;
    if prefill_chunk > 0 {
        loaded.set_max_chunk(prefill_chunk);
    }
    let b = Arc::new(loaded);
    let vocab = b.info().vocab_size;
    let ids = bench_tokens(tokens + decode + 2, vocab);
    // Every pipeline the long feed takes: full chunks, a partial one, and selection (a prompt
    // past the attention budget).
    let warm = (2 * b.max_chunk() + 17).min(tokens);
    b.sequence()?.feed(&ids[..warm], false)?;
    let mut seq = b.sequence()?;
    let start = Instant::now();
    let mut fed = 0;
    let mut steps = Vec::new();
    while fed < tokens {
        let n = PROGRESS_TOKENS.min(tokens - fed);
        let step = Instant::now();
        seq.feed(&ids[fed..fed + n], false)?;
        let secs = step.elapsed().as_secs_f64();
        fed += n;
        eprintln!(
            "prefilled {fed:>7} tokens in {:>7.1} s ({:.1} tok/s over the last {n})",
            start.elapsed().as_secs_f64(),
            n as f64 / secs
        );
        steps.push(serde_json::json!({"depth": fed, "seconds": secs}));
    }
    let prefill_secs = start.elapsed().as_secs_f64();
    seq.feed(&ids[tokens..tokens + 1], false)?;
    let mut per_token = Vec::with_capacity(decode);
    let start = Instant::now();
    for &t in &ids[tokens + 1..tokens + 1 + decode] {
        let step = Instant::now();
        seq.feed(&[t], false)?;
        per_token.push(step.elapsed().as_secs_f64());
    }
    let decode_secs = start.elapsed().as_secs_f64();
    per_token.sort_by(f64::total_cmp);
    let median = per_token.get(per_token.len() / 2).copied().unwrap_or(0.0);
    let decode_tps = decode as f64 / decode_secs.max(1e-12);
    let vram = crate::gpu::memory::used_device_memory(&ctx);
    let state = seq.state_bytes();
    let at = tokens + 1 + decode;
    let kernels = profile_feed(seq, &ids[at..at + 1], &format!("decode step at depth {at}"))?;
    eprintln!(
        "model: {} on {} ({:.1} GB/s streaming read)",
        b.info().name,
        b.info().backend,
        read_gbps
    );
    eprintln!(
        "prefill {tokens} tokens: {:.1} s, {:.1} tok/s",
        prefill_secs,
        tokens as f64 / prefill_secs
    );
    eprintln!(
        "decode {decode} tokens at depth {}: {decode_tps:.1} tok/s (median {:.3} ms/token host \
         wall)",
        tokens + 1,
        median * 1e3
    );
    eprintln!(
        "the sequence's state (KV and indexer caches, recurrent state): {:.2} GiB; VRAM this \
         process uses: {}",
        state as f64 / (1u64 << 30) as f64,
        vram.map_or("not reported by the adapter".into(), |v| format!(
            "{:.2} GiB",
            v as f64 / (1u64 << 30) as f64
        ))
    );
    Ok(serde_json::json!({
        "benchmark": "long",
        "model": b.info().name,
        "backend": b.info().backend,
        "adapter": serde_json::to_value(&ctx.adapter)?,
        "kv": format!("{:?}", b.config.kv),
        "prefill_tokens": tokens,
        "prefill_seconds": prefill_secs,
        "prefill_tokens_per_second": tokens as f64 / prefill_secs,
        "prefill_steps": steps,
        "decode_tokens": decode,
        "decode_depth": tokens + 1,
        "decode_tokens_per_second": decode_tps,
        "decode_median_ms_per_token": median * 1e3,
        "sequence_state_bytes": state,
        "vram_used_bytes": vram,
        "host_rss_bytes": host_rss_bytes(),
        "streaming_read_gbps": read_gbps,
        "decode_step_kernels": kernels,
    }))
}
