//! GGUF tensor block formats: dequantization bit-identical to ggml's `to_float`, finiteness checks
//! at the point where data enters, deterministic random blocks and a few reference quantizers.
//!
//! Every dequantizer follows the arithmetic of ggml's scalar reference (`ggml-quants.c`)
//! operation by operation — the same f16→f32 conversions, the same association of products such
//! as `(d * scale) * q` and the same integer intermediates — because the project needs
//! bit-identical weights, not merely close ones. `tests/quant_vectors.rs` compares against vectors
//! produced by ggml itself.
//!
//! Supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K … Q6_K, the i-quants IQ1_S …
//! IQ4_XS, and the newer scalar formats Q1_0, Q2_0, TQ1_0, TQ2_0, MXFP4 and NVFP4 (see
//! `docs/quant.md` for what "Q2_0" files are).

mod blocks;
pub(crate) mod iq_tables;
mod quantize;

pub use quantize::{is_quantize_supported, quantize};

use crate::gguf::GgmlType;

/// Why a block operation refused its input.
#[derive(Debug, thiserror::Error)]
pub enum QuantError {
    /// No dequantizer (or quantizer) exists here for this type.
    #[error("tensor type {0} is not supported by strata's block decoder")]
    Unsupported(GgmlType),
    /// The byte and value counts do not describe a whole number of blocks of this type.
    #[error(
        "{ty}: {src_bytes} bytes and {values} values do not match \
         ({block_bytes} bytes per block of {block_values} values)"
    )]
    BadLength {
        ty: GgmlType,
        /// Length of the packed side (bytes).
        src_bytes: usize,
        /// Length of the float side (values).
        values: usize,
        block_bytes: usize,
        block_values: usize,
    },
    /// A scale field (or, for F32/F16/BF16, a value) is NaN or infinite.
    #[error("{ty}: non-finite {field} in block {block}")]
    NonFinite {
        ty: GgmlType,
        /// Index of the first bad block (for F32/F16/BF16: of the first bad element).
        block: usize,
        /// Which field was bad ("d", "dmin", "value", …).
        field: &'static str,
    },
}

/// True when [`dequantize`] (and so [`dot_row`] and [`check_finite`]) handles `ty`.
pub fn is_supported(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        F32 | F16
            | BF16
            | Q4_0
            | Q4_1
            | Q5_0
            | Q5_1
            | Q8_0
            | Q2_K
            | Q3_K
            | Q4_K
            | Q5_K
            | Q6_K
            | IQ2_XXS
            | IQ2_XS
            | IQ2_S
            | IQ3_XXS
            | IQ3_S
            | IQ1_S
            | IQ1_M
            | IQ4_NL
            | IQ4_XS
            | Q1_0
            | Q2_0
            | TQ1_0
            | TQ2_0
            | MXFP4
            | NVFP4
    )
}

/// Number of whole blocks in `src_bytes`, checked against the number of values on the float side.
fn block_count(ty: GgmlType, src_bytes: usize, values: usize) -> Result<usize, QuantError> {
    let bad_length = || QuantError::BadLength {
        ty,
        src_bytes,
        values,
        block_bytes: ty.type_size(),
        block_values: ty.block_size(),
    };
    if !src_bytes.is_multiple_of(ty.type_size()) {
        return Err(bad_length());
    }
    let n_blocks = src_bytes / ty.type_size();
    if n_blocks.checked_mul(ty.block_size()) != Some(values) {
        return Err(bad_length());
    }
    Ok(n_blocks)
}

/// Dequantize `src` (a whole number of blocks) into `dst` (exactly n_blocks * block_size values).
///
/// Bit-identical to ggml's `to_float` for the type. No allocation.
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    if !is_supported(ty) {
        return Err(QuantError::Unsupported(ty));
    }
    block_count(ty, src.len(), dst.len())?;
    blocks::dequantize_checked_lengths(ty, src, dst);
    Ok(())
}

