//! GGUF reader and writer on real files: the tiny fixtures, writer round trips, multi-shard models.

use std::path::{Path, PathBuf};
use strata::gguf::{GgmlType, Gguf, GgufError, GgufWriter, Value};

mod common;
use common::{fixtures, tiny_model};

/// A fresh, empty directory for one test (removed again by the test on success).
fn scratch_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("strata-gguf-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

#[test]
fn tiny_f16_metadata_and_tensors() {
    let path = tiny_model("F16");
    let gguf = Gguf::open(&path).expect("tiny-F16 parses");
    assert_eq!(gguf.version(), 3);
    assert_eq!(gguf.get_str("general.architecture"), Some("qwen4exp"));
    assert_eq!(gguf.get_u64("qwen4exp.embedding_length"), Some(256));
    assert_eq!(gguf.get_u64("qwen4exp.block_count"), Some(4));
    assert_eq!(
        gguf.get_f32("qwen4exp.attention.layer_norm_rms_epsilon"),
        Some(1e-6)
    );
    let sections: Vec<i64> = gguf
        .get_array("qwen4exp.rope.dimension_sections")
        .expect("rope sections")
        .iter()
        .filter_map(Value::as_i64)
        .collect();
    assert_eq!(sections, [3, 3, 2, 0]);
    let tokens = gguf.get_array("tokenizer.ggml.tokens").expect("vocab");
    assert_eq!(tokens.len(), 512);
    assert_eq!(tokens[0].as_str(), Some("!"));
    assert_eq!(
        gguf.get("tokenizer.ggml.add_bos_token"),
        Some(&Value::Bool(false))
    );
    assert!(
        gguf.get_str("tokenizer.chat_template")
            .is_some_and(|t| t.contains("<|im_start|>"))
    );
    assert_eq!(gguf.metadata().len(), 52);
    assert_eq!(gguf.metadata()[0].0, "general.architecture");

    assert_eq!(gguf.tensors().len(), 113);
    let embd = gguf.tensor("token_embd.weight").expect("token_embd");
    assert_eq!(embd.ty, GgmlType::F16);
    assert_eq!(embd.dims, [256, 512]);
    assert_eq!(
        (embd.row_len(), embd.n_rows(), embd.n_elements()),
        (256, 512, 131072)
    );
    assert_eq!(embd.row_bytes(), 512);
    assert_eq!(embd.n_bytes, 262144);
    assert_eq!(embd.offset % 32, 0);

    // tensor_data is exactly the bytes at the tensor's offset in the file.
    let raw = std::fs::read(&path).expect("read fixture");
    for t in gguf.tensors() {
        let data = gguf.tensor_data(t);
        assert_eq!(data.len() as u64, t.n_bytes, "{}", t.name);
        let start = t.offset as usize;
        assert_eq!(data, &raw[start..start + data.len()], "{}", t.name);
    }
    let total: u64 = gguf.tensors().iter().map(|t| t.n_bytes).sum();
    assert_eq!(gguf.total_tensor_bytes(), total);
    assert!(total < raw.len() as u64);
    assert_eq!(gguf.shard_paths(), [path]);
}

#[test]
fn tiny_iq3_s_mixed_types() {
    let gguf = Gguf::open(tiny_model("IQ3_S")).expect("tiny-IQ3_S parses");
    assert_eq!(gguf.get_str("general.architecture"), Some("qwen4exp"));
    assert_eq!(gguf.get_u64("qwen4exp.block_count"), Some(4));
    assert_eq!(gguf.get_u64("general.file_type"), Some(26));
    assert_eq!(gguf.tensors().len(), 113);
    let embd = gguf.tensor("token_embd.weight").expect("token_embd");
    assert_eq!(
        (embd.ty, embd.dims.as_slice()),
        (GgmlType::IQ3_S, &[256u64, 512][..])
    );
    assert_eq!(embd.n_bytes, 512 * 110);
    let ple = gguf
        .tensor("per_layer_token_embd.weight")
        .expect("PLE table");
    assert_eq!(
        (ple.ty, ple.dims.as_slice()),
        (GgmlType::IQ4_NL, &[32u64, 8320][..])
    );
    assert_eq!(ple.row_bytes(), 18);
    let output = gguf.tensor("output.weight").expect("output");
    assert_eq!(output.ty, GgmlType::Q6_K);
    let types: std::collections::BTreeSet<&str> =
        gguf.tensors().iter().map(|t| t.ty.name()).collect();
    assert_eq!(
        types.into_iter().collect::<Vec<_>>(),
        ["F16", "F32", "IQ3_S", "IQ4_NL", "Q5_K", "Q6_K", "Q8_0"]
    );
}

/// Metadata covering every value type, nested arrays, an empty array and non-ASCII text.
fn every_value_type() -> Vec<(String, Value)> {
    let entries = vec![
        ("t.u8", Value::U8(200)),
        ("t.i8", Value::I8(-100)),
        ("t.u16", Value::U16(65_000)),
        ("t.i16", Value::I16(-32_000)),
        ("t.u32", Value::U32(4_000_000_000)),
        ("t.i32", Value::I32(-2_000_000_000)),
        ("t.u64", Value::U64(u64::MAX)),
        ("t.i64", Value::I64(i64::MIN)),
        ("t.f32", Value::F32(-1.5e-7)),
        ("t.f64", Value::F64(std::f64::consts::PI)),
        ("t.bool", Value::Bool(true)),
        (
            "t.string",
            Value::String("héllo ✓ <|im_end|>\n".to_string()),
        ),
        ("t.empty_string", Value::String(String::new())),
        ("t.empty_array", Value::Array(vec![])),
        (
            "t.strings",
            Value::Array(vec![Value::String("a".into()), Value::String("bc".into())]),
        ),
        (
            "t.nested",
            Value::Array(vec![
                Value::Array(vec![Value::I64(1), Value::I64(-2)]),
                Value::Array(vec![Value::I64(3)]),
            ]),
        ),
        (
            "t.deep",
            Value::Array(vec![Value::Array(vec![Value::Array(vec![Value::F64(
                0.5,
            )])])]),
        ),
        (
            "t.bools",
            Value::Array(vec![Value::Bool(false), Value::Bool(true)]),
        ),
    ];
    entries
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
}

#[test]
fn value_accessors_convert_what_fits() {
    assert_eq!(Value::U8(7).as_u64(), Some(7));
    assert_eq!(Value::I32(7).as_u64(), Some(7));
    assert_eq!(Value::I32(-7).as_u64(), None);
    assert_eq!(Value::I32(-7).as_i64(), Some(-7));
    assert_eq!(Value::U64(u64::MAX).as_i64(), None);
    assert_eq!(Value::F64(0.25).as_f32(), Some(0.25));
    assert_eq!(Value::F32(0.25).as_u64(), None);
    assert_eq!(Value::String("x".into()).as_str(), Some("x"));
    assert_eq!(Value::Bool(true).as_bool(), Some(true));
    assert_eq!(Value::U8(1).as_bool(), None);
    assert_eq!(Value::Array(vec![]).as_array(), Some(&[][..]));
    assert_eq!(Value::I16(1).type_name(), "i16");
}

#[test]
fn writer_round_trips_every_value_type_and_tensor_data() {
    let mut writer = GgufWriter::new();
    for (key, value) in every_value_type() {
        writer.add_metadata(key, value);
    }
    let f32_data: Vec<u8> = (0..24u32).flat_map(|i| (i as f32).to_le_bytes()).collect();
    writer
        .add_tensor("a.f32", &[4, 6], GgmlType::F32, f32_data.clone())
        .expect("add f32");
    let q4k_data: Vec<u8> = (0..2 * 144).map(|i| (i * 7 % 251) as u8).collect();
    writer
        .add_tensor("b.q4k", &[256, 2], GgmlType::Q4_K, q4k_data.as_slice())
        .expect("add q4_k");
    let iq3_data: Vec<u8> = (0..110).map(|i| i as u8).collect();
    writer
        .add_tensor("c.iq3s", &[256], GgmlType::IQ3_S, iq3_data.clone())
        .expect("add iq3_s");
    assert_eq!(
        writer
            .declare_tensor("d.zeros", &[32, 3], GgmlType::Q8_0)
            .expect("declare"),
        3 * 34
    );

    let gguf = Gguf::from_vec("round-trip", writer.to_bytes()).expect("written file parses");
    assert_eq!(gguf.version(), 3);
    assert_eq!(gguf.metadata(), every_value_type().as_slice());
    assert_eq!(gguf.get_u64("t.u64"), Some(u64::MAX));
    let names: Vec<&str> = gguf.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["a.f32", "b.q4k", "c.iq3s", "d.zeros"]);
    let data = |name: &str| gguf.tensor_data(gguf.tensor(name).expect(name)).to_vec();
    assert_eq!(data("a.f32"), f32_data);
    assert_eq!(data("b.q4k"), q4k_data);
    assert_eq!(data("c.iq3s"), iq3_data);
    assert_eq!(data("d.zeros"), vec![0u8; 102]);
    for t in gguf.tensors() {
        assert_eq!(t.offset % 32, 0, "{} is aligned", t.name);
    }

    // The same file written to disk (streaming the declared tensor) opens identically.
    let dir = scratch_dir("round-trip");
    let path = dir.join("model.gguf");
    writer
        .write_streaming(&path, |tensor, out| {
            assert_eq!(tensor.name, "d.zeros");
            out.write_all(&vec![0xAB; tensor.n_bytes as usize])
        })
        .expect("streamed write");
    let opened = Gguf::open(&path).expect("opens from disk");
    assert_eq!(opened.metadata(), gguf.metadata());
    let streamed = opened.tensor("d.zeros").expect("declared tensor");
    assert_eq!(opened.tensor_data(streamed), vec![0xAB; 102].as_slice());
    let f32_tensor = opened.tensor("a.f32").expect("a.f32");
    assert_eq!(opened.tensor_data(f32_tensor), f32_data.as_slice());

    // A fill callback that writes the wrong amount is an error, not a corrupt file.
    let short = writer.write_streaming(dir.join("short.gguf"), |_, out| out.write_all(&[1, 2, 3]));
    let message = short.expect_err("short fill must fail").to_string();
    assert!(
        message.contains("d.zeros") && message.contains("wrote 3 bytes"),
        "{message}"
    );
    std::fs::remove_dir_all(&dir).expect("clean up");
}

