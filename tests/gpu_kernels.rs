//! Every GPU kernel against its CPU twin on the available Vulkan adapter (lavapipe in CI).
//!
//! Harness: the adapter is printed; without one the test fails when `CI` is set and is skipped
//! with a message otherwise. Tolerances are stated per kernel next to each check.

mod common;

use common::gpu::{download, upload};
use common::{bits, fixtures_root, gpu_context as context, random_vec};
use std::path::PathBuf;

use strata::gguf::types::GgmlType;
use strata::gpu::GpuContext;
use strata::gpu::buffers::{GpuBuf, GpuWeight};
use strata::gpu::kernels::{self, Recorder, View};
use strata::model::config::KvType;

fn read_f32_file(path: &PathBuf) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    bytemuck::pod_collect_to_vec(&bytes)
}

/// (ggml name in the fixture files, type)
const QUANT_TYPES: &[(&str, GgmlType)] = &[
    ("f16", GgmlType::F16),
    ("bf16", GgmlType::BF16),
    ("q4_0", GgmlType::Q4_0),
    ("q4_1", GgmlType::Q4_1),
    ("q5_0", GgmlType::Q5_0),
    ("q5_1", GgmlType::Q5_1),
    ("q8_0", GgmlType::Q8_0),
    ("q2_K", GgmlType::Q2_K),
    ("q3_K", GgmlType::Q3_K),
    ("q4_K", GgmlType::Q4_K),
    ("q5_K", GgmlType::Q5_K),
    ("q6_K", GgmlType::Q6_K),
    ("iq4_nl", GgmlType::IQ4_NL),
    ("iq4_xs", GgmlType::IQ4_XS),
    ("iq2_xxs", GgmlType::IQ2_XXS),
    ("iq2_xs", GgmlType::IQ2_XS),
    ("iq2_s", GgmlType::IQ2_S),
    ("iq3_xxs", GgmlType::IQ3_XXS),
    ("iq3_s", GgmlType::IQ3_S),
    ("iq1_s", GgmlType::IQ1_S),
    ("iq1_m", GgmlType::IQ1_M),
];

/// The fixture blocks of `ty` and ggml's dequantization of them: both sets concatenated
/// (random bytes with finite scales, then quantized N(0,1) data).
fn fixture_blocks(name: &str) -> (Vec<u8>, Vec<f32>) {
    let mut bytes = Vec::new();
    let mut values = Vec::new();
    for set in ["random", "quantized"] {
        let b = std::fs::read(fixtures_root().join(format!("quant-vectors/{name}.{set}.bin")))
            .expect("fixture");
        let v = read_f32_file(&fixtures_root().join(format!("quant-vectors/{name}.{set}.f32")));
        // Keep whole 32-value groups only (the GPU reads rows in multiples of 32 values).
        if v.len().is_multiple_of(32) {
            bytes.extend_from_slice(&b);
            values.extend_from_slice(&v);
        }
    }
    (bytes, values)
}

/// Dequantization on the GPU (the `get_rows` kernel over every row) must reproduce ggml's
/// `to_float` of the fixture blocks. Tolerance: 1e-6 of the largest magnitude (the GPU may fuse
/// a scale multiply and an offset into one fma, which changes the last bit).
#[test]
fn dequant_matches_ggml_vectors() {
    let Some(ctx) = context() else { return };
    let mut failures = Vec::new();
    let mut tested = 0;
    for &(name, ty) in QUANT_TYPES {
        if !strata::gpu::shaders::supports(ty) {
            println!("{name}: no GPU kernel yet");
            continue;
        }
        let (bytes, expected) = fixture_blocks(name);
        let row_len = if ty.block_size() == 1 {
            32
        } else {
            ty.block_size()
        };
        let n_rows = expected.len() / row_len;
        let w = GpuWeight::upload(&ctx, name, ty, row_len, n_rows, 1, &bytes).expect("upload");
        let ids: Vec<u32> = (0..n_rows as u32).collect();
        let ids = GpuBuf::from_u32(&ctx, "ids", &ids).expect("ids");
        let out = GpuBuf::zeros(&ctx, "out", expected.len()).expect("out");
        let mut rec = Recorder::new();
        kernels::get_rows(
            &ctx,
            &mut rec,
            &w,
            &ids,
            n_rows,
            View::new(&out, 0, row_len),
            1,
            0,
        )
        .expect("get_rows");
        rec.run(&ctx).expect("run");
        let got = out.read_f32(&ctx, 0, expected.len()).expect("read");
        let scale = expected.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-30);
        let worst = got
            .iter()
            .zip(&expected)
            .map(|(g, e)| (g - e).abs() / scale)
            .fold(0f32, f32::max);
        println!(
            "{name}: {} values, max error {worst:.2e} of max |x| {scale:.3}",
            expected.len()
        );
        if worst > 1e-6 || got.iter().any(|v| !v.is_finite()) {
            failures.push(format!("{name}: {worst:.2e}"));
        }
        tested += 1;
    }
    assert!(tested >= 21, "only {tested} types tested");
    assert!(failures.is_empty(), "dequant mismatches: {failures:?}");
}

/// A weight matrix of `rows` x `row_len` built by cycling the fixture blocks (shifted per row so
/// rows differ) and its exact f32 values.
fn tiled_matrix(name: &str, ty: GgmlType, rows: usize, row_len: usize) -> (Vec<u8>, Vec<f32>) {
    let (bytes, values) = fixture_blocks(name);
    let block_values = ty.block_size().max(32);
    let block_bytes = if ty.block_size() == 1 {
        32 * ty.type_size()
    } else {
        ty.type_size()
    };
    let n_blocks = values.len() / block_values;
    let per_row = row_len / block_values;
    let mut out_bytes = Vec::new();
    let mut out_values = Vec::new();
    for r in 0..rows {
        for b in 0..per_row {
            let src = (r * 7 + b * 3) % n_blocks;
            out_bytes.extend_from_slice(&bytes[src * block_bytes..(src + 1) * block_bytes]);
            out_values.extend_from_slice(&values[src * block_values..(src + 1) * block_values]);
        }
    }
    (out_bytes, out_values)
}

/// Mat-vec for every supported type against an f64 CPU dot of the exact dequantized values.
/// Tolerance: 1e-5 of sum |w x| per row (f32 accumulation in a different order).
/// Also checks batch invariance: 21 vectors in one call (a wide tile of 16, a tile of 4 and one)
/// give the same bits as 21 single dispatches, and splitting the tensor into several parts
/// changes no bit.
#[test]
fn matvec_matches_cpu_and_is_batch_invariant() {
    let Some(ctx) = context() else { return };
    let (rows, row_len, items) = (37, 512, 21);
    let mut failures = Vec::new();
    for &(name, ty) in QUANT_TYPES {
        if !strata::gpu::shaders::supports(ty) {
            continue;
        }
        let (bytes, values) = tiled_matrix(name, ty, rows, row_len);
        let x = random_vec(items * row_len, 7);
        let w = GpuWeight::upload(&ctx, name, ty, row_len, rows, 1, &bytes).expect("upload");
        let row_bytes = bytes.len() / rows;
        let w_split = GpuWeight::upload_with_limit(
            &ctx,
            name,
            ty,
            row_len,
            rows,
            1,
            &bytes,
            Some(row_bytes * 10),
        )
        .expect("upload split");
        // 37 rows at (at most) 10 rows per part: 4 parts, or 5 for the split layouts, whose
        // 16-byte plane padding leaves room for 9 rows (src/gpu/layout.rs).
        assert!(
            (4..=5).contains(&w_split.parts.len()),
            "{name}: {} parts",
            w_split.parts.len()
        );
        let xb = GpuBuf::from_f32(&ctx, "x", &x).expect("x");
        let batched = GpuBuf::zeros(&ctx, "y", items * rows).expect("y");
        let single = GpuBuf::zeros(&ctx, "y1", items * rows).expect("y1");
        let split = GpuBuf::zeros(&ctx, "y2", items * rows).expect("y2");
        let mut rec = Recorder::new();
        kernels::matvec(
            &ctx,
            &mut rec,
            &w,
            View::new(&xb, 0, row_len),
            View::new(&batched, 0, rows),
            items,
        )
        .expect("matvec");
        for i in 0..items {
            kernels::matvec(
                &ctx,
                &mut rec,
                &w,
                View::new(&xb, i * row_len, row_len),
                View::new(&single, i * rows, rows),
                1,
            )
            .expect("matvec single");
        }
        kernels::matvec(
            &ctx,
            &mut rec,
            &w_split,
            View::new(&xb, 0, row_len),
            View::new(&split, 0, rows),
            items,
        )
        .expect("matvec split");
        rec.run(&ctx).expect("run");
        let got = batched.read_f32(&ctx, 0, items * rows).expect("read");
        let got_single = single.read_f32(&ctx, 0, items * rows).expect("read");
        let got_split = split.read_f32(&ctx, 0, items * rows).expect("read");
        let mut worst = 0f64;
        for i in 0..items {
            for r in 0..rows {
                let wr = &values[r * row_len..(r + 1) * row_len];
                let xr = &x[i * row_len..(i + 1) * row_len];
                let exact: f64 = wr.iter().zip(xr).map(|(a, b)| *a as f64 * *b as f64).sum();
                let magnitude: f64 = wr
                    .iter()
                    .zip(xr)
                    .map(|(a, b)| (*a as f64 * *b as f64).abs())
                    .sum();
                let err = (got[i * rows + r] as f64 - exact).abs() / magnitude.max(1e-30);
                worst = worst.max(err);
            }
        }
        let bit_equal = got
            .iter()
            .zip(&got_single)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        let split_equal = got
            .iter()
            .zip(&got_split)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        println!(
            "{name}: max rel error {worst:.2e}, batch-invariant {bit_equal}, split-invariant {split_equal}"
        );
        if worst > 1e-5 || !bit_equal || !split_equal {
            failures.push(format!(
                "{name}: err {worst:.2e} batch {bit_equal} split {split_equal}"
            ));
        }
    }
    assert!(failures.is_empty(), "matvec failures: {failures:?}");
}

