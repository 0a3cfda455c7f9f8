//! Block formats against ggml itself: `tests/fixtures/quant-vectors/` holds, for 21 ggml types,
//! blocks made by ggml's quantizer (`TYPE.quantized.bin`) and random blocks (`TYPE.random.bin`),
//! each with ggml's `to_float` output (`.f32`). Dequantization must reproduce every f32 bit.

use std::path::{Path, PathBuf};

use strata::gguf::GgmlType;
use strata::quant::{
    QuantError, check_finite, dequantize, dot_row, is_quantize_supported, is_supported, quantize,
    random_blocks,
};

/// The oracle's vectors for 21 types (a copy of the oracle's `quant-vectors`; its README §5).
fn vectors_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/quant-vectors")
}

/// Vectors made the same way, from the same ggml commit, for Q1_0, Q2_0, TQ1_0, TQ2_0, MXFP4 and
/// NVFP4 (see the README in that folder).
fn newer_vectors_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/quant-vectors-newer")
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|err| panic!("reading {}: {err}", path.display()))
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    assert_eq!(bytes.len() % 4, 0);
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// One row of `index.tsv`: type name, block bytes, values per block, block counts of both sets.
struct IndexRow {
    name: String,
    ty: GgmlType,
    block_bytes: usize,
    block_values: usize,
    quantized_blocks: usize,
    random_blocks: usize,
}

fn index(dir: &Path) -> Vec<IndexRow> {
    let text = String::from_utf8(read(&dir.join("index.tsv"))).expect("utf-8 index");
    let mut rows = Vec::new();
    for line in text.lines().skip(1).filter(|line| !line.trim().is_empty()) {
        let fields: Vec<&str> = line.split('\t').collect();
        assert_eq!(fields.len(), 5, "index.tsv line {line:?}");
        let number = |i: usize| fields[i].parse::<usize>().expect("number in index.tsv");
        let ty = GgmlType::from_name(fields[0])
            .unwrap_or_else(|| panic!("index.tsv names unknown type {}", fields[0]));
        rows.push(IndexRow {
            name: fields[0].to_string(),
            ty,
            block_bytes: number(1),
            block_values: number(2),
            quantized_blocks: number(3),
            random_blocks: number(4),
        });
    }
    rows
}

/// Dequantize `TYPE.SET.bin` and compare bit for bit with `TYPE.SET.f32`; returns values compared.
fn compare_set(dir: &Path, row: &IndexRow, set: &str, expected_blocks: usize) -> usize {
    let packed = read(&dir.join(format!("{}.{set}.bin", row.name)));
    let expected = f32s(&read(&dir.join(format!("{}.{set}.f32", row.name))));
    assert_eq!(
        packed.len(),
        expected_blocks * row.block_bytes,
        "{} {set}",
        row.name
    );
    assert_eq!(
        expected.len(),
        expected_blocks * row.block_values,
        "{} {set}",
        row.name
    );

    let mut actual = vec![f32::NAN; expected.len()];
    dequantize(row.ty, &packed, &mut actual)
        .unwrap_or_else(|err| panic!("{} {set}: {err}", row.name));
    for (i, (a, e)) in actual.iter().zip(&expected).enumerate() {
        assert_eq!(
            a.to_bits(),
            e.to_bits(),
            "{} {set}: value {i} (block {}) is {a:e} ({:#010x}), ggml gives {e:e} ({:#010x})",
            row.name,
            i / row.block_values,
            a.to_bits(),
            e.to_bits()
        );
    }
    expected.len()
}

/// Compare both sets of every type listed in `dir`; returns (types, sets, values).
fn compare_all(dir: &Path) -> (usize, usize, usize) {
    let rows = index(dir);
    let mut values = 0;
    let mut sets = 0;
    for row in &rows {
        assert!(is_supported(row.ty), "{} must be supported", row.name);
        assert_eq!(
            (row.ty.type_size(), row.ty.block_size()),
            (row.block_bytes, row.block_values),
            "{}: block geometry",
            row.name
        );
        values += compare_set(dir, row, "quantized", row.quantized_blocks);
        values += compare_set(dir, row, "random", row.random_blocks);
        sets += 2;
    }
    (rows.len(), sets, values)
}

#[test]
fn every_oracle_vector_is_bit_identical_to_ggml() {
    let (types, sets, values) = compare_all(&vectors_dir());
    println!("oracle: {types} types, {sets} vector sets, {values} values bit-identical");
    assert_eq!(
        (types, sets),
        (21, 42),
        "the oracle covers 21 types, two sets each"
    );
    assert_eq!(values, 35_592);
}

#[test]
fn newer_scalar_types_are_bit_identical_to_ggml() {
    let (types, sets, values) = compare_all(&newer_vectors_dir());
    println!("newer types: {types} types, {sets} vector sets, {values} values bit-identical");
    assert_eq!((types, sets), (6, 12));
    assert_eq!(values, 9_344);
}

