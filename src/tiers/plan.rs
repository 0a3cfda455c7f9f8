//! The VRAM plan: what goes on the GPU, in which buffers, and how many expert slots are left.
//!
//! Order of claims on the budget (issue 5): dense weights, the KV/indexer cache for `ctx`, the
//! recurrent state, work buffers — then as many expert slots as fit, capped at the number of
//! experts. The PLE table never goes to VRAM (its rows are gathered on the host), and routed experts
//! only through slots. Every allocation is counted as the GPU will make it: each dense tensor split
//! by whole rows into buffers no bigger than one binding, every buffer rounded up to the binding
//! alignment, expert slots packed into arena buffers of at most one binding each. Nothing assumes
//! one big buffer (wgpu caps a binding at 128 MiB on lavapipe and 2 GiB − 4 B on the H200).

use std::fmt;

use crate::gguf::{Gguf, TensorInfo};
use crate::model::{Config, LayerKind, ModelError};

use super::layout::{LayerExperts, LayoutError, expert_layers_of, is_expert_tensor};
use super::size::ByteSize;

/// The PLE n-gram table: gathered by row on the host, never uploaded whole.
pub const PLE_TABLE_TENSOR: &str = "per_layer_token_embd.weight";

/// VRAM left free for the driver, the desktop and other processes when the budget comes from the
/// adapter's free memory (the original engine's default `--vram-reserve-mib` was 700).
pub const DEFAULT_VRAM_RESERVE: u64 = 700 << 20;

/// Why no VRAM budget could be settled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BudgetError {
    #[error(
        "the GPU does not report its free memory; pass --vram-budget SIZE (e.g. --vram-budget 12GiB)"
    )]
    Unknown,
    #[error(
        "the GPU reports only {} free, less than the {} reserve; pass --vram-budget SIZE to use it anyway",
        ByteSize(*free), ByteSize(*reserve)
    )]
    TooLittleFree { free: u64, reserve: u64 },
}

/// The budget to plan with: `--vram-budget` when given (taken as is, the user knows their machine),
/// otherwise what the adapter reports free minus [`DEFAULT_VRAM_RESERVE`]. wgpu 30 has no portable
/// free-memory query, so `reported_free` comes from the backend when it can tell (e.g. Vulkan's
/// memory-budget extension), and is `None` otherwise.
pub fn resolve_vram_budget(
    requested: Option<u64>,
    reported_free: Option<u64>,
) -> Result<u64, BudgetError> {
    if let Some(budget) = requested {
        return Ok(budget);
    }
    let free = reported_free.ok_or(BudgetError::Unknown)?;
    match free.checked_sub(DEFAULT_VRAM_RESERVE) {
        Some(budget) if budget > 0 => Ok(budget),
        _ => Err(BudgetError::TooLittleFree {
            free,
            reserve: DEFAULT_VRAM_RESERVE,
        }),
    }
}

/// Device limits and engine choices the plan depends on. `Default` is safe everywhere (lavapipe's
/// 128 MiB binding limit); the GPU backend passes the adapter's real limits.
#[derive(Debug, Clone)]
pub struct PlanLimits {
    /// Largest buffer one shader binding may cover: `min(max_storage_buffer_binding_size,
    /// max_buffer_size)` of the adapter.
    pub max_binding_bytes: u64,
    /// Every buffer (and every part inside an expert slot) starts at a multiple of this:
    /// `min_storage_buffer_offset_alignment`, 256 on every adapter we target.
    pub alignment: u64,
    /// Sequences decoded at once (each has its own KV cache and recurrent state).
    pub sequences: usize,
    /// Tokens per prefill chunk; sizes the work buffers.
    pub prefill_chunk: usize,
    /// The key/value cache's storage type (`--kv`). Indexer keys are f32.
    pub kv: crate::model::config::KvType,
    /// Replace the work-buffer estimate by a measured figure.
    pub work_bytes: Option<u64>,
}

impl Default for PlanLimits {
    fn default() -> Self {
        PlanLimits {
            max_binding_bytes: 128 << 20,
            alignment: 256,
            sequences: 1,
            prefill_chunk: 512,
            kv: crate::model::config::KvType::F32,
            work_bytes: None,
        }
    }
}

