// block_iq2_xs: f16 d; u16 qs[32] (9-bit grid index + 7 sign bits, ksign adding the 8th);
// u8 scales[8] (two 4-bit scales per 32 values, d (0.5 + s) / 4 each). Split layout
// (src/gpu/layout.rs): the 72-byte body (qs @0, scales @64) on 4-byte boundaries, d in the scale
// plane. One task per 32-value chunk `sub`: 4 grid entries of 8 values; segment a (entries 0, 1)
// takes the low scale nibble, segment b (entries 2, 3) the high one. The 512-entry codebook
// (4 KB) is read through the cache (GRID).
const QK: u32 = 256u;
const BODY_BYTES: u32 = 72u;
const TASKS_PER_BLOCK: u32 = 8u;

fn task_x(t: u32) -> vec2<u32> {
    return vec2<u32>(32u * t, 32u * t + 16u);
}

// What a task reads of its block: its 4 grid indices, their 8 sign bits each (entry l in byte l),
// the two scale nibbles and the block's d.
struct Iq2xsBits {
    entries: vec4<u32>,
    signs: u32,
    scales: u32,
    d: f32,
}

fn iq2xs_bits(body: u32, d_row: u32, t: u32) -> Iq2xsBits {
    let sub = t % 8u;
    let blk = (body + (t / 8u) * BODY_BYTES) >> 2u;
    let q01 = W[blk + 2u * sub];
    let q23 = W[blk + 2u * sub + 1u];
    let q = vec4<u32>(q01 & 0xffffu, q01 >> 16u, q23 & 0xffffu, q23 >> 16u);
    let signs = ksign(q.x >> 9u) | (ksign(q.y >> 9u) << 8u) | (ksign(q.z >> 9u) << 16u)
        | (ksign(q.w >> 9u) << 24u);
    let scales = (W[blk + 16u + sub / 4u] >> (8u * (sub & 3u))) & 0xffu;
    return Iq2xsBits(q & vec4<u32>(511u), signs, scales, d_f16(d_row + 2u * (t / 8u)));
}

// The 4 values of grid word `w` (unsigned bytes) with sign bits 0..3 of `signs4` negating them.
fn iq2xs_codes(w: u32, signs4: u32) -> vec4<f32> {
    let v = bytes_f32(w, 0.0);
    let neg = ((vec4<u32>(signs4) >> vec4<u32>(0u, 1u, 2u, 3u)) & vec4<u32>(1u)) << vec4<u32>(31u);
    return bitcast<vec4<f32>>(bitcast<vec4<u32>>(v) ^ neg);
}

fn task_w(body: u32, d_row: u32, t: u32) -> Task {
    let bits = iq2xs_bits(body, d_row, t);
    let e = bits.entries;
    let s = bits.signs;
    let sa = bits.d * (0.5 + f32(bits.scales & 0xfu)) * 0.25;
    let sb = bits.d * (0.5 + f32(bits.scales >> 4u)) * 0.25;
    return Task(iq2xs_codes(GRID[2u * e.x], s), iq2xs_codes(GRID[2u * e.x + 1u], s >> 4u),
                iq2xs_codes(GRID[2u * e.y], s >> 8u), iq2xs_codes(GRID[2u * e.y + 1u], s >> 12u),
                iq2xs_codes(GRID[2u * e.z], s >> 16u), iq2xs_codes(GRID[2u * e.z + 1u], s >> 20u),
                iq2xs_codes(GRID[2u * e.w], s >> 24u), iq2xs_codes(GRID[2u * e.w + 1u], s >> 28u),
                sa, sb);
}

// The matvec_idot codes (quant/rows_idot.wgsl): grid bytes (8, 25, 43) negated bytewise where
// their sign bit is set, the odd factors 2s + 1 of each segment, d / 8 as the scale.
const IDOT_OFFSET: i32 = 0;

fn iq2xs_word(w: u32, signs4: u32) -> u32 {
    let one = ((signs4 & 0xfu) * 0x00204081u) & 0x01010101u;
    return (w ^ (one * 0xffu)) + one;
}

fn task_wi(body: u32, d_row: u32, t: u32) -> TaskI {
    let bits = iq2xs_bits(body, d_row, t);
    let e = bits.entries;
    let s = bits.signs;
    return TaskI(vec4<u32>(iq2xs_word(GRID[2u * e.x], s),
                           iq2xs_word(GRID[2u * e.x + 1u], s >> 4u),
                           iq2xs_word(GRID[2u * e.y], s >> 8u),
                           iq2xs_word(GRID[2u * e.y + 1u], s >> 12u)),
                 vec4<u32>(iq2xs_word(GRID[2u * e.z], s >> 16u),
                           iq2xs_word(GRID[2u * e.z + 1u], s >> 20u),
                           iq2xs_word(GRID[2u * e.w], s >> 24u),
                           iq2xs_word(GRID[2u * e.w + 1u], s >> 28u)),
                 i32(2u * (bits.scales & 0xfu) + 1u), i32(2u * (bits.scales >> 4u) + 1u),
                 bits.d * 0.125);
}
