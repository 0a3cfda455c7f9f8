// block_nvfp4: u8 d[4] (UE4M3 scale per 16 values), u8 qs[32]: E2M1 codes; in 16-value group s,
// value j < 8 = low nibble of qs[8s + j], j >= 8 = high nibble of qs[8s + j - 8]. The code book is
// stored doubled (ggml's kvalues_mxfp4) and the scale halved, exactly as ggml's to_float does.
const QK: u32 = 64u;
const BLOCK_BYTES: u32 = 36u;

// kvalues_mxfp4 as packed signed bytes (code 8 is +0, not -0).
const FP4_PACKED = vec4<u32>(0x03020100u, 0x0c080604u, 0xfdfeff00u, 0xf4f8fafcu);

fn fp4_value(q: u32) -> f32 {
    let byte = (FP4_PACKED[q >> 2u] >> ((q & 3u) << 3u)) & 0xffu;
    return f32(bitcast<i32>(byte << 24u) >> 24u);
}

fn pow2(e: i32) -> f32 {
    return bitcast<f32>(u32(e + 127) << 23u);
}

// ggml_ue4m3_to_fp32 halved; 0 and 0x7f decode to 0. Every step is exact in f32.
fn ue4m3_half(x: u32) -> f32 {
    if (x == 0u || x == 0x7fu) {
        return 0.0;
    }
    let exponent = i32((x >> 3u) & 0xfu);
    let mantissa = f32(x & 7u);
    var raw = mantissa * pow2(-9);
    if (exponent != 0) {
        raw = (1.0 + mantissa / 8.0) * pow2(exponent - 7);
    }
    return raw * 0.5;
}

// Chunk `sub` holds 16-value groups 2 sub and 2 sub + 1.
fn dequant_chunk(block: u32, sub: u32) {
    let qs = w_load16(block + 4u + 16u * sub);
    for (var g = 0u; g < 2u; g++) {
        let d = ue4m3_half(w_u8(block + 2u * sub + g));
        for (var j = 0u; j < 8u; j++) {
            let q = byte_of(qs, 8u * g + j);
            wq[16u * g + j] = fp4_value(q & 0xfu) * d;
            wq[16u * g + j + 8u] = fp4_value(q >> 4u) * d;
        }
    }
}
