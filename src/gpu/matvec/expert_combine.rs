//! The routed experts' down projections finishing the MoE block in their store
//! ([`matvec_expert_combine`]).

use super::expert::{check_expert_items, expert_params};
use super::keys::shader_name;
use super::store::can_moe_combine;
use super::tuning::{combine_rows, combine_wg};
use super::{
    GpuBuf, GpuContext, GpuError, GpuWeight, PipelineKey, Recorder, View, XForm, any_length,
    bindings, check_input, idot, item_grid, need_floats, specialise, to_u32,
};

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
/// the arithmetic of [`matvec_expert`](super::matvec_expert) into a buffer followed by
/// [`Store::MoeCombine`](super::Store::MoeCombine), so the same bits, with one dispatch and one
/// buffer round trip fewer. Only where [`can_expert_combine`] said so.
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
