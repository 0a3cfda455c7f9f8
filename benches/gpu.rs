//! Relative speed on whatever adapter is present (lavapipe on a laptop or CI, a real GPU where
//! there is one): `cargo bench --bench gpu`. Absolute figures and rooflines come from
//! `strata bench` on the real machine; these show whether a change made a kernel faster or slower.
//!
//! * `matvec`: one dequantizing mat-vec (record, submit, wait) per quant type at a 2560-wide shape
//!   of the model (2560 -> 2560 rows here, to keep a software adapter quick);
//! * `prefill_matvec`: the same weights against a 64-vector tile (the prefill form);
//! * `decode_step`: one token through the built-in demo model (every kernel of a decode step).
//!
//! Without a usable adapter the benches print why and run nothing.

use std::sync::{Arc, OnceLock};

use strata::engine::Backend;
use strata::gguf::types::GgmlType;
use strata::gpu::GpuContext;
use strata::gpu::backend::GpuBackend;
use strata::gpu::buffers::{GpuBuf, GpuWeight};
use strata::gpu::kernels::{self, Recorder, View};

const ROWS: usize = 2560;
const COLS: usize = 2560;
const TYPES: [GgmlType; 5] = [
    GgmlType::F32,
    GgmlType::Q8_0,
    GgmlType::Q6_K,
    GgmlType::IQ4_NL,
    GgmlType::IQ3_S,
];

fn main() {
    if context().is_none() {
        return;
    }
    divan::main();
}

fn context() -> Option<&'static Arc<GpuContext>> {
    static CTX: OnceLock<Option<Arc<GpuContext>>> = OnceLock::new();
    CTX.get_or_init(|| match GpuContext::new(None) {
        Ok(ctx) => {
            eprintln!("adapter: {}", ctx.describe());
            Some(ctx)
        }
        Err(e) => {
            eprintln!("no usable GPU adapter, nothing benched: {e}");
            None
        }
    })
    .as_ref()
}

struct MatvecCase {
    w: GpuWeight,
    x: GpuBuf,
    y: GpuBuf,
}

fn matvec_case(ctx: &GpuContext, ty: GgmlType, vectors: usize) -> MatvecCase {
    let blocks = strata::quant::random_blocks(ty, ROWS * COLS / ty.block_size(), 7);
    let w = GpuWeight::upload(ctx, "bench", ty, COLS, ROWS, 1, &blocks).expect("upload");
    let x: Vec<f32> = (0..vectors * COLS)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    MatvecCase {
        w,
        x: GpuBuf::from_f32(ctx, "x", &x).expect("x"),
        y: GpuBuf::zeros(ctx, "y", vectors * ROWS).expect("y"),
    }
}

fn run_matvec(bencher: divan::Bencher, ty: GgmlType, vectors: usize) {
    let Some(ctx) = context() else { return };
    let case = matvec_case(ctx, ty, vectors);
    let mut rec = Recorder::new();
    kernels::matvec(
        ctx,
        &mut rec,
        &case.w,
        View::new(&case.x, 0, COLS),
        View::new(&case.y, 0, ROWS),
        vectors,
    )
    .expect("record");
    rec.run(ctx).expect("warm-up");
    bencher.bench(|| rec.run(ctx).expect("run"));
}

#[divan::bench(args = TYPES, sample_count = 20)]
fn matvec(bencher: divan::Bencher, ty: GgmlType) {
    run_matvec(bencher, ty, 1);
}

#[divan::bench(args = TYPES, sample_count = 10)]
fn prefill_matvec(bencher: divan::Bencher, ty: GgmlType) {
    run_matvec(bencher, ty, 64);
}

#[divan::bench(sample_count = 20, sample_size = 1)]
fn decode_step(bencher: divan::Bencher) {
    let Some(ctx) = context() else { return };
    let gguf = Arc::new(strata::model::demo::demo_gguf().expect("demo model"));
    let backend = Arc::new(GpuBackend::load(Arc::clone(ctx), gguf, 4096).expect("load"));
    let mut seq = Arc::clone(&backend).new_sequence().expect("sequence");
    seq.feed(&[1, 2, 3, 4], false).expect("prompt");
    // One untimed step: the decode pipelines are built on first use.
    seq.feed(&[5], false).expect("first decode step");
    let mut token = 5u32;
    bencher.bench_local(|| {
        token = (token + 1) % 200;
        seq.feed(&[token], false).expect("decode step")
    });
}
