//! Launchers for shaders/qsa.wgsl: KV cache packing and stores (`kv_pack`, `kv_store`), `rope`,
//! block selection (`qsa_select`) and attention (`qsa_attend`).

use super::gdn::Span;
use super::{need, u};
use crate::gpu::buffers::GpuBuf;
use crate::gpu::kernels::Recorder;
use crate::gpu::pipelines::PipelineKey;
use crate::gpu::{GpuContext, GpuError};
use crate::model::config::KvType;

/// Parameters of shaders/qsa.wgsl. `first`: the column of the chunk's first token in the buffers
/// that hold a row per token (queries, index queries, attention output; [`kv_pack`]'s stage),
/// 0 for a sequence fed alone, a batch member's first column in the batch's buffers; the
/// scores, selections and partials stay the sequence's own, from row 0.
#[repr(C)]
#[derive(Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct QsaParams {
    pub tokens: u32,
    pub pos0: u32,
    pub heads: u32,
    pub head_stride: u32,
    pub row_stride: u32,
    pub off: u32,
    pub half: u32,
    pub pos_step: u32,
    pub n_kv: u32,
    pub hd: u32,
    pub ratio: u32,
    pub budget: u32,
    pub idim: u32,
    pub max_blocks: u32,
    pub dense: u32,
    pub scale: f32,
    pub first: u32,
}

/// `--kv f16` or `q8_0`: the `count` values of `stage` (f32) rounded into the flat cache `cache`
/// from value `first` on (`qsa.wgsl`'s `kv_pack` and `kv_pack_q8`; the values before `first` are
/// kept). q8_0 takes whole blocks of 32 values.
pub fn kv_pack(
    ctx: &GpuContext,
    rec: &mut Recorder,
    kv: KvType,
    stage: &GpuBuf,
    cache: &GpuBuf,
    first: usize,
    count: usize,
) -> Result<(), GpuError> {
    kv_pack_from(ctx, rec, kv, (stage, 0), cache, first, count)
}

/// [`kv_pack`] of the `count` values of `stage.0` from value `stage.1` on (a batch member's
/// columns of the batch's stage buffer).
pub fn kv_pack_from(
    ctx: &GpuContext,
    rec: &mut Recorder,
    kv: KvType,
    (stage, from): (&GpuBuf, usize),
    cache: &GpuBuf,
    first: usize,
    count: usize,
) -> Result<(), GpuError> {
    need(stage, from + count, "kv stage")?;
    let end = first + count;
    // The entry point, the cache words the values end in, and one invocation per word (f16) or
    // per block (q8_0).
    let (entry, words, invocations) = match kv {
        KvType::F16 => ("kv_pack", end.div_ceil(2), end.div_ceil(2) - first / 2),
        KvType::Q8_0 => {
            let block = crate::model::config::KV_Q8_BLOCK;
            if !first.is_multiple_of(block) || !count.is_multiple_of(block) {
                return Err(GpuError::BadArgs(format!(
                    "q8_0 cache: values {first}..{end} are not whole blocks"
                )));
            }
            ("kv_pack_q8", end / block * 9, count / block)
        }
        KvType::F32 => return Err(GpuError::BadArgs("no pack for an f32 cache".into())),
    };
    if cache.len < words || invocations.div_ceil(64) > 65535 {
        return Err(GpuError::BadArgs(format!(
            "{kv:?} cache of {} words: values {first}..{end} do not fit one pack",
            cache.len
        )));
    }
    let params = QsaParams {
        off: u(first)?,
        row_stride: u(count)?,
        first: u(from)?,
        ..Default::default()
    };
    rec.push(
        ctx,
        &PipelineKey::new("qsa", entry),
        &[(12, &*stage.buffer), (13, &*cache.buffer)],
        bytemuck::bytes_of(&params),
        [u(invocations.div_ceil(64))?, 1, 1],
    )
}

/// A stage buffer of a batch and the f32 cache its rows go to ([`kv_store`]).
#[derive(Clone, Copy)]
pub struct StageRows<'a> {
    pub stage: &'a GpuBuf,
    pub cache: &'a GpuBuf,
}

