//! Which routed expert sits in which VRAM slot: pure bookkeeping, no GPU.
//!
//! Per layer in decode the router's chosen experts come back to the host, [`ExpertSlotCache::
//! lookup_or_assign`] says for each whether it is resident (hit) or which slot to upload it into
//! (miss), and the same expert kernel then runs on the slots — so results never depend on placement.
//!
//! Eviction is least-recently-used and fully deterministic: every call is one tick of a logical
//! clock (never wall time), ties between slots last used in the same tick go to the smallest
//! (layer, expert), and empty slots are filled lowest index first. The experts of the current
//! request are pinned: a request never evicts one of its own experts, so one layer's ten experts
//! are all resident when its kernel runs.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::path::Path;

/// One routed expert: (layer, expert index).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ExpertKey {
    pub layer: u32,
    pub expert: u32,
}

impl ExpertKey {
    pub fn new(layer: u32, expert: u32) -> ExpertKey {
        ExpertKey { layer, expert }
    }
}

impl fmt::Display for ExpertKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "layer {} expert {}", self.layer, self.expert)
    }
}

/// The slot an expert of a request sits in, and whether it was already there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotAssignment {
    pub key: ExpertKey,
    pub slot: u32,
    /// True when the expert was resident before this request; false means "upload it into `slot`".
    pub hit: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExpertCacheError {
    #[error(
        "a request needs {wanted} different experts resident at once but the cache has only \
         {n_slots} slots"
    )]
    TooManyExperts { wanted: usize, n_slots: usize },
    #[error("{key} is outside the model ({n_layers} layers with experts)")]
    UnknownLayer { key: ExpertKey, n_layers: usize },
    #[error("expert profile {file}, line {line}: {problem}")]
    BadProfile {
        file: String,
        line: usize,
        problem: String,
    },
    #[error("expert profile {file}: {error}")]
    ProfileIo { file: String, error: String },
}

/// Cache counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExpertCacheStats {
    pub hits: u64,
    pub misses: u64,
    /// Bytes the misses uploaded (sum of the missed experts' sizes).
    pub bytes_uploaded: u64,
    /// Experts placed by [`ExpertSlotCache::preload`], and their bytes.
    pub preloaded: u64,
    pub bytes_preloaded: u64,
}

impl ExpertCacheStats {
    /// Hits / (hits + misses); 0 before any request.
    pub fn hit_rate(&self) -> f64 {
        let total = self.hits + self.misses;
        if total == 0 {
            0.0
        } else {
            self.hits as f64 / total as f64
        }
    }
}

/// The slot table: (layer, expert) → slot, with LRU eviction.
#[derive(Debug, Clone)]
pub struct ExpertSlotCache {
    n_slots: usize,
    /// Bytes of one expert, per layer (indexed by layer number).
    expert_bytes_per_layer: Vec<u64>,
    resident: HashMap<ExpertKey, (u32, u64)>,
    /// (last-use tick, key) of every resident expert, least recently used first.
    by_age: BTreeSet<(u64, ExpertKey)>,
    /// Empty slots, lowest first.
    free: BTreeSet<u32>,
    clock: u64,
    stats: ExpertCacheStats,
    /// (hits, misses) per layer, indexed by layer number.
    per_layer: Vec<(u64, u64)>,
}

impl ExpertSlotCache {
    /// A cache of `n_slots` empty slots. `expert_bytes_per_layer[layer]` is the size of one expert
    /// of that layer (for the upload statistics; layers with no experts can hold 0).
    pub fn new(n_slots: usize, expert_bytes_per_layer: Vec<u64>) -> ExpertSlotCache {
        // Slot indices are u32 on the GPU side; more than 4 Gi slots cannot exist.
        let n_slots = n_slots.min(u32::MAX as usize);
        ExpertSlotCache {
            n_slots,
            expert_bytes_per_layer,
            resident: HashMap::new(),
            by_age: BTreeSet::new(),
            free: (0..n_slots as u32).collect(),
            clock: 0,
            stats: ExpertCacheStats::default(),
            per_layer: Vec::new(),
        }
    }

    pub fn n_slots(&self) -> usize {
        self.n_slots
    }

    pub fn stats(&self) -> ExpertCacheStats {
        self.stats
    }

    /// (hits, misses) per layer since the cache was made, indexed by layer number (layers never
    /// asked for have (0, 0) or lie past the end).
    pub fn per_layer(&self) -> &[(u64, u64)] {
        &self.per_layer
    }

    fn count(&mut self, layer: u32, hit: bool) {
        let l = layer as usize;
        if self.per_layer.len() <= l {
            self.per_layer.resize(l + 1, (0, 0));
        }
        if let Some(entry) = self.per_layer.get_mut(l) {
            if hit {
                entry.0 += 1;
            } else {
                entry.1 += 1;
            }
        }
    }

    /// The slot of `key` if it is resident (does not count as a use).
    pub fn slot_of(&self, key: ExpertKey) -> Option<u32> {
        self.resident.get(&key).map(|&(slot, _)| slot)
    }

    /// Number of resident experts.
    pub fn len(&self) -> usize {
        self.resident.len()
    }

