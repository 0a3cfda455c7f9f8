// Gated DeltaNet (model-spec 2.6): causal depthwise conv and the per-token delta-rule recurrence.
// Both walk the chunk's tokens in order inside one invocation, so the state after a chunk is the
// same bits whatever the chunk size. No chunked (WY) form.

struct Params {
    tokens: u32,
    channels: u32,     // conv channels (q | k | v)
    kernel: u32,       // conv taps
    n_k_heads: u32,
    n_v_heads: u32,
    dk: u32,
    dv: u32,
    key_dim: u32,      // n_k_heads * dk
}

var<immediate> p: Params;

// gdn_conv bindings
@group(0) @binding(0) var<storage, read> U: array<f32>;          // [T, channels] pre-conv
@group(0) @binding(1) var<storage, read> CW: array<f32>;         // [channels, kernel]
@group(0) @binding(2) var<storage, read_write> HIST: array<f32>; // [kernel-1, channels], oldest first
@group(0) @binding(3) var<storage, read_write> CO: array<f32>;   // [T, channels] post-conv (SiLU)

fn silu(v: f32) -> f32 {
    return v / (1.0 + exp(-v));
}

@compute @workgroup_size(64)
fn gdn_conv(@builtin(global_invocation_id) id: vec3<u32>) {
    let c = id.x;
    if (c >= p.channels) {
        return;
    }
    let k = p.kernel;
    let hist = k - 1u;
    for (var t = 0u; t < p.tokens; t++) {
        var acc = 0.0;
        for (var j = 0u; j < k; j++) {
            // Tap j reads sequence element (hist + t) - (k - 1 - j); elements below `hist` are history.
            let idx = hist + t + j + 1u - k;
            var v: f32;
            if (idx < hist) {
                v = HIST[idx * p.channels + c];
            } else {
                v = U[(idx - hist) * p.channels + c];
            }
            acc += CW[c * k + j] * v;
        }
        CO[t * p.channels + c] = silu(acc);
    }
    // New history = last `hist` elements of [history, inputs]; sources lie ahead of destinations.
    for (var r = 0u; r < hist; r++) {
        let idx = p.tokens + r;
        var v: f32;
        if (idx < hist) {
            v = HIST[idx * p.channels + c];
        } else {
            v = U[(idx - hist) * p.channels + c];
        }
        HIST[r * p.channels + c] = v;
    }
}

// gdn_recurrence bindings (the conv output is read through QKV)
@group(0) @binding(4) var<storage, read> QKV: array<f32>;        // [T, channels] conv output (q and k normalised here)
@group(0) @binding(5) var<storage, read> BA: array<f32>;         // [T, 2*n_v_heads]: beta logits | alpha logits
@group(0) @binding(6) var<storage, read> GP: array<f32>;         // [2*n_v_heads]: dt_bias | ssm_a (= -exp(A_log))
@group(0) @binding(7) var<storage, read_write> S: array<f32>;    // [n_v_heads, dk, dv]
@group(0) @binding(8) var<storage, read_write> O: array<f32>;    // [T, n_v_heads*dv]

const MAX_DK: u32 = 128u;
// A quad of 4 subgroup lanes owns one value column of one head; lane g of the quad holds the
// state entries i = g + KEY_GROUPS * j (KEY_PER_THREAD of them) in registers. The key-dimension
// dot products are per-lane partial sums in key order, then `quad_sum`: two xor shuffles, no
// barrier (a workgroup barrier per sum, 20 per token, was the old form's cost).
const KEY_GROUPS: u32 = 4u;
const KEY_PER_THREAD: u32 = MAX_DK / KEY_GROUPS;
const REC_WG: u32 = 64u;
const COLS_PER_WG: u32 = REC_WG / KEY_GROUPS;

fn softplus(v: f32) -> f32 {
    if (v > 20.0) {
        return v;
    }
    return log(1.0 + exp(v));
}

// The quad's sum, (v0 + v1) + (v2 + v3) on every lane of the quad: the same bits on each (a sum
// of two values does not depend on their order), whatever the token count or subgroup size.
fn quad_sum(v: vec2<f32>) -> vec2<f32> {
    let a = v + subgroupShuffleXor(v, 1u);
    return a + subgroupShuffleXor(a, 2u);
}

