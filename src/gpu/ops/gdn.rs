//! Launchers for shaders/gdn.wgsl: the GDN conv (`gdn_conv`) and delta-rule recurrence
//! (`gdn_recurrence`, `gdn_recurrence_norm`), with [`Span`], the columns a per-sequence kernel
//! works on.

use super::{need, u, words};
use crate::gpu::buffers::GpuBuf;
use crate::gpu::kernels::Recorder;
use crate::gpu::pipelines::PipelineKey;
use crate::gpu::{GpuContext, GpuError};

/// GDN shapes for the gdn kernels.
#[derive(Clone, Copy)]
pub struct GdnShape {
    pub channels: usize,
    pub kernel: usize,
    pub n_k_heads: usize,
    pub n_v_heads: usize,
    pub dk: usize,
    pub dv: usize,
}

/// The tokens a per-sequence kernel works on: columns `first .. first + count` of the chunk
/// buffers it reads and writes (the sequence's own state buffers have no columns). A sequence
/// fed alone starts at column 0 (`usize` converts to that); a batched pass gives each member its
/// columns of the batch's buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub first: usize,
    pub count: usize,
}

impl Span {
    pub fn new(first: usize, count: usize) -> Self {
        Self { first, count }
    }

    /// Columns the chunk buffers need: `first + count`.
    pub fn end(&self) -> usize {
        self.first + self.count
    }
}

impl From<usize> for Span {
    fn from(count: usize) -> Self {
        Self { first: 0, count }
    }
}

impl GdnShape {
    fn params(&self, tokens: Span) -> Result<Vec<u8>, GpuError> {
        self.params_eps(tokens, 0.0)
    }

    /// The parameters with the gated norm's epsilon (gdn_recurrence_norm).
    fn params_eps(&self, tokens: Span, eps: f32) -> Result<Vec<u8>, GpuError> {
        Ok(words(&[
            u(tokens.count)?,
            u(self.channels)?,
            u(self.kernel)?,
            u(self.n_k_heads)?,
            u(self.n_v_heads)?,
            u(self.dk)?,
            u(self.dv)?,
            u(self.n_k_heads * self.dk)?,
            eps.to_bits(),
            u(tokens.first)?,
        ]))
    }
}

/// Causal depthwise conv + SiLU over the chunk, advancing the history.
#[allow(clippy::too_many_arguments)]
pub fn gdn_conv(
    ctx: &GpuContext,
    rec: &mut Recorder,
    shape: &GdnShape,
    input: &GpuBuf,
    conv_weight: &GpuBuf,
    history: &GpuBuf,
    out: &GpuBuf,
    tokens: impl Into<Span>,
) -> Result<(), GpuError> {
    let tokens = tokens.into();
    if shape.kernel < 2 {
        return Err(GpuError::Unsupported(
            "GDN conv with fewer than 2 taps".into(),
        ));
    }
    need(input, tokens.end() * shape.channels, "gdn conv input")?;
    need(
        conv_weight,
        shape.channels * shape.kernel,
        "gdn conv weight",
    )?;
    need(
        history,
        (shape.kernel - 1) * shape.channels,
        "gdn conv history",
    )?;
    need(out, tokens.end() * shape.channels, "gdn conv output")?;
    rec.push(
        ctx,
        &PipelineKey::new("gdn", "gdn_conv"),
        &[
            (0, &*input.buffer),
            (1, &*conv_weight.buffer),
            (2, &*history.buffer),
            (3, &*out.buffer),
        ],
        &shape.params(tokens)?,
        [u(shape.channels.div_ceil(64))?, 1, 1],
    )
}

/// Largest key head dim the recurrence kernel holds per invocation.
pub const GDN_MAX_DK: usize = 128;

/// What the GDN recurrence reads (and the state it updates in place): the conv output (q, k, v
/// channels of each token), the beta and alpha logits, dt_bias and a per value head, and the
/// state of every value head.
#[derive(Clone, Copy)]
pub struct GdnInputs<'a> {
    pub qkv: &'a GpuBuf,
    pub beta_alpha: &'a GpuBuf,
    pub gate_params: &'a GpuBuf,
    pub state: &'a GpuBuf,
}

