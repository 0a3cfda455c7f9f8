//! The expert mat-vecs of an MoE block: each item through the rows of its own expert, one item at
//! a time ([`matvec_expert`], with the gate|up SwiGLU in [`matvec_expert_glu`]) or grouped by
//! expert for prefill ([`matvec_group`]).

use super::dense::permuted_x;
use super::keys::{fused_key, key, wide_op};
use super::tuning::{
    TILE, glu_pairs, glu_rows_per_wg, rows_per_subgroup, subgroup_size, tile_rows, wg_size,
    wide_items, wide_ok, wide_pairs, wide_rounds, xperm,
};
use super::{
    GpuBuf, GpuContext, GpuError, GpuWeight, MatvecParams, Recorder, View, WeightPart, XForm,
    any_length, base_params, bindings, check_input, coop, idot, item_grid, need_floats, to_u32,
};

/// Parameters shared by the expert entry points for one part of an expert tensor.
#[allow(clippy::too_many_arguments)]
pub(super) fn expert_params(
    w: &GpuWeight,
    part: &WeightPart,
    x: View,
    xform: XForm,
    y: View,
    items: usize,
    slots: usize,
    x_per_item: bool,
    per_wg: usize,
) -> Result<MatvecParams, GpuError> {
    let mut params = base_params(w, part, x, xform, items)?;
    params.rows = to_u32(w.rows_per_unit, "rows")?;
    params.y_stride = to_u32(y.stride, "y stride")?;
    params.y_offset = to_u32(y.offset, "y offset")?;
    params.slots = to_u32(slots, "slots")?;
    params.x_per_item = x_per_item as u32;
    params.expert_first = to_u32(part.first_row / w.rows_per_unit, "expert")?;
    params.expert_count = to_u32(part.n_rows / w.rows_per_unit, "experts")?;
    params.rows_per_wg = to_u32(per_wg, "row groups per workgroup")?;
    Ok(params)
}

/// Items are whole tokens of `slots` items each, with an expert id each in `ids`.
pub(super) fn check_expert_items(
    w: &GpuWeight,
    ids: &GpuBuf,
    slots: usize,
    items: usize,
) -> Result<(), GpuError> {
    if slots == 0 || !items.is_multiple_of(slots) || ids.len < items {
        return Err(GpuError::BadArgs(format!(
            "expert matvec {}: {items} items, {slots} slots, {} ids",
            w.name, ids.len
        )));
    }
    Ok(())
}

/// Expert mat-vec: for item i (= token * slots + slot), y[i] = W_{ids[i]} . x, where x is
/// x[i] when `x_per_item`, else x[i / slots]. `ids` lives on the GPU (written by the router).
#[allow(clippy::too_many_arguments)]
pub fn matvec_expert(
    ctx: &GpuContext,
    rec: &mut Recorder,
    w: &GpuWeight,
    ids: &GpuBuf,
    slots: usize,
    x_per_item: bool,
    x: View,
    y: View,
    items: usize,
) -> Result<(), GpuError> {
    matvec_expert_with(
        ctx,
        rec,
        w,
        ids,
        slots,
        x_per_item,
        x,
        XForm::Plain,
        y,
        items,
    )
}

/// [`matvec_expert`] with an input transform.
#[allow(clippy::too_many_arguments)]
pub fn matvec_expert_with(
    ctx: &GpuContext,
    rec: &mut Recorder,
    w: &GpuWeight,
    ids: &GpuBuf,
    slots: usize,
    x_per_item: bool,
    x: View,
    xform: XForm,
    y: View,
    items: usize,
) -> Result<(), GpuError> {
    check_expert_items(w, ids, slots, items)?;
    let x_count = if x_per_item { items } else { items / slots };
    check_input(w, x, xform, x_count)?;
    y.check(
        items,
        w.rows_per_unit,
        &format!("expert matvec {} output", w.name),
    )?;
    let sg = subgroup_size(ctx);
    let per_sg = rows_per_subgroup(w, w.rows_per_unit * items);
    let per_wg = (wg_size() / sg).max(1);
    let (gy, gz) = item_grid(items);
    let grid = ctx.grid_buffer(w.ty)?;
    let int = idot::usable(ctx, w, x, xform);
    let local = int.then(|| idot::local_words(ctx, w, 1)).flatten();
    let digits = if int && local.is_none() {
        Some(idot::split(ctx, rec, w, x, xform, x_count)?)
    } else {
        None
    };
    let per_wg = per_wg * idot::staged_groups(local);
    for part in &w.parts {
        let mut params = expert_params(w, part, x, xform, y, items, slots, x_per_item, per_wg)?;
        let mut b = bindings(w, part, &grid);
        b.push((1, &*x.buf.buffer));
        b.push((2, &*y.buf.buffer));
        b.push((3, &*ids.buffer));
        let groups = w.rows_per_unit.div_ceil(per_sg);
        let gx = to_u32(groups.div_ceil(per_wg), "grid x")?;
        let pipeline = match (&digits, local) {
            (_, Some(words)) => idot::local_key(
                "matvec_idot",
                w,
                "matvec_expert",
                per_sg,
                params.x_mode,
                words,
            ),
            (Some(d), None) => {
                d.apply(&mut params);
                b.push((19, &*d.buf.buffer));
                idot::key(w, "matvec_expert", per_sg, 1)
            }
            (None, None) => key(
                w,
                any_length(w, x, xform),
                "matvec_expert",
                per_sg,
                1,
                xform,
            ),
        };
        rec.push(
            ctx,
            &pipeline,
            &b,
            bytemuck::bytes_of(&params),
            [gx, gy, gz],
        )?;
    }
    Ok(())
}

