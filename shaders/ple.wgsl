// PLE block (model-spec 2.5) after the host has gathered and dequantized the hashed rows and the
// GPU has projected and normalised them.
//   ple_gate: per token and stream s: a = <KN_s, QN_s>/sqrt(h); g = sigmoid(signed_sqrt(a));
//             P[t, s*h+i] = g * V[t*h+i]
//   ple_conv: per channel c, tokens in order: dilated causal conv of N over [history, chunk],
//             X[t, c] += P[t, c] + silu(conv); then the history keeps the last rows of N. The
//             chunk's tokens are columns first .. first + tokens of N, P and X (a batch member
//             starts past column 0).

struct Params {
    tokens: u32,
    h: u32,
    hc: u32,
    kernel: u32,
    dilation: u32,
    pos0: u32,        // absolute position of the chunk's first token
    first: u32,       // ple_conv: the chunk buffers' column of the first token (ple_gate: 0)
}

var<immediate> p: Params;

@group(0) @binding(0) var<storage, read> KN: array<f32>;
@group(0) @binding(1) var<storage, read> QN: array<f32>;
@group(0) @binding(2) var<storage, read> V: array<f32>;
@group(0) @binding(3) var<storage, read_write> P: array<f32>;

const WG: u32 = 64u;
var<workgroup> red: array<f32, WG>;

@compute @workgroup_size(WG)
fn ple_gate(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let s = wg.x;
    let t = wg.y;
    let wide = p.h * p.hc;
    let base = t * wide + s * p.h;
    var acc = 0.0;
    for (var i = lid.x; i < p.h; i += WG) {
        acc = fma(KN[base + i], QN[base + i], acc);
    }
    red[lid.x] = acc;
    workgroupBarrier();
    for (var st = WG / 2u; st > 0u; st >>= 1u) {
        if (lid.x < st) {
            red[lid.x] = red[lid.x] + red[lid.x + st];
        }
        workgroupBarrier();
    }
    let a = red[0] * (1.0 / sqrt(f32(p.h)));
    var root = 0.0;
    if (a != 0.0) {
        root = sign(a) * sqrt(max(abs(a), 1e-6));
    }
    let gate = 1.0 / (1.0 + exp(-root));
    for (var i = lid.x; i < p.h; i += WG) {
        P[base + i] = gate * V[t * p.h + i];
    }
}

@group(0) @binding(4) var<storage, read> N: array<f32>;          // [T, wide] normalised P
@group(0) @binding(5) var<storage, read> PR: array<f32>;         // [T, wide] P
@group(0) @binding(6) var<storage, read> CW: array<f32>;         // [wide, kernel]
@group(0) @binding(7) var<storage, read_write> HIST: array<f32>; // [(kernel-1)*dilation, wide], oldest first
@group(0) @binding(8) var<storage, read_write> X: array<f32>;    // [T, wide] residual

fn silu(v: f32) -> f32 {
    return v / (1.0 + exp(-v));
}

@compute @workgroup_size(64)
fn ple_conv(@builtin(global_invocation_id) id: vec3<u32>) {
    let wide = p.h * p.hc;
    let c = id.x;
    if (c >= wide) {
        return;
    }
    let hist = (p.kernel - 1u) * p.dilation;
    for (var t = 0u; t < p.tokens; t++) {
        var acc = 0.0;
        for (var k = 0u; k < p.kernel; k++) {
            let back = p.dilation * (p.kernel - 1u - k);
            var v = 0.0;
            if (back <= p.pos0 + t) {
                let idx = hist + t - back;
                if (idx < hist) {
                    v = HIST[idx * wide + c];
                } else {
                    v = N[(p.first + idx - hist) * wide + c];
                }
            }
            acc += CW[c * p.kernel + k] * v;
        }
        let at = (p.first + t) * wide + c;
        X[at] += PR[at] + silu(acc);
    }
    for (var r = 0u; r < hist; r++) {
        let idx = p.tokens + r;
        var v: f32;
        if (idx < hist) {
            v = HIST[idx * wide + c];
        } else {
            v = N[(p.first + idx - hist) * wide + c];
        }
        HIST[r * wide + c] = v;
    }
}
