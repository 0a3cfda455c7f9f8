//! Per-type block decoders, written after ggml's scalar reference `dequantize_row_*`
//! (`ggml/src/ggml-quants.c`). Each keeps ggml's operation order exactly: which integer
//! expression is formed first, which products are grouped, where int→f32 conversions happen.
//! Rust never fuses `a * b - c` into an FMA on its own, matching ggml's reference build.
//!
//! Block byte layouts are those of the `block_*` structs in `ggml-common.h` (little-endian, no
//! padding). Blocks are handed over as fixed-size arrays (`as_chunks`), so every constant offset
//! below is checked at compile time.

use super::SplitMix64;
use super::iq_tables::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS,
    KVALUES_IQ4NL,
};
use crate::gguf::GgmlType;

/// Offset applied to the IQ1_S / IQ1_M grid values (`IQ1S_DELTA` in ggml).
const IQ1S_DELTA: f32 = 0.125;

/// E2M1 values doubled (`kvalues_mxfp4` in ggml), shared by MXFP4 and NVFP4.
const KVALUES_FP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

#[inline]
fn f16_to_f32(lo: u8, hi: u8) -> f32 {
    f16_bits_to_f32(u16::from_le_bytes([lo, hi]))
}

/// Exact IEEE binary16 → binary32 conversion without branches (the classic bit trick ggml's
/// scalar path also uses), so loops over f16 data vectorize; `half`'s per-value conversion goes
/// through runtime CPU-feature dispatch and is several times slower here. Normal values are
/// re-biased by a multiply with 2^-112, subnormals come from a magic-number subtraction; both
/// are exact, and NaN stays NaN (quieted by the multiply, as hardware conversion does).
#[inline(always)]
pub(super) fn f16_bits_to_f32(h: u16) -> f32 {
    let w = u32::from(h) << 16;
    let sign = w & 0x8000_0000;
    let two_w = w.wrapping_add(w);
    let exp_offset = 0xE0u32 << 23;
    let exp_scale = f32::from_bits(0x0780_0000); // 2^-112
    let normalized = f32::from_bits((two_w >> 4) + exp_offset) * exp_scale;
    let magic_mask = 126u32 << 23;
    let denormalized = f32::from_bits((two_w >> 17) | magic_mask) - 0.5;
    let denormalized_cutoff = 1u32 << 27;
    let magnitude = if two_w < denormalized_cutoff {
        denormalized.to_bits()
    } else {
        normalized.to_bits()
    };
    f32::from_bits(sign | magnitude)
}

#[inline]
fn bf16_to_f32(lo: u8, hi: u8) -> f32 {
    f32::from_bits(u32::from(u16::from_le_bytes([lo, hi])) << 16)
}

#[inline]
fn u16_at(lo: u8, hi: u8) -> u16 {
    u16::from_le_bytes([lo, hi])
}

#[inline]
fn u32_at(bytes: &[u8], offset: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[offset..offset + 4]);
    u32::from_le_bytes(word)
}

/// ±1 for bit `j` of an IQ sign byte (a set bit means negative), as ggml's `kmask_iq2xs` test.
#[inline]
fn sign_of(signs: u8, j: usize) -> f32 {
    if signs & (1u8 << j) != 0 { -1.0 } else { 1.0 }
}

/// Pairs of (block bytes, block values). Callers have checked that the lengths are exactly
/// n_blocks * BYTES and n_blocks * VALUES.
fn block_pairs<'a, const BYTES: usize, const VALUES: usize>(
    src: &'a [u8],
    dst: &'a mut [f32],
) -> impl Iterator<Item = (&'a [u8; BYTES], &'a mut [f32; VALUES])> {
    src.as_chunks::<BYTES>()
        .0
        .iter()
        .zip(dst.as_chunks_mut::<VALUES>().0.iter_mut())
}

/// Decode whole blocks. Lengths must already be consistent (see `block_count`); unsupported
/// types leave `dst` untouched (the public entry points reject them first).
pub(super) fn dequantize_checked_lengths(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    use GgmlType::*;
    match ty {
        F32 => {
            for (value, bytes) in dst.iter_mut().zip(src.as_chunks::<4>().0) {
                *value = f32::from_le_bytes(*bytes);
            }
        }
        F16 => {
            for (value, bytes) in dst.iter_mut().zip(src.as_chunks::<2>().0) {
                *value = f16_to_f32(bytes[0], bytes[1]);
            }
        }
        BF16 => {
            for (value, bytes) in dst.iter_mut().zip(src.as_chunks::<2>().0) {
                *value = bf16_to_f32(bytes[0], bytes[1]);
            }
        }
        Q4_0 => q4_0(src, dst),
        Q4_1 => q4_1(src, dst),
        Q5_0 => q5_0(src, dst),
        Q5_1 => q5_1(src, dst),
        Q8_0 => q8_0(src, dst),
        Q2_K => q2_k(src, dst),
        Q3_K => q3_k(src, dst),
        Q4_K => q4_k(src, dst),
        Q5_K => q5_k(src, dst),
        Q6_K => q6_k(src, dst),
        IQ2_XXS => iq2_xxs(src, dst),
        IQ2_XS => iq2_xs(src, dst),
        IQ2_S => iq2_s(src, dst),
        IQ3_XXS => iq3_xxs(src, dst),
        IQ3_S => iq3_s(src, dst),
        IQ1_S => iq1_s(src, dst),
        IQ1_M => iq1_m(src, dst),
        IQ4_NL => iq4_nl(src, dst),
        IQ4_XS => iq4_xs(src, dst),
        Q1_0 => q1_0(src, dst),
        Q2_0 => q2_0(src, dst),
        TQ1_0 => tq1_0(src, dst),
        TQ2_0 => tq2_0(src, dst),
        MXFP4 => mxfp4(src, dst),
        NVFP4 => nvfp4(src, dst),
        Q8_1 | Q8_K | I8 | I16 | I32 | I64 | F64 => {}
    }
}

