// block_q6_K: u8 ql[128] (low 4 bits); u8 qh[64] (high 2 bits); i8 scales[16]; f16 d; offset -32
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 210u;

fn dequant_chunk(block: u32, sub: u32) {
    let d = w_f16(block + 208u);
    let half = sub / 4u;
    let k = sub % 4u;
    let ql = block + 64u * half + 32u * (k & 1u);
    let qh = block + 128u + 32u * half;
    let nibble_shift = 4u * (k / 2u);
    for (var l = 0u; l < 32u; l++) {
        let lo = (w_u8(ql + l) >> nibble_shift) & 0xfu;
        let hi = (w_u8(qh + l) >> (2u * k)) & 3u;
        let sc = f32(w_i8(block + 192u + 8u * half + l / 16u + 2u * k));
        wq[l] = d * sc * f32(i32(lo | (hi << 4u)) - 32);
    }
}
