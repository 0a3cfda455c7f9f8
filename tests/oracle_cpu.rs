//! The CPU reference forward pass against the transformers oracle (its README: `oracle/README.md`
//! in the project's shared folder; every file used here is in `tests/fixtures/tiny`).
//!
//! For each fixture type and prompt: prompt logits of every position, and teacher-forced decode
//! (prompt + llama.cpp's greedy tokens) compared with transformers' uncached logits on the same
//! weights — max |Δ| ≤ 1e-4 at every position whose QSA margin is ≥ 1e-3 (a smaller margin means the
//! reference's block choice is a tie, finding F5). The same tokens fed in chunks of 1, 7 and all at
//! once must give bit-identical logits.

use std::sync::Arc;

mod common;
use common::{fixtures, margins, max_abs_diff, open_fixture, prompt_ids, read, run};
use strata::npy::NpyArray;

use strata::engine::{Backend, EngineError};
use strata::model::CpuBackend;

const TOLERANCE: f32 = 1e-4;
const MIN_QSA_MARGIN: f32 = 1e-3;
const PROMPTS: [&str; 4] = ["p1", "p7", "p64eos", "p300"];
const TEACHER_PROMPTS: [&str; 3] = ["p7", "p64eos", "p300"];
const DECODE_STEPS: usize = 31;

/// Opens a fixture GGUF (all shipped in `tests/fixtures/tiny`; Q6_K rebuilt from its part file).
fn open_model(ty: &str) -> Option<Arc<CpuBackend>> {
    let gguf = Arc::new(open_fixture(ty));
    Some(Arc::new(
        CpuBackend::load(gguf, 0).expect("fixture model loads"),
    ))
}

/// The teacher tokens: llama.cpp's greedy continuation (`refs/llamacpp_<TYPE>`). For a type whose
/// llama.cpp tokens are not shipped (Q6_K) they are recovered from the teacher logits: token k is
/// the candidate near the top of teacher row k that, fed after the tokens so far, reproduces teacher
/// row k + 1 within the tolerance. A wrong model matches no candidate, so the search cannot hide a
/// bug; it stops early where no candidate matches (e.g. a QSA tie in the reference).
fn teacher_tokens(
    backend: &Arc<CpuBackend>,
    ty: &str,
    prompt: &str,
    ids: &[u32],
    teacher: &NpyArray,
) -> Vec<u32> {
    let llama_ty = if ty == "F16" { "F32" } else { ty };
    let path = fixtures().join(format!("refs/llamacpp_{llama_ty}/{prompt}.gen_tokens.npy"));
    if path.exists() {
        return read(&path)
            .data
            .iter()
            .take(DECODE_STEPS)
            .map(|&v| v as u32)
            .collect();
    }
    let mut seq = Arc::clone(backend).new_sequence().expect("sequence");
    seq.feed(ids, false).expect("prompt");
    let mut tokens = Vec::new();
    for k in 0..DECODE_STEPS {
        let row = teacher.row(k);
        let next = teacher.row(k + 1);
        let candidates = strata::model::ops::top_k(row, 8);
        let best = row[candidates[0]];
        let found = candidates
            .into_iter()
            .filter(|&c| row[c] >= best - 1.0)
            .find(|&c| {
                let mut trial = seq.fork().expect("fork");
                let logits = trial.feed(&[c as u32], false).expect("feed");
                max_abs_diff(&logits, next) <= TOLERANCE
            });
        let Some(token) = found else { break };
        seq.feed(&[token as u32], false).expect("feed");
        tokens.push(token as u32);
    }
    tokens
}

