//! Several sequences in one GPU pass (`Backend::feed_many`): every sequence's rows and sampling
//! candidates are bit-identical to the same tokens fed alone, with decode steps, short chunks
//! and long chunks (which run alone) mixed in one call, through the tiny model's GDN, QSA
//! (past its selection budget), indexer and PLE layers, with f32, f16 and q8_0 KV caches and with
//! pinned experts (hot copies promoted between passes).
//! Without an adapter the test fails when `CI` is set and is skipped otherwise.

use std::sync::Arc;

mod common;
use common::{fixtures, gpu_context as context, prompt_ids, run};

use strata::engine::{Backend, Fed, FeedItem, Sequence};
use strata::gguf::Gguf;
use strata::gpu::GpuContext;
use strata::gpu::backend::{BUDGET_MAX_CHUNK, GpuBackend};
use strata::gpu::tiered::plan_for_budget;
use strata::model::config::{Config, KvType};
use strata::tiers::{ExpertsArg, TierArgs};

const CONTEXT: usize = 1024;

fn gguf() -> Arc<Gguf> {
    let path = fixtures().join("tiny-IQ3_S.gguf");
    Arc::new(Gguf::open(&path).expect("fixture GGUF opens"))
}

fn load(ctx: &Arc<GpuContext>, tiers: &TierArgs) -> Arc<GpuBackend> {
    Arc::new(GpuBackend::load_with(ctx.clone(), gguf(), CONTEXT, tiers).expect("GPU load"))
}

/// Pinned experts (`--experts pinned`): every expert in host memory (a single decode step's misses
/// copied into the VRAM stage, longer steps' read in place), with hot copies in VRAM for a budget
/// that leaves room for a few more than one token's top-k beside the stage.
fn pinned(ctx: &GpuContext) -> TierArgs {
    let plan = plan_for_budget(
        ctx,
        &gguf(),
        CONTEXT,
        BUDGET_MAX_CHUNK,
        u64::MAX / 4,
        KvType::F32,
    )
    .expect("plan");
    let fixed = plan.vram_total() - plan.expert_slot_bytes();
    let few = (plan.min_expert_slots + 3).min(plan.total_experts - 1);
    // Room for `few` hot copies beside the decode stage (one step's k experts).
    let stage = plan.min_expert_slots;
    TierArgs {
        vram_budget: Some(fixed + (few + stage) * plan.slot_bytes),
        experts: ExpertsArg::Pinned,
        ..TierArgs::default()
    }
}

/// Tokens each sequence feeds per call, cycled (offset per sequence): decode steps, short
/// chunks, and chunks too long to share a pass.
const SIZES: [usize; 10] = [1, 5, 1, 12, 1, 1, 30, 2, 1, 70];

/// Three prompts: p300, p64eos and the first 150 tokens of p300 reversed.
fn prompts() -> [Vec<u32>; 3] {
    let p300 = prompt_ids("p300");
    let mut reversed = p300.clone();
    reversed.reverse();
    [p300, prompt_ids("p64eos"), reversed[..150].to_vec()]
}

