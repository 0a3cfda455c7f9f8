//! Tiered experts on the GPU (issue 5): a VRAM arena of expert slots filled on demand from the
//! host tier, so a model whose routed experts do not fit in VRAM still runs — with the same bits.
//!
//! Why placement cannot change the result: the slot arena of each projection (gate, up, down) is
//! laid out exactly like the all-resident expert tensor (`n_slots` units of one expert's rows, split
//! by whole units into buffers no bigger than one binding), and the MoE step runs the very same
//! `kernels::matvec_expert` launcher on it, with slot indices where the resident path has expert
//! indices. Each output element is one fixed-order reduction over one expert row, which does not
//! depend on where that row sits in VRAM, on how many items a dispatch covers, or on which other
//! experts share the arena. The tests compare logits byte for byte across placements.
//!
//! Cost: the router's choices must reach the host before the slots can be filled, so tiered mode
//! synchronises once per layer (submit, read back `tokens × k` ids), plus once per extra sub-batch
//! when a prefill chunk's experts do not all fit in the slots at once.
//!
//! Concurrency: the slot table and the arena are shared by every sequence of the backend. A
//! sequence holds the tier lock from the slot assignment until the dispatches that read the slots
//! are submitted; uploads of a later holder are queued behind that submission (wgpu orders
//! `write_buffer` before the *next* submission), so no kernel ever sees a slot change under it.

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use crate::engine::EngineError;
use crate::gguf::Gguf;
use crate::gguf::types::GgmlType;
use crate::model::weights::QuantMatrix;
use crate::tiers::layout::ExpertRole;
use crate::tiers::ple_reader::PleReaderStats;
use crate::tiers::{
    ExpertKey, ExpertProfile, ExpertSlotCache, HostExperts, MemoryPlan, PlanLimits, TierArgs,
    format_size,
};

use super::buffers::{GpuWeight, WeightPart};
use super::layout;
use super::{GpuContext, GpuError};

/// Plan limits of this adapter: its real binding limit and alignment, one sequence, and work
/// buffers for prefill chunks of `prefill_chunk` tokens (the planner's estimate).
pub fn plan_limits(ctx: &GpuContext, prefill_chunk: usize) -> PlanLimits {
    PlanLimits {
        max_binding_bytes: ctx.max_binding_bytes(),
        alignment: u64::from(ctx.limits.min_storage_buffer_offset_alignment).max(4),
        sequences: 1,
        prefill_chunk,
        ..PlanLimits::default()
    }
}

/// The plan for `--vram-budget budget`, as the backend makes it at load.
pub fn plan_for_budget(
    ctx: &GpuContext,
    gguf: &Gguf,
    context_length: usize,
    prefill_chunk: usize,
    budget: u64,
    kv: crate::model::config::KvType,
) -> anyhow::Result<MemoryPlan> {
    let limits = PlanLimits {
        kv,
        ..plan_limits(ctx, prefill_chunk)
    };
    Ok(MemoryPlan::compute(gguf, context_length, budget, &limits)?)
}

/// Expert-tier counters for `strata bench` and the tests.
#[derive(Debug, Clone, Default)]
pub struct TierStats {
    /// VRAM expert slots (0 when every expert is resident).
    pub slots: usize,
    pub total_experts: u64,
    pub hits: u64,
    pub misses: u64,
    /// (hits, misses) per layer, indexed by layer number.
    pub per_layer: Vec<(u64, u64)>,
    /// Bytes uploaded into slots on misses (after the start-up fill).
    pub bytes_uploaded: u64,
    /// Experts and bytes placed at start from the profile.
    pub preloaded: u64,
    pub bytes_preloaded: u64,
    /// Host time spent checking and queueing miss uploads.
    pub upload_seconds: f64,
    /// Pinned experts: hot-unit promotions so far (their bytes are in `bytes_uploaded`).
    pub promotions: u64,
    /// Extra sub-batches prefill needed because a chunk's experts did not fit the slots at once.
    pub extra_sub_batches: u64,
    /// PLE row reader counters (None when the table is read from memory).
    pub ple: Option<PleReaderStats>,
}

