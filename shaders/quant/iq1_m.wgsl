// block_iq1_m: u8 qs[32] (grid index low bytes); u8 qh[16] (per 8 values: 3 high index bits and
// the delta's sign); u8 scales[8] (per 16 values a 3-bit scale s, factor 2s + 1; the block's f16
// d spread over the top nibbles of the four u16 scale words). Split layout (src/gpu/layout.rs):
// the 48-byte body (qs @0, qh @32) on 16-byte boundaries, the 8 scale bytes in the head plane.
// One task per 32-value chunk `sub` (quant/iq1_tasks.wgsl): segment a takes the chunk's first
// factor, segment b its second. The 2048-entry codebook (16 KB) is read through the cache (GRID).
const QK: u32 = 256u;
const BODY_BYTES: u32 = 48u;
const TASKS_PER_BLOCK: u32 = 8u;

fn iq1_bits(body: u32, d_row: u32, t: u32) -> Iq1Bits {
    let sub = t % 8u;
    let q = iq1_body(body, t);
    let qs = q.x;
    let qh = q.y;
    let high = vec4<u32>(qh << 8u, qh << 4u, qh, qh >> 4u) & vec4<u32>(0x700u);
    let neg = ((qh >> 3u) & 1u) | ((qh >> 6u) & 2u) | ((qh >> 9u) & 4u) | ((qh >> 12u) & 8u);
    let head = d_row + HEAD_BYTES * (t / 8u);
    let s01 = W[head >> 2u];
    let s23 = W[(head >> 2u) + 1u];
    let bits = ((s01 >> 12u) & 0xfu) | ((s01 >> 24u) & 0xf0u) | ((s23 >> 4u) & 0xf00u)
        | ((s23 >> 16u) & 0xf000u);
    let sc = (select(s01, s23, sub >= 4u) >> (16u * ((sub / 2u) & 1u) + 6u * (sub & 1u))) & 0x3fu;
    let ka = 2u * (sc & 7u) + 1u;
    let kb = 2u * (sc >> 3u) + 1u;
    let d8 = unpack2x16float(bits).x * 0.125;
    return Iq1Bits(bytes4(qs) | high, neg, ka, kb, d8, d8 * f32(ka), d8 * f32(kb));
}
