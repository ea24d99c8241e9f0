//! Where a transaction's time goes: latency histograms per stage of its life, for protocols
//! that report them (Q-Store). A run snapshots them at both ends of its measurement window
//! and reports the difference, so warm-up does not count.

use hdrhistogram::Histogram;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Longest stage time recorded (longer ones are clamped): one minute, in nanoseconds.
const MAX_NS: u64 = 60_000_000_000;

/// One node's stage histograms, in nanoseconds, each value counted once per transaction.
pub struct StageClock {
    names: &'static [&'static str],
    hists: Mutex<Vec<Histogram<u64>>>,
}

impl StageClock {
    pub fn new(names: &'static [&'static str]) -> Self {
        StageClock {
            names,
            hists: Mutex::new(names.iter().map(|_| histogram()).collect()),
        }
    }

    /// Records, for `txns` transactions each, the time they spent in each stage given as
    /// (stage index, time).
    pub fn record(&self, times: &[(usize, Duration)], txns: u64) {
        let mut hists = self.hists.lock();
        for &(stage, d) in times {
            let ns = (d.as_nanos() as u64).clamp(1, MAX_NS);
            hists[stage].saturating_record_n(ns, txns);
        }
    }

    pub fn snapshot(&self) -> StageSnapshot {
        StageSnapshot {
            names: self.names,
            hists: self.hists.lock().clone(),
        }
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_NS, 2).expect("valid histogram bounds")
}

/// Stage histograms at one moment (or over a window, as the difference of two moments).
#[derive(Clone)]
pub struct StageSnapshot {
    names: &'static [&'static str],
    hists: Vec<Histogram<u64>>,
}

impl StageSnapshot {
    /// Adds another node's histograms (of the same stages).
    pub fn merge(&mut self, other: &StageSnapshot) {
        for (h, o) in self.hists.iter_mut().zip(&other.hists) {
            let _ = h.add(o);
        }
    }

    /// What was recorded since `before` (a snapshot of the same clocks taken earlier).
    pub fn since(&self, before: &StageSnapshot) -> StageSnapshot {
        let mut d = self.clone();
        for (h, b) in d.hists.iter_mut().zip(&before.hists) {
            // Counts only grow, so the earlier snapshot is contained in this one.
            let _ = h.subtract(b);
        }
        d
    }

    /// One line per stage, in the order of the stages.
    pub fn summary(&self) -> Vec<StageSummary> {
        let us = |ns: u64| ns as f64 / 1_000.0;
        self.names
            .iter()
            .zip(&self.hists)
            .map(|(name, h)| StageSummary {
                stage: name.to_string(),
                txns: h.len(),
                mean_us: h.mean() / 1_000.0,
                p50_us: us(h.value_at_quantile(0.5)),
                p99_us: us(h.value_at_quantile(0.99)),
            })
            .collect()
    }
}

/// The time transactions spent in one stage.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct StageSummary {
    pub stage: String,
    /// Transactions measured.
    pub txns: u64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_counts_what_was_recorded_within_it_on_every_node() {
        const STAGES: &[&str] = &["a", "b"];
        let (n0, n1) = (StageClock::new(STAGES), StageClock::new(STAGES));
        n0.record(&[(0, Duration::from_micros(500))], 10);
        let before = {
            let mut s = n0.snapshot();
            s.merge(&n1.snapshot());
            s
        };
        n0.record(
            &[(0, Duration::from_micros(2)), (1, Duration::from_micros(7))],
            3,
        );
        n1.record(&[(1, Duration::from_micros(7))], 1);
        let mut after = n0.snapshot();
        after.merge(&n1.snapshot());
        let s = after.since(&before).summary();
        assert_eq!((s[0].stage.as_str(), s[0].txns), ("a", 3));
        assert!((s[0].p50_us - 2.0).abs() < 0.1, "{s:?}");
        assert_eq!(s[1].txns, 4);
        assert!((s[1].mean_us - 7.0).abs() < 0.1, "{s:?}");
    }
}
