//! Malformed GGUF input must give a `GgufError` naming the file — never a panic, never a huge
//! allocation. Truncations, random corruption and hand-crafted bad headers.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use strata::gguf::{GgmlType, Gguf, GgufWriter, Value};

mod common;
use common::tiny_model;

const NAME: &str = "bad.gguf";

/// Parse `bytes`, proving it does not panic; on success touch every tensor's data.
/// Returns the error message, or `None` when the bytes parsed.
fn parse_without_panic(bytes: Vec<u8>) -> Option<String> {
    let outcome = catch_unwind(AssertUnwindSafe(|| match Gguf::from_vec(NAME, bytes) {
        Ok(gguf) => {
            for t in gguf.tensors() {
                let data = gguf.tensor_data(t);
                assert_eq!(data.len() as u64, t.n_bytes, "{}", t.name);
                // Reading the bytes proves the slice is really backed by the buffer.
                std::hint::black_box(data.iter().fold(0u8, |a, &b| a ^ b));
            }
            None
        }
        Err(e) => Some(e.to_string()),
    }));
    match outcome {
        Ok(result) => result,
        Err(_) => panic!("Gguf::from_vec panicked"),
    }
}

/// `bytes` must be rejected with a one-line message that starts with the file name.
fn expect_error(bytes: Vec<u8>) -> String {
    let message = parse_without_panic(bytes).expect("malformed input must be an error");
    assert!(message.starts_with(&format!("{NAME}: ")), "{message}");
    assert!(!message.contains('\n'), "{message}");
    message
}

/// A small valid file with several value types, a nested array and three tensors; it ends
/// exactly at the end of the last tensor's data, so every shorter prefix is invalid.
fn small_valid_file() -> Vec<u8> {
    let mut writer = GgufWriter::new();
    writer.add_metadata("general.architecture", Value::String("qwen4exp".into()));
    writer.add_metadata("qwen4exp.block_count", Value::U32(4));
    writer.add_metadata("qwen4exp.rope.freq_base", Value::F32(1e7));
    writer.add_metadata(
        "tokenizer.ggml.tokens",
        Value::Array(
            ["a", "b", "<|im_end|>"]
                .map(|s| Value::String(s.into()))
                .to_vec(),
        ),
    );
    writer.add_metadata(
        "nested",
        Value::Array(vec![Value::Array(vec![Value::U64(1), Value::U64(2)])]),
    );
    writer.add_metadata("flag", Value::Bool(true));
    writer
        .add_tensor("a", &[8, 2], GgmlType::F32, vec![1u8; 64])
        .expect("a");
    writer
        .add_tensor("b", &[32], GgmlType::Q8_0, vec![2u8; 34])
        .expect("b");
    writer
        .add_tensor("c", &[256], GgmlType::Q4_K, vec![3u8; 144])
        .expect("c");
    writer.to_bytes()
}

#[test]
fn small_valid_file_parses() {
    assert_eq!(parse_without_panic(small_valid_file()), None);
}

#[test]
fn every_truncation_of_a_small_file_is_an_error() {
    let bytes = small_valid_file();
    for len in 0..bytes.len() {
        let message = expect_error(bytes[..len].to_vec());
        assert!(
            message.contains("truncated")
                || message.contains("past the end")
                || message.contains("not a GGUF file"),
            "length {len}: {message}"
        );
    }
}

#[test]
fn truncations_of_a_real_fixture_are_errors() {
    let bytes = std::fs::read(tiny_model("IQ3_S")).expect("fixture");
    let header_end = Gguf::open(tiny_model("IQ3_S"))
        .expect("fixture parses")
        .tensors()
        .iter()
        .map(|t| t.offset)
        .min()
        .expect("has tensors") as usize;
    // Every length through the header and the start of the data, then a sample of the rest.
    let dense = 0..header_end + 64;
    let sparse = (header_end + 64..bytes.len()).step_by(7919);
    let mut checked = 0;
    for len in dense.chain(sparse) {
        expect_error(bytes[..len].to_vec());
        checked += 1;
    }
    assert!(checked > header_end, "{checked}");
}

