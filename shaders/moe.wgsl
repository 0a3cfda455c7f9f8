// MoE routing and combination (model-spec 2.8).
//   moe_router: per token: softmax over all experts (in place), top-k with the lowest id winning
//               ties (best first), weights renormalised over the chosen k. One invocation per
//               token walks the experts in order, so the result has one fixed order.
//   moe_combine: Y[t, i] = sum_slot W[t,slot] * D[t*k+slot, i]  (slots in order)
//                          + sigmoid(SG[t]) * SH[t, i]          (shared expert, when present)

struct Params {
    tokens: u32,
    n_expert: u32,
    k: u32,
    h: u32,
    has_shared: u32,
}

var<immediate> p: Params;

@group(0) @binding(0) var<storage, read_write> LOGITS: array<f32>; // [T, n_expert]
@group(0) @binding(1) var<storage, read_write> IDS: array<u32>;    // [T*k]
@group(0) @binding(2) var<storage, read_write> WTS: array<f32>;    // [T*k]

@compute @workgroup_size(64)
fn moe_router(@builtin(global_invocation_id) id: vec3<u32>) {
    let t = id.x;
    if (t >= p.tokens) {
        return;
    }
    let base = t * p.n_expert;
    var mx = LOGITS[base];
    for (var e = 1u; e < p.n_expert; e++) {
        mx = max(mx, LOGITS[base + e]);
    }
    var sum = 0.0;
    for (var e = 0u; e < p.n_expert; e++) {
        let v = exp(LOGITS[base + e] - mx);
        LOGITS[base + e] = v;
        sum += v;
    }
    let inv = 1.0 / sum;
    for (var e = 0u; e < p.n_expert; e++) {
        LOGITS[base + e] *= inv;
    }
    var total = 0.0;
    for (var slot = 0u; slot < p.k; slot++) {
        var best = 0xffffffffu;
        var best_p = 0.0;
        for (var e = 0u; e < p.n_expert; e++) {
            var taken = false;
            for (var j = 0u; j < slot; j++) {
                if (IDS[t * p.k + j] == e) {
                    taken = true;
                }
            }
            let v = LOGITS[base + e];
            if (!taken && (best == 0xffffffffu || v > best_p)) {
                best = e;
                best_p = v;
            }
        }
        IDS[t * p.k + slot] = best;
        WTS[t * p.k + slot] = best_p;
        total += best_p;
    }
    for (var slot = 0u; slot < p.k; slot++) {
        WTS[t * p.k + slot] = WTS[t * p.k + slot] / total;
    }
}

@group(0) @binding(3) var<storage, read> D: array<f32>;   // [T*k, h] expert outputs
@group(0) @binding(4) var<storage, read> W: array<f32>;   // [T*k] routing weights
@group(0) @binding(5) var<storage, read> SH: array<f32>;  // [T, h] shared expert output
@group(0) @binding(6) var<storage, read> SG: array<f32>;  // [T] shared gate logit
@group(0) @binding(7) var<storage, read_write> Y: array<f32>;

@compute @workgroup_size(64)
fn moe_combine(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x;
    let t = id.y;
    if (i >= p.h || t >= p.tokens) {
        return;
    }
    var acc = 0.0;
    for (var slot = 0u; slot < p.k; slot++) {
        let item = t * p.k + slot;
        acc += W[item] * D[item * p.h + i];
    }
    if (p.has_shared != 0u) {
        acc += (1.0 / (1.0 + exp(-SG[t]))) * SH[t * p.h + i];
    }
    Y[t * p.h + i] = acc;
}
