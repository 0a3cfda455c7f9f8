//! Memory tiers on the GPU backend (issue 5), on the tiny oracle model (lavapipe in CI):
//!
//! * all-position logits are byte-identical whatever the placement: every expert resident
//!   (default), a VRAM budget with room for a few experts beyond one token's top-k, the minimum
//!   (exactly top-k slots: "none beyond the dense part" is defined as the least that can run, one
//!   token's experts of one layer), `--ple-io read`, `--experts ram`; and token-by-token decode
//!   in tiered mode equals the resident prefill;
//! * the slot cache reports hits and uploads;
//! * a NaN in one PLE table row fails the request with row, token position and file offset, and
//!   the next request is served;
//! * a budget below the dense part is a clear error naming the size needed.
//!
//! Without an adapter the tests fail when `CI` is set and are skipped otherwise.

use std::path::{Path, PathBuf};
use std::sync::Arc;

mod common;
use common::{gpu_context as context, prompt_ids, run as feed_all, tiny_model as fixture};

use strata::engine::{Backend, EngineError};
use strata::gguf::Gguf;
use strata::gpu::GpuContext;
use strata::gpu::backend::{BUDGET_MAX_CHUNK, GpuBackend};
use strata::gpu::tiered::plan_for_budget;
use strata::model::config::Config;
use strata::model::config::KvType;
use strata::model::ple::{hash_rows, ngram_context};
use strata::tiers::{ExpertProfile, ExpertsArg, IoMode, PleTable, TierArgs};

const CONTEXT: usize = 512;

/// The slot path (`--experts mmap`): experts beyond the budget in VRAM slots fed from the file.
/// (The default, `auto`, reads them in place from pinned host memory where the adapter can.)
fn slot_tiers() -> TierArgs {
    TierArgs {
        experts: ExpertsArg::Mmap,
        ..TierArgs::default()
    }
}

fn open(path: &Path) -> Arc<Gguf> {
    Arc::new(Gguf::open(path).unwrap_or_else(|e| panic!("{} opens: {e}", path.display())))
}

fn load(ctx: &Arc<GpuContext>, path: &Path, tiers: &TierArgs) -> anyhow::Result<Arc<GpuBackend>> {
    Ok(Arc::new(GpuBackend::load_with(
        ctx.clone(),
        open(path),
        CONTEXT,
        tiers,
    )?))
}

