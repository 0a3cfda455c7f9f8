//! Loading: weights uploaded block by block, the VRAM budget and plan, the expert tier.

use super::*;
use crate::gpu::buffers::Placement;
use crate::tiers::{DEFAULT_VRAM_RESERVE, ExpertsArg, PleTable, resolve_vram_budget};

pub(super) fn upload(ctx: &GpuContext, m: &QuantMatrix) -> Result<GpuWeight, GpuError> {
    upload_placed(ctx, m, Placement::Vram)
}

/// [`upload`] into memory of `placement`.
pub(super) fn upload_placed(
    ctx: &GpuContext,
    m: &QuantMatrix,
    placement: Placement,
) -> Result<GpuWeight, GpuError> {
    let shape = (m.ty, m.cols, m.rows, 1);
    GpuWeight::upload_in(ctx, m.name(), shape, m.bytes(), None, placement)
}

/// Stack experts into one tensor; each unit is expert e's rows of every list in `lists`, in
/// order (gate then up rows for the fused gate-up projection).
pub(super) fn upload_experts(
    ctx: &GpuContext,
    name: &str,
    lists: &[&[QuantMatrix]],
    placement: Placement,
) -> Result<GpuWeight, GpuError> {
    let all: Vec<u32> = (0..lists.first().map_or(0, |l| l.len()) as u32).collect();
    upload_expert_units(ctx, name, lists, &all, placement)
}

/// [`upload_experts`] of the experts `units` only, as units 0, 1, … in that order.
pub(super) fn upload_expert_units(
    ctx: &GpuContext,
    name: &str,
    lists: &[&[QuantMatrix]],
    units: &[u32],
    placement: Placement,
) -> Result<GpuWeight, GpuError> {
    let Some(first) = lists.first().and_then(|l| l.first()) else {
        return Err(GpuError::BadArgs(format!("{name}: no experts")));
    };
    let n = units.len();
    let mut pieces: Vec<&[u8]> = Vec::with_capacity(n * lists.len());
    for &e in units {
        let e = e as usize;
        for list in lists {
            let Some(m) = list.get(e) else {
                return Err(GpuError::BadArgs(format!(
                    "{name}: expert lists differ in length"
                )));
            };
            if m.ty != first.ty || m.rows != first.rows || m.cols != first.cols {
                return Err(GpuError::BadArgs(format!(
                    "{name}: experts differ in shape or type"
                )));
            }
            pieces.push(m.bytes());
        }
    }
    let unit_rows = first.rows * lists.len();
    let shape = (first.ty, first.cols, unit_rows * n, unit_rows);
    GpuWeight::upload_pieces(ctx, name, shape, &pieces, None, placement)
}

/// Whether expert gate and up can share one tensor (same type and shape).
pub(super) fn gate_up_joinable(gate: &[QuantMatrix], up: &[QuantMatrix]) -> bool {
    match (gate.first(), up.first()) {
        (Some(g), Some(u)) => g.ty == u.ty && g.rows == u.rows && g.cols == u.cols,
        _ => false,
    }
}

/// The checked PLE row reader of a model on disk (`--ple-io`, `--ple-row-cache`; `None` for a
/// model without a PLE table or held in memory, the built-in demo), and what `--ram-budget`
/// leaves for the expert copy once the reader's row cache is counted
/// ([`TierArgs::split_ram_budget`]: the cache's row count is lowered to fit).
pub(super) fn open_ple_reader(
    gguf: &Gguf,
    tiers: &TierArgs,
) -> anyhow::Result<(Option<PleRowReader>, Option<u64>)> {
    let Some(tensor) = gguf.tensor(crate::tiers::plan::PLE_TABLE_TENSOR) else {
        return Ok((None, tiers.ram_budget));
    };
    let on_disk = gguf
        .shard_paths()
        .get(tensor.shard)
        .is_some_and(|p| !p.as_os_str().is_empty());
    if !on_disk {
        return Ok((None, tiers.ram_budget));
    }
    let mut options = tiers.ple_reader_options();
    let mut expert_budget = tiers.ram_budget;
    let table = PleTable::from_gguf(gguf)?;
    if tiers.ram_budget.is_some() {
        let (rows, rest) = tiers.split_ram_budget(table.row_bytes, table.n_rows);
        let all = usize::try_from(table.n_rows).unwrap_or(usize::MAX);
        if rows < options.cache_rows.min(all) {
            eprintln!(
                "PLE row cache: {rows} rows ({}) to stay within --ram-budget",
                format_size(rows as u64 * table.row_bytes as u64)
            );
        }
        options.cache_rows = rows;
        expert_budget = rest;
    }
    Ok((Some(PleRowReader::open(table, options)?), expert_budget))
}

