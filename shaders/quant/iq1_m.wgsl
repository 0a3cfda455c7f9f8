// block_iq1_m: u8 qs[32]; u8 qh[16]; u8 scales[8]. The f16 super-scale is spread over the top
// nibbles of the four u16 scale words; each 32 values have two 3-bit scales.
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 56u;

fn dequant_chunk(block: u32, sub: u32) {
    let s0 = w_u16(block + 48u);
    let s1 = w_u16(block + 50u);
    let s2 = w_u16(block + 52u);
    let s3 = w_u16(block + 54u);
    let d = f16_bits((s0 >> 12u) | ((s1 >> 8u) & 0xf0u) | ((s2 >> 4u) & 0xf00u) | (s3 & 0xf000u));
    let sc = w_u16(block + 48u + 2u * (sub / 2u));
    let shift = 6u * (sub % 2u);
    let dl1 = d * f32(2u * ((sc >> shift) & 7u) + 1u);
    let dl2 = d * f32(2u * ((sc >> (shift + 3u)) & 7u) + 1u);
    for (var l = 0u; l < 4u; l++) {
        let qh = w_u8(block + 32u + 2u * sub + l / 2u);
        var high: u32;
        var neg: bool;
        if ((l & 1u) == 0u) {
            high = (qh << 8u) & 0x700u;
            neg = (qh & 0x08u) != 0u;
        } else {
            high = (qh << 4u) & 0x700u;
            neg = (qh & 0x80u) != 0u;
        }
        let entry = w_u8(block + 4u * sub + l) | high;
        var delta = 0.125;
        if (neg) {
            delta = -0.125;
        }
        var dl = dl1;
        if (l >= 2u) {
            dl = dl2;
        }
        for (var j = 0u; j < 8u; j++) {
            wq[8u * l + j] = dl * (grid8_i8(entry, j) + delta);
        }
    }
}
