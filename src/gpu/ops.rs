//! Launchers for the non-matvec kernels (norms, hyper-connections, GDN, PLE, QSA, MoE). Each one
//! packs its shader's `Params` (passed as immediates) and the buffers the entry point binds.

use super::buffers::GpuBuf;
use super::kernels::Recorder;
use super::pipelines::PipelineKey;
use super::{GpuContext, GpuError};
use crate::model::config::KvType;

fn u(v: usize) -> Result<u32, GpuError> {
    u32::try_from(v).map_err(|_| GpuError::BadArgs(format!("{v} does not fit in u32")))
}

fn words(values: &[u32]) -> Vec<u8> {
    bytemuck::cast_slice(values).to_vec()
}

fn need(buf: &GpuBuf, len: usize, what: &str) -> Result<(), GpuError> {
    if buf.len < len {
        return Err(GpuError::BadArgs(format!(
            "{what}: buffer of {} elements, {len} needed",
            buf.len
        )));
    }
    Ok(())
}

/// Which norm `rmsnorm` computes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum NormMode {
    /// x / sqrt(mean(x^2) + eps)
    Rms,
    /// x / sqrt(sum(x^2) + eps)
    L2,
}

/// Where the groups of a norm live: group g of token t starts at `off + t*token_stride + g*group_stride`.
#[derive(Clone, Copy)]
pub struct Groups {
    pub n: usize,
    pub groups: usize,
    pub off: usize,
    pub group_stride: usize,
    pub token_stride: usize,
}

impl Groups {
    /// `groups` contiguous groups of `n` per token, tokens packed.
    pub fn packed(n: usize, groups: usize) -> Self {
        Self {
            n,
            groups,
            off: 0,
            group_stride: n,
            token_stride: n * groups,
        }
    }

    fn end(&self, tokens: usize) -> usize {
        if tokens == 0 || self.groups == 0 {
            return 0;
        }
        self.off + (tokens - 1) * self.token_stride + (self.groups - 1) * self.group_stride + self.n
    }
}

/// Norm parameters shared by the three entry points.
#[derive(Clone, Copy)]
pub struct NormSpec<'a> {
    pub mode: NormMode,
    pub eps: f32,
    pub scale: f32,
    /// Weight and its period (see shaders/norm.wgsl); None = no weight.
    pub weight: Option<(&'a GpuBuf, usize)>,
}

#[allow(clippy::too_many_arguments)]
fn norm_params(
    spec: &NormSpec,
    src: Groups,
    dst: Groups,
    tokens: usize,
) -> Result<Vec<u8>, GpuError> {
    let period = spec.weight.map(|(_, p)| p).unwrap_or(0);
    let mut w = vec![
        u(src.n)?,
        u(src.groups)?,
        u(tokens)?,
        match spec.mode {
            NormMode::Rms => 0,
            NormMode::L2 => 1,
        },
        u(src.off)?,
        u(src.group_stride)?,
        u(src.token_stride)?,
        u(dst.off)?,
        u(dst.group_stride)?,
        u(dst.token_stride)?,
        u(period)?,
    ];
    w.push(spec.eps.to_bits());
    w.push(spec.scale.to_bits());
    // The rotation fields of rmsnorm_rope (unused by the other entry points).
    w.extend([0, 0, 0]);
    Ok(words(&w))
}

fn weight_or<'a>(spec: &NormSpec<'a>, fallback: &'a GpuBuf) -> Result<&'a GpuBuf, GpuError> {
    match spec.weight {
        Some((w, period)) => {
            need(w, period, "norm weight")?;
            Ok(w)
        }
        None => Ok(fallback),
    }
}

/// y = norm(x) per group (out of place).
#[allow(clippy::too_many_arguments)]
pub fn rmsnorm(
    ctx: &GpuContext,
    rec: &mut Recorder,
    spec: &NormSpec,
    x: &GpuBuf,
    src: Groups,
    y: &GpuBuf,
    dst: Groups,
    tokens: usize,
) -> Result<(), GpuError> {
    need(x, src.end(tokens), "rmsnorm input")?;
    need(y, dst.end(tokens), "rmsnorm output")?;
    let w = weight_or(spec, x)?;
    let params = norm_params(spec, src, dst, tokens)?;
    rec.push(
        ctx,
        &PipelineKey::new("norm", "rmsnorm"),
        &[(0, &*x.buffer), (1, &*y.buffer), (2, &*w.buffer)],
        &params,
        [u(src.groups)?, u(tokens)?, 1],
    )
}

/// In-place norm of the groups of `y`.
pub fn rmsnorm_inplace(
    ctx: &GpuContext,
    rec: &mut Recorder,
    spec: &NormSpec,
    y: &GpuBuf,
    groups: Groups,
    tokens: usize,
    dummy: &GpuBuf,
) -> Result<(), GpuError> {
    need(y, groups.end(tokens), "rmsnorm input")?;
    let w = weight_or(spec, dummy)?;
    let params = norm_params(spec, groups, groups, tokens)?;
    rec.push(
        ctx,
        &PipelineKey::new("norm", "rmsnorm_inplace"),
        &[(1, &*y.buffer), (2, &*w.buffer)],
        &params,
        [u(groups.groups)?, u(tokens)?, 1],
    )
}