fn q4_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in block_pairs::<18, 32>(src, dst) {
        let d = f16_to_f32(b[0], b[1]);
        for j in 0..16 {
            let x0 = i32::from(b[2 + j] & 0x0F) - 8;
            let x1 = i32::from(b[2 + j] >> 4) - 8;
            y[j] = x0 as f32 * d;
            y[j + 16] = x1 as f32 * d;
        }
    }
}

fn q4_1(src: &[u8], dst: &mut [f32]) {
    for (b, y) in block_pairs::<20, 32>(src, dst) {
        let d = f16_to_f32(b[0], b[1]);
        let m = f16_to_f32(b[2], b[3]);
        for j in 0..16 {
            let x0 = i32::from(b[4 + j] & 0x0F);
            let x1 = i32::from(b[4 + j] >> 4);
            y[j] = x0 as f32 * d + m;
            y[j + 16] = x1 as f32 * d + m;
        }
    }
}

fn q5_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in block_pairs::<22, 32>(src, dst) {
        let d = f16_to_f32(b[0], b[1]);
        let qh = u32_at(b, 2);
        for j in 0..16 {
            let xh_0 = ((qh >> j) << 4) & 0x10;
            let xh_1 = (qh >> (j + 12)) & 0x10;
            let x0 = (u32::from(b[6 + j] & 0x0F) | xh_0) as i32 - 16;
            let x1 = (u32::from(b[6 + j] >> 4) | xh_1) as i32 - 16;
            y[j] = x0 as f32 * d;
            y[j + 16] = x1 as f32 * d;
        }
    }
}

fn q5_1(src: &[u8], dst: &mut [f32]) {
    for (b, y) in block_pairs::<24, 32>(src, dst) {
        let d = f16_to_f32(b[0], b[1]);
        let m = f16_to_f32(b[2], b[3]);
        let qh = u32_at(b, 4);
        for j in 0..16 {
            let xh_0 = ((qh >> j) << 4) & 0x10;
            let xh_1 = (qh >> (j + 12)) & 0x10;
            let x0 = u32::from(b[8 + j] & 0x0F) | xh_0;
            let x1 = u32::from(b[8 + j] >> 4) | xh_1;
            y[j] = x0 as f32 * d + m;
            y[j + 16] = x1 as f32 * d + m;
        }
    }
}

fn q8_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in block_pairs::<34, 32>(src, dst) {
        let d = f16_to_f32(b[0], b[1]);
        for j in 0..32 {
            y[j] = f32::from(b[2 + j] as i8) * d;
        }
    }
}

fn q2_k(src: &[u8], dst: &mut [f32]) {
    // block_q2_K: scales[16], qs[64], d, dmin
    for (b, y) in block_pairs::<84, 256>(src, dst) {
        let d = f16_to_f32(b[80], b[81]);
        let min = f16_to_f32(b[82], b[83]);
        let mut out = 0;
        let mut is = 0;
        for half_block in 0..2 {
            let q = &b[16 + 32 * half_block..16 + 32 * half_block + 32];
            let mut shift = 0;
            for _ in 0..4 {
                for part in 0..2 {
                    let sc = b[is];
                    is += 1;
                    let dl = d * f32::from(sc & 0xF);
                    let ml = min * f32::from(sc >> 4);
                    for l in 0..16 {
                        y[out] = dl * f32::from((q[l + 16 * part] >> shift) & 3) - ml;
                        out += 1;
                    }
                }
                shift += 2;
            }
        }
    }
}

