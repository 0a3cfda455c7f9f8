// block_iq1_s: f16 d; u8 qs[32]; u16 qh[8] (3 high index bits x4, 3-bit scale, delta sign)
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 50u;

fn dequant_chunk(block: u32, sub: u32) {
    let d = w_f16(block);
    let qh = w_u16(block + 34u + 2u * sub);
    let dl = d * f32(2u * ((qh >> 12u) & 7u) + 1u);
    var delta = 0.125;
    if ((qh & 0x8000u) != 0u) {
        delta = -0.125;
    }
    for (var l = 0u; l < 4u; l++) {
        let entry = w_u8(block + 2u + 4u * sub + l) | (((qh >> (3u * l)) & 7u) << 8u);
        for (var j = 0u; j < 8u; j++) {
            wq[8u * l + j] = dl * (grid8_i8(entry, j) + delta);
        }
    }
}
