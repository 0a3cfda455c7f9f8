//! Gated DeltaNet layer (model-spec §2.6), recurrent form, one token per call. The conv history and
//! the per-head delta-rule state carry across calls, so any split of a prompt into calls gives the
//! same bits.

use rayon::prelude::*;

use super::ModelError;
use super::config::Config;
use super::ops::{l2norm, rmsnorm_gated, sigmoid, silu, softplus};
use super::state::GdnState;
use super::weights::GdnWeights;

/// The reference's L2-norm epsilon (inside the square root).
const L2_EPS: f32 = 1e-6;

/// One token through a GDN layer: `x` (H) → `y` (H).
pub fn gdn_forward(
    cfg: &Config,
    w: &GdnWeights,
    state: &mut GdnState,
    x: &[f32],
    y: &mut [f32],
) -> Result<(), ModelError> {
    let d = &cfg.gdn;
    let channels = d.conv_channels();
    let kernel = d.conv_kernel;
    let key_dim = d.key_dim();
    let (dk, dv) = (d.head_k_dim, d.head_v_dim);

    let mut mixed = vec![0.0f32; channels];
    w.qkv.matvec(x, &mut mixed)?;
    let mut z = vec![0.0f32; d.value_dim()];
    w.gate.matvec(x, &mut z)?;
    let mut b = vec![0.0f32; d.n_v_heads];
    w.beta.matvec(x, &mut b)?;
    let mut a = vec![0.0f32; d.n_v_heads];
    w.alpha.matvec(x, &mut a)?;

    // Causal depthwise conv over [history (oldest first), current], then SiLU.
    let mut conv_out = vec![0.0f32; channels];
    for (c, out) in conv_out.iter_mut().enumerate() {
        let taps = &w.conv[c * kernel..(c + 1) * kernel];
        let mut sum = 0.0f32;
        for (k, &tap) in taps.iter().enumerate() {
            let input = if k + 1 == kernel {
                mixed[c]
            } else {
                state.conv[k * channels + c]
            };
            sum += tap * input;
        }
        *out = silu(sum);
    }
    if kernel > 1 {
        state.conv.copy_within(channels.., 0);
        let last = (kernel - 2) * channels;
        state.conv[last..last + channels].copy_from_slice(&mixed);
    }

    let (q_all, rest) = conv_out.split_at_mut(key_dim);
    let (k_all, v_all) = rest.split_at_mut(key_dim);
    let q_scale = 1.0 / (dk as f32).sqrt();
    for q in q_all.chunks_mut(dk) {
        l2norm(q, L2_EPS);
        for v in q.iter_mut() {
            *v *= q_scale;
        }
    }
    for k in k_all.chunks_mut(dk) {
        l2norm(k, L2_EPS);
    }
    let (q_all, k_all, v_all) = (&*q_all, &*k_all, &*v_all);

    // Per value head: decay, delta-rule update, read-out, gated norm. Heads are independent.
    let mut normed = vec![0.0f32; d.value_dim()];
    state
        .ssm
        .par_chunks_mut(dk * dv)
        .zip(normed.par_chunks_mut(dv))
        .enumerate()
        .for_each(|(j, (s, out))| {
            // GGUF (tiled) value-head order: value head j reads key head j % n_k_heads.
            let kh = j % d.n_k_heads;
            let q = &q_all[kh * dk..(kh + 1) * dk];
            let k = &k_all[kh * dk..(kh + 1) * dk];
            let v = &v_all[j * dv..(j + 1) * dv];
            let beta = sigmoid(b[j]);
            let decay = (w.a[j] * softplus(a[j] + w.dt_bias[j])).exp();
            for value in s.iter_mut() {
                *value *= decay;
            }
            let mut delta = vec![0.0f32; dv];
            for (col, dl) in delta.iter_mut().enumerate() {
                let mut predicted = 0.0f32;
                for (i, &ki) in k.iter().enumerate() {
                    predicted += s[i * dv + col] * ki;
                }
                *dl = (v[col] - predicted) * beta;
            }
            for (i, &ki) in k.iter().enumerate() {
                for (col, &dl) in delta.iter().enumerate() {
                    s[i * dv + col] += ki * dl;
                }
            }
            let mut o = vec![0.0f32; dv];
            for (col, oc) in o.iter_mut().enumerate() {
                let mut sum = 0.0f32;
                for (i, &qi) in q.iter().enumerate() {
                    sum += s[i * dv + col] * qi;
                }
                *oc = sum;
            }
            rmsnorm_gated(&o, &w.norm, &z[j * dv..(j + 1) * dv], cfg.rms_eps, out);
        });

    w.out.matvec(&normed, y)
}
