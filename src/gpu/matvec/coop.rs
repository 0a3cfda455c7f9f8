//! Tensor-core prefill tiles (`shaders/quant/rows_coop.wgsl`): in limb arithmetic, on adapters
//! with 16x16 f16 cooperative matrices ([`GpuContext::coop`]), the plain and segmented dense
//! stores and the grouped expert mat-vec run as 64-row x 32-vector tiles on the matrix units, with
//! the bits of the limb decode kernels (docs/tensor-cores.md). x is first split into limbs once
//! per mat-vec (`limb_x`), into the context's limb buffers.

use super::{
    GpuContext, GpuError, GpuWeight, MatvecParams, Recorder, SegFusion, Store, View, XForm,
    any_length, base_params, bindings, expert_params, item_grid, segment_params, to_u32,
};
use crate::gpu::pipelines::PipelineKey;

/// Vectors per tile and rows per workgroup (the shader's CV and 4 x 16).
const CV: usize = 32;
const ROWS_PER_WG: usize = 64;

/// Whether the mat-vec of `w` over `x` runs on the matrix units: a coop context, a split layout
/// read plainly, and more than one vector (decode keeps its kernels). `STRATA_WIDE` (the
/// fallback's tiles) does not change it.
pub(super) fn usable(ctx: &GpuContext, w: &GpuWeight, x: View, xform: XForm, items: usize) -> bool {
    ctx.coop()
        && items > 1
        && crate::gpu::shaders::limb_supported(w.ty)
        && xform == XForm::Plain
        && !any_length(w, x, xform)
}

fn shader(w: &GpuWeight) -> String {
    format!("matvec_coop:{}", w.ty.name())
}

/// The limb buffers for `count` vectors of `w`'s row length.
struct Limbs {
    hi: crate::gpu::buffers::GpuBuf,
    lo: crate::gpu::buffers::GpuBuf,
    exp: crate::gpu::buffers::GpuBuf,
}

/// Split `count` vectors of x into limbs (`limb_x`).
fn limbs(
    ctx: &GpuContext,
    rec: &mut Recorder,
    w: &GpuWeight,
    x: View,
    count: usize,
) -> Result<Limbs, GpuError> {
    let tasks = w.row_len / 32;
    let [hi, lo, exp] = ctx.limb_buffers(count * tasks * 16, count * tasks * 2)?;
    let params = MatvecParams {
        k: to_u32(w.row_len, "k")?,
        items: to_u32(count, "items")?,
        x_stride: to_u32(x.stride, "x stride")?,
        x_offset: to_u32(x.offset, "x offset")?,
        ..Default::default()
    };
    let (gy, gz) = item_grid(count);
    let gx = to_u32(tasks.div_ceil(64), "grid x")?;
    rec.push(
        ctx,
        &PipelineKey::new(shader(w), "limb_x"),
        &[
            (1, &*x.buf.buffer),
            (16, &*hi.buffer),
            (17, &*lo.buffer),
            (18, &*exp.buffer),
        ],
        bytemuck::bytes_of(&params),
        [gx, gy, gz],
    )?;
    Ok(Limbs { hi, lo, exp })
}

fn limb_bindings<'a>(b: &mut Vec<(u32, &'a wgpu::Buffer)>, l: &'a Limbs) {
    b.extend([
        (16, &*l.hi.buffer),
        (17, &*l.lo.buffer),
        (18, &*l.exp.buffer),
    ]);
}

/// The dense mat-vec in tensor-core tiles when `store` is one they have (rows, or plain
/// segments); `Ok(false)` leaves it to the other kernels.
pub(super) fn dense(
    ctx: &GpuContext,
    rec: &mut Recorder,
    w: &GpuWeight,
    x: View,
    store: &Store,
    items: usize,
) -> Result<bool, GpuError> {
    let entry = match store {
        Store::Rows(_) => "matvec_coop",
        Store::Segments {
            fused: SegFusion::None,
            ..
        } => "matvec_seg_coop",
        _ => return Ok(false),
    };
    let grid = ctx.grid_buffer(w.ty)?;
    let l = limbs(ctx, rec, w, x, items)?;
    for part in &w.parts {
        let mut params = base_params(w, part, x, XForm::Plain, items)?;
        // Vectors are read from the limbs, indexed from 0.
        params.x_offset = 0;
        let mut b = bindings(w, part, &grid);
        let mut y0_mode = 0;
        match store {
            Store::Rows(y) => {
                y.check(items, w.n_rows, &format!("matvec {} output", w.name))?;
                params.y_stride = to_u32(y.stride, "y stride")?;
                params.y_offset = to_u32(y.offset + part.first_row, "y offset")?;
                b.push((2, &*y.buf.buffer));
            }
            Store::Segments {
                outs, first, silu0, ..
            } => {
                segment_params(w, &mut params, *outs, *first, items)?;
                if let Some(scale) = silu0 {
                    params.x_scale = *scale;
                    y0_mode = 2;
                }
                b.push((2, &*outs[0].buf.buffer));
                b.push((6, &*outs[1].buf.buffer));
                b.push((7, &*outs[2].buf.buffer));
            }
            _ => return Ok(false),
        }
        limb_bindings(&mut b, &l);
        let gx = to_u32(part.n_rows.div_ceil(ROWS_PER_WG), "grid x")?;
        let (gy, gz) = item_grid(items.div_ceil(CV));
        let key = PipelineKey::new(shader(w), entry).constant("Y0_MODE", f64::from(y0_mode));
        rec.push(ctx, &key, &b, bytemuck::bytes_of(&params), [gx, gy, gz])?;
    }
    Ok(true)
}

/// The grouped expert mat-vec in tensor-core tiles (matvec_group's arguments, checked there).
#[allow(clippy::too_many_arguments)]
pub(super) fn group(
    ctx: &GpuContext,
    rec: &mut Recorder,
    w: &GpuWeight,
    groups: &crate::gpu::buffers::GpuBuf,
    group_cap: usize,
    slots: usize,
    x_per_item: bool,
    x: View,
    y: View,
    items: usize,
) -> Result<(), GpuError> {
    let experts = w.n_rows / w.rows_per_unit.max(1);
    let x_count = if x_per_item { items } else { items / slots };
    let grid = ctx.grid_buffer(w.ty)?;
    let l = limbs(ctx, rec, w, x, x_count)?;
    for part in &w.parts {
        let mut params = expert_params(w, part, x, XForm::Plain, y, items, slots, x_per_item, 1)?;
        params.x_offset = 0;
        params.group_base = to_u32(experts, "group base")?;
        params.group_cap = to_u32(group_cap, "group room")?;
        let mut b = bindings(w, part, &grid);
        b.push((2, &*y.buf.buffer));
        b.push((3, &*groups.buffer));
        limb_bindings(&mut b, &l);
        let gx = to_u32(w.rows_per_unit.div_ceil(ROWS_PER_WG), "grid x")?;
        rec.push(
            ctx,
            &PipelineKey::new(shader(w), "matvec_group_coop"),
            &b,
            bytemuck::bytes_of(&params),
            [gx, params.expert_count, 1],
        )?;
    }
    Ok(())
}
