// block_q2_0: f16 d; u8 qs[16]: 2-bit codes, 4 per byte, low bits first; weight = (code - 1) * d
const QK: u32 = 64u;
const BLOCK_BYTES: u32 = 18u;

fn dequant_chunk(block: u32, sub: u32) {
    let d = w_f16(block);
    let lo = w_u32(block + 2u + 8u * sub);
    let hi = w_u32(block + 6u + 8u * sub);
    for (var j = 0u; j < 16u; j++) {
        wq[j] = f32(i32((lo >> (2u * j)) & 3u) - 1) * d;
        wq[j + 16u] = f32(i32((hi >> (2u * j)) & 3u) - 1) * d;
    }
}
