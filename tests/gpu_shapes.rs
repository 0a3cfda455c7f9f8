//! Mat-vec shapes the oracle fixtures never produce, on the available adapter (lavapipe in CI,
//! where `.ci/run` repeats this file at subgroup sizes 4, 8 and 16):
//!
//! * quantized rows of 1, 2, 3 and 5 whole blocks of every GPU type (fewer 32-value chunks than a
//!   subgroup has lanes, odd chunk counts), with 1, 2, 3 and 7 rows (odd row counts leave a row
//!   without its pair) and 1 to 5 vectors (a partial tile);
//! * unquantized (F32, F16, BF16) rows of any length: 24, 33, 100 values;
//! * rows of 4,100 to 8,448 values, which several subgroups share (the K split).
//!
//! Each result is checked against an f64 dot of the CPU dequantizer's values: |error| <= 1e-5 of
//! sum |w x| per row (f32 accumulation in another order), and one dispatch of several vectors must
//! give the same bits as one dispatch per vector.
//!
//! The same shapes in the limb arithmetic (docs/tensor-cores.md), and that arithmetic against a
//! CPU twin written from its definition (Q8_0), bit for bit: its fold is one order whatever the
//! subgroup size, so the twin holds at 4, 8 and 16 alike.

mod common;

use common::gpu_context as context;
use common::gpu_context_limb as limb_context;
use common::{random_vec, same_bits};
use std::sync::Arc;

use strata::gguf::types::GgmlType;
use strata::gpu::GpuContext;
use strata::gpu::buffers::{GpuBuf, GpuWeight};
use strata::gpu::kernels::{self, Recorder, View};

/// Every type the GPU reads, in `GgmlType` order.
fn gpu_types() -> Vec<GgmlType> {
    GgmlType::all()
        .filter(|&t| strata::gpu::shaders::supports(t))
        .collect()
}

/// How many outputs of `got` differ from `want` in their bits, and the first few as (vector, row,
/// got, want, difference in ulps): a few ulps is rounding, more a misplaced value.
fn bit_differences(got: &[f32], want: &[f32], rows: usize) -> String {
    let differ: Vec<String> = got
        .iter()
        .zip(want)
        .enumerate()
        .filter(|(_, (a, b))| a.to_bits() != b.to_bits())
        .map(|(k, (a, b))| {
            let ulps = i64::from(a.to_bits()) - i64::from(b.to_bits());
            format!("(v{} r{} {a} {b} ulp {ulps})", k / rows, k % rows)
        })
        .collect();
    let first: Vec<&str> = differ.iter().take(12).map(String::as_str).collect();
    format!("{} differ: {}", differ.len(), first.join(" "))
}

