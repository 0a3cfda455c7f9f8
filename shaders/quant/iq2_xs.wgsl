// block_iq2_xs: f16 d; u16 qs[32] (9-bit grid index + 7 sign bits, ksign adding the 8th);
// u8 scales[8] (two 4-bit scales per 32 values, d (0.5 + s) / 4 each). Split layout
// (src/gpu/layout.rs): the 72-byte body (qs @0, scales @64) on 4-byte boundaries, d in the scale
// plane. One task per 32-value chunk `sub`: 4 grid entries of 8 values; segment a (entries 0, 1)
// takes the low scale nibble, segment b (entries 2, 3) the high one. The 512-entry codebook
// (4 KB) is read through the cache (GRID).
const QK: u32 = 256u;
const BODY_BYTES: u32 = 72u;
const TASKS_PER_BLOCK: u32 = 8u;

// This block's task fields (quant/iq2_tasks.wgsl builds its tasks from them).
fn iq2_bits(body: u32, d_row: u32, t: u32) -> Iq2Bits {
    let sub = t % 8u;
    let blk = (body + (t / 8u) * BODY_BYTES) >> 2u;
    let q01 = W[blk + 2u * sub];
    let q23 = W[blk + 2u * sub + 1u];
    let q = vec4<u32>(q01 & 0xffffu, q01 >> 16u, q23 & 0xffffu, q23 >> 16u);
    let signs = ksign(q.x >> 9u) | (ksign(q.y >> 9u) << 8u) | (ksign(q.z >> 9u) << 16u)
        | (ksign(q.w >> 9u) << 24u);
    let scales = (W[blk + 16u + sub / 4u] >> (8u * (sub & 3u))) & 0xffu;
    return Iq2Bits(q & vec4<u32>(511u), signs, scales, d_f16(d_row + 2u * (t / 8u)));
}
