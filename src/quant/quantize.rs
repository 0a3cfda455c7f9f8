//! Reference quantizers for building synthetic models and test data.
//!
//! F32, F16, BF16, Q8_0, Q4_0, Q1_0, Q2_0 and IQ4_NL follow the quantizers `ggml_quantize_chunk`
//! uses when no importance matrix is given (`quantize_row_*_ref`, and for IQ4_NL the scale search
//! of `quantize_row_iq4_nl_impl` with 7 tries) operation by operation, so
//! their output is byte-identical to ggml's (checked against ggml-made vectors in
//! `tests/quant_vectors.rs`). Other types are not offered: their ggml quantizers search over
//! scales and would take far more code than the tests and synthetic models need.

use super::{QuantError, block_count};
use crate::gguf::GgmlType;

/// True when [`quantize`] can produce `ty`.
pub fn is_quantize_supported(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::F32
            | GgmlType::F16
            | GgmlType::BF16
            | GgmlType::Q8_0
            | GgmlType::Q4_0
            | GgmlType::Q1_0
            | GgmlType::Q2_0
            | GgmlType::IQ4_NL
    )
}

/// Quantize `src` (a whole number of blocks of `ty`) into `dst` (exactly the packed size).
///
/// Non-finite input values are refused (`NonFinite` naming the first bad block): a NaN would
/// otherwise be baked silently into a scale.
pub fn quantize(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    if !is_quantize_supported(ty) {
        return Err(QuantError::Unsupported(ty));
    }
    block_count(ty, dst.len(), src.len())?;
    if let Some(bad) = src.iter().position(|value| !value.is_finite()) {
        return Err(QuantError::NonFinite {
            ty,
            block: bad / ty.block_size(),
            field: "input value",
        });
    }
    match ty {
        GgmlType::F32 => {
            for (bytes, value) in dst.as_chunks_mut::<4>().0.iter_mut().zip(src) {
                *bytes = value.to_le_bytes();
            }
        }
        GgmlType::F16 => {
            for (bytes, value) in dst.as_chunks_mut::<2>().0.iter_mut().zip(src) {
                *bytes = half::f16::from_f32(*value).to_le_bytes();
            }
        }
        GgmlType::BF16 => {
            for (bytes, value) in dst.as_chunks_mut::<2>().0.iter_mut().zip(src) {
                *bytes = f32_to_bf16_bits(*value).to_le_bytes();
            }
        }
        GgmlType::Q8_0 => quantize_q8_0(src, dst),
        GgmlType::Q4_0 => quantize_q4_0(src, dst),
        GgmlType::Q1_0 => quantize_q1_0(src, dst),
        GgmlType::Q2_0 => quantize_q2_0(src, dst),
        GgmlType::IQ4_NL => quantize_iq4_nl(src, dst),
        _ => return Err(QuantError::Unsupported(ty)),
    }
    Ok(())
}

/// f32 → bf16 with round-to-nearest-even (`ggml_compute_fp32_to_bf16`; inputs are finite here).
fn f32_to_bf16_bits(value: f32) -> u16 {
    let bits = value.to_bits();
    ((bits + (0x7fff + ((bits >> 16) & 1))) >> 16) as u16
}

