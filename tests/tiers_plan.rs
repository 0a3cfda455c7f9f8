//! The VRAM planner on the tiny fixture (sizes worked out by hand from its header) and on a
//! synthetic model with the real model's widths (header-only metadata plus a tensor list, since
//! the real 84 GB of data cannot be written).

use strata::gguf::{GgmlType, Gguf, GgufWriter, TensorInfo, Value};
use strata::model::Config;
use strata::tiers::{
    BudgetError, DEFAULT_VRAM_RESERVE, MemoryPlan, PlanError, PlanLimits, resolve_vram_budget,
};

const TINY: &str = "tests/fixtures/tiny/tiny-IQ3_S.gguf";

fn tiny() -> Gguf {
    Gguf::open(TINY).expect("tiny fixture")
}

fn big_budget() -> u64 {
    1 << 30
}

/// Tiny model (oracle README): 3 GDN layers (conv kernel 4, 2×64 key + 4×64 value dims), 1 QSA
/// layer (2 KV heads × 64, indexer dim 32), hc 4 × hidden 256, PLE conv kernel 4 dilation 3,
/// 4 layers × 8 experts of gate/up IQ3_S [256, 96] and down IQ4_NL [96, 256].
#[test]
fn tiny_model_sizes_match_hand_computation() {
    let gguf = tiny();
    let plan =
        MemoryPlan::compute(&gguf, 1000, big_budget(), &PlanLimits::default()).expect("plan");

    // Expert slot: 10560 (gate) → 10752 aligned, + 10560 (up) → 21504, + 13824 (down) = 35328.
    assert_eq!(plan.slot_bytes, 35_328);
    assert_eq!(plan.expert_layers.len(), 4);
    for layer in &plan.expert_layers {
        assert_eq!(layer.n_experts, 8);
        assert_eq!(layer.bytes_per_expert, 10_560 + 10_560 + 13_824);
        assert_eq!(layer.part_offsets, [0, 10_752, 21_504]);
    }
    assert_eq!(plan.total_experts, 32);
    assert_eq!(plan.min_expert_slots, 4);
    assert_eq!(plan.host_expert_bytes, 4 * (84_480 * 2 + 110_592));
    // Budget is plenty: every expert gets a slot.
    assert_eq!(plan.expert_slots, 32);

    // KV: 1 layer × (2 heads × 64 × (K, V) + 32 indexer) f32 per token.
    assert_eq!(plan.kv_layers, 1);
    assert_eq!(plan.kv_bytes_per_token, 288 * 4);
    assert_eq!(plan.kv_bytes, (1152u64 * 1000).next_multiple_of(256));
    // State: 3 × (3 × 512 conv + 4 × 64 × 64 SSM) + 9 × 1024 PLE conv values, f32.
    assert_eq!(
        plan.state_bytes,
        (3 * (3 * 512 + 4 * 64 * 64) + 9 * 1024) * 4
    );

    // Dense: every tensor but experts and the PLE table, each in one buffer rounded to 256.
    let dense: Vec<&TensorInfo> = gguf
        .tensors()
        .iter()
        .filter(|t| !t.name.contains("_exps.") && t.name != "per_layer_token_embd.weight")
        .collect();
    assert_eq!(plan.dense.len(), dense.len());
    assert_eq!(plan.dense.len(), gguf.tensors().len() - 12 - 1);
    let dense_bytes: u64 = dense.iter().map(|t| t.n_bytes.next_multiple_of(256)).sum();
    assert_eq!(plan.dense_bytes, dense_bytes);
    assert!(plan.dense.iter().all(|d| d.buffers == 1));

    let ple = plan.ple_table.as_ref().expect("PLE table");
    assert_eq!(
        (ple.n_rows, ple.row_bytes, ple.n_bytes),
        (8320, 18, 149_760)
    );

    assert!(plan.vram_total() <= plan.vram_budget);
    let text = plan.to_string();
    for needle in ["expert slots", "32 of 32 experts", "PLE table", "8320 rows"] {
        assert!(text.contains(needle), "{text}");
    }
}

