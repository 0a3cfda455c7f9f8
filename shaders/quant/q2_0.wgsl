// block_q2_0: f16 d; u8 qs[16]: 2-bit codes, 4 per byte, low bits first; weight = (code - 1) * d.
// Split layout (src/gpu/layout.rs): the 16 code bytes on 16-byte boundaries, d in the scale
// plane. Two tasks per block: task h takes values 32h .. 32h + 32, words 2h (segment a) and
// 2h + 1 (segment b) of the body.
const QK: u32 = 64u;
const BODY_BYTES: u32 = 16u;
const TASKS_PER_BLOCK: u32 = 2u;

fn task_x(t: u32) -> vec2<u32> {
    return vec2<u32>(32u * t, 32u * t + 16u);
}

// Codes 4k .. 4k + 3 of word `w` (byte k), as code - 1 in exact f32.
fn q2_codes(w: u32, k: u32) -> vec4<f32> {
    let c = (vec4<u32>(w) >> (vec4<u32>(0u, 2u, 4u, 6u) + vec4<u32>(8u * k))) & vec4<u32>(3u);
    return vec4<f32>(vec4<i32>(c) - vec4<i32>(1));
}

fn q2_words(body: u32, t: u32) -> vec2<u32> {
    let q = W4[(body >> 4u) + t / 2u];
    return select(q.xy, q.zw, (t & 1u) == 1u);
}

fn task_w(body: u32, d_row: u32, t: u32) -> Task {
    let w = q2_words(body, t);
    let d = d_f16(d_row + 2u * (t / 2u));
    return Task(q2_codes(w.x, 0u), q2_codes(w.x, 1u), q2_codes(w.x, 2u), q2_codes(w.x, 3u),
                q2_codes(w.y, 0u), q2_codes(w.y, 1u), q2_codes(w.y, 2u), q2_codes(w.y, 3u), d, d,
                0.0, 0.0);
}

// The matvec_idot codes (quant/rows_idot.wgsl): the unsigned 2-bit codes, one a byte (offset 1).
const IDOT_OFFSET: i32 = 1;

// Byte k of `w` (4 codes) spread to one code a byte, in value order.
fn q2_spread(w: u32, k: u32) -> u32 {
    let x = (w >> (8u * k)) & 0xffu;
    return (x & 3u) | ((x << 6u) & 0x300u) | ((x << 12u) & 0x30000u) | ((x << 18u) & 0x3000000u);
}

fn task_wi(body: u32, d_row: u32, t: u32) -> TaskI {
    let w = q2_words(body, t);
    return TaskI(vec4<u32>(q2_spread(w.x, 0u), q2_spread(w.x, 1u), q2_spread(w.x, 2u),
                           q2_spread(w.x, 3u)),
                 vec4<u32>(q2_spread(w.y, 0u), q2_spread(w.y, 1u), q2_spread(w.y, 2u),
                           q2_spread(w.y, 3u)),
                 1, 1, d_f16(d_row + 2u * (t / 2u)));
}
