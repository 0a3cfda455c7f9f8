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
@group(0) @binding(4) var<storage, read> QKV: array<f32>;        // [T, channels], q and k L2-normalised
@group(0) @binding(5) var<storage, read> BA: array<f32>;         // [T, 2*n_v_heads]: beta logits | alpha logits
@group(0) @binding(6) var<storage, read> GP: array<f32>;         // [2*n_v_heads]: dt_bias | ssm_a (= -exp(A_log))
@group(0) @binding(7) var<storage, read_write> S: array<f32>;    // [n_v_heads, dk, dv]
@group(0) @binding(8) var<storage, read_write> O: array<f32>;    // [T, n_v_heads*dv]

const MAX_DK: u32 = 128u;

fn softplus(v: f32) -> f32 {
    if (v > 20.0) {
        return v;
    }
    return log(1.0 + exp(v));
}

// One invocation per (value head, value column): it owns column `col` of that head's state, so
// every sum runs sequentially over the key dimension, in order.
@compute @workgroup_size(64)
fn gdn_recurrence(@builtin(global_invocation_id) id: vec3<u32>) {
    let flat = id.x;
    if (flat >= p.n_v_heads * p.dv) {
        return;
    }
    let head = flat / p.dv;
    let col = flat % p.dv;
    let kh = head % p.n_k_heads; // GGUF (tiled) value-head order
    var s: array<f32, MAX_DK>;
    let base = head * p.dk * p.dv;
    for (var i = 0u; i < p.dk; i++) {
        s[i] = S[base + i * p.dv + col];
    }
    let nv = p.n_v_heads;
    for (var t = 0u; t < p.tokens; t++) {
        let row = t * p.channels;
        let q0 = row + kh * p.dk;
        let k0 = row + p.key_dim + kh * p.dk;
        let v = QKV[row + 2u * p.key_dim + head * p.dv + col];
        let beta = 1.0 / (1.0 + exp(-BA[t * 2u * nv + head]));
        let decay = exp(GP[nv + head] * softplus(BA[t * 2u * nv + nv + head] + GP[head]));
        var predicted = 0.0;
        for (var i = 0u; i < p.dk; i++) {
            s[i] *= decay;
            predicted += s[i] * QKV[k0 + i];
        }
        let delta = (v - predicted) * beta;
        var out = 0.0;
        for (var i = 0u; i < p.dk; i++) {
            s[i] += QKV[k0 + i] * delta;
            out += s[i] * QKV[q0 + i];
        }
        O[t * nv * p.dv + head * p.dv + col] = out;
    }
    for (var i = 0u; i < p.dk; i++) {
        S[base + i * p.dv + col] = s[i];
    }
}