/// A batch member's new keys and values (`width` values per token) and raw index keys (`idim`
/// per token; 0: none, and `index` is only bound) from columns `tokens` of the batch's stage
/// buffers into its f32 caches from position `pos0` on: one dispatch (`qsa.wgsl`'s `kv_store`),
/// the words moved as they are.
#[allow(clippy::too_many_arguments)]
pub fn kv_store(
    ctx: &GpuContext,
    rec: &mut Recorder,
    [keys, values]: [StageRows; 2],
    index: StageRows,
    width: usize,
    idim: usize,
    tokens: impl Into<Span>,
    pos0: usize,
) -> Result<(), GpuError> {
    let tokens = tokens.into();
    if tokens.count == 0 {
        return Ok(());
    }
    let sets = if idim > 0 {
        need(index.stage, tokens.end() * idim, "index key stage")?;
        need(index.cache, (pos0 + tokens.count) * idim, "index key cache")?;
        3
    } else {
        2
    };
    for (rows, what) in [(keys, "key"), (values, "value")] {
        need(rows.stage, tokens.end() * width, &format!("{what} stage"))?;
        need(
            rows.cache,
            (pos0 + tokens.count) * width,
            &format!("{what} cache"),
        )?;
    }
    let params = QsaParams {
        tokens: u(tokens.count)?,
        pos0: u(pos0)?,
        row_stride: u(width)?,
        idim: u(idim)?,
        first: u(tokens.first)?,
        ..Default::default()
    };
    rec.push(
        ctx,
        &PipelineKey::new("qsa", "kv_store"),
        &[
            (14, &*keys.stage.buffer),
            (15, &*values.stage.buffer),
            (16, &*index.stage.buffer),
            (17, &*keys.cache.buffer),
            (18, &*values.cache.buffer),
            (19, &*index.cache.buffer),
        ],
        bytemuck::bytes_of(&params),
        [u(width.max(idim).div_ceil(64))?, u(tokens.count)?, sets],
    )
}

/// Rotate `heads` vectors per row in place (positions pos0 + t*pos_step).
#[allow(clippy::too_many_arguments)]
pub fn rope(
    ctx: &GpuContext,
    rec: &mut Recorder,
    y: &GpuBuf,
    table: &GpuBuf,
    rows: usize,
    heads: usize,
    head_stride: usize,
    row_stride: usize,
    off: usize,
    half: usize,
    pos0: usize,
    pos_step: usize,
) -> Result<(), GpuError> {
    if rows == 0 || half == 0 {
        return Ok(());
    }
    need(
        y,
        off + (rows - 1) * row_stride + (heads - 1) * head_stride + 2 * half,
        "rope data",
    )?;
    need(
        table,
        (pos0 + (rows - 1) * pos_step + 1) * half * 2,
        "rope table (context too long?)",
    )?;
    let params = QsaParams {
        tokens: u(rows)?,
        pos0: u(pos0)?,
        heads: u(heads)?,
        head_stride: u(head_stride)?,
        row_stride: u(row_stride)?,
        off: u(off)?,
        half: u(half)?,
        pos_step: u(pos_step)?,
        ..Default::default()
    };
    rec.push(
        ctx,
        &PipelineKey::new("qsa", "rope"),
        &[(0, &*y.buffer), (1, &*table.buffer)],
        bytemuck::bytes_of(&params),
        [u(half.div_ceil(64))?, u(heads)?, u(rows)?],
    )
}

/// Invocations of a `qsa_score` workgroup (shaders/qsa.wgsl `WG`): one block each.
const QSA_SCORE_WG: usize = 64;
/// Query tokens per `qsa_score` workgroup (`SCORE_TOKENS`): each staged block key serves them all.
const QSA_SCORE_TOKENS: usize = 16;

