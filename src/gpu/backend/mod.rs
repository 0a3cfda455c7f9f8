//! The whole model on the GPU: dense weights in VRAM (the PLE table stays on the host, as the spec
//! recommends: its rows are hashed, gathered through the checked [`PleRowReader`] and dequantized
//! on the CPU), one compute pass and one submission per chunk of tokens, one host sync per chunk
//! (the logits readback).
//!
//! Routed experts are all resident (the default, and whenever `--vram-budget` leaves room for
//! every one), pinned (`pinned`: all in host memory the GPU reads in place, the hot ones copied
//! into VRAM), or tiered (`gpu::tiered`): VRAM slots filled from the host tier as the router asks,
//! at the cost of one sync per layer. All run the same expert kernel, so the bits agree.
//!
//! Bit-identity across chunk sizes: every kernel computes each output element with one fixed
//! reduction order that does not depend on how many tokens the dispatch covers, and the recurrent
//! kernels (GDN, conv histories) walk tokens in order inside one invocation.
//!
//! One file per block, as in `src/model/`: `hc` (hyper-connection mix), `ple`, `gdn`, `qsa`, `moe`;
//! around them `load` (upload, VRAM budget and plan), `scratch` (a sequence's buffers), `forward`
//! (a chunk through embedding, layers and head) and `sequence` (feeding, forks). This file holds
//! the weight and state types they share.

use std::sync::Arc;

use crate::engine::{Backend, EngineError, Fed, FeedItem, ModelInfo, Sequence};
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
use super::topk;
use super::{GpuContext, GpuError};
use crate::tiers::{MemoryPlan, PleReadError, PleRowReader, TierArgs, format_size};

/// Tokens a fresh sequence's attention caches hold: they grow (doubling, up to the context) as
/// the sequence gets longer, so a short conversation does not hold a whole context's cache.
pub const KV_INITIAL_TOKENS: usize = 4096;

/// Default cap on tokens per sequence on the GPU.
pub const DEFAULT_GPU_CONTEXT: usize = 32768;
/// Tokens per forward chunk (activation buffers are sized for this).
/// Tokens per prefill chunk with every weight resident: the routed experts of a chunk are grouped
/// by expert, so larger chunks share each expert's weight reads among more tokens.
pub const DEFAULT_MAX_CHUNK: usize = 512;
/// Tokens per prefill chunk where the memory plan keeps every expert resident with room for this
/// chunk's activations: four times the experts' weight reads shared.
pub const LARGE_MAX_CHUNK: usize = 2048;
/// Tokens per chunk under a VRAM budget (the planner counts the chunk's activations).
pub const BUDGET_MAX_CHUNK: usize = 64;
/// Logits rows a chunk can return: longer feeds that want every row run in chunks of this size.
const LOGIT_ROWS: usize = 64;
/// Chunks of at least this many tokens may run the routed experts grouped by expert
/// ([`GpuSequence::moe_experts_grouped`]); smaller ones per item. Both give the same bits.
const GROUPED_MIN_TOKENS: usize = 8;
/// Routed items per expert (on average) from which the grouped path pays: it reads each chosen
/// expert once for all its items in wide tiles, the per-item path once per item. Measured on the
/// H100 (48-layer synthetic file): at 8 tokens (80 items over 512 experts, about 1 per expert)
/// the grouped kernels took 54 ms of an 80 ms chunk, about 3x the per-item kernels' cost for as
/// many items; at 2,048 tokens (40 per expert) they are about 3x cheaper.
const GROUPED_ITEMS_PER_EXPERT: usize = 4;
/// The same with pinned experts, read over the bus: there the bytes an expert read saves count
/// most, and from about one item per expert on average a chunk's items share experts (64 tokens
/// x 10 of 512: about 365 distinct experts for 640 items).
const GROUPED_ITEMS_PER_HOST_EXPERT: usize = 1;

/// Whether a chunk of `t` tokens runs its routed experts grouped by expert (`k` of `n_expert`
/// per token; `host`: pinned experts read over the bus). Chosen from the shape and placement
/// mode alone; either way the bits are the same.
fn grouped_experts(t: usize, k: usize, n_expert: usize, host: bool) -> bool {
    let per_expert = if host {
        GROUPED_ITEMS_PER_HOST_EXPERT
    } else {
        GROUPED_ITEMS_PER_EXPERT
    };
    t >= GROUPED_MIN_TOKENS && t * k >= per_expert * n_expert
}

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
    /// The down projection finishes the MoE block in its store (`Store::MoeCombine`): the
    /// adapter binds enough buffers for it (decided at load).
    combine_in_store: bool,
}

