//! Deterministic stand-in backends for tests of the generation loop and the server (no weights):
//! logits from a hash of the tokens fed so far, or a script of tokens to emit, with optional
//! slowness and an injected non-finite failure.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::engine::{Backend, EngineError, ModelInfo, Sequence};
use crate::sampler::splitmix64;

#[derive(Debug, Clone, Default)]
pub struct FakeOptions {
    /// Tokens to emit in order (then `script_end`), whatever the prompt; empty ⇒ hash logits.
    pub script: Vec<u32>,
    /// Emitted after the script (typically a stop id).
    pub script_end: Option<u32>,
    /// Sleep per `feed` call (to test queueing and cancellation).
    pub feed_delay: Duration,
    /// Fail with `NonFinite` when a feed reaches this many tokens in the sequence.
    pub fail_at_length: Option<usize>,
    /// Tokens the hash logits never favour (e.g. stop ids, so a run lasts `max_tokens`).
    pub suppressed: Vec<u32>,
}

/// A backend whose logits depend only on the tokens fed so far.
pub struct FakeBackend {
    info: ModelInfo,
    options: FakeOptions,
    /// Number of `feed` calls made, over all sequences.
    pub feeds: Arc<AtomicUsize>,
    /// Number of tokens fed, over all sequences.
    pub tokens_fed: Arc<AtomicUsize>,
}

impl FakeBackend {
    pub fn new(vocab_size: usize, context_length: usize, options: FakeOptions) -> FakeBackend {
        FakeBackend {
            info: ModelInfo {
                name: "fake".into(),
                vocab_size,
                context_length,
                backend: "fake".into(),
                prefill_chunk: crate::engine::generate::PREFILL_CHUNK,
            },
            options,
            feeds: Arc::new(AtomicUsize::new(0)),
            tokens_fed: Arc::new(AtomicUsize::new(0)),
        }
    }
}

impl Backend for FakeBackend {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn new_sequence(self: Arc<Self>) -> Result<Box<dyn Sequence>, EngineError> {
        Ok(Box::new(FakeSequence {
            backend: self,
            tokens: Vec::new(),
        }))
    }
}

struct FakeSequence {
    backend: Arc<FakeBackend>,
    tokens: Vec<u32>,
}

impl FakeSequence {
    fn logits_for(&self, upto: usize) -> Vec<f32> {
        let vocab = self.backend.info.vocab_size;
        let history = &self.tokens[..upto];
        let options = &self.backend.options;
        if !options.script.is_empty() {
            // Where are we in the script? The longest script prefix the history ends with.
            let script = &options.script;
            let done = (0..=script.len().min(history.len()))
                .rev()
                .find(|&k| history.ends_with(&script[..k]))
                .unwrap_or(0);
            let next = script
                .get(done)
                .copied()
                .or(options.script_end)
                .unwrap_or(0);
            let mut row = vec![0.0f32; vocab];
            if let Some(slot) = row.get_mut(next as usize) {
                *slot = 100.0;
            }
            return row;
        }
        let mut h = 0x5eed_u64;
        for &t in history {
            h = splitmix64(h ^ t as u64);
        }
        let mut row: Vec<f32> = (0..vocab)
            .map(|i| {
                let bits = splitmix64(h ^ (i as u64).wrapping_mul(0x9E37_79B9));
                // Uniform in [-4, 4): wide enough that temperature and top-k matter.
                ((bits >> 40) as f32 / (1u64 << 24) as f32) * 8.0 - 4.0
            })
            .collect();
        for &t in &options.suppressed {
            if let Some(l) = row.get_mut(t as usize) {
                *l = -100.0;
            }
        }
        row
    }
}

impl Sequence for FakeSequence {
    fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    fn feed(&mut self, tokens: &[u32], all_logits: bool) -> Result<Vec<f32>, EngineError> {
        let backend = self.backend.clone();
        backend.feeds.fetch_add(1, Ordering::SeqCst);
        backend.tokens_fed.fetch_add(tokens.len(), Ordering::SeqCst);
        if !backend.options.feed_delay.is_zero() {
            std::thread::sleep(backend.options.feed_delay);
        }
        let vocab = backend.info.vocab_size;
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(EngineError::BadToken { id: bad, vocab });
        }
        let start = self.tokens.len();
        self.tokens.extend_from_slice(tokens);
        if let Some(limit) = backend.options.fail_at_length
            && self.tokens.len() >= limit
        {
            return Err(EngineError::NonFinite {
                stage: "fake backend output".into(),
                position: limit - 1,
            });
        }
        let end = self.tokens.len();
        if all_logits {
            Ok((start + 1..=end)
                .flat_map(|upto| self.logits_for(upto))
                .collect())
        } else {
            Ok(self.logits_for(end))
        }
    }

    fn fork(&self) -> Option<Box<dyn Sequence>> {
        Some(Box::new(FakeSequence {
            backend: self.backend.clone(),
            tokens: self.tokens.clone(),
        }))
    }

    fn state_bytes(&self) -> usize {
        self.tokens.len() * 4
    }
}
