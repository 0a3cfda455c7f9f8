// block_tq1_0: u8 qs[48] (5 base-3 digits per byte), u8 qh[4] (4 digits per byte), f16 d.
// A byte holds a fixed-point fraction of 3^5: digit p of byte b is ((b * 3^p) mod 256) * 3 >> 8,
// and a digit t stands for (t - 1) * d. Values come in ggml's order: for each power, a run over
// the bytes of a group (bytes 0..32 for values 0..160, 32..48 for 160..240, qh for 240..256).
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 54u;

fn tq1_pow3(p: u32) -> u32 {
    var r = 1u;
    for (var i = 0u; i < p; i++) {
        r *= 3u;
    }
    return r;
}

fn dequant_chunk(block: u32, sub: u32) {
    let d = w_f16(block + 52u);
    for (var j = 0u; j < 32u; j++) {
        let v = 32u * sub + j;
        var byte_index = v % 32u;
        var power = v / 32u;
        if (v >= 240u) {
            byte_index = 48u + (v - 240u) % 4u;
            power = (v - 240u) / 4u;
        } else if (v >= 160u) {
            byte_index = 32u + (v - 160u) % 16u;
            power = (v - 160u) / 16u;
        }
        let q = (w_u8(block + byte_index) * tq1_pow3(power)) & 0xffu;
        let digit = (q * 3u) >> 8u;
        wq[j] = f32(i32(digit) - 1) * d;
    }
}
