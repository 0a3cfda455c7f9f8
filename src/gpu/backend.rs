//! The whole model on the GPU: dense weights in VRAM (the PLE table stays on the host, as the spec
//! recommends: its rows are hashed, gathered through the checked [`PleRowReader`] and dequantized
//! on the CPU), one compute pass and one submission per chunk of tokens, one host sync per chunk
//! (the logits readback).
//!
//! Routed experts are either all resident (the default, and whenever `--vram-budget` leaves room
//! for every one) or tiered (`gpu::tiered`): VRAM slots filled from the host tier as the router
//! asks, at the cost of one sync per layer. Both run the same expert kernel, so the bits agree.
//!
//! Bit-identity across chunk sizes: every kernel computes each output element with one fixed
//! reduction order that does not depend on how many tokens the dispatch covers, and the recurrent
//! kernels (GDN, conv histories) walk tokens in order inside one invocation.

use std::sync::Arc;

use crate::engine::{Backend, EngineError, ModelInfo, Sequence};
use crate::gguf::Gguf;
use crate::model::config::Config;
use crate::model::ops::{first_non_finite, rope_cos_sin, rope_inv_freqs};
use crate::model::ple::{hash_rows, ngram_context};
use crate::model::weights::{HcWeights, MixerWeights, QuantMatrix, Weights};

use super::buffers::{GpuBuf, GpuWeight, read_staging};
use super::kernels::{self, BindGroupCache, Recorder, Store, View, XForm};
use super::ops::{self, GdnShape, Groups, NormMode, NormSpec, PleShape, QsaParams};
use super::proj::{MultiProj, Src};
use super::tiered::{ExpertTier, TierStats, plan_for_budget};
use super::{GpuContext, GpuError, list_adapters};
use crate::tiers::{MemoryPlan, PleReadError, PleRowReader, TierArgs, format_size};

/// Default cap on tokens per sequence on the GPU (KV caches are allocated up front).
pub const DEFAULT_GPU_CONTEXT: usize = 32768;
/// Tokens per forward chunk (activation buffers are sized for this).
/// Tokens per prefill chunk with every weight resident: the routed experts of a chunk are grouped
/// by expert, so larger chunks share each expert's weight reads among more tokens.
pub const DEFAULT_MAX_CHUNK: usize = 512;
/// Tokens per chunk under a VRAM budget (the planner counts the chunk's activations).
pub const BUDGET_MAX_CHUNK: usize = 64;
/// Logits rows a chunk can return: longer feeds that want every row run in chunks of this size.
const LOGIT_ROWS: usize = 64;
/// Chunks of at least this many tokens run the routed experts grouped by expert
/// ([`GpuSequence::moe_experts_grouped`]); smaller ones per item. Both give the same bits.
const GROUPED_MIN_TOKENS: usize = 8;

fn gpu_err(e: GpuError) -> EngineError {
    EngineError::Other(format!("gpu: {e}"))
}

struct HcGpu {
    norm: GpuBuf,
    /// The low-rank down projection (group 0) and, except in the head mixer, the injection
    /// logits (group 1): both read the normed streams.
    down_inject: MultiProj,
    has_inject: bool,
    up: GpuWeight,
}

struct GdnGpu {
    /// qkv (group 0), z (group 1), beta and alpha (group 2).
    input: MultiProj,
    gate_params: GpuBuf,
    conv: GpuBuf,
    norm: GpuBuf,
    out: GpuWeight,
}

struct IndexerGpu {
    /// Raw key (group 0) and queries (group 1).
    kq: MultiProj,
    q_norm: GpuBuf,
    k_norm: GpuBuf,
    ratio: usize,
}

struct QsaGpu {
    /// Query and gate (group 0), key (group 1), value (group 2).
    qkv: MultiProj,
    out: GpuWeight,
    q_norm: GpuBuf,
    k_norm: GpuBuf,
    indexer: Option<IndexerGpu>,
}

enum MixerGpu {
    Gdn(GdnGpu),
    Qsa(QsaGpu),
}

struct SharedGpu {
    /// Gate then up rows, into one vector per token that the down projection reads as SwiGLU.
    gate_up: MultiProj,
    down: GpuWeight,
}

/// The expert tensors one MoE dispatch sequence reads: the resident fused gate-up tensor, or the
/// tiered slot arenas.
#[derive(Clone, Copy)]
enum ExpertWeights<'a> {
    Fused {
        gate_up: &'a GpuWeight,
        down: &'a GpuWeight,
    },
    Split {
        gate: &'a GpuWeight,
        up: &'a GpuWeight,
        down: &'a GpuWeight,
    },
}

/// The routed experts of one layer, whole, when every expert is resident: each expert's gate rows
/// then its up rows in one tensor, so one dispatch computes both.
struct ResidentExperts {
    gate_up: GpuWeight,
    down: GpuWeight,
}

struct MoeGpu {
    /// Router logits (group 0) and, with a shared expert, its gate logit (group 1).
    router: MultiProj,
    /// `None` in tiered mode: the experts come through the backend's slot arenas.
    experts: Option<ResidentExperts>,
    shared: Option<SharedGpu>,
}

struct PleGpu {
    key: GpuWeight,
    value: GpuWeight,
    norm_key: GpuBuf,
    norm_query: GpuBuf,
    norm_conv: GpuBuf,
    conv: GpuBuf,
}

struct LayerGpu {
    ple: Option<PleGpu>,
    attn_hc: HcGpu,
    mixer: MixerGpu,
    ffn_hc: HcGpu,
    moe: MoeGpu,
}

/// A loaded model on the GPU.
pub struct GpuBackend {
    pub ctx: Arc<GpuContext>,
    pub config: Config,
    weights: Weights,
    token_embd: GpuWeight,
    output: GpuWeight,
    head_hc: HcGpu,
    layers: Vec<LayerGpu>,
    rope_table: GpuBuf,
    dummy: GpuBuf,
    info: ModelInfo,
    max_chunk: usize,
    /// `STRATA_GPU_CHECK=1`: check the residual after every layer (slow; names the first bad stage).
    check_stages: bool,
    weight_bytes: usize,
    /// Tiered mode: the expert slot arenas and their slot table (`None`: every expert resident).
    tier: Option<ExpertTier>,
    /// The VRAM plan, when `--vram-budget` asked for one.
    plan: Option<MemoryPlan>,
    /// Checked PLE row gathers from the file (`None` for a model held in memory, whose table is
    /// read and checked by the weight view instead).
    ple_reader: Option<PleRowReader>,
    _gguf: Arc<Gguf>,
}

fn upload(ctx: &GpuContext, m: &QuantMatrix) -> Result<GpuWeight, GpuError> {
    GpuWeight::upload(ctx, m.name(), m.ty, m.cols, m.rows, 1, m.bytes())
}

/// Stack experts into one tensor; each unit is expert e's rows of every list in `lists`, in
/// order (gate then up rows for the fused gate-up projection).
fn upload_experts(
    ctx: &GpuContext,
    name: &str,
    lists: &[&[QuantMatrix]],
) -> Result<GpuWeight, GpuError> {
    let Some(first) = lists.first().and_then(|l| l.first()) else {
        return Err(GpuError::BadArgs(format!("{name}: no experts")));
    };
    let n = lists[0].len();
    let mut bytes = Vec::with_capacity(first.bytes().len() * n * lists.len());
    for e in 0..n {
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
            bytes.extend_from_slice(m.bytes());
        }
    }
    let unit_rows = first.rows * lists.len();
    GpuWeight::upload(
        ctx,
        name,
        first.ty,
        first.cols,
        unit_rows * n,
        unit_rows,
        &bytes,
    )
}

/// Whether expert gate and up can share one tensor (same type and shape).
fn gate_up_joinable(gate: &[QuantMatrix], up: &[QuantMatrix]) -> bool {
    match (gate.first(), up.first()) {
        (Some(g), Some(u)) => g.ty == u.ty && g.rows == u.rows && g.cols == u.cols,
        _ => false,
    }
}

