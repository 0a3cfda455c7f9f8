//! The mat-vec's fused stores against the plain one. The MoE block finished in the store of the
//! shared expert's down projection (`Store::MoeCombine`) against the separate form (`Store::Rows`
//! into a buffer, then `ops::moe_combine_hc`): the residual must come out with the same bits, for
//! block and split layouts, widths that are not multiples of the row groups, token counts that fill
//! tiles and leave remainders, SwiGLU inputs, a weight split over several parts, and rows long
//! enough to be split over subgroups. `Store::Segments` and `Store::Combine` likewise against
//! `Store::Rows` (and `ops::hc_combine`). `.ci/run` repeats this file at subgroup sizes 4, 8 and 16.

mod common;

use common::{gpu_context as context, random_vec};

use strata::gguf::types::GgmlType;
use strata::gpu::GpuContext;
use strata::gpu::buffers::{GpuBuf, GpuWeight};
use strata::gpu::kernels::{self, Recorder, SegFusion, Store, View, XForm};
use strata::gpu::ops;

struct Case {
    ty: GgmlType,
    /// Output width h (rows of the shared down projection).
    h: usize,
    /// Shared expert width (columns; the SwiGLU input holds twice as many).
    ff: usize,
    tokens: usize,
    /// Largest weight part, to split the rows over several parts.
    part_rows: Option<usize>,
}

fn run_case(ctx: &GpuContext, case: &Case) {
    let Case {
        ty,
        h,
        ff,
        tokens,
        part_rows,
    } = *case;
    let (k, hc) = (3usize, 4usize);
    let blocks = strata::quant::random_blocks(ty, h * ff / ty.block_size(), 17 + h as u64);
    let row_bytes = ff / ty.block_size() * ty.type_size();
    let w = GpuWeight::upload_with_limit(
        ctx,
        "shared down",
        ty,
        ff,
        h,
        1,
        &blocks,
        part_rows.map(|r| r * row_bytes),
    )
    .expect("upload");
    if part_rows.is_some() {
        assert!(w.parts.len() > 1, "{ty:?}: rows in several parts");
    }
    assert!(
        kernels::can_moe_combine(ctx, &w),
        "lavapipe binds enough buffers"
    );
    let gu = GpuBuf::from_f32(ctx, "gate|up", &random_vec(tokens * 2 * ff, 3)).expect("gu");
    let routed = GpuBuf::from_f32(ctx, "routed", &random_vec(tokens * k * h, 4)).expect("r");
    let weights = GpuBuf::from_f32(ctx, "weights", &random_vec(tokens * k, 5)).expect("w");
    let logit = GpuBuf::from_f32(ctx, "logit", &random_vec(tokens, 6)).expect("l");
    let inject = GpuBuf::from_f32(ctx, "inject", &random_vec(tokens * hc, 7)).expect("i");
    let residual = random_vec(tokens * hc * h, 8);
    let x = View::new(&gu, 0, 2 * ff);

    // Separate: the shared down rows into a buffer, then the combine kernel.
    let wide_a = GpuBuf::from_f32(ctx, "wide a", &residual).expect("wide");
    let shared = GpuBuf::zeros(ctx, "shared", tokens * h).expect("shared");
    let mut rec = Recorder::new();
    let swiglu = kernels::prepare_x(ctx, &mut rec, &w, x, XForm::Swiglu { half: ff }, tokens)
        .expect("prepare");
    let rows = Store::Rows(View::new(&shared, 0, h));
    kernels::matvec_with(ctx, &mut rec, &w, x, swiglu, rows, tokens).expect("rows");
    ops::moe_combine_hc(
        ctx,
        &mut rec,
        &routed,
        &weights,
        Some((&shared, &logit)),
        &wide_a,
        &inject,
        h,
        hc,
        k,
        tokens,
    )
    .expect("combine");
    rec.run(ctx).expect("separate run");

    // Fused: the same rows finishing the block in their store. A fresh SwiGLU input, since
    // prepare_x may transform it in place.
    let gu_b = GpuBuf::from_f32(ctx, "gate|up b", &random_vec(tokens * 2 * ff, 3)).expect("gu");
    let xb = View::new(&gu_b, 0, 2 * ff);
    let wide_b = GpuBuf::from_f32(ctx, "wide b", &residual).expect("wide");
    let mut rec = Recorder::new();
    let swiglu = kernels::prepare_x(ctx, &mut rec, &w, xb, XForm::Swiglu { half: ff }, tokens)
        .expect("prepare");
    let store = Store::MoeCombine {
        wide: &wide_b,
        inject: &inject,
        routed: &routed,
        weights: &weights,
        logit: &logit,
        h,
        hc,
        k,
    };
    kernels::matvec_with(ctx, &mut rec, &w, xb, swiglu, store, tokens).expect("fused");
    rec.run(ctx).expect("fused run");

    let a = wide_a.read_f32(ctx, 0, tokens * hc * h).expect("a");
    let b = wide_b.read_f32(ctx, 0, tokens * hc * h).expect("b");
    let changed = a
        .iter()
        .zip(&residual)
        .filter(|(x, r)| x.to_bits() != r.to_bits())
        .count();
    assert!(
        changed > a.len() / 2,
        "{ty:?}: the combine changed the residual"
    );
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert_eq!(
            x.to_bits(),
            y.to_bits(),
            "{ty:?} h {h} ff {ff} tokens {tokens}: residual value {i}: separate {x}, fused {y}"
        );
    }
}

