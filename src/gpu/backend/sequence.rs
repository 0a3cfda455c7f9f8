//! Feeding a sequence: chunks, greedy decode, forks, and the engine's `Sequence` trait.

use super::forward::{Got, Want};
use super::*;

impl GpuSequence {
    /// Feed `tokens` and return the greedy next token (argmax of the last logits row, lowest id on
    /// ties), computed on the GPU: the host reads back 8 bytes instead of the logits row.
    pub fn feed_greedy(&mut self, tokens: &[u32]) -> Result<u32, EngineError> {
        match self.feed_for(tokens, Want::Argmax)? {
            Got::Argmax(id) => Ok(id),
            _ => Err(EngineError::Other("greedy feed read back no token".into())),
        }
    }

    /// Feed `tokens` in chunks; the last chunk reads back what `want` asks (the others only their
    /// argmax, 8 bytes, which still checks their rows for non-finite values). An error leaves the
    /// sequence unusable.
    fn feed_for(&mut self, tokens: &[u32], want: Want) -> Result<Got, EngineError> {
        self.validate(tokens)?;
        if tokens.is_empty() {
            return Err(EngineError::Other("a feed needs at least one token".into()));
        }
        let chunks: Vec<&[u32]> = tokens.chunks(self.backend.max_chunk).collect();
        let last = chunks.len() - 1;
        let mut got = Err(EngineError::Other("nothing fed".into()));
        for (i, chunk) in chunks.into_iter().enumerate() {
            let w = if i == last { want } else { Want::Argmax };
            got = self.feed_chunk(chunk, false, w);
            if got.is_err() {
                self.poisoned = true;
                break;
            }
        }
        got
    }

    pub(super) fn validate(&self, tokens: &[u32]) -> Result<(), EngineError> {
        if self.poisoned {
            return Err(EngineError::Other(
                "sequence is unusable after an earlier error".into(),
            ));
        }
        let vocab = self.backend.config.vocab_size;
        if let Some(&id) = tokens.iter().find(|&&id| id as usize >= vocab) {
            return Err(EngineError::BadToken { id, vocab });
        }
        let ctx = self.backend.info.context_length;
        let needed = self.tokens.len() + tokens.len();
        if needed > ctx {
            return Err(EngineError::ContextOverflow { needed, ctx });
        }
        Ok(())
    }

    /// Turn per-dispatch GPU timestamps on or off for later feeds.
    pub fn set_profiling(&mut self, on: bool) {
        self.profile = on;
    }

    /// Turn whole-step GPU timing on or off for later feeds: each feed records its forward in
    /// one pass (not streamed) with a timestamp at each end, and [`Self::take_timings`] gets one
    /// `("step", nanoseconds)` pair per feed: the GPU's own time for the step, which a feed's
    /// host wall time exceeds by the host's share (recording, submission, readback, sampling).
    pub fn set_span_timing(&mut self, on: bool) {
        self.span = on;
    }

    /// The (dispatch label, nanoseconds) pairs collected since the last call.
    pub fn take_timings(&mut self) -> Vec<(String, f64)> {
        std::mem::take(&mut self.timings)
    }
}

impl GpuSequence {
    /// A deep copy: a fresh sequence whose state buffers are GPU-side copies of ours.
    pub fn try_fork(&self) -> Result<GpuSequence, GpuError> {
        let mut copy = GpuSequence::new(Arc::clone(&self.backend))?;
        copy.reserve_kv(self.kv_tokens)?;
        let c = &*self.backend.ctx;
        let mut encoder = c
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("fork"),
            });
        let mut pairs: Vec<(&GpuBuf, &GpuBuf)> = Vec::new();
        for (src, dst) in self.layers.iter().zip(&copy.layers) {
            match (src, dst) {
                (LayerState::Gdn { conv: a, ssm: b }, LayerState::Gdn { conv: x, ssm: y }) => {
                    pairs.extend([(a, x), (b, y)]);
                }
                (
                    LayerState::Qsa {
                        keys: a,
                        values: b,
                        raw_index_keys: i,
                        block_keys: k,
                    },
                    LayerState::Qsa {
                        keys: w,
                        values: x,
                        raw_index_keys: y,
                        block_keys: z,
                    },
                ) => pairs.extend([(a, w), (b, x), (i, y), (k, z)]),
                _ => return Err(GpuError::BadArgs("layer state kinds differ".into())),
            }
        }
        pairs.push((&self.ple_history, &copy.ple_history));
        for (src, dst) in pairs {
            encoder.copy_buffer_to_buffer(
                &src.buffer,
                0,
                &dst.buffer,
                0,
                (src.len.max(1) * 4) as u64,
            );
        }
        c.queue.submit([encoder.finish()]);
        c.wait()?;
        copy.tokens = self.tokens.clone();
        Ok(copy)
    }
}

impl Sequence for GpuSequence {
    fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    fn feed(&mut self, tokens: &[u32], all_logits: bool) -> Result<Vec<f32>, EngineError> {
        self.validate(tokens)?;
        if tokens.is_empty() {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        let chunk = if all_logits {
            self.backend.max_chunk.min(LOGIT_ROWS)
        } else {
            self.backend.max_chunk
        };
        let chunks: Vec<&[u32]> = tokens.chunks(chunk).collect();
        let last = chunks.len() - 1;
        for (i, chunk) in chunks.into_iter().enumerate() {
            let want = all_logits || i == last;
            match self.feed_chunk(chunk, all_logits, Want::Logits) {
                Ok(Got::Logits(logits)) => {
                    if want {
                        out.extend_from_slice(&logits);
                    }
                }
                Ok(_) => return Err(EngineError::Other("a feed read back no logits".into())),
                Err(e) => {
                    self.poisoned = true;
                    return Err(e);
                }
            }
        }
        Ok(out)
    }

    /// The candidates come from the GPU (`crate::gpu::topk`): the logits row stays there.
    fn feed_top(&mut self, tokens: &[u32], k: usize) -> Result<Vec<(u32, f32)>, EngineError> {
        if k > topk::TOP_CANDIDATES {
            return Err(EngineError::Other(format!(
                "at most {} sampling candidates come from the GPU, {k} asked",
                topk::TOP_CANDIDATES
            )));
        }
        match self.feed_for(tokens, Want::Top)? {
            Got::Top(mut top) => {
                top.truncate(k);
                Ok(top)
            }
            _ => Err(EngineError::Other("a feed read back no candidates".into())),
        }
    }

    fn state_bytes(&self) -> usize {
        self.state_bytes + self.tokens.len() * 4
    }

    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(self)
    }

    fn fork(&self) -> Option<Box<dyn Sequence>> {
        if self.poisoned {
            return None;
        }
        match self.try_fork() {
            Ok(seq) => Some(Box::new(seq)),
            Err(e) => {
                tracing::warn!("GPU sequence fork failed: {e}");
                None
            }
        }
    }
}
