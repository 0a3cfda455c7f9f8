// block_iq3_xxs: f16 d; u8 qs[64] (grid indices); u32 scales_and_signs[8] (per 32 values: four
// 7-bit sign indices, then a 4-bit scale s, the chunk's scale d (0.5 + s) / 2). Split layout
// (src/gpu/layout.rs): the 96-byte body (qs @0, scales_and_signs @64) on 16-byte boundaries, d in
// the scale plane. One task per 32-value chunk `sub`: 8 grid entries of 4 values (qs[8 sub ..]),
// entries 2l and 2l+1 signed by the 8 sign bits of 7-bit index l (ksign: the 8th bit makes the
// minus signs even).
const QK: u32 = 256u;
const BODY_BYTES: u32 = 96u;
const TASKS_PER_BLOCK: u32 = 8u;

// The 256-entry grid in workgroup memory (filled by the prologue).
var<workgroup> GRIDS: array<u32, 256>;

// Invocations 0..64 copy 4 entries each, every load issued before any store.
fn prologue(lid: u32) {
    if (lid < 64u) {
        let e0 = GRID[lid];
        let e1 = GRID[lid + 64u];
        let e2 = GRID[lid + 128u];
        let e3 = GRID[lid + 192u];
        GRIDS[lid] = e0;
        GRIDS[lid + 64u] = e1;
        GRIDS[lid + 128u] = e2;
        GRIDS[lid + 192u] = e3;
    }
}

fn task_x(t: u32) -> vec2<u32> {
    return vec2<u32>(32u * t, 32u * t + 16u);
}

// What a task reads of its block: its 8 grid indices (segment a: entries 0-3, b: 4-7), the 8 sign
// bits of each pair of entries (byte l of `signs`), the chunk's 4-bit scale and the block's d.
struct Iq3xxsBits {
    qa: vec4<u32>,
    qb: vec4<u32>,
    signs: u32,
    scale: u32,
    d: f32,
}

fn iq3xxs_bits(body: u32, d_row: u32, t: u32) -> Iq3xxsBits {
    let sub = t % 8u;
    let blk = (body + (t / 8u) * BODY_BYTES) >> 4u;
    // Aligned 16-byte loads: the chunk's 8 index bytes are half of vector sub / 2, its word of
    // scales and signs one of vector 4 + sub / 4 (selected, not dynamically indexed).
    let q = W4[blk + sub / 2u];
    let odd = (sub & 1u) == 1u;
    let idx = select(q.xy, q.zw, odd);
    let a = W4[blk + 4u + sub / 4u];
    let lane = sub & 3u;
    let aux = select(select(a.x, a.y, lane == 1u), select(a.z, a.w, lane == 3u), lane >= 2u);
    let signs = ksign(aux & 127u) | (ksign((aux >> 7u) & 127u) << 8u)
        | (ksign((aux >> 14u) & 127u) << 16u) | (ksign((aux >> 21u) & 127u) << 24u);
    return Iq3xxsBits(bytes4(idx.x), bytes4(idx.y), signs, aux >> 28u,
                      d_f16(d_row + 2u * (t / 8u)));
}

// Grid entry `entry` with sign bits 0..3 of `signs4` negating its values.
fn iq3xxs_codes(entry: u32, signs4: u32) -> vec4<f32> {
    return signed_codes(GRIDS[entry], signs4);
}

fn task_w(body: u32, d_row: u32, t: u32) -> Task {
    let bits = iq3xxs_bits(body, d_row, t);
    let db = bits.d * (0.5 + f32(bits.scale)) * 0.5;
    let qa = bits.qa;
    let qb = bits.qb;
    let s = bits.signs;
    return Task(iq3xxs_codes(qa.x, s), iq3xxs_codes(qa.y, s >> 4u),
                iq3xxs_codes(qa.z, s >> 8u), iq3xxs_codes(qa.w, s >> 12u),
                iq3xxs_codes(qb.x, s >> 16u), iq3xxs_codes(qb.y, s >> 20u),
                iq3xxs_codes(qb.z, s >> 24u), iq3xxs_codes(qb.w, s >> 28u),
                db, db, 0.0, 0.0);
}

// The matvec_idot codes (quant/rows_idot.wgsl): grid bytes (4..62) negated bytewise where their
// sign bit is set, the odd factor 2s + 1 for both segments, d / 4 as the scale.
const IDOT_OFFSET: i32 = 0;

fn iq3xxs_word(entry: u32, signs4: u32) -> u32 {
    return signed_bytes(GRIDS[entry], signs4);
}

fn task_wi(body: u32, d_row: u32, t: u32) -> TaskI {
    let bits = iq3xxs_bits(body, d_row, t);
    let k = i32(2u * bits.scale + 1u);
    let qa = bits.qa;
    let qb = bits.qb;
    let s = bits.signs;
    return TaskI(vec4<u32>(iq3xxs_word(qa.x, s), iq3xxs_word(qa.y, s >> 4u),
                           iq3xxs_word(qa.z, s >> 8u), iq3xxs_word(qa.w, s >> 12u)),
                 vec4<u32>(iq3xxs_word(qb.x, s >> 16u), iq3xxs_word(qb.y, s >> 20u),
                           iq3xxs_word(qb.z, s >> 24u), iq3xxs_word(qb.w, s >> 28u)),
                 k, k, bits.d * 0.25);
}
