//! The MoE block: router, routed experts (per item, grouped by expert, or from tier slots), shared expert and combine.

use super::*;

impl GpuSequence {
    /// The router: expert ids and weights of every token into `scratch.expert_ids/_weights`;
    /// with a shared expert, also its gate logit and its gate|up, recorded right after the router
    /// mat-vec: both only read `x_in`, and for a decode step the gate|up writes its layer's own
    /// buffer (`Scratch::shared_gu_layers`), so wgpu puts no barrier between them and they run
    /// side by side. [`Self::moe_finish`] does the shared down projection later (every expert
    /// path leaves the gate|up output and `x_in` as they are until then).
    pub(super) fn moe_route(
        &self,
        rec: &mut Recorder,
        w: &MoeGpu,
        t: usize,
    ) -> Result<(), GpuError> {
        let b = &self.backend;
        let c = &*b.ctx;
        let s = &self.scratch;
        let m = &b.config.moe;
        let x = View::new(&s.x_in, 0, b.config.n_embd);
        let mut outs = vec![View::new(&s.router, 0, m.n_expert)];
        if w.shared.is_some() {
            outs.push(View::new(&s.shared_logit, 0, 1));
        }
        w.router.record(c, rec, x, &outs, t)?;
        if let Some(sh) = &w.shared {
            sh.gate_up.record(c, rec, x, &[shared_gu(s, w, sh, t)], t)?;
        }
        let early = self.early_shared_down(w, t);
        if let Some((sh, _)) = early {
            // The top-k below waits for the router mat-vec anyway; the shared gate|up output
            // changes state in the same barrier, so the shared down needs none of its own.
            rec.read_only(&[shared_gu(s, w, sh, t).buf]);
        }
        ops::moe_router(
            c,
            rec,
            &s.router,
            &s.expert_ids,
            &s.expert_weights,
            m.n_expert,
            m.n_expert_used,
            t,
        )?;
        match early {
            Some((sh, out)) => self.shared_down(rec, w, sh, out, t),
            None => Ok(()),
        }
    }

    /// The shared expert's down projection of `t` tokens into `out` (SwiGLU of its gate|up on
    /// load).
    fn shared_down(
        &self,
        rec: &mut Recorder,
        w: &MoeGpu,
        sh: &SharedGpu,
        out: View,
        t: usize,
    ) -> Result<(), GpuError> {
        let c = &*self.backend.ctx;
        let sgu = shared_gu(&self.scratch, w, sh, t);
        let swiglu = XForm::Swiglu {
            half: sh.down.row_len,
        };
        let swiglu = kernels::prepare_x(c, rec, &sh.down, sgu, swiglu, t)?;
        kernels::matvec_with(c, rec, &sh.down, sgu, swiglu, Store::Rows(out), t)
    }