/// The VRAM budget without `--vram-budget`: the adapter's free device memory less
/// [`DEFAULT_VRAM_RESERVE`] (`tiers::resolve_vram_budget`). `None` (every weight loaded, as the
/// printed line says) where the adapter does not report it or reports less than the reserve.
pub(super) fn default_vram_budget(ctx: &GpuContext) -> Option<u64> {
    let free = crate::gpu::memory::free_device_memory(ctx);
    match resolve_vram_budget(None, free) {
        Ok(budget) => {
            eprintln!(
                "VRAM budget: {} (the adapter reports {} free, less a reserve of {}); \
                 --vram-budget overrides it",
                format_size(budget),
                format_size(free.unwrap_or(0)),
                format_size(DEFAULT_VRAM_RESERVE)
            );
            Some(budget)
        }
        Err(e) => {
            eprintln!(
                "VRAM budget: none set ({} adapter: {e}), so every weight is loaded into VRAM",
                ctx.adapter.backend
            );
            None
        }
    }
}

/// The plan for `budget` and the prefill chunk it was made for: the largest of
/// [`LARGE_MAX_CHUNK`] and [`DEFAULT_MAX_CHUNK`] with which every expert still fits, else
/// [`BUDGET_MAX_CHUNK`] (smaller activations leave more room for expert slots). The chunk never
/// changes a result bit (prefill equals decode at any chunk size).
pub(super) fn plan_with_chunk(
    ctx: &GpuContext,
    gguf: &Gguf,
    context_length: usize,
    budget: u64,
    kv: crate::model::config::KvType,
) -> anyhow::Result<(MemoryPlan, usize)> {
    for chunk in [LARGE_MAX_CHUNK, DEFAULT_MAX_CHUNK] {
        if let Ok(plan) = plan_for_budget(ctx, gguf, context_length, chunk, budget, kv)
            && plan.expert_slots >= plan.total_experts
        {
            return Ok((plan, chunk));
        }
    }
    let plan = plan_for_budget(ctx, gguf, context_length, BUDGET_MAX_CHUNK, budget, kv)?;
    Ok((plan, BUDGET_MAX_CHUNK))
}

pub(super) fn upload_hc(ctx: &GpuContext, w: &HcWeights) -> Result<HcGpu, GpuError> {
    let down = [Src::from(&w.down)];
    let inject: Vec<Src> = w.inject.iter().map(Src::from).collect();
    let groups: Vec<&[Src]> = if inject.is_empty() {
        vec![&down]
    } else {
        vec![&down, &inject]
    };
    Ok(HcGpu {
        norm: GpuBuf::from_f32(ctx, "hc norm", &w.norm)?,
        down_inject: MultiProj::upload(ctx, w.down.name(), &groups)?,
        has_inject: !inject.is_empty(),
        up: upload(ctx, &w.up)?,
    })
}

impl GpuBackend {
    /// Load `gguf` onto the GPU `ctx`. `context` caps tokens per sequence (0 = min(model,
    /// [`DEFAULT_GPU_CONTEXT`])).
    pub fn load(
        ctx: Arc<GpuContext>,
        gguf: Arc<Gguf>,
        context: usize,
    ) -> anyhow::Result<GpuBackend> {
        Self::load_with(ctx, gguf, context, &TierArgs::default())
    }