#[test]
fn writer_rejects_bad_tensors() {
    let mut writer = GgufWriter::new();
    let wrong_size = writer.add_tensor("x", &[4], GgmlType::F32, vec![0u8; 15]);
    assert!(
        wrong_size
            .expect_err("size mismatch")
            .to_string()
            .contains("15 bytes")
    );
    let partial_block = writer.add_tensor("y", &[100], GgmlType::Q4_K, vec![0u8; 144]);
    assert!(partial_block.is_err());
    writer
        .add_tensor("z", &[1], GgmlType::F32, vec![0u8; 4])
        .expect("ok");
    let duplicate = writer.add_tensor("z", &[1], GgmlType::F32, vec![0u8; 4]);
    assert!(
        duplicate
            .expect_err("duplicate")
            .to_string()
            .contains("twice")
    );
    assert!(writer.declare_tensor("w", &[0, 4], GgmlType::F32).is_err());
}

#[test]
fn writer_honours_custom_alignment() {
    let mut writer = GgufWriter::new();
    writer.add_metadata("general.alignment", Value::U32(256));
    writer
        .add_tensor("a", &[3], GgmlType::F32, vec![1u8; 12])
        .expect("a");
    writer
        .add_tensor("b", &[5], GgmlType::F32, vec![2u8; 20])
        .expect("b");
    let gguf = Gguf::from_vec("aligned", writer.to_bytes()).expect("parses");
    assert_eq!(gguf.alignment(), 256);
    for t in gguf.tensors() {
        assert_eq!(t.offset % 256, 0, "{}", t.name);
    }
    let b = gguf.tensor("b").expect("b");
    assert_eq!(gguf.tensor_data(b), [2u8; 20].as_slice());
}

