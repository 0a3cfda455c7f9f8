//! The generation loop's types and the one-request-at-a-time [`Generator`]: prompt ids → prefill
//! in chunks → sample / stop checks / stream text (see [`super::generation`] for the steps).
//!
//! Prompt cache ([`super::cache`]): after a request we keep a fork at the request's `checkpoint`
//! (where the chat template's generation prompt starts), a fork taken right after the prompt was
//! fed, and the sequence as it stood when generation ended — each with the logits of its last fed
//! token. A new prompt that starts with one of those token lists continues from it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::cache::{DEFAULT_CACHE_BYTES, ENTRIES_PER_SLOT, PromptCache};
use super::generation::{Generation, GenerationOptions, Next, check_fits};
use super::{Backend, EngineError};
use crate::sampler::logprobs::TokenLogprobs;
use crate::sampler::{SamplerError, SamplingParams};

/// Prompt tokens fed per `Sequence::feed` call on the CPU (a GPU backend asks for its own prefill
/// chunk, `ModelInfo::prefill_chunk`): small enough for progress reports and cancellation to stay
/// responsive. Prompts longer than this get progress events.
pub const PREFILL_CHUNK: usize = 256;

/// Turns token ids into text incrementally (implemented by the tokenizer's stream decoder).
pub trait TokenDecoder {
    /// Text completed by this token, if any (a token can end in the middle of a UTF-8 character).
    fn push(&mut self, id: u32) -> Option<String>;
    /// Whatever is still buffered at the end.
    fn finish(&mut self) -> Option<String>;
}

#[derive(Debug, Clone)]
pub struct GenerateRequest {
    pub prompt: Vec<u32>,
    /// Generated tokens at most (stop tokens not counted).
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Token ids that end generation (not part of the output), e.g. `<|im_end|>`, `<|endoftext|>`.
    pub stop_ids: Vec<u32>,
    /// Strings that end generation; the text is cut before the first one.
    pub stop_strings: Vec<String>,
    /// Also keep a prompt-cache entry after this many prompt tokens — e.g. where the chat
    /// template's generation prompt begins, since the next turn re-renders this turn's answer
    /// differently and can only reuse the conversation up to here.
    pub checkpoint: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token was sampled.
    StopToken(u32),
    /// A stop string appeared in the text.
    StopString(String),
    /// `max_tokens` reached.
    Length,
    /// The cancel flag was raised (client went away).
    Cancelled,
}