/// Our reference quantizers reproduce ggml's bytes for the types whose ggml quantizer (without an
/// importance matrix) is the plain `quantize_row_*_ref`.
#[test]
fn reference_quantizers_match_ggml_bytes() {
    let mut checked = Vec::new();
    for dir in [vectors_dir(), newer_vectors_dir()] {
        checked.extend(quantizer_matches_in(&dir));
    }
    checked.sort();
    // F32 is in neither set; every other type `quantize` offers must have been checked.
    assert_eq!(
        checked,
        ["bf16", "f16", "iq4_nl", "q1_0", "q2_0", "q4_0", "q8_0"]
    );
}

/// Quantize `TYPE.source.f32` for every type in `dir` that `quantize` offers and that has a source
/// file; compare with ggml's bytes. Returns the type names checked.
fn quantizer_matches_in(dir: &Path) -> Vec<String> {
    let mut checked = Vec::new();
    for row in index(dir) {
        let source_path = dir.join(format!("{}.source.f32", row.name));
        if !is_quantize_supported(row.ty) || !source_path.exists() {
            continue;
        }
        let source = f32s(&read(&source_path));
        let expected = read(&dir.join(format!("{}.quantized.bin", row.name)));
        let mut packed = vec![0u8; expected.len()];
        quantize(row.ty, &source, &mut packed).expect("quantize");
        let first_difference = packed.iter().zip(&expected).position(|(a, e)| a != e);
        assert_eq!(
            first_difference, None,
            "{}: quantized bytes differ from ggml at byte {first_difference:?}",
            row.name
        );
        checked.push(row.name);
    }
    checked
}

#[test]
fn quantize_refuses_non_finite_input() {
    let mut source = vec![0.5f32; 64];
    source[40] = f32::NAN;
    let mut packed = vec![0u8; 2 * GgmlType::Q8_0.type_size()];
    let err = quantize(GgmlType::Q8_0, &source, &mut packed).unwrap_err();
    assert!(
        matches!(err, QuantError::NonFinite { block: 1, .. }),
        "{err}"
    );
}

/// Every type `is_supported` accepts, for the property tests below.
fn supported_types() -> Vec<GgmlType> {
    GgmlType::all().filter(|&ty| is_supported(ty)).collect()
}

#[test]
fn check_finite_names_the_first_block_with_a_bad_scale() {
    for ty in supported_types() {
        // NVFP4 decodes to finite values for every byte: nothing can be bad.
        if ty == GgmlType::NVFP4 {
            continue;
        }
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut blocks = random_blocks(ty, 5, 7);
            check_finite(ty, &blocks).unwrap_or_else(|err| panic!("{ty}: {err}"));
            poison_first_scale(ty, &mut blocks[3 * ty.type_size()..4 * ty.type_size()], bad);
            match check_finite(ty, &blocks) {
                Err(QuantError::NonFinite { block, .. }) => assert_eq!(block, 3, "{ty}"),
                other => panic!("{ty}: expected NonFinite in block 3, got {other:?}"),
            }
        }
    }
}

/// Write `bad` into the first floating-point field of one block of `ty`.
fn poison_first_scale(ty: GgmlType, block: &mut [u8], bad: f32) {
    use GgmlType::*;
    let f16 = half::f16::from_f32(bad).to_le_bytes();
    let at = match ty {
        F32 => {
            block.copy_from_slice(&bad.to_le_bytes());
            return;
        }
        BF16 => {
            block.copy_from_slice(&((bad.to_bits() >> 16) as u16).to_le_bytes());
            return;
        }
        MXFP4 => {
            // No NaN exists in E8M0 as ggml decodes it; the largest exponents overflow instead.
            block[0] = if bad.is_nan() { 255 } else { 253 };
            return;
        }
        IQ1_M => {
            // The f16 scale is spread over the top nibbles of four u16 words at bytes 48..56.
            let bits = u16::from_le_bytes(f16);
            for k in 0..4 {
                let at = 48 + 2 * k;
                let word = u16::from_le_bytes([block[at], block[at + 1]]);
                let word = (word & 0x0FFF) | (((bits >> (4 * k)) & 0xF) << 12);
                block[at..at + 2].copy_from_slice(&word.to_le_bytes());
            }
            return;
        }
        Q2_K => 80,
        Q3_K => 108,
        Q6_K => 208,
        TQ1_0 => 52,
        TQ2_0 => 64,
        _ => 0,
    };
    block[at..at + 2].copy_from_slice(&f16);
}

#[test]
fn check_finite_catches_every_scale_field_of_two_scale_types() {
    // Q4_K's dmin (second field) and Q4_1's m must be checked too, not only d.
    for (ty, offset) in [
        (GgmlType::Q4_K, 2),
        (GgmlType::Q4_1, 2),
        (GgmlType::Q2_K, 82),
    ] {
        let mut blocks = random_blocks(ty, 2, 1);
        let at = ty.type_size() + offset;
        blocks[at..at + 2].copy_from_slice(&half::f16::NAN.to_le_bytes());
        assert!(
            matches!(
                check_finite(ty, &blocks),
                Err(QuantError::NonFinite { block: 1, .. })
            ),
            "{ty}"
        );
    }
}

