//! QSA sparse-attention layers: projections, indexer, block selection, attention.

use super::*;
use crate::gpu::ops::Span;
use crate::model::config::KvType;

impl GpuSequence {
    pub(super) fn qsa(
        &self,
        rec: &mut Recorder,
        w: &QsaGpu,
        state: &LayerState,
        t: usize,
        pos0: usize,
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
        let s = &self.scratch;
        let cfg = &self.backend.config;
        let a = &cfg.attention;
        let kv = a.n_head_kv * a.head_dim;
        let idim = a.indexer_head_dim;
        // Keys and values land in the f32 caches directly, the keys normed and rotated there;
        // with `--kv f16` or `q8_0` in the chunk's stage buffers first, then rounded into the
        // caches. Raw index keys land in their cache directly.
        let targets = if cfg.kv != KvType::F32 {
            [
                View::new(&s.key_stage, 0, kv),
                View::new(&s.value_stage, 0, kv),
            ]
        } else {
            [
                View::new(keys, pos0 * kv, kv),
                View::new(values, pos0 * kv, kv),
            ]
        };
        let index_keys = View::new(raw_index_keys, pos0 * idim, idim);
        self.qsa_project(rec, w, targets, index_keys, t)?;
        self.qsa_core(rec, w, state, &self.scratch, Span::from(t), pos0)?;
        self.qsa_out(rec, w, t)
    }

    /// The projections of `t` tokens: query and gate into the scratch's `query_gate`, keys and
    /// values into `kv`, the indexer's raw keys into `index_keys` and its queries into the
    /// scratch's `index_query`.
    pub(super) fn qsa_project(
        &self,
        rec: &mut Recorder,
        w: &QsaGpu,
        kv: [View; 2],
        index_keys: View,
        t: usize,
    ) -> Result<(), GpuError> {
        let b = &self.backend;
        let c = &*b.ctx;
        let s = &self.scratch;
        let a = &b.config.attention;
        let x = View::new(&s.x_in, 0, b.config.n_embd);
        let [keys, values] = kv;
        let outs = [
            View::new(&s.query_gate, 0, a.n_head * 2 * a.head_dim),
            keys,
            values,
        ];
        w.qkv.record(c, rec, x, &outs, t)?;
        if let Some(ix) = &w.indexer {
            let outs = [
                index_keys,
                View::new(&s.index_query, 0, a.indexer_n_head * a.indexer_head_dim),
            ];
            ix.kq.record(c, rec, x, &outs, t)?;
        }
        Ok(())
    }

