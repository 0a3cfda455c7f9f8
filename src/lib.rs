//! strata: a wgpu inference engine and server for the Qwen3.8-Flash-Next (`qwen4exp`) family.
//!
//! Data flows one way: GGUF (`gguf`) → block formats (`quant`) → weights and the CPU reference
//! forward pass (`model`) or the GPU forward pass (`gpu`) → logits → `sampler` → `server` / `cli`.
//! `engine` is the seam between a forward pass and everything that consumes logits.

pub mod chat;
pub mod cli;
pub mod engine;
pub mod gguf;
pub mod gpu;
pub mod model;
pub mod npy;
pub mod platform;
pub mod quant;
pub mod sampler;
pub mod server;
pub mod tiers;
pub mod tokenizer;
