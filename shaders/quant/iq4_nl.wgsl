// block_iq4_nl: f16 d; u8 qs[16]; nibbles index a fixed non-linear codebook
const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 18u;

const IQ4_VALUES = array<f32, 16>(-127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0,
                                  1.0, 13.0, 25.0, 38.0, 53.0, 69.0, 89.0, 113.0);

fn dequant_chunk(block: u32, sub: u32) {
    let d = w_f16(block);
    for (var j = 0u; j < 16u; j++) {
        let q = w_u8(block + 2u + j);
        wq[j] = d * IQ4_VALUES[q & 0xfu];
        wq[j + 16u] = d * IQ4_VALUES[q >> 4u];
    }
}
