// block_iq2_s: f16 d; u8 qs[64] (32 grid low bytes, then 32 sign bytes); u8 qh[8]; u8 scales[8]
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 82u;

fn dequant_chunk(block: u32, sub: u32) {
    let d = w_f16(block);
    let sc = w_u8(block + 74u + sub);
    let qh = w_u8(block + 66u + sub);
    for (var l = 0u; l < 4u; l++) {
        let nibble = (sc >> (4u * (l / 2u))) & 0xfu;
        let dl = d * (0.5 + f32(nibble)) * 0.25;
        let entry = w_u8(block + 2u + 4u * sub + l) | ((qh << (8u - 2u * l)) & 0x300u);
        let signs = w_u8(block + 34u + 4u * sub + l);
        for (var j = 0u; j < 8u; j++) {
            wq[8u * l + j] = signed(dl * f32(grid8(entry, j)), signs, j);
        }
    }
}
