//! The wgpu backend (Vulkan, Metal or DX12): device and adapter handling (`device`), tensors split to fit the
//! binding limits (`buffers`), the pipeline cache (`pipelines`), WGSL assembly (`shaders`), typed
//! kernel launchers (`kernels`), the sampling candidates (`topk`) and the whole model on the GPU (`backend`).
//!
//! Every kernel has a fixed reduction order that does not depend on how many tokens a dispatch
//! covers, so prefill in any chunk size gives the same bits as token-by-token decode.

pub mod backend;
pub mod buffers;
pub mod device;
pub mod iq_grids;
pub mod kernels;
pub mod layout;
pub mod matvec;
pub mod memory;
pub mod ops;
pub mod pipelines;
pub mod proj;
pub mod shaders;
pub mod tiered;
pub mod topk;
pub mod upload;

pub use device::{AdapterSummary, GpuContext, list_adapters};

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("no usable GPU adapter: {0}")]
    NoAdapter(String),
    #[error("GPU device error: {0}")]
    Device(String),
    #[error("GPU validation error: {0}")]
    Validation(String),
    #[error("shader {shader} failed to build: {message}")]
    Shader { shader: String, message: String },
    #[error("not supported on the GPU backend: {0}")]
    Unsupported(String),
    #[error("bad GPU kernel arguments: {0}")]
    BadArgs(String),
}
