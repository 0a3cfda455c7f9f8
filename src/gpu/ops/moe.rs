//! Launchers for shaders/moe.wgsl: the router (`moe_router`), the prefill grouping
//! (`moe_group`), the hot/cold split of the router's choices (`moe_split_ids`) and the combine
//! (`moe_combine`, `moe_combine_hc`).

use super::{need, u, words};
use crate::gpu::buffers::GpuBuf;
use crate::gpu::kernels::Recorder;
use crate::gpu::pipelines::PipelineKey;
use crate::gpu::{GpuContext, GpuError};

/// The router entry point for `n_expert` experts choosing `k`: the register router (`moe.wgsl`'s
/// `moe_router`) up to 1,024 experts (4 per invocation) and k up to 16 (its candidate room), else
/// the wide one. Chosen from the shape alone, so every run of a model takes the same one.
pub fn router_entry(n_expert: usize, k: usize) -> &'static str {
    if n_expert <= 1024 && k <= 16 {
        "moe_router"
    } else {
        "moe_router_wide"
    }
}

/// Softmax router with top-k (in place on the logits).
#[allow(clippy::too_many_arguments)]
pub fn moe_router(
    ctx: &GpuContext,
    rec: &mut Recorder,
    logits: &GpuBuf,
    ids: &GpuBuf,
    weights: &GpuBuf,
    n_expert: usize,
    k: usize,
    tokens: usize,
) -> Result<(), GpuError> {
    let entry = router_entry(n_expert, k);
    moe_router_entry(ctx, rec, entry, logits, ids, weights, n_expert, k, tokens)
}

/// [`moe_router`] through a given entry point of [`router_entry`]'s (the bench times each).
#[allow(clippy::too_many_arguments)]
pub fn moe_router_entry(
    ctx: &GpuContext,
    rec: &mut Recorder,
    entry: &'static str,
    logits: &GpuBuf,
    ids: &GpuBuf,
    weights: &GpuBuf,
    n_expert: usize,
    k: usize,
    tokens: usize,
) -> Result<(), GpuError> {
    if k > n_expert || k == 0 {
        return Err(GpuError::BadArgs(format!(
            "router of {n_expert} experts choosing {k}: it takes 1 to {n_expert}"
        )));
    }
    need(logits, tokens * n_expert, "router logits")?;
    need(ids, tokens * k, "router ids")?;
    need(weights, tokens * k, "router weights")?;
    rec.push(
        ctx,
        &PipelineKey::new("moe", entry),
        &[
            (0, &*logits.buffer),
            (1, &*ids.buffer),
            (2, &*weights.buffer),
        ],
        &words(&[u(tokens)?, u(n_expert)?, u(k)?, 0, 0, 0]),
        // One workgroup per token (grid x wraps at 65535 into y, as the shader expects).
        [u(tokens.min(65535))?, u(tokens.div_ceil(65535))?, 1],
    )
}

/// Groups the chunk's `tokens * k` routed items by expert for prefill (`moe.wgsl`'s `moe_group`):
/// `groups[e]` counts expert e's items, listed in ascending order from `groups[n_expert + e *
/// tokens]` (see [`group_len`]).
pub fn moe_group(
    ctx: &GpuContext,
    rec: &mut Recorder,
    ids: &GpuBuf,
    groups: &GpuBuf,
    n_expert: usize,
    k: usize,
    tokens: usize,
) -> Result<(), GpuError> {
    need(ids, tokens * k, "router ids")?;
    need(groups, group_len(n_expert, tokens), "expert groups")?;
    rec.push(
        ctx,
        &PipelineKey::new("moe", "moe_group"),
        &[(1, &*ids.buffer), (9, &*groups.buffer)],
        &words(&[u(tokens)?, u(n_expert)?, u(k)?, 0, 0, 0]),
        [u(n_expert)?, 1, 1],
    )
}

