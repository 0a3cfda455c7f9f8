//! The GPU dequantizers of Q1_0, Q2_0, TQ1_0, TQ2_0, MXFP4 and NVFP4 (`shaders/quant/<type>.wgsl`)
//! on the available adapter (lavapipe in CI) against the CPU dequantizer (`strata::quant`), which
//! `tests/quant_vectors.rs` checks bit for bit against ggml:
//!
//! * dequantization (`get_rows`) of ggml's vectors (`tests/fixtures/quant-vectors-newer`) and of
//!   random valid blocks: every value bit-identical;
//! * mat-vec against an f64 dot of the CPU values: |error| <= 1e-5 of sum |w x| per row;
//! * every type the CPU can dequantize has a GPU kernel, so `--backend auto` never falls back to the
//!   CPU for a weight type.

mod common;

use common::{fixtures_root, gpu_context as context, random_vec};
use std::sync::Arc;

use strata::gguf::types::GgmlType;
use strata::gpu::GpuContext;
use strata::gpu::buffers::{GpuBuf, GpuWeight};
use strata::gpu::kernels::{self, Recorder, View};

const NEW_TYPES: &[(&str, GgmlType)] = &[
    ("q1_0", GgmlType::Q1_0),
    ("q2_0", GgmlType::Q2_0),
    ("tq1_0", GgmlType::TQ1_0),
    ("tq2_0", GgmlType::TQ2_0),
    ("mxfp4", GgmlType::MXFP4),
    ("nvfp4", GgmlType::NVFP4),
];

fn read(name: &str) -> Vec<u8> {
    let path = fixtures_root().join("quant-vectors-newer").join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// Dequantize `blocks` of `ty` on the GPU, one block per row.
fn gpu_dequant(ctx: &Arc<GpuContext>, ty: GgmlType, blocks: &[u8]) -> Vec<f32> {
    let row_len = ty.block_size();
    let n_rows = blocks.len() / ty.type_size();
    let w = GpuWeight::upload(ctx, ty.name(), ty, row_len, n_rows, 1, blocks).expect("upload");
    let ids: Vec<u32> = (0..n_rows as u32).collect();
    let ids = GpuBuf::from_u32(ctx, "ids", &ids).expect("ids");
    let out = GpuBuf::zeros(ctx, "out", n_rows * row_len).expect("out");
    let mut rec = Recorder::new();
    kernels::get_rows(
        ctx,
        &mut rec,
        &w,
        &ids,
        n_rows,
        View::new(&out, 0, row_len),
        1,
        0,
    )
    .expect("get_rows");
    rec.run(ctx).expect("run");
    out.read_f32(ctx, 0, n_rows * row_len).expect("read")
}

fn cpu_dequant(ty: GgmlType, blocks: &[u8]) -> Vec<f32> {
    let mut values = vec![0f32; blocks.len() / ty.type_size() * ty.block_size()];
    strata::quant::dequantize(ty, blocks, &mut values).expect("CPU dequantize");
    values
}

/// Index and both values of the first bit difference, if any.
fn first_difference(got: &[f32], want: &[f32]) -> Option<(usize, f32, f32)> {
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .position(|(g, w)| g.to_bits() != w.to_bits())
        .map(|i| (i, got[i], want[i]))
}

#[test]
fn new_types_have_gpu_kernels() {
    for &(name, ty) in NEW_TYPES {
        assert!(strata::gpu::shaders::supports(ty), "{name}: no GPU kernel");
        assert_eq!(
            ty.block_size() % 32,
            0,
            "{name}: blocks are whole 32-value chunks"
        );
    }
}

/// `--backend auto` must not fall back to the CPU because of a weight type.
#[test]
fn every_type_the_cpu_dequantizes_has_a_gpu_kernel() {
    let missing: Vec<&str> = GgmlType::all()
        .filter(|&t| strata::quant::is_supported(t) && !strata::gpu::shaders::supports(t))
        .map(|t| t.name())
        .collect();
    assert!(missing.is_empty(), "no GPU kernel for {missing:?}");
}

#[test]
fn dequant_of_ggml_vectors_is_bit_identical() {
    let Some(ctx) = context() else { return };
    let mut failures = Vec::new();
    for &(name, ty) in NEW_TYPES {
        for set in ["random", "quantized"] {
            let blocks = read(&format!("{name}.{set}.bin"));
            let ggml: Vec<f32> = bytemuck::pod_collect_to_vec(&read(&format!("{name}.{set}.f32")));
            let cpu = cpu_dequant(ty, &blocks);
            assert!(
                first_difference(&cpu, &ggml).is_none(),
                "{name} {set}: the CPU dequantizer disagrees with ggml"
            );
            let gpu = gpu_dequant(&ctx, ty, &blocks);
            match first_difference(&gpu, &ggml) {
                None => println!("{name} {set}: {} values bit-identical", gpu.len()),
                Some((i, g, w)) => failures.push(format!(
                    "{name} {set}: value {i}: GPU {g:e} ({:#010x}), ggml {w:e} ({:#010x})",
                    g.to_bits(),
                    w.to_bits()
                )),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn dequant_of_random_blocks_is_bit_identical() {
    let Some(ctx) = context() else { return };
    let mut failures = Vec::new();
    for &(name, ty) in NEW_TYPES {
        let blocks = strata::quant::random_blocks(ty, 97, 12);
        let cpu = cpu_dequant(ty, &blocks);
        let gpu = gpu_dequant(&ctx, ty, &blocks);
        match first_difference(&gpu, &cpu) {
            None => println!("{name}: {} random values bit-identical", gpu.len()),
            Some((i, g, w)) => failures.push(format!(
                "{name}: value {i} (block {}): GPU {g:e}, CPU {w:e}",
                i / ty.block_size()
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn matvec_matches_cpu() {
    let Some(ctx) = context() else { return };
    let (rows, row_len, items) = (29, 1024, 3);
    let mut failures = Vec::new();
    for &(name, ty) in NEW_TYPES {
        let blocks = strata::quant::random_blocks(ty, rows * row_len / ty.block_size(), 5);
        let values = cpu_dequant(ty, &blocks);
        let x = random_vec(items * row_len, 3);
        let w = GpuWeight::upload(&ctx, name, ty, row_len, rows, 1, &blocks).expect("upload");
        let xb = GpuBuf::from_f32(&ctx, "x", &x).expect("x");
        let y = GpuBuf::zeros(&ctx, "y", items * rows).expect("y");
        let mut rec = Recorder::new();
        kernels::matvec(
            &ctx,
            &mut rec,
            &w,
            View::new(&xb, 0, row_len),
            View::new(&y, 0, rows),
            items,
        )
        .expect("matvec");
        rec.run(&ctx).expect("run");
        let got = y.read_f32(&ctx, 0, items * rows).expect("read");
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
                worst = worst.max(if err.is_nan() { f64::INFINITY } else { err });
            }
        }
        println!("{name}: mat-vec max rel error {worst:.2e}");
        if worst > 1e-5 {
            failures.push(format!("{name}: max rel error {worst:.2e}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
