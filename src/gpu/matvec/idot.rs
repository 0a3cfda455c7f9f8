//! The integer-digit arithmetic (`shaders/quant/rows_idot.wgsl`, docs/int-arith.md): x is split
//! once per mat-vec into three signed base-256 digits per value (`xq_split`) and each task's sums
//! are exact `dot4I8Packed` integer sums. A context takes it from `STRATA_ARITH=int` (or `strata
//! bench --synthetic matvec --arith int`, [`GpuContext::set_idot`]) for the split types with
//! integer codes (Q8_0, Q6_K, IQ4_NL, IQ4_XS, IQ3_S, IQ3_XXS, IQ2_S, IQ2_XS, IQ1_S, IQ1_M,
//! Q2_0); every store, the expert entry points and the wide prefill tiles then read the digits,
//! so prefill and decode keep one arithmetic per weight.
//! Input norms are stored apart first (the decode step's own norm kernel), then split.

use super::{
    GpuContext, GpuError, GpuWeight, MatvecParams, Recorder, View, XForm, any_length, specialise,
    to_u32, wg_size, x_params,
};
use crate::gpu::buffers::GpuBuf;
use crate::gpu::kernels::item_grid;
use crate::gpu::pipelines::PipelineKey;
use crate::gpu::shaders;

/// Words per task of a split vector (the shader's XQ_WORDS) and invocations per split workgroup.
const XQ_WORDS: usize = 25;
const XQ_WG: usize = 64;

/// Whether the mat-vec of `w` over `x` takes the experiment's kernels.
pub(super) fn usable(ctx: &GpuContext, w: &GpuWeight, x: View, xform: XForm) -> bool {
    ctx.idot() && shaders::idot_supported(w.ty) && !any_length(w, x, xform)
}

fn shader(w: &GpuWeight) -> String {
    shader_of("matvec_idot", w)
}

/// The assembly `op` (`matvec_idot`, or `matvec_conv_idot` with decode's GDN conv store) of `w`.
pub(super) fn shader_of(op: &str, w: &GpuWeight) -> String {
    format!("{op}:{}", w.ty.name())
}

/// `count` vectors of x (after `xform`) split into digits, with the stride between vectors.
pub(super) struct Split {
    pub buf: GpuBuf,
    pub stride: u32,
}

impl Split {
    /// Point `params` (built for the plain x) at the digits: vectors from 0, `stride` apart, no
    /// transform left to apply.
    pub fn apply(&self, params: &mut MatvecParams) {
        params.x_offset = 0;
        params.x_stride = self.stride;
        params.x_mode = 0;
    }
}

pub(super) fn split(
    ctx: &GpuContext,
    rec: &mut Recorder,
    w: &GpuWeight,
    x: View,
    xform: XForm,
    count: usize,
) -> Result<Split, GpuError> {
    let tasks = w.row_len / 32;
    let stride = XQ_WORDS * tasks;
    let buf = ctx.xq_buffer(count * stride)?;
    let params = x_params(w, x, xform, count)?;
    let x_mode = params.x_mode;
    let (gy, gz) = item_grid(count);
    let gx = to_u32(tasks.div_ceil(XQ_WG), "grid x")?;
    let key = PipelineKey::new(shader(w), "xq_split").constant("X_MODE", f64::from(x_mode));
    rec.push(
        ctx,
        &key,
        &[(1, &*x.buf.buffer), (19, &*buf.buffer)],
        bytemuck::bytes_of(&params),
        [gx, gy, gz],
    )?;
    Ok(Split {
        buf,
        stride: to_u32(stride, "digit stride")?,
    })
}

/// The pipeline of `entry` in the `matvec_idot` assembly (x already transformed).
pub(super) fn key(
    w: &GpuWeight,
    entry: &'static str,
    rows_per_sg: usize,
    items: usize,
) -> PipelineKey {
    key_of("matvec_idot", w, entry, rows_per_sg, items)
}

/// [`key`] in assembly `op` (see [`shader_of`]).
pub(super) fn key_of(
    op: &str,
    w: &GpuWeight,
    entry: &'static str,
    rows_per_sg: usize,
    items: usize,
) -> PipelineKey {
    specialise(
        PipelineKey::new(shader_of(op, w), entry),
        rows_per_sg,
        wg_size(),
        items,
        0,
    )
}

/// Words of workgroup memory the kernels keep for their own tables besides the staged digits
/// (KPART, codebooks, the expert combine's slot rows).
const LOCAL_RESERVE_BYTES: usize = 12 * 1024;

/// Decode's digits staged by each workgroup itself (`IDOT_LOCAL`): the XQL words for `vectors`
/// vectors of `w`'s rows where they fit the adapter's workgroup memory, unless
/// `STRATA_IDOT_LOCAL=0` (then a split dispatch; the same bits either way).
pub(super) fn local_words(ctx: &GpuContext, w: &GpuWeight, vectors: usize) -> Option<usize> {
    static LOCAL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let on = *LOCAL.get_or_init(|| std::env::var("STRATA_IDOT_LOCAL").map_or(true, |v| v != "0"));
    let words = XQ_WORDS * (w.row_len / 32) * vectors;
    let room = ctx.limits.max_compute_workgroup_storage_size as usize;
    (on && words * 4 + LOCAL_RESERVE_BYTES <= room).then_some(words)
}

/// [`key_of`] for a workgroup-staged pipeline: the x transform applied while staging.
pub(super) fn local_key(
    op: &str,
    w: &GpuWeight,
    entry: &'static str,
    rows_per_sg: usize,
    x_mode: u32,
    words: usize,
) -> PipelineKey {
    specialise(
        PipelineKey::new(shader_of(&format!("{op}_local"), w), entry),
        rows_per_sg,
        wg_size(),
        1,
        x_mode,
    )
    .constant("IDOT_LOCAL", 1.0)
    .constant("XQL_WORDS", words as f64)
}

/// Row groups per workgroup, as a multiple of the default, where decode's workgroups stage their
/// digits (`local` is [`local_words`]'s answer): each workgroup splits its whole vector, so it
/// runs more rows to spread that work; `STRATA_IDOT_GROUPS` (1 to 16, for tuning) overrides 4. A
/// row's bits never depend on it.
pub(super) fn staged_groups(local: Option<usize>) -> usize {
    static GROUPS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    if local.is_none() {
        return 1;
    }
    *GROUPS.get_or_init(|| {
        std::env::var("STRATA_IDOT_GROUPS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|n| (1..=16).contains(n))
            .unwrap_or(4)
    })
}