/// The checked PLE row reader of a model on disk (`--ple-io`, `--ple-row-cache`); `None` for a
/// model without a PLE table or held in memory (the built-in demo).
fn open_ple_reader(gguf: &Gguf, tiers: &TierArgs) -> anyhow::Result<Option<PleRowReader>> {
    let Some(tensor) = gguf.tensor(crate::tiers::plan::PLE_TABLE_TENSOR) else {
        return Ok(None);
    };
    let on_disk = gguf
        .shard_paths()
        .get(tensor.shard)
        .is_some_and(|p| !p.as_os_str().is_empty());
    if !on_disk {
        return Ok(None);
    }
    Ok(Some(PleRowReader::open_gguf(
        gguf,
        tiers.ple_reader_options(),
    )?))
}

/// A PLE read error as the engine reports it: a bad row names row, position and file offset.
fn ple_error(e: PleReadError) -> EngineError {
    match e {
        PleReadError::NonFinite {
            row,
            position,
            file,
            offset,
            block,
            field,
            ty,
        } => EngineError::NonFinite {
            stage: format!(
                "PLE table row {row} at byte offset {offset} of {file} (non-finite {field} in \
                 block {block}, {ty})"
            ),
            position,
        },
        other => EngineError::Other(other.to_string()),
    }
}

/// Reserve left out of the adapter's free memory for what the plan does not count (driver,
/// pipelines, staging): 5 % of it, at least 512 MiB.
fn vram_reserve(free: u64) -> u64 {
    (free / 20).max(512 << 20)
}

/// The VRAM budget without `--vram-budget`: the adapter's free device memory minus
/// [`vram_reserve`]. `None` (every weight loaded, as the message says) where the adapter does not
/// report it.
fn default_vram_budget(ctx: &GpuContext) -> Option<u64> {
    match super::memory::free_device_memory(ctx) {
        Some(free) => {
            let reserve = vram_reserve(free);
            let budget = free.saturating_sub(reserve);
            eprintln!(
                "VRAM budget: {} (the adapter reports {} free, less a reserve of {}); \
                 --vram-budget overrides it",
                format_size(budget),
                format_size(free),
                format_size(reserve)
            );
            Some(budget)
        }
        None => {
            eprintln!(
                "VRAM budget: the adapter does not report its free memory ({}), so every \
                 weight is loaded into VRAM; pass --vram-budget to plan for less",
                ctx.adapter.backend
            );
            None
        }
    }
}

/// The plan for `budget` and the prefill chunk it was made for: chunks of
/// [`DEFAULT_MAX_CHUNK`] when every expert then fits, else [`BUDGET_MAX_CHUNK`] (smaller
/// activations leave more room for expert slots).
fn plan_with_chunk(
    ctx: &GpuContext,
    gguf: &Gguf,
    context_length: usize,
    budget: u64,
) -> anyhow::Result<(MemoryPlan, usize)> {
    if let Ok(plan) = plan_for_budget(ctx, gguf, context_length, DEFAULT_MAX_CHUNK, budget)
        && plan.expert_slots >= plan.total_experts
    {
        return Ok((plan, DEFAULT_MAX_CHUNK));
    }
    let plan = plan_for_budget(ctx, gguf, context_length, BUDGET_MAX_CHUNK, budget)?;
    Ok((plan, BUDGET_MAX_CHUNK))
}