/// A `--vram-budget` that leaves room for exactly `slots` expert slots, and the model's total
/// number of experts and top-k.
fn budget_for_slots(ctx: &GpuContext, path: &Path, slots: u64) -> (u64, u64, u64) {
    let gguf = open(path);
    let plan = plan_for_budget(
        ctx,
        &gguf,
        CONTEXT,
        BUDGET_MAX_CHUNK,
        u64::MAX / 4,
        KvType::F32,
    )
    .expect("plan");
    let fixed = plan.vram_total() - plan.expert_slot_bytes();
    (
        fixed + slots * plan.slot_bytes,
        plan.total_experts,
        plan.min_expert_slots,
    )
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn assert_same_bytes(label: &str, expected: &[f32], got: &[f32]) {
    assert_eq!(expected.len(), got.len(), "{label}: logits length");
    if bytes(expected) != bytes(got) {
        let first = expected
            .iter()
            .zip(got)
            .position(|(a, b)| a.to_bits() != b.to_bits())
            .unwrap_or(0);
        panic!(
            "{label}: logits differ from the all-resident run, first at element {first} ({} vs {})",
            expected[first], got[first]
        );
    }
}

#[test]
fn logits_are_bit_identical_whatever_the_placement() {
    let Some(ctx) = context() else { return };
    let path = fixture("IQ3_S");
    let prompt = prompt_ids("p64eos");
    placements_match(&ctx, &path, &prompt);
}

/// The F16 fixture too (other expert kernels, bigger slots): resident against the minimum.
#[test]
fn f16_logits_are_bit_identical_with_minimum_slots() {
    let Some(ctx) = context() else { return };
    let path = fixture("F16");
    let prompt = prompt_ids("p64eos");
    let resident = load(&ctx, &path, &TierArgs::default()).expect("resident load");
    let expected = feed_all(&resident, &prompt, prompt.len());
    let (_, _, top_k) = budget_for_slots(&ctx, &path, 0);
    let tiers = TierArgs {
        vram_budget: Some(budget_for_slots(&ctx, &path, top_k).0),
        ..slot_tiers()
    };
    let tiered = load(&ctx, &path, &tiers).expect("tiered load");
    assert_eq!(tiered.expert_slots(), Some(top_k as usize));
    assert_same_bytes("F16, minimum", &expected, &feed_all(&tiered, &prompt, 64));
    assert_same_bytes(
        "F16, minimum, decode",
        &expected,
        &feed_all(&tiered, &prompt, 1),
    );
    if !ctx.has_host_storage() {
        return;
    }
    // Pinned, with promotions (F16 experts are whole GGUF rows, not the split layout of IQ3_S:
    // the other way units are copied).
    let profile = one_layer_profile("f16");
    let pinned = TierArgs {
        vram_budget: Some(budget_for_slots(&ctx, &path, top_k + 3).0),
        experts: ExpertsArg::Pinned,
        expert_profile: Some(profile.clone()),
        ..TierArgs::default()
    };
    let moving = load(&ctx, &path, &pinned).expect("pinned load");
    moving.set_promote_every(2);
    assert_same_bytes(
        "F16, pinned, promotions",
        &expected,
        &feed_all(&moving, &prompt, 3),
    );
    let stats = moving.tier_stats().expect("stats");
    assert!(stats.promotions > 0, "F16: no promotion");
    let _ = std::fs::remove_file(&profile);
}

/// A profile whose hot experts are 0, 1 and 2 of layer 1 only (the other layers get none).
fn one_layer_profile(tag: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!(
        "strata-tiers-gpu-{tag}-profile-{}.txt",
        std::process::id()
    ));
    let mut profile = ExpertProfile::new();
    for e in 0..3 {
        profile.add(strata::tiers::ExpertKey::new(1, e), 10 - u64::from(e));
    }
    profile.save(&path).expect("profile");
    path
}

