// block_tq2_0: u8 qs[64] (2-bit codes {0,1,2} for {-1,0,+1}), f16 d. Value order (ggml): for each
// half of qs (32 bytes), for each 2-bit position l, the 32 bytes in order. So 32-value chunk `sub`
// is bit pair sub % 4 of bytes 32 * (sub / 4) .. + 32.
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 66u;

fn dequant_chunk(block: u32, sub: u32) {
    let d = w_f16(block + 64u);
    let base = block + 32u * (sub / 4u);
    let shift = 2u * (sub % 4u);
    let lo = w_load16(base);
    let hi = w_load16(base + 16u);
    for (var j = 0u; j < 16u; j++) {
        wq[j] = f32(i32((byte_of(lo, j) >> shift) & 3u) - 1) * d;
        wq[j + 16u] = f32(i32((byte_of(hi, j) >> shift) & 3u) - 1) * d;
    }
}
