//! The prompt cache: sequences kept after requests (at the chat checkpoint, after the prompt, at
//! the end of generation), each with the logits of its last fed token (none when that token's
//! pass returned only sampling candidates: such an entry is reused only by longer prompts). A new prompt that starts
//! with one entry's tokens continues from a fork of it instead of recomputing them.
//!
//! Several entries are kept (least recently used evicted first), so concurrent conversations do
//! not evict each other's prefixes. Entries are bounded by count and by the bytes their sequences
//! hold (`Sequence::state_bytes`: VRAM on the GPU, host RAM on the CPU). Recurrent (GDN) state cannot be rewound, so only exact-prefix
//! extension is reusable; by the backend contract (logits depend only on the tokens, never on how
//! they were split into `feed` calls) reuse gives bit-identical results to starting afresh.

use super::Sequence;

/// Entries kept by default per concurrent sequence (checkpoint, prompt end, generation end).
pub const ENTRIES_PER_SLOT: usize = 3;
/// Bytes the cached sequences may hold together by default (`strata serve --prompt-cache-size`).
pub const DEFAULT_CACHE_BYTES: usize = 4 << 30;

struct Entry {
    sequence: Box<dyn Sequence>,
    last_logits: Vec<f32>,
    last_used: u64,
    /// The sequence's state bytes and its logits.
    bytes: usize,
}

/// A cached sequence handed to a request: the state and the logits of its last token.
pub struct CacheHit {
    pub sequence: Box<dyn Sequence>,
    pub last_logits: Vec<f32>,
}

pub struct PromptCache {
    entries: Vec<Entry>,
    capacity: usize,
    byte_budget: usize,
    clock: u64,
}

impl PromptCache {
    /// A cache of at most `capacity` entries holding at most `byte_budget` bytes together (either
    /// 0 turns caching off).
    pub fn new(capacity: usize, byte_budget: usize) -> PromptCache {
        PromptCache {
            entries: Vec::new(),
            capacity,
            byte_budget,
            clock: 0,
        }
    }

    pub fn enabled(&self) -> bool {
        self.capacity > 0 && self.byte_budget > 0
    }

