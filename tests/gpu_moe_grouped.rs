//! Prefill's routed experts grouped by expert (`moe_group` + `matvec_group`) against the per-item
//! kernel that decode uses (`matvec_expert`): the grouping must match a CPU grouping exactly, and
//! every (item, row) must have the same bits as the per-item kernel, whatever the tile it lands
//! in. Odd expert heights, experts split over several weight parts, experts with no item, one
//! item, or more items than a tile holds, split and block layouts and float rows of any length.
//! `.ci/run` repeats this file at subgroup sizes 4, 8 and 16.

mod common;

use common::gpu::download;
use common::{bits, gpu_context as context, random_vec, xorshift};

use strata::gguf::types::GgmlType;
use strata::gpu::GpuContext;
use strata::gpu::buffers::{GpuBuf, GpuWeight};
use strata::gpu::kernels::{self, Recorder, View, XForm};
use strata::gpu::ops;

/// `k` distinct experts per token out of `n_expert`, expert 0 never chosen (an expert with no
/// work) and expert 1 chosen by every token (more items than a tile).
fn routing(tokens: usize, k: usize, n_expert: usize, seed: u64) -> Vec<u32> {
    let mut s = seed | 1;
    let mut ids = Vec::with_capacity(tokens * k);
    for _ in 0..tokens {
        let mut chosen = vec![1u32];
        while chosen.len() < k {
            let e = 2 + (xorshift(&mut s) % (n_expert as u64 - 2)) as u32;
            if !chosen.contains(&e) {
                chosen.push(e);
            }
        }
        // Expert 1 in a varying slot.
        let at = (xorshift(&mut s) % k as u64) as usize;
        chosen.swap(0, at);
        ids.extend(chosen);
    }
    ids
}

/// `moe_split_ids` against its CPU twin: each item goes to the hot unit its expert maps to, or
/// to the host tensor, never both (an out-of-range id to neither); an item for the host tensor
/// gets its own unit of the decode stage (its index), the others none; the log holds the choices
/// at its offset; nothing past the items is written.
#[test]
fn moe_split_ids_sends_each_item_to_one_source() {
    let Some(ctx) = context() else { return };
    const NONE: u32 = u32::MAX;
    for (items, n_expert, layers) in [(1, 4, 1), (10, 16, 3), (130, 40, 2), (333, 512, 2)] {
        let mut s = 99 + items as u64;
        let mut ids: Vec<u32> = (0..items)
            .map(|_| (xorshift(&mut s) % n_expert as u64) as u32)
            .collect();
        ids[0] = n_expert as u32 + 5; // out of range: from nowhere
        let map: Vec<u32> = (0..layers * n_expert)
            .map(|i| {
                if xorshift(&mut s).is_multiple_of(3) {
                    (i % 7) as u32
                } else {
                    NONE
                }
            })
            .collect();
        let layer = layers - 1;
        let idb = GpuBuf::from_u32(&ctx, "ids", &ids).expect("ids");
        let mapb = GpuBuf::from_u32(&ctx, "map", &map).expect("map");
        let sentinel = vec![7u32; items + 3];
        let hot = GpuBuf::from_u32(&ctx, "hot", &sentinel).expect("hot");
        let cold = GpuBuf::from_u32(&ctx, "cold", &sentinel).expect("cold");
        let stage = GpuBuf::from_u32(&ctx, "stage", &sentinel).expect("stage");
        let log = GpuBuf::from_u32(&ctx, "log", &vec![7u32; 2 * items + 3]).expect("log");
        let mut rec = Recorder::new();
        ops::moe_split_ids(
            &ctx,
            &mut rec,
            &idb,
            (&mapb, layer * n_expert),
            n_expert,
            (&hot, &cold, &stage),
            (&log, items),
            items,
        )
        .expect("split");
        rec.run(&ctx).expect("run");
        let got_hot = hot.read_u32(&ctx, 0, items + 3).expect("read hot");
        let got_cold = cold.read_u32(&ctx, 0, items + 3).expect("read cold");
        let got_stage = stage.read_u32(&ctx, 0, items + 3).expect("read stage");
        for i in 0..items {
            let e = ids[i];
            let slot = if (e as usize) < n_expert {
                map[layer * n_expert + e as usize]
            } else {
                NONE
            };
            let want_cold = if slot == NONE { e } else { NONE };
            let want_stage = if slot == NONE && (e as usize) < n_expert {
                i as u32
            } else {
                NONE
            };
            assert_eq!(got_hot[i], slot, "items {items}: hot of item {i}");
            assert_eq!(got_cold[i], want_cold, "items {items}: cold of item {i}");
            assert_eq!(got_stage[i], want_stage, "items {items}: stage of item {i}");
        }
        assert_eq!(&got_hot[items..], &[7, 7, 7], "past the items");
        assert_eq!(&got_cold[items..], &[7, 7, 7], "past the items");
        assert_eq!(&got_stage[items..], &[7, 7, 7], "past the items");
        let got_log = log.read_u32(&ctx, 0, 2 * items + 3).expect("read log");
        assert!(
            got_log[..items].iter().all(|&v| v == 7),
            "before the offset"
        );
        assert_eq!(
            &got_log[items..2 * items],
            &ids[..],
            "the log holds the choices"
        );
        assert_eq!(&got_log[2 * items..], &[7, 7, 7], "past the log");
    }
}

