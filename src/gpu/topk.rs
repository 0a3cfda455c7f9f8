//! The first [`TOP_CANDIDATES`] tokens of a logits row in sampling order, found on the GPU
//! (`shaders/topk.wgsl`), so a sampled decode step reads back about half a kilobyte instead of the
//! whole row and the host sorts nothing (see `crate::sampler::Sampler::top_only`).

use super::buffers::GpuBuf;
use super::kernels::Recorder;
use super::pipelines::PipelineKey;
use super::{GpuContext, GpuError};

/// Candidates in a list (the shader's K).
pub const TOP_CANDIDATES: usize = 64;
/// Words of one list: the (id, key) pairs, then the smallest id of a non-finite value.
pub const LIST_WORDS: usize = 2 * TOP_CANDIDATES + 1;
/// Row values each workgroup of the first pass sorts (the shader's SLICE).
const SLICE: usize = 1024;
/// Lists one workgroup of a merge pass takes (two rounds of the shader's ROUND = 15).
const MERGE_PER_WG: usize = 30;

/// Words each of the two scratch buffers [`record`] needs for a row of `n` values.
pub fn scratch_words(n: usize) -> usize {
    n.div_ceil(SLICE).max(1) * LIST_WORDS
}

/// Record the passes that leave the list of `logits[..n]` at the start of the returned buffer
/// (`a` or `b`, both of at least [`scratch_words`] words).
pub fn record<'a>(
    ctx: &GpuContext,
    rec: &mut Recorder,
    logits: &GpuBuf,
    n: usize,
    a: &'a GpuBuf,
    b: &'a GpuBuf,
) -> Result<&'a GpuBuf, GpuError> {
    let words = scratch_words(n);
    if logits.len < n || a.len < words || b.len < words {
        return Err(GpuError::BadArgs(format!(
            "top candidates: {n} logits need buffers of {words} words"
        )));
    }
    let count = |v: usize| {
        u32::try_from(v).map_err(|_| GpuError::BadArgs(format!("{v} does not fit in u32")))
    };
    let mut lists = n.div_ceil(SLICE).max(1);
    rec.push(
        ctx,
        &PipelineKey::new("topk", "topk_slices"),
        &[(0, &*logits.buffer), (2, &*a.buffer)],
        bytemuck::cast_slice(&[count(n)?, 0u32]),
        [count(lists)?, 1, 1],
    )?;
    let (mut from, mut to) = (a, b);
    while lists > 1 {
        let groups = lists.div_ceil(MERGE_PER_WG);
        rec.push(
            ctx,
            &PipelineKey::new("topk", "topk_merge"),
            &[(1, &*from.buffer), (2, &*to.buffer)],
            bytemuck::cast_slice(&[count(lists)?, count(MERGE_PER_WG)?]),
            [count(groups)?, 1, 1],
        )?;
        lists = groups;
        std::mem::swap(&mut from, &mut to);
    }
    Ok(from)
}

/// A list read back: the candidates as (id, logit) in order (pairs past the row's `n` values
/// dropped), or `Err` with the smallest id of a non-finite value.
pub fn decode(words: &[u32], n: usize) -> Result<Vec<(u32, f32)>, u32> {
    if let Some(&bad) = words.get(2 * TOP_CANDIDATES)
        && bad != u32::MAX
    {
        return Err(bad);
    }
    Ok(words
        .chunks_exact(2)
        .take(TOP_CANDIDATES)
        .filter(|pair| (pair[0] as usize) < n)
        .map(|pair| (pair[0], f32::from_bits(logit_bits(pair[1]))))
        .collect())
}

/// The logit bits behind a key (the inverse of the shader's `order_hi`).
fn logit_bits(key: u32) -> u32 {
    if key & 0x8000_0000 != 0 {
        key
    } else {
        !key & 0x7fff_ffff
    }
}
