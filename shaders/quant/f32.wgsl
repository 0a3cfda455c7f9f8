const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 128u;

fn dequant_chunk(block: u32, sub: u32) {
    let w0 = block >> 2u;
    for (var j = 0u; j < 32u; j++) {
        wq[j] = bitcast<f32>(W[w0 + j]);
    }
}

// Register dequantizer for `dq8` (same values as `dequant_chunk`).
fn f32x4(w0: u32) -> vec4<f32> {
    return bitcast<vec4<f32>>(vec4<u32>(W[w0], W[w0 + 1u], W[w0 + 2u], W[w0 + 3u]));
}

fn dq8(block: u32, group: u32) -> Group8 {
    let w0 = (block >> 2u) + 8u * group;
    return Group8(f32x4(w0), f32x4(w0 + 4u));
}

// Value i of the row at byte `row_byte`, for quant/rows_any.wgsl.
fn wval(row_byte: u32, i: u32) -> f32 {
    return bitcast<f32>(W[(row_byte >> 2u) + i]);
}