    pub fn is_empty(&self) -> bool {
        self.resident.is_empty()
    }

    /// Resident experts and their slots, in key order.
    pub fn residents(&self) -> Vec<(ExpertKey, u32)> {
        let mut all: Vec<(ExpertKey, u32)> = self
            .resident
            .iter()
            .map(|(&key, &(slot, _))| (key, slot))
            .collect();
        all.sort_unstable();
        all
    }

    fn expert_bytes(&self, key: ExpertKey) -> Result<u64, ExpertCacheError> {
        self.expert_bytes_per_layer
            .get(key.layer as usize)
            .copied()
            .ok_or(ExpertCacheError::UnknownLayer {
                key,
                n_layers: self.expert_bytes_per_layer.len(),
            })
    }

    /// Make every expert of `wanted` resident, one assignment per entry of `wanted` (in order;
    /// a key listed twice gets the same slot and the same `hit`). Experts already resident are
    /// hits; the others take an empty slot or evict the least recently used expert that is not
    /// part of this request. On error nothing changes.
    pub fn lookup_or_assign(
        &mut self,
        wanted: &[ExpertKey],
    ) -> Result<Vec<SlotAssignment>, ExpertCacheError> {
        let unique: BTreeSet<ExpertKey> = wanted.iter().copied().collect();
        if unique.len() > self.n_slots {
            return Err(ExpertCacheError::TooManyExperts {
                wanted: unique.len(),
                n_slots: self.n_slots,
            });
        }
        let mut sizes = HashMap::with_capacity(unique.len());
        for &key in &unique {
            sizes.insert(key, self.expert_bytes(key)?);
        }
        self.clock += 1;
        let now = self.clock;
        // Pin: stamp every resident expert of the request with `now` first, so the eviction
        // below (which only takes entries older than `now`) cannot pick one of them.
        let mut outcome: HashMap<ExpertKey, (u32, bool)> = HashMap::with_capacity(unique.len());
        for &key in &unique {
            if let Some(entry) = self.resident.get_mut(&key) {
                self.by_age.remove(&(entry.1, key));
                entry.1 = now;
                self.by_age.insert((now, key));
                outcome.insert(key, (entry.0, true));
            }
        }
        // Misses in key order, so the slots they get do not depend on the order of `wanted`.
        for &key in &unique {
            if outcome.contains_key(&key) {
                continue;
            }
            let slot = match self.free.pop_first() {
                Some(slot) => slot,
                None => {
                    // At most n_slots unique keys, all stamped `now` once placed, so an older
                    // entry exists whenever no slot is free.
                    // Checked above, so this cannot fail; answering with the same error rather
                    // than panicking keeps a bookkeeping bug from taking the server down.
                    let Some(&(age, victim)) = self.by_age.first().filter(|(age, _)| *age < now)
                    else {
                        return Err(ExpertCacheError::TooManyExperts {
                            wanted: unique.len(),
                            n_slots: self.n_slots,
                        });
                    };
                    self.by_age.remove(&(age, victim));
                    let (slot, _) = self.resident.remove(&victim).unwrap_or((0, 0));
                    slot
                }
            };
            self.resident.insert(key, (slot, now));
            self.by_age.insert((now, key));
            outcome.insert(key, (slot, false));
            self.stats.misses += 1;
            self.stats.bytes_uploaded += sizes.get(&key).copied().unwrap_or(0);
        }
        self.stats.hits += outcome.values().filter(|(_, hit)| *hit).count() as u64;
        let counted: Vec<(u32, bool)> = outcome
            .iter()
            .map(|(k, (_, hit))| (k.layer, *hit))
            .collect();
        for (layer, hit) in counted {
            self.count(layer, hit);
        }
        Ok(wanted
            .iter()
            .map(|&key| {
                let (slot, hit) = outcome.get(&key).copied().unwrap_or((0, false));
                SlotAssignment { key, slot, hit }
            })
            .collect())
    }

    /// Empty the cache and fill it with the profile's most used experts (at most one per slot),
    /// hottest first into the lowest slots. The hottest expert is also the most recently used, so
    /// LRU evicts the coldest preloaded experts first. Returns what to upload; statistics of
    /// hits and misses are not touched.
    pub fn preload(
        &mut self,
        profile: &ExpertProfile,
    ) -> Result<Vec<SlotAssignment>, ExpertCacheError> {
        let chosen = profile.top_n(self.n_slots);
        let mut sizes = Vec::with_capacity(chosen.len());
        for &key in &chosen {
            sizes.push(self.expert_bytes(key)?);
        }
        self.resident.clear();
        self.by_age.clear();
        self.free = (0..self.n_slots as u32).collect();
        let n = chosen.len() as u64;
        let mut placed = Vec::with_capacity(chosen.len());
        for (rank, (&key, bytes)) in chosen.iter().zip(sizes).enumerate() {
            let Some(slot) = self.free.pop_first() else {
                break;
            };
            // Rank 0 gets the newest stamp n, the coldest stamp 1.
            let stamp = self.clock + n - rank as u64;
            self.resident.insert(key, (slot, stamp));
            self.by_age.insert((stamp, key));
            self.stats.preloaded += 1;
            self.stats.bytes_preloaded += bytes;
            placed.push(SlotAssignment {
                key,
                slot,
                hit: false,
            });
        }
        self.clock += n;
        Ok(placed)
    }
}

