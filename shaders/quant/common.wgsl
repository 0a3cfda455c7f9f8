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

fn w_u32(b: u32) -> u32 {
    let shift = (b & 3u) << 3u;
    let lo = W[b >> 2u];
    if (shift == 0u) {
        return lo;
    }
    return (lo >> shift) | (W[(b >> 2u) + 1u] << (32u - shift));
}

fn w_f16(b: u32) -> f32 {
    return unpack2x16float(w_u16(b)).x;
}

fn f16_bits(h: u32) -> f32 {
    return unpack2x16float(h & 0xffffu).x;
}

// 16 bytes from byte address `b` (any alignment) as 4 little-endian words: 4 or 5 word loads
// instead of 16 byte loads. The 5th word is only read when `b` is unaligned, and then it holds
// bytes of the 16 (so it is inside the tensor).
fn w_load16(b: u32) -> vec4<u32> {
    let i = b >> 2u;
    let s = (b & 3u) << 3u;
    let a0 = W[i];
    let a1 = W[i + 1u];
    let a2 = W[i + 2u];
    let a3 = W[i + 3u];
    if (s == 0u) {
        return vec4<u32>(a0, a1, a2, a3);
    }
    let a4 = W[i + 4u];
    let r = 32u - s;
    return vec4<u32>((a0 >> s) | (a1 << r), (a1 >> s) | (a2 << r), (a2 >> s) | (a3 << r), (a3 >> s) | (a4 << r));
}

// Byte j (0..15) of a `w_load16` result.
fn byte_of(v: vec4<u32>, j: u32) -> u32 {
    return (v[j >> 2u] >> ((j & 3u) << 3u)) & 0xffu;
}

fn sbyte_of(v: vec4<u32>, j: u32) -> i32 {
    return bitcast<i32>(byte_of(v, j) << 24u) >> 24u;
}
