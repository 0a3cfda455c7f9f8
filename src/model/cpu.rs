//! The CPU reference backend: the whole stack, one token at a time, in a fixed order.
//!
//! Because every token goes through every layer on its own (recurrent GDN form, incremental caches),
//! a prompt fed in chunks of any size and token-by-token decode produce bit-identical logits. Matvec
//! rows run in parallel, but each output element is one sequential reduction, so the thread count
//! never changes a bit.

use std::sync::Arc;

use crate::engine::{Backend, EngineError, ModelInfo, Sequence};
use crate::gguf::Gguf;

use super::ModelError;
use super::config::Config;
use super::embedding::embed;
use super::gdn::gdn_forward;
use super::head;
use super::hyper_connection::{hc_combine, hc_mix};
use super::moe::moe_forward;
use super::ops::first_non_finite;
use super::ple::ple_forward;
use super::qsa::qsa_forward;
use super::state::{LayerState, SequenceState};
use super::weights::{MixerWeights, Weights};

/// A loaded model on the CPU.
pub struct CpuBackend {
    pub config: Config,
    pub weights: Weights,
    info: ModelInfo,
    /// The file the weights borrow from (kept so `gguf()` can hand it to other components).
    gguf: Arc<Gguf>,
}

impl std::fmt::Debug for CpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuBackend")
            .field("info", &self.info)
            .finish()
    }
}

impl CpuBackend {
    /// Reads the config and binds the weights. `ctx` caps the per-sequence context (0 = the model's).
    pub fn load(gguf: Arc<Gguf>, ctx: usize) -> Result<CpuBackend, ModelError> {
        Self::load_with_progress(gguf, ctx, &mut |_, _| {})
    }

    /// The KV cache's storage type for every sequence made from here on (`--kv`); refused where
    /// the model's key rows do not fit it (q8_0 takes blocks of 32).
    pub fn set_kv(&mut self, kv: crate::model::config::KvType) -> Result<(), ModelError> {
        let a = &self.config.attention;
        if let Some(message) = kv.unsupported_width(a.n_head_kv * a.head_dim) {
            return Err(ModelError::Metadata {
                key: "attention.head_count_kv".into(),
                message,
            });
        }
        self.config.kv = kv;
        Ok(())
    }

