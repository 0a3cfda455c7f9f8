//! Launchers for shaders/elementwise.wgsl: `silu_scale`, `swiglu`, `copy_rows` and `block_mean`.

use super::{need, u};
use crate::gpu::buffers::GpuBuf;
use crate::gpu::kernels::Recorder;
use crate::gpu::pipelines::PipelineKey;
use crate::gpu::{GpuContext, GpuError};

#[repr(C)]
#[derive(Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
struct ElementwiseParams {
    count: u32,
    a: f32,
    width: u32,
    rows: u32,
    src_off: u32,
    src_stride: u32,
    dst_off: u32,
    dst_stride: u32,
    row0: u32,
    ratio: u32,
}

fn flat_grid(count: usize) -> Result<[u32; 3], GpuError> {
    let groups = count.div_ceil(64);
    let x = groups.min(65535);
    Ok([u(x)?, u(groups.div_ceil(x.max(1)))?, 1])
}

/// y[i] = silu(y[i] * a) for the first `count` elements.
pub fn silu_scale(
    ctx: &GpuContext,
    rec: &mut Recorder,
    y: &GpuBuf,
    count: usize,
    a: f32,
) -> Result<(), GpuError> {
    need(y, count, "silu")?;
    let params = ElementwiseParams {
        count: u(count)?,
        a,
        ..Default::default()
    };
    rec.push(
        ctx,
        &PipelineKey::new("elementwise", "silu_scale"),
        &[(1, &*y.buffer)],
        bytemuck::bytes_of(&params),
        flat_grid(count)?,
    )
}

/// gate[i] = silu(gate[i]) * up[i].
pub fn swiglu(
    ctx: &GpuContext,
    rec: &mut Recorder,
    gate: &GpuBuf,
    up: &GpuBuf,
    count: usize,
) -> Result<(), GpuError> {
    need(gate, count, "swiglu gate")?;
    need(up, count, "swiglu up")?;
    let params = ElementwiseParams {
        count: u(count)?,
        ..Default::default()
    };
    rec.push(
        ctx,
        &PipelineKey::new("elementwise", "swiglu"),
        &[(0, &*up.buffer), (1, &*gate.buffer)],
        bytemuck::bytes_of(&params),
        flat_grid(count)?,
    )
}

/// dst[dst_off + (row0 + t) * dst_stride + i] = src[src_off + t * src_stride + i], i < width, t < rows.
#[allow(clippy::too_many_arguments)]
pub fn copy_rows(
    ctx: &GpuContext,
    rec: &mut Recorder,
    src: &GpuBuf,
    src_off: usize,
    src_stride: usize,
    dst: &GpuBuf,
    dst_off: usize,
    dst_stride: usize,
    row0: usize,
    rows: usize,
    width: usize,
) -> Result<(), GpuError> {
    if rows == 0 {
        return Ok(());
    }
    need(
        src,
        src_off + (rows - 1) * src_stride + width,
        "copy source",
    )?;
    need(
        dst,
        dst_off + (row0 + rows - 1) * dst_stride + width,
        "copy destination",
    )?;
    let params = ElementwiseParams {
        width: u(width)?,
        rows: u(rows)?,
        src_off: u(src_off)?,
        src_stride: u(src_stride)?,
        dst_off: u(dst_off)?,
        dst_stride: u(dst_stride)?,
        row0: u(row0)?,
        ..Default::default()
    };
    rec.push(
        ctx,
        &PipelineKey::new("elementwise", "copy_rows"),
        &[(0, &*src.buffer), (1, &*dst.buffer)],
        bytemuck::bytes_of(&params),
        [u(width.div_ceil(64))?, u(rows)?, 1],
    )
}

/// Block means of raw indexer keys: blocks [first, first + count) of `ratio` rows of `width`.
#[allow(clippy::too_many_arguments)]
pub fn block_mean(
    ctx: &GpuContext,
    rec: &mut Recorder,
    raw: &GpuBuf,
    out: &GpuBuf,
    first: usize,
    count: usize,
    ratio: usize,
    width: usize,
) -> Result<(), GpuError> {
    if count == 0 {
        return Ok(());
    }
    need(raw, (first + count) * ratio * width, "block mean input")?;
    need(out, (first + count) * width, "block mean output")?;
    let params = ElementwiseParams {
        width: u(width)?,
        rows: u(count)?,
        row0: u(first)?,
        ratio: u(ratio)?,
        ..Default::default()
    };
    rec.push(
        ctx,
        &PipelineKey::new("elementwise", "block_mean"),
        &[(0, &*raw.buffer), (1, &*out.buffer)],
        bytemuck::bytes_of(&params),
        [u(width.div_ceil(64))?, u(count)?, 1],
    )
}