#[test]
fn fused_moe_combine_matches_the_separate_kernels_bit_for_bit() {
    let Some(ctx) = context() else { return };
    let cases = [
        // Decode (one token) and prefill tiles with a remainder, split layouts.
        (GgmlType::Q8_0, 40, 64, 1, None),
        (GgmlType::Q8_0, 37, 96, 7, None),
        (GgmlType::Q6_K, 33, 256, 5, Some(8)),
        (GgmlType::IQ4_NL, 19, 64, 9, None),
        // Wide prefill tiles (8 or 16 tokens), then tiles of 4 and a remainder.
        (GgmlType::Q6_K, 33, 256, 29, Some(8)),
        (GgmlType::IQ3_S, 24, 256, 4, None),
        // Block layout and float rows of any length.
        (GgmlType::Q4_K, 21, 256, 6, None),
        (GgmlType::F32, 17, 24, 3, Some(5)),
        // Long rows, which 2 and 4 subgroups share (the K split), decode and prefill.
        (GgmlType::Q6_K, 40, 17 * 256, 1, None),
        (GgmlType::Q8_0, 37, 8192, 5, None),
        (GgmlType::Q8_0, 37, 8192, 21, None),
    ];
    for (ty, h, ff, tokens, part_rows) in cases {
        run_case(
            &ctx,
            &Case {
                ty,
                h,
                ff,
                tokens,
                part_rows,
            },
        );
    }
}

/// The other two stores against `Store::Rows`, on rows long enough that 2 or 4 subgroups share
/// each (the K split) and on short ones: `Store::Segments` (a concatenated weight written to three
/// outputs) must give the rows' bits, and `Store::Combine` the bits of the rows followed by
/// `ops::hc_combine`.
#[test]
fn segment_and_combine_stores_match_rows_bit_for_bit() {
    let Some(ctx) = context() else { return };
    for (ty, h, row_len, tokens) in [
        (GgmlType::Q6_K, 40, 17 * 256, 1),
        (GgmlType::Q8_0, 37, 8192, 5),
        (GgmlType::Q8_0, 37, 8192, 21),
        (GgmlType::IQ4_NL, 29, 96, 6),
        (GgmlType::IQ4_NL, 29, 96, 21),
    ] {
        stores_case(&ctx, ty, h, row_len, tokens);
    }
}

