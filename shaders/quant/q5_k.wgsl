// block_q5_K: f16 d; f16 dmin; u8 scales[12]; u8 qh[32] (fifth bit of value 32*s+l in bit s of qh[l]); u8 qs[128]
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 176u;

// Scale and min of sub-block j from the 12 packed bytes at `sc`. Branch-free (lanes of a subgroup
// work on different sub-blocks, so `j < 4` diverges): one 16-byte load, both layouts, a select.
fn k4_scale_min(sc: u32, j: u32) -> vec2<f32> {
    let bytes = w_load16(sc);
    let b_j = byte_of(bytes, j);
    let b_j4 = byte_of(bytes, j + 4u);
    let b_jm4 = byte_of(bytes, select(j, j - 4u, j >= 4u));
    let low = vec2<u32>(b_j & 63u, b_j4 & 63u);
    let high = vec2<u32>((b_j4 & 0xfu) | ((b_jm4 >> 6u) << 4u), (b_j4 >> 4u) | ((b_j >> 6u) << 4u));
    return vec2<f32>(select(high, low, j < 4u));
}

fn dequant_chunk(block: u32, sub: u32) {
    let d = w_f16(block);
    let dmin = w_f16(block + 2u);
    let sm = k4_scale_min(block + 4u, sub);
    let dl = d * sm.x;
    let ml = dmin * sm.y;
    let qh = block + 16u;
    let qs = block + 48u + 32u * (sub / 2u);
    let shift = 4u * (sub % 2u);
    let q0 = w_load16(qs);
    let q1 = w_load16(qs + 16u);
    let h0 = w_load16(qh);
    let h1 = w_load16(qh + 16u);
    for (var l = 0u; l < 16u; l++) {
        let a = ((byte_of(q0, l) >> shift) & 0xfu) | (((byte_of(h0, l) >> sub) & 1u) << 4u);
        let b = ((byte_of(q1, l) >> shift) & 0xfu) | (((byte_of(h1, l) >> sub) & 1u) << 4u);
        wq[l] = dl * f32(a) - ml;
        wq[l + 16u] = dl * f32(b) - ml;
    }
}

// Register dequantizer for quant/rowdot_chunk.wgsl (same values as `dequant_chunk`).
// 4 values from a word of nibbles and the
// matching word of fifth bits.
fn q5x4(qw: u32, hw: u32, shift: u32, sub: u32, dl: f32, ml: f32) -> vec4<f32> {
    let low = (bytes4(qw) >> vec4<u32>(shift)) & vec4<u32>(0xfu);
    let high = ((bytes4(hw) >> vec4<u32>(sub)) & vec4<u32>(1u)) << vec4<u32>(4u);
    return dl * vec4<f32>(low | high) - vec4<f32>(ml);
}

fn dq_chunk(block: u32, sub: u32) -> Chunk {
    let d = w_f16(block);
    let dmin = w_f16(block + 2u);
    let sm = k4_scale_min(block + 4u, sub);
    let dl = d * sm.x;
    let ml = dmin * sm.y;
    let qs = block + 48u + 32u * (sub / 2u);
    let shift = 4u * (sub % 2u);
    let q0 = w_load16(qs);
    let q1 = w_load16(qs + 16u);
    let h0 = w_load16(block + 16u);
    let h1 = w_load16(block + 32u);
    return Chunk(q5x4(q0.x, h0.x, shift, sub, dl, ml), q5x4(q0.y, h0.y, shift, sub, dl, ml),
                 q5x4(q0.z, h0.z, shift, sub, dl, ml), q5x4(q0.w, h0.w, shift, sub, dl, ml),
                 q5x4(q1.x, h1.x, shift, sub, dl, ml), q5x4(q1.y, h1.y, shift, sub, dl, ml),
                 q5x4(q1.z, h1.z, shift, sub, dl, ml), q5x4(q1.w, h1.w, shift, sub, dl, ml));
}
