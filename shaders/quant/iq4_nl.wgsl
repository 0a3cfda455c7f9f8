// block_iq4_nl: f16 d; u8 qs[16]; nibbles index a fixed non-linear codebook. Split layout
// (src/gpu/layout.rs): the 16 code bytes on 16-byte boundaries, d in the scale plane. One task per
// block: values 0..15 are the low nibbles of bytes 0..15, values 16..31 the high nibbles.
const QK: u32 = 32u;
const BODY_BYTES: u32 = 16u;
const TASKS_PER_BLOCK: u32 = 1u;

// The codebook as packed signed bytes: a vector lookup instead of a const-array index, which
// some drivers turn into a per-invocation copy of the whole array.
const IQ4_PACKED = vec4<u32>(0xbfad9881u, 0xf6eaddcfu, 0x26190d01u, 0x71594535u);

fn iq4_value(q: u32) -> f32 {
    let byte = (IQ4_PACKED[q >> 2u] >> ((q & 3u) << 3u)) & 0xffu;
    return f32(bitcast<i32>(byte << 24u) >> 24u);
}

// The codebook as f32 in workgroup memory (filled by the prologue): a lookup per value without
// a dynamically indexed vector, which drivers turn into local-memory traffic.
var<workgroup> IQ4T: array<f32, 16>;

fn prologue(lid: u32) {
    if (lid < 16u) {
        IQ4T[lid] = iq4_value(lid);
    }
}

fn task_x(t: u32) -> vec2<u32> {
    return vec2<u32>(32u * t, 32u * t + 16u);
}

// Codebook values of the nibbles at `shift` of the 4 bytes of `w`.
fn iq4_codes(w: u32, shift: u32) -> vec4<f32> {
    let q = (w >> shift) & 0x0f0f0f0fu;
    return vec4<f32>(IQ4T[q & 0xffu], IQ4T[(q >> 8u) & 0xffu], IQ4T[(q >> 16u) & 0xffu],
                     IQ4T[q >> 24u]);
}

fn task_w(body: u32, d_row: u32, t: u32) -> Task {
    let q = W4[(body + t * BODY_BYTES) >> 4u];
    let d = d_f16(d_row + 2u * t);
    return Task(iq4_codes(q.x, 0u), iq4_codes(q.y, 0u), iq4_codes(q.z, 0u), iq4_codes(q.w, 0u),
                iq4_codes(q.x, 4u), iq4_codes(q.y, 4u), iq4_codes(q.z, 4u), iq4_codes(q.w, 4u),
                d, d);
}