/// xorshift64*: a small seeded generator so every run corrupts the same bytes.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Corrupt 1–4 bytes of `original[..region]` per case; returns how many cases were rejected.
fn corrupt_cases(original: &[u8], region: usize, cases: usize, seed: u64) -> usize {
    let mut rng = Rng(seed);
    let mut rejected = 0;
    for _ in 0..cases {
        let mut bytes = original.to_vec();
        for _ in 0..1 + rng.below(4) {
            let at = rng.below(region);
            // Mix plain random bytes with the values most likely to hit edge cases.
            bytes[at] = match rng.below(4) {
                0 => 0xFF,
                1 => 0x00,
                _ => rng.next() as u8,
            };
        }
        if let Some(message) = parse_without_panic(bytes) {
            assert!(message.starts_with(&format!("{NAME}: ")), "{message}");
            rejected += 1;
        }
    }
    rejected
}

#[test]
fn random_corruption_of_a_small_file_never_panics() {
    let bytes = small_valid_file();
    // Corrupt only the header (up to the first tensor's data), where all the parsing happens.
    let gguf = Gguf::from_vec(NAME, bytes.clone()).expect("valid");
    let data_start = gguf
        .tensors()
        .iter()
        .map(|t| t.offset)
        .min()
        .expect("tensors") as usize;
    let rejected = corrupt_cases(&bytes, data_start, 4000, 0x5EED_0001);
    // Most header bytes are lengths, counts, type ids and offsets: corruption is mostly caught.
    assert!(
        rejected > 1000,
        "only {rejected} of 4000 corruptions were rejected"
    );
}

#[test]
fn random_corruption_of_a_fixture_header_never_panics() {
    let bytes = std::fs::read(tiny_model("IQ3_S")).expect("fixture");
    let header_end = 25_000.min(bytes.len());
    let rejected = corrupt_cases(&bytes, header_end, 600, 0x5EED_0002);
    assert!(rejected > 0);
}

// ---------------------------------------------------------------------------------------------
// Hand-crafted headers

/// Raw GGUF bytes built field by field, so each test can put exactly one thing wrong.
struct Raw(Vec<u8>);