fn q3_k(src: &[u8], dst: &mut [f32]) {
    // block_q3_K: hmask[32], qs[64], scales[12], d
    const KMASK1: u32 = 0x0303_0303;
    const KMASK2: u32 = 0x0f0f_0f0f;
    for (b, y) in block_pairs::<110, 256>(src, dst) {
        let d_all = f16_to_f32(b[108], b[109]);
        let a0 = u32_at(b, 96);
        let a1 = u32_at(b, 100);
        let tmp = u32_at(b, 104);
        // The 16 6-bit scales: low nibbles from bytes 0..8, high 2 bits from bytes 8..12.
        let aux = [
            (a0 & KMASK2) | ((tmp & KMASK1) << 4),
            (a1 & KMASK2) | (((tmp >> 2) & KMASK1) << 4),
            ((a0 >> 4) & KMASK2) | (((tmp >> 4) & KMASK1) << 4),
            ((a1 >> 4) & KMASK2) | (((tmp >> 6) & KMASK1) << 4),
        ];
        let mut scales = [0i8; 16];
        for (k, word) in aux.iter().enumerate() {
            for (byte_index, byte) in word.to_le_bytes().iter().enumerate() {
                scales[4 * k + byte_index] = *byte as i8;
            }
        }
        let hm = &b[0..32];
        let mut m = 1u8;
        let mut out = 0;
        let mut is = 0;
        for half_block in 0..2 {
            let q = &b[32 + 32 * half_block..32 + 32 * half_block + 32];
            let mut shift = 0;
            for _ in 0..4 {
                for part in 0..2 {
                    let dl = d_all * (i32::from(scales[is]) - 32) as f32;
                    is += 1;
                    for l in 0..16 {
                        let low = i32::from((q[l + 16 * part] >> shift) & 3);
                        let high = if hm[l + 16 * part] & m != 0 { 0 } else { 4 };
                        y[out] = dl * (low - high) as f32;
                        out += 1;
                    }
                }
                shift += 2;
                m <<= 1;
            }
        }
    }
}

/// 6-bit scale and min number `j` of the 12 packed bytes of Q4_K / Q5_K (`get_scale_min_k4`).
#[inline]
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

fn q4_k(src: &[u8], dst: &mut [f32]) {
    // block_q4_K: d, dmin, scales[12], qs[128]
    for (b, y) in block_pairs::<144, 256>(src, dst) {
        let d = f16_to_f32(b[0], b[1]);
        let min = f16_to_f32(b[2], b[3]);
        let scales = &b[4..16];
        let mut out = 0;
        for group in 0..4 {
            let q = &b[16 + 32 * group..16 + 32 * group + 32];
            let (sc, m) = scale_min_k4(2 * group, scales);
            let d1 = d * f32::from(sc);
            let m1 = min * f32::from(m);
            let (sc, m) = scale_min_k4(2 * group + 1, scales);
            let d2 = d * f32::from(sc);
            let m2 = min * f32::from(m);
            for l in 0..32 {
                y[out + l] = d1 * f32::from(q[l] & 0xF) - m1;
                y[out + 32 + l] = d2 * f32::from(q[l] >> 4) - m2;
            }
            out += 64;
        }
    }
}

fn q5_k(src: &[u8], dst: &mut [f32]) {
    // block_q5_K: d, dmin, scales[12], qh[32], qs[128]
    for (b, y) in block_pairs::<176, 256>(src, dst) {
        let d = f16_to_f32(b[0], b[1]);
        let min = f16_to_f32(b[2], b[3]);
        let scales = &b[4..16];
        let qh = &b[16..48];
        let mut out = 0;
        let mut u1 = 1u8;
        let mut u2 = 2u8;
        for group in 0..4 {
            let ql = &b[48 + 32 * group..48 + 32 * group + 32];
            let (sc, m) = scale_min_k4(2 * group, scales);
            let d1 = d * f32::from(sc);
            let m1 = min * f32::from(m);
            let (sc, m) = scale_min_k4(2 * group + 1, scales);
            let d2 = d * f32::from(sc);
            let m2 = min * f32::from(m);
            for l in 0..32 {
                let high = if qh[l] & u1 != 0 { 16 } else { 0 };
                y[out + l] = d1 * f32::from((ql[l] & 0xF) + high) - m1;
            }
            for l in 0..32 {
                let high = if qh[l] & u2 != 0 { 16 } else { 0 };
                y[out + 32 + l] = d2 * f32::from((ql[l] >> 4) + high) - m2;
            }
            out += 64;
            u1 <<= 2;
            u2 <<= 2;
        }
    }
}

fn q6_k(src: &[u8], dst: &mut [f32]) {
    // block_q6_K: ql[128], qh[64], scales[16] (i8), d
    for (b, y) in block_pairs::<210, 256>(src, dst) {
        let d = f16_to_f32(b[208], b[209]);
        for half_block in 0..2 {
            let ql = &b[64 * half_block..64 * half_block + 64];
            let qh = &b[128 + 32 * half_block..128 + 32 * half_block + 32];
            let sc = &b[192 + 8 * half_block..192 + 8 * half_block + 8];
            let yb = &mut y[128 * half_block..128 * half_block + 128];
            for l in 0..32 {
                let is = l / 16;
                let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 - 32;
                let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
                let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
                yb[l] = d * f32::from(sc[is] as i8) * f32::from(q1);
                yb[l + 32] = d * f32::from(sc[is + 2] as i8) * f32::from(q2);
                yb[l + 64] = d * f32::from(sc[is + 4] as i8) * f32::from(q3);
                yb[l + 96] = d * f32::from(sc[is + 6] as i8) * f32::from(q4);
            }
        }
    }
}

