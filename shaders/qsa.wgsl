// Indexed sparse attention (model-spec 2.7).
//   rope:       partial NeoX rotation of `heads` vectors per row, angles from a host table
//               (cos, sin per position and pair; GPU sin/cos of large angles is not accurate).
//   qsa_select: per query token: score the complete blocks, keep the top `budget` (lowest block id
//               wins ties), written ascending; with nb <= budget every block is kept.
//   qsa_attend: per (head, token): softmax over the allowed keys in ascending position order,
//               then the weighted value sum in that order, times the sigmoid output gate.

struct Params {
    tokens: u32,
    pos0: u32,
    heads: u32,
    head_stride: u32,
    row_stride: u32,
    off: u32,
    half: u32,
    pos_step: u32,
    n_kv: u32,
    hd: u32,
    ratio: u32,
    budget: u32,
    idim: u32,
    max_blocks: u32,
    dense: u32,
    scale: f32,
}

var<immediate> p: Params;

@group(0) @binding(0) var<storage, read_write> Y: array<f32>;
@group(0) @binding(1) var<storage, read> ROPE: array<f32>;

@compute @workgroup_size(64)
fn rope(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x;
    let h = id.y;
    let t = id.z;
    if (i >= p.half || h >= p.heads || t >= p.tokens) {
        return;
    }
    let pos = p.pos0 + t * p.pos_step;
    let c = ROPE[(pos * p.half + i) * 2u];
    let s = ROPE[(pos * p.half + i) * 2u + 1u];
    let base = p.off + t * p.row_stride + h * p.head_stride;
    let a = Y[base + i];
    let b = Y[base + p.half + i];
    Y[base + i] = a * c - b * s;
    Y[base + p.half + i] = b * c + a * s;
}

@group(0) @binding(2) var<storage, read> IQ: array<f32>;       // [T, heads*idim] normed, rotated
@group(0) @binding(3) var<storage, read> BK: array<f32>;       // [blocks, idim] block keys
@group(0) @binding(4) var<storage, read_write> SC: array<f32>; // [T, 2*max_blocks]: scores | selected flags
@group(0) @binding(5) var<storage, read_write> SEL: array<u32>; // [T, budget + 1]: count, ids

const WG: u32 = 64u;

@compute @workgroup_size(WG)
fn qsa_select(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let t = wg.x;
    let pos = p.pos0 + t;
    let nb = (pos + 1u) / p.ratio;
    let sel = t * (p.budget + 1u);
    let sc = t * 2u * p.max_blocks;
    let flags = sc + p.max_blocks;
    if (nb <= p.budget) {
        if (lid.x == 0u) {
            SEL[sel] = nb;
        }
        for (var b = lid.x; b < nb; b += WG) {
            SEL[sel + 1u + b] = b;
        }
        return;
    }
    for (var b = lid.x; b < nb; b += WG) {
        var total = 0.0;
        for (var h = 0u; h < p.heads; h++) {
            var d = 0.0;
            for (var i = 0u; i < p.idim; i++) {
                d += IQ[t * p.heads * p.idim + h * p.idim + i] * BK[b * p.idim + i];
            }
            total += max(d, 0.0);
        }
        SC[sc + b] = total * p.scale;
    }
    storageBarrier();
    workgroupBarrier();
    // Rank of block b = blocks strictly better (higher score, or equal score and lower id).
    // Keep rank < budget (flags live apart from the scores other invocations are still reading).
    for (var b = lid.x; b < nb; b += WG) {
        let v = SC[sc + b];
        var rank = 0u;
        for (var j = 0u; j < nb; j++) {
            let u = SC[sc + j];
            if (u > v || (u == v && j < b)) {
                rank++;
            }
        }
        var flag = 0.0;
        if (rank < p.budget) {
            flag = 1.0;
        }
        SC[flags + b] = flag;
    }
    storageBarrier();
    workgroupBarrier();
    if (lid.x == 0u) {
        var n = 0u;
        for (var b = 0u; b < nb; b++) {
            if (SC[flags + b] != 0.0) {
                SEL[sel + 1u + n] = b;
                n++;
            }
        }
        SEL[sel] = n;
    }
}

