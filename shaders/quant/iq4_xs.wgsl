// block_iq4_xs: f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]; 6-bit scale per 32 values (offset -32)
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 136u;

// The codebook as packed signed bytes: a vector lookup instead of a const-array index, which
// some drivers turn into a per-invocation copy of the whole array.
const IQ4_PACKED = vec4<u32>(0xbfad9881u, 0xf6eaddcfu, 0x26190d01u, 0x71594535u);

fn iq4_value(q: u32) -> f32 {
    let byte = (IQ4_PACKED[q >> 2u] >> ((q & 3u) << 3u)) & 0xffu;
    return f32(bitcast<i32>(byte << 24u) >> 24u);
}

fn dequant_chunk(block: u32, sub: u32) {
    let d = w_f16(block);
    let scales_h = w_u16(block + 2u);
    let low = (w_u8(block + 4u + sub / 2u) >> (4u * (sub % 2u))) & 0xfu;
    let high = (scales_h >> (2u * sub)) & 3u;
    let dl = d * (f32(low | (high << 4u)) - 32.0);
    let qs = w_load16(block + 8u + 16u * sub);
    for (var j = 0u; j < 16u; j++) {
        let q = byte_of(qs, j);
        wq[j] = dl * iq4_value(q & 0xfu);
        wq[j + 16u] = dl * iq4_value(q >> 4u);
    }
}
