// block_q4_K: f16 d; f16 dmin; u8 scales[12] (8 packed 6-bit scale/min pairs); u8 qs[128]: the 32
// values of sub-block 2p are the low nibbles of qs[32p ..], those of 2p + 1 the high nibbles.
// Split layout: the 128 code bytes on 16-byte boundaries, the 16-byte head in the head plane;
// task t reads the 16 code bytes 16 (t % 8) of its block (quant/k_tasks.wgsl).
const QK: u32 = 256u;
const BODY_BYTES: u32 = 128u;

fn task_w(body: u32, d_row: u32, t: u32) -> Task {
    let q = W4[(body >> 4u) + t];
    let low = vec4<u32>(0x0f0f0f0fu);
    return k_task(q & low, (q >> vec4<u32>(4u)) & low, k_scales(d_row, t));
}
