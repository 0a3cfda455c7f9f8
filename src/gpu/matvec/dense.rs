//! The dense mat-vec ([`matvec_with`]): every vector of x through all of a weight's rows, in
//! tiles of vectors, into one of the [`Store`] forms.

use std::sync::Arc;

use super::keys::{any_length, fused_key, key, shader_name, wide_entry, wide_op};
use super::norm::{norm_apart, norm_store};
use super::store::Dispatch;
use super::tuning::{
    SMALL_WIDE, TILE, k_split, small_wide, subgroup_size, wg_size, wide_items, wide_ok, wide_pack,
    wide_pairs, xperm,
};
use super::{
    GpuBuf, GpuContext, GpuError, GpuWeight, MatvecParams, PipelineKey, Recorder, SegFusion, Store,
    View, WeightPart, XForm, check_input, coop, idot, item_grid, to_u32, x_params,
};

/// Before a mat-vec of `w` over `items` vectors: for more than one vector, apply `xform` to x once,
/// in place (`matvec.wgsl`'s `xform_in_place`: the same arithmetic as on load), and return
/// [`XForm::Plain`] for the mat-vec; otherwise, or where the any-length row body reads x, return
/// `xform` unchanged. Either way the mat-vec's bits are the same; prefill stops recomputing the
/// transform (an `exp` per value) for every row group. x's buffer then holds the transformed
/// values (a SwiGLU's over its gate half).
pub fn prepare_x(
    ctx: &GpuContext,
    rec: &mut Recorder,
    w: &GpuWeight,
    x: View,
    xform: XForm,
    items: usize,
) -> Result<XForm, GpuError> {
    if items <= 1 || xform == XForm::Plain || any_length(w, x, xform) {
        return Ok(xform);
    }
    check_input(w, x, xform, items)?;
    let params = x_params(w, x, xform, items)?;
    let (gy, gz) = item_grid(items);
    let gx = to_u32(w.row_len.div_ceil(4).div_ceil(64), "grid x")?;
    rec.push(
        ctx,
        &PipelineKey::new(shader_name(w, false), "xform_in_place")
            .constant("X_MODE", params.x_mode as f64),
        &[(9, &*x.buf.buffer)],
        bytemuck::bytes_of(&params),
        [gx, gy, gz],
    )?;
    Ok(XForm::Plain)
}

/// y[i][r] = W[r] . x[i] for `items` vectors.
pub fn matvec(
    ctx: &GpuContext,
    rec: &mut Recorder,
    w: &GpuWeight,
    x: View,
    y: View,
    items: usize,
) -> Result<(), GpuError> {
    matvec_with(ctx, rec, w, x, XForm::Plain, Store::Rows(y), items)
}

/// The mat-vec of `items` vectors with an input transform and a store form (module docs).
pub fn matvec_with(
    ctx: &GpuContext,
    rec: &mut Recorder,
    w: &GpuWeight,
    x: View,
    xform: XForm,
    store: Store,
    items: usize,
) -> Result<(), GpuError> {
    check_input(w, x, xform, items)?;
    if let Some(plain) = norm_apart(ctx, w, store, xform, items) {
        return norm_then_rows(ctx, rec, w, x, store, plain, items);
    }
    if coop::usable(ctx, w, x, xform, items) && coop::dense(ctx, rec, w, x, &store, items)? {
        return Ok(());
    }
    let plan = Plan::new(ctx, rec, w, x, xform, store, items)?;
    for part in &w.parts {
        for &run in &plan.runs {
            if run.1 == 0 {
                continue;
            }
            plan.dispatch(ctx, rec, part, run)?;
        }
    }
    Ok(())
}

/// Prefill with an input norm that [`norm_apart`] stores apart: the normed vectors first, then
/// wide tiles over them in the store `plain` (the same bits).
fn norm_then_rows(
    ctx: &GpuContext,
    rec: &mut Recorder,
    w: &GpuWeight,
    x: View,
    store: Store,
    plain: Store,
    items: usize,
) -> Result<(), GpuError> {
    let Store::Segments {
        fused: SegFusion::Norm(n),
        ..
    } = store
    else {
        return Err(GpuError::BadArgs("norm apart without a norm".into()));
    };
    norm_store(ctx, rec, w, x, store, items)?;
    matvec_with(ctx, rec, w, n.normed, XForm::Plain, plain, items)
}

/// What every dispatch of a dense mat-vec shares: the weight, its input and store, the grid
/// buffer, the integer-digit arithmetic's choice (decode's staged words, or x split into
/// digits), the tile runs, and the wide runs' x in task order.
struct Plan<'a> {
    w: &'a GpuWeight,
    x: View<'a>,
    xform: XForm,
    store: Store<'a>,
    items: usize,
    sg: usize,
    grid: Option<Arc<wgpu::Buffer>>,
    local: Option<usize>,
    digits: Option<idot::Split>,
    runs: Vec<(usize, usize, usize)>,
    task_order: Option<GpuBuf>,
}

