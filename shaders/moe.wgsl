// MoE routing and combination (model-spec 2.8).
//   moe_router: per token: softmax over all experts (in place), top-k with the lowest id winning
//               ties (best first), weights renormalised over the chosen k. One workgroup per
//               token, fixed reduction trees, so the result has one fixed order.
//   moe_combine: Y[t, i] = sum_slot W[t,slot] * D[t*k+slot, i]  (slots in order)
//                          + sigmoid(SG[t]) * SH[t, i]          (shared expert, when present)
//   moe_combine_hc: the same sum added into the wide residual as hc.wgsl's hc_combine does:
//                   Y[t, s*h+i] += 2 sigmoid(INJ[t*hc+s] / hc) * sum, streams in order

struct Params {
    tokens: u32,
    n_expert: u32,
    k: u32,
    h: u32,
    has_shared: u32,
    hc: u32,            // moe_combine_hc: residual streams
}

var<immediate> p: Params;

@group(0) @binding(0) var<storage, read_write> LOGITS: array<f32>; // [T, n_expert]
@group(0) @binding(1) var<storage, read_write> IDS: array<u32>;    // [T*k]
@group(0) @binding(2) var<storage, read_write> WTS: array<f32>;    // [T*k]

const ROUTER_WG: u32 = 64u;
const NO_EXPERT: u32 = 0xffffffffu;
var<workgroup> red_value: array<f32, ROUTER_WG>;
var<workgroup> red_id: array<u32, ROUTER_WG>;

// Whether (v, e) ranks before (best_v, best_e): higher probability first, the lower id on ties.
fn ranks_before(v: f32, e: u32, best_v: f32, best_e: u32) -> bool {
    return e != NO_EXPERT && (best_e == NO_EXPERT || v > best_v || (v == best_v && e < best_e));
}

// Fixed-shape binary trees over the workgroup (pairs lid, lid + s for s = 32, 16, ..., 1).
fn tree_max(v: f32, lid: u32) -> f32 {
    red_value[lid] = v;
    workgroupBarrier();
    for (var s = ROUTER_WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            red_value[lid] = max(red_value[lid], red_value[lid + s]);
        }
        workgroupBarrier();
    }
    let total = red_value[0];
    workgroupBarrier();
    return total;
}

fn tree_sum(v: f32, lid: u32) -> f32 {
    red_value[lid] = v;
    workgroupBarrier();
    for (var s = ROUTER_WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            red_value[lid] = red_value[lid] + red_value[lid + s];
        }
        workgroupBarrier();
    }
    let total = red_value[0];
    workgroupBarrier();
    return total;
}

struct Ranked {
    value: f32,
    id: u32,
}

// The best-ranked (value, id) over the workgroup; ids are distinct, so the winner does not
// depend on the tree's shape.
fn tree_best(v: f32, e: u32, lid: u32) -> Ranked {
    red_value[lid] = v;
    red_id[lid] = e;
    workgroupBarrier();
    for (var s = ROUTER_WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s && ranks_before(red_value[lid + s], red_id[lid + s], red_value[lid], red_id[lid])) {
            red_value[lid] = red_value[lid + s];
            red_id[lid] = red_id[lid + s];
        }
        workgroupBarrier();
    }
    let best = Ranked(red_value[0], red_id[0]);
    workgroupBarrier();
    return best;
}

