// block_q4_K: f16 d; f16 dmin; u8 scales[12] (8 packed 6-bit scale/min pairs); u8 qs[128]
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 144u;

// Scale and min of sub-block j from the 12 packed bytes at `sc`. Branch-free (lanes of a subgroup
// work on different sub-blocks, so `j < 4` diverges): one 16-byte load, both layouts, a select.
fn k4_scale_min(sc: u32, j: u32) -> vec2<f32> {
    let bytes = w_load16(sc);
    let b_j = byte_of(bytes, j);
    let b_j4 = byte_of(bytes, j + 4u);
    let b_jm4 = byte_of(bytes, select(j, j - 4u, j >= 4u));
    let low = vec2<u32>(b_j & 63u, b_j4 & 63u);
    let high = vec2<u32>((b_j4 & 0xfu) | ((b_jm4 >> 6u) << 4u), (b_j4 >> 4u) | ((b_j >> 6u) << 4u));
    return vec2<f32>(select(high, low, j < 4u));
}

fn dequant_chunk(block: u32, sub: u32) {
    let d = w_f16(block);
    let dmin = w_f16(block + 2u);
    let sm = k4_scale_min(block + 4u, sub);
    let dl = d * sm.x;
    let ml = dmin * sm.y;
    let qs = block + 16u + 32u * (sub / 2u);
    let shift = 4u * (sub % 2u);
    let q0 = w_load16(qs);
    let q1 = w_load16(qs + 16u);
    for (var l = 0u; l < 16u; l++) {
        wq[l] = dl * f32((byte_of(q0, l) >> shift) & 0xfu) - ml;
        wq[l + 16u] = dl * f32((byte_of(q1, l) >> shift) & 0xfu) - ml;
    }
}
