//! Per-sequence state, and the activation buffers of one chunk (shared by a backend's sequences).

use super::*;
use crate::model::config::KvType;

impl GpuSequence {
    /// A fresh sequence: its own state (every layer's recurrent state or KV cache, the PLE
    /// history), and the backend's chunk buffers, which every sequence shares.
    pub(super) fn new(backend: Arc<GpuBackend>) -> Result<Self, GpuError> {
        let b = &backend;
        let c = &*b.ctx;
        let cfg = &b.config;
        let g = &cfg.gdn;
        let kv_tokens = b.kv_initial_tokens.min(b.info.context_length).max(1);
        // Floats this sequence allocates, for `state_bytes`.
        let floats = std::cell::Cell::new(0usize);
        let zeros = |label: &str, n: usize| {
            floats.set(floats.get() + n);
            GpuBuf::zeros(c, label, n)
        };
        let mut layers = Vec::new();
        for l in &b.layers {
            layers.push(match &l.mixer {
                MixerGpu::Gdn(_) => LayerState::Gdn {
                    conv: zeros(
                        "gdn conv history",
                        (g.conv_kernel.max(2) - 1) * g.conv_channels(),
                    )?,
                    ssm: zeros("gdn state", g.n_v_heads * g.head_k_dim * g.head_v_dim)?,
                },
                MixerGpu::Qsa(q) => {
                    let (state, n) = qsa_state(b, q, kv_tokens)?;
                    floats.set(floats.get() + n);
                    state
                }
            });
        }
        let ple_hist = cfg.ple.as_ref().map_or(1, |p| p.conv_history().max(1));
        let ple_history = zeros("ple history", ple_hist * cfg.n_embd * cfg.hc_count)?;
        let state_bytes = floats.get() * 4;
        let scratch = b.shared_scratch()?;
        Ok(Self {
            backend,
            tokens: Vec::new(),
            layers,
            ple_history,
            scratch,
            state_bytes,
            kv_tokens,
            poisoned: false,
            profile: false,
            span: false,
            timings: Vec::new(),
            bind_groups: BindGroupCache::new(),
            next: None,
        })
    }

    /// Make room in the attention caches for `tokens` tokens: when they hold fewer, each is
    /// remade for twice as many (at least `tokens`, at most the context) and the values so far
    /// copied in, in place (every cache is a flat array over the tokens, so the layout of the
    /// first tokens does not change with the size). Where a value lives never changes what is
    /// computed from it.
    pub(super) fn reserve_kv(&mut self, tokens: usize) -> Result<(), GpuError> {
        let b = Arc::clone(&self.backend);
        let ctx_len = b.info.context_length;
        if tokens <= self.kv_tokens || self.kv_tokens >= ctx_len {
            return Ok(());
        }
        let grown = tokens.max(2 * self.kv_tokens).min(ctx_len);
        // A step recorded ahead binds the caches this replaces.
        self.next = None;
        // Every new cache first, so a failed allocation leaves the sequence as it was.
        let mut bigger = Vec::new();
        for (i, l) in b.layers.iter().enumerate() {
            if let MixerGpu::Qsa(q) = &l.mixer {
                bigger.push((i, qsa_state(&b, q, grown)?.0));
            }
        }
        let c = &*b.ctx;
        let mut encoder = c
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("kv grow"),
            });
        let mut added = 0;
        for (i, bigger) in bigger {
            let Some(state) = self.layers.get_mut(i) else {
                return Err(GpuError::BadArgs(format!("no layer {i}")));
            };
            if let (
                LayerState::Qsa {
                    keys,
                    values,
                    raw_index_keys,
                    block_keys,
                },
                LayerState::Qsa {
                    keys: k2,
                    values: v2,
                    raw_index_keys: r2,
                    block_keys: b2,
                },
            ) = (&*state, &bigger)
            {
                for (old, new) in [
                    (keys, k2),
                    (values, v2),
                    (raw_index_keys, r2),
                    (block_keys, b2),
                ] {
                    added += new.len - old.len;
                    encoder.copy_buffer_to_buffer(
                        &old.buffer,
                        0,
                        &new.buffer,
                        0,
                        (old.len * 4) as u64,
                    );
                }
            }
            *state = bigger;
        }
        c.queue.submit([encoder.finish()]);
        self.state_bytes += added * 4;
        self.kv_tokens = grown;
        // Bind groups made for the old buffers would keep them alive.
        self.bind_groups = BindGroupCache::new();
        Ok(())
    }

    /// Tokens the attention caches have room for now.
    pub fn kv_tokens(&self) -> usize {
        self.kv_tokens
    }
}

