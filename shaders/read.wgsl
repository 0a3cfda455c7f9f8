// Streaming-read probe for `strata bench`: every invocation xor-reduces a grid-strided slice of
// SRC (16-byte loads) and writes one word, so the compiler cannot drop the loads.

struct Params {
    n_vec4: u32,
}

var<immediate> p: Params;

@group(0) @binding(0) var<storage, read> SRC: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> OUT: array<u32>;

@compute @workgroup_size(256)
fn read_stream(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) n_wg: vec3<u32>) {
    let stride = n_wg.x * 256u;
    var acc = vec4<u32>(0u);
    for (var i = id.x; i < p.n_vec4; i += stride) {
        acc ^= SRC[i];
    }
    OUT[id.x] = acc.x ^ acc.y ^ acc.z ^ acc.w;
}