fn placements_match(ctx: &Arc<GpuContext>, path: &Path, prompt: &[u32]) {
    let resident = load(ctx, path, &TierArgs::default()).expect("resident load");
    assert_eq!(
        resident.expert_slots(),
        None,
        "default keeps every expert resident"
    );
    let expected = feed_all(&resident, prompt, prompt.len());
    assert!(!expected.is_empty());

    let (_, total, top_k) = budget_for_slots(ctx, path, 0);
    let few = (top_k + 3).min(total - 1);
    println!("tiny model: {total} routed experts, top-{top_k}; few = {few} slots");
    let cases: Vec<(&str, TierArgs, Option<u64>)> = vec![
        (
            "budget for a few experts",
            TierArgs {
                vram_budget: Some(budget_for_slots(ctx, path, few).0),
                ..slot_tiers()
            },
            Some(few),
        ),
        (
            "minimum budget (top-k slots)",
            TierArgs {
                vram_budget: Some(budget_for_slots(ctx, path, top_k).0),
                ..slot_tiers()
            },
            Some(top_k),
        ),
        (
            "--ple-io read, all resident",
            TierArgs {
                ple_io: IoMode::Read,
                ..slot_tiers()
            },
            None,
        ),
        (
            "--experts ram, few slots",
            TierArgs {
                vram_budget: Some(budget_for_slots(ctx, path, few).0),
                experts: ExpertsArg::Ram,
                ..slot_tiers()
            },
            Some(few),
        ),
        (
            "--experts ram, --ple-io read, minimum, no PLE row cache",
            TierArgs {
                vram_budget: Some(budget_for_slots(ctx, path, top_k).0),
                experts: ExpertsArg::Ram,
                ple_io: IoMode::Read,
                ple_row_cache: 0,
                ..slot_tiers()
            },
            Some(top_k),
        ),
    ];
    for (label, tiers, slots) in cases {
        let backend = load(ctx, path, &tiers).unwrap_or_else(|e| panic!("{label}: {e:#}"));
        assert_eq!(backend.expert_slots(), slots.map(|s| s as usize), "{label}");
        let got = feed_all(&backend, prompt, prompt.len());
        assert_same_bytes(label, &expected, &got);
        if slots.is_some() {
            let stats = backend.tier_stats().expect("tier stats");
            println!(
                "{label}: hit rate {:.3}, {} hits, {} misses, {} bytes uploaded, {} extra \
                 sub-batches",
                stats.hit_rate(),
                stats.hits,
                stats.misses,
                stats.bytes_uploaded,
                stats.extra_sub_batches
            );
            assert!(stats.hits > 0, "{label}: no slot hits");
            assert!(
                stats.misses > 0 && stats.bytes_uploaded > 0,
                "{label}: no uploads"
            );
            assert!(stats.hit_rate() > 0.0 && stats.hit_rate() < 1.0, "{label}");
        }
    }

    // Tiered decode, token by token and in odd chunks, with the fewest slots.
    let tiers = TierArgs {
        vram_budget: Some(budget_for_slots(ctx, path, top_k).0),
        ..slot_tiers()
    };
    let tiered = load(ctx, path, &tiers).expect("tiered load");
    assert_same_bytes(
        "minimum budget, one token per feed",
        &expected,
        &feed_all(&tiered, prompt, 1),
    );
    assert_same_bytes(
        "minimum budget, chunks of 7",
        &expected,
        &feed_all(&tiered, prompt, 7),
    );
    let stats = tiered.tier_stats().expect("stats");
    assert!(
        stats.extra_sub_batches > 0,
        "a prefill chunk with top-k slots must be split into sub-batches"
    );
}