    /// As [`load`](Self::load), calling `progress(layers_done, layers)` after each layer.
    pub fn load_with_progress(
        gguf: Arc<Gguf>,
        ctx: usize,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<CpuBackend, ModelError> {
        let config = Config::from_gguf(&gguf)?;
        let weights = Weights::bind(&gguf, &config, progress)?;
        let context_length = if ctx == 0 { config.context_length } else { ctx };
        let info = ModelInfo {
            name: config.name.clone(),
            vocab_size: config.vocab_size,
            context_length,
            backend: "cpu".to_string(),
            prefill_chunk: crate::engine::generate::PREFILL_CHUNK,
        };
        Ok(CpuBackend {
            config,
            weights,
            info,
            gguf,
        })
    }

    /// The GGUF the model was loaded from.
    pub fn gguf(&self) -> &Arc<Gguf> {
        &self.gguf
    }

    /// A fresh CPU sequence as its concrete type (for `feed_hidden` / `feed_layer_outputs`).
    pub fn sequence(self: &Arc<Self>) -> CpuSequence {
        CpuSequence {
            backend: Arc::clone(self),
            state: SequenceState::new(&self.config),
            poisoned: false,
        }
    }
}

impl Backend for CpuBackend {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn new_sequence(self: Arc<Self>) -> Result<Box<dyn Sequence>, EngineError> {
        Ok(Box::new(self.sequence()))
    }
}

/// One sequence's state on the CPU backend.
pub struct CpuSequence {
    backend: Arc<CpuBackend>,
    state: SequenceState,
    /// Set after an error: the state may be half-updated.
    poisoned: bool,
}

fn model_error(e: ModelError, position: usize) -> EngineError {
    match e {
        ModelError::NonFiniteWeight { name, detail } => EngineError::NonFinite {
            stage: format!("weights of {name}{detail}"),
            position,
        },
        other => EngineError::Other(format!("at token position {position}: {other}")),
    }
}

fn check(
    values: &[f32],
    position: usize,
    stage: impl FnOnce() -> String,
) -> Result<(), EngineError> {
    match first_non_finite(values) {
        Some(_) => Err(EngineError::NonFinite {
            stage: stage(),
            position,
        }),
        None => Ok(()),
    }
}

impl CpuSequence {
    /// Runs one token through the trunk and returns the final wide residual (before the head mixer).
    /// With `layer_outputs`, the wide residual after every layer is appended to it.
    fn step(
        &mut self,
        token: u32,
        mut layer_outputs: Option<&mut Vec<f32>>,
    ) -> Result<Vec<f32>, EngineError> {
        let backend = Arc::clone(&self.backend);
        let cfg = &backend.config;
        let w = &backend.weights;
        let position = self.state.tokens.len();
        let h = cfg.n_embd;
        let hc = cfg.hc_count;
        self.state.tokens.push(token);

        let mut wide = vec![0.0f32; hc * h];
        embed(&w.token_embd, token, &mut wide).map_err(|e| model_error(e, position))?;
        check(&wide, position, || "token embedding".to_string())?;

        let mut x_in = vec![0.0f32; h];
        let mut alpha = vec![0.0f32; hc];
        let mut y = vec![0.0f32; h];
        for (il, (lw, ls)) in w
            .layers
            .iter()
            .zip(self.state.layers.iter_mut())
            .enumerate()
        {
            if let (Some(pw), Some(pc), Some(ps)) = (&lw.ple, &cfg.ple, self.state.ple.as_mut()) {
                ple_forward(cfg, pc, pw, ps, &self.state.tokens, &mut wide)
                    .map_err(|e| model_error(e, position))?;
                check(&wide, position, || format!("layer {il} PLE output"))?;
            }

            hc_mix(
                &lw.attn_hc,
                &wide,
                h,
                hc,
                cfg.rms_eps,
                &mut x_in,
                &mut alpha,
            )
            .map_err(|e| model_error(e, position))?;
            check(&x_in, position, || {
                format!("layer {il} attention hyper-connection mix")
            })?;
            let stage = match (&lw.mixer, ls) {
                (MixerWeights::Gdn(gw), LayerState::Gdn(gs)) => {
                    gdn_forward(cfg, gw, gs, &x_in, &mut y)
                        .map_err(|e| model_error(e, position))?;
                    "GDN output"
                }
                (MixerWeights::Qsa(qw), LayerState::Qsa(qs)) => {
                    qsa_forward(cfg, qw, qs, position, &x_in, &mut y)
                        .map_err(|e| model_error(e, position))?;
                    "QSA attention output"
                }
                _ => {
                    return Err(EngineError::Other(format!(
                        "layer {il}: state does not match the layer kind"
                    )));
                }
            };
            check(&y, position, || format!("layer {il} {stage}"))?;
            hc_combine(&mut wide, &alpha, &y);

            hc_mix(&lw.ffn_hc, &wide, h, hc, cfg.rms_eps, &mut x_in, &mut alpha)
                .map_err(|e| model_error(e, position))?;
            check(&x_in, position, || {
                format!("layer {il} FFN hyper-connection mix")
            })?;
            moe_forward(cfg, &lw.moe, &x_in, &mut y).map_err(|e| model_error(e, position))?;
            check(&y, position, || format!("layer {il} MoE output"))?;
            hc_combine(&mut wide, &alpha, &y);
            check(&wide, position, || format!("layer {il} residual"))?;
            if let Some(out) = layer_outputs.as_deref_mut() {
                out.extend_from_slice(&wide);
            }
        }
        Ok(wide)
    }

