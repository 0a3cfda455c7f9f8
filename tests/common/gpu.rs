//! GPU buffer helpers for the kernel tests.

use strata::gpu::GpuContext;
use strata::gpu::buffers::GpuBuf;

/// `v` in a new storage buffer.
pub fn upload(ctx: &GpuContext, v: &[f32]) -> GpuBuf {
    GpuBuf::from_f32(ctx, "test", v).expect("upload")
}

/// The first `n` values of `b`.
pub fn download(ctx: &GpuContext, b: &GpuBuf, n: usize) -> Vec<f32> {
    b.read_f32(ctx, 0, n).expect("download")
}
