const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 64u;

// bf16 is the top half of an f32.
fn dequant_chunk(block: u32, sub: u32) {
    let w0 = block >> 2u;
    for (var j = 0u; j < 16u; j++) {
        let w = W[w0 + j];
        wq[2u * j] = bitcast<f32>(w << 16u);
        wq[2u * j + 1u] = bitcast<f32>(w & 0xffff0000u);
    }
}