#[test]
fn slots_fill_exactly_what_is_left_and_too_small_budgets_say_what_is_needed() {
    let gguf = tiny();
    let limits = PlanLimits {
        work_bytes: Some(1 << 20),
        ..PlanLimits::default()
    };
    let plan = MemoryPlan::compute(&gguf, 512, big_budget(), &limits).expect("plan");
    assert_eq!(plan.work_bytes, 1 << 20);
    assert!(!plan.work_estimated);
    let fixed = plan.dense_bytes + plan.kv_bytes + plan.state_bytes + plan.work_bytes;

    for slots in [4u64, 5, 10, 31] {
        let budget = fixed + slots * plan.slot_bytes + 100;
        let p = MemoryPlan::compute(&gguf, 512, budget, &limits).expect("fits");
        assert_eq!(p.expert_slots, slots);
        assert_eq!(p.vram_unused(), 100);
        assert_eq!(p.vram_total(), budget - 100);
    }
    // More budget than experts: capped at all 32.
    let p = MemoryPlan::compute(&gguf, 512, fixed + 40 * plan.slot_bytes, &limits).expect("fits");
    assert_eq!(p.expert_slots, 32);

    // One byte short of the dense part plus one layer's experts.
    let needed = fixed + 4 * plan.slot_bytes;
    let err = MemoryPlan::compute(&gguf, 512, needed - 1, &limits).unwrap_err();
    match &err {
        PlanError::DoesNotFit {
            needed: n, budget, ..
        } => {
            assert_eq!(*n, needed);
            assert_eq!(*budget, needed - 1);
        }
        other => panic!("unexpected {other}"),
    }
    let message = err.to_string();
    assert!(
        message.contains("needs at least") && message.contains("KV cache for 512 tokens"),
        "{message}"
    );
    // A longer context needs more.
    let longer = MemoryPlan::compute(&gguf, 4096, big_budget(), &limits).expect("plan");
    assert_eq!(longer.kv_bytes - plan.kv_bytes, (4096 - 512) * 1152);
}

#[test]
fn tensors_and_slots_are_split_to_the_binding_limit() {
    let gguf = tiny();
    let limits = PlanLimits {
        max_binding_bytes: 64 << 10,
        ..PlanLimits::default()
    };
    let plan = MemoryPlan::compute(&gguf, 64, big_budget(), &limits).expect("plan");
    // output.weight: Q6_K [256, 512], 210-byte rows, 107520 bytes → 312 rows per 64 KiB buffer.
    let output = plan
        .dense
        .iter()
        .find(|d| d.name == "output.weight")
        .expect("output");
    assert_eq!((output.rows_per_buffer, output.buffers), (312, 2));
    assert_eq!(
        output.vram_bytes,
        65_536 + (200 * 210u64).next_multiple_of(256)
    );
    assert!(
        plan.dense
            .iter()
            .all(|d| d.n_bytes.div_ceil(d.buffers as u64) <= 64 << 10)
    );
    // One 35328-byte slot per 64 KiB buffer.
    assert_eq!(plan.slots_per_buffer, 1);
    assert_eq!(plan.slot_buffers, plan.expert_slots);
    assert_eq!(plan.slots_in_buffer(0), 1);
    assert_eq!(plan.slots_in_buffer(plan.slot_buffers), 0);

    let err = MemoryPlan::compute(
        &gguf,
        64,
        big_budget(),
        &PlanLimits {
            max_binding_bytes: 30_000,
            ..PlanLimits::default()
        },
    )
    .unwrap_err();
    assert!(matches!(err, PlanError::SlotTooBig { .. }), "{err}");
    let err = MemoryPlan::compute(
        &gguf,
        64,
        big_budget(),
        &PlanLimits {
            max_binding_bytes: 100,
            ..PlanLimits::default()
        },
    )
    .unwrap_err();
    assert!(matches!(err, PlanError::RowTooBig { .. }), "{err}");
}

// ---------------------------------------------------------------------------------------------
// The real model's widths.

fn u32v(v: u32) -> Value {
    Value::U32(v)
}

fn u64_array(values: &[u64]) -> Value {
    Value::Array(values.iter().map(|&v| Value::U64(v)).collect())
}

