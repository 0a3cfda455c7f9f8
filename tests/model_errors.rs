//! Bad weights and bad files give clear errors naming the tensor or the stage, never a panic or a
//! silent NaN (DEVELOPERS.md rules 2 and 4). Corrupted copies of the F16 fixture are built in memory.

use std::path::Path;
use std::sync::Arc;

use strata::engine::{Backend, EngineError};
use strata::gguf::{GgmlType, Gguf, GgufWriter, Value};
use strata::model::{Config, CpuBackend, LayerKind, ModelError};

fn fixture_bytes() -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny/tiny-F16.gguf");
    std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn load(bytes: Vec<u8>) -> Result<CpuBackend, ModelError> {
    let gguf = Gguf::from_vec("corrupted fixture", bytes).expect("still a valid GGUF container");
    CpuBackend::load(Arc::new(gguf), 0)
}

/// Byte range of a tensor's data inside the file.
fn tensor_range(bytes: &[u8], name: &str) -> (usize, usize) {
    let gguf = Gguf::from_vec("fixture", bytes.to_vec()).expect("fixture parses");
    let info = gguf
        .tensor(name)
        .unwrap_or_else(|| panic!("{name} in fixture"));
    (info.offset as usize, info.n_bytes as usize)
}

/// Rebuilds the fixture with `edit` deciding, per tensor, what to write (None = drop it).
fn rebuild(
    metadata_edit: impl Fn(&str, &Value) -> Option<Value>,
    tensor_edit: impl Fn(&str, &[u64], GgmlType, &[u8]) -> Option<(Vec<u64>, GgmlType, Vec<u8>)>,
) -> Vec<u8> {
    let gguf = Gguf::from_vec("fixture", fixture_bytes()).expect("fixture parses");
    let mut writer = GgufWriter::new();
    for (key, value) in gguf.metadata() {
        if let Some(v) = metadata_edit(key, value) {
            writer.add_metadata(key.clone(), v);
        }
    }
    for info in gguf.tensors() {
        if let Some((dims, ty, data)) =
            tensor_edit(&info.name, &info.dims, info.ty, gguf.tensor_data(info))
        {
            writer
                .add_tensor(info.name.clone(), &dims, ty, data)
                .expect("tensor fits");
        }
    }
    writer.to_bytes()
}

fn keep_tensor(
    _: &str,
    dims: &[u64],
    ty: GgmlType,
    data: &[u8],
) -> Option<(Vec<u64>, GgmlType, Vec<u8>)> {
    Some((dims.to_vec(), ty, data.to_vec()))
}

