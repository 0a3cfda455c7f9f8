//! How a weight's blocks are laid out in VRAM.
//!
//! Most types are uploaded in their GGUF block format as they are. A few are **split** on upload:
//! each block's head (its f16 scale `d`; for IQ4_XS, IQ1_M, Q4_K and Q5_K the sub-block scales
//! (and mins) stored beside it or holding it) moves to a plane of its own after all the blocks' other bytes, so the
//! remaining block body is a multiple of 16 bytes (or of 4) and the mat-vec can read it with
//! aligned 16-byte loads (GGUF blocks of 34, 136 or 210 bytes are only 2-byte aligned). Only the place of the bytes changes,
//! never a value: the kernels dequantize exactly what the GGUF block holds.
//!
//! A part of `n` rows of a split type is `[n bodies rows][n head rows]`: row `r`'s body starts at
//! byte `r * body_row_bytes`, its heads at `d_base + r * blocks_per_row * head_bytes`.

use crate::gguf::types::GgmlType;

/// Where a split type keeps its head (the f16 scale `d` first) inside a GGUF block, and the
/// block's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitD {
    /// Byte offset of the head (the bytes holding `d`) inside the GGUF block.
    pub d_offset: usize,
    /// Bytes of the head: 2 (`d` alone), 8 (IQ4_XS: `d`, `scales_h`, `scales_l`; IQ1_M: its
    /// scales, `d` in their top nibbles) or 16 (Q4_K, Q5_K: `d`, `dmin`, scales and mins).
    pub head_bytes: usize,
    /// GGUF block size in bytes.
    pub block_bytes: usize,
}

impl SplitD {
    /// A split of the f16 `d` alone at `d_offset`.
    const fn d(d_offset: usize, block_bytes: usize) -> Self {
        Self {
            d_offset,
            head_bytes: 2,
            block_bytes,
        }
    }

    /// Bytes of a block without its head.
    pub fn body_bytes(&self) -> usize {
        self.block_bytes - self.head_bytes
    }

    /// Whether block bodies sit on 16-byte boundaries, so the kernel reads them as vec4 (binding
    /// `W4`); otherwise it reads words.
    pub fn vec4_bodies(&self) -> bool {
        self.body_bytes().is_multiple_of(16)
    }
}

/// The split layout of `ty`, or `None` when it is uploaded as GGUF blocks.
pub fn split_d(ty: GgmlType) -> Option<SplitD> {
    match ty {
        GgmlType::Q8_0 => Some(SplitD::d(0, 34)),
        GgmlType::Q6_K => Some(SplitD::d(208, 210)),
        GgmlType::IQ4_NL => Some(SplitD::d(0, 18)),
        GgmlType::IQ3_S => Some(SplitD::d(0, 110)),
        GgmlType::IQ3_XXS => Some(SplitD::d(0, 98)),
        GgmlType::IQ2_S => Some(SplitD::d(0, 82)),
        GgmlType::IQ2_XS => Some(SplitD::d(0, 74)),
        GgmlType::Q2_0 => Some(SplitD::d(0, 18)),
        GgmlType::IQ1_S => Some(SplitD::d(0, 50)),
        // The K types with mins: d, dmin and the packed scales and mins.
        GgmlType::Q4_K => Some(SplitD {
            d_offset: 0,
            head_bytes: 16,
            block_bytes: 144,
        }),
        GgmlType::Q5_K => Some(SplitD {
            d_offset: 0,
            head_bytes: 16,
            block_bytes: 176,
        }),
        // IQ1_M has no d field: its head is the 8 scale bytes, whose top nibbles hold d.
        GgmlType::IQ1_M => Some(SplitD {
            d_offset: 48,
            head_bytes: 8,
            block_bytes: 56,
        }),
        GgmlType::IQ4_XS => Some(SplitD {
            d_offset: 0,
            head_bytes: 8,
            block_bytes: 136,
        }),
        _ => None,
    }
}

/// Byte sizes of a part of `n_rows` rows of `blocks_per_row` blocks each in the split layout:
/// (body bytes per row, offset of the d plane).
pub fn split_sizes(split: SplitD, blocks_per_row: usize, n_rows: usize) -> (usize, usize) {
    let body_row = blocks_per_row * split.body_bytes();
    // The d plane starts on a 16-byte boundary, like everything a kernel reads as vec4.
    let d_base = (body_row * n_rows).div_ceil(16) * 16;
    (body_row, d_base)
}

/// Bytes of one row's heads.
pub fn head_row_bytes(split: SplitD, blocks_per_row: usize) -> usize {
    blocks_per_row * split.head_bytes
}

