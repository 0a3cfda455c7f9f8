// RMS-type norms over groups of `n` values, one workgroup per (group, token).
//   mode 0: centred RMSNorm   y = x / sqrt(mean(x^2) + eps) * w * scale
//   mode 1: L2 norm           y = x / sqrt(sum(x^2) + eps) * w * scale
// `w` is Wt[(g*n + i) % w_period] (w_period = 0: no weight), so one entry covers plain norms
// (period n), per-stream grouped norms whose weight spans all streams (period groups*n) and
// per-head norms that share one weight. `rmsnorm_gated` multiplies by sigmoid(Z) too (GDN output).
// Reduction order is fixed: thread l sums i = l, l+256, ... in order, `subgroupAdd` combines each
// subgroup (one fixed order per device), then every thread adds the subgroup sums in subgroup order.
// 256 threads (not 64) so a 2560-wide row is 10 loads per thread, not 40 dependent-latency steps.

struct Params {
    n: u32,
    groups: u32,
    tokens: u32,
    mode: u32,
    in_off: u32,
    in_gstride: u32,
    in_tstride: u32,
    out_off: u32,
    out_gstride: u32,
    out_tstride: u32,
    w_period: u32,
    eps: f32,
    scale: f32,
    half: u32,          // rmsnorm_rope: rotated pairs (i, i + half) per group
    pos0: u32,          // rmsnorm_rope: position of token 0, and between tokens
    pos_step: u32,
}

var<immediate> p: Params;

@group(0) @binding(0) var<storage, read> X: array<f32>;
@group(0) @binding(1) var<storage, read_write> Y: array<f32>;
@group(0) @binding(2) var<storage, read> Wt: array<f32>;
@group(0) @binding(3) var<storage, read> Z: array<f32>;
// rmsnorm_rope: (cos, sin) per position and pair, as qsa.wgsl's rope reads it.
@group(0) @binding(4) var<storage, read> ROPE: array<f32>;

const WG: u32 = 256u;
// One slot per subgroup (at least 1 lane per subgroup, so never more than WG subgroups).
var<workgroup> red: array<f32, WG>;

struct Lane {
    sg_lane: u32,
    sg_id: u32,
    n_sg: u32,
}

fn block_sum(v: f32, lane: Lane) -> f32 {
    let s = subgroupAdd(v);
    if (lane.sg_lane == 0u) {
        red[lane.sg_id] = s;
    }
    workgroupBarrier();
    var total = 0.0;
    for (var i = 0u; i < lane.n_sg; i++) {
        total += red[i];
    }
    return total;
}

fn inv_norm(sum_sq: f32) -> f32 {
    if (p.mode == 0u) {
        return 1.0 / sqrt(sum_sq / f32(p.n) + p.eps);
    }
    return 1.0 / sqrt(sum_sq + p.eps);
}

// This invocation's sum of squares of X[src + i], i = l, l + WG, ... < n, in that order. Four loads
// are issued together (the same sequential fma order), so a wide row costs a few memory latencies,
// not one per value.
fn sum_sq_x(src: u32, l: u32) -> f32 {
    var acc = 0.0;
    var i = l;
    for (; i + 3u * WG < p.n; i += 4u * WG) {
        let a = X[src + i];
        let b = X[src + i + WG];
        let c = X[src + i + 2u * WG];
        let d = X[src + i + 3u * WG];
        acc = fma(d, d, fma(c, c, fma(b, b, fma(a, a, acc))));
    }
    for (; i < p.n; i += WG) {
        let v = X[src + i];
        acc = fma(v, v, acc);
    }
    return acc;
}

// sum_sq_x over Y (the in-place entry points), the same order.
fn sum_sq_y(base: u32, l: u32) -> f32 {
    var acc = 0.0;
    var i = l;
    for (; i + 3u * WG < p.n; i += 4u * WG) {
        let a = Y[base + i];
        let b = Y[base + i + WG];
        let c = Y[base + i + 2u * WG];
        let d = Y[base + i + 3u * WG];
        acc = fma(d, d, fma(c, c, fma(b, b, fma(a, a, acc))));
    }
    for (; i < p.n; i += WG) {
        let v = Y[base + i];
        acc = fma(v, v, acc);
    }
    return acc;
}

fn weight(g: u32, i: u32) -> f32 {
    if (p.w_period == 0u) {
        return 1.0;
    }
    return Wt[(g * p.n + i) % p.w_period];
}

// X[src + l + k * WG] (0 past the group).
fn x_at(src: u32, l: u32, k: u32) -> f32 {
    let i = l + k * WG;
    if (i < p.n) {
        return X[src + i];
    }
    return 0.0;
}

