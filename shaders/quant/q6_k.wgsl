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
    let l0 = w_load16(ql);
    let l1 = w_load16(ql + 16u);
    let h0 = w_load16(qh);
    let h1 = w_load16(qh + 16u);
    let sc0 = f32(w_i8(block + 192u + 8u * half + 2u * k));
    let sc1 = f32(w_i8(block + 193u + 8u * half + 2u * k));
    for (var l = 0u; l < 16u; l++) {
        let a = ((byte_of(l0, l) >> nibble_shift) & 0xfu) | (((byte_of(h0, l) >> (2u * k)) & 3u) << 4u);
        let b = ((byte_of(l1, l) >> nibble_shift) & 0xfu) | (((byte_of(h1, l) >> (2u * k)) & 3u) << 4u);
        wq[l] = d * sc0 * f32(i32(a) - 32);
        wq[l + 16u] = d * sc1 * f32(i32(b) - 32);
    }
}
