//! Launchers for shaders/norm.wgsl: the RMS / L2 norms (`rmsnorm`; in place, `rmsnorm_inplace`;
//! fused with the rotation, `rmsnorm_rope` / `rmsnorm_rope2`; gated, `rmsnorm_gated`) and their
//! layout types.

use super::{need, u, words};
use crate::gpu::buffers::GpuBuf;
use crate::gpu::kernels::Recorder;
use crate::gpu::pipelines::PipelineKey;
use crate::gpu::{GpuContext, GpuError};

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
///
/// [`rope`]: super::rope
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
