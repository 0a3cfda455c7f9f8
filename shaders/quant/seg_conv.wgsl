// Decode's GDN conv in the input projection's store (the `matvec_conv:<type>` assemblies, entry
// matvec_seg with Y0_MODE 3, one vector): the rows of segment 0 are the conv's new inputs u, one
// per channel, and the subgroup that computed channel c's row also runs the channel's conv — the
// 4-tap sum over its history and u, then the SiLU (conv_tap.wgsl, as gdn.wgsl's gdn_conv) — and
// shifts its history, which no other invocation touches. The store then writes the conv output.
// Segment 0's rows are the channels (p.seg1 of them), so HIST holds 3 rows of p.seg1 values.
@group(0) @binding(13) var<storage, read_write> HIST: array<f32>; // [3, channels], oldest first
@group(0) @binding(14) var<storage, read> CW: array<f32>;         // [channels, 4]

fn seg0_store(c: u32, u: f32) -> f32 {
    let n = p.seg1;
    let h0 = HIST[c];
    let h1 = HIST[n + c];
    let h2 = HIST[2u * n + c];
    let w = vec4<f32>(CW[4u * c], CW[4u * c + 1u], CW[4u * c + 2u], CW[4u * c + 3u]);
    HIST[c] = h1;
    HIST[n + c] = h2;
    HIST[2u * n + c] = u;
    return conv_silu4(w, h0, h1, h2, u);
}