/// Every op shader compiles on this adapter (naga + driver), entry point by entry point.
#[test]
fn all_op_shaders_build() {
    let Some(ctx) = context() else { return };
    let entries: &[(&str, &[&'static str])] = &[
        (
            "norm",
            &[
                "rmsnorm",
                "rmsnorm_inplace",
                "rmsnorm_gated",
                "rmsnorm_rope",
            ],
        ),
        (
            "elementwise",
            &["silu_scale", "swiglu", "copy_rows", "block_mean"],
        ),
        ("hc", &["hc_mix_out", "hc_combine"]),
        (
            "gdn",
            &["gdn_conv", "gdn_recurrence", "gdn_recurrence_norm"],
        ),
        ("ple", &["ple_gate", "ple_conv"]),
        (
            "qsa",
            &[
                "rope",
                "qsa_score",
                "qsa_select",
                "qsa_attend",
                "qsa_attend_group",
                "qsa_merge",
                "kv_pack",
                "kv_pack_q8",
                "kv_store",
            ],
        ),
        (
            "moe",
            &[
                "moe_router",
                "moe_router_wide",
                "moe_combine",
                "moe_combine_hc",
            ],
        ),
        ("topk", &["topk_slices", "topk_merge"]),
    ];
    let mut failures = Vec::new();
    for (shader, names) in entries {
        for entry in names.iter() {
            if let Err(e) = ctx
                .pipelines
                .get(&strata::gpu::pipelines::PipelineKey::new(*shader, entry))
            {
                failures.push(format!("{shader}:{entry}: {e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ---- op kernels against the CPU reference ops of `strata::model::ops` -------------------------

use strata::gpu::ops::{self as gops, GdnShape, Groups, NormMode, NormSpec, QsaParams};
use strata::model::ops as cpu;

/// |a - b| <= tol * max(1, |b|) elementwise; returns the worst ratio.
fn close(got: &[f32], want: &[f32], tol: f32, what: &str) -> f32 {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst = 0f32;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(g.is_finite(), "{what}: non-finite at {i}");
        worst = worst.max((g - w).abs() / w.abs().max(1.0));
    }
    println!("{what}: max relative error {worst:.2e} (tolerance {tol:.0e})");
    assert!(worst <= tol, "{what}: {worst:.2e} > {tol:.0e}");
    worst
}

/// The three norm entries against `model::ops` (f32 paths: 1e-5 relative).
#[test]
fn norms_match_cpu() {
    let Some(ctx) = context() else { return };
    let (h, hc, tokens) = (96, 4, 3);
    let wide = h * hc;
    let x = random_vec(tokens * wide, 11);
    let w = random_vec(wide, 12)
        .iter()
        .map(|v| 1.0 + 0.2 * v)
        .collect::<Vec<_>>();
    let (xb, wb) = (upload(&ctx, &x), upload(&ctx, &w));
    let out = GpuBuf::zeros(&ctx, "out", tokens * wide).expect("out");
    let mut rec = Recorder::new();
    let spec = NormSpec {
        mode: NormMode::Rms,
        eps: 1e-6,
        scale: 1.0,
        weight: Some((&wb, wide)),
    };
    let groups = Groups::packed(h, hc);
    gops::rmsnorm(&ctx, &mut rec, &spec, &xb, groups, &out, groups, tokens).expect("rmsnorm");
    rec.run(&ctx).expect("run");
    let mut want = vec![0f32; tokens * wide];
    for t in 0..tokens {
        cpu::rmsnorm_grouped(
            &x[t * wide..(t + 1) * wide],
            &w,
            h,
            1e-6,
            &mut want[t * wide..(t + 1) * wide],
        );
    }
    close(
        &download(&ctx, &out, tokens * wide),
        &want,
        1e-5,
        "grouped rmsnorm",
    );
    // Groups longer than the kernel keeps in registers (12 per invocation): its loop form.
    let (lh, lg) = (3100, 2);
    let lx = random_vec(lh * lg, 15);
    let lw = random_vec(lh * lg, 16)
        .iter()
        .map(|v| 1.0 + 0.2 * v)
        .collect::<Vec<_>>();
    let (lxb, lwb) = (upload(&ctx, &lx), upload(&ctx, &lw));
    let lout = GpuBuf::zeros(&ctx, "long out", lh * lg).expect("out");
    let lspec = NormSpec {
        weight: Some((&lwb, lh * lg)),
        ..spec
    };
    let lgroups = Groups::packed(lh, lg);
    let mut rec = Recorder::new();
    gops::rmsnorm(&ctx, &mut rec, &lspec, &lxb, lgroups, &lout, lgroups, 1).expect("long");
    rec.run(&ctx).expect("run");
    let mut lwant = vec![0f32; lh * lg];
    cpu::rmsnorm_grouped(&lx, &lw, lh, 1e-6, &mut lwant);
    close(
        &download(&ctx, &lout, lh * lg),
        &lwant,
        1e-5,
        "long grouped rmsnorm",
    );

    // Per-head norm of the query half of [query | gate] rows, in place, weight shared by heads.
    let (hd, heads) = (64, 3);
    let qg = random_vec(tokens * heads * 2 * hd, 13);
    let qw = random_vec(hd, 14)
        .iter()
        .map(|v| 1.0 + 0.2 * v)
        .collect::<Vec<_>>();
    let (qb, qwb) = (upload(&ctx, &qg), upload(&ctx, &qw));
    let dummy = GpuBuf::zeros(&ctx, "dummy", 4).expect("dummy");
    let mut rec = Recorder::new();
    let q_heads = Groups {
        n: hd,
        groups: heads,
        off: 0,
        group_stride: 2 * hd,
        token_stride: heads * 2 * hd,
    };
    let spec = NormSpec {
        mode: NormMode::Rms,
        eps: 1e-6,
        scale: 1.0,
        weight: Some((&qwb, hd)),
    };
    gops::rmsnorm_inplace(&ctx, &mut rec, &spec, &qb, q_heads, tokens, &dummy).expect("inplace");
    rec.run(&ctx).expect("run");
    let mut want = qg.clone();
    for row in want.chunks_mut(2 * hd) {
        let mut normed = vec![0f32; hd];
        cpu::rmsnorm(&row[..hd], &qw, 1e-6, &mut normed);
        row[..hd].copy_from_slice(&normed);
    }
    close(
        &download(&ctx, &qb, qg.len()),
        &want,
        1e-5,
        "per-head rmsnorm (gate halves untouched)",
    );

    // L2 norm with a post scale (GDN q).
    let lb = upload(&ctx, &x);
    let mut rec = Recorder::new();
    let spec = NormSpec {
        mode: NormMode::L2,
        eps: 1e-6,
        scale: 0.125,
        weight: None,
    };
    gops::rmsnorm_inplace(
        &ctx,
        &mut rec,
        &spec,
        &lb,
        Groups::packed(h, hc),
        tokens,
        &dummy,
    )
    .expect("l2");
    rec.run(&ctx).expect("run");
    let mut want = x.clone();
    for v in want.chunks_mut(h) {
        cpu::l2norm(v, 1e-6);
        v.iter_mut().for_each(|e| *e *= 0.125);
    }
    close(&download(&ctx, &lb, x.len()), &want, 1e-5, "l2 norm");

    // Gated norm (GDN output).
    let z = random_vec(tokens * wide, 15);
    let gw = random_vec(h, 16);
    let (zb, gwb) = (upload(&ctx, &z), upload(&ctx, &gw));
    let mut rec = Recorder::new();
    let spec = NormSpec {
        mode: NormMode::Rms,
        eps: 1e-6,
        scale: 1.0,
        weight: Some((&gwb, h)),
    };
    gops::rmsnorm_gated(
        &ctx, &mut rec, &spec, &xb, &zb, groups, &out, groups, tokens,
    )
    .expect("gated");
    rec.run(&ctx).expect("run");
    let mut want = vec![0f32; x.len()];
    for ((xs, zs), os) in x.chunks(h).zip(z.chunks(h)).zip(want.chunks_mut(h)) {
        cpu::rmsnorm_gated(xs, &gw, zs, 1e-6, os);
    }
    close(&download(&ctx, &out, x.len()), &want, 1e-5, "gated rmsnorm");
}

/// RoPE against `model::ops::rope_apply` with the host table (1e-6 relative: same f32 maths).
#[test]
fn rope_matches_cpu() {
    let Some(ctx) = context() else { return };
    let (heads, hd, rotary, tokens, pos0) = (3, 32, 16, 5, 1000);
    let half = rotary / 2;
    let inv = cpu::rope_inv_freqs(1e7, rotary);
    let positions = pos0 + tokens;
    let mut table = vec![0f32; positions * half * 2];
    let (mut c, mut s) = (vec![0f32; half], vec![0f32; half]);
    for p in 0..positions {
        cpu::rope_cos_sin(p, &inv, &mut c, &mut s);
        for i in 0..half {
            table[(p * half + i) * 2] = c[i];
            table[(p * half + i) * 2 + 1] = s[i];
        }
    }
    let x = random_vec(tokens * heads * hd, 21);
    let (xb, tb) = (upload(&ctx, &x), upload(&ctx, &table));
    let mut rec = Recorder::new();
    gops::rope(
        &ctx,
        &mut rec,
        &xb,
        &tb,
        tokens,
        heads,
        hd,
        heads * hd,
        0,
        half,
        pos0,
        1,
    )
    .expect("rope");
    rec.run(&ctx).expect("run");
    let mut want = x.clone();
    for t in 0..tokens {
        cpu::rope_cos_sin(pos0 + t, &inv, &mut c, &mut s);
        for head in want[t * heads * hd..(t + 1) * heads * hd].chunks_mut(hd) {
            cpu::rope_apply(head, &c, &s);
        }
    }
    close(&download(&ctx, &xb, x.len()), &want, 1e-6, "rope");
}

/// The fused per-head norm and rotation (`rmsnorm_rope`) against `rmsnorm_inplace` then `rope`
/// (its definition; decode and prefill both take the fused form, so no result mixes the two), on
/// heads that are not a multiple of the workgroup, with a partial rotation, interleaved gate halves
/// and a position step (block keys): within 1e-6 relative, not bit for bit, since a shader compiler
/// may fuse `a * c - b * s` differently in the two kernels (lavapipe on an AMD EPYC host does).
/// Against the CPU too (1e-5 relative).
#[test]
fn rmsnorm_rope_matches_the_separate_kernels() {
    let Some(ctx) = context() else { return };
    for (heads, hd, rotary, tokens, pos0, step, stride) in [
        (3, 32, 16, 5, 1000, 1, 2),
        (2, 300, 64, 3, 7, 4, 1),
        (5, 36, 36, 2, 0, 1, 1),
    ] {
        let half = rotary / 2;
        let inv = cpu::rope_inv_freqs(1e7, rotary);
        let positions = pos0 + (tokens - 1) * step + 1;
        let mut table = vec![0f32; positions * half * 2];
        let (mut c, mut s) = (vec![0f32; half], vec![0f32; half]);
        for p in 0..positions {
            cpu::rope_cos_sin(p, &inv, &mut c, &mut s);
            for i in 0..half {
                table[(p * half + i) * 2] = c[i];
                table[(p * half + i) * 2 + 1] = s[i];
            }
        }
        let x = random_vec(tokens * heads * stride * hd, 31 + hd as u64);
        let w = random_vec(hd, 32);
        let (tb, wb) = (upload(&ctx, &table), upload(&ctx, &w));
        let dummy = GpuBuf::zeros(&ctx, "dummy", 4).expect("dummy");
        let groups = Groups {
            n: hd,
            groups: heads,
            off: 0,
            group_stride: stride * hd,
            token_stride: heads * stride * hd,
        };
        let spec = NormSpec {
            mode: NormMode::Rms,
            eps: 1e-6,
            scale: 1.0,
            weight: Some((&wb, hd)),
        };
        let separate = upload(&ctx, &x);
        let mut rec = Recorder::new();
        gops::rmsnorm_inplace(&ctx, &mut rec, &spec, &separate, groups, tokens, &dummy)
            .expect("norm");
        gops::rope(
            &ctx,
            &mut rec,
            &separate,
            &tb,
            tokens,
            heads,
            stride * hd,
            heads * stride * hd,
            0,
            half,
            pos0,
            step,
        )
        .expect("rope");
        rec.run(&ctx).expect("run");
        let fused = upload(&ctx, &x);
        let mut rec = Recorder::new();
        gops::rmsnorm_rope(
            &ctx, &mut rec, &spec, &fused, groups, tokens, &dummy, &tb, half, pos0, step,
        )
        .expect("fused");
        rec.run(&ctx).expect("run");
        let a = download(&ctx, &separate, x.len());
        let b = download(&ctx, &fused, x.len());
        close(
            &b,
            &a,
            1e-6,
            &format!("rmsnorm_rope hd {hd} against the separate kernels"),
        );
        let mut want = x.clone();
        for t in 0..tokens {
            cpu::rope_cos_sin(pos0 + t * step, &inv, &mut c, &mut s);
            let row = &mut want[t * heads * stride * hd..(t + 1) * heads * stride * hd];
            for head in row.chunks_mut(stride * hd) {
                let mut normed = vec![0f32; hd];
                cpu::rmsnorm(&head[..hd], &w, 1e-6, &mut normed);
                cpu::rope_apply(&mut normed, &c, &s);
                head[..hd].copy_from_slice(&normed);
            }
        }
        close(&b, &want, 1e-5, "rmsnorm_rope");
    }
}

/// The two-set form (`rmsnorm_rope2`: an attention layer's query and key heads in one dispatch)
/// against `rmsnorm_rope` on each set: heads of 36 and 300 values (one and two passes of the
/// workgroup), 3 and 2 groups in different buffers with their own offsets, strides and weights,
/// positions from 1000. Within 1e-6 relative (a compiler may contract `a * c - b * s` differently
/// in another kernel); the values outside the groups untouched.
#[test]
fn rmsnorm_rope2_matches_one_set_at_a_time() {
    let Some(ctx) = context() else { return };
    for (hd, rotary) in [(36, 16), (300, 64)] {
        let (tokens, pos0, half) = (4, 1000, rotary / 2);
        let inv = cpu::rope_inv_freqs(1e7, rotary);
        let mut table = vec![0f32; (pos0 + tokens) * half * 2];
        let (mut c, mut s) = (vec![0f32; half], vec![0f32; half]);
        for p in 0..pos0 + tokens {
            cpu::rope_cos_sin(p, &inv, &mut c, &mut s);
            for i in 0..half {
                table[(p * half + i) * 2] = c[i];
                table[(p * half + i) * 2 + 1] = s[i];
            }
        }
        let tb = upload(&ctx, &table);
        let dummy = GpuBuf::zeros(&ctx, "dummy", 4).expect("dummy");
        // Set A: 3 heads, each followed by a gate half (stride 2 hd), from offset 5; set B: 2
        // packed heads from offset 3 * hd.
        let ga = Groups {
            n: hd,
            groups: 3,
            off: 5,
            group_stride: 2 * hd,
            token_stride: 6 * hd + 1,
        };
        let gb = Groups {
            n: hd,
            groups: 2,
            off: 3 * hd,
            group_stride: hd,
            token_stride: 2 * hd,
        };
        let xa = random_vec(5 + tokens * (6 * hd + 1), 41);
        let xb = random_vec(3 * hd + tokens * 2 * hd + 7, 42);
        let (wa, wb) = (
            upload(&ctx, &random_vec(hd, 43)),
            upload(&ctx, &random_vec(hd, 44)),
        );
        let spec = |w| NormSpec {
            mode: NormMode::Rms,
            eps: 1e-6,
            scale: 1.0,
            weight: Some((w, hd)),
        };
        let (sa, sb) = (spec(&wa), spec(&wb));
        let (one_a, one_b) = (upload(&ctx, &xa), upload(&ctx, &xb));
        let mut rec = Recorder::new();
        for (sp, y, g) in [(&sa, &one_a, ga), (&sb, &one_b, gb)] {
            gops::rmsnorm_rope(&ctx, &mut rec, sp, y, g, tokens, &dummy, &tb, half, pos0, 1)
                .expect("one set");
        }
        rec.run(&ctx).expect("run");
        let (two_a, two_b) = (upload(&ctx, &xa), upload(&ctx, &xb));
        let mut rec = Recorder::new();
        gops::rmsnorm_rope2(
            &ctx,
            &mut rec,
            gops::RopeGroups {
                spec: &sa,
                y: &two_a,
                groups: ga,
            },
            gops::RopeGroups {
                spec: &sb,
                y: &two_b,
                groups: gb,
            },
            tokens,
            &dummy,
            &tb,
            half,
            pos0,
        )
        .expect("two sets");
        assert_eq!(rec.len(), 1, "one dispatch for both sets");
        rec.run(&ctx).expect("run");
        for (one, two, x, name) in [
            (&one_a, &two_a, &xa, "set A"),
            (&one_b, &two_b, &xb, "set B"),
        ] {
            let (want, got) = (download(&ctx, one, x.len()), download(&ctx, two, x.len()));
            assert!(want != *x, "{name}: the groups were normed");
            close(&got, &want, 1e-6, &format!("rmsnorm_rope2 hd {hd} {name}"));
        }
    }
}

/// The GPU router's (ids, weights) for `tokens` rows of `n_expert` logits choosing `k`.
fn route(
    ctx: &GpuContext,
    logits: &[f32],
    n_expert: usize,
    k: usize,
    tokens: usize,
) -> (Vec<u32>, Vec<f32>) {
    let lb = upload(ctx, logits);
    let ids = GpuBuf::zeros(ctx, "ids", tokens * k).expect("ids");
    let wts = GpuBuf::zeros(ctx, "wts", tokens * k).expect("wts");
    let mut rec = Recorder::new();
    gops::moe_router(ctx, &mut rec, &lb, &ids, &wts, n_expert, k, tokens).expect("router");
    rec.run(ctx).expect("run");
    (
        ids.read_u32(ctx, 0, tokens * k).expect("ids"),
        download(ctx, &wts, tokens * k),
    )
}

/// MoE router: softmax over all experts, top-k with the lowest id winning ties, renormalised —
/// against `model::ops::{softmax, top_k}`; includes rows with exact ties. (1e-6 relative.)
#[test]
fn router_matches_cpu_with_ties() {
    let Some(ctx) = context() else { return };
    let (n_expert, k, tokens) = (16, 4, 3);
    let mut logits = random_vec(tokens * n_expert, 31);
    // Token 1: experts 3, 7, 9 and 12 tie for the top; token 2: all equal.
    for e in [3, 7, 9, 12] {
        logits[n_expert + e] = 2.5;
    }
    for v in &mut logits[2 * n_expert..] {
        *v = 0.25;
    }
    let (got_ids, got_w) = route(&ctx, &logits, n_expert, k, tokens);
    let mut want_w = Vec::new();
    for t in 0..tokens {
        let mut p = logits[t * n_expert..(t + 1) * n_expert].to_vec();
        cpu::softmax(&mut p);
        let chosen = cpu::top_k(&p, k);
        let total: f32 = chosen.iter().map(|&e| p[e]).sum();
        let want_ids: Vec<u32> = chosen.iter().map(|&e| e as u32).collect();
        assert_eq!(
            &got_ids[t * k..(t + 1) * k],
            &want_ids[..],
            "token {t}: expert ids"
        );
        want_w.extend(chosen.iter().map(|&e| p[e] / total));
    }
    assert_eq!(
        &got_ids[k..2 * k],
        &[3, 7, 9, 12],
        "ties go to the lowest ids"
    );
    assert_eq!(&got_ids[2 * k..], &[0, 1, 2, 3], "all-equal row picks 0..k");
    close(&got_w, &want_w, 1e-6, "router weights");
}

/// The router against `model::ops::{softmax, top_k}` with ties spread over invocations and
/// subgroups, and token invariance (5 tokens in one dispatch give the same bits as 5 one-token
/// dispatches). The register router (`moe_router`, up to 1,024 experts) with 200 experts (some
/// subgroups hold fewer than k, some none) and 1,000 (4 per invocation); the wide router past it,
/// with 2,100 and 5,000 (33 to 79 per invocation, more than any real router has).
#[test]
fn router_many_experts_is_exact_and_token_invariant() {
    let Some(ctx) = context() else { return };
    for n_expert in [200, 1000, 2100, 5000] {
        router_case(&ctx, n_expert);
    }
}

fn router_case(ctx: &GpuContext, n_expert: usize) {
    let (k, tokens) = (10, 5);
    let mut logits = random_vec(tokens * n_expert, 37);
    // Token 0: a tie between experts owned by the same invocation (5, 69, 133) and by others
    // (6, 70, 199); token 1: ties below the top too.
    for e in [5, 69, 133, 6, 70, 199] {
        logits[e] = 3.0;
    }
    for e in [100, 4, 150] {
        logits[n_expert + e] = 2.0;
    }
    let run = |split: bool| -> (Vec<u32>, Vec<f32>) {
        let lb = upload(ctx, &logits);
        let ids = GpuBuf::zeros(ctx, "ids", tokens * k).expect("ids");
        let wts = GpuBuf::zeros(ctx, "wts", tokens * k).expect("wts");
        let mut rec = Recorder::new();
        if split {
            for t in 0..tokens {
                let one = upload(ctx, &logits[t * n_expert..(t + 1) * n_expert]);
                let one_ids = GpuBuf::zeros(ctx, "ids1", k).expect("ids1");
                let one_w = GpuBuf::zeros(ctx, "wts1", k).expect("wts1");
                gops::moe_router(ctx, &mut rec, &one, &one_ids, &one_w, n_expert, k, 1)
                    .expect("router");
                rec.run(ctx).expect("run");
                rec = Recorder::new();
                let i = one_ids.read_u32(ctx, 0, k).expect("ids");
                let w = download(ctx, &one_w, k);
                ids.write_u32(ctx, t * k, &i).expect("write ids");
                wts.write_u32(
                    ctx,
                    t * k,
                    &w.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                )
                .expect("write wts");
            }
        } else {
            gops::moe_router(ctx, &mut rec, &lb, &ids, &wts, n_expert, k, tokens).expect("router");
            rec.run(ctx).expect("run");
        }
        (
            ids.read_u32(ctx, 0, tokens * k).expect("ids"),
            download(ctx, &wts, tokens * k),
        )
    };
    let (got_ids, got_w) = run(false);
    let (split_ids, split_w) = run(true);
    let mut want_w = Vec::new();
    for t in 0..tokens {
        let mut p = logits[t * n_expert..(t + 1) * n_expert].to_vec();
        cpu::softmax(&mut p);
        let chosen = cpu::top_k(&p, k);
        let total: f32 = chosen.iter().map(|&e| p[e]).sum();
        let want_ids: Vec<u32> = chosen.iter().map(|&e| e as u32).collect();
        assert_eq!(
            &got_ids[t * k..(t + 1) * k],
            &want_ids[..],
            "token {t}: expert ids"
        );
        want_w.extend(chosen.iter().map(|&e| p[e] / total));
    }
    assert_eq!(
        &got_ids[..6],
        &[5, 6, 69, 70, 133, 199],
        "ties go to the lowest ids"
    );
    close(&got_w, &want_w, 1e-6, "router weights");
    assert_eq!(got_ids, split_ids, "ids depend on the token count");
    assert!(
        got_w
            .iter()
            .zip(&split_w)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "weights depend on the token count"
    );
}

/// A token whose router logits hold a NaN: both routers keep every id in range (the expert
/// kernels index with them) and give it non-finite weights, which the caller's finiteness check
/// reports; the token beside it is routed as the CPU routes it.
#[test]
fn router_nan_logits_keep_ids_in_range_and_weights_non_finite() {
    let Some(ctx) = context() else { return };
    for n_expert in [512, 2100] {
        let (k, tokens) = (10, 2);
        let mut logits = random_vec(tokens * n_expert, 41);
        logits[n_expert + 77] = f32::NAN;
        let (got_ids, got_w) = route(&ctx, &logits, n_expert, k, tokens);
        let mut p = logits[..n_expert].to_vec();
        cpu::softmax(&mut p);
        let want: Vec<u32> = cpu::top_k(&p, k).iter().map(|&e| e as u32).collect();
        assert_eq!(
            &got_ids[..k],
            &want[..],
            "{n_expert} experts: the finite token"
        );
        assert!(
            got_w[..k].iter().all(|w| w.is_finite()),
            "finite token's weights"
        );
        assert!(
            got_ids[k..].iter().all(|&e| (e as usize) < n_expert),
            "{n_expert} experts: ids in range, got {:?}",
            &got_ids[k..]
        );
        assert!(
            got_w[k..].iter().all(|w| !w.is_finite()),
            "{n_expert} experts: NaN token's weights {:?}",
            &got_w[k..]
        );
    }
}

/// GDN conv + recurrence against a CPU twin written from `model::gdn` (same per-token maths),
/// and chunk invariance: the tokens in one dispatch == token by token == uneven chunks that cross
/// the kernel's 8-token staging batches, bit for bit. Shapes: the tiny fixture's heads, the real
/// model's 128 x 128 heads, heads of odd sizes (keys not a multiple of 4, values not of 16), and a
/// 3-tap conv (the kernel's general path; the model's 4 taps have one of their own).
#[test]
fn gdn_matches_cpu_and_is_chunk_invariant() {
    let Some(ctx) = context() else { return };
    for (n_k_heads, n_v_heads, dk, dv, tokens, kernel) in [
        (2, 4, 16, 16, 7, 4),
        (1, 3, 128, 128, 19, 4),
        (3, 6, 23, 20, 19, 4),
        (2, 4, 16, 16, 9, 3),
    ] {
        let shape = GdnShape {
            channels: 0,
            kernel,
            n_k_heads,
            n_v_heads,
            dk,
            dv,
        };
        gdn_case(&ctx, shape, tokens);
    }
}

fn gdn_case(ctx: &GpuContext, shape: GdnShape, tokens: usize) {
    let key_dim = shape.n_k_heads * shape.dk;
    let channels = 2 * key_dim + shape.n_v_heads * shape.dv;
    let shape = GdnShape { channels, ..shape };
    let (nv, dk, dv) = (shape.n_v_heads, shape.dk, shape.dv);
    let mixed = random_vec(tokens * channels, 41);
    let conv_w = random_vec(channels * shape.kernel, 42);
    let taps_hist = shape.kernel - 1;
    let ba = random_vec(tokens * 2 * nv, 43);
    let mut gate_params = random_vec(nv, 44);
    gate_params.extend(random_vec(nv, 45).iter().map(|v| -0.5 - v.abs()));

    // `first`: where each step's tokens sit in the chunk buffers (a batch member's columns).
    let run = |chunks: &[usize], first: usize| -> (Vec<f32>, Vec<f32>) {
        let cw = upload(ctx, &conv_w);
        let hist = GpuBuf::zeros(ctx, "hist", taps_hist * channels).expect("hist");
        let gp = upload(ctx, &gate_params);
        let state = GpuBuf::zeros(ctx, "state", nv * dk * dv).expect("state");
        let out = GpuBuf::zeros(ctx, "out", tokens * nv * dv).expect("out");
        let mut steps = Vec::new();
        let mut t0 = 0;
        for &n in chunks.iter().cycle() {
            if t0 == tokens {
                break;
            }
            let n = n.min(tokens - t0);
            steps.push((t0, n));
            t0 += n;
        }
        for (t0, n) in steps {
            // Each step sees its own tokens from column `first` of the buffers (0: like the
            // backend's scratch), after columns of other values.
            let at = |v: &[f32], width: usize| {
                let mut padded = random_vec(first * width, 46);
                padded.extend_from_slice(&v[t0 * width..(t0 + n) * width]);
                upload(ctx, &padded)
            };
            let m = at(&mixed, channels);
            let b = at(&ba, 2 * nv);
            let c = GpuBuf::zeros(ctx, "c", (first + n) * channels).expect("c");
            let o = GpuBuf::zeros(ctx, "o", (first + n) * nv * dv).expect("o");
            let span = gops::Span::new(first, n);
            let mut rec = Recorder::new();
            gops::gdn_conv(ctx, &mut rec, &shape, &m, &cw, &hist, &c, span).expect("conv");
            // The recurrence L2-normalises q (and scales it by 1/sqrt(dk)) and k itself.
            let inputs = gops::GdnInputs {
                qkv: &c,
                beta_alpha: &b,
                gate_params: &gp,
                state: &state,
            };
            gops::gdn_recurrence(ctx, &mut rec, &shape, inputs, &o, span).expect("rec");
            rec.run(ctx).expect("run");
            let got = download(ctx, &o, (first + n) * nv * dv)[first * nv * dv..].to_vec();
            out.write_f32(ctx, t0 * nv * dv, &got).expect("gather");
        }
        (
            download(ctx, &out, tokens * nv * dv),
            download(ctx, &state, nv * dk * dv),
        )
    };
    let (whole, state_whole) = run(&[tokens], 0);
    for (chunks, first) in [
        (&[1][..], 0),
        (&[3, 9, 1], 0),
        (&[tokens], 5),
        (&[3, 9, 1], 2),
    ] {
        let (split, state_split) = run(chunks, first);
        assert!(
            whole
                .iter()
                .zip(&split)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "dk {dk} dv {dv}: chunks {chunks:?} from column {first} != one dispatch"
        );
        assert!(
            state_whole
                .iter()
                .zip(&state_split)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "dk {dk} dv {dv}: state differs for chunks {chunks:?}"
        );
    }

    // CPU twin.
    let taps = shape.kernel;
    let mut hist = vec![0f32; taps_hist * channels];
    let mut s = vec![0f32; nv * dk * dv];
    let mut want = Vec::new();
    for t in 0..tokens {
        let u = &mixed[t * channels..(t + 1) * channels];
        let mut c = vec![0f32; channels];
        for ch in 0..channels {
            let mut acc = 0f32;
            for k in 0..taps {
                let v = if k == taps_hist {
                    u[ch]
                } else {
                    hist[k * channels + ch]
                };
                acc += conv_w[ch * taps + k] * v;
            }
            c[ch] = cpu::silu(acc);
        }
        hist.copy_within(channels.., 0);
        hist[(taps_hist - 1) * channels..].copy_from_slice(u);
        for q in c[..key_dim].chunks_mut(dk) {
            cpu::l2norm(q, 1e-6);
            q.iter_mut().for_each(|v| *v *= 1.0 / (dk as f32).sqrt());
        }
        for kk in c[key_dim..2 * key_dim].chunks_mut(dk) {
            cpu::l2norm(kk, 1e-6);
        }
        for j in 0..nv {
            let kh = j % shape.n_k_heads;
            let q = &c[kh * dk..(kh + 1) * dk];
            let kv = &c[key_dim + kh * dk..key_dim + (kh + 1) * dk];
            let v = &c[2 * key_dim + j * dv..2 * key_dim + (j + 1) * dv];
            let beta = cpu::sigmoid(ba[t * 2 * nv + j]);
            let decay = (gate_params[nv + j]
                * cpu::softplus(ba[t * 2 * nv + nv + j] + gate_params[j]))
            .exp();
            let st = &mut s[j * dk * dv..(j + 1) * dk * dv];
            st.iter_mut().for_each(|e| *e *= decay);
            for col in 0..dv {
                let pred: f32 = (0..dk).map(|i| st[i * dv + col] * kv[i]).sum();
                let delta = (v[col] - pred) * beta;
                for i in 0..dk {
                    st[i * dv + col] += kv[i] * delta;
                }
            }
            for col in 0..dv {
                want.push((0..dk).map(|i| st[i * dv + col] * q[i]).sum());
            }
        }
    }
    close(&whole, &want, 1e-5, "gdn conv + recurrence");
    close(&state_whole, &s, 1e-5, "gdn state");
}

/// The GDN output's gated norm in the recurrence's dispatch (`gdn_recurrence_norm`, a workgroup
/// per value head) against the recurrence followed by `rmsnorm_gated`: the state must come out
/// with the same bits (the same recurrence arithmetic), the normed outputs within 1e-5 (the
/// norm's sum order differs), and chunks of 1 and of 3, 9, 1 tokens must give the bits of one
/// dispatch. Heads of 16, 20 (no multiple of 8), 128 and 256 values.
#[test]
fn gdn_gated_norm_in_the_recurrence_matches_the_separate_norm() {
    let Some(ctx) = context() else { return };
    for (n_k_heads, n_v_heads, dk, dv, tokens) in [
        (2, 4, 16, 16, 9),
        (3, 6, 23, 20, 11),
        (1, 3, 128, 128, 10),
        (1, 2, 32, 256, 5),
    ] {
        let key_dim = n_k_heads * dk;
        let shape = GdnShape {
            channels: 2 * key_dim + n_v_heads * dv,
            kernel: 4,
            n_k_heads,
            n_v_heads,
            dk,
            dv,
        };
        gdn_norm_case(&ctx, shape, tokens);
    }
}

fn gdn_norm_case(ctx: &GpuContext, shape: GdnShape, tokens: usize) {
    let (nv, dk, dv, ch) = (shape.n_v_heads, shape.dk, shape.dv, shape.channels);
    let what = format!("dk {dk} dv {dv} heads {nv}");
    let qkv = random_vec(tokens * ch, 61);
    let ba = random_vec(tokens * 2 * nv, 62);
    let mut gp = random_vec(nv, 63);
    gp.extend(random_vec(nv, 64).iter().map(|v| -0.5 - v.abs()));
    let z = random_vec(tokens * nv * dv, 65);
    let nw: Vec<f32> = random_vec(dv, 66).iter().map(|v| 1.0 + v).collect();
    let eps = 1e-6f32;
    let (gpb, nwb) = (upload(ctx, &gp), upload(ctx, &nw));

    // Separate kernels over the whole chunk.
    let state_a = GpuBuf::zeros(ctx, "state a", nv * dk * dv).expect("state");
    let raw = GpuBuf::zeros(ctx, "raw", tokens * nv * dv).expect("raw");
    let normed_a = GpuBuf::zeros(ctx, "normed a", tokens * nv * dv).expect("normed");
    let (qb, bab, zb) = (upload(ctx, &qkv), upload(ctx, &ba), upload(ctx, &z));
    let mut rec = Recorder::new();
    let inputs = gops::GdnInputs {
        qkv: &qb,
        beta_alpha: &bab,
        gate_params: &gpb,
        state: &state_a,
    };
    gops::gdn_recurrence(ctx, &mut rec, &shape, inputs, &raw, tokens).expect("recurrence");
    let spec = NormSpec {
        mode: NormMode::Rms,
        eps,
        scale: 1.0,
        weight: Some((&nwb, dv)),
    };
    let heads = Groups::packed(dv, nv);
    gops::rmsnorm_gated(
        ctx, &mut rec, &spec, &raw, &zb, heads, &normed_a, heads, tokens,
    )
    .expect("gated norm");
    rec.run(ctx).expect("separate");
    let want = download(ctx, &normed_a, tokens * nv * dv);
    let want_state = download(ctx, &state_a, nv * dk * dv);

    // `first`: the column of each step's first token in its buffers (a batch member's).
    let fused = |chunks: &[usize], first: usize| -> (Vec<f32>, Vec<f32>) {
        let state = GpuBuf::zeros(ctx, "state", nv * dk * dv).expect("state");
        let mut out = Vec::new();
        let mut t0 = 0;
        for &n in chunks.iter().cycle() {
            if t0 == tokens {
                break;
            }
            let n = n.min(tokens - t0);
            let at = |v: &[f32], width: usize| {
                let mut padded = random_vec(first * width, 67);
                padded.extend_from_slice(&v[t0 * width..(t0 + n) * width]);
                upload(ctx, &padded)
            };
            let q = at(&qkv, ch);
            let b = at(&ba, 2 * nv);
            let zz = at(&z, nv * dv);
            let o = GpuBuf::zeros(ctx, "o", (first + n) * nv * dv).expect("o");
            let norm = gops::GatedNorm {
                z: &zz,
                weight: &nwb,
                eps,
            };
            let mut rec = Recorder::new();
            let inputs = gops::GdnInputs {
                qkv: &q,
                beta_alpha: &b,
                gate_params: &gpb,
                state: &state,
            };
            let span = gops::Span::new(first, n);
            gops::gdn_recurrence_norm(ctx, &mut rec, &shape, inputs, norm, &o, span)
                .expect("fused");
            rec.run(ctx).expect("fused run");
            out.extend_from_slice(&download(ctx, &o, (first + n) * nv * dv)[first * nv * dv..]);
            t0 += n;
        }
        (out, download(ctx, &state, nv * dk * dv))
    };
    let (whole, state) = fused(&[tokens], 0);
    for (i, (a, b)) in state.iter().zip(&want_state).enumerate() {
        assert_eq!(a.to_bits(), b.to_bits(), "{what}: state value {i}");
    }
    close(&whole, &want, 1e-5, &format!("{what}: fused gated norm"));
    for (chunks, first) in [
        (&[1][..], 0),
        (&[3, 9, 1], 0),
        (&[tokens], 3),
        (&[3, 9, 1], 6),
    ] {
        let (split, split_state) = fused(chunks, first);
        assert!(
            whole
                .iter()
                .zip(&split)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{what}: chunks {chunks:?} from column {first} != one dispatch"
        );
        assert!(
            split_state
                .iter()
                .zip(&state)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{what}: state differs for chunks {chunks:?}"
        );
    }
}

/// QSA block selection over many blocks (the radix select): the kept blocks must be exactly those
/// that fewer than `budget` blocks beat (a higher score, or the same score and a lower id), listed
/// ascending, checked on the scores the kernel computed. Many blocks score exactly 0 (both heads'
/// dots negative) and some are copies of others, so the threshold falls among ties. From 75 to
/// 10,000 blocks per token (one selection workgroup walks them 256 at a time).
#[test]
fn qsa_select_keeps_the_top_blocks_of_many() {
    let Some(ctx) = context() else { return };
    let (ratio, idim, nih) = (4usize, 8usize, 2usize);
    // The last: a decode step (one token) over 10,000 blocks, the real budget of 512 blocks.
    for (budget, pos0, tokens) in [
        (300usize, 3990usize, 3usize),
        (700, 3996, 2),
        (17, 300, 2),
        (512, 39_999, 1),
    ] {
        let positions = pos0 + tokens;
        let blocks = positions / ratio;
        let mut block_keys = random_vec(blocks * idim, 61 + budget as u64);
        for b in (0..blocks).step_by(7).skip(1) {
            let src: Vec<f32> = block_keys[..idim].to_vec();
            block_keys[b * idim..(b + 1) * idim].copy_from_slice(&src);
        }
        let iq = random_vec(tokens * nih * idim, 62);
        let max_blocks = blocks + 1;
        let (iqb, bkb) = (upload(&ctx, &iq), upload(&ctx, &block_keys));
        let scratch = GpuBuf::zeros(&ctx, "scores", tokens * 2 * max_blocks).expect("scores");
        let sel = GpuBuf::zeros(&ctx, "sel", tokens * (budget + 1)).expect("sel");
        let params = QsaParams {
            tokens: tokens as u32,
            pos0: pos0 as u32,
            heads: nih as u32,
            ratio: ratio as u32,
            budget: budget as u32,
            idim: idim as u32,
            max_blocks: max_blocks as u32,
            scale: 1.0 / (idim as f32).sqrt(),
            ..Default::default()
        };
        let mut rec = Recorder::new();
        gops::qsa_select(&ctx, &mut rec, &params, &iqb, &bkb, &scratch, &sel).expect("select");
        rec.run(&ctx).expect("run");
        let got = sel.read_u32(&ctx, 0, tokens * (budget + 1)).expect("sel");
        let scores = download(&ctx, &scratch, tokens * 2 * max_blocks);
        for t in 0..tokens {
            let nb = (pos0 + t + 1) / ratio;
            let s = &scores[t * 2 * max_blocks..t * 2 * max_blocks + nb];
            let zeros = s.iter().filter(|v| **v == 0.0).count();
            assert!(
                zeros * 10 >= nb,
                "budget {budget}: {zeros} of {nb} scores 0"
            );
            let want: Vec<u32> = (0..nb)
                .filter(|&b| {
                    let beaten_by = (0..nb)
                        .filter(|&j| s[j] > s[b] || (s[j] == s[b] && j < b))
                        .count();
                    beaten_by < budget
                })
                .map(|b| b as u32)
                .collect();
            let row = &got[t * (budget + 1)..(t + 1) * (budget + 1)];
            let n = row[0] as usize;
            assert_eq!(n, want.len(), "budget {budget} token {t}: count");
            assert_eq!(
                &row[1..1 + n],
                &want[..],
                "budget {budget} token {t}: blocks"
            );
        }
    }
}

/// QSA block selection where every score shares its top bits (all in [1, 2), multiples of 1/512,
/// so most of them tie): one index head of one dim, query 1, so each block's score is its key.
/// The radix select's first rounds see whole subgroups in one bin (counted once per subgroup,
/// which must add the subgroup's lane count). Kept blocks checked against the pairwise rule.
#[test]
fn qsa_select_with_scores_sharing_their_top_bits() {
    let Some(ctx) = context() else { return };
    let ratio = 4usize;
    for (budget, pos0, tokens) in [(512usize, 7_999usize, 1usize), (100, 2_001, 2)] {
        let blocks = (pos0 + tokens) / ratio;
        let keys: Vec<f32> = random_vec(blocks, 71 + budget as u64)
            .iter()
            .map(|u| 1.0 + (u.abs().fract() * 512.0).floor() / 512.0)
            .collect();
        let iq = vec![1.0f32; tokens];
        let max_blocks = blocks + 1;
        let (iqb, bkb) = (upload(&ctx, &iq), upload(&ctx, &keys));
        let scratch = GpuBuf::zeros(&ctx, "scores", tokens * 2 * max_blocks).expect("scores");
        let sel = GpuBuf::zeros(&ctx, "sel", tokens * (budget + 1)).expect("sel");
        let params = QsaParams {
            tokens: tokens as u32,
            pos0: pos0 as u32,
            heads: 1,
            ratio: ratio as u32,
            budget: budget as u32,
            idim: 1,
            max_blocks: max_blocks as u32,
            scale: 1.0,
            ..Default::default()
        };
        let mut rec = Recorder::new();
        gops::qsa_select(&ctx, &mut rec, &params, &iqb, &bkb, &scratch, &sel).expect("select");
        rec.run(&ctx).expect("run");
        let got = sel.read_u32(&ctx, 0, tokens * (budget + 1)).expect("sel");
        for t in 0..tokens {
            let nb = (pos0 + t + 1) / ratio;
            let s = &keys[..nb];
            let mut order: Vec<usize> = (0..nb).collect();
            order.sort_by(|&a, &b| s[b].total_cmp(&s[a]).then(a.cmp(&b)));
            let mut want: Vec<u32> = order[..budget].iter().map(|&b| b as u32).collect();
            want.sort_unstable();
            let row = &got[t * (budget + 1)..(t + 1) * (budget + 1)];
            assert_eq!(row[0] as usize, budget, "budget {budget} token {t}: count");
            assert_eq!(&row[1..], &want[..], "budget {budget} token {t}: blocks");
        }
    }
}

/// QSA block scores at shapes the fixtures lack: index head dims that are odd, not a multiple of
/// 4, or wider than the staged tile (160: keys read from the buffer), and 21 query tokens (two
/// token groups, the last partial). Each score is within 1e-5 of sum_h max(q_h . k_b, 0) * scale in
/// f64, and has the bits of the same token scored alone (a decode step, from its own column).
#[test]
fn qsa_scores_match_f64_and_a_token_scored_alone() {
    let Some(ctx) = context() else { return };
    let (ratio, nih, tokens, pos0) = (4usize, 3usize, 21usize, 250usize);
    for idim in [7usize, 33, 160] {
        let blocks = (pos0 + tokens) / ratio;
        let block_keys = random_vec(blocks * idim, 71 + idim as u64);
        let iq = random_vec(tokens * nih * idim, 72 + idim as u64);
        let max_blocks = blocks + 1;
        let (iqb, bkb) = (upload(&ctx, &iq), upload(&ctx, &block_keys));
        let scale = 1.0 / (idim as f32).sqrt();
        let scores_of = |first: usize, n: usize| {
            let scratch = GpuBuf::zeros(&ctx, "scores", n * 2 * max_blocks).expect("scores");
            let sel = GpuBuf::zeros(&ctx, "sel", n * 3).expect("sel");
            let params = QsaParams {
                tokens: n as u32,
                pos0: (pos0 + first) as u32,
                heads: nih as u32,
                ratio: ratio as u32,
                budget: 2,
                idim: idim as u32,
                max_blocks: max_blocks as u32,
                scale,
                first: first as u32,
                ..Default::default()
            };
            let mut rec = Recorder::new();
            gops::qsa_select(&ctx, &mut rec, &params, &iqb, &bkb, &scratch, &sel).expect("select");
            rec.run(&ctx).expect("run");
            download(&ctx, &scratch, n * 2 * max_blocks)
        };
        let all = scores_of(0, tokens);
        let mut worst = 0f64;
        for t in 0..tokens {
            let alone = scores_of(t, 1);
            let nb = (pos0 + t + 1) / ratio;
            for b in 0..nb {
                let got = all[t * 2 * max_blocks + b];
                assert_eq!(
                    got.to_bits(),
                    alone[b].to_bits(),
                    "idim {idim} token {t} block {b}: {got} in the chunk, {} alone",
                    alone[b]
                );
                let key = &block_keys[b * idim..(b + 1) * idim];
                let mut want = 0f64;
                let mut magnitude = 0f64;
                for h in 0..nih {
                    let q = &iq[(t * nih + h) * idim..(t * nih + h + 1) * idim];
                    let d: f64 = q.iter().zip(key).map(|(a, k)| *a as f64 * *k as f64).sum();
                    want += d.max(0.0);
                    magnitude += q
                        .iter()
                        .zip(key)
                        .map(|(a, k)| (*a as f64 * *k as f64).abs())
                        .sum::<f64>();
                }
                want *= scale as f64;
                let err = (got as f64 - want).abs() / (magnitude * scale as f64).max(1e-30);
                worst = worst.max(err);
            }
        }
        println!("qsa scores, idim {idim}: max relative error {worst:.2e}");
        assert!(worst <= 1e-5, "idim {idim}: {worst:.2e}");
    }
}

/// QSA block selection (top-budget with lowest-id ties, ascending list) and attention over the
/// selection against a CPU twin (1e-5 relative).
#[test]
fn qsa_select_and_attend_match_cpu() {
    let Some(ctx) = context() else { return };
    let (ratio, budget, idim, nih) = (4usize, 3usize, 8usize, 2usize);
    let (heads, n_kv, hd) = (4usize, 2usize, 16usize);
    let (tokens, pos0) = (6usize, 20usize);
    let positions = pos0 + tokens;
    let blocks = positions / ratio;
    let mut block_keys = random_vec(blocks * idim, 51);
    // Blocks 1 and 4 identical: a tie the lowest id must win.
    let b1: Vec<f32> = block_keys[idim..2 * idim].to_vec();
    block_keys[4 * idim..5 * idim].copy_from_slice(&b1);
    let iq = random_vec(tokens * nih * idim, 52);
    let keys = random_vec(positions * n_kv * hd, 53);
    let values = random_vec(positions * n_kv * hd, 54);
    let queries = random_vec(tokens * heads * 2 * hd, 55);
    let max_blocks = blocks + 1;
    let (iqb, bkb) = (upload(&ctx, &iq), upload(&ctx, &block_keys));
    let scratch = GpuBuf::zeros(&ctx, "scores", tokens * 2 * max_blocks).expect("scores");
    let sel = GpuBuf::zeros(&ctx, "sel", tokens * (budget + 1)).expect("sel");
    let (qb, kb, vb) = (
        upload(&ctx, &queries),
        upload(&ctx, &keys),
        upload(&ctx, &values),
    );
    let out = GpuBuf::zeros(&ctx, "out", tokens * heads * hd).expect("out");
    let select = QsaParams {
        tokens: tokens as u32,
        pos0: pos0 as u32,
        heads: nih as u32,
        ratio: ratio as u32,
        budget: budget as u32,
        idim: idim as u32,
        max_blocks: max_blocks as u32,
        scale: 1.0 / (idim as f32).sqrt(),
        ..Default::default()
    };
    let attend = QsaParams {
        tokens: tokens as u32,
        pos0: pos0 as u32,
        heads: heads as u32,
        n_kv: n_kv as u32,
        hd: hd as u32,
        ratio: ratio as u32,
        budget: budget as u32,
        scale: 1.0 / (hd as f32).sqrt(),
        ..Default::default()
    };
    let mut rec = Recorder::new();
    gops::qsa_select(&ctx, &mut rec, &select, &iqb, &bkb, &scratch, &sel).expect("select");
    let parts =
        GpuBuf::zeros(&ctx, "parts", gops::qsa_partials_len(tokens, heads, hd)).expect("parts");
    gops::qsa_attend(
        &ctx,
        &mut rec,
        &attend,
        &qb,
        &kb,
        &vb,
        &sel,
        &parts,
        &out,
        KvType::F32,
    )
    .expect("attend");
    rec.run(&ctx).expect("run");
    let got_sel = sel.read_u32(&ctx, 0, tokens * (budget + 1)).expect("sel");
    let got = download(&ctx, &out, tokens * heads * hd);
    let mut want = Vec::new();
    for t in 0..tokens {
        let pos = pos0 + t;
        let nb = (pos + 1) / ratio;
        let scores: Vec<f32> = (0..nb)
            .map(|b| {
                let mut total = 0f32;
                for h in 0..nih {
                    let q = &iq[(t * nih + h) * idim..(t * nih + h + 1) * idim];
                    total += cpu::dot(q, &block_keys[b * idim..(b + 1) * idim]).max(0.0);
                }
                total / (idim as f32).sqrt()
            })
            .collect();
        let mut chosen = cpu::top_k(&scores, budget);
        chosen.sort_unstable();
        let count = got_sel[t * (budget + 1)] as usize;
        let got_blocks: Vec<usize> = got_sel[t * (budget + 1) + 1..t * (budget + 1) + 1 + count]
            .iter()
            .map(|&b| b as usize)
            .collect();
        assert_eq!(got_blocks, chosen, "token {t}: selected blocks");
        let mut visible: Vec<usize> = chosen
            .iter()
            .flat_map(|&b| b * ratio..(b + 1) * ratio)
            .collect();
        visible.extend(nb * ratio..=pos);
        for h in 0..heads {
            let kvh = h / (heads / n_kv);
            let q = &queries[(t * heads + h) * 2 * hd..(t * heads + h) * 2 * hd + hd];
            let gate = &queries[(t * heads + h) * 2 * hd + hd..(t * heads + h + 1) * 2 * hd];
            let mut w: Vec<f32> = visible
                .iter()
                .map(|&j| {
                    cpu::dot(q, &keys[(j * n_kv + kvh) * hd..(j * n_kv + kvh + 1) * hd])
                        / (hd as f32).sqrt()
                })
                .collect();
            cpu::softmax(&mut w);
            for d in 0..hd {
                let mut acc = 0f32;
                for (wt, &j) in w.iter().zip(&visible) {
                    acc += wt * values[(j * n_kv + kvh) * hd + d];
                }
                want.push(acc * cpu::sigmoid(gate[d]));
            }
        }
    }
    close(&got, &want, 1e-5, "qsa attention over the selection");
}

/// Dense attention over more keys than one chunk (three chunks, the last partial) against a plain
/// softmax (1e-5), at head widths that fill the kernel's 16-dim key tiles (32), end in a partial
/// tile (36) and are not a multiple of 4 (38, 7).
#[test]
fn attention_over_several_chunks_matches_cpu() {
    let Some(ctx) = context() else { return };
    for hd in [32usize, 36, 38, 7] {
        attention_over_several_chunks(&ctx, hd);
    }
}

fn attention_over_several_chunks(ctx: &GpuContext, hd: usize) {
    let (heads, n_kv) = (4usize, 2usize);
    let (tokens, pos0) = (3usize, 600usize);
    let positions = pos0 + tokens;
    let keys = random_vec(positions * n_kv * hd, 71);
    let values = random_vec(positions * n_kv * hd, 72);
    let queries: Vec<f32> = random_vec(tokens * heads * 2 * hd, 73)
        .iter()
        .map(|v| v * 4.0)
        .collect();
    let (qb, kb, vb) = (
        upload(ctx, &queries),
        upload(ctx, &keys),
        upload(ctx, &values),
    );
    let sel = GpuBuf::zeros(ctx, "sel", 1).expect("sel");
    let parts =
        GpuBuf::zeros(ctx, "parts", gops::qsa_partials_len(tokens, heads, hd)).expect("parts");
    let out = GpuBuf::zeros(ctx, "out", tokens * heads * hd).expect("out");
    let attend = QsaParams {
        tokens: tokens as u32,
        pos0: pos0 as u32,
        heads: heads as u32,
        n_kv: n_kv as u32,
        hd: hd as u32,
        ratio: 1,
        dense: 1,
        scale: 1.0 / (hd as f32).sqrt(),
        ..Default::default()
    };
    let mut rec = Recorder::new();
    gops::qsa_attend(
        ctx,
        &mut rec,
        &attend,
        &qb,
        &kb,
        &vb,
        &sel,
        &parts,
        &out,
        KvType::F32,
    )
    .expect("attend");
    rec.run(ctx).expect("run");
    let got = download(ctx, &out, tokens * heads * hd);
    let mut want = Vec::new();
    for t in 0..tokens {
        for h in 0..heads {
            let kvh = h / (heads / n_kv);
            let q = &queries[(t * heads + h) * 2 * hd..(t * heads + h) * 2 * hd + hd];
            let gate = &queries[(t * heads + h) * 2 * hd + hd..(t * heads + h + 1) * 2 * hd];
            let mut w: Vec<f32> = (0..=pos0 + t)
                .map(|j| {
                    cpu::dot(q, &keys[(j * n_kv + kvh) * hd..(j * n_kv + kvh + 1) * hd])
                        / (hd as f32).sqrt()
                })
                .collect();
            cpu::softmax(&mut w);
            for d in 0..hd {
                let mut acc = 0f32;
                for (j, wt) in w.iter().enumerate() {
                    acc += wt * values[(j * n_kv + kvh) * hd + d];
                }
                want.push(acc * cpu::sigmoid(gate[d]));
            }
        }
    }
    close(
        &got,
        &want,
        1e-5,
        &format!("attention over several chunks, head width {hd}"),
    );
}

/// A prefill chunk attends with several query heads of a kv head per workgroup (as many as the
/// device's workgroup memory holds); a decode step with one. Each token of a 9-token chunk must
/// get the bits it gets fed alone, over two chunks of keys, at head widths with a partial key
/// tile and a tail of dims past the last multiple of 4, and at 12 and 3 query heads per kv head.
#[test]
fn grouped_heads_attend_with_the_bits_of_one_head_per_workgroup() {
    let Some(ctx) = context() else { return };
    for (heads, n_kv, hd) in [(24usize, 2usize, 38usize), (6, 2, 36), (12, 1, 16)] {
        grouped_heads_case(&ctx, heads, n_kv, hd);
    }
}

fn grouped_heads_case(ctx: &GpuContext, heads: usize, n_kv: usize, hd: usize) {
    let (tokens, pos0) = (9usize, 300usize);
    let positions = pos0 + tokens;
    let keys = random_vec(positions * n_kv * hd, 81);
    let values = random_vec(positions * n_kv * hd, 82);
    let queries: Vec<f32> = random_vec(tokens * heads * 2 * hd, 83)
        .iter()
        .map(|v| v * 3.0)
        .collect();
    let (kb, vb) = (upload(ctx, &keys), upload(ctx, &values));
    let sel = GpuBuf::zeros(ctx, "sel", 1).expect("sel");
    let params = |t: usize, pos: usize| QsaParams {
        tokens: t as u32,
        pos0: pos as u32,
        heads: heads as u32,
        n_kv: n_kv as u32,
        hd: hd as u32,
        ratio: 1,
        dense: 1,
        scale: 1.0 / (hd as f32).sqrt(),
        ..Default::default()
    };
    let attend = |t: usize, pos: usize, q: &[f32]| {
        let qb = upload(ctx, q);
        let parts =
            GpuBuf::zeros(ctx, "parts", gops::qsa_partials_len(t, heads, hd)).expect("parts");
        let out = GpuBuf::zeros(ctx, "out", t * heads * hd).expect("out");
        let mut rec = Recorder::new();
        gops::qsa_attend(
            ctx,
            &mut rec,
            &params(t, pos),
            &qb,
            &kb,
            &vb,
            &sel,
            &parts,
            &out,
            KvType::F32,
        )
        .expect("attend");
        rec.run(ctx).expect("run");
        download(ctx, &out, t * heads * hd)
    };
    let chunk = attend(tokens, pos0, &queries);
    let row = heads * hd;
    let what = format!("{heads} heads, {n_kv} kv heads, width {hd}");
    assert!(chunk.iter().all(|v| v.is_finite()), "{what}: non-finite");
    for t in 0..tokens {
        let q = &queries[t * heads * 2 * hd..(t + 1) * heads * 2 * hd];
        let alone = attend(1, pos0 + t, q);
        for (i, (a, b)) in chunk[t * row..(t + 1) * row].iter().zip(&alone).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "{what}: token {t}, value {i}");
        }
    }
}

/// `v` (`width` values per token) after `first` columns of other values: a batch member's columns
/// of the batch's buffers.
fn at_column(v: &[f32], width: usize, first: usize, seed: u64) -> Vec<f32> {
    let mut padded = random_vec(first * width, seed);
    padded.extend_from_slice(v);
    padded
}

/// The QSA kernels run from a batch member's columns (`QsaParams::first` 2 and 5: the index
/// queries of the block selection, the queries and output of attention) give the bits they give
/// from column 0, and leave the other columns as they were: dense attention and attention over a
/// selection, a decode step and chunks, one query head per workgroup and grouped heads.
#[test]
fn qsa_kernels_from_a_column_offset_give_the_bits_of_column_0() {
    let Some(ctx) = context() else { return };
    let (ratio, budget, idim, nih) = (4usize, 3usize, 8usize, 2usize);
    let pos0 = 20usize;
    for (heads, n_kv, hd) in [(8usize, 2usize, 16usize), (4, 4, 18)] {
        for tokens in [1usize, 6, 9] {
            for dense in [false, true] {
                let what = format!("{heads} heads of {hd}, {tokens} tokens, dense {dense}");
                let positions = pos0 + tokens;
                let blocks = positions / ratio;
                let max_blocks = blocks + 1;
                let block_keys = random_vec(blocks * idim, 91);
                let iq = random_vec(tokens * nih * idim, 92);
                let keys = random_vec(positions * n_kv * hd, 93);
                let values = random_vec(positions * n_kv * hd, 94);
                let queries: Vec<f32> = random_vec(tokens * heads * 2 * hd, 95)
                    .iter()
                    .map(|v| v * 3.0)
                    .collect();
                let (bkb, kb, vb) = (
                    upload(&ctx, &block_keys),
                    upload(&ctx, &keys),
                    upload(&ctx, &values),
                );
                let row = heads * hd;
                let run = |first: usize| -> (Vec<u32>, Vec<f32>) {
                    let iqb = upload(&ctx, &at_column(&iq, nih * idim, first, 96));
                    let qb = upload(&ctx, &at_column(&queries, heads * 2 * hd, first, 97));
                    let before = at_column(&vec![0.0; tokens * row], row, first, 98);
                    let out = upload(&ctx, &before);
                    let scores =
                        GpuBuf::zeros(&ctx, "scores", tokens * 2 * max_blocks).expect("scores");
                    let sel = GpuBuf::zeros(&ctx, "sel", tokens * (budget + 1)).expect("sel");
                    let parts =
                        GpuBuf::zeros(&ctx, "parts", gops::qsa_partials_len(tokens, heads, hd))
                            .expect("parts");
                    let mut attend = QsaParams {
                        first: first as u32,
                        tokens: tokens as u32,
                        pos0: pos0 as u32,
                        heads: heads as u32,
                        n_kv: n_kv as u32,
                        hd: hd as u32,
                        ratio: 1,
                        dense: 1,
                        scale: 1.0 / (hd as f32).sqrt(),
                        ..Default::default()
                    };
                    let mut rec = Recorder::new();
                    if !dense {
                        let select = QsaParams {
                            first: first as u32,
                            tokens: tokens as u32,
                            pos0: pos0 as u32,
                            heads: nih as u32,
                            ratio: ratio as u32,
                            budget: budget as u32,
                            idim: idim as u32,
                            max_blocks: max_blocks as u32,
                            scale: 1.0 / (idim as f32).sqrt(),
                            ..Default::default()
                        };
                        gops::qsa_select(&ctx, &mut rec, &select, &iqb, &bkb, &scores, &sel)
                            .expect("select");
                        attend.ratio = ratio as u32;
                        attend.budget = budget as u32;
                        attend.dense = 0;
                    }
                    gops::qsa_attend(
                        &ctx,
                        &mut rec,
                        &attend,
                        &qb,
                        &kb,
                        &vb,
                        &sel,
                        &parts,
                        &out,
                        KvType::F32,
                    )
                    .expect("attend");
                    rec.run(&ctx).expect("run");
                    let selected = sel.read_u32(&ctx, 0, tokens * (budget + 1)).expect("sel");
                    let got = download(&ctx, &out, (first + tokens) * row);
                    assert_eq!(
                        bits(&got[..first * row]),
                        bits(&before[..first * row]),
                        "{what}: columns before {first} changed"
                    );
                    (selected, got[first * row..].to_vec())
                };
                let (sel0, out0) = run(0);
                assert!(out0.iter().all(|v| v.is_finite()), "{what}: non-finite");
                for first in [2usize, 5] {
                    let (sel, out) = run(first);
                    assert_eq!(sel, sel0, "{what}: selection from column {first}");
                    assert_eq!(
                        bits(&out),
                        bits(&out0),
                        "{what}: attention from column {first}"
                    );
                }
            }
        }
    }
}

/// A batch member's keys and values into its caches: `kv_pack_from` (f16 and q8_0) reading the
/// member's columns of a stage gives the cache words `kv_pack` gives from the start of one, and
/// `kv_store` (f32 caches) moves the words of the member's key, value and raw index key columns
/// to its positions exactly (NaN payloads included), leaving the other positions (and, with no
/// index keys, the index cache) as they were.
#[test]
fn kv_pack_and_store_from_a_column_offset() {
    let Some(ctx) = context() else { return };
    let (width, tokens, pos0, first) = (32usize, 3usize, 5usize, 4usize);
    let stage = random_vec(tokens * width, 101);
    for kv in [KvType::F16, KvType::Q8_0] {
        let words = kv.cache_bytes((pos0 + tokens) * width) / 4;
        let pack = |buf: &GpuBuf, from: usize| {
            let cache = GpuBuf::from_u32(&ctx, "cache", &vec![0x3c00_3c00; words]).expect("cache");
            let mut rec = Recorder::new();
            gops::kv_pack_from(
                &ctx,
                &mut rec,
                kv,
                (buf, from),
                &cache,
                pos0 * width,
                tokens * width,
            )
            .expect("pack");
            rec.run(&ctx).expect("run");
            cache.read_u32(&ctx, 0, words).expect("read")
        };
        let alone = pack(&upload(&ctx, &stage), 0);
        let padded = upload(&ctx, &at_column(&stage, width, first, 102));
        assert_eq!(pack(&padded, first * width), alone, "{kv:?} pack");
    }
    let idim = 8usize;
    // Stage words: random values, with a quiet and a signalling NaN payload among them.
    let stage_words = |n: usize, seed: u64| -> Vec<u32> {
        let mut w = bits(&random_vec(n, seed));
        w[1] = 0x7fc1_2345;
        w[n - 2] = 0x7f80_0001;
        w
    };
    for indexed in [true, false] {
        let n = (first + tokens) * width;
        let (ks, vs) = (stage_words(n, 103), stage_words(n, 104));
        let is = stage_words((first + tokens) * idim, 105);
        let cache = |n: usize, seed: u64| bits(&random_vec(n, seed));
        let (kc, vc, ic) = (
            cache((pos0 + tokens + 2) * width, 106),
            cache((pos0 + tokens + 2) * width, 107),
            cache((pos0 + tokens + 2) * idim, 108),
        );
        let buf = |w: &[u32]| GpuBuf::from_u32(&ctx, "kv", w).expect("upload");
        let (ksb, vsb, isb, kcb, vcb, icb) =
            (buf(&ks), buf(&vs), buf(&is), buf(&kc), buf(&vc), buf(&ic));
        let rows = |stage, cache| gops::StageRows { stage, cache };
        let mut rec = Recorder::new();
        gops::kv_store(
            &ctx,
            &mut rec,
            [rows(&ksb, &kcb), rows(&vsb, &vcb)],
            rows(&isb, &icb),
            width,
            if indexed { idim } else { 0 },
            gops::Span::new(first, tokens),
            pos0,
        )
        .expect("store");
        rec.run(&ctx).expect("run");
        let sets = [
            (&ks, &kc, &kcb, width, true),
            (&vs, &vc, &vcb, width, true),
            (&is, &ic, &icb, idim, indexed),
        ];
        for (i, (stage, before, got, w, stored)) in sets.into_iter().enumerate() {
            let mut want = before.clone();
            if stored {
                want[pos0 * w..(pos0 + tokens) * w]
                    .copy_from_slice(&stage[first * w..(first + tokens) * w]);
            }
            let got = got.read_u32(&ctx, 0, want.len()).expect("read");
            assert_eq!(got, want, "kv_store set {i}, indexed {indexed}");
        }
    }
}

/// Hyper-connection mixing and combination against the formulas of `model::hyper_connection`
/// (1e-6 relative).
#[test]
fn hc_mix_and_combine_match_cpu() {
    let Some(ctx) = context() else { return };
    let (h, hc, tokens) = (40, 4, 3);
    let wide = h * hc;
    let gates = random_vec(tokens * wide, 61);
    let normed = random_vec(tokens * wide, 62);
    let residual = random_vec(tokens * wide, 63);
    let y = random_vec(tokens * h, 64);
    let inject = random_vec(tokens * hc, 65);
    let (gb, nb, rb, yb, ib) = (
        upload(&ctx, &gates),
        upload(&ctx, &normed),
        upload(&ctx, &residual),
        upload(&ctx, &y),
        upload(&ctx, &inject),
    );
    let x_in = GpuBuf::zeros(&ctx, "x_in", tokens * h).expect("x_in");
    let mut rec = Recorder::new();
    gops::hc_mix_out(&ctx, &mut rec, &gb, &nb, &x_in, h, hc, tokens).expect("mix");
    gops::hc_combine(&ctx, &mut rec, &rb, &yb, &ib, h, hc, tokens).expect("combine");
    rec.run(&ctx).expect("run");
    let mut want_mix = Vec::new();
    let mut want_res = residual.clone();
    for t in 0..tokens {
        for j in 0..h {
            let mut sum = 0f32;
            for s in 0..hc {
                let i = t * wide + s * h + j;
                sum += cpu::sigmoid(gates[i]) * normed[i];
            }
            want_mix.push(sum * (1.0 / hc as f32));
        }
        for s in 0..hc {
            let alpha = 2.0 * cpu::sigmoid(inject[t * hc + s] * (1.0 / hc as f32));
            for j in 0..h {
                want_res[t * wide + s * h + j] += alpha * y[t * h + j];
            }
        }
    }
    close(
        &download(&ctx, &x_in, tokens * h),
        &want_mix,
        1e-6,
        "hc mix",
    );
    close(
        &download(&ctx, &rb, tokens * wide),
        &want_res,
        1e-6,
        "hc combine",
    );
}

/// PLE gate and dilated conv against the formulas of `model::ple` (1e-5 relative), including
/// history carried across two chunks.
#[test]
fn ple_gate_and_conv_match_cpu() {
    let Some(ctx) = context() else { return };
    let shape = gops::PleShape {
        h: 32,
        hc: 4,
        kernel: 4,
        dilation: 3,
    };
    let (h, hc) = (shape.h, shape.hc);
    let wide = h * hc;
    let tokens = 11;
    let kn = random_vec(tokens * wide, 71);
    let qn = random_vec(tokens * wide, 72);
    let v = random_vec(tokens * h, 73);
    let conv_w = random_vec(wide * 4, 74);
    let residual = random_vec(tokens * wide, 75);
    // The conv input (normalised P) is an independent random array here: the norm has its own test.
    let n = random_vec(tokens * wide, 76);
    let (knb, qnb, vb, cwb) = (
        upload(&ctx, &kn),
        upload(&ctx, &qn),
        upload(&ctx, &v),
        upload(&ctx, &conv_w),
    );
    let gated = GpuBuf::zeros(&ctx, "gated", tokens * wide).expect("gated");
    let mut rec = Recorder::new();
    gops::ple_gate(&ctx, &mut rec, &shape, &knb, &qnb, &vb, &gated, tokens).expect("gate");
    rec.run(&ctx).expect("run");
    let got_gated = download(&ctx, &gated, tokens * wide);
    let mut want_gated = Vec::new();
    for t in 0..tokens {
        for s in 0..hc {
            let r = t * wide + s * h..t * wide + (s + 1) * h;
            let a = cpu::dot(&kn[r.clone()], &qn[r]) / (h as f32).sqrt();
            let g = cpu::sigmoid(cpu::signed_sqrt(a, 1e-6));
            want_gated.extend(v[t * h..(t + 1) * h].iter().map(|x| g * x));
        }
    }
    close(&got_gated, &want_gated, 1e-5, "ple gate");

    // Conv over two chunks (5 + 6 tokens) with the history buffer carrying between them.
    let hist = GpuBuf::zeros(&ctx, "hist", 9 * wide).expect("hist");
    let mut got = Vec::new();
    for (t0, count) in [(0usize, 5usize), (5, 6)] {
        let nbc = upload(&ctx, &n[t0 * wide..(t0 + count) * wide]);
        let pc = upload(&ctx, &want_gated[t0 * wide..(t0 + count) * wide]);
        let xc = upload(&ctx, &residual[t0 * wide..(t0 + count) * wide]);
        let mut rec = Recorder::new();
        gops::ple_conv(
            &ctx, &mut rec, &shape, &nbc, &pc, &cwb, &hist, &xc, count, t0,
        )
        .expect("conv");
        rec.run(&ctx).expect("run");
        got.extend(download(&ctx, &xc, count * wide));
    }
    let mut want = residual.clone();
    for t in 0..tokens {
        for c in 0..wide {
            let mut sum = 0f32;
            for k in 0..4 {
                let back = 3 * (3 - k);
                let input = if back <= t {
                    n[(t - back) * wide + c]
                } else {
                    0.0
                };
                sum += conv_w[c * 4 + k] * input;
            }
            want[t * wide + c] += want_gated[t * wide + c] + cpu::silu(sum);
        }
    }
    close(&got, &want, 1e-5, "ple conv across chunks");
}

/// The PLE conv run from a batch member's columns (2 and 5) of its inputs and residual, over two
/// chunks with the history carried between them, gives the bits (residual and history) it gives
/// from column 0, and leaves the other columns of the residual as they were.
#[test]
fn ple_conv_from_a_column_offset_gives_the_bits_of_column_0() {
    let Some(ctx) = context() else { return };
    let shape = gops::PleShape {
        h: 32,
        hc: 4,
        kernel: 4,
        dilation: 3,
    };
    let wide = shape.h * shape.hc;
    let tokens = 11;
    let n = random_vec(tokens * wide, 111);
    let gated = random_vec(tokens * wide, 112);
    let residual = random_vec(tokens * wide, 113);
    let cwb = upload(&ctx, &random_vec(wide * 4, 114));
    let run = |first: usize| -> (Vec<u32>, Vec<u32>) {
        let hist = GpuBuf::zeros(&ctx, "hist", 9 * wide).expect("hist");
        let mut got = Vec::new();
        for (t0, count) in [(0usize, 5usize), (5, 6)] {
            let part =
                |v: &[f32], seed| at_column(&v[t0 * wide..(t0 + count) * wide], wide, first, seed);
            let (nbc, pc) = (
                upload(&ctx, &part(&n, 115)),
                upload(&ctx, &part(&gated, 116)),
            );
            let before = part(&residual, 117);
            let xc = upload(&ctx, &before);
            let mut rec = Recorder::new();
            let span = gops::Span::new(first, count);
            gops::ple_conv(
                &ctx, &mut rec, &shape, &nbc, &pc, &cwb, &hist, &xc, span, t0,
            )
            .expect("conv");
            rec.run(&ctx).expect("run");
            let x = download(&ctx, &xc, (first + count) * wide);
            assert_eq!(
                bits(&x[..first * wide]),
                bits(&before[..first * wide]),
                "columns before {first} changed"
            );
            got.extend(bits(&x[first * wide..]));
        }
        (got, bits(&download(&ctx, &hist, 9 * wide)))
    };
    let (x0, hist0) = run(0);
    for first in [2usize, 5] {
        let (x, hist) = run(first);
        assert_eq!(x, x0, "PLE conv residual from column {first}");
        assert_eq!(hist, hist0, "PLE conv history from column {first}");
    }
}

/// Expert mat-vec reading expert ids from a GPU buffer (weights split into parts of whole
/// experts), SwiGLU and the weighted combination with the shared expert, against the CPU
/// (1e-5 relative).
#[test]
fn moe_experts_and_combine_match_cpu() {
    let Some(ctx) = context() else { return };
    let (n_expert, rows, cols, k, tokens) = (6usize, 8usize, 64usize, 2usize, 3usize);
    let ty = GgmlType::Q8_0;
    let blocks = strata::quant::random_blocks(ty, n_expert * rows * cols / 32, 81);
    let mut dense = vec![0f32; n_expert * rows * cols];
    strata::quant::dequantize(ty, &blocks, &mut dense).expect("dequantize");
    let row_bytes = cols / 32 * ty.type_size();
    // Two experts per part: three parts.
    let w = GpuWeight::upload_with_limit(
        &ctx,
        "experts",
        ty,
        cols,
        n_expert * rows,
        rows,
        &blocks,
        Some(2 * rows * row_bytes),
    )
    .expect("upload");
    assert_eq!(w.parts.len(), 3);
    let ids: Vec<u32> = vec![5, 0, 2, 3, 1, 4];
    let x = random_vec(tokens * cols, 82);
    let (idb, xb) = (
        GpuBuf::from_u32(&ctx, "ids", &ids).expect("ids"),
        upload(&ctx, &x),
    );
    let y = GpuBuf::zeros(&ctx, "y", tokens * k * rows).expect("y");
    let mut rec = Recorder::new();
    kernels::matvec_expert(
        &ctx,
        &mut rec,
        &w,
        &idb,
        k,
        false,
        View::new(&xb, 0, cols),
        View::new(&y, 0, rows),
        tokens * k,
    )
    .expect("expert matvec");
    rec.run(&ctx).expect("run");
    let got = download(&ctx, &y, tokens * k * rows);
    let mut want = Vec::new();
    for (item, &e) in ids.iter().enumerate() {
        let t = item / k;
        for r in 0..rows {
            let row = &dense[(e as usize * rows + r) * cols..(e as usize * rows + r + 1) * cols];
            want.push(cpu::dot(row, &x[t * cols..(t + 1) * cols]));
        }
    }
    close(&got, &want, 1e-5, "expert matvec");

    // SwiGLU + combine with the shared expert.
    let h = rows;
    let gate = random_vec(tokens * k * h, 83);
    let up = random_vec(tokens * k * h, 84);
    let weights = random_vec(tokens * k, 85)
        .iter()
        .map(|v| v.abs())
        .collect::<Vec<_>>();
    let shared = random_vec(tokens * h, 86);
    let shared_logit = random_vec(tokens, 87);
    let (gb, ub, wb, sb, slb) = (
        upload(&ctx, &gate),
        upload(&ctx, &up),
        upload(&ctx, &weights),
        upload(&ctx, &shared),
        upload(&ctx, &shared_logit),
    );
    let out = GpuBuf::zeros(&ctx, "out", tokens * h).expect("out");
    let mut rec = Recorder::new();
    gops::swiglu(&ctx, &mut rec, &gb, &ub, tokens * k * h).expect("swiglu");
    gops::moe_combine(
        &ctx,
        &mut rec,
        &gb,
        &wb,
        Some((&sb, &slb)),
        &out,
        h,
        k,
        tokens,
    )
    .expect("combine");
    rec.run(&ctx).expect("run");
    let act: Vec<f32> = gate
        .iter()
        .zip(&up)
        .map(|(g, u)| cpu::silu(*g) * u)
        .collect();
    close(&download(&ctx, &gb, act.len()), &act, 1e-6, "swiglu");
    let mut want = Vec::new();
    for t in 0..tokens {
        for i in 0..h {
            let mut acc = 0f32;
            for slot in 0..k {
                acc += weights[t * k + slot] * act[(t * k + slot) * h + i];
            }
            acc += cpu::sigmoid(shared_logit[t]) * shared[t * h + i];
            want.push(acc);
        }
    }
    close(
        &download(&ctx, &out, tokens * h),
        &want,
        1e-6,
        "moe combine",
    );
}

/// Embedding gather into every stream, cache row copies and block means.
#[test]
fn gather_copy_and_block_mean_match_cpu() {
    let Some(ctx) = context() else { return };
    let (vocab, dim, reps) = (10usize, 64usize, 4usize);
    let table = random_vec(vocab * dim, 91);
    let w = GpuWeight::upload_with_limit(
        &ctx,
        "embd",
        GgmlType::F32,
        dim,
        vocab,
        1,
        bytemuck::cast_slice(&table),
        Some(3 * dim * 4),
    )
    .expect("upload");
    let ids = [7u32, 0, 9, 7];
    let idb = GpuBuf::from_u32(&ctx, "ids", &ids).expect("ids");
    let out = GpuBuf::zeros(&ctx, "out", ids.len() * dim * reps).expect("out");
    let mut rec = Recorder::new();
    kernels::get_rows(
        &ctx,
        &mut rec,
        &w,
        &idb,
        ids.len(),
        View::new(&out, 0, dim * reps),
        reps,
        dim,
    )
    .expect("get_rows");
    rec.run(&ctx).expect("run");
    let want: Vec<f32> = ids
        .iter()
        .flat_map(|&id| (0..reps).flat_map(move |_| (0..dim).map(move |i| (id as usize, i))))
        .map(|(id, i)| table[id * dim + i])
        .collect();
    close(
        &download(&ctx, &out, want.len()),
        &want,
        0.0,
        "embedding gather into every stream",
    );

    let (rows, width, ratio) = (8usize, 16usize, 4usize);
    let src = random_vec(rows * width, 92);
    let sb = upload(&ctx, &src);
    let cache = GpuBuf::zeros(&ctx, "cache", 12 * width).expect("cache");
    let means = GpuBuf::zeros(&ctx, "means", 3 * width).expect("means");
    let mut rec = Recorder::new();
    gops::copy_rows(
        &ctx, &mut rec, &sb, 0, width, &cache, 0, width, 4, rows, width,
    )
    .expect("copy");
    gops::block_mean(&ctx, &mut rec, &cache, &means, 1, 2, ratio, width).expect("mean");
    rec.run(&ctx).expect("run");
    let got_cache = download(&ctx, &cache, 12 * width);
    assert!(
        got_cache[..4 * width].iter().all(|v| *v == 0.0),
        "rows before row0 untouched"
    );
    close(&got_cache[4 * width..], &src, 0.0, "copy rows");
    let mut want = vec![0f32; width];
    for b in 1..3 {
        for i in 0..width {
            let mut acc = 0f32;
            for j in 0..ratio {
                acc += got_cache[(b * ratio + j) * width + i];
            }
            want.push(acc / ratio as f32);
        }
    }
    close(
        &download(&ctx, &means, 3 * width),
        &want,
        1e-6,
        "block means",
    );
}

/// Greedy argmax: lowest index on ties, non-finite rows flagged.
#[test]
fn argmax_matches_cpu_with_ties_and_flags_nan() {
    let Some(ctx) = context() else { return };
    let n = 1000;
    let mut x = random_vec(4 * n, 101);
    // Row 1: a tie between 700 and 300 (300 must win); row 2: all equal; row 3: a NaN.
    x[n + 700] = 5.0;
    x[n + 300] = 5.0;
    for v in &mut x[2 * n..3 * n] {
        *v = -1.5;
    }
    x[3 * n + 10] = f32::NAN;
    let xb = upload(&ctx, &x);
    let out = GpuBuf::zeros(&ctx, "out", 8).expect("out");
    let mut rec = Recorder::new();
    gops::argmax(&ctx, &mut rec, &xb, n, 4, &out).expect("argmax");
    rec.run(&ctx).expect("run");
    let got = out.read_u32(&ctx, 0, 8).expect("read");
    let cpu_first_max = |row: &[f32]| {
        let mut best = 0;
        for (i, v) in row.iter().enumerate() {
            if *v > row[best] {
                best = i;
            }
        }
        best as u32
    };
    assert_eq!((got[0], got[1]), (cpu_first_max(&x[..n]), 0), "row 0");
    assert_eq!(
        (got[2], got[3]),
        (300, 0),
        "row 1: tie goes to the lower index"
    );
    assert_eq!((got[4], got[5]), (0, 0), "row 2: all equal");
    assert_eq!(got[7], 1, "row 3: the NaN is flagged");
}

/// The sampling candidates found on the GPU (`strata::gpu::topk`): the first 64 tokens in the
/// sampler's candidate order, exactly `sampler::top_candidates` of the row, for rows of one
/// slice, of several merge rounds and of the real vocabulary (three passes), with ties, signed
/// zeros and rows shorter than the list; a non-finite value reports its smallest id.
#[test]
fn top_candidates_on_the_gpu_equal_the_sampler_order() {
    use strata::gpu::topk;
    let Some(ctx) = context() else { return };
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for (n, levels) in [
        (1, 4),
        (40, 3),
        (1024, 7),
        (1025, 1000),
        (31_000, 50),
        (248_320, 4000),
    ] {
        let row: Vec<f32> = (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                match state % 13 {
                    0 => -0.0,
                    1 => 0.0,
                    _ => ((state >> 24) % levels) as f32 * 0.25 - levels as f32 / 8.0,
                }
            })
            .collect();
        let got = run_topk(&ctx, &row).unwrap_or_else(|bad| panic!("n {n}: bad id {bad}"));
        let want = strata::sampler::top_candidates(&row, topk::TOP_CANDIDATES);
        assert_eq!(got.len(), want.len(), "n {n}");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                (g.0, g.1.to_bits()),
                (w.0, w.1.to_bits()),
                "n {n}, candidate {i}"
            );
        }
    }
    let mut row = random_vec(5000, 7);
    row[4321] = f32::INFINITY;
    row[1234] = f32::NAN;
    assert_eq!(
        run_topk(&ctx, &row),
        Err(1234),
        "the smallest non-finite id"
    );
}

/// Several rows in one set of passes (`topk::record_rows`, a batched decode step's members):
/// each listed row's candidates equal `sampler::top_candidates` of that row, in the listed order
/// (rows repeated and out of order, one with a non-finite value reporting its own id), at a
/// vocabulary of three merge levels and at one of a single slice.
#[test]
fn top_candidates_of_listed_rows_equal_each_row_alone() {
    use strata::gpu::topk;
    let Some(ctx) = context() else { return };
    for (n, seed) in [(70_001usize, 11u64), (900, 12)] {
        let count = 5;
        let mut logits = random_vec(n * count, seed);
        // Ties across the row: every 97th value equal.
        for (i, v) in logits.iter_mut().enumerate() {
            if i % 97 == 0 {
                *v = 0.5;
            }
        }
        logits[3 * n + n / 3] = f32::NAN;
        let rows = [4u32, 0, 2, 2, 3];
        let words = topk::scratch_words(n) * rows.len();
        let x = upload(&ctx, &logits);
        let a = GpuBuf::zeros(&ctx, "lists a", words).expect("a");
        let b = GpuBuf::zeros(&ctx, "lists b", words).expect("b");
        let listed = GpuBuf::zeros(&ctx, "rows", rows.len()).expect("rows");
        let mut rec = Recorder::new();
        let list =
            topk::record_rows(&ctx, &mut rec, &x, n, &rows, &listed, &a, &b).expect("record");
        rec.run(&ctx).expect("run");
        let got = list
            .read_u32(&ctx, 0, rows.len() * topk::LIST_WORDS)
            .expect("read");
        for (i, &r) in rows.iter().enumerate() {
            let words = &got[i * topk::LIST_WORDS..(i + 1) * topk::LIST_WORDS];
            let row = &logits[r as usize * n..(r as usize + 1) * n];
            let decoded = topk::decode(words, n);
            if r == 3 {
                assert_eq!(decoded, Err((n / 3) as u32), "n {n}: row 3's non-finite id");
                continue;
            }
            let want = strata::sampler::top_candidates(row, topk::TOP_CANDIDATES);
            let got = decoded.unwrap_or_else(|bad| panic!("n {n}, row {r}: bad id {bad}"));
            let bits =
                |l: &[(u32, f32)]| l.iter().map(|(i, v)| (*i, v.to_bits())).collect::<Vec<_>>();
            assert_eq!(
                bits(&got),
                bits(&want),
                "n {n}: listed row {i} (logits row {r})"
            );
        }
    }
}

fn run_topk(ctx: &GpuContext, row: &[f32]) -> Result<Vec<(u32, f32)>, u32> {
    use strata::gpu::topk;
    let words = topk::scratch_words(row.len());
    let x = upload(ctx, row);
    let a = GpuBuf::zeros(ctx, "lists a", words).expect("a");
    let b = GpuBuf::zeros(ctx, "lists b", words).expect("b");
    let mut rec = Recorder::new();
    let list = topk::record(ctx, &mut rec, &x, row.len(), &a, &b).expect("record");
    rec.run(ctx).expect("run");
    let got = list.read_u32(ctx, 0, topk::LIST_WORDS).expect("read");
    topk::decode(&got, row.len())
}