/// The tiered slot arenas one MoE dispatch sequence reads: gate and up apart, SwiGLU on the
/// down projection's load.
#[derive(Clone, Copy)]
struct SlotExperts<'a> {
    gate: &'a GpuWeight,
    up: &'a GpuWeight,
    down: &'a GpuWeight,
}

/// The routed experts of one layer, whole: each expert's gate rows then its up rows in one
/// tensor, so one dispatch computes both. In VRAM, or in pinned host memory with the layer's hot
/// experts copied into VRAM (`hot`).
struct ResidentExperts {
    gate_up: GpuWeight,
    down: GpuWeight,
    hot: Option<HotExperts>,
}

/// A layer's hot experts in VRAM when the full tensors are in host memory: units in the order of
/// `experts` (ascending ids); the backend's expert map sends each routed id to its unit here.
struct HotExperts {
    gate_up: GpuWeight,
    down: GpuWeight,
    experts: Vec<u32>,
}

/// One place the items of a layer's routed experts are computed from: a fused gate|up and a down
/// tensor of `units` experts, and each item's unit in `ids` (`u32::MAX`: not from here). Each
/// source has its own gate|up output `gu` and item lists `groups` (grouped prefill), so the
/// sources' gate|up dispatches write different buffers.
#[derive(Clone, Copy)]
struct ExpertSource<'a> {
    gate_up: &'a GpuWeight,
    down: &'a GpuWeight,
    ids: &'a GpuBuf,
    units: usize,
    gu: &'a GpuBuf,
    groups: &'a GpuBuf,
}

struct MoeGpu {
    /// Router logits (group 0) and, with a shared expert, its gate logit (group 1).
    router: MultiProj,
    /// `None` in tiered mode: the experts come through the backend's slot arenas.
    experts: Option<ResidentExperts>,
    shared: Option<SharedGpu>,
    /// The layer's index (its own buffers in `Scratch::shared_gu_layers`).
    layer: usize,
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
    /// Tokens a fresh sequence's attention caches hold before they first grow (see
    /// [`GpuSequence::reserve_kv`]).
    kv_initial_tokens: usize,
    /// `STRATA_GPU_CHECK=1`: check the residual after every layer (slow; names the first bad stage).
    check_stages: bool,
    /// [`GpuBackend::set_prepare_ahead`]'s setting: 0 none (the environment and the adapter
    /// decide), 1 off, 2 on.
    prepare: std::sync::atomic::AtomicU8,
    weight_bytes: usize,
    /// Tiered mode: the expert slot arenas and their slot table (`None`: every expert resident).
    tier: Option<ExpertTier>,
    /// Routed experts in pinned host memory, read in place (`--experts pinned`; `None` when they
    /// are in VRAM or slots).
    pinned: Option<pinned::PinnedExperts>,
    /// The VRAM plan, when `--vram-budget` asked for one.
    plan: Option<MemoryPlan>,
    /// Checked PLE row gathers from the file (`None` for a model held in memory, whose table is
    /// read and checked by the weight view instead).
    ple_reader: Option<PleRowReader>,
    /// The chunk buffers every sequence shares (see `shared_scratch`), made on first use.
    scratch: std::sync::Mutex<Option<Arc<Scratch>>>,
    /// The token-wise buffers of batched feeds (see `batch`), made on first use.
    batch_scratch: std::sync::Mutex<Option<Arc<Scratch>>>,
    /// Bind groups of batched feeds, kept between them.
    batch_binds: std::sync::Mutex<BindGroupCache>,
    /// Batched passes run, and the sequence steps they carried.
    batched: [std::sync::atomic::AtomicUsize; 2],
    /// Held by a sequence's feed from its first dispatch to its readback: the shared chunk
    /// buffers serve one feed at a time.
    feed_lock: std::sync::Mutex<()>,
    _gguf: Arc<Gguf>,
}

mod batch;
pub use batch::BATCH_TOKENS;
mod forward;
mod gdn;
mod hc;
mod load;
mod moe;
mod pinned;
mod ple;
mod qsa;
mod scratch;
mod sequence;
mod stage;

impl GpuBackend {
    /// Bytes of routed experts the GPU reads from pinned host memory (0: none).
    pub fn pinned_expert_bytes(&self) -> u64 {
        self.pinned.as_ref().map_or(0, |p| p.bytes)
    }