#[test]
fn fixture_survives_a_rewrite_through_the_writer() {
    let original = Gguf::open(tiny_model("IQ3_S")).expect("fixture");
    let mut writer = GgufWriter::new();
    for (key, value) in original.metadata() {
        writer.add_metadata(key.clone(), value.clone());
    }
    for t in original.tensors() {
        writer
            .add_tensor(t.name.clone(), &t.dims, t.ty, original.tensor_data(t))
            .expect("copy tensor");
    }
    let copy = Gguf::from_vec("copy", writer.to_bytes()).expect("copy parses");
    assert_eq!(copy.metadata(), original.metadata());
    assert_eq!(copy.tensors().len(), original.tensors().len());
    for (a, b) in original.tensors().iter().zip(copy.tensors()) {
        assert_eq!((&a.name, &a.dims, a.ty), (&b.name, &b.dims, b.ty));
        assert_eq!(original.tensor_data(a), copy.tensor_data(b), "{}", a.name);
    }
}

/// Split `original` into `count` shard files `tiny-0000K-of-0000N.gguf` in `dir`, tensors dealt
/// round-robin so every shard holds some; returns the shard paths.
fn write_shards(original: &Gguf, dir: &Path, count: usize) -> Vec<PathBuf> {
    let mut paths = Vec::new();
    for shard in 0..count {
        let mut writer = GgufWriter::new();
        if shard == 0 {
            for (key, value) in original.metadata() {
                writer.add_metadata(key.clone(), value.clone());
            }
        }
        writer.add_metadata("split.no", Value::U16(shard as u16));
        writer.add_metadata("split.count", Value::U16(count as u16));
        writer.add_metadata(
            "split.tensors.count",
            Value::I32(original.tensors().len() as i32),
        );
        for t in original.tensors().iter().skip(shard).step_by(count) {
            writer
                .add_tensor(t.name.clone(), &t.dims, t.ty, original.tensor_data(t))
                .expect("copy tensor");
        }
        let path = dir.join(format!("tiny-{:05}-of-{count:05}.gguf", shard + 1));
        writer.write_to(&path).expect("write shard");
        paths.push(path);
    }
    paths
}

