//! Routed experts in pinned host memory (`--experts pinned`, or `auto` where the adapter can read
//! host memory): the GPU reads every expert in place over the bus, with no VRAM slots to fill and
//! no host round trip per layer; the hot experts of each layer also have a copy in VRAM
//! ([`HotExperts`]). `moe_split_ids` sends each routed item to its hot copy or to the host tensor
//! through the expert map, and logs the layer's choices; the host reads the log with the logits,
//! for the hit rate and the `--expert-profile` written at exit. The same kernel and the same
//! bytes either way, so where an expert is read from never changes a bit.

use std::path::PathBuf;
use std::sync::Mutex;

use super::*;
use crate::gpu::buffers::Placement;
use crate::tiers::{ExpertKey, ExpertProfile, ExpertsArg};

use super::load::upload_expert_units;

/// The pinned tier of a backend: the expert map the kernels read and the routing seen so far.
pub(super) struct PinnedExperts {
    /// Bytes of routed experts in host memory.
    pub bytes: u64,
    /// `layers x n_expert` entries: the unit of (layer, expert) in the layer's [`HotExperts`], or
    /// `u32::MAX`.
    pub map: GpuBuf,
    n_expert: usize,
    hot: usize,
    routing: Mutex<Routing>,
    /// Routed items per layer between promotion rounds (0: never promote).
    promote_every: std::sync::atomic::AtomicUsize,
    /// Write the observed profile here when dropped (`--expert-profile` naming a missing file).
    save_profile_to: Option<PathBuf>,
    /// Where decode steps copy their misses before the expert kernels read them (`None`: they
    /// read host memory in place).
    pub stage: Option<super::stage::ExpertStage>,
}

#[derive(Default)]
struct Routing {
    /// (hits, misses) per layer: items served by a hot copy, and by the host tensor.
    per_layer: Vec<(u64, u64)>,
    /// Every use of each expert since load, `[layer][expert]` (the profile written at exit).
    observed: Vec<Vec<u64>>,
    /// The host's copy of `map`.
    host_map: Vec<u32>,
    /// Recent use of each expert, `[layer][expert]`, halved after every promotion round.
    recent: Vec<Vec<u32>>,
    /// The expert each hot unit holds, `[layer][unit]`.
    units: Vec<Vec<u32>>,
    /// Routed items per layer counted since the last promotion round.
    since: usize,
    promotions: u64,
    promoted_bytes: u64,
}

/// One promotion: hot unit `unit` of `layer` takes `expert` in place of `evicted`.
pub(super) struct Swap {
    pub layer: usize,
    pub unit: usize,
    pub evicted: u32,
    pub expert: u32,
}

/// Tokens between promotion rounds (routed items per layer ÷ top-k), unless set otherwise.
const PROMOTE_EVERY_TOKENS: usize = 256;
/// Swaps per layer per round at most, so a round costs a bounded copy.
const MAX_SWAPS_PER_LAYER: usize = 8;

impl PinnedExperts {
    pub fn new(
        c: &GpuContext,
        bytes: u64,
        sets: &[Vec<u32>],
        n_expert: usize,
        n_expert_used: usize,
        tiers: &TierArgs,
        stage: Option<super::stage::ExpertStage>,
    ) -> Result<Self, GpuError> {
        let mut host_map = vec![u32::MAX; sets.len() * n_expert];
        for (layer, set) in sets.iter().enumerate() {
            for (unit, &e) in set.iter().enumerate() {
                host_map[layer * n_expert + e as usize] = unit as u32;
            }
        }
        let save_profile_to = tiers
            .expert_profile
            .as_ref()
            .filter(|path| !path.exists())
            .cloned();
        Ok(PinnedExperts {
            bytes,
            map: GpuBuf::from_u32(c, "expert map", &host_map)?,
            n_expert,
            hot: sets.iter().map(Vec::len).sum(),
            routing: Mutex::new(Routing {
                per_layer: vec![(0, 0); sets.len()],
                observed: vec![vec![0; n_expert]; sets.len()],
                recent: vec![vec![0; n_expert]; sets.len()],
                units: sets.to_vec(),
                host_map,
                ..Routing::default()
            }),
            promote_every: std::sync::atomic::AtomicUsize::new(
                PROMOTE_EVERY_TOKENS * n_expert_used,
            ),
            save_profile_to,
            stage,
        })
    }

    pub fn hot_experts(&self) -> usize {
        self.hot
    }