/// Rule 2 of the project: check data where it enters.
///
/// Ok if every block's scale fields (the f16/bf16/f32 values: d, dmin, per-block deltas) are
/// finite; `Err(NonFinite { block, .. })` naming the first bad block otherwise. For F32/F16/BF16
/// every value is checked (and `block` is the element index). Integer codes cannot be non-finite,
/// and every code maps to a finite value once the scales are finite, so checking the scales is
/// enough for the dequantized weights to be finite. The one exception is MXFP4, whose E8M0
/// exponent is always a finite scale but can be so large (e >= 253) that scale x code overflows
/// to infinity; such blocks are reported too. NVFP4 needs no check (every weight is at most 2880).
pub fn check_finite(ty: GgmlType, src: &[u8]) -> Result<(), QuantError> {
    if !is_supported(ty) {
        return Err(QuantError::Unsupported(ty));
    }
    if !src.len().is_multiple_of(ty.type_size()) {
        return Err(QuantError::BadLength {
            ty,
            src_bytes: src.len(),
            values: src.len() / ty.type_size() * ty.block_size(),
            block_bytes: ty.type_size(),
            block_values: ty.block_size(),
        });
    }
    let fields = blocks::scale_fields(ty);
    for (block, bytes) in src.chunks_exact(ty.type_size()).enumerate() {
        for field in fields {
            if !field.read(bytes).is_finite() {
                return Err(QuantError::NonFinite {
                    ty,
                    block,
                    field: field.name,
                });
            }
        }
    }
    Ok(())
}

/// Valid random blocks with finite scales (deterministic from `seed`), for synthetic benchmark
/// models and tests.
///
/// Code bytes are uniformly random (every index, sign and high-bit pattern occurs); f16 scale
/// fields get finite values with |d| in [2^-10, 2^-3), like the oracle's random vectors (MXFP4:
/// 2^-11 ..= 2^-4; NVFP4's UE4M3 scales stay random, every code is small and finite), so
/// dequantized weights stay below ~10^3 in magnitude. F32/F16/BF16 get values uniform in
/// [-1, 1). For a type that [`is_supported`] rejects the bytes are random and nothing is fixed up.
pub fn random_blocks(ty: GgmlType, n_blocks: usize, seed: u64) -> Vec<u8> {
    let mut rng = SplitMix64(seed ^ 0x005E_ED0F_B10C_u64.wrapping_mul(u64::from(ty.id()) + 1));
    let mut out = vec![0u8; n_blocks.saturating_mul(ty.type_size())];
    for byte_group in out.chunks_mut(8) {
        let word = rng.next_u64().to_le_bytes();
        byte_group.copy_from_slice(&word[..byte_group.len()]);
    }
    if is_supported(ty) {
        for block in out.chunks_exact_mut(ty.type_size()) {
            blocks::randomize_scales(ty, block, &mut rng);
        }
    }
    out
}

/// f32 dot of one quantized row with `x`: dequantize into `scratch`, then a sequential f32 sum in
/// index order. This fixed order is the CPU reference that GPU kernels are checked against.
pub fn dot_row(
    ty: GgmlType,
    row: &[u8],
    x: &[f32],
    scratch: &mut Vec<f32>,
) -> Result<f32, QuantError> {
    if !is_supported(ty) {
        return Err(QuantError::Unsupported(ty));
    }
    block_count(ty, row.len(), x.len())?;
    // Every value is overwritten below, so only the length needs setting (no zero-fill when the
    // buffer is reused for rows of the same size).
    scratch.resize(x.len(), 0.0);
    blocks::dequantize_checked_lengths(ty, row, scratch);
    let mut sum = 0.0f32;
    for (weight, value) in scratch.iter().zip(x) {
        sum += weight * value;
    }
    Ok(sum)
}

/// Small deterministic generator (SplitMix64): enough for test data, and stable across platforms
/// and crate versions, unlike a library RNG whose stream may change.
pub(crate) struct SplitMix64(pub(crate) u64);

impl SplitMix64 {
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1) with 24 random bits (exactly representable in f32).
    pub(crate) fn next_unit_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u32 << 24) as f32)
    }
}
