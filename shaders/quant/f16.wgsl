const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 64u;

// Rows of F16 are multiples of 64 bytes (32 values), so every chunk is word-aligned.
fn dequant_chunk(block: u32, sub: u32) {
    let w0 = block >> 2u;
    for (var j = 0u; j < 16u; j++) {
        let v = unpack2x16float(W[w0 + j]);
        wq[2u * j] = v.x;
        wq[2u * j + 1u] = v.y;
    }
}

// Register dequantizer for `dq8` (same values as `dequant_chunk`).
fn f16x4(w0: u32) -> vec4<f32> {
    return vec4<f32>(unpack2x16float(W[w0]), unpack2x16float(W[w0 + 1u]));
}

fn dq8(block: u32, group: u32) -> Group8 {
    let w0 = (block >> 2u) + 4u * group;
    return Group8(f16x4(w0), f16x4(w0 + 2u));
}

// Value i of the row at byte `row_byte` (2-byte aligned), for quant/rows_any.wgsl.
fn wval(row_byte: u32, i: u32) -> f32 {
    let b = row_byte + 2u * i;
    return unpack2x16float(W[b >> 2u] >> ((b & 2u) << 3u)).x;
}