/// Why no plan could be made.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("cannot plan memory: {0}")]
    Config(#[from] ModelError),
    #[error("cannot plan memory: {0}")]
    Layout(#[from] LayoutError),
    #[error("cannot plan memory: {0}")]
    BadLimits(String),
    #[error(
        "tensor {tensor}: one row is {row_bytes} bytes, more than the largest GPU binding \
         ({max_binding_bytes} bytes), so it cannot be split into buffers"
    )]
    RowTooBig {
        tensor: String,
        row_bytes: u64,
        max_binding_bytes: u64,
    },
    #[error(
        "one expert slot needs {} but the largest GPU binding is {}",
        ByteSize(*slot_bytes), ByteSize(*max_binding_bytes)
    )]
    SlotTooBig {
        slot_bytes: u64,
        max_binding_bytes: u64,
    },
    #[error(
        "the model does not fit in the VRAM budget of {budget}: it needs at least {needed} \
         ({breakdown}); raise --vram-budget to at least {needed} or lower --ctx",
        budget = ByteSize(*budget), needed = ByteSize(*needed)
    )]
    DoesNotFit {
        needed: u64,
        budget: u64,
        breakdown: String,
    },
    #[error("size overflow while planning ({0})")]
    Overflow(&'static str),
}

/// A dense tensor as it will be allocated: one buffer per chunk of whole rows.
#[derive(Debug, Clone)]
pub struct DenseTensorPlan {
    pub name: String,
    pub n_bytes: u64,
    pub row_bytes: u64,
    /// Rows per buffer (the last buffer may hold fewer).
    pub rows_per_buffer: u64,
    pub buffers: usize,
    /// VRAM taken, each buffer rounded up to the alignment.
    pub vram_bytes: u64,
}

/// One layer's routed experts as they sit in a slot.
#[derive(Debug, Clone)]
pub struct LayerSlotLayout {
    pub layer: u32,
    pub n_experts: u32,
    /// Bytes of one expert (sum of its gate/up/down slices).
    pub bytes_per_expert: u64,
    /// Where each part (gate, up, down — or gate_up, down) starts inside a slot.
    pub part_offsets: Vec<u64>,
}

/// Where the PLE table lives (host / disk; never VRAM).
#[derive(Debug, Clone)]
pub struct PleTablePlan {
    pub shard: usize,
    pub n_bytes: u64,
    pub n_rows: u64,
    pub row_bytes: u64,
}

/// The VRAM plan made at load (and shown by `strata inspect --plan`).
#[derive(Debug, Clone)]
pub struct MemoryPlan {
    pub ctx: usize,
    pub vram_budget: u64,
    pub limits: PlanLimits,
    pub dense: Vec<DenseTensorPlan>,
    /// Sum of `dense[i].vram_bytes`.
    pub dense_bytes: u64,
    /// Attention layers with a KV cache (trunk QSA layers plus the MTP block, if any).
    pub kv_layers: usize,
    pub kv_bytes_per_token: u64,
    pub kv_bytes: u64,
    /// The key/value cache's storage type (the limits' `kv`).
    pub kv: crate::model::config::KvType,
    /// GDN conv + SSM state of every GDN layer and the PLE conv history, for all sequences.
    pub state_bytes: u64,
    pub work_bytes: u64,
    /// True when `work_bytes` is the built-in estimate rather than a given figure.
    pub work_estimated: bool,
    pub expert_layers: Vec<LayerSlotLayout>,
    /// Stride of one slot: big enough for the largest layer's expert, aligned.
    pub slot_bytes: u64,
    pub total_experts: u64,
    pub expert_slots: u64,
    /// The least a layer's decode step needs resident at once (experts per token).
    pub min_expert_slots: u64,
    pub slots_per_buffer: u64,
    pub slot_buffers: u64,
    /// Routed expert bytes as stored in the file (served from the host tier).
    pub host_expert_bytes: u64,
    pub ple_table: Option<PleTablePlan>,
}

fn checked_sum(values: &[u64]) -> Result<u64, PlanError> {
    values
        .iter()
        .try_fold(0u64, |acc, &v| acc.checked_add(v))
        .ok_or(PlanError::Overflow("VRAM total"))
}

fn mul(a: u64, b: u64, what: &'static str) -> Result<u64, PlanError> {
    a.checked_mul(b).ok_or(PlanError::Overflow(what))
}

