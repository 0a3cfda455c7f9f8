// block_q8_0: f16 d; i8 qs[32]
const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 34u;

fn dequant_chunk(block: u32, sub: u32) {
    let d = w_f16(block);
    let lo = w_load16(block + 2u);
    let hi = w_load16(block + 18u);
    for (var j = 0u; j < 16u; j++) {
        wq[j] = d * f32(sbyte_of(lo, j));
        wq[j + 16u] = d * f32(sbyte_of(hi, j));
    }
}

// Register dequantizer for `dq8` (same values as `dequant_chunk`).
fn dq8(block: u32, group: u32) -> Group8 {
    let d = w_f16(block);
    let q = block + 2u + 8u * group;
    return Group8(d * i8x4(w_u32(q)), d * i8x4(w_u32(q + 4u)));
}
