// block_q8_0: f16 d; i8 qs[32]
const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 34u;

fn dequant_chunk(block: u32, sub: u32) {
    let d = w_f16(block);
    for (var j = 0u; j < 32u; j++) {
        wq[j] = d * f32(w_i8(block + 2u + j));
    }
}