// rmsnorm of a group of at most 12 * WG values: the thread's (up to 12) values and weights are
// loaded at once and kept in registers, so the group costs one memory latency, not one per
// batch of 4 and then the reread. The same arithmetic in the same order as the loop form: the
// sum is the same sequential fma over i = l, l + WG, ... (the zeros past the group add nothing),
// and each output is x * inv * w * scale.
fn rmsnorm_short(g: u32, src: u32, dst: u32, l: u32, lane: Lane) {
    let a = vec4<f32>(x_at(src, l, 0u), x_at(src, l, 1u), x_at(src, l, 2u), x_at(src, l, 3u));
    let b = vec4<f32>(x_at(src, l, 4u), x_at(src, l, 5u), x_at(src, l, 6u), x_at(src, l, 7u));
    let c = vec4<f32>(x_at(src, l, 8u), x_at(src, l, 9u), x_at(src, l, 10u), x_at(src, l, 11u));
    var acc = 0.0;
    acc = fma(a.w, a.w, fma(a.z, a.z, fma(a.y, a.y, fma(a.x, a.x, acc))));
    acc = fma(b.w, b.w, fma(b.z, b.z, fma(b.y, b.y, fma(b.x, b.x, acc))));
    acc = fma(c.w, c.w, fma(c.z, c.z, fma(c.y, c.y, fma(c.x, c.x, acc))));
    let inv = inv_norm(block_sum(acc, lane));
    put_short(g, dst, l, 0u, a.x, inv);
    put_short(g, dst, l, 1u, a.y, inv);
    put_short(g, dst, l, 2u, a.z, inv);
    put_short(g, dst, l, 3u, a.w, inv);
    put_short(g, dst, l, 4u, b.x, inv);
    put_short(g, dst, l, 5u, b.y, inv);
    put_short(g, dst, l, 6u, b.z, inv);
    put_short(g, dst, l, 7u, b.w, inv);
    put_short(g, dst, l, 8u, c.x, inv);
    put_short(g, dst, l, 9u, c.y, inv);
    put_short(g, dst, l, 10u, c.z, inv);
    put_short(g, dst, l, 11u, c.w, inv);
}

fn put_short(g: u32, dst: u32, l: u32, k: u32, x: f32, inv: f32) {
    let i = l + k * WG;
    if (i < p.n) {
        Y[dst + i] = x * inv * weight(g, i) * p.scale;
    }
}

@compute @workgroup_size(WG)
fn rmsnorm(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(subgroup_invocation_id) sg_lane: u32, @builtin(subgroup_id) sg_id: u32,
        @builtin(num_subgroups) n_sg: u32) {
    let g = wg.x;
    let t = wg.y;
    let src = p.in_off + t * p.in_tstride + g * p.in_gstride;
    let dst = p.out_off + t * p.out_tstride + g * p.out_gstride;
    if (p.n <= 12u * WG) {
        rmsnorm_short(g, src, dst, lid.x, Lane(sg_lane, sg_id, n_sg));
        return;
    }
    let inv = inv_norm(block_sum(sum_sq_x(src, lid.x), Lane(sg_lane, sg_id, n_sg)));
    var i = lid.x;
    for (; i + 3u * WG < p.n; i += 4u * WG) {
        let a = X[src + i];
        let b = X[src + i + WG];
        let c = X[src + i + 2u * WG];
        let d = X[src + i + 3u * WG];
        Y[dst + i] = a * inv * weight(g, i) * p.scale;
        Y[dst + i + WG] = b * inv * weight(g, i + WG) * p.scale;
        Y[dst + i + 2u * WG] = c * inv * weight(g, i + 2u * WG) * p.scale;
        Y[dst + i + 3u * WG] = d * inv * weight(g, i + 3u * WG) * p.scale;
    }
    for (; i < p.n; i += WG) {
        Y[dst + i] = X[src + i] * inv * weight(g, i) * p.scale;
    }
}

@compute @workgroup_size(WG)
fn rmsnorm_inplace(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(subgroup_invocation_id) sg_lane: u32, @builtin(subgroup_id) sg_id: u32,
        @builtin(num_subgroups) n_sg: u32) {
    let g = wg.x;
    let t = wg.y;
    let base = p.in_off + t * p.in_tstride + g * p.in_gstride;
    let inv = inv_norm(block_sum(sum_sq_y(base, lid.x), Lane(sg_lane, sg_id, n_sg)));
    for (var i = lid.x; i < p.n; i += WG) {
        Y[base + i] = Y[base + i] * inv * weight(g, i) * p.scale;
    }
}

@compute @workgroup_size(WG)
fn rmsnorm_gated(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(subgroup_invocation_id) sg_lane: u32, @builtin(subgroup_id) sg_id: u32,
        @builtin(num_subgroups) n_sg: u32) {
    let g = wg.x;
    let t = wg.y;
    let src = p.in_off + t * p.in_tstride + g * p.in_gstride;
    let dst = p.out_off + t * p.out_tstride + g * p.out_gstride;
    let inv = inv_norm(block_sum(sum_sq_x(src, lid.x), Lane(sg_lane, sg_id, n_sg)));
    for (var i = lid.x; i < p.n; i += WG) {
        let gate = 1.0 / (1.0 + exp(-Z[src + i]));
        Y[dst + i] = X[src + i] * inv * weight(g, i) * gate;
    }
}