impl GdnInputs<'_> {
    fn check(&self, shape: &GdnShape, out: &GpuBuf, tokens: Span) -> Result<(), GpuError> {
        let tokens = tokens.end();
        if shape.dk > GDN_MAX_DK {
            return Err(GpuError::Unsupported(format!(
                "GDN key head dim {} > {GDN_MAX_DK}",
                shape.dk
            )));
        }
        let nv = shape.n_v_heads;
        need(self.qkv, tokens * shape.channels, "gdn qkv")?;
        need(self.beta_alpha, tokens * 2 * nv, "gdn beta/alpha")?;
        need(self.gate_params, 2 * nv, "gdn dt_bias/a")?;
        need(self.state, nv * shape.dk * shape.dv, "gdn state")?;
        need(out, tokens * nv * shape.dv, "gdn output")
    }

    /// Bindings 4..=8 of gdn.wgsl's recurrence entry points.
    fn bindings<'a>(&'a self, out: &'a GpuBuf) -> [(u32, &'a wgpu::Buffer); 5] {
        [
            (4, &*self.qkv.buffer),
            (5, &*self.beta_alpha.buffer),
            (6, &*self.gate_params.buffer),
            (7, &*self.state.buffer),
            (8, &*out.buffer),
        ]
    }
}

/// The delta-rule recurrence over the chunk (state updated in place).
pub fn gdn_recurrence(
    ctx: &GpuContext,
    rec: &mut Recorder,
    shape: &GdnShape,
    inputs: GdnInputs,
    out: &GpuBuf,
    tokens: impl Into<Span>,
) -> Result<(), GpuError> {
    let tokens = tokens.into();
    inputs.check(shape, out, tokens)?;
    let mut b = inputs.bindings(out).to_vec();
    // The gated norm's gate and weight, which this entry point never reads (it shares its body
    // with gdn_recurrence_norm): any buffers.
    b.extend([
        (9, &*inputs.beta_alpha.buffer),
        (10, &*inputs.gate_params.buffer),
    ]);
    rec.push(
        ctx,
        &PipelineKey::new("gdn", "gdn_recurrence"),
        &b,
        &shape.params(tokens)?,
        // Workgroups of 16 value columns x 4 key lanes, one row of them per value head.
        [u(shape.dv.div_ceil(16))?, u(shape.n_v_heads)?, 1],
    )
}

/// Largest value head [`gdn_recurrence_norm`] holds in one workgroup.
pub const GDN_NORM_MAX_DV: usize = 256;

/// The GDN output's gated norm in the recurrence's dispatch ([`gdn_recurrence_norm`]).
#[derive(Clone, Copy)]
pub struct GatedNorm<'a> {
    /// The gate z, `n_v_heads * dv` per token.
    pub z: &'a GpuBuf,
    /// The norm weight, `dv` values (shared by the heads).
    pub weight: &'a GpuBuf,
    pub eps: f32,
}

/// [`gdn_recurrence`] followed by the gated RMS norm of each head's output,
/// `y * inv * weight * sigmoid(z)` with `inv = 1 / sqrt(mean(y^2) + eps)` per (token, head) (what
/// [`rmsnorm_gated`] computes, with its own sum order), in one dispatch: a workgroup per value
/// head of at most [`GDN_NORM_MAX_DV`] values. The recurrence arithmetic is gdn_recurrence's.
///
/// [`rmsnorm_gated`]: super::rmsnorm_gated
pub fn gdn_recurrence_norm(
    ctx: &GpuContext,
    rec: &mut Recorder,
    shape: &GdnShape,
    inputs: GdnInputs,
    norm: GatedNorm,
    out: &GpuBuf,
    tokens: impl Into<Span>,
) -> Result<(), GpuError> {
    let tokens = tokens.into();
    if shape.dv > GDN_NORM_MAX_DV {
        return Err(GpuError::Unsupported(format!(
            "GDN value heads of {} > {GDN_NORM_MAX_DV} in one workgroup",
            shape.dv
        )));
    }
    inputs.check(shape, out, tokens)?;
    need(
        norm.z,
        tokens.end() * shape.n_v_heads * shape.dv,
        "gdn output gate",
    )?;
    need(norm.weight, shape.dv, "gdn norm weight")?;
    let mut b = inputs.bindings(out).to_vec();
    b.extend([(9, &*norm.z.buffer), (10, &*norm.weight.buffer)]);
    // 4 lanes per column; at least the 16 quads that stage a batch's q and k, and a multiple of
    // the batch (8 tokens) for the norm's partial sums.
    let wg = (4 * shape.dv.next_multiple_of(8)).max(64);
    rec.push(
        ctx,
        &PipelineKey::new("gdn", "gdn_recurrence_norm").constant("HEAD_WG", wg as f64),
        &b,
        &shape.params_eps(tokens, norm.eps)?,
        [1, u(shape.n_v_heads)?, 1],
    )
}