    /// Where the block's finish is one dispatch ([`Self::moe_resident_block`]) and the layer has
    /// its own shared gate|up and down buffers for `t` tokens (a decode step): the shared expert
    /// and the layer's own down output. [`Self::moe_route`] then records the shared down beside
    /// the router's top-k (a single workgroup that leaves the GPU idle), where it waited for the
    /// routed gate|up before. The same kernel on the same inputs, so the same bits.
    fn early_shared_down<'w>(&self, w: &'w MoeGpu, t: usize) -> Option<(&'w SharedGpu, View<'_>)> {
        let s = &self.scratch;
        let (sh, _) = self.resident_block(w, t)?;
        let own_gu = s.shared_gu_layers.get(w.layer)?;
        let own_down = s.shared_down_layers.get(w.layer)?;
        let h = self.backend.config.n_embd;
        let fits = t * 2 * sh.down.row_len <= own_gu.len && t * h <= own_down.len;
        fits.then(|| (sh, View::new(own_down, 0, h)))
    }

    /// The shared expert and resident experts of `w` where [`Self::moe_resident_block`] applies
    /// to `t` tokens: every expert in one VRAM tensor (not pinned), not grouped, a shared
    /// expert whose down projection can take the combine in its store.
    fn resident_block<'w>(
        &self,
        w: &'w MoeGpu,
        t: usize,
    ) -> Option<(&'w SharedGpu, &'w ResidentExperts)> {
        let b = &self.backend;
        let m = &b.config.moe;
        let (sh, e) = (w.shared.as_ref()?, w.experts.as_ref()?);
        let grouped = grouped_experts(t, m.n_expert_used, m.n_expert, b.pinned.is_some());
        let fused =
            sh.combine_in_store && kernels::can_expert_combine(&b.ctx, &e.down, m.n_expert_used);
        (b.pinned.is_none() && !grouped && fused).then_some((sh, e))
    }

    /// (width, experts per token, routed expert width).
    fn moe_dims(&self) -> (usize, usize, usize) {
        let cfg = &self.backend.config;
        (cfg.n_embd, cfg.moe.n_expert_used, cfg.moe.expert_ff)
    }

    /// Where layer `index`'s routed experts are computed from: the whole tensors, or — pinned,
    /// with hot copies in VRAM — the host tensors for the items whose expert has no hot unit and
    /// the hot units for the rest (split by `moe_split_ids`, which also logs the choices), each
    /// with its own gate|up output and item lists (the host source `scratch.cold_gu` and
    /// `expert_groups`, the hot one `expert_gu` and `hot_groups`). A decode step's host items are
    /// first copied into the expert stage (`stage`) and read there. Every item comes from exactly
    /// one source, with the same kernel and the same bytes, so the bits never depend on the split.
    fn expert_sources<'a>(
        &'a self,
        rec: &mut Recorder,
        e: &'a ResidentExperts,
        index: usize,
        t: usize,
    ) -> Result<Vec<ExpertSource<'a>>, GpuError> {
        let b = &self.backend;
        let s = &self.scratch;
        let n_expert = b.config.moe.n_expert;
        let whole = |ids, gu| ExpertSource {
            gate_up: &e.gate_up,
            down: &e.down,
            ids,
            units: n_expert,
            gu,
            groups: &s.expert_groups,
        };
        let Some(pinned) = &b.pinned else {
            return Ok(vec![whole(&s.expert_ids, &s.expert_gu)]);
        };
        let items = t * b.config.moe.n_expert_used;
        ops::moe_split_ids(
            &b.ctx,
            rec,
            &s.expert_ids,
            (&pinned.map, index * n_expert),
            n_expert,
            (&s.slot_ids, &s.cold_ids, &s.stage_ids),
            (&s.routing_log, index * items),
            items,
        )?;
        let gu = if e.hot.is_some() {
            &s.cold_gu
        } else {
            &s.expert_gu
        };
        let cold = match pinned.stage.as_ref() {
            Some(stage) if items <= stage.units && stage.fits(e) => {
                stage.record(&b.ctx, rec, e, &s.cold_ids, items)?;
                ExpertSource {
                    gate_up: &stage.gate_up,
                    down: &stage.down,
                    ids: &s.stage_ids,
                    units: stage.units,
                    gu,
                    groups: &s.expert_groups,
                }
            }
            _ => whole(&s.cold_ids, gu),
        };
        let Some(hot) = &e.hot else {
            return Ok(vec![cold]);
        };
        let hot_source = ExpertSource {
            gate_up: &hot.gate_up,
            down: &hot.down,
            ids: &s.slot_ids,
            units: hot.experts.len(),
            gu: &s.expert_gu,
            groups: &s.hot_groups,
        };
        // Read in place, the host tensors go first: their reads over the bus are the long
        // dispatch, and the hot one, writing other buffers, is recorded right after it. Staged,
        // the hot one goes first, beside the stage's copies, which it does not wait for.
        if std::ptr::eq(cold.gate_up, &e.gate_up) {
            Ok(vec![cold, hot_source])
        } else {
            Ok(vec![hot_source, cold])
        }
    }

    /// The routed experts of layer `index` for a decode step or a short chunk of `t` tokens, one
    /// workgroup per (item, row block): gate|up with SwiGLU in the store (each source's `gu`, the
    /// sources' dispatches back to back), then down into `scratch.expert_down` from each source.
    pub(super) fn moe_experts_resident(
        &self,
        rec: &mut Recorder,
        e: &ResidentExperts,
        index: usize,
        t: usize,
    ) -> Result<(), GpuError> {
        let c = &*self.backend.ctx;
        let s = &self.scratch;
        let (h, k, f) = self.moe_dims();
        let items = t * k;
        let x = View::new(&s.x_in, 0, h);
        let sources = self.expert_sources(rec, e, index, t)?;
        for src in &sources {
            kernels::matvec_expert_glu(c, rec, src.gate_up, src.ids, k, x, src.gu_view(f), items)?;
        }
        let y = View::new(&s.expert_down, 0, h);
        for src in &sources {
            kernels::matvec_expert_with(
                c,
                rec,
                src.down,
                src.ids,
                k,
                true,
                src.gu_view(f),
                XForm::Plain,
                y,
                items,
            )?;
        }
        Ok(())
    }

    /// Decode and short chunks with every expert resident in one tensor: the routed experts'
    /// gate|up, the shared expert's down rows beside it (into `scratch.shared_down`), then the
    /// routed down projections finishing the block in one dispatch
    /// (`kernels::matvec_expert_combine`: the arithmetic of the expert kernel followed by the
    /// combine in the shared down's store, so the same bits). Returns false, recording nothing,
    /// where that does not apply (pinned sources, no shared expert, several parts); the caller
    /// then takes [`Self::moe_experts_resident`] and [`Self::moe_finish`].
    pub(super) fn moe_resident_block(
        &self,
        rec: &mut Recorder,
        w: &MoeGpu,
        e: &ResidentExperts,
        t: usize,
    ) -> Result<bool, GpuError> {
        let b = &self.backend;
        let c = &*b.ctx;
        let s = &self.scratch;
        let (h, k, f) = self.moe_dims();
        let Some((sh, _)) = self.resident_block(w, t) else {
            return Ok(false);
        };
        let items = t * k;
        let gu = View::new(&s.expert_gu, 0, 2 * f);
        let x = View::new(&s.x_in, 0, h);
        kernels::matvec_expert_glu(c, rec, &e.gate_up, &s.expert_ids, k, x, gu, items)?;
        // The shared down ran beside the router's top-k, or runs here.
        let shared = match self.early_shared_down(w, t) {
            Some((_, early)) => early,
            None => {
                let out = View::new(&s.shared_down, 0, h);
                self.shared_down(rec, w, sh, out, t)?;
                out
            }
        };
        let combine = kernels::ExpertCombine {
            ids: &s.expert_ids,
            slots: k,
            x: gu,
            shared: shared.buf,
            weights: &s.expert_weights,
            logit: &s.shared_logit,
            wide: &s.wide,
            inject: &s.inject,
            hc: b.config.hc_count,
        };
        kernels::matvec_expert_combine(c, rec, &e.down, combine, t)?;
        Ok(true)
    }

    /// The routed experts of the chunk's tokens `tokens` from the tiered slot arenas: `ids` holds
    /// their `k` slot indices per token from index 0. Gate and up land side by side in
    /// `scratch.expert_gu` (from 0, reused per sub-batch); the down projection reads them as
    /// SwiGLU and writes the tokens' own rows of `scratch.expert_down`, ready for the combine.
    /// The same rows, so the same bits, as the fused kernels of the resident path.
    pub(super) fn moe_experts_slots(
        &self,
        rec: &mut Recorder,
        experts: SlotExperts,
        ids: &GpuBuf,
        tokens: std::ops::Range<usize>,
    ) -> Result<(), GpuError> {
        let b = &self.backend;
        let c = &*b.ctx;
        let s = &self.scratch;
        let cfg = &b.config;
        let h = cfg.n_embd;
        let k = cfg.moe.n_expert_used;
        let f = cfg.moe.expert_ff;
        let items = tokens.len() * k;
        let x = View::new(&s.x_in, tokens.start * h, h);
        let gu = |offset: usize| View::new(&s.expert_gu, offset, 2 * f);
        kernels::matvec_expert(c, rec, experts.gate, ids, k, false, x, gu(0), items)?;
        kernels::matvec_expert(c, rec, experts.up, ids, k, false, x, gu(f), items)?;
        kernels::matvec_expert_with(
            c,
            rec,
            experts.down,
            ids,
            k,
            true,
            gu(0),
            XForm::Swiglu { half: f },
            View::new(&s.expert_down, tokens.start * k * h, h),
            items,
        )
    }

    /// [`Self::moe_experts_resident`] for a prefill chunk of `t` tokens: the items grouped by
    /// expert first (per source), so each expert's weights are read once for all its tokens.
    /// Each step runs for every source back to back (the sources write different buffers until
    /// the down projections). The same bits per item as the per-item kernels.
    pub(super) fn moe_experts_grouped(
        &self,
        rec: &mut Recorder,
        e: &ResidentExperts,
        index: usize,
        t: usize,
    ) -> Result<(), GpuError> {
        let c = &*self.backend.ctx;
        let s = &self.scratch;
        let (h, k, f) = self.moe_dims();
        // moe_group lists each expert's items in room for the chunk's `t` tokens.
        let cap = t;
        let items = t * k;
        let sources = self.expert_sources(rec, e, index, t)?;
        let x = View::new(&s.x_in, 0, h);
        for src in &sources {
            ops::moe_group(c, rec, src.ids, src.groups, src.units, k, t)?;
        }
        for src in &sources {
            kernels::matvec_group(
                c,
                rec,
                src.gate_up,
                src.groups,
                cap,
                k,
                false,
                x,
                XForm::Plain,
                src.gu_view(f),
                items,
            )?;
        }
        // SwiGLU in place where it pays (else on the down projection's load): the same bits.
        let mut swiglu = Vec::with_capacity(sources.len());
        for src in &sources {
            let xf = XForm::Swiglu { half: f };
            swiglu.push(kernels::prepare_x(
                c,
                rec,
                &e.down,
                src.gu_view(f),
                xf,
                items,
            )?);
        }
        let y = View::new(&s.expert_down, 0, h);
        for (src, &xform) in sources.iter().zip(&swiglu) {
            kernels::matvec_group(
                c,
                rec,
                src.down,
                src.groups,
                cap,
                k,
                true,
                src.gu_view(f),
                xform,
                y,
                items,
            )?;
        }
        Ok(())
    }

    /// Shared expert (its down projection: [`Self::moe_route`] recorded the gate|up), and the
    /// weighted combine of the routed and shared outputs added into the wide residual: in the
    /// store of the shared down projection when the adapter binds enough buffers (one dispatch
    /// fewer per layer), else by `moe_combine_hc`; the same arithmetic, so the same bits.
    pub(super) fn moe_finish(
        &self,
        rec: &mut Recorder,
        w: &MoeGpu,
        t: usize,
    ) -> Result<(), GpuError> {
        let b = &self.backend;
        let c = &*b.ctx;
        let s = &self.scratch;
        let cfg = &b.config;
        let h = cfg.n_embd;
        let k = cfg.moe.n_expert_used;
        let shared = match &w.shared {
            Some(sh) => {
                let sf = sh.down.row_len;
                let gu = shared_gu(s, w, sh, t);
                // A no-op for one token (decode); for a chunk, SwiGLU in place where that pays.
                let swiglu =
                    kernels::prepare_x(c, rec, &sh.down, gu, XForm::Swiglu { half: sf }, t)?;
                if sh.combine_in_store {
                    let store = Store::MoeCombine {
                        wide: &s.wide,
                        inject: &s.inject,
                        routed: &s.expert_down,
                        weights: &s.expert_weights,
                        logit: &s.shared_logit,
                        h,
                        hc: cfg.hc_count,
                        k,
                    };
                    return kernels::matvec_with(c, rec, &sh.down, gu, swiglu, store, t);
                }
                let y = Store::Rows(View::new(&s.shared_down, 0, h));
                kernels::matvec_with(c, rec, &sh.down, gu, swiglu, y, t)?;
                Some((&s.shared_down, &s.shared_logit))
            }
            None => None,
        };
        ops::moe_combine_hc(
            c,
            rec,
            &s.expert_down,
            &s.expert_weights,
            shared,
            &s.wide,
            &s.inject,
            h,
            cfg.hc_count,
            k,
            t,
        )
    }

    /// Tiered experts of layer `index`: submit what `rec` holds (the layer up to the router and
    /// the shared expert's gate|up, which `moe_finish` reads after the experts), read
    /// the chosen experts back, make them resident in slots (uploading misses) and submit the
    /// expert kernels on the slot arenas — per run of tokens whose experts fit the slots at once.
    /// `rec` comes back empty (its bind-group cache kept).
    pub(super) fn tiered_experts(
        &self,
        rec: &mut Recorder,
        tier: &ExpertTier,
        index: usize,
        t: usize,
    ) -> Result<(), EngineError> {
        let b = &self.backend;
        let c = &*b.ctx;
        let k = b.config.moe.n_expert_used;
        rec.run(c).map_err(gpu_err)?;
        *rec = Recorder::with_cache(rec.take_cache());
        let ids = self
            .scratch
            .expert_ids
            .read_u32(c, 0, t * k)
            .map_err(gpu_err)?;
        let runs = tier.sub_batches(&ids, k);
        let a = &tier.arenas;
        // Held until the dispatches reading the slots are submitted (see `gpu::tiered`).
        let mut state = tier.lock();
        tier.note_extra_sub_batches(&mut state, runs.len().saturating_sub(1));
        for run in runs {
            let chosen = ids.get(run.start * k..run.end * k).unwrap_or_default();
            let slots = tier.place(c, &mut state, index, chosen)?;
            self.scratch
                .slot_ids
                .write_u32(c, 0, &slots)
                .map_err(gpu_err)?;
            let split = SlotExperts {
                gate: &a.gate,
                up: &a.up,
                down: &a.down,
            };
            self.moe_experts_slots(rec, split, &self.scratch.slot_ids, run)
                .map_err(gpu_err)?;
            let mut encoder = c
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("tiered experts"),
                });
            rec.encode(&mut encoder, None);
            c.queue.submit([encoder.finish()]);
            *rec = Recorder::with_cache(rec.take_cache());
        }
        drop(state);
        c.check_errors().map_err(gpu_err)
    }
}

/// The shared expert's gate|up output of `t` tokens of `w`'s layer: gate then up of each token,
/// side by side, in the layer's own buffer when it holds them (a decode step; see
/// `Scratch::shared_gu_layers`), else in the chunk's.
fn shared_gu<'a>(s: &'a Scratch, w: &MoeGpu, sh: &SharedGpu, t: usize) -> View<'a> {
    let width = 2 * sh.down.row_len;
    let buf = match s.shared_gu_layers.get(w.layer) {
        Some(own) if t * width <= own.len => own,
        _ => &s.shared_gu,
    };
    View::new(buf, 0, width)
}

impl<'a> ExpertSource<'a> {
    /// This source's gate|up output for routed expert width `f`: gate then up of each item.
    fn gu_view(&self, f: usize) -> View<'a> {
        View::new(self.gu, 0, 2 * f)
    }
}