/// `quantize_row_q8_0_ref`: d = amax / 127, codes round(x / d) (half away from zero, as `roundf`).
fn quantize_q8_0(src: &[f32], dst: &mut [u8]) {
    for (block, x) in dst
        .as_chunks_mut::<34>()
        .0
        .iter_mut()
        .zip(src.as_chunks::<32>().0)
    {
        let amax = x.iter().fold(0.0f32, |amax, v| amax.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        block[0..2].copy_from_slice(&half::f16::from_f32(d).to_le_bytes());
        for (code, value) in block[2..].iter_mut().zip(x) {
            *code = ((value * id).round() as i8) as u8;
        }
    }
}

/// `quantize_row_q4_0_ref`: d = (value of largest magnitude) / -8, codes trunc(x / d + 8.5)
/// capped at 15; the first 16 values go to the low nibbles, the last 16 to the high ones.
fn quantize_q4_0(src: &[f32], dst: &mut [u8]) {
    for (block, x) in dst
        .as_chunks_mut::<18>()
        .0
        .iter_mut()
        .zip(src.as_chunks::<32>().0)
    {
        let mut amax = 0.0f32;
        let mut max = 0.0f32;
        for &value in x {
            if amax < value.abs() {
                amax = value.abs();
                max = value;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        block[0..2].copy_from_slice(&half::f16::from_f32(d).to_le_bytes());
        for j in 0..16 {
            let low = ((x[j] * id + 8.5) as i8).min(15) as u8;
            let high = ((x[j + 16] * id + 8.5) as i8).min(15) as u8;
            block[2 + j] = low | (high << 4);
        }
    }
}

/// `quantize_row_q1_0_ref`: d = mean |x| (summed in index order), one bit per value: set for
/// x >= 0 (+d), clear for x < 0 (-d).
fn quantize_q1_0(src: &[f32], dst: &mut [u8]) {
    for (block, x) in dst
        .as_chunks_mut::<18>()
        .0
        .iter_mut()
        .zip(src.as_chunks::<128>().0)
    {
        let mut sum_abs = 0.0f32;
        for value in x {
            sum_abs += value.abs();
        }
        let d = sum_abs / 128.0;
        block[0..2].copy_from_slice(&half::f16::from_f32(d).to_le_bytes());
        for (byte, values) in block[2..].iter_mut().zip(x.chunks_exact(8)) {
            *byte = 0;
            for (bit, value) in values.iter().enumerate() {
                if *value >= 0.0 {
                    *byte |= 1 << bit;
                }
            }
        }
    }
}

/// `quantize_row_q2_0_ref`: d = max |x|, code round(x / d) + 1 clamped to 0..=3 (so codes mean
/// {-1, 0, +1, +2} * d; this quantizer never needs +2), four codes per byte, low bits first.
fn quantize_q2_0(src: &[f32], dst: &mut [u8]) {
    for (block, x) in dst
        .as_chunks_mut::<18>()
        .0
        .iter_mut()
        .zip(src.as_chunks::<64>().0)
    {
        let amax = x.iter().fold(
            0.0f32,
            |amax, v| if v.abs() > amax { v.abs() } else { amax },
        );
        let d = amax;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        block[0..2].copy_from_slice(&half::f16::from_f32(d).to_le_bytes());
        for (byte, values) in block[2..].iter_mut().zip(x.chunks_exact(4)) {
            *byte = 0;
            for (slot, value) in values.iter().enumerate() {
                let code = ((value * id).round() as i32 + 1).clamp(0, 3) as u8;
                *byte |= code << (2 * slot);
            }
        }
    }
}

/// Index of the code-book entry nearest to `x` (`best_index_int8`; ties go to the upper entry).
fn nearest_code(values: &[i8; 16], x: f32) -> usize {
    if x <= f32::from(values[0]) {
        return 0;
    }
    if x >= f32::from(values[15]) {
        return 15;
    }
    let (mut low, mut high) = (0usize, 15usize);
    while high - low > 1 {
        let middle = (low + high) / 2;
        if x < f32::from(values[middle]) {
            high = middle;
        } else {
            low = middle;
        }
    }
    if x - f32::from(values[high - 1]) < f32::from(values[high]) - x {
        high - 1
    } else {
        high
    }
}

/// IQ4_NL as `ggml_quantize_chunk` makes it without an importance matrix
/// (`quantize_row_iq4_nl_impl`, super-block = block = 32, 7 tries): weights x², a first scale
/// from the largest value, then the best of 15 trial scales by weighted least squares.
fn quantize_iq4_nl(src: &[f32], dst: &mut [u8]) {
    use super::iq_tables::KVALUES_IQ4NL as VALUES;
    const TRIES: i32 = 7;
    const GROUP_MAX_EPS: f32 = 1e-15;
    for (block, x) in dst
        .as_chunks_mut::<18>()
        .0
        .iter_mut()
        .zip(src.as_chunks::<32>().0)
    {
        let weight: [f32; 32] = std::array::from_fn(|j| x[j] * x[j]);
        let mut amax = 0.0f32;
        let mut max = 0.0f32;
        for &value in x {
            if value.abs() > amax {
                amax = value.abs();
                max = value;
            }
        }
        let first = f32::from(VALUES[0]);
        // Weighted sums of q·x and q² for the codes nearest to x·inverse_scale.
        let sums = |inverse_scale: f32| {
            let mut sum_qx = 0.0f32;
            let mut sum_q2 = 0.0f32;
            for (value, w) in x.iter().zip(&weight) {
                let q = f32::from(VALUES[nearest_code(&VALUES, inverse_scale * value)]);
                sum_qx += w * q * value;
                sum_q2 += w * q * q;
            }
            (sum_qx, sum_q2)
        };
        let scale = if amax < GROUP_MAX_EPS {
            0.0
        } else {
            let (sum_qx, sum_q2) = sums(1.0 / (-max / first));
            let mut d = if sum_q2 > 0.0 { sum_qx / sum_q2 } else { 0.0 };
            let mut best = d * sum_qx;
            for attempt in -TRIES..=TRIES {
                let (sum_qx, sum_q2) = sums((attempt as f32 + first) / max);
                if sum_q2 > 0.0 && sum_qx * sum_qx > best * sum_q2 {
                    d = sum_qx / sum_q2;
                    best = d * sum_qx;
                }
            }
            d
        };
        block[0..2].copy_from_slice(&half::f16::from_f32(scale).to_le_bytes());
        let inverse = if scale != 0.0 { 1.0 / scale } else { 0.0 };
        for j in 0..16 {
            let low = nearest_code(&VALUES, inverse * x[j]) as u8;
            let high = nearest_code(&VALUES, inverse * x[j + 16]) as u8;
            block[2 + j] = low | (high << 4);
        }
    }
}
