//! The built-in demo model served by `strata serve` without `--model`: the tiny random qwen4exp
//! fixture (IQ3_S), compiled into the binary. Its outputs are meaningless but exercise every path.

use crate::gguf::{Gguf, GgufError};

/// The demo model's name in `/v1/models` and logs (its GGUF's `general.name` is the converter's
/// placeholder "Hf", which tells a user nothing).
pub const DEMO_MODEL_NAME: &str = "strata-demo-tiny-random";

static DEMO_GGUF: &[u8] = include_bytes!("../../tests/fixtures/tiny/tiny-IQ3_S.gguf");

pub fn demo_gguf() -> Result<Gguf, GgufError> {
    Gguf::from_static("demo (tiny random qwen4exp)", DEMO_GGUF)
}
