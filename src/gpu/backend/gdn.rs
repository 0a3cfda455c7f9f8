//! Gated DeltaNet layers, and the output projection both mixers end with.

use super::*;
use crate::gpu::kernels::ConvStore;
use crate::gpu::ops::Span;

impl GpuSequence {
    pub(super) fn gdn(
        &self,
        rec: &mut Recorder,
        w: &GdnGpu,
        state: &LayerState,
        t: usize,
    ) -> Result<(), GpuError> {
        let LayerState::Gdn { conv, .. } = state else {
            return Err(GpuError::BadArgs("GDN layer with attention state".into()));
        };
        let b = &self.backend;
        let s = &self.scratch;
        let g = &b.config.gdn;
        let ch = g.conv_channels();
        // One token of a 4-tap conv: the conv runs in the input projection's store (the same
        // expression as gdn_conv's, so the same bits), one dispatch fewer.
        let mut conv_done = false;
        if t == 1 && g.conv_kernel == 4 && w.input.rows(0) == ch {
            let h = b.config.n_embd;
            let outs = [
                View::new(&s.conv_out, 0, ch),
                View::new(&s.z, 0, g.value_dim()),
                View::new(&s.beta_alpha, 0, 2 * g.n_v_heads),
            ];
            let store = ConvStore {
                history: conv,
                weight: &w.conv,
            };
            let x = View::new(&s.x_in, 0, h);
            conv_done = w.input.record_conv(&b.ctx, rec, x, &outs, store)?.is_some();
        }
        if !conv_done {
            self.gdn_project(rec, w, t)?;
        }
        self.gdn_core(rec, w, state, t, !conv_done)?;
        self.gdn_out(rec, w, t)
    }

    /// The input projection of `t` tokens: `mixed`, `z` and `beta_alpha` of the scratch.
    pub(super) fn gdn_project(
        &self,
        rec: &mut Recorder,
        w: &GdnGpu,
        t: usize,
    ) -> Result<(), GpuError> {
        let b = &self.backend;
        let s = &self.scratch;
        let g = &b.config.gdn;
        let x = View::new(&s.x_in, 0, b.config.n_embd);
        let outs = [
            View::new(&s.mixed, 0, g.conv_channels()),
            View::new(&s.z, 0, g.value_dim()),
            View::new(&s.beta_alpha, 0, 2 * g.n_v_heads),
        ];
        w.input.record(&b.ctx, rec, x, &outs, t)
    }

    /// What depends on this sequence's state: the conv (when `conv`; else `conv_out` is already
    /// there), the recurrence and the gated norm, from the scratch's projections of `t` tokens
    /// into its `gdn_normed`.
    pub(super) fn gdn_core(
        &self,
        rec: &mut Recorder,
        w: &GdnGpu,
        state: &LayerState,
        t: usize,
        conv: bool,
    ) -> Result<(), GpuError> {
        self.gdn_recur(rec, w, state, &self.scratch, Span::from(t), conv)?;
        self.gdn_norm_apart(rec, w, t)
    }

    /// The conv (when `conv`) and the recurrence of the tokens in columns `span` of `s`'s
    /// projections, with this sequence's state: `s.gdn_normed` at those columns, or, for value
    /// heads too wide for the fused norm, `s.recurrent_out` (then [`gdn_norm_apart`] follows).
    ///
    /// [`gdn_norm_apart`]: Self::gdn_norm_apart
    pub(super) fn gdn_recur(
        &self,
        rec: &mut Recorder,
        w: &GdnGpu,
        state: &LayerState,
        s: &Scratch,
        span: Span,
        conv: bool,
    ) -> Result<(), GpuError> {
        let LayerState::Gdn { conv: history, ssm } = state else {
            return Err(GpuError::BadArgs("GDN layer with attention state".into()));
        };
        let b = &self.backend;
        let c = &*b.ctx;
        let cfg = &b.config;
        let shape = gdn_shape(cfg);
        if conv {
            ops::gdn_conv(
                c,
                rec,
                &shape,
                &s.mixed,
                &w.conv,
                history,
                &s.conv_out,
                span,
            )?;
        }
        let inputs = ops::GdnInputs {
            qkv: &s.conv_out,
            beta_alpha: &s.beta_alpha,
            gate_params: &w.gate_params,
            state: ssm,
        };
        if fused_norm(cfg) {
            // The gated norm in the recurrence's dispatch (a workgroup per value head).
            let norm = ops::GatedNorm {
                z: &s.z,
                weight: &w.norm,
                eps: cfg.rms_eps,
            };
            ops::gdn_recurrence_norm(c, rec, &shape, inputs, norm, &s.gdn_normed, span)
        } else {
            ops::gdn_recurrence(c, rec, &shape, inputs, &s.recurrent_out, span)
        }
    }

    /// The gated norm of `t` tokens' `recurrent_out` into `gdn_normed` (token-wise), for value
    /// heads too wide for the recurrence's fused norm; nothing otherwise.
    pub(super) fn gdn_norm_apart(
        &self,
        rec: &mut Recorder,
        w: &GdnGpu,
        t: usize,
    ) -> Result<(), GpuError> {
        let b = &self.backend;
        let g = &b.config.gdn;
        if fused_norm(&b.config) {
            return Ok(());
        }
        let s = &self.scratch;
        let per_head = Groups::packed(g.head_v_dim, g.n_v_heads);
        ops::rmsnorm_gated(
            &b.ctx,
            rec,
            &self.norm_spec(Some((&w.norm, g.head_v_dim))),
            &s.recurrent_out,
            &s.z,
            per_head,
            &s.gdn_normed,
            per_head,
            t,
        )
    }

    /// The output projection of `t` tokens' `gdn_normed`, added into the wide residual.
    pub(super) fn gdn_out(&self, rec: &mut Recorder, w: &GdnGpu, t: usize) -> Result<(), GpuError> {
        let s = &self.scratch;
        let x = View::new(&s.gdn_normed, 0, self.backend.config.gdn.value_dim());
        self.out_and_combine(rec, &w.out, x, t)
    }

    /// A mixer's output projection added into the wide residual (fused `hc_combine`).
    pub(super) fn out_and_combine(
        &self,
        rec: &mut Recorder,
        w: &GpuWeight,
        x: View,
        t: usize,
    ) -> Result<(), GpuError> {
        let b = &self.backend;
        let s = &self.scratch;
        let store = Store::Combine {
            wide: &s.wide,
            inject: &s.inject,
            h: b.config.n_embd,
            hc: b.config.hc_count,
        };
        kernels::matvec_with(&b.ctx, rec, w, x, XForm::Plain, store, t)
    }
}

/// The GDN kernels' shape for `cfg`.
fn gdn_shape(cfg: &crate::model::config::Config) -> GdnShape {
    let g = &cfg.gdn;
    GdnShape {
        channels: g.conv_channels(),
        kernel: g.conv_kernel,
        n_k_heads: g.n_k_heads,
        n_v_heads: g.n_v_heads,
        dk: g.head_k_dim,
        dv: g.head_v_dim,
    }
}

/// Whether the gated norm runs in the recurrence's dispatch (value heads that fit a workgroup).
fn fused_norm(cfg: &crate::model::config::Config) -> bool {
    cfg.gdn.head_v_dim <= ops::GDN_NORM_MAX_DV
}
