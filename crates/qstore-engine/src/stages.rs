//! Where a transaction's time goes: time per stage of its life, for protocols that report
//! it (Q-Store's stages; the interactive protocols' phases, with the messages and bytes each
//! sent). A run snapshots the clocks at both ends of its measurement window and reports the
//! difference, so warm-up does not count.
//!
//! A clock keeps exact totals per stage (transactions, time, traffic) and a latency histogram.
//! The totals are what a server sends its client ([`StageTotals`]): means and figures per
//! transaction follow from them over TCP too; percentiles need the histograms, which stay in
//! the process that recorded them.

use hdrhistogram::Histogram;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Longest stage time recorded (longer ones are clamped): one minute, in nanoseconds.
const MAX_NS: u64 = 60_000_000_000;

/// One node's stage clocks: per stage, a histogram of the time (in nanoseconds, each value
/// counted once per transaction) and the exact totals.
pub struct StageClock {
    names: &'static [&'static str],
    per_txn: bool,
    state: Mutex<(Vec<Histogram<u64>>, Vec<StageTotal>)>,
}

/// Messages and bytes sent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    pub msgs: u64,
    pub bytes: u64,
}

/// Everything recorded in one stage.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageTotal {
    pub txns: u64,
    pub ns: u64,
    pub msgs: u64,
    pub bytes: u64,
}

impl StageTotal {
    fn add(&mut self, o: &StageTotal) {
        self.txns += o.txns;
        self.ns += o.ns;
        self.msgs += o.msgs;
        self.bytes += o.bytes;
    }

    /// What was added since `before` (totals only grow).
    fn since(&self, before: &StageTotal) -> StageTotal {
        StageTotal {
            txns: self.txns.saturating_sub(before.txns),
            ns: self.ns.saturating_sub(before.ns),
            msgs: self.msgs.saturating_sub(before.msgs),
            bytes: self.bytes.saturating_sub(before.bytes),
        }
    }
}

