//! Launchers for shaders/ple.wgsl: the PLE gate (`ple_gate`) and dilated conv (`ple_conv`).

use super::gdn::Span;
use super::{need, u, words};
use crate::gpu::buffers::GpuBuf;
use crate::gpu::kernels::Recorder;
use crate::gpu::pipelines::PipelineKey;
use crate::gpu::{GpuContext, GpuError};

/// PLE shapes.
#[derive(Clone, Copy)]
pub struct PleShape {
    pub h: usize,
    pub hc: usize,
    pub kernel: usize,
    pub dilation: usize,
}

impl PleShape {
    fn params(&self, tokens: Span, pos0: usize) -> Result<Vec<u8>, GpuError> {
        Ok(words(&[
            u(tokens.count)?,
            u(self.h)?,
            u(self.hc)?,
            u(self.kernel)?,
            u(self.dilation)?,
            u(pos0)?,
            u(tokens.first)?,
        ]))
    }
}

/// P[t, s] = sigmoid(signed_sqrt(<KN_s, QN_s>/sqrt(h))) * V[t].
#[allow(clippy::too_many_arguments)]
pub fn ple_gate(
    ctx: &GpuContext,
    rec: &mut Recorder,
    shape: &PleShape,
    key_normed: &GpuBuf,
    query_normed: &GpuBuf,
    value: &GpuBuf,
    gated: &GpuBuf,
    tokens: usize,
) -> Result<(), GpuError> {
    let wide = shape.h * shape.hc;
    need(key_normed, tokens * wide, "ple key")?;
    need(query_normed, tokens * wide, "ple query")?;
    need(value, tokens * shape.h, "ple value")?;
    need(gated, tokens * wide, "ple gated")?;
    rec.push(
        ctx,
        &PipelineKey::new("ple", "ple_gate"),
        &[
            (0, &*key_normed.buffer),
            (1, &*query_normed.buffer),
            (2, &*value.buffer),
            (3, &*gated.buffer),
        ],
        &shape.params(Span::from(tokens), 0)?,
        [u(shape.hc)?, u(tokens)?, 1],
    )
}

/// wide += P + silu(dilated conv of N), advancing the history: the tokens at columns `tokens` of
/// `normed` (N), `gated` (P) and `wide`, the first at position `pos0`.
#[allow(clippy::too_many_arguments)]
pub fn ple_conv(
    ctx: &GpuContext,
    rec: &mut Recorder,
    shape: &PleShape,
    normed: &GpuBuf,
    gated: &GpuBuf,
    conv_weight: &GpuBuf,
    history: &GpuBuf,
    wide: &GpuBuf,
    tokens: impl Into<Span>,
    pos0: usize,
) -> Result<(), GpuError> {
    let tokens = tokens.into();
    let width = shape.h * shape.hc;
    let hist = (shape.kernel.max(1) - 1) * shape.dilation;
    let end = tokens.end();
    need(normed, end * width, "ple normed")?;
    need(gated, end * width, "ple gated")?;
    need(conv_weight, width * shape.kernel, "ple conv weight")?;
    need(history, hist.max(1) * width, "ple history")?;
    need(wide, end * width, "ple residual")?;
    rec.push(
        ctx,
        &PipelineKey::new("ple", "ple_conv"),
        &[
            (4, &*normed.buffer),
            (5, &*gated.buffer),
            (6, &*conv_weight.buffer),
            (7, &*history.buffer),
            (8, &*wide.buffer),
        ],
        &shape.params(tokens, pos0)?,
        [u(width.div_ceil(64))?, 1, 1],
    )
}
