//! The decode stage of the pinned tier: a decode step's routed experts that have no hot copy in
//! VRAM are first copied from their tensors in host memory into a small VRAM stage, one unit per
//! routed item (`stage_units`, shaders/stage.wgsl: whole consecutive words per subgroup, so the
//! bus carries full line requests), and the expert kernels then read them there. The expert
//! kernels reading host memory in place fetch a few scattered words per lane, which reaches about
//! 60 % of the link. The kernels read the same bytes from either place, so the same bits.
//! Steps of more tokens (prefill chunks, batched decode) read in place.

use super::*;
use crate::gpu::buffers::Placement;
use crate::model::weights::MoeWeights;

use super::load::upload_expert_units;

/// Tokens per step whose misses the stage holds (a step of more tokens reads in place).
pub(super) const STAGE_TOKENS: usize = 1;

/// A VRAM stage of `units` experts with the layout of the model's expert tensors.
pub(super) struct ExpertStage {
    pub gate_up: GpuWeight,
    pub down: GpuWeight,
    pub units: usize,
}

/// Whether decode steps stage their misses: on unless `STRATA_STAGE=0` (A/B runs; the bits are
/// the same either way).
pub(super) fn stage_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("STRATA_STAGE").map_or(true, |v| v != "0"))
}

/// VRAM bytes of a stage of `units` experts shaped like `m`'s (GGUF bytes: a split layout moves
/// the scales, it does not add bytes).
pub(super) fn stage_bytes(m: &MoeWeights, units: usize) -> u64 {
    let unit = |list: &[QuantMatrix]| list.first().map_or(0, |q| q.bytes().len() as u64);
    (unit(&m.gate) + unit(&m.up) + unit(&m.down)) * units as u64
}

impl ExpertStage {
    /// A stage of `units` experts shaped like `m`'s, holding copies of expert 0 until a step
    /// stages its own.
    pub fn new(c: &GpuContext, m: &MoeWeights, units: usize) -> Result<Self, GpuError> {
        let set = vec![0u32; units];
        Ok(Self {
            gate_up: upload_expert_units(
                c,
                "expert stage gate|up",
                &[&m.gate, &m.up],
                &set,
                Placement::Vram,
            )?,
            down: upload_expert_units(c, "expert stage down", &[&m.down], &set, Placement::Vram)?,
            units,
        })
    }

    /// Whether `e`'s tensors have this stage's layout (a layer of other types reads in place).
    pub fn fits(&self, e: &ResidentExperts) -> bool {
        same_layout(&self.gate_up, &e.gate_up) && same_layout(&self.down, &e.down)
    }

    /// Record the copies of the experts `ids` names (`u32::MAX`: none) from `e`'s tensors into
    /// the items' units: one dispatch per part and byte range of each tensor, none depending on
    /// another.
    pub fn record(
        &self,
        c: &GpuContext,
        rec: &mut Recorder,
        e: &ResidentExperts,
        ids: &GpuBuf,
        items: usize,
    ) -> Result<(), GpuError> {
        if items > self.units {
            return Err(GpuError::BadArgs(format!(
                "expert stage: {items} items for {} units",
                self.units
            )));
        }
        for (src, dst) in [(&e.gate_up, &self.gate_up), (&e.down, &self.down)] {
            let dst_ranges = unit_strides(dst, 0, self.units)?;
            for part in &src.parts {
                let first = part.first_row / src.rows_per_unit;
                let units = part.n_rows / src.rows_per_unit;
                let src_ranges = unit_strides(src, first, units)?;
                for (&(sb, so, stride, len), &(db, doff, dstride, dlen)) in
                    src_ranges.iter().zip(&dst_ranges)
                {
                    if len != dlen {
                        return Err(GpuError::BadArgs(format!(
                            "{}: a unit range of {len} bytes against the stage's {dlen}",
                            src.name
                        )));
                    }
                    let range = ops::StageRange {
                        src: sb,
                        unit_first: first,
                        units,
                        src_base: so,
                        src_stride: stride,
                        dst: db,
                        dst_base: doff,
                        dst_stride: dstride,
                        bytes: len,
                    };
                    ops::stage_units(c, rec, range, ids, items)?;
                }
            }
        }
        Ok(())
    }
}

/// The byte ranges of unit `first` of `w` with the stride between consecutive units (the range's
/// length when the part holds one unit): (buffer, offset, stride, length) per range.
fn unit_strides(
    w: &GpuWeight,
    first: usize,
    units: usize,
) -> Result<Vec<(&wgpu::Buffer, u64, u64, u64)>, GpuError> {
    let missing = || GpuError::BadArgs(format!("{}: no unit {first}", w.name));
    let r0 = w.unit_ranges(first).ok_or_else(missing)?;
    let r1 = if units > 1 {
        Some(w.unit_ranges(first + 1).ok_or_else(missing)?)
    } else {
        None
    };
    Ok(r0
        .iter()
        .enumerate()
        .map(|(j, &(buf, off, len))| {
            let stride = r1.as_ref().map_or(len, |r| r[j].1 - off);
            (buf, off, stride, len)
        })
        .collect())
}

fn same_layout(a: &GpuWeight, b: &GpuWeight) -> bool {
    a.ty == b.ty
        && a.row_len == b.row_len
        && a.rows_per_unit == b.rows_per_unit
        && a.row_stride == b.row_stride
        && a.split.is_some() == b.split.is_some()
}
