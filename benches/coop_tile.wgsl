// Probe (benches/coop.rs): can tensor cores, through wgpu's cooperative matrices, give a
// quantized mat-vec tile the bits of the decode kernels' fma chains?
//
// The arithmetic both kernels share, per (row, token):
// - x is split per 16-value segment into two integer limbs, hi and lo (|.| <= 2048, exact in
//   f16), with scales eh = 2^(E-11) and el = 2^(E-22) (E: the segment's exponent), so that
//   x ~ hi * eh + lo * el to 2^-22 of the segment's largest value;
// - a segment's sum over 16 integer codes times one limb is an integer below 2^24: exact in f32
//   in any order, so the tensor cores' order and the fma chain's give the same value;
// - task t (32 values = segments a, b, scales sa, sb) is worth
//   v = fma(sb, hb * ebh + lb * ebl, sa * (ha * eah + la * eal));
// - lane class l = t % 32 adds its tasks' values in task order; subgroupAdd adds the classes.
enable f16;
enable wgpu_cooperative_matrix;

struct Params {
    rows: u32,
    toks: u32,
    k: u32,
    tasks: u32,
}

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> S: array<vec2<f32>>;
@group(0) @binding(2) var<storage, read> XH: array<f16>;
@group(0) @binding(3) var<storage, read> XL: array<f16>;
@group(0) @binding(4) var<storage, read> E: array<vec2<f32>>;
@group(0) @binding(5) var<storage, read_write> Y: array<f32>;
@group(0) @binding(6) var<uniform> p: Params;

const NW: u32 = 4u;
var<workgroup> AS: array<f16, 2048>;
var<workgroup> CS: array<f32, 1024>;
var<workgroup> PS: array<f32, 8192>;

struct V8 {
    a: vec4<f32>,
    b: vec4<f32>,
}

fn stage(c: coop_mat16x16<f32, C>, w: u32, lane: u32) -> V8 {
    coopStoreT(c, &CS[w * 256u], 16u);
    subgroupBarrier();
    let at = w * 256u + lane;
    let r = V8(vec4<f32>(CS[at], CS[at + 32u], CS[at + 64u], CS[at + 96u]),
               vec4<f32>(CS[at + 128u], CS[at + 160u], CS[at + 192u], CS[at + 224u]));
    subgroupBarrier();
    return r;
}

fn codes4(word: u32) -> vec4<f16> {
    let v = bitcast<vec4<i32>>(vec4<u32>(word << 24u, word << 16u, word << 8u, word)) >> vec4<u32>(24u);
    return vec4<f16>(vec4<f32>(v));
}

// The warp's 16 rows x 32 codes of task t into AS.
fn stage_a(row0: u32, t: u32, w: u32, lane: u32) {
    let r = lane / 2u;
    let h = lane % 2u;
    let word0 = ((row0 + r) * p.k + t * 32u + h * 16u) / 4u;
    let at = w * 512u + r * 32u + h * 16u;
    for (var j = 0u; j < 4u; j++) {
        let c = codes4(W[word0 + j]);
        AS[at + 4u * j] = c.x;
        AS[at + 4u * j + 1u] = c.y;
        AS[at + 4u * j + 2u] = c.z;
        AS[at + 4u * j + 3u] = c.w;
    }
    subgroupBarrier();
}

// Segment sums of task t for the tile: 4 products (segments a, b x limbs hi, lo).
struct Sums {
    ah: coop_mat16x16<f32, C>,
    al: coop_mat16x16<f32, C>,
    bh: coop_mat16x16<f32, C>,
    bl: coop_mat16x16<f32, C>,
}

fn task_sums(tok0: u32, t: u32, w: u32) -> Sums {
    let zero = coop_mat16x16<f32, C>();
    let wa = coopLoadT<coop_mat16x16<f16, A>>(&AS[w * 512u], 32u);
    let wb = coopLoadT<coop_mat16x16<f16, A>>(&AS[w * 512u + 16u], 32u);
    let xa = tok0 * p.k + t * 32u;
    let ha = coopLoad<coop_mat16x16<f16, B>>(&XH[xa], p.k);
    let la = coopLoad<coop_mat16x16<f16, B>>(&XL[xa], p.k);
    let hb = coopLoad<coop_mat16x16<f16, B>>(&XH[xa + 16u], p.k);
    let lb = coopLoad<coop_mat16x16<f16, B>>(&XL[xa + 16u], p.k);
    return Sums(coopMultiplyAdd(wa, ha, zero), coopMultiplyAdd(wa, la, zero),
                coopMultiplyAdd(wb, hb, zero), coopMultiplyAdd(wb, lb, zero));
}

fn seg_value(h: f32, l: f32, e: vec2<f32>) -> f32 {
    return h * e.x + l * e.y;
}

fn task_value(sa: f32, sb: f32, ah: f32, al: f32, bh: f32, bl: f32, ea: vec2<f32>,
              eb: vec2<f32>) -> f32 {
    return fma(sb, seg_value(bh, bl, eb), sa * seg_value(ah, al, ea));
}

// Tile 16 rows x 16 tokens per workgroup; subgroup w takes tasks w, w + 4, ...; lane takes the
// tile outputs o = lane + 32 j (row o / 16, token o % 16 = lane % 16).
@compute @workgroup_size(128)
fn tile(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let w = lid / 32u;
    let lane = lid % 32u;
    let row0 = wg.x * 16u;
    let tok0 = wg.y * 16u;
    for (var i = lid; i < 8192u; i += 128u) {
        PS[i] = 0.0;
    }
    workgroupBarrier();
    let n = lane % 16u;
    let segs = p.k / 16u;
    for (var t = w; t < p.tasks; t += NW) {
        stage_a(row0, t, w, lane);
        let s = task_sums(tok0, t, w);
        let ah = stage(s.ah, w, lane);
        let al = stage(s.al, w, lane);
        let bh = stage(s.bh, w, lane);
        let bl = stage(s.bl, w, lane);
        let ea = E[(tok0 + n) * segs + 2u * t];
        let eb = E[(tok0 + n) * segs + 2u * t + 1u];
        let cls = (t % 32u) * 256u + lane;
        for (var j = 0u; j < 8u; j++) {
            let row = row0 + lane / 16u + 2u * j;
            let sc = S[row * p.tasks + t];
            var v: f32;
            if (j < 4u) {
                v = task_value(sc.x, sc.y, ah.a[j], al.a[j], bh.a[j], bl.a[j], ea, eb);
            } else {
                v = task_value(sc.x, sc.y, ah.b[j - 4u], al.b[j - 4u], bh.b[j - 4u],
                               bl.b[j - 4u], ea, eb);
            }
            PS[cls + 32u * j] += v;
        }
    }
    workgroupBarrier();
    for (var o = w * 64u; o < w * 64u + 64u; o++) {
        let total = subgroupAdd(PS[lane * 256u + o]);
        if (lane == o % 32u) {
            Y[(tok0 + o % 16u) * p.rows + row0 + o / 16u] = total;
        }
    }
}

