//! The seam between a forward pass (CPU reference in `model`, GPU in `gpu`) and everything that
//! consumes logits (sampler, CLI, server). A `Backend` is a loaded model; a `Sequence` is one
//! request's state (recurrent GDN/PLE state, KV and indexer caches) and the tokens fed so far.
//!
//! Contract every backend keeps (DEVELOPERS.md rule 1): the logits of a position depend only on the
//! tokens up to it — never on how the tokens were split across `feed` calls, on other sequences, on
//! timing, or on where a weight lives.

pub mod cache;
pub mod generate;
pub mod generation;
pub mod scheduler;

use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A non-finite value was found; `stage` names the first stage that produced one
    /// (e.g. "layer 3 QSA attention output"), `position` the absolute token position.
    #[error("non-finite value in {stage} at token position {position}")]
    NonFinite { stage: String, position: usize },
    /// The request would run past the context the sequence was created with.
    #[error("context overflow: {needed} tokens needed, context is {ctx}")]
    ContextOverflow { needed: usize, ctx: usize },
    #[error("token id {id} is outside the vocabulary ({vocab})")]
    BadToken { id: u32, vocab: usize },
    #[error("{0}")]
    Other(String),
}

/// What the rest of the program needs to know about the loaded model.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    /// Human-readable model name (GGUF `general.name` or the file stem).
    pub name: String,
    pub vocab_size: usize,
    /// Maximum context the backend will accept per sequence.
    pub context_length: usize,
    /// "cpu" or "gpu (<adapter name>)".
    pub backend: String,
    /// Prompt tokens per feed the backend runs best with (the GPU's prefill chunk); generation
    /// feeds prompts in pieces of this size. Results never depend on it.
    pub prefill_chunk: usize,
}

pub trait Backend: Send + Sync {
    fn info(&self) -> &ModelInfo;
    /// A fresh sequence at position 0.
    fn new_sequence(self: Arc<Self>) -> Result<Box<dyn Sequence>, EngineError>;
    /// Advance several sequences by one forward pass each (`logits = false` semantics: the last
    /// fed token's row). The default feeds them one after another; a backend that can batch
    /// several sequences into one GPU pass overrides this. Results are in `batch` order, and each
    /// must equal what `feed` alone would return (the contract above).
    fn feed_many(&self, batch: &mut [FeedItem<'_>]) -> Vec<Result<Fed, EngineError>> {
        batch.iter_mut().map(FeedItem::feed).collect()
    }
    /// Batched passes run since load, and the sequence steps they carried together (several
    /// sequences of a [`Self::feed_many`] sharing one forward pass); (0, 0) for a backend that
    /// never batches.
    fn batched_passes(&self) -> (usize, usize) {
        (0, 0)
    }
    /// How many requests a server should advance together on this backend by default
    /// ([`scheduler::DEFAULT_PARALLEL`] unless the backend knows better).
    fn default_parallel(&self) -> usize {
        scheduler::DEFAULT_PARALLEL
    }
}

/// One sequence's share of a [`Backend::feed_many`] call.
pub struct FeedItem<'a> {
    pub sequence: &'a mut dyn Sequence,
    pub tokens: &'a [u32],
    /// 0: the last fed token's whole logits row; k > 0: only its first `k` candidates
    /// ([`Sequence::feed_top`]).
    pub top: usize,
}

impl FeedItem<'_> {
    /// This item's pass on its own.
    pub fn feed(&mut self) -> Result<Fed, EngineError> {
        if self.top > 0 {
            self.sequence.feed_top(self.tokens, self.top).map(Fed::Top)
        } else {
            self.sequence.feed(self.tokens, false).map(Fed::Row)
        }
    }
}

/// What a pass hands back for its last fed token.
#[derive(Debug, Clone, PartialEq)]
pub enum Fed {
    /// The whole logits row (`[vocab]`).
    Row(Vec<f32>),
    /// The first candidates in sampling order, as (id, logit) ([`Sequence::feed_top`]).
    Top(Vec<(u32, f32)>),
}

pub trait Sequence: Send {
    /// Tokens fed so far (the absolute position of the next token is `tokens().len()`).
    fn tokens(&self) -> &[u32];
    /// Feed `tokens` after the ones already fed. Returns logits row-major: `[tokens.len(), vocab]`
    /// when `all_logits`, else `[1, vocab]` for the last fed token. Every row is checked for
    /// non-finite values. On error the sequence is left unusable (callers drop it).
    fn feed(&mut self, tokens: &[u32], all_logits: bool) -> Result<Vec<f32>, EngineError>;
    /// Feed `tokens` and return only the first `k` tokens of the last row in sampling order (logit
    /// descending, id ascending: `crate::sampler::top_candidates` of the row) as (id, logit), the
    /// whole row still checked for non-finite values. A backend that finds them where the logits
    /// are (the GPU) overrides this, so the row never crosses to the host.
    fn feed_top(&mut self, tokens: &[u32], k: usize) -> Result<Vec<(u32, f32)>, EngineError> {
        let logits = self.feed(tokens, false)?;
        Ok(crate::sampler::top_candidates(&logits, k))
    }
    /// A deep copy of the state (used by the prompt cache). Backends that cannot copy return None.
    fn fork(&self) -> Option<Box<dyn Sequence>>;
    /// Bytes of memory this sequence holds (VRAM for a GPU sequence, host RAM for a CPU one):
    /// what keeping it in the prompt cache costs.
    fn state_bytes(&self) -> usize;
    /// The sequence itself, for a backend whose [`Backend::feed_many`] batches its own kind of
    /// sequence into one pass (`None`: fed one at a time).
    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        None
    }
}