#[test]
fn moe_group_lists_items_by_expert_in_order() {
    let Some(ctx) = context() else { return };
    for (tokens, k, n_expert) in [(1, 2, 4), (11, 3, 9), (70, 4, 16), (130, 10, 40)] {
        let ids = routing(tokens, k, n_expert, 7 + tokens as u64);
        let idb = GpuBuf::from_u32(&ctx, "ids", &ids).expect("ids");
        let groups = GpuBuf::zeros(&ctx, "groups", ops::group_len(n_expert, tokens)).expect("g");
        let mut rec = Recorder::new();
        ops::moe_group(&ctx, &mut rec, &idb, &groups, n_expert, k, tokens).expect("group");
        rec.run(&ctx).expect("run");
        let got = groups
            .read_u32(&ctx, 0, ops::group_len(n_expert, tokens))
            .expect("read");
        for e in 0..n_expert {
            let want: Vec<u32> = (0..ids.len() as u32)
                .filter(|&i| ids[i as usize] == e as u32)
                .collect();
            assert_eq!(
                got[e] as usize,
                want.len(),
                "count of expert {e} ({tokens} tokens)"
            );
            let list = n_expert + e * tokens;
            assert_eq!(
                &got[list..list + want.len()],
                &want[..],
                "items of expert {e}"
            );
        }
    }
}

struct Case {
    ty: GgmlType,
    cols: usize,
}