/// Block selection per query token (see shaders/qsa.wgsl): the blocks' scores spread over many
/// workgroups (`qsa_score`, only where some token has more blocks than the budget), then one
/// workgroup per token selects (`qsa_select`).
#[allow(clippy::too_many_arguments)]
pub fn qsa_select(
    ctx: &GpuContext,
    rec: &mut Recorder,
    params: &QsaParams,
    index_queries: &GpuBuf,
    block_keys: &GpuBuf,
    scratch: &GpuBuf,
    selected: &GpuBuf,
) -> Result<(), GpuError> {
    let t = params.tokens as usize;
    let end = params.first as usize + t;
    need(
        index_queries,
        end * params.heads as usize * params.idim as usize,
        "qsa index queries",
    )?;
    need(scratch, t * 2 * params.max_blocks as usize, "qsa scratch")?;
    need(selected, t * (params.budget as usize + 1), "qsa selection")?;
    // Blocks of the chunk's last token: the most any of its tokens has.
    let most_blocks = (params.pos0 as usize + t) / params.ratio.max(1) as usize;
    if most_blocks > params.budget as usize {
        if most_blocks > params.max_blocks as usize {
            return Err(GpuError::BadArgs(format!(
                "qsa selection: {most_blocks} blocks, room for {}",
                params.max_blocks
            )));
        }
        rec.push(
            ctx,
            &PipelineKey::new("qsa", "qsa_score"),
            &[
                (2, &*index_queries.buffer),
                (3, &*block_keys.buffer),
                (4, &*scratch.buffer),
            ],
            bytemuck::bytes_of(params),
            [
                u(most_blocks.div_ceil(QSA_SCORE_WG))?,
                u(t.div_ceil(QSA_SCORE_TOKENS))?,
                1,
            ],
        )?;
    }
    rec.push(
        ctx,
        &PipelineKey::new("qsa", "qsa_select"),
        &[(4, &*scratch.buffer), (5, &*selected.buffer)],
        bytemuck::bytes_of(params),
        [u(t)?, 1, 1],
    )
}

/// Most keys one query may attend to on the GPU (sizes the attention partials).
pub const QSA_MAX_KEYS: usize = 2560;
/// Keys per attention chunk (shaders/qsa.wgsl `ATT_CHUNK`).
pub const QSA_CHUNK: usize = 256;

/// Floats of attention partials a chunk of `tokens` queries needs (see [`qsa_attend`]).
pub fn qsa_partials_len(tokens: usize, heads: usize, hd: usize) -> usize {
    tokens * heads * QSA_MAX_KEYS.div_ceil(QSA_CHUNK) * (hd + 2)
}

/// `qsa_attend`'s workgroup size and its most query heads per workgroup (ATT_WG, MAX_GROUP).
const QSA_ATT_WG: usize = 256;
const QSA_MAX_GROUP: usize = 16;
/// Chunks of at least this many tokens group the query heads of a kv head in one workgroup.
const QSA_GROUP_MIN_TOKENS: usize = 8;
/// Shorter chunks (decode) group at most this many: the heads spread over more workgroups, while
/// each key tile still serves several. (H200, 48 layers, 2,100 keys: `qsa_attend` 1,196 us per
/// step with one head per workgroup, 875 with 4; `docs/bench/attend-group.txt`.)
const QSA_DECODE_GROUP: usize = 4;

/// Workgroup memory `qsa_attend` needs with key tiles of `kt` dims and `group` heads.
fn attend_memory(kt: usize, group: usize) -> usize {
    let tile = QSA_CHUNK * (kt / 4 + 1) * 16;
    tile + QSA_CHUNK * 4 * (group + 1) + QSA_ATT_WG * 4 * group
}