impl<'a> Plan<'a> {
    /// The plan of a dense mat-vec, recording first the dispatches that prepare x for it (its
    /// digits, or the wide runs' x in task order).
    fn new(
        ctx: &GpuContext,
        rec: &mut Recorder,
        w: &'a GpuWeight,
        x: View<'a>,
        xform: XForm,
        store: Store<'a>,
        items: usize,
    ) -> Result<Self, GpuError> {
        let sg = subgroup_size(ctx);
        let grid = ctx.grid_buffer(w.ty)?;
        let (local, digits) = int_digits(ctx, rec, w, x, xform, store, items)?;
        // Wide tiles where the store has a wide entry, then full tiles of TILE vectors, then the
        // remainder as tiles of its own size.
        let runs = tile_runs(items, wide_tile(w, x, xform, store));
        // The wide runs come first, from item 0.
        let wide_end: usize = runs.iter().filter(|r| r.2 > TILE).map(|r| r.1).sum();
        let task_order = if wide_end > 0 && xperm() && digits.is_none() {
            Some(permuted_x(ctx, rec, w, x, wide_end)?)
        } else {
            None
        };
        Ok(Plan {
            w,
            x,
            xform,
            store,
            items,
            sg,
            grid,
            local,
            digits,
            runs,
            task_order,
        })
    }

    /// Records the dispatch of `part`'s rows over the run `(item0, count, tile)` of the vectors.
    fn dispatch(
        &self,
        ctx: &GpuContext,
        rec: &mut Recorder,
        part: &WeightPart,
        (item0, count, tile): (usize, usize, usize),
    ) -> Result<(), GpuError> {
        let is_wide = tile > TILE;
        let mut d = Dispatch::new(
            self.w, part, &self.grid, self.x, self.xform, self.items, tile,
        )?;
        d.bind_x(self.task_order.as_ref().filter(|_| is_wide));
        let (entry, per_sg, groups) = d.store(self.store)?;
        // Row groups (of `per_sg` rows) per workgroup: one per subgroup, or per `split`
        // subgroups where a row's input is split over several (not for the mix store).
        let split = if entry == "matvec_mix" {
            1
        } else {
            k_split(ctx, self.w)
        };
        // Row groups a subgroup takes per step: packed short rows, or two in pairs.
        let pairs = self.pairs(ctx, is_wide, split);
        let pack = if pairs {
            2
        } else {
            self.pack(ctx, is_wide, split)
        };
        let per_wg = (wg_size() / self.sg / split).max(1) * idot::staged_groups(self.local) * pack;
        d.params.rows_per_wg = to_u32(per_wg, "row groups per workgroup")?;
        let gx = to_u32(groups.div_ceil(per_wg), "grid x")?;
        d.params.item0 = to_u32(item0, "first item")?;
        let (gy, gz) = item_grid(count / tile);
        if let Some(digits) = &self.digits {
            digits.apply(&mut d.params);
            d.b.push((19, &*digits.buf.buffer));
        }
        let mut pipeline = self.pipeline(entry, per_sg, tile, d.params.x_mode, d.y0_mode, pairs);
        if pack > 1 {
            pipeline = pipeline.constant("PACK", pack as f64);
        }
        if pairs {
            pipeline = pipeline.constant("PAIRS", 1.0);
        }
        rec.push(
            ctx,
            &pipeline
                .constant("KSPLIT", split as f64)
                .constant("Y0_MODE", d.y0_mode as f64),
            &d.b,
            bytemuck::bytes_of(&d.params),
            [gx, gy, gz],
        )
    }

    /// Row groups per subgroup of a dispatch (wide tiles of short rows in the default arithmetic:
    /// [`wide_pack`]; else 1).
    fn pack(&self, ctx: &GpuContext, is_wide: bool, split: usize) -> usize {
        if !is_wide || self.digits.is_some() {
            return 1;
        }
        wide_pack(ctx, self.w.row_len / 32, split, self.sg)
    }

    /// Whether a dispatch's wide tiles run their rows in pairs ([`wide_pairs`]).
    fn pairs(&self, ctx: &GpuContext, is_wide: bool, split: usize) -> bool {
        is_wide
            && self.digits.is_none()
            && wide_pairs(ctx, self.w.ty, self.w.row_len / 32, split, self.sg)
    }

