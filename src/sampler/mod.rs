//! Turning one row of logits into one token id.
//!
//! Order of operations (fixed, so a GPU kernel can reproduce it bit for bit):
//! 1. penalties: repetition (over prompt + generated tokens, CTRL style: a positive logit is divided
//!    by the penalty, a negative one multiplied), then frequency (`count × f`) and presence (`p` once)
//!    over the generated tokens only (OpenAI semantics);
//! 2. temperature: `temperature == 0` ⇒ greedy argmax of the penalised logits, lowest id on ties;
//!    otherwise the logits are divided by the temperature (inside the exponent, see below);
//! 3. candidates sorted by (logit descending, id ascending) — a total order, so ties are deterministic;
//! 4. top-k (0 = off), 5. top-p (smallest prefix whose probability mass reaches `top_p`),
//! 6. min-p (drop tokens whose probability is below `min_p × p_max`),
//! 7. sample: one uniform `u` from [`uniform`] keyed by (seed, absolute position); walk the kept
//!    candidates in sorted order until the cumulative (unnormalised) mass exceeds `u × total`.
//!
//! Unnormalised probabilities are `exp((l - l_max) / T)` computed in f64 (so a tiny temperature
//! cannot overflow), truncated to multiples of 2⁻¹⁰⁰ and summed as integers (`mass`): exact, so
//! the sums do not depend on their order. `top_p` and `u` are taken as multiples of 2⁻⁵³, and the
//! targets `top_p × total` and `u × total` are rounded down. The min-p threshold is
//! `min_p × p_max` as a mass, rounded down the same way.

pub mod logprobs;
mod mass;
mod select;

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{BuildHasher, Hasher};

