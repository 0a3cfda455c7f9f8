// Tensor-core prefill tiles for the split row bodies in limb arithmetic (the `matvec_coop:<type>`
// assemblies: the cooperative-matrix enables, matvec.wgsl, quant/rows_split.wgsl, then this file;
// docs/tensor-cores.md). Built only where the adapter has 16x16 f16 cooperative matrices with f32
// results and subgroups of 32, and only for contexts in limb arithmetic.
//
// Same bits as rows_dot_limb (decode) and rows_wide_limb: for (row, vector) the task values are
//   v_t = select(fma(sb, Sb, sa * Sa), sa * (Sa + Sb), sa == sb),  S = Ch * 2^(e-11) + Cl * 2^(e-22)
// where Ch (Cl) is the exact integer sum of the segment's 16 codes times the hi (lo) limbs of x:
// the tensor cores add those products in an order of their own, but every partial sum is an
// integer below 2^24, so any order gives the same value, equal to the fma chain of `seg_sum`
// over code * (limb * 2^(e-11)) (a power of two: no rounding either). The row then adds its task
// values in task order, acc + v_0 + v_1 + ..., as the decode fold does.
//
// x comes in limbs from `limb_x` (below): per vector and task, its two 16-value segments (at
// task_x(t)) as f16 integers hi and lo, and each segment's exponent e.
//
// A workgroup (4 subgroups of 32) computes 64 rows x 32 vectors; subgroup s owns rows 16s .. 16s
// + 16. Per task: each subgroup's 16 rows store their codes (decoded the task before, so the
// loads overlap the products) into AS (f16) and scales into SS; the workgroup stores the 32
// vectors' limbs (also loaded a task ahead) into BH / BL and exponents into BE; each subgroup
// multiplies (2 segments x 2 limbs x 2 blocks of 16 vectors), stores the products to CS and folds
// the task values of its 16 x 32 outputs, 16 per lane (row lane / 16 + 2j, vector lane % 16 +
// 16 b), in registers.

// Limbs of x, per (vector, task): 16 words of hi (segment a's 16 values, then b's, two f16 per
// word), the same for lo, and the segments' exponents.
@group(0) @binding(16) var<storage, read_write> LH: array<u32>;
@group(0) @binding(17) var<storage, read_write> LL: array<u32>;
@group(0) @binding(18) var<storage, read_write> LE: array<vec2<i32>>;

const CV: u32 = 32u;

var<workgroup> AS: array<f16, 2048>;
var<workgroup> SS: array<vec2<f32>, 64>;
var<workgroup> BH: array<f16, 1024>;
var<workgroup> BL: array<f16, 1024>;
var<workgroup> BE: array<vec2<i32>, 32>;
var<workgroup> CS: array<f32, 4096>;
// The x index of each of the tile's vectors, and (matvec_group_coop) its item.
var<workgroup> VIDX: array<u32, 32>;
var<workgroup> VITEM: array<u32, 32>;

fn coop_tasks() -> u32 {
    return (p.k / QK) * TASKS_PER_BLOCK;
}

// ---- limb_x: x in limbs (one invocation per (task, vector)) ----

// The 4 values of `v` as integer limbs hi, lo (rows_split.wgsl's limb_ints) packed as f16 pairs.
fn limb_words(v: vec4<f32>, e: i32) -> vec4<u32> {
    let l = limb_ints(v, e);
    return vec4<u32>(pack2x16float(l[0].xy), pack2x16float(l[0].zw), pack2x16float(l[1].xy),
                     pack2x16float(l[1].zw));
}

fn put_seg_limbs(at: u32, s: Seg, e: i32) {
    let a = limb_words(s.v0, e);
    let b = limb_words(s.v1, e);
    let c = limb_words(s.v2, e);
    let d = limb_words(s.v3, e);
    LH[at] = a.x;
    LH[at + 1u] = a.y;
    LH[at + 2u] = b.x;
    LH[at + 3u] = b.y;
    LH[at + 4u] = c.x;
    LH[at + 5u] = c.y;
    LH[at + 6u] = d.x;
    LH[at + 7u] = d.y;
    LL[at] = a.z;
    LL[at + 1u] = a.w;
    LL[at + 2u] = b.z;
    LL[at + 3u] = b.w;
    LL[at + 4u] = c.z;
    LL[at + 5u] = c.w;
    LL[at + 6u] = d.z;
    LL[at + 7u] = d.w;
}