// The same 4 products per task, accumulated in the cooperative matrices only (no epilogue): the
// ceiling the epilogue costs against.
@compute @workgroup_size(128)
fn mma_only(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let w = lid / 32u;
    let lane = lid % 32u;
    let row0 = wg.x * 16u;
    let tok0 = wg.y * 16u;
    var acc = coop_mat16x16<f32, C>();
    for (var t = w; t < p.tasks; t += NW) {
        stage_a(row0, t, w, lane);
        let wa = coopLoadT<coop_mat16x16<f16, A>>(&AS[w * 512u], 32u);
        let wb = coopLoadT<coop_mat16x16<f16, A>>(&AS[w * 512u + 16u], 32u);
        let xa = tok0 * p.k + t * 32u;
        acc = coopMultiplyAdd(wa, coopLoad<coop_mat16x16<f16, B>>(&XH[xa], p.k), acc);
        acc = coopMultiplyAdd(wa, coopLoad<coop_mat16x16<f16, B>>(&XL[xa], p.k), acc);
        acc = coopMultiplyAdd(wb, coopLoad<coop_mat16x16<f16, B>>(&XH[xa + 16u], p.k), acc);
        acc = coopMultiplyAdd(wb, coopLoad<coop_mat16x16<f16, B>>(&XL[xa + 16u], p.k), acc);
    }
    let v = stage(acc, w, lane);
    if (w == 0u) {
        Y[(tok0 + lane % 16u) * p.rows + row0 + lane / 16u] = v.a.x + v.b.w;
    }
}

// The decode form: one subgroup per (row, token), lane l takes tasks l, l + 32, ... with fma
// chains over the limbs as f32 (hi * eh and lo * el are exact), then subgroupAdd.
fn code(row: u32, i: u32) -> f32 {
    let b = row * p.k + i;
    let word = W[b / 4u];
    return f32(bitcast<i32>(word << (24u - 8u * (b % 4u))) >> 24u);
}

fn seg_fma(row: u32, tok: u32, first: u32, e: vec2<f32>) -> f32 {
    var h = 0.0;
    var l = 0.0;
    for (var i = 0u; i < 16u; i++) {
        let c = code(row, first + i);
        h = fma(c, f32(XH[tok * p.k + first + i]) * e.x, h);
        l = fma(c, f32(XL[tok * p.k + first + i]) * e.y, l);
    }
    return h + l;
}

@compute @workgroup_size(32)
fn reference(@builtin(workgroup_id) wg: vec3<u32>, @builtin(subgroup_invocation_id) lane: u32) {
    let row = wg.x;
    let tok = wg.y;
    let segs = p.k / 16u;
    var acc = 0.0;
    for (var t = lane; t < p.tasks; t += 32u) {
        let sc = S[row * p.tasks + t];
        let a = seg_fma(row, tok, t * 32u, E[tok * segs + 2u * t]);
        let b = seg_fma(row, tok, t * 32u + 16u, E[tok * segs + 2u * t + 1u]);
        acc += fma(sc.y, b, sc.x * a);
    }
    let total = subgroupAdd(acc);
    if (lane == 0u) {
        Y[tok * p.rows + row] = total;
    }
}

// Raw products of one 16 x 32 by 32 x 16 block per workgroup (case wg.x), f16 inputs in
// row-major order, f32 results: compared on the host with exact integer sums.
@compute @workgroup_size(32)
fn exact(@builtin(workgroup_id) wg: vec3<u32>) {
    let case_a = wg.x * 512u;
    let zero = coop_mat16x16<f32, C>();
    var c = coopMultiplyAdd(coopLoadT<coop_mat16x16<f16, A>>(&XH[case_a], 32u),
                            coopLoadT<coop_mat16x16<f16, B>>(&XL[case_a], 16u), zero);
    c = coopMultiplyAdd(coopLoadT<coop_mat16x16<f16, A>>(&XH[case_a + 16u], 32u),
                        coopLoadT<coop_mat16x16<f16, B>>(&XL[case_a + 256u], 16u), c);
    coopStoreT(c, &Y[wg.x * 256u], 16u);
}

// ---- Second form: 16 fixed classes, a fixed tree, 32 x 32 tiles ----
// Tasks of 32 values with one scale s (IQ3_S, IQ4_NL, Q8_0) and one x exponent per 32 values
// (E2: eh, el per 32-value block): v = s * (Σh * eh + Σl * el), Σ over the 32 integer codes
// times a limb (exact). Class c = t % 16 adds its tasks' values in task order; the classes are
// added in the fixed tree ((P0 + P1) + (P2 + P3)) + ... (a butterfly over 16 lanes gives it).
// Nothing depends on the subgroup size.
@group(0) @binding(7) var<storage, read> E2: array<vec2<f32>>;
@group(0) @binding(8) var<storage, read> S2: array<f32>;

var<workgroup> A2: array<f16, 8192>;
var<workgroup> C2: array<f32, 4096>;

fn stage2(c: coop_mat16x16<f32, C>, w: u32, lane: u32) -> V8 {
    coopStoreT(c, &C2[w * 256u], 16u);
    subgroupBarrier();
    let at = w * 256u + lane;
    let r = V8(vec4<f32>(C2[at], C2[at + 32u], C2[at + 64u], C2[at + 96u]),
               vec4<f32>(C2[at + 128u], C2[at + 160u], C2[at + 192u], C2[at + 224u]));
    subgroupBarrier();
    return r;
}

// The warp's copy of task t for rows row0 .. row0 + 32 (32 codes each) in A2.
fn stage_a2(row0: u32, t: u32, w: u32, lane: u32) {
    let word0 = ((row0 + lane) * p.k + t * 32u) / 4u;
    let at = w * 1024u + lane * 32u;
    for (var j = 0u; j < 8u; j++) {
        let c = codes4(W[word0 + j]);
        A2[at + 4u * j] = c.x;
        A2[at + 4u * j + 1u] = c.y;
        A2[at + 4u * j + 2u] = c.z;
        A2[at + 4u * j + 3u] = c.w;
    }
    subgroupBarrier();
}

fn sums2(a0: coop_mat16x16<f16, A>, a1: coop_mat16x16<f16, A>, x: u32) -> array<coop_mat16x16<f32, C>, 2> {
    let zero = coop_mat16x16<f32, C>();
    var h = coopMultiplyAdd(a0, coopLoad<coop_mat16x16<f16, B>>(&XH[x], p.k), zero);
    h = coopMultiplyAdd(a1, coopLoad<coop_mat16x16<f16, B>>(&XH[x + 16u], p.k), h);
    var l = coopMultiplyAdd(a0, coopLoad<coop_mat16x16<f16, B>>(&XL[x], p.k), zero);
    l = coopMultiplyAdd(a1, coopLoad<coop_mat16x16<f16, B>>(&XL[x + 16u], p.k), l);
    return array<coop_mat16x16<f32, C>, 2>(h, l);
}