fn to_u64(n: usize) -> u64 {
    n as u64 // usize is at most 64 bits on every target we build for
}

impl MemoryPlan {
    /// Plan `gguf` for a context of `ctx` tokens within `vram_budget` bytes.
    pub fn compute(
        gguf: &Gguf,
        ctx: usize,
        vram_budget: u64,
        limits: &PlanLimits,
    ) -> Result<MemoryPlan, PlanError> {
        let config = Config::from_gguf(gguf)?;
        MemoryPlan::compute_from(&config, gguf.tensors(), ctx, vram_budget, limits)
    }

    /// [`compute`](Self::compute) from a parsed config and the tensor list, without a file (for
    /// what-if planning of models not on disk).
    pub fn compute_from(
        config: &Config,
        tensors: &[TensorInfo],
        ctx: usize,
        vram_budget: u64,
        limits: &PlanLimits,
    ) -> Result<MemoryPlan, PlanError> {
        if limits.max_binding_bytes == 0 || !limits.alignment.is_power_of_two() {
            return Err(PlanError::BadLimits(format!(
                "max binding {} bytes and alignment {} (must be > 0 and a power of two)",
                limits.max_binding_bytes, limits.alignment
            )));
        }
        let align = |bytes: u64| bytes.next_multiple_of(limits.alignment);

        // Dense weights: everything that is neither a routed expert nor the PLE table.
        let mut dense = Vec::new();
        let mut ple_table = None;
        for tensor in tensors {
            if tensor.name == PLE_TABLE_TENSOR {
                ple_table = Some(PleTablePlan {
                    shard: tensor.shard,
                    n_bytes: tensor.n_bytes,
                    n_rows: tensor.n_rows(),
                    row_bytes: tensor.row_bytes(),
                });
                continue;
            }
            if is_expert_tensor(&tensor.name) {
                continue;
            }
            dense.push(plan_dense_tensor(tensor, limits)?);
        }
        let dense_bytes = checked_sum(&dense.iter().map(|d| d.vram_bytes).collect::<Vec<_>>())?;

        // KV + indexer cache: per attention layer and token, K and V for every KV head plus the
        // indexer key (one indexer KV head) on indexed layers.
        let attention = &config.attention;
        let mtp_layers = count_mtp_attention_layers(tensors, config.n_layer);
        // Bytes per token of one attention layer's caches.
        let kv_values_per_layer = |indexed: bool| {
            2 * to_u64(
                limits
                    .kv
                    .cache_bytes(attention.n_head_kv * attention.head_dim),
            ) + if indexed {
                to_u64(attention.indexer_head_dim) * 4
            } else {
                0
            }
        };
        let mut kv_values_per_token = 0u64;
        let mut kv_layers = 0usize;
        for kind in &config.layers {
            if let LayerKind::Qsa { compress_ratio } = kind {
                kv_values_per_token += kv_values_per_layer(compress_ratio.is_some());
                kv_layers += 1;
            }
        }
        // The MTP block is an indexed attention layer with its own cache (model-spec §2.11).
        kv_values_per_token += to_u64(mtp_layers) * kv_values_per_layer(true);
        kv_layers += mtp_layers;
        let kv_bytes_per_token = kv_values_per_token;
        let sequences = to_u64(limits.sequences.max(1));
        let kv_bytes = align(mul(
            mul(kv_bytes_per_token, to_u64(ctx), "KV cache")?,
            sequences,
            "KV cache",
        )?);

        // Recurrent state: GDN conv history + SSM matrix per GDN layer, PLE conv history.
        let gdn = &config.gdn;
        let gdn_values = to_u64((gdn.conv_kernel.saturating_sub(1)) * gdn.conv_channels())
            + to_u64(gdn.n_v_heads * gdn.head_k_dim * gdn.head_v_dim);
        let wide = to_u64(config.hc_count * config.n_embd);
        let ple_values = config
            .ple
            .as_ref()
            .map_or(0, |p| to_u64(p.conv_history()) * wide);
        let state_values = to_u64(config.n_gdn_layers()) * gdn_values + ple_values;
        let state_bytes = align(mul(mul(state_values, 4, "state")?, sequences, "state")?);

        let (work_bytes, work_estimated) = match limits.work_bytes {
            Some(bytes) => (bytes, false),
            None => (
                align(estimate_work_bytes(
                    config,
                    ctx,
                    limits,
                    ple_table.as_ref(),
                )?),
                true,
            ),
        };

        // Expert slots.
        let layers = expert_layers_of(tensors)?;
        let mut expert_layers = Vec::with_capacity(layers.len());
        let mut slot_bytes = 0u64;
        let mut total_experts = 0u64;
        let mut host_expert_bytes = 0u64;
        for layer in &layers {
            let (part_offsets, bytes) = layer.slot_layout(limits.alignment);
            slot_bytes = slot_bytes.max(bytes);
            total_experts += u64::from(layer.n_experts);
            host_expert_bytes += layer_tensor_bytes(layer);
            expert_layers.push(LayerSlotLayout {
                layer: layer.layer,
                n_experts: layer.n_experts,
                bytes_per_expert: layer.bytes_per_expert(),
                part_offsets,
            });
        }
        let slots_per_buffer = limits
            .max_binding_bytes
            .checked_div(slot_bytes)
            .unwrap_or(0);
        if slot_bytes > 0 && slots_per_buffer == 0 {
            return Err(PlanError::SlotTooBig {
                slot_bytes,
                max_binding_bytes: limits.max_binding_bytes,
            });
        }
        let min_expert_slots = to_u64(config.moe.n_expert_used).min(total_experts);

        let fixed = checked_sum(&[dense_bytes, kv_bytes, state_bytes, work_bytes])?;
        let needed = checked_sum(&[
            fixed,
            mul(min_expert_slots, slot_bytes, "minimum expert slots")?,
        ])?;
        if needed > vram_budget {
            let breakdown = format!(
                "dense weights {}, KV cache for {ctx} tokens {}, recurrent state {}, work buffers {}, \
                 {min_expert_slots} expert slots {}",
                ByteSize(dense_bytes),
                ByteSize(kv_bytes),
                ByteSize(state_bytes),
                ByteSize(work_bytes),
                ByteSize(min_expert_slots * slot_bytes),
            );
            return Err(PlanError::DoesNotFit {
                needed,
                budget: vram_budget,
                breakdown,
            });
        }
        let expert_slots = (vram_budget - fixed)
            .checked_div(slot_bytes)
            .map_or(0, |slots| slots.min(total_experts));
        let slot_buffers = if slots_per_buffer == 0 {
            0
        } else {
            expert_slots.div_ceil(slots_per_buffer)
        };

        Ok(MemoryPlan {
            ctx,
            vram_budget,
            limits: limits.clone(),
            dense,
            dense_bytes,
            kv_layers,
            kv_bytes_per_token,
            kv_bytes,
            kv: limits.kv,
            state_bytes,
            work_bytes,
            work_estimated,
            expert_layers,
            slot_bytes,
            total_experts,
            expert_slots,
            min_expert_slots,
            slots_per_buffer,
            slot_buffers,
            host_expert_bytes,
            ple_table,
        })
    }