/// Runs one mat-vec of `rows` x `row_len` random weights of `ty` against `items` vectors; returns
/// a description of what went wrong, if anything.
fn check_shape(
    ctx: &Arc<GpuContext>,
    ty: GgmlType,
    rows: usize,
    row_len: usize,
    items: usize,
) -> Result<(), String> {
    let what = format!("{} {rows}x{row_len} x{items}", ty.name());
    let block = ty.block_size();
    if !row_len.is_multiple_of(block) {
        return Err(format!("{what}: not whole blocks"));
    }
    let bytes =
        strata::quant::random_blocks(ty, rows * row_len / block, (rows * 31 + row_len) as u64);
    let mut values = vec![0f32; rows * row_len];
    strata::quant::dequantize(ty, &bytes, &mut values).map_err(|e| format!("{what}: {e}"))?;
    // Vectors start on 16-byte boundaries: pad each one to a multiple of 4 floats.
    let stride = row_len.next_multiple_of(4);
    let x_dense = random_vec(items * row_len, row_len as u64);
    let mut x = vec![0f32; items * stride];
    for i in 0..items {
        x[i * stride..i * stride + row_len]
            .copy_from_slice(&x_dense[i * row_len..(i + 1) * row_len]);
    }
    let w = GpuWeight::upload(ctx, &what, ty, row_len, rows, 1, &bytes)
        .map_err(|e| format!("{what}: upload: {e}"))?;
    let xb = GpuBuf::from_f32(ctx, "x", &x).map_err(|e| format!("{what}: {e}"))?;
    let batched = GpuBuf::zeros(ctx, "y", items * rows).map_err(|e| format!("{what}: {e}"))?;
    let single = GpuBuf::zeros(ctx, "y1", items * rows).map_err(|e| format!("{what}: {e}"))?;
    let mut rec = Recorder::new();
    kernels::matvec(
        ctx,
        &mut rec,
        &w,
        View::new(&xb, 0, stride),
        View::new(&batched, 0, rows),
        items,
    )
    .map_err(|e| format!("{what}: matvec: {e}"))?;
    for i in 0..items {
        kernels::matvec(
            ctx,
            &mut rec,
            &w,
            View::new(&xb, i * stride, stride),
            View::new(&single, i * rows, rows),
            1,
        )
        .map_err(|e| format!("{what}: matvec single: {e}"))?;
    }
    rec.run(ctx).map_err(|e| format!("{what}: run: {e}"))?;
    let got_single = single
        .read_f32(ctx, 0, items * rows)
        .map_err(|e| format!("{what}: {e}"))?;
    let got = batched
        .read_f32(ctx, 0, items * rows)
        .map_err(|e| format!("{what}: {e}"))?;
    if !same_bits(&got, &got_single) {
        return Err(format!(
            "{what}: batched result differs from one vector at a time: {}",
            bit_differences(&got, &got_single, rows)
        ));
    }
    for i in 0..items {
        for r in 0..rows {
            let wr = &values[r * row_len..(r + 1) * row_len];
            let xr = &x_dense[i * row_len..(i + 1) * row_len];
            let exact: f64 = wr.iter().zip(xr).map(|(a, b)| *a as f64 * *b as f64).sum();
            let magnitude: f64 = wr
                .iter()
                .zip(xr)
                .map(|(a, b)| (*a as f64 * *b as f64).abs())
                .sum();
            let got = got_single[i * rows + r] as f64;
            let err = (got - exact).abs() / magnitude.max(1e-30);
            if err.is_nan() || err > 1e-5 {
                return Err(format!(
                    "{what}: vector {i} row {r}: got {got}, want {exact} (rel error {err:.2e})"
                ));
            }
        }
    }
    Ok(())
}

