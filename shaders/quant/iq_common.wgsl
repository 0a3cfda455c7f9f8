// Shared pieces of the i-quant dequantizers. `GRID` holds the type's codebook: u64 entries as two
// u32 words (low first), u32 entries as one word; byte j of an entry is value j.

fn grid8(entry: u32, j: u32) -> u32 {
    return (GRID[2u * entry + (j >> 2u)] >> ((j & 3u) << 3u)) & 0xffu;
}

fn grid8_i8(entry: u32, j: u32) -> f32 {
    return f32(bitcast<i32>(grid8(entry, j) << 24u) >> 24u);
}

fn grid4(entry: u32, j: u32) -> u32 {
    return (GRID[entry] >> (j << 3u)) & 0xffu;
}

// 7 stored sign bits plus an 8th that makes the number of minus signs even.
fn ksign(bits7: u32) -> u32 {
    return bits7 | ((countOneBits(bits7) & 1u) << 7u);
}

fn signed(v: f32, signs: u32, j: u32) -> f32 {
    if (((signs >> j) & 1u) != 0u) {
        return -v;
    }
    return v;
}
