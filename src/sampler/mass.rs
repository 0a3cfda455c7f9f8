//! Probability mass as exact integers: `exp((l - l_max) / T)`, computed in f64, then truncated to
//! a multiple of 2⁻¹⁰⁰ and held as a `u128`. Sums of such masses are exact, so they do not depend
//! on the order they are added in: the total mass of a whole vocabulary can be summed in id order
//! while the candidates are walked in sorted order, and a GPU can reproduce every sum bit for bit.

/// 2¹⁰⁰ as an f64 (exact).
const SCALE: f64 = 1_267_650_600_228_229_401_496_703_205_376.0;

/// Below this exponent `exp(x) · 2¹⁰⁰ < 0.5`, so the mass truncates to 0 without computing it.
const ZERO_BELOW: f64 = -70.0;

/// The mass of logit `l` given the largest logit `max` and `1 / T`.
pub fn mass(l: f32, max: f64, inv_temperature: f64) -> u128 {
    let x = (f64::from(l) - max) * inv_temperature;
    if x < ZERO_BELOW {
        return 0;
    }
    // exp(x) ≤ 1, so the product is below 2¹⁰¹ and the conversion truncates exactly.
    (x.exp() * SCALE) as u128
}

/// The mass of a probability `p` ∈ [0, 1] relative to the top token (whose mass is 2¹⁰⁰),
/// rounded down: the min-p threshold.
pub fn mass_of_probability(p: f64) -> u128 {
    (p.clamp(0.0, 1.0) * SCALE) as u128
}

/// `fraction` ∈ [0, 1] as an exact multiple of 2⁻⁵³ (truncated): what [`super::uniform`] draws.
pub fn q53(fraction: f64) -> u64 {
    (fraction.clamp(0.0, 1.0) * (1u64 << 53) as f64) as u64
}

/// ⌊q · total / 2⁵³⌋ exactly, for q ≤ 2⁵³ and total < 2¹¹⁸.
pub fn scale(q: u64, total: u128) -> u128 {
    let q = u128::from(q);
    let hi = total >> 64;
    let lo = total & u128::from(u64::MAX);
    ((q * hi) << 11) + ((q * lo) >> 53)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masses_are_truncated_multiples_of_two_to_the_minus_100() {
        assert_eq!(mass(3.0, 3.0, 1.7), 1u128 << 100, "the top token");
        assert_eq!(mass(-50.0, 30.0, 1.0), 0, "exp(-80) is below 2^-100");
        assert_eq!(mass(-39.0, 30.0, 1.0), 1, "exp(-69) · 2^100 ≈ 1.3");
        assert_eq!(mass(29.0, 30.0, 1.0), ((-1.0f64).exp() * SCALE) as u128);
    }

    #[test]
    fn scale_is_exact() {
        // Where q · total fits in a u128, the plain product and shift is the reference.
        let mut s = 0x9e37_79b9_7f4a_7c15_u64;
        for _ in 0..1000 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let q = s >> 11;
            let total = u128::from(s.rotate_left(17)) << (s % 11);
            assert_eq!(scale(q, total), (u128::from(q) * total) >> 53);
        }
        let total = (1u128 << 117) + 12345;
        assert_eq!(scale(1 << 53, total), total);
        assert_eq!(scale(1 << 52, total), total >> 1);
        assert_eq!(scale(0, total), 0);
        assert_eq!(q53(0.5), 1 << 52);
        assert_eq!(q53(1.0), 1 << 53);
    }
}