// Workgroup: 8 warps, tile 32 rows x 32 tokens; warp w takes the tasks of classes 2w and 2w + 1.
// Lane output i (0..32) of the tile: block i / 8 (row block, token block), element
// lane + 32 (i % 8) of it.
@compute @workgroup_size(256)
fn tile32(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let w = lid / 32u;
    let lane = lid % 32u;
    let row0 = wg.x * 32u;
    let tok0 = wg.y * 32u;
    var p0: array<f32, 32>;
    var p1: array<f32, 32>;
    for (var i = 0u; i < 32u; i++) {
        p0[i] = 0.0;
        p1[i] = 0.0;
    }
    let blocks = p.k / 32u;
    for (var base = 0u; base < p.tasks; base += 16u) {
        for (var half = 0u; half < 2u; half++) {
            let t = base + 2u * w + half;
            if (t >= p.tasks) {
                break;
            }
            stage_a2(row0, t, w, lane);
            for (var rb = 0u; rb < 2u; rb++) {
                let a0 = coopLoadT<coop_mat16x16<f16, A>>(&A2[w * 1024u + rb * 512u], 32u);
                let a1 = coopLoadT<coop_mat16x16<f16, A>>(&A2[w * 1024u + rb * 512u + 16u], 32u);
                for (var tb = 0u; tb < 2u; tb++) {
                    let s = sums2(a0, a1, (tok0 + tb * 16u) * p.k + t * 32u);
                    let h = stage2(s[0], w, lane);
                    let l = stage2(s[1], w, lane);
                    let e = E2[(tok0 + tb * 16u + lane % 16u) * blocks + t];
                    for (var j = 0u; j < 8u; j++) {
                        let row = row0 + rb * 16u + lane / 16u + 2u * j;
                        let sc = S2[row * p.tasks + t];
                        var hv: f32;
                        var lv: f32;
                        if (j < 4u) {
                            hv = h.a[j];
                            lv = l.a[j];
                        } else {
                            hv = h.b[j - 4u];
                            lv = l.b[j - 4u];
                        }
                        let x = hv * e.x + lv * e.y;
                        let i = (rb * 2u + tb) * 8u + j;
                        if (half == 0u) {
                            p0[i] = fma(sc, x, p0[i]);
                        } else {
                            p1[i] = fma(sc, x, p1[i]);
                        }
                    }
                }
            }
        }
    }
    // Tree: in-warp P(2w) + P(2w+1), then warps 2i+1 -> 2i, 4i+2 -> 4i, 4 -> 0 through C2.
    var q: array<f32, 32>;
    for (var i = 0u; i < 32u; i++) {
        q[i] = p0[i] + p1[i];
    }
    for (var step = 1u; step < 8u; step *= 2u) {
        workgroupBarrier();
        if (w % (2u * step) == step) {
            for (var i = 0u; i < 32u; i++) {
                C2[((w - step) / 2u) * 1024u + i * 32u + lane] = q[i];
            }
        }
        workgroupBarrier();
        if (w % (2u * step) == 0u) {
            for (var i = 0u; i < 32u; i++) {
                q[i] = q[i] + C2[(w / 2u) * 1024u + i * 32u + lane];
            }
        }
    }
    if (w == 0u) {
        for (var i = 0u; i < 32u; i++) {
            let blk = i / 8u;
            let o = lane + 32u * (i % 8u);
            let row = row0 + (blk / 2u) * 16u + o / 16u;
            let tok = tok0 + (blk % 2u) * 16u + o % 16u;
            Y[tok * p.rows + row] = q[i];
        }
    }
}

// The decode form of the second arithmetic: 16 lanes per (row, token) (two outputs per
// workgroup of 32), lane c takes tasks c, c + 16, ... with fma chains, then the butterfly.
fn block_fma(row: u32, tok: u32, t: u32, e: vec2<f32>) -> f32 {
    var h = 0.0;
    var l = 0.0;
    for (var i = 0u; i < 32u; i++) {
        let c = code(row, t * 32u + i);
        h = fma(c, f32(XH[tok * p.k + t * 32u + i]) * e.x, h);
        l = fma(c, f32(XL[tok * p.k + t * 32u + i]) * e.y, l);
    }
    return h + l;
}

@compute @workgroup_size(32)
fn reference16(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wg.x * 2u + lid / 16u;
    let tok = wg.y;
    let c = lid % 16u;
    var acc = 0.0;
    for (var t = c; t < p.tasks; t += 16u) {
        acc = fma(S2[row * p.tasks + t], block_fma(row, tok, t, E2[tok * (p.k / 32u) + t]), acc);
    }
    acc = acc + subgroupShuffleXor(acc, 1u);
    acc = acc + subgroupShuffleXor(acc, 2u);
    acc = acc + subgroupShuffleXor(acc, 4u);
    acc = acc + subgroupShuffleXor(acc, 8u);
    if (c == 0u) {
        Y[tok * p.rows + row] = acc;
    }
}

// ---- Third form: 8 fixed classes, one warp per class, 32 x 64 tiles ----
// As the second form with classes c = t % 8 and the tree ((P0 + P1) + (P2 + P3)) +
// ((P4 + P5) + (P6 + P7)). Warp w of 8 takes the tasks of class w for the whole tile: 32 tile
// outputs per lane per 16 x 16 block pair... (64 per lane over the 32 x 64 tile).
var<workgroup> A3: array<f16, 8192>;
var<workgroup> C3: array<f32, 8192>;

fn stage_a3(row0: u32, t: u32, w: u32, lane: u32) {
    let word0 = ((row0 + lane) * p.k + t * 32u) / 4u;
    let at = w * 1024u + lane * 32u;
    for (var j = 0u; j < 8u; j++) {
        let c = codes4(W[word0 + j]);
        A3[at + 4u * j] = c.x;
        A3[at + 4u * j + 1u] = c.y;
        A3[at + 4u * j + 2u] = c.z;
        A3[at + 4u * j + 3u] = c.w;
    }
}

// h and l of one block through the warp's 2 KB of C3: lane's 8 values each.
struct HL {
    h: V8,
    l: V8,
}

fn stage_hl(h: coop_mat16x16<f32, C>, l: coop_mat16x16<f32, C>, w: u32, lane: u32) -> HL {
    coopStoreT(h, &C3[w * 512u], 16u);
    coopStoreT(l, &C3[w * 512u + 256u], 16u);
    subgroupBarrier();
    let a = w * 512u + lane;
    let b = a + 256u;
    let r = HL(V8(vec4<f32>(C3[a], C3[a + 32u], C3[a + 64u], C3[a + 96u]),
                  vec4<f32>(C3[a + 128u], C3[a + 160u], C3[a + 192u], C3[a + 224u])),
               V8(vec4<f32>(C3[b], C3[b + 32u], C3[b + 64u], C3[b + 96u]),
                  vec4<f32>(C3[b + 128u], C3[b + 160u], C3[b + 192u], C3[b + 224u])));
    subgroupBarrier();
    return r;
}

