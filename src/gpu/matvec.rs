//! Launchers of `shaders/matvec.wgsl`: the dequantizing mat-vec in all its forms. Every form runs
//! the same row body (`quant/rows_split.wgsl` or `quant/rows_block.wgsl`), so a row's bits never
//! depend on which form computed it, on the batch, or on the rows beside it. The forms fuse what
//! a layer does around a mat-vec into the one dispatch:
//!
//! * [`XForm`]: the input vector transformed on load (SwiGLU of a gate|up vector, scaled SiLU);
//! * [`Store::Segments`]: a concatenation of weights that share an input, each part of the output
//!   going to its own buffer (one dispatch instead of one per weight);
//! * [`Store::Mix`]: the hyper-connection mix of the gate rows (`hc.wgsl`'s `hc_mix_out`);
//! * [`Store::Combine`]: the result added into the wide residual (`hc.wgsl`'s `hc_combine`).

use super::buffers::{GpuBuf, GpuWeight, WeightPart};
use super::kernels::{Recorder, View, item_grid, to_u32};
use super::pipelines::PipelineKey;
use super::{GpuContext, GpuError};

mod coop;
mod idot;

/// Parameters of `shaders/matvec.wgsl` (must match its `Params`).
#[repr(C)]
#[derive(Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
struct MatvecParams {
    rows: u32,
    k: u32,
    row_bytes: u32,
    items: u32,
    x_stride: u32,
    x_offset: u32,
    y_stride: u32,
    y_offset: u32,
    slots: u32,
    x_per_item: u32,
    expert_first: u32,
    expert_count: u32,
    rows_per_wg: u32,
    d_base: u32,
    x_mode: u32,
    x_half: u32,
    x_scale: f32,
    row_base: u32,
    seg1: u32,
    seg2: u32,
    y1_offset: u32,
    y1_stride: u32,
    y2_offset: u32,
    y2_stride: u32,
    hc: u32,
    h: u32,
    item0: u32,
    group_base: u32,
    group_cap: u32,
    norm_eps: f32,
    norm_period: u32,
}

/// How the input vector is read.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum XForm {
    #[default]
    Plain,
    /// `silu(x[i]) * x[i + half]`: the SwiGLU of a vector holding the gate then, `half` floats
    /// later, the up projection.
    Swiglu { half: usize },
    /// `silu(x[i] * scale)`.
    SiluScale(f32),
}

impl XForm {
    fn mode(self) -> (u32, usize, f32) {
        match self {
            XForm::Plain => (0, 0, 0.0),
            XForm::Swiglu { half } => (1, half, 0.0),
            XForm::SiluScale(s) => (2, 0, s),
        }
    }

    /// Floats of each input vector read for a row of `k` values.
    fn width(self, k: usize) -> usize {
        match self {
            XForm::Swiglu { half } => half + k,
            _ => k,
        }
    }
}

/// Where the rows go.
#[derive(Clone, Copy)]
pub enum Store<'a> {
    /// Row r of vector i to `y[i][r]`.
    Rows(View<'a>),
    /// A weight made of concatenated matrices: rows `[0, first[1])` to `outs[0]`,
    /// `[first[1], first[2])` to `outs[1]` and the rest to `outs[2]` (each from its own row 0).
    Segments {
        outs: [View<'a>; 3],
        first: [usize; 3],
        /// `Some(scale)`: output 0 holds `silu(y * scale)`, what [`prepare_x`] with
        /// [`XForm::SiluScale`] would leave there (the same bits), so its reader takes it plainly.
        silu0: Option<f32>,
        /// What else the dispatch does (a norm of its input, the GDN conv in its store).
        fused: SegFusion<'a>,
    },
    /// The rows are the `hc` streams' gates (row `s * h + i`): `out[i] = (1/hc) Σ_s
    /// sigmoid(gate[s*h+i]) * normed[s*h+i]`, `normed` holding `hc * h` floats per vector.
    Mix {
        out: View<'a>,
        normed: &'a GpuBuf,
        h: usize,
        hc: usize,
    },
    /// The shared expert's down projection finishing the MoE block (`moe.wgsl`'s
    /// `moe_combine_hc`, the same arithmetic): for token i,
    /// `m[r] = Σ_slot weights[i*k + slot] * routed[(i*k + slot)*h + r] + sigmoid(logit[i]) * y[r]`
    /// (slots in order), then `wide[i][s*h + r] += 2 sigmoid(inject[i*hc + s] / hc) * m[r]`.
    MoeCombine {
        wide: &'a GpuBuf,
        inject: &'a GpuBuf,
        routed: &'a GpuBuf,
        weights: &'a GpuBuf,
        logit: &'a GpuBuf,
        h: usize,
        hc: usize,
        k: usize,
    },
    /// `wide[i][s*h + r] += 2 sigmoid(inject[i*hc + s] / hc) * y[r]` for every stream s.
    Combine {
        wide: &'a GpuBuf,
        inject: &'a GpuBuf,
        h: usize,
        hc: usize,
    },
}

/// What a [`Store::Segments`] mat-vec does besides its rows.
#[derive(Clone, Copy, Default)]
pub enum SegFusion<'a> {
    #[default]
    None,
    /// The rows read x through a grouped RMS norm, and the normed vectors are stored too; the
    /// third segment must be empty.
    Norm(InputNorm<'a>),
    /// One vector (decode): the rows of segment 0 are GDN conv inputs, and the channels' conv
    /// outputs are stored instead (see [`ConvStore`]).
    Conv(ConvStore<'a>),
}

/// The GDN causal conv of decode in the store of its input projection
/// (`shaders/quant/seg_conv.wgsl`): segment 0's row c is channel c's new input u; the store
/// writes `silu(Σ taps * [history, u])` (the expression `ops::gdn_conv` uses, so the same bits)
/// and shifts the channel's history. A 4-tap conv over as many channels as segment 0 has rows:
/// `history` holds 3 rows of them, `weight` 4 taps per channel.
#[derive(Clone, Copy)]
pub struct ConvStore<'a> {
    pub history: &'a GpuBuf,
    pub weight: &'a GpuBuf,
}

/// A grouped RMS norm of the input applied on load (`shaders/quant/x_norm.wgsl`): value i of a
/// vector of `groups` groups of `group` values reads `(x[i] * inv_g) * weight[i % period]`,
/// `inv_g = 1 / sqrt(mean of group g's squares + eps)`, what `ops::rmsnorm` computes in mode `Rms`
/// (with its own sum order), and the normed vectors are stored into `normed` as well. One dispatch
/// instead of a norm and a mat-vec; the rows equal a plain mat-vec over the stored vectors bit for
/// bit. Only for weights [`can_norm_input`] accepts.
#[derive(Clone, Copy)]
pub struct InputNorm<'a> {
    pub weight: &'a GpuBuf,
    pub period: usize,
    pub group: usize,
    pub groups: usize,
    pub eps: f32,
    pub normed: View<'a>,
}

/// Whether a segmented mat-vec of `w` can norm its input ([`InputNorm`]) in groups of `group`
/// values with a weight of `period` values: a split layout in one part, 1 to 4 groups filling the
/// row, groups and period multiples of 16 (a row body's segments then never straddle either).
/// Decided by shapes alone, so prefill and decode take the same path.
pub fn can_norm_input(w: &GpuWeight, group: usize, period: usize) -> bool {
    w.split.is_some()
        && w.parts.len() == 1
        && group > 0
        && group.is_multiple_of(16)
        && period > 0
        && period.is_multiple_of(16)
        && w.row_len.is_multiple_of(group)
        && (1..=4).contains(&(w.row_len / group))
}

