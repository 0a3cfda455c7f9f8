//! The GGUF tokenizer against the oracle: `tokenizer_cases.json` holds 12 strings tokenized by
//! Hugging Face `tokenizers` and by llama.cpp (which agreed 12/12) with the tiny model's BPE.

use serde_json::Value as Json;
use strata::gguf::{Gguf, GgufWriter, Value};
use strata::tokenizer::{StreamDecoder, Tokenizer, TokenizerError};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tiny");

fn tiny_gguf() -> Gguf {
    Gguf::open(format!("{FIXTURES}/tiny-F16.gguf")).expect("tiny-F16.gguf opens")
}

fn tiny_tokenizer() -> Tokenizer {
    Tokenizer::from_gguf(&tiny_gguf()).expect("tokenizer builds from the GGUF")
}

struct Case {
    text: String,
    ids: Vec<u32>,
    decoded: String,
}

fn cases() -> Vec<Case> {
    let raw = std::fs::read_to_string(format!("{FIXTURES}/tokenizer_cases.json"))
        .expect("tokenizer_cases.json");
    let json: Json = serde_json::from_str(&raw).expect("valid JSON");
    json["cases"]
        .as_array()
        .expect("cases array")
        .iter()
        .map(|c| Case {
            text: c["text"].as_str().expect("text").to_string(),
            ids: c["ids"]
                .as_array()
                .expect("ids")
                .iter()
                .map(|v| v.as_u64().expect("id") as u32)
                .collect(),
            decoded: c["decoded"].as_str().expect("decoded").to_string(),
        })
        .collect()
}

#[test]
fn all_cases_give_the_reference_ids_and_decode_back() {
    let tokenizer = tiny_tokenizer();
    let cases = cases();
    assert_eq!(cases.len(), 12);
    let mut matching = 0;
    for case in &cases {
        let ids = tokenizer.encode(&case.text, true).expect("encodes");
        if ids == case.ids {
            matching += 1;
        } else {
            eprintln!(
                "MISMATCH {:?}\n  got  {ids:?}\n  want {:?}",
                case.text, case.ids
            );
        }
        assert_eq!(tokenizer.decode(&case.ids, false), case.decoded);
    }
    assert_eq!(matching, cases.len(), "cases with identical ids");
}

#[test]
fn special_tokens_only_parsed_when_asked() {
    let tokenizer = tiny_tokenizer();
    let im_start = tokenizer
        .token_id("<|im_start|>")
        .expect("<|im_start|> in vocab");
    let im_end = tokenizer
        .token_id("<|im_end|>")
        .expect("<|im_end|> in vocab");
    assert_eq!((im_start, im_end), (510, 511));
    assert!(tokenizer.is_special(im_start));
    assert!(!tokenizer.is_special(0));

    let text = "<|im_start|>user\nhi<|im_end|>";
    let trusted = tokenizer.encode(text, true).expect("encodes");
    assert_eq!(trusted.first(), Some(&im_start));
    assert_eq!(trusted.last(), Some(&im_end));

    let untrusted = tokenizer.encode(text, false).expect("encodes");
    assert!(!untrusted.contains(&im_start) && !untrusted.contains(&im_end));
    // Still the same text: the markup is spelled out byte by byte.
    assert_eq!(tokenizer.decode(&untrusted, false), text);

    assert_eq!(tokenizer.decode(&trusted, true), "user\nhi");
}

#[test]
fn vocabulary_and_stop_ids() {
    let tokenizer = tiny_tokenizer();
    assert_eq!(tokenizer.vocab_size(), 512);
    assert_eq!(tokenizer.eos_id(), Some(509));
    let stops = tokenizer.stop_ids();
    assert!(stops.contains(&509) && stops.contains(&511), "{stops:?}");
    assert!(!stops.contains(&510));
    assert_eq!(tokenizer.token_text(511).as_deref(), Some("<|im_end|>"));
    assert_eq!(tokenizer.token_text(100_000), None);
    // Unknown ids are skipped, not a panic.
    assert_eq!(tokenizer.decode(&[39, 100_000], false), "H");
}

