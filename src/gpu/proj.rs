//! Projections that read the same input vector, recorded as one dispatch.
//!
//! The matrices are grouped by output buffer (a group's matrices write consecutive rows of its
//! output). When every matrix has the same type and width they are uploaded as ONE weight, their
//! rows concatenated, and run as one segmented mat-vec; otherwise each runs on its own. A row's
//! bits are the same either way (the mat-vec's rows never depend on the rows beside them), so
//! the choice changes speed only.

use crate::gguf::types::GgmlType;
use crate::model::weights::QuantMatrix;

use super::buffers::{GpuWeight, Placement};
use super::kernels::{Recorder, View};
use super::matvec::{self, ConvStore, InputNorm, SegFusion, Store, XForm};
use super::{GpuContext, GpuError};

/// One matrix of a projection: GGUF rows of `ty`.
#[derive(Clone, Copy)]
pub struct Src<'a> {
    pub name: &'a str,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub bytes: &'a [u8],
}

impl<'a> From<&'a QuantMatrix> for Src<'a> {
    fn from(m: &'a QuantMatrix) -> Self {
        Src {
            name: m.name(),
            ty: m.ty,
            rows: m.rows,
            cols: m.cols,
            bytes: m.bytes(),
        }
    }
}

impl<'a> Src<'a> {
    /// An f32 vector as a one-row matrix.
    pub fn vector(name: &'a str, v: &'a [f32]) -> Self {
        Src {
            name,
            ty: GgmlType::F32,
            rows: 1,
            cols: v.len(),
            bytes: bytemuck::cast_slice(v),
        }
    }
}

pub struct MultiProj {
    /// The concatenated weight, when the matrices could be joined.
    fused: Option<GpuWeight>,
    /// Otherwise each matrix: (group, first row inside the group's output, weight).
    separate: Vec<(usize, usize, GpuWeight)>,
    /// Rows of each group.
    group_rows: Vec<usize>,
}

impl MultiProj {
    /// Upload `groups` (at most 3 output groups) of matrices that share their input.
    pub fn upload(ctx: &GpuContext, name: &str, groups: &[&[Src]]) -> Result<Self, GpuError> {
        let all: Vec<Src> = groups.iter().flat_map(|g| g.iter().copied()).collect();
        let Some(first) = all.first() else {
            return Err(GpuError::BadArgs(format!("{name}: no matrices")));
        };
        let group_rows: Vec<usize> = groups
            .iter()
            .map(|g| g.iter().map(|m| m.rows).sum())
            .collect();
        let joinable =
            groups.len() <= 3 && all.iter().all(|m| m.ty == first.ty && m.cols == first.cols);
        if joinable {
            let rows: usize = group_rows.iter().sum();
            let pieces: Vec<&[u8]> = all.iter().map(|m| m.bytes).collect();
            let shape = (first.ty, first.cols, rows, 1);
            let w = GpuWeight::upload_pieces(ctx, name, shape, &pieces, None, Placement::Vram)?;
            return Ok(Self {
                fused: Some(w),
                separate: Vec::new(),
                group_rows,
            });
        }
        let mut separate = Vec::new();
        for (g, mats) in groups.iter().enumerate() {
            let mut row = 0;
            for m in mats.iter() {
                let w = GpuWeight::upload(ctx, m.name, m.ty, m.cols, m.rows, 1, m.bytes)?;
                separate.push((g, row, w));
                row += m.rows;
            }
        }
        Ok(Self {
            fused: None,
            separate,
            group_rows,
        })
    }

    /// Bytes of the weights.
    pub fn bytes(&self) -> usize {
        self.fused.as_ref().map_or(0, GpuWeight::bytes)
            + self
                .separate
                .iter()
                .map(|(_, _, w)| w.bytes())
                .sum::<usize>()
    }

    /// Dispatches this projection takes.
    pub fn dispatches(&self) -> usize {
        if self.fused.is_some() {
            1
        } else {
            self.separate.len()
        }
    }

    /// Rows of group `g`.
    pub fn rows(&self, g: usize) -> usize {
        self.group_rows.get(g).copied().unwrap_or(0)
    }

