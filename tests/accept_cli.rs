//! CLI acceptance regressions: what a person types first should work, and a bad value should get
//! the sampler's explanation rather than an argument-parser riddle.

use std::process::Command;

const TINY: &str = "tests/fixtures/tiny/tiny-F16.gguf";

fn strata(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(args)
        .output()
        .expect("spawn strata");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn run_takes_the_prompt_as_a_plain_argument_too() {
    let common = [
        "--model",
        TINY,
        "--backend",
        "cpu",
        "-n",
        "6",
        "--seed",
        "5",
    ];
    let mut positional = vec!["run"];
    positional.extend(common);
    positional.push("hello there");
    let (ok, by_argument, stderr) = strata(&positional);
    assert!(ok, "{stderr}");
    let mut flagged = vec!["run"];
    flagged.extend(common);
    flagged.extend(["--prompt", "hello there"]);
    let (ok, by_flag, stderr) = strata(&flagged);
    assert!(ok, "{stderr}");
    assert!(!by_flag.is_empty());
    assert_eq!(by_argument, by_flag, "same prompt and seed, same text");

    // Neither form: clap names the missing prompt.
    let (ok, _, stderr) = strata(&["run", "--model", TINY]);
    assert!(!ok);
    assert!(stderr.contains("PROMPT"), "{stderr}");
    // Both forms at once are refused rather than one silently winning.
    let (ok, _, stderr) = strata(&["run", "--model", TINY, "-p", "a", "b"]);
    assert!(!ok);
    assert!(stderr.contains("cannot be used with"), "{stderr}");
}

#[test]
fn negative_temperature_gets_the_samplers_message() {
    let (ok, _, stderr) = strata(&[
        "run",
        "--model",
        TINY,
        "--backend",
        "cpu",
        "--temperature",
        "-1",
        "hi",
    ]);
    assert!(!ok);
    assert!(
        stderr.contains("temperature must be ≥ 0"),
        "expected the sampler's explanation, got: {stderr}"
    );
}