impl StageClock {
    /// Stages timed for a sample of the transactions.
    pub fn new(names: &'static [&'static str]) -> Self {
        StageClock {
            names,
            per_txn: false,
            state: Mutex::new((
                names.iter().map(|_| histogram()).collect(),
                vec![StageTotal::default(); names.len()],
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
        let mut guard = self.state.lock();
        let (hists, totals) = &mut *guard;
        for &(stage, d, t) in costs {
            let ns = (d.as_nanos() as u64).clamp(1, MAX_NS);
            hists[stage].saturating_record(ns);
            totals[stage].add(&StageTotal {
                txns: 1,
                ns,
                msgs: t.msgs,
                bytes: t.bytes,
            });
        }
    }

    /// Records, for `txns` transactions each, the time they spent in each stage given as
    /// (stage index, time).
    pub fn record(&self, times: &[(usize, Duration)], txns: u64) {
        let mut guard = self.state.lock();
        let (hists, totals) = &mut *guard;
        for &(stage, d) in times {
            let ns = (d.as_nanos() as u64).clamp(1, MAX_NS);
            hists[stage].saturating_record_n(ns, txns);
            totals[stage].add(&StageTotal {
                txns,
                ns: ns.saturating_mul(txns),
                ..StageTotal::default()
            });
        }
    }

    pub fn snapshot(&self) -> StageSnapshot {
        let (hists, stages) = self.state.lock().clone();
        StageSnapshot {
            totals: StageTotals {
                names: self.names.iter().map(|n| n.to_string()).collect(),
                per_txn: self.per_txn,
                stages,
            },
            hists: Some(hists),
        }
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_NS, 2).expect("valid histogram bounds")
}

/// The totals of a set of stage clocks, as a server sends them to its client.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StageTotals {
    pub names: Vec<String>,
    /// See [`StageClock::per_transaction`].
    pub per_txn: bool,
    pub stages: Vec<StageTotal>,
}

impl StageTotals {
    /// Adds another node's totals of the same stages.
    pub fn add(&mut self, other: &StageTotals) {
        for (t, o) in self.stages.iter_mut().zip(&other.stages) {
            t.add(o);
        }
    }

    /// What was added since `before` (totals of the same stages taken earlier).
    pub fn since(&self, before: &StageTotals) -> StageTotals {
        let mut d = self.clone();
        for (t, b) in d.stages.iter_mut().zip(&before.stages) {
            *t = t.since(b);
        }
        d
    }
}

/// Stage clocks at one moment (or over a window, as the difference of two moments): the
/// totals, and the histograms where they are at hand (not from another process).
#[derive(Clone)]
pub struct StageSnapshot {
    totals: StageTotals,
    hists: Option<Vec<Histogram<u64>>>,
}

impl StageSnapshot {
    /// A snapshot of totals alone (from a server): means, not percentiles.
    pub fn from_totals(totals: StageTotals) -> Self {
        StageSnapshot {
            totals,
            hists: None,
        }
    }

    pub fn totals(&self) -> &StageTotals {
        &self.totals
    }

    /// Adds another node's clocks (of the same stages).
    pub fn merge(&mut self, other: &StageSnapshot) {
        self.totals.add(&other.totals);
        self.hists = match (self.hists.take(), &other.hists) {
            (Some(mut hs), Some(os)) => {
                for (h, o) in hs.iter_mut().zip(os) {
                    let _ = h.add(o);
                }
                Some(hs)
            }
            _ => None,
        };
    }

    /// What was recorded since `before` (a snapshot of the same clocks taken earlier).
    pub fn since(&self, before: &StageSnapshot) -> StageSnapshot {
        let mut d = self.clone();
        d.totals = self.totals.since(&before.totals);
        d.hists = match (d.hists, &before.hists) {
            (Some(mut hs), Some(bs)) => {
                for (h, b) in hs.iter_mut().zip(bs) {
                    // Counts only grow, so the earlier snapshot is contained in this one.
                    let _ = h.subtract(b);
                }
                Some(hs)
            }
            _ => None,
        };
        d
    }

    /// One line per stage, in the order of the stages.
    pub fn summary(&self) -> Vec<StageSummary> {
        let us = |ns: f64| ns / 1_000.0;
        let t = &self.totals;
        let first = t.stages.first().map_or(0, |s| s.txns);
        t.names
            .iter()
            .zip(&t.stages)
            .enumerate()
            .map(|(i, (name, s))| {
                let hist = self.hists.as_ref().map(|hs| &hs[i]);
                StageSummary {
                    stage: name.clone(),
                    txns: s.txns,
                    mean_us: us(s.ns as f64 / s.txns.max(1) as f64),
                    p50_us: hist.map(|h| us(h.value_at_quantile(0.5) as f64)),
                    p99_us: hist.map(|h| us(h.value_at_quantile(0.99) as f64)),
                    per_txn: (t.per_txn && first > 0).then(|| {
                        let n = first as f64;
                        PerTxn {
                            us: us(s.ns as f64) / n,
                            msgs: s.msgs as f64 / n,
                            bytes: s.bytes as f64 / n,
                        }
                    }),
                }
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
    /// Percentiles, where the histograms were at hand (not over TCP).
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
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
        assert!((s[0].p50_us.unwrap() - 2.0).abs() < 0.1, "{s:?}");
        assert_eq!(s[1].txns, 4);
        assert!((s[1].mean_us - 7.0).abs() < 0.1, "{s:?}");
    }

    /// What a server sends (totals) gives the same means and per-transaction figures as the
    /// clocks themselves, and no percentiles.
    #[test]
    fn totals_alone_give_the_means_and_figures_per_transaction() {
        const PHASES: &[&str] = &["first", "second"];
        let clock = StageClock::per_transaction(PHASES);
        let traffic = |msgs, bytes| Traffic { msgs, bytes };
        let ms = Duration::from_millis;
        clock.record_with_traffic(&[(0, ms(1), traffic(2, 100)), (1, ms(3), traffic(1, 10))]);
        clock.record_with_traffic(&[(0, ms(3), traffic(2, 100))]);
        let full = clock.snapshot().summary();
        let bytes = postcard::to_stdvec(clock.snapshot().totals()).unwrap();
        let wire: StageTotals = postcard::from_bytes(&bytes).unwrap();
        let remote = StageSnapshot::from_totals(wire).summary();
        for (f, r) in full.iter().zip(&remote) {
            assert_eq!(
                (f.txns, f.mean_us, f.per_txn),
                (r.txns, r.mean_us, r.per_txn)
            );
            assert!(f.p50_us.is_some() && r.p50_us.is_none());
        }
        let first = remote[0].per_txn.unwrap();
        assert_eq!((first.us, first.msgs, first.bytes), (2_000.0, 2.0, 100.0));
        assert_eq!(remote[1].per_txn.unwrap().us, 1_500.0);
    }
}
