// Routing of one token by one subgroup (model-spec 2.8): softmax over the router's logits, the
// top k (highest probability first, the lower id on ties) and their weights renormalised over
// the k. Used by moe.wgsl's moe_router and by matvec.wgsl's matvec_expert_glu where it routes its
// own token (the `matvec_route` assemblies), so a decode step needs no router dispatch: one
// function, so the same bits in both.
//
// Lane l of the subgroup takes experts l, l + S, l + 2S, ... (S the subgroup size) in that
// order: the max and the sum are each lane's values in that order, then subgroupMax /
// subgroupAdd; the ranking is a strict order, so each slot's winner is the one it defines. The
// result depends only on the logits and S. The including shader supplies `route_logit(i)` (the
// logit at index i of its logits buffer). At most RT_MAX experts and RT_KMAX slots (the
// launchers check; more take moe_router_wide).

const NO_EXPERT: u32 = 0xffffffffu;
const RT_MAX: u32 = 1024u;
const RT_KMAX: u32 = 16u;

// The token's probabilities (each lane touches only its own experts), then the chosen experts
// and weights (written by lane 0; read by others after a barrier).
var<workgroup> RT_PROB: array<f32, RT_MAX>;
var<workgroup> RT_ID: array<u32, RT_KMAX>;
var<workgroup> RT_W: array<f32, RT_KMAX>;

struct Ranked {
    value: f32,
    id: u32,
}

// Whether (v, e) ranks before (best_v, best_e): higher probability first, the lower id on ties.
fn ranks_before(v: f32, e: u32, best_v: f32, best_e: u32) -> bool {
    return e != NO_EXPERT && (best_e == NO_EXPERT || v > best_v || (v == best_v && e < best_e));
}

// `best`, or (v, e) where it ranks before `best` and after the previous slot's (prev_v, prev_e).
fn rt_best(v: f32, e: u32, prev_v: f32, prev_e: u32, best: Ranked) -> Ranked {
    let after_prev = prev_e == NO_EXPERT || ranks_before(prev_v, prev_e, v, e);
    if (after_prev && ranks_before(v, e, best.value, best.id)) {
        return Ranked(v, e);
    }
    return best;
}

// The subgroup's best (value, id): subgroupMax of the values, subgroupMin of the ids holding it.
// A NaN never wins.
fn sg_best(r: Ranked) -> Ranked {
    let valid = r.id != NO_EXPERT && r.value == r.value;
    let key = select(-1.0, r.value, valid);
    let m = subgroupMax(key);
    let id = subgroupMin(select(NO_EXPERT, r.id, valid && key == m));
    return Ranked(m, id);
}

// Route the token whose n logits start at `base`: RT_ID[slot] and RT_W[slot] for slot < k, on
// lane 0 of the calling subgroup (every lane of it must call, in uniform control flow). NaN
// logits leave no expert ranked: the slot then takes an id in range and a NaN weight, which the
// caller's finiteness check reports.
fn route_token(base: u32, n: u32, k: u32, lane: u32, s: u32) {
    var m = -3.402823e38;
    for (var e = lane; e < n; e += s) {
        m = max(m, route_logit(base + e));
    }
    m = subgroupMax(m);
    var sum = 0.0;
    for (var e = lane; e < n; e += s) {
        let v = exp(route_logit(base + e) - m);
        RT_PROB[e] = v;
        sum += v;
    }
    let inv = 1.0 / subgroupAdd(sum);
    for (var e = lane; e < n; e += s) {
        RT_PROB[e] = RT_PROB[e] * inv;
    }
    var prev = Ranked(0.0, NO_EXPERT);
    var total = 0.0;
    for (var slot = 0u; slot < k; slot++) {
        var best = Ranked(0.0, NO_EXPERT);
        for (var e = lane; e < n; e += s) {
            best = rt_best(RT_PROB[e], e, prev.value, prev.id, best);
        }
        var won = sg_best(best);
        if (won.id == NO_EXPERT) {
            won = Ranked(inv * (inv - inv), min(slot, n - 1u));
        }
        prev = won;
        total += won.value;
        if (lane == 0u) {
            RT_ID[slot] = won.id;
            RT_W[slot] = won.value;
        }
    }
    if (lane == 0u) {
        for (var slot = 0u; slot < k; slot++) {
            RT_W[slot] = RT_W[slot] / total;
        }
    }
}
