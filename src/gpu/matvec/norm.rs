//! A grouped RMS norm of the input fused into a segmented mat-vec ([`InputNorm`]): whether a weight
//! takes it, its parameters, and the normed vectors stored apart for prefill.

use super::keys::fused_key;
use super::tuning::{k_split, least_wide, subgroup_size, tile_rows, wg_size, wide_ok};
use super::{
    GpuContext, GpuError, GpuWeight, InputNorm, MatvecParams, Recorder, SegFusion, Store, View,
    XForm, base_params, bindings, idot, item_grid, need_floats, segment_params, to_u32,
};

/// Whether a segmented mat-vec of `w` can norm its input ([`InputNorm`]) in groups of `group`
/// values with a weight of `period` values: a split layout in one part, 1 to 4 groups filling the
/// row, groups and period multiples of 16 (a row body's segments then never straddle either).
/// Decided by shapes alone, so prefill and decode take the same path.
pub fn can_norm_input(w: &GpuWeight, group: usize, period: usize) -> bool {
    w.split.is_some()
        && w.parts.len() == 1
        && group > 0
        && group.is_multiple_of(16)
        && period > 0
        && period.is_multiple_of(16)
        && w.row_len.is_multiple_of(group)
        && (1..=4).contains(&(w.row_len / group))
}

/// Where a segmented mat-vec with an input norm covers enough vectors for wide tiles (prefill),
/// the same store without the norm, to run over the normed vectors that [`norm_store`] writes
/// first: the fused entry has no wide tiles, and the rows over the stored vectors are the fused
/// rows bit for bit (`shaders/quant/x_norm.wgsl`). `None` where the fused dispatch stays.
pub(super) fn norm_apart<'a>(
    ctx: &GpuContext,
    w: &GpuWeight,
    store: Store<'a>,
    xform: XForm,
    items: usize,
) -> Option<Store<'a>> {
    let Store::Segments {
        outs,
        first,
        silu0,
        fused: SegFusion::Norm(n),
    } = store
    else {
        return None;
    };
    // The integer-digit arithmetic splits the normed vectors, in prefill (or where decode cannot
    // stage them in its workgroups).
    let digits = xform == XForm::Plain
        && idot::usable(ctx, w, n.normed, xform)
        && (items > 1 || norm_staged(ctx, w, n).is_none());
    let wide = least_wide();
    let wide = wide > 0 && items >= wide && xform == XForm::Plain && wide_ok(w, n.normed, xform);
    (digits || wide).then_some(Store::Segments {
        outs,
        first,
        silu0,
        fused: SegFusion::None,
    })
}

/// The XQL words of decode's fused input norm in the integer-digit arithmetic, which stages the
/// normed vector in each workgroup (`matvec_norm_idot_local`), where it does.
fn norm_staged(ctx: &GpuContext, w: &GpuWeight, n: InputNorm) -> Option<usize> {
    idot::usable(ctx, w, n.normed, XForm::Plain)
        .then(|| idot::local_words(ctx, w, 1))
        .flatten()
}

/// The normed vectors of an [`InputNorm`] alone: the decode step's own fused pipeline (`matvec_seg`
/// of the `matvec_norm` assembly, one vector per workgroup, the same constants) run with no rows,
/// so only its norm prologue works. The same compiled code as a decode step, hence the same
/// values: a separate entry point with the same source was not enough, as a compiler may treat
/// the same expression differently in two kernels (llvmpipe did at subgroup size 4).
pub(super) fn norm_store(
    ctx: &GpuContext,
    rec: &mut Recorder,
    w: &GpuWeight,
    x: View,
    store: Store,
    items: usize,
) -> Result<(), GpuError> {
    let Store::Segments {
        outs,
        first,
        silu0,
        fused: SegFusion::Norm(n),
    } = store
    else {
        return Err(GpuError::BadArgs("norm store without a norm".into()));
    };
    let Some(part) = w.parts.first() else {
        return Err(GpuError::BadArgs(format!("matvec {}: no parts", w.name)));
    };
    let grid = ctx.grid_buffer(w.ty)?;
    let mut params = base_params(w, part, x, XForm::Plain, items)?;
    segment_params(w, &mut params, outs, first, items)?;
    let mut y0_mode = 0;
    if let Some(scale) = silu0 {
        params.x_scale = scale;
        y0_mode = 2;
    }
    norm_params(w, &mut params, XForm::Plain, first, n, items)?;
    let split = k_split(ctx, w);
    params.rows_per_wg = to_u32(
        (wg_size() / subgroup_size(ctx) / split).max(1),
        "row groups per workgroup",
    )?;
    params.item0 = 0;
    // No rows: the workgroups only norm and store their vectors.
    params.rows = 0;
    let mut b = bindings(w, part, &grid);
    b.extend([
        (1, &*x.buf.buffer),
        (2, &*outs[0].buf.buffer),
        (6, &*outs[1].buf.buffer),
        (7, &*n.normed.buf.buffer),
        (15, &*n.weight.buffer),
    ]);
    let (gy, gz) = item_grid(items);
    let per_sg = tile_rows(w, w.n_rows, 1);
    // Decode's own pipeline: the integer-digit one where decode stages the normed vector.
    let key = match norm_staged(ctx, w, n) {
        Some(words) => idot::local_key("matvec_norm_idot", w, "matvec_seg", per_sg, 3, words),
        None => fused_key("matvec_norm", w, "matvec_seg", per_sg, 1, 3),
    };
    rec.push(
        ctx,
        &key.constant("KSPLIT", split as f64)
            .constant("Y0_MODE", y0_mode as f64),
        &b,
        bytemuck::bytes_of(&params),
        [1, gy, gz],
    )
}

/// The X_MODE 3 fields of a segmented mat-vec with an input norm (output 2 becomes the normed
/// vectors).
pub(super) fn norm_params(
    w: &GpuWeight,
    params: &mut MatvecParams,
    xform: XForm,
    first: [usize; 3],
    n: InputNorm,
    items: usize,
) -> Result<(), GpuError> {
    if xform != XForm::Plain || first[2] != w.n_rows || !can_norm_input(w, n.group, n.period) {
        return Err(GpuError::BadArgs(format!(
            "matvec {}: no input norm of groups of {} (weight period {}) here",
            w.name, n.group, n.period
        )));
    }
    need_floats(n.weight, n.period, "input norm weight")?;
    n.normed
        .check(items, w.row_len, &format!("matvec {} normed input", w.name))?;
    params.x_mode = 3;
    params.h = to_u32(n.group, "norm group")?;
    params.hc = to_u32(w.row_len / n.group, "norm groups")?;
    params.norm_eps = n.eps;
    params.norm_period = to_u32(n.period, "norm period")?;
    params.y2_offset = to_u32(n.normed.offset, "normed offset")?;
    params.y2_stride = to_u32(n.normed.stride, "normed stride")?;
    Ok(())
}
