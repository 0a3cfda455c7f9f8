// block_iq2_xxs: f16 d; u16 qs[32]. Per 32 values: 4 grid bytes, then 4x7 sign bits + 4-bit scale.
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 66u;

fn dequant_chunk(block: u32, sub: u32) {
    let d = w_f16(block);
    let indices = w_u32(block + 2u + 8u * sub);
    let aux = w_u32(block + 6u + 8u * sub);
    let db = d * (0.5 + f32(aux >> 28u)) * 0.25;
    for (var l = 0u; l < 4u; l++) {
        let entry = (indices >> (8u * l)) & 0xffu;
        let signs = ksign((aux >> (7u * l)) & 127u);
        for (var j = 0u; j < 8u; j++) {
            wq[8u * l + j] = signed(db * f32(grid8(entry, j)), signs, j);
        }
    }
}
