const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 128u;

fn dequant_chunk(block: u32, sub: u32) {
    let w0 = block >> 2u;
    for (var j = 0u; j < 32u; j++) {
        wq[j] = bitcast<f32>(W[w0 + j]);
    }
}
