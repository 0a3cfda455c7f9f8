// The tasks of IQ2_S and IQ2_XS (appended to their files, which define iq2_bits): 4 grid entries
// of 8 values (two codebook words each, read through the cache from GRID), one sign byte per entry;
// segment a (entries 0, 1) takes the low scale nibble, segment b (entries 2, 3) the high one, each
// d (0.5 + s) / 4.

// What a task reads of its block: its 4 grid indices, their sign bytes (entry l in byte l of
// `signs`), the two scale nibbles and the block's d.
struct Iq2Bits {
    entries: vec4<u32>,
    signs: u32,
    scales: u32,
    d: f32,
}

fn task_x(t: u32) -> vec2<u32> {
    return vec2<u32>(32u * t, 32u * t + 16u);
}

fn task_w(body: u32, d_row: u32, t: u32) -> Task {
    let bits = iq2_bits(body, d_row, t);
    let e = bits.entries;
    let s = bits.signs;
    let sa = bits.d * (0.5 + f32(bits.scales & 0xfu)) * 0.25;
    let sb = bits.d * (0.5 + f32(bits.scales >> 4u)) * 0.25;
    return Task(signed_codes(GRID[2u * e.x], s), signed_codes(GRID[2u * e.x + 1u], s >> 4u),
                signed_codes(GRID[2u * e.y], s >> 8u), signed_codes(GRID[2u * e.y + 1u], s >> 12u),
                signed_codes(GRID[2u * e.z], s >> 16u), signed_codes(GRID[2u * e.z + 1u], s >> 20u),
                signed_codes(GRID[2u * e.w], s >> 24u), signed_codes(GRID[2u * e.w + 1u], s >> 28u),
                sa, sb, 0.0, 0.0);
}

// The matvec_idot codes (quant/rows_idot.wgsl): grid bytes (8, 25, 43) negated bytewise where
// their sign bit is set, the odd factors 2s + 1 of each segment, d / 8 as the scale.
const IDOT_OFFSET: i32 = 0;

fn task_wi(body: u32, d_row: u32, t: u32) -> TaskI {
    let bits = iq2_bits(body, d_row, t);
    let e = bits.entries;
    let s = bits.signs;
    return TaskI(vec4<u32>(signed_bytes(GRID[2u * e.x], s), signed_bytes(GRID[2u * e.x + 1u], s >> 4u),
                           signed_bytes(GRID[2u * e.y], s >> 8u),
                           signed_bytes(GRID[2u * e.y + 1u], s >> 12u)),
                 vec4<u32>(signed_bytes(GRID[2u * e.z], s >> 16u),
                           signed_bytes(GRID[2u * e.z + 1u], s >> 20u),
                           signed_bytes(GRID[2u * e.w], s >> 24u),
                           signed_bytes(GRID[2u * e.w + 1u], s >> 28u)),
                 i32(2u * (bits.scales & 0xfu) + 1u), i32(2u * (bits.scales >> 4u) + 1u),
                 bits.d * 0.125);
}
