// block_iq4_xs: f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]: 8 sub-blocks of 32 values, each
// with a 6-bit scale (low 4 bits in scales_l, high 2 in scales_h; offset -32) and IQ4_NL's codes.
// Split layout (src/gpu/layout.rs): the 128 code bytes on 16-byte boundaries, the 8-byte head
// (d, scales_h, scales_l) in the head plane. A task is one sub-block (quant/iq4_tasks.wgsl).
const QK: u32 = 256u;
const BODY_BYTES: u32 = 128u;
const TASKS_PER_BLOCK: u32 = 8u;

// The task's scale: d times the sub-block's scale (the CPU's dl), or that scale as the factor.
fn iq4_scale(d_row: u32, t: u32) -> Iq4Scale {
    let head = d_row + HEAD_BYTES * (t / 8u);
    let j = t % 8u;
    let w0 = W[head >> 2u];
    let low = (W[(head >> 2u) + 1u] >> (4u * j)) & 0xfu;
    let high = (w0 >> (16u + 2u * j)) & 3u;
    let k = i32(low | (high << 4u)) - 32;
    let d = unpack2x16float(w0).x;
    return Iq4Scale(d * f32(k), k, d);
}