/// Streamed to the caller while a request runs.
#[derive(Debug, Clone, PartialEq)]
pub enum GenEvent {
    /// `done` of `total` prompt tokens fed (`cached` of them came from the prompt cache).
    PromptProgress { done: usize, total: usize },
    /// A generated token and the text it completes (may be empty: partial UTF-8, or held back
    /// because it could be the start of a stop string).
    Token {
        id: u32,
        text: String,
        /// Present when the request asked for log-probabilities.
        logprobs: Option<TokenLogprobs>,
    },
    /// Text released at the end (decoder tail, text held back for a stop string that never came).
    TrailingText(String),
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Usage {
    pub prompt_tokens: usize,
    /// Prompt tokens served from the prompt cache (not recomputed).
    pub cached_tokens: usize,
    pub completion_tokens: usize,
}

#[derive(Debug, Clone)]
pub struct GenOutput {
    pub tokens: Vec<u32>,
    /// Per generated token, when the request asked for log-probabilities.
    pub logprobs: Vec<TokenLogprobs>,
    /// The visible text (cut before a stop string, without stop tokens).
    pub text: String,
    pub finish: FinishReason,
    pub usage: Usage,
    /// The seed actually used.
    pub seed: u64,
    pub prefill_time: Duration,
    pub decode_time: Duration,
}

impl GenOutput {
    /// Prompt tokens actually computed per second.
    pub fn prefill_tokens_per_second(&self) -> f64 {
        rate(
            self.usage.prompt_tokens - self.usage.cached_tokens,
            self.prefill_time,
        )
    }
    pub fn decode_tokens_per_second(&self) -> f64 {
        rate(self.usage.completion_tokens, self.decode_time)
    }
}

fn rate(count: usize, time: Duration) -> f64 {
    let s = time.as_secs_f64();
    if s > 0.0 { count as f64 / s } else { 0.0 }
}

#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error(
        "the prompt has {prompt} tokens and max_tokens is {max_tokens}: {} > context length {ctx}",
        prompt.saturating_add(*max_tokens)
    )]
    ContextOverflow {
        prompt: usize,
        max_tokens: usize,
        ctx: usize,
    },
    #[error("max_tokens must be at least 1")]
    ZeroMaxTokens,
    /// The client went away before the request got a slot.
    #[error("the request was cancelled before it started")]
    Cancelled,
    #[error(transparent)]
    Sampler(#[from] SamplerError),
    #[error("engine error: {0}")]
    Engine(#[from] EngineError),
}

/// Owns the backend and a prompt cache; runs one request at a time (`&mut self`), for the CLI.
/// The server interleaves several with [`super::scheduler::Scheduler`]; both run the same
/// [`Generation`] state machine.
pub struct Generator {
    backend: Arc<dyn Backend>,
    cache: PromptCache,
}

impl Generator {
    pub fn new(backend: Arc<dyn Backend>) -> Generator {
        Generator {
            backend,
            cache: PromptCache::new(ENTRIES_PER_SLOT, DEFAULT_CACHE_BYTES),
        }
    }

    /// Turn the prompt cache off (every request starts from position 0).
    pub fn with_prompt_cache(mut self, enabled: bool) -> Generator {
        self.cache = PromptCache::new(
            if enabled { ENTRIES_PER_SLOT } else { 0 },
            DEFAULT_CACHE_BYTES,
        );
        self
    }

    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    pub fn context_length(&self) -> usize {
        self.backend.info().context_length
    }

    /// Drop the cached sequences (e.g. `/reset` in the chat).
    pub fn clear_cache(&mut self) {
        self.cache.clear();
    }

    /// Check a request against the context before any compute.
    pub fn check_fits(&self, prompt_len: usize, max_tokens: usize) -> Result<(), GenerateError> {
        check_fits(prompt_len, max_tokens, self.context_length())
    }

    /// Run one request. `decoder` turns ids into text; `cancel` is checked before every feed;
    /// `on_event` sees progress and every token. On error the sequence is dropped and the cache
    /// emptied, so the next request starts clean.
    pub fn generate(
        &mut self,
        request: &GenerateRequest,
        decoder: &mut dyn TokenDecoder,
        cancel: &AtomicBool,
        on_event: &mut dyn FnMut(GenEvent),
    ) -> Result<GenOutput, GenerateError> {
        let result = self.generate_inner(request, decoder, cancel, on_event);
        if result.is_err() {
            self.cache.clear();
        }
        result
    }

    fn generate_inner(
        &mut self,
        request: &GenerateRequest,
        decoder: &mut dyn TokenDecoder,
        cancel: &AtomicBool,
        on_event: &mut dyn FnMut(GenEvent),
    ) -> Result<GenOutput, GenerateError> {
        let options = GenerationOptions::default();
        let mut generation = Generation::start(
            &self.backend,
            &mut self.cache,
            request.clone(),
            options,
            decoder,
        )?;
        loop {
            let cancelled = cancel.load(Ordering::Relaxed);
            match generation.advance(cancelled, &mut self.cache, on_event)? {
                Next::Finished(output) => return Ok(output),
                Next::Feed => {
                    let fed = generation.feed_alone();
                    generation.absorb(fed, &mut self.cache, on_event)?;
                }
            }
        }
    }
}

impl<T: TokenDecoder + ?Sized> TokenDecoder for &mut T {
    fn push(&mut self, id: u32) -> Option<String> {
        (**self).push(id)
    }
    fn finish(&mut self) -> Option<String> {
        (**self).finish()
    }
}

impl<T: TokenDecoder + ?Sized> TokenDecoder for Box<T> {
    fn push(&mut self, id: u32) -> Option<String> {
        (**self).push(id)
    }
    fn finish(&mut self) -> Option<String> {
        (**self).finish()
    }
}

/// Holds back text that could be the start of a stop string and cuts the text at the first stop
/// string found.
#[derive(Debug, Clone)]
pub struct StopStringFilter {
    stops: Vec<String>,
    /// All text so far (visible part is `text[..emitted]` plus whatever is released later).
    text: String,
    emitted: usize,
    stopped: bool,
}

impl StopStringFilter {
    pub fn new(stops: &[String]) -> StopStringFilter {
        StopStringFilter {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            text: String::new(),
            emitted: 0,
            stopped: false,
        }
    }

    /// Add a piece of text; returns the text now safe to show and the stop string if one matched.
    pub fn push(&mut self, piece: &str) -> (String, Option<String>) {
        if self.stopped {
            return (String::new(), None);
        }
        // A stop string can begin in text already emitted only if we released part of it, which we
        // never do: search from the emitted boundary.
        let search_from = self.emitted;
        self.text.push_str(piece);
        let mut first: Option<(usize, &String)> = None;
        for stop in &self.stops {
            if let Some(i) = self.text[search_from..].find(stop.as_str()) {
                let at = search_from + i;
                if first.is_none_or(|(f, _)| at < f) {
                    first = Some((at, stop));
                }
            }
        }
        if let Some((at, stop)) = first {
            let stop = stop.clone();
            let visible = self.text[self.emitted..at].to_string();
            self.text.truncate(at);
            self.emitted = at;
            self.stopped = true;
            return (visible, Some(stop));
        }
        let hold = self.held_back_len();
        let safe = self.text.len() - hold;
        let visible = self.text[self.emitted..safe].to_string();
        self.emitted = safe;
        (visible, None)
    }

    /// Length of the longest suffix of the unreleased text that is a proper prefix of a stop string.
    fn held_back_len(&self) -> usize {
        let pending = &self.text[self.emitted..];
        let mut hold = 0;
        for stop in &self.stops {
            for (i, _) in pending.char_indices() {
                let suffix = &pending[i..];
                if suffix.len() <= hold {
                    break;
                }
                if stop.starts_with(suffix) {
                    hold = suffix.len();
                    break;
                }
            }
        }
        hold
    }

    /// Release everything held back (end of generation without a stop string).
    pub fn flush(&mut self) -> String {
        let rest = self.text[self.emitted..].to_string();
        self.emitted = self.text.len();
        rest
    }

    /// The final visible text.
    pub fn into_text(mut self) -> String {
        self.text.truncate(self.emitted);
        self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stops(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn stop_string_split_across_pieces_is_cut() {
        let mut f = StopStringFilter::new(&stops(&["END"]));
        assert_eq!(f.push("hello E"), ("hello ".to_string(), None));
        assert_eq!(f.push("N"), (String::new(), None));
        assert_eq!(f.push("D more"), (String::new(), Some("END".to_string())));
        assert_eq!(f.into_text(), "hello ");
    }

    #[test]
    fn false_start_is_released() {
        let mut f = StopStringFilter::new(&stops(&["END"]));
        assert_eq!(f.push("E"), (String::new(), None));
        assert_eq!(f.push("x"), ("Ex".to_string(), None));
        assert_eq!(f.push("EN"), (String::new(), None));
        assert_eq!(f.flush(), "EN");
        assert_eq!(f.into_text(), "ExEN");
    }

    #[test]
    fn earliest_stop_wins_and_multibyte_is_safe() {
        let mut f = StopStringFilter::new(&stops(&["zz", "é!"]));
        let (visible, stop) = f.push("aé!zz");
        assert_eq!(visible, "a");
        assert_eq!(stop.as_deref(), Some("é!"));
    }
}
