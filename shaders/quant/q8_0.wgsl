// block_q8_0: f16 d; i8 qs[32]. Split layout (src/gpu/layout.rs): the 32 code bytes on 16-byte
// boundaries, d in the scale plane. One task per block: values 0..15 and 16..31.
const QK: u32 = 32u;
const BODY_BYTES: u32 = 32u;
const TASKS_PER_BLOCK: u32 = 1u;

fn task_x(t: u32) -> vec2<u32> {
    return vec2<u32>(32u * t, 32u * t + 16u);
}

// 4 signed bytes as f32: flip the sign bit to get byte + 128, then the exponent trick.
fn i8_codes(w: u32) -> vec4<f32> {
    return bytes_f32(w ^ 0x80808080u, 128.0);
}

fn task_w(body: u32, d_row: u32, t: u32) -> Task {
    let i = (body + t * BODY_BYTES) >> 4u;
    let lo = W4[i];
    let hi = W4[i + 1u];
    let d = d_f16(d_row + 2u * t);
    return Task(i8_codes(lo.x), i8_codes(lo.y), i8_codes(lo.z), i8_codes(lo.w),
                i8_codes(hi.x), i8_codes(hi.y), i8_codes(hi.z), i8_codes(hi.w), d, d, 0.0, 0.0);
}

// The matvec_idot codes (quant/rows_idot.wgsl): the stored bytes themselves.
const IDOT_OFFSET: i32 = 0;

fn task_wi(body: u32, d_row: u32, t: u32) -> TaskI {
    let i = (body + t * BODY_BYTES) >> 4u;
    return TaskI(W4[i], W4[i + 1u], 1, 1, d_f16(d_row + 2u * t));
}
