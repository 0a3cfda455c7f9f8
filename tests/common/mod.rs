//! Helpers shared by the oracle tests (CPU and GPU backends run the same comparison).
// Each test binary compiles this module on its own and uses a different subset of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use strata::engine::Backend;
use strata::npy::{self, NpyArray};

/// The repository root: `STRATA_REPO` when set (a test binary carried to another machine, where
/// the compile-time path does not exist), else the crate directory.
pub fn repo_root() -> PathBuf {
    std::env::var_os("STRATA_REPO")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

pub fn fixtures() -> PathBuf {
    repo_root().join("tests/fixtures/tiny")
}

pub fn read(path: &Path) -> NpyArray {
    npy::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// Token ids of one prompt of `prompts.json`.
pub fn prompt_ids(name: &str) -> Vec<u32> {
    let text = std::fs::read_to_string(fixtures().join("prompts.json")).expect("prompts.json");
    let all: serde_json::Value = serde_json::from_str(&text).expect("prompts.json parses");
    all[name]
        .as_array()
        .expect("prompt is a list")
        .iter()
        .map(|v| v.as_u64().expect("id") as u32)
        .collect()
}

/// Every position's logits for `tokens`, fed `chunk` tokens per call.
pub fn run<B: Backend + 'static>(backend: &Arc<B>, tokens: &[u32], chunk: usize) -> Vec<f32> {
    let mut seq = Arc::clone(backend).new_sequence().expect("sequence");
    let mut out = Vec::new();
    for piece in tokens.chunks(chunk) {
        out.extend(seq.feed(piece, true).expect("feed"));
    }
    out
}

/// Minimum over the QSA layers of the margin at each position (rows = layers).
pub fn margins(path: &Path) -> Vec<f32> {
    let m = read(path);
    let len = *m.shape.last().expect("margin shape");
    (0..len)
        .map(|i| {
            m.data
                .iter()
                .skip(i)
                .step_by(len)
                .copied()
                .fold(f32::INFINITY, f32::min)
        })
        .collect()
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}
