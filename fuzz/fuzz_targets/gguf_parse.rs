//! Fuzz the GGUF reader: arbitrary bytes must parse or fail with an error naming the file, never
//! panic; whatever parses must have every tensor's data in range and survive a rewrite.
//!
//! Run: `RUSTC_BOOTSTRAP=1 cargo fuzz run gguf_parse fuzz/corpus/gguf_parse fuzz/seeds/gguf_parse`
#![no_main]

// Compile the reader straight from the main crate's sources: it depends only on std, memmap2 and
// thiserror, and building it alone keeps the instrumented build small and fast.
#[allow(dead_code)]
#[path = "../../src/gguf/mod.rs"]
mod gguf;

use gguf::{Gguf, GgufWriter};
use libfuzzer_sys::fuzz_target;

const NAME: &str = "fuzz.gguf";

fuzz_target!(|data: &[u8]| {
    let gguf = match Gguf::from_vec(NAME, data.to_vec()) {
        Ok(gguf) => gguf,
        Err(e) => {
            let message = e.to_string();
            assert!(message.starts_with("fuzz.gguf: "), "{message}");
            assert!(!message.contains('\n'), "{message}");
            return;
        }
    };
    let mut checksum = 0u8;
    for t in gguf.tensors() {
        let bytes = gguf.tensor_data(t);
        assert_eq!(bytes.len() as u64, t.n_bytes, "{}", t.name);
        assert_eq!(t.row_bytes() * t.n_rows(), t.n_bytes, "{}", t.name);
        checksum ^= bytes.iter().fold(0u8, |a, &b| a ^ b);
        assert!(std::ptr::eq(gguf.tensor(&t.name).unwrap_or(t), t));
    }
    std::hint::black_box(checksum);
    for (key, value) in gguf.metadata() {
        assert!(gguf.get(key).is_some());
        std::hint::black_box((
            value.as_u64(),
            value.as_i64(),
            value.as_f32(),
            value.as_str(),
        ));
    }

    // Whatever parses can be written back, and writing the re-read file gives the same bytes.
    let rewrite = |g: &Gguf| {
        let mut writer = GgufWriter::new();
        for (key, value) in g.metadata() {
            writer.add_metadata(key.clone(), value.clone());
        }
        for t in g.tensors() {
            if let Err(e) = writer.add_tensor(t.name.clone(), &t.dims, t.ty, g.tensor_data(t)) {
                panic!("a parsed tensor could not be written back: {e}");
            }
        }
        writer.to_bytes()
    };
    let first = rewrite(&gguf);
    match Gguf::from_vec(NAME, first.clone()) {
        Ok(reread) => assert!(rewrite(&reread) == first, "rewrite is not stable"),
        Err(e) => panic!("a rewritten file does not parse: {e}"),
    }
});
