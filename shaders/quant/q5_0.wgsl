// block_q5_0: f16 d; u8 qh[4] (fifth bits, value j in bit j); u8 qs[16]; offset -16
const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 22u;

fn dequant_chunk(block: u32, sub: u32) {
    let d = w_f16(block);
    let qh = w_u32(block + 2u);
    let qs = w_load16(block + 6u);
    for (var j = 0u; j < 16u; j++) {
        let q = byte_of(qs, j);
        let h0 = ((qh >> j) & 1u) << 4u;
        let h1 = ((qh >> (j + 16u)) & 1u) << 4u;
        wq[j] = d * (f32((q & 0xfu) | h0) - 16.0);
        wq[j + 16u] = d * (f32((q >> 4u) | h1) - 16.0);
    }
}
