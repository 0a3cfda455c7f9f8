//! Hyper-connections (model-spec §2.4): the wide residual holds `hc_count` streams of H values
//! (stream-major). A mixer reads a gated mean of the normalised streams; the block's output is added
//! back to every raw stream with a per-stream weight in (0, 2).

use super::ModelError;
use super::ops::{rmsnorm_grouped, sigmoid, silu};
use super::weights::HcWeights;

/// Computes the mixer input `x_in` (H) and, when the module has an inject weight, the per-stream
/// weights `alpha` (`hc_count`).
pub fn hc_mix(
    w: &HcWeights,
    wide: &[f32],
    n_embd: usize,
    hc_count: usize,
    eps: f32,
    x_in: &mut [f32],
    alpha: &mut [f32],
) -> Result<(), ModelError> {
    let mut normed = vec![0.0f32; wide.len()];
    rmsnorm_grouped(wide, &w.norm, n_embd, eps, &mut normed);

    let scale = 1.0 / hc_count as f32;
    let mut low = vec![0.0f32; w.down.rows];
    w.down.matvec(&normed, &mut low)?;
    for v in low.iter_mut() {
        // The reference divides by hc_count before the SiLU.
        *v = silu(*v * scale);
    }
    let mut gates = vec![0.0f32; w.up.rows];
    w.up.matvec(&low, &mut gates)?;

    for (j, out) in x_in.iter_mut().enumerate().take(n_embd) {
        let mut sum = 0.0f32;
        for s in 0..hc_count {
            let i = s * n_embd + j;
            sum += sigmoid(gates[i]) * normed[i];
        }
        *out = sum * scale;
    }

    if let Some(inject) = &w.inject {
        let mut raw = vec![0.0f32; hc_count];
        inject.matvec(&normed, &mut raw)?;
        for (a, r) in alpha.iter_mut().zip(raw) {
            *a = 2.0 * sigmoid(r * scale);
        }
    }
    Ok(())
}

/// `X_s ← X_s + alpha_s · y` for every stream s (adds to the raw residual).
pub fn hc_combine(wide: &mut [f32], alpha: &[f32], y: &[f32]) {
    let n_embd = y.len();
    for (stream, &a) in wide.chunks_mut(n_embd).zip(alpha) {
        for (x, &v) in stream.iter_mut().zip(y) {
            *x += a * v;
        }
    }
}
