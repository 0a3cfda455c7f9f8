// block_iq2_s: f16 d; u8 qs[64] (32 grid index low bytes, then 32 sign bytes); u8 qh[8] (2 high
// index bits per entry); u8 scales[8] (two 4-bit scales per 32 values, d (0.5 + s) / 4 each).
// Split layout (src/gpu/layout.rs): the 80-byte body (index bytes @0, signs @32, qh @64, scales
// @72) on 16-byte boundaries, d in the scale plane. One task per 32-value chunk `sub`: 4 grid
// entries of 8 values (10-bit indices), one sign byte per entry; segment a (entries 0, 1) takes
// the low scale nibble, segment b (entries 2, 3) the high one. The 1024-entry codebook (8 KB) is
// read through the cache (GRID), not copied into workgroup memory.
const QK: u32 = 256u;
const BODY_BYTES: u32 = 80u;
const TASKS_PER_BLOCK: u32 = 8u;

// This block's task fields (quant/iq2_tasks.wgsl builds its tasks from them).
fn iq2_bits(body: u32, d_row: u32, t: u32) -> Iq2Bits {
    let sub = t % 8u;
    let blk = body + (t / 8u) * BODY_BYTES;
    let low = pick4(W4[(blk >> 4u) + sub / 4u], sub & 3u);
    let signs = pick4(W4[(blk >> 4u) + 2u + sub / 4u], sub & 3u);
    let shift = 8u * (sub & 3u);
    let qh = (W[(blk >> 2u) + 16u + sub / 4u] >> shift) & 0xffu;
    let scales = (W[(blk >> 2u) + 18u + sub / 4u] >> shift) & 0xffu;
    let entries = bytes4(low) | ((vec4<u32>(qh) << vec4<u32>(8u, 6u, 4u, 2u)) & vec4<u32>(0x300u));
    return Iq2Bits(entries, signs, scales, d_f16(d_row + 2u * (t / 8u)));
}