fn upload_hc(ctx: &GpuContext, w: &HcWeights) -> Result<HcGpu, GpuError> {
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
        let config = Config::from_gguf(&gguf)?;
        let weights = Weights::bind(&gguf, &config, &mut |_, _| {})?;
        let context_length = if context == 0 {
            config.context_length.min(DEFAULT_GPU_CONTEXT)
        } else {
            context
        };
        let (plan, max_chunk) = match tiers.vram_budget {
            Some(budget) => {
                let (plan, chunk) = plan_with_chunk(&ctx, &gguf, context_length, budget)?;
                (Some(plan), chunk)
            }
            None => match default_vram_budget(&ctx)
                .map(|budget| plan_with_chunk(&ctx, &gguf, context_length, budget))
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
        let tiered = plan
            .as_ref()
            .is_some_and(|p| p.expert_slots < p.total_experts);
        let ple_reader = open_ple_reader(&gguf, tiers)?;
        let c = &ctx;
        let token_embd = upload(c, &weights.token_embd)?;
        let output = upload(c, &weights.output)?;
        let head_hc = upload_hc(c, &weights.head_hc)?;
        let mut layers = Vec::with_capacity(weights.layers.len());
        for lw in &weights.layers {
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
                Some(s) => Some(SharedGpu {
                    gate_up: MultiProj::upload(
                        c,
                        s.gate.name(),
                        &[&[Src::from(&s.gate), Src::from(&s.up)]],
                    )?,
                    down: upload(c, &s.down)?,
                }),
                None => None,
            };
            let experts = if tiered {
                None
            } else if gate_up_joinable(&m.gate, &m.up) {
                Some(ResidentExperts {
                    gate_up: upload_experts(c, "ffn_gate_up_exps", &[&m.gate, &m.up])?,
                    down: upload_experts(c, "ffn_down_exps", &[&m.down])?,
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
            };
            layers.push(LayerGpu {
                ple,
                attn_hc: upload_hc(c, &lw.attn_hc)?,
                mixer,
                ffn_hc: upload_hc(c, &lw.ffn_hc)?,
                moe,
            });
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
        let mut weight_bytes = token_embd.bytes() + output.bytes();
        let hc_bytes = |h: &HcGpu| h.down_inject.bytes() + h.up.bytes();
        weight_bytes += hc_bytes(&head_hc);
        for l in &layers {
            weight_bytes += hc_bytes(&l.attn_hc) + hc_bytes(&l.ffn_hc);
            weight_bytes += l.moe.router.bytes()
                + l.moe
                    .experts
                    .as_ref()
                    .map_or(0, |e| e.gate_up.bytes() + e.down.bytes());
        }
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
                    tiers,
                    &views,
                    config.moe.n_expert,
                )?;
                eprintln!("{}", tier.describe(plan));
                let a = &tier.arenas;
                weight_bytes += a.gate.bytes() + a.up.bytes() + a.down.bytes();
                Some(tier)
            }
            (Some(plan), false) => {
                if tiers.experts != crate::tiers::ExpertsArg::Mmap {
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
        ctx.wait()?;
        let info = ModelInfo {
            name: config.name.clone(),
            vocab_size: config.vocab_size,
            context_length,
            backend: format!("gpu ({})", ctx.adapter.name),
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
            check_stages: std::env::var_os("STRATA_GPU_CHECK").is_some_and(|v| v != "0"),
            weight_bytes,
            tier,
            plan,
            ple_reader,
            _gguf: gguf,
        })
    }

    /// Expert-tier and PLE-reader counters (hit rate, uploads, rows read); `None` when every
    /// expert is resident and the PLE table is read from memory.
    pub fn tier_stats(&self) -> Option<TierStats> {
        let ple = self.ple_reader.as_ref().map(|r| r.stats());
        match &self.tier {
            Some(tier) => Some(TierStats {
                ple,
                ..tier.stats()
            }),
            None => ple.map(|ple| TierStats {
                ple: Some(ple),
                ..TierStats::default()
            }),
        }
    }

    /// VRAM expert slots in tiered mode (`None`: every expert resident).
    pub fn expert_slots(&self) -> Option<usize> {
        self.tier.as_ref().map(|t| t.n_slots)
    }

    /// The VRAM plan made at load (only with `--vram-budget`).
    pub fn memory_plan(&self) -> Option<&MemoryPlan> {
        self.plan.as_ref()
    }

    /// The expert routing observed since load in tiered mode (save it with
    /// `ExpertProfile::save` and pass it as `--expert-profile` next time).
    pub fn observed_expert_profile(&self) -> Option<crate::tiers::ExpertProfile> {
        self.tier.as_ref().map(|t| t.observed_profile())
    }

    /// Bytes of weights in VRAM (excluding the host-side PLE table).
    pub fn weight_bytes(&self) -> usize {
        self.weight_bytes
    }

    /// Check the residual after every layer and name the first stage that produced a non-finite
    /// value (slow: one submission and readback per layer). Also on with `STRATA_GPU_CHECK=1`.
    pub fn set_check_stages(&mut self, on: bool) {
        self.check_stages = on;
    }

    /// Tokens per chunk (activation buffers are allocated per sequence for this many).
    /// Tokens per GPU prefill chunk.
    pub fn max_chunk(&self) -> usize {
        self.max_chunk
    }

    pub fn set_max_chunk(&mut self, n: usize) {
        self.max_chunk = n.max(1);
    }

    /// Bytes of weights read to decode one token: everything except the unused experts and the
    /// embedding table (one row).
    pub fn bytes_per_decoded_token(&self) -> usize {
        let mut total = self.output.bytes() + self.token_embd.row_bytes;
        let hc_bytes = |h: &HcGpu| h.down_inject.bytes() + h.up.bytes();
        total += hc_bytes(&self.head_hc);
        let used = self.config.moe.n_expert_used;
        let n_expert = self.config.moe.n_expert.max(1);
        for l in &self.layers {
            total += hc_bytes(&l.attn_hc) + hc_bytes(&l.ffn_hc);
            let m = &l.moe;
            let expert_bytes = match (&m.experts, &self.tier) {
                (Some(e), _) => (e.gate_up.bytes() + e.down.bytes()) / n_expert,
                (None, Some(t)) => {
                    let a = &t.arenas;
                    (a.gate.bytes() + a.up.bytes() + a.down.bytes()) / t.n_slots.max(1)
                }
                (None, None) => 0,
            };
            total += m.router.bytes() + expert_bytes * used;
            if let Some(s) = &m.shared {
                total += s.gate_up.bytes() + s.down.bytes();
            }
            if let Some(p) = &l.ple {
                total += p.key.bytes() + p.value.bytes();
            }
            total += match &l.mixer {
                MixerGpu::Gdn(g) => g.input.bytes() + g.out.bytes(),
                MixerGpu::Qsa(q) => {
                    q.qkv.bytes() + q.out.bytes() + q.indexer.as_ref().map_or(0, |i| i.kq.bytes())
                }
            };
        }
        total
    }

    pub fn sequence(self: &Arc<Self>) -> Result<GpuSequence, GpuError> {
        GpuSequence::new(Arc::clone(self))
    }
}

impl Backend for GpuBackend {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn new_sequence(self: Arc<Self>) -> Result<Box<dyn Sequence>, EngineError> {
        Ok(Box::new(GpuSequence::new(self).map_err(gpu_err)?))
    }
}

/// Per-layer recurrent state and caches.
enum LayerState {
    Gdn {
        conv: GpuBuf,
        ssm: GpuBuf,
    },
    Qsa {
        keys: GpuBuf,
        values: GpuBuf,
        raw_index_keys: GpuBuf,
        block_keys: GpuBuf,
    },
}

/// Activation buffers for one chunk of up to `max_chunk` tokens.
struct Scratch {
    ids: GpuBuf,
    wide: GpuBuf,
    normed: GpuBuf,
    low: GpuBuf,
    gates: GpuBuf,
    x_in: GpuBuf,
    inject: GpuBuf,
    // GDN
    mixed: GpuBuf,
    z: GpuBuf,
    beta_alpha: GpuBuf,
    conv_out: GpuBuf,
    recurrent_out: GpuBuf,
    gdn_normed: GpuBuf,
    // QSA
    query_gate: GpuBuf,
    index_query: GpuBuf,
    selected: GpuBuf,
    scores: GpuBuf,
    attended: GpuBuf,
    attn_parts: GpuBuf,
    // MoE
    router: GpuBuf,
    expert_ids: GpuBuf,
    /// Tiered mode: the slot of each (token, k) expert of the current sub-batch.
    slot_ids: GpuBuf,
    expert_weights: GpuBuf,
    /// Gate then up outputs of each (token, expert), side by side.
    expert_gu: GpuBuf,
    expert_down: GpuBuf,
    expert_groups: GpuBuf,
    /// Gate then up outputs of the shared expert per token.
    shared_gu: GpuBuf,
    shared_down: GpuBuf,
    shared_logit: GpuBuf,
    // PLE
    ple_embedding: GpuBuf,
    ple_key: GpuBuf,
    ple_key_normed: GpuBuf,
    ple_value: GpuBuf,
    ple_query_normed: GpuBuf,
    ple_gated: GpuBuf,
    ple_conv_in: GpuBuf,
    ple_history: GpuBuf,
    logits: GpuBuf,
    greedy: GpuBuf,
}

pub struct GpuSequence {
    backend: Arc<GpuBackend>,
    tokens: Vec<u32>,
    layers: Vec<LayerState>,
    scratch: Scratch,
    poisoned: bool,
    /// Collect per-dispatch GPU timestamps on the next feed (see [`GpuSequence::take_timings`]).
    profile: bool,
    timings: Vec<(String, f64)>,
    bind_groups: BindGroupCache,
}

impl GpuSequence {
    fn new(backend: Arc<GpuBackend>) -> Result<Self, GpuError> {
        let b = &backend;
        let c = &*b.ctx;
        let cfg = &b.config;
        let t = b.max_chunk;
        let h = cfg.n_embd;
        let hc = cfg.hc_count;
        let wide = h * hc;
        let ctx_len = b.info.context_length;
        let g = &cfg.gdn;
        let a = &cfg.attention;
        let m = &cfg.moe;
        let mut layers = Vec::new();
        let mut max_blocks = 1;
        let mut budget = 1;
        for l in &b.layers {
            layers.push(match &l.mixer {
                MixerGpu::Gdn(_) => LayerState::Gdn {
                    conv: GpuBuf::zeros(
                        c,
                        "gdn conv history",
                        (g.conv_kernel.max(2) - 1) * g.conv_channels(),
                    )?,
                    ssm: GpuBuf::zeros(c, "gdn state", g.n_v_heads * g.head_k_dim * g.head_v_dim)?,
                },
                MixerGpu::Qsa(q) => {
                    let kv = a.n_head_kv * a.head_dim;
                    let (ratio, idim) = match &q.indexer {
                        Some(ix) => (ix.ratio, a.indexer_head_dim),
                        None => (1, 1),
                    };
                    if let Some(ix) = &q.indexer {
                        max_blocks = max_blocks.max(ctx_len / ix.ratio + 1);
                        budget = budget.max(a.indexer_budget_tokens / ix.ratio);
                    }
                    LayerState::Qsa {
                        keys: GpuBuf::zeros(c, "key cache", ctx_len * kv)?,
                        values: GpuBuf::zeros(c, "value cache", ctx_len * kv)?,
                        raw_index_keys: GpuBuf::zeros(c, "indexer key cache", ctx_len * idim)?,
                        block_keys: GpuBuf::zeros(c, "block keys", (ctx_len / ratio + 1) * idim)?,
                    }
                }
            });
        }
        let ple_dim = cfg.ple.as_ref().map_or(32, |p| p.embed_dim());
        let ple_hist = cfg.ple.as_ref().map_or(1, |p| p.conv_history().max(1));
        let qg = a.n_head * 2 * a.head_dim;
        let k = m.n_expert_used;
        let z = |label: &str, n: usize| GpuBuf::zeros(c, label, n.max(1));
        let scratch = Scratch {
            ids: z("ids", t)?,
            wide: z("wide", t * wide)?,
            normed: z("normed", t * wide)?,
            low: z("low", t * cfg.hc_low_rank)?,
            gates: z("gates", t * wide)?,
            x_in: z("x_in", t * h)?,
            inject: z("inject", t * hc)?,
            mixed: z("mixed", t * g.conv_channels())?,
            z: z("z", t * g.value_dim())?,
            beta_alpha: z("beta alpha", t * 2 * g.n_v_heads)?,
            conv_out: z("conv out", t * g.conv_channels())?,
            recurrent_out: z("recurrent out", t * g.value_dim())?,
            gdn_normed: z("gdn normed", t * g.value_dim())?,
            query_gate: z("query gate", t * qg)?,
            index_query: z("index query", t * a.indexer_n_head * a.indexer_head_dim)?,
            selected: z("selected", t * (budget + 1))?,
            scores: z("scores", t * 2 * max_blocks)?,
            attended: z("attended", t * a.n_head * a.head_dim)?,
            attn_parts: z(
                "attention partials",
                ops::qsa_partials_len(t, a.n_head, a.head_dim),
            )?,
            router: z("router", t * m.n_expert)?,
            expert_ids: z("expert ids", t * k)?,
            slot_ids: z("expert slot ids", t * k)?,
            expert_weights: z("expert weights", t * k)?,
            expert_gu: z("expert gate up", t * k * 2 * m.expert_ff)?,
            expert_down: z("expert down", t * k * h)?,
            expert_groups: z("expert groups", ops::group_len(m.n_expert, t))?,
            shared_gu: z("shared gate up", t * 2 * m.shared_ff)?,
            shared_down: z("shared down", t * h)?,
            shared_logit: z("shared logit", t)?,
            ple_embedding: z("ple embedding", t * ple_dim)?,
            ple_key: z("ple key", t * wide)?,
            ple_key_normed: z("ple key normed", t * wide)?,
            ple_value: z("ple value", t * h)?,
            ple_query_normed: z("ple query normed", t * wide)?,
            ple_gated: z("ple gated", t * wide)?,
            ple_conv_in: z("ple conv in", t * wide)?,
            ple_history: z("ple history", ple_hist * wide)?,
            logits: z("logits", t.min(LOGIT_ROWS) * cfg.vocab_size)?,
            greedy: z("greedy", 2)?,
        };
        Ok(Self {
            backend,
            tokens: Vec::new(),
            layers,
            scratch,
            poisoned: false,
            profile: false,
            timings: Vec::new(),
            bind_groups: BindGroupCache::new(),
        })
    }

    fn norm_spec<'a>(&self, weight: Option<(&'a GpuBuf, usize)>) -> NormSpec<'a> {
        NormSpec {
            mode: NormMode::Rms,
            eps: self.backend.config.rms_eps,
            scale: 1.0,
            weight,
        }
    }

    /// The hyper-connection mix (model-spec 2.4): `x_in` and, with an injection, `inject`.
    /// Three dispatches: the grouped norm; down projection and injection logits together; the up
    /// projection with the SiLU on its input and the stream mix in its store.
    fn hc_mix(&self, rec: &mut Recorder, w: &HcGpu, t: usize) -> Result<(), GpuError> {
        let b = &self.backend;
        let c = &*b.ctx;
        let s = &self.scratch;
        let h = b.config.n_embd;
        let hc = b.config.hc_count;
        let wide = h * hc;
        let groups = Groups::packed(h, hc);
        ops::rmsnorm(
            c,
            rec,
            &self.norm_spec(Some((&w.norm, wide))),
            &s.wide,
            groups,
            &s.normed,
            groups,
            t,
        )?;
        let r = w.down_inject.rows(0);
        let mut outs = vec![View::new(&s.low, 0, r)];
        if w.has_inject {
            outs.push(View::new(&s.inject, 0, hc));
        }
        w.down_inject
            .record(c, rec, View::new(&s.normed, 0, wide), &outs, t)?;
        let x = View::new(&s.low, 0, r);
        let silu = kernels::prepare_x(c, rec, &w.up, x, XForm::SiluScale(1.0 / hc as f32), t)?;
        if hc <= 4 && w.up.parts.len() == 1 {
            let store = Store::Mix {
                out: View::new(&s.x_in, 0, h),
                normed: &s.normed,
                h,
                hc,
            };
            return kernels::matvec_with(c, rec, &w.up, x, silu, store, t);
        }
        let gates = Store::Rows(View::new(&s.gates, 0, wide));
        kernels::matvec_with(c, rec, &w.up, x, silu, gates, t)?;
        ops::hc_mix_out(c, rec, &s.gates, &s.normed, &s.x_in, h, hc, t)
    }

    fn ple(&self, rec: &mut Recorder, w: &PleGpu, t: usize, pos0: usize) -> Result<(), GpuError> {
        let b = &self.backend;
        let c = &*b.ctx;
        let s = &self.scratch;
        let cfg = &b.config;
        let Some(pc) = &cfg.ple else {
            return Err(GpuError::BadArgs("PLE weights without PLE config".into()));
        };
        let h = cfg.n_embd;
        let hc = cfg.hc_count;
        let wide = h * hc;
        let groups = Groups::packed(h, hc);
        let dim = pc.embed_dim();
        kernels::matvec(
            c,
            rec,
            &w.key,
            View::new(&s.ple_embedding, 0, dim),
            View::new(&s.ple_key, 0, wide),
            t,
        )?;
        ops::rmsnorm(
            c,
            rec,
            &self.norm_spec(Some((&w.norm_key, wide))),
            &s.ple_key,
            groups,
            &s.ple_key_normed,
            groups,
            t,
        )?;
        kernels::matvec(
            c,
            rec,
            &w.value,
            View::new(&s.ple_embedding, 0, dim),
            View::new(&s.ple_value, 0, h),
            t,
        )?;
        ops::rmsnorm(
            c,
            rec,
            &self.norm_spec(Some((&w.norm_query, wide))),
            &s.wide,
            groups,
            &s.ple_query_normed,
            groups,
            t,
        )?;
        let shape = PleShape {
            h,
            hc,
            kernel: pc.conv_kernel,
            dilation: pc.conv_dilation(),
        };
        ops::ple_gate(
            c,
            rec,
            &shape,
            &s.ple_key_normed,
            &s.ple_query_normed,
            &s.ple_value,
            &s.ple_gated,
            t,
        )?;
        ops::rmsnorm(
            c,
            rec,
            &self.norm_spec(Some((&w.norm_conv, wide))),
            &s.ple_gated,
            groups,
            &s.ple_conv_in,
            groups,
            t,
        )?;
        ops::ple_conv(
            c,
            rec,
            &shape,
            &s.ple_conv_in,
            &s.ple_gated,
            &w.conv,
            &s.ple_history,
            &s.wide,
            t,
            pos0,
        )
    }

    fn gdn(
        &self,
        rec: &mut Recorder,
        w: &GdnGpu,
        state: &LayerState,
        t: usize,
    ) -> Result<(), GpuError> {
        let LayerState::Gdn { conv, ssm } = state else {
            return Err(GpuError::BadArgs("GDN layer with attention state".into()));
        };
        let b = &self.backend;
        let c = &*b.ctx;
        let s = &self.scratch;
        let cfg = &b.config;
        let g = &cfg.gdn;
        let h = cfg.n_embd;
        let ch = g.conv_channels();
        let nv = g.n_v_heads;
        let x = View::new(&s.x_in, 0, h);
        let outs = [
            View::new(&s.mixed, 0, ch),
            View::new(&s.z, 0, g.value_dim()),
            View::new(&s.beta_alpha, 0, 2 * nv),
        ];
        w.input.record(c, rec, x, &outs, t)?;
        let shape = GdnShape {
            channels: ch,
            kernel: g.conv_kernel,
            n_k_heads: g.n_k_heads,
            n_v_heads: nv,
            dk: g.head_k_dim,
            dv: g.head_v_dim,
        };
        ops::gdn_conv(c, rec, &shape, &s.mixed, &w.conv, conv, &s.conv_out, t)?;
        ops::gdn_recurrence(
            c,
            rec,
            &shape,
            &s.conv_out,
            &s.beta_alpha,
            &w.gate_params,
            ssm,
            &s.recurrent_out,
            t,
        )?;
        let per_head = Groups::packed(g.head_v_dim, nv);
        ops::rmsnorm_gated(
            c,
            rec,
            &self.norm_spec(Some((&w.norm, g.head_v_dim))),
            &s.recurrent_out,
            &s.z,
            per_head,
            &s.gdn_normed,
            per_head,
            t,
        )?;
        let x = View::new(&s.gdn_normed, 0, g.value_dim());
        self.out_and_combine(rec, &w.out, x, t)
    }

    /// A mixer's output projection added into the wide residual (fused `hc_combine`).
    fn out_and_combine(
        &self,
        rec: &mut Recorder,
        w: &GpuWeight,
        x: View,
        t: usize,
    ) -> Result<(), GpuError> {
        let b = &self.backend;
        let s = &self.scratch;
        let store = Store::Combine {
            wide: &s.wide,
            inject: &s.inject,
            h: b.config.n_embd,
            hc: b.config.hc_count,
        };
        kernels::matvec_with(&b.ctx, rec, w, x, XForm::Plain, store, t)
    }

    fn qsa(
        &self,
        rec: &mut Recorder,
        w: &QsaGpu,
        state: &LayerState,
        t: usize,
        pos0: usize,
    ) -> Result<(), GpuError> {
        let LayerState::Qsa {
            keys,
            values,
            raw_index_keys,
            block_keys,
        } = state
        else {
            return Err(GpuError::BadArgs("attention layer with GDN state".into()));
        };
        let b = &self.backend;
        let c = &*b.ctx;
        let s = &self.scratch;
        let cfg = &b.config;
        let a = &cfg.attention;
        let h = cfg.n_embd;
        let hd = a.head_dim;
        let kv = a.n_head_kv * hd;
        let qg = a.n_head * 2 * hd;
        let half = a.rotary_dims / 2;
        let x = View::new(&s.x_in, 0, h);
        // Keys and values land in the caches directly; the keys are normed and rotated there.
        let outs = [
            View::new(&s.query_gate, 0, qg),
            View::new(keys, pos0 * kv, kv),
            View::new(values, pos0 * kv, kv),
        ];
        w.qkv.record(c, rec, x, &outs, t)?;
        let q_heads = Groups {
            n: hd,
            groups: a.n_head,
            off: 0,
            group_stride: 2 * hd,
            token_stride: qg,
        };
        ops::rmsnorm_inplace(
            c,
            rec,
            &self.norm_spec(Some((&w.q_norm, hd))),
            &s.query_gate,
            q_heads,
            t,
            &b.dummy,
        )?;
        ops::rope(
            c,
            rec,
            &s.query_gate,
            &b.rope_table,
            t,
            a.n_head,
            2 * hd,
            qg,
            0,
            half,
            pos0,
            1,
        )?;
        ops::rmsnorm_inplace(
            c,
            rec,
            &self.norm_spec(Some((&w.k_norm, hd))),
            keys,
            Groups {
                off: pos0 * kv,
                ..Groups::packed(hd, a.n_head_kv)
            },
            t,
            &b.dummy,
        )?;
        ops::rope(
            c,
            rec,
            keys,
            &b.rope_table,
            t,
            a.n_head_kv,
            hd,
            kv,
            pos0 * kv,
            half,
            pos0,
            1,
        )?;
        let mut params = QsaParams {
            tokens: t as u32,
            pos0: pos0 as u32,
            heads: a.n_head as u32,
            n_kv: a.n_head_kv as u32,
            hd: hd as u32,
            ratio: 1,
            budget: 0,
            dense: 1,
            scale: 1.0 / (hd as f32).sqrt(),
            ..Default::default()
        };
        if let Some(ix) = &w.indexer {
            let idim = a.indexer_head_dim;
            let nih = a.indexer_n_head;
            let ratio = ix.ratio;
            let budget = a.indexer_budget_tokens / ratio;
            // Raw index keys land in their cache directly.
            let outs = [
                View::new(raw_index_keys, pos0 * idim, idim),
                View::new(&s.index_query, 0, nih * idim),
            ];
            ix.kq.record(c, rec, x, &outs, t)?;
            let first = pos0 / ratio;
            let end = (pos0 + t) / ratio;
            if end > first {
                let count = end - first;
                ops::block_mean(
                    c,
                    rec,
                    raw_index_keys,
                    block_keys,
                    first,
                    count,
                    ratio,
                    idim,
                )?;
                let rows = Groups {
                    n: idim,
                    groups: 1,
                    off: first * idim,
                    group_stride: idim,
                    token_stride: idim,
                };
                ops::rmsnorm_inplace(
                    c,
                    rec,
                    &self.norm_spec(Some((&ix.k_norm, idim))),
                    block_keys,
                    rows,
                    count,
                    &b.dummy,
                )?;
                ops::rope(
                    c,
                    rec,
                    block_keys,
                    &b.rope_table,
                    count,
                    1,
                    idim,
                    idim,
                    first * idim,
                    half,
                    first * ratio,
                    ratio,
                )?;
            }
            ops::rmsnorm_inplace(
                c,
                rec,
                &self.norm_spec(Some((&ix.q_norm, idim))),
                &s.index_query,
                Groups::packed(idim, nih),
                t,
                &b.dummy,
            )?;
            ops::rope(
                c,
                rec,
                &s.index_query,
                &b.rope_table,
                t,
                nih,
                idim,
                nih * idim,
                0,
                half,
                pos0,
                1,
            )?;
            let max_blocks = s.scores.len / (2 * b.max_chunk);
            let select = QsaParams {
                tokens: t as u32,
                pos0: pos0 as u32,
                heads: nih as u32,
                ratio: ratio as u32,
                budget: budget as u32,
                idim: idim as u32,
                max_blocks: max_blocks as u32,
                scale: 1.0 / (idim as f32).sqrt(),
                ..Default::default()
            };
            ops::qsa_select(
                c,
                rec,
                &select,
                &s.index_query,
                block_keys,
                &s.scores,
                &s.selected,
            )?;
            params.ratio = ratio as u32;
            params.budget = budget as u32;
            params.dense = 0;
        }
        ops::qsa_attend(
            c,
            rec,
            &params,
            &s.query_gate,
            keys,
            values,
            &s.selected,
            &s.attn_parts,
            &s.attended,
        )?;
        let x = View::new(&s.attended, 0, a.n_head * hd);
        self.out_and_combine(rec, &w.out, x, t)
    }

    /// The router: expert ids and weights of every token into `scratch.expert_ids/_weights`.
    fn moe_route(&self, rec: &mut Recorder, w: &MoeGpu, t: usize) -> Result<(), GpuError> {
        let b = &self.backend;
        let c = &*b.ctx;
        let s = &self.scratch;
        let m = &b.config.moe;
        let x = View::new(&s.x_in, 0, b.config.n_embd);
        let mut outs = vec![View::new(&s.router, 0, m.n_expert)];
        if w.shared.is_some() {
            outs.push(View::new(&s.shared_logit, 0, 1));
        }
        w.router.record(c, rec, x, &outs, t)?;
        ops::moe_router(
            c,
            rec,
            &s.router,
            &s.expert_ids,
            &s.expert_weights,
            m.n_expert,
            m.n_expert_used,
            t,
        )
    }

    /// The routed experts of the chunk's tokens `tokens`: `ids` holds their `k` expert (or slot)
    /// indices per token from index 0. Gate and up land side by side in `scratch.expert_gu` (from
    /// 0, reused per sub-batch), from one fused tensor or from two (the slot arenas): the same
    /// rows either way. The down projection reads them as SwiGLU; its outputs land at the
    /// tokens' own rows of `scratch.expert_down`, ready for the combine.
    fn moe_experts(
        &self,
        rec: &mut Recorder,
        experts: ExpertWeights,
        ids: &GpuBuf,
        tokens: std::ops::Range<usize>,
    ) -> Result<(), GpuError> {
        let b = &self.backend;
        let c = &*b.ctx;
        let s = &self.scratch;
        let cfg = &b.config;
        let h = cfg.n_embd;
        let k = cfg.moe.n_expert_used;
        let f = cfg.moe.expert_ff;
        let items = tokens.len() * k;
        let x = View::new(&s.x_in, tokens.start * h, h);
        let gu = |offset: usize| View::new(&s.expert_gu, offset, 2 * f);
        let down = match experts {
            ExpertWeights::Fused { gate_up, down } => {
                kernels::matvec_expert(c, rec, gate_up, ids, k, false, x, gu(0), items)?;
                down
            }
            ExpertWeights::Split { gate, up, down } => {
                kernels::matvec_expert(c, rec, gate, ids, k, false, x, gu(0), items)?;
                kernels::matvec_expert(c, rec, up, ids, k, false, x, gu(f), items)?;
                down
            }
        };
        kernels::matvec_expert_with(
            c,
            rec,
            down,
            ids,
            k,
            true,
            gu(0),
            XForm::Swiglu { half: f },
            View::new(&s.expert_down, tokens.start * k * h, h),
            items,
        )
    }

    /// [`Self::moe_experts`] for a prefill chunk of `t` tokens with every expert resident: the
    /// items grouped by expert first, so each expert's weights are read once for all its tokens.
    /// The same bits per item as the per-item kernels.
    fn moe_experts_grouped(
        &self,
        rec: &mut Recorder,
        gate_up: &GpuWeight,
        down: &GpuWeight,
        t: usize,
    ) -> Result<(), GpuError> {
        let b = &self.backend;
        let c = &*b.ctx;
        let s = &self.scratch;
        let cfg = &b.config;
        let h = cfg.n_embd;
        let k = cfg.moe.n_expert_used;
        let f = cfg.moe.expert_ff;
        // moe_group lists each expert's items in room for the chunk's `t` tokens.
        let cap = t;
        let items = t * k;
        ops::moe_group(
            c,
            rec,
            &s.expert_ids,
            &s.expert_groups,
            cfg.moe.n_expert,
            k,
            t,
        )?;
        let x = View::new(&s.x_in, 0, h);
        let gu = View::new(&s.expert_gu, 0, 2 * f);
        let groups = &s.expert_groups;
        kernels::matvec_group(
            c,
            rec,
            gate_up,
            groups,
            cap,
            k,
            false,
            x,
            XForm::Plain,
            gu,
            items,
        )?;
        let y = View::new(&s.expert_down, 0, h);
        let swiglu = kernels::prepare_x(c, rec, down, gu, XForm::Swiglu { half: f }, items)?;
        kernels::matvec_group(c, rec, down, groups, cap, k, true, gu, swiglu, y, items)
    }

    /// Shared expert, and the weighted combine of the routed and shared outputs added into the
    /// wide residual.
    fn moe_finish(&self, rec: &mut Recorder, w: &MoeGpu, t: usize) -> Result<(), GpuError> {
        let b = &self.backend;
        let c = &*b.ctx;
        let s = &self.scratch;
        let cfg = &b.config;
        let h = cfg.n_embd;
        let k = cfg.moe.n_expert_used;
        let x = View::new(&s.x_in, 0, h);
        let shared = match &w.shared {
            Some(sh) => {
                let sf = sh.down.row_len;
                let gu = View::new(&s.shared_gu, 0, 2 * sf);
                sh.gate_up.record(c, rec, x, &[gu], t)?;
                let y = Store::Rows(View::new(&s.shared_down, 0, h));
                let swiglu =
                    kernels::prepare_x(c, rec, &sh.down, gu, XForm::Swiglu { half: sf }, t)?;
                kernels::matvec_with(c, rec, &sh.down, gu, swiglu, y, t)?;
                Some((&s.shared_down, &s.shared_logit))
            }
            None => None,
        };
        ops::moe_combine_hc(
            c,
            rec,
            &s.expert_down,
            &s.expert_weights,
            shared,
            &s.wide,
            &s.inject,
            h,
            cfg.hc_count,
            k,
            t,
        )
    }

    /// Tiered experts of layer `index`: submit what `rec` holds (the layer up to the router), read
    /// the chosen experts back, make them resident in slots (uploading misses) and submit the
    /// expert kernels on the slot arenas — per run of tokens whose experts fit the slots at once.
    /// `rec` comes back empty (its bind-group cache kept).
    fn tiered_experts(
        &self,
        rec: &mut Recorder,
        tier: &ExpertTier,
        index: usize,
        t: usize,
    ) -> Result<(), EngineError> {
        let b = &self.backend;
        let c = &*b.ctx;
        let k = b.config.moe.n_expert_used;
        rec.run(c).map_err(gpu_err)?;
        *rec = Recorder::with_cache(rec.take_cache());
        let ids = self
            .scratch
            .expert_ids
            .read_u32(c, 0, t * k)
            .map_err(gpu_err)?;
        let runs = tier.sub_batches(&ids, k);
        let a = &tier.arenas;
        // Held until the dispatches reading the slots are submitted (see `gpu::tiered`).
        let mut state = tier.lock();
        tier.note_extra_sub_batches(&mut state, runs.len().saturating_sub(1));
        for run in runs {
            let chosen = ids.get(run.start * k..run.end * k).unwrap_or_default();
            let slots = tier.place(c, &mut state, index, chosen)?;
            self.scratch
                .slot_ids
                .write_u32(c, 0, &slots)
                .map_err(gpu_err)?;
            let split = ExpertWeights::Split {
                gate: &a.gate,
                up: &a.up,
                down: &a.down,
            };
            self.moe_experts(rec, split, &self.scratch.slot_ids, run)
                .map_err(gpu_err)?;
            let mut encoder = c
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("tiered experts"),
                });
            rec.encode(&mut encoder, None);
            c.queue.submit([encoder.finish()]);
            *rec = Recorder::with_cache(rec.take_cache());
        }
        drop(state);
        c.check_errors().map_err(gpu_err)
    }

    /// Record the forward pass of `t` tokens at positions pos0.. (ids and PLE rows already
    /// uploaded). Logits land in `scratch.logits`: all rows, or only the last token's in row 0.
    fn record(
        &self,
        rec: &mut Recorder,
        t: usize,
        pos0: usize,
        all_logits: bool,
    ) -> Result<usize, EngineError> {
        self.record_embedding(rec, t).map_err(gpu_err)?;
        for layer in 0..self.layers.len() {
            self.record_layer(rec, layer, t, pos0)?;
        }
        self.record_head(rec, t, all_logits).map_err(gpu_err)
    }

    fn record_embedding(&self, rec: &mut Recorder, t: usize) -> Result<(), GpuError> {
        let b = &self.backend;
        let s = &self.scratch;
        let h = b.config.n_embd;
        let hc = b.config.hc_count;
        let view = View::new(&s.wide, 0, h * hc);
        kernels::get_rows(&b.ctx, rec, &b.token_embd, &s.ids, t, view, hc, h)
    }

    /// Record layer `index`. In tiered mode this submits the recorded work at the router and
    /// again after the expert kernels (see [`Self::tiered_experts`]); `rec` then holds the rest.
    fn record_layer(
        &self,
        rec: &mut Recorder,
        index: usize,
        t: usize,
        pos0: usize,
    ) -> Result<(), EngineError> {
        let b = &self.backend;
        let Some(layer) = b.layers.get(index) else {
            return Err(gpu_err(GpuError::BadArgs(format!("no layer {index}"))));
        };
        self.record_layer_to_router(rec, index, t, pos0)
            .map_err(gpu_err)?;
        match (&layer.moe.experts, &b.tier) {
            (Some(e), _) if t >= GROUPED_MIN_TOKENS => self
                .moe_experts_grouped(rec, &e.gate_up, &e.down, t)
                .map_err(gpu_err)?,
            (Some(e), _) => {
                let fused = ExpertWeights::Fused {
                    gate_up: &e.gate_up,
                    down: &e.down,
                };
                self.moe_experts(rec, fused, &self.scratch.expert_ids, 0..t)
                    .map_err(gpu_err)?
            }
            (None, Some(tier)) => self.tiered_experts(rec, tier, index, t)?,
            (None, None) => {
                return Err(gpu_err(GpuError::BadArgs(format!(
                    "layer {index} has neither resident nor tiered experts"
                ))));
            }
        }
        self.moe_finish(rec, &layer.moe, t).map_err(gpu_err)
    }

    /// Layer `index` from its input up to and including the MoE router.
    fn record_layer_to_router(
        &self,
        rec: &mut Recorder,
        index: usize,
        t: usize,
        pos0: usize,
    ) -> Result<(), GpuError> {
        let b = &self.backend;
        let (Some(layer), Some(state)) = (b.layers.get(index), self.layers.get(index)) else {
            return Err(GpuError::BadArgs(format!("no layer {index}")));
        };
        if let Some(p) = &layer.ple {
            self.ple(rec, p, t, pos0)?;
        }
        self.hc_mix(rec, &layer.attn_hc, t)?;
        // The mixers add their output into the wide residual themselves (fused hc_combine).
        match &layer.mixer {
            MixerGpu::Gdn(g) => self.gdn(rec, g, state, t)?,
            MixerGpu::Qsa(q) => self.qsa(rec, q, state, t, pos0)?,
        }
        self.hc_mix(rec, &layer.ffn_hc, t)?;
        self.moe_route(rec, &layer.moe, t)
    }

    /// Head mixer and lm_head; returns the number of logits rows written.
    fn record_head(
        &self,
        rec: &mut Recorder,
        t: usize,
        all_logits: bool,
    ) -> Result<usize, GpuError> {
        let b = &self.backend;
        let c = &*b.ctx;
        let s = &self.scratch;
        let h = b.config.n_embd;
        let v = b.config.vocab_size;
        self.hc_mix(rec, &b.head_hc, t)?;
        let (offset, rows) = if all_logits { (0, t) } else { ((t - 1) * h, 1) };
        let x = View::new(&s.x_in, offset, h);
        kernels::matvec(c, rec, &b.output, x, View::new(&s.logits, 0, v), rows)?;
        Ok(rows)
    }

    /// Diagnostic mode (`STRATA_GPU_CHECK=1`): run the chunk stage by stage, reading the residual
    /// back after each, so a non-finite value is reported at the first stage that produced it.
    /// It runs the whole chunk, leaving the logits in `scratch.logits` as `record` would.
    fn run_checked(
        &mut self,
        t: usize,
        pos0: usize,
        all_logits: bool,
    ) -> Result<usize, EngineError> {
        let b = Arc::clone(&self.backend);
        let c = &*b.ctx;
        let wide = b.config.n_embd * b.config.hc_count;
        let layers = self.layers.len();
        for stage in 0..=layers + 1 {
            let mut rec = Recorder::with_cache(std::mem::take(&mut self.bind_groups));
            let recorded = match stage {
                0 => self
                    .record_embedding(&mut rec, t)
                    .map(|_| 0)
                    .map_err(gpu_err),
                s if s <= layers => self.record_layer(&mut rec, s - 1, t, pos0).map(|_| 0),
                _ => self.record_head(&mut rec, t, all_logits).map_err(gpu_err),
            };
            self.bind_groups = rec.take_cache();
            let rows = recorded?;
            rec.run(c).map_err(gpu_err)?;
            if stage > layers {
                return Ok(rows);
            }
            let values = self
                .scratch
                .wide
                .read_f32(c, 0, t * wide)
                .map_err(gpu_err)?;
            if let Some(bad) = first_non_finite(&values) {
                let name = match stage {
                    0 => "token embedding".to_string(),
                    s => {
                        let kind = match b.layers.get(s - 1).map(|l| &l.mixer) {
                            Some(MixerGpu::Gdn(_)) => "GDN",
                            _ => "QSA attention",
                        };
                        format!("layer {} ({kind}) output", s - 1)
                    }
                };
                return Err(EngineError::NonFinite {
                    stage: name,
                    position: pos0 + bad / wide,
                });
            }
        }
        Err(EngineError::Other("stage loop ended early".into()))
    }

    /// Host side of PLE: hash the n-gram rows of each chunk token and dequantize them.
    fn upload_ple_rows(&self, pos0: usize, t: usize) -> Result<(), EngineError> {
        let b = &self.backend;
        let Some(pc) = &b.config.ple else {
            return Ok(());
        };
        let Some(table) = b
            .weights
            .layers
            .get(pc.layer)
            .and_then(|l| l.ple.as_ref())
            .map(|p| &p.table)
        else {
            return Ok(());
        };
        let dim = pc.embed_dim();
        if let Some(reader) = &b.ple_reader {
            let mut table_rows = Vec::with_capacity(t * pc.n_heads());
            let mut positions = Vec::with_capacity(t);
            for i in 0..t {
                let context =
                    ngram_context(&self.tokens[..pos0 + i + 1], pc.ngram_size, pc.eos_token_id);
                table_rows.extend(hash_rows(pc, &context));
                positions.push(pos0 + i);
            }
            let mut raw = Vec::new();
            let mut rows = Vec::with_capacity(t * dim);
            reader
                .gather_dequantized(&table_rows, &positions, &mut raw, &mut rows)
                .map_err(ple_error)?;
            if rows.len() != t * dim {
                return Err(EngineError::Other(format!(
                    "PLE rows hold {} values for {t} tokens of {dim}",
                    rows.len()
                )));
            }
            if let Some(bad) = first_non_finite(&rows) {
                return Err(EngineError::NonFinite {
                    stage: "PLE table rows".into(),
                    position: pos0 + bad / dim,
                });
            }
            return self
                .scratch
                .ple_embedding
                .write_f32(&b.ctx, 0, &rows)
                .map_err(gpu_err);
        }
        let mut rows = vec![0.0f32; t * dim];
        for i in 0..t {
            let context =
                ngram_context(&self.tokens[..pos0 + i + 1], pc.ngram_size, pc.eos_token_id);
            for (head, row) in hash_rows(pc, &context).into_iter().enumerate() {
                let row = usize::try_from(row).unwrap_or(usize::MAX);
                let out =
                    &mut rows[i * dim + head * pc.head_dim..i * dim + (head + 1) * pc.head_dim];
                table
                    .dequantize_row(row, out)
                    .map_err(|e| EngineError::Other(e.to_string()))?;
            }
        }
        if let Some(bad) = first_non_finite(&rows) {
            return Err(EngineError::NonFinite {
                stage: "PLE table rows".into(),
                position: pos0 + bad / dim,
            });
        }
        self.scratch
            .ple_embedding
            .write_f32(&b.ctx, 0, &rows)
            .map_err(gpu_err)
    }

    /// One chunk through the model. Returns the logits (all rows or the last), or with `greedy`
    /// the argmax of the last row as a single-element vector (only 8 bytes are read back).
    fn feed_chunk(
        &mut self,
        chunk: &[u32],
        all_logits: bool,
        greedy: bool,
    ) -> Result<Vec<f32>, EngineError> {
        let pos0 = self.tokens.len();
        let t = chunk.len();
        self.tokens.extend_from_slice(chunk);
        let b = Arc::clone(&self.backend);
        let c = &*b.ctx;
        self.scratch.ids.write_u32(c, 0, chunk).map_err(gpu_err)?;
        self.upload_ple_rows(pos0, t)?;
        // Diagnostic mode runs the forward stage by stage (the recorder below then only adds the
        // greedy argmax, if any, and the readback).
        let checked_rows = if b.check_stages {
            Some(self.run_checked(t, pos0, all_logits && !greedy)?)
        } else {
            None
        };
        let mut rec = Recorder::with_cache(std::mem::take(&mut self.bind_groups));
        let v = b.config.vocab_size;
        let recorded = match checked_rows {
            Some(rows) => Ok(rows),
            None => self.record(&mut rec, t, pos0, all_logits && !greedy),
        }
        .and_then(|rows| {
            if greedy {
                ops::argmax(
                    c,
                    &mut rec,
                    &self.scratch.logits,
                    v,
                    1,
                    &self.scratch.greedy,
                )
                .map_err(gpu_err)?;
            }
            Ok(rows)
        });
        self.bind_groups = rec.take_cache();
        let rows = recorded?;
        let (source, size) = if greedy {
            (&self.scratch.greedy, 8u64)
        } else {
            (&self.scratch.logits, (rows * v * 4) as u64)
        };
        let staging = c.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("logits readback"),
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut encoder = c
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("token"),
            });
        let timestamps = if self.profile {
            rec.timestamps(c)
        } else {
            None
        };
        rec.encode(&mut encoder, timestamps.as_ref().map(|t| &t.set));
        if let Some(t) = &timestamps {
            t.resolve(&mut encoder);
        }
        encoder.copy_buffer_to_buffer(&source.buffer, 0, &staging, 0, size);
        c.queue.submit([encoder.finish()]);
        let bytes = read_staging(c, &staging).map_err(gpu_err)?;
        if let Some(t) = &timestamps {
            self.timings.extend(t.read(c, &rec).map_err(gpu_err)?);
        }
        if greedy {
            let words: Vec<u32> = bytemuck::pod_collect_to_vec(&bytes);
            return match words.as_slice() {
                // A token id (< vocab < 2^24) is exact as an f32.
                [id, 0] => Ok(vec![*id as f32]),
                _ => Err(EngineError::NonFinite {
                    stage: "GPU logits".into(),
                    position: pos0 + t - 1,
                }),
            };
        }
        let logits: Vec<f32> = bytemuck::pod_collect_to_vec(&bytes);
        if let Some(bad) = first_non_finite(&logits) {
            let row = bad / v.max(1);
            let position = if all_logits { pos0 + row } else { pos0 + t - 1 };
            return Err(EngineError::NonFinite {
                stage: "GPU logits".into(),
                position,
            });
        }
        Ok(logits)
    }
}

