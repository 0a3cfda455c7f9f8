//! Launchers for the non-matvec kernels (norms, hyper-connections, GDN, PLE, QSA, MoE). Each one
//! packs its shader's `Params` (passed as immediates) and the buffers the entry point binds.

mod argmax;
mod elementwise;
mod gdn;
mod hc;
mod moe;
mod norm;
mod ple;
mod qsa;
mod stage;

pub use argmax::*;
pub use elementwise::*;
pub use gdn::*;
pub use hc::*;
pub use moe::*;
pub use norm::*;
pub use ple::*;
pub use qsa::*;
pub use stage::*;

use super::GpuError;
use super::buffers::GpuBuf;

fn u(v: usize) -> Result<u32, GpuError> {
    u32::try_from(v).map_err(|_| GpuError::BadArgs(format!("{v} does not fit in u32")))
}

fn words(values: &[u32]) -> Vec<u8> {
    bytemuck::cast_slice(values).to_vec()
}

fn need(buf: &GpuBuf, len: usize, what: &str) -> Result<(), GpuError> {
    if buf.len < len {
        return Err(GpuError::BadArgs(format!(
            "{what}: buffer of {} elements, {len} needed",
            buf.len
        )));
    }
    Ok(())
}