fn check_type(ty: &str) {
    let Some(backend) = open_model(ty) else {
        return;
    };
    let vocab = backend.info().vocab_size;
    let ref_dir = fixtures()
        .join("refs")
        .join(if ty == "F16" { "F32" } else { ty });
    let margin_dir = fixtures().join("refs/F32");
    let mut report = Vec::new();
    for prompt in PROMPTS {
        let ids = prompt_ids(prompt);
        let n = ids.len();
        // Teacher-forced decode rows: every prompt but the one-token p1, whose reference files
        // are left out to keep the fixtures under 20 MB (p7, p64eos and p300 cover decode).
        let teacher = TEACHER_PROMPTS
            .contains(&prompt)
            .then(|| read(&ref_dir.join(format!("{prompt}.teacher_logits.npy"))));
        let gen_tokens = match &teacher {
            Some(t) => teacher_tokens(&backend, ty, prompt, &ids, t),
            None => Vec::new(),
        };
        let mut tokens = ids.clone();
        tokens.extend(&gen_tokens);

        let whole = run(&backend, &tokens, tokens.len());
        for chunk in [1, 7] {
            let other = run(&backend, &tokens, chunk);
            let same = whole
                .iter()
                .zip(&other)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "{ty} {prompt}: chunk {chunk} differs from one whole-prompt feed"
            );
        }

        let prompt_ref = read(&ref_dir.join(format!("{prompt}.prompt_logits.npy")));
        let prompt_margin = margins(&margin_dir.join(format!("{prompt}.qsa_margin_prompt.npy")));
        let mut worst_prompt = 0.0f32;
        let mut checked = 0;
        for i in 0..n {
            if prompt_margin[i] < MIN_QSA_MARGIN {
                continue;
            }
            let d = max_abs_diff(&whole[i * vocab..(i + 1) * vocab], prompt_ref.row(i));
            assert!(
                d <= TOLERANCE,
                "{ty} {prompt}: prompt position {i} max |Δ| {d}"
            );
            worst_prompt = worst_prompt.max(d);
            checked += 1;
        }
        assert!(
            checked > 0,
            "{ty} {prompt}: no prompt position was compared"
        );

        let teacher_margin = margins(&margin_dir.join(format!("{prompt}.qsa_margin_teacher.npy")));
        let mut worst_teacher = 0.0f32;
        let mut teacher_rows = 0;
        let Some(teacher) = teacher else {
            report.push(format!(
                "{ty} {prompt}: prompt max |Δ| {worst_prompt:.2e} over {checked}/{n} positions"
            ));
            continue;
        };
        for k in 0..=gen_tokens.len() {
            let position = n - 1 + k;
            if teacher_margin
                .get(position)
                .copied()
                .unwrap_or(f32::INFINITY)
                < MIN_QSA_MARGIN
            {
                continue;
            }
            let d = max_abs_diff(
                &whole[position * vocab..(position + 1) * vocab],
                teacher.row(k),
            );
            assert!(
                d <= TOLERANCE,
                "{ty} {prompt}: teacher row {k} (position {position}) max |Δ| {d}"
            );
            worst_teacher = worst_teacher.max(d);
            teacher_rows += 1;
        }
        report.push(format!(
            "{ty} {prompt}: prompt max |Δ| {worst_prompt:.2e} over {checked}/{n} positions; teacher-forced max |Δ| {worst_teacher:.2e} over {teacher_rows} rows"
        ));
    }
    for line in report {
        println!("{line}");
    }
}

#[test]
fn f16_matches_transformers() {
    check_type("F16");
}

#[test]
fn q6_k_matches_transformers() {
    check_type("Q6_K");
}

#[test]
fn iq3_s_matches_transformers() {
    check_type("IQ3_S");
}

/// Decoder-layer outputs and the head mixer output of p7 against transformers, to localise a
/// mismatch to a layer.
#[test]
fn f16_final_hidden_matches_transformers() {
    let Some(backend) = open_model("F16") else {
        return;
    };
    for prompt in ["p7", "p64eos"] {
        let ids = prompt_ids(prompt);
        let mut seq = backend.sequence();
        let hidden = seq.feed_hidden(&ids).expect("feed");
        let reference = read(&fixtures().join(format!("refs/F32/{prompt}.final_hidden.npy")));
        let d = max_abs_diff(&hidden, &reference.data);
        assert!(d <= 1e-5, "{prompt}: final hidden max |Δ| {d}");
    }
}

/// Every decoder layer's output (the four streams) for p7 against transformers' `layer_out`.
#[test]
fn f16_layer_outputs_match_transformers() {
    let Some(backend) = open_model("F16") else {
        return;
    };
    let ids = prompt_ids("p7");
    let layers = backend.config.n_layer;
    let wide = backend.config.hc_count * backend.config.n_embd;
    let ours = backend.sequence().feed_layer_outputs(&ids).expect("feed");
    // Reference shape [layer, token, 4H]; ours [token, layer, 4H].
    let reference = read(&fixtures().join("refs/F32/p7.layer_out.npy"));
    assert_eq!(reference.shape, vec![layers, ids.len(), wide]);
    for layer in 0..layers {
        for t in 0..ids.len() {
            let got = &ours[(t * layers + layer) * wide..(t * layers + layer + 1) * wide];
            let want =
                &reference.data[(layer * ids.len() + t) * wide..(layer * ids.len() + t + 1) * wide];
            let d = max_abs_diff(got, want);
            assert!(d <= 1e-5, "layer {layer} token {t}: max |Δ| {d}");
        }
    }
}

/// A fresh sequence after a failed one works, and a sequence rejects a bad token with a clear error.
#[test]
fn bad_token_is_rejected_without_poisoning_the_backend() {
    let Some(backend) = open_model("F16") else {
        return;
    };
    let mut seq = Arc::clone(&backend).new_sequence().expect("sequence");
    match seq.feed(&[1, 512], false) {
        Err(EngineError::BadToken {
            id: 512,
            vocab: 512,
        }) => {}
        other => panic!("expected BadToken, got {other:?}"),
    }
    let mut fresh = Arc::clone(&backend).new_sequence().expect("sequence");
    assert_eq!(fresh.feed(&[1, 2], false).expect("feed").len(), 512);
}