// One workgroup per token; invocation l owns experts l, l+64, ... (it writes and rereads only
// those). The softmax sum is per-invocation sums in expert order, then a fixed tree. Slot s takes
// the best-ranked expert ranked after slot s-1's choice, which is the original "best of the
// experts not yet taken" without a taken list.
@compute @workgroup_size(ROUTER_WG)
fn moe_router(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>) {
    let t = wg.x + wg.y * 65535u;
    // Uniform per workgroup, so the early return keeps the barriers uniform.
    if (t >= p.tokens) {
        return;
    }
    let lid = lid3.x;
    let base = t * p.n_expert;
    var local_max = -3.402823e38;
    for (var e = lid; e < p.n_expert; e += ROUTER_WG) {
        local_max = max(local_max, LOGITS[base + e]);
    }
    let mx = tree_max(local_max, lid);
    var local_sum = 0.0;
    for (var e = lid; e < p.n_expert; e += ROUTER_WG) {
        let v = exp(LOGITS[base + e] - mx);
        LOGITS[base + e] = v;
        local_sum += v;
    }
    let inv = 1.0 / tree_sum(local_sum, lid);
    for (var e = lid; e < p.n_expert; e += ROUTER_WG) {
        LOGITS[base + e] *= inv;
    }
    var total = 0.0;
    var prev_e = NO_EXPERT;
    var prev_v = 0.0;
    for (var slot = 0u; slot < p.k; slot++) {
        var best_e = NO_EXPERT;
        var best_v = 0.0;
        for (var e = lid; e < p.n_expert; e += ROUTER_WG) {
            let v = LOGITS[base + e];
            let after_prev = prev_e == NO_EXPERT || ranks_before(prev_v, prev_e, v, e);
            if (after_prev && ranks_before(v, e, best_v, best_e)) {
                best_e = e;
                best_v = v;
            }
        }
        let best = tree_best(best_v, best_e, lid);
        var chosen = best.id;
        var chosen_v = best.value;
        if (chosen == NO_EXPERT) {
            // Only when the probabilities are NaN (nothing compares): keep the id in range and
            // let the NaN reach the weights, where the caller's finiteness check reports it.
            chosen = min(slot, p.n_expert - 1u);
            chosen_v = inv * (inv - inv);
        }
        prev_e = chosen;
        prev_v = chosen_v;
        total += chosen_v;
        if (lid == 0u) {
            IDS[t * p.k + slot] = chosen;
            WTS[t * p.k + slot] = chosen_v;
        }
    }
    if (lid == 0u) {
        for (var slot = 0u; slot < p.k; slot++) {
            WTS[t * p.k + slot] = WTS[t * p.k + slot] / total;
        }
    }
}

@group(0) @binding(3) var<storage, read> D: array<f32>;   // [T*k, h] expert outputs
@group(0) @binding(4) var<storage, read> W: array<f32>;   // [T*k] routing weights
@group(0) @binding(5) var<storage, read> SH: array<f32>;  // [T, h] shared expert output
@group(0) @binding(6) var<storage, read> SG: array<f32>;  // [T] shared gate logit
@group(0) @binding(7) var<storage, read_write> Y: array<f32>;

@group(0) @binding(8) var<storage, read> INJ: array<f32>; // [T, hc] injection logits

fn combined(t: u32, i: u32) -> f32 {
    var acc = 0.0;
    for (var slot = 0u; slot < p.k; slot++) {
        let item = t * p.k + slot;
        acc += W[item] * D[item * p.h + i];
    }
    if (p.has_shared != 0u) {
        acc += (1.0 / (1.0 + exp(-SG[t]))) * SH[t * p.h + i];
    }
    return acc;
}

@compute @workgroup_size(64)
fn moe_combine_hc(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x;
    let t = id.y;
    if (i >= p.h || t >= p.tokens) {
        return;
    }
    let y = combined(t, i);
    let wide = p.h * p.hc;
    for (var s = 0u; s < p.hc; s++) {
        let alpha = 2.0 * (1.0 / (1.0 + exp(-(INJ[t * p.hc + s] * (1.0 / f32(p.hc))))));
        Y[t * wide + s * p.h + i] += alpha * y;
    }
}

@compute @workgroup_size(64)
fn moe_combine(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x;
    let t = id.y;
    if (i >= p.h || t >= p.tokens) {
        return;
    }
    Y[t * p.h + i] = combined(t, i);
}