#[test]
fn multi_shard_model_reads_like_the_single_file() {
    let original = Gguf::open(tiny_model("IQ3_S")).expect("fixture");
    let dir = scratch_dir("shards");
    let paths = write_shards(&original, &dir, 3);

    let split = Gguf::open(&paths[0]).expect("split model opens from its first shard");
    assert_eq!(split.shard_paths(), paths);
    assert_eq!(split.get_str("general.architecture"), Some("qwen4exp"));
    assert_eq!(split.get_u64("split.count"), Some(3));
    assert_eq!(split.tensors().len(), original.tensors().len());
    let mut seen_shards = [0usize; 3];
    for t in original.tensors() {
        let s = split.tensor(&t.name).expect("tensor present in some shard");
        seen_shards[s.shard] += 1;
        assert_eq!((&s.dims, s.ty), (&t.dims, t.ty));
        assert_eq!(split.tensor_data(s), original.tensor_data(t), "{}", t.name);
    }
    assert!(seen_shards.iter().all(|&n| n > 30), "{seen_shards:?}");
    assert_eq!(split.total_tensor_bytes(), original.total_tensor_bytes());

    // Opening a later shard points at the first one.
    let later = Gguf::open(&paths[1])
        .expect_err("second shard alone")
        .to_string();
    assert!(
        later.contains("shard 2 of 3") && later.contains("tiny-00001-of-00003.gguf"),
        "{later}"
    );

    // A missing shard is named.
    std::fs::remove_file(&paths[2]).expect("remove shard 3");
    let missing = Gguf::open(&paths[0]).expect_err("missing shard");
    assert!(
        matches!(missing, GgufError::MissingShard { .. }),
        "{missing:?}"
    );
    let message = missing.to_string();
    assert!(message.contains("tiny-00003-of-00003.gguf"), "{message}");
    assert!(
        message.starts_with(&paths[0].display().to_string()),
        "{message}"
    );
    std::fs::remove_dir_all(&dir).expect("clean up");
}