/// In-place norm of the groups of `y`, then the rotation of [`rope`] (pairs `(i, i + half)` of
/// each group at positions `pos0 + t * pos_step`): one dispatch, the same bits as
/// [`rmsnorm_inplace`] followed by [`rope`] with the groups as heads.
#[allow(clippy::too_many_arguments)]
pub fn rmsnorm_rope(
    ctx: &GpuContext,
    rec: &mut Recorder,
    spec: &NormSpec,
    y: &GpuBuf,
    groups: Groups,
    tokens: usize,
    dummy: &GpuBuf,
    table: &GpuBuf,
    half: usize,
    pos0: usize,
    pos_step: usize,
) -> Result<(), GpuError> {
    if tokens == 0 {
        return Ok(());
    }
    need(y, groups.end(tokens), "rmsnorm input")?;
    if 2 * half > groups.n {
        return Err(GpuError::BadArgs(format!(
            "rotating {half} pairs of a group of {}",
            groups.n
        )));
    }
    need(
        table,
        (pos0 + (tokens - 1) * pos_step + 1) * half * 2,
        "rope table (context too long?)",
    )?;
    let w = weight_or(spec, dummy)?;
    let mut params = norm_params(spec, groups, groups, tokens)?;
    let n = params.len();
    params[n - 12..].copy_from_slice(&words(&[u(half)?, u(pos0)?, u(pos_step)?]));
    rec.push(
        ctx,
        &PipelineKey::new("norm", "rmsnorm_rope"),
        &[(1, &*y.buffer), (2, &*w.buffer), (4, &*table.buffer)],
        &params,
        [u(groups.groups)?, u(tokens)?, 1],
    )
}

/// One set of groups for [`rmsnorm_rope2`]: its norm, buffer and layout.
#[derive(Clone, Copy)]
pub struct RopeGroups<'a> {
    pub spec: &'a NormSpec<'a>,
    pub y: &'a GpuBuf,
    pub groups: Groups,
}

/// [`rmsnorm_rope`] over two sets of groups at the same positions (an attention layer's query
/// heads and key heads) in one dispatch when their norms differ only in the weight buffer, else
/// as two dispatches. Each group gets [`rmsnorm_rope`]'s arithmetic; a shader compiler may
/// contract it differently in the two kernels, so a model takes one path for every chunk (which
/// one depends only on its norms).
#[allow(clippy::too_many_arguments)]
pub fn rmsnorm_rope2(
    ctx: &GpuContext,
    rec: &mut Recorder,
    a: RopeGroups,
    b: RopeGroups,
    tokens: usize,
    dummy: &GpuBuf,
    table: &GpuBuf,
    half: usize,
    pos0: usize,
) -> Result<(), GpuError> {
    let period = |s: &NormSpec| s.weight.map(|(_, p)| p);
    let shared = a.spec.mode == b.spec.mode
        && a.spec.eps.to_bits() == b.spec.eps.to_bits()
        && a.spec.scale.to_bits() == b.spec.scale.to_bits()
        && period(a.spec) == period(b.spec)
        && a.groups.n == b.groups.n;
    if !shared || tokens == 0 || a.groups.groups == 0 || b.groups.groups == 0 {
        for g in [a, b] {
            rmsnorm_rope(
                ctx, rec, g.spec, g.y, g.groups, tokens, dummy, table, half, pos0, 1,
            )?;
        }
        return Ok(());
    }
    need(a.y, a.groups.end(tokens), "rmsnorm input")?;
    need(b.y, b.groups.end(tokens), "rmsnorm input")?;
    if 2 * half > a.groups.n {
        return Err(GpuError::BadArgs(format!(
            "rotating {half} pairs of a group of {}",
            a.groups.n
        )));
    }
    need(
        table,
        (pos0 + tokens) * half * 2,
        "rope table (context too long?)",
    )?;
    let wa = weight_or(a.spec, dummy)?;
    let wb = weight_or(b.spec, dummy)?;
    // Set B's layout travels in the out_* fields (unused in place).
    let mut params = norm_params(a.spec, a.groups, b.groups, tokens)?;
    let n = params.len();
    params[n - 12..].copy_from_slice(&words(&[u(half)?, u(pos0)?, 1]));
    rec.push(
        ctx,
        &PipelineKey::new("norm", "rmsnorm_rope2"),
        &[
            (1, &*a.y.buffer),
            (2, &*wa.buffer),
            (4, &*table.buffer),
            (5, &*b.y.buffer),
            (6, &*wb.buffer),
        ],
        &params,
        [u(a.groups.groups + b.groups.groups)?, u(tokens)?, 1],
    )
}

/// y = rmsnorm(x) * w * sigmoid(z), z laid out like x (the GDN output norm).
#[allow(clippy::too_many_arguments)]
pub fn rmsnorm_gated(
    ctx: &GpuContext,
    rec: &mut Recorder,
    spec: &NormSpec,
    x: &GpuBuf,
    z: &GpuBuf,
    src: Groups,
    y: &GpuBuf,
    dst: Groups,
    tokens: usize,
) -> Result<(), GpuError> {
    need(x, src.end(tokens), "gated norm input")?;
    need(z, src.end(tokens), "gated norm gate")?;
    need(y, dst.end(tokens), "gated norm output")?;
    let w = weight_or(spec, x)?;
    let params = norm_params(spec, src, dst, tokens)?;
    rec.push(
        ctx,
        &PipelineKey::new("norm", "rmsnorm_gated"),
        &[
            (0, &*x.buffer),
            (1, &*y.buffer),
            (2, &*w.buffer),
            (3, &*z.buffer),
        ],
        &params,
        [u(src.groups)?, u(tokens)?, 1],
    )
}

