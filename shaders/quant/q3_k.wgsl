// block_q3_K: u8 hmask[32]; u8 qs[64]; u8 scales[12] (16 packed 6-bit scales, offset -32); f16 d
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 110u;

fn q3k_scale(block: u32, i: u32) -> f32 {
    let sc = block + 96u;
    var low: u32;
    if (i < 8u) {
        low = w_u8(sc + i) & 0xfu;
    } else {
        low = w_u8(sc + i - 8u) >> 4u;
    }
    let high = (w_u8(sc + 8u + i % 4u) >> (2u * (i / 4u))) & 3u;
    return f32(i32(low | (high << 4u)) - 32);
}

fn dequant_chunk(block: u32, sub: u32) {
    let d = w_f16(block + 108u);
    let half = sub / 4u;
    let shift = 2u * (sub % 4u);
    let qs = block + 32u + 32u * half;
    let mask = 1u << sub;
    for (var part = 0u; part < 2u; part++) {
        let dl = d * q3k_scale(block, 2u * sub + part);
        for (var l = 0u; l < 16u; l++) {
            let idx = 16u * part + l;
            var q = i32((w_u8(qs + idx) >> shift) & 3u);
            if ((w_u8(block + idx) & mask) == 0u) {
                q -= 4;
            }
            wq[idx] = dl * f32(q);
        }
    }
}