#[test]
fn random_blocks_are_deterministic_finite_and_decode_to_finite_values() {
    for ty in supported_types() {
        let n_blocks = 6;
        let blocks = random_blocks(ty, n_blocks, 42);
        assert_eq!(blocks.len(), n_blocks * ty.type_size(), "{ty}");
        assert_eq!(
            blocks,
            random_blocks(ty, n_blocks, 42),
            "{ty}: same seed, same bytes"
        );
        assert_ne!(
            blocks,
            random_blocks(ty, n_blocks, 43),
            "{ty}: seed must matter"
        );
        check_finite(ty, &blocks).unwrap_or_else(|err| panic!("{ty}: {err}"));
        let mut values = vec![f32::NAN; n_blocks * ty.block_size()];
        dequantize(ty, &blocks, &mut values).unwrap_or_else(|err| panic!("{ty}: {err}"));
        assert!(
            values.iter().all(|v| v.is_finite()),
            "{ty}: non-finite weight"
        );
        assert!(values.iter().any(|&v| v != 0.0), "{ty}: all weights zero");
    }
}

#[test]
fn dot_row_is_dequantize_then_sum_in_index_order() {
    for ty in supported_types() {
        let n_blocks = 3;
        let row = random_blocks(ty, n_blocks, 9);
        let n = n_blocks * ty.block_size();
        let x: Vec<f32> = (0..n)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 16.0)
            .collect();

        let mut weights = vec![0.0f32; n];
        dequantize(ty, &row, &mut weights).expect("dequantize");
        let mut expected = 0.0f32;
        for i in 0..n {
            expected += weights[i] * x[i];
        }

        let mut scratch = Vec::new();
        let actual = dot_row(ty, &row, &x, &mut scratch).expect("dot_row");
        assert_eq!(actual.to_bits(), expected.to_bits(), "{ty}");
        // A reused scratch buffer (longer than needed, stale contents) gives the same answer.
        scratch.resize(10 * n, f32::NAN);
        let again = dot_row(ty, &row, &x, &mut scratch).expect("dot_row");
        assert_eq!(again.to_bits(), expected.to_bits(), "{ty}");
    }
}

#[test]
fn wrong_lengths_are_errors_not_panics() {
    for ty in supported_types() {
        let blocks = random_blocks(ty, 2, 3);
        let values = 2 * ty.block_size();
        let mut dst = vec![0.0f32; values + 1];

        // Output one value too long or too short.
        for len in [values + 1, values - 1, 0] {
            let result = dequantize(ty, &blocks, &mut dst[..len]);
            assert!(
                matches!(result, Err(QuantError::BadLength { .. })),
                "{ty} len {len}"
            );
        }
        // Packed side not a whole number of blocks (for byte-sized types, a partial element).
        if ty.type_size() > 1 {
            let short = &blocks[..blocks.len() - 1];
            let result = dequantize(ty, short, &mut dst[..values]);
            assert!(matches!(result, Err(QuantError::BadLength { .. })), "{ty}");
            assert!(
                matches!(check_finite(ty, short), Err(QuantError::BadLength { .. })),
                "{ty}"
            );
        }
        let mut scratch = Vec::new();
        let result = dot_row(ty, &blocks, &vec![1.0; values + 3], &mut scratch);
        assert!(matches!(result, Err(QuantError::BadLength { .. })), "{ty}");
        // Empty input is a valid zero-block tensor.
        assert!(dequantize(ty, &[], &mut []).is_ok(), "{ty}");
    }
}

#[test]
fn unsupported_types_are_refused_by_name() {
    for ty in [GgmlType::Q8_K, GgmlType::Q8_1, GgmlType::I32, GgmlType::F64] {
        assert!(!is_supported(ty));
        let blocks = vec![0u8; ty.type_size()];
        let mut dst = vec![0.0f32; ty.block_size()];
        let err = dequantize(ty, &blocks, &mut dst).unwrap_err();
        assert!(matches!(err, QuantError::Unsupported(t) if t == ty), "{ty}");
        assert!(err.to_string().contains(ty.name()), "{err}");
    }
}

#[test]
fn mxfp4_exponents_that_overflow_weights_are_caught_at_the_boundary() {
    let mut block = random_blocks(GgmlType::MXFP4, 1, 5);
    block[1..].fill(0x77); // every code 7 → the largest magnitude, 12 (doubled e2m1 6.0)
    let mut values = [0.0f32; 32];

    block[0] = 252; // 12 * 2^124 ≈ 2.0e38: still finite
    check_finite(GgmlType::MXFP4, &block).expect("e = 252 is usable");
    dequantize(GgmlType::MXFP4, &block, &mut values).expect("dequantize");
    assert!(values.iter().all(|v| v.is_finite()));

    block[0] = 253; // 12 * 2^125 overflows
    dequantize(GgmlType::MXFP4, &block, &mut values).expect("dequantize");
    assert!(
        values.iter().any(|v| v.is_infinite()),
        "the check below guards a real overflow"
    );
    assert!(matches!(
        check_finite(GgmlType::MXFP4, &block),
        Err(QuantError::NonFinite { block: 0, .. })
    ));
}
