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

/// Words each of the two scratch buffers [`record`] needs for a row of `n` values (times the
/// rows for [`record_rows`]).
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
    passes(ctx, rec, logits, n, Rows::First(1), a, b)
}

/// Record the passes that leave the lists of `rows.len()` rows of `logits` (rows of `n` values;
/// row i of the result is logits row `rows[i]`, as the `rows_buf` holds them) in the returned
/// buffer, list i at word `i * LIST_WORDS`. `a` and `b` need `rows.len() * scratch_words(n)`
/// words. Each row's list is the one [`record`] finds for that row alone.
#[allow(clippy::too_many_arguments)]
pub fn record_rows<'a>(
    ctx: &GpuContext,
    rec: &mut Recorder,
    logits: &GpuBuf,
    n: usize,
    rows: &[u32],
    rows_buf: &GpuBuf,
    a: &'a GpuBuf,
    b: &'a GpuBuf,
) -> Result<&'a GpuBuf, GpuError> {
    if rows_buf.len < rows.len() {
        return Err(GpuError::BadArgs(format!(
            "top candidates: {} rows need a row list of as many words",
            rows.len()
        )));
    }
    if let Some(&bad) = rows.iter().find(|&&r| logits.len < (r as usize + 1) * n) {
        return Err(GpuError::BadArgs(format!(
            "top candidates: logits row {bad} is past the buffer"
        )));
    }
    rows_buf.write_u32(ctx, 0, rows)?;
    passes(
        ctx,
        rec,
        logits,
        n,
        Rows::Listed(rows.len(), rows_buf),
        a,
        b,
    )
}

/// Which logits rows a pass sorts: the first `count`, or `count` rows named in a buffer.
enum Rows<'a> {
    First(usize),
    Listed(usize, &'a GpuBuf),
}

fn passes<'a>(
    ctx: &GpuContext,
    rec: &mut Recorder,
    logits: &GpuBuf,
    n: usize,
    rows: Rows<'_>,
    a: &'a GpuBuf,
    b: &'a GpuBuf,
) -> Result<&'a GpuBuf, GpuError> {
    let (count, listed, rows_buf) = match rows {
        Rows::First(count) => (count, 0u32, logits),
        Rows::Listed(count, buf) => (count, 1u32, buf),
    };
    let words = scratch_words(n) * count;
    if (listed == 0 && logits.len < n * count) || a.len < words || b.len < words {
        return Err(GpuError::BadArgs(format!(
            "top candidates: {count} rows of {n} logits need buffers of {words} words"
        )));
    }
    let num = |v: usize| {
        u32::try_from(v).map_err(|_| GpuError::BadArgs(format!("{v} does not fit in u32")))
    };
    let mut lists = n.div_ceil(SLICE).max(1);
    rec.push(
        ctx,
        &PipelineKey::new("topk", "topk_slices"),
        &[
            (0, &*logits.buffer),
            (2, &*a.buffer),
            (3, &*rows_buf.buffer),
        ],
        bytemuck::cast_slice(&[num(n)?, 0u32, listed, 0u32]),
        [num(lists)?, num(count)?, 1],
    )?;
    let (mut from, mut to) = (a, b);
    while lists > 1 {
        let groups = lists.div_ceil(MERGE_PER_WG);
        rec.push(
            ctx,
            &PipelineKey::new("topk", "topk_merge"),
            &[(1, &*from.buffer), (2, &*to.buffer)],
            bytemuck::cast_slice(&[num(lists)?, num(MERGE_PER_WG)?, 0u32, 0u32]),
            [num(groups)?, num(count)?, 1],
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