fn stores_case(ctx: &GpuContext, ty: GgmlType, h: usize, row_len: usize, tokens: usize) {
    let hc = 4;
    let what = format!("{ty:?} {h}x{row_len} tokens {tokens}");
    let blocks = strata::quant::random_blocks(ty, h * row_len / ty.block_size(), 5 + h as u64);
    let w = GpuWeight::upload(ctx, "w", ty, row_len, h, 1, &blocks).expect("upload");
    let x = GpuBuf::from_f32(ctx, "x", &random_vec(tokens * row_len, 9)).expect("x");
    let xv = View::new(&x, 0, row_len);
    let rows = GpuBuf::zeros(ctx, "rows", tokens * h).expect("rows");
    let inject = GpuBuf::from_f32(ctx, "inject", &random_vec(tokens * hc, 10)).expect("inject");
    let residual = random_vec(tokens * hc * h, 11);
    let wide_a = GpuBuf::from_f32(ctx, "wide a", &residual).expect("wide a");
    let wide_b = GpuBuf::from_f32(ctx, "wide b", &residual).expect("wide b");
    let first = [0, h / 3, h / 2];
    let lens = [first[1], first[2] - first[1], h - first[2]];
    let segs: Vec<GpuBuf> = lens
        .iter()
        .map(|&n| GpuBuf::zeros(ctx, "segment", tokens * n).expect("segment"))
        .collect();
    let mut rec = Recorder::new();
    let plain = Store::Rows(View::new(&rows, 0, h));
    kernels::matvec_with(ctx, &mut rec, &w, xv, XForm::Plain, plain, tokens).expect("rows");
    ops::hc_combine(ctx, &mut rec, &wide_a, &rows, &inject, h, hc, tokens).expect("hc combine");
    let outs = [
        View::new(&segs[0], 0, lens[0]),
        View::new(&segs[1], 0, lens[1]),
        View::new(&segs[2], 0, lens[2]),
    ];
    let segments = Store::Segments {
        outs,
        first,
        silu0: None,
        fused: SegFusion::None,
    };
    kernels::matvec_with(ctx, &mut rec, &w, xv, XForm::Plain, segments, tokens).expect("segs");
    // The same with output 0 stored through the scaled SiLU.
    let silu_seg = GpuBuf::zeros(ctx, "silu segment", tokens * lens[0]).expect("segment");
    let scale = 0.25f32;
    let silu_store = Store::Segments {
        outs: [View::new(&silu_seg, 0, lens[0]), outs[1], outs[2]],
        first,
        silu0: Some(scale),
        fused: SegFusion::None,
    };
    kernels::matvec_with(ctx, &mut rec, &w, xv, XForm::Plain, silu_store, tokens)
        .expect("silu segs");
    let combine = Store::Combine {
        wide: &wide_b,
        inject: &inject,
        h,
        hc,
    };
    kernels::matvec_with(ctx, &mut rec, &w, xv, XForm::Plain, combine, tokens).expect("combine");
    rec.run(ctx).expect("run");

    let want = rows.read_f32(ctx, 0, tokens * h).expect("rows");
    for (s, (seg, &n)) in segs.iter().zip(&lens).enumerate() {
        let got = seg.read_f32(ctx, 0, tokens * n).expect("segment");
        for t in 0..tokens {
            for r in 0..n {
                let (g, wv) = (got[t * n + r], want[t * h + first[s] + r]);
                assert_eq!(g.to_bits(), wv.to_bits(), "{what}: segment {s} row {r}");
            }
        }
    }
    let got = silu_seg
        .read_f32(ctx, 0, tokens * lens[0])
        .expect("silu segment");
    for t in 0..tokens {
        for r in 0..lens[0] {
            let v = want[t * h + r] * scale;
            let silu = v / (1.0 + (-v).exp());
            let g = got[t * lens[0] + r];
            assert!(
                (g - silu).abs() <= 1e-6 * silu.abs().max(1.0),
                "{what}: SiLU segment row {r}: {g} vs {silu}"
            );
        }
    }
    let a = wide_a.read_f32(ctx, 0, tokens * hc * h).expect("a");
    let b = wide_b.read_f32(ctx, 0, tokens * hc * h).expect("b");
    assert!(
        a.iter()
            .zip(&residual)
            .any(|(x, r)| x.to_bits() != r.to_bits()),
        "{what}: the combine changed the residual"
    );
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert_eq!(x.to_bits(), y.to_bits(), "{what}: residual value {i}");
    }
}

