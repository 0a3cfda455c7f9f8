//! The i-quant codebooks for the GPU, taken from the tables `quant` dequantizes with on the CPU
//! (one copy, so the two sides cannot drift), as u32 words: u64 entries low word first.

use crate::gguf::types::GgmlType;
use crate::quant::iq_tables;

use super::GpuError;

fn split_u64(table: &[u64]) -> Vec<u32> {
    table
        .iter()
        .flat_map(|&v| [v as u32, (v >> 32) as u32])
        .collect()
}

/// The codebook of `ty` as u32 words (u64 entries low word first), or None if `ty` has none.
pub fn grid_words(ty: GgmlType) -> Result<Option<Vec<u32>>, GpuError> {
    Ok(match ty {
        GgmlType::IQ2_XXS => Some(split_u64(&iq_tables::IQ2XXS_GRID)),
        GgmlType::IQ2_XS => Some(split_u64(&iq_tables::IQ2XS_GRID)),
        GgmlType::IQ2_S => Some(split_u64(&iq_tables::IQ2S_GRID)),
        GgmlType::IQ3_XXS => Some(iq_tables::IQ3XXS_GRID.to_vec()),
        GgmlType::IQ3_S => Some(iq_tables::IQ3S_GRID.to_vec()),
        GgmlType::IQ1_S | GgmlType::IQ1_M => Some(split_u64(&iq_tables::IQ1S_GRID)),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codebooks_have_the_ggml_sizes_and_word_order() {
        let words = |ty| grid_words(ty).ok().flatten().map_or(0, |w| w.len());
        assert_eq!(words(GgmlType::IQ2_XXS), 2 * 256);
        assert_eq!(words(GgmlType::IQ2_XS), 2 * 512);
        assert_eq!(words(GgmlType::IQ2_S), 2 * 1024);
        assert_eq!(words(GgmlType::IQ3_XXS), 256);
        assert_eq!(words(GgmlType::IQ3_S), 512);
        assert_eq!(words(GgmlType::IQ1_M), 2 * 2048);
        assert!(grid_words(GgmlType::Q8_0).ok().flatten().is_none());
        let iq2 = grid_words(GgmlType::IQ2_XXS)
            .ok()
            .flatten()
            .unwrap_or_default();
        let first = iq_tables::IQ2XXS_GRID[1];
        assert_eq!((iq2[2], iq2[3]), (first as u32, (first >> 32) as u32));
    }
}