    /// [`Self::load`] with the memory-tier options (`--vram-budget`, `--experts`, `--ple-io`, …).
    ///
    /// Without `--vram-budget` every weight is resident, as before: wgpu 30 cannot ask the adapter
    /// how much memory is free, so the default is "all in VRAM", and a failed allocation tells
    /// the user to pass a budget. With a budget the load is planned first: a clear error when even
    /// the dense part (plus one token's experts) does not fit, all-resident when every expert
    /// fits, otherwise tiered experts with as many slots as the budget leaves.
    pub fn load_with(
        ctx: Arc<GpuContext>,
        gguf: Arc<Gguf>,
        context: usize,
        tiers: &TierArgs,
    ) -> anyhow::Result<GpuBackend> {
        let mut config = Config::from_gguf(&gguf)?;
        config.kv = tiers.kv;
        let a = &config.attention;
        if let Some(why) = config.kv.unsupported_width(a.n_head_kv * a.head_dim) {
            anyhow::bail!(why);
        }
        let weights = Weights::bind(&gguf, &config, &mut |_, _| {})?;
        let context_length = if context == 0 {
            config.context_length.min(DEFAULT_GPU_CONTEXT)
        } else {
            context
        };
        let (plan, max_chunk) = match tiers.vram_budget {
            Some(budget) => {
                let (plan, chunk) = plan_with_chunk(&ctx, &gguf, context_length, budget, tiers.kv)?;
                (Some(plan), chunk)
            }
            None => match default_vram_budget(&ctx)
                .map(|budget| plan_with_chunk(&ctx, &gguf, context_length, budget, tiers.kv))
            {
                Some(Ok((plan, chunk))) => (Some(plan), chunk),
                // A budget the user did not ask for never stops a load: without a plan every
                // weight goes to VRAM, as when the adapter reports no free memory.
                Some(Err(e)) => {
                    eprintln!(
                        "VRAM budget: no plan fits the reported free memory ({e:#}); loading every weight"
                    );
                    (None, DEFAULT_MAX_CHUNK)
                }
                None => (None, DEFAULT_MAX_CHUNK),
            },
        };
        let over_budget = plan
            .as_ref()
            .is_some_and(|p| p.expert_slots < p.total_experts);
        let expert_bytes = pinned::routed_expert_bytes(&weights);
        let pinned = over_budget && pinned::choose_pinned(&ctx, tiers, expert_bytes)?;
        let tiered = over_budget && !pinned;
        // Pinned experts take no VRAM, and the token embedding joins them in host memory: the
        // plan is made again for that (see `pinned::plan`).
        // Pinned, a decode step's misses are copied into a VRAM stage first (`stage`).
        let stage_units = config.moe.n_expert_used * super::stage::STAGE_TOKENS;
        let stage_reserve = match weights.layers.first() {
            Some(l) if pinned && super::stage::stage_enabled() => {
                super::stage::stage_bytes(&l.moe, stage_units)
            }
            _ => 0,
        };
        let (plan, max_chunk, host_embedding) = match (plan, pinned) {
            (Some(p), true) => {
                let pinned_plan = pinned::plan(
                    &ctx,
                    &gguf,
                    &weights,
                    context_length,
                    (p, max_chunk),
                    stage_reserve,
                );
                (
                    Some(pinned_plan.plan),
                    pinned_plan.chunk,
                    pinned_plan.embedding,
                )
            }
            (plan, _) => (plan, max_chunk, None),
        };
        let expert_placement = if pinned {
            Placement::Host
        } else {
            Placement::Vram
        };
        let hot_sets = match (&plan, pinned) {
            (Some(p), true) => pinned::hot_expert_sets(tiers, &weights, &config, p)?,
            _ => vec![Vec::new(); weights.layers.len()],
        };
        let (ple_reader, expert_ram) = open_ple_reader(&gguf, tiers)?;
        let expert_tiers = TierArgs {
            ram_budget: expert_ram,
            ..tiers.clone()
        };
        let c = &ctx;
        // One row read per token: in pinned mode it is read in place from host memory.
        let token_embd = upload_placed(c, &weights.token_embd, expert_placement)?;
        let output = upload(c, &weights.output)?;
        let head_hc = upload_hc(c, &weights.head_hc)?;
        let mut layers = Vec::with_capacity(weights.layers.len());
        for (layer, (lw, hot_set)) in weights.layers.iter().zip(&hot_sets).enumerate() {
            let ple = match &lw.ple {
                Some(p) => Some(PleGpu {
                    key: upload(c, &p.key)?,
                    value: upload(c, &p.value)?,
                    norm_key: GpuBuf::from_f32(c, "ple norm key", &p.norm_key)?,
                    norm_query: GpuBuf::from_f32(c, "ple norm query", &p.norm_query)?,
                    norm_conv: GpuBuf::from_f32(c, "ple norm conv", &p.norm_conv)?,
                    conv: GpuBuf::from_f32(c, "ple conv", &p.conv)?,
                }),
                None => None,
            };
            let mixer = match &lw.mixer {
                MixerWeights::Gdn(g) => {
                    if config.gdn.head_k_dim > ops::GDN_MAX_DK {
                        anyhow::bail!(
                            "GDN key head dim {} exceeds the GPU kernel's {}",
                            config.gdn.head_k_dim,
                            ops::GDN_MAX_DK
                        );
                    }
                    let mut gate_params = g.dt_bias.clone();
                    gate_params.extend_from_slice(&g.a);
                    let input = MultiProj::upload(
                        c,
                        g.qkv.name(),
                        &[
                            &[Src::from(&g.qkv)],
                            &[Src::from(&g.gate)],
                            &[Src::from(&g.beta), Src::from(&g.alpha)],
                        ],
                    )?;
                    MixerGpu::Gdn(GdnGpu {
                        input,
                        gate_params: GpuBuf::from_f32(c, "gdn gate params", &gate_params)?,
                        conv: GpuBuf::from_f32(c, "gdn conv", &g.conv)?,
                        norm: GpuBuf::from_f32(c, "gdn norm", &g.norm)?,
                        out: upload(c, &g.out)?,
                    })
                }
                MixerWeights::Qsa(q) => {
                    let indexer = match (&q.indexer, q.compress_ratio) {
                        (Some(ix), Some(ratio)) if ratio > 0 => {
                            let budget = config.attention.indexer_budget_tokens / ratio;
                            if budget * ratio + ratio > ops::QSA_MAX_KEYS {
                                anyhow::bail!(
                                    "QSA budget of {budget} blocks exceeds the GPU kernel's {} keys",
                                    ops::QSA_MAX_KEYS
                                );
                            }
                            Some(IndexerGpu {
                                kq: MultiProj::upload(
                                    c,
                                    ix.k.name(),
                                    &[&[Src::from(&ix.k)], &[Src::from(&ix.q)]],
                                )?,
                                q_norm: GpuBuf::from_f32(c, "indexer q norm", &ix.q_norm)?,
                                k_norm: GpuBuf::from_f32(c, "indexer k norm", &ix.k_norm)?,
                                ratio,
                            })
                        }
                        _ => None,
                    };
                    MixerGpu::Qsa(QsaGpu {
                        qkv: MultiProj::upload(
                            c,
                            q.q.name(),
                            &[&[Src::from(&q.q)], &[Src::from(&q.k)], &[Src::from(&q.v)]],
                        )?,
                        out: upload(c, &q.out)?,
                        q_norm: GpuBuf::from_f32(c, "q norm", &q.q_norm)?,
                        k_norm: GpuBuf::from_f32(c, "k norm", &q.k_norm)?,
                        indexer,
                    })
                }
            };
            let m = &lw.moe;
            let shared = match &m.shared {
                Some(s) => {
                    let down = upload(c, &s.down)?;
                    Some(SharedGpu {
                        gate_up: MultiProj::upload(
                            c,
                            s.gate.name(),
                            &[&[Src::from(&s.gate), Src::from(&s.up)]],
                        )?,
                        combine_in_store: kernels::can_moe_combine(c, &down),
                        down,
                    })
                }
                None => None,
            };
            let experts = if tiered {
                None
            } else if gate_up_joinable(&m.gate, &m.up) {
                Some(ResidentExperts {
                    gate_up: upload_experts(
                        c,
                        "ffn_gate_up_exps",
                        &[&m.gate, &m.up],
                        expert_placement,
                    )?,
                    down: upload_experts(c, "ffn_down_exps", &[&m.down], expert_placement)?,
                    hot: pinned::upload_hot(c, m, hot_set)?,
                })
            } else {
                anyhow::bail!(
                    "expert gate and up projections differ in type or shape; the GPU backend \
                     needs them alike"
                );
            };
            let router_src = [Src::from(&m.router)];
            let gate_src: Vec<Src> = m
                .shared
                .iter()
                .map(|s| Src::vector("shared expert gate", &s.gate_inp))
                .collect();
            let mut router_groups: Vec<&[Src]> = vec![&router_src];
            if !gate_src.is_empty() {
                router_groups.push(&gate_src);
            }
            let moe = MoeGpu {
                router: MultiProj::upload(c, m.router.name(), &router_groups)?,
                experts,
                shared,
                layer,
            };
            layers.push(LayerGpu {
                ple,
                attn_hc: upload_hc(c, &lw.attn_hc)?,
                mixer,
                ffn_hc: upload_hc(c, &lw.ffn_hc)?,
                moe,
            });
            // wgpu fills each buffer through a staging copy that lives until a submission
            // completes: flush per layer, so staging never holds more than one layer's weights
            // (the whole expert set, otherwise, on top of its pinned copy).
            c.queue.submit(std::iter::empty());
            c.wait()?;
        }
        // RoPE table for every position a sequence can reach (host f64 sin/cos of f32 angles).
        let a = &config.attention;
        let inv = rope_inv_freqs(a.rope_base, a.rotary_dims);
        let half = inv.len();
        let mut table = vec![0.0f32; context_length.max(1) * half.max(1) * 2];
        let (mut cos, mut sin) = (vec![0.0f32; half], vec![0.0f32; half]);
        for p in 0..context_length {
            rope_cos_sin(p, &inv, &mut cos, &mut sin);
            for i in 0..half {
                table[(p * half + i) * 2] = cos[i];
                table[(p * half + i) * 2 + 1] = sin[i];
            }
        }
        let rope_table = GpuBuf::from_f32(c, "rope table", &table)?;
        let dummy = GpuBuf::zeros(c, "dummy", 4)?;
        // In VRAM only: pinned, the embedding and the expert tensors are in host memory, and
        // only the hot copies count.
        let mut weight_bytes = output.bytes() + if pinned { 0 } else { token_embd.bytes() };
        let hc_bytes = |h: &HcGpu| h.down_inject.bytes() + h.up.bytes();
        weight_bytes += hc_bytes(&head_hc);
        for l in &layers {
            weight_bytes += hc_bytes(&l.attn_hc) + hc_bytes(&l.ffn_hc);
            weight_bytes += l.moe.router.bytes()
                + l.moe
                    .experts
                    .as_ref()
                    .map_or(0, |e| match (&e.hot, pinned) {
                        (_, false) => e.gate_up.bytes() + e.down.bytes(),
                        (Some(hot), true) => hot.gate_up.bytes() + hot.down.bytes(),
                        (None, true) => 0,
                    });
        }
        let stage = match weights.layers.first() {
            Some(l) if stage_reserve > 0 => {
                Some(super::stage::ExpertStage::new(c, &l.moe, stage_units)?)
            }
            _ => None,
        };
        let pinned_tier = if pinned {
            Some(pinned::PinnedExperts::new(
                c,
                expert_bytes,
                &hot_sets,
                config.moe.n_expert,
                config.moe.n_expert_used,
                tiers,
                stage,
            )?)
        } else {
            None
        };
        let tier = match (&plan, tiered) {
            (Some(plan), true) => {
                let views: Vec<_> = weights
                    .layers
                    .iter()
                    .map(|l| {
                        (
                            l.moe.gate.as_slice(),
                            l.moe.up.as_slice(),
                            l.moe.down.as_slice(),
                        )
                    })
                    .collect();
                let tier = ExpertTier::new(
                    &ctx,
                    Arc::clone(&gguf),
                    plan,
                    &expert_tiers,
                    &views,
                    config.moe.n_expert,
                )?;
                eprintln!("{}", tier.describe(plan));
                let a = &tier.arenas;
                weight_bytes += a.gate.bytes() + a.up.bytes() + a.down.bytes();
                Some(tier)
            }
            (Some(plan), false) if pinned => {
                c.check_errors().map_err(|e| {
                    anyhow::anyhow!(
                        "pinning {} of experts in host memory failed ({e}); use --experts mmap",
                        format_size(expert_bytes)
                    )
                })?;
                let hot: usize = hot_sets.iter().map(Vec::len).sum();
                let embedding = match host_embedding {
                    Some(bytes) => format!(
                        " (the token embedding, {}, in pinned host memory)",
                        format_size(bytes)
                    ),
                    None => ", the token embedding's rows read from pinned host memory".into(),
                };
                let staged = match stage_reserve {
                    0 => "read in place by the GPU".to_string(),
                    bytes => format!(
                        "a decode step's misses copied into a VRAM stage of {stage_units} ({}), \
                         longer steps' read in place",
                        format_size(bytes)
                    ),
                };
                eprintln!(
                    "memory plan: budget {}, dense weights {}{embedding}, KV cache {} ({} tokens); \
                     all {} experts in pinned host memory ({}), {staged}; {hot} \
                     hot experts copied into VRAM ({})",
                    format_size(plan.vram_budget),
                    format_size(plan.dense_bytes),
                    format_size(plan.kv_bytes),
                    plan.ctx,
                    plan.total_experts,
                    format_size(expert_bytes),
                    match &tiers.expert_profile {
                        Some(path) if path.exists() => format!("from {}", path.display()),
                        _ => "the same share of every layer, without --expert-profile".into(),
                    }
                );
                None
            }
            (Some(plan), false) => {
                if !matches!(tiers.experts, ExpertsArg::Mmap | ExpertsArg::Auto) {
                    eprintln!(
                        "--experts {:?}: no host copy made, every expert is in VRAM",
                        tiers.experts
                    );
                }
                eprintln!(
                    "memory plan: budget {}, dense weights {}, KV cache {} ({} tokens); all {} \
                     experts resident",
                    format_size(plan.vram_budget),
                    format_size(plan.dense_bytes),
                    format_size(plan.kv_bytes),
                    plan.ctx,
                    plan.total_experts
                );
                None
            }
            _ => None,
        };
        ctx.release_staging()?;
        ctx.wait()?;
        let info = ModelInfo {
            name: config.name.clone(),
            vocab_size: config.vocab_size,
            context_length,
            backend: format!("gpu ({})", ctx.adapter.name),
            prefill_chunk: max_chunk,
        };
        Ok(GpuBackend {
            ctx,
            config,
            weights,
            token_embd,
            output,
            head_hc,
            layers,
            rope_table,
            dummy,
            info,
            max_chunk,
            kv_initial_tokens: KV_INITIAL_TOKENS,
            check_stages: std::env::var_os("STRATA_GPU_CHECK").is_some_and(|v| v != "0"),
            prepare: std::sync::atomic::AtomicU8::new(0),
            scratch: std::sync::Mutex::new(None),
            batch_scratch: std::sync::Mutex::new(None),
            batch_binds: std::sync::Mutex::new(BindGroupCache::new()),
            batched: Default::default(),
            feed_lock: std::sync::Mutex::new(()),
            weight_bytes,
            tier,
            pinned: pinned_tier,
            plan,
            ple_reader,
            _gguf: gguf,
        })
    }
}