#[repr(C)]
#[derive(Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
struct ElementwiseParams {
    count: u32,
    a: f32,
    width: u32,
    rows: u32,
    src_off: u32,
    src_stride: u32,
    dst_off: u32,
    dst_stride: u32,
    row0: u32,
    ratio: u32,
}

fn flat_grid(count: usize) -> Result<[u32; 3], GpuError> {
    let groups = count.div_ceil(64);
    let x = groups.min(65535);
    Ok([u(x)?, u(groups.div_ceil(x.max(1)))?, 1])
}

/// y[i] = silu(y[i] * a) for the first `count` elements.
pub fn silu_scale(
    ctx: &GpuContext,
    rec: &mut Recorder,
    y: &GpuBuf,
    count: usize,
    a: f32,
) -> Result<(), GpuError> {
    need(y, count, "silu")?;
    let params = ElementwiseParams {
        count: u(count)?,
        a,
        ..Default::default()
    };
    rec.push(
        ctx,
        &PipelineKey::new("elementwise", "silu_scale"),
        &[(1, &*y.buffer)],
        bytemuck::bytes_of(&params),
        flat_grid(count)?,
    )
}

/// gate[i] = silu(gate[i]) * up[i].
pub fn swiglu(
    ctx: &GpuContext,
    rec: &mut Recorder,
    gate: &GpuBuf,
    up: &GpuBuf,
    count: usize,
) -> Result<(), GpuError> {
    need(gate, count, "swiglu gate")?;
    need(up, count, "swiglu up")?;
    let params = ElementwiseParams {
        count: u(count)?,
        ..Default::default()
    };
    rec.push(
        ctx,
        &PipelineKey::new("elementwise", "swiglu"),
        &[(0, &*up.buffer), (1, &*gate.buffer)],
        bytemuck::bytes_of(&params),
        flat_grid(count)?,
    )
}

/// dst[dst_off + (row0 + t) * dst_stride + i] = src[src_off + t * src_stride + i], i < width, t < rows.
#[allow(clippy::too_many_arguments)]
pub fn copy_rows(
    ctx: &GpuContext,
    rec: &mut Recorder,
    src: &GpuBuf,
    src_off: usize,
    src_stride: usize,
    dst: &GpuBuf,
    dst_off: usize,
    dst_stride: usize,
    row0: usize,
    rows: usize,
    width: usize,
) -> Result<(), GpuError> {
    if rows == 0 {
        return Ok(());
    }
    need(
        src,
        src_off + (rows - 1) * src_stride + width,
        "copy source",
    )?;
    need(
        dst,
        dst_off + (row0 + rows - 1) * dst_stride + width,
        "copy destination",
    )?;
    let params = ElementwiseParams {
        width: u(width)?,
        rows: u(rows)?,
        src_off: u(src_off)?,
        src_stride: u(src_stride)?,
        dst_off: u(dst_off)?,
        dst_stride: u(dst_stride)?,
        row0: u(row0)?,
        ..Default::default()
    };
    rec.push(
        ctx,
        &PipelineKey::new("elementwise", "copy_rows"),
        &[(0, &*src.buffer), (1, &*dst.buffer)],
        bytemuck::bytes_of(&params),
        [u(width.div_ceil(64))?, u(rows)?, 1],
    )
}

/// Block means of raw indexer keys: blocks [first, first + count) of `ratio` rows of `width`.
#[allow(clippy::too_many_arguments)]
pub fn block_mean(
    ctx: &GpuContext,
    rec: &mut Recorder,
    raw: &GpuBuf,
    out: &GpuBuf,
    first: usize,
    count: usize,
    ratio: usize,
    width: usize,
) -> Result<(), GpuError> {
    if count == 0 {
        return Ok(());
    }
    need(raw, (first + count) * ratio * width, "block mean input")?;
    need(out, (first + count) * width, "block mean output")?;
    let params = ElementwiseParams {
        width: u(width)?,
        rows: u(count)?,
        row0: u(first)?,
        ratio: u(ratio)?,
        ..Default::default()
    };
    rec.push(
        ctx,
        &PipelineKey::new("elementwise", "block_mean"),
        &[(0, &*raw.buffer), (1, &*out.buffer)],
        bytemuck::bytes_of(&params),
        [u(width.div_ceil(64))?, u(count)?, 1],
    )
}

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

/// Parameters of shaders/qsa.wgsl. `first`: the column of the chunk's first token in the buffers
/// that hold a row per token (queries, index queries, attention output; [`kv_pack`]'s stage),
/// 0 for a sequence fed alone, a batch member's first column in the batch's buffers; the
/// scores, selections and partials stay the sequence's own, from row 0.
#[repr(C)]
#[derive(Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct QsaParams {
    pub tokens: u32,
    pub pos0: u32,
    pub heads: u32,
    pub head_stride: u32,
    pub row_stride: u32,
    pub off: u32,
    pub half: u32,
    pub pos_step: u32,
    pub n_kv: u32,
    pub hd: u32,
    pub ratio: u32,
    pub budget: u32,
    pub idim: u32,
    pub max_blocks: u32,
    pub dense: u32,
    pub scale: f32,
    pub first: u32,
}

