// block_q2_K: u8 scales[16] (low nibble scale, high nibble min); u8 qs[64] (2-bit values); f16 d; f16 dmin
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 84u;

fn dequant_chunk(block: u32, sub: u32) {
    let d = w_f16(block + 80u);
    let dmin = w_f16(block + 82u);
    let half = sub / 4u;
    let shift = 2u * (sub % 4u);
    let qs = block + 16u + 32u * half;
    for (var part = 0u; part < 2u; part++) {
        let sc = w_u8(block + 8u * half + 2u * (sub % 4u) + part);
        let dl = d * f32(sc & 0xfu);
        let ml = dmin * f32(sc >> 4u);
        for (var l = 0u; l < 16u; l++) {
            let q = (w_u8(qs + 16u * part + l) >> shift) & 3u;
            wq[16u * part + l] = dl * f32(q) - ml;
        }
    }
}
