//! Hashed n-gram per-layer embedding (model-spec §2.5), added to the wide residual before the PLE
//! layer's mixer. The 64-bit hashing runs on the host (WGSL has no 64-bit integers).

use super::ModelError;
use super::config::{Config, PleConfig};
use super::ops::{dot, rmsnorm_grouped, sigmoid, signed_sqrt, silu};
use super::state::PleState;
use super::weights::PleWeights;

/// Floor of the signed square root of the attention score.
const SIGNED_SQRT_FLOOR: f32 = 1e-6;

/// The n-gram context of the last token of `tokens`: `[c0, c1, …, c_{n−1}]` where c0 is the token
/// itself and c_s the token s places back — or EOS when that is before the sequence start or when an
/// EOS occurs anywhere in the s tokens before the current one (EOS resets the window).
pub fn ngram_context(tokens: &[u32], ngram_size: usize, eos: u32) -> Vec<u64> {
    let Some((&current, history)) = tokens.split_last() else {
        return vec![eos as u64; ngram_size];
    };
    let mut context = Vec::with_capacity(ngram_size);
    context.push(current as u64);
    let mut reset = false;
    for s in 1..ngram_size {
        let previous = history.len().checked_sub(s).map(|i| history[i]);
        match previous {
            Some(id) if !reset => {
                if id == eos {
                    reset = true;
                }
                context.push(id as u64);
            }
            _ => {
                reset = true;
                context.push(eos as u64);
            }
        }
    }
    context
}

/// Table rows of every hash head for one n-gram context. Heads `(n−2)·heads_per_ngram ..` hash the
/// n-gram of order n: `(XOR_{s<n} c_s·m_s) mod V_h + O_h` (wrapping 64-bit products, which equal the
/// reference's non-negative int64 products).
pub fn hash_rows(cfg: &PleConfig, context: &[u64]) -> Vec<u64> {
    let mut rows = Vec::with_capacity(cfg.n_heads());
    for order in 2..=cfg.ngram_size {
        let mut mix = 0u64;
        for (c, m) in context.iter().zip(&cfg.multipliers).take(order) {
            mix ^= c.wrapping_mul(*m);
        }
        for i in 0..cfg.heads_per_ngram {
            let head = (order - 2) * cfg.heads_per_ngram + i;
            let size = cfg.head_vocab_sizes[head];
            rows.push(mix % size + cfg.head_offsets[head]);
        }
    }
    rows
}

/// Adds the PLE of the last token of `tokens` to `wide` and advances the conv history.
pub fn ple_forward(
    cfg: &Config,
    pc: &PleConfig,
    w: &PleWeights,
    state: &mut PleState,
    tokens: &[u32],
    wide: &mut [f32],
) -> Result<(), ModelError> {
    let h = cfg.n_embd;
    let hc = cfg.hc_count;
    let width = hc * h;
    let eps = cfg.rms_eps;
    let position = tokens.len().saturating_sub(1);

    // Gather the hashed rows.
    let context = ngram_context(tokens, pc.ngram_size, pc.eos_token_id);
    let rows = hash_rows(pc, &context);
    let mut embedding = vec![0.0f32; pc.embed_dim()];
    for (row, out) in rows.iter().zip(embedding.chunks_mut(pc.head_dim)) {
        let row = usize::try_from(*row).unwrap_or(usize::MAX);
        w.table.dequantize_row(row, out)?;
    }

    let mut key = vec![0.0f32; width];
    w.key.matvec(&embedding, &mut key)?;
    let mut key_normed = vec![0.0f32; width];
    rmsnorm_grouped(&key, &w.norm_key, h, eps, &mut key_normed);
    let mut value = vec![0.0f32; h];
    w.value.matvec(&embedding, &mut value)?;
    let mut query_normed = vec![0.0f32; width];
    rmsnorm_grouped(wide, &w.norm_query, h, eps, &mut query_normed);

    // Per stream: gate = σ(signed_sqrt(<K̂_s, Q̂_s> / sqrt(H))), P_s = gate · v.
    let inv_sqrt_h = 1.0 / (h as f32).sqrt();
    let mut gated = vec![0.0f32; width];
    for s in 0..hc {
        let range = s * h..(s + 1) * h;
        let score = dot(&key_normed[range.clone()], &query_normed[range.clone()]) * inv_sqrt_h;
        let gate = sigmoid(signed_sqrt(score, SIGNED_SQRT_FLOOR));
        for (p, &v) in gated[range].iter_mut().zip(&value) {
            *p = gate * v;
        }
    }
    let mut conv_in = vec![0.0f32; width];
    rmsnorm_grouped(&gated, &w.norm_conv, h, eps, &mut conv_in);

    // Depthwise causal conv with dilation d: taps at t − d·(K−1−k); rows before the start are 0.
    let kernel = pc.conv_kernel;
    let dilation = pc.conv_dilation();
    let ring = pc.conv_history();
    for c in 0..width {
        let taps = &w.conv[c * kernel..(c + 1) * kernel];
        let mut sum = 0.0f32;
        for (k, &tap) in taps.iter().enumerate() {
            let back = dilation * (kernel - 1 - k);
            let input = if back == 0 {
                conv_in[c]
            } else if back <= position && ring > 0 {
                state.history[((position - back) % ring) * width + c]
            } else {
                0.0
            };
            sum += tap * input;
        }
        wide[c] += gated[c] + silu(sum);
    }
    if ring > 0 {
        let slot = position % ring;
        state.history[slot * width..(slot + 1) * width].copy_from_slice(&conv_in);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eos_resets_the_window() {
        let eos = 9;
        assert_eq!(ngram_context(&[1], 3, eos), vec![1, 9, 9]);
        assert_eq!(ngram_context(&[1, 2, 3], 3, eos), vec![3, 2, 1]);
        assert_eq!(ngram_context(&[1, 9, 3], 3, eos), vec![3, 9, 9]);
        assert_eq!(ngram_context(&[9, 2, 3], 3, eos), vec![3, 2, 9]);
        assert_eq!(ngram_context(&[1, 2, 9], 3, eos), vec![9, 2, 1]);
    }
}
