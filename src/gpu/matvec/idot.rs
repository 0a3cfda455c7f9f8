//! The integer-digit mat-vec experiment (`shaders/quant/rows_idot.wgsl`, docs/int-arith.md): x is
//! split once into three signed base-256 digits per value (`xq_split`) and each task's sums are
//! exact `dot4I8Packed` integer sums. Only `strata bench --synthetic matvec --arith int` turns it
//! on ([`GpuContext::set_idot`]): it covers the plain row store and the expert entry points of
//! Q8_0, Q6_K, IQ3_S and IQ4_NL, enough to time the kernels, not a model's every path.

use super::{
    GpuContext, GpuError, GpuWeight, MatvecParams, Recorder, View, XForm, any_length, specialise,
    to_u32, wg_size,
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
    format!("matvec_idot:{}", w.ty.name())
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
    let (x_mode, x_half, x_scale) = xform.mode();
    let params = MatvecParams {
        k: to_u32(w.row_len, "k")?,
        items: to_u32(count, "items")?,
        x_stride: to_u32(x.stride, "x stride")?,
        x_offset: to_u32(x.offset, "x offset")?,
        x_mode,
        x_half: to_u32(x_half, "x half")?,
        x_scale,
        ..Default::default()
    };
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

/// The pipeline of `entry` in the experiment's assembly (x already transformed).
pub(super) fn key(
    w: &GpuWeight,
    entry: &'static str,
    rows_per_sg: usize,
    items: usize,
) -> PipelineKey {
    specialise(
        PipelineKey::new(shader(w), entry),
        rows_per_sg,
        wg_size(),
        items,
        0,
    )
}