/// [`matvec_expert`] of a fused gate|up weight (each expert's `2h` rows: gate, then up) storing
/// `silu(gate) * up` at rows `0..h` of each item's output (`matvec.wgsl`'s `matvec_expert_glu`):
/// what [`prepare_x`](super::prepare_x)'s SwiGLU would leave there, with the same bits, so the
/// down projection reads it with [`XForm::Plain`]. Rows `h..2h` of the output are left as they
/// were.
#[allow(clippy::too_many_arguments)]
pub fn matvec_expert_glu(
    ctx: &GpuContext,
    rec: &mut Recorder,
    w: &GpuWeight,
    ids: &GpuBuf,
    slots: usize,
    x: View,
    y: View,
    items: usize,
) -> Result<(), GpuError> {
    matvec_expert_glu_pairs(ctx, rec, w, ids, slots, x, y, items, glu_pairs())
}

/// [`matvec_expert_glu`] with `pairs` (1 or 2) gate|up row pairs per subgroup; the same bits
/// whatever `pairs` is.
#[allow(clippy::too_many_arguments)]
pub fn matvec_expert_glu_pairs(
    ctx: &GpuContext,
    rec: &mut Recorder,
    w: &GpuWeight,
    ids: &GpuBuf,
    slots: usize,
    x: View,
    y: View,
    items: usize,
    pairs: usize,
) -> Result<(), GpuError> {
    if !(1..=2).contains(&pairs) {
        return Err(GpuError::BadArgs(format!(
            "{pairs} gate|up pairs per subgroup"
        )));
    }
    check_expert_items(w, ids, slots, items)?;
    if !w.rows_per_unit.is_multiple_of(2) {
        return Err(GpuError::BadArgs(format!(
            "gate|up experts {}: {} rows per expert is not a gate and an up half",
            w.name, w.rows_per_unit
        )));
    }
    let half = w.rows_per_unit / 2;
    check_input(w, x, XForm::Plain, items / slots)?;
    y.check(items, half, &format!("expert matvec {} output", w.name))?;
    let sg = subgroup_size(ctx);
    let per_wg = glu_rows_per_wg().unwrap_or((wg_size() / sg).max(1));
    let (gy, gz) = item_grid(items);
    let grid = ctx.grid_buffer(w.ty)?;
    let int = idot::usable(ctx, w, x, XForm::Plain);
    let local = int.then(|| idot::local_words(ctx, w, 1)).flatten();
    let digits = if int && local.is_none() {
        Some(idot::split(ctx, rec, w, x, XForm::Plain, items / slots)?)
    } else {
        None
    };
    let per_wg = per_wg * idot::staged_groups(local);
    for part in &w.parts {
        let mut params = expert_params(w, part, x, XForm::Plain, y, items, slots, false, per_wg)?;
        params.h = to_u32(half, "half")?;
        let mut b = bindings(w, part, &grid);
        b.push((1, &*x.buf.buffer));
        b.push((2, &*y.buf.buffer));
        b.push((3, &*ids.buffer));
        let gx = to_u32(half.div_ceil(per_wg * pairs), "grid x")?;
        let pipeline = match (&digits, local) {
            (_, Some(words)) => idot::local_key(
                "matvec_idot",
                w,
                "matvec_expert_glu",
                2 * pairs,
                params.x_mode,
                words,
            ),
            (Some(d), None) => {
                d.apply(&mut params);
                b.push((19, &*d.buf.buffer));
                idot::key(w, "matvec_expert_glu", 2 * pairs, 1)
            }
            (None, None) => key(
                w,
                any_length(w, x, XForm::Plain),
                "matvec_expert_glu",
                2 * pairs,
                1,
                XForm::Plain,
            ),
        };
        rec.push(
            ctx,
            &pipeline.constant("PAIRED", 1.0),
            &b,
            bytemuck::bytes_of(&params),
            [gx, gy, gz],
        )?;
    }
    Ok(())
}