fn iq2_xxs(src: &[u8], dst: &mut [f32]) {
    // block_iq2_xxs: d, qs[32] (u16) — per 32 values: 4 grid bytes, then 4 x 7 sign bits + scale
    for (b, y) in block_pairs::<66, 256>(src, dst) {
        let d = f16_to_f32(b[0], b[1]);
        for ib32 in 0..8 {
            let grid_indices = u32_at(b, 2 + 8 * ib32).to_le_bytes();
            let signs_and_scale = u32_at(b, 6 + 8 * ib32);
            let db = d * (0.5 + (signs_and_scale >> 28) as f32) * 0.25;
            for l in 0..4 {
                let grid = IQ2XXS_GRID[usize::from(grid_indices[l])].to_le_bytes();
                let signs = KSIGNS_IQ2XS[((signs_and_scale >> (7 * l)) & 127) as usize];
                let yb = &mut y[32 * ib32 + 8 * l..32 * ib32 + 8 * l + 8];
                for j in 0..8 {
                    yb[j] = db * f32::from(grid[j]) * sign_of(signs, j);
                }
            }
        }
    }
}

fn iq2_xs(src: &[u8], dst: &mut [f32]) {
    // block_iq2_xs: d, qs[32] (u16: 9-bit grid index, 7 sign bits), scales[8]
    for (b, y) in block_pairs::<74, 256>(src, dst) {
        let d = f16_to_f32(b[0], b[1]);
        for ib32 in 0..8 {
            let scale = b[66 + ib32];
            let db = [
                d * (0.5 + f32::from(scale & 0xf)) * 0.25,
                d * (0.5 + f32::from(scale >> 4)) * 0.25,
            ];
            for l in 0..4 {
                let k = 4 * ib32 + l;
                let code = u16_at(b[2 + 2 * k], b[3 + 2 * k]);
                let grid = IQ2XS_GRID[usize::from(code & 511)].to_le_bytes();
                let signs = KSIGNS_IQ2XS[usize::from(code >> 9)];
                let yb = &mut y[8 * k..8 * k + 8];
                for j in 0..8 {
                    yb[j] = db[l / 2] * f32::from(grid[j]) * sign_of(signs, j);
                }
            }
        }
    }
}

fn iq2_s(src: &[u8], dst: &mut [f32]) {
    // block_iq2_s: d, qs[64] (32 grid low bytes, then 32 sign bytes), qh[8], scales[8]
    for (b, y) in block_pairs::<82, 256>(src, dst) {
        let d = f16_to_f32(b[0], b[1]);
        for ib32 in 0..8 {
            let scale = b[74 + ib32];
            let db = [
                d * (0.5 + f32::from(scale & 0xf)) * 0.25,
                d * (0.5 + f32::from(scale >> 4)) * 0.25,
            ];
            let qh = usize::from(b[66 + ib32]);
            for l in 0..4 {
                let k = 4 * ib32 + l;
                let dl = db[l / 2];
                let index = usize::from(b[2 + k]) | ((qh << (8 - 2 * l)) & 0x300);
                let grid = IQ2S_GRID[index].to_le_bytes();
                let signs = b[34 + k];
                let yb = &mut y[8 * k..8 * k + 8];
                for j in 0..8 {
                    yb[j] = dl * f32::from(grid[j]) * sign_of(signs, j);
                }
            }
        }
    }
}

fn iq3_xxs(src: &[u8], dst: &mut [f32]) {
    // block_iq3_xxs: d, qs[64] grid indices, then 8 x u32 (4 x 7 sign bits + 4-bit scale)
    for (b, y) in block_pairs::<98, 256>(src, dst) {
        let d = f16_to_f32(b[0], b[1]);
        for ib32 in 0..8 {
            let signs_and_scale = u32_at(b, 66 + 4 * ib32);
            let db = d * (0.5 + (signs_and_scale >> 28) as f32) * 0.5;
            for l in 0..4 {
                let signs = KSIGNS_IQ2XS[((signs_and_scale >> (7 * l)) & 127) as usize];
                let grid1 = IQ3XXS_GRID[usize::from(b[2 + 8 * ib32 + 2 * l])].to_le_bytes();
                let grid2 = IQ3XXS_GRID[usize::from(b[3 + 8 * ib32 + 2 * l])].to_le_bytes();
                let yb = &mut y[32 * ib32 + 8 * l..32 * ib32 + 8 * l + 8];
                for j in 0..4 {
                    yb[j] = db * f32::from(grid1[j]) * sign_of(signs, j);
                    yb[j + 4] = db * f32::from(grid2[j]) * sign_of(signs, j + 4);
                }
            }
        }
    }
}