// `items` vectors of x (x_offset, x_stride apart; X_MODE 0) into limbs, vector i at LE[i * tasks].
@compute @workgroup_size(64)
fn limb_x(@builtin(global_invocation_id) gid: vec3<u32>,
          @builtin(workgroup_id) wg: vec3<u32>) {
    let t = gid.x;
    let item = wg.y + wg.z * 65535u;
    let tasks = coop_tasks();
    if (t >= tasks || item >= p.items) {
        return;
    }
    let xo = task_x(t);
    let base = p.x_offset + item * p.x_stride;
    let sa = load_seg(base + xo.x);
    let sb = load_seg(base + xo.y);
    let ea = seg_exp(sa);
    let eb = seg_exp(sb);
    let at = item * tasks + t;
    put_seg_limbs(16u * at, sa, ea);
    put_seg_limbs(16u * at + 8u, sb, eb);
    LE[at] = vec2<i32>(ea, eb);
}

// ---- the tile ----

fn put_codes(at: u32, w: Task) {
    let c = array<vec4<f32>, 8>(w.a0, w.a1, w.a2, w.a3, w.b0, w.b1, w.b2, w.b3);
    for (var i = 0u; i < 8u; i++) {
        let v = vec4<f16>(c[i]);
        AS[at + 4u * i] = v.x;
        AS[at + 4u * i + 1u] = v.y;
        AS[at + 4u * i + 2u] = v.z;
        AS[at + 4u * i + 3u] = v.w;
    }
}

// Task t's codes and scales of this subgroup's row lane % 16 (rows past `last` repeat it); lanes
// 0..15 store theirs (put_task). Decoded a task ahead, so the loads overlap the products.
fn coop_task(row_base: u32, row0: u32, last: u32, t: u32, lane: u32) -> Task {
    let row = row_base + min(row0 + (lane & 15u), last);
    return task_w(row * p.row_bytes, row_d(row), t);
}

fn put_task(w: Task, sg_id: u32, lane: u32) {
    if (lane < 16u) {
        put_codes(sg_id * 512u + lane * 32u, w);
        SS[sg_id * 16u + lane] = vec2<f32>(w.sa, w.sb);
    }
}

// Invocation lid's share of task t's limbs of the tile's 32 vectors (vector lid / 4, 8 values),
// loaded a task ahead.
struct XRegs {
    h: vec4<u32>,
    l: vec4<u32>,
    e: vec2<i32>,
}

fn load_x_regs(t: u32, lid: u32) -> XRegs {
    let at = VIDX[lid >> 2u] * coop_tasks() + t;
    let src = 16u * at + 4u * (lid & 3u);
    return XRegs(vec4<u32>(LH[src], LH[src + 1u], LH[src + 2u], LH[src + 3u]),
                 vec4<u32>(LL[src], LL[src + 1u], LL[src + 2u], LL[src + 3u]), LE[at]);
}

fn put_x_regs(r: XRegs, lid: u32) {
    let n = lid >> 2u;
    let q = lid & 3u;
    let dst = n * 32u + 8u * q;
    for (var i = 0u; i < 4u; i++) {
        let h = unpack2x16float(r.h[i]);
        let l = unpack2x16float(r.l[i]);
        BH[dst + 2u * i] = f16(h.x);
        BH[dst + 2u * i + 1u] = f16(h.y);
        BL[dst + 2u * i] = f16(l.x);
        BL[dst + 2u * i + 1u] = f16(l.y);
    }
    if (q == 0u) {
        BE[n] = r.e;
    }
}

// One segment's value from its two exact sums (seg_sum's value: see the header).
fn coop_seg(h: f32, l: f32, e: i32) -> f32 {
    return h * pow2(e - 11) + l * pow2(e - 22);
}

// task_dot_limb's value from the products.
fn coop_value(s: vec2<f32>, ah: f32, al: f32, bh: f32, bl: f32, e: vec2<i32>) -> f32 {
    let sa = coop_seg(ah, al, e.x);
    let sb = coop_seg(bh, bl, e.y);
    return select(fma(s.y, sb, s.x * sa), s.x * (sa + sb), s.x == s.y);
}

