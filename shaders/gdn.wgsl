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
    eps: f32,          // gdn_recurrence_norm: the gated norm's epsilon
    first: u32,        // the chunk buffers' column of the first token (a batch member's)
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
    if (k == 4u) {
        conv4(c);
    } else {
        conv_any(c, k, hist);
    }
    // New history = last `hist` elements of [history, inputs]; sources lie ahead of destinations.
    for (var r = 0u; r < hist; r++) {
        let idx = p.tokens + r;
        var v: f32;
        if (idx < hist) {
            v = HIST[idx * p.channels + c];
        } else {
            v = U[(p.first + idx - hist) * p.channels + c];
        }
        HIST[r * p.channels + c] = v;
    }
}

// The model's 4-tap conv of channel c: the taps and the last three inputs stay in registers, and
// four tokens' inputs are loaded before their sums. Each output is conv_tap.wgsl's conv_silu4, the
// expression decode's input projection store also uses (quant/seg_conv.wgsl), so a token gets the
// same bits whichever computed its conv.
fn conv4(c: u32) {
    let n = p.channels;
    let w = vec4<f32>(CW[c * 4u], CW[c * 4u + 1u], CW[c * 4u + 2u], CW[c * 4u + 3u]);
    var a = HIST[c];
    var b = HIST[n + c];
    var d = HIST[2u * n + c];
    // Columns p.first .. p.first + p.tokens (a batch member starts past column 0).
    let end = p.first + p.tokens;
    var t = p.first;
    for (; t + 4u <= end; t += 4u) {
        let u0 = U[t * n + c];
        let u1 = U[(t + 1u) * n + c];
        let u2 = U[(t + 2u) * n + c];
        let u3 = U[(t + 3u) * n + c];
        CO[t * n + c] = conv_silu4(w, a, b, d, u0);
        CO[(t + 1u) * n + c] = conv_silu4(w, b, d, u0, u1);
        CO[(t + 2u) * n + c] = conv_silu4(w, d, u0, u1, u2);
        CO[(t + 3u) * n + c] = conv_silu4(w, u0, u1, u2, u3);
        a = u1;
        b = u2;
        d = u3;
    }
    for (; t < end; t++) {
        let u = U[t * n + c];
        CO[t * n + c] = conv_silu4(w, a, b, d, u);
        a = b;
        b = d;
        d = u;
    }
}

