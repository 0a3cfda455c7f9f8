//! Log-probabilities reported to clients (`logprobs` / `top_logprobs`).
//!
//! The values are the log-softmax of the model's raw logits for the position — before penalties,
//! temperature, top-k/top-p/min-p and any structured-output mask — as OpenAI reports them (the
//! model's distribution, not the sampling distribution). Computed in f64 with a fixed summation
//! order, so they are as deterministic as the logits.

/// One token and its log-probability.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f32,
}

/// The sampled token's log-probability and the `top` most likely tokens at that position.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    pub chosen: TokenLogprob,
    /// Most likely first; ties by lower id.
    pub top: Vec<TokenLogprob>,
}

/// log Σ exp(l) over the row, as (max, log-sum-exp relative to max).
fn log_normaliser(logits: &[f32]) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    max + sum.ln()
}

/// Log-probabilities of `chosen` and of the `top` most likely tokens of one logits row.
pub fn logprobs(logits: &[f32], chosen: u32, top: usize) -> TokenLogprobs {
    let norm = log_normaliser(logits);
    let lp = |id: u32| TokenLogprob {
        id,
        logprob: logits
            .get(id as usize)
            .map(|&l| (l as f64 - norm) as f32)
            .unwrap_or(f32::NEG_INFINITY),
    };
    let mut ids: Vec<u32> = (0..logits.len() as u32).collect();
    let order = |a: &u32, b: &u32| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    let top = top.min(ids.len());
    if top > 0 && top < ids.len() {
        ids.select_nth_unstable_by(top - 1, order);
    }
    ids.truncate(top);
    ids.sort_unstable_by(order);
    TokenLogprobs {
        chosen: lp(chosen),
        top: ids.into_iter().map(lp).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_a_direct_log_softmax_and_orders_ties_by_id() {
        let logits = [1.0f32, 3.0, 3.0, -2.0];
        let out = logprobs(&logits, 3, 3);
        let z: f64 = logits.iter().map(|&l| (l as f64).exp()).sum();
        let direct = |i: usize| ((logits[i] as f64).exp() / z).ln() as f32;
        assert!((out.chosen.logprob - direct(3)).abs() < 1e-6);
        let ids: Vec<u32> = out.top.iter().map(|t| t.id).collect();
        assert_eq!(ids, vec![1, 2, 0]);
        assert!((out.top[0].logprob - direct(1)).abs() < 1e-6);
        let total: f64 = (0..4)
            .map(|i| (logprobs(&logits, i, 0).chosen.logprob as f64).exp())
            .sum();
        assert!((total - 1.0).abs() < 1e-6);
    }
}