/// Invocations per mat-vec workgroup (`STRATA_MATVEC_WG` overrides: 64, 128 or 256, for tuning).
fn wg_size() -> usize {
    static WG: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *WG.get_or_init(|| {
        std::env::var("STRATA_MATVEC_WG")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|n| [64, 128, 256].contains(n))
            .unwrap_or(128)
    })
}
const TILE: usize = 4;

/// Vectors per wide prefill tile (quant/rows_wide.wgsl, split layouts only): 16 unless
/// `STRATA_WIDE` (0 = off, 8, 12 or 16) says otherwise, for tuning. A row's bits never depend on it.
fn wide_items() -> usize {
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
fn xperm() -> bool {
    static XPERM: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *XPERM.get_or_init(|| std::env::var("STRATA_XPERM").map_or(true, |v| v != "0"))
}

/// x's first `count` vectors in task order for `w`'s wide tiles, in the context's buffer for it:
/// returns that buffer, whose vectors are `w.row_len` floats apart from offset 0.
fn permuted_x(
    ctx: &GpuContext,
    rec: &mut Recorder,
    w: &GpuWeight,
    x: View,
    count: usize,
) -> Result<GpuBuf, GpuError> {
    let k = w.row_len;
    let out = ctx.xperm_buffer(count * k)?;
    let params = MatvecParams {
        k: to_u32(k, "k")?,
        items: to_u32(count, "items")?,
        x_stride: to_u32(x.stride, "x stride")?,
        x_offset: to_u32(x.offset, "x offset")?,
        y_stride: to_u32(k, "y stride")?,
        ..Default::default()
    };
    let (gy, gz) = item_grid(count);
    let gx = to_u32((k / 4).div_ceil(64), "grid x")?;
    rec.push(
        ctx,
        &PipelineKey::new(format!("matvec_wide:{}", w.ty.name()), "permute_x"),
        &[(1, &*x.buf.buffer), (9, &*out.buffer)],
        bytemuck::bytes_of(&params),
        [gx, gy, gz],
    )?;
    Ok(out)
}

/// Rows per subgroup of the wide tiles (`STRATA_WIDE_ROWS`, 1 to 4, for tuning; default 4).
fn wide_rows() -> usize {
    static ROWS: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    ROWS.get_or_init(|| env_rows("STRATA_WIDE_ROWS"))
        .unwrap_or(4)
}

/// Whether a mat-vec of `w` over `x` may run in wide tiles: a split layout read plainly (the
/// transform already applied) by the split row body.
fn wide_ok(w: &GpuWeight, x: View, xform: XForm) -> bool {
    wide_items() > 0 && w.split.is_some() && xform == XForm::Plain && !any_length(w, x, xform)
}

/// The adapter's subgroup size for sizing grids (32 when it reports none). Any actual size still
/// computes every row: the kernels loop over their row groups by the real subgroup count.
fn subgroup_size(ctx: &GpuContext) -> usize {
    match ctx.adapter.subgroup_max_size {
        0 => 32,
        n => (n as usize).min(wg_size()),
    }
}

/// Rows per subgroup: for the split layouts, enough workgroups to fill a large GPU before sharing
/// x loads across rows (`STRATA_MATVEC_ROWS` overrides, for tuning); row pairs for the block
/// layouts. A row's bits do not depend on it.
fn rows_per_subgroup(w: &GpuWeight, rows: usize) -> usize {
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

/// The wide-tile twin (quant/rows_wide.wgsl) of a dense store's entry point.
fn wide_entry(entry: &'static str) -> &'static str {
    match entry {
        "matvec_seg" => "matvec_seg_wide",
        "matvec_mix" => "matvec_mix_wide",
        "matvec_combine" => "matvec_combine_wide",
        "matvec_moe_combine" => "matvec_moe_combine_wide",
        _ => "matvec_wide",
    }
}

/// Rows per subgroup for `tile`-vector tiles: [`wide_rows`] for wide tiles, else
/// [`rows_for_tile`].
fn tile_rows(w: &GpuWeight, rows: usize, tile: usize) -> usize {
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

/// The pipeline of `entry` for `w`, specialised (override constants) on the rows per subgroup,
/// the vectors per tile and the input transform, so its row body has no data-dependent branch.
/// Whether the mat-vec of `w` over `x` needs the any-length row body (quant/rows_any.wgsl):
/// unquantized rows that are not whole 32-value chunks, or inputs not on 16-byte boundaries.
/// Decided by shapes alone, so prefill and decode of a weight always take the same body.
fn any_length(w: &GpuWeight, x: View, xform: XForm) -> bool {
    let aligned = x.offset.is_multiple_of(4)
        && x.stride.is_multiple_of(4)
        && match xform {
            XForm::Swiglu { half } => half.is_multiple_of(4),
            _ => true,
        };
    w.ty.block_size() == 1 && (!w.row_len.is_multiple_of(32) || !aligned)
}

fn shader_name(w: &GpuWeight, any: bool) -> String {
    let op = if any { "matvec_any" } else { "matvec" };
    format!("{op}:{}", w.ty.name())
}

fn key(
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

/// [`key`] for a fused assembly (`matvec_norm`: X_MODE 3, [`InputNorm`]; `matvec_conv`:
/// [`ConvStore`]) of split or block row bodies.
fn fused_key(
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
fn specialise(key: PipelineKey, rows: usize, wg: usize, items: usize, x_mode: u32) -> PipelineKey {
    key.constant("ROWS", rows as f64)
        .constant("WG", wg as f64)
        .constant("ITEMS", items as f64)
        .constant("X_MODE", x_mode as f64)
}

/// Subgroups that share each row of a dense mat-vec (the shader's KSPLIT), for matrices of few
/// long rows (up to 1,024 rows of 2,048 values or more), which would leave a large GPU mostly idle
/// with each lane walking tens of loop steps: 4; never more than a workgroup's subgroups. (On the
/// H200: 320 x 10,240 Q6_K 15.6 us unsplit, 12.9 split in 2, 11.6 in 4; the router's
/// 513 x 2,560 F32 15.1, 12.0, 10.9; 2,560 x 6,144 rows got slower split.) It changes a row's summation order, so it depends on the weight and the
/// adapter only, never on the number of vectors: prefill and decode agree. (The expert entry
/// points keep 1.) `STRATA_MATVEC_KSPLIT` (1, 2, 4 or 8) overrides it for every dense weight, for
/// tuning only: it changes the bits of the rows it touches.
fn k_split(ctx: &GpuContext, w: &GpuWeight) -> usize {
    // The limb arithmetic folds a row's tasks in order within one subgroup.
    if ctx.pipelines.limb() && super::shaders::limb_supported(w.ty) {
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

fn bindings<'a>(
    w: &'a GpuWeight,
    part: &'a WeightPart,
    grid: &'a Option<std::sync::Arc<wgpu::Buffer>>,
) -> Vec<(u32, &'a wgpu::Buffer)> {
    let mut b = vec![(0, &part.buffer)];
    if w.split.is_some_and(|s| s.vec4_bodies()) {
        b.push((5, &part.buffer));
    }
    if let Some(g) = grid {
        b.push((4, &**g));
    }
    b
}

fn base_params(
    w: &GpuWeight,
    part: &WeightPart,
    x: View,
    xform: XForm,
    items: usize,
) -> Result<MatvecParams, GpuError> {
    let (x_mode, x_half, x_scale) = xform.mode();
    Ok(MatvecParams {
        rows: to_u32(part.n_rows, "rows")?,
        k: to_u32(w.row_len, "k")?,
        row_bytes: to_u32(w.row_stride, "row stride")?,
        items: to_u32(items, "items")?,
        x_stride: to_u32(x.stride, "x stride")?,
        x_offset: to_u32(x.offset, "x offset")?,
        d_base: to_u32(part.d_base, "d base")?,
        x_mode,
        x_half: to_u32(x_half, "x half")?,
        x_scale,
        row_base: to_u32(part.first_row, "first row")?,
        seg1: u32::MAX,
        seg2: u32::MAX,
        ..Default::default()
    })
}

/// The fields of a pass over `items` vectors of x alone (its transform, where the vectors lie), for
/// kernels that rewrite x before the rows read it.
fn x_params(w: &GpuWeight, x: View, xform: XForm, items: usize) -> Result<MatvecParams, GpuError> {
    let (x_mode, x_half, x_scale) = xform.mode();
    Ok(MatvecParams {
        k: to_u32(w.row_len, "k")?,
        items: to_u32(items, "items")?,
        x_stride: to_u32(x.stride, "x stride")?,
        x_offset: to_u32(x.offset, "x offset")?,
        x_mode,
        x_half: to_u32(x_half, "x half")?,
        x_scale,
        ..Default::default()
    })
}

fn check_input(w: &GpuWeight, x: View, xform: XForm, count: usize) -> Result<(), GpuError> {
    x.check(
        count,
        xform.width(w.row_len),
        &format!("matvec {} input", w.name),
    )?;
    x.check_vec4(&w.name)?;
    if let XForm::Swiglu { half } = xform
        && !half.is_multiple_of(4)
    {
        return Err(GpuError::BadArgs(format!(
            "matvec {}: SwiGLU half {half} must be a multiple of 4",
            w.name
        )));
    }
    Ok(())
}

/// Before a mat-vec of `w` over `items` vectors: for more than one vector, apply `xform` to x once,
/// in place (`matvec.wgsl`'s `xform_in_place`: the same arithmetic as on load), and return
/// [`XForm::Plain`] for the mat-vec; otherwise, or where the any-length row body reads x, return
/// `xform` unchanged. Either way the mat-vec's bits are the same; prefill stops recomputing the
/// transform (an `exp` per value) for every row group. x's buffer then holds the transformed
/// values (a SwiGLU's over its gate half).
pub fn prepare_x(
    ctx: &GpuContext,
    rec: &mut Recorder,
    w: &GpuWeight,
    x: View,
    xform: XForm,
    items: usize,
) -> Result<XForm, GpuError> {
    if items <= 1 || xform == XForm::Plain || any_length(w, x, xform) {
        return Ok(xform);
    }
    check_input(w, x, xform, items)?;
    let params = x_params(w, x, xform, items)?;
    let (gy, gz) = item_grid(items);
    let gx = to_u32(w.row_len.div_ceil(4).div_ceil(64), "grid x")?;
    rec.push(
        ctx,
        &PipelineKey::new(shader_name(w, false), "xform_in_place")
            .constant("X_MODE", params.x_mode as f64),
        &[(9, &*x.buf.buffer)],
        bytemuck::bytes_of(&params),
        [gx, gy, gz],
    )?;
    Ok(XForm::Plain)
}

/// y[i][r] = W[r] . x[i] for `items` vectors.
pub fn matvec(
    ctx: &GpuContext,
    rec: &mut Recorder,
    w: &GpuWeight,
    x: View,
    y: View,
    items: usize,
) -> Result<(), GpuError> {
    matvec_with(ctx, rec, w, x, XForm::Plain, Store::Rows(y), items)
}

/// The mat-vec of `items` vectors with an input transform and a store form (module docs).
pub fn matvec_with(
    ctx: &GpuContext,
    rec: &mut Recorder,
    w: &GpuWeight,
    x: View,
    xform: XForm,
    store: Store,
    items: usize,
) -> Result<(), GpuError> {
    check_input(w, x, xform, items)?;
    if let Some(plain) = norm_apart(ctx, w, store, xform, items) {
        // Prefill: the normed vectors first, then wide tiles over them (the same bits).
        let Store::Segments {
            fused: SegFusion::Norm(n),
            ..
        } = store
        else {
            return Err(GpuError::BadArgs("norm apart without a norm".into()));
        };
        norm_store(ctx, rec, w, x, store, items)?;
        return matvec_with(ctx, rec, w, n.normed, XForm::Plain, plain, items);
    }
    if coop::usable(ctx, w, x, xform, items) && coop::dense(ctx, rec, w, x, &store, items)? {
        return Ok(());
    }
    let sg = subgroup_size(ctx);
    let grid = ctx.grid_buffer(w.ty)?;
    // Wide tiles where the store has a wide entry, then full tiles of TILE vectors, then the
    // remainder as tiles of its own size.
    let wide_store = match store {
        Store::Segments { fused, .. } => matches!(fused, SegFusion::None),
        _ => true,
    };
    // The integer-digit arithmetic: x split once, or staged by decode's workgroups. (An input
    // norm was stored apart above unless decode stages the normed vector, see norm_apart.)
    let normed_on_load = matches!(
        store,
        Store::Segments {
            fused: SegFusion::Norm(_),
            ..
        }
    );
    let int = (!normed_on_load || items == 1) && idot::usable(ctx, w, x, xform);
    // Decode stages its one vector's digits in each workgroup, without a split dispatch.
    let local = if int && items == 1 {
        idot::local_words(ctx, w, 1)
    } else {
        None
    };
    let digits = if int && local.is_none() && !normed_on_load {
        Some(idot::split(ctx, rec, w, x, xform, items)?)
    } else {
        None
    };
    let wide = if wide_store && wide_ok(w, x, xform) {
        wide_items()
    } else {
        0
    };
    let runs = tile_runs(items, wide);
    // The wide runs come first, from item 0.
    let wide_end: usize = runs.iter().filter(|r| r.2 > TILE).map(|r| r.1).sum();
    let task_order = if wide_end > 0 && xperm() && digits.is_none() {
        Some(permuted_x(ctx, rec, w, x, wide_end)?)
    } else {
        None
    };
    for part in &w.parts {
        for &(item0, count, tile) in &runs {
            if count == 0 {
                continue;
            }
            let is_wide = tile > TILE;
            let mut params = base_params(w, part, x, xform, items)?;
            let mut b = bindings(w, part, &grid);
            match task_order.as_ref().filter(|_| is_wide) {
                Some(xp) => {
                    // The wide run starts at item 0: its vectors are xp's, k apart.
                    params.x_offset = 0;
                    params.x_stride = params.k;
                    b.push((1, &*xp.buffer));
                }
                None => b.push((1, &*x.buf.buffer)),
            }
            let mut y0_mode = 0;
            let (entry, per_sg, groups) = match store {
                Store::Rows(y) => {
                    y.check(items, w.n_rows, &format!("matvec {} output", w.name))?;
                    params.y_stride = to_u32(y.stride, "y stride")?;
                    params.y_offset = to_u32(y.offset + part.first_row, "y offset")?;
                    b.push((2, &*y.buf.buffer));
                    let per_sg = tile_rows(w, w.n_rows, tile);
                    ("matvec", per_sg, part.n_rows.div_ceil(per_sg))
                }
                Store::Segments {
                    outs,
                    first,
                    silu0,
                    fused,
                } => {
                    segment_params(w, &mut params, outs, first, items)?;
                    if let Some(scale) = silu0 {
                        params.x_scale = scale;
                        y0_mode = 2;
                    }
                    b.push((2, &*outs[0].buf.buffer));
                    b.push((6, &*outs[1].buf.buffer));
                    match fused {
                        SegFusion::Norm(n) => {
                            norm_params(w, &mut params, xform, first, n, items)?;
                            b.push((7, &*n.normed.buf.buffer));
                            b.push((15, &*n.weight.buffer));
                        }
                        SegFusion::Conv(conv) => {
                            conv_checks(w, x, silu0, first, conv, items)?;
                            y0_mode = 3;
                            b.push((7, &*outs[2].buf.buffer));
                            b.push((13, &*conv.history.buffer));
                            b.push((14, &*conv.weight.buffer));
                        }
                        SegFusion::None => b.push((7, &*outs[2].buf.buffer)),
                    }
                    let per_sg = tile_rows(w, w.n_rows, tile);
                    ("matvec_seg", per_sg, part.n_rows.div_ceil(per_sg))
                }
                Store::Mix { out, normed, h, hc } => {
                    if w.parts.len() != 1 || w.n_rows != h * hc || !(1..=4).contains(&hc) {
                        return Err(GpuError::BadArgs(format!(
                            "matvec {}: mixing needs one part of {hc} x {h} rows (1 to 4 streams)",
                            w.name
                        )));
                    }
                    out.check(items, h, &format!("matvec {} mix output", w.name))?;
                    need_floats(normed, items * h * hc, "mix normed streams")?;
                    params.y_stride = to_u32(out.stride, "y stride")?;
                    params.y_offset = to_u32(out.offset, "y offset")?;
                    params.h = to_u32(h, "h")?;
                    params.hc = to_u32(hc, "hc")?;
                    b.push((2, &*out.buf.buffer));
                    b.push((8, &*normed.buffer));
                    // One subgroup per value i (its hc gate rows).
                    ("matvec_mix", hc, h)
                }
                Store::MoeCombine {
                    wide,
                    inject,
                    routed,
                    weights,
                    logit,
                    h,
                    hc,
                    k,
                } => {
                    residual_store(w, &mut params, &mut b, wide, inject, h, hc, items)?;
                    need_floats(routed, items * k * h, "routed expert outputs")?;
                    need_floats(weights, items * k, "routing weights")?;
                    need_floats(logit, items, "shared expert gate")?;
                    params.slots = to_u32(k, "slots")?;
                    b.extend([
                        (10, &*routed.buffer),
                        (11, &*weights.buffer),
                        (12, &*logit.buffer),
                    ]);
                    let per_sg = tile_rows(w, w.n_rows, tile);
                    ("matvec_moe_combine", per_sg, part.n_rows.div_ceil(per_sg))
                }
                Store::Combine {
                    wide,
                    inject,
                    h,
                    hc,
                } => {
                    residual_store(w, &mut params, &mut b, wide, inject, h, hc, items)?;
                    let per_sg = tile_rows(w, w.n_rows, tile);
                    ("matvec_combine", per_sg, part.n_rows.div_ceil(per_sg))
                }
            };
            // Row groups (of `per_sg` rows) per workgroup: one per subgroup, or per `split`
            // subgroups where a row's input is split over several (not for the mix store).
            let split = if entry == "matvec_mix" {
                1
            } else {
                k_split(ctx, w)
            };
            let per_wg = (wg_size() / sg / split).max(1) * idot::staged_groups(local);
            params.rows_per_wg = to_u32(per_wg, "row groups per workgroup")?;
            let gx = to_u32(groups.div_ceil(per_wg), "grid x")?;
            params.item0 = to_u32(item0, "first item")?;
            let (gy, gz) = item_grid(count / tile);
            if let Some(d) = &digits {
                d.apply(&mut params);
                b.push((19, &*d.buf.buffer));
            }
            let pipeline = if is_wide && digits.is_some() {
                idot::key_of("matvec_wide_idot", w, wide_entry(entry), per_sg, tile)
            } else if is_wide {
                fused_key("matvec_wide", w, wide_entry(entry), per_sg, tile, 0)
                    .constant("XPERM", f64::from(u8::from(task_order.is_some())))
            } else if digits.is_some() || local.is_some() {
                let op = if params.x_mode == 3 {
                    "matvec_norm_idot"
                } else if y0_mode == 3 {
                    "matvec_conv_idot"
                } else {
                    "matvec_idot"
                };
                match local {
                    Some(words) => idot::local_key(op, w, entry, per_sg, params.x_mode, words),
                    None => idot::key_of(op, w, entry, per_sg, tile),
                }
            } else if params.x_mode == 3 {
                fused_key("matvec_norm", w, entry, per_sg, tile, 3)
            } else if y0_mode == 3 {
                fused_key("matvec_conv", w, entry, per_sg, tile, 0)
            } else {
                key(w, any_length(w, x, xform), entry, per_sg, tile, xform)
            };
            rec.push(
                ctx,
                &pipeline
                    .constant("KSPLIT", split as f64)
                    .constant("Y0_MODE", y0_mode as f64),
                &b,
                bytemuck::bytes_of(&params),
                [gx, gy, gz],
            )?;
        }
    }
    Ok(())
}

/// How `items` vectors are tiled, as (first item, count, vectors per tile) runs: tiles of `wide`
/// vectors (0: none), then one of [`SMALL_WIDE`] where at least that many remain and
/// [`small_wide`] allows it, then tiles of `TILE`, then the rest as one tile. Every (row, vector)
/// has the same bits in any of them.
fn tile_runs(items: usize, wide: usize) -> Vec<(usize, usize, usize)> {
    let mut runs = Vec::with_capacity(4);
    let full_wide = items.checked_div(wide).map_or(0, |n| n * wide);
    runs.push((0, full_wide, wide));
    let mut at = full_wide;
    if wide > SMALL_WIDE && small_wide() && items - at >= SMALL_WIDE {
        runs.push((at, SMALL_WIDE, SMALL_WIDE));
        at += SMALL_WIDE;
    }
    let full = at + (items - at) / TILE * TILE;
    runs.push((at, full - at, TILE));
    runs.push((full, items - full, items - full));
    runs.retain(|r| r.1 > 0);
    runs
}

/// The smaller wide tile, for batches of decode steps (8 to 15 vectors left after the wide tiles).
const SMALL_WIDE: usize = 8;

/// Whether a remainder of 8 to 15 vectors takes one wide tile of 8 (`STRATA_SMALL_WIDE=1`) or
/// tiles of `TILE`.
fn small_wide() -> bool {
    static SMALL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SMALL.get_or_init(|| std::env::var("STRATA_SMALL_WIDE").is_ok_and(|v| v == "1"))
}

/// The fewest vectors a wide tile takes.
fn least_wide() -> usize {
    let wide = wide_items();
    if wide > SMALL_WIDE && small_wide() {
        SMALL_WIDE
    } else {
        wide
    }
}

/// The part both residual stores share: `w`'s rows are one stream's width `h`, the wide residual
/// (binding 2) holds `hc` streams per vector and the injection logits (binding 8) `hc` per vector.
#[allow(clippy::too_many_arguments)]
fn residual_store<'a>(
    w: &GpuWeight,
    params: &mut MatvecParams,
    b: &mut Vec<(u32, &'a wgpu::Buffer)>,
    wide: &'a GpuBuf,
    inject: &'a GpuBuf,
    h: usize,
    hc: usize,
    items: usize,
) -> Result<(), GpuError> {
    if w.n_rows != h {
        return Err(GpuError::BadArgs(format!(
            "matvec {}: {} rows cannot be combined into streams of {h}",
            w.name, w.n_rows
        )));
    }
    need_floats(wide, items * h * hc, "combine residual")?;
    need_floats(inject, items * hc, "combine injection")?;
    params.h = to_u32(h, "h")?;
    params.hc = to_u32(hc, "hc")?;
    b.push((2, &*wide.buffer));
    b.push((8, &*inject.buffer));
    Ok(())
}

/// Whether `w`'s mat-vec can finish an MoE block in its store ([`Store::MoeCombine`]): it binds
/// five buffers more than a plain mat-vec, which must fit the adapter's storage buffers per stage.
pub fn can_moe_combine(ctx: &GpuContext, w: &GpuWeight) -> bool {
    let Some(part) = w.parts.first() else {
        return false;
    };
    let grid = match ctx.grid_buffer(w.ty) {
        Ok(g) => g,
        Err(_) => return false,
    };
    // The weight's own bindings, x, and the five of the store.
    let needed = bindings(w, part, &grid).len() + 1 + 5;
    needed <= ctx.adapter.max_storage_buffers_per_shader_stage as usize
}

fn need_floats(b: &GpuBuf, n: usize, what: &str) -> Result<(), GpuError> {
    if b.len < n {
        return Err(GpuError::BadArgs(format!(
            "{what}: {n} floats needed, buffer holds {}",
            b.len
        )));
    }
    Ok(())
}

/// Where a segmented mat-vec with an input norm covers enough vectors for wide tiles (prefill),
/// the same store without the norm, to run over the normed vectors that [`norm_store`] writes
/// first: the fused entry has no wide tiles, and the rows over the stored vectors are the fused
/// rows bit for bit (`shaders/quant/x_norm.wgsl`). `None` where the fused dispatch stays.
fn norm_apart<'a>(
    ctx: &GpuContext,
    w: &GpuWeight,
    store: Store<'a>,
    xform: XForm,
    items: usize,
) -> Option<Store<'a>> {
    let Store::Segments {
        outs,
        first,
        silu0,
        fused: SegFusion::Norm(n),
    } = store
    else {
        return None;
    };
    // The integer-digit arithmetic splits the normed vectors, in prefill (or where decode cannot
    // stage them in its workgroups).
    let digits = xform == XForm::Plain
        && idot::usable(ctx, w, n.normed, xform)
        && (items > 1 || norm_staged(ctx, w, n).is_none());
    let wide = least_wide();
    let wide = wide > 0 && items >= wide && xform == XForm::Plain && wide_ok(w, n.normed, xform);
    (digits || wide).then_some(Store::Segments {
        outs,
        first,
        silu0,
        fused: SegFusion::None,
    })
}

/// The XQL words of decode's fused input norm in the integer-digit arithmetic, which stages the
/// normed vector in each workgroup (`matvec_norm_idot_local`), where it does.
fn norm_staged(ctx: &GpuContext, w: &GpuWeight, n: InputNorm) -> Option<usize> {
    idot::usable(ctx, w, n.normed, XForm::Plain)
        .then(|| idot::local_words(ctx, w, 1))
        .flatten()
}

/// The normed vectors of an [`InputNorm`] alone: the decode step's own fused pipeline (`matvec_seg`
/// of the `matvec_norm` assembly, one vector per workgroup, the same constants) run with no rows,
/// so only its norm prologue works. The same compiled code as a decode step, hence the same
/// values: a separate entry point with the same source was not enough, as a compiler may treat
/// the same expression differently in two kernels (llvmpipe did at subgroup size 4).
fn norm_store(
    ctx: &GpuContext,
    rec: &mut Recorder,
    w: &GpuWeight,
    x: View,
    store: Store,
    items: usize,
) -> Result<(), GpuError> {
    let Store::Segments {
        outs,
        first,
        silu0,
        fused: SegFusion::Norm(n),
    } = store
    else {
        return Err(GpuError::BadArgs("norm store without a norm".into()));
    };
    let Some(part) = w.parts.first() else {
        return Err(GpuError::BadArgs(format!("matvec {}: no parts", w.name)));
    };
    let grid = ctx.grid_buffer(w.ty)?;
    let mut params = base_params(w, part, x, XForm::Plain, items)?;
    segment_params(w, &mut params, outs, first, items)?;
    let mut y0_mode = 0;
    if let Some(scale) = silu0 {
        params.x_scale = scale;
        y0_mode = 2;
    }
    norm_params(w, &mut params, XForm::Plain, first, n, items)?;
    let split = k_split(ctx, w);
    params.rows_per_wg = to_u32(
        (wg_size() / subgroup_size(ctx) / split).max(1),
        "row groups per workgroup",
    )?;
    params.item0 = 0;
    // No rows: the workgroups only norm and store their vectors.
    params.rows = 0;
    let mut b = bindings(w, part, &grid);
    b.extend([
        (1, &*x.buf.buffer),
        (2, &*outs[0].buf.buffer),
        (6, &*outs[1].buf.buffer),
        (7, &*n.normed.buf.buffer),
        (15, &*n.weight.buffer),
    ]);
    let (gy, gz) = item_grid(items);
    let per_sg = tile_rows(w, w.n_rows, 1);
    // Decode's own pipeline: the integer-digit one where decode stages the normed vector.
    let key = match norm_staged(ctx, w, n) {
        Some(words) => idot::local_key("matvec_norm_idot", w, "matvec_seg", per_sg, 3, words),
        None => fused_key("matvec_norm", w, "matvec_seg", per_sg, 1, 3),
    };
    rec.push(
        ctx,
        &key.constant("KSPLIT", split as f64)
            .constant("Y0_MODE", y0_mode as f64),
        &b,
        bytemuck::bytes_of(&params),
        [1, gy, gz],
    )
}

/// The X_MODE 3 fields of a segmented mat-vec with an input norm (output 2 becomes the normed
/// vectors).
fn norm_params(
    w: &GpuWeight,
    params: &mut MatvecParams,
    xform: XForm,
    first: [usize; 3],
    n: InputNorm,
    items: usize,
) -> Result<(), GpuError> {
    if xform != XForm::Plain || first[2] != w.n_rows || !can_norm_input(w, n.group, n.period) {
        return Err(GpuError::BadArgs(format!(
            "matvec {}: no input norm of groups of {} (weight period {}) here",
            w.name, n.group, n.period
        )));
    }
    need_floats(n.weight, n.period, "input norm weight")?;
    n.normed
        .check(items, w.row_len, &format!("matvec {} normed input", w.name))?;
    params.x_mode = 3;
    params.h = to_u32(n.group, "norm group")?;
    params.hc = to_u32(w.row_len / n.group, "norm groups")?;
    params.norm_eps = n.eps;
    params.norm_period = to_u32(n.period, "norm period")?;
    params.y2_offset = to_u32(n.normed.offset, "normed offset")?;
    params.y2_stride = to_u32(n.normed.stride, "normed stride")?;
    Ok(())
}

/// A [`ConvStore`] needs one vector, no other store transform, and segment 0's rows as its
/// channels.
fn conv_checks(
    w: &GpuWeight,
    x: View,
    silu0: Option<f32>,
    first: [usize; 3],
    conv: ConvStore,
    items: usize,
) -> Result<(), GpuError> {
    let channels = first[1];
    if items != 1 || silu0.is_some() || any_length(w, x, XForm::Plain) {
        return Err(GpuError::BadArgs(format!(
            "matvec {}: the conv store takes one vector and plain rows",
            w.name
        )));
    }
    need_floats(conv.history, 3 * channels, "conv history")?;
    need_floats(conv.weight, 4 * channels, "conv taps")
}

fn segment_params(
    w: &GpuWeight,
    params: &mut MatvecParams,
    outs: [View; 3],
    first: [usize; 3],
    items: usize,
) -> Result<(), GpuError> {
    if first[0] != 0 || first[1] > first[2] || first[2] > w.n_rows {
        return Err(GpuError::BadArgs(format!(
            "matvec {}: bad segments {first:?} of {} rows",
            w.name, w.n_rows
        )));
    }
    let ends = [first[1], first[2], w.n_rows];
    for (s, out) in outs.iter().enumerate() {
        out.check(
            items,
            ends[s] - first[s],
            &format!("matvec {} segment {s}", w.name),
        )?;
    }
    params.y_stride = to_u32(outs[0].stride, "y stride")?;
    params.y_offset = to_u32(outs[0].offset, "y offset")?;
    params.seg1 = to_u32(first[1], "segment 1")?;
    params.seg2 = to_u32(first[2], "segment 2")?;
    params.y1_offset = to_u32(outs[1].offset, "y1 offset")?;
    params.y1_stride = to_u32(outs[1].stride, "y1 stride")?;
    params.y2_offset = to_u32(outs[2].offset, "y2 offset")?;
    params.y2_stride = to_u32(outs[2].stride, "y2 stride")?;
    Ok(())
}

/// Parameters shared by the expert entry points for one part of an expert tensor.
#[allow(clippy::too_many_arguments)]
fn expert_params(
    w: &GpuWeight,
    part: &WeightPart,
    x: View,
    xform: XForm,
    y: View,
    items: usize,
    slots: usize,
    x_per_item: bool,
    per_wg: usize,
) -> Result<MatvecParams, GpuError> {
    let mut params = base_params(w, part, x, xform, items)?;
    params.rows = to_u32(w.rows_per_unit, "rows")?;
    params.y_stride = to_u32(y.stride, "y stride")?;
    params.y_offset = to_u32(y.offset, "y offset")?;
    params.slots = to_u32(slots, "slots")?;
    params.x_per_item = x_per_item as u32;
    params.expert_first = to_u32(part.first_row / w.rows_per_unit, "expert")?;
    params.expert_count = to_u32(part.n_rows / w.rows_per_unit, "experts")?;
    params.rows_per_wg = to_u32(per_wg, "row groups per workgroup")?;
    Ok(params)
}

/// Items are whole tokens of `slots` items each, with an expert id each in `ids`.
fn check_expert_items(
    w: &GpuWeight,
    ids: &GpuBuf,
    slots: usize,
    items: usize,
) -> Result<(), GpuError> {
    if slots == 0 || !items.is_multiple_of(slots) || ids.len < items {
        return Err(GpuError::BadArgs(format!(
            "expert matvec {}: {items} items, {slots} slots, {} ids",
            w.name, ids.len
        )));
    }
    Ok(())
}

/// Expert mat-vec: for item i (= token * slots + slot), y[i] = W_{ids[i]} . x, where x is
/// x[i] when `x_per_item`, else x[i / slots]. `ids` lives on the GPU (written by the router).
#[allow(clippy::too_many_arguments)]
pub fn matvec_expert(
    ctx: &GpuContext,
    rec: &mut Recorder,
    w: &GpuWeight,
    ids: &GpuBuf,
    slots: usize,
    x_per_item: bool,
    x: View,
    y: View,
    items: usize,
) -> Result<(), GpuError> {
    matvec_expert_with(
        ctx,
        rec,
        w,
        ids,
        slots,
        x_per_item,
        x,
        XForm::Plain,
        y,
        items,
    )
}

/// [`matvec_expert`] with an input transform.
#[allow(clippy::too_many_arguments)]
pub fn matvec_expert_with(
    ctx: &GpuContext,
    rec: &mut Recorder,
    w: &GpuWeight,
    ids: &GpuBuf,
    slots: usize,
    x_per_item: bool,
    x: View,
    xform: XForm,
    y: View,
    items: usize,
) -> Result<(), GpuError> {
    check_expert_items(w, ids, slots, items)?;
    let x_count = if x_per_item { items } else { items / slots };
    check_input(w, x, xform, x_count)?;
    y.check(
        items,
        w.rows_per_unit,
        &format!("expert matvec {} output", w.name),
    )?;
    let sg = subgroup_size(ctx);
    let per_sg = rows_per_subgroup(w, w.rows_per_unit * items);
    let per_wg = (wg_size() / sg).max(1);
    let (gy, gz) = item_grid(items);
    let grid = ctx.grid_buffer(w.ty)?;
    let int = idot::usable(ctx, w, x, xform);
    let local = int.then(|| idot::local_words(ctx, w, 1)).flatten();
    let digits = if int && local.is_none() {
        Some(idot::split(ctx, rec, w, x, xform, x_count)?)
    } else {
        None
    };
    let per_wg = per_wg * idot::staged_groups(local);
    for part in &w.parts {
        let mut params = expert_params(w, part, x, xform, y, items, slots, x_per_item, per_wg)?;
        let mut b = bindings(w, part, &grid);
        b.push((1, &*x.buf.buffer));
        b.push((2, &*y.buf.buffer));
        b.push((3, &*ids.buffer));
        let groups = w.rows_per_unit.div_ceil(per_sg);
        let gx = to_u32(groups.div_ceil(per_wg), "grid x")?;
        let pipeline = match (&digits, local) {
            (_, Some(words)) => idot::local_key(
                "matvec_idot",
                w,
                "matvec_expert",
                per_sg,
                params.x_mode,
                words,
            ),
            (Some(d), None) => {
                d.apply(&mut params);
                b.push((19, &*d.buf.buffer));
                idot::key(w, "matvec_expert", per_sg, 1)
            }
            (None, None) => key(
                w,
                any_length(w, x, xform),
                "matvec_expert",
                per_sg,
                1,
                xform,
            ),
        };
        rec.push(
            ctx,
            &pipeline,
            &b,
            bytemuck::bytes_of(&params),
            [gx, gy, gz],
        )?;
    }
    Ok(())
}

/// [`matvec_expert`] of a fused gate|up weight (each expert's `2h` rows: gate, then up) storing
/// `silu(gate) * up` at rows `0..h` of each item's output (`matvec.wgsl`'s `matvec_expert_glu`):
/// what [`prepare_x`]'s SwiGLU would leave there, with the same bits, so the down projection
/// reads it with [`XForm::Plain`]. Rows `h..2h` of the output are left as they were.
#[allow(clippy::too_many_arguments)]
pub fn matvec_expert_glu(
    ctx: &GpuContext,
    rec: &mut Recorder,
    w: &GpuWeight,
    ids: &GpuBuf,
    slots: usize,
    x: View,
    y: View,
    items: usize,
) -> Result<(), GpuError> {
    matvec_expert_glu_pairs(ctx, rec, w, ids, slots, x, y, items, glu_pairs())
}

/// [`matvec_expert_glu`] with `pairs` (1 or 2) gate|up row pairs per subgroup; the same bits
/// whatever `pairs` is.
#[allow(clippy::too_many_arguments)]
pub fn matvec_expert_glu_pairs(
    ctx: &GpuContext,
    rec: &mut Recorder,
    w: &GpuWeight,
    ids: &GpuBuf,
    slots: usize,
    x: View,
    y: View,
    items: usize,
    pairs: usize,
) -> Result<(), GpuError> {
    if !(1..=2).contains(&pairs) {
        return Err(GpuError::BadArgs(format!(
            "{pairs} gate|up pairs per subgroup"
        )));
    }
    check_expert_items(w, ids, slots, items)?;
    if !w.rows_per_unit.is_multiple_of(2) {
        return Err(GpuError::BadArgs(format!(
            "gate|up experts {}: {} rows per expert is not a gate and an up half",
            w.name, w.rows_per_unit
        )));
    }
    let half = w.rows_per_unit / 2;
    check_input(w, x, XForm::Plain, items / slots)?;
    y.check(items, half, &format!("expert matvec {} output", w.name))?;
    let sg = subgroup_size(ctx);
    let per_wg = glu_rows_per_wg().unwrap_or((wg_size() / sg).max(1));
    let (gy, gz) = item_grid(items);
    let grid = ctx.grid_buffer(w.ty)?;
    let int = idot::usable(ctx, w, x, XForm::Plain);
    let local = int.then(|| idot::local_words(ctx, w, 1)).flatten();
    let digits = if int && local.is_none() {
        Some(idot::split(ctx, rec, w, x, XForm::Plain, items / slots)?)
    } else {
        None
    };
    let per_wg = per_wg * idot::staged_groups(local);
    for part in &w.parts {
        let mut params = expert_params(w, part, x, XForm::Plain, y, items, slots, false, per_wg)?;
        params.h = to_u32(half, "half")?;
        let mut b = bindings(w, part, &grid);
        b.push((1, &*x.buf.buffer));
        b.push((2, &*y.buf.buffer));
        b.push((3, &*ids.buffer));
        let gx = to_u32(half.div_ceil(per_wg * pairs), "grid x")?;
        let pipeline = match (&digits, local) {
            (_, Some(words)) => idot::local_key(
                "matvec_idot",
                w,
                "matvec_expert_glu",
                2 * pairs,
                params.x_mode,
                words,
            ),
            (Some(d), None) => {
                d.apply(&mut params);
                b.push((19, &*d.buf.buffer));
                idot::key(w, "matvec_expert_glu", 2 * pairs, 1)
            }
            (None, None) => key(
                w,
                any_length(w, x, XForm::Plain),
                "matvec_expert_glu",
                2 * pairs,
                1,
                XForm::Plain,
            ),
        };
        rec.push(
            ctx,
            &pipeline.constant("PAIRED", 1.0),
            &b,
            bytemuck::bytes_of(&params),
            [gx, gy, gz],
        )?;
    }
    Ok(())
}

/// Row groups (of [`glu_pairs`] gate|up pairs) per workgroup of [`matvec_expert_glu`]: one per
/// subgroup unless `STRATA_GLU_WG_ROWS` (1 to 256, for tuning) says otherwise; the subgroups take
/// them in turn.
/// A row's bits never depend on it.
fn glu_rows_per_wg() -> Option<usize> {
    static ROWS: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *ROWS.get_or_init(|| {
        std::env::var("STRATA_GLU_WG_ROWS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|n| (1..=256).contains(n))
    })
}

/// Gate|up row pairs per subgroup of [`matvec_expert_glu`] (the shader's ROWS / 2): 1 unless
/// `STRATA_GLU_PAIRS` (1 or 2, for tuning) says otherwise. A row's bits never depend on it.
fn glu_pairs() -> usize {
    static PAIRS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *PAIRS.get_or_init(|| {
        std::env::var("STRATA_GLU_PAIRS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|n| [1, 2].contains(n))
            .unwrap_or(1)
    })
}

/// What [`matvec_expert_combine`] reads and where it adds: the routed experts' ids and SwiGLU
/// outputs (`x`, one vector per item, as the gate|up kernel leaves them), the shared expert's down
/// rows of each token (`shared`: `h` floats per token from offset 0), the routing weights, the
/// shared expert's gate logit, and the wide residual with its injection logits.
#[derive(Clone, Copy)]
pub struct ExpertCombine<'a> {
    pub ids: &'a GpuBuf,
    pub slots: usize,
    pub x: View<'a>,
    pub shared: &'a GpuBuf,
    pub weights: &'a GpuBuf,
    pub logit: &'a GpuBuf,
    pub wide: &'a GpuBuf,
    pub inject: &'a GpuBuf,
    pub hc: usize,
}

/// Invocations of a [`matvec_expert_combine`] workgroup: one subgroup per slot (320 for 10 slots
/// on 32-wide subgroups), so that every slot's row dot runs at once (H200, 8 layers: the kernel
/// 38.6 -> 34.5 us, decode 302.9 -> 311.0 tok/s against 128 invocations), at least 128 and at
/// most the adapter's limit; or `STRATA_COMBINE_WG` (a multiple of 32 from 64 up to the limit;
/// for tuning). Any size gives the same bits (each slot's dot is one subgroup's, whichever it is).
fn combine_wg(ctx: &GpuContext, slots: usize) -> usize {
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

/// Rows of each workgroup of [`matvec_expert_combine`] (its shader's ROWS): 4 unless
/// `STRATA_COMBINE_ROWS` (1 to 4, for tuning) says otherwise. A row's bits never depend on it.
/// (H200, 8 layers, 64 decode steps: the kernel 273 -> 215 us per step against 2 rows, decode
/// 305-315 -> 331-340 tok/s.)
fn combine_rows() -> usize {
    static ROWS: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    ROWS.get_or_init(|| env_rows("STRATA_COMBINE_ROWS"))
        .unwrap_or(4)
}

/// Whether [`matvec_expert_combine`] can run the down projections `w` of `slots` experts per
/// token: every expert in one part, the slots' rows fit the workgroup's table, and the adapter
/// binds enough buffers.
pub fn can_expert_combine(ctx: &GpuContext, w: &GpuWeight, slots: usize) -> bool {
    w.parts.len() == 1 && slots > 0 && slots * combine_rows() <= 256 && can_moe_combine(ctx, w)
}

/// The routed experts' down projections (`w`, `rows_per_unit` = h rows per expert) finishing the
/// MoE block in one dispatch: for each token and row r,
/// `m = Σ_slot weights[slot] * (W_{ids[slot]} row r . x[slot]) + sigmoid(logit) * shared[r]`
/// (slots in order), then `wide[s*h + r] += 2 sigmoid(inject[s] / hc) * m` for every stream —
/// the arithmetic of [`matvec_expert`] into a buffer followed by [`Store::MoeCombine`], so the
/// same bits, with one dispatch and one buffer round trip fewer. Only where
/// [`can_expert_combine`] said so.
pub fn matvec_expert_combine(
    ctx: &GpuContext,
    rec: &mut Recorder,
    w: &GpuWeight,
    c: ExpertCombine,
    tokens: usize,
) -> Result<(), GpuError> {
    let items = tokens * c.slots;
    check_expert_items(w, c.ids, c.slots, items)?;
    if !can_expert_combine(ctx, w, c.slots) {
        return Err(GpuError::BadArgs(format!(
            "expert combine {}: {} slots, {} parts",
            w.name,
            c.slots,
            w.parts.len()
        )));
    }
    check_input(w, c.x, XForm::Plain, items)?;
    let h = w.rows_per_unit;
    need_floats(c.shared, tokens * h, "shared expert rows")?;
    need_floats(c.weights, items, "routing weights")?;
    need_floats(c.logit, tokens, "shared expert gate")?;
    need_floats(c.wide, tokens * h * c.hc, "wide residual")?;
    need_floats(c.inject, tokens * c.hc, "injection logits")?;
    let grid = ctx.grid_buffer(w.ty)?;
    let (gy, gz) = item_grid(tokens);
    let int = idot::usable(ctx, w, c.x, XForm::Plain);
    let local = int.then(|| idot::local_words(ctx, w, c.slots)).flatten();
    let digits = if int && local.is_none() {
        Some(idot::split(ctx, rec, w, c.x, XForm::Plain, items)?)
    } else {
        None
    };
    for part in &w.parts {
        let y = View::new(c.wide, 0, h * c.hc);
        let mut params = expert_params(w, part, c.x, XForm::Plain, y, items, c.slots, true, 1)?;
        params.h = to_u32(h, "h")?;
        params.hc = to_u32(c.hc, "hc")?;
        let mut b = bindings(w, part, &grid);
        b.extend([
            (1, &*c.x.buf.buffer),
            (2, &*c.wide.buffer),
            (3, &*c.ids.buffer),
            (8, &*c.inject.buffer),
            (10, &*c.shared.buffer),
            (11, &*c.weights.buffer),
            (12, &*c.logit.buffer),
        ]);
        let gx = to_u32(h.div_ceil(combine_rows()), "grid x")?;
        let shader = match &digits {
            Some(d) => {
                d.apply(&mut params);
                b.push((19, &*d.buf.buffer));
                idot::shader_of("matvec_idot", w)
            }
            None if local.is_some() => idot::shader_of("matvec_idot_local", w),
            None => shader_name(w, any_length(w, c.x, XForm::Plain)),
        };
        let mut pipeline = specialise(
            PipelineKey::new(shader, "matvec_expert_combine"),
            combine_rows(),
            combine_wg(ctx, c.slots),
            1,
            XForm::Plain.mode().0,
        );
        if let Some(words) = local {
            pipeline = pipeline
                .constant("IDOT_LOCAL", 1.0)
                .constant("XQL_WORDS", words as f64);
        }
        rec.push(
            ctx,
            &pipeline,
            &b,
            bytemuck::bytes_of(&params),
            [gx, gy, gz],
        )?;
    }
    Ok(())
}

/// Expert mat-vec over items grouped by expert (prefill): `groups` as `ops::moe_group` writes it
/// for chunks of up to `group_cap` tokens; otherwise as [`matvec_expert_with`], with the same
/// bits for every (item, row). Each workgroup runs one block of an expert's rows over all of that
/// expert's items, `TILE` at a time, so each weight is read once per chunk rather than per item.
#[allow(clippy::too_many_arguments)]
pub fn matvec_group(
    ctx: &GpuContext,
    rec: &mut Recorder,
    w: &GpuWeight,
    groups: &GpuBuf,
    group_cap: usize,
    slots: usize,
    x_per_item: bool,
    x: View,
    xform: XForm,
    y: View,
    items: usize,
) -> Result<(), GpuError> {
    let experts = w.n_rows / w.rows_per_unit.max(1);
    if slots == 0 || !items.is_multiple_of(slots) || items / slots > group_cap {
        return Err(GpuError::BadArgs(format!(
            "grouped expert matvec {}: {items} items, {slots} slots, lists of {group_cap}",
            w.name
        )));
    }
    need_floats(groups, experts * (1 + group_cap), "expert groups")?;
    let x_count = if x_per_item { items } else { items / slots };
    check_input(w, x, xform, x_count)?;
    y.check(
        items,
        w.rows_per_unit,
        &format!("grouped expert matvec {} output", w.name),
    )?;
    if coop::usable(ctx, w, x, xform, items) {
        return coop::group(
            ctx, rec, w, groups, group_cap, slots, x_per_item, x, y, items,
        );
    }
    let digits = if idot::usable(ctx, w, x, xform) {
        Some(idot::split(ctx, rec, w, x, xform, x_count)?)
    } else {
        None
    };
    let sg = subgroup_size(ctx);
    let wide = wide_ok(w, x, xform);
    let tile = if wide { wide_items() } else { TILE };
    let per_sg = tile_rows(w, w.rows_per_unit, tile);
    let per_wg = (wg_size() / sg).max(1);
    let grid = ctx.grid_buffer(w.ty)?;
    let task_order = if wide && xperm() && digits.is_none() {
        Some(permuted_x(ctx, rec, w, x, x_count)?)
    } else {
        None
    };
    for part in &w.parts {
        let mut params = expert_params(w, part, x, xform, y, items, slots, x_per_item, per_wg)?;
        params.group_base = to_u32(experts, "group base")?;
        params.group_cap = to_u32(group_cap, "group room")?;
        let mut b = bindings(w, part, &grid);
        match &task_order {
            Some(xp) => {
                params.x_offset = 0;
                params.x_stride = params.k;
                b.push((1, &*xp.buffer));
            }
            None => b.push((1, &*x.buf.buffer)),
        }
        b.push((2, &*y.buf.buffer));
        b.push((3, &*groups.buffer));
        let groups_x = w.rows_per_unit.div_ceil(per_sg);
        let gx = to_u32(groups_x.div_ceil(per_wg), "grid x")?;
        let gy = params.expert_count;
        if let Some(d) = &digits {
            d.apply(&mut params);
            b.push((19, &*d.buf.buffer));
        }
        let pipeline = if digits.is_some() && wide {
            idot::key_of("matvec_wide_idot", w, "matvec_group_wide", per_sg, tile)
        } else if digits.is_some() {
            idot::key(w, "matvec_group", per_sg, TILE)
        } else if wide {
            fused_key("matvec_wide", w, "matvec_group_wide", per_sg, tile, 0)
                .constant("XPERM", f64::from(u8::from(task_order.is_some())))
        } else {
            key(
                w,
                any_length(w, x, xform),
                "matvec_group",
                per_sg,
                TILE,
                xform,
            )
        };
        rec.push(ctx, &pipeline, &b, bytemuck::bytes_of(&params), [gx, gy, 1])?;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
/// Dequantize rows `ids[i]` (global row numbers) into `out[i]`, repeated `reps` times
/// `rep_stride` apart (the embedding lookup writes each token's row into all HC streams).
pub fn get_rows(
    ctx: &GpuContext,
    rec: &mut Recorder,
    w: &GpuWeight,
    ids: &GpuBuf,
    items: usize,
    out: View,
    reps: usize,
    rep_stride: usize,
) -> Result<(), GpuError> {
    if ids.len < items || reps == 0 {
        return Err(GpuError::BadArgs(format!(
            "get_rows {}: {items} items, {} ids",
            w.name, ids.len
        )));
    }
    out.check(
        items,
        (reps - 1) * rep_stride + w.row_len,
        &format!("get_rows {} output", w.name),
    )?;
    // get_rows writes at `item * y_stride + ...` from element 0: fold the view offset in by
    // binding from the start and requiring offset 0.
    if out.offset != 0 {
        return Err(GpuError::BadArgs(
            "get_rows output view must start at 0".into(),
        ));
    }
    let (gy, gz) = item_grid(items);
    // One invocation per 32 values (a chunk, a task of a split layout, or 32 values of a row of
    // any length).
    let chunks = w.row_len.div_ceil(32);
    let any = w.ty.block_size() == 1 && !w.row_len.is_multiple_of(32);
    let grid = ctx.grid_buffer(w.ty)?;
    for part in &w.parts {
        let params = MatvecParams {
            rows: to_u32(part.n_rows, "rows")?,
            k: to_u32(w.row_len, "k")?,
            row_bytes: to_u32(w.row_stride, "row stride")?,
            items: to_u32(items, "items")?,
            x_stride: to_u32(reps, "reps")?,
            x_offset: to_u32(rep_stride, "rep stride")?,
            y_stride: to_u32(out.stride, "out stride")?,
            y_offset: to_u32(part.first_row, "first row")?,
            d_base: to_u32(part.d_base, "d base")?,
            ..Default::default()
        };
        let mut b = bindings(w, part, &grid);
        b.push((2, &*out.buf.buffer));
        b.push((3, &*ids.buffer));
        let gx = to_u32(chunks.div_ceil(64), "grid x")?;
        rec.push(
            ctx,
            &PipelineKey::new(shader_name(w, any), "get_rows"),
            &b,
            bytemuck::bytes_of(&params),
            [gx, gy, gz],
        )?;
    }
    Ok(())
}