    /// Count one chunk's routing `log` (`t * k` expert ids per layer, layer by layer).
    pub fn record(&self, log: &[u32], items_per_layer: usize) {
        let n_expert = self.n_expert;
        let mut r = scratch::lock(&self.routing);
        r.since += items_per_layer;
        let Routing {
            per_layer,
            observed,
            recent,
            host_map,
            ..
        } = &mut *r;
        for (layer, (((ids, counts), recent), observed)) in log
            .chunks(items_per_layer.max(1))
            .zip(per_layer.iter_mut())
            .zip(recent.iter_mut())
            .zip(observed.iter_mut())
            .enumerate()
        {
            for &e in ids {
                if e as usize >= n_expert {
                    continue;
                }
                observed[e as usize] += 1;
                recent[e as usize] = recent[e as usize].saturating_add(1);
                if host_map[layer * n_expert + e as usize] == u32::MAX {
                    counts.1 += 1;
                } else {
                    counts.0 += 1;
                }
            }
        }
    }

    /// Routed items per layer between promotion rounds (0: never); tests set it low.
    pub fn set_promote_every(&self, items: usize) {
        self.promote_every
            .store(items, std::sync::atomic::Ordering::Relaxed);
    }

    /// When a round is due: the swaps that bring recently busy experts into the hot units of
    /// their layer in place of idle ones (an expert must have been used more than twice as often
    /// as the one it evicts, so the set does not churn), with the host's map updated; the caller
    /// copies the bytes and writes the GPU's map before the next submission. The choice depends
    /// only on the routing seen, so it is the same on every run, and it never changes a result's
    /// bits, only where bytes are read.
    pub fn due_swaps(&self) -> Vec<Swap> {
        let every = self
            .promote_every
            .load(std::sync::atomic::Ordering::Relaxed);
        let mut r = scratch::lock(&self.routing);
        if every == 0 || r.since < every {
            return Vec::new();
        }
        r.since = 0;
        let n_expert = self.n_expert;
        let mut swaps = Vec::new();
        let Routing {
            recent,
            units,
            host_map,
            ..
        } = &mut *r;
        for (layer, (recent, units)) in recent.iter_mut().zip(units.iter_mut()).enumerate() {
            if units.is_empty() {
                continue;
            }
            let mut hot: Vec<usize> = (0..units.len()).collect();
            hot.sort_by_key(|&u| (recent[units[u] as usize], units[u]));
            let is_hot = |e: u32| units.contains(&e);
            let mut cold: Vec<u32> = (0..n_expert as u32).filter(|&e| !is_hot(e)).collect();
            cold.sort_by_key(|&e| (std::cmp::Reverse(recent[e as usize]), e));
            for (&unit, &expert) in hot.iter().zip(&cold).take(MAX_SWAPS_PER_LAYER) {
                let evicted = units[unit];
                if recent[expert as usize] <= 2 * recent[evicted as usize] + 1 {
                    break;
                }
                swaps.push(Swap {
                    layer,
                    unit,
                    evicted,
                    expert,
                });
            }
            for s in swaps.iter().filter(|s| s.layer == layer) {
                units[s.unit] = s.expert;
                host_map[layer * n_expert + s.evicted as usize] = u32::MAX;
                host_map[layer * n_expert + s.expert as usize] = s.unit as u32;
            }
            for c in recent.iter_mut() {
                *c /= 2;
            }
        }
        drop(r);
        swaps
    }

    /// Count applied swaps and the bytes they copied.
    pub fn note_swaps(&self, swaps: usize, bytes: u64) {
        let mut r = scratch::lock(&self.routing);
        r.promotions += swaps as u64;
        r.promoted_bytes += bytes;
    }

    pub fn stats(&self) -> TierStats {
        let r = scratch::lock(&self.routing);
        TierStats {
            slots: self.hot,
            total_experts: r.host_map.len() as u64,
            hits: r.per_layer.iter().map(|c| c.0).sum(),
            misses: r.per_layer.iter().map(|c| c.1).sum(),
            per_layer: r.per_layer.clone(),
            bytes_uploaded: r.promoted_bytes,
            promotions: r.promotions,
            ..TierStats::default()
        }
    }

    pub fn observed_profile(&self) -> ExpertProfile {
        let r = scratch::lock(&self.routing);
        let mut profile = ExpertProfile::new();
        for (layer, counts) in r.observed.iter().enumerate() {
            for (expert, &n) in counts.iter().enumerate() {
                if n > 0 {
                    profile.add(ExpertKey::new(layer as u32, expert as u32), n);
                }
            }
        }
        profile
    }
}

impl Drop for PinnedExperts {
    fn drop(&mut self) {
        let Some(path) = &self.save_profile_to else {
            return;
        };
        let profile = self.observed_profile();
        if profile.is_empty() {
            return;
        }
        match profile.save(path) {
            Ok(()) => tracing::info!("expert profile written to {}", path.display()),
            Err(e) => tracing::warn!("writing the expert profile failed: {e}"),
        }
    }
}

