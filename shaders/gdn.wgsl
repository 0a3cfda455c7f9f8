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
// A workgroup owns COL_LANES value columns of one head; the key dimension of each column is split
// over KEY_GROUPS invocations holding KEY_PER_THREAD state entries each (i = g + KEY_GROUPS * j),
// in registers. (One invocation per column walking all 128 keys kept its state in a dynamically
// indexed private array, i.e. in local memory, and ran 256 dependent steps per token.)
const COL_LANES: u32 = 32u;
const KEY_GROUPS: u32 = 8u;
const KEY_PER_THREAD: u32 = MAX_DK / KEY_GROUPS;

var<workgroup> partial: array<f32, 256>; // [KEY_GROUPS][COL_LANES]

fn softplus(v: f32) -> f32 {
    if (v > 20.0) {
        return v;
    }
    return log(1.0 + exp(v));
}

// Sum of the KEY_GROUPS partials of column lane `x`, always in the same binary-tree order
// (groups 0+4, 1+5, ... then 0+2, 1+3, then 0+1), so the result never depends on the token count.
fn key_sum(v: f32, x: u32, g: u32) -> f32 {
    partial[g * COL_LANES + x] = v;
    workgroupBarrier();
    for (var half = KEY_GROUPS / 2u; half > 0u; half >>= 1u) {
        if (g < half) {
            partial[g * COL_LANES + x] = partial[g * COL_LANES + x] + partial[(g + half) * COL_LANES + x];
        }
        workgroupBarrier();
    }
    let total = partial[x];
    // Everyone has read the total before the next call overwrites the slots.
    workgroupBarrier();
    return total;
}

// Workgroup (column block, value head); invocation (column lane x, key group g). Per token, each
// column's two key-dimension dot products are partial sums in key order per group, then
// `key_sum`; the state update is elementwise. Tokens are walked in order.
@compute @workgroup_size(32, 8)
fn gdn_recurrence(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let x = lid.x;
    let g = lid.y;
    let head = wg.y;
    let col = wg.x * COL_LANES + x;
    // No early return: every invocation takes part in the barriers.
    let column_valid = col < p.dv && head < p.n_v_heads;
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
        let k_inv = 1.0 / sqrt(key_sum(kk, x, g) + 1e-6);
        let q_inv = 1.0 / sqrt(key_sum(qq, x, g) + 1e-6) * (1.0 / sqrt(f32(p.dk)));
        var predicted = 0.0;
        for (var j = 0u; j < KEY_PER_THREAD; j++) {
            kv[j] = kv[j] * k_inv;
            qv[j] = qv[j] * q_inv;
            s[j] *= decay;
            predicted += s[j] * kv[j];
        }
        let delta = (v - key_sum(predicted, x, g)) * beta;
        var out = 0.0;
        for (var j = 0u; j < KEY_PER_THREAD; j++) {
            s[j] += kv[j] * delta;
            out += s[j] * qv[j];
        }
        let total = key_sum(out, x, g);
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