    /// Head mixer output for a final wide residual.
    fn hidden_of(&self, wide: &[f32], position: usize) -> Result<Vec<f32>, EngineError> {
        let cfg = &self.backend.config;
        let mut hidden = vec![0.0f32; cfg.n_embd];
        head::final_hidden(cfg, &self.backend.weights, wide, &mut hidden)
            .map_err(|e| model_error(e, position))?;
        check(&hidden, position, || "head mixer output".to_string())?;
        Ok(hidden)
    }

    fn logits_of(&self, wide: &[f32], position: usize, out: &mut [f32]) -> Result<(), EngineError> {
        let hidden = self.hidden_of(wide, position)?;
        head::logits(&self.backend.weights, &hidden, out).map_err(|e| model_error(e, position))?;
        check(out, position, || "logits".to_string())
    }

    fn validate(&self, tokens: &[u32]) -> Result<(), EngineError> {
        if self.poisoned {
            return Err(EngineError::Other(
                "this sequence failed earlier and cannot be used".into(),
            ));
        }
        let info = &self.backend.info;
        let vocab = info.vocab_size;
        if let Some(&id) = tokens.iter().find(|&&id| id as usize >= vocab) {
            return Err(EngineError::BadToken { id, vocab });
        }
        let needed = self.state.tokens.len() + tokens.len();
        if needed > info.context_length {
            return Err(EngineError::ContextOverflow {
                needed,
                ctx: info.context_length,
            });
        }
        Ok(())
    }

    /// Feeds tokens and returns every decoder layer's output: the wide residual (`hc_count · H`,
    /// stream-major) after each layer, token-major: `[token][layer][hc_count · H]`. This is
    /// transformers' `layer_out` (transposed) and llama.cpp's `l_last-<il>`, for localising a
    /// mismatch to a layer.
    pub fn feed_layer_outputs(&mut self, tokens: &[u32]) -> Result<Vec<f32>, EngineError> {
        self.validate(tokens)?;
        let mut out = Vec::new();
        for &t in tokens {
            self.step(t, Some(&mut out))
                .inspect_err(|_| self.poisoned = true)?;
        }
        Ok(out)
    }

    /// Feeds tokens and returns the head mixer outputs (`final_hidden`, H per token) — for tests
    /// that localise a mismatch against the reference.
    pub fn feed_hidden(&mut self, tokens: &[u32]) -> Result<Vec<f32>, EngineError> {
        self.validate(tokens)?;
        let mut out = Vec::with_capacity(tokens.len() * self.backend.config.n_embd);
        for &t in tokens {
            let position = self.state.tokens.len();
            let wide = self.step(t, None).inspect_err(|_| self.poisoned = true)?;
            out.extend(self.hidden_of(&wide, position)?);
        }
        Ok(out)
    }
}

impl Sequence for CpuSequence {
    fn tokens(&self) -> &[u32] {
        &self.state.tokens
    }

    fn feed(&mut self, tokens: &[u32], all_logits: bool) -> Result<Vec<f32>, EngineError> {
        self.validate(tokens)?;
        if tokens.is_empty() {
            return Err(EngineError::Other("feed called with no tokens".into()));
        }
        let vocab = self.backend.config.vocab_size;
        let rows = if all_logits { tokens.len() } else { 1 };
        let mut logits = vec![0.0f32; rows * vocab];
        let result = (|| {
            for (i, &t) in tokens.iter().enumerate() {
                let position = self.state.tokens.len();
                let wide = self.step(t, None)?;
                let row = if all_logits {
                    Some(i)
                } else if i + 1 == tokens.len() {
                    Some(0)
                } else {
                    None
                };
                if let Some(r) = row {
                    self.logits_of(&wide, position, &mut logits[r * vocab..(r + 1) * vocab])?;
                }
            }
            Ok(())
        })();
        result.inspect_err(|_| self.poisoned = true)?;
        Ok(logits)
    }

    fn fork(&self) -> Option<Box<dyn Sequence>> {
        if self.poisoned {
            return None;
        }
        Some(Box::new(CpuSequence {
            backend: Arc::clone(&self.backend),
            state: self.state.clone(),
            poisoned: false,
        }))
    }

    fn state_bytes(&self) -> usize {
        self.state.bytes()
    }
}