/// `--kv f16` or `q8_0`: the `count` values of `stage` (f32) rounded into the flat cache `cache`
/// from value `first` on (`qsa.wgsl`'s `kv_pack` and `kv_pack_q8`; the values before `first` are
/// kept). q8_0 takes whole blocks of 32 values.
pub fn kv_pack(
    ctx: &GpuContext,
    rec: &mut Recorder,
    kv: KvType,
    stage: &GpuBuf,
    cache: &GpuBuf,
    first: usize,
    count: usize,
) -> Result<(), GpuError> {
    kv_pack_from(ctx, rec, kv, (stage, 0), cache, first, count)
}

/// [`kv_pack`] of the `count` values of `stage.0` from value `stage.1` on (a batch member's
/// columns of the batch's stage buffer).
pub fn kv_pack_from(
    ctx: &GpuContext,
    rec: &mut Recorder,
    kv: KvType,
    (stage, from): (&GpuBuf, usize),
    cache: &GpuBuf,
    first: usize,
    count: usize,
) -> Result<(), GpuError> {
    need(stage, from + count, "kv stage")?;
    let end = first + count;
    // The entry point, the cache words the values end in, and one invocation per word (f16) or
    // per block (q8_0).
    let (entry, words, invocations) = match kv {
        KvType::F16 => ("kv_pack", end.div_ceil(2), end.div_ceil(2) - first / 2),
        KvType::Q8_0 => {
            let block = crate::model::config::KV_Q8_BLOCK;
            if !first.is_multiple_of(block) || !count.is_multiple_of(block) {
                return Err(GpuError::BadArgs(format!(
                    "q8_0 cache: values {first}..{end} are not whole blocks"
                )));
            }
            ("kv_pack_q8", end / block * 9, count / block)
        }
        KvType::F32 => return Err(GpuError::BadArgs("no pack for an f32 cache".into())),
    };
    if cache.len < words || invocations.div_ceil(64) > 65535 {
        return Err(GpuError::BadArgs(format!(
            "{kv:?} cache of {} words: values {first}..{end} do not fit one pack",
            cache.len
        )));
    }
    let params = QsaParams {
        off: u(first)?,
        row_stride: u(count)?,
        first: u(from)?,
        ..Default::default()
    };
    rec.push(
        ctx,
        &PipelineKey::new("qsa", entry),
        &[(12, &*stage.buffer), (13, &*cache.buffer)],
        bytemuck::bytes_of(&params),
        [u(invocations.div_ceil(64))?, 1, 1],
    )
}

/// A stage buffer of a batch and the f32 cache its rows go to ([`kv_store`]).
#[derive(Clone, Copy)]
pub struct StageRows<'a> {
    pub stage: &'a GpuBuf,
    pub cache: &'a GpuBuf,
}

/// A batch member's new keys and values (`width` values per token) and raw index keys (`idim`
/// per token; 0: none, and `index` is only bound) from columns `tokens` of the batch's stage
/// buffers into its f32 caches from position `pos0` on: one dispatch (`qsa.wgsl`'s `kv_store`),
/// the words moved as they are.
#[allow(clippy::too_many_arguments)]
pub fn kv_store(
    ctx: &GpuContext,
    rec: &mut Recorder,
    [keys, values]: [StageRows; 2],
    index: StageRows,
    width: usize,
    idim: usize,
    tokens: impl Into<Span>,
    pos0: usize,
) -> Result<(), GpuError> {
    let tokens = tokens.into();
    if tokens.count == 0 {
        return Ok(());
    }
    let sets = if idim > 0 {
        need(index.stage, tokens.end() * idim, "index key stage")?;
        need(index.cache, (pos0 + tokens.count) * idim, "index key cache")?;
        3
    } else {
        2
    };
    for (rows, what) in [(keys, "key"), (values, "value")] {
        need(rows.stage, tokens.end() * width, &format!("{what} stage"))?;
        need(
            rows.cache,
            (pos0 + tokens.count) * width,
            &format!("{what} cache"),
        )?;
    }
    let params = QsaParams {
        tokens: u(tokens.count)?,
        pos0: u(pos0)?,
        row_stride: u(width)?,
        idim: u(idim)?,
        first: u(tokens.first)?,
        ..Default::default()
    };
    rec.push(
        ctx,
        &PipelineKey::new("qsa", "kv_store"),
        &[
            (14, &*keys.stage.buffer),
            (15, &*values.stage.buffer),
            (16, &*index.stage.buffer),
            (17, &*keys.cache.buffer),
            (18, &*values.cache.buffer),
            (19, &*index.cache.buffer),
        ],
        bytemuck::bytes_of(&params),
        [u(width.max(idim).div_ceil(64))?, u(tokens.count)?, sets],
    )
}

