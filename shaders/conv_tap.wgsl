// The GDN causal conv of one channel over its last four inputs (oldest first) with its taps, and
// the SiLU after it: gdn.wgsl's conv4 and decode's input projection store (quant/seg_conv.wgsl)
// both call this one expression, with explicit fmas, so they give the same bits.
fn conv_silu4(w: vec4<f32>, v0: f32, v1: f32, v2: f32, v3: f32) -> f32 {
    let acc = fma(w.w, v3, fma(w.z, v2, fma(w.y, v1, w.x * v0)));
    return acc / (1.0 + exp(-acc));
}
