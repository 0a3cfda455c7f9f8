//! The forward pass of a chunk: embedding, layers, head, and running it (with the stage-check mode).

use super::*;

/// Dispatches recorded before a streaming forward hands them to the GPU: the first submission
/// comes after a few layers, so the host's recording of the rest overlaps the GPU's work.
pub(super) const STREAM_DISPATCHES: usize = 64;

/// What a chunk's feed reads back ([`GpuSequence::feed_chunk`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Want {
    Logits,
    Argmax,
    Top,
}

/// What it read back.
pub(super) enum Got {
    Logits(Vec<f32>),
    Argmax(u32),
    Top(Vec<(u32, f32)>),
}

/// The next decode step, recorded and encoded while the GPU ran the one before
/// ([`GpuSequence::feed_chunk`]): one token at `pos0`, reading back what `want` asks. Its feed
/// only writes the token (and its PLE rows) and submits it, so the GPU waits for the host's
/// sampling and a few writes between steps instead of for the recording of the step's first
/// dispatches. The same dispatches as a step recorded then, so the same bits.
pub(super) struct Prepared {
    pos0: usize,
    want: Want,
    commands: wgpu::CommandBuffer,
    staging: wgpu::Buffer,
}

impl GpuBackend {
    /// Record this backend's decode steps ahead ([`Prepared`]) or not, whatever `STRATA_PREPARE`
    /// and the adapter say: the tests that check the prepared steps' bits turn it on for their
    /// own backend.
    pub fn set_prepare_ahead(&self, on: bool) {
        let value = if on { 2 } else { 1 };
        self.prepare
            .store(value, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Whether `b` records decode steps ahead: on a GPU unless `STRATA_PREPARE=0` (an A/B switch for
/// the bench); on a CPU adapter (lavapipe) only with `STRATA_PREPARE=1`, since there the host's
/// recording takes the cores the kernels run on.
fn prepare_ahead(b: &GpuBackend) -> bool {
    static ENV: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    match b.prepare.load(std::sync::atomic::Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => {
            let env = ENV.get_or_init(|| match std::env::var("STRATA_PREPARE").as_deref() {
                Ok("0") => Some(false),
                Ok("1") => Some(true),
                _ => None,
            });
            env.unwrap_or(b.ctx.adapter.device_type != "Cpu")
        }
    }
}

impl GpuSequence {
    /// Record the forward pass of `t` tokens at positions pos0.. (ids and PLE rows already
    /// uploaded). Logits land in `scratch.logits`: all rows, or only the last token's in row 0.
    /// With `stream`, the dispatches are submitted every [`STREAM_DISPATCHES`] or so, so the GPU
    /// runs the first layers while the host records the rest; `rec` then holds the remainder.
    pub(super) fn record(
        &self,
        rec: &mut Recorder,
        t: usize,
        pos0: usize,
        all_logits: bool,
        stream: bool,
    ) -> Result<usize, EngineError> {
        self.record_embedding(rec, t).map_err(gpu_err)?;
        for layer in 0..self.layers.len() {
            self.record_layer(rec, layer, t, pos0)?;
            if stream && rec.len() >= STREAM_DISPATCHES {
                rec.flush(&self.backend.ctx);
            }
        }
        self.record_head(rec, t, all_logits).map_err(gpu_err)
    }

    pub(super) fn record_embedding(&self, rec: &mut Recorder, t: usize) -> Result<(), GpuError> {
        let b = &self.backend;
        let s = &self.scratch;
        let h = b.config.n_embd;
        let hc = b.config.hc_count;
        let view = View::new(&s.wide, 0, h * hc);
        kernels::get_rows(&b.ctx, rec, &b.token_embd, &s.ids, t, view, hc, h)
    }

    /// Record layer `index`. In tiered mode this submits the recorded work at the router and
    /// again after the expert kernels (see [`Self::tiered_experts`]); `rec` then holds the rest.
    pub(super) fn record_layer(
        &self,
        rec: &mut Recorder,
        index: usize,
        t: usize,
        pos0: usize,
    ) -> Result<(), EngineError> {
        let b = &self.backend;
        let Some(layer) = b.layers.get(index) else {
            return Err(gpu_err(GpuError::BadArgs(format!("no layer {index}"))));
        };
        self.record_layer_to_router(rec, index, t, pos0)
            .map_err(gpu_err)?;
        self.record_moe(rec, layer, index, t)
    }

    /// Layer `index`'s routed experts (from the router's choices) and the MoE block's finish.
    pub(super) fn record_moe(
        &self,
        rec: &mut Recorder,
        layer: &LayerGpu,
        index: usize,
        t: usize,
    ) -> Result<(), EngineError> {
        let b = &self.backend;
        let m = &b.config.moe;
        match (&layer.moe.experts, &b.tier) {
            (Some(e), _) if grouped_experts(t, m.n_expert_used, m.n_expert, b.pinned.is_some()) => {
                self.moe_experts_grouped(rec, e, index, t)
                    .map_err(gpu_err)?
            }
            (Some(e), _) => {
                if self
                    .moe_resident_block(rec, &layer.moe, e, t)
                    .map_err(gpu_err)?
                {
                    return Ok(());
                }
                self.moe_experts_resident(rec, e, index, t)
                    .map_err(gpu_err)?
            }
            (None, Some(tier)) => self.tiered_experts(rec, tier, index, t)?,
            (None, None) => {
                return Err(gpu_err(GpuError::BadArgs(format!(
                    "layer {index} has neither resident nor tiered experts"
                ))));
            }
        }
        self.moe_finish(rec, &layer.moe, t).map_err(gpu_err)
    }

    /// Layer `index` from its input up to and including the MoE router.
    pub(super) fn record_layer_to_router(
        &self,
        rec: &mut Recorder,
        index: usize,
        t: usize,
        pos0: usize,
    ) -> Result<(), GpuError> {
        let b = &self.backend;
        let (Some(layer), Some(state)) = (b.layers.get(index), self.layers.get(index)) else {
            return Err(GpuError::BadArgs(format!("no layer {index}")));
        };
        if let Some(p) = &layer.ple {
            self.ple(rec, p, t, pos0)?;
        }
        self.hc_mix(rec, &layer.attn_hc, t)?;
        // The mixers add their output into the wide residual themselves (fused hc_combine).
        match &layer.mixer {
            MixerGpu::Gdn(g) => self.gdn(rec, g, state, t)?,
            MixerGpu::Qsa(q) => self.qsa(rec, q, state, t, pos0)?,
        }
        self.hc_mix(rec, &layer.ffn_hc, t)?;
        self.moe_route(rec, &layer.moe, t)
    }

    /// Head mixer and lm_head; returns the number of logits rows written.
    pub(super) fn record_head(
        &self,
        rec: &mut Recorder,
        t: usize,
        all_logits: bool,
    ) -> Result<usize, GpuError> {
        let b = &self.backend;
        let c = &*b.ctx;
        let s = &self.scratch;
        let h = b.config.n_embd;
        let v = b.config.vocab_size;
        self.hc_mix(rec, &b.head_hc, t)?;
        let (offset, rows) = if all_logits { (0, t) } else { ((t - 1) * h, 1) };
        let x = View::new(&s.x_in, offset, h);
        kernels::matvec(c, rec, &b.output, x, View::new(&s.logits, 0, v), rows)?;
        Ok(rows)
    }

    /// Diagnostic mode (`STRATA_GPU_CHECK=1`): run the chunk stage by stage, reading the residual
    /// back after each, so a non-finite value is reported at the first stage that produced it.
    /// It runs the whole chunk, leaving the logits in `scratch.logits` as `record` would.
    pub(super) fn run_checked(
        &mut self,
        t: usize,
        pos0: usize,
        all_logits: bool,
    ) -> Result<usize, EngineError> {
        let b = Arc::clone(&self.backend);
        let c = &*b.ctx;
        let wide = b.config.n_embd * b.config.hc_count;
        let layers = self.layers.len();
        for stage in 0..=layers + 1 {
            let mut rec = Recorder::with_cache(std::mem::take(&mut self.bind_groups));
            let recorded = match stage {
                0 => self
                    .record_embedding(&mut rec, t)
                    .map(|_| 0)
                    .map_err(gpu_err),
                s if s <= layers => self.record_layer(&mut rec, s - 1, t, pos0).map(|_| 0),
                _ => self.record_head(&mut rec, t, all_logits).map_err(gpu_err),
            };
            self.bind_groups = rec.take_cache();
            let rows = recorded?;
            rec.run(c).map_err(gpu_err)?;
            if stage > layers {
                return Ok(rows);
            }
            let values = self
                .scratch
                .wide
                .read_f32(c, 0, t * wide)
                .map_err(gpu_err)?;
            if let Some(bad) = first_non_finite(&values) {
                let name = match stage {
                    0 => "token embedding".to_string(),
                    s => {
                        let kind = match b.layers.get(s - 1).map(|l| &l.mixer) {
                            Some(MixerGpu::Gdn(_)) => "GDN",
                            _ => "QSA attention",
                        };
                        format!("layer {} ({kind}) output", s - 1)
                    }
                };
                return Err(EngineError::NonFinite {
                    stage: name,
                    position: pos0 + bad / wide,
                });
            }
        }
        Err(EngineError::Other("stage loop ended early".into()))
    }

    /// One chunk through the model, and what `want` asks of its logits: the rows (all, or the
    /// last), or a result computed where they are (the argmax, the sampling candidates), so only
    /// a few bytes are read back.
    pub(super) fn feed_chunk(
        &mut self,
        chunk: &[u32],
        all_logits: bool,
        want: Want,
    ) -> Result<Got, EngineError> {
        let pos0 = self.tokens.len();
        let t = chunk.len();
        let started = std::time::Instant::now();
        self.reserve_kv(pos0 + t).map_err(gpu_err)?;
        self.tokens.extend_from_slice(chunk);
        let b = Arc::clone(&self.backend);
        let c = &*b.ctx;
        let all_logits = all_logits && want == Want::Logits;
        // The chunk buffers are shared: nothing of another sequence's feed may run until this
        // one's results are read back (the readback below waits for the GPU).
        let _feeding = scratch::lock(&b.feed_lock);
        self.scratch.ids.write_u32(c, 0, chunk).map_err(gpu_err)?;
        self.upload_ple_rows(pos0, t)?;
        let uploaded = std::time::Instant::now();
        // Diagnostic mode runs the forward stage by stage (the recorder below then only adds the
        // argmax or candidate passes, if any, and the readback).
        let checked_rows = if b.check_stages {
            Some(self.run_checked(t, pos0, all_logits)?)
        } else {
            None
        };
        let prepared = self
            .next
            .take()
            .filter(|p| t == 1 && !all_logits && p.pos0 == pos0 && p.want == want);
        if let Some(p) = prepared.filter(|_| checked_rows.is_none()) {
            c.queue.submit([p.commands]);
            self.prepare_next(pos0 + t, want, t == 1 && !all_logits);
            let bytes = read_staging(c, &p.staging).map_err(gpu_err)?;
            tracing::debug!(
                pos0,
                ms = started.elapsed().as_secs_f64() * 1e3,
                "prepared step fed"
            );
            return read_back(bytes, want, b.config.vocab_size, pos0, pos0, false);
        }
        // A profile needs every dispatch in one pass (its timestamps share a query set).
        let stream = !(self.profile || self.span);
        let recorded = self.record_step(t, pos0, all_logits, want, stream, checked_rows);
        let recorded_at = std::time::Instant::now();
        let (rec, source, size) = recorded?;
        let staging = readback_buffer(c, size);
        let mut encoder = c
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("token"),
            });
        let timestamps = if self.profile {
            rec.timestamps(c)
        } else {
            None
        };
        let span = match self.span {
            true => rec.span_timestamps(c),
            false => None,
        };
        match &span {
            Some(s) => rec.encode_span(&mut encoder, s),
            None => rec.encode(&mut encoder, timestamps.as_ref().map(|t| &t.set)),
        }
        for t in timestamps.iter().chain(&span) {
            t.resolve(&mut encoder);
        }
        encoder.copy_buffer_to_buffer(&source, 0, &staging, 0, size);
        let routing = b.routing_readback(&mut encoder, &self.scratch, t);
        c.queue.submit([encoder.finish()]);
        let submitted = std::time::Instant::now();
        if checked_rows.is_none() {
            self.prepare_next(pos0 + t, want, t == 1 && !all_logits);
        }
        let bytes = read_staging(c, &staging).map_err(gpu_err)?;
        let read_at = std::time::Instant::now();
        if let (Some(staging), Some(pinned)) = (routing, &b.pinned) {
            let log: Vec<u32> =
                bytemuck::pod_collect_to_vec(&read_staging(c, &staging).map_err(gpu_err)?);
            pinned.record(&log, t * b.config.moe.n_expert_used);
            b.promote_hot_experts().map_err(gpu_err)?;
        }
        if let Some(t) = &timestamps {
            self.timings.extend(t.read(c, &rec).map_err(gpu_err)?);
        }
        if let Some(s) = &span {
            let ns = s.read_span(c).map_err(gpu_err)?;
            self.timings.push(("step".into(), ns));
        }
        // Where the host's time goes (`RUST_LOG=strata=debug`): before the first dispatch is
        // recorded (uploads), until the GPU first gets work, recording, the last submission, and
        // waiting for the readback.
        let us = |from: std::time::Instant, to: std::time::Instant| {
            to.saturating_duration_since(from).as_secs_f64() * 1e6
        };
        tracing::debug!(
            pos0,
            tokens = t,
            ms = started.elapsed().as_secs_f64() * 1e3,
            upload_us = us(started, uploaded),
            first_submit_us = us(started, rec.first_flush().unwrap_or(submitted)),
            record_us = us(uploaded, recorded_at),
            submit_us = us(recorded_at, submitted),
            wait_us = us(submitted, read_at),
            after_us = us(read_at, std::time::Instant::now()),
            "chunk fed"
        );
        read_back(
            bytes,
            want,
            b.config.vocab_size,
            pos0,
            pos0 + t - 1,
            all_logits,
        )
    }

    /// Record the forward of `t` tokens at `pos0` (unless diagnostic mode already ran it:
    /// `checked` rows) and the passes `want` adds, submitting along the way with `stream`; returns
    /// the recorder (its bind-group cache handed back) and the buffer and bytes to read back.
    fn record_step(
        &mut self,
        t: usize,
        pos0: usize,
        all_logits: bool,
        want: Want,
        stream: bool,
        checked: Option<usize>,
    ) -> Result<(Recorder, Arc<wgpu::Buffer>, u64), EngineError> {
        let b = Arc::clone(&self.backend);
        let scratch = Arc::clone(&self.scratch);
        let mut rec = Recorder::with_cache(std::mem::take(&mut self.bind_groups));
        let recorded = match checked {
            Some(rows) => Ok(rows),
            None => self.record(&mut rec, t, pos0, all_logits, stream),
        }
        .and_then(|rows| {
            let source = record_readback(&b, &scratch, &mut rec, want).map_err(gpu_err)?;
            Ok((
                rows,
                source.map(|(buf, size)| (Arc::clone(&buf.buffer), size)),
            ))
        });
        self.bind_groups = rec.take_cache();
        let (rows, source) = recorded?;
        let (source, size) = source.unwrap_or_else(|| {
            let bytes = rows * b.config.vocab_size * 4;
            (Arc::clone(&scratch.logits.buffer), bytes as u64)
        });
        Ok((rec, source, size))
    }

    /// While the GPU runs the step just submitted: record and encode the next one-token step at
    /// `pos0` ([`Prepared`]), where the backend's mode allows it (every expert resident, no
    /// diagnostics, no profile) and this step was one token (decode). Anything that goes wrong
    /// here only means that the next feed records its step itself.
    fn prepare_next(&mut self, pos0: usize, want: Want, one_token: bool) {
        let b = Arc::clone(&self.backend);
        let eligible = prepare_ahead(&b)
            && one_token
            && pos0 == self.tokens.len()
            && !(self.profile || self.span || b.check_stages)
            && b.tier.is_none()
            && b.pinned.is_none()
            && pos0 < b.info.context_length;
        if !eligible {
            return;
        }
        match self.prepare_step(pos0, want) {
            Ok(p) => self.next = Some(Box::new(p)),
            Err(e) => tracing::debug!(pos0, error = %e, "next step not prepared"),
        }
    }

    /// Record and encode the one-token step at `pos0` reading back what `want` asks.
    fn prepare_step(&mut self, pos0: usize, want: Want) -> Result<Prepared, EngineError> {
        // Room for the token first: a cache that grows gets new buffers (filled by copies that
        // run in queue order, after the step just submitted).
        self.reserve_kv(pos0 + 1).map_err(gpu_err)?;
        let b = Arc::clone(&self.backend);
        let c = &*b.ctx;
        let (rec, source, size) = self.record_step(1, pos0, false, want, false, None)?;
        let staging = readback_buffer(c, size);
        let mut encoder = c
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("prepared token"),
            });
        rec.encode(&mut encoder, None);
        encoder.copy_buffer_to_buffer(&source, 0, &staging, 0, size);
        Ok(Prepared {
            pos0,
            want,
            commands: encoder.finish(),
            staging,
        })
    }
}

