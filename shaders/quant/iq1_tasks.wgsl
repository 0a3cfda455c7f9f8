
// The tasks of IQ1_S and IQ1_M (appended to their files, which define iq1_bits): 4 grid entries
// of 8 values in {-1, 0, 1} (two codebook words each, read through the cache from GRID), each
// entry shifted by a delta of +-1/8; segment a (entries 0, 1) takes factor ka, segment b (entries
// 2, 3) factor kb, each weight d ka (g + delta). Codes are kept as the integers 8 (g + delta)
// (odd, -9..9) with the scale d k / 8: multiplying by 8 and 1/8 is exact, so these are the
// dequantized values' products, and the integer-digit arithmetic reads the same bytes.

// What a task reads of its block: its 4 grid indices, the delta's sign per entry (bit l set:
// entry l's delta is negative), the odd factors 2s + 1 of the two segments, the block's d / 8 and
// the segments' scales d k / 8 (`sa`, `sb`: the same value where the factors are one, as IQ1_S's
// are, so that every assembly computes a task's value alike).
struct Iq1Bits {
    entries: vec4<u32>,
    neg: u32,
    ka: u32,
    kb: u32,
    d8: f32,
    sa: f32,
    sb: f32,
}

// Both types' 48-byte bodies: task t's word of 4 grid index bytes (qs @0) and its 16 bits of qh
// (@32).
fn iq1_body(body: u32, t: u32) -> vec2<u32> {
    let sub = t % 8u;
    let blk = (body + (t / 8u) * BODY_BYTES) >> 4u;
    let qs = pick4(W4[blk + sub / 4u], sub & 3u);
    let qh = (pick4(W4[blk + 2u], sub / 2u) >> (16u * (sub & 1u))) & 0xffffu;
    return vec2<u32>(qs, qh);
}

fn task_x(t: u32) -> vec2<u32> {
    return vec2<u32>(32u * t, 32u * t + 16u);
}

// Grid word `g` (4 bytes, each 0xff, 0 or 1) as the signed bytes 8 g + 1, or 8 g - 1 when
// `neg`: 8 g bytewise (no carries), then a bytewise add of +-1 (carries kept inside each byte).
fn iq1_bytes(g: u32, neg: bool) -> u32 {
    let minus = (g >> 7u) & 0x01010101u;
    let plus = g & 0x01010101u & ~minus;
    let eight = (plus << 3u) | (minus * 0xf8u);
    let delta = select(0x01010101u, 0xffffffffu, neg);
    return ((eight & 0x7f7f7f7fu) + (delta & 0x7f7f7f7fu)) ^ ((eight ^ delta) & 0x80808080u);
}

// Entry `e`'s two words of signed bytes 8 (g + delta).
fn iq1_entry(e: u32, neg: bool) -> vec2<u32> {
    return vec2<u32>(iq1_bytes(GRID[2u * e], neg), iq1_bytes(GRID[2u * e + 1u], neg));
}

// Exact f32 of 4 signed bytes.
fn signed_f32(w: u32) -> vec4<f32> {
    return bytes_f32(w ^ 0x80808080u, 128.0);
}

struct Iq1Words {
    a: vec4<u32>,
    b: vec4<u32>,
}

fn iq1_words(bits: Iq1Bits) -> Iq1Words {
    let e0 = iq1_entry(bits.entries.x, (bits.neg & 1u) != 0u);
    let e1 = iq1_entry(bits.entries.y, (bits.neg & 2u) != 0u);
    let e2 = iq1_entry(bits.entries.z, (bits.neg & 4u) != 0u);
    let e3 = iq1_entry(bits.entries.w, (bits.neg & 8u) != 0u);
    return Iq1Words(vec4<u32>(e0, e1), vec4<u32>(e2, e3));
}

fn task_w(body: u32, d_row: u32, t: u32) -> Task {
    let bits = iq1_bits(body, d_row, t);
    let w = iq1_words(bits);
    return Task(signed_f32(w.a.x), signed_f32(w.a.y), signed_f32(w.a.z), signed_f32(w.a.w),
                signed_f32(w.b.x), signed_f32(w.b.y), signed_f32(w.b.z), signed_f32(w.b.w), bits.sa,
                bits.sb, 0.0, 0.0);
}

// The matvec_idot codes (quant/rows_idot.wgsl): the same signed bytes, the odd factors, d / 8.
const IDOT_OFFSET: i32 = 0;

fn task_wi(body: u32, d_row: u32, t: u32) -> TaskI {
    let bits = iq1_bits(body, d_row, t);
    let w = iq1_words(bits);
    return TaskI(w.a, w.b, i32(bits.ka), i32(bits.kb), bits.d8);
}