/// The input norm on load (`Store::Segments` with an `InputNorm`, the hyper-connection mix's down
/// projection): the normed vectors it stores must match the grouped RMS norm computed on the CPU,
/// its rows must equal a plain mat-vec over those stored vectors bit for bit, and a batch of
/// vectors (tiles and a remainder) must give the bits of the vectors fed one at a time. The real
/// shape (4 groups of 2,560, rows split over subgroups), a weight period of one group, 1 to 4
/// groups, widths that are no multiple of the row groups, and batches wide enough for prefill's
/// wide tiles.
#[test]
fn input_norm_rows_equal_a_matvec_over_the_normed_vectors() {
    let Some(ctx) = context() else { return };
    for (ty, group, groups, whole_period, rows, tokens) in [
        (GgmlType::Q6_K, 2560, 4, true, 37, 6),
        (GgmlType::Q6_K, 2560, 4, true, 37, 17),
        (GgmlType::Q8_0, 48, 4, false, 29, 5),
        (GgmlType::IQ4_NL, 80, 2, true, 21, 4),
        (GgmlType::IQ3_S, 256, 3, false, 11, 3),
        // Batches as wide as prefill's wide tiles (the normed input keeps tiles of 4).
        (GgmlType::Q8_0, 48, 4, false, 29, 21),
        (GgmlType::IQ4_NL, 80, 2, true, 21, 13),
        (GgmlType::Q6_K, 256, 1, true, 9, 1),
    ] {
        let period = if whole_period { group * groups } else { group };
        input_norm_case(&ctx, ty, (group, groups, period), rows, tokens);
    }
}

struct NormCase<'a> {
    weight: &'a GpuBuf,
    shape: (usize, usize, usize),
    eps: f32,
    first: [usize; 3],
    lens: [usize; 2],
}