@group(0) @binding(6) var<storage, read> Q: array<f32>;   // [T, heads * 2 * hd] (query, gate per head)
@group(0) @binding(7) var<storage, read> KC: array<f32>;  // [ctx, n_kv * hd]
@group(0) @binding(8) var<storage, read> VC: array<f32>;  // [ctx, n_kv * hd]
@group(0) @binding(9) var<storage, read> SELR: array<u32>;
@group(0) @binding(10) var<storage, read_write> OUT: array<f32>; // [T, heads * hd]

const MAX_KEYS: u32 = 2560u;
var<workgroup> wts: array<f32, MAX_KEYS>;
var<workgroup> red: array<f32, WG>;
// Attention runs 256 invocations per (head, token): each key's dot product, the key-order exp sum
// and each output dimension's key-order sum are still computed by one invocation in a fixed order,
// so the width changes speed only, never bits (the max reduction is exact in any order).
const ATT_WG: u32 = 256u;
var<workgroup> att_red: array<f32, ATT_WG>;

fn key_position(t: u32, j: u32, pos: u32) -> u32 {
    if (p.dense != 0u) {
        return j;
    }
    let sel = t * (p.budget + 1u);
    let count = SELR[sel];
    let nb = (pos + 1u) / p.ratio;
    if (j < count * p.ratio) {
        return SELR[sel + 1u + j / p.ratio] * p.ratio + j % p.ratio;
    }
    return nb * p.ratio + (j - count * p.ratio);
}

@compute @workgroup_size(ATT_WG)
fn qsa_attend(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let h = wg.x;
    let t = wg.y;
    let pos = p.pos0 + t;
    var n_keys = pos + 1u;
    if (p.dense == 0u) {
        let nb = (pos + 1u) / p.ratio;
        n_keys = SELR[t * (p.budget + 1u)] * p.ratio + (pos + 1u - nb * p.ratio);
    }
    n_keys = min(n_keys, MAX_KEYS);
    let kvh = h / (p.heads / p.n_kv);
    let kv_width = p.n_kv * p.hd;
    let q0 = t * p.heads * 2u * p.hd + h * 2u * p.hd;
    var local_max = -3.0e38;
    for (var j = lid.x; j < n_keys; j += ATT_WG) {
        let kp = key_position(t, j, pos);
        var d = 0.0;
        for (var i = 0u; i < p.hd; i++) {
            d += Q[q0 + i] * KC[kp * kv_width + kvh * p.hd + i];
        }
        let s = d * p.scale;
        wts[j] = s;
        local_max = max(local_max, s);
    }
    att_red[lid.x] = local_max;
    workgroupBarrier();
    for (var st = ATT_WG / 2u; st > 0u; st >>= 1u) {
        if (lid.x < st) {
            att_red[lid.x] = max(att_red[lid.x], att_red[lid.x + st]);
        }
        workgroupBarrier();
    }
    let mx = att_red[0];
    workgroupBarrier();
    // The exp sum runs in key order on one invocation: a fixed order, like the CPU softmax.
    if (lid.x == 0u) {
        var sum = 0.0;
        for (var j = 0u; j < n_keys; j++) {
            let e = exp(wts[j] - mx);
            wts[j] = e;
            sum += e;
        }
        att_red[0] = 1.0 / sum;
    }
    workgroupBarrier();
    let inv = att_red[0];
    for (var i = lid.x; i < p.hd; i += ATT_WG) {
        var acc = 0.0;
        for (var j = 0u; j < n_keys; j++) {
            let kp = key_position(t, j, pos);
            acc += (wts[j] * inv) * VC[kp * kv_width + kvh * p.hd + i];
        }
        let gate = 1.0 / (1.0 + exp(-Q[q0 + p.hd + i]));
        OUT[t * p.heads * p.hd + h * p.hd + i] = acc * gate;
    }
}
