//! Where a transaction's time goes: latency histograms per stage of its life, for protocols
//! that report them (Q-Store's stages; the interactive protocols' phases, with the messages
//! and bytes each sent). A run snapshots them at both ends of its measurement window and
//! reports the difference, so warm-up does not count.

use hdrhistogram::Histogram;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Longest stage time recorded (longer ones are clamped): one minute, in nanoseconds.
const MAX_NS: u64 = 60_000_000_000;

/// One node's stage histograms, in nanoseconds, each value counted once per transaction, and
/// the node-to-node messages and bytes sent in each stage.
pub struct StageClock {
    names: &'static [&'static str],
    per_txn: bool,
    hists: Mutex<(Vec<Histogram<u64>>, Vec<Traffic>)>,
}

/// Messages and bytes sent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    pub msgs: u64,
    pub bytes: u64,
}

impl StageClock {
    /// Stages timed for a sample of the transactions.
    pub fn new(names: &'static [&'static str]) -> Self {
        StageClock {
            names,
            per_txn: false,
            hists: Mutex::new((
                names.iter().map(|_| histogram()).collect(),
                vec![Traffic::default(); names.len()],
            )),
        }
    }

    /// Stages whose totals are reported per transaction: divided by the number of
    /// transactions recorded in the first stage (every transaction measured passes through
    /// it; the others may be skipped, or stand for other transactions, as the interactive
    /// protocols' aborted attempts do). Whether every transaction or a sample is measured,
    /// the figures per transaction are then the same.
    pub fn per_transaction(names: &'static [&'static str]) -> Self {
        StageClock {
            per_txn: true,
            ..Self::new(names)
        }
    }

    /// Records one transaction's time and traffic in each stage given as (stage index, time,
    /// traffic).
    pub fn record_with_traffic(&self, costs: &[(usize, Duration, Traffic)]) {
        let mut guard = self.hists.lock();
        let (hists, traffic) = &mut *guard;
        for &(stage, d, t) in costs {
            let ns = (d.as_nanos() as u64).clamp(1, MAX_NS);
            hists[stage].saturating_record(ns);
            traffic[stage].msgs += t.msgs;
            traffic[stage].bytes += t.bytes;
        }
    }

    /// Records, for `txns` transactions each, the time they spent in each stage given as
    /// (stage index, time).
    pub fn record(&self, times: &[(usize, Duration)], txns: u64) {
        let hists = &mut self.hists.lock().0;
        for &(stage, d) in times {
            let ns = (d.as_nanos() as u64).clamp(1, MAX_NS);
            hists[stage].saturating_record_n(ns, txns);
        }
    }

    pub fn snapshot(&self) -> StageSnapshot {
        let (hists, traffic) = self.hists.lock().clone();
        StageSnapshot {
            names: self.names,
            per_txn: self.per_txn,
            hists,
            traffic,
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
    per_txn: bool,
    hists: Vec<Histogram<u64>>,
    traffic: Vec<Traffic>,
}

impl StageSnapshot {
    /// Adds another node's histograms (of the same stages).
    pub fn merge(&mut self, other: &StageSnapshot) {
        for (h, o) in self.hists.iter_mut().zip(&other.hists) {
            let _ = h.add(o);
        }
        for (t, o) in self.traffic.iter_mut().zip(&other.traffic) {
            t.msgs += o.msgs;
            t.bytes += o.bytes;
        }
    }

    /// What was recorded since `before` (a snapshot of the same clocks taken earlier).
    pub fn since(&self, before: &StageSnapshot) -> StageSnapshot {
        let mut d = self.clone();
        for (h, b) in d.hists.iter_mut().zip(&before.hists) {
            // Counts only grow, so the earlier snapshot is contained in this one.
            let _ = h.subtract(b);
        }
        for (t, b) in d.traffic.iter_mut().zip(&before.traffic) {
            t.msgs -= b.msgs;
            t.bytes -= b.bytes;
        }
        d
    }

    /// One line per stage, in the order of the stages.
    pub fn summary(&self) -> Vec<StageSummary> {
        let us = |ns: u64| ns as f64 / 1_000.0;
        let txns = self.hists.first().map_or(0, |h| h.len());
        self.names
            .iter()
            .zip(&self.hists)
            .zip(&self.traffic)
            .map(|((name, h), t)| StageSummary {
                stage: name.to_string(),
                txns: h.len(),
                mean_us: h.mean() / 1_000.0,
                p50_us: us(h.value_at_quantile(0.5)),
                p99_us: us(h.value_at_quantile(0.99)),
                per_txn: (self.per_txn && txns > 0).then(|| {
                    let n = txns as f64;
                    PerTxn {
                        us: h.mean() * h.len() as f64 / 1_000.0 / n,
                        msgs: t.msgs as f64 / n,
                        bytes: t.bytes as f64 / n,
                    }
                }),
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
    /// For clocks that report per transaction (see [`StageClock::per_transaction`]): the
    /// time and node-to-node traffic of the stage per transaction measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_txn: Option<PerTxn>,
}

/// A stage's cost per transaction.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
pub struct PerTxn {
    pub us: f64,
    pub msgs: f64,
    pub bytes: f64,
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
