// block_q6_K: u8 ql[128] (low 4 bits); u8 qh[64] (high 2 bits); i8 scales[16]; f16 d; offset -32.
// Split layout (src/gpu/layout.rs): the 208-byte body (ql, qh, scales) on 16-byte boundaries, d in
// the scale plane. Value v of a block: half h = v / 128, quadrant k = (v % 128) / 32, l = v % 32;
// its low bits are nibble k / 2 of ql[64h + 32(k % 2) + l], its high bits are bits 2k of
// qh[32h + l], its scale scales[v / 16].
const QK: u32 = 256u;
const BODY_BYTES: u32 = 208u;
// Task t of a block: half h, 16 values from l0, quadrants kp and kp + 2 (which share ql bytes).
const TASKS_PER_BLOCK: u32 = 8u;

fn task_x(t: u32) -> vec2<u32> {
    let j = t % 8u;
    let first = (t / 8u) * 256u + 128u * (j / 4u) + 16u * ((j / 2u) % 2u) + 32u * (j % 2u);
    return vec2<u32>(first, first + 64u);
}

// 4 six-bit codes from a word of ql nibbles and a word of qh bit pairs, as f32 minus 32.
// 4 six-bit codes (unsigned) from a word of ql nibbles and a word of qh bit pairs.
fn q6_word(lw: u32, hw: u32, nibble_shift: u32, pair_shift: u32) -> u32 {
    return ((lw >> nibble_shift) & 0x0f0f0f0fu) | (((hw >> pair_shift) & 0x03030303u) << 4u);
}

fn q6_codes(lw: u32, hw: u32, nibble_shift: u32, pair_shift: u32) -> vec4<f32> {
    return bytes_f32(q6_word(lw, hw, nibble_shift, pair_shift), 32.0);
}

// What a task reads of its block: the ql and qh words, the qh bit-pair shifts of its two
// segments, their signed scales and the block's d.
struct Q6Bits {
    ql: vec4<u32>,
    qh: vec4<u32>,
    pa: u32,
    pb: u32,
    sa: i32,
    sb: i32,
    d: f32,
}

fn q6_bits(body: u32, d_row: u32, t: u32) -> Q6Bits {
    let j = t % 8u;
    let h = j / 4u;
    let l0 = 16u * ((j / 2u) % 2u);
    let kp = j % 2u;
    let blk = body + (t / 8u) * BODY_BYTES;
    // The two segments' scales, each read as a byte of its word (no dynamically indexed vector).
    let ia = 8u * h + 2u * kp + l0 / 16u;
    return Q6Bits(W4[(blk + 64u * h + 32u * kp + l0) >> 4u], W4[(blk + 128u + 32u * h + l0) >> 4u],
                  2u * kp, 2u * kp + 4u, w_i8(blk + 192u + ia), w_i8(blk + 196u + ia),
                  d_f16(d_row + 2u * (t / 8u)));
}

fn task_w(body: u32, d_row: u32, t: u32) -> Task {
    let bits = q6_bits(body, d_row, t);
    let ql = bits.ql;
    let qh = bits.qh;
    let pa = bits.pa;
    let pb = bits.pb;
    let sa = bits.d * f32(bits.sa);
    let sb = bits.d * f32(bits.sb);
    return Task(q6_codes(ql.x, qh.x, 0u, pa), q6_codes(ql.y, qh.y, 0u, pa),
                q6_codes(ql.z, qh.z, 0u, pa), q6_codes(ql.w, qh.w, 0u, pa),
                q6_codes(ql.x, qh.x, 4u, pb), q6_codes(ql.y, qh.y, 4u, pb),
                q6_codes(ql.z, qh.z, 4u, pb), q6_codes(ql.w, qh.w, 4u, pb),
                sa, sb, 0.0, 0.0);
}

// The matvec_idot codes (quant/rows_idot.wgsl): the unsigned 6-bit codes (offset 32), each
// segment's signed scale as its factor, d as the scale.
const IDOT_OFFSET: i32 = 32;

fn task_wi(body: u32, d_row: u32, t: u32) -> TaskI {
    let bits = q6_bits(body, d_row, t);
    let ql = bits.ql;
    let qh = bits.qh;
    let pa = bits.pa;
    let pb = bits.pb;
    return TaskI(vec4<u32>(q6_word(ql.x, qh.x, 0u, pa), q6_word(ql.y, qh.y, 0u, pa),
                           q6_word(ql.z, qh.z, 0u, pa), q6_word(ql.w, qh.w, 0u, pa)),
                 vec4<u32>(q6_word(ql.x, qh.x, 4u, pb), q6_word(ql.y, qh.y, 4u, pb),
                           q6_word(ql.z, qh.z, 4u, pb), q6_word(ql.w, qh.w, 4u, pb)),
                 bits.sa, bits.sb, bits.d);
}