// Any number of taps: tap j of token t reads sequence element (hist + t) - (k - 1 - j).
fn conv_any(c: u32, k: u32, hist: u32) {
    for (var t = 0u; t < p.tokens; t++) {
        var acc = 0.0;
        for (var j = 0u; j < k; j++) {
            // Tap j reads sequence element (hist + t) - (k - 1 - j); elements below `hist` are history.
            let idx = hist + t + j + 1u - k;
            var v: f32;
            if (idx < hist) {
                v = HIST[idx * p.channels + c];
            } else {
                v = U[(p.first + idx - hist) * p.channels + c];
            }
            acc += CW[c * k + j] * v;
        }
        CO[(p.first + t) * p.channels + c] = silu(acc);
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
// state entries of keys 32g .. 32g + 32 in eight vec4 registers (named fields: an indexed array
// would live in slow local memory). A key-dimension dot product is the lane's vec4 partial sums in
// key order, (x + y) + (z + w), then `quad_sum`: two xor shuffles, no barrier.
const KEY_GROUPS: u32 = 4u;
const REC_WG: u32 = 64u;
const COLS_PER_WG: u32 = REC_WG / KEY_GROUPS;
// gdn_recurrence_norm: a workgroup per value head, 4 lanes per column (HEAD_WG = 4 x the columns,
// at most 1,024 invocations, so heads of at most 256 values).
override HEAD_WG: u32 = 512u;
const HEAD_COLS_MAX: u32 = 256u;
// Tokens staged per batch: the workgroup loads a batch's q and k (L2-normalised once per token by
// one quad each), v, beta and decay into workgroup memory, then walks its tokens from there.
const BATCH: u32 = 8u;

// Normalised q (even slots) and k (odd slots) of the batch's tokens, MAX_DK values each.
var<workgroup> QK: array<vec4<f32>, 512>; // 2 * BATCH * MAX_DK / 4
var<workgroup> VB: array<f32, 2048>;      // BATCH * columns of the workgroup (at most 256)
var<workgroup> BETA: array<f32, 8>;
var<workgroup> DECAY: array<f32, 8>;

struct K32 {
    v0: vec4<f32>,
    v1: vec4<f32>,
    v2: vec4<f32>,
    v3: vec4<f32>,
    v4: vec4<f32>,
    v5: vec4<f32>,
    v6: vec4<f32>,
    v7: vec4<f32>,
}

fn softplus(v: f32) -> f32 {
    if (v > 20.0) {
        return v;
    }
    return log(1.0 + exp(v));
}

// The quad's sum, (v0 + v1) + (v2 + v3) on every lane of the quad: the same bits on each (a sum
// of two values does not depend on their order), whatever the token count or subgroup size.
fn quad_sum(v: f32) -> f32 {
    let a = v + subgroupShuffleXor(v, 1u);
    return a + subgroupShuffleXor(a, 2u);
}

fn hsum(v: vec4<f32>) -> f32 {
    return (v.x + v.y) + (v.z + v.w);
}

// a . b over the lane's 32 keys, in key order.
fn dot32(a: K32, b: K32) -> f32 {
    var acc = a.v0 * b.v0;
    acc = fma(a.v1, b.v1, acc);
    acc = fma(a.v2, b.v2, acc);
    acc = fma(a.v3, b.v3, acc);
    acc = fma(a.v4, b.v4, acc);
    acc = fma(a.v5, b.v5, acc);
    acc = fma(a.v6, b.v6, acc);
    acc = fma(a.v7, b.v7, acc);
    return hsum(acc);
}

fn scale32(a: K32, f: f32) -> K32 {
    return K32(a.v0 * f, a.v1 * f, a.v2 * f, a.v3 * f, a.v4 * f, a.v5 * f, a.v6 * f, a.v7 * f);
}

// a + b * f.
fn axpy32(a: K32, b: K32, f: f32) -> K32 {
    return K32(fma(b.v0, vec4(f), a.v0), fma(b.v1, vec4(f), a.v1), fma(b.v2, vec4(f), a.v2),
               fma(b.v3, vec4(f), a.v3), fma(b.v4, vec4(f), a.v4), fma(b.v5, vec4(f), a.v5),
               fma(b.v6, vec4(f), a.v6), fma(b.v7, vec4(f), a.v7));
}

fn shared32(at: u32) -> K32 {
    return K32(QK[at], QK[at + 1u], QK[at + 2u], QK[at + 3u], QK[at + 4u], QK[at + 5u],
               QK[at + 6u], QK[at + 7u]);
}

fn store_shared32(at: u32, a: K32) {
    QK[at] = a.v0;
    QK[at + 1u] = a.v1;
    QK[at + 2u] = a.v2;
    QK[at + 3u] = a.v3;
    QK[at + 4u] = a.v4;
    QK[at + 5u] = a.v5;
    QK[at + 6u] = a.v6;
    QK[at + 7u] = a.v7;
}

// Four values of QKV from `at`, the keys at or past `n` read as 0.
fn qkv4(at: u32, key: u32, n: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    if (key < n) {
        v.x = QKV[at];
    }
    if (key + 1u < n) {
        v.y = QKV[at + 1u];
    }
    if (key + 2u < n) {
        v.z = QKV[at + 2u];
    }
    if (key + 3u < n) {
        v.w = QKV[at + 3u];
    }
    return v;
}

// Keys first .. first + 32 of a q or k vector starting at QKV[at] (keys past dk read as 0).
fn load_keys(at: u32, first: u32) -> K32 {
    let n = p.dk;
    return K32(qkv4(at + first, first, n), qkv4(at + first + 4u, first + 4u, n),
               qkv4(at + first + 8u, first + 8u, n), qkv4(at + first + 12u, first + 12u, n),
               qkv4(at + first + 16u, first + 16u, n), qkv4(at + first + 20u, first + 20u, n),
               qkv4(at + first + 24u, first + 24u, n), qkv4(at + first + 28u, first + 28u, n));
}

// State entry (key, col) of the head at `base`, 0 outside the head.
fn state_at(base: u32, key: u32, col: u32, valid: bool) -> f32 {
    if (valid && key < p.dk) {
        return S[base + key * p.dv + col];
    }
    return 0.0;
}

fn state4(base: u32, key: u32, col: u32, valid: bool) -> vec4<f32> {
    return vec4<f32>(state_at(base, key, col, valid), state_at(base, key + 1u, col, valid),
                     state_at(base, key + 2u, col, valid), state_at(base, key + 3u, col, valid));
}

fn put_state4(base: u32, key: u32, col: u32, valid: bool, v: vec4<f32>) {
    if (!valid) {
        return;
    }
    if (key < p.dk) {
        S[base + key * p.dv + col] = v.x;
    }
    if (key + 1u < p.dk) {
        S[base + (key + 1u) * p.dv + col] = v.y;
    }
    if (key + 2u < p.dk) {
        S[base + (key + 2u) * p.dv + col] = v.z;
    }
    if (key + 3u < p.dk) {
        S[base + (key + 3u) * p.dv + col] = v.w;
    }
}

// Stage tokens t0 .. t0 + n: quad v (< 2n) normalises vector v (q of token v / 2 when v is even,
// k when odd) and writes its MAX_DK values; v, beta and decay of the workgroup's columns and head.
fn stage(t0: u32, n: u32, tid: u32, g: u32, head: u32, col_base: u32, cols: u32, wg_size: u32) {
    let vq = tid / KEY_GROUPS;
    let tok = vq / 2u;
    let is_k = vq % 2u;
    var keys = K32(vec4(0.0), vec4(0.0), vec4(0.0), vec4(0.0), vec4(0.0), vec4(0.0), vec4(0.0),
                   vec4(0.0));
    let kh = head % p.n_k_heads; // GGUF (tiled) value-head order
    if (tok < n) {
        let at = (p.first + t0 + tok) * p.channels + is_k * p.key_dim + kh * p.dk;
        keys = load_keys(at, 32u * g);
    }
    // L2 norms (model-spec 2.6, eps inside the sqrt), q also scaled by 1/sqrt(dk).
    let sum_sq = quad_sum(dot32(keys, keys));
    var inv = 1.0 / sqrt(sum_sq + 1e-6);
    if (is_k == 0u) {
        inv = inv * (1.0 / sqrt(f32(p.dk)));
    }
    // Only the first 2 * BATCH quads have a vector (wider workgroups have more quads).
    if (vq < 2u * BATCH) {
        store_shared32(vq * (MAX_DK / 4u) + 8u * g, scale32(keys, inv));
    }
    let nv = p.n_v_heads;
    for (var i = tid; i < BATCH * cols; i += wg_size) {
        let t = i / cols;
        let col = col_base + i % cols;
        var v = 0.0;
        if (t < n && col < p.dv) {
            v = QKV[(p.first + t0 + t) * p.channels + 2u * p.key_dim + head * p.dv + col];
        }
        VB[i] = v;
    }
    if (tid < n) {
        let t = p.first + t0 + tid;
        BETA[tid] = 1.0 / (1.0 + exp(-BA[t * 2u * nv + head]));
        DECAY[tid] = exp(GP[nv + head] * softplus(BA[t * 2u * nv + nv + head] + GP[head]));
    }
}

// Workgroup (column block, value head) of REC_WG invocations; the quads are formed from subgroup
// lanes (any subgroup size from 4 up). Tokens are walked in order, BATCH at a time: the decayed
// state's prediction, the delta update and the output. The head size must be at most MAX_DK.
@compute @workgroup_size(REC_WG)
fn gdn_recurrence(@builtin(workgroup_id) wg: vec3<u32>,
                  @builtin(subgroup_id) sg_id: u32,
                  @builtin(subgroup_size) sg_size: u32,
                  @builtin(subgroup_invocation_id) lane: u32) {
    let tid = sg_id * sg_size + lane;
    recur(Cols(wg.y, wg.x * COLS_PER_WG, COLS_PER_WG, REC_WG), tid, lane % KEY_GROUPS, false);
}

// gdn_recurrence with the GDN output's gated RMS norm (model-spec 2.6; what norm.wgsl's
// rmsnorm_gated computes, here with its own sum order) in the same dispatch: a workgroup holds a
// whole value head, so it has all of a token's outputs for the norm. Bindings: the gate z and the
// norm weight (one head's dv values).
@group(0) @binding(9) var<storage, read> GZ: array<f32>;  // [T, n_v_heads * dv]
@group(0) @binding(10) var<storage, read> GW: array<f32>; // [dv]
// The batch's outputs before the norm, the per-token partial sums, and the inverse norms.
var<workgroup> OUTB: array<f32, 2048>;
var<workgroup> RED: array<f32, 1024>;
var<workgroup> INV: array<f32, 8>;
// Runs of 8 of each token's partial sums (at most BATCH * 1024 / BATCH / 8 = 128).
var<workgroup> RUNS: array<f32, 128>;

@compute @workgroup_size(HEAD_WG)
fn gdn_recurrence_norm(@builtin(workgroup_id) wg: vec3<u32>,
                       @builtin(subgroup_id) sg_id: u32,
                       @builtin(subgroup_size) sg_size: u32,
                       @builtin(subgroup_invocation_id) lane: u32) {
    let tid = sg_id * sg_size + lane;
    recur(Cols(wg.y, 0u, HEAD_WG / KEY_GROUPS, HEAD_WG), tid, lane % KEY_GROUPS, true);
}

// A workgroup's value head and columns (col_base .. col_base + cols) and its size.
struct Cols {
    head: u32,
    base: u32,
    cols: u32,
    wg_size: u32,
}

// The recurrence of the workgroup's columns over the chunk; with `normed`, the outputs of each
// batch of tokens go through the gated norm (the workgroup holds the whole head) before they are
// stored. Called by every invocation (it holds barriers).
fn recur(w: Cols, tid: u32, g: u32, normed: bool) {
    let quad = tid / KEY_GROUPS;
    let col = w.base + quad;
    let head = w.head;
    // No early return: every lane takes part in the shuffles and barriers.
    let valid = quad < w.cols && col < p.dv && head < p.n_v_heads;
    let base = head * p.dk * p.dv;
    let k0 = 32u * g;
    var s = K32(state4(base, k0, col, valid), state4(base, k0 + 4u, col, valid),
                state4(base, k0 + 8u, col, valid), state4(base, k0 + 12u, col, valid),
                state4(base, k0 + 16u, col, valid), state4(base, k0 + 20u, col, valid),
                state4(base, k0 + 24u, col, valid), state4(base, k0 + 28u, col, valid));
    let out_stride = p.n_v_heads * p.dv;
    for (var t0 = 0u; t0 < p.tokens; t0 += BATCH) {
        let n = min(BATCH, p.tokens - t0);
        workgroupBarrier();
        stage(t0, n, tid, g, head, w.base, w.cols, w.wg_size);
        workgroupBarrier();
        for (var t = 0u; t < n; t++) {
            let q = shared32((2u * t) * (MAX_DK / 4u) + 8u * g);
            let k = shared32((2u * t + 1u) * (MAX_DK / 4u) + 8u * g);
            s = scale32(s, DECAY[t]);
            let predicted = quad_sum(dot32(s, k));
            let delta = (VB[t * w.cols + quad % w.cols] - predicted) * BETA[t];
            s = axpy32(s, k, delta);
            let total = quad_sum(dot32(s, q));
            if (valid && g == 0u) {
                if (normed) {
                    OUTB[t * w.cols + quad] = total;
                } else {
                    O[(p.first + t0 + t) * out_stride + head * p.dv + col] = total;
                }
            }
        }
        if (normed) {
            gated_norm(t0, n, tid, w);
        }
    }
    put_state4(base, k0, col, valid, s.v0);
    put_state4(base, k0 + 4u, col, valid, s.v1);
    put_state4(base, k0 + 8u, col, valid, s.v2);
    put_state4(base, k0 + 12u, col, valid, s.v3);
    put_state4(base, k0 + 16u, col, valid, s.v4);
    put_state4(base, k0 + 20u, col, valid, s.v5);
    put_state4(base, k0 + 24u, col, valid, s.v6);
    put_state4(base, k0 + 28u, col, valid, s.v7);
}

// The gated RMS norm of the batch's n outputs (OUTB, one head per workgroup): invocation tid adds
// the squares of columns tid % P, tid % P + P, ... of token tid / P (P = wg_size / BATCH) in
// order; token t's P partial sums are added in runs of 8 (in order), then the runs in order,
// inv = 1 / sqrt(mean + eps);
// each output is (y * inv) * weight * sigmoid(z), as rmsnorm_gated stores it.
fn gated_norm(t0: u32, n: u32, tid: u32, w: Cols) {
    workgroupBarrier();
    let per = w.wg_size / BATCH;
    let tt = tid / per;
    var acc = 0.0;
    if (tt < n) {
        for (var c = tid % per; c < p.dv; c += per) {
            let v = OUTB[tt * w.cols + c];
            acc = fma(v, v, acc);
        }
    }
    RED[tid] = acc;
    workgroupBarrier();
    // Token t's `per` partial sums in runs of 8, each run in order (one invocation per run), then
    // the runs in order: two short serial sums instead of one long one.
    let runs = (per + 7u) / 8u;
    if (tid < n * runs) {
        let t = tid / runs;
        let r = tid % runs;
        var run = 0.0;
        for (var q = 8u * r; q < min(per, 8u * r + 8u); q++) {
            run += RED[t * per + q];
        }
        RUNS[tid] = run;
    }
    workgroupBarrier();
    if (tid < n) {
        var total = 0.0;
        for (var r = 0u; r < runs; r++) {
            total += RUNS[tid * runs + r];
        }
        INV[tid] = 1.0 / sqrt(total / f32(p.dv) + p.eps);
    }
    workgroupBarrier();
    let out_stride = p.n_v_heads * p.dv;
    for (var i = tid; i < n * w.cols; i += w.wg_size) {
        let t = i / w.cols;
        let c = i % w.cols;
        if (c < p.dv) {
            let at = (p.first + t0 + t) * out_stride + w.head * p.dv + c;
            let gate = 1.0 / (1.0 + exp(-GZ[at]));
            O[at] = OUTB[i] * INV[t] * GW[c] * gate;
        }
    }
}
