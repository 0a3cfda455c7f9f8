//! Indexed (QSA) attention layer (model-spec §2.7), one token per call.
//!
//! The indexer caches each position's raw key; once a block of `ratio` tokens is complete its mean
//! key is normalised and rotated (at the block's first position) and cached. A query attends to the
//! top `min(budget/ratio, n_blocks)` complete blocks by indexer score (lowest block index wins a
//! tie) plus the incomplete tail, which always holds the query itself — exactly the reference's
//! selection. With `compress_ratio = None` the layer attends densely.

use super::ModelError;
use super::config::Config;
use super::ops::{dot, rmsnorm, rope_apply, rope_cos_sin, rope_inv_freqs, sigmoid, softmax, top_k};
use super::state::QsaState;
use super::weights::{IndexerWeights, QsaWeights};

/// cos/sin of one position for the rotary dims.
fn rope_row(cfg: &Config, position: usize) -> (Vec<f32>, Vec<f32>) {
    let a = &cfg.attention;
    let inv = rope_inv_freqs(a.rope_base, a.rotary_dims);
    let mut cos = vec![0.0f32; inv.len()];
    let mut sin = vec![0.0f32; inv.len()];
    rope_cos_sin(position, &inv, &mut cos, &mut sin);
    (cos, sin)
}

/// Updates the indexer caches for the token at `position` and returns which past positions the
/// query may attend to (`allowed[j]` for j ≤ position).
fn select_keys(
    cfg: &Config,
    w: &IndexerWeights,
    ratio: usize,
    state: &mut QsaState,
    position: usize,
    x: &[f32],
    rope: &(Vec<f32>, Vec<f32>),
) -> Result<Vec<bool>, ModelError> {
    let a = &cfg.attention;
    let dim = a.indexer_head_dim;

    let mut raw_key = vec![0.0f32; dim];
    w.k.matvec(x, &mut raw_key)?;
    state.raw_index_keys.extend_from_slice(&raw_key);

    // A block just completed: cache its normalised, rotated mean key.
    let n_blocks = (position + 1) / ratio;
    while state.block_keys.len() / dim < n_blocks {
        let block = state.block_keys.len() / dim;
        let mut mean = vec![0.0f32; dim];
        for j in block * ratio..(block + 1) * ratio {
            for (m, &k) in mean
                .iter_mut()
                .zip(&state.raw_index_keys[j * dim..(j + 1) * dim])
            {
                *m += k;
            }
        }
        for m in mean.iter_mut() {
            *m /= ratio as f32;
        }
        let mut key = vec![0.0f32; dim];
        rmsnorm(&mean, &w.k_norm, cfg.rms_eps, &mut key);
        let (cos, sin) = rope_row(cfg, block * ratio);
        rope_apply(&mut key, &cos, &sin);
        state.block_keys.extend_from_slice(&key);
    }

    let budget_blocks = a.indexer_budget_tokens / ratio;
    let mut allowed = vec![false; position + 1];
    // The incomplete tail (including the query itself) is always visible.
    for cell in allowed.iter_mut().skip(n_blocks * ratio) {
        *cell = true;
    }
    if n_blocks <= budget_blocks {
        // Every complete block is selected: no need to score.
        for cell in allowed.iter_mut().take(n_blocks * ratio) {
            *cell = true;
        }
        return Ok(allowed);
    }

    let mut queries = vec![0.0f32; a.indexer_n_head * dim];
    w.q.matvec(x, &mut queries)?;
    let mut normed = vec![0.0f32; dim];
    for q in queries.chunks_mut(dim) {
        rmsnorm(q, &w.q_norm, cfg.rms_eps, &mut normed);
        q.copy_from_slice(&normed);
        rope_apply(q, &rope.0, &rope.1);
    }
    let scale = 1.0 / (dim as f32).sqrt();
    let scores: Vec<f32> = state
        .block_keys
        .chunks(dim)
        .take(n_blocks)
        .map(|key| {
            let mut sum = 0.0f32;
            for q in queries.chunks(dim) {
                sum += dot(q, key).max(0.0);
            }
            sum * scale
        })
        .collect();
    if scores.iter().any(|s| !s.is_finite()) {
        return Err(ModelError::Tensor {
            name: "QSA indexer".into(),
            message: format!("non-finite block score at position {position}"),
        });
    }
    for block in top_k(&scores, budget_blocks) {
        for cell in allowed.iter_mut().skip(block * ratio).take(ratio) {
            *cell = true;
        }
    }
    Ok(allowed)
}

/// One token at `position` through an attention layer: `x` (H) → `y` (H).
pub fn qsa_forward(
    cfg: &Config,
    w: &QsaWeights,
    state: &mut QsaState,
    position: usize,
    x: &[f32],
    y: &mut [f32],
) -> Result<(), ModelError> {
    let a = &cfg.attention;
    let hd = a.head_dim;
    let rope = rope_row(cfg, position);

    let mut query_gate = vec![0.0f32; 2 * a.n_head * hd];
    w.q.matvec(x, &mut query_gate)?;
    let mut key = vec![0.0f32; a.n_head_kv * hd];
    w.k.matvec(x, &mut key)?;
    let mut value = vec![0.0f32; a.n_head_kv * hd];
    w.v.matvec(x, &mut value)?;

    let mut normed = vec![0.0f32; hd];
    for k in key.chunks_mut(hd) {
        rmsnorm(k, &w.k_norm, cfg.rms_eps, &mut normed);
        k.copy_from_slice(&normed);
        rope_apply(k, &rope.0, &rope.1);
    }
    cfg.kv.store_row(&mut key);
    cfg.kv.store_row(&mut value);
    state.keys.extend_from_slice(&key);
    state.values.extend_from_slice(&value);

    let allowed = match (&w.indexer, w.compress_ratio) {
        (Some(indexer), Some(ratio)) if ratio > 0 => {
            select_keys(cfg, indexer, ratio, state, position, x, &rope)?
        }
        _ => vec![true; position + 1],
    };
    let visible: Vec<usize> = allowed
        .iter()
        .enumerate()
        .filter(|(_, ok)| **ok)
        .map(|(j, _)| j)
        .collect();

    let kv_width = a.n_head_kv * hd;
    let group = a.n_head / a.n_head_kv;
    let scale = 1.0 / (hd as f32).sqrt();
    let mut attended = vec![0.0f32; a.n_head * hd];
    let mut weights = vec![0.0f32; visible.len()];
    for (head, out) in attended.chunks_mut(hd).enumerate() {
        let qg = &query_gate[head * 2 * hd..(head + 1) * 2 * hd];
        let mut q = vec![0.0f32; hd];
        rmsnorm(&qg[..hd], &w.q_norm, cfg.rms_eps, &mut q);
        rope_apply(&mut q, &rope.0, &rope.1);
        let gate = &qg[hd..];
        let kv_head = head / group;
        for (wt, &j) in weights.iter_mut().zip(&visible) {
            let k = &state.keys[j * kv_width + kv_head * hd..j * kv_width + (kv_head + 1) * hd];
            *wt = dot(&q, k) * scale;
        }
        softmax(&mut weights);
        out.fill(0.0);
        for (&wt, &j) in weights.iter().zip(&visible) {
            let v = &state.values[j * kv_width + kv_head * hd..j * kv_width + (kv_head + 1) * hd];
            for (o, &vv) in out.iter_mut().zip(v) {
                *o += wt * vv;
            }
        }
        for (o, &g) in out.iter_mut().zip(gate) {
            *o *= sigmoid(g);
        }
    }
    w.out.matvec(&attended, y)
}