impl TierStats {
    /// Hits / (hits + misses); 0 before any lookup.
    pub fn hit_rate(&self) -> f64 {
        let total = self.hits + self.misses;
        if total == 0 {
            0.0
        } else {
            self.hits as f64 / total as f64
        }
    }

    /// Upload bandwidth in GB/s (10^9 bytes) over the host time spent uploading.
    pub fn upload_gb_per_s(&self) -> f64 {
        if self.upload_seconds > 0.0 {
            self.bytes_uploaded as f64 / self.upload_seconds / 1e9
        } else {
            0.0
        }
    }
}

/// Shape of one routed projection, the same in every layer (checked at load).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ProjectionShape {
    ty: GgmlType,
    row_len: usize,
    rows: usize,
}

impl ProjectionShape {
    fn of(m: &QuantMatrix) -> Self {
        ProjectionShape {
            ty: m.ty,
            row_len: m.cols,
            rows: m.rows,
        }
    }
}

/// An expert-shaped arena of `n_slots` units, zero-filled, split by whole units like an uploaded
/// expert tensor so `matvec_expert` addresses it the same way.
fn empty_arena(
    ctx: &GpuContext,
    name: &str,
    shape: ProjectionShape,
    n_slots: usize,
) -> Result<GpuWeight, GpuError> {
    let bad = |m: String| GpuError::BadArgs(format!("expert slot arena {name}: {m}"));
    let block = shape.ty.block_size().max(1);
    let row_bytes = shape.row_len / block * shape.ty.type_size();
    let unit_bytes = row_bytes
        .checked_mul(shape.rows)
        .ok_or_else(|| bad("size overflows".into()))?;
    // Slot uploads go through `queue.write_buffer`, whose offsets and sizes are multiples of 4.
    if unit_bytes == 0 || !unit_bytes.is_multiple_of(4) {
        return Err(bad(format!(
            "one expert is {unit_bytes} bytes, not a multiple of 4, so it cannot be uploaded into \
             a slot; run without --vram-budget (every expert resident)"
        )));
    }
    let limit = ctx.max_binding_bytes().min(u32::MAX as u64 - 16) as usize;
    if unit_bytes > limit {
        return Err(bad(format!(
            "one expert of {unit_bytes} bytes exceeds the binding limit of {limit} bytes"
        )));
    }
    let split = layout::split_d(shape.ty);
    let blocks = shape.row_len / block;
    if split.is_some_and(|sd| !(shape.rows * layout::head_row_bytes(sd, blocks)).is_multiple_of(4))
    {
        return Err(bad(format!(
            "one expert has an odd number of {} blocks, so its scales cannot be uploaded into a \
             slot; run without --vram-budget (every expert resident)",
            shape.ty.name()
        )));
    }
    let units_per_part = (limit.saturating_sub(32) / unit_bytes).max(1);
    let mut parts = Vec::new();
    let mut unit = 0;
    while unit < n_slots {
        let count = units_per_part.min(n_slots - unit);
        let rows = count * shape.rows;
        let (size, d_base) = match split {
            Some(sd) => (
                layout::split_part_bytes(sd, blocks, rows),
                layout::split_sizes(sd, blocks, rows).1,
            ),
            None => (count * unit_bytes, 0),
        };
        let buffer = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(name),
            size: size as u64,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        parts.push(WeightPart {
            buffer,
            first_row: unit * shape.rows,
            n_rows: rows,
            d_base,
        });
        unit += count;
    }
    let row_stride = split.map_or(row_bytes, |sd| blocks * sd.body_bytes());
    Ok(GpuWeight {
        name: name.to_string(),
        ty: shape.ty,
        row_len: shape.row_len,
        n_rows: n_slots * shape.rows,
        row_bytes,
        row_stride,
        split,
        rows_per_unit: shape.rows,
        parts,
    })
}

