//! Config and weight-binding variants that real GGUF files use (model-spec §3): each variant of the
//! F16 fixture must read to the same model and give bit-identical logits.

use std::path::Path;
use std::sync::Arc;

use strata::engine::Backend;
use strata::gguf::{GgmlType, Gguf, GgufWriter, Value};
use strata::model::{Config, CpuBackend, LayerKind};

type TensorEdit<'a> =
    &'a dyn Fn(&str, &[u64], GgmlType, &[u8]) -> Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>;

fn fixture() -> Gguf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny/tiny-F16.gguf");
    Gguf::open(&path).unwrap_or_else(|e| panic!("opening {}: {e}", path.display()))
}

/// Rebuilds the fixture: `meta` maps each key/value to its replacement (None drops it), `tensor`
/// maps each tensor to the tensors written in its place.
fn rebuild(meta: &dyn Fn(&str, &Value) -> Option<Value>, tensor: TensorEdit) -> Gguf {
    let original = fixture();
    let mut writer = GgufWriter::new();
    for (key, value) in original.metadata() {
        if let Some(v) = meta(key, value) {
            writer.add_metadata(key.clone(), v);
        }
    }
    for info in original.tensors() {
        for (name, dims, ty, data) in
            tensor(&info.name, &info.dims, info.ty, original.tensor_data(info))
        {
            writer
                .add_tensor(name, &dims, ty, data)
                .expect("tensor fits");
        }
    }
    Gguf::from_vec("variant", writer.to_bytes()).expect("variant parses")
}

fn same_meta(_: &str, v: &Value) -> Option<Value> {
    Some(v.clone())
}

fn same_tensor(
    name: &str,
    dims: &[u64],
    ty: GgmlType,
    data: &[u8],
) -> Vec<(String, Vec<u64>, GgmlType, Vec<u8>)> {
    vec![(name.to_string(), dims.to_vec(), ty, data.to_vec())]
}

/// All-position logits of a 40-token input with an EOS inside (QSA sparse from position 35).
fn logits(gguf: Gguf) -> Vec<f32> {
    let backend = Arc::new(CpuBackend::load(Arc::new(gguf), 0).expect("variant loads"));
    let ids: Vec<u32> = (0..40)
        .map(|i| if i == 17 { 509 } else { (i * 53 + 7) % 509 })
        .collect();
    backend
        .new_sequence()
        .expect("sequence")
        .feed(&ids, true)
        .expect("feed")
}

fn assert_same_bits(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    assert!(
        a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
        "{what}: logits differ"
    );
}

#[test]
fn fixture_config_reads_as_documented() {
    let cfg = Config::from_gguf(&fixture()).expect("config");
    assert_eq!(
        (
            cfg.n_embd,
            cfg.n_layer,
            cfg.vocab_size,
            cfg.hc_count,
            cfg.hc_low_rank
        ),
        (256, 4, 512, 4, 32)
    );
    assert_eq!(cfg.layers[..3], [LayerKind::Gdn; 3]);
    assert_eq!(
        cfg.layers[3],
        LayerKind::Qsa {
            compress_ratio: Some(4)
        }
    );
    assert!(!cfg.assumed_qsa_ratio);
    assert_eq!(
        (
            cfg.attention.head_dim,
            cfg.attention.rotary_dims,
            cfg.attention.indexer_budget_tokens
        ),
        (64, 16, 32)
    );
    assert_eq!(
        (
            cfg.gdn.n_k_heads,
            cfg.gdn.n_v_heads,
            cfg.gdn.head_k_dim,
            cfg.gdn.head_v_dim
        ),
        (2, 4, 64, 64)
    );
    assert_eq!(
        (
            cfg.moe.n_expert,
            cfg.moe.n_expert_used,
            cfg.moe.expert_ff,
            cfg.moe.shared_ff
        ),
        (8, 4, 96, 96)
    );
    let ple = cfg.ple.as_ref().expect("PLE");
    assert_eq!(
        (
            ple.layer,
            ple.n_heads(),
            ple.head_dim,
            ple.conv_history(),
            ple.eos_token_id
        ),
        (1, 8, 32, 9, 509)
    );
    let text = cfg.to_string();
    assert!(
        text.contains("GGGQ") && text.contains("PLE          layer 1"),
        "{text}"
    );
}

#[test]
fn layer_kinds_fall_back_to_the_attention_interval() {
    let base = logits(fixture());
    let gguf = rebuild(
        &|k, v| (k != "qwen4exp.attention.recurrent_layers").then(|| v.clone()),
        &same_tensor,
    );
    let cfg = Config::from_gguf(&gguf).expect("config");
    assert_eq!(
        cfg.layers[3],
        LayerKind::Qsa {
            compress_ratio: Some(4)
        }
    );
    assert_same_bits(&base, &logits(gguf), "without recurrent_layers");
}