fn expect_error(result: Result<CpuBackend, ModelError>) -> String {
    match result {
        Ok(_) => panic!("the corrupted model loaded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn nan_in_an_embedding_row_is_reported_and_other_sequences_still_work() {
    let mut bytes = fixture_bytes();
    let (offset, _) = tensor_range(&bytes, "token_embd.weight");
    // Row 7 of the F16 embedding (256 values of 2 bytes): one NaN in the middle.
    let nan = half::f16::NAN.to_bits().to_le_bytes();
    let at = offset + 7 * 256 * 2 + 100 * 2;
    bytes[at..at + 2].copy_from_slice(&nan);
    let backend = Arc::new(load(bytes).expect("the embedding table is checked per gathered row"));

    let mut seq = Arc::clone(&backend).new_sequence().expect("sequence");
    match seq.feed(&[3, 7, 4], true) {
        Err(EngineError::NonFinite { stage, position }) => {
            assert_eq!(position, 1, "the bad token is the second one");
            assert!(
                stage.contains("token_embd.weight"),
                "stage names the tensor: {stage}"
            );
        }
        other => panic!("expected NonFinite, got {other:?}"),
    }
    // The failed sequence refuses further use; a fresh one without the bad token works.
    assert!(seq.feed(&[3], false).is_err());
    let mut fresh = Arc::clone(&backend).new_sequence().expect("sequence");
    let logits = fresh.feed(&[3, 4, 5], false).expect("fresh sequence runs");
    assert!(logits.iter().all(|v| v.is_finite()));
}

#[test]
fn overflow_inside_a_block_names_the_first_bad_stage() {
    let mut bytes = fixture_bytes();
    let (offset, n_bytes) = tensor_range(&bytes, "blk.0.ssm_a");
    // A finite but absurd decay rate: exp overflows inside the GDN recurrence of layer 0.
    for chunk in bytes[offset..offset + n_bytes].chunks_mut(4) {
        chunk.copy_from_slice(&1.0e30f32.to_le_bytes());
    }
    let backend = Arc::new(load(bytes).expect("finite weights load"));
    let mut seq = Arc::clone(&backend).new_sequence().expect("sequence");
    match seq.feed(&[3, 4], false) {
        Err(EngineError::NonFinite { stage, position }) => {
            assert_eq!(position, 0);
            assert_eq!(stage, "layer 0 GDN output");
        }
        other => panic!("expected NonFinite, got {other:?}"),
    }
}

#[test]
fn nan_in_a_small_weight_fails_at_load_naming_the_tensor() {
    let mut bytes = fixture_bytes();
    let (offset, _) = tensor_range(&bytes, "blk.2.ssm_norm.weight");
    bytes[offset + 8..offset + 12].copy_from_slice(&f32::NAN.to_le_bytes());
    let message = expect_error(load(bytes));
    assert!(
        message.contains("blk.2.ssm_norm.weight") && message.contains("non-finite"),
        "{message}"
    );
}

#[test]
fn missing_tensor_is_named() {
    let bytes = rebuild(
        |_, v| Some(v.clone()),
        |name, dims, ty, data| {
            (name != "blk.3.attn_k.weight").then(|| (dims.to_vec(), ty, data.to_vec()))
        },
    );
    let message = expect_error(load(bytes));
    assert_eq!(
        message,
        "tensor blk.3.attn_k.weight is missing from the GGUF"
    );
}

#[test]
fn wrong_shape_is_named() {
    let bytes = rebuild(
        |_, v| Some(v.clone()),
        |name, dims, ty, data| {
            if name == "blk.0.ssm_out.weight" {
                // Same bytes, rows and columns swapped in the header: [256, 256] stays square, so
                // truncate instead to a clearly wrong shape.
                Some((
                    vec![dims[0], dims[1] / 2],
                    ty,
                    data[..data.len() / 2].to_vec(),
                ))
            } else {
                Some((dims.to_vec(), ty, data.to_vec()))
            }
        },
    );
    let message = expect_error(load(bytes));
    assert!(
        message.starts_with("tensor blk.0.ssm_out.weight has shape [256, 128]"),
        "{message}"
    );
}

#[test]
fn missing_metadata_is_named() {
    let bytes = rebuild(
        |k, v| (k != "qwen4exp.ssm.group_count").then(|| v.clone()),
        keep_tensor,
    );
    let message = expect_error(load(bytes));
    assert!(
        message.contains("qwen4exp.ssm.group_count") && message.contains("missing"),
        "{message}"
    );
}

#[test]
fn zero_compress_ratios_mean_qsa_with_ratio_4() {
    // Finding F2: the converter may write all-zero ratios; the checkpoint intends QSA.
    let bytes = rebuild(
        |k, v| {
            if k == "qwen4exp.attention.compress_ratios" {
                Some(Value::Array(vec![Value::I32(0); 4]))
            } else {
                Some(v.clone())
            }
        },
        keep_tensor,
    );
    let gguf = Gguf::from_vec("zero ratios", bytes).expect("parses");
    let cfg = Config::from_gguf(&gguf).expect("config");
    assert!(cfg.assumed_qsa_ratio);
    assert_eq!(
        cfg.layers[3],
        LayerKind::Qsa {
            compress_ratio: Some(4)
        }
    );
    assert!(cfg.to_string().contains("assumed"));

    // The same logits as the original file, which says 4 explicitly (QSA is sparse from position 35).
    let ids: Vec<u32> = (0..48).map(|i| (i * 37 + 11) % 509).collect();
    let zero = Arc::new(CpuBackend::load(Arc::new(gguf), 0).expect("loads"));
    let original = Arc::new(load(fixture_bytes()).expect("loads"));
    let a = zero
        .new_sequence()
        .expect("seq")
        .feed(&ids, true)
        .expect("feed");
    let b = original
        .new_sequence()
        .expect("seq")
        .feed(&ids, true)
        .expect("feed");
    assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
}

#[test]
fn context_overflow_is_an_error() {
    let gguf = Gguf::from_vec("fixture", fixture_bytes()).expect("parses");
    let backend = Arc::new(CpuBackend::load(Arc::new(gguf), 4).expect("loads"));
    let mut seq = Arc::clone(&backend).new_sequence().expect("seq");
    seq.feed(&[1, 2, 3], false).expect("fits");
    match seq.feed(&[4, 5], false) {
        Err(EngineError::ContextOverflow { needed: 5, ctx: 4 }) => {}
        other => panic!("expected ContextOverflow, got {other:?}"),
    }
}

#[test]
fn unsupported_type_is_named() {
    let bytes = rebuild(
        |_, v| Some(v.clone()),
        |name, dims, ty, data| {
            let ty = if name == "blk.0.ssm_a" {
                GgmlType::I32
            } else {
                ty
            };
            Some((dims.to_vec(), ty, data.to_vec()))
        },
    );
    let message = expect_error(load(bytes));
    assert_eq!(
        message,
        "tensor blk.0.ssm_a has type I32 which strata does not support"
    );
}
