//! Launchers for shaders/hc.wgsl: the hyper-connection mix (`hc_mix_out`) and combine
//! (`hc_combine`).

use super::{need, u, words};
use crate::gpu::buffers::GpuBuf;
use crate::gpu::kernels::Recorder;
use crate::gpu::pipelines::PipelineKey;
use crate::gpu::{GpuContext, GpuError};

/// x_in[t] = mean_s sigmoid(g[t,s]) * n[t,s]  (per element, streams in order).
#[allow(clippy::too_many_arguments)]
pub fn hc_mix_out(
    ctx: &GpuContext,
    rec: &mut Recorder,
    gates: &GpuBuf,
    normed: &GpuBuf,
    out: &GpuBuf,
    h: usize,
    hc: usize,
    tokens: usize,
) -> Result<(), GpuError> {
    need(gates, tokens * h * hc, "hc gates")?;
    need(normed, tokens * h * hc, "hc normed")?;
    need(out, tokens * h, "hc out")?;
    rec.push(
        ctx,
        &PipelineKey::new("hc", "hc_mix_out"),
        &[(0, &*gates.buffer), (1, &*normed.buffer), (2, &*out.buffer)],
        &words(&[u(h)?, u(hc)?, u(tokens)?]),
        [u(h.div_ceil(64))?, u(tokens)?, 1],
    )
}

/// wide[t, s] += 2 sigmoid(inject[t, s] / hc) * y[t].
#[allow(clippy::too_many_arguments)]
pub fn hc_combine(
    ctx: &GpuContext,
    rec: &mut Recorder,
    wide: &GpuBuf,
    y: &GpuBuf,
    inject: &GpuBuf,
    h: usize,
    hc: usize,
    tokens: usize,
) -> Result<(), GpuError> {
    need(wide, tokens * h * hc, "hc residual")?;
    need(y, tokens * h, "hc block output")?;
    need(inject, tokens * hc, "hc inject")?;
    rec.push(
        ctx,
        &PipelineKey::new("hc", "hc_combine"),
        &[(2, &*wide.buffer), (3, &*y.buffer), (4, &*inject.buffer)],
        &words(&[u(h)?, u(hc)?, u(tokens)?]),
        [u((h * hc).div_ceil(64))?, u(tokens)?, 1],
    )
}