/// `--expert-profile FILE` naming a missing file: the observed routing is written there when the
/// backend is dropped; loading with it preloads the hottest experts, with the same logits.
#[test]
fn expert_profile_is_written_and_preloads_the_same_bits() {
    let Some(ctx) = context() else { return };
    let path = fixture("IQ3_S");
    let prompt = prompt_ids("p64eos");
    let profile_path = std::env::temp_dir().join(format!(
        "strata-tiers-gpu-profile-{}.txt",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&profile_path);
    let (budget, _, top_k) = budget_for_slots(&ctx, &path, 6);
    let tiers = TierArgs {
        vram_budget: Some(budget),
        expert_profile: Some(profile_path.clone()),
        ..slot_tiers()
    };
    let first = load(&ctx, &path, &tiers).expect("load");
    let expected = feed_all(&first, &prompt, prompt.len());
    let observed = first.observed_expert_profile().expect("tiered");
    drop(first);
    let saved = ExpertProfile::load(&profile_path).expect("profile written at drop");
    assert_eq!(saved, observed);
    assert!(saved.len() >= top_k as usize, "routing was recorded");

    // With the profile (which now exists) and the stage checks on: same bits.
    let mut second =
        GpuBackend::load_with(ctx.clone(), open(&path), CONTEXT, &tiers).expect("load");
    second.set_check_stages(true);
    let second = Arc::new(second);
    let stats = second.tier_stats().expect("stats");
    assert_eq!(stats.preloaded, 6, "the profile fills every slot");
    assert_same_bytes(
        "profile preload, stage checks",
        &expected,
        &feed_all(&second, &prompt, 16),
    );
    drop(second);
    // An existing profile is not overwritten.
    assert_eq!(ExpertProfile::load(&profile_path).expect("profile"), saved);
    let _ = std::fs::remove_file(&profile_path);
}

#[test]
fn corrupted_ple_row_fails_the_request_and_the_next_is_served() {
    let Some(ctx) = context() else { return };
    let path = fixture("IQ3_S");
    let gguf = open(&path);
    let config = Config::from_gguf(&gguf).expect("config");
    let pc = config.ple.clone().expect("the tiny model has PLE");
    let table = PleTable::from_gguf(&gguf).expect("PLE table");
    let prompt = prompt_ids("p64eos");
    let rows_of = |position: usize| {
        hash_rows(
            &pc,
            &ngram_context(&prompt[..=position], pc.ngram_size, pc.eos_token_id),
        )
    };
    // Corrupt a row first used at position 5 (not by positions 0..5).
    let bad_position = 5;
    let earlier: Vec<u64> = (0..bad_position).flat_map(rows_of).collect();
    let bad_row = rows_of(bad_position)
        .into_iter()
        .find(|r| !earlier.contains(r))
        .expect("position 5 has a row of its own");
    let offset = table.row_offset(bad_row);
    let mut file = std::fs::read(&path).expect("fixture bytes");
    let at = offset as usize;
    // Every block type starts with its scale; a NaN there (f16 0x7E00, or f32 for F32 tables).
    match table.ty.type_size() {
        4 if table.ty.block_size() == 1 => {
            file[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes())
        }
        _ => file[at..at + 2].copy_from_slice(&0x7E00u16.to_le_bytes()),
    }
    let bad_path = std::env::temp_dir().join(format!(
        "strata-tiers-gpu-badple-{}.gguf",
        std::process::id()
    ));
    std::fs::write(&bad_path, &file).expect("write corrupted copy");
    drop(gguf);

    for ple_io in [IoMode::Mmap, IoMode::Read] {
        let tiers = TierArgs {
            ple_io,
            ..slot_tiers()
        };
        let backend = load(&ctx, &bad_path, &tiers).expect("a bad row is found when used");
        let mut seq = Arc::clone(&backend).new_sequence().expect("sequence");
        let err = seq
            .feed(&prompt[..bad_position + 3], true)
            .expect_err("the corrupted row must fail the request");
        let message = err.to_string();
        println!("{ple_io:?}: {message}");
        assert!(
            matches!(&err, EngineError::NonFinite { position, .. } if *position == bad_position),
            "{message}"
        );
        for needle in [
            format!("row {bad_row}"),
            format!("offset {offset}"),
            format!("position {bad_position}"),
        ] {
            assert!(
                message.contains(&needle),
                "{needle:?} missing in: {message}"
            );
        }
        // The next request (not touching the bad row) is served, and equals a clean model's.
        let mut next = Arc::clone(&backend).new_sequence().expect("next sequence");
        let logits = next
            .feed(&prompt[..bad_position], true)
            .expect("the next request is served");
        let clean = load(&ctx, &path, &tiers).expect("clean load");
        assert_same_bytes(
            "after a bad row",
            &feed_all(&clean, &prompt[..bad_position], bad_position),
            &logits,
        );
    }
    let _ = std::fs::remove_file(&bad_path);
}

#[test]
fn budget_below_the_dense_part_is_a_clear_error() {
    let Some(ctx) = context() else { return };
    let path = fixture("IQ3_S");
    let (minimum, _, top_k) = budget_for_slots(&ctx, &path, 0);
    let needed = minimum
        + top_k * {
            let (one, _, _) = budget_for_slots(&ctx, &path, 1);
            one - minimum
        };
    let tiers = TierArgs {
        vram_budget: Some(minimum / 2),
        ..slot_tiers()
    };
    let err = load(&ctx, &path, &tiers)
        .err()
        .expect("a budget below the dense part must fail");
    let message = format!("{err:#}");
    println!("{message}");
    assert!(message.contains("does not fit"), "{message}");
    assert!(message.contains("--vram-budget"), "{message}");
    assert!(
        message.contains(&strata::tiers::format_size(needed)),
        "the needed size {needed} is named: {message}"
    );
    // One byte short of the minimum fails too; the minimum itself loads.
    let short = TierArgs {
        vram_budget: Some(needed - 1),
        ..slot_tiers()
    };
    assert!(load(&ctx, &path, &short).is_err());
    let exact = TierArgs {
        vram_budget: Some(needed),
        ..slot_tiers()
    };
    let backend = load(&ctx, &path, &exact).expect("the minimum budget loads");
    assert_eq!(backend.expert_slots(), Some(top_k as usize));
}

/// `--experts pinned` (and `auto`, which picks it where the adapter reads host memory): every
/// expert in host memory (read in place, or through the decode stage for a step of one token),
/// the hot ones copied into VRAM — the same bits as all
/// resident, in one chunk, token by token and in odd chunks, with hot copies in every layer, in
/// one layer only (a profile), or none.
#[test]
fn pinned_experts_give_the_same_bits() {
    let Some(ctx) = context() else { return };
    let path = fixture("IQ3_S");
    let prompt = prompt_ids("p64eos");
    let resident = load(&ctx, &path, &TierArgs::default()).expect("resident load");
    let expected = feed_all(&resident, &prompt, prompt.len());
    assert_eq!(resident.pinned_expert_bytes(), 0);
    let (_, total, top_k) = budget_for_slots(&ctx, &path, 0);
    let few = (top_k + 3).min(total - 1);
    let budget = budget_for_slots(&ctx, &path, few).0;
    if !ctx.has_host_storage() {
        let auto = TierArgs {
            vram_budget: Some(budget),
            ..TierArgs::default()
        };
        let backend = load(&ctx, &path, &auto).expect("auto falls back to slots");
        assert!(backend.expert_slots().is_some());
        println!("SKIPPED pinned cases: the adapter cannot read host memory");
        return;
    }
    let one_layer = one_layer_profile("pinned");
    let pinned = |budget: u64, profile: Option<PathBuf>| TierArgs {
        vram_budget: Some(budget),
        experts: ExpertsArg::Pinned,
        expert_profile: profile,
        ..TierArgs::default()
    };
    let cases = [
        (
            "auto, hot copies in every layer",
            TierArgs {
                vram_budget: Some(budget),
                ..TierArgs::default()
            },
            None,
        ),
        (
            "pinned, hot copies in every layer",
            pinned(budget, None),
            None,
        ),
        (
            "pinned, hot copies in layer 1 only",
            pinned(budget, Some(one_layer.clone())),
            Some(3),
        ),
    ];
    for (label, tiers, hot_expected) in cases {
        let backend = load(&ctx, &path, &tiers).unwrap_or_else(|e| panic!("{label}: {e:#}"));
        assert_eq!(backend.expert_slots(), None, "{label}: no slots");
        assert!(backend.pinned_expert_bytes() > 0, "{label}: pinned");
        let hot = backend.hot_expert_count();
        println!("{label}: {hot} hot experts of {total}");
        match hot_expected {
            Some(n) => assert_eq!(hot, n, "{label}"),
            None => assert!(hot > 0 && hot < total as usize, "{label}: {hot} hot"),
        }
        assert_same_bytes(label, &expected, &feed_all(&backend, &prompt, prompt.len()));
        assert_same_bytes(label, &expected, &feed_all(&backend, &prompt, 1));
        assert_same_bytes(label, &expected, &feed_all(&backend, &prompt, 7));
    }
    // Promotion rounds every 2 tokens: busy experts of layer 1 move into its hot units while
    // the prompt runs, token by token and in chunks; the bits stay the same.
    for chunk in [1, 7] {
        let moving = load(&ctx, &path, &pinned(budget, Some(one_layer.clone()))).expect("load");
        moving.set_promote_every(2);
        let label = format!("pinned, promotions, chunks of {chunk}");
        assert_same_bytes(&label, &expected, &feed_all(&moving, &prompt, chunk));
        let stats = moving.tier_stats().expect("stats");
        println!(
            "{label}: {} promotions, {} bytes",
            stats.promotions, stats.bytes_uploaded
        );
        assert!(
            stats.promotions > 0 && stats.bytes_uploaded > 0,
            "{label}: no promotion"
        );
        // Once promoted, the same prompt again: still the same bits.
        assert_same_bytes(&label, &expected, &feed_all(&moving, &prompt, chunk));
    }
    let _ = std::fs::remove_file(&one_layer);

    // No hot copies: a profile naming no expert of this model (layer 99).
    let nowhere = std::env::temp_dir().join(format!(
        "strata-tiers-gpu-pinned-none-{}.txt",
        std::process::id()
    ));
    let mut empty = ExpertProfile::new();
    empty.add(strata::tiers::ExpertKey::new(99, 0), 1);
    empty.save(&nowhere).expect("profile");
    let bare = load(&ctx, &path, &pinned(budget, Some(nowhere.clone()))).expect("pinned");
    let _ = std::fs::remove_file(&nowhere);
    assert_eq!(bare.hot_expert_count(), 0);
    assert_same_bytes(
        "pinned, no hot copies",
        &expected,
        &feed_all(&bare, &prompt, 5),
    );

    // The routing is counted from the GPU's log: every item once, hits where a hot copy served
    // it; `--expert-profile` naming a missing file gets the observed routing at exit.
    let written = std::env::temp_dir().join(format!(
        "strata-tiers-gpu-pinned-written-{}.txt",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&written);
    let counted = load(&ctx, &path, &pinned(budget, Some(written.clone()))).expect("pinned");
    let _ = feed_all(&counted, &prompt, 9);
    let stats = counted.tier_stats().expect("pinned stats");
    let config = Config::from_gguf(&open(&path)).expect("config");
    let items = (prompt.len() * config.moe.n_expert_used * config.n_layer) as u64;
    assert_eq!(
        stats.hits + stats.misses,
        items,
        "every routed item counted once"
    );
    assert!(
        stats.hits > 0 && stats.misses > 0,
        "{} hits, {} misses",
        stats.hits,
        stats.misses
    );
    let observed = counted.observed_expert_profile().expect("observed");
    drop(counted);
    assert_eq!(
        ExpertProfile::load(&written).expect("written at exit"),
        observed
    );
    let _ = std::fs::remove_file(&written);

    // A --ram-budget below the experts: `pinned` is refused with the reason, `auto` uses slots.
    let short_ram = TierArgs {
        ram_budget: Some(1024),
        ..pinned(budget, None)
    };
    let err = load(&ctx, &path, &short_ram)
        .err()
        .expect("pinned over the RAM budget fails");
    let message = format!("{err:#}");
    assert!(
        message.contains("--ram-budget") && message.contains("--experts mmap"),
        "{message}"
    );
    let auto_short = TierArgs {
        experts: ExpertsArg::Auto,
        ..short_ram
    };
    let backend = load(&ctx, &path, &auto_short).expect("auto falls back to slots");
    assert!(backend.expert_slots().is_some() && backend.pinned_expert_bytes() == 0);
    assert_same_bytes(
        "auto, slots",
        &expected,
        &feed_all(&backend, &prompt, prompt.len()),
    );
}

/// Pinned experts, what is read where: the token embedding sits in host memory beside the
/// experts and the VRAM plan no longer counts it, so the budget's hot copies gain its bytes (less
/// the decode stage's); a decode step whose layer reads some items from hot copies and the rest
/// from the stage the host tensors' bytes are copied into
/// (the two gate|up dispatches writing separate buffers, back to back), and a grouped prefill
/// chunk doing the same, give the same bits as all resident.
#[test]
fn pinned_embedding_in_host_and_split_steps_give_the_same_bits() {
    let Some(ctx) = context() else { return };
    if !ctx.has_host_storage() {
        println!("SKIPPED: the adapter cannot read host memory");
        return;
    }
    let path = fixture("IQ3_S");
    let prompt = prompt_ids("p64eos");
    let resident = load(&ctx, &path, &TierArgs::default()).expect("resident load");
    let expected = feed_all(&resident, &prompt, prompt.len());
    let (_, total, top_k) = budget_for_slots(&ctx, &path, 0);
    let budget = budget_for_slots(&ctx, &path, (top_k + 3).min(total - 1)).0;
    let tiers = TierArgs {
        vram_budget: Some(budget),
        experts: ExpertsArg::Pinned,
        ..TierArgs::default()
    };
    let backend = load(&ctx, &path, &tiers).expect("pinned load");
    assert!(backend.pinned_expert_bytes() > 0);

    // The plan: the embedding left out of the dense weights, its VRAM given to hot copies.
    let plan = backend.memory_plan().expect("plan");
    let embedding = "token_embd.weight";
    assert!(
        plan.dense.iter().all(|d| d.name != embedding),
        "the embedding is not planned in VRAM"
    );
    let gguf = open(&path);
    let counted = plan_for_budget(
        &ctx,
        &gguf,
        CONTEXT,
        backend.max_chunk(),
        budget,
        KvType::F32,
    )
    .expect("the plan with the embedding in VRAM");
    let embd = counted
        .dense
        .iter()
        .find(|d| d.name == embedding)
        .expect("the embedding is a dense tensor")
        .vram_bytes;
    assert_eq!(plan.dense_bytes + embd, counted.dense_bytes);
    let fixed = counted.vram_total() - counted.expert_slot_bytes();
    // The VRAM stage that a decode step copies its misses into is planned as working memory.
    let staged = plan.work_bytes - counted.work_bytes;
    assert!(staged > 0, "the decode stage is planned");
    let slots = ((budget - fixed + embd - staged) / plan.slot_bytes).min(total);
    assert_eq!(
        plan.expert_slots, slots,
        "hot copies fill what the embedding left"
    );
    assert!(
        plan.expert_slots * plan.slot_bytes + staged > counted.expert_slots * plan.slot_bytes,
        "the embedding's VRAM went to hot copies and the stage"
    );
    assert!(plan.vram_total() <= budget);
    let hot = backend.hot_expert_count() as u64;
    println!(
        "pinned: {hot} hot experts of {total} (with the embedding in VRAM: {})",
        counted.expert_slots
    );
    assert!(hot == plan.expert_slots && hot < total, "{hot} hot");
    assert_eq!(
        backend.expert_stage_units(),
        Some(top_k as usize),
        "a decode step's misses go through the stage"
    );

    // Decode steps: count those where some layer read from both sources.
    let mut seq = Arc::clone(&backend).new_sequence().expect("sequence");
    let per_layer = |b: &Arc<GpuBackend>| b.tier_stats().expect("pinned stats").per_layer;
    let mut before = per_layer(&backend);
    let (mut got, mut split_steps) = (Vec::new(), 0);
    for &id in &prompt {
        got.extend(seq.feed(&[id], true).expect("feed"));
        let now = per_layer(&backend);
        if now.iter().zip(&before).any(|(n, b)| n.0 > b.0 && n.1 > b.1) {
            split_steps += 1;
        }
        before = now;
    }
    println!(
        "{split_steps} of {} decode steps split a layer",
        prompt.len()
    );
    assert!(split_steps > 0, "no decode step read from both sources");
    assert_same_bytes("pinned, decode steps", &expected, &got);

    // One grouped prefill chunk of the whole prompt, hot and host sources in one layer.
    let before = per_layer(&backend);
    let got = feed_all(&backend, &prompt, prompt.len());
    let now = per_layer(&backend);
    assert!(
        now.iter().zip(&before).any(|(n, b)| n.0 > b.0 && n.1 > b.1),
        "the chunk read from both sources in some layer"
    );
    assert_same_bytes("pinned, one chunk", &expected, &got);
}
