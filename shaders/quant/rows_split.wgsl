// Row body for the split layouts (src/gpu/layout.rs: block bodies on 16-byte boundaries, f16
// scales in a plane of their own), used by shaders/matvec.wgsl. The type's quant/<type>.wgsl
// supplies the task interface:
//   TASKS_PER_BLOCK             32-value tasks per block
//   task_x(t) -> vec2<u32>      first x index of the task's two 16-value segments (row-relative)
//   task_w(body, d, t) -> Task  the segments' integer codes as exact f32, one scale each and, for
//                               the types with mins (HAS_MIN: Q4_K, Q5_K), one min each
//
// Reduction order (fixed): lane l of a subgroup takes tasks l, l+S, l+2S, ... of its row in order.
// A task's value is fma(sb, Σb, sa * Σa), each Σ a sequential fma over its 16 codes times x in
// index order, less fma(mb, Xb, ma * Xa) with mins (X a segment's sum of x, in index order); the
// lane adds its task values in order, then `subgroupAdd` combines the lanes.

// The same buffer as W, for aligned 16-byte loads of block bodies.
@group(0) @binding(5) var<storage, read> W4: array<vec4<u32>>;

// A task's codes (16 + 16 values, as exact f32 integers), the scale of each 16-value segment and
// its min (a weight is scale * code - min; 0 without HAS_MIN).
struct Task {
    a0: vec4<f32>,
    a1: vec4<f32>,
    a2: vec4<f32>,
    a3: vec4<f32>,
    b0: vec4<f32>,
    b1: vec4<f32>,
    b2: vec4<f32>,
    b3: vec4<f32>,
    sa: f32,
    sb: f32,
    ma: f32,
    mb: f32,
}

// A task's integer codes for the matvec_idot assemblies (quant/rows_idot.wgsl): each segment's
// 16 codes as 4 signed bytes a word in value order, an integer factor per segment, one scale.
struct TaskI {
    a: vec4<u32>,
    b: vec4<u32>,
    ka: i32,
    kb: i32,
    s: f32,
}

// 16 x values of one segment.
struct Seg {
    v0: vec4<f32>,
    v1: vec4<f32>,
    v2: vec4<f32>,
    v3: vec4<f32>,
}

fn load_seg(first: u32) -> Seg {
    let i = first >> 2u;
    return Seg(load_x4(i), load_x4(i + 1u), load_x4(i + 2u), load_x4(i + 3u));
}

fn fma4(w: vec4<f32>, x: vec4<f32>, acc: f32) -> f32 {
    var a = acc;
    a = fma(w.x, x.x, a);
    a = fma(w.y, x.y, a);
    a = fma(w.z, x.z, a);
    a = fma(w.w, x.w, a);
    return a;
}

fn task_dot(t: Task, xa: Seg, xb: Seg) -> f32 {
    var sa = fma4(t.a0, xa.v0, 0.0);
    sa = fma4(t.a1, xa.v1, sa);
    sa = fma4(t.a2, xa.v2, sa);
    sa = fma4(t.a3, xa.v3, sa);
    var sb = fma4(t.b0, xb.v0, 0.0);
    sb = fma4(t.b1, xb.v1, sb);
    sb = fma4(t.b2, xb.v2, sb);
    sb = fma4(t.b3, xb.v3, sb);
    let v = fma(t.sb, sb, t.sa * sa);
    if (HAS_MIN) {
        return v - fma(t.mb, seg_total(xb), t.ma * seg_total(xa));
    }
    return v;
}

// The sum of a segment's 16 x values, in index order.
fn seg_total(x: Seg) -> f32 {
    var s = x.v0.x;
    s = s + x.v0.y;
    s = s + x.v0.z;
    s = s + x.v0.w;
    s = s + x.v1.x;
    s = s + x.v1.y;
    s = s + x.v1.z;
    s = s + x.v1.w;
    s = s + x.v2.x;
    s = s + x.v2.y;
    s = s + x.v2.z;
    s = s + x.v2.w;
    s = s + x.v3.x;
    s = s + x.v3.y;
    s = s + x.v3.z;
    return s + x.v3.w;
}

