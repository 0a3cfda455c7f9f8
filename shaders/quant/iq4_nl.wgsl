// block_iq4_nl: f16 d; u8 qs[16]; nibbles index a fixed non-linear codebook. Split layout
// (src/gpu/layout.rs): the 16 code bytes on 16-byte boundaries, d in the scale plane. One task per
// block (quant/iq4_tasks.wgsl).
const QK: u32 = 32u;
const BODY_BYTES: u32 = 16u;
const TASKS_PER_BLOCK: u32 = 1u;

fn iq4_scale(d_row: u32, t: u32) -> Iq4Scale {
    let d = d_f16(d_row + 2u * t);
    return Iq4Scale(d, 1, d);
}
