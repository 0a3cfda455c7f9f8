//! Several sequences in one forward pass ([`Backend::feed_many`](crate::engine::Backend)): the
//! tokens of every member become the columns of one chunk, so each weight is read once for all
//! of them. What is token-wise (embedding, projections, hyper-connections, norms, MoE, head)
//! runs over the whole chunk in a batch scratch; what reads a sequence's own state (the GDN conv
//! and recurrence, QSA caches and attention, the PLE conv) runs per member on its columns of the
//! batch scratch (`ops::Span`, the kernels' first column), with its own state; an f32 KV cache
//! gets the member's new keys, values and raw index keys from the batch's stage buffers in one
//! copy (a rounded cache reads them in its pack, and copies only the raw index keys). Every
//! kernel computes a column the same way whatever the chunk around it and wherever the column
//! sits (the chunk-size invariance the backend keeps), and copies move bits, so a member's
//! logits are those of the same tokens fed alone.
//!
//! Batched: members of this backend with resident or pinned experts (VRAM slots filled by the
//! host, `--experts` tiers other than pinned, sync with the host per layer), outside the
//! stage-check and profiling modes, up to [`BATCH_TOKENS`] tokens together. The other items of a
//! call are fed one at a time. With pinned experts the pass's routing log is read back with the
//! logits, as a feed alone reads its own, and the hot copies are promoted between passes.

use super::*;
use crate::engine::Fed;
use crate::gpu::ops::Span;
use crate::model::config::KvType;

/// Tokens of one batched pass (every column's logits row is computed: see [`LOGIT_ROWS`]).
pub const BATCH_TOKENS: usize = LOGIT_ROWS;

/// One sequence's share of a batched pass.
struct Member<'a> {
    /// Index in the caller's batch.
    item: usize,
    seq: &'a mut GpuSequence,
    tokens: &'a [u32],
    top: usize,
    /// Its first column in the batch scratch.
    col: usize,
    /// Its first token's absolute position.
    pos0: usize,
}

