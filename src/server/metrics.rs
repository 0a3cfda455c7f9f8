//! Counters for `GET /metrics` (Prometheus text exposition format, version 0.0.4).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Upper bounds (seconds) of the request latency histogram buckets.
const LATENCY_BUCKETS: [f64; 12] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0,
];

#[derive(Default)]
struct Histogram {
    /// Per-bucket counts (not cumulative); the last slot is +Inf.
    buckets: [u64; LATENCY_BUCKETS.len() + 1],
    sum: f64,
    count: u64,
}

#[derive(Default)]
pub struct Metrics {
    pub prompt_tokens: AtomicU64,
    pub cached_prompt_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    /// Requests whose generation stopped because the client went away.
    pub cancelled_generations: AtomicU64,
    /// Waiting / running counts and prefill progress, kept by the scheduler.
    pub scheduler: Arc<crate::engine::scheduler::SchedulerStats>,
    /// f64 bits of the last request's prefill / decode speed.
    last_prefill_tps: AtomicU64,
    last_decode_tps: AtomicU64,
    latency: Mutex<Histogram>,
    /// (endpoint, HTTP status) → count.
    requests: Mutex<BTreeMap<(String, u16), u64>>,
}

impl Metrics {
    pub fn record_speeds(&self, prefill_tps: f64, decode_tps: f64) {
        if prefill_tps > 0.0 {
            self.last_prefill_tps
                .store(prefill_tps.to_bits(), Ordering::Relaxed);
        }
        if decode_tps > 0.0 {
            self.last_decode_tps
                .store(decode_tps.to_bits(), Ordering::Relaxed);
        }
    }

    /// Prefill speed (tokens/s) of the last request that had one; 0 before any.
    pub fn last_prefill_tps(&self) -> f64 {
        f64::from_bits(self.last_prefill_tps.load(Ordering::Relaxed))
    }

    /// Decode speed (tokens/s) of the last request that had one; 0 before any.
    pub fn last_decode_tps(&self) -> f64 {
        f64::from_bits(self.last_decode_tps.load(Ordering::Relaxed))
    }

    pub fn record_request(&self, endpoint: &str, status: u16, seconds: f64) {
        if let Ok(mut map) = self.requests.lock() {
            *map.entry((endpoint.to_string(), status)).or_insert(0) += 1;
        }
        if let Ok(mut h) = self.latency.lock() {
            let slot = LATENCY_BUCKETS
                .iter()
                .position(|&b| seconds <= b)
                .unwrap_or(LATENCY_BUCKETS.len());
            h.buckets[slot] += 1;
            h.sum += seconds;
            h.count += 1;
        }
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        let counter = |out: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
            );
        };
        let gauge = |out: &mut String, name: &str, help: &str, v: f64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        counter(
            &mut out,
            "strata_prompt_tokens_total",
            "Prompt tokens processed (including cached ones).",
            self.prompt_tokens.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "strata_prompt_tokens_cached_total",
            "Prompt tokens served from the prompt cache.",
            self.cached_prompt_tokens.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "strata_generated_tokens_total",
            "Tokens generated.",
            self.generated_tokens.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "strata_generations_cancelled_total",
            "Generations stopped because the client disconnected.",
            self.cancelled_generations.load(Ordering::Relaxed),
        );
        let scheduler = &self.scheduler;
        let load = |v: &AtomicUsize| v.load(Ordering::Relaxed) as f64;
        gauge(
            &mut out,
            "strata_queue_depth",
            "Requests waiting for a generation slot.",
            load(&scheduler.waiting),
        );
        gauge(
            &mut out,
            "strata_requests_running",
            "Requests holding a generation slot (advanced step by step together).",
            load(&scheduler.running),
        );
        gauge(
            &mut out,
            "strata_prefill_tokens_done",
            "Prompt tokens processed so far by the requests still processing their prompt.",
            load(&scheduler.prefill_done),
        );
        gauge(
            &mut out,
            "strata_prompt_cache_entries",
            "Sequences kept in the prompt cache.",
            load(&scheduler.cache_entries),
        );
        gauge(
            &mut out,
            "strata_prompt_cache_bytes",
            "Memory held by the prompt cache's sequences (VRAM on the GPU).",
            load(&scheduler.cache_bytes),
        );
        counter(
            &mut out,
            "strata_batched_passes_total",
            "Forward passes that advanced several requests at once (GPU backend).",
            load(&scheduler.batched_passes) as u64,
        );
        counter(
            &mut out,
            "strata_batched_steps_total",
            "Request steps carried by those shared passes.",
            load(&scheduler.batched_steps) as u64,
        );
        gauge(
            &mut out,
            "strata_prefill_tokens_remaining",
            "Prompt tokens still to process by the running requests.",
            load(&scheduler.prefill_remaining),
        );
        gauge(
            &mut out,
            "strata_prompt_tokens_per_second",
            "Prefill speed of the last request.",
            f64::from_bits(self.last_prefill_tps.load(Ordering::Relaxed)),
        );
        gauge(
            &mut out,
            "strata_generation_tokens_per_second",
            "Decode speed of the last request.",
            f64::from_bits(self.last_decode_tps.load(Ordering::Relaxed)),
        );
        if let Ok(h) = self.latency.lock() {
            let name = "strata_request_duration_seconds";
            let _ = writeln!(
                out,
                "# HELP {name} Time from a request's arrival to its response headers (for streams: to the first byte).\n# TYPE {name} histogram"
            );
            let mut cumulative = 0;
            for (i, bound) in LATENCY_BUCKETS.iter().enumerate() {
                cumulative += h.buckets[i];
                let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
            }
            cumulative += h.buckets[LATENCY_BUCKETS.len()];
            let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
            let _ = writeln!(out, "{name}_sum {}\n{name}_count {}", h.sum, h.count);
        }
        if let Ok(map) = self.requests.lock() {
            let name = "strata_requests_total";
            let _ = writeln!(
                out,
                "# HELP {name} Requests by endpoint and HTTP status.\n# TYPE {name} counter"
            );
            for ((endpoint, status), count) in map.iter() {
                let _ = writeln!(
                    out,
                    "{name}{{endpoint=\"{endpoint}\",status=\"{status}\"}} {count}"
                );
            }
        }
        out
    }
}