/// Model defaults used when a GGUF carries no `general.sampling.*` keys: the values Qwen publishes
/// for thinking mode. Never greedy by default (greedy decoding is what made the original loop).
pub const DEFAULT_TEMPERATURE: f32 = 0.6;
pub const DEFAULT_TOP_P: f32 = 0.95;
pub const DEFAULT_TOP_K: usize = 20;

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SamplingParams {
    /// 0 ⇒ greedy.
    pub temperature: f32,
    /// 0 ⇒ no top-k cut.
    pub top_k: usize,
    /// 1 ⇒ no nucleus cut.
    pub top_p: f32,
    /// 0 ⇒ no min-p cut.
    pub min_p: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    /// 1 ⇒ off.
    pub repetition_penalty: f32,
    /// None ⇒ a seed is drawn from the OS per request (and reported back).
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: DEFAULT_TEMPERATURE,
            top_k: DEFAULT_TOP_K,
            top_p: DEFAULT_TOP_P,
            min_p: 0.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            seed: None,
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SamplerError {
    #[error("invalid sampling parameter: {0}")]
    InvalidParam(String),
    #[error("non-finite logit {value} for token {token} at position {position} (sampler input)")]
    NonFiniteLogit {
        token: u32,
        value: f32,
        position: usize,
    },
    #[error("empty logits row")]
    EmptyLogits,
    #[error("the output constraint allows no token at position {position}")]
    NothingAllowed { position: usize },
}

/// The GGUF keys llama.cpp's `gguf-py` writes for a model author's sampling defaults.
pub mod gguf_keys {
    pub const TEMPERATURE: &str = "general.sampling.temp";
    pub const TOP_K: &str = "general.sampling.top_k";
    pub const TOP_P: &str = "general.sampling.top_p";
    pub const MIN_P: &str = "general.sampling.min_p";
    pub const REPETITION_PENALTY: &str = "general.sampling.penalty_repeat";
}

impl SamplingParams {
    /// Defaults from a metadata lookup (`general.sampling.*` as a number), falling back to
    /// temperature 0.6, top-p 0.95, top-k 20. Values that fail validation are ignored (with a
    /// warning) rather than turning a bad file into a bad default.
    pub fn from_metadata(lookup: impl Fn(&str) -> Option<f64>) -> SamplingParams {
        let mut params = SamplingParams::default();
        let apply = |key: &str, set: &mut dyn FnMut(f64)| {
            if let Some(v) = lookup(key) {
                if v.is_finite() {
                    set(v);
                } else {
                    tracing::warn!("ignoring non-finite GGUF sampling default {key} = {v}");
                }
            }
        };
        apply(gguf_keys::TEMPERATURE, &mut |v| {
            params.temperature = v as f32
        });
        apply(gguf_keys::TOP_K, &mut |v| {
            params.top_k = v.max(0.0) as usize
        });
        apply(gguf_keys::TOP_P, &mut |v| params.top_p = v as f32);
        apply(gguf_keys::MIN_P, &mut |v| params.min_p = v as f32);
        apply(gguf_keys::REPETITION_PENALTY, &mut |v| {
            params.repetition_penalty = v as f32
        });
        if let Err(e) = params.validate() {
            tracing::warn!("GGUF sampling defaults rejected ({e}); using built-in defaults");
            return SamplingParams::default();
        }
        params
    }

    /// Defaults for a model: its GGUF `general.sampling.*` keys where present.
    pub fn model_defaults(gguf: &crate::gguf::Gguf) -> SamplingParams {
        SamplingParams::from_metadata(|key| gguf.get(key).and_then(|v| v.as_f64()))
    }

    /// Reject values that make no sense instead of silently clamping them.
    pub fn validate(&self) -> Result<(), SamplerError> {
        let bad = |m: String| Err(SamplerError::InvalidParam(m));
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return bad(format!("temperature must be ≥ 0, got {}", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad(format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        if !self.repetition_penalty.is_finite() || self.repetition_penalty <= 0.0 {
            return bad(format!(
                "repetition_penalty must be > 0, got {}",
                self.repetition_penalty
            ));
        }
        for (name, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !v.is_finite() || !(-2.0..=2.0).contains(&v) {
                return bad(format!("{name} must be in [-2, 2], got {v}"));
            }
        }
        Ok(())
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }
}

/// Most candidates a top-only pass hands the sampler (see [`Sampler::top_only`]; the GPU's list).
pub const MAX_TOP_CANDIDATES: usize = 64;

/// The first `k` tokens of `row` in candidate order (step 3: logit descending, id ascending), as
/// (id, logit), skipping `-inf`: what a top-only pass returns for a row.
pub fn top_candidates(row: &[f32], k: usize) -> Vec<(u32, f32)> {
    select::first_candidates(row, k)
}

/// splitmix64's output function (Steele, Lea, Flood 2014).
pub fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The one random number used to sample the token at absolute `position` (0-based index the token
/// will have in the sequence) under `seed`:
///
/// `bits = splitmix64(splitmix64(seed) ^ position)`; `u = (bits >> 11) × 2⁻⁵³` ∈ [0, 1).
///
/// Counter-based (no state carried between tokens), so a seed reproduces its tokens however
/// requests are batched, resumed from the prompt cache or split across devices.
pub fn uniform(seed: u64, position: u64) -> f64 {
    let bits = splitmix64(splitmix64(seed) ^ position);
    (bits >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// A fresh seed from the OS's randomness (std's `RandomState` is seeded from it), for requests
/// that do not give one. The seed is reported back so the output can be reproduced.
pub fn random_seed() -> u64 {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0),
    );
    hasher.finish()
}

/// One request's sampler: the parameters, the resolved seed and the token history penalties need.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    seed: u64,
    /// Prompt and generated tokens seen (repetition penalty).
    seen: BTreeSet<u32>,
    /// Generated tokens and how often each was generated (presence / frequency penalties).
    generated: BTreeMap<u32, u32>,
}

impl Sampler {
    /// Validates `params`, resolves the seed and records the prompt for the repetition penalty.
    pub fn new(params: &SamplingParams, prompt: &[u32]) -> Result<Sampler, SamplerError> {
        params.validate()?;
        let seen = if params.repetition_penalty != 1.0 {
            prompt.iter().copied().collect()
        } else {
            BTreeSet::new()
        };
        Ok(Sampler {
            params: params.clone(),
            seed: params.seed.unwrap_or_else(random_seed),
            seen,
            generated: BTreeMap::new(),
        })
    }

    /// The seed actually used (the client's, or the one drawn for it).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Record a token as generated (done by [`Sampler::sample`]; public for forced tokens).
    pub fn accept(&mut self, token: u32) {
        *self.generated.entry(token).or_insert(0) += 1;
        if self.params.repetition_penalty != 1.0 {
            self.seen.insert(token);
        }
    }

    /// Pick the token at absolute `position` from one row of logits, and record it.
    pub fn sample(&mut self, logits: &[f32], position: usize) -> Result<u32, SamplerError> {
        let token = self.pick(logits, position)?;
        self.accept(token);
        Ok(token)
    }

    /// Like [`Sampler::sample`], choosing only among tokens whose `allowed` entry is true (a
    /// structured-output mask). The mask is applied after the penalties and before temperature,
    /// top-k, top-p and min-p, so the cuts work within the allowed tokens.
    pub fn sample_masked(
        &mut self,
        logits: &[f32],
        position: usize,
        allowed: Option<&[bool]>,
    ) -> Result<u32, SamplerError> {
        let token = self.pick_masked(logits, position, allowed)?;
        self.accept(token);
        Ok(token)
    }

    /// `Some(k)` when the token depends only on the first `k` candidates of the raw logits row,
    /// `k` at most [`MAX_TOP_CANDIDATES`]: sampling (not greedy) with a top-k cut and no penalty.
    /// A backend may then return just those candidates (`Sequence::feed_top`, found on the GPU),
    /// and [`Sampler::sample_top`] picks the token [`Sampler::sample`] would pick from the row.
    pub fn top_only(&self) -> Option<usize> {
        let p = &self.params;
        let no_penalty =
            p.repetition_penalty == 1.0 && p.frequency_penalty == 0.0 && p.presence_penalty == 0.0;
        let k = p.top_k;
        (!p.is_greedy() && no_penalty && (1..=MAX_TOP_CANDIDATES).contains(&k)).then_some(k)
    }

    /// Like [`Sampler::sample`], from the first candidates of the row in candidate order (at least
    /// the `k` of [`Sampler::top_only`], or every live token when the row has fewer), and record
    /// it: the same steps on the same values, so the same token.
    pub fn sample_top(&mut self, top: &[(u32, f32)], position: usize) -> Result<u32, SamplerError> {
        let Some(k) = self.top_only() else {
            return Err(SamplerError::InvalidParam(format!(
                "sampling from the first candidates needs a top-k cut of 1 to \
                 {MAX_TOP_CANDIDATES} and no penalty"
            )));
        };
        if top.is_empty() {
            return Err(SamplerError::EmptyLogits);
        }
        if let Some(&(token, value)) = top.iter().find(|c| !c.1.is_finite()) {
            return Err(SamplerError::NonFiniteLogit {
                token,
                value,
                position,
            });
        }
        let inv_temperature = 1.0 / self.params.temperature as f64;
        let kept = self.kept(&top[..k.min(top.len())], inv_temperature);
        let token = draw(&kept, uniform(self.seed, position as u64));
        self.accept(token);
        Ok(token)
    }

    /// Pick without recording.
    pub fn pick(&self, logits: &[f32], position: usize) -> Result<u32, SamplerError> {
        self.pick_masked(logits, position, None)
    }

    /// Pick among the allowed tokens without recording.
    pub fn pick_masked(
        &self,
        logits: &[f32],
        position: usize,
        allowed: Option<&[bool]>,
    ) -> Result<u32, SamplerError> {
        if logits.is_empty() {
            return Err(SamplerError::EmptyLogits);
        }
        if let Some((i, v)) = logits.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(SamplerError::NonFiniteLogit {
                token: i as u32,
                value: *v,
                position,
            });
        }
        let mut row = logits.to_vec();
        self.apply_penalties(&mut row);
        if let Some(allowed) = allowed {
            apply_mask(&mut row, allowed, position)?;
        }
        if self.params.is_greedy() {
            return Ok(argmax(&row));
        }
        let inv_temperature = 1.0 / self.params.temperature as f64;
        let candidates = self.candidates(&row, inv_temperature);
        let u = uniform(self.seed, position as u64);
        Ok(draw(&candidates, u))
    }

    fn apply_penalties(&self, row: &mut [f32]) {
        let p = &self.params;
        if p.repetition_penalty != 1.0 {
            for &t in &self.seen {
                if let Some(l) = row.get_mut(t as usize) {
                    *l = if *l > 0.0 {
                        *l / p.repetition_penalty
                    } else {
                        *l * p.repetition_penalty
                    };
                }
            }
        }
        if p.frequency_penalty != 0.0 || p.presence_penalty != 0.0 {
            for (&t, &count) in &self.generated {
                if let Some(l) = row.get_mut(t as usize) {
                    *l -= count as f32 * p.frequency_penalty + p.presence_penalty;
                }
            }
        }
    }

    /// Steps 2–6: temperature, sort, top-k, top-p, min-p. Returns the kept candidates as (id,
    /// mass) in candidate order, never empty.
    ///
    /// With a top-k cut only those `k` tokens are sorted. Without one, the total mass is summed
    /// over every token in id order (masses are exact integers, see [`mass`]) and sorted prefixes
    /// of growing length are taken until the top-p and min-p cuts fall inside them: a peaked
    /// distribution needs a few dozen sorted tokens, a flat one the whole vocabulary.
    fn candidates(&self, row: &[f32], inv_temperature: f64) -> Vec<(u32, u128)> {
        let p = &self.params;
        if p.top_k > 0 {
            return self.kept(&select::first_candidates(row, p.top_k), inv_temperature);
        }
        // No cut at all (pure temperature): every token is a candidate, sorted.
        let uncut = p.top_p >= 1.0 && p.min_p <= 0.0;
        let mut prefix_len = if uncut { 0 } else { FIRST_PREFIX };
        let mut total_of_all = None;
        loop {
            let ids = select::first_candidates(row, prefix_len);
            // Every candidate is in `ids` when nothing was left out.
            let whole = ids.len() < prefix_len || prefix_len == 0;
            let max = f64::from(ids.first().map_or(0.0, |c| c.1));
            let mut masses: Vec<(u32, u128)> = ids
                .iter()
                .map(|&(id, l)| (id, mass::mass(l, max, inv_temperature)))
                .collect();
            let total: u128 = if whole {
                masses.iter().map(|c| c.1).sum()
            } else {
                *total_of_all.get_or_insert_with(|| {
                    row.iter()
                        .filter(|l| **l != f32::NEG_INFINITY)
                        .map(|&l| mass::mass(l, max, inv_temperature))
                        .sum()
                })
            };
            if let Some(keep) = self.cut(&masses, total, whole) {
                masses.truncate(keep);
                return masses;
            }
            // The cuts fall past this prefix: take a longer one (0 = all).
            prefix_len = match prefix_len.saturating_mul(8) {
                n if n >= row.len() => 0,
                n => n,
            };
        }
    }

    /// Steps 4–6 once the first candidates are known (`ids`, in candidate order: all of them, or
    /// the top-k cut's): their masses, then the top-p and min-p cuts.
    fn kept(&self, ids: &[(u32, f32)], inv_temperature: f64) -> Vec<(u32, u128)> {
        let max = f64::from(ids.first().map_or(0.0, |c| c.1));
        let mut masses: Vec<(u32, u128)> = ids
            .iter()
            .map(|&(id, l)| (id, mass::mass(l, max, inv_temperature)))
            .collect();
        let total: u128 = masses.iter().map(|c| c.1).sum();
        let keep = self.cut(&masses, total, true).unwrap_or(masses.len());
        masses.truncate(keep);
        masses
    }

    /// Steps 5 and 6 on the sorted `masses` (a prefix of the candidates, or all of them when
    /// `whole`) of total mass `total`: how many to keep (at least 1), or `None` when a cut needs
    /// candidates past the prefix.
    fn cut(&self, masses: &[(u32, u128)], total: u128, whole: bool) -> Option<usize> {
        let p = &self.params;
        let mut keep = masses.len();
        if p.top_p < 1.0 {
            let target = mass::scale(mass::q53(f64::from(p.top_p)), total);
            let mut cumulative = 0u128;
            let reached = masses.iter().position(|c| {
                cumulative += c.1;
                cumulative >= target
            });
            match reached {
                Some(i) => keep = i + 1,
                None if !whole => return None,
                None => {}
            }
        }
        if p.min_p > 0.0 {
            // The first candidate has probability exp(0) = 1 relative to itself.
            let threshold = mass::mass_of_probability(f64::from(p.min_p));
            let below = masses[..keep].iter().position(|c| c.1 < threshold);
            match below {
                Some(i) => keep = i,
                None if !whole && keep == masses.len() => return None,
                None => {}
            }
        } else if !whole && keep == masses.len() {
            return None;
        }
        Some(keep.max(1))
    }
}

/// Length of the first sorted prefix taken when there is no top-k cut.
const FIRST_PREFIX: usize = 64;

/// Set the logits of tokens the mask forbids (and of ids past its end) to -inf.
fn apply_mask(row: &mut [f32], allowed: &[bool], position: usize) -> Result<(), SamplerError> {
    let mut any = false;
    for (i, l) in row.iter_mut().enumerate() {
        if allowed.get(i).copied().unwrap_or(false) {
            any = true;
        } else {
            *l = f32::NEG_INFINITY;
        }
    }
    if any {
        Ok(())
    } else {
        Err(SamplerError::NothingAllowed { position })
    }
}

/// Greedy pick: highest logit, lowest id among equals.
pub fn argmax(row: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

fn draw(candidates: &[(u32, u128)], u: f64) -> u32 {
    let total: u128 = candidates.iter().map(|c| c.1).sum();
    let target = mass::scale(mass::q53(u), total);
    let mut cumulative = 0u128;
    for c in candidates {
        cumulative += c.1;
        if cumulative > target {
            return c.0;
        }
    }
    candidates.last().map(|c| c.0).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_k: usize, top_p: f32, min_p: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            top_k,
            top_p,
            min_p,
            seed: Some(7),
            ..SamplingParams::default()
        }
    }

    /// Sampling from the first candidates (what the GPU hands back) picks the token sampling
    /// from the whole row picks, and records it the same way: random rows with ties and signed
    /// zeros, top-k from 1 to the list's 64, with and without top-p and min-p, rows shorter than
    /// the cut; and samplers the shortcut does not apply to say so.
    #[test]
    fn sampling_from_the_first_candidates_equals_sampling_from_the_row() {
        let mut state = 0x0123_4567_89ab_cdefu64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut checked = 0;
        for case in 0..400 {
            let n = [3usize, 50, 1000, 20_000][case % 4];
            let levels = 2 + next() % 300;
            let row: Vec<f32> = (0..n)
                .map(|_| match next() % 11 {
                    0 => -0.0,
                    1 => 0.0,
                    r => ((r * 7919 + next() % levels) % levels) as f32 * 0.05 - 3.0,
                })
                .collect();
            let top_k = 1 + (next() % MAX_TOP_CANDIDATES as u64) as usize;
            let top_p = [1.0, 0.95, 0.5, 0.1][case % 3];
            let min_p = [0.0, 0.05, 0.3][(case / 3) % 3];
            let temperature = [0.6, 1.0, 0.05, 2.0][(case / 2) % 4];
            let mut p = params(temperature, top_k, top_p, min_p);
            p.seed = Some(next());
            let mut whole = Sampler::new(&p, &[]).unwrap();
            let mut short = Sampler::new(&p, &[]).unwrap();
            assert_eq!(short.top_only(), Some(top_k));
            let top = top_candidates(&row, MAX_TOP_CANDIDATES);
            for position in [0, 17, 40_000] {
                let want = whole.sample(&row, position).unwrap();
                let got = short.sample_top(&top, position).unwrap();
                assert_eq!(got, want, "case {case}, position {position}");
                checked += 1;
            }
            assert_eq!(short.generated, whole.generated, "case {case}");
        }
        assert_eq!(checked, 1200);
        for p in [
            params(0.0, 20, 0.95, 0.0),
            params(0.6, 0, 0.95, 0.0),
            params(0.6, MAX_TOP_CANDIDATES + 1, 1.0, 0.0),
            SamplingParams {
                repetition_penalty: 1.1,
                ..params(0.6, 20, 0.95, 0.0)
            },
            SamplingParams {
                presence_penalty: 0.5,
                ..params(0.6, 20, 0.95, 0.0)
            },
        ] {
            let mut s = Sampler::new(&p, &[1, 2]).unwrap();
            assert_eq!(s.top_only(), None, "{p:?}");
            assert!(s.sample_top(&[(0, 1.0)], 0).is_err(), "{p:?}");
        }
    }

    #[test]
    fn greedy_prefers_lowest_id_on_ties() {
        let s = Sampler::new(&params(0.0, 0, 1.0, 0.0), &[]).unwrap();
        assert_eq!(s.pick(&[0.5, 2.0, 2.0, 1.0], 0).unwrap(), 1);
    }

    #[test]
    fn uniform_is_in_unit_interval_and_keyed_by_position() {
        let a = uniform(1, 0);
        let b = uniform(1, 1);
        let c = uniform(2, 0);
        assert!((0.0..1.0).contains(&a));
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_eq!(a, uniform(1, 0));
    }

    #[test]
    fn top_k_one_is_greedy() {
        let s = Sampler::new(&params(1.0, 1, 1.0, 0.0), &[]).unwrap();
        for pos in 0..50 {
            assert_eq!(s.pick(&[0.1, 0.3, 0.2], pos).unwrap(), 1);
        }
    }

    #[test]
    fn min_p_cuts_unlikely_tokens() {
        // p(0) ∝ 1, p(1) ∝ e^-5 ≈ 0.0067 < 0.1 × p(0).
        let s = Sampler::new(&params(1.0, 0, 1.0, 0.1), &[]).unwrap();
        for pos in 0..200 {
            assert_eq!(s.pick(&[5.0, 0.0], pos).unwrap(), 0);
        }
    }

    #[test]
    fn tiny_temperature_behaves_like_greedy_instead_of_overflowing() {
        let s = Sampler::new(&params(1e-30, 0, 1.0, 0.0), &[]).unwrap();
        for pos in 0..100 {
            assert_eq!(s.pick(&[1e30, 3e30, 2e30], pos).unwrap(), 1);
        }
    }

    #[test]
    fn mask_restricts_greedy_and_sampled_picks() {
        let logits = [3.0, 2.0, 1.0, 0.5];
        let allowed = [false, false, true, true];
        let greedy = Sampler::new(&params(0.0, 0, 1.0, 0.0), &[]).unwrap();
        assert_eq!(greedy.pick_masked(&logits, 0, Some(&allowed)).unwrap(), 2);
        let hot = Sampler::new(&params(2.0, 0, 1.0, 0.0), &[]).unwrap();
        for pos in 0..100 {
            let t = hot.pick_masked(&logits, pos, Some(&allowed)).unwrap();
            assert!(t == 2 || t == 3, "picked masked-out token {t}");
        }
        let none = [false; 4];
        assert_eq!(
            hot.pick_masked(&logits, 9, Some(&none)),
            Err(SamplerError::NothingAllowed { position: 9 })
        );
    }

    #[test]
    fn rejects_non_finite_logits() {
        let s = Sampler::new(&params(1.0, 0, 1.0, 0.0), &[]).unwrap();
        let err = s.pick(&[0.0, f32::NAN], 3).unwrap_err();
        assert!(matches!(
            err,
            SamplerError::NonFiniteLogit {
                token: 1,
                position: 3,
                ..
            }
        ));
    }

    #[test]
    fn metadata_defaults_are_read_and_fall_back() {
        let p = SamplingParams::from_metadata(|k| match k {
            gguf_keys::TEMPERATURE => Some(1.0),
            gguf_keys::TOP_K => Some(40.0),
            _ => None,
        });
        assert_eq!(p.temperature, 1.0);
        assert_eq!(p.top_k, 40);
        assert_eq!(p.top_p, DEFAULT_TOP_P);
        let none = SamplingParams::from_metadata(|_| None);
        assert_eq!(none, SamplingParams::default());
        assert!(!none.is_greedy());
    }
}