    /// The pipeline of a dispatch over `tile`-vector tiles whose store chose `entry` with `per_sg`
    /// rows per subgroup, `x_mode` and `y0_mode` as its parameters and store left them: the wide
    /// tiles' assembly, an integer-digit one, a fused one (input norm, conv store) or the plain
    /// one.
    fn pipeline(
        &self,
        entry: &'static str,
        per_sg: usize,
        tile: usize,
        x_mode: u32,
        y0_mode: u32,
        pairs: bool,
    ) -> PipelineKey {
        let w = self.w;
        let is_wide = tile > TILE;
        if is_wide && self.digits.is_some() {
            idot::key_of("matvec_wide_idot", w, wide_entry(entry), per_sg, tile)
        } else if is_wide {
            fused_key(wide_op(pairs), w, wide_entry(entry), per_sg, tile, 0)
                .constant("XPERM", f64::from(u8::from(self.task_order.is_some())))
        } else if self.digits.is_some() || self.local.is_some() {
            let op = if x_mode == 3 {
                "matvec_norm_idot"
            } else if y0_mode == 3 {
                "matvec_conv_idot"
            } else {
                "matvec_idot"
            };
            match self.local {
                Some(words) => idot::local_key(op, w, entry, per_sg, x_mode, words),
                None => idot::key_of(op, w, entry, per_sg, tile),
            }
        } else if x_mode == 3 {
            fused_key("matvec_norm", w, entry, per_sg, tile, 3)
        } else if y0_mode == 3 {
            fused_key("matvec_conv", w, entry, per_sg, tile, 0)
        } else {
            key(
                w,
                any_length(w, self.x, self.xform),
                entry,
                per_sg,
                tile,
                self.xform,
            )
        }
    }
}

/// The integer-digit arithmetic of a dense mat-vec, where it applies: decode's digits staged by
/// each workgroup (the words, [`idot::local_words`]), or x split once into digits (recorded here).
fn int_digits(
    ctx: &GpuContext,
    rec: &mut Recorder,
    w: &GpuWeight,
    x: View,
    xform: XForm,
    store: Store,
    items: usize,
) -> Result<(Option<usize>, Option<idot::Split>), GpuError> {
    // The integer-digit arithmetic: x split once, or staged by decode's workgroups. (An input
    // norm was stored apart before unless decode stages the normed vector, see norm_apart.)
    let normed_on_load = matches!(
        store,
        Store::Segments {
            fused: SegFusion::Norm(_),
            ..
        }
    );
    let int = (!normed_on_load || items == 1) && idot::usable(ctx, w, x, xform);
    // Decode stages its one vector's digits in each workgroup, without a split dispatch.
    let local = if int && items == 1 {
        idot::local_words(ctx, w, 1)
    } else {
        None
    };
    let digits = if int && local.is_none() && !normed_on_load {
        Some(idot::split(ctx, rec, w, x, xform, items)?)
    } else {
        None
    };
    Ok((local, digits))
}

/// Vectors per wide tile of a dense mat-vec (0: none): [`wide_items`] where the store has a wide
/// entry and [`wide_ok`] allows it.
fn wide_tile(w: &GpuWeight, x: View, xform: XForm, store: Store) -> usize {
    let wide_store = match store {
        Store::Segments { fused, .. } => matches!(fused, SegFusion::None),
        _ => true,
    };
    if wide_store && wide_ok(w, x, xform) {
        wide_items()
    } else {
        0
    }
}

/// How `items` vectors are tiled, as (first item, count, vectors per tile) runs: tiles of `wide`
/// vectors (0: none), then one of [`SMALL_WIDE`] where at least that many remain and
/// [`small_wide`] allows it, then tiles of `TILE`, then the rest as one tile. Every (row, vector)
/// has the same bits in any of them.
fn tile_runs(items: usize, wide: usize) -> Vec<(usize, usize, usize)> {
    let mut runs = Vec::with_capacity(4);
    let full_wide = items.checked_div(wide).map_or(0, |n| n * wide);
    runs.push((0, full_wide, wide));
    let mut at = full_wide;
    if wide > SMALL_WIDE && small_wide() && items - at >= SMALL_WIDE {
        runs.push((at, SMALL_WIDE, SMALL_WIDE));
        at += SMALL_WIDE;
    }
    let full = at + (items - at) / TILE * TILE;
    runs.push((at, full - at, TILE));
    runs.push((full, items - full, items - full));
    runs.retain(|r| r.1 > 0);
    runs
}

/// x's first `count` vectors in task order for `w`'s wide tiles, in the context's buffer for it:
/// returns that buffer, whose vectors are `w.row_len` floats apart from offset 0.
pub(super) fn permuted_x(
    ctx: &GpuContext,
    rec: &mut Recorder,
    w: &GpuWeight,
    x: View,
    count: usize,
) -> Result<GpuBuf, GpuError> {
    let k = w.row_len;
    let out = ctx.xperm_buffer(count * k)?;
    let params = MatvecParams {
        k: to_u32(k, "k")?,
        items: to_u32(count, "items")?,
        x_stride: to_u32(x.stride, "x stride")?,
        x_offset: to_u32(x.offset, "x offset")?,
        y_stride: to_u32(k, "y stride")?,
        ..Default::default()
    };
    let (gy, gz) = item_grid(count);
    let gx = to_u32((k / 4).div_ceil(64), "grid x")?;
    rec.push(
        ctx,
        &PipelineKey::new(format!("matvec_wide:{}", w.ty.name()), "permute_x"),
        &[(1, &*x.buf.buffer), (9, &*out.buffer)],
        bytemuck::bytes_of(&params),
        [gx, gy, gz],
    )?;
    Ok(out)
}
