//! Token embedding and stream initialisation (model-spec §2.1): every hyper-connection stream starts
//! as a copy of the token's embedding row (no scaling).

use super::ModelError;
use super::weights::QuantMatrix;

/// Writes the embedding of `token` into each of the `wide.len() / H` streams of `wide`.
pub fn embed(table: &QuantMatrix, token: u32, wide: &mut [f32]) -> Result<(), ModelError> {
    let n_embd = table.cols;
    let (first, rest) = wide.split_at_mut(n_embd.min(wide.len()));
    table.dequantize_row(token as usize, first)?;
    for stream in rest.chunks_mut(n_embd) {
        stream.copy_from_slice(first);
    }
    Ok(())
}