fn fold4(p: vec4<f32>, s: vec4<f32>, h: vec4<f32>, l: vec4<f32>, e: vec2<f32>) -> vec4<f32> {
    return fma(s, h * e.x + l * e.y, p);
}

@compute @workgroup_size(256)
fn tile8(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let w = lid / 32u;
    let lane = lid % 32u;
    let row0 = wg.x * 32u;
    let tok0 = wg.y * 64u;
    let blocks = p.k / 32u;
    // P: [row block][token block] x 8 values (V8 = 2 vec4) = 16 vec4 in named registers.
    var p00 = V8(vec4<f32>(0.0), vec4<f32>(0.0));
    var p01 = p00;
    var p02 = p00;
    var p03 = p00;
    var p10 = p00;
    var p11 = p00;
    var p12 = p00;
    var p13 = p00;
    for (var t = w; t < p.tasks; t += 8u) {
        stage_a3(row0, t, w, lane);
        subgroupBarrier();
        // Scales of the lane's rows: rows rb*16 + lane/16 + 2j.
        let r0 = row0 + lane / 16u;
        var s0: V8;
        var s1: V8;
        s0.a = vec4<f32>(S2[r0 * p.tasks + t], S2[(r0 + 2u) * p.tasks + t],
                         S2[(r0 + 4u) * p.tasks + t], S2[(r0 + 6u) * p.tasks + t]);
        s0.b = vec4<f32>(S2[(r0 + 8u) * p.tasks + t], S2[(r0 + 10u) * p.tasks + t],
                         S2[(r0 + 12u) * p.tasks + t], S2[(r0 + 14u) * p.tasks + t]);
        s1.a = vec4<f32>(S2[(r0 + 16u) * p.tasks + t], S2[(r0 + 18u) * p.tasks + t],
                         S2[(r0 + 20u) * p.tasks + t], S2[(r0 + 22u) * p.tasks + t]);
        s1.b = vec4<f32>(S2[(r0 + 24u) * p.tasks + t], S2[(r0 + 26u) * p.tasks + t],
                         S2[(r0 + 28u) * p.tasks + t], S2[(r0 + 30u) * p.tasks + t]);
        let a00 = coopLoadT<coop_mat16x16<f16, A>>(&A3[w * 1024u], 32u);
        let a01 = coopLoadT<coop_mat16x16<f16, A>>(&A3[w * 1024u + 16u], 32u);
        let a10 = coopLoadT<coop_mat16x16<f16, A>>(&A3[w * 1024u + 512u], 32u);
        let a11 = coopLoadT<coop_mat16x16<f16, A>>(&A3[w * 1024u + 528u], 32u);
        for (var tb = 0u; tb < 4u; tb++) {
            let x = (tok0 + tb * 16u) * p.k + t * 32u;
            let bh0 = coopLoad<coop_mat16x16<f16, B>>(&XH[x], p.k);
            let bh1 = coopLoad<coop_mat16x16<f16, B>>(&XH[x + 16u], p.k);
            let bl0 = coopLoad<coop_mat16x16<f16, B>>(&XL[x], p.k);
            let bl1 = coopLoad<coop_mat16x16<f16, B>>(&XL[x + 16u], p.k);
            let zero = coop_mat16x16<f32, C>();
            let h0 = coopMultiplyAdd(a01, bh1, coopMultiplyAdd(a00, bh0, zero));
            let l0 = coopMultiplyAdd(a01, bl1, coopMultiplyAdd(a00, bl0, zero));
            let h1 = coopMultiplyAdd(a11, bh1, coopMultiplyAdd(a10, bh0, zero));
            let l1 = coopMultiplyAdd(a11, bl1, coopMultiplyAdd(a10, bl0, zero));
            let e = E2[(tok0 + tb * 16u + lane % 16u) * blocks + t];
            let v0 = stage_hl(h0, l0, w, lane);
            let v1 = stage_hl(h1, l1, w, lane);
            let q0 = V8(fold4(select(select(p00.a, p01.a, tb == 1u), select(p02.a, p03.a, tb == 3u), tb >= 2u), s0.a, v0.h.a, v0.l.a, e),
                        fold4(select(select(p00.b, p01.b, tb == 1u), select(p02.b, p03.b, tb == 3u), tb >= 2u), s0.b, v0.h.b, v0.l.b, e));
            let q1 = V8(fold4(select(select(p10.a, p11.a, tb == 1u), select(p12.a, p13.a, tb == 3u), tb >= 2u), s1.a, v1.h.a, v1.l.a, e),
                        fold4(select(select(p10.b, p11.b, tb == 1u), select(p12.b, p13.b, tb == 3u), tb >= 2u), s1.b, v1.h.b, v1.l.b, e));
            switch tb {
                case 0u: { p00 = q0; p10 = q1; }
                case 1u: { p01 = q0; p11 = q1; }
                case 2u: { p02 = q0; p12 = q1; }
                default: { p03 = q0; p13 = q1; }
            }
        }
    }
    // Tree over the 8 warps through C3 (16 vec4 per lane per warp = 2048 floats per part; 4 parts
    // at the first level).
    var q = array<vec4<f32>, 16>(p00.a, p00.b, p01.a, p01.b, p02.a, p02.b, p03.a, p03.b,
                                 p10.a, p10.b, p11.a, p11.b, p12.a, p12.b, p13.a, p13.b);
    for (var step = 1u; step < 8u; step *= 2u) {
        workgroupBarrier();
        if (w % (2u * step) == step) {
            let slot = (w - step) / (2u * step);
            for (var i = 0u; i < 16u; i++) {
                let at = slot * 2048u + (i * 32u + lane) * 4u;
                C3[at] = q[i].x;
                C3[at + 1u] = q[i].y;
                C3[at + 2u] = q[i].z;
                C3[at + 3u] = q[i].w;
            }
        }
        workgroupBarrier();
        if (w % (2u * step) == 0u) {
            let slot = w / (2u * step);
            for (var i = 0u; i < 16u; i++) {
                let at = slot * 2048u + (i * 32u + lane) * 4u;
                q[i] = q[i] + vec4<f32>(C3[at], C3[at + 1u], C3[at + 2u], C3[at + 3u]);
            }
        }
    }
    if (w == 0u) {
        for (var i = 0u; i < 16u; i++) {
            // q[i]: row block i / 8, token block (i % 8) / 2, values j = 4 (i % 2) .. + 4.
            let rb = i / 8u;
            let tb = (i % 8u) / 2u;
            for (var c = 0u; c < 4u; c++) {
                let j = 4u * (i % 2u) + c;
                let row = row0 + rb * 16u + lane / 16u + 2u * j;
                let tok = tok0 + tb * 16u + lane % 16u;
                Y[tok * p.rows + row] = q[i][c];
            }
        }
    }
}


