// block_q6_K: u8 ql[128] (low 4 bits); u8 qh[64] (high 2 bits); i8 scales[16]; f16 d; offset -32
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 210u;

fn dequant_chunk(block: u32, sub: u32) {
    let d = w_f16(block + 208u);
    let half = sub / 4u;
    let k = sub % 4u;
    let ql = block + 64u * half + 32u * (k & 1u);
    let qh = block + 128u + 32u * half;
    let nibble_shift = 4u * (k / 2u);
    let l0 = w_load16(ql);
    let l1 = w_load16(ql + 16u);
    let h0 = w_load16(qh);
    let h1 = w_load16(qh + 16u);
    let sc0 = f32(w_i8(block + 192u + 8u * half + 2u * k));
    let sc1 = f32(w_i8(block + 193u + 8u * half + 2u * k));
    for (var l = 0u; l < 16u; l++) {
        let a = ((byte_of(l0, l) >> nibble_shift) & 0xfu) | (((byte_of(h0, l) >> (2u * k)) & 3u) << 4u);
        let b = ((byte_of(l1, l) >> nibble_shift) & 0xfu) | (((byte_of(h1, l) >> (2u * k)) & 3u) << 4u);
        wq[l] = d * sc0 * f32(i32(a) - 32);
        wq[l + 16u] = d * sc1 * f32(i32(b) - 32);
    }
}

// Register dequantizer for `dq8` (same values as `dequant_chunk`).
// 4 values from a word of low nibbles and
// the matching word of high bit pairs, offset -32, times the sub-block scale.
fn q6x4(lw: u32, hw: u32, nibble_shift: u32, pair_shift: u32, scale: f32) -> vec4<f32> {
    let low = (bytes4(lw) >> vec4<u32>(nibble_shift)) & vec4<u32>(0xfu);
    let high = ((bytes4(hw) >> vec4<u32>(pair_shift)) & vec4<u32>(3u)) << vec4<u32>(4u);
    return scale * vec4<f32>(vec4<i32>(low | high) - vec4<i32>(32));
}

// Value v of a chunk comes from byte v of its low-nibble run and byte v of its high-bit run.
fn dq8(block: u32, group: u32) -> Group8 {
    let sub = group / 4u;
    let part = group % 4u;
    let half = sub / 4u;
    let k = sub % 4u;
    let d = w_f16(block + 208u);
    let ql = block + 64u * half + 32u * (k & 1u) + 8u * part;
    let qh = block + 128u + 32u * half + 8u * part;
    let ns = 4u * (k / 2u);
    let ps = 2u * k;
    let scale = d * f32(w_i8(block + 192u + 8u * half + 2u * k + part / 2u));
    return Group8(q6x4(w_u32(ql), w_u32(qh), ns, ps, scale),
                  q6x4(w_u32(ql + 4u), w_u32(qh + 4u), ns, ps, scale));
}
