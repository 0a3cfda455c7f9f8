//! Several sequences in one GPU pass (`Backend::feed_many`): every sequence's rows and sampling
//! candidates are bit-identical to the same tokens fed alone, with decode steps, short chunks
//! and long chunks (which run alone) mixed in one call, through the tiny model's GDN, QSA
//! (past its selection budget), indexer and PLE layers, with f32 and f16 KV caches.
//! Without an adapter the test fails when `CI` is set and is skipped otherwise.

use std::sync::Arc;

mod common;
use common::{fixtures, gpu_context as context, prompt_ids, run};

use strata::engine::{Backend, Fed, FeedItem, Sequence};
use strata::gguf::Gguf;
use strata::gpu::GpuContext;
use strata::gpu::backend::GpuBackend;
use strata::model::config::KvType;
use strata::tiers::TierArgs;

fn load(ctx: &Arc<GpuContext>, kv: KvType) -> Arc<GpuBackend> {
    let path = fixtures().join("tiny-IQ3_S.gguf");
    let gguf = Arc::new(Gguf::open(&path).expect("fixture GGUF opens"));
    let tiers = TierArgs {
        kv,
        ..TierArgs::default()
    };
    Arc::new(GpuBackend::load_with(ctx.clone(), gguf, 1024, &tiers).expect("GPU load"))
}

/// Tokens each sequence feeds per call, cycled (offset per sequence): decode steps, short
/// chunks, and chunks too long to share a pass.
const SIZES: [usize; 10] = [1, 5, 1, 12, 1, 1, 30, 2, 1, 70];

fn check(kv: KvType) {
    let Some(ctx) = context() else { return };
    let backend = load(&ctx, kv);
    let vocab = backend.info().vocab_size;
    let p300 = prompt_ids("p300");
    let mut reversed = p300.clone();
    reversed.reverse();
    let prompts = [p300, prompt_ids("p64eos"), reversed[..150].to_vec()];
    let alone: Vec<Vec<f32>> = prompts.iter().map(|p| run(&backend, p, 16)).collect();
    let mut seqs: Vec<Box<dyn Sequence>> = prompts
        .iter()
        .map(|_| Arc::clone(&backend).new_sequence().expect("sequence"))
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
            match got.unwrap_or_else(|e| panic!("sequence {i} at {last}: {e}")) {
                Fed::Row(row) => {
                    assert_eq!(top, 0);
                    let same = row.len() == want.len()
                        && row
                            .iter()
                            .zip(want)
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "sequence {i}: row {last} differs from its feed alone");
                }
                Fed::Top(list) => {
                    assert_eq!(list, strata::sampler::top_candidates(want, top));
                }
            }
            fed[i] += n;
            checked += 1;
        }
        round += 1;
    }
    let (passes, steps) = backend.batched_passes();
    println!("{kv:?}: {checked} results checked, {passes} batched passes carried {steps} steps");
    // Every round with two or more short chunks shared a pass.
    assert_eq!(
        (passes, steps),
        expected,
        "batched passes and steps of {round} rounds"
    );
    assert!(passes >= 5);
}

#[test]
fn batched_sequences_equal_sequences_fed_alone() {
    check(KvType::F32);
}

#[test]
fn batched_sequences_with_f16_caches_equal_sequences_fed_alone() {
    check(KvType::F16);
}