#[test]
fn stream_decoder_never_splits_a_character() {
    let tokenizer = tiny_tokenizer();
    for case in cases() {
        let mut decoder = StreamDecoder::new(&tokenizer);
        let mut text = String::new();
        for &id in &case.ids {
            if let Some(piece) = decoder.push(id) {
                assert!(
                    !piece.contains('\u{FFFD}'),
                    "half a character emitted for {:?}: {piece:?}",
                    case.text
                );
                text.push_str(&piece);
            }
        }
        if let Some(tail) = decoder.finish() {
            text.push_str(&tail);
        }
        assert_eq!(text, case.decoded);
    }
}

#[test]
fn stream_decoder_holds_back_an_incomplete_character() {
    let tokenizer = tiny_tokenizer();
    // The tiny vocabulary has single-byte tokens; "é" is two bytes, so two tokens.
    let ids = tokenizer.encode("é", false).expect("encodes");
    assert_eq!(ids.len(), 2, "{ids:?}");
    let mut decoder = StreamDecoder::new(&tokenizer);
    assert_eq!(decoder.push(ids[0]), None);
    assert_eq!(decoder.push(ids[1]).as_deref(), Some("é"));
    assert_eq!(decoder.finish(), None);

    // A stream cut in the middle of a character flushes what there is at the end.
    let mut decoder = StreamDecoder::new(&tokenizer);
    assert_eq!(decoder.push(ids[0]), None);
    assert_eq!(decoder.finish().as_deref(), Some("\u{FFFD}"));
}

/// A copy of the tiny GGUF's metadata with some keys changed.
fn gguf_with(changes: &[(&str, Option<Value>)]) -> Gguf {
    let source = tiny_gguf();
    let mut writer = GgufWriter::new();
    for (key, value) in source.metadata() {
        if key.starts_with("split.") {
            continue;
        }
        match changes.iter().find(|(k, _)| k == key) {
            Some((_, Some(v))) => writer.add_metadata(key.clone(), v.clone()),
            Some((_, None)) => continue,
            None => writer.add_metadata(key.clone(), value.clone()),
        };
    }
    Gguf::from_vec("edited.gguf", writer.to_bytes()).expect("edited GGUF parses")
}

#[test]
fn unsupported_or_missing_tokenizer_metadata_is_a_clear_error() {
    let unknown_pre = gguf_with(&[("tokenizer.ggml.pre", Some(Value::String("made-up".into())))]);
    match Tokenizer::from_gguf(&unknown_pre) {
        Err(TokenizerError::UnsupportedPre(pre)) => assert_eq!(pre, "made-up"),
        other => panic!("expected UnsupportedPre, got {other:?}"),
    }

    let spm = gguf_with(&[("tokenizer.ggml.model", Some(Value::String("llama".into())))]);
    assert!(matches!(
        Tokenizer::from_gguf(&spm),
        Err(TokenizerError::UnsupportedModel(_))
    ));

    let no_merges = gguf_with(&[("tokenizer.ggml.merges", None)]);
    let err = Tokenizer::from_gguf(&no_merges).expect_err("no merges");
    assert!(err.to_string().contains("tokenizer.ggml.merges"), "{err}");

    let bad_merge = gguf_with(&[(
        "tokenizer.ggml.merges",
        Some(Value::Array(vec![Value::String("nospace".into())])),
    )]);
    assert!(matches!(
        Tokenizer::from_gguf(&bad_merge),
        Err(TokenizerError::BadMerge { index: 0, .. })
    ));

    let short_types = gguf_with(&[(
        "tokenizer.ggml.token_type",
        Some(Value::Array(vec![Value::I32(1); 3])),
    )]);
    assert!(matches!(
        Tokenizer::from_gguf(&short_types),
        Err(TokenizerError::TokenTypeCount {
            types: 3,
            tokens: 512
        })
    ));
}

#[test]
fn tokenizer_is_shareable_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Tokenizer>();
    let tokenizer = tiny_tokenizer();
    let handles: Vec<_> = (0..2)
        .map(|_| {
            let t = tokenizer.clone();
            std::thread::spawn(move || t.encode("Hello world", true).expect("encodes"))
        })
        .collect();
    for handle in handles {
        assert_eq!(handle.join().expect("thread"), vec![39, 298, 329, 375, 276]);
    }
}