/// Rotate `heads` vectors per row in place (positions pos0 + t*pos_step).
#[allow(clippy::too_many_arguments)]
pub fn rope(
    ctx: &GpuContext,
    rec: &mut Recorder,
    y: &GpuBuf,
    table: &GpuBuf,
    rows: usize,
    heads: usize,
    head_stride: usize,
    row_stride: usize,
    off: usize,
    half: usize,
    pos0: usize,
    pos_step: usize,
) -> Result<(), GpuError> {
    if rows == 0 || half == 0 {
        return Ok(());
    }
    need(
        y,
        off + (rows - 1) * row_stride + (heads - 1) * head_stride + 2 * half,
        "rope data",
    )?;
    need(
        table,
        (pos0 + (rows - 1) * pos_step + 1) * half * 2,
        "rope table (context too long?)",
    )?;
    let params = QsaParams {
        tokens: u(rows)?,
        pos0: u(pos0)?,
        heads: u(heads)?,
        head_stride: u(head_stride)?,
        row_stride: u(row_stride)?,
        off: u(off)?,
        half: u(half)?,
        pos_step: u(pos_step)?,
        ..Default::default()
    };
    rec.push(
        ctx,
        &PipelineKey::new("qsa", "rope"),
        &[(0, &*y.buffer), (1, &*table.buffer)],
        bytemuck::bytes_of(&params),
        [u(half.div_ceil(64))?, u(heads)?, u(rows)?],
    )
}

/// Invocations of a `qsa_score` workgroup (shaders/qsa.wgsl `WG`): one block each.
const QSA_SCORE_WG: usize = 64;
/// Query tokens per `qsa_score` workgroup (`SCORE_TOKENS`): each staged block key serves them all.
const QSA_SCORE_TOKENS: usize = 16;

/// Block selection per query token (see shaders/qsa.wgsl): the blocks' scores spread over many
/// workgroups (`qsa_score`, only where some token has more blocks than the budget), then one
/// workgroup per token selects (`qsa_select`).
#[allow(clippy::too_many_arguments)]
pub fn qsa_select(
    ctx: &GpuContext,
    rec: &mut Recorder,
    params: &QsaParams,
    index_queries: &GpuBuf,
    block_keys: &GpuBuf,
    scratch: &GpuBuf,
    selected: &GpuBuf,
) -> Result<(), GpuError> {
    let t = params.tokens as usize;
    let end = params.first as usize + t;
    need(
        index_queries,
        end * params.heads as usize * params.idim as usize,
        "qsa index queries",
    )?;
    need(scratch, t * 2 * params.max_blocks as usize, "qsa scratch")?;
    need(selected, t * (params.budget as usize + 1), "qsa selection")?;
    // Blocks of the chunk's last token: the most any of its tokens has.
    let most_blocks = (params.pos0 as usize + t) / params.ratio.max(1) as usize;
    if most_blocks > params.budget as usize {
        if most_blocks > params.max_blocks as usize {
            return Err(GpuError::BadArgs(format!(
                "qsa selection: {most_blocks} blocks, room for {}",
                params.max_blocks
            )));
        }
        rec.push(
            ctx,
            &PipelineKey::new("qsa", "qsa_score"),
            &[
                (2, &*index_queries.buffer),
                (3, &*block_keys.buffer),
                (4, &*scratch.buffer),
            ],
            bytemuck::bytes_of(params),
            [
                u(most_blocks.div_ceil(QSA_SCORE_WG))?,
                u(t.div_ceil(QSA_SCORE_TOKENS))?,
                1,
            ],
        )?;
    }
    rec.push(
        ctx,
        &PipelineKey::new("qsa", "qsa_select"),
        &[(4, &*scratch.buffer), (5, &*selected.buffer)],
        bytemuck::bytes_of(params),
        [u(t)?, 1, 1],
    )
}

/// Most keys one query may attend to on the GPU (sizes the attention partials).
pub const QSA_MAX_KEYS: usize = 2560;
/// Keys per attention chunk (shaders/qsa.wgsl `ATT_CHUNK`).
pub const QSA_CHUNK: usize = 256;

/// Floats of attention partials a chunk of `tokens` queries needs (see [`qsa_attend`]).
pub fn qsa_partials_len(tokens: usize, heads: usize, hd: usize) -> usize {
    tokens * heads * QSA_MAX_KEYS.div_ceil(QSA_CHUNK) * (hd + 2)
}

/// `qsa_attend`'s workgroup size and its most query heads per workgroup (ATT_WG, MAX_GROUP).
const QSA_ATT_WG: usize = 256;
const QSA_MAX_GROUP: usize = 16;
/// Chunks of at least this many tokens group the query heads of a kv head in one workgroup.
const QSA_GROUP_MIN_TOKENS: usize = 8;
/// Shorter chunks (decode) group at most this many: the heads spread over more workgroups, while
/// each key tile still serves several. (H200, 48 layers, 2,100 keys: `qsa_attend` 1,196 us per
/// step with one head per workgroup, 875 with 4; `docs/bench/attend-group.txt`.)
const QSA_DECODE_GROUP: usize = 4;

/// Workgroup memory `qsa_attend` needs with key tiles of `kt` dims and `group` heads.
fn attend_memory(kt: usize, group: usize) -> usize {
    let tile = QSA_CHUNK * (kt / 4 + 1) * 16;
    tile + QSA_CHUNK * 4 * (group + 1) + QSA_ATT_WG * 4 * group
}