fn iq3_s(src: &[u8], dst: &mut [f32]) {
    // block_iq3_s: d, qs[64], qh[8], signs[32], scales[4]
    for (b, y) in block_pairs::<110, 256>(src, dst) {
        let d = f16_to_f32(b[0], b[1]);
        for ib32 in 0..8 {
            let scale = b[106 + ib32 / 2];
            let nibble = if ib32 % 2 == 0 {
                scale & 0xf
            } else {
                scale >> 4
            };
            let db = d * (1 + 2 * i32::from(nibble)) as f32;
            let qh = usize::from(b[66 + ib32]);
            for l in 0..4 {
                let q1 = usize::from(b[2 + 8 * ib32 + 2 * l]);
                let q2 = usize::from(b[3 + 8 * ib32 + 2 * l]);
                let grid1 = IQ3S_GRID[q1 | ((qh << (8 - 2 * l)) & 256)].to_le_bytes();
                let grid2 = IQ3S_GRID[q2 | ((qh << (7 - 2 * l)) & 256)].to_le_bytes();
                let signs = b[74 + 4 * ib32 + l];
                let yb = &mut y[32 * ib32 + 8 * l..32 * ib32 + 8 * l + 8];
                for j in 0..4 {
                    yb[j] = db * f32::from(grid1[j]) * sign_of(signs, j);
                    yb[j + 4] = db * f32::from(grid2[j]) * sign_of(signs, j + 4);
                }
            }
        }
    }
}

fn iq1_s(src: &[u8], dst: &mut [f32]) {
    // block_iq1_s: d, qs[32], qh[8] (u16: 4 x 3 high index bits, 3-bit scale, delta sign)
    for (b, y) in block_pairs::<50, 256>(src, dst) {
        let d = f16_to_f32(b[0], b[1]);
        for ib in 0..8 {
            let qh = u16_at(b[34 + 2 * ib], b[35 + 2 * ib]);
            let dl = d * (2 * ((qh >> 12) & 7) + 1) as f32;
            let delta = if qh & 0x8000 != 0 {
                -IQ1S_DELTA
            } else {
                IQ1S_DELTA
            };
            for l in 0..4 {
                let index =
                    usize::from(b[2 + 4 * ib + l]) | (usize::from((qh >> (3 * l)) & 7) << 8);
                let grid = IQ1S_GRID[index].to_le_bytes();
                let yb = &mut y[32 * ib + 8 * l..32 * ib + 8 * l + 8];
                for j in 0..8 {
                    yb[j] = dl * (f32::from(grid[j] as i8) + delta);
                }
            }
        }
    }
}

/// The f16 super-block scale of IQ1_M, spread over the top nibbles of its four u16 scale words.
#[inline]
fn iq1_m_scale_bits(b: &[u8; 56]) -> u16 {
    let sc = [
        u16_at(b[48], b[49]),
        u16_at(b[50], b[51]),
        u16_at(b[52], b[53]),
        u16_at(b[54], b[55]),
    ];
    (sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000)
}

fn iq1_m(src: &[u8], dst: &mut [f32]) {
    // block_iq1_m: qs[32], qh[16], scales[8] (4 x u16: 3-bit block scales + f16 nibbles)
    for (b, y) in block_pairs::<56, 256>(src, dst) {
        let scale_bits = iq1_m_scale_bits(b);
        let d = f16_bits_to_f32(scale_bits);
        for ib in 0..8 {
            let sc = u16_at(b[48 + 2 * (ib / 2)], b[49 + 2 * (ib / 2)]);
            let shift = 6 * (ib % 2);
            let dl1 = d * (2 * ((sc >> shift) & 0x7) + 1) as f32;
            let dl2 = d * (2 * ((sc >> (shift + 3)) & 0x7) + 1) as f32;
            let qs = &b[4 * ib..4 * ib + 4];
            let qh0 = usize::from(b[32 + 2 * ib]);
            let qh1 = usize::from(b[33 + 2 * ib]);
            let index = [
                usize::from(qs[0]) | ((qh0 << 8) & 0x700),
                usize::from(qs[1]) | ((qh0 << 4) & 0x700),
                usize::from(qs[2]) | ((qh1 << 8) & 0x700),
                usize::from(qs[3]) | ((qh1 << 4) & 0x700),
            ];
            let delta_for = |bit: bool| if bit { -IQ1S_DELTA } else { IQ1S_DELTA };
            let delta = [
                delta_for(qh0 & 0x08 != 0),
                delta_for(qh0 & 0x80 != 0),
                delta_for(qh1 & 0x08 != 0),
                delta_for(qh1 & 0x80 != 0),
            ];
            for l in 0..4 {
                let dl = if l < 2 { dl1 } else { dl2 };
                let grid = IQ1S_GRID[index[l]].to_le_bytes();
                let yb = &mut y[32 * ib + 8 * l..32 * ib + 8 * l + 8];
                for j in 0..8 {
                    yb[j] = dl * (f32::from(grid[j] as i8) + delta[l]);
                }
            }
        }
    }
}