    /// Record `t` vectors of `x` into `outs` (one view per group).
    pub fn record(
        &self,
        ctx: &GpuContext,
        rec: &mut Recorder,
        x: View,
        outs: &[View],
        t: usize,
    ) -> Result<(), GpuError> {
        self.record_silu0(ctx, rec, x, outs, t, None).map(|_| ())
    }

    /// [`Self::record`], with group 0 stored as `silu(y * scale)` when `silu0` is `Some(scale)`
    /// and the matrices are joined ([`Store::Segments`]'s `silu0`). Returns whether it was: if
    /// not, group 0 holds `y` and the caller transforms it.
    pub fn record_silu0(
        &self,
        ctx: &GpuContext,
        rec: &mut Recorder,
        x: View,
        outs: &[View],
        t: usize,
        silu0: Option<f32>,
    ) -> Result<bool, GpuError> {
        self.record_with(ctx, rec, x, outs, t, silu0, SegFusion::None)
    }

    /// Whether [`Self::record_normed`] can take an input normed in groups of `group` values with
    /// a weight of `period` values: the matrices are joined into at most two groups and the
    /// joined weight's layout has the norm on load (`matvec::can_norm_input`).
    pub fn can_norm_input(&self, group: usize, period: usize) -> bool {
        self.group_rows.len() <= 2
            && self
                .fused
                .as_ref()
                .is_some_and(|w| matvec::can_norm_input(w, group, period))
    }

    /// [`Self::record_silu0`] over the grouped RMS norm of `x` ([`InputNorm`], which also stores
    /// the normed vectors), in one dispatch. Only where [`Self::can_norm_input`] said so.
    #[allow(clippy::too_many_arguments)]
    pub fn record_normed(
        &self,
        ctx: &GpuContext,
        rec: &mut Recorder,
        x: View,
        norm: InputNorm,
        outs: &[View],
        t: usize,
        silu0: Option<f32>,
    ) -> Result<(), GpuError> {
        if !self.can_norm_input(norm.group, norm.period) {
            return Err(GpuError::BadArgs(
                "projection cannot norm its input on load".into(),
            ));
        }
        self.record_with(ctx, rec, x, outs, t, silu0, SegFusion::Norm(norm))
            .map(|_| ())
    }

    /// Decode's GDN input projection with the conv in its store ([`ConvStore`]): group 0 is the
    /// conv's input channels, and `outs[0]` receives their conv outputs. One vector only; `None`
    /// (nothing recorded) where the matrices are not joined, so the caller runs the conv itself.
    pub fn record_conv(
        &self,
        ctx: &GpuContext,
        rec: &mut Recorder,
        x: View,
        outs: &[View],
        conv: ConvStore,
    ) -> Result<Option<()>, GpuError> {
        if self.fused.is_none() {
            return Ok(None);
        }
        self.record_with(ctx, rec, x, outs, 1, None, SegFusion::Conv(conv))
            .map(|_| Some(()))
    }

    #[allow(clippy::too_many_arguments)]
    fn record_with(
        &self,
        ctx: &GpuContext,
        rec: &mut Recorder,
        x: View,
        outs: &[View],
        t: usize,
        silu0: Option<f32>,
        fused: SegFusion,
    ) -> Result<bool, GpuError> {
        if outs.len() != self.group_rows.len() {
            return Err(GpuError::BadArgs(format!(
                "projection of {} groups given {} outputs",
                self.group_rows.len(),
                outs.len()
            )));
        }
        if let Some(w) = &self.fused {
            // Absent groups are empty segments at the end (their view is never written).
            let pick = |g: usize| outs.get(g).copied().unwrap_or(outs[0]);
            let store = Store::Segments {
                outs: [pick(0), pick(1), pick(2)],
                first: [0, self.rows(0), self.rows(0) + self.rows(1)],
                silu0,
                fused,
            };
            matvec::matvec_with(ctx, rec, w, x, XForm::Plain, store, t)?;
            return Ok(silu0.is_some());
        }
        for (g, row, w) in &self.separate {
            let out = outs[*g];
            let y = View::new(out.buf, out.offset + row, out.stride);
            matvec::matvec(ctx, rec, w, x, y, t)?;
        }
        Ok(false)
    }
}