/// `qsa_attend`'s query heads per workgroup (GROUP) and dims per key tile (KT_DIMS): the most
/// heads of one kv head (a divisor of `heads / n_kv`; at most [`QSA_DECODE_GROUP`] for a decode
/// step or a short chunk) that fit, with tiles of 32 dims where the device's workgroup memory
/// still holds them, else 16. Every head's
/// arithmetic is the same whatever the choice, so the same bits (`STRATA_ATTEND_TILE=16` forces
/// the smaller tile, `STRATA_ATTEND_GROUP=1` one head per workgroup, to check that;
/// `STRATA_ATTEND_GROUP=N` at most N heads per workgroup for every chunk, decode too, for tuning).
fn attend_shape(ctx: &GpuContext, tokens: usize, heads: usize, n_kv: usize) -> (usize, usize) {
    let forced_small = std::env::var("STRATA_ATTEND_TILE").as_deref() == Ok("16");
    let forced_group = std::env::var("STRATA_ATTEND_GROUP")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|n| *n >= 1);
    let limit = ctx.limits.max_compute_workgroup_storage_size as usize;
    let tiles: &[usize] = if forced_small { &[16] } else { &[32, 16] };
    let per_kv = if n_kv > 0 && heads.is_multiple_of(n_kv) {
        heads / n_kv
    } else {
        1
    };
    let most = match forced_group {
        Some(n) => n.min(per_kv).min(QSA_MAX_GROUP),
        None if tokens >= QSA_GROUP_MIN_TOKENS => per_kv.min(QSA_MAX_GROUP),
        None => per_kv.min(QSA_DECODE_GROUP),
    };
    for group in (1..=most).rev().filter(|g| per_kv.is_multiple_of(*g)) {
        for &kt in tiles {
            if attend_memory(kt, group) <= limit {
                return (group, kt);
            }
        }
    }
    (1, 16)
}

/// Attention over the selected keys, with the sigmoid output gate: partial softmax per chunk of
/// keys into `partials`, then the chunks merged in order (two dispatches).
#[allow(clippy::too_many_arguments)]
pub fn qsa_attend(
    ctx: &GpuContext,
    rec: &mut Recorder,
    params: &QsaParams,
    queries: &GpuBuf,
    keys: &GpuBuf,
    values: &GpuBuf,
    selected: &GpuBuf,
    partials: &GpuBuf,
    out: &GpuBuf,
    kv: KvType,
) -> Result<(), GpuError> {
    let t = params.tokens as usize;
    let h = params.heads as usize;
    let hd = params.hd as usize;
    let chunks = QSA_MAX_KEYS.div_ceil(QSA_CHUNK);
    let mode = match kv {
        KvType::F32 => 0.0,
        KvType::F16 => 1.0,
        KvType::Q8_0 => 2.0,
    };
    let (group, kt) = attend_shape(ctx, t, h, params.n_kv as usize);
    let attend = if group > 1 {
        PipelineKey::new("qsa", "qsa_attend_group").constant("GROUP", group as f64)
    } else {
        PipelineKey::new("qsa", "qsa_attend")
    }
    .constant("KV_MODE", mode)
    .constant("KT_DIMS", kt as f64);
    need(partials, qsa_partials_len(t, h, hd), "qsa partials")?;
    let params = QsaParams {
        max_blocks: u(chunks)?,
        ..*params
    };
    if params.dense != 0 && params.pos0 as usize + t > QSA_MAX_KEYS {
        return Err(GpuError::Unsupported(format!(
            "dense attention past {QSA_MAX_KEYS} tokens on the GPU"
        )));
    }
    let end = params.first as usize + t;
    need(queries, end * h * 2 * hd, "qsa queries")?;
    need(out, end * h * hd, "qsa output")?;
    rec.push(
        ctx,
        &attend,
        &[
            (6, &*queries.buffer),
            (7, &*keys.buffer),
            (8, &*values.buffer),
            (9, &*selected.buffer),
            (11, &*partials.buffer),
        ],
        bytemuck::bytes_of(&params),
        [u(h / group)?, u(chunks)?, u(t)?],
    )?;
    rec.push(
        ctx,
        &PipelineKey::new("qsa", "qsa_merge"),
        &[
            (6, &*queries.buffer),
            (9, &*selected.buffer),
            (10, &*out.buffer),
            (11, &*partials.buffer),
        ],
        bytemuck::bytes_of(&params),
        [u(h)?, u(t)?, 1],
    )
}

/// The router entry point for `n_expert` experts choosing `k`: the register router (`moe.wgsl`'s
/// `moe_router`) up to 1,024 experts (4 per invocation) and k up to 16 (its candidate room), else
/// the wide one. Chosen from the shape alone, so every run of a model takes the same one.
pub fn router_entry(n_expert: usize, k: usize) -> &'static str {
    if n_expert <= 1024 && k <= 16 {
        "moe_router"
    } else {
        "moe_router_wide"
    }
}

/// Softmax router with top-k (in place on the logits).
#[allow(clippy::too_many_arguments)]
pub fn moe_router(
    ctx: &GpuContext,
    rec: &mut Recorder,
    logits: &GpuBuf,
    ids: &GpuBuf,
    weights: &GpuBuf,
    n_expert: usize,
    k: usize,
    tokens: usize,
) -> Result<(), GpuError> {
    let entry = router_entry(n_expert, k);
    moe_router_entry(ctx, rec, entry, logits, ids, weights, n_expert, k, tokens)
}

