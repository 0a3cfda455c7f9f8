//! The built-in demo model served by `strata serve` without `--model`: the tiny random qwen4exp
//! fixture (IQ3_S), compiled into the binary. Its outputs are meaningless but exercise every path.

use crate::gguf::{Gguf, GgufError};

/// The demo model's name in `/v1/models` and logs (its GGUF's `general.name` is the converter's
/// placeholder "Hf", which tells a user nothing).
pub const DEMO_MODEL_NAME: &str = "strata-demo-tiny-random";

static DEMO_GGUF: &[u8] = include_bytes!("../../tests/fixtures/tiny/tiny-IQ3_S.gguf");

/// The demo model, named [`DEMO_MODEL_NAME`] (its `general.name`, which every command reports).
pub fn demo_gguf() -> Result<Gguf, GgufError> {
    let mut gguf = Gguf::from_static("demo (tiny random qwen4exp)", DEMO_GGUF)?;
    gguf.set_metadata(
        "general.name",
        crate::gguf::Value::String(DEMO_MODEL_NAME.to_string()),
    );
    Ok(gguf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_model_is_named_for_users() {
        let gguf = demo_gguf().expect("demo model");
        let config = crate::model::config::Config::from_gguf(&gguf).expect("config");
        assert_eq!(config.name, DEMO_MODEL_NAME);
    }
}