/// Runs the grouped and the per-item kernels on one random expert tensor; both the plain input
/// (x per token) and the SwiGLU input (x per item) forms.
/// 61 tokens of 3 experts among 9: about 20 items per expert, so the wide tiles of the split
/// layouts (16 items) run full and partial tiles, with and without whole quads missing.
fn check_case(ctx: &GpuContext, case: &Case, rows: usize) {
    let (n_expert, tokens, k) = (9usize, 61usize, 3usize);
    let Case { ty, cols } = *case;
    let blocks = strata::quant::random_blocks(ty, n_expert * rows * cols / ty.block_size(), 91);
    let row_bytes = cols / ty.block_size() * ty.type_size();
    // Four experts per part: three parts, the last one short.
    let w = GpuWeight::upload_with_limit(
        ctx,
        "experts",
        ty,
        cols,
        n_expert * rows,
        rows,
        &blocks,
        Some(4 * rows * row_bytes),
    )
    .expect("upload");
    assert!(w.parts.len() > 1, "{ty:?}: experts in several parts");
    let ids = routing(tokens, k, n_expert, 5);
    let items = tokens * k;
    let idb = GpuBuf::from_u32(ctx, "ids", &ids).expect("ids");
    let groups = GpuBuf::zeros(ctx, "groups", ops::group_len(n_expert, tokens)).expect("g");
    let mut rec = Recorder::new();
    ops::moe_group(ctx, &mut rec, &idb, &groups, n_expert, k, tokens).expect("group");
    rec.run(ctx).expect("group run");

    // Plain input, one x per token.
    let x = GpuBuf::from_f32(ctx, "x", &random_vec(tokens * cols, 92)).expect("x");
    let per_item = GpuBuf::zeros(ctx, "per item", items * rows).expect("y");
    let grouped = GpuBuf::zeros(ctx, "grouped", items * rows).expect("y");
    let xv = View::new(&x, 0, cols);
    let mut rec = Recorder::new();
    kernels::matvec_expert(
        ctx,
        &mut rec,
        &w,
        &idb,
        k,
        false,
        xv,
        View::new(&per_item, 0, rows),
        items,
    )
    .expect("per item");
    kernels::matvec_group(
        ctx,
        &mut rec,
        &w,
        &groups,
        tokens,
        k,
        false,
        xv,
        XForm::Plain,
        View::new(&grouped, 0, rows),
        items,
    )
    .expect("grouped");
    rec.run(ctx).expect("run");
    let a = download(ctx, &per_item, items * rows);
    let b = download(ctx, &grouped, items * rows);
    assert!(
        a.iter().all(|v| v.is_finite() && *v != 0.0),
        "{ty:?}: results"
    );
    assert_eq!(bits(&a), bits(&b), "{ty:?}: grouped == per item (plain)");

    // SwiGLU of a gate|up vector per item.
    let gu = GpuBuf::from_f32(ctx, "gu", &random_vec(items * 2 * cols, 93)).expect("gu");
    let gv = View::new(&gu, 0, 2 * cols);
    let swiglu = XForm::Swiglu { half: cols };
    let mut rec = Recorder::new();
    let y = |b| View::new(b, 0, rows);
    kernels::matvec_expert_with(
        ctx,
        &mut rec,
        &w,
        &idb,
        k,
        true,
        gv,
        swiglu,
        y(&per_item),
        items,
    )
    .expect("per item swiglu");
    kernels::matvec_group(
        ctx,
        &mut rec,
        &w,
        &groups,
        tokens,
        k,
        true,
        gv,
        swiglu,
        y(&grouped),
        items,
    )
    .expect("grouped swiglu");
    rec.run(ctx).expect("run");
    let a = download(ctx, &per_item, items * rows);
    let b = download(ctx, &grouped, items * rows);
    assert_eq!(bits(&a), bits(&b), "{ty:?}: grouped == per item (SwiGLU)");
}

#[test]
fn grouped_experts_equal_per_item_bits() {
    let Some(ctx) = context() else { return };
    let cases = [
        Case {
            ty: GgmlType::Q8_0,
            cols: 96,
        },
        Case {
            ty: GgmlType::IQ3_S,
            cols: 256,
        },
        Case {
            ty: GgmlType::IQ4_NL,
            cols: 64,
        },
        Case {
            ty: GgmlType::Q6_K,
            cols: 512,
        },
        Case {
            ty: GgmlType::Q4_K,
            cols: 256,
        },
        Case {
            ty: GgmlType::F32,
            cols: 64,
        },
        Case {
            ty: GgmlType::F16,
            cols: 40,
        },
    ];
    for case in &cases {
        check_case(&ctx, case, 5);
    }
}

