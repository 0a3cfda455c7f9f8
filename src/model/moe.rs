//! Mixture-of-experts FFN (model-spec §2.8): softmax router over all experts, top-k, renormalise;
//! SwiGLU experts; a shared expert scaled by a sigmoid gate.

use super::ModelError;
use super::config::Config;
use super::ops::{dot, sigmoid, silu, softmax, top_k};
use super::weights::{MoeWeights, QuantMatrix};

/// The experts a token is routed to, best first, with their renormalised weights.
pub fn route(cfg: &Config, w: &MoeWeights, x: &[f32]) -> Result<Vec<(usize, f32)>, ModelError> {
    let mut probs = vec![0.0f32; cfg.moe.n_expert];
    w.router.matvec(x, &mut probs)?;
    // Softmax over all experts first, then top-k, then renormalise (not a softmax over the top-k
    // logits: same in exact arithmetic, different rounding).
    softmax(&mut probs);
    let chosen = top_k(&probs, cfg.moe.n_expert_used);
    let mut total = 0.0f32;
    for &e in &chosen {
        total += probs[e];
    }
    Ok(chosen.into_iter().map(|e| (e, probs[e] / total)).collect())
}

/// `down · (silu(gate · x) ⊙ (up · x))`.
fn swiglu(
    gate: &QuantMatrix,
    up: &QuantMatrix,
    down: &QuantMatrix,
    x: &[f32],
    out: &mut [f32],
) -> Result<(), ModelError> {
    let mut g = vec![0.0f32; gate.rows];
    gate.matvec(x, &mut g)?;
    let mut u = vec![0.0f32; up.rows];
    up.matvec(x, &mut u)?;
    for (gv, uv) in g.iter_mut().zip(&u) {
        *gv = silu(*gv) * uv;
    }
    down.matvec(&g, out)
}

/// One token through the MoE block: `x` (H) → `y` (H).
pub fn moe_forward(
    cfg: &Config,
    w: &MoeWeights,
    x: &[f32],
    y: &mut [f32],
) -> Result<(), ModelError> {
    let routes = route(cfg, w, x)?;
    y.fill(0.0);
    let mut expert_out = vec![0.0f32; y.len()];
    for (e, weight) in routes {
        let (Some(gate), Some(up), Some(down)) = (w.gate.get(e), w.up.get(e), w.down.get(e)) else {
            return Err(ModelError::Tensor {
                name: "ffn experts".into(),
                message: format!("expert {e} is missing"),
            });
        };
        swiglu(gate, up, down, x, &mut expert_out)?;
        for (o, &v) in y.iter_mut().zip(&expert_out) {
            *o += weight * v;
        }
    }
    if let Some(shared) = &w.shared {
        swiglu(&shared.gate, &shared.up, &shared.down, x, &mut expert_out)?;
        let gate = sigmoid(dot(&shared.gate_inp, x));
        for (o, &v) in y.iter_mut().zip(&expert_out) {
            *o += gate * v;
        }
    }
    Ok(())
}