/// Bytes of every routed expert of the model (gate, up and down of every layer).
pub(super) fn routed_expert_bytes(weights: &Weights) -> u64 {
    let sum = |list: &[QuantMatrix]| list.iter().map(|m| m.bytes().len() as u64).sum::<u64>();
    weights
        .layers
        .iter()
        .map(|l| sum(&l.moe.gate) + sum(&l.moe.up) + sum(&l.moe.down))
        .sum()
}

/// The memory plan with pinned experts (see [`plan`]).
pub(super) struct PinnedPlan {
    pub plan: MemoryPlan,
    /// Tokens per prefill chunk it was made for.
    pub chunk: usize,
    /// VRAM bytes of the token embedding that the plan no longer counts (`None`: it still does,
    /// for a table tied to lm_head, whose VRAM copy its entry stands for, or where no plan with
    /// it left out fits).
    pub embedding: Option<u64>,
}

/// The name of the token embedding table in the file (and in the plan's dense tensors).
const TOKEN_EMBD_TENSOR: &str = "token_embd.weight";

/// The plan with pinned experts, given `plan` (made with every dense weight in VRAM, for
/// prefill chunks of `chunk`). Pinned experts take no VRAM but their hot copies, so the chunk
/// is planned as if every expert were resident: [`DEFAULT_MAX_CHUNK`] where it fits. The token
/// embedding (one row read per token) is in host memory too: the plan is made for the budget
/// plus the table's VRAM and the table then taken out of its dense weights, so the VRAM it would
/// have taken goes to hot expert copies. (A tied embedding is also lm_head, which stays in VRAM:
/// the plan keeps its entry.) `reserve` bytes of VRAM stay out of the plan (the decode stage).
/// Falls back to `plan` where no other fits.
pub(super) fn plan(
    ctx: &GpuContext,
    gguf: &Gguf,
    weights: &Weights,
    context_length: usize,
    (plan, chunk): (MemoryPlan, usize),
    reserve: u64,
) -> PinnedPlan {
    let tied = weights.output.name() == weights.token_embd.name();
    let embedding = plan
        .dense
        .iter()
        .find(|d| d.name == TOKEN_EMBD_TENSOR)
        .map(|d| d.vram_bytes)
        .filter(|_| !tied);
    let freed = embedding.unwrap_or(0);
    let budget = plan.vram_budget;
    for c in [DEFAULT_MAX_CHUNK, chunk] {
        let budget_now = budget.saturating_add(freed).saturating_sub(reserve);
        let Ok(mut p) = plan_for_budget(ctx, gguf, context_length, c, budget_now, plan.kv) else {
            continue;
        };
        p.vram_budget = budget;
        // The reserve is working memory of the plan (and so in its VRAM total).
        p.work_bytes = p.work_bytes.saturating_add(reserve);
        if embedding.is_some() {
            p.dense.retain(|d| d.name != TOKEN_EMBD_TENSOR);
            p.dense_bytes = p.dense_bytes.saturating_sub(freed);
        }
        return PinnedPlan {
            plan: p,
            chunk: c,
            embedding,
        };
    }
    PinnedPlan {
        plan,
        chunk,
        embedding: None,
    }
}

/// Which experts of each layer get a VRAM copy beside the pinned tensors: the `expert_slots` the
/// plan leaves room for, the most used of `--expert-profile` when the file exists, else the same
/// share of every layer.
pub(super) fn hot_expert_sets(
    tiers: &TierArgs,
    weights: &Weights,
    config: &Config,
    plan: &MemoryPlan,
) -> anyhow::Result<Vec<Vec<u32>>> {
    let n_layers = weights.layers.len();
    let n_expert = config.moe.n_expert;
    let profile = match &tiers.expert_profile {
        Some(path) if path.exists() => crate::tiers::ExpertProfile::load(path)?,
        _ => crate::tiers::ExpertProfile::uniform(n_layers as u32, n_expert as u32),
    };
    let slots = usize::try_from(plan.expert_slots)?;
    Ok(profile.hot_sets(n_layers, n_expert, slots))
}

/// The VRAM copy of a layer's hot experts `set` (`None` when it has none).
pub(super) fn upload_hot(
    c: &GpuContext,
    m: &crate::model::weights::MoeWeights,
    set: &[u32],
) -> Result<Option<HotExperts>, GpuError> {
    if set.is_empty() {
        return Ok(None);
    }
    Ok(Some(HotExperts {
        gate_up: upload_expert_units(
            c,
            "hot ffn_gate_up_exps",
            &[&m.gate, &m.up],
            set,
            Placement::Vram,
        )?,
        down: upload_expert_units(c, "hot ffn_down_exps", &[&m.down], set, Placement::Vram)?,
        experts: set.to_vec(),
    }))
}