/// Queue `bytes` (one expert's rows) into unit `slot` of `arena`.
fn write_slot(
    ctx: &GpuContext,
    arena: &GpuWeight,
    slot: usize,
    bytes: &[u8],
) -> Result<(), GpuError> {
    let unit_bytes = arena.row_bytes * arena.rows_per_unit;
    if bytes.len() != unit_bytes {
        return Err(GpuError::BadArgs(format!(
            "{}: {} bytes for a slot of {unit_bytes}",
            arena.name,
            bytes.len()
        )));
    }
    let row = slot * arena.rows_per_unit;
    let part = arena
        .parts
        .iter()
        .find(|p| row >= p.first_row && row < p.first_row + p.n_rows)
        .ok_or_else(|| GpuError::BadArgs(format!("{}: no slot {slot}", arena.name)))?;
    let local = row - part.first_row;
    match arena.split {
        Some(sd) => {
            // One unit in the split layout: its body rows, then its d rows (see gpu::layout).
            let blocks = arena.row_len / arena.ty.block_size();
            let rows = arena.rows_per_unit;
            let packed = layout::split_rows(sd, blocks, rows, bytes);
            let (body_row, d_base) = layout::split_sizes(sd, blocks, rows);
            let d_row = layout::head_row_bytes(sd, blocks);
            let d_len = rows * d_row;
            ctx.queue.write_buffer(
                &part.buffer,
                (local * arena.row_stride) as u64,
                &packed[..body_row * rows],
            );
            ctx.queue.write_buffer(
                &part.buffer,
                (part.d_base + local * d_row) as u64,
                &packed[d_base..d_base + d_len],
            );
        }
        None => {
            let offset = local * arena.row_bytes;
            ctx.queue.write_buffer(&part.buffer, offset as u64, bytes);
        }
    }
    Ok(())
}

/// The three slot arenas the expert kernels read in tiered mode.
pub(crate) struct SlotArenas {
    pub gate: GpuWeight,
    pub up: GpuWeight,
    pub down: GpuWeight,
}

/// Mutable tier state, behind the tier lock.
pub(crate) struct TierState {
    cache: ExpertSlotCache,
    /// Routing observed since load (what `--expert-profile` would preload next time).
    observed: ExpertProfile,
    upload_seconds: f64,
    extra_sub_batches: u64,
}

/// Routed experts served through VRAM slots from the host tier.
pub(crate) struct ExpertTier {
    pub arenas: SlotArenas,
    host: HostExperts,
    state: Mutex<TierState>,
    pub n_slots: usize,
    n_expert: usize,
    total_experts: u64,
    /// Write the observed profile here when the backend is dropped (the `--expert-profile` file
    /// when it did not exist at load).
    save_profile_to: Option<PathBuf>,
}

