//! Every GPU kernel against its CPU twin on the available Vulkan adapter (lavapipe in CI).
//!
//! Harness: the adapter is printed; without one the test fails when `CI` is set and is skipped
//! with a message otherwise. Tolerances are stated per kernel next to each check.

use std::path::PathBuf;
use std::sync::Arc;

use strata::gguf::types::GgmlType;
use strata::gpu::GpuContext;
use strata::gpu::buffers::{GpuBuf, GpuWeight};
use strata::gpu::kernels::{self, Recorder, View};

fn context() -> Option<Arc<GpuContext>> {
    let adapter = std::env::var("STRATA_ADAPTER")
        .ok()
        .and_then(|s| s.parse().ok());
    match GpuContext::new(adapter) {
        Ok(ctx) => {
            println!("adapter: {}", ctx.describe());
            Some(ctx)
        }
        Err(e) => {
            if std::env::var_os("CI").is_some() {
                panic!("CI is set but no usable GPU adapter: {e}");
            }
            eprintln!(
                "SKIPPED: no usable GPU adapter ({e}); install mesa-vulkan-drivers for lavapipe"
            );
            None
        }
    }
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn read_f32_file(path: &PathBuf) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    bytemuck::pod_collect_to_vec(&bytes)
}

/// Deterministic pseudo-random values in [-1, 1) (xorshift), never all zeros.
fn random_vec(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
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
        let b =
            std::fs::read(fixture(&format!("quant-vectors/{name}.{set}.bin"))).expect("fixture");
        let v = read_f32_file(&fixture(&format!("quant-vectors/{name}.{set}.f32")));
        // Keep whole 32-value groups only (the GPU reads rows in multiples of 32 values).
        if v.len() % 32 == 0 {
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
/// Also checks batch invariance: 5 vectors in one dispatch give the same bits as 5 single
/// dispatches, and splitting the tensor into several parts changes no bit.
#[test]
fn matvec_matches_cpu_and_is_batch_invariant() {
    let Some(ctx) = context() else { return };
    let (rows, row_len, items) = (37, 512, 5);
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
        assert_eq!(w_split.parts.len(), 4, "37 rows at 10 rows per part");
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
        ("norm", &["rmsnorm", "rmsnorm_inplace", "rmsnorm_gated"]),
        (
            "elementwise",
            &["silu_scale", "swiglu", "copy_rows", "block_mean"],
        ),
        ("hc", &["hc_mix_out", "hc_combine"]),
        ("gdn", &["gdn_conv", "gdn_recurrence"]),
        ("ple", &["ple_gate", "ple_conv"]),
        ("qsa", &["rope", "qsa_select", "qsa_attend"]),
        ("moe", &["moe_router", "moe_combine"]),
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