    /// Experts the pinned tier's decode stage holds (`None`: misses are read in place).
    pub fn expert_stage_units(&self) -> Option<usize> {
        self.pinned.as_ref()?.stage.as_ref().map(|s| s.units)
    }

    /// Pinned experts: promotion rounds every `tokens` tokens of routing (0: never; the default
    /// is 256). Where bytes are read from never changes a result; tests set it low.
    pub fn set_promote_every(&self, tokens: usize) {
        if let Some(p) = &self.pinned {
            p.set_promote_every(tokens * self.config.moe.n_expert_used);
        }
    }

    /// Experts with a VRAM copy beside the pinned tensors (0 unless pinned).
    pub fn hot_expert_count(&self) -> usize {
        self.pinned.as_ref().map_or(0, |p| p.hot_experts())
    }

    /// Expert-tier and PLE-reader counters (hit rate, uploads, rows read); `None` when every
    /// expert is resident and the PLE table is read from memory.
    pub fn tier_stats(&self) -> Option<TierStats> {
        let ple = self.ple_reader.as_ref().map(|r| r.stats());
        if let Some(p) = &self.pinned {
            return Some(TierStats { ple, ..p.stats() });
        }
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

    /// The expert routing observed since load in tiered or pinned mode (save it with
    /// `ExpertProfile::save` and pass it as `--expert-profile` next time).
    pub fn observed_expert_profile(&self) -> Option<crate::tiers::ExpertProfile> {
        match (&self.tier, &self.pinned) {
            (Some(t), _) => Some(t.observed_profile()),
            (None, Some(p)) => Some(p.observed_profile()),
            (None, None) => None,
        }
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

    /// Tokens a fresh sequence's attention caches are made for (default
    /// [`KV_INITIAL_TOKENS`], at most the context); they grow as the sequence does. For tests.
    pub fn set_kv_initial_tokens(&mut self, n: usize) {
        self.kv_initial_tokens = n.max(1);
    }

    /// Tokens per GPU prefill chunk (the shared chunk buffers are sized for this many).
    pub fn max_chunk(&self) -> usize {
        self.max_chunk
    }

    /// Set the chunk size; chunk buffers made for another size are dropped (remade on use).
    pub fn set_max_chunk(&mut self, n: usize) {
        self.max_chunk = n.max(1);
        self.info.prefill_chunk = self.max_chunk;
        *self
            .scratch
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = None;
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

    /// Of [`Self::bytes_per_decoded_token`], the routed experts' bytes read from pinned host
    /// memory over the bus (0 unless `--experts pinned`).
    pub fn pinned_bytes_per_decoded_token(&self) -> usize {
        if self.pinned.is_none() {
            return 0;
        }
        let used = self.config.moe.n_expert_used;
        let n_expert = self.config.moe.n_expert.max(1);
        self.layers
            .iter()
            .filter_map(|l| l.moe.experts.as_ref())
            .map(|e| (e.gate_up.bytes() + e.down.bytes()) / n_expert * used)
            .sum()
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

    fn feed_many(&self, batch: &mut [FeedItem<'_>]) -> Vec<Result<Fed, EngineError>> {
        self.feed_batched(batch)
    }

    fn batched_passes(&self) -> (usize, usize) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.batched[0].load(Relaxed), self.batched[1].load(Relaxed))
    }

    /// With every expert in VRAM, [`RESIDENT_PARALLEL`]; otherwise (experts read over the bus or
    /// through slots) the engine's default.
    fn default_parallel(&self) -> usize {
        if self.tier.is_none() && self.pinned.is_none() {
            RESIDENT_PARALLEL
        } else {
            crate::engine::scheduler::DEFAULT_PARALLEL
        }
    }
}

/// Requests a server advances together by default when every expert is in VRAM: their decode
/// steps share batched passes. Measured on the H100 (48-layer synthetic file, `strata bench
/// --parallel`): 139 tok/s together at 4 sequences, 175 at 8, 191 at 16 (84 ms per step, too
/// slow a stream for each).
const RESIDENT_PARALLEL: usize = 8;

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
    /// `--kv f16`: the chunk's keys and values in f32 (normed and rotated there), before they
    /// are rounded into the caches (one float each otherwise).
    key_stage: GpuBuf,
    value_stage: GpuBuf,
    index_query: GpuBuf,
    /// A batch's raw index keys before they are copied into each sequence's cache (1 element
    /// outside a batch scratch).
    index_key_stage: GpuBuf,
    selected: GpuBuf,
    scores: GpuBuf,
    attended: GpuBuf,
    attn_parts: GpuBuf,
    // MoE
    router: GpuBuf,
    expert_ids: GpuBuf,
    /// Tiered mode: the slot of each (token, k) expert of the current sub-batch.
    /// Tiered: each item's slot. Pinned with hot copies: each item's hot unit (or `u32::MAX`).
    slot_ids: GpuBuf,
    /// Pinned with hot copies: each item's expert when it has no hot unit (else `u32::MAX`).
    cold_ids: GpuBuf,
    /// Pinned decode steps: each item's unit in the expert stage (`u32::MAX`: a hot copy).
    stage_ids: GpuBuf,
    expert_weights: GpuBuf,
    /// Gate then up outputs of each (token, expert), side by side.
    expert_gu: GpuBuf,
    /// Pinned with hot copies: [`Self::expert_gu`] of the items read from host memory, so the
    /// hot and cold gate|up dispatches write different buffers (1 element otherwise). wgpu still
    /// puts a barrier before each (see [`Self::shared_gu_layers`]): both outputs were used by
    /// earlier layers of the pass, and each reads an id list `moe_split_ids` just wrote (one
    /// barrier could cover both only if the two lists shared a buffer).
    cold_gu: GpuBuf,
    expert_down: GpuBuf,
    expert_groups: GpuBuf,
    /// Grouped prefill from hot copies: the hot units' item lists.
    hot_groups: GpuBuf,
    /// Pinned experts: every layer's router choices of the chunk (`t * k` per layer), read back
    /// with the logits for the hit rate and the observed profile.
    routing_log: GpuBuf,
    /// Gate then up outputs of the shared expert per token.
    shared_gu: GpuBuf,
    /// [`Self::shared_gu`] of each layer, for a decode step or a short chunk (fewer tokens than
    /// grouped prefill takes): a buffer no earlier dispatch of the pass used, so wgpu puts no
    /// barrier before the shared gate|up and it runs beside the router mat-vec. (wgpu-core puts
    /// one before every dispatch that writes a buffer an earlier dispatch of the same pass used,
    /// and on Vulkan a barrier waits for every earlier dispatch.)
    shared_gu_layers: Vec<GpuBuf>,
    shared_down: GpuBuf,
    /// [`Self::shared_down`] of each layer, for the same steps as [`Self::shared_gu_layers`]:
    /// where the block's finish is one dispatch (`GpuSequence::moe_resident_block`), the shared
    /// down projection runs beside the router's top-k (`GpuSequence::moe_route`), writing a
    /// buffer no earlier dispatch of the pass used.
    shared_down_layers: Vec<GpuBuf>,
    shared_logit: GpuBuf,
    // PLE
    ple_embedding: GpuBuf,
    ple_key: GpuBuf,
    ple_key_normed: GpuBuf,
    ple_value: GpuBuf,
    ple_query_normed: GpuBuf,
    ple_gated: GpuBuf,
    ple_conv_in: GpuBuf,
    logits: GpuBuf,
    greedy: GpuBuf,
    /// The two buffers the sampling-candidate passes alternate between (`crate::gpu::topk`).
    top_lists: [GpuBuf; 2],
    /// A batched pass: the logits rows whose candidates the GPU finds (its members' last rows).
    top_rows: GpuBuf,
}

pub struct GpuSequence {
    backend: Arc<GpuBackend>,
    tokens: Vec<u32>,
    layers: Vec<LayerState>,
    /// The PLE conv history (its ring of normalised rows).
    ple_history: GpuBuf,
    /// The backend's chunk buffers, shared with its other sequences.
    scratch: Arc<Scratch>,
    /// VRAM of this sequence's own buffers (`layers`, `ple_history`), counted at allocation.
    state_bytes: usize,
    /// Tokens the attention caches of `layers` have room for.
    kv_tokens: usize,
    poisoned: bool,
    /// Collect per-dispatch GPU timestamps on the next feed (see [`GpuSequence::take_timings`]).
    profile: bool,
    /// Time each feed's whole forward in one pass, with a timestamp at each end (see
    /// [`GpuSequence::set_span_timing`]).
    span: bool,
    timings: Vec<(String, f64)>,
    bind_groups: BindGroupCache,
    /// The next decode step, recorded while the GPU ran this one (`forward::Prepared`).
    next: Option<Box<forward::Prepared>>,
}
