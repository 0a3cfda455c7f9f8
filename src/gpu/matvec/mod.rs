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
mod dense;
mod expert;
mod expert_combine;
mod idot;
mod keys;
mod norm;
mod rows;
mod store;
mod tuning;

pub use dense::{matvec, matvec_with, prepare_x};
pub use expert::{
    matvec_expert, matvec_expert_glu, matvec_expert_glu_pairs, matvec_expert_with, matvec_group,
};
pub use expert_combine::{ExpertCombine, can_expert_combine, matvec_expert_combine};
pub use norm::can_norm_input;
pub use rows::get_rows;
pub use store::can_moe_combine;
pub use tuning::set_wide_pairs;

// What coop.rs and idot.rs take from here besides the shared items below.
use expert::expert_params;
use keys::{any_length, specialise};
use store::segment_params;
use tuning::wg_size;

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

fn need_floats(b: &GpuBuf, n: usize, what: &str) -> Result<(), GpuError> {
    if b.len < n {
        return Err(GpuError::BadArgs(format!(
            "{what}: {n} floats needed, buffer holds {}",
            b.len
        )));
    }
    Ok(())
}
