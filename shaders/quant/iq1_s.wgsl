// block_iq1_s: f16 d; u8 qs[32] (grid index low bytes); u16 qh[8] (per 32 values: 3 high index
// bits for each of 4 entries, a 3-bit scale s (factor 2s + 1), the delta's sign). Split layout
// (src/gpu/layout.rs): the 48-byte body (qs @0, qh @32) on 16-byte boundaries, d in the scale
// plane. One task per 32-value chunk `sub` (quant/iq1_tasks.wgsl): both segments share the factor
// and the 4 entries the delta. The 2048-entry codebook (16 KB) is read through the cache (GRID).
const QK: u32 = 256u;
const BODY_BYTES: u32 = 48u;
const TASKS_PER_BLOCK: u32 = 8u;

fn iq1_bits(body: u32, d_row: u32, t: u32) -> Iq1Bits {
    let q = iq1_body(body, t);
    let qs = q.x;
    let qh = q.y;
    let entries = bytes4(qs) | (((vec4<u32>(qh) >> vec4<u32>(0u, 3u, 6u, 9u)) & vec4<u32>(7u)) << vec4<u32>(8u));
    let k = 2u * ((qh >> 12u) & 7u) + 1u;
    let neg = select(0u, 0xfu, (qh & 0x8000u) != 0u);
    let d8 = d_f16(d_row + 2u * (t / 8u)) * 0.125;
    let s = d8 * f32(k);
    return Iq1Bits(entries, neg, k, k, d8, s, s);
}
