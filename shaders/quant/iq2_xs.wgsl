// block_iq2_xs: f16 d; u16 qs[32] (9-bit grid index + 7 sign bits); u8 scales[8]
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 74u;

fn dequant_chunk(block: u32, sub: u32) {
    let d = w_f16(block);
    let sc = w_u8(block + 66u + sub);
    for (var l = 0u; l < 4u; l++) {
        let q = w_u16(block + 2u + 2u * (4u * sub + l));
        let nibble = (sc >> (4u * (l / 2u))) & 0xfu;
        let dl = d * (0.5 + f32(nibble)) * 0.25;
        let entry = q & 511u;
        let signs = ksign(q >> 9u);
        for (var j = 0u; j < 8u; j++) {
            wq[8u * l + j] = signed(dl * f32(grid8(entry, j)), signs, j);
        }
    }
}
