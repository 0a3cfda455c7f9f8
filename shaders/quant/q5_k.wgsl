// block_q5_K: f16 d; f16 dmin; u8 scales[12]; u8 qh[32] (fifth bit of value 32*s+l in bit s of qh[l]); u8 qs[128]
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 176u;

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
    let qh = block + 16u;
    let qs = block + 48u + 32u * (sub / 2u);
    let shift = 4u * (sub % 2u);
    let q0 = w_load16(qs);
    let q1 = w_load16(qs + 16u);
    let h0 = w_load16(qh);
    let h1 = w_load16(qh + 16u);
    for (var l = 0u; l < 16u; l++) {
        let a = ((byte_of(q0, l) >> shift) & 0xfu) | (((byte_of(h0, l) >> sub) & 1u) << 4u);
        let b = ((byte_of(q1, l) >> shift) & 0xfu) | (((byte_of(h1, l) >> sub) & 1u) << 4u);
        wq[l] = dl * f32(a) - ml;
        wq[l + 16u] = dl * f32(b) - ml;
    }
}