/// A host-readable buffer of `size` bytes for a feed's readback.
fn readback_buffer(c: &crate::gpu::GpuContext, size: u64) -> wgpu::Buffer {
    c.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("logits readback"),
        size,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    })
}

/// What `want` asked of a feed, from the bytes read back: the argmax, the candidates or the
/// logits rows (all of the chunk's, from position `pos0`, with `all_logits`; else the row of
/// position `last`), checked for non-finite values.
fn read_back(
    bytes: Vec<u8>,
    want: Want,
    v: usize,
    pos0: usize,
    last: usize,
    all_logits: bool,
) -> Result<Got, EngineError> {
    let bad_logits = |position| EngineError::NonFinite {
        stage: "GPU logits".into(),
        position,
    };
    match want {
        Want::Argmax => {
            let words: Vec<u32> = bytemuck::pod_collect_to_vec(&bytes);
            match words.as_slice() {
                [id, 0] => Ok(Got::Argmax(*id)),
                _ => Err(bad_logits(last)),
            }
        }
        Want::Top => {
            let words: Vec<u32> = bytemuck::pod_collect_to_vec(&bytes);
            topk::decode(&words, v)
                .map(Got::Top)
                .map_err(|_| bad_logits(last))
        }
        Want::Logits => {
            let logits: Vec<f32> = bytemuck::pod_collect_to_vec(&bytes);
            if let Some(bad) = first_non_finite(&logits) {
                let position = if all_logits {
                    pos0 + bad / v.max(1)
                } else {
                    last
                };
                return Err(bad_logits(position));
            }
            Ok(Got::Logits(logits))
        }
    }
}

/// The passes `want` adds after the forward (on the last row, in row 0 of the logits), and the
/// buffer and bytes to read back instead of the logits rows.
fn record_readback<'a>(
    b: &GpuBackend,
    s: &'a Scratch,
    rec: &mut Recorder,
    want: Want,
) -> Result<Option<(&'a GpuBuf, u64)>, GpuError> {
    let c = &*b.ctx;
    let v = b.config.vocab_size;
    match want {
        Want::Logits => Ok(None),
        Want::Argmax => {
            ops::argmax(c, rec, &s.logits, v, 1, &s.greedy)?;
            Ok(Some((&s.greedy, 8)))
        }
        Want::Top => {
            let [x, y] = &s.top_lists;
            let list = topk::record(c, rec, &s.logits, v, x, y)?;
            Ok(Some((list, (topk::LIST_WORDS * 4) as u64)))
        }
    }
}
