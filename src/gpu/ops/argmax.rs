//! Launcher for shaders/argmax.wgsl: `argmax` per row.

use super::{need, u, words};
use crate::gpu::buffers::GpuBuf;
use crate::gpu::kernels::Recorder;
use crate::gpu::pipelines::PipelineKey;
use crate::gpu::{GpuContext, GpuError};

/// Per row of `n` values: out[2r] = index of the maximum (lowest index on ties),
/// out[2r+1] = 1 if the row holds a non-finite value.
pub fn argmax(
    ctx: &GpuContext,
    rec: &mut Recorder,
    x: &GpuBuf,
    n: usize,
    rows: usize,
    out: &GpuBuf,
) -> Result<(), GpuError> {
    need(x, n * rows, "argmax input")?;
    need(out, 2 * rows, "argmax output")?;
    rec.push(
        ctx,
        &PipelineKey::new("argmax", "argmax"),
        &[(0, &*x.buffer), (1, &*out.buffer)],
        &words(&[u(n)?, u(rows)?]),
        [u(rows)?, 1, 1],
    )
}
