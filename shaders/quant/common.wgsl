// Byte access into a weight tensor bound as `W: array<u32>` (raw GGUF blocks, little-endian).
// GGUF blocks have odd sizes (18, 34, 110, 210 bytes ...), so fields are read by byte address.
// `wq` receives the 32 dequantized values of one chunk; every quant file defines
// `QK` (values per block), `BLOCK_BYTES` and `dequant_chunk(block_byte, sub)` that fills `wq` with
// values [32*sub, 32*sub+32) of the block starting at byte `block_byte`.

var<private> wq: array<f32, 32>;

fn w_u8(b: u32) -> u32 {
    return (W[b >> 2u] >> ((b & 3u) << 3u)) & 0xffu;
}

fn w_i8(b: u32) -> i32 {
    return bitcast<i32>(w_u8(b) << 24u) >> 24u;
}

fn w_u16(b: u32) -> u32 {
    if ((b & 3u) != 3u) {
        return (W[b >> 2u] >> ((b & 3u) << 3u)) & 0xffffu;
    }
    return w_u8(b) | (w_u8(b + 1u) << 8u);
}

// The 32 bits starting `s` bits into `lo` (continuing into `hi`). Branch-free: lanes of a subgroup
// reading blocks of odd sizes see both alignments, and a branch would run both paths.
fn funnel(lo: u32, hi: u32, s: u32) -> u32 {
    // `hi << 32u` would be `hi << 0u` (WGSL masks shift amounts), so s == 0 is selected apart.
    return select((lo >> s) | (hi << (32u - s)), lo, s == 0u);
}

fn w_u32(b: u32) -> u32 {
    let i = b >> 2u;
    return funnel(W[i], W[i + 1u], (b & 3u) << 3u);
}

fn w_f16(b: u32) -> f32 {
    return unpack2x16float(w_u16(b)).x;
}

fn f16_bits(h: u32) -> f32 {
    return unpack2x16float(h & 0xffffu).x;
}

// 16 bytes from byte address `b` (any alignment) as 4 little-endian words: 5 word loads and no
// branch. When `b` is aligned the 5th word is not used; it may then lie past the tensor's end,
// where WGSL's bounds handling makes the load harmless.
fn w_load16(b: u32) -> vec4<u32> {
    let i = b >> 2u;
    let s = (b & 3u) << 3u;
    let a0 = W[i];
    let a1 = W[i + 1u];
    let a2 = W[i + 2u];
    let a3 = W[i + 3u];
    let a4 = W[i + 4u];
    return vec4<u32>(funnel(a0, a1, s), funnel(a1, a2, s), funnel(a2, a3, s), funnel(a3, a4, s));
}

// Byte j (0..15) of a `w_load16` result.
fn byte_of(v: vec4<u32>, j: u32) -> u32 {
    return (v[j >> 2u] >> ((j & 3u) << 3u)) & 0xffu;
}

fn sbyte_of(v: vec4<u32>, j: u32) -> i32 {
    return bitcast<i32>(byte_of(v, j) << 24u) >> 24u;
}

// One chunk's 32 dequantized values held in registers: v0 = values 0..3, v1 = 4..7, ... A struct
// of vectors read with constant field names stays in registers, unlike a private array indexed in
// a loop. quant/rowdot_chunk.wgsl reads chunks through `dq_chunk`: a register
// one in the type's file (IQ3_S, Q5_K) or quant/chunk_regs.wgsl's copy of `wq` into a `Chunk`.
struct Chunk {
    v0: vec4<f32>,
    v1: vec4<f32>,
    v2: vec4<f32>,
    v3: vec4<f32>,
    v4: vec4<f32>,
    v5: vec4<f32>,
    v6: vec4<f32>,
    v7: vec4<f32>,
}

// The 4 bytes of `w` (low first) as unsigned vector lanes.
fn bytes4(w: u32) -> vec4<u32> {
    return (vec4<u32>(w, w >> 8u, w >> 16u, w >> 24u)) & vec4<u32>(0xffu);
}

// The 4 bytes of `w` (low first) as signed values.
fn i8x4(w: u32) -> vec4<f32> {
    return vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(w << 24u, w << 16u, w << 8u, w)) >> vec4<u32>(24u));
}

// 8 consecutive dequantized values in registers (the unit of the lane-along-row mat-vec path).
struct Group8 {
    lo: vec4<f32>,
    hi: vec4<f32>,
}
