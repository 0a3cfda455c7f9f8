// block_q4_K: f16 d; f16 dmin; u8 scales[12] (8 packed 6-bit scale/min pairs); u8 qs[128]
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 144u;

// Scale and min of sub-block j from the 12 packed bytes at `sc`.
fn k4_scale_min(sc: u32, j: u32) -> vec2<f32> {
    if (j < 4u) {
        return vec2<f32>(f32(w_u8(sc + j) & 63u), f32(w_u8(sc + j + 4u) & 63u));
    }
    let s = (w_u8(sc + j + 4u) & 0xfu) | ((w_u8(sc + j - 4u) >> 6u) << 4u);
    let m = (w_u8(sc + j + 4u) >> 4u) | ((w_u8(sc + j) >> 6u) << 4u);
    return vec2<f32>(f32(s), f32(m));
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