fn real_config() -> Config {
    let mut w = GgufWriter::new();
    let k = |name: &str| format!("qwen4exp.{name}");
    w.add_metadata("general.architecture", Value::String("qwen4exp".into()));
    for (name, value) in [
        ("block_count", 48),
        ("vocab_size", 248_320),
        ("context_length", 262_144),
        ("embedding_length", 2560),
        ("attention.head_count", 24),
        ("attention.head_count_kv", 2),
        ("attention.key_length", 256),
        ("attention.value_length", 256),
        ("rope.dimension_count", 64),
        ("full_attention_interval", 4),
        ("ssm.group_count", 16),
        ("ssm.time_step_rank", 48),
        ("ssm.state_size", 128),
        ("ssm.inner_size", 6144),
        ("ssm.conv_kernel", 4),
        ("expert_count", 512),
        ("expert_used_count", 10),
        ("expert_feed_forward_length", 640),
        ("expert_shared_feed_forward_length", 640),
        ("hyper_connection.count", 4),
        ("hyper_connection.low_rank", 320),
        ("attention.indexer.head_count", 4),
        ("attention.indexer.key_length", 128),
        ("attention.indexer.top_k", 2048),
        ("ple.ngram_size", 3),
        ("ple.heads_per_ngram", 8),
        ("ple.conv_kernel", 4),
        ("ple.eos_token_id", 248_044),
        ("embedding_length_per_layer_input", 160),
    ] {
        w.add_metadata(k(name), u32v(value));
    }
    w.add_metadata(k("attention.layer_norm_rms_epsilon"), Value::F32(1e-6));
    w.add_metadata(
        k("attention.compress_ratios"),
        Value::Array(
            (0..48)
                .map(|i| Value::I32(if (i + 1) % 4 == 0 { 4 } else { 0 }))
                .collect(),
        ),
    );
    w.add_metadata(k("ple.layers"), Value::Array(vec![Value::I32(1)]));
    w.add_metadata(
        k("ple.layer_multipliers"),
        u64_array(&[23_703_573_157_769, 20_109_073_645_365, 8_052_911_324_071]),
    );
    let sizes: [u64; 16] = [
        20000003, 20000023, 20000033, 20000047, 20000059, 20000063, 20000069, 20000077, 20000081,
        20000093, 20000107, 20000147, 20000153, 20000159, 20000161, 20000171,
    ];
    let offsets: Vec<u64> = sizes
        .iter()
        .scan(0u64, |acc, &s| {
            let o = *acc;
            *acc += s;
            Some(o)
        })
        .collect();
    w.add_metadata(k("ple.head_offsets"), u64_array(&offsets));
    w.add_metadata(k("ple.head_vocab_sizes"), u64_array(&sizes));
    let gguf = Gguf::from_vec("real-widths", w.to_bytes()).expect("header-only GGUF");
    Config::from_gguf(&gguf).expect("real config")
}

fn tensor(name: String, dims: &[u64], ty: GgmlType) -> TensorInfo {
    let rows: u64 = dims[1..].iter().product();
    TensorInfo {
        name,
        dims: dims.to_vec(),
        ty,
        shard: 0,
        offset: 0,
        n_bytes: ty.row_bytes(dims[0]).expect("whole blocks") * rows,
    }
}

/// The IQ3_S file's tensors (model-spec §3.2, §3.4): experts IQ3_S gate/up + IQ4_NL down, the
/// PLE table IQ4_NL, projections Q8_0, norms and small vectors F32.
fn real_tensors() -> Vec<TensorInfo> {
    use GgmlType::*;
    let mut t = vec![
        tensor("token_embd.weight".into(), &[2560, 248_320], Q4_K),
        tensor("output.weight".into(), &[2560, 248_320], Q6_K),
        tensor("output_hc_norm.weight".into(), &[10240], F32),
        tensor("output_hc_down.weight".into(), &[10240, 320], Q8_0),
        tensor("output_hc_up.weight".into(), &[320, 10240], Q8_0),
        tensor(
            "per_layer_token_embd.weight".into(),
            &[160, 320_001_536],
            IQ4_NL,
        ),
    ];
    for l in 0..48 {
        let n = |s: &str| format!("blk.{l}.{s}");
        for hc in ["attn", "ffn"] {
            t.push(tensor(n(&format!("hc_{hc}_norm.weight")), &[10240], F32));
            t.push(tensor(
                n(&format!("hc_{hc}_down.weight")),
                &[10240, 320],
                Q8_0,
            ));
            t.push(tensor(
                n(&format!("hc_{hc}_up.weight")),
                &[320, 10240],
                Q8_0,
            ));
            t.push(tensor(
                n(&format!("hc_{hc}_inject.weight")),
                &[10240, 4],
                F32,
            ));
        }
        t.push(tensor(n("ffn_gate_inp.weight"), &[2560, 512], F32));
        t.push(tensor(n("ffn_gate_exps.weight"), &[2560, 640, 512], IQ3_S));
        t.push(tensor(n("ffn_up_exps.weight"), &[2560, 640, 512], IQ3_S));
        t.push(tensor(n("ffn_down_exps.weight"), &[640, 2560, 512], IQ4_NL));
        t.push(tensor(n("ffn_gate_inp_shexp.weight"), &[2560], F32));
        t.push(tensor(n("ffn_gate_shexp.weight"), &[2560, 640], Q8_0));
        t.push(tensor(n("ffn_up_shexp.weight"), &[2560, 640], Q8_0));
        t.push(tensor(n("ffn_down_shexp.weight"), &[640, 2560], Q8_0));
        if (l + 1) % 4 == 0 {
            t.push(tensor(n("attn_q.weight"), &[2560, 12288], Q8_0));
            t.push(tensor(n("attn_k.weight"), &[2560, 512], Q8_0));
            t.push(tensor(n("attn_v.weight"), &[2560, 512], Q8_0));
            t.push(tensor(n("attn_output.weight"), &[6144, 2560], Q8_0));
            t.push(tensor(n("attn_q_norm.weight"), &[256], F32));
            t.push(tensor(n("attn_k_norm.weight"), &[256], F32));
            t.push(tensor(n("indexer.q_proj.weight"), &[2560, 512], Q8_0));
            t.push(tensor(n("indexer.k_proj.weight"), &[2560, 128], Q8_0));
        } else {
            t.push(tensor(n("attn_qkv.weight"), &[2560, 10240], Q8_0));
            t.push(tensor(n("attn_gate.weight"), &[2560, 6144], Q8_0));
            t.push(tensor(n("ssm_beta.weight"), &[2560, 48], F32));
            t.push(tensor(n("ssm_alpha.weight"), &[2560, 48], F32));
            t.push(tensor(n("ssm_conv1d.weight"), &[4, 10240], F32));
            t.push(tensor(n("ssm_out.weight"), &[6144, 2560], Q8_0));
        }
    }
    t
}