    /// Bytes of one expert per layer number (0 for layers without experts): the argument of
    /// [`ExpertSlotCache::new`](super::ExpertSlotCache::new).
    pub fn expert_bytes_per_layer(&self) -> Vec<u64> {
        let n = self
            .expert_layers
            .iter()
            .map(|l| l.layer as usize + 1)
            .max()
            .unwrap_or(0);
        let mut sizes = vec![0; n];
        for layer in &self.expert_layers {
            if let Some(size) = sizes.get_mut(layer.layer as usize) {
                *size = layer.bytes_per_expert;
            }
        }
        sizes
    }

    /// VRAM used by the expert slots.
    pub fn expert_slot_bytes(&self) -> u64 {
        self.expert_slots * self.slot_bytes
    }

    /// Everything the plan allocates on the GPU.
    pub fn vram_total(&self) -> u64 {
        self.dense_bytes
            + self.kv_bytes
            + self.state_bytes
            + self.work_bytes
            + self.expert_slot_bytes()
    }

    /// Budget left over (less than one slot unless every expert is resident).
    pub fn vram_unused(&self) -> u64 {
        self.vram_budget.saturating_sub(self.vram_total())
    }

    /// How many slots buffer `index` of the expert arena holds (the last one may be partial).
    pub fn slots_in_buffer(&self, index: u64) -> u64 {
        let start = index.saturating_mul(self.slots_per_buffer);
        self.expert_slots
            .saturating_sub(start)
            .min(self.slots_per_buffer)
    }

