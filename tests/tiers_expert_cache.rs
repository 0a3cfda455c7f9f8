//! Expert slot bookkeeping: LRU order, tie-breaks, pinning, determinism against a reference model,
//! preload from a profile and the profile file round trip.

use strata::tiers::expert_cache::ExpertCacheStats;
use strata::tiers::{ExpertCacheError, ExpertKey, ExpertProfile, ExpertSlotCache};

fn key(layer: u32, expert: u32) -> ExpertKey {
    ExpertKey::new(layer, expert)
}

/// (slot, hit) per wanted key.
fn assign(cache: &mut ExpertSlotCache, wanted: &[ExpertKey]) -> Vec<(u32, bool)> {
    cache
        .lookup_or_assign(wanted)
        .expect("request fits")
        .iter()
        .map(|a| (a.slot, a.hit))
        .collect()
}

#[test]
fn least_recently_used_expert_is_evicted() {
    let mut cache = ExpertSlotCache::new(3, vec![100, 200]);
    assert_eq!(assign(&mut cache, &[key(0, 0)]), [(0, false)]);
    assert_eq!(assign(&mut cache, &[key(0, 1)]), [(1, false)]);
    assert_eq!(assign(&mut cache, &[key(0, 2)]), [(2, false)]);
    assert_eq!(assign(&mut cache, &[key(0, 0)]), [(0, true)]);
    // (0,1) is now the least recently used: its slot goes to the new expert.
    assert_eq!(assign(&mut cache, &[key(1, 7)]), [(1, false)]);
    assert_eq!(cache.slot_of(key(0, 1)), None);
    assert_eq!(cache.slot_of(key(1, 7)), Some(1));
    // Next victim is (0,2), then (0,0).
    assert_eq!(assign(&mut cache, &[key(1, 8)]), [(2, false)]);
    assert_eq!(assign(&mut cache, &[key(1, 9)]), [(0, false)]);
    assert_eq!(
        cache.stats(),
        ExpertCacheStats {
            hits: 1,
            misses: 6,
            bytes_uploaded: 3 * 100 + 3 * 200,
            preloaded: 0,
            bytes_preloaded: 0,
        }
    );
    assert!((cache.stats().hit_rate() - 1.0 / 7.0).abs() < 1e-12);
}

#[test]
fn ties_go_to_the_smallest_key_and_misses_fill_in_key_order() {
    let mut cache = ExpertSlotCache::new(2, vec![1, 1]);
    // Listed out of order: slots follow key order, answers follow request order.
    assert_eq!(
        assign(&mut cache, &[key(0, 5), key(0, 3)]),
        [(1, false), (0, false)]
    );
    // Both were used in the same tick; the smaller key (0,3) in slot 0 is evicted first.
    assert_eq!(assign(&mut cache, &[key(1, 0)]), [(0, false)]);
    assert_eq!(cache.slot_of(key(0, 3)), None);
    assert_eq!(cache.slot_of(key(0, 5)), Some(1));
}

#[test]
fn a_request_never_evicts_its_own_experts() {
    let mut cache = ExpertSlotCache::new(2, vec![1]);
    assign(&mut cache, &[key(0, 0)]);
    assign(&mut cache, &[key(0, 1)]);
    // (0,0) is the LRU entry, but it is part of this request: (0,1) must go instead.
    assert_eq!(
        assign(&mut cache, &[key(0, 2), key(0, 0)]),
        [(1, false), (0, true)]
    );
    assert_eq!(cache.residents(), [(key(0, 0), 0), (key(0, 2), 1)]);
    // A full request of n_slots new experts replaces everything, each once.
    let got = assign(&mut cache, &[key(0, 3), key(0, 4)]);
    assert_eq!(got, [(0, false), (1, false)]);
}

#[test]
fn duplicates_share_a_slot_and_oversized_requests_change_nothing() {
    let mut cache = ExpertSlotCache::new(2, vec![10]);
    assert_eq!(
        assign(&mut cache, &[key(0, 1), key(0, 1), key(0, 2)]),
        [(0, false), (0, false), (1, false)]
    );
    assert_eq!(cache.stats().misses, 2);
    let before = cache.residents();
    let stats_before = cache.stats();
    let err = cache
        .lookup_or_assign(&[key(0, 3), key(0, 4), key(0, 5)])
        .unwrap_err();
    assert_eq!(
        err,
        ExpertCacheError::TooManyExperts {
            wanted: 3,
            n_slots: 2
        }
    );
    assert_eq!(cache.residents(), before);
    assert_eq!(cache.stats(), stats_before);
    let err = cache.lookup_or_assign(&[key(4, 0)]).unwrap_err();
    assert!(
        matches!(err, ExpertCacheError::UnknownLayer { .. }),
        "{err}"
    );
    assert_eq!(cache.residents(), before);
}

