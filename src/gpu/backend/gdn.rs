//! Gated DeltaNet layers, and the output projection both mixers end with.

use super::*;
use crate::gpu::kernels::ConvStore;

impl GpuSequence {
    pub(super) fn gdn(
        &self,
        rec: &mut Recorder,
        w: &GdnGpu,
        state: &LayerState,
        t: usize,
    ) -> Result<(), GpuError> {
        let LayerState::Gdn { conv, ssm } = state else {
            return Err(GpuError::BadArgs("GDN layer with attention state".into()));
        };
        let b = &self.backend;
        let c = &*b.ctx;
        let s = &self.scratch;
        let cfg = &b.config;
        let g = &cfg.gdn;
        let h = cfg.n_embd;
        let ch = g.conv_channels();
        let nv = g.n_v_heads;
        let x = View::new(&s.x_in, 0, h);
        let mut outs = [
            View::new(&s.mixed, 0, ch),
            View::new(&s.z, 0, g.value_dim()),
            View::new(&s.beta_alpha, 0, 2 * nv),
        ];
        let shape = GdnShape {
            channels: ch,
            kernel: g.conv_kernel,
            n_k_heads: g.n_k_heads,
            n_v_heads: nv,
            dk: g.head_k_dim,
            dv: g.head_v_dim,
        };
        // One token of a 4-tap conv: the conv runs in the input projection's store (the same
        // expression as gdn_conv's, so the same bits), one dispatch fewer.
        let mut conv_done = false;
        if t == 1 && g.conv_kernel == 4 && w.input.rows(0) == ch {
            outs[0] = View::new(&s.conv_out, 0, ch);
            let store = ConvStore {
                history: conv,
                weight: &w.conv,
            };
            conv_done = w.input.record_conv(c, rec, x, &outs, store)?.is_some();
            outs[0] = View::new(&s.mixed, 0, ch);
        }
        if !conv_done {
            w.input.record(c, rec, x, &outs, t)?;
            ops::gdn_conv(c, rec, &shape, &s.mixed, &w.conv, conv, &s.conv_out, t)?;
        }
        let inputs = ops::GdnInputs {
            qkv: &s.conv_out,
            beta_alpha: &s.beta_alpha,
            gate_params: &w.gate_params,
            state: ssm,
        };
        if g.head_v_dim <= ops::GDN_NORM_MAX_DV {
            // The gated norm in the recurrence's dispatch (a workgroup per value head).
            let norm = ops::GatedNorm {
                z: &s.z,
                weight: &w.norm,
                eps: cfg.rms_eps,
            };
            ops::gdn_recurrence_norm(c, rec, &shape, inputs, norm, &s.gdn_normed, t)?;
        } else {
            ops::gdn_recurrence(c, rec, &shape, inputs, &s.recurrent_out, t)?;
            let per_head = Groups::packed(g.head_v_dim, nv);
            ops::rmsnorm_gated(
                c,
                rec,
                &self.norm_spec(Some((&w.norm, g.head_v_dim))),
                &s.recurrent_out,
                &s.z,
                per_head,
                &s.gdn_normed,
                per_head,
                t,
            )?;
        }
        let x = View::new(&s.gdn_normed, 0, g.value_dim());
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