impl ExpertTier {
    /// Build the tier for `plan.expert_slots` slots. `experts[layer] = (gate, up, down)` views of
    /// the layers' expert tensors (for their shapes).
    pub fn new(
        ctx: &GpuContext,
        gguf: std::sync::Arc<Gguf>,
        plan: &MemoryPlan,
        tiers: &TierArgs,
        experts: &[(&[QuantMatrix], &[QuantMatrix], &[QuantMatrix])],
        n_expert: usize,
    ) -> anyhow::Result<ExpertTier> {
        let n_slots = usize::try_from(plan.expert_slots)?;
        let first = |list: &[QuantMatrix], role: &str| {
            list.first()
                .map(ProjectionShape::of)
                .ok_or_else(|| anyhow::anyhow!("a layer has no routed {role} experts"))
        };
        let Some(&(g0, u0, d0)) = experts.first() else {
            anyhow::bail!("the model has no routed experts to tier");
        };
        let shapes = [first(g0, "gate")?, first(u0, "up")?, first(d0, "down")?];
        for (layer, &(g, u, d)) in experts.iter().enumerate() {
            for (list, shape) in [g, u, d].into_iter().zip(shapes) {
                if list.len() != n_expert || list.iter().any(|m| ProjectionShape::of(m) != shape) {
                    anyhow::bail!(
                        "layer {layer}: routed experts differ in number, shape or type from layer \
                         0; the expert slots need one shape (run without --vram-budget)"
                    );
                }
            }
        }
        let arenas = SlotArenas {
            gate: empty_arena(ctx, "expert slots gate", shapes[0], n_slots)?,
            up: empty_arena(ctx, "expert slots up", shapes[1], n_slots)?,
            down: empty_arena(ctx, "expert slots down", shapes[2], n_slots)?,
        };
        let host = HostExperts::new(gguf, tiers.experts.source(), tiers.ram_budget)?;
        let mut cache = ExpertSlotCache::new(n_slots, host.expert_bytes_per_layer());
        let (profile, save_profile_to) = match &tiers.expert_profile {
            Some(path) if path.exists() => (ExpertProfile::load(path)?, None),
            Some(path) => (
                ExpertProfile::uniform(experts.len() as u32, n_expert as u32),
                Some(path.clone()),
            ),
            None => (
                ExpertProfile::uniform(experts.len() as u32, n_expert as u32),
                None,
            ),
        };
        let tier = ExpertTier {
            arenas,
            host,
            state: Mutex::new(TierState {
                cache: ExpertSlotCache::new(0, Vec::new()),
                observed: ExpertProfile::new(),
                upload_seconds: 0.0,
                extra_sub_batches: 0,
            }),
            n_slots,
            n_expert,
            total_experts: plan.total_experts,
            save_profile_to,
        };
        for placed in cache.preload(&profile)? {
            tier.upload(ctx, placed.key, placed.slot)?;
        }
        tier.lock().cache = cache;
        ctx.wait()?;
        Ok(tier)
    }

    pub fn lock(&self) -> MutexGuard<'_, TierState> {
        // A poisoned lock means another sequence panicked mid-step; the slot table is only
        // updated after its uploads were queued, so it still describes the arena.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Check one expert's scales (rule 2) and queue its bytes into `slot` of the three arenas.
    fn upload(&self, ctx: &GpuContext, key: ExpertKey, slot: u32) -> anyhow::Result<()> {
        self.host.check_expert(key)?;
        let expert = self.host.expert(key)?;
        let slot = slot as usize;
        let (gate, up) = match (expert.part(ExpertRole::Gate), expert.part(ExpertRole::Up)) {
            (Some(g), Some(u)) => (g, u),
            _ => {
                let fused = expert.part(ExpertRole::GateUp).ok_or_else(|| {
                    anyhow::anyhow!("expert {key:?} has neither gate/up nor gate_up")
                })?;
                fused.split_at(fused.len() / 2)
            }
        };
        let down = expert
            .part(ExpertRole::Down)
            .ok_or_else(|| anyhow::anyhow!("expert {key:?} has no down projection"))?;
        write_slot(ctx, &self.arenas.gate, slot, gate)?;
        write_slot(ctx, &self.arenas.up, slot, up)?;
        write_slot(ctx, &self.arenas.down, slot, down)?;
        Ok(())
    }

