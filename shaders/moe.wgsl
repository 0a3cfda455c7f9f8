// MoE routing and combination (model-spec 2.8).
//   moe_router: per token: softmax over all experts (in place), top-k with the lowest id winning
//               ties (best first), weights renormalised over the chosen k. One workgroup per
//               token, fixed reduction trees, so the result has one fixed order.
//   moe_group:  the chunk's (token, slot) items grouped by expert for prefill: GROUPS[e] = how many
//               items chose expert e, their item indices (token * k + slot) in ascending order from
//               GROUPS[n_expert + e * tokens]. Integer prefix sums only: one fixed result.
//   moe_split_ids: the items' experts split between a layer's VRAM copy of its hot experts and
//               the full tensor in host memory: HOT[i] = MAP[map_offset + IDS[i]] (the expert's
//               slot, or NO_EXPERT), COLD[i] = IDS[i] when it has no slot, else NO_EXPERT. The
//               expert kernels skip NO_EXPERT items, so each item is computed from one place.
//               STAGE[i] = i where item i has no hot copy, else NO_EXPERT: its unit in the VRAM
//               stage that decode copies the missed experts into (stage.wgsl).
//               LOG[log_offset + i] = IDS[i] keeps the layer's choices for the host.
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

// Per-subgroup winners of a top-k round, two rounds' worth (by parity: a round's slots are
// rewritten two rounds later, after every invocation has passed the round in between).
var<workgroup> sg_best_v: array<f32, 2u * ROUTER_WG>;
var<workgroup> sg_best_e: array<u32, 2u * ROUTER_WG>;

// The best-ranked (value, id) over the workgroup: each subgroup's best by subgroupMax of the
// value and subgroupMin of the ids holding it (both exact), then the subgroups' winners in a
// fixed scan. Ids are distinct and the ranking is a strict order, so the winner is the one the
// ranking defines, whatever the subgroup size. One barrier. A NaN candidate never wins (NaN
// probabilities leave every slot without an expert, which the caller reports).
fn workgroup_best(v: f32, e: u32, lane_sg: vec3<u32>, parity: u32) -> Ranked {
    let sg_id = lane_sg.x;
    let n_sg = lane_sg.y;
    let lane = lane_sg.z;
    let valid = e != NO_EXPERT && v == v;
    let key = select(-1.0, v, valid);
    let m = subgroupMax(key);
    let id = subgroupMin(select(NO_EXPERT, e, valid && key == m));
    let slot = parity * ROUTER_WG;
    if (lane == 0u) {
        sg_best_v[slot + sg_id] = m;
        sg_best_e[slot + sg_id] = id;
    }
    workgroupBarrier();
    var best = Ranked(0.0, NO_EXPERT);
    for (var g = 0u; g < n_sg; g++) {
        let gv = sg_best_v[slot + g];
        let ge = sg_best_e[slot + g];
        if (ranks_before(gv, ge, best.value, best.id)) {
            best = Ranked(gv, ge);
        }
    }
    return best;
}

// moe_router: one workgroup of RT_WG invocations per token; invocation l holds the probabilities
// of experts l, l + RT_WG, l + 2 RT_WG, l + 3 RT_WG in registers (routers of up to 4 RT_WG
// experts; more take moe_router_wide, chosen by the launcher from the expert count and k alone).
// Softmax: the max is exact in any order; the sum is each invocation's values in expert order,
// then the subgroup sums (subgroupAdd, one fixed order per device), then the subgroups' sums in
// subgroup order. Top-k without a barrier per round: each subgroup ranks its own best k (k rounds
// of subgroupMax / subgroupMin), then subgroup 0 ranks the subgroups' candidates (the global best
// k are among them). The ranking is a strict order, so the result is the one it defines.
const RT_WG: u32 = 256u;
// Candidates in workgroup memory: k of each of up to RT_WG / 4 subgroups (k <= 16).
const RT_CAND: u32 = 1024u;
var<workgroup> rt_part: array<f32, RT_WG>;
var<workgroup> cand_v: array<f32, RT_CAND>;
var<workgroup> cand_e: array<u32, RT_CAND>;
// The workgroup's total of one value per invocation (max when `is_max`), as described above.
fn rt_reduce(v: f32, is_max: bool, sg_id: u32, n_sg: u32, lane: u32) -> f32 {
    var s: f32;
    if (is_max) {
        s = subgroupMax(v);
    } else {
        s = subgroupAdd(v);
    }
    if (lane == 0u) {
        rt_part[sg_id] = s;
    }
    workgroupBarrier();
    var total = rt_part[0];
    for (var g = 1u; g < n_sg; g++) {
        if (is_max) {
            total = max(total, rt_part[g]);
        } else {
            total += rt_part[g];
        }
    }
    workgroupBarrier();
    return total;
}

