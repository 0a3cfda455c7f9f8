// block_iq3_xxs: f16 d; u8 qs[64] (grid indices); u32 scales_and_signs[8] (4x7 sign bits + 4-bit scale)
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 98u;

fn dequant_chunk(block: u32, sub: u32) {
    let d = w_f16(block);
    let aux = w_u32(block + 66u + 4u * sub);
    let db = d * (0.5 + f32(aux >> 28u)) * 0.5;
    for (var l = 0u; l < 4u; l++) {
        let signs = ksign((aux >> (7u * l)) & 127u);
        let e1 = w_u8(block + 2u + 8u * sub + 2u * l);
        let e2 = w_u8(block + 3u + 8u * sub + 2u * l);
        for (var j = 0u; j < 4u; j++) {
            wq[8u * l + j] = signed(db * f32(grid4(e1, j)), signs, j);
            wq[8u * l + j + 4u] = signed(db * f32(grid4(e2, j)), signs, j + 4u);
        }
    }
}