impl GpuSequence {
    /// Feed `tokens` and return the greedy next token (argmax of the last logits row, lowest id on
    /// ties), computed on the GPU: the host reads back 8 bytes instead of the logits row.
    pub fn feed_greedy(&mut self, tokens: &[u32]) -> Result<u32, EngineError> {
        self.validate(tokens)?;
        let Some((last, rest)) = tokens.split_last() else {
            return Err(EngineError::Other(
                "feed_greedy needs at least one token".into(),
            ));
        };
        let result = (|| {
            if !rest.is_empty() {
                for chunk in rest.chunks(self.backend.max_chunk) {
                    self.feed_chunk(chunk, false, false)?;
                }
            }
            self.feed_chunk(std::slice::from_ref(last), false, true)
        })();
        match result {
            Ok(v) => Ok(v.first().copied().unwrap_or(0.0) as u32),
            Err(e) => {
                self.poisoned = true;
                Err(e)
            }
        }
    }

    fn validate(&self, tokens: &[u32]) -> Result<(), EngineError> {
        if self.poisoned {
            return Err(EngineError::Other(
                "sequence is unusable after an earlier error".into(),
            ));
        }
        let vocab = self.backend.config.vocab_size;
        if let Some(&id) = tokens.iter().find(|&&id| id as usize >= vocab) {
            return Err(EngineError::BadToken { id, vocab });
        }
        let ctx = self.backend.info.context_length;
        let needed = self.tokens.len() + tokens.len();
        if needed > ctx {
            return Err(EngineError::ContextOverflow { needed, ctx });
        }
        Ok(())
    }