/// Expert mat-vec over items grouped by expert (prefill): `groups` as `ops::moe_group` writes it
/// for chunks of up to `group_cap` tokens; otherwise as [`matvec_expert_with`], with the same
/// bits for every (item, row). Each workgroup runs one block of an expert's rows over all of that
/// expert's items, `TILE` at a time, so each weight is read once per chunk rather than per item.
#[allow(clippy::too_many_arguments)]
pub fn matvec_group(
    ctx: &GpuContext,
    rec: &mut Recorder,
    w: &GpuWeight,
    groups: &GpuBuf,
    group_cap: usize,
    slots: usize,
    x_per_item: bool,
    x: View,
    xform: XForm,
    y: View,
    items: usize,
) -> Result<(), GpuError> {
    let experts = w.n_rows / w.rows_per_unit.max(1);
    if slots == 0 || !items.is_multiple_of(slots) || items / slots > group_cap {
        return Err(GpuError::BadArgs(format!(
            "grouped expert matvec {}: {items} items, {slots} slots, lists of {group_cap}",
            w.name
        )));
    }
    need_floats(groups, experts * (1 + group_cap), "expert groups")?;
    let x_count = if x_per_item { items } else { items / slots };
    check_input(w, x, xform, x_count)?;
    y.check(
        items,
        w.rows_per_unit,
        &format!("grouped expert matvec {} output", w.name),
    )?;
    if coop::usable(ctx, w, x, xform, items) {
        return coop::group(
            ctx, rec, w, groups, group_cap, slots, x_per_item, x, y, items,
        );
    }
    let digits = if idot::usable(ctx, w, x, xform) {
        Some(idot::split(ctx, rec, w, x, xform, x_count)?)
    } else {
        None
    };
    let sg = subgroup_size(ctx);
    let wide = wide_ok(w, x, xform);
    let tile = if wide { wide_items() } else { TILE };
    let per_sg = tile_rows(w, w.rows_per_unit, tile);
    let rounds = wide && digits.is_none() && wide_rounds(ctx, w.row_len / 32, sg);
    let pairs = wide && digits.is_none() && wide_pairs(ctx, w.ty, w.row_len / 32, 1, sg);
    // In rounds each subgroup takes row groups three at a time, in pairs two.
    let per_wg = (wg_size() / sg).max(1)
        * if rounds {
            3
        } else if pairs {
            2
        } else {
            1
        };
    let grid = ctx.grid_buffer(w.ty)?;
    let task_order = if wide && xperm() && digits.is_none() {
        Some(permuted_x(ctx, rec, w, x, x_count)?)
    } else {
        None
    };
    for part in &w.parts {
        let mut params = expert_params(w, part, x, xform, y, items, slots, x_per_item, per_wg)?;
        params.group_base = to_u32(experts, "group base")?;
        params.group_cap = to_u32(group_cap, "group room")?;
        let mut b = bindings(w, part, &grid);
        match &task_order {
            Some(xp) => {
                params.x_offset = 0;
                params.x_stride = params.k;
                b.push((1, &*xp.buffer));
            }
            None => b.push((1, &*x.buf.buffer)),
        }
        b.push((2, &*y.buf.buffer));
        b.push((3, &*groups.buffer));
        let groups_x = w.rows_per_unit.div_ceil(per_sg);
        let gx = to_u32(groups_x.div_ceil(per_wg), "grid x")?;
        let gy = params.expert_count;
        if let Some(d) = &digits {
            d.apply(&mut params);
            b.push((19, &*d.buf.buffer));
        }
        let pipeline = if digits.is_some() && wide {
            idot::key_of("matvec_wide_idot", w, "matvec_group_wide", per_sg, tile)
        } else if digits.is_some() {
            idot::key(w, "matvec_group", per_sg, TILE)
        } else if wide {
            fused_key(
                wide_op(rounds || pairs),
                w,
                "matvec_group_wide",
                per_sg,
                tile,
                0,
            )
            .constant("XPERM", f64::from(u8::from(task_order.is_some())))
            .constant("ROUNDS", f64::from(u8::from(rounds)))
            .constant("PAIRS", f64::from(u8::from(pairs)))
        } else {
            key(
                w,
                any_length(w, x, xform),
                "matvec_group",
                per_sg,
                TILE,
                xform,
            )
        };
        rec.push(ctx, &pipeline, &b, bytemuck::bytes_of(&params), [gx, gy, 1])?;
    }
    Ok(())
}
