// block_q5_K: f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]: value l of sub-block s has
// the nibble s % 2 of qs[32 (s / 2) + l] and, as its fifth bit, bit s of qh[l]. Split layout: the
// 160-byte body (qh @0, qs @32) on 16-byte boundaries, the 16-byte head in the head plane; task t
// reads the 16 code bytes 16 (t % 8) of qs and the 16 qh bytes of its half (quant/k_tasks.wgsl).
const QK: u32 = 256u;
const BODY_BYTES: u32 = 160u;

fn task_w(body: u32, d_row: u32, t: u32) -> Task {
    let blk = (body >> 4u) + (t / 8u) * 10u;
    let j = t % 8u;
    let q = W4[blk + 2u + j];
    let h = W4[blk + j % 2u];
    let bit = vec4<u32>(2u * (j / 2u));
    let one = vec4<u32>(0x01010101u);
    let low = vec4<u32>(0x0f0f0f0fu);
    let a = (q & low) | (((h >> bit) & one) << vec4<u32>(4u));
    let b = ((q >> vec4<u32>(4u)) & low) | (((h >> (bit + vec4<u32>(1u))) & one) << vec4<u32>(4u));
    return k_task(a, b, k_scales(d_row, t));
}
