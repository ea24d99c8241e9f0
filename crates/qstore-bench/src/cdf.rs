//! A latency distribution as a short list of points of its cumulative distribution function
//! (CDF): what a run reports of its committed transactions' latencies besides the usual
//! percentiles, and what a latency CDF figure draws.

use hdrhistogram::Histogram;
use serde::Serialize;

/// One point of a CDF: a `fraction` of the transactions took at most `latency_us`.
#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct CdfPoint {
    pub fraction: f64,
    pub latency_us: u64,
}

/// The fractions above 0.99 a CDF is taken at: the tail in finer steps, then 1 (the
/// slowest transaction).
const TAIL: [f64; 4] = [0.995, 0.999, 0.9999, 1.0];

/// The fractions a CDF is taken at, ascending: every percent from 1 to 99, then [`TAIL`].
/// The same for every run, so that the CDFs of a figure's rounds line up point by point;
/// about a hundred, so that a report stays small.
pub fn fractions() -> impl Iterator<Item = f64> {
    (1..=99u32).map(|p| f64::from(p) / 100.0).chain(TAIL)
}

/// The CDF of the values recorded in `h` at [`fractions`]: nondecreasing in latency, ending
/// at fraction 1 with the largest value. Empty when nothing was recorded.
///
/// A point's latency is the histogram's value at that quantile (to its precision: 3
/// significant digits for the client's latencies), so at least that fraction of the
/// values lies at or below it.
pub fn of(h: &Histogram<u64>) -> Vec<CdfPoint> {
    if h.is_empty() {
        return Vec::new();
    }
    fractions()
        .map(|fraction| CdfPoint {
            fraction,
            latency_us: if fraction >= 1.0 {
                h.max()
            } else {
                h.value_at_quantile(fraction)
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn histogram(values: impl IntoIterator<Item = u64>) -> Histogram<u64> {
        let mut h = Histogram::new_with_bounds(1, 60_000_000, 3).unwrap();
        for v in values {
            h.record(v).unwrap();
        }
        h
    }

    fn at(cdf: &[CdfPoint], fraction: f64) -> u64 {
        cdf.iter()
            .find(|p| p.fraction == fraction)
            .unwrap()
            .latency_us
    }

    #[test]
    fn a_cdf_is_monotone_and_ends_at_one_with_the_maximum() {
        // Two modes far apart and a long tail: 90% near 200 us, 10% near 40 ms, one at 2 s.
        let values = (0..9_000)
            .map(|i| 200 + i % 50)
            .chain((0..999).map(|i| 40_000 + i * 10))
            .chain([2_000_000]);
        let h = histogram(values);
        let cdf = of(&h);
        assert_eq!(cdf.len(), 99 + TAIL.len());
        for w in cdf.windows(2) {
            assert!(w[0].fraction < w[1].fraction, "{w:?}");
            assert!(w[0].latency_us <= w[1].latency_us, "{w:?}");
        }
        let last = cdf.last().unwrap();
        assert_eq!(last.fraction, 1.0);
        assert_eq!(last.latency_us, h.max());
        assert!(at(&cdf, 0.9) < 300 && at(&cdf, 0.91) >= 40_000, "{cdf:?}");
    }

    #[test]
    fn a_cdf_matches_a_known_histogram() {
        // 1..=1000 us once each: the value at fraction q is 1000 q, exactly (3 digits).
        let cdf = of(&histogram(1..=1000));
        assert_eq!(at(&cdf, 0.01), 10);
        assert_eq!(at(&cdf, 0.5), 500);
        assert_eq!(at(&cdf, 0.99), 990);
        assert_eq!(at(&cdf, 0.995), 995);
        assert_eq!(at(&cdf, 0.999), 999);
        assert_eq!(at(&cdf, 0.9999), 1000);
        assert_eq!(at(&cdf, 1.0), 1000);
    }

    #[test]
    fn nothing_recorded_is_no_cdf() {
        assert!(of(&histogram([])).is_empty());
    }
}
