//! The qwen4exp model: configuration, weights bound by GGUF name, and the CPU reference forward pass
//! (one file per block type). The CPU pass is the ground truth the GPU backend is checked against;
//! it equals transformers' `Qwen4ExpForCausalLM` on the oracle fixtures (tests/oracle_cpu.rs).

pub mod config;
pub mod cpu;
pub mod demo;
pub mod embedding;
pub mod gdn;
pub mod head;
pub mod hyper_connection;
pub mod moe;
pub mod ops;
pub mod ple;
pub mod qsa;
pub mod state;
pub mod weights;

pub use config::{Config, LayerKind};
pub use cpu::CpuBackend;
pub use weights::{QuantMatrix, Weights};

/// Errors while reading a model's configuration or binding its weights.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("GGUF metadata {key}: {message}")]
    Metadata { key: String, message: String },
    #[error("tensor {name} is missing from the GGUF")]
    MissingTensor { name: String },
    #[error("tensor {name} has shape {found:?}, expected {expected:?} (ggml ne order)")]
    BadShape {
        name: String,
        expected: Vec<u64>,
        found: Vec<u64>,
    },
    #[error("tensor {name} has type {ty} which strata does not support")]
    UnsupportedType { name: String, ty: String },
    #[error("tensor {name} holds a non-finite value{detail}")]
    NonFiniteWeight { name: String, detail: String },
    #[error("tensor {name}: {message}")]
    Tensor { name: String, message: String },
}
