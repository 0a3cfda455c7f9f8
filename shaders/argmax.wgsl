// Greedy sampling on the GPU: per row, the index of the largest value, the lowest index winning a
// tie; OUT[2*row] = index, OUT[2*row+1] = 1 when the row holds a non-finite value (then the index
// is meaningless and the host reports an error). Fixed strided scan + fixed tree: deterministic.

struct Params {
    n: u32,
    rows: u32,
}

var<immediate> p: Params;

@group(0) @binding(0) var<storage, read> X: array<f32>;
@group(0) @binding(1) var<storage, read_write> OUT: array<u32>;

const WG: u32 = 256u;
var<workgroup> best_v: array<f32, WG>;
var<workgroup> best_i: array<u32, WG>;
var<workgroup> bad: array<u32, WG>;

fn is_finite(v: f32) -> bool {
    // Exponent all ones = inf or NaN.
    return (bitcast<u32>(v) & 0x7f800000u) != 0x7f800000u;
}

@compute @workgroup_size(WG)
fn argmax(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let row = wg.x;
    let base = row * p.n;
    var v = -3.4e38;
    var idx = 0xffffffffu;
    var nonfinite = 0u;
    for (var i = lid.x; i < p.n; i += WG) {
        let x = X[base + i];
        if (!is_finite(x)) {
            nonfinite = 1u;
        } else if (idx == 0xffffffffu || x > v) {
            v = x;
            idx = i;
        }
    }
    best_v[lid.x] = v;
    best_i[lid.x] = idx;
    bad[lid.x] = nonfinite;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid.x < s) {
            let ov = best_v[lid.x + s];
            let oi = best_i[lid.x + s];
            let take = oi != 0xffffffffu
                && (best_i[lid.x] == 0xffffffffu || ov > best_v[lid.x] || (ov == best_v[lid.x] && oi < best_i[lid.x]));
            if (take) {
                best_v[lid.x] = ov;
                best_i[lid.x] = oi;
            }
            bad[lid.x] = bad[lid.x] | bad[lid.x + s];
        }
        workgroupBarrier();
    }
    if (lid.x == 0u) {
        OUT[2u * row] = best_i[0];
        OUT[2u * row + 1u] = bad[0];
    }
}
