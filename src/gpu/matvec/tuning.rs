//! The shapes a mat-vec runs in: workgroup and tile sizes, rows per subgroup, the K split, and
//! the environment knobs that override them for tuning. A row's bits never depend on them, except
//! the K split (see [`k_split`]).

use super::keys::any_length;
use super::{GpuContext, GpuWeight, View, XForm};
use crate::gguf::GgmlType;

/// Invocations per mat-vec workgroup (`STRATA_MATVEC_WG` overrides: 64, 128 or 256, for tuning).
pub(super) fn wg_size() -> usize {
    static WG: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *WG.get_or_init(|| {
        std::env::var("STRATA_MATVEC_WG")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|n| [64, 128, 256].contains(n))
            .unwrap_or(128)
    })
}

pub(super) const TILE: usize = 4;

/// Vectors per wide prefill tile (quant/rows_wide.wgsl, split layouts only): 16 unless
/// `STRATA_WIDE` (0 = off, 8, 12 or 16) says otherwise, for tuning. A row's bits never depend on it.
pub(super) fn wide_items() -> usize {
    static WIDE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *WIDE.get_or_init(|| {
        std::env::var("STRATA_WIDE")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|n| [0, 8, 12, 16].contains(n))
            .unwrap_or(16)
    })
}

/// Whether wide tiles read x in task order (`permute_x` in quant/rows_wide.wgsl): the lanes of a
/// subgroup, each on its own 32-value task, then load consecutive vec4s instead of vec4s 128
/// bytes apart. `STRATA_XPERM=0` turns it off, for comparison; the bits are the same either way.
pub(super) fn xperm() -> bool {
    static XPERM: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *XPERM.get_or_init(|| std::env::var("STRATA_XPERM").map_or(true, |v| v != "0"))
}

/// Row groups that share a subgroup in a wide tile (quant/rows_wide.wgsl's PACK): rows of `tasks`
/// 32-value tasks leave lanes `tasks..` of a subgroup idle when a lane takes whole tasks, so
/// `sg / tasks` groups share it where at least two fit (the Q8_0 HC up's 320-value rows: 3 on
/// 32-wide subgroups). Only without a K split, in the default arithmetic; `STRATA_PACK=0` turns it
/// off, for comparison. Every (row, vector) keeps its bits either way.
pub(super) fn wide_pack(ctx: &GpuContext, tasks: usize, split: usize, sg: usize) -> usize {
    static PACK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let on = *PACK.get_or_init(|| std::env::var("STRATA_PACK").map_or(true, |v| v != "0"));
    if !on || split != 1 || tasks == 0 || ctx.pipelines.limb() {
        return 1;
    }
    match sg / tasks {
        p if p >= 2 => p,
        _ => 1,
    }
}

/// The largest workgroup whose rounds and pairs fit the stash of the `matvec_wide_stash` assembly
/// (quant/rows_wide.wgsl; the plain `matvec_wide` one holds none).
const STASH_WG: usize = 128;

/// Whether the grouped expert wide tiles run rows of `tasks` 32-value tasks in rounds
/// (quant/rows_wide.wgsl's ROUNDS: three row groups in two rounds where a row's tasks fill more than
/// half and at most two thirds of a subgroup, the expert down's 640-value rows on 32 lanes), in the
/// default arithmetic on devices with subgroup barriers; `STRATA_ROUNDS=0` turns it off, for
/// comparison. Every (row, vector) keeps its bits either way.
pub(super) fn wide_rounds(ctx: &GpuContext, tasks: usize, sg: usize) -> bool {
    static ROUNDS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let on = *ROUNDS.get_or_init(|| std::env::var("STRATA_ROUNDS").map_or(true, |v| v != "0"));
    on && ctx.has_subgroup_barrier()
        && !ctx.pipelines.limb()
        && wg_size() <= STASH_WG
        && 2 * tasks > sg
        && 3 * tasks <= 2 * sg
}

/// Pairs for this process: 0 = as `STRATA_PAIRS` says (off unless it is 1), 1 = off, 2 = on.
static PAIRS_SET: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Turns the wide tiles' pairs on or off for this process, whatever `STRATA_PAIRS` says: the tests
/// that check their bits turn them on. Every (row, vector) keeps its bits either way.
pub fn set_wide_pairs(on: bool) {
    PAIRS_SET.store(if on { 2 } else { 1 }, std::sync::atomic::Ordering::Relaxed);
}

fn pairs_on() -> bool {
    static PAIRS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    match PAIRS_SET.load(std::sync::atomic::Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => *PAIRS.get_or_init(|| std::env::var("STRATA_PAIRS").is_ok_and(|v| v == "1")),
    }
}