// Exact f32 of the 4 bytes of `w` minus `bias`, by the exponent trick: 2^23 + byte, less 2^23.
fn bytes_f32(w: u32, bias: f32) -> vec4<f32> {
    let b = (vec4<u32>(w, w >> 8u, w >> 16u, w >> 24u) & vec4<u32>(0xffu)) | vec4<u32>(0x4b000000u);
    return bitcast<vec4<f32>>(b) - vec4<f32>(8388608.0 + bias);
}

// The 4 unsigned bytes of codebook word `w` with sign bits 0..3 of `signs4` negating them: as exact
// f32 codes (the i-quants' task_w) ... (A 16-entry table of sign masks in workgroup memory was
// tried: the IQ3_S prefill mat-vec took 406 ms per 512-token chunk on the H200 against 368 ms with
// these shifts.)
fn signed_codes(w: u32, signs4: u32) -> vec4<f32> {
    let v = bytes_f32(w, 0.0);
    let neg = ((vec4<u32>(signs4) >> vec4<u32>(0u, 1u, 2u, 3u)) & vec4<u32>(1u)) << vec4<u32>(31u);
    return bitcast<vec4<f32>>(bitcast<vec4<u32>>(v) ^ neg);
}

// ... and as 4 signed bytes (their task_wi): each set bit spread to its byte, the byte negated
// there (two's complement; codebook bytes are never 0).
fn signed_bytes(w: u32, signs4: u32) -> u32 {
    let one = ((signs4 & 0xfu) * 0x00204081u) & 0x01010101u;
    return (w ^ (one * 0xffu)) + one;
}

// Component `i` (0..3) of `v`, selected rather than dynamically indexed.
fn pick4(v: vec4<u32>, i: u32) -> u32 {
    return select(select(v.x, v.y, i == 1u), select(v.z, v.w, i == 3u), i >= 2u);
}

// The f16 scale at even byte address `b` of the scale plane (branch-free).
fn d_f16(b: u32) -> f32 {
    return unpack2x16float(W[b >> 2u] >> ((b & 2u) << 3u)).x;
}

// Where row `row`'s block heads start (HEAD_BYTES a block, set from src/gpu/layout.rs).
fn row_d(row: u32) -> u32 {
    return p.d_base + row * (p.k / QK) * HEAD_BYTES;
}

// The x segments of one task for every vector of the tile (only ITEMS of them are loaded).
struct TileX {
    a0: Seg,
    b0: Seg,
    a1: Seg,
    b1: Seg,
    a2: Seg,
    b2: Seg,
    a3: Seg,
    b3: Seg,
}

