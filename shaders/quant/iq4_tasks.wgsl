
// The IQ4 types' shared task builders (appended to iq4_nl.wgsl and iq4_xs.wgsl, which supply
// `iq4_scale`). A task is 32 values whose codes are the 16 bytes at body + 16t: values 0..15 the
// low nibbles of bytes 0..15, values 16..31 the high nibbles, indexing a fixed non-linear codebook.

// A task's scale (the type's iq4_scale): as f32 (`f`), and as an integer factor `k` times a
// scale `s` (task_wi).
struct Iq4Scale {
    f: f32,
    k: i32,
    s: f32,
}

// The codebook as packed signed bytes: a vector lookup instead of a const-array index, which
// some drivers turn into a per-invocation copy of the whole array.
const IQ4_PACKED = vec4<u32>(0xbfad9881u, 0xf6eaddcfu, 0x26190d01u, 0x71594535u);

fn iq4_value(q: u32) -> f32 {
    let byte = (IQ4_PACKED[q >> 2u] >> ((q & 3u) << 3u)) & 0xffu;
    return f32(bitcast<i32>(byte << 24u) >> 24u);
}

// The codebook values of both nibbles of every byte, as f32 in workgroup memory (filled by the
// prologue): one table read gives two values, low nibble first, so a value costs a fraction of a
// byte unpack (integer work bounds this mat-vec on large GPUs).
var<workgroup> IQ4P: array<vec2<f32>, 256>;

fn prologue(lid: u32) {
    if (lid < 64u) {
        for (var b = lid; b < 256u; b += 64u) {
            if (IDOT) {
                IQ4I[b] = iq4_byte(b & 15u) | (iq4_byte(b >> 4u) << 16u);
            } else {
                IQ4P[b] = vec2<f32>(iq4_value(b & 15u), iq4_value(b >> 4u));
            }
        }
    }
}

fn task_x(t: u32) -> vec2<u32> {
    return vec2<u32>(32u * t, 32u * t + 16u);
}

// The 4 bytes of `w`: their low-nibble values (values 4j.. of the task) and high-nibble values.
struct Pair4 {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

fn iq4_pairs(w: u32) -> Pair4 {
    let a = IQ4P[w & 0xffu];
    let b = IQ4P[(w >> 8u) & 0xffu];
    let c = IQ4P[(w >> 16u) & 0xffu];
    let d = IQ4P[w >> 24u];
    return Pair4(vec4<f32>(a.x, b.x, c.x, d.x), vec4<f32>(a.y, b.y, c.y, d.y));
}

fn task_w(body: u32, d_row: u32, t: u32) -> Task {
    let q = W4[(body + 16u * t) >> 4u];
    let s = iq4_scale(d_row, t);
    let x = iq4_pairs(q.x);
    let y = iq4_pairs(q.y);
    let z = iq4_pairs(q.z);
    let w = iq4_pairs(q.w);
    return Task(x.lo, y.lo, z.lo, w.lo, x.hi, y.hi, z.hi, w.hi, s.f, s.f, 0.0, 0.0);
}

// The matvec_idot codes (quant/rows_idot.wgsl): the codebook's signed bytes, the task's integer
// factor and scale. IQ4I holds, for each byte, its low nibble's value in byte 0 and its high
// nibble's in byte 2.
const IDOT_OFFSET: i32 = 0;
var<workgroup> IQ4I: array<u32, 256>;

fn iq4_byte(q: u32) -> u32 {
    return (IQ4_PACKED[q >> 2u] >> ((q & 3u) << 3u)) & 0xffu;
}

// The values of the low nibbles of w's 4 bytes (x) and of their high nibbles (y), packed.
fn iq4_words(w: u32) -> vec2<u32> {
    let u = IQ4I[w & 0xffu] | (IQ4I[(w >> 8u) & 0xffu] << 8u);
    let v = IQ4I[(w >> 16u) & 0xffu] | (IQ4I[w >> 24u] << 8u);
    return vec2<u32>((u & 0xffffu) | (v << 16u), (u >> 16u) | (v & 0xffff0000u));
}

fn task_wi(body: u32, d_row: u32, t: u32) -> TaskI {
    let q = W4[(body + 16u * t) >> 4u];
    let s = iq4_scale(d_row, t);
    let x = iq4_words(q.x);
    let y = iq4_words(q.y);
    let z = iq4_words(q.z);
    let w = iq4_words(q.w);
    return TaskI(vec4<u32>(x.x, y.x, z.x, w.x), vec4<u32>(x.y, y.y, z.y, w.y), s.k, s.k, s.s);
}