    /// Bytes the entries hold together (at most the budget).
    pub fn bytes(&self) -> usize {
        self.entries.iter().map(|e| e.bytes).sum()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn clear(&mut self) {
        self.entries.clear();
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// The longest entry whose tokens are a prefix of `prompt`: a fork of it (the entry stays,
    /// so concurrent requests sharing a prefix all hit), or the entry itself when the backend
    /// cannot fork.
    pub fn take_longest_prefix(&mut self, prompt: &[u32]) -> Option<CacheHit> {
        let best = self
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| {
                let t = e.sequence.tokens();
                // An entry without logits (its last pass returned only sampling candidates) can
                // only be extended: a prompt ending where it ends needs its last row.
                let usable = t.len() < prompt.len() || !e.last_logits.is_empty();
                !t.is_empty() && prompt.starts_with(t) && usable
            })
            .max_by_key(|(_, e)| e.sequence.tokens().len())
            .map(|(i, _)| i)?;
        let now = self.tick();
        let entry = &mut self.entries[best];
        entry.last_used = now;
        if let Some(sequence) = entry.sequence.fork() {
            return Some(CacheHit {
                sequence,
                last_logits: entry.last_logits.clone(),
            });
        }
        let entry = self.entries.swap_remove(best);
        Some(CacheHit {
            sequence: entry.sequence,
            last_logits: entry.last_logits,
        })
    }

    /// Keep `sequence` (replacing an entry with the same tokens), evicting the least recently
    /// used entries beyond the capacity or the byte budget. A sequence larger than the whole
    /// budget is not kept.
    pub fn insert(&mut self, sequence: Box<dyn Sequence>, last_logits: Vec<f32>) {
        if !self.enabled() || sequence.tokens().is_empty() {
            return;
        }
        let bytes = sequence.state_bytes() + last_logits.len() * 4;
        if bytes > self.byte_budget {
            return;
        }
        self.entries
            .retain(|e| e.sequence.tokens() != sequence.tokens());
        let last_used = self.tick();
        self.entries.push(Entry {
            sequence,
            last_logits,
            last_used,
            bytes,
        });
        while self.entries.len() > self.capacity || self.bytes() > self.byte_budget {
            let oldest = self
                .entries
                .iter()
                .enumerate()
                .min_by_key(|(_, e)| e.last_used)
                .map(|(i, _)| i);
            match oldest {
                Some(i) => {
                    self.entries.swap_remove(i);
                }
                None => break,
            }
        }
    }

    /// Keep a fork of `sequence` (backends that cannot fork keep nothing, and nothing is forked
    /// for a sequence larger than the whole budget).
    pub fn insert_fork(&mut self, sequence: &dyn Sequence, last_logits: &[f32]) {
        if !self.enabled() || sequence.state_bytes() + last_logits.len() * 4 > self.byte_budget {
            return;
        }
        if let Some(fork) = sequence.fork() {
            self.insert(fork, last_logits.to_vec());
        }
    }

    /// Token counts of the entries, longest first (for tests and metrics).
    pub fn entry_lengths(&self) -> Vec<usize> {
        let mut lengths: Vec<usize> = self
            .entries
            .iter()
            .map(|e| e.sequence.tokens().len())
            .collect();
        lengths.sort_unstable_by(|a, b| b.cmp(a));
        lengths
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::EngineError;

    /// A sequence of given tokens holding `bytes` of state.
    struct Held {
        tokens: Vec<u32>,
        bytes: usize,
    }

    impl Sequence for Held {
        fn tokens(&self) -> &[u32] {
            &self.tokens
        }
        fn feed(&mut self, tokens: &[u32], _all: bool) -> Result<Vec<f32>, EngineError> {
            self.tokens.extend_from_slice(tokens);
            Ok(vec![0.0])
        }
        fn fork(&self) -> Option<Box<dyn Sequence>> {
            Some(Box::new(Held {
                tokens: self.tokens.clone(),
                bytes: self.bytes,
            }))
        }
        fn state_bytes(&self) -> usize {
            self.bytes
        }
    }

    fn held(tokens: &[u32], bytes: usize) -> Box<dyn Sequence> {
        Box::new(Held {
            tokens: tokens.to_vec(),
            bytes,
        })
    }

    #[test]
    fn byte_budget_evicts_least_recently_used() {
        // Room for two entries of 400 bytes (+ 4 bytes of logits each), not three.
        let mut cache = PromptCache::new(10, 1000);
        cache.insert(held(&[1], 400), vec![0.0]);
        cache.insert(held(&[2], 400), vec![0.0]);
        // Using [1] makes [2] the least recently used.
        assert!(cache.take_longest_prefix(&[1, 5]).is_some());
        cache.insert(held(&[3], 400), vec![0.0]);
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.bytes(), 808);
        assert!(
            cache.take_longest_prefix(&[2, 5]).is_none(),
            "[2] was evicted"
        );
        assert!(cache.take_longest_prefix(&[1, 5]).is_some());
        assert!(cache.take_longest_prefix(&[3, 5]).is_some());
    }

    #[test]
    fn oversized_sequences_are_not_kept_and_zero_turns_the_cache_off() {
        let mut cache = PromptCache::new(10, 1000);
        cache.insert(held(&[1], 300), vec![0.0]);
        cache.insert(held(&[2], 2000), vec![0.0]);
        cache.insert_fork(&*held(&[3], 2000), &[0.0]);
        assert_eq!(cache.entry_lengths(), vec![1]);
        assert!(
            cache.take_longest_prefix(&[1]).is_some(),
            "the small entry stays"
        );
        let mut off = PromptCache::new(10, 0);
        assert!(!off.enabled());
        off.insert(held(&[1], 1), vec![0.0]);
        assert!(off.is_empty());
    }
}
