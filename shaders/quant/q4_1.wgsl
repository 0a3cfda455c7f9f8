// block_q4_1: f16 d; f16 m; u8 qs[16]; value = d*q + m
const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 20u;

fn dequant_chunk(block: u32, sub: u32) {
    let d = w_f16(block);
    let m = w_f16(block + 2u);
    let qs = w_load16(block + 4u);
    for (var j = 0u; j < 16u; j++) {
        let q = byte_of(qs, j);
        wq[j] = d * f32(q & 0xfu) + m;
        wq[j + 16u] = d * f32(q >> 4u) + m;
    }
}