/// Total bytes of a part of `n_rows` rows in the split layout (padded to 16).
pub fn split_part_bytes(split: SplitD, blocks_per_row: usize, n_rows: usize) -> usize {
    let (_, d_base) = split_sizes(split, blocks_per_row, n_rows);
    (d_base + n_rows * head_row_bytes(split, blocks_per_row)).div_ceil(16) * 16
}

/// Rearrange `data` (whole GGUF rows) into the split layout of a part of `n_rows` rows.
pub fn split_rows(split: SplitD, blocks_per_row: usize, n_rows: usize, data: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; split_part_bytes(split, blocks_per_row, n_rows)];
    write_split_rows(split, blocks_per_row, n_rows, 0, data, &mut out);
    out
}

/// One GGUF row `src` in the split layout: its block bodies into `body`, its heads into `d`.
pub fn split_row(split: SplitD, src: &[u8], body: &mut [u8], d: &mut [u8]) {
    let bb = split.body_bytes();
    let blocks = src.chunks_exact(split.block_bytes);
    for ((block, out), dd) in blocks
        .zip(body.chunks_exact_mut(bb))
        .zip(d.chunks_exact_mut(split.head_bytes))
    {
        let (before, rest) = block.split_at(split.d_offset);
        let (scale, after) = rest.split_at(split.head_bytes);
        out[..before.len()].copy_from_slice(before);
        out[before.len()..].copy_from_slice(after);
        dd.copy_from_slice(scale);
    }
}

/// Write rows `first_row..` (as many as `data` holds) of a split part of `n_rows` rows into `out`,
/// which holds the whole part.
pub fn write_split_rows(
    split: SplitD,
    blocks_per_row: usize,
    n_rows: usize,
    first_row: usize,
    data: &[u8],
    out: &mut [u8],
) {
    let (body_row, d_base) = split_sizes(split, blocks_per_row, n_rows);
    let body = split.body_bytes();
    let head = split.head_bytes;
    let first_block = first_row * blocks_per_row;
    for (i, block) in data.chunks_exact(split.block_bytes).enumerate() {
        let b = first_block + i;
        let dst = b * body;
        let (before, rest) = block.split_at(split.d_offset);
        let (d, after) = rest.split_at(head);
        out[dst..dst + before.len()].copy_from_slice(before);
        out[dst + before.len()..dst + body].copy_from_slice(after);
        out[d_base + head * b..d_base + head * (b + 1)].copy_from_slice(d);
    }
    debug_assert!(body_row * n_rows <= d_base);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_moves_only_d() {
        let split = SplitD::d(208, 210);
        let data: Vec<u8> = (0..210 * 6).map(|i| (i * 7 % 251) as u8).collect();
        let out = split_rows(split, 2, 3, &data);
        let (body_row, d_base) = split_sizes(split, 2, 3);
        assert_eq!(body_row, 416);
        assert_eq!(d_base % 16, 0);
        for b in 0..6 {
            assert_eq!(&out[b * 208..b * 208 + 208], &data[b * 210..b * 210 + 208]);
            assert_eq!(
                &out[d_base + 2 * b..d_base + 2 * b + 2],
                &data[b * 210 + 208..b * 210 + 210]
            );
        }
    }

    #[test]
    fn split_with_leading_d() {
        let split = split_d(GgmlType::Q8_0).unwrap_or(SplitD::d(0, 34));
        let data: Vec<u8> = (0..34 * 4).map(|i| (i % 253) as u8).collect();
        let out = split_rows(split, 4, 1, &data);
        let (_, d_base) = split_sizes(split, 4, 1);
        for b in 0..4 {
            assert_eq!(&out[b * 32..b * 32 + 32], &data[b * 34 + 2..b * 34 + 34]);
            assert_eq!(
                &out[d_base + 2 * b..d_base + 2 * b + 2],
                &data[b * 34..b * 34 + 2]
            );
        }
    }

    #[test]
    fn split_moves_a_whole_head() {
        let split = split_d(GgmlType::IQ4_XS).unwrap_or(SplitD::d(0, 136));
        assert_eq!((split.head_bytes, split.body_bytes()), (8, 128));
        let data: Vec<u8> = (0..136 * 6).map(|i| (i * 5 % 241) as u8).collect();
        let out = split_rows(split, 3, 2, &data);
        let (body_row, d_base) = split_sizes(split, 3, 2);
        assert_eq!(body_row, 384);
        for b in 0..6 {
            assert_eq!(
                &out[b * 128..b * 128 + 128],
                &data[b * 136 + 8..b * 136 + 136]
            );
            assert_eq!(
                &out[d_base + 8 * b..d_base + 8 * b + 8],
                &data[b * 136..b * 136 + 8]
            );
        }
    }
}