    /// Number of GPU buffers the plan allocates.
    pub fn buffer_count(&self) -> u64 {
        let dense: u64 = self.dense.iter().map(|d| to_u64(d.buffers)).sum();
        // KV, state and work are counted as one buffer each per binding-sized piece.
        let pieces = |bytes: u64| bytes.div_ceil(self.limits.max_binding_bytes);
        dense
            + pieces(self.kv_bytes)
            + pieces(self.state_bytes)
            + pieces(self.work_bytes)
            + self.slot_buffers
    }
}

/// Bytes of all of a layer's expert tensors.
fn layer_tensor_bytes(layer: &LayerExperts) -> u64 {
    layer.parts.iter().map(|p| p.tensor.n_bytes).sum()
}

/// Attention layers past the trunk (the MTP block, `blk.<n_layer>.`) that carry a K projection.
fn count_mtp_attention_layers(tensors: &[TensorInfo], n_layer: usize) -> usize {
    let mut layers: Vec<usize> = tensors
        .iter()
        .filter_map(|t| {
            let rest = t.name.strip_prefix("blk.")?;
            let (layer, suffix) = rest.split_once('.')?;
            let layer: usize = layer.parse().ok()?;
            (suffix == "attn_k.weight" && layer >= n_layer).then_some(layer)
        })
        .collect();
    layers.sort_unstable();
    layers.dedup();
    layers.len()
}

fn plan_dense_tensor(
    tensor: &TensorInfo,
    limits: &PlanLimits,
) -> Result<DenseTensorPlan, PlanError> {
    let align = |bytes: u64| bytes.next_multiple_of(limits.alignment);
    // A hand-built info whose rows are not whole blocks is treated as one indivisible row.
    let row_bytes = match tensor.row_bytes() {
        0 => tensor.n_bytes,
        r => r,
    };
    if tensor.n_bytes <= limits.max_binding_bytes {
        return Ok(DenseTensorPlan {
            name: tensor.name.clone(),
            n_bytes: tensor.n_bytes,
            row_bytes,
            rows_per_buffer: tensor.n_rows(),
            buffers: 1,
            vram_bytes: align(tensor.n_bytes),
        });
    }
    let rows_per_buffer = limits.max_binding_bytes / row_bytes;
    if rows_per_buffer == 0 {
        return Err(PlanError::RowTooBig {
            tensor: tensor.name.clone(),
            row_bytes,
            max_binding_bytes: limits.max_binding_bytes,
        });
    }
    let n_rows = tensor.n_rows();
    let full_buffers = n_rows / rows_per_buffer;
    let last_rows = n_rows % rows_per_buffer;
    let buffers = full_buffers + u64::from(last_rows > 0);
    let vram_bytes =
        full_buffers * align(rows_per_buffer * row_bytes) + align(last_rows * row_bytes);
    Ok(DenseTensorPlan {
        name: tensor.name.clone(),
        n_bytes: tensor.n_bytes,
        row_bytes,
        rows_per_buffer,
        buffers: usize::try_from(buffers).map_err(|_| PlanError::Overflow("buffer count"))?,
        vram_bytes,
    })
}

