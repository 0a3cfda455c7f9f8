//! The store forms of a dense mat-vec dispatch ([`Store`]): each fills the dispatch's parameters
//! and bindings, and says which entry point runs it over how many rows.

use std::sync::Arc;

use super::norm::norm_params;
use super::tuning::tile_rows;
use super::{
    ConvStore, GpuBuf, GpuContext, GpuError, GpuWeight, MatvecParams, SegFusion, Store, View,
    WeightPart, XForm, any_length, base_params, bindings, need_floats, to_u32,
};

/// One dispatch of a dense mat-vec over `tile`-vector tiles of one part of `w`, as x and its store
/// fill it: the parameters and bindings so far, and the store's Y0_MODE (0: the rows; 2: output 0
/// holds `silu(y * scale)`; 3: the conv store).
pub(super) struct Dispatch<'a> {
    pub w: &'a GpuWeight,
    pub part: &'a WeightPart,
    pub x: View<'a>,
    pub xform: XForm,
    pub items: usize,
    pub tile: usize,
    pub params: MatvecParams,
    pub b: Vec<(u32, &'a wgpu::Buffer)>,
    pub y0_mode: u32,
}

impl<'a> Dispatch<'a> {
    /// The dispatch of `part` of `w` over tiles of `tile` vectors: the parameters every store
    /// starts from and the weight's bindings.
    pub fn new(
        w: &'a GpuWeight,
        part: &'a WeightPart,
        grid: &'a Option<Arc<wgpu::Buffer>>,
        x: View<'a>,
        xform: XForm,
        items: usize,
        tile: usize,
    ) -> Result<Self, GpuError> {
        Ok(Dispatch {
            w,
            part,
            x,
            xform,
            items,
            tile,
            params: base_params(w, part, x, xform, items)?,
            b: bindings(w, part, grid),
            y0_mode: 0,
        })
    }

    /// Binds x (binding 1): `task_order` where given, the wide run's vectors in task order (from
    /// item 0, k apart), else x itself.
    pub fn bind_x(&mut self, task_order: Option<&'a GpuBuf>) {
        match task_order {
            Some(xp) => {
                // The wide run starts at item 0: its vectors are xp's, k apart.
                self.params.x_offset = 0;
                self.params.x_stride = self.params.k;
                self.b.push((1, &*xp.buffer));
            }
            None => self.b.push((1, &*self.x.buf.buffer)),
        }
    }

    /// Fills in what `store` binds and sets: returns its entry point, the rows per subgroup and
    /// the row groups of the dispatch.
    pub fn store(&mut self, store: Store<'a>) -> Result<(&'static str, usize, usize), GpuError> {
        match store {
            Store::Rows(y) => self.rows(y),
            Store::Segments {
                outs,
                first,
                silu0,
                fused,
            } => self.segments(outs, first, silu0, fused),
            Store::Mix { out, normed, h, hc } => self.mix(out, normed, h, hc),
            Store::MoeCombine {
                wide,
                inject,
                routed,
                weights,
                logit,
                h,
                hc,
                k,
            } => self.moe_combine(wide, inject, routed, weights, logit, h, hc, k),
            Store::Combine {
                wide,
                inject,
                h,
                hc,
            } => self.combine(wide, inject, h, hc),
        }
    }

    /// `entry` with the rows per subgroup of this dispatch's tiles ([`tile_rows`]) and the part's
    /// row groups of that many rows.
    fn tiled(&self, entry: &'static str) -> (&'static str, usize, usize) {
        let per_sg = tile_rows(self.w, self.w.n_rows, self.tile);
        (entry, per_sg, self.part.n_rows.div_ceil(per_sg))
    }

    /// [`Store::Rows`].
    fn rows(&mut self, y: View<'a>) -> Result<(&'static str, usize, usize), GpuError> {
        let w = self.w;
        y.check(self.items, w.n_rows, &format!("matvec {} output", w.name))?;
        self.params.y_stride = to_u32(y.stride, "y stride")?;
        self.params.y_offset = to_u32(y.offset + self.part.first_row, "y offset")?;
        self.b.push((2, &*y.buf.buffer));
        Ok(self.tiled("matvec"))
    }

