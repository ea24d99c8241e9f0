//! Key-rank choice: uniform or Zipfian.
//!
//! The Zipfian sampler is `rand_distr::Zipf`, which uses rejection-inversion sampling
//! (Hörmann and Derflinger): O(1) per sample with no precomputed zeta table, exact for any
//! exponent θ ≥ 0, including θ ≥ 1 where the classic YCSB (Gray et al.) formula breaks down.

use qstore_core::rng::Rng;
use rand_distr::Distribution;

/// Draws ranks in `[0, n)`; rank 0 is the most popular.
#[derive(Clone, Debug)]
pub enum RankChooser {
    /// A rank is the high half of a random 64-bit number times `n` (Lemire's multiply-shift,
    /// without the rejection step): one multiplication, no division, and each rank's
    /// probability is within n / 2^64 of 1/n (about 1e-12 for ten million keys).
    Uniform {
        n: u64,
    },
    Zipf {
        dist: rand_distr::Zipf<f64>,
        n: u64,
    },
}

impl RankChooser {
    /// Uniform when `theta` is 0, Zipfian with exponent `theta` otherwise.
    pub fn new(n: u64, theta: f64) -> Self {
        assert!(
            n >= 1 && theta.is_finite() && theta >= 0.0,
            "validated by config"
        );
        if theta == 0.0 {
            RankChooser::Uniform { n }
        } else {
            let dist = rand_distr::Zipf::new(n as f64, theta).expect("n >= 1 and theta >= 0");
            RankChooser::Zipf { dist, n }
        }
    }

    /// Always inlined: the uniform draw is a few instructions, and with the Zipfian one
    /// beside it the compiler made every draw a call.
    #[inline(always)]
    pub fn sample(&self, rng: &mut Rng) -> u64 {
        match self {
            RankChooser::Uniform { n } => {
                ((rand::RngCore::next_u64(rng) as u128 * *n as u128) >> 64) as u64
            }
            RankChooser::Zipf { dist, n } => zipf_rank(dist, *n, rng),
        }
    }
}

#[inline(never)]
fn zipf_rank(dist: &rand_distr::Zipf<f64>, n: u64, rng: &mut Rng) -> u64 {
    // Zipf samples are integers in [1, n] carried as floats.
    (dist.sample(rng) as u64).clamp(1, n) - 1
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Expected probability of each rank under Zipf(n, θ).
    fn zipf_pmf(n: usize, theta: f64) -> Vec<f64> {
        let w: Vec<f64> = (1..=n).map(|k| (k as f64).powf(-theta)).collect();
        let h: f64 = w.iter().sum();
        w.into_iter().map(|x| x / h).collect()
    }

    /// Pearson's chi-squared statistic of observed counts against expected probabilities.
    fn chi_squared(counts: &[u64], pmf: &[f64]) -> f64 {
        let total: u64 = counts.iter().sum();
        counts
            .iter()
            .zip(pmf)
            .map(|(&o, &p)| {
                let e = p * total as f64;
                (o as f64 - e).powi(2) / e
            })
            .sum()
    }

    fn histogram(chooser: &RankChooser, n: usize, samples: usize, seed: u64) -> Vec<u64> {
        let mut rng = qstore_core::rng::stream(seed, 0);
        let mut counts = vec![0u64; n];
        for _ in 0..samples {
            counts[chooser.sample(&mut rng) as usize] += 1;
        }
        counts
    }

    #[test]
    fn zipfian_matches_the_distribution_for_skews_below_and_above_one() {
        let n = 100;
        for theta in [0.5, 0.9, 0.99, 1.2, 2.0] {
            let counts = histogram(&RankChooser::new(n as u64, theta), n, 400_000, 7);
            let chi2 = chi_squared(&counts, &zipf_pmf(n, theta));
            // 99 degrees of freedom: the 99.99th percentile of chi-squared is about 157.
            assert!(chi2 < 157.0, "theta {theta}: chi2 {chi2}");
        }
    }

    #[test]
    fn uniform_is_uniform_and_in_range() {
        let n = 50;
        let counts = histogram(&RankChooser::new(n as u64, 0.0), n, 200_000, 3);
        let chi2 = chi_squared(&counts, &vec![1.0 / n as f64; n]);
        assert!(chi2 < 90.0, "chi2 {chi2}"); // 49 degrees of freedom, 99.99th pct ~ 90
    }

    #[test]
    fn skew_concentrates_on_low_ranks() {
        let n = 1_000_000u64;
        let chooser = RankChooser::new(n, 0.99);
        let mut rng = qstore_core::rng::stream(1, 0);
        let hot = (0..100_000)
            .filter(|_| chooser.sample(&mut rng) < 100)
            .count();
        // P(rank < 100) under Zipf(10^6, 0.99) is about 0.36.
        assert!((30_000..42_000).contains(&hot), "{hot}");
    }

    #[test]
    fn single_key_always_rank_zero() {
        let mut rng = qstore_core::rng::stream(1, 0);
        for theta in [0.0, 0.9, 3.0] {
            let c = RankChooser::new(1, theta);
            assert!((0..100).all(|_| c.sample(&mut rng) == 0));
        }
    }
}
