//! The `run`, `chat` and `serve` subcommands, through the real binary.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const TINY: &str = "tests/fixtures/tiny/tiny-F16.gguf";

fn strata() -> Command {
    Command::new(env!("CARGO_BIN_EXE_strata"))
}

fn run_ok(args: &[&str]) -> (String, String) {
    let out = strata().args(args).output().expect("spawn strata");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        out.status.success(),
        "strata {args:?} failed\nstdout: {stdout}\nstderr: {stderr}"
    );
    (stdout, stderr)
}

#[test]
fn run_streams_text_reproducibly_and_reports_stats() {
    let args = [
        "run",
        "--model",
        TINY,
        "--backend",
        "cpu",
        "--prompt",
        "hello there",
        "-n",
        "10",
        "--temperature",
        "0.8",
        "--top-k",
        "40",
        "--top-p",
        "0.9",
        "--seed",
        "3",
    ];
    let (a, stats) = run_ok(&args);
    let (b, _) = run_ok(&args);
    assert_eq!(a, b, "same seed, same output");
    assert!(!a.trim().is_empty());
    assert!(stats.contains("generated: "), "{stats}");
    assert!(stats.contains("seed 3"), "{stats}");
    assert!(stats.contains("tok/s"), "{stats}");
    // Piped stdout: the chat template's reasoning is marked, not coloured.
    assert!(!a.contains('\x1b'));
    assert!(a.starts_with("[thinking]"), "{a:?}");

    let mut other = args;
    other[other.len() - 1] = "4";
    let (c, _) = run_ok(&other);
    assert_ne!(a, c, "another seed, another output");

    // --raw feeds the text as is (no template, no reasoning markers).
    let (raw, stats) = run_ok(&[
        "run",
        "--model",
        TINY,
        "--prompt",
        "hello",
        "-n",
        "5",
        "--raw",
        "--temperature",
        "0",
    ]);
    assert!(!raw.contains("[thinking]"));
    assert!(stats.contains("generated: 5 tokens"), "{stats}");
}

#[test]
fn run_errors_are_one_clear_line() {
    let out = strata()
        .args(["run", "--model", "no/such/model.gguf", "--prompt", "x"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert!(stderr.contains("no/such/model.gguf"), "{stderr}");

    let out = strata()
        .args(["run", "--model", TINY, "--prompt", "x", "--top-p", "2"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("top_p"));
}

#[test]
fn chat_reads_piped_stdin_with_commands() {
    let mut child = strata()
        .args(["chat", "--model", TINY, "-n", "6", "--seed", "1", "--stats"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"hello\n/think off\nand again\n/think sideways\n/think high\n/reset\nthird\n/exit\nnever read\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // Three replies, each followed by a stats line; the second turn reused the first's prompt.
    let stats: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("prompt: "))
        .collect();
    assert_eq!(stats.len(), 3, "{stderr}");
    assert!(stderr.contains("(reasoning: off)"));
    assert!(stderr.contains("unknown reasoning_effort"), "{stderr}");
    assert!(stderr.contains("(conversation cleared)"));
    // Only the reply with thinking off has no reasoning block.
    assert_eq!(stdout.matches("[thinking]").count(), 2, "{stdout}");
}

#[test]
fn serve_binds_first_reports_the_demo_model_and_answers() {
    let mut child = strata()
        .args(["serve", "--port", "0"])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut log = String::new();
    let mut base = None;
    let deadline = Instant::now() + Duration::from_secs(60);
    while base.is_none() && Instant::now() < deadline {
        let mut line = String::new();
        if stderr.read_line(&mut line).unwrap_or(0) == 0 {
            break;
        }
        if let Some(rest) = line.split("listening on ").nth(1) {
            base = rest.split_whitespace().next().map(str::to_string);
        }
        log.push_str(&line);
    }
    let result = std::panic::catch_unwind(|| {
        let base = base
            .clone()
            .unwrap_or_else(|| panic!("no listening line in: {log}"));
        assert!(log.contains("demo model"), "{log}");
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async {
            let client = reqwest::Client::new();
            let mut ready = false;
            for _ in 0..600 {
                let r = client.get(format!("{base}/health")).send().await.unwrap();
                if r.status().as_u16() == 200 {
                    ready = true;
                    break;
                }
                assert_eq!(r.status().as_u16(), 503);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert!(ready, "the demo model never became ready");
            let r = client
                .post(format!("{base}/v1/chat/completions"))
                .json(&serde_json::json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status().as_u16(), 200);
            let body: serde_json::Value = r.json().await.unwrap();
            assert!(body["usage"]["completion_tokens"].as_u64().unwrap() <= 4);
        });
    });
    let _ = child.kill();
    let _ = child.wait();
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}