/// [`moe_router`] through a given entry point of [`router_entry`]'s (the bench times each).
#[allow(clippy::too_many_arguments)]
pub fn moe_router_entry(
    ctx: &GpuContext,
    rec: &mut Recorder,
    entry: &'static str,
    logits: &GpuBuf,
    ids: &GpuBuf,
    weights: &GpuBuf,
    n_expert: usize,
    k: usize,
    tokens: usize,
) -> Result<(), GpuError> {
    if k > n_expert || k == 0 {
        return Err(GpuError::BadArgs(format!(
            "router of {n_expert} experts choosing {k}: it takes 1 to {n_expert}"
        )));
    }
    need(logits, tokens * n_expert, "router logits")?;
    need(ids, tokens * k, "router ids")?;
    need(weights, tokens * k, "router weights")?;
    rec.push(
        ctx,
        &PipelineKey::new("moe", entry),
        &[
            (0, &*logits.buffer),
            (1, &*ids.buffer),
            (2, &*weights.buffer),
        ],
        &words(&[u(tokens)?, u(n_expert)?, u(k)?, 0, 0, 0]),
        // One workgroup per token (grid x wraps at 65535 into y, as the shader expects).
        [u(tokens.min(65535))?, u(tokens.div_ceil(65535))?, 1],
    )
}

/// Groups the chunk's `tokens * k` routed items by expert for prefill (`moe.wgsl`'s `moe_group`):
/// `groups[e]` counts expert e's items, listed in ascending order from `groups[n_expert + e *
/// tokens]` (see [`group_len`]).
pub fn moe_group(
    ctx: &GpuContext,
    rec: &mut Recorder,
    ids: &GpuBuf,
    groups: &GpuBuf,
    n_expert: usize,
    k: usize,
    tokens: usize,
) -> Result<(), GpuError> {
    need(ids, tokens * k, "router ids")?;
    need(groups, group_len(n_expert, tokens), "expert groups")?;
    rec.push(
        ctx,
        &PipelineKey::new("moe", "moe_group"),
        &[(1, &*ids.buffer), (9, &*groups.buffer)],
        &words(&[u(tokens)?, u(n_expert)?, u(k)?, 0, 0, 0]),
        [u(n_expert)?, 1, 1],
    )
}

/// Split `items` router choices `ids` between a layer's hot experts in VRAM and the host tensor,
/// through `map` = (the expert map, this layer's offset in it): `hot[i]` = the expert's unit
/// (or `u32::MAX`), `cold[i]` = `ids[i]` when that is `u32::MAX`, else `u32::MAX`. The choices
/// are also copied to `log` = (buffer, offset). See moe.wgsl's `moe_split_ids`.
#[allow(clippy::too_many_arguments)]
pub fn moe_split_ids(
    ctx: &GpuContext,
    rec: &mut Recorder,
    ids: &GpuBuf,
    map: (&GpuBuf, usize),
    n_expert: usize,
    (hot, cold, stage): (&GpuBuf, &GpuBuf, &GpuBuf),
    log: (&GpuBuf, usize),
    items: usize,
) -> Result<(), GpuError> {
    need(ids, items, "router ids")?;
    need(map.0, map.1 + n_expert, "expert slot map")?;
    need(hot, items, "hot expert ids")?;
    need(cold, items, "cold expert ids")?;
    need(stage, items, "staged expert ids")?;
    need(log.0, log.1 + items, "routing log")?;
    rec.push(
        ctx,
        &PipelineKey::new("moe", "moe_split_ids"),
        &[
            (1, &*ids.buffer),
            (10, &*map.0.buffer),
            (11, &*hot.buffer),
            (12, &*cold.buffer),
            (13, &*log.0.buffer),
            (14, &*stage.buffer),
        ],
        &words(&[u(items)?, u(n_expert)?, u(map.1)?, u(log.1)?, 0, 0]),
        [u(items.div_ceil(64))?, 1, 1],
    )
}

/// One byte range of an expert unit for [`stage_units`]: units `unit_first ..
/// unit_first + units` of a source tensor part in `src`, unit `e` at byte `src_base + (e -
/// unit_first) * src_stride`, copied to `dst_base + item * dst_stride` in `dst`, `bytes` each (all
/// multiples of 4).
#[derive(Clone, Copy)]
pub struct StageRange<'a> {
    pub src: &'a wgpu::Buffer,
    pub unit_first: usize,
    pub units: usize,
    pub src_base: u64,
    pub src_stride: u64,
    pub dst: &'a wgpu::Buffer,
    pub dst_base: u64,
    pub dst_stride: u64,
    pub bytes: u64,
}

/// Words one `stage_units` workgroup copies (stage.wgsl: STAGE_WG x PER).
const STAGE_WORDS_PER_WG: u64 = 256 * 8;

/// Copy range `r` of each item's expert `ids[item]` (items of other parts and `u32::MAX` ids copy
/// nothing) into the item's unit of a VRAM stage. See stage.wgsl.
pub fn stage_units(
    ctx: &GpuContext,
    rec: &mut Recorder,
    r: StageRange,
    ids: &GpuBuf,
    items: usize,
) -> Result<(), GpuError> {
    need(ids, items, "staged expert ids")?;
    let word = |v: u64, what: &str| -> Result<u32, GpuError> {
        if !v.is_multiple_of(4) {
            return Err(GpuError::BadArgs(format!(
                "expert stage: {what} of {v} bytes is not whole words"
            )));
        }
        u32::try_from(v / 4)
            .map_err(|_| GpuError::BadArgs(format!("expert stage: {what} of {v} bytes")))
    };
    let src_end = r.src_base + r.src_stride * r.units.saturating_sub(1) as u64 + r.bytes;
    let dst_end = r.dst_base + r.dst_stride * items.saturating_sub(1) as u64 + r.bytes;
    let overlap = (items > 1 && r.bytes > r.dst_stride) || (r.units > 1 && r.bytes > r.src_stride);
    if src_end > r.src.size() || dst_end > r.dst.size() || overlap {
        return Err(GpuError::BadArgs(format!(
            "expert stage: a range of {} bytes overlaps or passes its buffers ({src_end} of {}, \
             {dst_end} of {})",
            r.bytes,
            r.src.size(),
            r.dst.size()
        )));
    }
    word(src_end, "the source end")?;
    word(dst_end, "the stage end")?;
    let params = [
        u(items)?,
        u(r.unit_first)?,
        u(r.units)?,
        word(r.src_base, "the source base")?,
        word(r.src_stride, "the source stride")?,
        word(r.dst_base, "the stage base")?,
        word(r.dst_stride, "the stage stride")?,
        word(r.bytes, "the range")?,
    ];
    let groups = (r.bytes / 4).div_ceil(STAGE_WORDS_PER_WG);
    rec.push(
        ctx,
        &PipelineKey::new("stage", "stage_units"),
        &[(0, r.src), (1, r.dst), (2, &*ids.buffer)],
        &words(&params),
        [u(groups as usize)?, u(items)?, 1],
    )
}