@compute @workgroup_size(32)
fn reference8(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wg.x * 4u + lid / 8u;
    let tok = wg.y;
    let c = lid % 8u;
    var acc = 0.0;
    for (var t = c; t < p.tasks; t += 8u) {
        let e = E2[tok * (p.k / 32u) + t];
        var h = 0.0;
        var l = 0.0;
        for (var i = 0u; i < 32u; i++) {
            let cd = code(row, t * 32u + i);
            h = fma(cd, f32(XH[tok * p.k + t * 32u + i]) * e.x, h);
            l = fma(cd, f32(XL[tok * p.k + t * 32u + i]) * e.y, l);
        }
        acc = fma(S2[row * p.tasks + t], h + l, acc);
    }
    acc = acc + subgroupShuffleXor(acc, 1u);
    acc = acc + subgroupShuffleXor(acc, 2u);
    acc = acc + subgroupShuffleXor(acc, 4u);
    if (c == 0u) {
        Y[tok * p.rows + row] = acc;
    }
}

// Diagnostics of tile8's cost: the same A staging, B loads and 16 products per task with the
// epilogue replaced by accumulation (`tile8_noepi`), and that without the A staging either, A read
// as f16 from a storage buffer (`tile8_bare`; the values are meaningless).
@compute @workgroup_size(256)
fn tile8_noepi(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let w = lid / 32u;
    let lane = lid % 32u;
    let row0 = wg.x * 32u;
    let tok0 = wg.y * 64u;
    var acc0 = coop_mat16x16<f32, C>();
    var acc1 = coop_mat16x16<f32, C>();
    var acc2 = coop_mat16x16<f32, C>();
    var acc3 = coop_mat16x16<f32, C>();
    for (var t = w; t < p.tasks; t += 8u) {
        stage_a3(row0, t, w, lane);
        subgroupBarrier();
        let a00 = coopLoadT<coop_mat16x16<f16, A>>(&A3[w * 1024u], 32u);
        let a01 = coopLoadT<coop_mat16x16<f16, A>>(&A3[w * 1024u + 16u], 32u);
        let a10 = coopLoadT<coop_mat16x16<f16, A>>(&A3[w * 1024u + 512u], 32u);
        let a11 = coopLoadT<coop_mat16x16<f16, A>>(&A3[w * 1024u + 528u], 32u);
        for (var tb = 0u; tb < 4u; tb++) {
            let x = (tok0 + tb * 16u) * p.k + t * 32u;
            let bh0 = coopLoad<coop_mat16x16<f16, B>>(&XH[x], p.k);
            let bh1 = coopLoad<coop_mat16x16<f16, B>>(&XH[x + 16u], p.k);
            let bl0 = coopLoad<coop_mat16x16<f16, B>>(&XL[x], p.k);
            let bl1 = coopLoad<coop_mat16x16<f16, B>>(&XL[x + 16u], p.k);
            acc0 = coopMultiplyAdd(a01, bh1, coopMultiplyAdd(a00, bh0, acc0));
            acc1 = coopMultiplyAdd(a01, bl1, coopMultiplyAdd(a00, bl0, acc1));
            acc2 = coopMultiplyAdd(a11, bh1, coopMultiplyAdd(a10, bh0, acc2));
            acc3 = coopMultiplyAdd(a11, bl1, coopMultiplyAdd(a10, bl0, acc3));
        }
        subgroupBarrier();
    }
    let v = stage_hl(acc0, acc1, w, lane);
    let u = stage_hl(acc2, acc3, w, lane);
    Y[(tok0 + lane % 16u) * p.rows + row0 + w] = v.h.a.x + v.l.b.w + u.h.a.y + u.l.b.z;
}

@compute @workgroup_size(256)
fn tile8_bare(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let w = lid / 32u;
    let lane = lid % 32u;
    let row0 = wg.x * 32u;
    let tok0 = wg.y * 64u;
    var acc0 = coop_mat16x16<f32, C>();
    var acc1 = coop_mat16x16<f32, C>();
    var acc2 = coop_mat16x16<f32, C>();
    var acc3 = coop_mat16x16<f32, C>();
    for (var t = w; t < p.tasks; t += 8u) {
        let ar = (row0 % 512u) * p.k + t * 32u;
        let a00 = coopLoadT<coop_mat16x16<f16, A>>(&XH[ar], p.k);
        let a01 = coopLoadT<coop_mat16x16<f16, A>>(&XH[ar + 16u], p.k);
        let a10 = coopLoadT<coop_mat16x16<f16, A>>(&XL[ar], p.k);
        let a11 = coopLoadT<coop_mat16x16<f16, A>>(&XL[ar + 16u], p.k);
        for (var tb = 0u; tb < 4u; tb++) {
            let x = (tok0 + tb * 16u) * p.k + t * 32u;
            let bh0 = coopLoad<coop_mat16x16<f16, B>>(&XH[x], p.k);
            let bh1 = coopLoad<coop_mat16x16<f16, B>>(&XH[x + 16u], p.k);
            let bl0 = coopLoad<coop_mat16x16<f16, B>>(&XL[x], p.k);
            let bl1 = coopLoad<coop_mat16x16<f16, B>>(&XL[x + 16u], p.k);
            acc0 = coopMultiplyAdd(a01, bh1, coopMultiplyAdd(a00, bh0, acc0));
            acc1 = coopMultiplyAdd(a01, bl1, coopMultiplyAdd(a00, bl0, acc1));
            acc2 = coopMultiplyAdd(a11, bh1, coopMultiplyAdd(a10, bh0, acc2));
            acc3 = coopMultiplyAdd(a11, bl1, coopMultiplyAdd(a10, bl0, acc3));
        }
    }
    let v = stage_hl(acc0, acc1, w, lane);
    let u = stage_hl(acc2, acc3, w, lane);
    Y[(tok0 + lane % 16u) * p.rows + row0 + w] = v.h.a.x + v.l.b.w + u.h.a.y + u.l.b.z;
}

// ---- Fourth form: one class (C = 1), warps splitting the tile ----
// out = fold over tasks t in order of acc = fma(s_t, x_t, acc), x_t = Σh·eh + Σl·el (both
// products exact, so x_t is one rounding of an exact sum whichever unit computed the sums).
// Workgroup: 8 warps, tile 64 rows x 128 tokens; warp w takes rows 32 (w / 4) .., tokens
// 32 (w % 4) ..: 2 x 2 blocks. A (64 rows x 32 codes of task t) is staged once per task for all
// warps; B fragments come from global memory. Lane output i (0..32): block i / 8, element
// lane + 32 (i % 8).
var<workgroup> A4: array<f16, 2048>;
var<workgroup> C4: array<f32, 4096>;

fn stage_a4(row0: u32, t: u32, lid: u32) {
    // 256 invocations x 8 codes: row lid / 4, codes 8 (lid % 4) ...
    let r = lid / 4u;
    let q = lid % 4u;
    let word0 = ((row0 + r) * p.k + t * 32u + 8u * q) / 4u;
    let c0 = codes4(W[word0]);
    let c1 = codes4(W[word0 + 1u]);
    let at = r * 32u + 8u * q;
    A4[at] = c0.x;
    A4[at + 1u] = c0.y;
    A4[at + 2u] = c0.z;
    A4[at + 3u] = c0.w;
    A4[at + 4u] = c1.x;
    A4[at + 5u] = c1.y;
    A4[at + 6u] = c1.z;
    A4[at + 7u] = c1.w;
}