/// Whether wide tiles run rows of `tasks` 32-value tasks in pairs (quant/rows_wide.wgsl's PAIRS:
/// two row groups in 2q + 1 rounds instead of 2q + 2 where a row has q S + S/2 tasks, q >= 1, the
/// 2,560-value rows on 32 lanes), without a K split, in the default arithmetic, on devices with
/// subgroup barriers. Off unless `STRATA_PAIRS=1` or [`set_wide_pairs`]: on an H100 the IQ3_S
/// expert gate|up took 277 ms per 512-token chunk in pairs against ~215 on the plain tiles, in a
/// tree where every wide entry also carried the stash (docs/bench/short-rows-ab-h100.txt); they
/// stay opt-in until measured again. Every (row, vector) keeps its bits either way, for the types
/// whose task has one scale and that the tests check at each subgroup size: Q8_0, IQ4_NL and
/// IQ3_S. (Q6_K, two scales a task, gave other bits than a decode step on lavapipe at subgroup
/// size 16, at 768 and 1,280 values: a few ulps in a sixth of the outputs, so rounding, not a
/// misplaced task; the compiler's handling of its two-scale sum is the suspect. Not taken.)
pub(super) fn wide_pairs(
    ctx: &GpuContext,
    ty: GgmlType,
    tasks: usize,
    split: usize,
    sg: usize,
) -> bool {
    let on = pairs_on();
    on && matches!(ty, GgmlType::Q8_0 | GgmlType::IQ4_NL | GgmlType::IQ3_S)
        && split == 1
        && wg_size() <= STASH_WG
        && ctx.has_subgroup_barrier()
        && !ctx.pipelines.limb()
        && sg >= 2
        && tasks > sg
        && tasks % sg == sg / 2
}

/// Rows per subgroup of the wide tiles (`STRATA_WIDE_ROWS`, 1 to 4, for tuning; default 4).
fn wide_rows() -> usize {
    static ROWS: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    ROWS.get_or_init(|| env_rows("STRATA_WIDE_ROWS"))
        .unwrap_or(4)
}

/// Whether a mat-vec of `w` over `x` may run in wide tiles: a split layout read plainly (the
/// transform already applied) by the split row body.
pub(super) fn wide_ok(w: &GpuWeight, x: View, xform: XForm) -> bool {
    wide_items() > 0 && w.split.is_some() && xform == XForm::Plain && !any_length(w, x, xform)
}

/// The adapter's subgroup size for sizing grids (32 when it reports none). Any actual size still
/// computes every row: the kernels loop over their row groups by the real subgroup count.
pub(super) fn subgroup_size(ctx: &GpuContext) -> usize {
    match ctx.adapter.subgroup_max_size {
        0 => 32,
        n => (n as usize).min(wg_size()),
    }
}

/// Rows per subgroup: for the split layouts, enough workgroups to fill a large GPU before sharing
/// x loads across rows (`STRATA_MATVEC_ROWS` overrides, for tuning); row pairs for the block
/// layouts. A row's bits do not depend on it.
pub(super) fn rows_per_subgroup(w: &GpuWeight, rows: usize) -> usize {
    if w.split.is_none() {
        return 2;
    }
    static ROWS: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    if let Some(n) = *ROWS.get_or_init(|| env_rows("STRATA_MATVEC_ROWS")) {
        return n;
    }
    match rows {
        r if r >= 8192 => 4,
        r if r >= 4096 => 2,
        _ => 1,
    }
}

/// Rows per subgroup for a dispatch of `tile`-vector tiles: prefill tiles (of `TILE` vectors) of
/// the split layouts take 4, sharing each x load among 4 rows; the rest as
/// [`rows_per_subgroup`].
fn rows_for_tile(w: &GpuWeight, rows: usize, tile: usize) -> usize {
    static PREFILL_ROWS: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    if tile == TILE && w.split.is_some() {
        PREFILL_ROWS
            .get_or_init(|| env_rows("STRATA_PREFILL_ROWS"))
            .unwrap_or(4)
    } else {
        rows_per_subgroup(w, rows)
    }
}

/// Rows per subgroup for `tile`-vector tiles: [`wide_rows`] for wide tiles, else
/// [`rows_for_tile`].
pub(super) fn tile_rows(w: &GpuWeight, rows: usize, tile: usize) -> usize {
    if tile > TILE {
        wide_rows()
    } else {
        rows_for_tile(w, rows, tile)
    }
}

/// A rows-per-subgroup override from the environment (1 to 4; for tuning, never for results),
/// read once per process by its caller.
fn env_rows(var: &str) -> Option<usize> {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|n| (1..=4).contains(n))
}

