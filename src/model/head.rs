//! Output head (model-spec §2.9): the head mixer (a hyper-connection read without inject) replaces
//! the usual final norm, then the untied lm_head.

use super::ModelError;
use super::config::Config;
use super::hyper_connection::hc_mix;
use super::weights::Weights;

/// The head mixer's output (H values), `final_hidden` in the transformers reference.
pub fn final_hidden(
    cfg: &Config,
    w: &Weights,
    wide: &[f32],
    hidden: &mut [f32],
) -> Result<(), ModelError> {
    let mut unused_alpha = [0.0f32; 0];
    hc_mix(
        &w.head_hc,
        wide,
        cfg.n_embd,
        cfg.hc_count,
        cfg.rms_eps,
        hidden,
        &mut unused_alpha,
    )
}

/// `logits = W_lm · hidden`.
pub fn logits(w: &Weights, hidden: &[f32], logits: &mut [f32]) -> Result<(), ModelError> {
    w.output.matvec(hidden, logits)
}
