//! The MoE block: router, routed experts (per item, grouped by expert, or from tier slots), shared expert and combine.

use super::*;

impl GpuSequence {
    /// The router: expert ids and weights of every token into `scratch.expert_ids/_weights`.
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
        ops::moe_router(
            c,
            rec,
            &s.router,
            &s.expert_ids,
            &s.expert_weights,
            m.n_expert,
            m.n_expert_used,
            t,
        )
    }

    /// (width, experts per token, routed expert width).
    fn moe_dims(&self) -> (usize, usize, usize) {
        let cfg = &self.backend.config;
        (cfg.n_embd, cfg.moe.n_expert_used, cfg.moe.expert_ff)
    }

    /// Where layer `index`'s routed experts are computed from: the whole tensors, or — pinned,
    /// with hot copies in VRAM — the hot units for the items whose expert has one and the host
    /// tensors for the rest (split by `moe_split_ids`, which also logs the choices). Every item
    /// comes from exactly one source, with the same kernel and the same bytes, so the bits never
    /// depend on the split.
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
        let whole = |ids| ExpertSource {
            gate_up: &e.gate_up,
            down: &e.down,
            ids,
            units: n_expert,
        };
        let Some(pinned) = &b.pinned else {
            return Ok(vec![whole(&s.expert_ids)]);
        };
        let items = t * b.config.moe.n_expert_used;
        ops::moe_split_ids(
            &b.ctx,
            rec,
            &s.expert_ids,
            (&pinned.map, index * n_expert),
            n_expert,
            (&s.slot_ids, &s.cold_ids),
            (&s.routing_log, index * items),
            items,
        )?;
        let Some(hot) = &e.hot else {
            return Ok(vec![whole(&s.cold_ids)]);
        };
        let hot_source = ExpertSource {
            gate_up: &hot.gate_up,
            down: &hot.down,
            ids: &s.slot_ids,
            units: hot.experts.len(),
        };
        Ok(vec![hot_source, whole(&s.cold_ids)])
    }

    /// The routed experts of layer `index` for a decode step or a short chunk of `t` tokens, one
    /// workgroup per (item, row block): gate|up with SwiGLU in the store (`scratch.expert_gu`),
    /// then down into `scratch.expert_down`, from each source in turn.
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
        let gu = View::new(&s.expert_gu, 0, 2 * f);
        let sources = self.expert_sources(rec, e, index, t)?;
        for src in &sources {
            kernels::matvec_expert_glu(c, rec, src.gate_up, src.ids, k, x, gu, items)?;
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
                gu,
                XForm::Plain,
                y,
                items,
            )?;
        }
        Ok(())
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
    /// The same bits per item as the per-item kernels.
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
        let gu = View::new(&s.expert_gu, 0, 2 * f);
        // The last source uses `expert_groups`, a hot source before it `hot_groups`.
        let groups_of = |i: usize| {
            if i + 1 == sources.len() {
                &s.expert_groups
            } else {
                &s.hot_groups
            }
        };
        for (i, src) in sources.iter().enumerate() {
            let groups = groups_of(i);
            ops::moe_group(c, rec, src.ids, groups, src.units, k, t)?;
            kernels::matvec_group(
                c,
                rec,
                src.gate_up,
                groups,
                cap,
                k,
                false,
                x,
                XForm::Plain,
                gu,
                items,
            )?;
        }
        let y = View::new(&s.expert_down, 0, h);
        let swiglu = kernels::prepare_x(c, rec, &e.down, gu, XForm::Swiglu { half: f }, items)?;
        for (i, src) in sources.iter().enumerate() {
            kernels::matvec_group(
                c,
                rec,
                src.down,
                groups_of(i),
                cap,
                k,
                true,
                gu,
                swiglu,
                y,
                items,
            )?;
        }
        Ok(())
    }

    /// Shared expert, and the weighted combine of the routed and shared outputs added into the
    /// wide residual: in the store of the shared down projection when the adapter binds enough
    /// buffers (one dispatch fewer per layer), else by `moe_combine_hc`; the same arithmetic, so
    /// the same bits.
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
        let x = View::new(&s.x_in, 0, h);
        let shared = match &w.shared {
            Some(sh) => {
                let sf = sh.down.row_len;
                let gu = View::new(&s.shared_gu, 0, 2 * sf);
                sh.gate_up.record(c, rec, x, &[gu], t)?;
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

    /// Tiered experts of layer `index`: submit what `rec` holds (the layer up to the router), read
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
