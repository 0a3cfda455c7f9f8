const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 64u;

// bf16 is the top half of an f32.
fn dequant_chunk(block: u32, sub: u32) {
    let w0 = block >> 2u;
    for (var j = 0u; j < 16u; j++) {
        let w = W[w0 + j];
        wq[2u * j] = bitcast<f32>(w << 16u);
        wq[2u * j + 1u] = bitcast<f32>(w & 0xffff0000u);
    }
}

// Register dequantizer for `dq8` (same values as `dequant_chunk`).
fn bf16x4(w0: u32) -> vec4<f32> {
    let a = W[w0];
    let b = W[w0 + 1u];
    return bitcast<vec4<f32>>(vec4<u32>(a << 16u, a & 0xffff0000u, b << 16u, b & 0xffff0000u));
}

fn dq8(block: u32, group: u32) -> Group8 {
    let w0 = (block >> 2u) + 4u * group;
    return Group8(bf16x4(w0), bf16x4(w0 + 2u));
}

// Value i of the row at byte `row_byte` (2-byte aligned), for quant/rows_any.wgsl.
fn wval(row_byte: u32, i: u32) -> f32 {
    let b = row_byte + 2u * i;
    return bitcast<f32>(((W[b >> 2u] >> ((b & 2u) << 3u)) & 0xffffu) << 16u);
}