    /// [`Store::Segments`], with what it fuses ([`SegFusion`]).
    fn segments(
        &mut self,
        outs: [View<'a>; 3],
        first: [usize; 3],
        silu0: Option<f32>,
        fused: SegFusion<'a>,
    ) -> Result<(&'static str, usize, usize), GpuError> {
        let (w, items) = (self.w, self.items);
        segment_params(w, &mut self.params, outs, first, items)?;
        if let Some(scale) = silu0 {
            self.params.x_scale = scale;
            self.y0_mode = 2;
        }
        self.b.push((2, &*outs[0].buf.buffer));
        self.b.push((6, &*outs[1].buf.buffer));
        match fused {
            SegFusion::Norm(n) => {
                norm_params(w, &mut self.params, self.xform, first, n, items)?;
                self.b.push((7, &*n.normed.buf.buffer));
                self.b.push((15, &*n.weight.buffer));
            }
            SegFusion::Conv(conv) => {
                conv_checks(w, self.x, silu0, first, conv, items)?;
                self.y0_mode = 3;
                self.b.push((7, &*outs[2].buf.buffer));
                self.b.push((13, &*conv.history.buffer));
                self.b.push((14, &*conv.weight.buffer));
            }
            SegFusion::None => self.b.push((7, &*outs[2].buf.buffer)),
        }
        Ok(self.tiled("matvec_seg"))
    }

    /// [`Store::Mix`].
    fn mix(
        &mut self,
        out: View<'a>,
        normed: &'a GpuBuf,
        h: usize,
        hc: usize,
    ) -> Result<(&'static str, usize, usize), GpuError> {
        let (w, items) = (self.w, self.items);
        if w.parts.len() != 1 || w.n_rows != h * hc || !(1..=4).contains(&hc) {
            return Err(GpuError::BadArgs(format!(
                "matvec {}: mixing needs one part of {hc} x {h} rows (1 to 4 streams)",
                w.name
            )));
        }
        out.check(items, h, &format!("matvec {} mix output", w.name))?;
        need_floats(normed, items * h * hc, "mix normed streams")?;
        self.params.y_stride = to_u32(out.stride, "y stride")?;
        self.params.y_offset = to_u32(out.offset, "y offset")?;
        self.params.h = to_u32(h, "h")?;
        self.params.hc = to_u32(hc, "hc")?;
        self.b.push((2, &*out.buf.buffer));
        self.b.push((8, &*normed.buffer));
        // One subgroup per value i (its hc gate rows).
        Ok(("matvec_mix", hc, h))
    }

    /// [`Store::MoeCombine`].
    #[allow(clippy::too_many_arguments)]
    fn moe_combine(
        &mut self,
        wide: &'a GpuBuf,
        inject: &'a GpuBuf,
        routed: &'a GpuBuf,
        weights: &'a GpuBuf,
        logit: &'a GpuBuf,
        h: usize,
        hc: usize,
        k: usize,
    ) -> Result<(&'static str, usize, usize), GpuError> {
        let (w, items) = (self.w, self.items);
        residual_store(w, &mut self.params, &mut self.b, wide, inject, h, hc, items)?;
        need_floats(routed, items * k * h, "routed expert outputs")?;
        need_floats(weights, items * k, "routing weights")?;
        need_floats(logit, items, "shared expert gate")?;
        self.params.slots = to_u32(k, "slots")?;
        self.b.extend([
            (10, &*routed.buffer),
            (11, &*weights.buffer),
            (12, &*logit.buffer),
        ]);
        Ok(self.tiled("matvec_moe_combine"))
    }

    /// [`Store::Combine`].
    fn combine(
        &mut self,
        wide: &'a GpuBuf,
        inject: &'a GpuBuf,
        h: usize,
        hc: usize,
    ) -> Result<(&'static str, usize, usize), GpuError> {
        let (w, items) = (self.w, self.items);
        residual_store(w, &mut self.params, &mut self.b, wide, inject, h, hc, items)?;
        Ok(self.tiled("matvec_combine"))
    }
}

/// The part both residual stores share: `w`'s rows are one stream's width `h`, the wide residual
/// (binding 2) holds `hc` streams per vector and the injection logits (binding 8) `hc` per vector.
#[allow(clippy::too_many_arguments)]
fn residual_store<'a>(
    w: &GpuWeight,
    params: &mut MatvecParams,
    b: &mut Vec<(u32, &'a wgpu::Buffer)>,
    wide: &'a GpuBuf,
    inject: &'a GpuBuf,
    h: usize,
    hc: usize,
    items: usize,
) -> Result<(), GpuError> {
    if w.n_rows != h {
        return Err(GpuError::BadArgs(format!(
            "matvec {}: {} rows cannot be combined into streams of {h}",
            w.name, w.n_rows
        )));
    }
    need_floats(wide, items * h * hc, "combine residual")?;
    need_floats(inject, items * hc, "combine injection")?;
    params.h = to_u32(h, "h")?;
    params.hc = to_u32(hc, "hc")?;
    b.push((2, &*wide.buffer));
    b.push((8, &*inject.buffer));
    Ok(())
}

pub(super) fn segment_params(
    w: &GpuWeight,
    params: &mut MatvecParams,
    outs: [View; 3],
    first: [usize; 3],
    items: usize,
) -> Result<(), GpuError> {
    if first[0] != 0 || first[1] > first[2] || first[2] > w.n_rows {
        return Err(GpuError::BadArgs(format!(
            "matvec {}: bad segments {first:?} of {} rows",
            w.name, w.n_rows
        )));
    }
    let ends = [first[1], first[2], w.n_rows];
    for (s, out) in outs.iter().enumerate() {
        out.check(
            items,
            ends[s] - first[s],
            &format!("matvec {} segment {s}", w.name),
        )?;
    }
    params.y_stride = to_u32(outs[0].stride, "y stride")?;
    params.y_offset = to_u32(outs[0].offset, "y offset")?;
    params.seg1 = to_u32(first[1], "segment 1")?;
    params.seg2 = to_u32(first[2], "segment 2")?;
    params.y1_offset = to_u32(outs[1].offset, "y1 offset")?;
    params.y1_stride = to_u32(outs[1].stride, "y1 stride")?;
    params.y2_offset = to_u32(outs[2].offset, "y2 offset")?;
    params.y2_stride = to_u32(outs[2].stride, "y2 stride")?;
    Ok(())
}

/// A [`ConvStore`] needs one vector, no other store transform, and segment 0's rows as its
/// channels.
fn conv_checks(
    w: &GpuWeight,
    x: View,
    silu0: Option<f32>,
    first: [usize; 3],
    conv: ConvStore,
    items: usize,
) -> Result<(), GpuError> {
    let channels = first[1];
    if items != 1 || silu0.is_some() || any_length(w, x, XForm::Plain) {
        return Err(GpuError::BadArgs(format!(
            "matvec {}: the conv store takes one vector and plain rows",
            w.name
        )));
    }
    need_floats(conv.history, 3 * channels, "conv history")?;
    need_floats(conv.weight, 4 * channels, "conv taps")
}

/// Whether `w`'s mat-vec can finish an MoE block in its store ([`Store::MoeCombine`]): it binds
/// five buffers more than a plain mat-vec, which must fit the adapter's storage buffers per stage.
pub fn can_moe_combine(ctx: &GpuContext, w: &GpuWeight) -> bool {
    let Some(part) = w.parts.first() else {
        return false;
    };
    let grid = match ctx.grid_buffer(w.ty) {
        Ok(g) => g,
        Err(_) => return false,
    };
    // The weight's own bindings, x, and the five of the store.
    let needed = bindings(w, part, &grid).len() + 1 + 5;
    needed <= ctx.adapter.max_storage_buffers_per_shader_stage as usize
}
