// block_iq3_s: f16 d; u8 qs[64]; u8 qh[8] (9th index bits); u8 signs[32]; u8 scales[4] (4-bit, odd scale 1+2s)
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 110u;

fn dequant_chunk(block: u32, sub: u32) {
    let d = w_f16(block);
    let db = d * f32(1u + 2u * ((w_u8(block + 106u + sub / 2u) >> (4u * (sub % 2u))) & 0xfu));
    let qh = w_u8(block + 66u + sub);
    let qs = w_load16(block + 2u + 8u * sub); // bytes 0..7 are this chunk's indices
    let sign_word = w_u32(block + 74u + 4u * sub);
    for (var l = 0u; l < 4u; l++) {
        let e1 = byte_of(qs, 2u * l) | ((qh << (8u - 2u * l)) & 256u);
        let e2 = byte_of(qs, 2u * l + 1u) | ((qh << (7u - 2u * l)) & 256u);
        let signs = (sign_word >> (8u * l)) & 0xffu;
        for (var j = 0u; j < 4u; j++) {
            wq[8u * l + j] = signed(db * f32(grid4(e1, j)), signs, j);
            wq[8u * l + j + 4u] = signed(db * f32(grid4(e2, j)), signs, j + 4u);
        }
    }
}

// Register dequantizer for quant/rowdot_chunk.wgsl (same values as `dequant_chunk`).
// Grid entry `entry` scaled by `db`, with
// sign bits 0..3 of `signs4` negating values 0..3.
fn iq3s_x4(entry: u32, signs4: u32, db: f32) -> vec4<f32> {
    let values = db * vec4<f32>(bytes4(GRID[entry]));
    let negate = ((vec4<u32>(signs4) >> vec4<u32>(0u, 1u, 2u, 3u)) & vec4<u32>(1u)) != vec4<u32>(0u);
    return select(values, -values, negate);
}

fn dq_chunk(block: u32, sub: u32) -> Chunk {
    let d = w_f16(block);
    let db = d * f32(1u + 2u * ((w_u8(block + 106u + sub / 2u) >> (4u * (sub % 2u))) & 0xfu));
    let qh = w_u8(block + 66u + sub);
    let q_lo = w_u32(block + 2u + 8u * sub); // indices of value groups 0..3
    let q_hi = w_u32(block + 6u + 8u * sub); // indices of value groups 4..7
    let s = w_u32(block + 74u + 4u * sub); // 8 sign bits per 8 values
    let ql = bytes4(q_lo);
    let qhb = bytes4(q_hi);
    return Chunk(iq3s_x4(ql.x | ((qh << 8u) & 256u), s, db),
                 iq3s_x4(ql.y | ((qh << 7u) & 256u), s >> 4u, db),
                 iq3s_x4(ql.z | ((qh << 6u) & 256u), s >> 8u, db),
                 iq3s_x4(ql.w | ((qh << 5u) & 256u), s >> 12u, db),
                 iq3s_x4(qhb.x | ((qh << 4u) & 256u), s >> 16u, db),
                 iq3s_x4(qhb.y | ((qh << 3u) & 256u), s >> 20u, db),
                 iq3s_x4(qhb.z | ((qh << 2u) & 256u), s >> 24u, db),
                 iq3s_x4(qhb.w | ((qh << 1u) & 256u), s >> 28u, db));
}
