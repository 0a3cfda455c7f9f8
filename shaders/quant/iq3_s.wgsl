// block_iq3_s: f16 d; u8 qs[64]; u8 qh[8] (9th index bits); u8 signs[32]; u8 scales[4] (4-bit,
// odd scale 1+2s). Split layout (src/gpu/layout.rs): the 108-byte body (qs @0, qh @64, signs @72,
// scales @104) on 4-byte boundaries, d in the scale plane. One task per 32-value chunk `sub`
// (values 32sub .. 32sub+32): 8 grid entries of 4 values, index bits from qs and qh, one sign bit
// per value, one scale for the chunk.
const QK: u32 = 256u;
const BODY_BYTES: u32 = 108u;
const TASKS_PER_BLOCK: u32 = 8u;

// The 512-entry grid in workgroup memory (filled by the prologue).
var<workgroup> GRIDS: array<u32, 512>;

// Invocations 0..64 copy 8 entries each, every load issued before any store: one memory latency
// per workgroup, not one per entry.
fn prologue(lid: u32) {
    if (lid < 64u) {
        let e0 = GRID[lid];
        let e1 = GRID[lid + 64u];
        let e2 = GRID[lid + 128u];
        let e3 = GRID[lid + 192u];
        let e4 = GRID[lid + 256u];
        let e5 = GRID[lid + 320u];
        let e6 = GRID[lid + 384u];
        let e7 = GRID[lid + 448u];
        GRIDS[lid] = e0;
        GRIDS[lid + 64u] = e1;
        GRIDS[lid + 128u] = e2;
        GRIDS[lid + 192u] = e3;
        GRIDS[lid + 256u] = e4;
        GRIDS[lid + 320u] = e5;
        GRIDS[lid + 384u] = e6;
        GRIDS[lid + 448u] = e7;
    }
}

fn task_x(t: u32) -> vec2<u32> {
    return vec2<u32>(32u * t, 32u * t + 16u);
}

// Grid entry `entry` with sign bits 0..3 of `signs4` negating its values.
fn iq3s_codes(entry: u32, signs4: u32) -> vec4<f32> {
    return signed_codes(GRIDS[entry], signs4);
}

// What a task reads of its block: the grid indices' low bytes (ql: entries 0-3, qhb: 4-7), their
// 9th bits (qh), the sign bits, the odd scale 1 + 2s and the block's d.
struct Iq3sBits {
    ql: vec4<u32>,
    qhb: vec4<u32>,
    qh: u32,
    s: u32,
    scale: u32,
    d: f32,
}

fn iq3s_bits(body: u32, d_row: u32, t: u32) -> Iq3sBits {
    let sub = t % 8u;
    let blk = (body + (t / 8u) * BODY_BYTES) >> 2u;
    let scale_nibble = (W[blk + 26u] >> (8u * (sub / 2u) + 4u * (sub % 2u))) & 0xfu;
    return Iq3sBits(bytes4(W[blk + 2u * sub]), bytes4(W[blk + 2u * sub + 1u]),
                    (W[blk + 16u + sub / 4u] >> (8u * (sub % 4u))) & 0xffu, W[blk + 18u + sub],
                    1u + 2u * scale_nibble, d_f16(d_row + 2u * (t / 8u)));
}

fn task_w(body: u32, d_row: u32, t: u32) -> Task {
    let bits = iq3s_bits(body, d_row, t);
    let db = bits.d * f32(bits.scale);
    let ql = bits.ql;
    let qhb = bits.qhb;
    let qh = bits.qh;
    let s = bits.s;
    return Task(iq3s_codes(ql.x | ((qh << 8u) & 256u), s),
                iq3s_codes(ql.y | ((qh << 7u) & 256u), s >> 4u),
                iq3s_codes(ql.z | ((qh << 6u) & 256u), s >> 8u),
                iq3s_codes(ql.w | ((qh << 5u) & 256u), s >> 12u),
                iq3s_codes(qhb.x | ((qh << 4u) & 256u), s >> 16u),
                iq3s_codes(qhb.y | ((qh << 3u) & 256u), s >> 20u),
                iq3s_codes(qhb.z | ((qh << 2u) & 256u), s >> 24u),
                iq3s_codes(qhb.w | ((qh << 1u) & 256u), s >> 28u),
                db, db, 0.0, 0.0);
}

// The matvec_idot codes (quant/rows_idot.wgsl): grid bytes (odd, 1..15) negated bytewise where
// their sign bit is set, the odd scale 1 + 2s as both factors, d as the scale.
const IDOT_OFFSET: i32 = 0;

fn iq3s_word(entry: u32, signs4: u32) -> u32 {
    return signed_bytes(GRIDS[entry], signs4);
}

fn task_wi(body: u32, d_row: u32, t: u32) -> TaskI {
    let bits = iq3s_bits(body, d_row, t);
    let k = i32(bits.scale);
    let ql = bits.ql;
    let qhb = bits.qhb;
    let qh = bits.qh;
    let s = bits.s;
    return TaskI(vec4<u32>(iq3s_word(ql.x | ((qh << 8u) & 256u), s),
                           iq3s_word(ql.y | ((qh << 7u) & 256u), s >> 4u),
                           iq3s_word(ql.z | ((qh << 6u) & 256u), s >> 8u),
                           iq3s_word(ql.w | ((qh << 5u) & 256u), s >> 12u)),
                 vec4<u32>(iq3s_word(qhb.x | ((qh << 4u) & 256u), s >> 16u),
                           iq3s_word(qhb.y | ((qh << 3u) & 256u), s >> 20u),
                           iq3s_word(qhb.z | ((qh << 2u) & 256u), s >> 24u),
                           iq3s_word(qhb.w | ((qh << 1u) & 256u), s >> 28u)),
                 k, k, bits.d);
}
