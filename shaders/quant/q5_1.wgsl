// block_q5_1: f16 d; f16 m; u8 qh[4]; u8 qs[16]; value = d*q + m
const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 24u;

fn dequant_chunk(block: u32, sub: u32) {
    let d = w_f16(block);
    let m = w_f16(block + 2u);
    let qh = w_u32(block + 4u);
    let qs = w_load16(block + 8u);
    for (var j = 0u; j < 16u; j++) {
        let q = byte_of(qs, j);
        let h0 = ((qh >> j) & 1u) << 4u;
        let h1 = ((qh >> (j + 16u)) & 1u) << 4u;
        wq[j] = d * f32((q & 0xfu) | h0) + m;
        wq[j + 16u] = d * f32((q >> 4u) | h1) + m;
    }
}
