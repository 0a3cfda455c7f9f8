//! The prompt cache: sequences kept after requests (at the chat checkpoint, after the prompt, at
//! the end of generation), each with the logits of its last fed token. A new prompt that starts
//! with one entry's tokens continues from a fork of it instead of recomputing them.
//!
//! Several entries are kept (least recently used evicted first), so concurrent conversations do
//! not evict each other's prefixes. Recurrent (GDN) state cannot be rewound, so only exact-prefix
//! extension is reusable; by the backend contract (logits depend only on the tokens, never on how
//! they were split into `feed` calls) reuse gives bit-identical results to starting afresh.

use super::Sequence;

/// Entries kept by default per concurrent sequence (checkpoint, prompt end, generation end).
pub const ENTRIES_PER_SLOT: usize = 3;

struct Entry {
    sequence: Box<dyn Sequence>,
    last_logits: Vec<f32>,
    last_used: u64,
}

/// A cached sequence handed to a request: the state and the logits of its last token.
pub struct CacheHit {
    pub sequence: Box<dyn Sequence>,
    pub last_logits: Vec<f32>,
}

pub struct PromptCache {
    entries: Vec<Entry>,
    capacity: usize,
    clock: u64,
}

impl PromptCache {
    /// A cache of at most `capacity` entries (0 turns caching off).
    pub fn new(capacity: usize) -> PromptCache {
        PromptCache {
            entries: Vec::new(),
            capacity,
            clock: 0,
        }
    }

    pub fn enabled(&self) -> bool {
        self.capacity > 0
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
                !t.is_empty() && prompt.starts_with(t)
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
    /// used entries beyond the capacity.
    pub fn insert(&mut self, sequence: Box<dyn Sequence>, last_logits: Vec<f32>) {
        if !self.enabled() || sequence.tokens().is_empty() {
            return;
        }
        self.entries
            .retain(|e| e.sequence.tokens() != sequence.tokens());
        let last_used = self.tick();
        self.entries.push(Entry {
            sequence,
            last_logits,
            last_used,
        });
        while self.entries.len() > self.capacity {
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

    /// Keep a fork of `sequence` (backends that cannot fork keep nothing).
    pub fn insert_fork(&mut self, sequence: &dyn Sequence, last_logits: &[f32]) {
        if !self.enabled() {
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