fn stage_hl4(h: coop_mat16x16<f32, C>, l: coop_mat16x16<f32, C>, w: u32, lane: u32) -> HL {
    coopStoreT(h, &C4[w * 512u], 16u);
    coopStoreT(l, &C4[w * 512u + 256u], 16u);
    subgroupBarrier();
    let a = w * 512u + lane;
    let b = a + 256u;
    let r = HL(V8(vec4<f32>(C4[a], C4[a + 32u], C4[a + 64u], C4[a + 96u]),
                  vec4<f32>(C4[a + 128u], C4[a + 160u], C4[a + 192u], C4[a + 224u])),
               V8(vec4<f32>(C4[b], C4[b + 32u], C4[b + 64u], C4[b + 96u]),
                  vec4<f32>(C4[b + 128u], C4[b + 160u], C4[b + 192u], C4[b + 224u])));
    subgroupBarrier();
    return r;
}

fn fold1(acc: V8, s: V8, v: HL, e: vec2<f32>) -> V8 {
    return V8(fma(s.a, v.h.a * e.x + v.l.a * e.y, acc.a), fma(s.b, v.h.b * e.x + v.l.b * e.y, acc.b));
}

@compute @workgroup_size(256)
fn tile1(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let w = lid / 32u;
    let lane = lid % 32u;
    let row0 = wg.x * 64u;
    let tok0 = wg.y * 128u;
    let wr = (w / 4u) * 32u;
    let wt = (w % 4u) * 32u;
    let blocks = p.k / 32u;
    var p00 = V8(vec4<f32>(0.0), vec4<f32>(0.0));
    var p01 = p00;
    var p10 = p00;
    var p11 = p00;
    for (var t = 0u; t < p.tasks; t++) {
        workgroupBarrier();
        stage_a4(row0, t, lid);
        workgroupBarrier();
        let a00 = coopLoadT<coop_mat16x16<f16, A>>(&A4[wr * 32u], 32u);
        let a01 = coopLoadT<coop_mat16x16<f16, A>>(&A4[wr * 32u + 16u], 32u);
        let a10 = coopLoadT<coop_mat16x16<f16, A>>(&A4[(wr + 16u) * 32u], 32u);
        let a11 = coopLoadT<coop_mat16x16<f16, A>>(&A4[(wr + 16u) * 32u + 16u], 32u);
        let r0 = row0 + wr + lane / 16u;
        var s0: V8;
        var s1: V8;
        s0.a = vec4<f32>(S2[r0 * p.tasks + t], S2[(r0 + 2u) * p.tasks + t],
                         S2[(r0 + 4u) * p.tasks + t], S2[(r0 + 6u) * p.tasks + t]);
        s0.b = vec4<f32>(S2[(r0 + 8u) * p.tasks + t], S2[(r0 + 10u) * p.tasks + t],
                         S2[(r0 + 12u) * p.tasks + t], S2[(r0 + 14u) * p.tasks + t]);
        s1.a = vec4<f32>(S2[(r0 + 16u) * p.tasks + t], S2[(r0 + 18u) * p.tasks + t],
                         S2[(r0 + 20u) * p.tasks + t], S2[(r0 + 22u) * p.tasks + t]);
        s1.b = vec4<f32>(S2[(r0 + 24u) * p.tasks + t], S2[(r0 + 26u) * p.tasks + t],
                         S2[(r0 + 28u) * p.tasks + t], S2[(r0 + 30u) * p.tasks + t]);
        let zero = coop_mat16x16<f32, C>();
        for (var tb = 0u; tb < 2u; tb++) {
            let x = (tok0 + wt + tb * 16u) * p.k + t * 32u;
            let bh0 = coopLoad<coop_mat16x16<f16, B>>(&XH[x], p.k);
            let bh1 = coopLoad<coop_mat16x16<f16, B>>(&XH[x + 16u], p.k);
            let bl0 = coopLoad<coop_mat16x16<f16, B>>(&XL[x], p.k);
            let bl1 = coopLoad<coop_mat16x16<f16, B>>(&XL[x + 16u], p.k);
            let h0 = coopMultiplyAdd(a01, bh1, coopMultiplyAdd(a00, bh0, zero));
            let l0 = coopMultiplyAdd(a01, bl1, coopMultiplyAdd(a00, bl0, zero));
            let h1 = coopMultiplyAdd(a11, bh1, coopMultiplyAdd(a10, bh0, zero));
            let l1 = coopMultiplyAdd(a11, bl1, coopMultiplyAdd(a10, bl0, zero));
            let e = E2[(tok0 + wt + tb * 16u + lane % 16u) * blocks + t];
            let v0 = stage_hl4(h0, l0, w, lane);
            let v1 = stage_hl4(h1, l1, w, lane);
            if (tb == 0u) {
                p00 = fold1(p00, s0, v0, e);
                p10 = fold1(p10, s1, v1, e);
            } else {
                p01 = fold1(p01, s0, v0, e);
                p11 = fold1(p11, s1, v1, e);
            }
        }
    }
    // Block (rb, tb) of the warp, lane element j: row wr + 16 rb + lane / 16 + 2 j, token
    // wt + 16 tb + lane % 16.
    for (var j = 0u; j < 8u; j++) {
        let rr = row0 + wr + lane / 16u + 2u * j;
        let tt = tok0 + wt + lane % 16u;
        let c = j % 4u;
        let hi = j >= 4u;
        Y[tt * p.rows + rr] = select(p00.a[c], p00.b[c], hi);
        Y[(tt + 16u) * p.rows + rr] = select(p01.a[c], p01.b[c], hi);
        Y[tt * p.rows + rr + 16u] = select(p10.a[c], p10.b[c], hi);
        Y[(tt + 16u) * p.rows + rr + 16u] = select(p11.a[c], p11.b[c], hi);
    }
}