/// A generous estimate of the scratch buffers of one prefill chunk (f32 activations), the
/// indexer's per-query scores over the whole context, one row of logits and the PLE staging.
/// The GPU backend can replace it by what it really allocates (`PlanLimits::work_bytes`).
fn estimate_work_bytes(
    config: &Config,
    ctx: usize,
    limits: &PlanLimits,
    ple_table: Option<&PleTablePlan>,
) -> Result<u64, PlanError> {
    let chunk = to_u64(limits.prefill_chunk.max(1));
    let attention = &config.attention;
    let gdn = &config.gdn;
    let wide = to_u64(config.hc_count * config.n_embd);
    let widest_projection = [
        to_u64(attention.n_head * attention.head_dim * 2), // query + output gate
        to_u64(gdn.conv_channels() + gdn.value_dim()),     // qkv + z
        to_u64(4 * config.n_embd),                         // PLE key projection
    ]
    .into_iter()
    .max()
    .unwrap_or(0);
    let moe_values =
        to_u64(config.moe.n_expert + config.moe.n_expert_used * config.moe.expert_ff * 3);
    // Residual streams in, out and normalised, two more for mixing, one for a mat-vec's input in
    // task order (the wide prefill tiles'; no input is wider than the residual streams), and the
    // widest projection twice.
    let per_token = 6 * wide + 2 * widest_projection + moe_values;
    let activations = mul(mul(chunk, per_token, "work")?, 4, "work")?;
    let has_indexer = config.layers.iter().any(|l| {
        matches!(
            l,
            LayerKind::Qsa {
                compress_ratio: Some(_)
            }
        )
    });
    let indexer_scores = if has_indexer {
        mul(
            mul(chunk, to_u64(ctx), "indexer scores")?,
            4,
            "indexer scores",
        )?
    } else {
        0
    };
    let logits = to_u64(config.vocab_size) * 4;
    let ple_staging = match (&config.ple, ple_table) {
        (Some(ple), Some(table)) => {
            // Raw rows in, f32 rows out, for every token of the chunk.
            chunk * to_u64(ple.n_heads()) * (table.row_bytes + to_u64(ple.head_dim) * 4)
        }
        _ => 0,
    };
    checked_sum(&[activations, indexer_scores, logits, ple_staging])
}

impl fmt::Display for MemoryPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dense_buffers: usize = self.dense.iter().map(|d| d.buffers).sum();
        let split = self.dense.iter().filter(|d| d.buffers > 1).count();
        writeln!(
            f,
            "VRAM plan: budget {}, context {} tokens × {} sequence(s), largest binding {}",
            ByteSize(self.vram_budget),
            self.ctx,
            self.limits.sequences.max(1),
            ByteSize(self.limits.max_binding_bytes)
        )?;
        writeln!(f, "  {:<18} {:>12}  detail", "part", "VRAM")?;
        writeln!(
            f,
            "  {:<18} {:>12}  {} tensors in {} buffers ({} split by rows)",
            "dense weights",
            ByteSize(self.dense_bytes),
            self.dense.len(),
            dense_buffers,
            split
        )?;
        writeln!(
            f,
            "  {:<18} {:>12}  {} attention layers × {} B/token",
            "KV + indexer",
            ByteSize(self.kv_bytes),
            self.kv_layers,
            self.kv_bytes_per_token
        )?;
        writeln!(
            f,
            "  {:<18} {:>12}  GDN conv + SSM state, PLE conv history",
            "recurrent state",
            ByteSize(self.state_bytes)
        )?;
        writeln!(
            f,
            "  {:<18} {:>12}  {}",
            "work buffers",
            ByteSize(self.work_bytes),
            if self.work_estimated {
                format!(
                    "estimate for {}-token prefill chunks",
                    self.limits.prefill_chunk
                )
            } else {
                "as given".to_string()
            }
        )?;
        let percent = if self.total_experts == 0 {
            0.0
        } else {
            100.0 * self.expert_slots as f64 / self.total_experts as f64
        };
        writeln!(
            f,
            "  {:<18} {:>12}  {} of {} experts ({percent:.1} %), {} per slot, {} buffer(s) of ≤ {} slots \
             (with pinned experts: hot copies)",
            "expert slots",
            ByteSize(self.expert_slot_bytes()),
            self.expert_slots,
            self.total_experts,
            ByteSize(self.slot_bytes),
            self.slot_buffers,
            self.slots_per_buffer
        )?;
        writeln!(
            f,
            "  {:<18} {:>12}  ({} unused)",
            "total",
            ByteSize(self.vram_total()),
            ByteSize(self.vram_unused())
        )?;
        writeln!(f, "host / disk:")?;
        writeln!(
            f,
            "  {:<18} {:>12}  all experts: pinned host memory read in place (--experts auto or \
             pinned), or the file (mmap) or a RAM copy feeding the slots",
            "routed experts",
            ByteSize(self.host_expert_bytes)
        )?;
        match &self.ple_table {
            Some(ple) => writeln!(
                f,
                "  {:<18} {:>12}  {} rows × {} B in shard {}, gathered by row",
                "PLE table",
                ByteSize(ple.n_bytes),
                ple.n_rows,
                ple.row_bytes,
                ple.shard + 1
            ),
            None => writeln!(f, "  {:<18} {:>12}", "PLE table", "none"),
        }
    }
}