fn iq4_nl(src: &[u8], dst: &mut [f32]) {
    for (b, y) in block_pairs::<18, 32>(src, dst) {
        let d = f16_to_f32(b[0], b[1]);
        for j in 0..16 {
            y[j] = d * f32::from(KVALUES_IQ4NL[usize::from(b[2 + j] & 0xf)]);
            y[j + 16] = d * f32::from(KVALUES_IQ4NL[usize::from(b[2 + j] >> 4)]);
        }
    }
}

fn iq4_xs(src: &[u8], dst: &mut [f32]) {
    // block_iq4_xs: d, scales_h (u16), scales_l[4], qs[128]
    for (b, y) in block_pairs::<136, 256>(src, dst) {
        let d = f16_to_f32(b[0], b[1]);
        let scales_h = u16_at(b[2], b[3]);
        for ib in 0..8 {
            let low = (b[4 + ib / 2] >> (4 * (ib % 2))) & 0xf;
            let high = ((scales_h >> (2 * ib)) & 3) as u8;
            let ls = i32::from(low | (high << 4));
            let dl = d * (ls - 32) as f32;
            let qs = &b[8 + 16 * ib..8 + 16 * ib + 16];
            for j in 0..16 {
                y[32 * ib + j] = dl * f32::from(KVALUES_IQ4NL[usize::from(qs[j] & 0xf)]);
                y[32 * ib + j + 16] = dl * f32::from(KVALUES_IQ4NL[usize::from(qs[j] >> 4)]);
            }
        }
    }
}

fn q1_0(src: &[u8], dst: &mut [f32]) {
    // block_q1_0: d, qs[16]: one sign bit per value (set = +d), low bit first
    for (b, y) in block_pairs::<18, 128>(src, dst) {
        let d = f16_to_f32(b[0], b[1]);
        let neg_d = -d;
        for (&byte, values) in b[2..].iter().zip(y.chunks_exact_mut(8)) {
            for (bit, value) in values.iter_mut().enumerate() {
                *value = if (byte >> bit) & 1 != 0 { d } else { neg_d };
            }
        }
    }
}

fn q2_0(src: &[u8], dst: &mut [f32]) {
    // block_q2_0: d, qs[16]: 2-bit codes {0,1,2,3} → {-1,0,+1,+2} * d, 4 per byte, low bits first
    for (b, y) in block_pairs::<18, 64>(src, dst) {
        let d = f16_to_f32(b[0], b[1]);
        for (&byte, values) in b[2..].iter().zip(y.chunks_exact_mut(4)) {
            for (slot, value) in values.iter_mut().enumerate() {
                let q = (byte >> (2 * slot)) & 0x03;
                *value = (i32::from(q) - 1) as f32 * d;
            }
        }
    }
}

/// One base-3 digit of a TQ1_0 byte (the byte holds a fixed-point fraction of 3^5).
#[inline]
fn tq1_digit(byte: u8, pow3: u8) -> f32 {
    let q = byte.wrapping_mul(pow3);
    let xi = (u16::from(q) * 3) >> 8;
    (i32::from(xi) - 1) as f32
}

fn tq1_0(src: &[u8], dst: &mut [f32]) {
    // block_tq1_0: qs[48] (5 ternary digits per byte), qh[4] (4 digits per byte), d
    const POW3: [u8; 5] = [1, 3, 9, 27, 81];
    for (b, y) in block_pairs::<54, 256>(src, dst) {
        let d = f16_to_f32(b[52], b[53]);
        // Digits come out in ggml's order: for each power of 3, a run over the bytes of a group
        // (32 bytes, then 16, then the 4 qh bytes with only 4 digits each).
        let groups: [(&[u8], &[u8]); 3] = [
            (&b[0..32], &POW3),
            (&b[32..48], &POW3),
            (&b[48..52], &POW3[..4]),
        ];
        let mut out = y.iter_mut();
        for (bytes, powers) in groups {
            for &pow3 in powers {
                for (&byte, value) in bytes.iter().zip(out.by_ref()) {
                    *value = tq1_digit(byte, pow3) * d;
                }
            }
        }
    }
}

fn tq2_0(src: &[u8], dst: &mut [f32]) {
    // block_tq2_0: qs[64] (2-bit codes {0,1,2} → {-1,0,+1}), d
    for (b, y) in block_pairs::<66, 256>(src, dst) {
        let d = f16_to_f32(b[64], b[65]);
        let mut out = 0;
        for j in (0..64).step_by(32) {
            for l in 0..4 {
                for m in 0..32 {
                    let q = (b[j + m] >> (2 * l)) & 3;
                    y[out] = (i32::from(q) - 1) as f32 * d;
                    out += 1;
                }
            }
        }
    }
}

