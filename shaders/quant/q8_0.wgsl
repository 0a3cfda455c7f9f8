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

// Register dequantizer (same values as `dequant_chunk`).
fn dq_chunk(block: u32, sub: u32) -> Chunk {
    let d = w_f16(block);
    let lo = w_load16(block + 2u);
    let hi = w_load16(block + 18u);
    return Chunk(d * i8x4(lo.x), d * i8x4(lo.y), d * i8x4(lo.z), d * i8x4(lo.w), d * i8x4(hi.x),
                 d * i8x4(hi.y), d * i8x4(hi.z), d * i8x4(hi.w));
}
