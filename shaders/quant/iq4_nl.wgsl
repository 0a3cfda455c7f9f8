// block_iq4_nl: f16 d; u8 qs[16]; nibbles index a fixed non-linear codebook
const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 18u;

// The codebook as packed signed bytes: a vector lookup instead of a const-array index, which
// some drivers turn into a per-invocation copy of the whole array.
const IQ4_PACKED = vec4<u32>(0xbfad9881u, 0xf6eaddcfu, 0x26190d01u, 0x71594535u);

fn iq4_value(q: u32) -> f32 {
    let byte = (IQ4_PACKED[q >> 2u] >> ((q & 3u) << 3u)) & 0xffu;
    return f32(bitcast<i32>(byte << 24u) >> 24u);
}

fn dequant_chunk(block: u32, sub: u32) {
    let d = w_f16(block);
    let qs = w_load16(block + 2u);
    for (var j = 0u; j < 16u; j++) {
        let q = byte_of(qs, j);
        wq[j] = d * iq4_value(q & 0xfu);
        wq[j + 16u] = d * iq4_value(q >> 4u);
    }
}

// Register dequantizer for `dq8` (same values as `dequant_chunk`).
// nibble `shift` of each byte of `w`.
fn iq4x4(w: u32, shift: u32) -> vec4<f32> {
    let q = (bytes4(w) >> vec4<u32>(shift)) & vec4<u32>(0xfu);
    return vec4<f32>(iq4_value(q.x), iq4_value(q.y), iq4_value(q.z), iq4_value(q.w));
}

// Group g: low nibbles (g < 2) or high nibbles (g >= 2) of bytes 8*(g%2) .. 8*(g%2)+8.
fn dq8(block: u32, group: u32) -> Group8 {
    let d = w_f16(block);
    let q = block + 2u + 8u * (group & 1u);
    let shift = 4u * (group >> 1u);
    return Group8(d * iq4x4(w_u32(q), shift), d * iq4x4(w_u32(q + 4u), shift));
}