#[test]
fn multi_shard_consistency_is_checked() {
    let original = Gguf::open(tiny_model("IQ3_S")).expect("fixture");
    let dir = scratch_dir("shard-checks");
    let paths = write_shards(&original, &dir, 2);

    // A shard holding a tensor that another shard also holds.
    let mut writer = GgufWriter::new();
    writer.add_metadata("split.no", Value::U16(1));
    writer.add_metadata("split.count", Value::U16(2));
    let first = &original.tensors()[0];
    writer
        .add_tensor(
            first.name.clone(),
            &first.dims,
            first.ty,
            original.tensor_data(first),
        )
        .expect("dup tensor");
    writer.write_to(&paths[1]).expect("rewrite shard 2");
    let duplicate = Gguf::open(&paths[0])
        .expect_err("duplicate tensor")
        .to_string();
    assert!(duplicate.contains("duplicate tensor name"), "{duplicate}");
    assert!(
        duplicate.contains("tiny-00002-of-00002.gguf"),
        "{duplicate}"
    );

    // A shard whose split.no is wrong.
    let mut writer = GgufWriter::new();
    writer.add_metadata("split.no", Value::U16(0));
    writer.add_metadata("split.count", Value::U16(2));
    writer.write_to(&paths[1]).expect("rewrite shard 2");
    let wrong_no = Gguf::open(&paths[0])
        .expect_err("wrong split.no")
        .to_string();
    assert!(wrong_no.contains("expected shard 2 of 2"), "{wrong_no}");

    // Shards that hold fewer tensors than split.tensors.count says.
    let mut writer = GgufWriter::new();
    writer.add_metadata("split.no", Value::U16(1));
    writer.add_metadata("split.count", Value::U16(2));
    writer.write_to(&paths[1]).expect("rewrite shard 2");
    let short = Gguf::open(&paths[0])
        .expect_err("tensor count mismatch")
        .to_string();
    assert!(short.contains("split.tensors.count"), "{short}");

    // split.count > 1 but a file name that does not say where the other shards are.
    let renamed = dir.join("renamed.gguf");
    std::fs::rename(&paths[0], &renamed).expect("rename");
    let unnamed = Gguf::open(&renamed)
        .expect_err("unsplittable name")
        .to_string();
    assert!(unnamed.contains("file name"), "{unnamed}");

    // An in-memory shard of a split model is refused rather than read half.
    let bytes = std::fs::read(&renamed).expect("read shard");
    let in_memory = Gguf::from_vec("shard.gguf", bytes)
        .expect_err("in-memory shard")
        .to_string();
    assert!(in_memory.starts_with("shard.gguf: "), "{in_memory}");
    std::fs::remove_dir_all(&dir).expect("clean up");
}

#[test]
fn open_reports_io_errors_with_the_path() {
    let missing = fixtures().join("no-such-model.gguf");
    let message = Gguf::open(&missing).expect_err("missing file").to_string();
    assert!(
        message.starts_with(&missing.display().to_string()),
        "{message}"
    );
}

#[test]
fn from_static_parses_embedded_bytes() {
    let mut writer = GgufWriter::new();
    writer.add_metadata("general.architecture", Value::String("demo".into()));
    writer
        .add_tensor("t", &[2], GgmlType::F16, vec![0u8, 60, 0, 188])
        .expect("t");
    let leaked: &'static [u8] = Box::leak(writer.to_bytes().into_boxed_slice());
    let gguf = Gguf::from_static("demo", leaked).expect("static parses");
    assert_eq!(gguf.get_str("general.architecture"), Some("demo"));
    let t = gguf.tensor("t").expect("t");
    assert_eq!(gguf.tensor_data(t), [0u8, 60, 0, 188].as_slice());
    assert_eq!(gguf.shard_paths(), [PathBuf::new()]);
}

#[test]
fn gguf_is_send_and_sync() {
    fn shareable<T: Send + Sync + 'static>() {}
    // A loaded model is shared between server threads behind an Arc.
    shareable::<Gguf>();
    shareable::<GgufError>();
}
