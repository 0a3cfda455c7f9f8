// block_q1_0: f16 d; u8 qs[16]: one bit per value, low bit first; set = +d, clear = -d
const QK: u32 = 128u;
const BLOCK_BYTES: u32 = 18u;

fn dequant_chunk(block: u32, sub: u32) {
    let d = w_f16(block);
    let bits = w_u32(block + 2u + 4u * sub);
    for (var j = 0u; j < 32u; j++) {
        wq[j] = select(-d, d, ((bits >> j) & 1u) != 0u);
    }
}