/// `qsa_attend`'s query heads per workgroup (GROUP) and dims per key tile (KT_DIMS): the most
/// heads of one kv head (a divisor of `heads / n_kv`; at most [`QSA_DECODE_GROUP`] for a decode
/// step or a short chunk) that fit, with tiles of 32 dims where the device's workgroup memory
/// still holds them, else 16. Every head's
/// arithmetic is the same whatever the choice, so the same bits (`STRATA_ATTEND_TILE=16` forces
/// the smaller tile, `STRATA_ATTEND_GROUP=1` one head per workgroup, to check that;
/// `STRATA_ATTEND_GROUP=N` at most N heads per workgroup for every chunk, decode too, for tuning).
fn attend_shape(ctx: &GpuContext, tokens: usize, heads: usize, n_kv: usize) -> (usize, usize) {
    let forced_small = std::env::var("STRATA_ATTEND_TILE").as_deref() == Ok("16");
    let forced_group = std::env::var("STRATA_ATTEND_GROUP")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|n| *n >= 1);
    let limit = ctx.limits.max_compute_workgroup_storage_size as usize;
    let tiles: &[usize] = if forced_small { &[16] } else { &[32, 16] };
    let per_kv = if n_kv > 0 && heads.is_multiple_of(n_kv) {
        heads / n_kv
    } else {
        1
    };
    let most = match forced_group {
        Some(n) => n.min(per_kv).min(QSA_MAX_GROUP),
        None if tokens >= QSA_GROUP_MIN_TOKENS => per_kv.min(QSA_MAX_GROUP),
        None => per_kv.min(QSA_DECODE_GROUP),
    };
    for group in (1..=most).rev().filter(|g| per_kv.is_multiple_of(*g)) {
        for &kt in tiles {
            if attend_memory(kt, group) <= limit {
                return (group, kt);
            }
        }
    }
    (1, 16)
}

/// Attention over the selected keys, with the sigmoid output gate: partial softmax per chunk of
/// keys into `partials`, then the chunks merged in order (two dispatches).
#[allow(clippy::too_many_arguments)]
pub fn qsa_attend(
    ctx: &GpuContext,
    rec: &mut Recorder,
    params: &QsaParams,
    queries: &GpuBuf,
    keys: &GpuBuf,
    values: &GpuBuf,
    selected: &GpuBuf,
    partials: &GpuBuf,
    out: &GpuBuf,
    kv: KvType,
) -> Result<(), GpuError> {
    let t = params.tokens as usize;
    let h = params.heads as usize;
    let hd = params.hd as usize;
    let chunks = QSA_MAX_KEYS.div_ceil(QSA_CHUNK);
    let mode = match kv {
        KvType::F32 => 0.0,
        KvType::F16 => 1.0,
        KvType::Q8_0 => 2.0,
    };
    let (group, kt) = attend_shape(ctx, t, h, params.n_kv as usize);
    let attend = if group > 1 {
        PipelineKey::new("qsa", "qsa_attend_group").constant("GROUP", group as f64)
    } else {
        PipelineKey::new("qsa", "qsa_attend")
    }
    .constant("KV_MODE", mode)
    .constant("KT_DIMS", kt as f64);
    need(partials, qsa_partials_len(t, h, hd), "qsa partials")?;
    let params = QsaParams {
        max_blocks: u(chunks)?,
        ..*params
    };
    if params.dense != 0 && params.pos0 as usize + t > QSA_MAX_KEYS {
        return Err(GpuError::Unsupported(format!(
            "dense attention past {QSA_MAX_KEYS} tokens on the GPU"
        )));
    }
    let end = params.first as usize + t;
    need(queries, end * h * 2 * hd, "qsa queries")?;
    need(out, end * h * hd, "qsa output")?;
    rec.push(
        ctx,
        &attend,
        &[
            (6, &*queries.buffer),
            (7, &*keys.buffer),
            (8, &*values.buffer),
            (9, &*selected.buffer),
            (11, &*partials.buffer),
        ],
        bytemuck::bytes_of(&params),
        [u(h / group)?, u(chunks)?, u(t)?],
    )?;
    rec.push(
        ctx,
        &PipelineKey::new("qsa", "qsa_merge"),
        &[
            (6, &*queries.buffer),
            (9, &*selected.buffer),
            (10, &*out.buffer),
            (11, &*partials.buffer),
        ],
        bytemuck::bytes_of(&params),
        [u(h)?, u(t)?, 1],
    )
}