/// 2^exponent for a normal-range exponent, built from its bits (exact, like ggml's ldexpf).
#[inline]
fn pow2(exponent: i32) -> f32 {
    f32::from_bits(((exponent + 127) as u32) << 23)
}

/// Half of an E8M0 scale (`ggml_e8m0_to_fp32_half`): MXFP4's code book is stored doubled.
#[inline]
fn e8m0_to_f32_half(e: u8) -> f32 {
    if e < 2 {
        f32::from_bits(0x0020_0000 << e)
    } else {
        f32::from_bits(u32::from(e - 1) << 23)
    }
}

/// Half of a UE4M3 scale (`ggml_ue4m3_to_fp32`), for NVFP4's doubled code book.
#[inline]
fn ue4m3_to_f32_half(x: u8) -> f32 {
    if x == 0 || x == 0x7F {
        return 0.0;
    }
    let exponent = i32::from((x >> 3) & 0xF);
    let mantissa = f32::from(x & 0x7);
    let raw = if exponent == 0 {
        mantissa * pow2(-9)
    } else {
        (1.0 + mantissa / 8.0) * pow2(exponent - 7)
    };
    raw * 0.5
}

fn mxfp4(src: &[u8], dst: &mut [f32]) {
    // block_mxfp4: e (E8M0), qs[16]
    for (b, y) in block_pairs::<17, 32>(src, dst) {
        let d = e8m0_to_f32_half(b[0]);
        for j in 0..16 {
            y[j] = f32::from(KVALUES_FP4[usize::from(b[1 + j] & 0x0F)]) * d;
            y[j + 16] = f32::from(KVALUES_FP4[usize::from(b[1 + j] >> 4)]) * d;
        }
    }
}

fn nvfp4(src: &[u8], dst: &mut [f32]) {
    // block_nvfp4: d[4] (UE4M3, one per 16 values), qs[32]
    for (b, y) in block_pairs::<36, 64>(src, dst) {
        for sub in 0..4 {
            let d = ue4m3_to_f32_half(b[sub]);
            let qs = &b[4 + 8 * sub..4 + 8 * sub + 8];
            let yb = &mut y[16 * sub..16 * sub + 16];
            for j in 0..8 {
                yb[j] = f32::from(KVALUES_FP4[usize::from(qs[j] & 0x0F)]) * d;
                yb[j + 8] = f32::from(KVALUES_FP4[usize::from(qs[j] >> 4)]) * d;
            }
        }
    }
}

/// Where a floating-point field sits in a block.
#[derive(Clone, Copy)]
enum FieldKind {
    F32At(usize),
    F16At(usize),
    Bf16At(usize),
    /// IQ1_M's f16 scale, spread over the top nibbles of the four scale words.
    Iq1mScale,
    /// MXFP4's E8M0 exponent byte; read as the largest weight it can produce (scale x 12), since
    /// the scale itself is always finite but can make weights overflow.
    E8m0At(usize),
}

/// A floating-point field of a block that must be finite.
#[derive(Clone, Copy)]
pub(super) struct ScaleField {
    pub(super) name: &'static str,
    kind: FieldKind,
}

const fn field(name: &'static str, kind: FieldKind) -> ScaleField {
    ScaleField { name, kind }
}

impl ScaleField {
    /// The field's value in `block` (exactly one block of the type it was listed for).
    pub(super) fn read(&self, block: &[u8]) -> f32 {
        match self.kind {
            FieldKind::F32At(at) => f32::from_bits(u32::from_le_bytes([
                block[at],
                block[at + 1],
                block[at + 2],
                block[at + 3],
            ])),
            FieldKind::F16At(at) => f16_to_f32(block[at], block[at + 1]),
            FieldKind::Bf16At(at) => bf16_to_f32(block[at], block[at + 1]),
            FieldKind::Iq1mScale => match block.first_chunk::<56>() {
                Some(b) => f16_bits_to_f32(iq1_m_scale_bits(b)),
                None => f32::NAN,
            },
            FieldKind::E8m0At(at) => e8m0_to_f32_half(block[at]) * 12.0,
        }
    }