    /// Turn per-dispatch GPU timestamps on or off for later feeds.
    pub fn set_profiling(&mut self, on: bool) {
        self.profile = on;
    }

    /// The (dispatch label, nanoseconds) pairs collected since the last call.
    pub fn take_timings(&mut self) -> Vec<(String, f64)> {
        std::mem::take(&mut self.timings)
    }
}

impl GpuSequence {
    /// A deep copy: a fresh sequence whose state buffers are GPU-side copies of ours.
    fn try_fork(&self) -> Result<GpuSequence, GpuError> {
        let mut copy = GpuSequence::new(Arc::clone(&self.backend))?;
        let c = &*self.backend.ctx;
        let mut encoder = c
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("fork"),
            });
        let mut pairs: Vec<(&GpuBuf, &GpuBuf)> = Vec::new();
        for (src, dst) in self.layers.iter().zip(&copy.layers) {
            match (src, dst) {
                (LayerState::Gdn { conv: a, ssm: b }, LayerState::Gdn { conv: x, ssm: y }) => {
                    pairs.extend([(a, x), (b, y)]);
                }
                (
                    LayerState::Qsa {
                        keys: a,
                        values: b,
                        raw_index_keys: i,
                        block_keys: k,
                    },
                    LayerState::Qsa {
                        keys: w,
                        values: x,
                        raw_index_keys: y,
                        block_keys: z,
                    },
                ) => pairs.extend([(a, w), (b, x), (i, y), (k, z)]),
                _ => return Err(GpuError::BadArgs("layer state kinds differ".into())),
            }
        }
        pairs.push((&self.scratch.ple_history, &copy.scratch.ple_history));
        for (src, dst) in pairs {
            encoder.copy_buffer_to_buffer(
                &src.buffer,
                0,
                &dst.buffer,
                0,
                (src.len.max(1) * 4) as u64,
            );
        }
        c.queue.submit([encoder.finish()]);
        c.wait()?;
        copy.tokens = self.tokens.clone();
        Ok(copy)
    }
}