/// An attention layer's caches for `tokens` tokens, and the floats they take. f16: two values per
/// word, q8_0: 9 words per 32 values; each a flat array over the tokens.
fn qsa_state(b: &GpuBackend, q: &QsaGpu, tokens: usize) -> Result<(LayerState, usize), GpuError> {
    let c = &*b.ctx;
    let a = &b.config.attention;
    let kv = a.n_head_kv * a.head_dim;
    let (ratio, idim) = match &q.indexer {
        Some(ix) => (ix.ratio, a.indexer_head_dim),
        None => (1, 1),
    };
    let cached = b.config.kv.cache_bytes(tokens * kv) / 4;
    let raw = tokens * idim;
    let blocks = (tokens / ratio + 1) * idim;
    let state = LayerState::Qsa {
        keys: GpuBuf::zeros(c, "key cache", cached)?,
        values: GpuBuf::zeros(c, "value cache", cached)?,
        raw_index_keys: GpuBuf::zeros(c, "indexer key cache", raw)?,
        block_keys: GpuBuf::zeros(c, "block keys", blocks)?,
    };
    Ok((state, 2 * cached + raw + blocks))
}

impl GpuBackend {
    /// The chunk buffers every sequence of this backend shares, made on first use. Sequences feed
    /// one at a time (`feed_lock`), so one set serves them all, and a cached or idle sequence
    /// holds only its own state.
    pub(super) fn shared_scratch(&self) -> Result<Arc<Scratch>, GpuError> {
        let mut slot = lock(&self.scratch);
        if let Some(s) = &*slot {
            return Ok(Arc::clone(s));
        }
        let s = Arc::new(Scratch::new(self, self.max_chunk, false)?);
        *slot = Some(Arc::clone(&s));
        Ok(s)
    }

    /// The token-wise buffers of a batched forward ([`batch`](super::batch)), made on first use:
    /// [`batch::BATCH_TOKENS`](super::batch::BATCH_TOKENS) columns, with stage buffers for the
    /// keys, values and raw index keys, which a batch never writes into a cache directly.
    pub(super) fn batch_scratch(&self) -> Result<Arc<Scratch>, GpuError> {
        let mut slot = lock(&self.batch_scratch);
        if let Some(s) = &*slot {
            return Ok(Arc::clone(s));
        }
        let s = Arc::new(Scratch::new(self, batch::BATCH_TOKENS, true)?);
        *slot = Some(Arc::clone(&s));
        Ok(s)
    }
}

/// A poisoned lock still guards plain buffers: take it anyway.
pub(super) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