#[test]
fn quantized_rows_of_few_whole_blocks() {
    let Some(ctx) = context() else { return };
    let mut failures = Vec::new();
    let mut checked = 0;
    for ty in gpu_types() {
        let block = ty.block_size().max(32);
        for blocks in [1, 2, 3, 5] {
            for (rows, items) in [(1, 1), (2, 3), (3, 5), (7, 2)] {
                if let Err(e) = check_shape(&ctx, ty, rows, blocks * block, items) {
                    failures.push(e);
                }
                checked += 1;
            }
        }
    }
    println!("{checked} shapes checked, {} failed", failures.len());
    assert!(checked >= 16 * 27, "only {checked} shapes");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Unquantized rows whose length is not a multiple of 32 (shaders/quant/rows_any.wgsl).
#[test]
fn unquantized_rows_of_any_length() {
    let Some(ctx) = context() else { return };
    let mut failures = Vec::new();
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
        for row_len in [24, 33, 100] {
            for (rows, items) in [(1, 1), (3, 2), (7, 5)] {
                if let Err(e) = check_shape(&ctx, ty, rows, row_len, items) {
                    failures.push(e);
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Unquantized rows of lengths that are multiples of 32 but of no larger power of two.
#[test]
fn unquantized_rows_of_multiples_of_32() {
    let Some(ctx) = context() else { return };
    let mut failures = Vec::new();
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
        for row_len in [32, 96, 160, 416] {
            for (rows, items) in [(1, 1), (3, 2), (7, 5)] {
                if let Err(e) = check_shape(&ctx, ty, rows, row_len, items) {
                    failures.push(e);
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Few rows long enough that several subgroups share each row (the K split: 2 from 4,096 values, 4
/// from 8,192), for every GPU type, with row counts that leave workgroups partly filled and
/// partial tiles: the same tolerance, and batched == one vector at a time.
#[test]
fn long_rows_split_over_subgroups() {
    let Some(ctx) = context() else { return };
    let mut failures = Vec::new();
    let mut checked = 0;
    for ty in gpu_types() {
        let lengths: &[usize] = if ty.block_size() == 1 {
            &[4100, 8200]
        } else {
            &[17 * 256, 33 * 256]
        };
        for &row_len in lengths {
            for (rows, items) in [(1, 1), (37, 5)] {
                if let Err(e) = check_shape(&ctx, ty, rows, row_len, items) {
                    failures.push(e);
                }
                checked += 1;
            }
        }
    }
    println!("{checked} shapes checked, {} failed", failures.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Device creation refuses adapters whose subgroup size the kernels do not handle.
#[test]
fn subgroup_sizes_must_be_powers_of_two_from_4_to_128() {
    use strata::gpu::device::subgroup_size_ok;
    for ok in [4, 8, 16, 32, 64, 128] {
        assert!(subgroup_size_ok(ok), "{ok}");
    }
    for bad in [0, 1, 2, 3, 6, 12, 24, 48, 96, 256] {
        assert!(!subgroup_size_ok(bad), "{bad}");
    }
}

/// Rows of fewer 32-value tasks than a subgroup has lanes, in wide tiles (the hyper-connection up
/// projection's shape: 320 values, 10 tasks). One block of each type (a few for the 32-value ones)
/// and 21 vectors: the same tolerance, and batched == one vector at a time, bit for bit, at
/// whatever subgroup size the adapter has (CI: 4, 8, 16). Rows of at most half a subgroup's tasks
/// take the packed wide path (several row groups per subgroup, `PACK` in quant/rows_wide.wgsl), so
/// this is its check against the unpacked decode row body: at subgroup size 8, rows of 32 to 128
/// values pack 8, 4 and 2 groups (37 rows: a last subgroup with groups past the rows).
#[test]
fn short_rows_in_wide_tiles() {
    let Some(ctx) = context() else { return };
    let mut failures = Vec::new();
    for ty in gpu_types() {
        let lengths: &[usize] = match ty.block_size() {
            1 => &[32, 64, 128],
            32 => &[32, 64, 96, 128, 320],
            b => &[b],
        };
        for &row_len in lengths {
            for (rows, items) in [(37, 21), (5, 17)] {
                if let Err(e) = check_shape(&ctx, ty, rows, row_len, items) {
                    failures.push(e);
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Rows of q S + S/2 tasks (q >= 1) run in pairs in wide tiles (`PAIRS` in quant/rows_wide.wgsl:
/// the 2,560-value rows on 32 lanes) for Q8_0, IQ4_NL and IQ3_S: 192 and 320 values at subgroup
/// size 4, 384 and 640 at 8, 768 and 1,280 at 16 (CI runs all three; IQ3_S's 256-value blocks only
/// at 16). Q6_K keeps the plain tiles (it gave other bits in pairs at 16) and is checked alike. 13 rows make row groups of 4, 4, 4 and 1, so one pair is
/// whole, one has a short second group and subgroups past the rows compute without storing; 21
/// vectors, a wide tile and a tile of 4 and 1. The same tolerance, and batched == one vector at a
/// time, bit for bit.
#[test]
fn rows_in_pairs_in_wide_tiles() {
    let Some(ctx) = context() else { return };
    // Pairs are opt-in; on for this process (every other test's bits are the same either way).
    kernels::set_wide_pairs(true);
    let mut failures = Vec::new();
    for ty in [
        GgmlType::Q8_0,
        GgmlType::IQ4_NL,
        GgmlType::IQ3_S,
        GgmlType::Q6_K,
    ] {
        for row_len in [192usize, 320, 384, 640, 768, 1280] {
            if !row_len.is_multiple_of(ty.block_size()) {
                continue;
            }
            if let Err(e) = check_shape(&ctx, ty, 13, row_len, 21) {
                failures.push(e);
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Every GPU type in the limb arithmetic (the split layouts take it; the others keep theirs): few
/// whole blocks, wide tiles of 17 and 21 vectors, and rows long enough that today's arithmetic would
/// split them over subgroups. The same tolerance, and batched == one vector at a time.
#[test]
fn limb_arithmetic_shapes() {
    let Some(ctx) = limb_context() else { return };
    let mut failures = Vec::new();
    let mut checked = 0;
    for ty in gpu_types() {
        let block = ty.block_size().max(32);
        let mut shapes = vec![
            (1, block, 1),
            (3, 3 * block, 5),
            (7, 5 * block, 2),
            (37, block, 21),
        ];
        if ty.block_size() > 1 {
            shapes.push((5, 2560, 17));
            shapes.push((3, 17 * 256, 5));
        }
        for (rows, row_len, items) in shapes {
            if let Err(e) = check_shape(&ctx, ty, rows, row_len, items) {
                failures.push(e);
            }
            checked += 1;
        }
    }
    println!("{checked} shapes checked, {} failed", failures.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Q8_0 blocks (f16 scale, 32 signed codes) with scales in [2^-8, 2^-6) and codes in -127..=127.
fn q8_0_blocks(n: usize, seed: u64) -> Vec<u8> {
    let r = random_vec(2 * n * 33, seed);
    let mut out = Vec::with_capacity(n * 34);
    for b in 0..n {
        let d = half::f16::from_f32((1.0 + r[b * 66].abs()) / 256.0);
        out.extend_from_slice(&d.to_le_bytes());
        for i in 0..32 {
            out.push(((r[b * 66 + 1 + i] * 127.0).round() as i8) as u8);
        }
    }
    out
}

/// A 16-value segment's limbs, as rows_split.wgsl's `limbs` makes them.
fn limbs(x: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let m = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    // The exponent of `limb_exp`: m < 2^e, at least -100 (so -100 for m = 0).
    let e = (((m.to_bits() >> 23) & 0xff) as i32 - 126).max(-100);
    let scale = |v: f32, n: i32| v * 2f32.powi(n);
    let xh: Vec<f32> = x
        .iter()
        .map(|v| scale(scale(*v, 11 - e).round_ties_even(), e - 11))
        .collect();
    let xl = x
        .iter()
        .zip(&xh)
        .map(|(v, h)| scale(scale(v - h, 22 - e).round_ties_even(), e - 22))
        .collect();
    (xh, xl)
}

/// Σ codes x limb, in index order with fma (exact: integer codes times one limb's grid).
fn seg_sum(codes: &[f32], x: &[f32]) -> f32 {
    codes.iter().zip(x).fold(0f32, |s, (c, v)| c.mul_add(*v, s))
}

/// The limb arithmetic of one Q8_0 row against one vector, from its definition.
fn q8_0_limb_dot(block_bytes: &[u8], x: &[f32]) -> f32 {
    let mut acc = 0f32;
    for (t, block) in block_bytes.chunks(34).enumerate() {
        let d = half::f16::from_le_bytes([block[0], block[1]]).to_f32();
        let codes: Vec<f32> = block[2..34].iter().map(|b| *b as i8 as f32).collect();
        let (ah, al) = limbs(&x[32 * t..32 * t + 16]);
        let (bh, bl) = limbs(&x[32 * t + 16..32 * t + 32]);
        let sa = seg_sum(&codes[..16], &ah) + seg_sum(&codes[..16], &al);
        let sb = seg_sum(&codes[16..], &bh) + seg_sum(&codes[16..], &bl);
        // One scale for both segments: s * (Σa + Σb) (rows_split.wgsl's task_dot_limb).
        acc += d * (sa + sb);
    }
    acc
}

/// The limb arithmetic on the GPU equals its CPU twin bit for bit (Q8_0, decode and wide tiles),
/// with x values spread over 2^-40 .. 2^8 so that segments get very different exponents.
#[test]
fn limb_arithmetic_equals_its_cpu_twin() {
    let Some(ctx) = limb_context() else { return };
    let mut failures = Vec::new();
    for (rows, row_len, items) in [(7, 32, 1), (5, 96, 3), (9, 2560, 1), (37, 640, 21)] {
        let blocks = q8_0_blocks(rows * row_len / 32, row_len as u64);
        let stride = row_len.next_multiple_of(4);
        let r = random_vec(items * stride, 77 + row_len as u64);
        let x: Vec<f32> = r
            .iter()
            .enumerate()
            .map(|(i, v)| v * 2f32.powi(((i / 16) % 49) as i32 - 40))
            .collect();
        let w = GpuWeight::upload(&ctx, "q8_0", GgmlType::Q8_0, row_len, rows, 1, &blocks)
            .expect("upload");
        let xb = GpuBuf::from_f32(&ctx, "x", &x).expect("x");
        let y = GpuBuf::zeros(&ctx, "y", items * rows).expect("y");
        let mut rec = Recorder::new();
        kernels::matvec(
            &ctx,
            &mut rec,
            &w,
            View::new(&xb, 0, stride),
            View::new(&y, 0, rows),
            items,
        )
        .expect("matvec");
        rec.run(&ctx).expect("run");
        let got = y.read_f32(&ctx, 0, items * rows).expect("read");
        for i in 0..items {
            for row in 0..rows {
                let want = q8_0_limb_dot(
                    &blocks[row * row_len / 32 * 34..(row + 1) * row_len / 32 * 34],
                    &x[i * stride..i * stride + row_len],
                );
                let g = got[i * rows + row];
                if g.to_bits() != want.to_bits() {
                    failures.push(format!(
                        "{rows}x{row_len} x{items}: vector {i} row {row}: GPU {g:e}, twin {want:e}"
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The integer-digit kernel experiment (docs/int-arith.md, `bench --synthetic matvec --arith
/// int`, `STRATA_ARITH=int`) for every type it covers: the same tolerance against the f64 dot (x
/// keeps 22 bits per task, more than the f32 sums' own error), and tiles of several vectors, wide
/// tiles included, give each vector's bits. Shapes from one block to rows that several subgroups
/// share.
#[test]
fn integer_digit_experiment_shapes() {
    let Some(ctx) = context() else { return };
    ctx.set_idot(true);
    let mut failures = Vec::new();
    let mut checked = 0;
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q6_K,
        GgmlType::IQ3_S,
        GgmlType::IQ3_XXS,
        GgmlType::IQ2_S,
        GgmlType::IQ2_XS,
        GgmlType::IQ4_NL,
        GgmlType::IQ4_XS,
        GgmlType::IQ1_S,
        GgmlType::IQ1_M,
        GgmlType::Q2_0,
    ] {
        assert!(strata::gpu::shaders::idot_supported(ty), "{}", ty.name());
        let block = ty.block_size().max(32);
        // 21 and 40 vectors take the wide tiles.
        for (blocks, rows, items) in [
            (1, 1, 1),
            (2, 3, 5),
            (3, 7, 2),
            (5, 2, 3),
            (40, 3, 2),
            (3, 9, 21),
            (2, 5, 40),
        ] {
            if let Err(e) = check_shape(&ctx, ty, rows, blocks * block, items) {
                failures.push(e);
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 77);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
