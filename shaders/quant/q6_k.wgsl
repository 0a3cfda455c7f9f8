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
fn q6_codes(lw: u32, hw: u32, nibble_shift: u32, pair_shift: u32) -> vec4<f32> {
    let q = ((lw >> nibble_shift) & 0x0f0f0f0fu) | (((hw >> pair_shift) & 0x03030303u) << 4u);
    return bytes_f32(q, 32.0);
}

fn task_w(body: u32, d_row: u32, t: u32) -> Task {
    let j = t % 8u;
    let h = j / 4u;
    let l0 = 16u * ((j / 2u) % 2u);
    let kp = j % 2u;
    let blk = body + (t / 8u) * BODY_BYTES;
    let ql = W4[(blk + 64u * h + 32u * kp + l0) >> 4u];
    let qh = W4[(blk + 128u + 32u * h + l0) >> 4u];
    let d = d_f16(d_row + 2u * (t / 8u));
    // The two segments' scales, each read as a byte of its word (no dynamically indexed vector).
    let ia = 8u * h + 2u * kp + l0 / 16u;
    let sa = d * f32(w_i8(blk + 192u + ia));
    let sb = d * f32(w_i8(blk + 196u + ia));
    let pa = 2u * kp;
    let pb = 2u * kp + 4u;
    return Task(q6_codes(ql.x, qh.x, 0u, pa), q6_codes(ql.y, qh.y, 0u, pa),
                q6_codes(ql.z, qh.z, 0u, pa), q6_codes(ql.w, qh.w, 0u, pa),
                q6_codes(ql.x, qh.x, 4u, pb), q6_codes(ql.y, qh.y, 4u, pb),
                q6_codes(ql.z, qh.z, 4u, pb), q6_codes(ql.w, qh.w, 4u, pb),
                sa, sb);
}

// The matvec_idot codes (quant/rows_idot.wgsl): the unsigned 6-bit codes (offset 32), each
// segment's signed scale as its factor, d as the scale.
const IDOT_OFFSET: i32 = 32;

fn q6_word(lw: u32, hw: u32, nibble_shift: u32, pair_shift: u32) -> u32 {
    return ((lw >> nibble_shift) & 0x0f0f0f0fu) | (((hw >> pair_shift) & 0x03030303u) << 4u);
}

fn task_wi(body: u32, d_row: u32, t: u32) -> TaskI {
    let j = t % 8u;
    let h = j / 4u;
    let l0 = 16u * ((j / 2u) % 2u);
    let kp = j % 2u;
    let blk = body + (t / 8u) * BODY_BYTES;
    let ql = W4[(blk + 64u * h + 32u * kp + l0) >> 4u];
    let qh = W4[(blk + 128u + 32u * h + l0) >> 4u];
    let ia = 8u * h + 2u * kp + l0 / 16u;
    let pa = 2u * kp;
    let pb = 2u * kp + 4u;
    return TaskI(vec4<u32>(q6_word(ql.x, qh.x, 0u, pa), q6_word(ql.y, qh.y, 0u, pa),
                           q6_word(ql.z, qh.z, 0u, pa), q6_word(ql.w, qh.w, 0u, pa)),
                 vec4<u32>(q6_word(ql.x, qh.x, 4u, pb), q6_word(ql.y, qh.y, 4u, pb),
                           q6_word(ql.z, qh.z, 4u, pb), q6_word(ql.w, qh.w, 4u, pb)),
                 w_i8(blk + 192u + ia), w_i8(blk + 196u + ia), d_f16(d_row + 2u * (t / 8u)));
}