impl Scratch {
    /// Buffers for `t` tokens; `batch`: with the stage buffers a batched forward needs.
    fn new(b: &GpuBackend, t: usize, batch: bool) -> Result<Self, GpuError> {
        let c = &*b.ctx;
        let cfg = &b.config;
        let h = cfg.n_embd;
        let hc = cfg.hc_count;
        let wide = h * hc;
        let ctx_len = b.info.context_length;
        let g = &cfg.gdn;
        let a = &cfg.attention;
        let m = &cfg.moe;
        let mut max_blocks = 1;
        let mut budget = 1;
        for l in &b.layers {
            if let MixerGpu::Qsa(QsaGpu {
                indexer: Some(ix), ..
            }) = &l.mixer
            {
                max_blocks = max_blocks.max(ctx_len / ix.ratio + 1);
                budget = budget.max(a.indexer_budget_tokens / ix.ratio);
            }
        }
        let ple_dim = cfg.ple.as_ref().map_or(32, |p| p.embed_dim());
        let qg = a.n_head * 2 * a.head_dim;
        let staged = match cfg.kv {
            KvType::F32 if !batch => 1,
            _ => t * a.n_head_kv * a.head_dim,
        };
        let k = m.n_expert_used;
        // Rows whose sampling candidates one pass finds: a batch's members, else the last row.
        let top_rows = if batch { t.min(LOGIT_ROWS) } else { 1 };
        let z = |label: &str, n: usize| GpuBuf::zeros(c, label, n.max(1));
        // Tokens of the layers' own shared gate|up buffers: a decode step or a short chunk.
        let decode_t = t.min(GROUPED_MIN_TOKENS - 1);
        Ok(Scratch {
            ids: z("ids", t)?,
            wide: z("wide", t * wide)?,
            normed: z("normed", t * wide)?,
            low: z("low", t * cfg.hc_low_rank)?,
            gates: z("gates", t * wide)?,
            x_in: z("x_in", t * h)?,
            inject: z("inject", t * hc)?,
            mixed: z("mixed", t * g.conv_channels())?,
            z: z("z", t * g.value_dim())?,
            beta_alpha: z("beta alpha", t * 2 * g.n_v_heads)?,
            conv_out: z("conv out", t * g.conv_channels())?,
            recurrent_out: z("recurrent out", t * g.value_dim())?,
            gdn_normed: z("gdn normed", t * g.value_dim())?,
            query_gate: z("query gate", t * qg)?,
            key_stage: z("key stage", staged)?,
            value_stage: z("value stage", staged)?,
            index_query: z("index query", t * a.indexer_n_head * a.indexer_head_dim)?,
            index_key_stage: z(
                "index key stage",
                if batch { t * a.indexer_head_dim } else { 1 },
            )?,
            selected: z("selected", t * (budget + 1))?,
            scores: z("scores", t * 2 * max_blocks)?,
            attended: z("attended", t * a.n_head * a.head_dim)?,
            attn_parts: z(
                "attention partials",
                ops::qsa_partials_len(t, a.n_head, a.head_dim),
            )?,
            router: z("router", t * m.n_expert)?,
            expert_ids: z("expert ids", t * k)?,
            slot_ids: z("expert slot ids", t * k)?,
            cold_ids: z("expert host ids", t * k)?,
            stage_ids: z("expert stage ids", t * k)?,
            expert_weights: z("expert weights", t * k)?,
            expert_gu: z("expert gate up", t * k * 2 * m.expert_ff)?,
            cold_gu: z(
                "cold expert gate up",
                if b.pinned.as_ref().is_some_and(|p| p.hot_experts() > 0) {
                    t * k * 2 * m.expert_ff
                } else {
                    1
                },
            )?,
            expert_down: z("expert down", t * k * h)?,
            expert_groups: z("expert groups", ops::group_len(m.n_expert, t))?,
            hot_groups: z("hot expert groups", ops::group_len(m.n_expert, t))?,
            routing_log: z(
                "routing log",
                if b.pinned.is_some() {
                    b.layers.len() * t * k
                } else {
                    1
                },
            )?,
            shared_gu: z("shared gate up", t * 2 * m.shared_ff)?,
            shared_gu_layers: b
                .layers
                .iter()
                .map(|l| {
                    let sf = l.moe.shared.as_ref().map_or(0, |sh| sh.down.row_len);
                    z("layer shared gate up", decode_t * 2 * sf)
                })
                .collect::<Result<_, _>>()?,
            shared_down: z("shared down", t * h)?,
            shared_down_layers: b
                .layers
                .iter()
                .map(|l| match l.moe.shared {
                    Some(_) => z("layer shared down", decode_t * h),
                    None => z("layer shared down", 1),
                })
                .collect::<Result<_, _>>()?,
            shared_logit: z("shared logit", t)?,
            ple_embedding: z("ple embedding", t * ple_dim)?,
            ple_key: z("ple key", t * wide)?,
            ple_key_normed: z("ple key normed", t * wide)?,
            ple_value: z("ple value", t * h)?,
            ple_query_normed: z("ple query normed", t * wide)?,
            ple_gated: z("ple gated", t * wide)?,
            ple_conv_in: z("ple conv in", t * wide)?,
            logits: z("logits", t.min(LOGIT_ROWS) * cfg.vocab_size)?,
            greedy: z("greedy", 2)?,
            top_lists: [
                z(
                    "top candidates a",
                    topk::scratch_words(cfg.vocab_size) * top_rows,
                )?,
                z(
                    "top candidates b",
                    topk::scratch_words(cfg.vocab_size) * top_rows,
                )?,
            ],
            top_rows: z("top candidate rows", top_rows)?,
        })
    }
}
