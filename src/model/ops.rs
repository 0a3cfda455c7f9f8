//! CPU twins of the GPU kernels: one plain function per op, with the inputs and outputs a kernel has.
//!
//! Everything is f32 and every reduction is a sequential sum in index order, so a result depends only
//! on its inputs (DEVELOPERS.md rule 1). The GPU kernels are validated against these functions.

/// `1 / sqrt(mean(x²) + eps)`, the scale every RMSNorm applies.
pub fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let mut sum_sq = 0.0f32;
    for &v in x {
        sum_sq += v * v;
    }
    let mean = sum_sq / x.len().max(1) as f32;
    1.0 / (mean + eps).sqrt()
}

/// Centred RMSNorm with a GGUF weight that already holds `1 + w` (model-spec §3.3: never add 1 again).
/// `out = x * rms_scale(x) * weight`.
pub fn rmsnorm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let scale = rms_scale(x, eps);
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = v * scale * w;
    }
}

/// Grouped centred RMSNorm: the mean of squares is taken over each `group`-sized slice separately
/// while `weight` spans the whole vector (every 4H-wide norm of the trunk: hc norms, PLE norms).
pub fn rmsnorm_grouped(x: &[f32], weight: &[f32], group: usize, eps: f32, out: &mut [f32]) {
    let group = group.max(1);
    for ((xs, ws), os) in x
        .chunks(group)
        .zip(weight.chunks(group))
        .zip(out.chunks_mut(group))
    {
        rmsnorm(xs, ws, eps, os);
    }
}

/// Plain gated RMSNorm of the GDN output: `out = x * rms_scale(x) * weight * sigmoid(gate)`.
/// The weight is NOT folded (`ssm_norm` is stored as is).
pub fn rmsnorm_gated(x: &[f32], weight: &[f32], gate: &[f32], eps: f32, out: &mut [f32]) {
    let scale = rms_scale(x, eps);
    for (((o, &v), &w), &g) in out.iter_mut().zip(x).zip(weight).zip(gate) {
        *o = v * scale * w * sigmoid(g);
    }
}

/// L2 normalisation with the epsilon inside the square root: `x / sqrt(Σx² + eps)`.
pub fn l2norm(x: &mut [f32], eps: f32) {
    let mut sum_sq = 0.0f32;
    for &v in x.iter() {
        sum_sq += v * v;
    }
    let inv = 1.0 / (sum_sq + eps).sqrt();
    for v in x.iter_mut() {
        *v *= inv;
    }
}

pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

pub fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}

/// `log(1 + eˣ)`, returning `x` above 20 like torch so large inputs do not overflow.
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

/// Sequential dot product.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut sum = 0.0f32;
    for (&x, &y) in a.iter().zip(b) {
        sum += x * y;
    }
    sum
}

/// In-place softmax with the max subtracted first (fp32 throughout).
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// Indices of the `k` largest scores, best first; among equal scores the lowest index wins, so the
/// choice is reproducible (torch's CPU top-k leaves ties unspecified). Scores must be finite.
pub fn top_k(scores: &[f32], k: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    // A stable sort keeps ascending index order among equal scores.
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
    order.truncate(k.min(scores.len()));
    order
}

/// Inverse frequencies of a rotary embedding over `rotary_dims` dims, computed the way the reference
/// does it in fp32: `1 / base^(f32(2i) / f32(rotary_dims))`.
pub fn rope_inv_freqs(base: f32, rotary_dims: usize) -> Vec<f32> {
    (0..rotary_dims / 2)
        .map(|i| {
            let exponent = (2 * i) as f32 / rotary_dims as f32;
            let denom = (base as f64).powf(exponent as f64) as f32;
            1.0 / denom
        })
        .collect()
}

/// Host-side cos/sin table row for one position: the angle is the fp32 product `f32(p) * inv_f`
/// (as in the reference), its sine and cosine are taken in f64 and rounded to f32 (GPU sin/cos of
/// angles up to ~2.6e5 rad are too inaccurate, so the GPU reads these tables too).
pub fn rope_cos_sin(position: usize, inv_freqs: &[f32], cos: &mut [f32], sin: &mut [f32]) {
    let p = position as f32;
    for ((c, s), &f) in cos.iter_mut().zip(sin.iter_mut()).zip(inv_freqs) {
        let angle = (p * f) as f64;
        *c = angle.cos() as f32;
        *s = angle.sin() as f32;
    }
}

/// Partial NeoX-style rotary embedding: rotates the pairs `(i, i + half)` for `i < half`, where
/// `half = cos.len()`; dims from `2·half` on are left unchanged.
pub fn rope_apply(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = cos.len();
    if x.len() < 2 * half {
        return;
    }
    let (lo, hi) = x.split_at_mut(half);
    for i in 0..half {
        let a = lo[i];
        let b = hi[i];
        lo[i] = a * cos[i] - b * sin[i];
        hi[i] = b * cos[i] + a * sin[i];
    }
}

/// Signed square root with a floor: `sign(a) · sqrt(max(|a|, floor))`, and 0 for a == 0.
pub fn signed_sqrt(a: f32, floor: f32) -> f32 {
    if a == 0.0 {
        0.0
    } else {
        a.signum() * a.abs().max(floor).sqrt()
    }
}

/// `y += alpha * x`.
pub fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    for (o, &v) in y.iter_mut().zip(x) {
        *o += alpha * v;
    }
}

/// Index of the first non-finite value, if any.
pub fn first_non_finite(x: &[f32]) -> Option<usize> {
    x.iter().position(|v| !v.is_finite())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_prefers_lowest_index_on_ties() {
        let scores = [0.0, 3.0, 1.0, 3.0, 0.0, 1.0];
        assert_eq!(top_k(&scores, 4), vec![1, 3, 2, 5]);
        assert_eq!(top_k(&scores, 10).len(), 6);
    }

    #[test]
    fn softplus_is_stable_and_matches_definition() {
        assert_eq!(softplus(50.0), 50.0);
        assert!((softplus(0.0) - std::f32::consts::LN_2).abs() < 1e-7);
        assert!(softplus(-100.0) >= 0.0);
    }

    #[test]
    fn rope_rotates_only_the_rotary_prefix() {
        let inv = rope_inv_freqs(10000.0, 4);
        let (mut c, mut s) = (vec![0.0; 2], vec![0.0; 2]);
        rope_cos_sin(3, &inv, &mut c, &mut s);
        let mut x = vec![1.0, 0.0, 0.0, 0.0, 7.0];
        rope_apply(&mut x, &c, &s);
        assert!((x[0] - 3.0f32.cos()).abs() < 1e-6);
        assert!((x[2] - 3.0f32.sin()).abs() < 1e-6);
        assert_eq!(x[4], 7.0);
    }

    #[test]
    fn grouped_norm_uses_one_rms_per_group() {
        let x = [1.0, 1.0, 10.0, 10.0];
        let w = [1.0; 4];
        let mut out = [0.0; 4];
        rmsnorm_grouped(&x, &w, 2, 0.0, &mut out);
        for v in out {
            assert!((v - 1.0).abs() < 1e-6);
        }
    }

    #[test]
    fn signed_sqrt_keeps_sign_and_zero() {
        assert_eq!(signed_sqrt(0.0, 1e-6), 0.0);
        assert_eq!(signed_sqrt(-4.0, 1e-6), -2.0);
        assert!((signed_sqrt(1e-9, 1e-6) - 1e-3).abs() < 1e-9);
    }
}
