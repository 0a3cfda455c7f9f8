//! `strata bench --parallel 1,2,4,8`: aggregate decode throughput of N sequences advanced
//! together, one [`Backend::feed_many`] call per step (on the GPU one batched pass: each weight
//! read once for all N).

use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;

use super::Prompted;
use crate::engine::{Backend, FeedItem, Sequence};

/// Sampling candidates each step asks for (the default `top_k`).
const TOP: usize = 20;

/// Parse `--parallel` (comma-separated sequence counts, each at least 1).
pub fn counts(list: &str) -> anyhow::Result<Vec<usize>> {
    list.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| match s.trim().parse::<usize>() {
            Ok(n) if n >= 1 => Ok(n),
            _ => anyhow::bail!("bad --parallel count {s:?} (expected whole numbers >= 1)"),
        })
        .collect()
}

/// One row per count: `steps` decode steps of `n` copies of the prompted sequence `base`, each
/// fed its own tokens (sequence i feeds `tokens` from offset 7i, so their experts differ). The
/// median step (host wall, after one untimed step) gives the aggregate tok/s.
pub fn decode(
    backend: &Arc<dyn Backend>,
    base: &Prompted,
    tokens: &[u32],
    counts: &[usize],
    steps: usize,
) -> anyhow::Result<serde_json::Value> {
    let mut rows = Vec::new();
    for &n in counts {
        let mut seqs: Vec<Box<dyn Sequence>> =
            (0..n).map(|_| base.fork()).collect::<anyhow::Result<_>>()?;
        let mut times = Vec::new();
        for step in 0..=steps {
            let picks: Vec<u32> = (0..n)
                .map(|i| tokens[(step + 7 * i) % tokens.len().max(1)])
                .collect();
            let mut items: Vec<FeedItem> = seqs
                .iter_mut()
                .zip(&picks)
                .map(|(seq, pick)| FeedItem {
                    sequence: seq.as_mut(),
                    tokens: std::slice::from_ref(pick),
                    top: TOP,
                })
                .collect();
            let start = Instant::now();
            for fed in backend.feed_many(&mut items) {
                fed.context("a parallel decode step")?;
            }
            if step > 0 {
                times.push(start.elapsed().as_secs_f64());
            }
        }
        times.sort_by(f64::total_cmp);
        let median = times.get(times.len() / 2).copied().unwrap_or(0.0);
        let tps = n as f64 / median.max(1e-12);
        eprintln!(
            "parallel decode: {n} sequences, {:.2} ms per step, {tps:.1} tok/s together",
            median * 1e3
        );
        rows.push(serde_json::json!({
            "sequences": n,
            "median_ms_per_step": median * 1e3,
            "tokens_per_second": tps,
        }));
    }
    Ok(serde_json::Value::Array(rows))
}