@compute @workgroup_size(256)
fn tile1_nos(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let w = lid / 32u;
    let lane = lid % 32u;
    let row0 = wg.x * 64u;
    let tok0 = wg.y * 128u;
    let wr = (w / 4u) * 32u;
    let wt = (w % 4u) * 32u;
    let blocks = p.k / 32u;
    var p00 = V8(vec4<f32>(0.0), vec4<f32>(0.0));
    var p01 = p00;
    var p10 = p00;
    var p11 = p00;
    for (var t = 0u; t < p.tasks; t++) {
        workgroupBarrier();
        stage_a4(row0, t, lid);
        workgroupBarrier();
        let a00 = coopLoadT<coop_mat16x16<f16, A>>(&A4[wr * 32u], 32u);
        let a01 = coopLoadT<coop_mat16x16<f16, A>>(&A4[wr * 32u + 16u], 32u);
        let a10 = coopLoadT<coop_mat16x16<f16, A>>(&A4[(wr + 16u) * 32u], 32u);
        let a11 = coopLoadT<coop_mat16x16<f16, A>>(&A4[(wr + 16u) * 32u + 16u], 32u);
        let r0 = row0 + wr + lane / 16u;
        var s0: V8;
        var s1: V8;
        s0.a = vec4<f32>(f32(t));
        s0.b = s0.a;
        s1.a = s0.a;
        s1.b = s0.a;
        let zero = coop_mat16x16<f32, C>();
        for (var tb = 0u; tb < 2u; tb++) {
            let x = (tok0 + wt + tb * 16u) * p.k + t * 32u;
            let bh0 = coopLoad<coop_mat16x16<f16, B>>(&XH[x], p.k);
            let bh1 = coopLoad<coop_mat16x16<f16, B>>(&XH[x + 16u], p.k);
            let bl0 = coopLoad<coop_mat16x16<f16, B>>(&XL[x], p.k);
            let bl1 = coopLoad<coop_mat16x16<f16, B>>(&XL[x + 16u], p.k);
            let h0 = coopMultiplyAdd(a01, bh1, coopMultiplyAdd(a00, bh0, zero));
            let l0 = coopMultiplyAdd(a01, bl1, coopMultiplyAdd(a00, bl0, zero));
            let h1 = coopMultiplyAdd(a11, bh1, coopMultiplyAdd(a10, bh0, zero));
            let l1 = coopMultiplyAdd(a11, bl1, coopMultiplyAdd(a10, bl0, zero));
            let e = E2[(tok0 + wt + tb * 16u + lane % 16u) * blocks + t];
            let v0 = stage_hl4(h0, l0, w, lane);
            let v1 = stage_hl4(h1, l1, w, lane);
            if (tb == 0u) {
                p00 = fold1(p00, s0, v0, e);
                p10 = fold1(p10, s1, v1, e);
            } else {
                p01 = fold1(p01, s0, v0, e);
                p11 = fold1(p11, s1, v1, e);
            }
        }
    }
    // Block (rb, tb) of the warp, lane element j: row wr + 16 rb + lane / 16 + 2 j, token
    // wt + 16 tb + lane % 16.
    for (var j = 0u; j < 8u; j++) {
        let rr = row0 + wr + lane / 16u + 2u * j;
        let tt = tok0 + wt + lane % 16u;
        let c = j % 4u;
        let hi = j >= 4u;
        Y[tt * p.rows + rr] = select(p00.a[c], p00.b[c], hi);
        Y[(tt + 16u) * p.rows + rr] = select(p01.a[c], p01.b[c], hi);
        Y[tt * p.rows + rr + 16u] = select(p10.a[c], p10.b[c], hi);
        Y[(tt + 16u) * p.rows + rr + 16u] = select(p11.a[c], p11.b[c], hi);
    }
}

@compute @workgroup_size(256)
fn tile1_noe(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let w = lid / 32u;
    let lane = lid % 32u;
    let row0 = wg.x * 64u;
    let tok0 = wg.y * 128u;
    let wr = (w / 4u) * 32u;
    let wt = (w % 4u) * 32u;
    let blocks = p.k / 32u;
    var ka = coop_mat16x16<f32, C>();
    var kb = coop_mat16x16<f32, C>();
    var kc = coop_mat16x16<f32, C>();
    var kd = coop_mat16x16<f32, C>();
    var p00 = V8(vec4<f32>(0.0), vec4<f32>(0.0));
    var p01 = p00;
    var p10 = p00;
    var p11 = p00;
    for (var t = 0u; t < p.tasks; t++) {
        workgroupBarrier();
        stage_a4(row0, t, lid);
        workgroupBarrier();
        let a00 = coopLoadT<coop_mat16x16<f16, A>>(&A4[wr * 32u], 32u);
        let a01 = coopLoadT<coop_mat16x16<f16, A>>(&A4[wr * 32u + 16u], 32u);
        let a10 = coopLoadT<coop_mat16x16<f16, A>>(&A4[(wr + 16u) * 32u], 32u);
        let a11 = coopLoadT<coop_mat16x16<f16, A>>(&A4[(wr + 16u) * 32u + 16u], 32u);
        let r0 = row0 + wr + lane / 16u;
        var s0: V8;
        var s1: V8;
        s0.a = vec4<f32>(S2[r0 * p.tasks + t], S2[(r0 + 2u) * p.tasks + t],
                         S2[(r0 + 4u) * p.tasks + t], S2[(r0 + 6u) * p.tasks + t]);
        s0.b = vec4<f32>(S2[(r0 + 8u) * p.tasks + t], S2[(r0 + 10u) * p.tasks + t],
                         S2[(r0 + 12u) * p.tasks + t], S2[(r0 + 14u) * p.tasks + t]);
        s1.a = vec4<f32>(S2[(r0 + 16u) * p.tasks + t], S2[(r0 + 18u) * p.tasks + t],
                         S2[(r0 + 20u) * p.tasks + t], S2[(r0 + 22u) * p.tasks + t]);
        s1.b = vec4<f32>(S2[(r0 + 24u) * p.tasks + t], S2[(r0 + 26u) * p.tasks + t],
                         S2[(r0 + 28u) * p.tasks + t], S2[(r0 + 30u) * p.tasks + t]);
        for (var tb = 0u; tb < 2u; tb++) {
            let x = (tok0 + wt + tb * 16u) * p.k + t * 32u;
            let bh0 = coopLoad<coop_mat16x16<f16, B>>(&XH[x], p.k);
            let bh1 = coopLoad<coop_mat16x16<f16, B>>(&XH[x + 16u], p.k);
            let bl0 = coopLoad<coop_mat16x16<f16, B>>(&XL[x], p.k);
            let bl1 = coopLoad<coop_mat16x16<f16, B>>(&XL[x + 16u], p.k);
            ka = coopMultiplyAdd(a01, bh1, ka);
            kb = coopMultiplyAdd(a00, bl0, kb);
            kc = coopMultiplyAdd(a11, bl1, kc);
            kd = coopMultiplyAdd(a10, bh0, kd);
            ka = coopMultiplyAdd(a00, bh0, ka);
            kb = coopMultiplyAdd(a01, bl1, kb);
            kc = coopMultiplyAdd(a10, bl0, kc);
            kd = coopMultiplyAdd(a11, bh1, kd);
        }
    }
    let u0 = stage_hl4(ka, kb, w, lane);
    let u1 = stage_hl4(kc, kd, w, lane);
    p00 = u0.h;
    p01 = u0.l;
    p10 = u1.h;
    p11 = u1.l;
    // Block (rb, tb) of the warp, lane element j: row wr + 16 rb + lane / 16 + 2 j, token
    // wt + 16 tb + lane % 16.
    for (var j = 0u; j < 8u; j++) {
        let rr = row0 + wr + lane / 16u + 2u * j;
        let tt = tok0 + wt + lane % 16u;
        let c = j % 4u;
        let hi = j >= 4u;
        Y[tt * p.rows + rr] = select(p00.a[c], p00.b[c], hi);
        Y[(tt + 16u) * p.rows + rr] = select(p01.a[c], p01.b[c], hi);
        Y[tt * p.rows + rr + 16u] = select(p10.a[c], p10.b[c], hi);
        Y[(tt + 16u) * p.rows + rr + 16u] = select(p11.a[c], p11.b[c], hi);
    }
}