// The task values of rows r, r + 2, r + 4, r + 6 (of the subgroup's 16), vector n of the block
// whose products are at CS[c ..].
fn coop_quad(c: u32, so: u32, r: u32, n: u32, e: vec2<i32>) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    for (var j = 0u; j < 4u; j++) {
        let row = r + 2u * j;
        let o = c + row * 16u + n;
        v[j] = coop_value(SS[so + row], CS[o], CS[o + 256u], CS[o + 512u], CS[o + 768u], e);
    }
    return v;
}

// A lane's 16 outputs: block b (vectors 16b .. 16b + 16), rows lane / 16 + 2j (j 0..3 in .lo,
// 4..7 in .hi), vector lane % 16.
struct CoopAcc {
    lo0: vec4<f32>,
    hi0: vec4<f32>,
    lo1: vec4<f32>,
    hi1: vec4<f32>,
}

// Products of block b for this subgroup into CS, then the task values added to `acc`.
fn coop_block(acc_lo: vec4<f32>, acc_hi: vec4<f32>, aa: coop_mat16x16<f16, A>,
              ab: coop_mat16x16<f16, A>, b: u32, sg_id: u32, lane: u32) -> array<vec4<f32>, 2> {
    let zero = coop_mat16x16<f32, C>();
    let c = sg_id * 1024u;
    let xb = b * 512u;
    coopStoreT(coopMultiplyAdd(aa, coopLoad<coop_mat16x16<f16, B>>(&BH[xb], 32u), zero), &CS[c], 16u);
    coopStoreT(coopMultiplyAdd(aa, coopLoad<coop_mat16x16<f16, B>>(&BL[xb], 32u), zero), &CS[c + 256u], 16u);
    coopStoreT(coopMultiplyAdd(ab, coopLoad<coop_mat16x16<f16, B>>(&BH[xb + 16u], 32u), zero), &CS[c + 512u], 16u);
    coopStoreT(coopMultiplyAdd(ab, coopLoad<coop_mat16x16<f16, B>>(&BL[xb + 16u], 32u), zero), &CS[c + 768u], 16u);
    subgroupBarrier();
    let n = lane % 16u;
    let e = BE[16u * b + n];
    let so = sg_id * 16u;
    let r = lane / 16u;
    let lo = acc_lo + coop_quad(c, so, r, n, e);
    let hi = acc_hi + coop_quad(c, so, r + 8u, n, e);
    subgroupBarrier();
    return array<vec4<f32>, 2>(lo, hi);
}

