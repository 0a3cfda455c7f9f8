// block_q4_0: f16 d; u8 qs[16]; value j<16 = low nibble of qs[j], j>=16 = high nibble of qs[j-16]; offset -8
const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 18u;

fn dequant_chunk(block: u32, sub: u32) {
    let d = w_f16(block);
    let qs = w_load16(block + 2u);
    for (var j = 0u; j < 16u; j++) {
        let q = byte_of(qs, j);
        wq[j] = d * (f32(q & 0xfu) - 8.0);
        wq[j + 16u] = d * (f32(q >> 4u) - 8.0);
    }
}
