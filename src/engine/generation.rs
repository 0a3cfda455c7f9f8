//! One request's generation as a step-able state machine, so a scheduler can interleave several
//! (and later batch their forward passes): [`Generation::advance`] does the host-side work up to
//! the next forward pass (pick the next prefill chunk, or sample / stop checks / stream text) and
//! [`Generation::absorb`] takes that pass's logits. The forward pass itself is the caller's:
//! `sequence.feed` one at a time, or [`super::Backend::feed_many`] for several at once.
//!
//! Everything a token depends on is this request's own: its tokens (the backend contract) and its
//! sampler, keyed by (seed, absolute position). So a request's output is the same bits whether it
//! runs alone or beside others, and whatever the order the scheduler steps them in.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::cache::PromptCache;
use super::generate::{
    FinishReason, GenEvent, GenOutput, GenerateError, GenerateRequest, StopStringFilter,
    TokenDecoder, Usage,
};
use super::{Backend, EngineError, Fed, FeedItem, Sequence};
use crate::sampler::Sampler;
use crate::sampler::logprobs::{TokenLogprobs, logprobs};

/// Restricts which tokens may come next (structured output). The mask is computed on the host.
pub trait TokenConstraint: Send {
    /// Allowed next tokens as a mask over the vocabulary (`vocab` entries). When the constraint
    /// is complete, only its end token (one of the request's stop ids) is allowed.
    fn allowed(&mut self, vocab: usize) -> Result<Vec<bool>, String>;
    /// Record a sampled token.
    fn accept(&mut self, token: u32) -> Result<(), String>;
}

/// Per-request extras beyond [`GenerateRequest`].
#[derive(Default)]
pub struct GenerationOptions {
    /// Report log-probabilities: `Some(n)` ⇒ the sampled token's and the `n` most likely.
    pub logprobs: Option<usize>,
    pub constraint: Option<Box<dyn TokenConstraint>>,
}

/// What a generation needs next.
pub enum Next {
    /// Feed [`Generation::feed_item`]'s tokens, then [`Generation::absorb`] the logits.
    Feed,
    /// Generation ended; the sequence went to the prompt cache.
    Finished(GenOutput),
}

pub struct Generation<D: TokenDecoder> {
    request: GenerateRequest,
    options: GenerationOptions,
    decoder: D,
    sampler: Sampler,
    sequence: Option<Box<dyn Sequence>>,
    /// Logits of the last fed token (empty after a top-only pass).
    logits: Vec<f32>,
    /// The first candidates of the last fed token, after a top-only pass (see
    /// [`Generation::feed_item`]).
    top: Option<Vec<(u32, f32)>>,
    vocab: usize,
    /// Prompt tokens fed so far (cached ones included).
    fed: usize,
    cached_tokens: usize,
    /// A prompt-cache checkpoint strictly inside the part still to feed.
    checkpoint: Option<usize>,
    /// Prompt tokens per feed (the backend's prefill chunk).
    prefill_chunk: usize,
    /// Tokens of the forward pass in flight.
    pending: Vec<u32>,
    tokens: Vec<u32>,
    token_logprobs: Vec<TokenLogprobs>,
    filter: StopStringFilter,
    started: Instant,
    prefill_time: Option<Duration>,
    decode_start: Option<Instant>,
    announced: bool,
}

/// Prompt positions (multiples of this) where a long prompt also leaves a prompt-cache entry,
/// so a conversation that edits an earlier turn resumes from the last such point before the edit
/// rather than from zero. Entries are bounded by the cache's count and byte budget like any other.
pub const CHECKPOINT_EVERY: usize = 4096;

impl<D: TokenDecoder> Generation<D> {
    /// Validate the request and take its starting state from the prompt cache or a fresh sequence.
    pub fn start(
        backend: &Arc<dyn Backend>,
        cache: &mut PromptCache,
        request: GenerateRequest,
        options: GenerationOptions,
        decoder: D,
    ) -> Result<Generation<D>, GenerateError> {
        check_fits(
            request.prompt.len(),
            request.max_tokens,
            backend.info().context_length,
        )?;
        let sampler = Sampler::new(&request.sampling, &request.prompt)?;
        let (sequence, logits) = match cache.take_longest_prefix(&request.prompt) {
            Some(hit) => (hit.sequence, hit.last_logits),
            None => (backend.clone().new_sequence()?, Vec::new()),
        };
        let cached_tokens = sequence.tokens().len();
        let checkpoint = request
            .checkpoint
            .filter(|&c| cache.enabled() && c > cached_tokens && c < request.prompt.len());
        Ok(Generation {
            filter: StopStringFilter::new(&request.stop_strings),
            request,
            options,
            decoder,
            sampler,
            sequence: Some(sequence),
            logits,
            top: None,
            vocab: backend.info().vocab_size,
            fed: cached_tokens,
            cached_tokens,
            checkpoint,
            prefill_chunk: backend.info().prefill_chunk.max(1),
            pending: Vec::new(),
            tokens: Vec::new(),
            token_logprobs: Vec::new(),
            started: Instant::now(),
            prefill_time: None,
            decode_start: None,
            announced: false,
        })
    }

