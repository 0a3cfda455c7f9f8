//! The hashed n-gram PLE injection at layer 1, and the PLE rows it reads.

use super::*;
use crate::gpu::ops::Span;

impl GpuSequence {
    pub(super) fn ple(
        &self,
        rec: &mut Recorder,
        w: &PleGpu,
        t: usize,
        pos0: usize,
    ) -> Result<(), GpuError> {
        self.ple_mix(rec, w, t)?;
        self.ple_conv(rec, w, &self.scratch, Span::from(t), pos0)
    }

    /// The PLE block of `t` tokens up to its conv: projections, norms and the gate, from the
    /// scratch's `ple_embedding` and wide residual into its `ple_gated` and `ple_conv_in`.
    pub(super) fn ple_mix(&self, rec: &mut Recorder, w: &PleGpu, t: usize) -> Result<(), GpuError> {
        let b = &self.backend;
        let c = &*b.ctx;
        let s = &self.scratch;
        let cfg = &b.config;
        let Some(pc) = &cfg.ple else {
            return Err(GpuError::BadArgs("PLE weights without PLE config".into()));
        };
        let h = cfg.n_embd;
        let hc = cfg.hc_count;
        let wide = h * hc;
        let groups = Groups::packed(h, hc);
        let dim = pc.embed_dim();
        kernels::matvec(
            c,
            rec,
            &w.key,
            View::new(&s.ple_embedding, 0, dim),
            View::new(&s.ple_key, 0, wide),
            t,
        )?;
        ops::rmsnorm(
            c,
            rec,
            &self.norm_spec(Some((&w.norm_key, wide))),
            &s.ple_key,
            groups,
            &s.ple_key_normed,
            groups,
            t,
        )?;
        kernels::matvec(
            c,
            rec,
            &w.value,
            View::new(&s.ple_embedding, 0, dim),
            View::new(&s.ple_value, 0, h),
            t,
        )?;
        ops::rmsnorm(
            c,
            rec,
            &self.norm_spec(Some((&w.norm_query, wide))),
            &s.wide,
            groups,
            &s.ple_query_normed,
            groups,
            t,
        )?;
        let shape = PleShape {
            h,
            hc,
            kernel: pc.conv_kernel,
            dilation: pc.conv_dilation(),
        };
        ops::ple_gate(
            c,
            rec,
            &shape,
            &s.ple_key_normed,
            &s.ple_query_normed,
            &s.ple_value,
            &s.ple_gated,
            t,
        )?;
        ops::rmsnorm(
            c,
            rec,
            &self.norm_spec(Some((&w.norm_conv, wide))),
            &s.ple_gated,
            groups,
            &s.ple_conv_in,
            groups,
            t,
        )
    }

    /// The PLE conv over this sequence's history of the tokens in columns `span` of `s`'s
    /// `ple_conv_in` and `ple_gated` (the first at position `pos0`), added into `s.wide` at those
    /// columns: a sequence fed alone passes its own scratch from column 0, a batch member the
    /// batch's at its columns.
    pub(super) fn ple_conv(
        &self,
        rec: &mut Recorder,
        w: &PleGpu,
        s: &Scratch,
        span: Span,
        pos0: usize,
    ) -> Result<(), GpuError> {
        let b = &self.backend;
        let cfg = &b.config;
        let Some(pc) = &cfg.ple else {
            return Err(GpuError::BadArgs("PLE weights without PLE config".into()));
        };
        let shape = PleShape {
            h: cfg.n_embd,
            hc: cfg.hc_count,
            kernel: pc.conv_kernel,
            dilation: pc.conv_dilation(),
        };
        ops::ple_conv(
            &b.ctx,
            rec,
            &shape,
            &s.ple_conv_in,
            &s.ple_gated,
            &w.conv,
            &self.ple_history,
            &s.wide,
            span,
            pos0,
        )
    }

    /// Host side of PLE: hash the n-gram rows of each chunk token and dequantize them into the
    /// scratch's `ple_embedding`.
    pub(super) fn upload_ple_rows(&self, pos0: usize, t: usize) -> Result<(), EngineError> {
        self.upload_ple_rows_to(&self.scratch, 0, pos0, t)
    }

    /// [`Self::upload_ple_rows`] into `dst`'s `ple_embedding` from token `tok0` on.
    pub(super) fn upload_ple_rows_to(
        &self,
        dst: &Scratch,
        tok0: usize,
        pos0: usize,
        t: usize,
    ) -> Result<(), EngineError> {
        let b = &self.backend;
        let Some(pc) = &b.config.ple else {
            return Ok(());
        };
        let Some(table) = b
            .weights
            .layers
            .get(pc.layer)
            .and_then(|l| l.ple.as_ref())
            .map(|p| &p.table)
        else {
            return Ok(());
        };
        let dim = pc.embed_dim();
        if let Some(reader) = &b.ple_reader {
            let mut table_rows = Vec::with_capacity(t * pc.n_heads());
            let mut positions = Vec::with_capacity(t);
            for i in 0..t {
                let context =
                    ngram_context(&self.tokens[..pos0 + i + 1], pc.ngram_size, pc.eos_token_id);
                table_rows.extend(hash_rows(pc, &context));
                positions.push(pos0 + i);
            }
            let mut raw = Vec::new();
            let mut rows = Vec::with_capacity(t * dim);
            reader
                .gather_dequantized(&table_rows, &positions, &mut raw, &mut rows)
                .map_err(ple_error)?;
            if rows.len() != t * dim {
                return Err(EngineError::Other(format!(
                    "PLE rows hold {} values for {t} tokens of {dim}",
                    rows.len()
                )));
            }
            if let Some(bad) = first_non_finite(&rows) {
                return Err(EngineError::NonFinite {
                    stage: "PLE table rows".into(),
                    position: pos0 + bad / dim,
                });
            }
            return dst
                .ple_embedding
                .write_f32(&b.ctx, tok0 * dim, &rows)
                .map_err(gpu_err);
        }
        let mut rows = vec![0.0f32; t * dim];
        for i in 0..t {
            let context =
                ngram_context(&self.tokens[..pos0 + i + 1], pc.ngram_size, pc.eos_token_id);
            for (head, row) in hash_rows(pc, &context).into_iter().enumerate() {
                let row = usize::try_from(row).unwrap_or(usize::MAX);
                let out =
                    &mut rows[i * dim + head * pc.head_dim..i * dim + (head + 1) * pc.head_dim];
                table
                    .dequantize_row(row, out)
                    .map_err(|e| EngineError::Other(e.to_string()))?;
            }
        }
        if let Some(bad) = first_non_finite(&rows) {
            return Err(EngineError::NonFinite {
                stage: "PLE table rows".into(),
                position: pos0 + bad / dim,
            });
        }
        dst.ple_embedding
            .write_f32(&b.ctx, tok0 * dim, &rows)
            .map_err(gpu_err)
    }
}

/// A PLE read error as the engine reports it: a bad row names row, position and file offset.
fn ple_error(e: PleReadError) -> EngineError {
    match e {
        PleReadError::NonFinite {
            row,
            position,
            file,
            offset,
            block,
            field,
            ty,
        } => EngineError::NonFinite {
            stage: format!(
                "PLE table row {row} at byte offset {offset} of {file} (non-finite {field} in \
                 block {block}, {ty})"
            ),
            position,
        },
        other => EngineError::Other(other.to_string()),
    }
}