fn h200_limits() -> PlanLimits {
    PlanLimits {
        max_binding_bytes: (2 << 30) - 4,
        ..PlanLimits::default()
    }
}

#[test]
fn real_widths_plan_a_12_gib_gpu() {
    let config = real_config();
    let tensors = real_tensors();
    let budget = 12u64 << 30;
    let plan = MemoryPlan::compute_from(&config, &tensors, 32_768, budget, &h200_limits())
        .expect("a 12 GiB GPU runs the model at 32K context");
    println!("{plan}");
    // One expert: gate and up IQ3_S [2560, 640] (704000 B each), down IQ4_NL [640, 2560] (921600 B).
    assert_eq!(plan.slot_bytes, 704_000 + 704_000 + 921_600);
    assert_eq!(plan.total_experts, 48 * 512);
    assert_eq!(plan.min_expert_slots, 10);
    // 12 QSA layers × (2 × 256 × 2 + 128) values × 4 bytes.
    assert_eq!(plan.kv_bytes_per_token, 55_296);
    assert_eq!(plan.kv_bytes, 55_296 * 32_768);
    // `--kv f16`: keys and values in 2 bytes each, the indexer keys still f32.
    let limits = PlanLimits {
        kv: strata::model::config::KvType::F16,
        ..h200_limits()
    };
    let half = MemoryPlan::compute_from(&config, &tensors, 32_768, budget, &limits)
        .expect("f16 cache plan");
    assert_eq!(half.kv_bytes_per_token, 12 * (2 * 256 * 2 * 2 + 128 * 4));
    assert_eq!(half.kv_bytes, 30_720 * 32_768);
    // 36 GDN layers × (3 × 10240 + 48 × 128 × 128) + 9 × 10240 PLE conv values, f32 (≈ 3.1 MiB per
    // GDN layer and 360 KiB for PLE, model-spec §2.11).
    assert_eq!(plan.state_bytes, (36 * 817_152 + 92_160) * 4);
    // The 28.8 GB PLE table and the experts are not dense.
    let ple = plan.ple_table.as_ref().expect("PLE");
    assert_eq!(ple.n_bytes, 28_800_138_240);
    let dense_expected: u64 = tensors
        .iter()
        .filter(|t| !t.name.contains("_exps.") && !t.name.starts_with("per_layer"))
        .map(|t| t.n_bytes.next_multiple_of(256))
        .sum();
    assert_eq!(plan.dense_bytes, dense_expected);
    assert_eq!(plan.dense.len(), tensors.len() - 48 * 3 - 1);
    assert_eq!(plan.host_expert_bytes, 48 * 512 * plan.slot_bytes);

    let fixed = plan.dense_bytes + plan.kv_bytes + plan.state_bytes + plan.work_bytes;
    assert_eq!(plan.expert_slots, (budget - fixed) / plan.slot_bytes);
    assert!(plan.vram_total() <= budget);
    assert!(budget - plan.vram_total() < plan.slot_bytes);
    assert!(
        (1000..5000).contains(&plan.expert_slots),
        "{} slots:\n{plan}",
        plan.expert_slots
    );
    // 2 GiB bindings hold 921 slots each.
    assert_eq!(plan.slots_per_buffer, ((2u64 << 30) - 4) / 2_329_600);
    assert_eq!(
        plan.slot_buffers,
        plan.expert_slots.div_ceil(plan.slots_per_buffer)
    );
    let in_buffers: u64 = (0..plan.slot_buffers)
        .map(|b| plan.slots_in_buffer(b))
        .sum();
    assert_eq!(in_buffers, plan.expert_slots);

    // More VRAM → more slots, about 460 per extra GiB at 2.33 MB per expert.
    let bigger = MemoryPlan::compute_from(
        &config,
        &tensors,
        32_768,
        budget + (1 << 30),
        &h200_limits(),
    )
    .expect("plan");
    assert!((460..=461).contains(&(bigger.expert_slots - plan.expert_slots)));
}