    /// Everything after the projections ([`Self::qsa_project`]) of the tokens in columns `span`
    /// of `cols`'s buffers (`query_gate`, `index_query`, with a rounded cache `key_stage` and
    /// `value_stage`; the first at position `pos0`): norms and rotations, the keys and values
    /// into this sequence's caches (an f32 cache already holds them, at their positions), the
    /// indexer's blocks and selection, and attention into `cols.attended` at those columns. The
    /// scores, selections and partials are this sequence's scratch's, from row 0. A sequence fed
    /// alone passes its own scratch from column 0; a batch member the batch's, at its columns.
    pub(super) fn qsa_core(
        &self,
        rec: &mut Recorder,
        w: &QsaGpu,
        state: &LayerState,
        cols: &Scratch,
        span: Span,
        pos0: usize,
    ) -> Result<(), GpuError> {
        let LayerState::Qsa {
            keys,
            values,
            raw_index_keys,
            block_keys,
        } = state
        else {
            return Err(GpuError::BadArgs("attention layer with GDN state".into()));
        };
        let b = &self.backend;
        let c = &*b.ctx;
        let s = &self.scratch;
        let cfg = &b.config;
        let a = &cfg.attention;
        let hd = a.head_dim;
        let kv = a.n_head_kv * hd;
        let qg = a.n_head * 2 * hd;
        let half = a.rotary_dims / 2;
        let (t, first) = (span.count, span.first);
        let staged = cfg.kv != KvType::F32;
        let (key_rows, kv_off) = if staged {
            (&cols.key_stage, first * kv)
        } else {
            (keys, pos0 * kv)
        };
        let q_heads = Groups {
            n: hd,
            groups: a.n_head,
            off: first * qg,
            group_stride: 2 * hd,
            token_stride: qg,
        };
        // Per-head q and k norms with their rotations, in one dispatch.
        let q_spec = self.norm_spec(Some((&w.q_norm, hd)));
        let k_spec = self.norm_spec(Some((&w.k_norm, hd)));
        ops::rmsnorm_rope2(
            c,
            rec,
            ops::RopeGroups {
                spec: &q_spec,
                y: &cols.query_gate,
                groups: q_heads,
            },
            ops::RopeGroups {
                spec: &k_spec,
                y: key_rows,
                groups: Groups {
                    off: kv_off,
                    ..Groups::packed(hd, a.n_head_kv)
                },
            },
            t,
            &b.dummy,
            &b.rope_table,
            half,
            pos0,
        )?;
        if staged {
            for (stage, cache) in [(&cols.key_stage, keys), (&cols.value_stage, values)] {
                ops::kv_pack_from(c, rec, cfg.kv, (stage, kv_off), cache, pos0 * kv, t * kv)?;
            }
        }
        let mut params = QsaParams {
            first: first as u32,
            tokens: t as u32,
            pos0: pos0 as u32,
            heads: a.n_head as u32,
            n_kv: a.n_head_kv as u32,
            hd: hd as u32,
            ratio: 1,
            budget: 0,
            dense: 1,
            scale: 1.0 / (hd as f32).sqrt(),
            ..Default::default()
        };
        if let Some(ix) = &w.indexer {
            let idim = a.indexer_head_dim;
            let nih = a.indexer_n_head;
            let ratio = ix.ratio;
            let budget = a.indexer_budget_tokens / ratio;
            let block0 = pos0 / ratio;
            let end = (pos0 + t) / ratio;
            if end > block0 {
                let count = end - block0;
                ops::block_mean(
                    c,
                    rec,
                    raw_index_keys,
                    block_keys,
                    block0,
                    count,
                    ratio,
                    idim,
                )?;
                let rows = Groups {
                    n: idim,
                    groups: 1,
                    off: block0 * idim,
                    group_stride: idim,
                    token_stride: idim,
                };
                ops::rmsnorm_rope(
                    c,
                    rec,
                    &self.norm_spec(Some((&ix.k_norm, idim))),
                    block_keys,
                    rows,
                    count,
                    &b.dummy,
                    &b.rope_table,
                    half,
                    block0 * ratio,
                    ratio,
                )?;
            }
            // While every token of the chunk has at most `budget` complete blocks, each keeps all
            // of them: the same keys in the same order as dense attention (key j is position j),
            // so the same bits, without the index query's norm and the selection.
            if (pos0 + t) / ratio <= budget {
                return self.attend(rec, state, cols, &params);
            }
            ops::rmsnorm_rope(
                c,
                rec,
                &self.norm_spec(Some((&ix.q_norm, idim))),
                &cols.index_query,
                Groups {
                    off: first * nih * idim,
                    ..Groups::packed(idim, nih)
                },
                t,
                &b.dummy,
                &b.rope_table,
                half,
                pos0,
                1,
            )?;
            let max_blocks = s.scores.len / (2 * b.max_chunk);
            let select = QsaParams {
                first: first as u32,
                tokens: t as u32,
                pos0: pos0 as u32,
                heads: nih as u32,
                ratio: ratio as u32,
                budget: budget as u32,
                idim: idim as u32,
                max_blocks: max_blocks as u32,
                scale: 1.0 / (idim as f32).sqrt(),
                ..Default::default()
            };
            ops::qsa_select(
                c,
                rec,
                &select,
                &cols.index_query,
                block_keys,
                &s.scores,
                &s.selected,
            )?;
            params.ratio = ratio as u32;
            params.budget = budget as u32;
            params.dense = 0;
        }
        self.attend(rec, state, cols, &params)
    }

    /// Attention over the keys `params` selects (all of them when dense), from `cols`'s queries
    /// into its `attended` (at the columns from `params.first`).
    fn attend(
        &self,
        rec: &mut Recorder,
        state: &LayerState,
        cols: &Scratch,
        params: &QsaParams,
    ) -> Result<(), GpuError> {
        let LayerState::Qsa { keys, values, .. } = state else {
            return Err(GpuError::BadArgs("attention layer with GDN state".into()));
        };
        let b = &self.backend;
        let s = &self.scratch;
        ops::qsa_attend(
            &b.ctx,
            rec,
            params,
            &cols.query_gate,
            keys,
            values,
            &s.selected,
            &s.attn_parts,
            &cols.attended,
            b.config.kv,
        )
    }

    /// The output projection of `t` tokens' attention, added into the wide residual.
    pub(super) fn qsa_out(&self, rec: &mut Recorder, w: &QsaGpu, t: usize) -> Result<(), GpuError> {
        let a = &self.backend.config.attention;
        let x = View::new(&self.scratch.attended, 0, a.n_head * a.head_dim);
        self.out_and_combine(rec, &w.out, x, t)
    }
}