impl<'a> NormCase<'a> {
    /// The normed segmented store of vector `t` onwards into `outs` (segment 0, segment 1,
    /// normed vectors).
    fn store(&self, outs: [&'a GpuBuf; 3], t: usize) -> Store<'a> {
        let (group, groups, period) = self.shape;
        let [l0, l1] = self.lens;
        let v0 = View::new(outs[0], t * l0, l0);
        Store::Segments {
            outs: [v0, View::new(outs[1], t * l1, l1), v0],
            first: self.first,
            silu0: None,
            fused: SegFusion::Norm(kernels::InputNorm {
                weight: self.weight,
                period,
                group,
                groups,
                eps: self.eps,
                normed: View::new(outs[2], t * group * groups, group * groups),
            }),
        }
    }
}

fn input_norm_case(
    ctx: &GpuContext,
    ty: GgmlType,
    (group, groups, period): (usize, usize, usize),
    h: usize,
    tokens: usize,
) {
    let row_len = group * groups;
    let what = format!("{ty:?} {h}x{row_len} ({groups} groups, period {period}), {tokens} tokens");
    let blocks = strata::quant::random_blocks(ty, h * row_len / ty.block_size(), 3 + h as u64);
    let w = GpuWeight::upload(ctx, "w", ty, row_len, h, 1, &blocks).expect("upload");
    assert!(kernels::can_norm_input(&w, group, period), "{what}");
    // Groups of different scales, so a wrong group's norm shows.
    let mut xs = random_vec(tokens * row_len, 21);
    for (i, v) in xs.iter_mut().enumerate() {
        *v *= 1.0 + ((i % row_len) / group) as f32 * 3.0;
    }
    let nw: Vec<f32> = random_vec(period, 22).iter().map(|v| 1.0 + v).collect();
    let x = GpuBuf::from_f32(ctx, "x", &xs).expect("x");
    let weight = GpuBuf::from_f32(ctx, "norm weight", &nw).expect("nw");
    let first = [0, h / 2, h];
    let lens = [first[1], h - first[1]];
    let zeros = |n: usize| GpuBuf::zeros(ctx, "out", n).expect("out");
    let (seg0, seg1, normed) = (
        zeros(tokens * lens[0]),
        zeros(tokens * lens[1]),
        zeros(tokens * row_len),
    );
    let (one0, one1, one_normed) = (
        zeros(tokens * lens[0]),
        zeros(tokens * lens[1]),
        zeros(tokens * row_len),
    );
    let rows = zeros(tokens * h);
    let eps = 1e-6f32;
    let spec = NormCase {
        weight: &weight,
        shape: (group, groups, period),
        eps,
        first,
        lens,
    };
    let mut rec = Recorder::new();
    let xv = View::new(&x, 0, row_len);
    kernels::matvec_with(
        ctx,
        &mut rec,
        &w,
        xv,
        XForm::Plain,
        spec.store([&seg0, &seg1, &normed], 0),
        tokens,
    )
    .expect("normed segments");
    for t in 0..tokens {
        let xt = View::new(&x, t * row_len, row_len);
        let one = spec.store([&one0, &one1, &one_normed], t);
        kernels::matvec_with(ctx, &mut rec, &w, xt, XForm::Plain, one, 1).expect("one vector");
    }
    rec.run(ctx).expect("run");
    let mut rec = Recorder::new();
    let plain = Store::Rows(View::new(&rows, 0, h));
    kernels::matvec_with(
        ctx,
        &mut rec,
        &w,
        View::new(&normed, 0, row_len),
        XForm::Plain,
        plain,
        tokens,
    )
    .expect("plain rows");
    rec.run(ctx).expect("run");

    let got_normed = normed.read_f32(ctx, 0, tokens * row_len).expect("normed");
    for t in 0..tokens {
        for g in 0..groups {
            let at = t * row_len + g * group;
            let vals = &xs[at..at + group];
            let mean = vals
                .iter()
                .map(|&v| f64::from(v) * f64::from(v))
                .sum::<f64>()
                / group as f64;
            let inv = 1.0 / (mean + f64::from(eps)).sqrt();
            for i in 0..group {
                let want = f64::from(vals[i]) * inv * f64::from(nw[(g * group + i) % period]);
                let got = f64::from(got_normed[at + i]);
                assert!(
                    (got - want).abs() <= 1e-5 * want.abs().max(1.0),
                    "{what}: normed value {} of token {t}: {got} vs {want}",
                    g * group + i
                );
            }
        }
    }
    let want = rows.read_f32(ctx, 0, tokens * h).expect("rows");
    let bufs = [(&seg0, &one0), (&seg1, &one1)];
    for (s, (batch, single)) in bufs.iter().enumerate() {
        let n = lens[s];
        let got = batch.read_f32(ctx, 0, tokens * n).expect("segment");
        let one = single.read_f32(ctx, 0, tokens * n).expect("single");
        for t in 0..tokens {
            for r in 0..n {
                let wv = want[t * h + first[s] + r];
                let (g, o) = (got[t * n + r], one[t * n + r]);
                assert_eq!(
                    g.to_bits(),
                    wv.to_bits(),
                    "{what}: segment {s} row {r} token {t}"
                );
                assert_eq!(
                    o.to_bits(),
                    g.to_bits(),
                    "{what}: token {t} alone, segment {s} row {r}"
                );
            }
        }
    }
    let one = one_normed
        .read_f32(ctx, 0, tokens * row_len)
        .expect("normed alone");
    for (i, (a, b)) in got_normed.iter().zip(&one).enumerate() {
        assert_eq!(a.to_bits(), b.to_bits(), "{what}: normed value {i} alone");
    }
}

/// The routed experts' down projections finishing the MoE block in one dispatch
/// (`matvec_expert_combine`, the shared expert's down rows computed beforehand) against the
/// expert kernel into a buffer followed by the shared down projection with the combine in its
/// store: the residual must come out with the same bits. Split and block layouts, an odd width,
/// one token (decode) and several, 3 and 10 slots.
#[test]
fn expert_combine_matches_the_combine_store_bit_for_bit() {
    let Some(ctx) = context() else { return };
    for (ty, h, ff, tokens, k) in [
        (GgmlType::IQ4_NL, 37, 64, 1, 10),
        (GgmlType::Q8_0, 40, 96, 3, 3),
        (GgmlType::IQ3_S, 19, 256, 2, 10),
        (GgmlType::Q4_K, 21, 256, 1, 3),
    ] {
        expert_combine_case(&ctx, ty, (h, ff), tokens, k);
    }
}

fn expert_combine_case(
    ctx: &GpuContext,
    ty: GgmlType,
    (h, ff): (usize, usize),
    tokens: usize,
    k: usize,
) {
    let (n_expert, hc) = (12usize, 4usize);
    let what = format!("{ty:?} {h}x{ff}, {tokens} tokens, {k} slots");
    let blocks =
        strata::quant::random_blocks(ty, n_expert * h * ff / ty.block_size(), 31 + h as u64);
    let down = GpuWeight::upload(ctx, "down", ty, ff, n_expert * h, h, &blocks).expect("down");
    let sty = GgmlType::Q8_0;
    let sblocks = strata::quant::random_blocks(sty, h * ff / sty.block_size(), 32);
    let shared_w = GpuWeight::upload(ctx, "shared down", sty, ff, h, 1, &sblocks).expect("shared");
    assert!(kernels::can_expert_combine(ctx, &down, k), "{what}");
    let items = tokens * k;
    let ids: Vec<u32> = (0..items)
        .map(|i| ((i * 7 + 3) % n_expert) as u32)
        .collect();
    let ids = GpuBuf::from_u32(ctx, "ids", &ids).expect("ids");
    let gu = GpuBuf::from_f32(ctx, "expert gu", &random_vec(items * 2 * ff, 41)).expect("gu");
    let x = View::new(&gu, 0, 2 * ff);
    let sgu = random_vec(tokens * 2 * ff, 42);
    let weights = GpuBuf::from_f32(ctx, "weights", &random_vec(items, 43)).expect("w");
    let logit = GpuBuf::from_f32(ctx, "logit", &random_vec(tokens, 44)).expect("l");
    let inject = GpuBuf::from_f32(ctx, "inject", &random_vec(tokens * hc, 45)).expect("i");
    let residual = random_vec(tokens * hc * h, 46);
    let swiglu = XForm::Swiglu { half: ff };

    // Separate: the experts into a buffer, then the shared down rows with the combine in store.
    let routed = GpuBuf::zeros(ctx, "routed", items * h).expect("routed");
    let wide_a = GpuBuf::from_f32(ctx, "wide a", &residual).expect("wide a");
    let sgu_a = GpuBuf::from_f32(ctx, "shared gu a", &sgu).expect("sgu");
    let mut rec = Recorder::new();
    let y = View::new(&routed, 0, h);
    kernels::matvec_expert_with(
        ctx,
        &mut rec,
        &down,
        &ids,
        k,
        true,
        x,
        XForm::Plain,
        y,
        items,
    )
    .expect("experts");
    let sx = View::new(&sgu_a, 0, 2 * ff);
    let sform = kernels::prepare_x(ctx, &mut rec, &shared_w, sx, swiglu, tokens).expect("prep");
    let store = Store::MoeCombine {
        wide: &wide_a,
        inject: &inject,
        routed: &routed,
        weights: &weights,
        logit: &logit,
        h,
        hc,
        k,
    };
    kernels::matvec_with(ctx, &mut rec, &shared_w, sx, sform, store, tokens).expect("store");
    rec.run(ctx).expect("separate");

    // Fused: the shared rows into a buffer, then the experts finishing the block.
    let shared = GpuBuf::zeros(ctx, "shared rows", tokens * h).expect("shared rows");
    let wide_b = GpuBuf::from_f32(ctx, "wide b", &residual).expect("wide b");
    let sgu_b = GpuBuf::from_f32(ctx, "shared gu b", &sgu).expect("sgu");
    let mut rec = Recorder::new();
    let sx = View::new(&sgu_b, 0, 2 * ff);
    let sform = kernels::prepare_x(ctx, &mut rec, &shared_w, sx, swiglu, tokens).expect("prep");
    let rows = Store::Rows(View::new(&shared, 0, h));
    kernels::matvec_with(ctx, &mut rec, &shared_w, sx, sform, rows, tokens).expect("rows");
    let combine = kernels::ExpertCombine {
        ids: &ids,
        slots: k,
        x,
        shared: &shared,
        weights: &weights,
        logit: &logit,
        wide: &wide_b,
        inject: &inject,
        hc,
    };
    kernels::matvec_expert_combine(ctx, &mut rec, &down, combine, tokens).expect("combine");
    rec.run(ctx).expect("fused");

    let a = wide_a.read_f32(ctx, 0, tokens * hc * h).expect("a");
    let b = wide_b.read_f32(ctx, 0, tokens * hc * h).expect("b");
    let changed = a
        .iter()
        .zip(&residual)
        .filter(|(x, r)| x.to_bits() != r.to_bits())
        .count();
    assert!(
        changed > a.len() / 2,
        "{what}: the combine changed the residual"
    );
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert_eq!(
            x.to_bits(),
            y.to_bits(),
            "{what}: residual value {i}: {x} vs {y}"
        );
    }
}

/// Decode's GDN conv in the input projection's store (`SegFusion::Conv`) against the plain
/// segmented mat-vec followed by `ops::gdn_conv`: the conv outputs, the advanced history and the
/// other segments must come out with the same bits. Split, block and float layouts; channel
/// counts that are no multiple of the row groups; rows split over subgroups.
#[test]
fn conv_store_matches_the_conv_kernel_bit_for_bit() {
    let Some(ctx) = context() else { return };
    for (ty, channels, others, row_len) in [
        (GgmlType::Q6_K, 37, [11, 6], 512),
        (GgmlType::Q8_0, 64, [5, 4], 8192),
        (GgmlType::Q4_K, 21, [9, 2], 256),
        (GgmlType::F32, 19, [3, 4], 96),
    ] {
        conv_store_case(&ctx, ty, channels, others, row_len);
    }
}

fn conv_store_case(ctx: &GpuContext, ty: GgmlType, ch: usize, others: [usize; 2], k: usize) {
    let what = format!("{ty:?} {ch} channels, rows of {k}");
    let rows = ch + others[0] + others[1];
    let blocks = strata::quant::random_blocks(ty, rows * k / ty.block_size(), 51 + ch as u64);
    let w = GpuWeight::upload(ctx, "in", ty, k, rows, 1, &blocks).expect("upload");
    let x = GpuBuf::from_f32(ctx, "x", &random_vec(k, 52)).expect("x");
    let taps = GpuBuf::from_f32(ctx, "taps", &random_vec(4 * ch, 53)).expect("taps");
    let history = random_vec(3 * ch, 54);
    let zeros = |n: usize| GpuBuf::zeros(ctx, "out", n).expect("out");
    let first = [0, ch, ch + others[0]];
    let shape = ops::GdnShape {
        channels: ch,
        kernel: 4,
        n_k_heads: 1,
        n_v_heads: 1,
        dk: 1,
        dv: 1,
    };
    let xv = View::new(&x, 0, k);

    let (mixed, conv_a, z_a, ba_a) = (zeros(ch), zeros(ch), zeros(others[0]), zeros(others[1]));
    let hist_a = GpuBuf::from_f32(ctx, "history a", &history).expect("history");
    let mut rec = Recorder::new();
    let plain = Store::Segments {
        outs: [
            View::new(&mixed, 0, ch),
            View::new(&z_a, 0, others[0]),
            View::new(&ba_a, 0, others[1]),
        ],
        first,
        silu0: None,
        fused: SegFusion::None,
    };
    kernels::matvec_with(ctx, &mut rec, &w, xv, XForm::Plain, plain, 1).expect("segments");
    ops::gdn_conv(ctx, &mut rec, &shape, &mixed, &taps, &hist_a, &conv_a, 1).expect("conv");
    rec.run(ctx).expect("separate");

    let (conv_b, z_b, ba_b) = (zeros(ch), zeros(others[0]), zeros(others[1]));
    let hist_b = GpuBuf::from_f32(ctx, "history b", &history).expect("history");
    let mut rec = Recorder::new();
    let fused = Store::Segments {
        outs: [
            View::new(&conv_b, 0, ch),
            View::new(&z_b, 0, others[0]),
            View::new(&ba_b, 0, others[1]),
        ],
        first,
        silu0: None,
        fused: SegFusion::Conv(kernels::ConvStore {
            history: &hist_b,
            weight: &taps,
        }),
    };
    kernels::matvec_with(ctx, &mut rec, &w, xv, XForm::Plain, fused, 1).expect("conv store");
    rec.run(ctx).expect("fused");

    let pairs = [
        ("conv output", &conv_a, &conv_b, ch),
        ("history", &hist_a, &hist_b, 3 * ch),
        ("segment 1", &z_a, &z_b, others[0]),
        ("segment 2", &ba_a, &ba_b, others[1]),
    ];
    for (name, a, b, n) in pairs {
        let a = a.read_f32(ctx, 0, n).expect("a");
        let b = b.read_f32(ctx, 0, n).expect("b");
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            assert_eq!(
                x.to_bits(),
                y.to_bits(),
                "{what}: {name} value {i}: {x} vs {y}"
            );
        }
    }
    let advanced = hist_b.read_f32(ctx, 0, 3 * ch).expect("history");
    assert_ne!(advanced, history, "{what}: the history moved");
}