// Decode form of the fourth arithmetic: lanes compute x_t side by side (exact block sums), then
// lane 0 folds acc = fma(s_t, x_t, acc) in task order.
var<workgroup> XT: array<f32, 1024>;

@compute @workgroup_size(32)
fn reference1(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wg.x;
    let tok = wg.y;
    for (var t = lid; t < p.tasks; t += 32u) {
        let e = E2[tok * (p.k / 32u) + t];
        var h = 0.0;
        var l = 0.0;
        for (var i = 0u; i < 32u; i++) {
            let cd = code(row, t * 32u + i);
            h = fma(cd, f32(XH[tok * p.k + t * 32u + i]) * e.x, h);
            l = fma(cd, f32(XL[tok * p.k + t * 32u + i]) * e.y, l);
        }
        XT[t] = h + l;
    }
    workgroupBarrier();
    if (lid == 0u) {
        var acc = 0.0;
        for (var t = 0u; t < p.tasks; t++) {
            acc = fma(S2[row * p.tasks + t], XT[t], acc);
        }
        Y[tok * p.rows + row] = acc;
    }
}

// tile1 with 32 x 64 per warp (2 x 4 blocks), 128 x 128 per workgroup (warps 4 x 2): each A
// fragment feeds 4 block pairs, each B fragment 2.
var<workgroup> A5: array<f16, 4096>;

fn stage_a5(row0: u32, t: u32, lid: u32) {
    // 256 invocations x 16 codes: row lid / 2, codes 16 (lid % 2) ...
    let r = lid / 2u;
    let q = lid % 2u;
    let word0 = ((row0 + r) * p.k + t * 32u + 16u * q) / 4u;
    let at = r * 32u + 16u * q;
    for (var j = 0u; j < 4u; j++) {
        let c = codes4(W[word0 + j]);
        A5[at + 4u * j] = c.x;
        A5[at + 4u * j + 1u] = c.y;
        A5[at + 4u * j + 2u] = c.z;
        A5[at + 4u * j + 3u] = c.w;
    }
}

fn scales16(r0: u32, t: u32) -> V8 {
    return V8(vec4<f32>(S2[r0 * p.tasks + t], S2[(r0 + 2u) * p.tasks + t],
                        S2[(r0 + 4u) * p.tasks + t], S2[(r0 + 6u) * p.tasks + t]),
              vec4<f32>(S2[(r0 + 8u) * p.tasks + t], S2[(r0 + 10u) * p.tasks + t],
                        S2[(r0 + 12u) * p.tasks + t], S2[(r0 + 14u) * p.tasks + t]));
}

struct P8 {
    b0: V8,
    b1: V8,
    b2: V8,
    b3: V8,
}

fn p8_get(q: P8, tb: u32) -> V8 {
    switch tb {
        case 0u: { return q.b0; }
        case 1u: { return q.b1; }
        case 2u: { return q.b2; }
        default: { return q.b3; }
    }
}

fn p8_set(q: P8, tb: u32, v: V8) -> P8 {
    var r = q;
    switch tb {
        case 0u: { r.b0 = v; }
        case 1u: { r.b1 = v; }
        case 2u: { r.b2 = v; }
        default: { r.b3 = v; }
    }
    return r;
}

fn put_block(acc: V8, row: u32, tok: u32) {
    for (var j = 0u; j < 8u; j++) {
        let c = j % 4u;
        Y[tok * p.rows + row + 2u * j] = select(acc.a[c], acc.b[c], j >= 4u);
    }
}

@compute @workgroup_size(256)
fn tile1w(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let w = lid / 32u;
    let lane = lid % 32u;
    let row0 = wg.x * 128u;
    let tok0 = wg.y * 128u;
    let wr = (w / 2u) * 32u;
    let wt = (w % 2u) * 64u;
    let blocks = p.k / 32u;
    let z = V8(vec4<f32>(0.0), vec4<f32>(0.0));
    var q0 = P8(z, z, z, z);
    var q1 = P8(z, z, z, z);
    for (var t = 0u; t < p.tasks; t++) {
        workgroupBarrier();
        stage_a5(row0, t, lid);
        workgroupBarrier();
        let a00 = coopLoadT<coop_mat16x16<f16, A>>(&A5[wr * 32u], 32u);
        let a01 = coopLoadT<coop_mat16x16<f16, A>>(&A5[wr * 32u + 16u], 32u);
        let a10 = coopLoadT<coop_mat16x16<f16, A>>(&A5[(wr + 16u) * 32u], 32u);
        let a11 = coopLoadT<coop_mat16x16<f16, A>>(&A5[(wr + 16u) * 32u + 16u], 32u);
        let r0 = row0 + wr + lane / 16u;
        let s0 = scales16(r0, t);
        let s1 = scales16(r0 + 16u, t);
        let zero = coop_mat16x16<f32, C>();
        for (var tb = 0u; tb < 4u; tb++) {
            let x = (tok0 + wt + tb * 16u) * p.k + t * 32u;
            let bh0 = coopLoad<coop_mat16x16<f16, B>>(&XH[x], p.k);
            let bh1 = coopLoad<coop_mat16x16<f16, B>>(&XH[x + 16u], p.k);
            let bl0 = coopLoad<coop_mat16x16<f16, B>>(&XL[x], p.k);
            let bl1 = coopLoad<coop_mat16x16<f16, B>>(&XL[x + 16u], p.k);
            let h0 = coopMultiplyAdd(a01, bh1, coopMultiplyAdd(a00, bh0, zero));
            let l0 = coopMultiplyAdd(a01, bl1, coopMultiplyAdd(a00, bl0, zero));
            let h1 = coopMultiplyAdd(a11, bh1, coopMultiplyAdd(a10, bh0, zero));
            let l1 = coopMultiplyAdd(a11, bl1, coopMultiplyAdd(a10, bl0, zero));
            let e = E2[(tok0 + wt + tb * 16u + lane % 16u) * blocks + t];
            let v0 = stage_hl4(h0, l0, w, lane);
            let v1 = stage_hl4(h1, l1, w, lane);
            q0 = p8_set(q0, tb, fold1(p8_get(q0, tb), s0, v0, e));
            q1 = p8_set(q1, tb, fold1(p8_get(q1, tb), s1, v1, e));
        }
    }
    let rr = row0 + wr + lane / 16u;
    let tt = tok0 + wt + lane % 16u;
    for (var tb = 0u; tb < 4u; tb++) {
        put_block(p8_get(q0, tb), rr, tt + 16u * tb);
        put_block(p8_get(q1, tb), rr + 16u, tt + 16u * tb);
    }
}