impl GpuBackend {
    /// [`Backend::feed_many`]: the members that can share a pass run together, the rest alone.
    pub(super) fn feed_batched(&self, batch: &mut [FeedItem<'_>]) -> Vec<Result<Fed, EngineError>> {
        let mut results: Vec<Option<Result<Fed, EngineError>>> =
            batch.iter().map(|_| None).collect();
        let batchable = self.tier.is_none() && !self.check_stages;
        let mut members = Vec::new();
        let mut cols = 0;
        let mut alone = Vec::new();
        for (i, item) in batch.iter_mut().enumerate() {
            let t = item.tokens.len();
            let fits = batchable
                && t > 0
                && t <= self.max_chunk
                && cols + t <= BATCH_TOKENS
                && item.top <= topk::TOP_CANDIDATES;
            let ours = |s: &GpuSequence| {
                !s.profile && !s.span && std::ptr::eq(Arc::as_ptr(&s.backend), self)
            };
            let joins = fits
                && item
                    .sequence
                    .as_any_mut()
                    .and_then(|s| s.downcast_ref::<GpuSequence>())
                    .is_some_and(ours);
            if !joins {
                alone.push(item);
                continue;
            }
            let Some(seq) = item
                .sequence
                .as_any_mut()
                .and_then(|s| s.downcast_mut::<GpuSequence>())
            else {
                continue;
            };
            // What a feed alone checks first (it leaves the sequence as it was).
            let pos0 = seq.tokens.len();
            let ready = seq
                .validate(item.tokens)
                .and_then(|()| seq.reserve_kv(pos0 + t).map_err(gpu_err));
            if let Err(e) = ready {
                results[i] = Some(Err(e));
                continue;
            }
            members.push(Member {
                item: i,
                seq,
                tokens: item.tokens,
                top: item.top,
                col: cols,
                pos0,
            });
            cols += t;
        }
        match members.len() {
            0 => {}
            1 => {
                // Nothing to share: the member's own feed (its chunk buffers, its fusions).
                for m in members {
                    let fed = if m.top > 0 {
                        m.seq.feed_top(m.tokens, m.top).map(Fed::Top)
                    } else {
                        m.seq.feed(m.tokens, false).map(Fed::Row)
                    };
                    results[m.item] = Some(fed);
                }
            }
            _ => {
                for (item, fed) in self.run_batch(members) {
                    results[item] = Some(fed);
                }
            }
        }
        let mut alone = alone.into_iter();
        for (i, slot) in results.iter_mut().enumerate() {
            if slot.is_none() {
                *slot = Some(match alone.next() {
                    Some(item) => item.feed(),
                    None => Err(EngineError::Other(format!("batch item {i} was not fed"))),
                });
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(EngineError::Other("batch item not fed".into()))))
            .collect()
    }

    /// Run `members` as one pass; each member's result by its item index. A member whose PLE
    /// rows fail their check gets that error alone; a failure of the pass itself fails (and
    /// poisons) every member in it.
    fn run_batch(&self, members: Vec<Member<'_>>) -> Vec<(usize, Result<Fed, EngineError>)> {
        let mut out = Vec::new();
        let bs = match self.batch_scratch() {
            Ok(bs) => bs,
            Err(e) => {
                let message = e.to_string();
                return members
                    .into_iter()
                    .map(|m| (m.item, Err(gpu_err(GpuError::BadArgs(message.clone())))))
                    .collect();
            }
        };
        // The chunk buffers and the batch scratch serve one feed at a time.
        let _feeding = scratch::lock(&self.feed_lock);
        let mut ready = Vec::new();
        let mut cols = 0;
        for mut m in members {
            // A step a member recorded ahead for itself would read its caches at a position
            // this pass fills.
            m.seq.next = None;
            m.seq.tokens.extend_from_slice(m.tokens);
            m.col = cols;
            match m.seq.upload_ple_rows_to(&bs, cols, m.pos0, m.tokens.len()) {
                Ok(()) => {
                    cols += m.tokens.len();
                    ready.push(m);
                }
                Err(e) => {
                    m.seq.poisoned = true;
                    out.push((m.item, Err(e)));
                }
            }
        }
        if ready.is_empty() {
            return out;
        }
        match self.batch_pass(&bs, &mut ready, cols) {
            Ok(rows) => {
                use std::sync::atomic::Ordering::Relaxed;
                self.batched[0].fetch_add(1, Relaxed);
                self.batched[1].fetch_add(ready.len(), Relaxed);
                out.extend(
                    ready
                        .iter_mut()
                        .zip(rows)
                        .map(|(m, row)| (m.item, m.finish(row, self.config.vocab_size))),
                );
            }
            Err(e) => {
                let message = e.to_string();
                out.extend(ready.iter_mut().map(|m| {
                    m.seq.poisoned = true;
                    (m.item, Err(EngineError::Other(message.clone())))
                }));
            }
        }
        out
    }

    /// The pass over `members` (`cols` tokens; their PLE rows already in `bs`): what each
    /// member's last logits row gives, in member order: its sampling candidates, found on the
    /// GPU, for a member that asks for them, else the row.
    // A bind-group cache is keyed by buffers (see `Recorder::with_cache`).
    #[allow(clippy::mutable_key_type)]
    fn batch_pass(
        &self,
        bs: &Arc<Scratch>,
        members: &mut [Member<'_>],
        cols: usize,
    ) -> Result<Vec<LastRow>, EngineError> {
        let Some(first) = members.first() else {
            return Ok(Vec::new());
        };
        let backend = Arc::clone(&first.seq.backend);
        let c = &*self.ctx;
        let ids: Vec<u32> = members
            .iter()
            .flat_map(|m| m.tokens.iter().copied())
            .collect();
        debug_assert_eq!(ids.len(), cols);
        bs.ids.write_u32(c, 0, &ids).map_err(gpu_err)?;
        let driver = GpuSequence::driver(backend, Arc::clone(bs)).map_err(gpu_err)?;
        let cache = std::mem::take(&mut *scratch::lock(&self.batch_binds));
        let mut rec = Recorder::with_cache(cache);
        let recorded = self
            .record_batch(&mut rec, &driver, members, cols)
            .and_then(|()| record_candidates(self, bs, &mut rec, members).map_err(gpu_err));
        *scratch::lock(&self.batch_binds) = rec.take_cache();
        let lists = recorded?;
        let v = self.config.vocab_size;
        let row_bytes = (v * 4) as u64;
        let list_bytes = (topk::LIST_WORDS * 4) as u64;
        // The staging layout: each member's row or list, in member order.
        let sizes: Vec<u64> = members
            .iter()
            .map(|m| if m.top > 0 { list_bytes } else { row_bytes })
            .collect();
        let staging = c.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("batch readback"),
            size: sizes.iter().sum::<u64>().max(4),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut encoder = c
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("batch"),
            });
        rec.encode(&mut encoder, None);
        let mut at = 0;
        let mut listed = 0;
        for (m, &size) in members.iter().zip(&sizes) {
            if m.top > 0 {
                let from = lists.ok_or_else(|| gpu_err(no_lists()))?;
                encoder.copy_buffer_to_buffer(
                    &from.buffer,
                    listed * list_bytes,
                    &staging,
                    at,
                    size,
                );
                listed += 1;
            } else {
                let last = (m.col + m.tokens.len() - 1) as u64;
                encoder.copy_buffer_to_buffer(
                    &bs.logits.buffer,
                    last * row_bytes,
                    &staging,
                    at,
                    size,
                );
            }
            at += size;
        }
        let routing = self.routing_readback(&mut encoder, bs, cols);
        c.queue.submit([encoder.finish()]);
        let bytes = read_staging(c, &staging).map_err(gpu_err)?;
        if let (Some(staging), Some(pinned)) = (routing, &self.pinned) {
            let log: Vec<u32> =
                bytemuck::pod_collect_to_vec(&read_staging(c, &staging).map_err(gpu_err)?);
            pinned.record(&log, cols * self.config.moe.n_expert_used);
            self.promote_hot_experts().map_err(gpu_err)?;
        }
        let mut out = Vec::with_capacity(members.len());
        let mut at = 0;
        for (m, &size) in members.iter().zip(&sizes) {
            let part = &bytes[at as usize..(at + size) as usize];
            out.push(if m.top > 0 {
                LastRow::List(bytemuck::pod_collect_to_vec(part))
            } else {
                LastRow::Row(bytemuck::pod_collect_to_vec(part))
            });
            at += size;
        }
        Ok(out)
    }