#[test]
fn ple_arrays_may_be_signed_and_hc_norms_two_dimensional() {
    let base = logits(fixture());
    let gguf = rebuild(
        &|k, v| match (k.starts_with("qwen4exp.ple."), v) {
            (true, Value::Array(items)) => Some(Value::Array(
                items
                    .iter()
                    .map(|x| Value::I64(x.as_i64().expect("integer")))
                    .collect(),
            )),
            _ => Some(v.clone()),
        },
        &|name, dims, ty, data| {
            // Newer converters store the 4H hc gammas as [H, 4]: the same stream-major bytes.
            let dims = if name.contains("hc_") && name.ends_with("norm.weight") {
                vec![dims[0] / 4, 4]
            } else {
                dims.to_vec()
            };
            vec![(name.to_string(), dims, ty, data.to_vec())]
        },
    );
    assert_same_bits(&base, &logits(gguf), "i64 PLE arrays and [H, 4] hc norms");
}

#[test]
fn fused_gate_up_experts_are_accepted() {
    let base = logits(fixture());
    let original = fixture();
    let gguf = rebuild(&same_meta, &|name, dims, ty, data| {
        if name.ends_with("ffn_up_exps.weight") {
            return Vec::new();
        }
        let Some(layer) = name.strip_suffix("ffn_gate_exps.weight") else {
            return same_tensor(name, dims, ty, data);
        };
        // Per expert: its gate rows, then its up rows.
        let up_info = original
            .tensor(&format!("{layer}ffn_up_exps.weight"))
            .expect("up experts");
        let up = original.tensor_data(up_info);
        let per_expert = data.len() / dims[2] as usize;
        let mut fused = Vec::with_capacity(2 * data.len());
        for (gate_rows, up_rows) in data.chunks(per_expert).zip(up.chunks(per_expert)) {
            fused.extend_from_slice(gate_rows);
            fused.extend_from_slice(up_rows);
        }
        vec![(
            format!("{layer}ffn_gate_up_exps.weight"),
            vec![dims[0], 2 * dims[1], dims[2]],
            ty,
            fused,
        )]
    });
    assert_same_bits(&base, &logits(gguf), "fused ffn_gate_up_exps");
}

#[test]
fn wrong_architecture_is_refused() {
    let gguf = rebuild(
        &|k, v| {
            Some(if k == "general.architecture" {
                Value::String("llama".into())
            } else {
                v.clone()
            })
        },
        &same_tensor,
    );
    let message = Config::from_gguf(&gguf)
        .expect_err("llama is not qwen4exp")
        .to_string();
    assert!(
        message.contains("general.architecture") && message.contains("llama"),
        "{message}"
    );
}

/// `--kv`: what each cache type keeps of a row, and the widths q8_0 refuses with a message.
#[test]
fn kv_cache_types_round_rows_and_refuse_widths_they_cannot_hold() {
    use strata::model::config::KvType;
    let row: Vec<f32> = (0..64).map(|i| (i as f32 - 31.5) * 0.0173).collect();
    let mut kept = row.clone();
    KvType::F32.store_row(&mut kept);
    assert_eq!(kept, row);
    KvType::F16.store_row(&mut kept);
    for (k, v) in kept.iter().zip(&row) {
        assert_eq!(*k, half::f16::from_f32(*v).to_f32());
    }
    let mut q = row.clone();
    KvType::Q8_0.store_row(&mut q);
    for (block, orig) in q.chunks(32).zip(row.chunks(32)) {
        let amax = orig.iter().fold(0f32, |m, v| m.max(v.abs()));
        let scale = half::f16::from_f32(amax / 127.0).to_f32();
        for (k, v) in block.iter().zip(orig) {
            let code = k / scale;
            assert_eq!(
                code,
                code.round(),
                "{k} is not a whole multiple of the scale"
            );
            assert!(code.abs() <= 127.0);
            assert!(
                (k - v).abs() <= 0.5 * scale + amax * 1e-3,
                "{k} against {v}"
            );
        }
    }
    assert_eq!(KvType::F32.cache_bytes(64), 256);
    assert_eq!(KvType::F16.cache_bytes(64), 128);
    assert_eq!(KvType::Q8_0.cache_bytes(64), 72);
    assert!(KvType::Q8_0.unsupported_width(64).is_none());
    let why = KvType::Q8_0
        .unsupported_width(48)
        .expect("48 is not whole blocks");
    assert!(why.contains("48") && why.contains("--kv f16"), "{why}");
    assert!(KvType::F16.unsupported_width(48).is_none());
}