#[test]
fn real_widths_too_long_a_context_is_refused_with_the_needed_size() {
    let config = real_config();
    let tensors = real_tensors();
    // 262144 tokens of f32 KV alone are 14.5 GB.
    let err =
        MemoryPlan::compute_from(&config, &tensors, 262_144, 12 << 30, &h200_limits()).unwrap_err();
    let PlanError::DoesNotFit { needed, budget, .. } = &err else {
        panic!("unexpected {err}");
    };
    assert_eq!(*budget, 12 << 30);
    assert!(*needed > 55_296 * 262_144, "{needed}");
    let message = err.to_string();
    assert!(
        message.contains("--vram-budget") && message.contains("GiB"),
        "{message}"
    );
}

#[test]
fn real_widths_big_tensors_split_under_lavapipe_limits() {
    let config = real_config();
    let tensors = real_tensors();
    let plan = MemoryPlan::compute_from(&config, &tensors, 4096, 24 << 30, &PlanLimits::default())
        .expect("plan");
    // token_embd Q4_K: 1440-byte rows, 357.6 MB → 93206 rows per 128 MiB buffer → 3 buffers.
    let embd = plan
        .dense
        .iter()
        .find(|d| d.name == "token_embd.weight")
        .expect("token_embd");
    assert_eq!(embd.rows_per_buffer, (128 << 20) / 1440);
    assert_eq!(embd.buffers, 3);
    for d in &plan.dense {
        if d.buffers == 1 {
            assert!(d.n_bytes <= 128 << 20, "{}", d.name);
        } else {
            assert!(d.rows_per_buffer * d.row_bytes <= 128 << 20, "{}", d.name);
            assert_eq!(
                d.n_bytes.div_ceil(d.rows_per_buffer * d.row_bytes),
                d.buffers as u64
            );
        }
    }
    assert_eq!(plan.slots_per_buffer, (128 << 20) / 2_329_600);
    assert!(plan.buffer_count() > plan.dense.len() as u64);
}

#[test]
fn the_budget_is_the_flag_or_free_memory_minus_the_reserve() {
    assert_eq!(
        resolve_vram_budget(Some(12 << 30), Some(1 << 30)),
        Ok(12 << 30)
    );
    assert_eq!(
        resolve_vram_budget(None, Some(24 << 30)),
        Ok((24 << 30) - DEFAULT_VRAM_RESERVE)
    );
    assert_eq!(resolve_vram_budget(None, None), Err(BudgetError::Unknown));
    assert_eq!(
        resolve_vram_budget(None, Some(DEFAULT_VRAM_RESERVE)),
        Err(BudgetError::TooLittleFree {
            free: DEFAULT_VRAM_RESERVE,
            reserve: DEFAULT_VRAM_RESERVE
        })
    );
    assert!(
        BudgetError::Unknown.to_string().contains("--vram-budget"),
        "the error says what to do"
    );
}

#[test]
fn plan_sizes_feed_the_slot_cache() {
    let plan =
        MemoryPlan::compute(&tiny(), 64, big_budget(), &PlanLimits::default()).expect("plan");
    assert_eq!(plan.expert_bytes_per_layer(), vec![34_944; 4]);
}