fn rt_load(base: u32, e: u32) -> f32 {
    if (e < p.n_expert) {
        return LOGITS[base + e];
    }
    return -3.402823e38;
}

fn rt_best(v: f32, e: u32, prev_v: f32, prev_e: u32, best: Ranked) -> Ranked {
    let after_prev = prev_e == NO_EXPERT || ranks_before(prev_v, prev_e, v, e);
    if (e < p.n_expert && after_prev && ranks_before(v, e, best.value, best.id)) {
        return Ranked(v, e);
    }
    return best;
}

// The subgroup's best (value, id): subgroupMax of the values, subgroupMin of the ids holding it.
fn sg_best(r: Ranked) -> Ranked {
    let valid = r.id != NO_EXPERT && r.value == r.value;
    let key = select(-1.0, r.value, valid);
    let m = subgroupMax(key);
    let id = subgroupMin(select(NO_EXPERT, r.id, valid && key == m));
    return Ranked(m, id);
}

@compute @workgroup_size(RT_WG)
fn moe_router(@builtin(workgroup_id) wg: vec3<u32>,
              @builtin(local_invocation_id) lid3: vec3<u32>,
              @builtin(subgroup_id) sg_id: u32, @builtin(num_subgroups) n_sg: u32,
              @builtin(subgroup_invocation_id) lane: u32,
              @builtin(subgroup_size) sg_size: u32) {
    let t = wg.x + wg.y * 65535u;
    // Uniform per workgroup, so the early return keeps the barriers uniform.
    if (t >= p.tokens) {
        return;
    }
    let lid = lid3.x;
    let base = t * p.n_expert;
    let e = vec4<u32>(lid, lid + RT_WG, lid + 2u * RT_WG, lid + 3u * RT_WG);
    var v = vec4<f32>(rt_load(base, e.x), rt_load(base, e.y), rt_load(base, e.z),
                      rt_load(base, e.w));
    let mx = rt_reduce(max(max(max(max(-3.402823e38, v.x), v.y), v.z), v.w), true, sg_id,
                       n_sg, lane);
    let live = e < vec4<u32>(p.n_expert);
    v = select(vec4<f32>(0.0), exp(v - mx), live);
    let inv = 1.0 / rt_reduce(((v.x + v.y) + v.z) + v.w, false, sg_id, n_sg, lane);
    v *= inv;
    if (live.x) { LOGITS[base + e.x] = v.x; }
    if (live.y) { LOGITS[base + e.y] = v.y; }
    if (live.z) { LOGITS[base + e.z] = v.z; }
    if (live.w) { LOGITS[base + e.w] = v.w; }
    // This subgroup's best k, best first.
    var prev = Ranked(0.0, NO_EXPERT);
    for (var slot = 0u; slot < p.k; slot++) {
        var best = Ranked(0.0, NO_EXPERT);
        best = rt_best(v.x, e.x, prev.value, prev.id, best);
        best = rt_best(v.y, e.y, prev.value, prev.id, best);
        best = rt_best(v.z, e.z, prev.value, prev.id, best);
        best = rt_best(v.w, e.w, prev.value, prev.id, best);
        let got = sg_best(best);
        if (got.id != NO_EXPERT) {
            prev = got;
        }
        if (lane == 0u) {
            cand_v[sg_id * p.k + slot] = got.value;
            cand_e[sg_id * p.k + slot] = got.id;
        }
    }
    workgroupBarrier();
    if (sg_id != 0u) {
        return;
    }
    // Subgroup 0 ranks the n_sg * k candidates (NO_EXPERT ones never win).
    let n_cand = n_sg * p.k;
    var total = 0.0;
    prev = Ranked(0.0, NO_EXPERT);
    for (var slot = 0u; slot < p.k; slot++) {
        var best = Ranked(0.0, NO_EXPERT);
        for (var c = lane; c < n_cand; c += sg_size) {
            best = rt_best(cand_v[c], cand_e[c], prev.value, prev.id, best);
        }
        var won = sg_best(best);
        if (won.id == NO_EXPERT) {
            // Only when the probabilities are NaN (nothing compares): keep the id in range and
            // let the NaN reach the weights, where the caller's finiteness check reports it.
            won = Ranked(inv * (inv - inv), min(slot, p.n_expert - 1u));
        }
        prev = won;
        total += won.value;
        if (lane == 0u) {
            IDS[t * p.k + slot] = won.id;
            // Kept in workgroup memory (free since the last rt_reduce), not reread from WTS: a
            // read after a store to a storage buffer is a memory round trip per slot.
            rt_part[slot] = won.value;
        }
    }
    if (lane == 0u) {
        for (var slot = 0u; slot < p.k; slot++) {
            WTS[t * p.k + slot] = rt_part[slot] / total;
        }
    }
}

