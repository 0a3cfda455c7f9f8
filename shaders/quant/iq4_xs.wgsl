// block_iq4_xs: f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]; 6-bit scale per 32 values (offset -32)
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 136u;

const IQ4_VALUES = array<f32, 16>(-127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0,
                                  1.0, 13.0, 25.0, 38.0, 53.0, 69.0, 89.0, 113.0);

fn dequant_chunk(block: u32, sub: u32) {
    let d = w_f16(block);
    let scales_h = w_u16(block + 2u);
    let low = (w_u8(block + 4u + sub / 2u) >> (4u * (sub % 2u))) & 0xfu;
    let high = (scales_h >> (2u * sub)) & 3u;
    let dl = d * (f32(low | (high << 4u)) - 32.0);
    let qs = block + 8u + 16u * sub;
    for (var j = 0u; j < 16u; j++) {
        let q = w_u8(qs + j);
        wq[j] = dl * IQ4_VALUES[q & 0xfu];
        wq[j + 16u] = dl * IQ4_VALUES[q >> 4u];
    }
}