/// How often each (layer, expert) was routed to: the start-up fill of the slots.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExpertProfile {
    counts: BTreeMap<ExpertKey, u64>,
}

const PROFILE_HEADER: &str = "# strata expert profile v1: layer expert count";

impl ExpertProfile {
    pub fn new() -> ExpertProfile {
        ExpertProfile::default()
    }

    /// The default without a measured profile: every layer gets the same share of slots, filled
    /// with experts in index order (layer 0..L expert 0 first, then expert 1, …).
    pub fn uniform(n_layers: u32, n_experts: u32) -> ExpertProfile {
        let mut profile = ExpertProfile::new();
        for layer in 0..n_layers {
            for expert in 0..n_experts {
                // Lower expert index = higher count; equal counts across layers tie-break by layer.
                profile
                    .counts
                    .insert(ExpertKey::new(layer, expert), u64::from(n_experts - expert));
            }
        }
        profile
    }

    pub fn record(&mut self, key: ExpertKey) {
        self.add(key, 1);
    }

    pub fn record_all(&mut self, keys: &[ExpertKey]) {
        for &key in keys {
            self.record(key);
        }
    }

    pub fn add(&mut self, key: ExpertKey, count: u64) {
        let entry = self.counts.entry(key).or_insert(0);
        *entry = entry.saturating_add(count);
    }

    pub fn count(&self, key: ExpertKey) -> u64 {
        self.counts.get(&key).copied().unwrap_or(0)
    }

    /// Distinct experts with a count.
    pub fn len(&self) -> usize {
        self.counts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// The `n` most used experts: by count descending, ties by (layer, expert) ascending.
    pub fn top_n(&self, n: usize) -> Vec<ExpertKey> {
        let mut all: Vec<(u64, ExpertKey)> = self
            .counts
            .iter()
            .filter(|&(_, &count)| count > 0)
            .map(|(&key, &count)| (count, key))
            .collect();
        all.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        all.into_iter().take(n).map(|(_, key)| key).collect()
    }

    /// The `slots` most used experts (as [`Self::top_n`]) of `n_layers` layers of `n_expert`
    /// experts, per layer, in ascending expert order: what a static VRAM copy of the hot
    /// experts holds.
    pub fn hot_sets(&self, n_layers: usize, n_expert: usize, slots: usize) -> Vec<Vec<u32>> {
        let mut sets = vec![Vec::new(); n_layers];
        let valid = self
            .top_n(usize::MAX)
            .into_iter()
            .filter(|k| (k.layer as usize) < n_layers && (k.expert as usize) < n_expert);
        for key in valid.take(slots) {
            sets[key.layer as usize].push(key.expert);
        }
        for set in &mut sets {
            set.sort_unstable();
        }
        sets
    }

    /// The profile as text: a header line, then `layer expert count` per line in key order.
    pub fn to_text(&self) -> String {
        let mut text = String::with_capacity(16 * self.counts.len() + PROFILE_HEADER.len() + 1);
        text.push_str(PROFILE_HEADER);
        text.push('\n');
        for (key, count) in &self.counts {
            text.push_str(&format!("{} {} {count}\n", key.layer, key.expert));
        }
        text
    }

    /// Parse [`to_text`](Self::to_text) output. Blank lines and `#` comments are ignored; the same
    /// expert on several lines adds up. `file` names the source in errors.
    pub fn from_text(file: &str, text: &str) -> Result<ExpertProfile, ExpertCacheError> {
        let mut profile = ExpertProfile::new();
        for (index, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |problem: String| ExpertCacheError::BadProfile {
                file: file.to_string(),
                line: index + 1,
                problem,
            };
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [layer, expert, count] = fields.as_slice() else {
                return Err(bad(format!(
                    "expected `layer expert count`, found {line:?}"
                )));
            };
            let layer: u32 = layer
                .parse()
                .map_err(|_| bad(format!("layer {layer:?} is not a number")))?;
            let expert: u32 = expert
                .parse()
                .map_err(|_| bad(format!("expert {expert:?} is not a number")))?;
            let count: u64 = count
                .parse()
                .map_err(|_| bad(format!("count {count:?} is not a number")))?;
            profile.add(ExpertKey::new(layer, expert), count);
        }
        Ok(profile)
    }

    pub fn save(&self, path: impl AsRef<Path>) -> Result<(), ExpertCacheError> {
        let path = path.as_ref();
        std::fs::write(path, self.to_text()).map_err(|e| ExpertCacheError::ProfileIo {
            file: path.display().to_string(),
            error: e.to_string(),
        })
    }

    pub fn load(path: impl AsRef<Path>) -> Result<ExpertProfile, ExpertCacheError> {
        let path = path.as_ref();
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ExpertCacheError::ProfileIo {
            file: file.clone(),
            error: e.to_string(),
        })?;
        ExpertProfile::from_text(&file, &text)
    }
}
