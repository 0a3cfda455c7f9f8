//! Helpers shared by the tests: fixture paths, the GPU adapter, deterministic data, and the oracle
//! comparison that the CPU and GPU backends both run.
// Each test binary compiles this module on its own and uses a different subset of it.
#![allow(dead_code)]

pub mod gpu;
pub mod real_widths;

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

/// `tests/fixtures`, every fixture set's parent.
pub fn fixtures_root() -> PathBuf {
    repo_root().join("tests/fixtures")
}

/// `tests/fixtures/tiny`: the tiny oracle model, its prompts and references.
pub fn fixtures() -> PathBuf {
    fixtures_root().join("tiny")
}

/// The shipped tiny model of one type (`F16`, `IQ3_S`, ...): `tests/fixtures/tiny/tiny-{ty}.gguf`.
pub fn tiny_model(ty: &str) -> PathBuf {
    fixtures().join(format!("tiny-{ty}.gguf"))
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

/// One xorshift64 step (13, 7, 17) of `s`, returning the new state.
pub fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// Deterministic pseudo-random values in [-1, 1) (xorshift), never all zeros.
pub fn random_vec(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| ((xorshift(&mut s) >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0)
        .collect()
}

/// The bit patterns of `v`, to compare floats exactly (NaN and -0.0 included).
pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Whether `a` and `b` hold the same values bit for bit.
pub fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// GGUF files of the tiny model that tests can open: the shipped ones from `tests/fixtures/tiny`,
/// and `Q6_K`, rebuilt in memory by [`rebuilt_q6_k`] (the whole file would push the fixtures past
/// their 20 MB budget).
pub fn open_fixture(ty: &str) -> strata::gguf::Gguf {
    if ty == "Q6_K" {
        return rebuilt_q6_k();
    }
    let path = tiny_model(ty);
    strata::gguf::Gguf::open(&path)
        .unwrap_or_else(|e| panic!("fixture {} opens: {e}", path.display()))
}

/// Byte length of the oracle's `tiny-Q6_K.gguf` header (metadata and tensor infos, padded).
const Q6_K_HEADER_BYTES: usize = 24_896;
/// Byte length of the oracle's `tiny-Q6_K.gguf`.
const Q6_K_FILE_BYTES: usize = 5_026_112;
/// FNV-1a 64 of the oracle's `tiny-Q6_K.gguf` (sha256 c81e21a6… in `gguf_manifest.json`).
const Q6_K_FNV1A64: u64 = 0x6857_d3dc_23c9_0e68;

/// The oracle's `tiny-Q6_K.gguf`, byte for byte, from `tiny-Q6_K.part` (its header followed by the
/// data of its Q6_K tensors, in file order) and `tiny-F16.gguf`: every other tensor of the Q6_K file
/// is F32, F16 or Q8_0 made by llama-quantize from the same weight values the F16 file holds, and
/// strata's F32/F16/Q8_0 quantizers are byte-identical to ggml's (`tests/quant_vectors.rs`). The
/// result is checked against the original file's hash, so a wrong rebuild fails loudly.
pub fn rebuilt_q6_k() -> strata::gguf::Gguf {
    use strata::gguf::{GgmlType, Gguf};
    let part_path = fixtures().join("tiny-Q6_K.part");
    let part = std::fs::read(&part_path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", part_path.display()));
    assert!(
        part.len() >= Q6_K_HEADER_BYTES,
        "tiny-Q6_K.part is too short"
    );
    let mut bytes = part[..Q6_K_HEADER_BYTES].to_vec();
    bytes.resize(Q6_K_FILE_BYTES, 0);
    // Parse the header over zeroed data to learn every tensor's type and place.
    let layout = Gguf::from_vec("tiny-Q6_K.gguf", bytes.clone()).expect("Q6_K header parses");
    let f16 = open_fixture("F16");
    let mut tensors = layout.tensors().to_vec();
    tensors.sort_by_key(|t| t.offset);
    let mut next_q6 = Q6_K_HEADER_BYTES;
    for t in &tensors {
        let start = t.offset as usize;
        let len = t.n_bytes as usize;
        let dst = &mut bytes[start..start + len];
        if t.ty == GgmlType::Q6_K {
            dst.copy_from_slice(&part[next_q6..next_q6 + len]);
            next_q6 += len;
            continue;
        }
        let src = f16
            .tensor(&t.name)
            .unwrap_or_else(|| panic!("{} missing from tiny-F16.gguf", t.name));
        let mut values = vec![0f32; src.n_elements() as usize];
        strata::quant::dequantize(src.ty, f16.tensor_data(src), &mut values)
            .unwrap_or_else(|e| panic!("{}: {e}", t.name));
        strata::quant::quantize(t.ty, &values, dst).unwrap_or_else(|e| panic!("{}: {e}", t.name));
    }
    assert_eq!(
        next_q6,
        part.len(),
        "tiny-Q6_K.part holds exactly the Q6_K tensors"
    );
    let hash = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    assert_eq!(
        hash, Q6_K_FNV1A64,
        "rebuilt tiny-Q6_K.gguf differs from the oracle's file"
    );
    Gguf::from_vec("tiny-Q6_K.gguf", bytes).expect("rebuilt tiny-Q6_K.gguf parses")
}

/// The GPU adapter for a test (`STRATA_ADAPTER` picks one), printed. Without one the test is
/// skipped with a message, except under `CI`, where a missing adapter is a failure.
pub fn gpu_context() -> Option<Arc<strata::gpu::GpuContext>> {
    context_or_skip(strata::gpu::GpuContext::new(adapter_index()))
}

/// [`gpu_context`] with the limb arithmetic (docs/tensor-cores.md) whatever `STRATA_ARITH` says.
pub fn gpu_context_limb() -> Option<Arc<strata::gpu::GpuContext>> {
    context_or_skip(strata::gpu::GpuContext::with_arithmetic(
        adapter_index(),
        true,
    ))
}

fn adapter_index() -> Option<usize> {
    std::env::var("STRATA_ADAPTER")
        .ok()
        .and_then(|s| s.parse().ok())
}

fn context_or_skip(
    made: Result<Arc<strata::gpu::GpuContext>, strata::gpu::GpuError>,
) -> Option<Arc<strata::gpu::GpuContext>> {
    match made {
        Ok(ctx) => {
            println!("adapter: {}", ctx.describe());
            Some(ctx)
        }
        Err(e) => {
            if std::env::var_os("CI").is_some() {
                panic!("CI is set, so a missing GPU adapter is a failure: {e}");
            }
            eprintln!("SKIPPED: no usable GPU adapter ({e})");
            None
        }
    }
}