fn load_tile_x(x_base: u32, xo: vec2<u32>) -> TileX {
    let zero = Seg(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
    var x = TileX(load_seg(x_base + xo.x), load_seg(x_base + xo.y), zero, zero, zero, zero, zero,
                  zero);
    if (ITEMS > 1u) {
        x.a1 = load_seg(x_base + XS.y + xo.x);
        x.b1 = load_seg(x_base + XS.y + xo.y);
    }
    if (ITEMS > 2u) {
        x.a2 = load_seg(x_base + XS.z + xo.x);
        x.b2 = load_seg(x_base + XS.z + xo.y);
    }
    if (ITEMS > 3u) {
        x.a3 = load_seg(x_base + XS.w + xo.x);
        x.b3 = load_seg(x_base + XS.w + xo.y);
    }
    if (X_MODE == 3u) {
        x = norm_tile_x(x, xo);
    }
    return x;
}

// X_MODE 3: the tile's segments normed (quant/x_norm.wgsl; the identity in other assemblies).
fn norm_tile_x(x: TileX, xo: vec2<u32>) -> TileX {
    var y = x;
    y.a0 = norm_seg(x.a0, xo.x, 0u);
    y.b0 = norm_seg(x.b0, xo.y, 0u);
    if (ITEMS > 1u) {
        y.a1 = norm_seg(x.a1, xo.x, 1u);
        y.b1 = norm_seg(x.b1, xo.y, 1u);
    }
    if (ITEMS > 2u) {
        y.a2 = norm_seg(x.a2, xo.x, 2u);
        y.b2 = norm_seg(x.b2, xo.y, 2u);
    }
    if (ITEMS > 3u) {
        y.a3 = norm_seg(x.a3, xo.x, 3u);
        y.b3 = norm_seg(x.b3, xo.y, 3u);
    }
    return y;
}

// Task t of one row against the tile's vectors (components past ITEMS stay 0). The tile's x is
// loaded once per task and shared by every row of the lane.
fn row_task(row: u32, t: u32, x: TileX) -> vec4<f32> {
    let w = task_w(row * p.row_bytes, row_d(row), t);
    var v = vec4<f32>(task_dot(w, x.a0, x.b0), 0.0, 0.0, 0.0);
    if (ITEMS > 1u) {
        v.y = task_dot(w, x.a1, x.b1);
    }
    if (ITEMS > 2u) {
        v.z = task_dot(w, x.a2, x.b2);
    }
    if (ITEMS > 3u) {
        v.w = task_dot(w, x.a3, x.b3);
    }
    return v;
}

// Rows row_at(row0, row_step, r) (part-relative; r < n_rows <= ROWS) against `n_items` vectors from
// `x_base`; results of row r in acc.r<r> (one component per vector) after the subgroup reduction.
// Rows past n_rows repeat the last row (read, never stored) rather than branching. Everything is
// in named registers: no dynamically indexed array, which drivers place in slow local memory.
fn rows_dot(row0: u32, row_step: u32, n_rows: u32, x_base: u32, n_items: u32, lane: u32,
            sg_size: u32) -> Acc {
    if (LIMB) {
        return rows_dot_limb(row0, row_step, n_rows, x_base, lane, sg_size);
    }
    if (IDOT) {
        return rows_dot_idot(row0, row_step, n_rows, x_base, n_items, lane, sg_size);
    }
    var a0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var a3 = vec4<f32>(0.0);
    let last = n_rows - 1u;
    let tasks = (p.k / QK) * TASKS_PER_BLOCK;
    for (var t = lane; t < tasks; t += sg_size) {
        let x = load_tile_x(x_base, task_x(t));
        a0 += row_task(row0, t, x);
        if (ROWS > 1u) {
            a1 += row_task(row_at(row0, row_step, min(1u, last)), t, x);
        }
        if (ROWS > 2u) {
            a2 += row_task(row_at(row0, row_step, min(2u, last)), t, x);
        }
        if (ROWS > 3u) {
            a3 += row_task(row_at(row0, row_step, min(3u, last)), t, x);
        }
    }
    return Acc(reduce_items(a0, n_items), reduce_items(a1, n_items), reduce_items(a2, n_items),
               reduce_items(a3, n_items));
}

// ---- Limb arithmetic (LIMB; docs/tensor-cores.md) ----
// The arithmetic a tensor-core prefill can reproduce bit for bit. Each 16-value x segment is split
// into two integer limbs: with E the exponent of its largest |x| (|x| < 2^E, E at least -100),
// xh = round(x * 2^(11-E)) * 2^(E-11) and xl = round((x - xh) * 2^(22-E)) * 2^(E-22). A segment's
// sum over 16 integer codes times one limb is then exact in f32, whichever order adds it. A task
// is worth s * (Σa + Σb) (one scale) or fma(sb, Σb, sa * Σa) with Σ = Σ(code * xh) +
// Σ(code * xl) (task_dot_limb), and a row folds its task
// values in task order, acc = acc + v (one order for every subgroup size and tile; the lanes
// compute the task values side by side and every lane folds them through subgroupShuffle).
// Set per context (`STRATA_ARITH=limb`); the launcher keeps KSPLIT at 1 with it.
override LIMB: bool = false;

// A segment's two limbs.
struct LSeg {
    h: Seg,
    l: Seg,
}

// 2^n for -126 <= n <= 127 (a normal f32): scaling by it is exact wherever ldexp's is, without
// ldexp's cost (NVIDIA's Vulkan compiler makes ldexp a long sequence; frexp likewise).
fn pow2(n: i32) -> f32 {
    return bitcast<f32>(u32(n + 127) << 23u);
}

// The exponent E of `m` >= 0 with m < 2^E (frexp's for normal m), at least -100: every scale
// 2^(E-22) .. 2^(22-E) the limbs use is then a normal f32. (Zero and subnormal m give -100.)
fn limb_exp(m: f32) -> i32 {
    return max(i32((bitcast<u32>(m) >> 23u) & 0xffu) - 126, -100);
}

// The integer limbs hi, lo of 4 values of a segment of exponent e (|hi| <= 2048, |lo| <= 1024).
fn limb_ints(v: vec4<f32>, e: i32) -> array<vec4<f32>, 2> {
    let hi = round(v * pow2(11 - e));
    let lo = round((v - hi * pow2(e - 11)) * pow2(22 - e));
    return array<vec4<f32>, 2>(hi, lo);
}

fn limb4(v: vec4<f32>, e: i32) -> array<vec4<f32>, 2> {
    let l = limb_ints(v, e);
    return array<vec4<f32>, 2>(l[0] * pow2(e - 11), l[1] * pow2(e - 22));
}

// A segment's exponent: that of its largest |x| (limb_exp).
fn seg_exp(s: Seg) -> i32 {
    let m = max(max(abs(s.v0), abs(s.v1)), max(abs(s.v2), abs(s.v3)));
    return limb_exp(max(max(m.x, m.y), max(m.z, m.w)));
}

fn limbs(s: Seg) -> LSeg {
    let e = seg_exp(s);
    let a = limb4(s.v0, e);
    let b = limb4(s.v1, e);
    let c = limb4(s.v2, e);
    let d = limb4(s.v3, e);
    return LSeg(Seg(a[0], b[0], c[0], d[0]), Seg(a[1], b[1], c[1], d[1]));
}

fn seg_sum(t0: vec4<f32>, t1: vec4<f32>, t2: vec4<f32>, t3: vec4<f32>, x: Seg) -> f32 {
    var s = fma4(t0, x.v0, 0.0);
    s = fma4(t1, x.v1, s);
    s = fma4(t2, x.v2, s);
    return fma4(t3, x.v3, s);
}

// A task's value: s * (Σa + Σb) when both segments have one scale s (written so: a compiler that
// sees one scale rewrites fma(s, Σb, s * Σa) into it, lavapipe does), else fma(sb, Σb, sa * Σa).
fn task_dot_limb(t: Task, xa: LSeg, xb: LSeg) -> f32 {
    let sa = seg_sum(t.a0, t.a1, t.a2, t.a3, xa.h) + seg_sum(t.a0, t.a1, t.a2, t.a3, xa.l);
    let sb = seg_sum(t.b0, t.b1, t.b2, t.b3, xb.h) + seg_sum(t.b0, t.b1, t.b2, t.b3, xb.l);
    return select(fma(t.sb, sb, t.sa * sa), t.sa * (sa + sb), t.sa == t.sb);
}

// The tile's x segments of one task in limbs (only ITEMS of them are split).
struct TileL {
    a0: LSeg,
    b0: LSeg,
    a1: LSeg,
    b1: LSeg,
    a2: LSeg,
    b2: LSeg,
    a3: LSeg,
    b3: LSeg,
}

fn limb_tile_x(x_base: u32, xo: vec2<u32>) -> TileL {
    let x = load_tile_x(x_base, xo);
    let zero = LSeg(x.a1, x.a1);
    var y = TileL(limbs(x.a0), limbs(x.b0), zero, zero, zero, zero, zero, zero);
    if (ITEMS > 1u) {
        y.a1 = limbs(x.a1);
        y.b1 = limbs(x.b1);
    }
    if (ITEMS > 2u) {
        y.a2 = limbs(x.a2);
        y.b2 = limbs(x.b2);
    }
    if (ITEMS > 3u) {
        y.a3 = limbs(x.a3);
        y.b3 = limbs(x.b3);
    }
    return y;
}

fn row_task_limb(row: u32, t: u32, x: TileL) -> vec4<f32> {
    let w = task_w(row * p.row_bytes, row_d(row), t);
    var v = vec4<f32>(task_dot_limb(w, x.a0, x.b0), 0.0, 0.0, 0.0);
    if (ITEMS > 1u) {
        v.y = task_dot_limb(w, x.a1, x.b1);
    }
    if (ITEMS > 2u) {
        v.z = task_dot_limb(w, x.a2, x.b2);
    }
    if (ITEMS > 3u) {
        v.w = task_dot_limb(w, x.a3, x.b3);
    }
    return v;
}

// rows_dot in limb arithmetic: rounds of sg_size tasks (lane l computes task base + l; lanes past
// the last task recompute it and are never folded), each round folded in task order on every lane.
// Needs lane = the subgroup lane and sg_size = the subgroup size (KSPLIT 1).
fn rows_dot_limb(row0: u32, row_step: u32, n_rows: u32, x_base: u32, lane: u32,
                 sg_size: u32) -> Acc {
    var a0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var a3 = vec4<f32>(0.0);
    let last = n_rows - 1u;
    let tasks = (p.k / QK) * TASKS_PER_BLOCK;
    for (var base = 0u; base < tasks; base += sg_size) {
        let t = min(base + lane, tasks - 1u);
        let x = limb_tile_x(x_base, task_x(t));
        let v0 = row_task_limb(row0, t, x);
        var v1 = vec4<f32>(0.0);
        var v2 = vec4<f32>(0.0);
        var v3 = vec4<f32>(0.0);
        if (ROWS > 1u) {
            v1 = row_task_limb(row_at(row0, row_step, min(1u, last)), t, x);
        }
        if (ROWS > 2u) {
            v2 = row_task_limb(row_at(row0, row_step, min(2u, last)), t, x);
        }
        if (ROWS > 3u) {
            v3 = row_task_limb(row_at(row0, row_step, min(3u, last)), t, x);
        }
        let n = min(sg_size, tasks - base);
        if (ITEMS == 1u) {
            // One vector: the rows' values side by side, one vec4 shuffle per task instead of
            // one per row (the same adds, in the same order, on each row's value).
            var r = vec4<f32>(a0.x, a1.x, a2.x, a3.x);
            let v = vec4<f32>(v0.x, v1.x, v2.x, v3.x);
            for (var l = 0u; l < n; l++) {
                r = r + subgroupShuffle(v, l);
            }
            a0.x = r.x;
            a1.x = r.y;
            a2.x = r.z;
            a3.x = r.w;
            continue;
        }
        for (var l = 0u; l < n; l++) {
            a0 = a0 + subgroupShuffle(v0, l);
            if (ROWS > 1u) {
                a1 = a1 + subgroupShuffle(v1, l);
            }
            if (ROWS > 2u) {
                a2 = a2 + subgroupShuffle(v2, l);
            }
            if (ROWS > 3u) {
                a3 = a3 + subgroupShuffle(v3, l);
            }
        }
    }
    return Acc(a0, a1, a2, a3);
}

// Row gather with dequantization (embedding lookup, and the dequant test): for item i, row IDS[i]
// (global row id; rows outside this part are skipped) is written `reps` times, `rep_stride` apart.
// Reuses the Params fields: rows = rows in this part, y_offset = first global row of this part,
// x_stride = reps, x_offset = rep_stride. One invocation per task; a value is its scale times its
// code, exactly the GGUF dequantization.
const GET_ROWS_WG: u32 = 64u;

fn put4(base: u32, v: vec4<f32>) {
    Y[base] = v.x;
    Y[base + 1u] = v.y;
    Y[base + 2u] = v.z;
    Y[base + 3u] = v.w;
}

@compute @workgroup_size(GET_ROWS_WG)
fn get_rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    prologue(lid.x);
    workgroupBarrier();
    let item = wg.y + wg.z * 65535u;
    if (item >= p.items) {
        return;
    }
    let global_row = IDS[item];
    if (global_row < p.y_offset || global_row >= p.y_offset + p.rows) {
        return;
    }
    let row = global_row - p.y_offset;
    let t = wg.x * GET_ROWS_WG + lid.x;
    if (t >= (p.k / QK) * TASKS_PER_BLOCK) {
        return;
    }
    let w = task_w(row * p.row_bytes, row_d(row), t);
    let xo = task_x(t);
    for (var rep = 0u; rep < p.x_stride; rep++) {
        let base = item * p.y_stride + rep * p.x_offset;
        put4(base + xo.x, w.sa * w.a0 - w.ma);
        put4(base + xo.x + 4u, w.sa * w.a1 - w.ma);
        put4(base + xo.x + 8u, w.sa * w.a2 - w.ma);
        put4(base + xo.x + 12u, w.sa * w.a3 - w.ma);
        put4(base + xo.y, w.sb * w.b0 - w.mb);
        put4(base + xo.y + 4u, w.sb * w.b1 - w.mb);
        put4(base + xo.y + 8u, w.sb * w.b2 - w.mb);
        put4(base + xo.y + 12u, w.sb * w.b3 - w.mb);
    }
}