/// Rows of more than half and at most two thirds of a subgroup's 32-value tasks: the wide tiles
/// take three row groups in two rounds (ROUNDS in quant/rows_wide.wgsl; the real expert down's
/// 640 values on 32 lanes). 160 values at subgroup size 8, 320 at 16 (CI runs both; at 4 neither
/// shape is in rounds and the test checks the plain tiles). 13 rows: groups of 4, 4, 4 and 1, so
/// the first triple is whole and the second has one short group and two past the rows.
#[test]
fn grouped_short_rows_in_rounds_equal_per_item_bits() {
    let Some(ctx) = context() else { return };
    for ty in [GgmlType::IQ4_NL, GgmlType::Q8_0] {
        for cols in [160, 320] {
            check_case(&ctx, &Case { ty, cols }, 13);
        }
    }
}

/// Rows of q S + S/2 tasks, q >= 1, in pairs (PAIRS in quant/rows_wide.wgsl; the real expert
/// gate|up's 2,560 values on 32 lanes): 192 values at subgroup size 4, 384 at 8, 768 at 16. 13
/// rows: pairs of groups of 4 and 4, then 4 and 1.
#[test]
fn grouped_rows_in_pairs_equal_per_item_bits() {
    let Some(ctx) = context() else { return };
    // Pairs are opt-in; on for this process (every other test's bits are the same either way).
    kernels::set_wide_pairs(true);
    for ty in [GgmlType::IQ4_NL, GgmlType::Q8_0] {
        for cols in [192, 384, 768] {
            check_case(&ctx, &Case { ty, cols }, 13);
        }
    }
}

/// Decode's gate|up kernel with the SwiGLU in its store (`matvec_expert_glu`) against the plain
/// per-item kernel followed by prefill's in-place SwiGLU (`prepare_x`): the same bits at rows
/// `0..half` of every item, for split, block and float layouts, experts over several parts, with
/// one and two gate|up pairs per subgroup, and an odd half (the last pair group short).
#[test]
fn glu_store_equals_swiglu_in_place_bits() {
    let Some(ctx) = context() else { return };
    for (half, pairs) in [(32, 1), (32, 2), (7, 2), (36, 2)] {
        glu_store_case(&ctx, half, pairs);
    }
}

fn glu_store_case(ctx: &GpuContext, half: usize, pairs: usize) {
    for (ty, cols) in [
        (GgmlType::IQ3_S, 256),
        (GgmlType::Q8_0, 96),
        (GgmlType::Q6_K, 512),
        (GgmlType::IQ4_NL, 64),
        (GgmlType::F16, 40),
    ] {
        let (n_expert, tokens, k) = (9usize, 4usize, 3usize);
        let rows = 2 * half;
        let blocks = strata::quant::random_blocks(ty, n_expert * rows * cols / ty.block_size(), 95);
        let row_bytes = cols / ty.block_size() * ty.type_size();
        let w = GpuWeight::upload_with_limit(
            ctx,
            "gate_up",
            ty,
            cols,
            n_expert * rows,
            rows,
            &blocks,
            Some(4 * rows * row_bytes),
        )
        .expect("upload");
        // prepare_x takes the transform's length from the weight that reads it (the down rows).
        let down = GpuWeight::upload(ctx, "down", GgmlType::F32, half, 1, 1, &vec![0u8; 4 * half])
            .expect("down");
        let ids = routing(tokens, k, n_expert, 11);
        let items = tokens * k;
        let idb = GpuBuf::from_u32(ctx, "ids", &ids).expect("ids");
        let x = GpuBuf::from_f32(ctx, "x", &random_vec(tokens * cols, 96)).expect("x");
        let xv = View::new(&x, 0, cols);
        let fused = GpuBuf::zeros(ctx, "fused", items * rows).expect("y");
        let plain = GpuBuf::zeros(ctx, "plain", items * rows).expect("y");
        let mut rec = Recorder::new();
        kernels::matvec_expert_glu_pairs(
            ctx,
            &mut rec,
            &w,
            &idb,
            k,
            xv,
            View::new(&fused, 0, rows),
            items,
            pairs,
        )
        .expect("glu");
        if half.is_multiple_of(32) {
            kernels::matvec_expert(
                ctx,
                &mut rec,
                &w,
                &idb,
                k,
                false,
                xv,
                View::new(&plain, 0, rows),
                items,
            )
            .expect("plain");
            let xf = kernels::prepare_x(
                ctx,
                &mut rec,
                &down,
                View::new(&plain, 0, rows),
                XForm::Swiglu { half },
                items,
            )
            .expect("swiglu");
            assert_eq!(xf, XForm::Plain, "{ty:?}: the SwiGLU ran in place");
        } else {
            // (The in-place SwiGLU takes whole 32-value chunks: against the one-pair kernel.)
            let y = View::new(&plain, 0, rows);
            kernels::matvec_expert_glu_pairs(ctx, &mut rec, &w, &idb, k, xv, y, items, 1)
                .expect("one pair");
        }
        rec.run(ctx).expect("run");
        let a = download(ctx, &fused, items * rows);
        let b = download(ctx, &plain, items * rows);
        for i in 0..items {
            let (fa, fb) = (&a[i * rows..i * rows + half], &b[i * rows..i * rows + half]);
            // (silu of a large negative gate is an exact 0, so some zeros are right.)
            assert!(fa.iter().all(|v| v.is_finite()), "{ty:?}: {fa:?}");
            assert!(fa.iter().any(|v| *v != 0.0), "{ty:?}: {fa:?}");
            assert_eq!(
                bits(fa),
                bits(fb),
                "{ty:?}, half {half}, {pairs} pairs: item {i}"
            );
        }
    }
}