    /// Pinned experts: queue a copy of the routing log of a pass over `t` tokens of `scratch`
    /// (every layer's choices) for the host.
    pub(super) fn routing_readback(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        scratch: &Scratch,
        t: usize,
    ) -> Option<wgpu::Buffer> {
        self.pinned.as_ref()?;
        let size = (self.layers.len() * t * self.config.moe.n_expert_used * 4) as u64;
        let staging = self.ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("routing readback"),
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        encoder.copy_buffer_to_buffer(&scratch.routing_log.buffer, 0, &staging, 0, size);
        Some(staging)
    }

    /// Record the batched forward: logits of every column into the batch scratch.
    fn record_batch(
        &self,
        rec: &mut Recorder,
        driver: &GpuSequence,
        members: &mut [Member<'_>],
        cols: usize,
    ) -> Result<(), EngineError> {
        driver.record_embedding(rec, cols).map_err(gpu_err)?;
        for (index, layer) in self.layers.iter().enumerate() {
            self.record_batch_mixer(rec, driver, members, index, layer, cols)
                .map_err(gpu_err)?;
            driver.hc_mix(rec, &layer.ffn_hc, cols).map_err(gpu_err)?;
            driver.moe_route(rec, &layer.moe, cols).map_err(gpu_err)?;
            driver.record_moe(rec, layer, index, cols)?;
            if rec.len() >= forward::STREAM_DISPATCHES {
                rec.flush(&self.ctx);
            }
        }
        driver.record_head(rec, cols, true).map_err(gpu_err)?;
        Ok(())
    }

    /// A layer's PLE (if any) and mixer: token-wise parts on the driver, the rest per member.
    fn record_batch_mixer(
        &self,
        rec: &mut Recorder,
        driver: &GpuSequence,
        members: &mut [Member<'_>],
        index: usize,
        layer: &LayerGpu,
        cols: usize,
    ) -> Result<(), GpuError> {
        let cfg = &self.config;
        let bs = &*driver.scratch;
        if let Some(p) = &layer.ple {
            driver.ple_mix(rec, p, cols)?;
            // Each member's conv on its own columns of the batch's buffers.
            for_each_member(rec, members, |rec, m| {
                m.seq.ple_conv(rec, p, bs, m.span(), m.pos0)
            })?;
        }
        driver.hc_mix(rec, &layer.attn_hc, cols)?;
        match &layer.mixer {
            MixerGpu::Gdn(g) => {
                driver.gdn_project(rec, g, cols)?;
                // Each member's conv and recurrence on its own columns of the batch's buffers.
                for_each_member(rec, members, |rec, m| {
                    m.seq.gdn_recur(rec, g, m.state(index)?, bs, m.span(), true)
                })?;
                driver.gdn_norm_apart(rec, g, cols)?;
                driver.gdn_out(rec, g, cols)
            }
            MixerGpu::Qsa(q) => {
                let a = &cfg.attention;
                let kv = a.n_head_kv * a.head_dim;
                let idim = a.indexer_head_dim;
                let targets = [
                    View::new(&bs.key_stage, 0, kv),
                    View::new(&bs.value_stage, 0, kv),
                ];
                let index_keys = View::new(&bs.index_key_stage, 0, idim);
                driver.qsa_project(rec, q, targets, index_keys, cols)?;
                // Each member's caches, indexer and attention on its own columns of the batch's
                // buffers.
                let indexed = q.indexer.is_some();
                for_each_member(rec, members, |rec, m| {
                    let state = m.state(index)?;
                    m.store_kv(rec, bs, state, indexed)?;
                    m.seq.qsa_core(rec, q, state, bs, m.span(), m.pos0)
                })?;
                driver.qsa_out(rec, q, cols)
            }
        }
    }
}

/// Run `f` for every member with its own bind groups in `rec`.
#[allow(clippy::mutable_key_type)]
fn for_each_member<F>(
    rec: &mut Recorder,
    members: &mut [Member<'_>],
    mut f: F,
) -> Result<(), GpuError>
where
    F: FnMut(&mut Recorder, &mut Member<'_>) -> Result<(), GpuError>,
{
    for m in members.iter_mut() {
        let own = std::mem::take(&mut m.seq.bind_groups);
        let driver_cache = rec.swap_cache(own);
        let done = f(rec, m);
        m.seq.bind_groups = rec.swap_cache(driver_cache);
        done?;
    }
    Ok(())
}

impl Member<'_> {
    fn state(&self, index: usize) -> Result<&LayerState, GpuError> {
        self.seq
            .layers
            .get(index)
            .ok_or_else(|| GpuError::BadArgs(format!("no layer {index}")))
    }

    /// Its columns of the batch scratch.
    fn span(&self) -> Span {
        Span::new(self.col, self.tokens.len())
    }

    /// The batch's new keys, values and raw index keys (`indexed`) of this member where a feed
    /// alone projects them: into the f32 caches at its positions, in one dispatch. A rounded
    /// cache gets its keys and values from the batch's stage buffers in `qsa_core` (the pack
    /// reads the member's columns), so only the raw index keys are copied.
    fn store_kv(
        &self,
        rec: &mut Recorder,
        bs: &Scratch,
        state: &LayerState,
        indexed: bool,
    ) -> Result<(), GpuError> {
        let LayerState::Qsa {
            keys,
            values,
            raw_index_keys,
            ..
        } = state
        else {
            return Err(GpuError::BadArgs("attention layer with GDN state".into()));
        };
        let b = &*self.seq.backend;
        let c = &*b.ctx;
        let a = &b.config.attention;
        let kv = a.n_head_kv * a.head_dim;
        let idim = if indexed { a.indexer_head_dim } else { 0 };
        if b.config.kv == KvType::F32 {
            let rows = |stage, cache| ops::StageRows { stage, cache };
            return ops::kv_store(
                c,
                rec,
                [rows(&bs.key_stage, keys), rows(&bs.value_stage, values)],
                rows(&bs.index_key_stage, raw_index_keys),
                kv,
                idim,
                self.span(),
                self.pos0,
            );
        }
        if idim == 0 {
            return Ok(());
        }
        ops::copy_rows(
            c,
            rec,
            &bs.index_key_stage,
            self.col * idim,
            idim,
            raw_index_keys,
            self.pos0 * idim,
            idim,
            0,
            self.tokens.len(),
            idim,
        )
    }

    /// What this member's feed returns for its last row (checked for non-finite values).
    fn finish(&mut self, last: LastRow, vocab: usize) -> Result<Fed, EngineError> {
        let got = match last {
            LastRow::Row(row) if row.len() == vocab && first_non_finite(&row).is_none() => {
                Some(Fed::Row(row))
            }
            LastRow::List(words) => topk::decode(&words, vocab).ok().map(|mut top| {
                top.truncate(self.top);
                Fed::Top(top)
            }),
            LastRow::Row(_) => None,
        };
        got.ok_or_else(|| {
            self.seq.poisoned = true;
            EngineError::NonFinite {
                stage: "GPU logits".into(),
                position: self.pos0 + self.tokens.len() - 1,
            }
        })
    }
}

/// What a batched pass reads back for a member: its last logits row, or that row's sampling
/// candidates ([`topk::LIST_WORDS`] words).
enum LastRow {
    Row(Vec<f32>),
    List(Vec<u32>),
}

fn no_lists() -> GpuError {
    GpuError::BadArgs("a batch member asks for candidates that were not recorded".into())
}

/// The candidate passes over the last rows of the members that ask for candidates (in member
/// order), when any does: the buffer holding their lists, list i at word i * LIST_WORDS.
fn record_candidates<'a>(
    b: &GpuBackend,
    bs: &'a Scratch,
    rec: &mut Recorder,
    members: &[Member<'_>],
) -> Result<Option<&'a GpuBuf>, GpuError> {
    let rows: Vec<u32> = members
        .iter()
        .filter(|m| m.top > 0)
        .map(|m| (m.col + m.tokens.len() - 1) as u32)
        .collect();
    if rows.is_empty() {
        return Ok(None);
    }
    let [x, y] = &bs.top_lists;
    let v = b.config.vocab_size;
    topk::record_rows(&b.ctx, rec, &bs.logits, v, &rows, &bs.top_rows, x, y).map(Some)
}

impl GpuSequence {
    /// A sequence with no state of its own whose chunk buffers are `scratch`: it records the
    /// token-wise parts of a batched pass.
    fn driver(backend: Arc<GpuBackend>, scratch: Arc<Scratch>) -> Result<Self, GpuError> {
        let ple_history = GpuBuf::zeros(&backend.ctx, "batch driver", 1)?;
        Ok(Self {
            backend,
            tokens: Vec::new(),
            layers: Vec::new(),
            ple_history,
            scratch,
            state_bytes: 0,
            kv_tokens: 0,
            poisoned: false,
            profile: false,
            span: false,
            timings: Vec::new(),
            bind_groups: BindGroupCache::new(),
            next: None,
        })
    }
}
