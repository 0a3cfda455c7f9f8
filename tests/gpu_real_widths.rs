//! The GPU forward pass at the real widths (`common::real_widths`) with routed experts in the split
//! layouts that the published files' experts use: IQ3_XXS, IQ2_S, IQ2_XS, IQ4_XS or IQ1_M gate and
//! up matrices (and Q4_K, whose weights have mins), Q2_0 down matrices (the fixtures hold none of these). Every expert path runs: decode's
//! fused gate|up and down + combine kernels (chunks of 1), per-item experts (chunks of 7) and
//! grouped prefill (the whole prompt). Each must equal the whole prompt's logits bit for bit, and
//! the CPU reference within 1e-4 of the largest |logit| (f32 sums in other orders). With a VRAM
//! budget of exactly top-k expert slots (experts uploaded into slots in the split layout as they are
//! routed), the whole prompt and chunks of 1 give the same bits again.

use std::sync::Arc;

mod common;
use common::real_widths::build_model;
use common::same_bits;

use strata::gguf::{GgmlType, Gguf};
use strata::gpu::GpuContext;
use strata::gpu::backend::{BUDGET_MAX_CHUNK, GpuBackend};
use strata::gpu::tiered::plan_for_budget;
use strata::model::CpuBackend;
use strata::model::config::KvType;
use strata::tiers::{ExpertsArg, TierArgs};

const CONTEXT: usize = 64;

/// Tiers with a VRAM budget for exactly top-k expert slots, fed from the file.
fn minimum_slots(ctx: &GpuContext, gguf: &Gguf) -> TierArgs {
    let plan = plan_for_budget(
        ctx,
        gguf,
        CONTEXT,
        BUDGET_MAX_CHUNK,
        u64::MAX / 4,
        KvType::F32,
    )
    .expect("memory plan");
    let fixed = plan.vram_total() - plan.expert_slot_bytes();
    TierArgs {
        vram_budget: Some(fixed + plan.min_expert_slots * plan.slot_bytes),
        experts: ExpertsArg::Mmap,
        ..TierArgs::default()
    }
}

#[test]
fn split_expert_types_at_real_widths_match_the_cpu_and_every_chunk_size() {
    let Some(ctx) = common::gpu_context() else {
        return;
    };
    // An EOS inside (the PLE n-gram reset); 15 tokens make the QSA layer sparse.
    let tokens: Vec<u32> = vec![17, 230, 5, 99, 509, 42, 42, 311, 7, 480, 12, 64, 200, 3, 77];
    let mut failures = Vec::new();
    for (gate_up, down) in [
        (GgmlType::IQ3_XXS, GgmlType::Q2_0),
        (GgmlType::IQ2_S, GgmlType::Q2_0),
        (GgmlType::IQ2_XS, GgmlType::Q2_0),
        (GgmlType::IQ4_XS, GgmlType::Q2_0),
        (GgmlType::IQ1_M, GgmlType::Q2_0),
        (GgmlType::Q4_K, GgmlType::Q2_0),
    ] {
        let name = format!("{} / {}", gate_up.name(), down.name());
        let gguf = Arc::new(
            Gguf::from_vec("synthetic real widths", build_model((gate_up, down)))
                .expect("synthetic GGUF parses"),
        );
        let cpu = Arc::new(CpuBackend::load(Arc::clone(&gguf), 0).expect("CPU load"));
        let want = common::run(&cpu, &tokens, tokens.len());
        assert!(want.iter().all(|v| v.is_finite()), "{name}: CPU logits");
        let gpu = Arc::new(
            GpuBackend::load_with(
                ctx.clone(),
                Arc::clone(&gguf),
                CONTEXT,
                &TierArgs::default(),
            )
            .expect("GPU load"),
        );
        let whole = common::run(&gpu, &tokens, tokens.len());
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        let diff = common::max_abs_diff(&whole, &want);
        println!("{name}: max |GPU - CPU| {diff:.3e} of max |logit| {scale:.3}");
        if diff.is_nan() || diff > 1e-4 * scale {
            failures.push(format!("{name}: GPU differs from the CPU by {diff:e}"));
        }
        for chunk in [1, 7] {
            let got = common::run(&gpu, &tokens, chunk);
            if !same_bits(&got, &whole) {
                failures.push(format!(
                    "{name}: chunks of {chunk} differ from the whole prompt"
                ));
            }
        }
        let tiers = minimum_slots(&ctx, &gguf);
        let tiered = Arc::new(
            GpuBackend::load_with(ctx.clone(), gguf, CONTEXT, &tiers).expect("tiered GPU load"),
        );
        assert_eq!(tiered.expert_slots(), Some(2), "{name}: top-k slots");
        for chunk in [tokens.len(), 1] {
            let got = common::run(&tiered, &tokens, chunk);
            if !same_bits(&got, &whole) {
                failures.push(format!(
                    "{name}: expert slots (chunks of {chunk}) differ from every expert resident"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