    /// Overwrite the field with a random finite value: F32/F16/BF16 elements uniform in [-1, 1),
    /// scales ±m·2^e with e in [-10, -4] (|value| in [2^-10, 2^-3)).
    fn randomize(&self, block: &mut [u8], rng: &mut SplitMix64) {
        let bits = rng.next_u64();
        // f16 with sign, exponent field 5..=11 (2^-10 .. 2^-4) and a random mantissa.
        let scale_f16 = ((bits & 1) << 15) as u16
            | (((5 + (bits >> 1) % 7) as u16) << 10)
            | ((bits >> 8) & 0x3ff) as u16;
        match self.kind {
            FieldKind::F32At(at) => {
                let value = rng.next_unit_f32() * 2.0 - 1.0;
                block[at..at + 4].copy_from_slice(&value.to_le_bytes());
            }
            FieldKind::F16At(at) => {
                let value = if self.name == "value" {
                    half::f16::from_f32(rng.next_unit_f32() * 2.0 - 1.0).to_bits()
                } else {
                    scale_f16
                };
                block[at..at + 2].copy_from_slice(&value.to_le_bytes());
            }
            FieldKind::Bf16At(at) => {
                let value = rng.next_unit_f32() * 2.0 - 1.0;
                // Truncation is fine here: any bf16 in range will do.
                let truncated = (value.to_bits() >> 16) as u16;
                block[at..at + 2].copy_from_slice(&truncated.to_le_bytes());
            }
            FieldKind::E8m0At(at) => {
                // 2^(e - 128) for e in 117..=124: 2^-11 ..= 2^-4.
                block[at] = 117 + (bits % 8) as u8;
            }
            FieldKind::Iq1mScale => {
                for (word, nibble) in (0..4).map(|k| (48 + 2 * k, (scale_f16 >> (4 * k)) & 0xF)) {
                    let old = u16::from_le_bytes([block[word], block[word + 1]]);
                    let new = (old & 0x0FFF) | (nibble << 12);
                    block[word..word + 2].copy_from_slice(&new.to_le_bytes());
                }
            }
        }
    }
}

/// The floating-point fields of one block of `ty` (empty for NVFP4, whose UE4M3 scales and codes
/// give finite weights for every byte, and for the unsupported types).
pub(super) fn scale_fields(ty: GgmlType) -> &'static [ScaleField] {
    use FieldKind::*;
    use GgmlType::*;
    const F32_VALUE: &[ScaleField] = &[field("value", F32At(0))];
    const F16_VALUE: &[ScaleField] = &[field("value", F16At(0))];
    const BF16_VALUE: &[ScaleField] = &[field("value", Bf16At(0))];
    const D_AT_0: &[ScaleField] = &[field("d", F16At(0))];
    const D_M: &[ScaleField] = &[field("d", F16At(0)), field("m", F16At(2))];
    const D_DMIN: &[ScaleField] = &[field("d", F16At(0)), field("dmin", F16At(2))];
    const Q2_K_FIELDS: &[ScaleField] = &[field("d", F16At(80)), field("dmin", F16At(82))];
    const Q3_K_FIELDS: &[ScaleField] = &[field("d", F16At(108))];
    const Q6_K_FIELDS: &[ScaleField] = &[field("d", F16At(208))];
    const IQ1_M_FIELDS: &[ScaleField] = &[field("d", Iq1mScale)];
    const TQ1_0_FIELDS: &[ScaleField] = &[field("d", F16At(52))];
    const TQ2_0_FIELDS: &[ScaleField] = &[field("d", F16At(64))];
    const MXFP4_FIELDS: &[ScaleField] = &[field("e (largest weight)", E8m0At(0))];
    match ty {
        F32 => F32_VALUE,
        F16 => F16_VALUE,
        BF16 => BF16_VALUE,
        Q4_0 | Q5_0 | Q8_0 | IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ1_S | IQ4_NL
        | IQ4_XS | Q1_0 | Q2_0 => D_AT_0,
        Q4_1 | Q5_1 => D_M,
        Q4_K | Q5_K => D_DMIN,
        Q2_K => Q2_K_FIELDS,
        Q3_K => Q3_K_FIELDS,
        Q6_K => Q6_K_FIELDS,
        IQ1_M => IQ1_M_FIELDS,
        TQ1_0 => TQ1_0_FIELDS,
        TQ2_0 => TQ2_0_FIELDS,
        MXFP4 => MXFP4_FIELDS,
        NVFP4 | Q8_1 | Q8_K | I8 | I16 | I32 | I64 | F64 => &[],
    }
}

/// Give every floating-point field of `block` a random finite value.
pub(super) fn randomize_scales(ty: GgmlType, block: &mut [u8], rng: &mut SplitMix64) {
    for field in scale_fields(ty) {
        field.randomize(block, rng);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn branch_free_f16_conversion_is_exact_for_every_bit_pattern() {
        for bits in 0..=u16::MAX {
            let expected = half::f16::from_bits(bits).to_f32();
            let actual = f16_bits_to_f32(bits);
            if expected.is_nan() {
                assert!(actual.is_nan(), "{bits:#06x}");
                assert_eq!(
                    actual.to_bits() & 0x003F_FFFF,
                    expected.to_bits() & 0x003F_FFFF
                );
            } else {
                assert_eq!(actual.to_bits(), expected.to_bits(), "{bits:#06x}");
            }
        }
    }

    #[test]
    fn ksigns_table_is_seven_bits_plus_even_parity() {
        for (index, &signs) in KSIGNS_IQ2XS.iter().enumerate() {
            assert_eq!(usize::from(signs & 0x7F), index);
            assert_eq!(signs.count_ones() % 2, 0, "entry {index}");
        }
    }
}
