//! Per-sequence state of the CPU forward pass: everything a later token needs from earlier ones.
//! `Clone` is a deep copy (used by `Sequence::fork`).

use super::config::{Config, LayerKind};

/// One GDN layer: the conv input history and the delta-rule state of every value head.
#[derive(Debug, Clone)]
pub struct GdnState {
    /// The last `kernel − 1` conv inputs, oldest first, `channels` values each (zeros before the
    /// sequence starts).
    pub conv: Vec<f32>,
    /// Per value head a `[head_k_dim][head_v_dim]` matrix S (key-major), f32.
    pub ssm: Vec<f32>,
}

/// One QSA / attention layer: keys, values and the indexer's raw keys for every past position.
#[derive(Debug, Clone, Default)]
pub struct QsaState {
    /// `[position][n_head_kv · head_dim]`, after k_norm and RoPE.
    pub keys: Vec<f32>,
    /// `[position][n_head_kv · head_dim]`.
    pub values: Vec<f32>,
    /// `[position][indexer_head_dim]`, raw (no norm, no RoPE), as the reference caches them.
    pub raw_index_keys: Vec<f32>,
    /// `[block][indexer_head_dim]`: normalised, rotated mean keys of the finished blocks.
    pub block_keys: Vec<f32>,
}

#[derive(Debug, Clone)]
pub enum LayerState {
    Gdn(GdnState),
    Qsa(QsaState),
}

/// The PLE layer's dilated-conv history: normalised rows N of the last `(kernel−1)·dilation` tokens,
/// in a ring indexed by position.
#[derive(Debug, Clone)]
pub struct PleState {
    pub history: Vec<f32>,
}

#[derive(Debug, Clone)]
pub struct SequenceState {
    /// Every token fed so far (the n-gram hash reads back through them).
    pub tokens: Vec<u32>,
    pub layers: Vec<LayerState>,
    pub ple: Option<PleState>,
}

impl SequenceState {
    /// Bytes held: tokens, every layer's state and the PLE history (what a fork copies).
    pub fn bytes(&self) -> usize {
        let floats: usize = self
            .layers
            .iter()
            .map(|l| match l {
                LayerState::Gdn(g) => g.conv.len() + g.ssm.len(),
                LayerState::Qsa(q) => {
                    q.keys.len() + q.values.len() + q.raw_index_keys.len() + q.block_keys.len()
                }
            })
            .sum();
        let ple = self.ple.as_ref().map_or(0, |p| p.history.len());
        (self.tokens.len() + floats + ple) * 4
    }

    pub fn new(cfg: &Config) -> SequenceState {
        let d = &cfg.gdn;
        let layers = cfg
            .layers
            .iter()
            .map(|kind| match kind {
                LayerKind::Gdn => LayerState::Gdn(GdnState {
                    conv: vec![0.0; (d.conv_kernel - 1) * d.conv_channels()],
                    ssm: vec![0.0; d.n_v_heads * d.head_k_dim * d.head_v_dim],
                }),
                LayerKind::Qsa { .. } => LayerState::Qsa(QsaState::default()),
            })
            .collect();
        let ple = cfg.ple.as_ref().map(|p| PleState {
            history: vec![0.0; p.conv_history() * cfg.hc_count * cfg.n_embd],
        });
        SequenceState {
            tokens: Vec::new(),
            layers,
            ple,
        }
    }
}
