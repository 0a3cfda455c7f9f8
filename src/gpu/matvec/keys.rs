//! The pipelines of the mat-vec: shader assemblies, entry points, and the override constants each
//! is specialised on.

use super::tuning::wg_size;
use super::{GpuWeight, PipelineKey, View, XForm};

/// Whether the mat-vec of `w` over `x` needs the any-length row body (quant/rows_any.wgsl):
/// unquantized rows that are not whole 32-value chunks, or inputs not on 16-byte boundaries.
/// Decided by shapes alone, so prefill and decode of a weight always take the same body.
pub(super) fn any_length(w: &GpuWeight, x: View, xform: XForm) -> bool {
    let aligned = x.offset.is_multiple_of(4)
        && x.stride.is_multiple_of(4)
        && match xform {
            XForm::Swiglu { half } => half.is_multiple_of(4),
            _ => true,
        };
    w.ty.block_size() == 1 && (!w.row_len.is_multiple_of(32) || !aligned)
}

pub(super) fn shader_name(w: &GpuWeight, any: bool) -> String {
    let op = if any { "matvec_any" } else { "matvec" };
    format!("{op}:{}", w.ty.name())
}

/// The pipeline of `entry` for `w`, specialised (override constants) on the rows per subgroup,
/// the vectors per tile and the input transform, so its row body has no data-dependent branch.
pub(super) fn key(
    w: &GpuWeight,
    any: bool,
    entry: &'static str,
    rows_per_sg: usize,
    items: usize,
    xform: XForm,
) -> PipelineKey {
    let key = PipelineKey::new(shader_name(w, any), entry);
    specialise(key, rows_per_sg, wg_size(), items, xform.mode().0)
}

/// [`key`] for a fused assembly (`matvec_norm`: X_MODE 3, [`InputNorm`](super::InputNorm);
/// `matvec_conv`: [`ConvStore`](super::ConvStore)) of split or block row bodies.
pub(super) fn fused_key(
    op: &str,
    w: &GpuWeight,
    entry: &'static str,
    rows_per_sg: usize,
    items: usize,
    x_mode: u32,
) -> PipelineKey {
    let key = PipelineKey::new(format!("{op}:{}", w.ty.name()), entry);
    specialise(key, rows_per_sg, wg_size(), items, x_mode)
}

/// The override constants every mat-vec pipeline is specialised on.
pub(super) fn specialise(
    key: PipelineKey,
    rows: usize,
    wg: usize,
    items: usize,
    x_mode: u32,
) -> PipelineKey {
    key.constant("ROWS", rows as f64)
        .constant("WG", wg as f64)
        .constant("ITEMS", items as f64)
        .constant("X_MODE", x_mode as f64)
}

/// The wide tiles' assembly: with the stash of their rounds and pairs (`matvec_wide_stash`) only
/// where a pipeline runs them, so that the others keep their workgroup memory.
pub(super) fn wide_op(stash: bool) -> &'static str {
    if stash {
        "matvec_wide_stash"
    } else {
        "matvec_wide"
    }
}

/// The wide-tile twin (quant/rows_wide.wgsl) of a dense store's entry point.
pub(super) fn wide_entry(entry: &'static str) -> &'static str {
    match entry {
        "matvec_seg" => "matvec_seg_wide",
        "matvec_mix" => "matvec_mix_wide",
        "matvec_combine" => "matvec_combine_wide",
        "matvec_moe_combine" => "matvec_moe_combine_wide",
        _ => "matvec_wide",
    }
}