fn check(label: &str, backend: &Arc<GpuBackend>) {
    let vocab = backend.info().vocab_size;
    let prompts = prompts();
    let alone: Vec<Vec<f32>> = prompts.iter().map(|p| run(backend, p, 16)).collect();
    let (passes_before, steps_before) = backend.batched_passes();
    let mut seqs: Vec<Box<dyn Sequence>> = prompts
        .iter()
        .map(|_| Arc::clone(backend).new_sequence().expect("sequence"))
        .collect();
    let mut fed = [0usize; 3];
    let mut round = 0;
    let mut checked = 0;
    let mut expected = (0, 0);
    while fed.iter().zip(&prompts).any(|(f, p)| *f < p.len()) {
        let mut items = Vec::new();
        let mut which = Vec::new();
        for (i, seq) in seqs.iter_mut().enumerate() {
            let left = prompts[i].len() - fed[i];
            if left == 0 {
                continue;
            }
            let n = SIZES[(round + 3 * i) % SIZES.len()].min(left);
            let top = if (round + i) % 3 == 0 { 20 } else { 0 };
            items.push(FeedItem {
                sequence: seq.as_mut(),
                tokens: &prompts[i][fed[i]..fed[i] + n],
                top,
            });
            which.push((i, n, top));
        }
        // The backend's rule: items join in order while the pass has room for their tokens.
        let mut cols = 0;
        let joining = which
            .iter()
            .filter(|(_, n, _)| {
                let joins = cols + n <= strata::gpu::backend::BATCH_TOKENS;
                cols += if joins { *n } else { 0 };
                joins
            })
            .count();
        if joining >= 2 {
            expected.0 += 1;
            expected.1 += joining;
        }
        let results = backend.feed_many(&mut items);
        drop(items);
        assert_eq!(results.len(), which.len());
        for ((i, n, top), got) in which.into_iter().zip(results) {
            let last = fed[i] + n - 1;
            let want = &alone[i][last * vocab..(last + 1) * vocab];
            match got.unwrap_or_else(|e| panic!("{label}: sequence {i} at {last}: {e}")) {
                Fed::Row(row) => {
                    assert_eq!(top, 0);
                    let same = row.len() == want.len()
                        && row
                            .iter()
                            .zip(want)
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "{label}: sequence {i}: row {last} differs from its feed alone"
                    );
                }
                Fed::Top(list) => {
                    assert_eq!(list, strata::sampler::top_candidates(want, top), "{label}");
                }
            }
            fed[i] += n;
            checked += 1;
        }
        round += 1;
    }
    let (passes, steps) = backend.batched_passes();
    let (passes, steps) = (passes - passes_before, steps - steps_before);
    println!("{label}: {checked} results checked, {passes} batched passes carried {steps} steps");
    // Every round with two or more short chunks shared a pass.
    assert_eq!(
        (passes, steps),
        expected,
        "{label}: batched passes and steps of {round} rounds"
    );
    assert!(passes >= 5);
}

fn with_kv(kv: KvType) -> TierArgs {
    TierArgs {
        kv,
        ..TierArgs::default()
    }
}

#[test]
fn batched_sequences_equal_sequences_fed_alone() {
    let Some(ctx) = context() else { return };
    check("f32 KV", &load(&ctx, &with_kv(KvType::F32)));
}

#[test]
fn batched_sequences_with_f16_caches_equal_sequences_fed_alone() {
    let Some(ctx) = context() else { return };
    check("f16 KV", &load(&ctx, &with_kv(KvType::F16)));
}

/// A q8_0 cache packs whole blocks from a member's columns of the batch's stage buffers.
#[test]
fn batched_sequences_with_q8_0_caches_equal_sequences_fed_alone() {
    let Some(ctx) = context() else { return };
    check("q8_0 KV", &load(&ctx, &with_kv(KvType::Q8_0)));
}

/// Pinned experts (the 12 GB plan) batch too: the pass's routing goes to the hot copies or the
/// host tensors through the expert map, and promotions between passes (every 2 tokens here)
/// move busy experts into the hot copies; the bits stay those of each sequence fed alone.
#[test]
fn batched_sequences_with_pinned_experts_equal_sequences_fed_alone() {
    let Some(ctx) = context() else { return };
    if !ctx.has_host_storage() {
        println!("SKIPPED: the adapter cannot read host memory");
        return;
    }
    let backend = load(&ctx, &pinned(&ctx));
    assert!(backend.pinned_expert_bytes() > 0, "experts pinned");
    let hot = backend.hot_expert_count();
    assert!(hot > 0, "hot copies");
    backend.set_promote_every(2);
    check("pinned experts", &backend);
    let stats = backend.tier_stats().expect("pinned tier statistics");
    println!(
        "pinned experts: {hot} hot, {} promotions, {} bytes",
        stats.promotions, stats.bytes_uploaded
    );
    assert!(stats.promotions > 0, "promotions ran between passes");
    // Every token's routing reached the host once, whether fed alone or in a pass: each prompt
    // ran alone once and through the batched rounds once.
    let k = Config::from_gguf(&gguf())
        .expect("config")
        .moe
        .n_expert_used as u64;
    let tokens = prompts().iter().map(Vec::len).sum::<usize>() as u64;
    for (layer, (hits, misses)) in stats.per_layer.iter().enumerate() {
        assert_eq!(
            hits + misses,
            2 * tokens * k,
            "layer {layer}: routed items logged"
        );
    }
}