/// Words of [`moe_group`]'s output for `tokens` tokens: a count and a list of up to `tokens`
/// items per expert.
pub fn group_len(n_expert: usize, tokens: usize) -> usize {
    n_expert * (1 + tokens)
}

/// Checks the combine's inputs; returns the shared-expert output and gate buffers to bind (the
/// routing weights stand in when there is no shared expert) and the has-shared flag.
fn combine_inputs<'a>(
    expert_out: &GpuBuf,
    weights: &'a GpuBuf,
    shared: Option<(&'a GpuBuf, &'a GpuBuf)>,
    h: usize,
    k: usize,
    tokens: usize,
) -> Result<(&'a GpuBuf, &'a GpuBuf, u32), GpuError> {
    need(expert_out, tokens * k * h, "expert outputs")?;
    need(weights, tokens * k, "routing weights")?;
    match shared {
        Some((sh, sg)) => {
            need(sh, tokens * h, "shared expert output")?;
            need(sg, tokens, "shared gate")?;
            Ok((sh, sg, 1))
        }
        None => Ok((weights, weights, 0)),
    }
}

/// y = sum_slot w * expert_out (+ sigmoid(shared_gate) * shared).
#[allow(clippy::too_many_arguments)]
pub fn moe_combine(
    ctx: &GpuContext,
    rec: &mut Recorder,
    expert_out: &GpuBuf,
    weights: &GpuBuf,
    shared: Option<(&GpuBuf, &GpuBuf)>,
    y: &GpuBuf,
    h: usize,
    k: usize,
    tokens: usize,
) -> Result<(), GpuError> {
    need(y, tokens * h, "moe output")?;
    let (sh, sg, has) = combine_inputs(expert_out, weights, shared, h, k, tokens)?;
    rec.push(
        ctx,
        &PipelineKey::new("moe", "moe_combine"),
        &[
            (3, &*expert_out.buffer),
            (4, &*weights.buffer),
            (5, &*sh.buffer),
            (6, &*sg.buffer),
            (7, &*y.buffer),
        ],
        &words(&[u(tokens)?, 0, u(k)?, u(h)?, has, 0]),
        [u(h.div_ceil(64))?, u(tokens)?, 1],
    )
}

/// [`moe_combine`] added into the wide residual (`hc` streams of `h`) with the injection weights
/// of `inject`, as [`hc_combine`] adds a block output.
#[allow(clippy::too_many_arguments)]
pub fn moe_combine_hc(
    ctx: &GpuContext,
    rec: &mut Recorder,
    expert_out: &GpuBuf,
    weights: &GpuBuf,
    shared: Option<(&GpuBuf, &GpuBuf)>,
    wide: &GpuBuf,
    inject: &GpuBuf,
    h: usize,
    hc: usize,
    k: usize,
    tokens: usize,
) -> Result<(), GpuError> {
    need(wide, tokens * h * hc, "residual")?;
    need(inject, tokens * hc, "injection logits")?;
    let (sh, sg, has) = combine_inputs(expert_out, weights, shared, h, k, tokens)?;
    rec.push(
        ctx,
        &PipelineKey::new("moe", "moe_combine_hc"),
        &[
            (3, &*expert_out.buffer),
            (4, &*weights.buffer),
            (5, &*sh.buffer),
            (6, &*sg.buffer),
            (7, &*wide.buffer),
            (8, &*inject.buffer),
        ],
        &words(&[u(tokens)?, 0, u(k)?, u(h)?, has, u(hc)?]),
        [u(h.div_ceil(64))?, u(tokens)?, 1],
    )
}

/// Per row of `n` values: out[2r] = index of the maximum (lowest index on ties),
/// out[2r+1] = 1 if the row holds a non-finite value.
pub fn argmax(
    ctx: &GpuContext,
    rec: &mut Recorder,
    x: &GpuBuf,
    n: usize,
    rows: usize,
    out: &GpuBuf,
) -> Result<(), GpuError> {
    need(x, n * rows, "argmax input")?;
    need(out, 2 * rows, "argmax output")?;
    rec.push(
        ctx,
        &PipelineKey::new("argmax", "argmax"),
        &[(0, &*x.buffer), (1, &*out.buffer)],
        &words(&[u(n)?, u(rows)?]),
        [u(rows)?, 1, 1],
    )
}
