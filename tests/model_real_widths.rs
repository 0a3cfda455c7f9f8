//! The CPU forward pass on a synthetic model with the real Qwen3.8-Flash-Next widths (hidden 2560,
//! 4 streams of low rank 320, attention 24/2 heads × 256 with a 4 × 128 indexer, GDN 16 k / 48 v heads
//! × 128, expert width 640, PLE 16 heads × 160) but few layers, experts and vocabulary. Nothing may
//! assume the tiny fixture's sizes: this checks that config, weight binding and every block work at
//! these widths, that prefill chunking and `fork` leave the logits bit-identical, and that the sparse
//! QSA path runs (a budget of 8 tokens makes it sparse from position 11).

use std::sync::Arc;

mod common;
use common::real_widths::{VOCAB, build_model};
use common::same_bits;

use strata::engine::{Backend, Sequence};
use strata::gguf::{GgmlType, Gguf};
use strata::model::{Config, CpuBackend, LayerKind};

fn feed_in_chunks(seq: &mut dyn Sequence, tokens: &[u32], chunk: usize) -> Vec<f32> {
    tokens
        .chunks(chunk)
        .flat_map(|piece| seq.feed(piece, true).expect("feed"))
        .collect()
}

#[test]
fn real_widths_run_and_are_chunk_invariant() {
    let gguf = Arc::new(
        Gguf::from_vec(
            "synthetic real widths",
            build_model((GgmlType::Q8_0, GgmlType::Q8_0)),
        )
        .expect("synthetic GGUF parses"),
    );
    let cfg = Config::from_gguf(&gguf).expect("config");
    assert_eq!((cfg.n_embd, cfg.hc_count, cfg.hc_low_rank), (2560, 4, 320));
    assert_eq!(
        (
            cfg.attention.head_dim,
            cfg.attention.rotary_dims,
            cfg.attention.indexer_head_dim
        ),
        (256, 64, 128)
    );
    assert_eq!(
        (cfg.gdn.n_k_heads, cfg.gdn.n_v_heads, cfg.gdn.head_v_dim),
        (16, 48, 128)
    );
    assert_eq!(cfg.moe.expert_ff, 640);
    let ple = cfg.ple.as_ref().expect("PLE layer");
    assert_eq!(
        (ple.layer, ple.n_heads(), ple.head_dim, ple.embed_dim()),
        (1, 16, 160, 2560)
    );
    assert_eq!(
        cfg.layers,
        vec![
            LayerKind::Gdn,
            LayerKind::Gdn,
            LayerKind::Qsa {
                compress_ratio: Some(4)
            }
        ]
    );

    let backend = Arc::new(CpuBackend::load(gguf, 0).expect("synthetic model loads"));
    // An EOS inside exercises the n-gram reset; 15 tokens make QSA sparse (budget 2 blocks).
    let tokens: Vec<u32> = vec![17, 230, 5, 99, 509, 42, 42, 311, 7, 480, 12, 64, 200, 3, 77];
    let whole = feed_in_chunks(
        Arc::clone(&backend).new_sequence().expect("seq").as_mut(),
        &tokens,
        tokens.len(),
    );
    assert_eq!(whole.len(), tokens.len() * VOCAB as usize);
    assert!(whole.iter().all(|v| v.is_finite()), "non-finite logits");
    let rows: Vec<&[f32]> = whole.chunks(VOCAB as usize).collect();
    assert!(
        rows.windows(2).all(|w| w[0] != w[1]),
        "every position has its own logits"
    );

    // Token by token, on one thread: neither the split nor the thread count may change a bit.
    let single_thread = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("pool");
    let one_by_one = single_thread.install(|| {
        feed_in_chunks(
            Arc::clone(&backend).new_sequence().expect("seq").as_mut(),
            &tokens,
            1,
        )
    });
    assert!(
        same_bits(&whole, &one_by_one),
        "token-by-token on one thread differs from one whole feed"
    );

    // Fork in the middle (on three threads): both branches continue exactly like the unforked run.
    let three_threads = rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build()
        .expect("pool");
    three_threads.install(|| {
        let mut first = Arc::clone(&backend).new_sequence().expect("seq");
        let mut head = first.feed(&tokens[..6], true).expect("feed");
        let mut second = first.fork().expect("CPU sequences fork");
        let rest_a = first.feed(&tokens[6..], true).expect("feed");
        let rest_b = second.feed(&tokens[6..], true).expect("feed");
        assert!(same_bits(&rest_a, &rest_b), "a fork diverged");
        head.extend(rest_a);
        assert!(
            same_bits(&head, &whole),
            "fork + continue differs from one feed"
        );
    });
}
