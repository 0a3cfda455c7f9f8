//! Hyper-connection mixing (model-spec: the 4-stream residual) on the GPU.

use super::*;
use crate::gpu::kernels::InputNorm;

impl GpuSequence {
    pub(super) fn norm_spec<'a>(&self, weight: Option<(&'a GpuBuf, usize)>) -> NormSpec<'a> {
        NormSpec {
            mode: NormMode::Rms,
            eps: self.backend.config.rms_eps,
            scale: 1.0,
            weight,
        }
    }

    /// The hyper-connection mix (model-spec 2.4): `x_in` and, with an injection, `inject`.
    /// Two dispatches: the down projection and injection logits together over the grouped norm
    /// of the streams (the norm on load, the normed streams stored for the mix, the SiLU of the
    /// low-rank values in its store); the up projection with the stream mix in its store. Where
    /// the down weight's layout cannot norm on load, the norm runs first as a dispatch of its own.
    pub(super) fn hc_mix(&self, rec: &mut Recorder, w: &HcGpu, t: usize) -> Result<(), GpuError> {
        let b = &self.backend;
        let c = &*b.ctx;
        let s = &self.scratch;
        let h = b.config.n_embd;
        let hc = b.config.hc_count;
        let wide = h * hc;
        let r = w.down_inject.rows(0);
        let mut outs = vec![View::new(&s.low, 0, r)];
        if w.has_inject {
            outs.push(View::new(&s.inject, 0, hc));
        }
        let scale = 1.0 / hc as f32;
        let in_store = if w.down_inject.can_norm_input(h, wide) {
            let norm = InputNorm {
                weight: &w.norm,
                period: wide,
                group: h,
                groups: hc,
                eps: b.config.rms_eps,
                normed: View::new(&s.normed, 0, wide),
            };
            let x = View::new(&s.wide, 0, wide);
            w.down_inject
                .record_normed(c, rec, x, norm, &outs, t, Some(scale))?;
            true
        } else {
            let groups = Groups::packed(h, hc);
            ops::rmsnorm(
                c,
                rec,
                &self.norm_spec(Some((&w.norm, wide))),
                &s.wide,
                groups,
                &s.normed,
                groups,
                t,
            )?;
            let x = View::new(&s.normed, 0, wide);
            w.down_inject
                .record_silu0(c, rec, x, &outs, t, Some(scale))?
        };
        let x = View::new(&s.low, 0, r);
        let silu = if in_store {
            XForm::Plain
        } else {
            kernels::prepare_x(c, rec, &w.up, x, XForm::SiluScale(scale), t)?
        };
        if hc <= 4 && w.up.parts.len() == 1 {
            let store = Store::Mix {
                out: View::new(&s.x_in, 0, h),
                normed: &s.normed,
                h,
                hc,
            };
            return kernels::matvec_with(c, rec, &w.up, x, silu, store, t);
        }
        let gates = Store::Rows(View::new(&s.gates, 0, wide));
        kernels::matvec_with(c, rec, &w.up, x, silu, gates, t)?;
        ops::hc_mix_out(c, rec, &s.gates, &s.normed, &s.x_in, h, hc, t)
    }
}