/// Subgroups that share each row of a dense mat-vec (the shader's KSPLIT), for matrices of few
/// long rows (up to 1,024 rows of 2,048 values or more), which would leave a large GPU mostly idle
/// with each lane walking tens of loop steps: 4; never more than a workgroup's subgroups. (On the
/// H200: 320 x 10,240 Q6_K 15.6 us unsplit, 12.9 split in 2, 11.6 in 4; the router's
/// 513 x 2,560 F32 15.1, 12.0, 10.9; 2,560 x 6,144 rows got slower split.) It changes a row's summation order, so it depends on the weight and the
/// adapter only, never on the number of vectors: prefill and decode agree. (The expert entry
/// points keep 1.) `STRATA_MATVEC_KSPLIT` (1, 2, 4 or 8) overrides it for every dense weight, for
/// tuning only: it changes the bits of the rows it touches.
pub(super) fn k_split(ctx: &GpuContext, w: &GpuWeight) -> usize {
    // The limb arithmetic folds a row's tasks in order within one subgroup.
    if ctx.pipelines.limb() && crate::gpu::shaders::limb_supported(w.ty) {
        return 1;
    }
    static KSPLIT: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let tuned = *KSPLIT.get_or_init(|| {
        std::env::var("STRATA_MATVEC_KSPLIT")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|n| [1, 2, 4, 8].contains(n))
    });
    let want = match (w.n_rows, w.row_len) {
        _ if tuned.is_some() => tuned.unwrap_or(1),
        (r, _) if r > 1024 => 1,
        (_, k) if k >= 2048 => 4,
        _ => 1,
    };
    want.min((wg_size() / subgroup_size(ctx)).max(1))
}

/// The smaller wide tile, for batches of decode steps (8 to 15 vectors left after the wide tiles).
pub(super) const SMALL_WIDE: usize = 8;

/// Whether a remainder of 8 to 15 vectors takes one wide tile of 8 (`STRATA_SMALL_WIDE=1`) or
/// tiles of `TILE`.
pub(super) fn small_wide() -> bool {
    static SMALL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SMALL.get_or_init(|| std::env::var("STRATA_SMALL_WIDE").is_ok_and(|v| v == "1"))
}

/// The fewest vectors a wide tile takes.
pub(super) fn least_wide() -> usize {
    let wide = wide_items();
    if wide > SMALL_WIDE && small_wide() {
        SMALL_WIDE
    } else {
        wide
    }
}

/// Row groups (of [`glu_pairs`] gate|up pairs) per workgroup of
/// [`matvec_expert_glu`](super::matvec_expert_glu): one per subgroup unless `STRATA_GLU_WG_ROWS` (1
/// to 256, for tuning) says otherwise; the subgroups take them in turn. A row's bits never depend
/// on it.
pub(super) fn glu_rows_per_wg() -> Option<usize> {
    static ROWS: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *ROWS.get_or_init(|| {
        std::env::var("STRATA_GLU_WG_ROWS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|n| (1..=256).contains(n))
    })
}

/// Gate|up row pairs per subgroup of [`matvec_expert_glu`](super::matvec_expert_glu) (the shader's
/// ROWS / 2): 1 unless `STRATA_GLU_PAIRS` (1 or 2, for tuning) says otherwise. A row's bits never
/// depend on it.
pub(super) fn glu_pairs() -> usize {
    static PAIRS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *PAIRS.get_or_init(|| {
        std::env::var("STRATA_GLU_PAIRS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|n| [1, 2].contains(n))
            .unwrap_or(1)
    })
}

/// Invocations of a [`matvec_expert_combine`](super::matvec_expert_combine) workgroup: one subgroup
/// per slot (320 for 10 slots on 32-wide subgroups), so that every slot's row dot runs at once
/// (H200, 8 layers: the kernel 38.6 -> 34.5 us, decode 302.9 -> 311.0 tok/s against 128
/// invocations), at least 128 and at most the adapter's limit; or `STRATA_COMBINE_WG` (a multiple
/// of 32 from 64 up to the limit; for tuning). Any size gives the same bits (each slot's dot is one
/// subgroup's, whichever it is).
pub(super) fn combine_wg(ctx: &GpuContext, slots: usize) -> usize {
    static WG: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let limit = ctx.limits.max_compute_invocations_per_workgroup as usize;
    let per_slot = (slots * subgroup_size(ctx)).next_multiple_of(32);
    WG.get_or_init(|| {
        std::env::var("STRATA_COMBINE_WG")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|n| *n >= 64 && n.is_multiple_of(32))
    })
    .filter(|n| *n <= limit)
    .unwrap_or_else(|| per_slot.clamp(wg_size(), limit.max(wg_size())))
}

/// Rows of each workgroup of [`matvec_expert_combine`](super::matvec_expert_combine) (its shader's
/// ROWS): 4 unless `STRATA_COMBINE_ROWS` (1 to 4, for tuning) says otherwise. A row's bits never
/// depend on it. (H200, 8 layers, 64 decode steps: the kernel 273 -> 215 us per step against 2
/// rows, decode 305-315 -> 331-340 tok/s.)
pub(super) fn combine_rows() -> usize {
    static ROWS: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    ROWS.get_or_init(|| env_rows("STRATA_COMBINE_ROWS"))
        .unwrap_or(4)
}