/// Host memory left free beside pinned experts, so the system and the page cache keep room.
const PINNED_HOST_RESERVE: u64 = 2 << 30;

/// Whether experts that do not fit the VRAM budget go to pinned host memory (`--experts
/// pinned`, or `auto` when the adapter and the host allow it) rather than VRAM slots. An
/// explicit `pinned` that cannot be honoured is an error; `auto` falls back to slots and says why.
pub(super) fn choose_pinned(
    ctx: &GpuContext,
    tiers: &TierArgs,
    expert_bytes: u64,
) -> anyhow::Result<bool> {
    let why_not = if !ctx.has_host_storage() {
        Some(format!(
            "the adapter ({}) cannot read storage buffers in host memory",
            ctx.adapter.backend
        ))
    } else if let Some(budget) = tiers.ram_budget.filter(|&b| b < expert_bytes) {
        Some(format!(
            "the experts need {} of host RAM but --ram-budget is {}",
            format_size(expert_bytes),
            format_size(budget)
        ))
    } else {
        match crate::platform::memory::available_bytes() {
            Some(free) if free < expert_bytes + PINNED_HOST_RESERVE => Some(format!(
                "the experts need {} of host RAM (plus a reserve of {}) but the system has {} \
                 available",
                format_size(expert_bytes),
                format_size(PINNED_HOST_RESERVE),
                format_size(free)
            )),
            _ => None,
        }
    };
    match (tiers.experts, why_not) {
        (ExpertsArg::Pinned, Some(why)) => {
            anyhow::bail!(
                "--experts pinned: {why}; use --experts mmap (VRAM slots fed from the file)"
            )
        }
        (ExpertsArg::Pinned, None) => Ok(true),
        (ExpertsArg::Auto, None) => Ok(true),
        (ExpertsArg::Auto, Some(why)) => {
            eprintln!(
                "experts: {why}, so they are served through VRAM slots from the file (--experts mmap)"
            );
            Ok(false)
        }
        _ => Ok(false),
    }
}

impl GpuBackend {
    /// Pinned experts: run a promotion round when one is due (after a chunk's routing was
    /// recorded, with this feed's work finished): copy each newly hot expert from host memory into
    /// its unit, GPU-side, and point the map at it. Queued before the next submission, so no
    /// kernel sees a unit change under it.
    pub(super) fn promote_hot_experts(&self) -> Result<(), GpuError> {
        let Some(pinned) = &self.pinned else {
            return Ok(());
        };
        let swaps = pinned.due_swaps();
        if swaps.is_empty() {
            return Ok(());
        }
        let c = &*self.ctx;
        let mut encoder = c
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("promote hot experts"),
            });
        let mut bytes = 0u64;
        let n_expert = self.config.moe.n_expert;
        for s in &swaps {
            let Some(e) = self
                .layers
                .get(s.layer)
                .and_then(|l| l.moe.experts.as_ref())
            else {
                continue;
            };
            let Some(hot) = &e.hot else { continue };
            for (from, to) in [(&e.gate_up, &hot.gate_up), (&e.down, &hot.down)] {
                let (Some(src), Some(dst)) =
                    (from.unit_ranges(s.expert as usize), to.unit_ranges(s.unit))
                else {
                    return Err(GpuError::BadArgs(format!(
                        "layer {}: no unit for expert {} or hot unit {}",
                        s.layer, s.expert, s.unit
                    )));
                };
                for ((sb, so, len), (db, dof, dlen)) in src.into_iter().zip(dst) {
                    if len != dlen || len % 4 != 0 || so % 4 != 0 || dof % 4 != 0 {
                        return Err(GpuError::BadArgs(format!(
                            "{}: unit ranges of {len} and {dlen} bytes cannot be copied",
                            to.name
                        )));
                    }
                    encoder.copy_buffer_to_buffer(sb, so, db, dof, len);
                    bytes += len;
                }
            }
            let base = s.layer * n_expert;
            pinned
                .map
                .write_u32(c, base + s.evicted as usize, &[u32::MAX])?;
            pinned
                .map
                .write_u32(c, base + s.expert as usize, &[s.unit as u32])?;
        }
        c.queue.submit([encoder.finish()]);
        pinned.note_swaps(swaps.len(), bytes);
        Ok(())
    }
}