impl Sequence for GpuSequence {
    fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    fn feed(&mut self, tokens: &[u32], all_logits: bool) -> Result<Vec<f32>, EngineError> {
        self.validate(tokens)?;
        if tokens.is_empty() {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        let chunk = if all_logits {
            self.backend.max_chunk.min(LOGIT_ROWS)
        } else {
            self.backend.max_chunk
        };
        let chunks: Vec<&[u32]> = tokens.chunks(chunk).collect();
        let last = chunks.len() - 1;
        for (i, chunk) in chunks.into_iter().enumerate() {
            let want = all_logits || i == last;
            match self.feed_chunk(chunk, all_logits, false) {
                Ok(logits) => {
                    if want {
                        out.extend_from_slice(&logits);
                    }
                }
                Err(e) => {
                    self.poisoned = true;
                    return Err(e);
                }
            }
        }
        Ok(out)
    }

    fn fork(&self) -> Option<Box<dyn Sequence>> {
        if self.poisoned {
            return None;
        }
        match self.try_fork() {
            Ok(seq) => Some(Box::new(seq)),
            Err(e) => {
                tracing::warn!("GPU sequence fork failed: {e}");
                None
            }
        }
    }
}

/// True when a load error looks like a failed VRAM allocation.
fn is_out_of_memory(e: &anyhow::Error) -> bool {
    let text = format!("{e:#}").to_lowercase();
    text.contains("out of memory") || text.contains("outofmemory")
}

/// Adapter index from `STRATA_ADAPTER` (the CLI's `--adapter` where a subcommand offers it).
pub fn adapter_from_env() -> Option<usize> {
    std::env::var("STRATA_ADAPTER")
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

/// Load for the CLI. `required`: `--backend gpu` (any error is returned). Otherwise (`auto`) the
/// GPU is used only when a hardware adapter (not a software rasterizer such as lavapipe) is
/// usable; `Ok(None)` tells the caller to fall back to the CPU.
pub fn load_for_cli(
    gguf: Arc<Gguf>,
    ctx_len: usize,
    required: bool,
) -> anyhow::Result<Option<Arc<dyn Backend>>> {
    load_for_cli_with(gguf, ctx_len, required, &TierArgs::default())
}

/// [`load_for_cli`] with the memory-tier options. Asking for tiers (`--vram-budget`) makes a GPU
/// load failure an error rather than a silent fall back to the CPU.
pub fn load_for_cli_with(
    gguf: Arc<Gguf>,
    ctx_len: usize,
    required: bool,
    tiers: &TierArgs,
) -> anyhow::Result<Option<Arc<dyn Backend>>> {
    let adapter = adapter_from_env();
    if !required {
        // Decide from the adapter list before creating any device: `auto` on a machine with only
        // a software rasterizer should cost nothing.
        let software = format!("{:?}", wgpu::DeviceType::Cpu);
        let adapters = list_adapters();
        let chosen = match adapter {
            Some(i) => adapters.get(i),
            None => adapters.first(),
        };
        match chosen {
            Some(a) if a.device_type != software && a.has_subgroups => {}
            Some(a) => {
                tracing::info!(
                    "only a software or unsuitable adapter ({}); using the CPU",
                    a.name
                );
                return Ok(None);
            }
            None => {
                tracing::info!("no GPU adapter; using the CPU");
                return Ok(None);
            }
        }
    }
    let ctx = match GpuContext::new(adapter) {
        Ok(c) => c,
        Err(e) if !required => {
            tracing::info!("no GPU ({e}); using the CPU");
            return Ok(None);
        }
        Err(e) => return Err(e.into()),
    };
    match GpuBackend::load_with(ctx, gguf, ctx_len, tiers) {
        Ok(b) => Ok(Some(Arc::new(b))),
        Err(e) if tiers.vram_budget.is_none() && is_out_of_memory(&e) => Err(e.context(
            "the GPU ran out of memory with every weight resident; pass --vram-budget SIZE to \
             keep only some experts in VRAM",
        )),
        Err(e) if !required && tiers.vram_budget.is_none() => {
            tracing::warn!("GPU load failed ({e:#}); using the CPU");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}
