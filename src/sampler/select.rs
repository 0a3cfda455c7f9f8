//! The candidate order of step 3 — logit descending (`f32::total_cmp`), then id ascending — as
//! one `u64` key per token, and the first `k` tokens of that order without sorting the whole
//! vocabulary.

/// The token's place in the candidate order: smaller keys come first. The high half is the
/// logit's bits mapped so that unsigned order follows `total_cmp` order, then inverted (descending
/// logits); the low half is the id (ascending among equal logits). Keys are unique.
pub fn order_key(id: u32, logit: f32) -> u64 {
    let bits = logit.to_bits();
    let monotone = if bits & 0x8000_0000 != 0 {
        !bits
    } else {
        bits | 0x8000_0000
    };
    (u64::from(!monotone) << 32) | u64::from(id)
}

fn id_of(key: u64) -> u32 {
    key as u32
}

/// The first `k` tokens of `row` in candidate order (all of them when `k` is 0 or at least the
/// row's length), as (id, logit), skipping `-inf` (masked) logits.
///
/// With a cut, one pass keeps a buffer of at most `4k` keys below a threshold; when it fills, it
/// is cut back to its `k` smallest and the threshold becomes the largest of those. Tokens are
/// scanned in id order, so a later token with an equal logit never beats the threshold.
pub fn first_candidates(row: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut keys: Vec<u64> = if k == 0 || k >= row.len() {
        row.iter()
            .enumerate()
            .filter(|(_, l)| **l != f32::NEG_INFINITY)
            .map(|(i, &l)| order_key(i as u32, l))
            .collect()
    } else {
        let cap = 4 * k;
        let mut buf = Vec::with_capacity(cap);
        let mut threshold = u64::MAX;
        // A logit below the threshold token's (IEEE `<`, which implies `total_cmp` order for
        // the finite and infinite values a row holds) is rejected without computing its key.
        let mut floor = f32::NEG_INFINITY;
        for (i, &l) in row.iter().enumerate() {
            if l < floor || l == f32::NEG_INFINITY {
                continue;
            }
            let key = order_key(i as u32, l);
            if key < threshold {
                buf.push(key);
                if buf.len() == cap {
                    buf.select_nth_unstable(k - 1);
                    buf.truncate(k);
                    threshold = buf.iter().copied().max().unwrap_or(u64::MAX);
                    floor = row[id_of(threshold) as usize];
                }
            }
        }
        if buf.len() > k {
            buf.select_nth_unstable(k - 1);
            buf.truncate(k);
        }
        buf
    };
    keys.sort_unstable();
    keys.into_iter()
        .map(|key| {
            let id = id_of(key);
            (id, row[id as usize])
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference: every live token sorted by the comparator step 3 defines.
    fn reference(row: &[f32], k: usize) -> Vec<(u32, f32)> {
        let mut ids: Vec<(u32, f32)> = row
            .iter()
            .enumerate()
            .filter(|(_, l)| **l != f32::NEG_INFINITY)
            .map(|(i, &l)| (i as u32, l))
            .collect();
        ids.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if k > 0 {
            ids.truncate(k);
        }
        ids
    }

    #[test]
    fn keys_follow_total_cmp_then_id() {
        let values = [
            f32::INFINITY,
            3.5,
            1.0,
            0.0,
            -0.0,
            -1e-30,
            -2.0,
            f32::MIN,
            f32::NEG_INFINITY,
        ];
        for (i, &a) in values.iter().enumerate() {
            for (j, &b) in values.iter().enumerate() {
                let want = b.total_cmp(&a).then((i as u32).cmp(&(j as u32)));
                assert_eq!(
                    order_key(i as u32, a).cmp(&order_key(j as u32, b)),
                    want,
                    "{a} {b}"
                );
            }
        }
    }

    #[test]
    fn first_candidates_equal_a_full_sort() {
        let mut s = 0x1234_5678_9abc_def0u64;
        for (n, levels) in [
            (1, 3),
            (7, 2),
            (100, 5),
            (5000, 40),
            (5000, 100000),
            (70000, 9),
        ] {
            let row: Vec<f32> = (0..n)
                .map(|_| {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    match s % 17 {
                        0 => f32::NEG_INFINITY,
                        1 => -0.0,
                        2 => 0.0,
                        _ => (s >> 20) as f32 % levels as f32 - levels as f32 / 2.0,
                    }
                })
                .collect();
            for k in [0, 1, 2, 5, 20, 64, n, n + 3] {
                assert_eq!(
                    first_candidates(&row, k),
                    reference(&row, k),
                    "n {n}, k {k}"
                );
            }
        }
    }
}