    /// Make the experts of `expert_ids` (router output of one layer, `k` per token) resident and
    /// return the slot of each, in the same order. Misses are checked and queued for upload;
    /// the caller must submit the kernels that read them before releasing `state`.
    pub fn place(
        &self,
        ctx: &GpuContext,
        state: &mut TierState,
        layer: usize,
        expert_ids: &[u32],
    ) -> Result<Vec<u32>, EngineError> {
        let other = |e: String| EngineError::Other(e);
        let keys: Vec<ExpertKey> = expert_ids
            .iter()
            .map(|&e| {
                if (e as usize) < self.n_expert {
                    Ok(ExpertKey::new(layer as u32, e))
                } else {
                    Err(other(format!(
                        "layer {layer}: router chose expert {e} of {}",
                        self.n_expert
                    )))
                }
            })
            .collect::<Result<_, _>>()?;
        let assignments = state
            .cache
            .lookup_or_assign(&keys)
            .map_err(|e| other(e.to_string()))?;
        let started = Instant::now();
        let mut queued = std::collections::BTreeSet::new();
        for a in &assignments {
            if !a.hit && queued.insert(a.slot) {
                self.upload(ctx, a.key, a.slot)
                    .map_err(|e| other(format!("uploading expert: {e:#}")))?;
            }
        }
        state.upload_seconds += started.elapsed().as_secs_f64();
        state.observed.record_all(&keys);
        Ok(assignments.iter().map(|a| a.slot).collect())
    }

    /// Split the tokens of a chunk (`ids`: `k` per token) into consecutive runs whose distinct
    /// experts fit in the slots. Any grouping gives the same bits (the kernels are
    /// batch-invariant); consecutive runs keep the activations contiguous.
    pub fn sub_batches(&self, ids: &[u32], k: usize) -> Vec<std::ops::Range<usize>> {
        let tokens = ids.len() / k.max(1);
        let mut runs = Vec::new();
        let mut start = 0;
        let mut distinct = std::collections::BTreeSet::new();
        for token in 0..tokens {
            let mine = &ids[token * k..(token + 1) * k];
            let mut grown = distinct.clone();
            grown.extend(mine.iter().copied());
            if grown.len() > self.n_slots && token > start {
                runs.push(start..token);
                start = token;
                distinct = mine.iter().copied().collect();
            } else {
                distinct = grown;
            }
        }
        if tokens > start {
            runs.push(start..tokens);
        }
        runs
    }

    pub fn note_extra_sub_batches(&self, state: &mut TierState, n: usize) {
        state.extra_sub_batches += n as u64;
    }

    pub fn stats(&self) -> TierStats {
        let state = self.lock();
        let c = state.cache.stats();
        TierStats {
            slots: self.n_slots,
            total_experts: self.total_experts,
            hits: c.hits,
            misses: c.misses,
            per_layer: state.cache.per_layer().to_vec(),
            bytes_uploaded: c.bytes_uploaded,
            preloaded: c.preloaded,
            bytes_preloaded: c.bytes_preloaded,
            upload_seconds: state.upload_seconds,
            extra_sub_batches: state.extra_sub_batches,
            promotions: 0,
            ple: None,
        }
    }

    /// The routing seen since load, as an `--expert-profile` file would hold it.
    pub fn observed_profile(&self) -> ExpertProfile {
        self.lock().observed.clone()
    }

    /// One line per fact of the plan, printed at load.
    pub fn describe(&self, plan: &MemoryPlan) -> String {
        format!(
            "memory plan: budget {}, dense weights {}, KV cache {} ({} tokens), state {}, work {}; \
             {} of {} experts in VRAM slots ({} per slot), the rest from {} (host {})",
            format_size(plan.vram_budget),
            format_size(plan.dense_bytes),
            format_size(plan.kv_bytes),
            plan.ctx,
            format_size(plan.state_bytes),
            format_size(plan.work_bytes),
            self.n_slots,
            plan.total_experts,
            format_size(plan.slot_bytes),
            if self.host.ram_bytes() > 0 {
                "a RAM copy"
            } else {
                "the memory-mapped file"
            },
            format_size(plan.host_expert_bytes),
        )
    }
}

impl Drop for ExpertTier {
    fn drop(&mut self) {
        if let Some(path) = &self.save_profile_to {
            let profile = self.lock().observed.clone();
            if profile.is_empty() {
                return;
            }
            match profile.save(path) {
                Ok(()) => tracing::info!("expert profile written to {}", path.display()),
                Err(e) => tracing::warn!("writing the expert profile failed: {e}"),
            }
        }
    }
}
