//! Launcher for shaders/stage.wgsl: `stage_units`, copying expert units into a VRAM stage.

use super::{need, u, words};
use crate::gpu::buffers::GpuBuf;
use crate::gpu::kernels::Recorder;
use crate::gpu::pipelines::PipelineKey;
use crate::gpu::{GpuContext, GpuError};

/// One byte range of an expert unit for [`stage_units`]: units `unit_first ..
/// unit_first + units` of a source tensor part in `src`, unit `e` at byte `src_base + (e -
/// unit_first) * src_stride`, copied to `dst_base + item * dst_stride` in `dst`, `bytes` each (all
/// multiples of 4).
#[derive(Clone, Copy)]
pub struct StageRange<'a> {
    pub src: &'a wgpu::Buffer,
    pub unit_first: usize,
    pub units: usize,
    pub src_base: u64,
    pub src_stride: u64,
    pub dst: &'a wgpu::Buffer,
    pub dst_base: u64,
    pub dst_stride: u64,
    pub bytes: u64,
}

/// Words one `stage_units` workgroup copies (stage.wgsl: STAGE_WG x PER).
const STAGE_WORDS_PER_WG: u64 = 256 * 8;

/// Copy range `r` of each item's expert `ids[item]` (items of other parts and `u32::MAX` ids copy
/// nothing) into the item's unit of a VRAM stage. See stage.wgsl.
pub fn stage_units(
    ctx: &GpuContext,
    rec: &mut Recorder,
    r: StageRange,
    ids: &GpuBuf,
    items: usize,
) -> Result<(), GpuError> {
    need(ids, items, "staged expert ids")?;
    let word = |v: u64, what: &str| -> Result<u32, GpuError> {
        if !v.is_multiple_of(4) {
            return Err(GpuError::BadArgs(format!(
                "expert stage: {what} of {v} bytes is not whole words"
            )));
        }
        u32::try_from(v / 4)
            .map_err(|_| GpuError::BadArgs(format!("expert stage: {what} of {v} bytes")))
    };
    let src_end = r.src_base + r.src_stride * r.units.saturating_sub(1) as u64 + r.bytes;
    let dst_end = r.dst_base + r.dst_stride * items.saturating_sub(1) as u64 + r.bytes;
    let overlap = (items > 1 && r.bytes > r.dst_stride) || (r.units > 1 && r.bytes > r.src_stride);
    if src_end > r.src.size() || dst_end > r.dst.size() || overlap {
        return Err(GpuError::BadArgs(format!(
            "expert stage: a range of {} bytes overlaps or passes its buffers ({src_end} of {}, \
             {dst_end} of {})",
            r.bytes,
            r.src.size(),
            r.dst.size()
        )));
    }
    word(src_end, "the source end")?;
    word(dst_end, "the stage end")?;
    let params = [
        u(items)?,
        u(r.unit_first)?,
        u(r.units)?,
        word(r.src_base, "the source base")?,
        word(r.src_stride, "the source stride")?,
        word(r.dst_base, "the stage base")?,
        word(r.dst_stride, "the stage stride")?,
        word(r.bytes, "the range")?,
    ];
    let groups = (r.bytes / 4).div_ceil(STAGE_WORDS_PER_WG);
    rec.push(
        ctx,
        &PipelineKey::new("stage", "stage_units"),
        &[(0, r.src), (1, r.dst), (2, &*ids.buffer)],
        &words(&params),
        [u(groups as usize)?, u(items)?, 1],
    )
}
