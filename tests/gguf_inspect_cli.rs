//! `strata inspect` through the built binary.

use std::process::{Command, Output};

mod common;
use common::tiny_model;

fn inspect(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_strata"))
        .arg("inspect")
        .args(args)
        .output()
        .expect("run strata inspect")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn inspect_prints_metadata_tensors_totals_and_config() {
    let path = tiny_model("IQ3_S");
    let output = inspect(&[path.to_str().expect("utf-8 path")]);
    let stdout = text(&output.stdout);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(
        stdout.contains("GGUF v3, 56 metadata entries, 113 tensors"),
        "{stdout}"
    );
    assert!(stdout.contains("general.architecture"), "{stdout}");
    assert!(stdout.contains("\"qwen4exp\""), "{stdout}");
    // Long arrays are summarised with their length and element type.
    assert!(
        stdout.contains("[512 × string] \"!\", \"\\\"\""),
        "{stdout}"
    );
    // The chat template is cut, with its length given.
    let template_line = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("tokenizer.chat_template"))
        .expect("chat template line");
    assert!(
        template_line.contains("chars,") && template_line.len() < 250,
        "{template_line}"
    );
    // Tensor table and per-type totals.
    let embd_line = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("token_embd.weight"))
        .expect("token_embd row");
    assert!(
        embd_line.contains("IQ3_S")
            && embd_line.contains("[256, 512]")
            && embd_line.contains("56320"),
        "{embd_line}"
    );
    let iq4_total = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("IQ4_NL") && l.contains("tensors"))
        .expect("IQ4_NL total");
    assert!(iq4_total.contains("18 tensors"), "{iq4_total}");
    // The config as the engine reads it, not an error.
    let config = stdout
        .split("config (as the engine reads it):")
        .nth(1)
        .expect("config section");
    assert!(!config.contains("not runnable"), "{config}");
    assert!(config.contains("layers"), "{config}");
}

#[test]
fn inspect_json_is_complete_and_parseable() {
    let path = tiny_model("F16");
    let output = inspect(&["--json", path.to_str().expect("utf-8 path")]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&output.stdout).expect("valid JSON");
    assert_eq!(doc["version"], 3);
    assert_eq!(doc["tensor_count"], 113);
    assert_eq!(doc["tensors"].as_array().map(Vec::len), Some(113));
    let metadata = doc["metadata"].as_array().expect("metadata list");
    assert_eq!(metadata[0]["key"], "general.architecture");
    assert_eq!(metadata[0]["value"], "qwen4exp");
    let tokens = metadata
        .iter()
        .find(|m| m["key"] == "tokenizer.ggml.tokens")
        .expect("tokens");
    assert_eq!(tokens["value"].as_array().map(Vec::len), Some(512));
    let share_sum: f64 = doc["types"]
        .as_array()
        .expect("types")
        .iter()
        .filter_map(|t| t["share"].as_f64())
        .sum();
    assert!((share_sum - 1.0).abs() < 1e-9, "{share_sum}");
    assert!(doc["config"]["ok"].is_string(), "{}", doc["config"]);
}

#[test]
fn inspect_tensor_filters() {
    let path = tiny_model("F16");
    let path = path.to_str().expect("utf-8 path");
    let filtered = text(&inspect(&["--tensors", "blk.3.", path]).stdout);
    let listed = filtered
        .lines()
        .find(|l| l.starts_with("tensors ("))
        .expect("tensor header");
    assert!(!listed.contains("(113 listed)"), "{listed}");
    assert!(!filtered.contains("token_embd.weight  "), "{filtered}");
    let none = text(&inspect(&["--no-tensors", path]).stdout);
    assert!(!none.contains("tensors ("), "{none}");
    assert!(none.contains("totals per type"), "{none}");
}

#[test]
fn inspect_truncated_file_fails_with_one_error_line() {
    let bytes = std::fs::read(tiny_model("IQ3_S")).expect("fixture");
    let dir = std::env::temp_dir().join(format!("strata-inspect-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let truncated = dir.join("cut.gguf");
    std::fs::write(&truncated, &bytes[..5000]).expect("write truncated copy");

    let output = inspect(&[truncated.to_str().expect("utf-8 path")]);
    assert!(!output.status.success());
    let stderr = text(&output.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    assert!(lines[0].contains("cut.gguf"), "{stderr}");
    assert!(lines[0].contains("truncated"), "{stderr}");
    assert!(output.stdout.is_empty());

    let missing = dir.join("missing.gguf");
    let output = inspect(&[missing.to_str().expect("utf-8 path")]);
    assert!(!output.status.success());
    assert!(text(&output.stderr).starts_with("error: "));
    std::fs::remove_dir_all(&dir).expect("clean up");
}
