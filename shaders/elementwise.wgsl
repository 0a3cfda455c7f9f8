// Small element-wise kernels, one thread per element.
//   silu_scale:  Y[i] = silu(Y[i] * a)                     (HC low-rank activation, a = 1/hc)
//   swiglu:      Y[i] = silu(Y[i]) * X[i]                   (expert gate (Y) and up (X))
//   copy_rows:   Y[dst_off + (row0 + t) * dst_stride + i] = X[src_off + t * src_stride + i]
//   block_mean:  Y[b * width + i] = (sum_j X[(b * ratio + j) * width + i]) / ratio, b in [row0, row0 + rows)

struct Params {
    count: u32,
    a: f32,
    width: u32,
    rows: u32,
    src_off: u32,
    src_stride: u32,
    dst_off: u32,
    dst_stride: u32,
    row0: u32,
    ratio: u32,
}

var<immediate> p: Params;

@group(0) @binding(0) var<storage, read> X: array<f32>;
@group(0) @binding(1) var<storage, read_write> Y: array<f32>;

const WG: u32 = 64u;

fn silu(v: f32) -> f32 {
    return v / (1.0 + exp(-v));
}

fn flat(id: vec3<u32>, n_wg: vec3<u32>) -> u32 {
    return id.x + id.y * n_wg.x * WG;
}

@compute @workgroup_size(WG)
fn silu_scale(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) n_wg: vec3<u32>) {
    let i = flat(id, n_wg);
    if (i < p.count) {
        Y[i] = silu(Y[i] * p.a);
    }
}

@compute @workgroup_size(WG)
fn swiglu(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) n_wg: vec3<u32>) {
    let i = flat(id, n_wg);
    if (i < p.count) {
        Y[i] = silu(Y[i]) * X[i];
    }
}

@compute @workgroup_size(WG)
fn copy_rows(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x;
    let t = id.y;
    if (i < p.width && t < p.rows) {
        Y[p.dst_off + (p.row0 + t) * p.dst_stride + i] = X[p.src_off + t * p.src_stride + i];
    }
}

@compute @workgroup_size(WG)
fn block_mean(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x;
    let b = p.row0 + id.y;
    if (i < p.width && id.y < p.rows) {
        var acc = 0.0;
        for (var j = 0u; j < p.ratio; j++) {
            acc += X[(b * p.ratio + j) * p.width + i];
        }
        Y[b * p.width + i] = acc / f32(p.ratio);
    }
}
