// Hyper-connection mixing (model-spec 2.4), per token, `hc` streams of `h` values, stream-major.
//   hc_mix_out: Y[t*h + i] = (1/hc) * sum_s sigmoid(G[t, s*h+i]) * N[t, s*h+i]   (streams in order)
//   hc_combine: Y[t, s*h+i] += 2*sigmoid(INJ[t*hc+s] / hc) * X[t*h + i]         (adds to the raw residual)

struct Params {
    h: u32,
    hc: u32,
    tokens: u32,
}

var<immediate> p: Params;

@group(0) @binding(0) var<storage, read> G: array<f32>;
@group(0) @binding(1) var<storage, read> N: array<f32>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<storage, read> X: array<f32>;
@group(0) @binding(4) var<storage, read> INJ: array<f32>;

fn sigmoid(v: f32) -> f32 {
    return 1.0 / (1.0 + exp(-v));
}

@compute @workgroup_size(64)
fn hc_mix_out(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x;
    let t = id.y;
    if (i >= p.h || t >= p.tokens) {
        return;
    }
    let wide = p.h * p.hc;
    var acc = 0.0;
    for (var s = 0u; s < p.hc; s++) {
        let k = t * wide + s * p.h + i;
        acc += sigmoid(G[k]) * N[k];
    }
    Y[t * p.h + i] = acc * (1.0 / f32(p.hc));
}

@compute @workgroup_size(64)
fn hc_combine(@builtin(global_invocation_id) id: vec3<u32>) {
    let j = id.x;
    let t = id.y;
    let wide = p.h * p.hc;
    if (j >= wide || t >= p.tokens) {
        return;
    }
    let s = j / p.h;
    let i = j % p.h;
    let alpha = 2.0 * sigmoid(INJ[t * p.hc + s] * (1.0 / f32(p.hc)));
    Y[t * wide + j] += alpha * X[t * p.h + i];
}