// moe_router_wide: one workgroup of ROUTER_WG invocations per token; invocation l owns experts
// l, l+64, ... in LOGITS (it writes and rereads only those). The softmax sum is per-invocation sums in expert order, then a fixed tree. Slot s takes
// the best-ranked expert ranked after slot s-1's choice, which is the original "best of the
// experts not yet taken" without a taken list.
@compute @workgroup_size(ROUTER_WG)
fn moe_router_wide(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>,
              @builtin(subgroup_id) sg_id: u32, @builtin(num_subgroups) n_sg: u32,
              @builtin(subgroup_invocation_id) lane: u32) {
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
        let best = workgroup_best(best_v, best_e, vec3<u32>(sg_id, n_sg, lane), slot % 2u);
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

@group(0) @binding(9) var<storage, read_write> GROUPS: array<u32>;

// One workgroup per expert e: the chunk's tokens are scanned ROUTER_WG at a time (token t of the
// scan holds at most one item of e, as a token picks an expert once); hits are packed in token
// order by an exclusive prefix sum (subgroups, then subgroup totals in red_id).
@compute @workgroup_size(ROUTER_WG)
fn moe_group(@builtin(workgroup_id) wg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32,
             @builtin(subgroup_id) sg_id: u32,
             @builtin(num_subgroups) n_sg: u32,
             @builtin(subgroup_invocation_id) lane: u32) {
    let e = wg.x;
    if (e >= p.n_expert) {
        return;
    }
    let list = p.n_expert + e * p.tokens;
    var total = 0u;
    for (var t0 = 0u; t0 < p.tokens; t0 += ROUTER_WG) {
        let t = t0 + lid;
        var hit = 0u;
        var item = 0u;
        if (t < p.tokens) {
            for (var slot = 0u; slot < p.k; slot++) {
                if (IDS[t * p.k + slot] == e) {
                    hit = 1u;
                    item = t * p.k + slot;
                }
            }
        }
        let before = subgroupExclusiveAdd(hit);
        let sg_total = subgroupAdd(hit);
        if (lane == 0u) {
            red_id[sg_id] = sg_total;
        }
        workgroupBarrier();
        var offset = total;
        var chunk_total = 0u;
        for (var g = 0u; g < n_sg; g++) {
            let n = red_id[g];
            if (g < sg_id) {
                offset += n;
            }
            chunk_total += n;
        }
        if (hit == 1u) {
            GROUPS[list + offset + before] = item;
        }
        total += chunk_total;
        workgroupBarrier();
    }
    if (lid == 0u) {
        GROUPS[e] = total;
    }
}

// moe_split_ids (see the header): p.tokens = items, p.n_expert = experts per layer, p.k = the
// layer's offset in MAP, p.h = the offset in LOG.
@group(0) @binding(10) var<storage, read> MAP: array<u32>;
@group(0) @binding(11) var<storage, read_write> HOT: array<u32>;
@group(0) @binding(12) var<storage, read_write> COLD: array<u32>;
@group(0) @binding(13) var<storage, read_write> LOG: array<u32>;
@group(0) @binding(14) var<storage, read_write> STAGE: array<u32>;

@compute @workgroup_size(ROUTER_WG)
fn moe_split_ids(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= p.tokens) {
        return;
    }
    let e = IDS[i];
    var slot = NO_EXPERT;
    if (e < p.n_expert) {
        slot = MAP[p.k + e];
    }
    HOT[i] = slot;
    COLD[i] = select(NO_EXPERT, e, slot == NO_EXPERT);
    STAGE[i] = select(NO_EXPERT, i, slot == NO_EXPERT && e < p.n_expert);
    LOG[p.h + i] = e;
}