// rmsnorm_inplace followed by qsa.wgsl's rope (partial NeoX rotation of pairs (i, i + half) at
// position pos0 + t * pos_step), one dispatch instead of two with the same arithmetic: each value
// is normed exactly as rmsnorm_inplace stores it, then rotated exactly as rope rotates it. Every
// read of the sum comes before block_sum's barrier, and each value is then read and written by
// one invocation only.
@compute @workgroup_size(WG)
fn rmsnorm_rope(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(subgroup_invocation_id) sg_lane: u32, @builtin(subgroup_id) sg_id: u32,
        @builtin(num_subgroups) n_sg: u32) {
    norm_rope_y(wg.x, wg.y, lid.x, Lane(sg_lane, sg_id, n_sg));
}

// Group g of token t of Y (layout p.in_*, weight Wt): normed in place, then rotated.
fn norm_rope_y(g: u32, t: u32, l: u32, lane: Lane) {
    let base = p.in_off + t * p.in_tstride + g * p.in_gstride;
    let inv = inv_norm(block_sum(sum_sq_y(base, l), lane));
    let pos = p.pos0 + t * p.pos_step;
    for (var i = l; i < p.half; i += WG) {
        let a = Y[base + i] * inv * weight(g, i) * p.scale;
        let b = Y[base + p.half + i] * inv * weight(g, p.half + i) * p.scale;
        let c = ROPE[(pos * p.half + i) * 2u];
        let s = ROPE[(pos * p.half + i) * 2u + 1u];
        Y[base + i] = a * c - b * s;
        Y[base + p.half + i] = b * c + a * s;
    }
    for (var i = 2u * p.half + l; i < p.n; i += WG) {
        Y[base + i] = Y[base + i] * inv * weight(g, i) * p.scale;
    }
}

// rmsnorm_rope over two sets of groups in one dispatch (the queries' heads and the keys' heads of
// an attention layer, which sit in different buffers): workgroups x < p.groups take set A (Y, Wt,
// p.in_*), the rest set B (Y2, W2, its offset and strides in p.out_*, unused in place). Both share
// n, mode, eps, scale, the weight period and the rotation. Each group's arithmetic is
// rmsnorm_rope's, so the same bits as two dispatches. The branch is uniform per workgroup, so the
// barrier inside block_sum stays in uniform control flow.
@group(0) @binding(5) var<storage, read_write> Y2: array<f32>;
@group(0) @binding(6) var<storage, read> W2: array<f32>;

fn sum_sq_y2(base: u32, l: u32) -> f32 {
    var acc = 0.0;
    var i = l;
    for (; i + 3u * WG < p.n; i += 4u * WG) {
        let a = Y2[base + i];
        let b = Y2[base + i + WG];
        let c = Y2[base + i + 2u * WG];
        let d = Y2[base + i + 3u * WG];
        acc = fma(d, d, fma(c, c, fma(b, b, fma(a, a, acc))));
    }
    for (; i < p.n; i += WG) {
        let v = Y2[base + i];
        acc = fma(v, v, acc);
    }
    return acc;
}

fn weight2(g: u32, i: u32) -> f32 {
    if (p.w_period == 0u) {
        return 1.0;
    }
    return W2[(g * p.n + i) % p.w_period];
}

@compute @workgroup_size(WG)
fn rmsnorm_rope2(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(subgroup_invocation_id) sg_lane: u32, @builtin(subgroup_id) sg_id: u32,
        @builtin(num_subgroups) n_sg: u32) {
    let t = wg.y;
    let lane = Lane(sg_lane, sg_id, n_sg);
    if (wg.x < p.groups) {
        norm_rope_y(wg.x, t, lid.x, lane);
    } else {
        // norm_rope_y over Y2 and W2 (a WGSL function cannot take the buffer as a parameter).
        let g = wg.x - p.groups;
        let pos = p.pos0 + t * p.pos_step;
        let base = p.out_off + t * p.out_tstride + g * p.out_gstride;
        let inv = inv_norm(block_sum(sum_sq_y2(base, lid.x), lane));
        for (var i = lid.x; i < p.half; i += WG) {
            let a = Y2[base + i] * inv * weight2(g, i) * p.scale;
            let b = Y2[base + p.half + i] * inv * weight2(g, p.half + i) * p.scale;
            let c = ROPE[(pos * p.half + i) * 2u];
            let s = ROPE[(pos * p.half + i) * 2u + 1u];
            Y2[base + i] = a * c - b * s;
            Y2[base + p.half + i] = b * c + a * s;
        }
        for (var i = 2u * p.half + lid.x; i < p.n; i += WG) {
            Y2[base + i] = Y2[base + i] * inv * weight2(g, i) * p.scale;
        }
    }
}