// Workgroup (column block, value head) of REC_WG invocations; the quads are formed from subgroup
// lanes (any subgroup size from 4 up). Per token: L2 norms of k and q, the decayed state's
// prediction, the delta update and the output, tokens walked in order.
@compute @workgroup_size(REC_WG)
fn gdn_recurrence(@builtin(workgroup_id) wg: vec3<u32>,
                  @builtin(subgroup_id) sg_id: u32,
                  @builtin(subgroup_size) sg_size: u32,
                  @builtin(subgroup_invocation_id) lane: u32) {
    let g = lane % KEY_GROUPS;
    let quad = (sg_id * sg_size + lane) / KEY_GROUPS;
    let head = wg.y;
    let col = wg.x * COLS_PER_WG + quad;
    // No early return: every lane takes part in the shuffles.
    let column_valid = quad < COLS_PER_WG && col < p.dv && head < p.n_v_heads;
    let kh = head % p.n_k_heads; // GGUF (tiled) value-head order
    let base = head * p.dk * p.dv;
    var s: array<f32, KEY_PER_THREAD>;
    for (var j = 0u; j < KEY_PER_THREAD; j++) {
        let i = g + KEY_GROUPS * j;
        if (column_valid && i < p.dk) {
            s[j] = S[base + i * p.dv + col];
        } else {
            s[j] = 0.0;
        }
    }
    let nv = p.n_v_heads;
    for (var t = 0u; t < p.tokens; t++) {
        let row = t * p.channels;
        let q0 = row + kh * p.dk;
        let k0 = row + p.key_dim + kh * p.dk;
        var v = 0.0;
        var beta = 0.0;
        var decay = 0.0;
        if (column_valid) {
            v = QKV[row + 2u * p.key_dim + head * p.dv + col];
            beta = 1.0 / (1.0 + exp(-BA[t * 2u * nv + head]));
            decay = exp(GP[nv + head] * softplus(BA[t * 2u * nv + nv + head] + GP[head]));
        }
        var kv: array<f32, KEY_PER_THREAD>;
        var qv: array<f32, KEY_PER_THREAD>;
        var kk = 0.0;
        var qq = 0.0;
        for (var j = 0u; j < KEY_PER_THREAD; j++) {
            let i = g + KEY_GROUPS * j;
            kv[j] = 0.0;
            qv[j] = 0.0;
            if (column_valid && i < p.dk) {
                kv[j] = QKV[k0 + i];
                qv[j] = QKV[q0 + i];
            }
            kk = fma(kv[j], kv[j], kk);
            qq = fma(qv[j], qv[j], qq);
        }
        // L2 norms of k and q (model-spec 2.6, eps inside the sqrt), q also scaled by 1/sqrt(dk).
        let norms = quad_sum(vec2<f32>(kk, qq));
        let k_inv = 1.0 / sqrt(norms.x + 1e-6);
        let q_inv = 1.0 / sqrt(norms.y + 1e-6) * (1.0 / sqrt(f32(p.dk)));
        var predicted = 0.0;
        for (var j = 0u; j < KEY_PER_THREAD; j++) {
            kv[j] = kv[j] * k_inv;
            qv[j] = qv[j] * q_inv;
            s[j] *= decay;
            predicted += s[j] * kv[j];
        }
        let delta = (v - quad_sum(vec2<f32>(predicted, 0.0)).x) * beta;
        var out = 0.0;
        for (var j = 0u; j < KEY_PER_THREAD; j++) {
            s[j] += kv[j] * delta;
            out += s[j] * qv[j];
        }
        let total = quad_sum(vec2<f32>(out, 0.0)).x;
        if (column_valid && g == 0u) {
            O[t * nv * p.dv + head * p.dv + col] = total;
        }
    }
    for (var j = 0u; j < KEY_PER_THREAD; j++) {
        let i = g + KEY_GROUPS * j;
        if (column_valid && i < p.dk) {
            S[base + i * p.dv + col] = s[j];
        }
    }
}