    /// (done, total) prompt tokens.
    pub fn prompt_progress(&self) -> (usize, usize) {
        (self.fed, self.request.prompt.len())
    }

    /// Host-side work up to the next forward pass. `cancelled` ends the generation here.
    pub fn advance(
        &mut self,
        cancelled: bool,
        cache: &mut PromptCache,
        on_event: &mut dyn FnMut(GenEvent),
    ) -> Result<Next, GenerateError> {
        if !self.announced {
            self.announced = true;
            on_event(self.progress_event());
        }
        if cancelled {
            return Ok(Next::Finished(self.finish(
                FinishReason::Cancelled,
                cache,
                on_event,
            )));
        }
        if self.fed < self.request.prompt.len() {
            self.plan_prefill_chunk();
            return Ok(Next::Feed);
        }
        if self.prefill_time.is_none() {
            self.end_prefill(cache)?;
        }
        self.decode_one(cache, on_event)
    }

    /// The sequence and the tokens to feed for the pass [`Generation::advance`] asked for. A
    /// decode step whose sampler needs only the first candidates (`Sampler::top_only`; no
    /// log-probabilities, no output constraint) asks for just those: on the GPU the logits row
    /// then stays there. Prompt chunks always return the row (the prompt cache keeps it).
    pub fn feed_item(&mut self) -> Option<FeedItem<'_>> {
        let top = self.top_wanted();
        let sequence = self.sequence.as_deref_mut()?;
        Some(FeedItem {
            sequence,
            tokens: &self.pending,
            top,
        })
    }

    /// Candidates a top-only pass returns for the next sample (0: the whole row).
    fn top_wanted(&self) -> usize {
        let plain = self.options.logprobs.is_none() && self.options.constraint.is_none();
        match self.sampler.top_only() {
            Some(k) if plain && self.prefill_time.is_some() => k,
            _ => 0,
        }
    }

    /// Whether [`Self::feed_item`] has a sequence to feed.
    pub fn can_feed(&self) -> bool {
        self.sequence.is_some()
    }

    /// Feed the pending tokens directly (no batching).
    pub fn feed_alone(&mut self) -> Result<Fed, EngineError> {
        match self.feed_item() {
            Some(mut item) => item.feed(),
            None => Err(no_sequence()),
        }
    }

    /// Take the result of the pass asked for.
    pub fn absorb(
        &mut self,
        fed: Result<Fed, EngineError>,
        cache: &mut PromptCache,
        on_event: &mut dyn FnMut(GenEvent),
    ) -> Result<(), GenerateError> {
        match fed? {
            Fed::Row(logits) => {
                self.logits = logits;
                self.top = None;
            }
            Fed::Top(top) => {
                self.logits = Vec::new();
                self.top = Some(top);
            }
        }
        if self.prefill_time.is_some() {
            return Ok(());
        }
        self.fed += self.pending.len();
        let periodic =
            self.fed.is_multiple_of(CHECKPOINT_EVERY) && self.fed < self.request.prompt.len();
        if (self.checkpoint == Some(self.fed) || periodic)
            && let Some(sequence) = self.sequence.as_deref()
        {
            cache.insert_fork(sequence, &self.logits);
        }
        on_event(self.progress_event());
        Ok(())
    }

    fn progress_event(&self) -> GenEvent {
        GenEvent::PromptProgress {
            done: self.fed,
            total: self.request.prompt.len(),
        }
    }

    /// The next prompt chunk: up to the backend's prefill chunk, cut at the checkpoint and at the
    /// next multiple of [`CHECKPOINT_EVERY`] (chunk boundaries never change a result).
    fn plan_prefill_chunk(&mut self) {
        let prompt = &self.request.prompt;
        let next_periodic = (self.fed / CHECKPOINT_EVERY + 1) * CHECKPOINT_EVERY;
        let mut end = (self.fed + self.prefill_chunk)
            .min(prompt.len())
            .min(next_periodic);
        if let Some(c) = self.checkpoint
            && self.fed < c
            && c < end
        {
            end = c;
        }
        self.pending = prompt[self.fed..end].to_vec();
    }

    fn end_prefill(&mut self, cache: &mut PromptCache) -> Result<(), GenerateError> {
        self.prefill_time = Some(self.started.elapsed());
        self.decode_start = Some(Instant::now());
        if self.logits.len() != self.vocab {
            return Err(EngineError::Other(format!(
                "backend returned {} logits, vocabulary is {}",
                self.logits.len(),
                self.vocab
            ))
            .into());
        }
        if let Some(sequence) = self.sequence.as_deref() {
            cache.insert_fork(sequence, &self.logits);
        }
        Ok(())
    }

    /// Sample one token, stream it, and decide whether to go on.
    fn decode_one(
        &mut self,
        cache: &mut PromptCache,
        on_event: &mut dyn FnMut(GenEvent),
    ) -> Result<Next, GenerateError> {
        let position = self.request.prompt.len() + self.tokens.len();
        let mask = match self.options.constraint.as_mut() {
            Some(c) => Some(c.allowed(self.vocab).map_err(EngineError::Other)?),
            None => None,
        };
        let token = match &self.top {
            Some(top) => self.sampler.sample_top(top, position)?,
            None => self
                .sampler
                .sample_masked(&self.logits, position, mask.as_deref())?,
        };
        if self.request.stop_ids.contains(&token) {
            // Not consumed by the constraint: a complete grammar has stopped and takes no more.
            return Ok(Next::Finished(self.finish(
                FinishReason::StopToken(token),
                cache,
                on_event,
            )));
        }
        if let Some(c) = self.options.constraint.as_mut() {
            c.accept(token).map_err(EngineError::Other)?;
        }
        let token_logprobs = self
            .options
            .logprobs
            .map(|top| logprobs(&self.logits, token, top));
        if let Some(lp) = &token_logprobs {
            self.token_logprobs.push(lp.clone());
        }
        self.tokens.push(token);
        let piece = self.decoder.push(token).unwrap_or_default();
        let (visible, stop) = self.filter.push(&piece);
        on_event(GenEvent::Token {
            id: token,
            text: visible,
            logprobs: token_logprobs,
        });
        if let Some(stop) = stop {
            let reason = FinishReason::StopString(stop);
            return Ok(Next::Finished(self.finish(reason, cache, on_event)));
        }
        if self.tokens.len() >= self.request.max_tokens {
            return Ok(Next::Finished(self.finish(
                FinishReason::Length,
                cache,
                on_event,
            )));
        }
        self.pending = vec![token];
        Ok(Next::Feed)
    }

    /// Flush held-back text, hand the sequence to the cache and build the output.
    fn finish(
        &mut self,
        finish: FinishReason,
        cache: &mut PromptCache,
        on_event: &mut dyn FnMut(GenEvent),
    ) -> GenOutput {
        let decoding = self.prefill_time.is_some();
        if decoding && !matches!(finish, FinishReason::StopString(_)) {
            let tail = self.decoder.finish().unwrap_or_default();
            let (mut visible, stop) = self.filter.push(&tail);
            if stop.is_none() {
                visible.push_str(&self.filter.flush());
            }
            if !visible.is_empty() {
                on_event(GenEvent::TrailingText(visible));
            }
        }
        if decoding && let Some(sequence) = self.sequence.take() {
            cache.insert(sequence, std::mem::take(&mut self.logits));
        }
        let filter = std::mem::replace(&mut self.filter, StopStringFilter::new(&[]));
        let prefill_time = self.prefill_time.unwrap_or_else(|| self.started.elapsed());
        GenOutput {
            usage: Usage {
                prompt_tokens: self.request.prompt.len(),
                cached_tokens: self.cached_tokens,
                completion_tokens: self.tokens.len(),
            },
            tokens: std::mem::take(&mut self.tokens),
            logprobs: std::mem::take(&mut self.token_logprobs),
            text: filter.into_text(),
            finish,
            seed: self.sampler.seed(),
            prefill_time,
            decode_time: self.decode_start.map(|s| s.elapsed()).unwrap_or_default(),
        }
    }
}

fn no_sequence() -> EngineError {
    EngineError::Other("the generation has already finished".into())
}

/// Check a request against the context before any compute.
pub fn check_fits(prompt_len: usize, max_tokens: usize, ctx: usize) -> Result<(), GenerateError> {
    if prompt_len == 0 {
        return Err(GenerateError::EmptyPrompt);
    }
    if max_tokens == 0 {
        return Err(GenerateError::ZeroMaxTokens);
    }
    if prompt_len.saturating_add(max_tokens) > ctx {
        return Err(GenerateError::ContextOverflow {
            prompt: prompt_len,
            max_tokens,
            ctx,
        });
    }
    Ok(())
}
