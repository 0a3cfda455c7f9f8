//! Row lookups ([`get_rows`]): whole rows of a weight dequantized, for the embedding.

use super::keys::shader_name;
use super::{
    GpuBuf, GpuContext, GpuError, GpuWeight, MatvecParams, PipelineKey, Recorder, View, bindings,
    item_grid, to_u32,
};

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
