// block_mxfp4: u8 e (E8M0 shared exponent), u8 qs[16]: E2M1 codes, value j < 16 = low nibble of
// qs[j], j >= 16 = high nibble of qs[j - 16]. The code book is stored doubled (ggml's
// kvalues_mxfp4) and the scale halved, exactly as ggml's to_float does.
const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 17u;

// kvalues_mxfp4 {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12} as packed signed bytes
// (code 8 is +0, not -0).
const FP4_PACKED = vec4<u32>(0x03020100u, 0x0c080604u, 0xfdfeff00u, 0xf4f8fafcu);

fn fp4_value(q: u32) -> f32 {
    let byte = (FP4_PACKED[q >> 2u] >> ((q & 3u) << 3u)) & 0xffu;
    return f32(bitcast<i32>(byte << 24u) >> 24u);
}

// ggml_e8m0_to_fp32_half: 2^(e - 128), built from its bits (subnormal for e < 2).
fn e8m0_half(e: u32) -> f32 {
    return bitcast<f32>(select((e - 1u) << 23u, 0x00200000u << e, e < 2u));
}

fn dequant_chunk(block: u32, sub: u32) {
    let d = e8m0_half(w_u8(block));
    let qs = w_load16(block + 1u);
    for (var j = 0u; j < 16u; j++) {
        let q = byte_of(qs, j);
        wq[j] = fp4_value(q & 0xfu) * d;
        wq[j + 16u] = fp4_value(q >> 4u) * d;
    }
}