/// Split `items` router choices `ids` between a layer's hot experts in VRAM and the host tensor,
/// through `map` = (the expert map, this layer's offset in it): `hot[i]` = the expert's unit
/// (or `u32::MAX`), `cold[i]` = `ids[i]` when that is `u32::MAX`, else `u32::MAX`. The choices
/// are also copied to `log` = (buffer, offset). See moe.wgsl's `moe_split_ids`.
#[allow(clippy::too_many_arguments)]
pub fn moe_split_ids(
    ctx: &GpuContext,
    rec: &mut Recorder,
    ids: &GpuBuf,
    map: (&GpuBuf, usize),
    n_expert: usize,
    (hot, cold, stage): (&GpuBuf, &GpuBuf, &GpuBuf),
    log: (&GpuBuf, usize),
    items: usize,
) -> Result<(), GpuError> {
    need(ids, items, "router ids")?;
    need(map.0, map.1 + n_expert, "expert slot map")?;
    need(hot, items, "hot expert ids")?;
    need(cold, items, "cold expert ids")?;
    need(stage, items, "staged expert ids")?;
    need(log.0, log.1 + items, "routing log")?;
    rec.push(
        ctx,
        &PipelineKey::new("moe", "moe_split_ids"),
        &[
            (1, &*ids.buffer),
            (10, &*map.0.buffer),
            (11, &*hot.buffer),
            (12, &*cold.buffer),
            (13, &*log.0.buffer),
            (14, &*stage.buffer),
        ],
        &words(&[u(items)?, u(n_expert)?, u(map.1)?, u(log.1)?, 0, 0]),
        [u(items.div_ceil(64))?, 1, 1],
    )
}

/// Words of [`moe_group`]'s output for `tokens` tokens: a count and a list of up to `tokens`
/// items per expert.
pub fn group_len(n_expert: usize, tokens: usize) -> usize {
    n_expert * (1 + tokens)
}

/// Checks the combine's inputs; returns the shared-expert output and gate buffers to bind (the
/// routing weights stand in when there is no shared expert) and the has-shared flag.
fn combine_inputs<'a>(
    expert_out: &GpuBuf,
    weights: &'a GpuBuf,
    shared: Option<(&'a GpuBuf, &'a GpuBuf)>,
    h: usize,
    k: usize,
    tokens: usize,
) -> Result<(&'a GpuBuf, &'a GpuBuf, u32), GpuError> {
    need(expert_out, tokens * k * h, "expert outputs")?;
    need(weights, tokens * k, "routing weights")?;
    match shared {
        Some((sh, sg)) => {
            need(sh, tokens * h, "shared expert output")?;
            need(sg, tokens, "shared gate")?;
            Ok((sh, sg, 1))
        }
        None => Ok((weights, weights, 0)),
    }
}

/// y = sum_slot w * expert_out (+ sigmoid(shared_gate) * shared).
#[allow(clippy::too_many_arguments)]
pub fn moe_combine(
    ctx: &GpuContext,
    rec: &mut Recorder,
    expert_out: &GpuBuf,
    weights: &GpuBuf,
    shared: Option<(&GpuBuf, &GpuBuf)>,
    y: &GpuBuf,
    h: usize,
    k: usize,
    tokens: usize,
) -> Result<(), GpuError> {
    need(y, tokens * h, "moe output")?;
    let (sh, sg, has) = combine_inputs(expert_out, weights, shared, h, k, tokens)?;
    rec.push(
        ctx,
        &PipelineKey::new("moe", "moe_combine"),
        &[
            (3, &*expert_out.buffer),
            (4, &*weights.buffer),
            (5, &*sh.buffer),
            (6, &*sg.buffer),
            (7, &*y.buffer),
        ],
        &words(&[u(tokens)?, 0, u(k)?, u(h)?, has, 0]),
        [u(h.div_ceil(64))?, u(tokens)?, 1],
    )
}

/// [`moe_combine`] added into the wide residual (`hc` streams of `h`) with the injection weights
/// of `inject`, as [`hc_combine`] adds a block output.
///
/// [`hc_combine`]: super::hc_combine
#[allow(clippy::too_many_arguments)]
pub fn moe_combine_hc(
    ctx: &GpuContext,
    rec: &mut Recorder,
    expert_out: &GpuBuf,
    weights: &GpuBuf,
    shared: Option<(&GpuBuf, &GpuBuf)>,
    wide: &GpuBuf,
    inject: &GpuBuf,
    h: usize,
    hc: usize,
    k: usize,
    tokens: usize,
) -> Result<(), GpuError> {
    need(wide, tokens * h * hc, "residual")?;
    need(inject, tokens * hc, "injection logits")?;
    let (sh, sg, has) = combine_inputs(expert_out, weights, shared, h, k, tokens)?;
    rec.push(
        ctx,
        &PipelineKey::new("moe", "moe_combine_hc"),
        &[
            (3, &*expert_out.buffer),
            (4, &*weights.buffer),
            (5, &*sh.buffer),
            (6, &*sg.buffer),
            (7, &*wide.buffer),
            (8, &*inject.buffer),
        ],
        &words(&[u(tokens)?, 0, u(k)?, u(h)?, has, u(hc)?]),
        [u(h.div_ceil(64))?, u(tokens)?, 1],
    )
}
