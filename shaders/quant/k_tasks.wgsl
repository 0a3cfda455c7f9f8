
// The tasks of Q4_K and Q5_K (appended to their files, which define task_w from k_task and
// k_scales). Split layout (src/gpu/layout.rs): the 16-byte head (f16 d, f16 dmin, 12 bytes of
// packed 6-bit scales and mins) in the head plane, read as 4 words (W; bodies through W4). A block's 8 sub-blocks of 32
// values pair up (2p, 2p + 1) on the same code bytes, low and high nibbles; task j of a block takes
// half h = j % 2 of pair p = j / 2: segment a is values 16h.. of sub-block 2p, segment b the same
// values of sub-block 2p + 1. A weight is d sc code - dmin m (HAS_MIN).
const HAS_MIN: bool = true;
const TASKS_PER_BLOCK: u32 = 8u;

fn task_x(t: u32) -> vec2<u32> {
    let j = t % 8u;
    let first = (t / 8u) * 256u + 64u * (j / 2u) + 16u * (j % 2u);
    return vec2<u32>(first, first + 32u);
}

fn byte_at(w: u32, i: u32) -> u32 {
    return (w >> (8u * i)) & 0xffu;
}

// Scale and min of sub-block s from the head (scales in h.y, h.z, h.w), as ggml packs them.
fn k_scale_min(h: vec4<u32>, s: u32) -> vec2<u32> {
    let i = s & 3u;
    let a = byte_at(h.y, i);
    let b = byte_at(h.z, i);
    let c = byte_at(h.w, i);
    let low = vec2<u32>(a & 63u, b & 63u);
    let high = vec2<u32>((c & 0xfu) | ((a >> 6u) << 4u), (c >> 4u) | ((b >> 6u) << 4u));
    return select(low, high, s >= 4u);
}

// Task t's scales d sc and mins dmin m (the CPU's d1 and m1), segment a then b.
struct KScales {
    sa: f32,
    sb: f32,
    ma: f32,
    mb: f32,
}

fn k_scales(d_row: u32, t: u32) -> KScales {
    let at = (d_row >> 2u) + 4u * (t / 8u);
    let h = vec4<u32>(W[at], W[at + 1u], W[at + 2u], W[at + 3u]);
    let dm = unpack2x16float(h.x);
    let s = 2u * ((t % 8u) / 2u);
    let a = k_scale_min(h, s);
    let b = k_scale_min(h, s + 1u);
    return KScales(dm.x * f32(a.x), dm.x * f32(b.x), dm.y * f32(a.y), dm.y * f32(b.y));
}

// The task from its codes, one byte each (segment a's 16 in `a`, b's in `b`).
fn k_task(a: vec4<u32>, b: vec4<u32>, s: KScales) -> Task {
    return Task(bytes_f32(a.x, 0.0), bytes_f32(a.y, 0.0), bytes_f32(a.z, 0.0), bytes_f32(a.w, 0.0),
                bytes_f32(b.x, 0.0), bytes_f32(b.y, 0.0), bytes_f32(b.z, 0.0), bytes_f32(b.w, 0.0),
                s.sa, s.sb, s.ma, s.mb);
}
