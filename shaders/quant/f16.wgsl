const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 64u;

// Rows of F16 are multiples of 64 bytes (32 values), so every chunk is word-aligned.
fn dequant_chunk(block: u32, sub: u32) {
    let w0 = block >> 2u;
    for (var j = 0u; j < 16u; j++) {
        let v = unpack2x16float(W[w0 + j]);
        wq[2u * j] = v.x;
        wq[2u * j + 1u] = v.y;
    }
}