// Rows row_base + row0 + (0 .. 16) (clamped to row_base + last) of this subgroup against the
// 32 vectors listed in VIDX, over every task. Called by every invocation (it holds barriers).
fn coop_rows(row_base: u32, row0: u32, last: u32, lid: u32, sg_id: u32, lane: u32) -> CoopAcc {
    var acc = CoopAcc(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
    let tasks = coop_tasks();
    workgroupBarrier();
    var wn = coop_task(row_base, row0, last, 0u, lane);
    var xn = load_x_regs(0u, lid);
    for (var t = 0u; t < tasks; t++) {
        workgroupBarrier();
        put_task(wn, sg_id, lane);
        put_x_regs(xn, lid);
        workgroupBarrier();
        let next = min(t + 1u, tasks - 1u);
        wn = coop_task(row_base, row0, last, next, lane);
        xn = load_x_regs(next, lid);
        let aa = coopLoadT<coop_mat16x16<f16, A>>(&AS[sg_id * 512u], 32u);
        let ab = coopLoadT<coop_mat16x16<f16, A>>(&AS[sg_id * 512u + 16u], 32u);
        let b0 = coop_block(acc.lo0, acc.hi0, aa, ab, 0u, sg_id, lane);
        let b1 = coop_block(acc.lo1, acc.hi1, aa, ab, 1u, sg_id, lane);
        acc = CoopAcc(b0[0], b0[1], b1[0], b1[1]);
    }
    return acc;
}

// Output j (0..7) of block b of a lane's accumulators.
fn coop_out(a: CoopAcc, b: u32, j: u32) -> f32 {
    let lo = select(a.lo0, a.lo1, b == 1u);
    let hi = select(a.hi0, a.hi1, b == 1u);
    return select(lo[j & 3u], hi[j & 3u], j >= 4u);
}

// The dense tile of workgroup `wg` (x: 64-row block, y/z: 32-vector tile): its first vector, with
// VIDX filled (vectors past p.items repeat the last); u32::MAX past the vectors.
fn coop_dense_tile(wg: vec3<u32>, lid: u32) -> u32 {
    let first = p.item0 + (wg.y + wg.z * 65535u) * CV;
    if (first >= p.items) {
        return 0xffffffffu;
    }
    if (lid < CV) {
        VIDX[lid] = min(first + lid, p.items - 1u);
    }
    return first;
}

// Dense rows stored as matvec stores them (p.rows rows of this part).
@compute @workgroup_size(128)
fn matvec_coop(@builtin(workgroup_id) wg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32,
               @builtin(subgroup_id) sg_id: u32,
               @builtin(subgroup_invocation_id) lane: u32) {
    prologue(lid);
    let first = coop_dense_tile(wg, lid);
    if (first == 0xffffffffu) {
        return;
    }
    let row0 = wg.x * 64u + sg_id * 16u;
    let acc = coop_rows(0u, row0, p.rows - 1u, lid, sg_id, lane);
    for (var b = 0u; b < 2u; b++) {
        let item = first + 16u * b + lane % 16u;
        for (var j = 0u; j < 8u; j++) {
            let row = row0 + lane / 16u + 2u * j;
            if (row < p.rows && item < p.items) {
                Y[item * p.y_stride + p.y_offset + row] = coop_out(acc, b, j);
            }
        }
    }
}

// Dense rows split over three outputs as matvec_seg stores them (Y0_MODE 0 or 2).
@compute @workgroup_size(128)
fn matvec_seg_coop(@builtin(workgroup_id) wg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32,
                   @builtin(subgroup_id) sg_id: u32,
                   @builtin(subgroup_invocation_id) lane: u32) {
    prologue(lid);
    let first = coop_dense_tile(wg, lid);
    if (first == 0xffffffffu) {
        return;
    }
    let row0 = wg.x * 64u + sg_id * 16u;
    let acc = coop_rows(0u, row0, p.rows - 1u, lid, sg_id, lane);
    for (var b = 0u; b < 2u; b++) {
        let item = first + 16u * b + lane % 16u;
        for (var j = 0u; j < 8u; j++) {
            let row = row0 + lane / 16u + 2u * j;
            if (row < p.rows && item < p.items) {
                let seg = seg_of(p.row_base + row);
                var value = coop_out(acc, b, j);
                if (Y0_MODE == 2u && seg.buf == 0u) {
                    value = silu4(vec4<f32>(value) * p.x_scale).x;
                }
                put(seg.buf, item * seg.stride + seg.at, value);
            }
        }
    }
}

// matvec_group in tensor-core tiles: workgroup (x: 64-row block of an expert's rows, y: expert of
// this part), the expert's items 32 at a time (the last tile padded with its last item, computed
// and never stored).
@compute @workgroup_size(128)
fn matvec_group_coop(@builtin(workgroup_id) wg: vec3<u32>,
                     @builtin(local_invocation_index) lid: u32,
                     @builtin(subgroup_id) sg_id: u32,
                     @builtin(subgroup_invocation_id) lane: u32) {
    prologue(lid);
    let local_expert = wg.y;
    if (local_expert >= p.expert_count) {
        return;
    }
    let expert = p.expert_first + local_expert;
    let count = IDS[expert];
    let list = p.group_base + expert * p.group_cap;
    let row0 = wg.x * 64u + sg_id * 16u;
    for (var j = 0u; j < count; j += CV) {
        workgroupBarrier();
        if (lid < CV) {
            let item = IDS[list + min(j + lid, count - 1u)];
            VITEM[lid] = item;
            VIDX[lid] = select(item / p.slots, item, p.x_per_item != 0u);
        }
        let acc = coop_rows(local_expert * p.rows, row0, p.rows - 1u, lid, sg_id, lane);
        for (var b = 0u; b < 2u; b++) {
            let n = 16u * b + lane % 16u;
            let item = VITEM[n];
            for (var jr = 0u; jr < 8u; jr++) {
                let row = row0 + lane / 16u + 2u * jr;
                if (row < p.rows && j + n < count) {
                    Y[item * p.y_stride + p.y_offset + row] = coop_out(acc, b, jr);
                }
            }
        }
    }
}