/// A deliberately naive LRU (linear scans over a slot array) with the documented rules, to check
/// the indexed implementation against.
struct ReferenceLru {
    slots: Vec<Option<(ExpertKey, u64)>>,
    tick: u64,
}

impl ReferenceLru {
    fn request(&mut self, wanted: &[ExpertKey]) -> Vec<(u32, bool)> {
        self.tick += 1;
        let mut unique: Vec<ExpertKey> = wanted.to_vec();
        unique.sort();
        unique.dedup();
        let mut result = std::collections::HashMap::new();
        for &k in &unique {
            if let Some(i) = self
                .slots
                .iter()
                .position(|s| s.is_some_and(|(sk, _)| sk == k))
            {
                self.slots[i] = Some((k, self.tick));
                result.insert(k, (i as u32, true));
            }
        }
        for &k in &unique {
            if result.contains_key(&k) {
                continue;
            }
            let index = match self.slots.iter().position(|s| s.is_none()) {
                Some(i) => i,
                None => (0..self.slots.len())
                    .filter(|&i| self.slots[i].is_some_and(|(_, t)| t < self.tick))
                    .min_by_key(|&i| self.slots[i].map(|(k, t)| (t, k)))
                    .expect("an unpinned slot"),
            };
            self.slots[index] = Some((k, self.tick));
            result.insert(k, (index as u32, false));
        }
        wanted.iter().map(|k| result[k]).collect()
    }
}

/// SplitMix64, for a reproducible request stream.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

fn random_requests(seed: u64, n: usize) -> Vec<Vec<ExpertKey>> {
    let mut rng = Rng(seed);
    (0..n)
        .map(|_| {
            let layer = (rng.next() % 6) as u32;
            // Skewed expert choice so that hits happen: small indices are more frequent.
            (0..10)
                .map(|_| {
                    let a = rng.next() % 64;
                    let b = rng.next() % 64;
                    key(layer, a.min(b) as u32)
                })
                .collect()
        })
        .collect()
}

#[test]
fn same_requests_give_same_assignments_and_match_the_reference() {
    let requests = random_requests(20261130, 5_000);
    let n_slots = 37;
    let mut first = ExpertSlotCache::new(n_slots, vec![1000; 6]);
    let mut second = ExpertSlotCache::new(n_slots, vec![1000; 6]);
    let mut reference = ReferenceLru {
        slots: vec![None; n_slots],
        tick: 0,
    };
    for wanted in &requests {
        let a = first.lookup_or_assign(wanted).expect("fits");
        let b = second.lookup_or_assign(wanted).expect("fits");
        assert_eq!(a, b);
        let expected = reference.request(wanted);
        let got: Vec<(u32, bool)> = a.iter().map(|s| (s.slot, s.hit)).collect();
        assert_eq!(got, expected, "request {wanted:?}");
        // Every wanted expert is resident afterwards, in the slot it was given.
        for s in &a {
            assert_eq!(first.slot_of(s.key), Some(s.slot));
        }
        // No slot holds two experts.
        let residents = first.residents();
        let mut slots: Vec<u32> = residents.iter().map(|r| r.1).collect();
        slots.sort();
        slots.dedup();
        assert_eq!(slots.len(), residents.len());
        assert!(residents.len() <= n_slots);
    }
    let stats = first.stats();
    assert!(stats.hits > 0 && stats.misses > 0, "{stats:?}");
    assert_eq!(stats.bytes_uploaded, stats.misses * 1000);
}

#[test]
fn preload_fills_hottest_first_and_evicts_coldest_first() {
    let mut profile = ExpertProfile::new();
    profile.add(key(0, 4), 50);
    profile.add(key(1, 2), 50);
    profile.add(key(0, 1), 80);
    profile.add(key(1, 0), 10);
    profile.add(key(0, 9), 0); // never used: not preloaded
    assert_eq!(
        profile.top_n(10),
        [key(0, 1), key(0, 4), key(1, 2), key(1, 0)]
    );
    let mut cache = ExpertSlotCache::new(3, vec![7, 11]);
    let placed = cache.preload(&profile).expect("layers known");
    let placed: Vec<(ExpertKey, u32, bool)> =
        placed.iter().map(|p| (p.key, p.slot, p.hit)).collect();
    assert_eq!(
        placed,
        [
            (key(0, 1), 0, false),
            (key(0, 4), 1, false),
            (key(1, 2), 2, false)
        ]
    );
    assert_eq!(cache.stats().preloaded, 3);
    assert_eq!(cache.stats().bytes_preloaded, 7 + 7 + 11);
    assert_eq!(assign(&mut cache, &[key(0, 4)]), [(1, true)]);
    // The coldest preloaded expert, (1,2), goes first; then (0,1) (older than the hit (0,4)).
    assert_eq!(assign(&mut cache, &[key(1, 0)]), [(2, false)]);
    assert_eq!(assign(&mut cache, &[key(1, 1)]), [(0, false)]);
    assert_eq!(cache.slot_of(key(0, 4)), Some(1));
}

