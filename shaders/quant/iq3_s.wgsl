// block_iq3_s: f16 d; u8 qs[64]; u8 qh[8] (9th index bits); u8 signs[32]; u8 scales[4] (4-bit, odd scale 1+2s)
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 110u;

fn dequant_chunk(block: u32, sub: u32) {
    let d = w_f16(block);
    let db = d * f32(1u + 2u * ((w_u8(block + 106u + sub / 2u) >> (4u * (sub % 2u))) & 0xfu));
    let qh = w_u8(block + 66u + sub);
    let qs = w_load16(block + 2u + 8u * sub); // bytes 0..7 are this chunk's indices
    let sign_word = w_u32(block + 74u + 4u * sub);
    for (var l = 0u; l < 4u; l++) {
        let e1 = byte_of(qs, 2u * l) | ((qh << (8u - 2u * l)) & 256u);
        let e2 = byte_of(qs, 2u * l + 1u) | ((qh << (7u - 2u * l)) & 256u);
        let signs = (sign_word >> (8u * l)) & 0xffu;
        for (var j = 0u; j < 4u; j++) {
            wq[8u * l + j] = signed(db * f32(grid4(e1, j)), signs, j);
            wq[8u * l + j + 4u] = signed(db * f32(grid4(e2, j)), signs, j + 4u);
        }
    }
}