impl Raw {
    fn new(version: u32, tensor_count: u64, kv_count: u64) -> Raw {
        let mut raw = Raw(b"GGUF".to_vec());
        raw.u32(version).u64(tensor_count).u64(kv_count);
        raw
    }
    fn u32(&mut self, v: u32) -> &mut Raw {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Raw {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn str(&mut self, s: &str) -> &mut Raw {
        self.u64(s.len() as u64);
        self.0.extend_from_slice(s.as_bytes());
        self
    }
    /// Key/value with a u32 value.
    fn kv_u32(&mut self, key: &str, v: u32) -> &mut Raw {
        self.str(key).u32(4).u32(v)
    }
    fn tensor(&mut self, name: &str, dims: &[u64], type_id: u32, offset: u64) -> &mut Raw {
        self.str(name).u32(dims.len() as u32);
        for &d in dims {
            self.u64(d);
        }
        self.u32(type_id).u64(offset)
    }
    /// Pad to `alignment` and append `data_len` bytes of tensor data.
    fn data(&mut self, alignment: usize, data_len: usize) -> Vec<u8> {
        let mut bytes = self.0.clone();
        bytes.resize(bytes.len().next_multiple_of(alignment), 0);
        bytes.resize(bytes.len() + data_len, 0x11);
        bytes
    }
}

const F32: u32 = 0;

#[test]
fn raw_builder_makes_valid_files() {
    // The baseline the crafted cases below each change in one place.
    let bytes = Raw::new(3, 2, 1)
        .kv_u32("k", 1)
        .tensor("a", &[4], F32, 0)
        .tensor("b", &[4], F32, 32)
        .data(32, 48);
    assert_eq!(parse_without_panic(bytes), None);
    let v2 = Raw::new(2, 1, 0).tensor("a", &[8], F32, 0).data(32, 32);
    assert_eq!(parse_without_panic(v2), None);
}

#[test]
fn bad_magic_and_versions() {
    let message = expect_error(b"GGML\x03\0\0\0".to_vec());
    assert!(message.contains("not a GGUF file"), "{message}");
    let message = expect_error(Raw::new(1, 0, 0).data(1, 0));
    assert!(message.contains("unsupported GGUF version 1"), "{message}");
    let message = expect_error(Raw::new(4, 0, 0).data(1, 0));
    assert!(message.contains("unsupported GGUF version 4"), "{message}");
    let message = expect_error(Raw::new(3u32.swap_bytes(), 0, 0).data(1, 0));
    assert!(message.contains("big-endian"), "{message}");
    assert!(expect_error(Vec::new()).contains("not a GGUF file"));
}

#[test]
fn absurd_counts_and_lengths_are_rejected_before_allocating() {
    let message = expect_error(Raw::new(3, u64::MAX, 0).data(1, 0));
    assert!(
        message.contains("claims") && message.contains("tensors"),
        "{message}"
    );
    let message = expect_error(Raw::new(3, 0, 1 << 62).data(1, 0));
    assert!(message.contains("metadata entries"), "{message}");
    // A key whose length is absurd, and one that merely runs past the end of the file.
    let message = expect_error(Raw::new(3, 0, 1).u64(u64::MAX).data(1, 64));
    assert!(
        message.contains("exceeds the limit") && message.contains("key"),
        "{message}"
    );
    let message = expect_error(Raw::new(3, 0, 1).u64(1000).data(1, 64));
    assert!(
        message.contains("truncated") && message.contains("key"),
        "{message}"
    );
    // A string value with a huge length.
    let message = expect_error(Raw::new(3, 0, 1).str("s").u32(8).u64(1 << 40).data(1, 0));
    assert!(message.contains("exceeds the limit"), "{message}");
    // Arrays claiming far more elements than allowed, or than the file holds, flat and nested.
    let message = expect_error(
        Raw::new(3, 0, 1)
            .str("arr")
            .u32(9)
            .u32(0)
            .u64(1 << 60)
            .data(1, 0),
    );
    assert!(message.contains("exceeds the limit"), "{message}");
    let message = expect_error(
        Raw::new(3, 0, 1)
            .str("arr")
            .u32(9)
            .u32(4)
            .u64(1 << 20)
            .data(1, 100),
    );
    assert!(
        message.contains("array claims 1048576 elements"),
        "{message}"
    );
    let message = expect_error(
        Raw::new(3, 0, 1)
            .str("arr")
            .u32(9)
            .u32(9)
            .u64(1)
            .u32(8)
            .u64(1 << 23)
            .data(1, 0),
    );
    assert!(message.contains("array claims"), "{message}");
    // A tensor name with a huge length.
    let message = expect_error(Raw::new(3, 1, 0).u64(u64::MAX - 3).data(1, 64));
    assert!(message.contains("name of tensor 0"), "{message}");
}

#[test]
fn deeply_nested_arrays_are_rejected() {
    let mut raw = Raw::new(3, 0, 1);
    raw.str("deep").u32(9);
    for _ in 0..200 {
        raw.u32(9).u64(1);
    }
    let message = expect_error(raw.data(1, 0));
    assert!(message.contains("nested"), "{message}");
}

#[test]
fn bad_metadata_values() {
    let message = expect_error(Raw::new(3, 0, 1).str("k").u32(13).u32(0).data(1, 0));
    assert!(
        message.contains("unknown metadata value type 13"),
        "{message}"
    );
    let mut raw = Raw::new(3, 0, 1);
    raw.str("flag").u32(7);
    raw.0.push(2);
    let message = expect_error(raw.data(1, 0));
    assert!(message.contains("bool"), "{message}");
    let mut raw = Raw::new(3, 0, 1);
    raw.u64(2);
    raw.0.extend_from_slice(&[0xC3, 0x28]);
    raw.u32(4).u32(0);
    let message = expect_error(raw.data(1, 0));
    assert!(message.contains("UTF-8"), "{message}");
    let message = expect_error(Raw::new(3, 0, 2).kv_u32("k", 1).kv_u32("k", 2).data(1, 0));
    assert!(message.contains("duplicate metadata key"), "{message}");
}

#[test]
fn bad_alignment_values() {
    for alignment in [0u32, 3, 48] {
        let message = expect_error(
            Raw::new(3, 1, 1)
                .kv_u32("general.alignment", alignment)
                .tensor("a", &[4], F32, 0)
                .data(64, 16),
        );
        assert!(message.contains("power of two"), "{alignment}: {message}");
    }
    // Found by the fuzzer: a huge alignment in a file without tensors used to parse, and writing
    // the file back padded its header to 4 TiB.
    let message = expect_error(
        Raw::new(3, 0, 1)
            .str("general.alignment")
            .u32(11)
            .u64(1 << 42)
            .data(1, 0),
    );
    assert!(message.contains("power of two from 1 to"), "{message}");
    let message = expect_error(
        Raw::new(3, 0, 1)
            .str("general.alignment")
            .u32(8)
            .str("32")
            .data(1, 0),
    );
    assert!(message.contains("general.alignment"), "{message}");
    // A valid non-default alignment is honoured.
    let ok = Raw::new(3, 1, 1)
        .kv_u32("general.alignment", 64)
        .tensor("a", &[4], F32, 0)
        .data(64, 16);
    assert_eq!(parse_without_panic(ok), None);
}

#[test]
fn bad_tensor_placement() {
    let message = expect_error(
        Raw::new(3, 1, 0)
            .tensor("a", &[4], F32, 1 << 40)
            .data(32, 16),
    );
    assert!(
        message.contains("\"a\"") && message.contains("past the end"),
        "{message}"
    );
    let message = expect_error(
        Raw::new(3, 1, 0)
            .tensor("a", &[4], F32, u64::MAX - 31)
            .data(32, 16),
    );
    assert!(message.contains("past the end"), "{message}");
    let message = expect_error(Raw::new(3, 1, 0).tensor("a", &[8], F32, 0).data(32, 31));
    assert!(message.contains("past the end"), "{message}");
    let message = expect_error(Raw::new(3, 1, 0).tensor("a", &[4], F32, 4).data(32, 64));
    assert!(
        message.contains("not a multiple of the alignment"),
        "{message}"
    );
    let message = expect_error(
        Raw::new(3, 2, 0)
            .tensor("a", &[16], F32, 0)
            .tensor("b", &[4], F32, 32)
            .data(32, 64),
    );
    assert!(message.contains("overlap"), "{message}");
    let message = expect_error(
        Raw::new(3, 2, 0)
            .tensor("a", &[4], F32, 0)
            .tensor("a", &[4], F32, 32)
            .data(32, 64),
    );
    assert!(message.contains("duplicate tensor name"), "{message}");
    // Header ends, but the padded data section start lies past the end of the file.
    let mut raw = Raw::new(3, 1, 0);
    raw.tensor("a", &[1], 24, 0); // I8, one byte
    let unpadded = raw.0.clone();
    assert!(!unpadded.len().is_multiple_of(32));
    let message = expect_error(unpadded);
    assert!(message.contains("truncated"), "{message}");
}

#[test]
fn bad_tensor_shapes_and_types() {
    for id in [4u32, 31, 36, 43, 1000, u32::MAX] {
        let message = expect_error(Raw::new(3, 1, 0).tensor("w", &[32], id, 0).data(32, 1024));
        assert!(
            message.contains(&format!("unknown ggml type id {id}")),
            "{message}"
        );
    }
    let message = expect_error(Raw::new(3, 1, 0).tensor("w", &[4, 0], F32, 0).data(32, 64));
    assert!(message.contains("invalid dimension 0"), "{message}");
    let message = expect_error(
        Raw::new(3, 1, 0)
            .tensor("w", &[1 << 40, 1 << 40], F32, 0)
            .data(32, 64),
    );
    assert!(message.contains("overflows"), "{message}");
    let message = expect_error(
        Raw::new(3, 1, 0)
            .tensor("w", &[u64::MAX], F32, 0)
            .data(32, 64),
    );
    assert!(message.contains("invalid dimension"), "{message}");
    let message = expect_error(
        Raw::new(3, 1, 0)
            .tensor("w", &[1, 1, 1, 1, 1], F32, 0)
            .data(32, 64),
    );
    assert!(message.contains("5 dimensions"), "{message}");
    let q4k = GgmlType::Q4_K.id();
    let message = expect_error(
        Raw::new(3, 1, 0)
            .tensor("w", &[100, 2], q4k, 0)
            .data(32, 512),
    );
    assert!(
        message.contains("not a whole number of Q4_K blocks"),
        "{message}"
    );
}

#[test]
fn split_shard_in_memory_is_an_error() {
    let message = expect_error(Raw::new(3, 0, 1).kv_u32("split.count", 2).data(1, 0));
    assert!(message.contains("2-shard"), "{message}");
    let message = expect_error(
        Raw::new(3, 0, 1)
            .str("split.count")
            .u32(8)
            .str("two")
            .data(1, 0),
    );
    assert!(message.contains("split.count"), "{message}");
}

/// Regenerates the committed fuzz seeds: `cargo test --test gguf_robustness -- --ignored`.
#[test]
#[ignore = "writes fuzz/seeds; run by hand after changing the seed set"]
fn write_fuzz_seeds() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/gguf_parse");
    std::fs::create_dir_all(&dir).expect("seed dir");
    std::fs::write(dir.join("small.gguf"), small_valid_file()).expect("small seed");
    // The fixture's metadata with its long arrays cut short and three of its tensors, so the
    // seed is a few KB but has the real keys, types and layout.
    let fixture = Gguf::open(tiny_model("IQ3_S")).expect("fixture");
    let mut writer = GgufWriter::new();
    for (key, value) in fixture.metadata() {
        let value = match value {
            Value::Array(items) => Value::Array(items.iter().take(4).cloned().collect()),
            Value::String(s) if s.len() > 64 => Value::String(s.chars().take(64).collect()),
            other => other.clone(),
        };
        writer.add_metadata(key.clone(), value);
    }
    for name in ["output_hc_norm.weight", "blk.0.attn_gate.weight"] {
        let t = fixture.tensor(name).expect(name);
        let rows = t.n_rows().min(2);
        let dims: Vec<u64> = [t.row_len(), rows].into();
        let data = &fixture.tensor_data(t)[..(t.row_bytes() * rows) as usize];
        writer.add_tensor(name, &dims, t.ty, data).expect(name);
    }
    std::fs::write(dir.join("fixture-header.gguf"), writer.to_bytes()).expect("fixture seed");
    let mut split = GgufWriter::new();
    split.add_metadata("split.no", Value::U16(0));
    split.add_metadata("split.count", Value::U16(1));
    split.add_metadata("general.alignment", Value::U32(64));
    split
        .add_tensor("x", &[32, 1], GgmlType::IQ4_NL, vec![7u8; 18])
        .expect("x");
    std::fs::write(dir.join("aligned.gguf"), split.to_bytes()).expect("aligned seed");
}