#[test]
fn uniform_default_profile_spreads_slots_over_layers() {
    let profile = ExpertProfile::uniform(3, 4);
    assert_eq!(profile.len(), 12);
    assert_eq!(
        profile.top_n(5),
        [key(0, 0), key(1, 0), key(2, 0), key(0, 1), key(1, 1)]
    );
}

#[test]
fn profile_round_trips_through_a_file() {
    let mut profile = ExpertProfile::new();
    profile.record_all(&[key(3, 1), key(3, 1), key(0, 511), key(47, 0)]);
    profile.add(key(12, 300), u64::MAX - 5);
    let path =
        std::env::temp_dir().join(format!("strata-tiers-profile-{}.txt", std::process::id()));
    profile.save(&path).expect("write profile");
    let loaded = ExpertProfile::load(&path);
    let _ = std::fs::remove_file(&path);
    let loaded = loaded.expect("read profile");
    assert_eq!(loaded, profile);
    assert_eq!(loaded.count(key(3, 1)), 2);
    assert_eq!(loaded.top_n(2), [key(12, 300), key(3, 1)]);
}

#[test]
fn bad_profiles_are_reported_with_their_line() {
    let err = ExpertProfile::from_text("p.txt", "# header\n0 1 2\n\n0 x 3\n").unwrap_err();
    assert!(
        matches!(&err, ExpertCacheError::BadProfile { line: 4, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("p.txt, line 4"), "{err}");
    let err = ExpertProfile::from_text("p.txt", "1 2\n").unwrap_err();
    assert!(
        matches!(&err, ExpertCacheError::BadProfile { line: 1, .. }),
        "{err}"
    );
    let err = ExpertProfile::load("/nonexistent/strata/profile.txt").unwrap_err();
    assert!(matches!(err, ExpertCacheError::ProfileIo { .. }), "{err}");
}

/// Hits and misses are also counted per layer (what `strata bench` reports as the per-layer hit
/// rate), and add up to the totals.
#[test]
fn hits_and_misses_are_counted_per_layer() {
    let mut cache = ExpertSlotCache::new(4, vec![100, 100, 100]);
    assign(&mut cache, &[key(0, 1), key(0, 2)]);
    assign(&mut cache, &[key(2, 1)]);
    assign(&mut cache, &[key(0, 1), key(0, 3)]);
    assign(&mut cache, &[key(2, 1)]);
    assert_eq!(cache.per_layer(), &[(1, 3), (0, 0), (1, 1)]);
    let (hits, misses) = cache
        .per_layer()
        .iter()
        .fold((0, 0), |(h, m), (a, b)| (h + a, m + b));
    assert_eq!((hits, misses), (cache.stats().hits, cache.stats().misses));
}

/// The hot experts of a static VRAM copy: the `slots` most used of the profile, per layer, in
/// ascending expert order; keys outside the model are ignored; the uniform profile gives every
/// layer the same share.
#[test]
fn hot_sets_take_the_most_used_experts_per_layer() {
    let mut profile = ExpertProfile::new();
    profile.add(ExpertKey::new(0, 5), 50);
    profile.add(ExpertKey::new(1, 2), 40);
    profile.add(ExpertKey::new(0, 1), 30);
    profile.add(ExpertKey::new(7, 0), 100); // no layer 7 in a 2-layer model
    profile.add(ExpertKey::new(1, 9), 90); // no expert 9 among 8
    profile.add(ExpertKey::new(1, 3), 10);
    assert_eq!(profile.hot_sets(2, 8, 3), vec![vec![1, 5], vec![2]]);
    assert_eq!(profile.hot_sets(2, 8, 0), vec![Vec::<u32>::new(), vec![]]);
    assert_eq!(profile.hot_sets(2, 8, 99), vec![vec![1, 5], vec![2, 3]]);
    let uniform = ExpertProfile::uniform(3, 4);
    assert_eq!(
        uniform.hot_sets(3, 4, 7),
        vec![vec![0, 1, 2], vec![0, 1], vec![0, 1]]
    );
}