/// `stage_units` against its CPU twin: each item whose expert lies in the part copies that
/// unit's range into its own stage unit (several workgroups per unit and a partial last one);
/// items of other parts and `u32::MAX` ids copy nothing, and nothing outside the units is
/// written.
#[test]
fn stage_units_copies_each_items_expert_range() {
    let Some(ctx) = context() else { return };
    const NONE: u32 = u32::MAX;
    for (words, units, unit_first, src_stride, base) in [
        (5usize, 3usize, 0usize, 7usize, 0usize),
        (2048, 4, 2, 2050, 3),
        (4099, 5, 1, 4099, 9),
    ] {
        let src: Vec<u32> = (0..base + units * src_stride)
            .map(|i| 0x1000_0000 + i as u32)
            .collect();
        let ids = [
            unit_first as u32 + 1,
            NONE,
            unit_first as u32 + units as u32,
            0,
            unit_first as u32 + units as u32 - 1,
        ];
        let items = ids.len();
        let dst_stride = words + 2;
        let dst_len = 1 + items * dst_stride;
        let srcb = GpuBuf::from_u32(&ctx, "src", &src).expect("src");
        let dst = GpuBuf::from_u32(&ctx, "dst", &vec![7u32; dst_len]).expect("dst");
        let idb = GpuBuf::from_u32(&ctx, "ids", &ids).expect("ids");
        let range = ops::StageRange {
            src: &srcb.buffer,
            unit_first,
            units,
            src_base: 4 * base as u64,
            src_stride: 4 * src_stride as u64,
            dst: &dst.buffer,
            dst_base: 4,
            dst_stride: 4 * dst_stride as u64,
            bytes: 4 * words as u64,
        };
        let mut rec = Recorder::new();
        ops::stage_units(&ctx, &mut rec, range, &idb, items).expect("stage");
        rec.run(&ctx).expect("run");
        let got = dst.read_u32(&ctx, 0, dst_len).expect("read");
        let mut want = vec![7u32; dst_len];
        for (i, &e) in ids.iter().enumerate() {
            let e = e as usize;
            if e < unit_first || e >= unit_first + units {
                continue;
            }
            let from = base + (e - unit_first) * src_stride;
            let to = 1 + i * dst_stride;
            want[to..to + words].copy_from_slice(&src[from..from + words]);
        }
        assert_eq!(
            got,
            want,
            "{words} words, units {unit_first}..{}",
            unit_first + units
        );
    }
}
