//! Client-side statistics. Every metric is defined here, once:
//! - a transaction counts once, at the client, when its commit answer arrives inside the
//!   measurement window;
//! - its latency runs from its first submission (for open loop: its scheduled arrival) to its
//!   final answer, retries and back-off included;
//! - abort rate = concurrency-control aborts / (commits + concurrency-control aborts);
//!   logic-induced aborts are counted apart and never retried.

use hdrhistogram::Histogram;
use qstore_core::txn::CcAbortCause;
use std::collections::BTreeMap;

/// Distinct logic-abort reasons kept (programs' reasons are few; a client sending many
/// distinct ones cannot grow the map past this).
const LOGIC_REASONS: usize = 16;

/// Largest latency the histogram distinguishes (60 s); larger values saturate.
const MAX_LATENCY_US: u64 = 60_000_000;

/// Counts of one load-generator thread, merged at the end of a run.
#[derive(Clone)]
pub struct ClientStats {
    pub commits: u64,
    pub ops: u64,
    pub logic_aborts: u64,
    /// Logic aborts by the reason the program gave (at most `LOGIC_REASONS` reasons; the
    /// rest under "other").
    pub logic_reasons: BTreeMap<String, u64>,
    pub rejected: u64,
    pub cc_aborts: BTreeMap<CcAbortCause, u64>,
    /// Latency of committed transactions, in microseconds.
    pub latency_us: Histogram<u64>,
    /// First rejection message seen (explains `rejected` to the user).
    pub first_rejection: Option<String>,
    /// Transactions still unanswered when the run gave up waiting.
    pub unfinished: u64,
    /// Resubmissions after a replicated server answered that it does not lead the
    /// transaction's partition (a fail-over, or a client that learnt the leader late).
    pub redirected: u64,
    /// Open-loop arrivals skipped because too many transactions were outstanding.
    pub missed_arrivals: u64,
    /// Committed answers that broke a workload invariant, and the first explanation.
    pub invariant_violations: u64,
    pub first_violation: Option<String>,
    /// Commits per `STALL_BUCKET_MS` since the run's epoch (see [`Self::longest_stall_ms`]).
    pub commit_buckets: Vec<u32>,
}

/// Resolution of [`ClientStats::longest_stall_ms`].
pub const STALL_BUCKET_MS: u64 = 10;
/// Buckets kept: runs longer than this (about 2.9 hours) are not looked at past it.
const MAX_STALL_BUCKETS: usize = 1 << 20;

impl Default for ClientStats {
    fn default() -> Self {
        ClientStats {
            commits: 0,
            ops: 0,
            logic_aborts: 0,
            logic_reasons: BTreeMap::new(),
            rejected: 0,
            cc_aborts: BTreeMap::new(),
            latency_us: Histogram::new_with_bounds(1, MAX_LATENCY_US, 3)
                .expect("valid histogram bounds"),
            first_rejection: None,
            unfinished: 0,
            redirected: 0,
            missed_arrivals: 0,
            invariant_violations: 0,
            commit_buckets: Vec::new(),
            first_violation: None,
        }
    }
}

impl ClientStats {
    pub fn record_commit(&mut self, ops: u32, latency_us: u64) {
        self.commits += 1;
        self.ops += ops as u64;
        self.latency_us.saturating_record(latency_us.max(1));
    }

    /// Notes a commit `since` the run's epoch (one epoch for every driver thread).
    pub fn record_commit_time(&mut self, since: std::time::Duration) {
        let i = (since.as_millis() as u64 / STALL_BUCKET_MS) as usize;
        if i >= MAX_STALL_BUCKETS {
            return;
        }
        if i >= self.commit_buckets.len() {
            self.commit_buckets.resize(i + 1, 0);
        }
        self.commit_buckets[i] += 1;
    }

    /// The longest time between the first and the last commit recorded with
    /// `record_commit_time` (the whole run's) in which nothing committed (to `STALL_BUCKET_MS`): how long a
    /// fail-over left the cluster unavailable, for instance.
    pub fn longest_stall_ms(&self) -> u64 {
        let b = &self.commit_buckets;
        let (Some(first), Some(last)) = (
            b.iter().position(|&n| n > 0),
            b.iter().rposition(|&n| n > 0),
        ) else {
            return 0;
        };
        let longest = b[first..=last].split(|&n| n > 0).map(<[u32]>::len).max();
        longest.unwrap_or(0) as u64 * STALL_BUCKET_MS
    }

    pub fn record_cc_abort(&mut self, cause: CcAbortCause) {
        *self.cc_aborts.entry(cause).or_default() += 1;
    }

    pub fn record_logic_abort(&mut self, why: &str) {
        self.logic_aborts += 1;
        let known =
            self.logic_reasons.len() < LOGIC_REASONS || self.logic_reasons.contains_key(why);
        let reason = if known { why } else { "other" };
        match self.logic_reasons.get_mut(reason) {
            Some(n) => *n += 1,
            None => {
                self.logic_reasons.insert(reason.to_string(), 1);
            }
        }
    }

    pub fn cc_abort_total(&self) -> u64 {
        self.cc_aborts.values().sum()
    }

    pub fn merge(&mut self, other: &ClientStats) {
        self.commits += other.commits;
        self.ops += other.ops;
        self.logic_aborts += other.logic_aborts;
        for (why, n) in &other.logic_reasons {
            *self.logic_reasons.entry(why.clone()).or_default() += n;
        }
        self.rejected += other.rejected;
        for (cause, n) in &other.cc_aborts {
            *self.cc_aborts.entry(*cause).or_default() += n;
        }
        self.latency_us
            .add(&other.latency_us)
            .expect("histograms share bounds");
        if self.first_rejection.is_none() {
            self.first_rejection = other.first_rejection.clone();
        }
        self.unfinished += other.unfinished;
        self.redirected += other.redirected;
        if self.commit_buckets.len() < other.commit_buckets.len() {
            self.commit_buckets.resize(other.commit_buckets.len(), 0);
        }
        for (a, b) in self.commit_buckets.iter_mut().zip(&other.commit_buckets) {
            *a += b;
        }
        self.missed_arrivals += other.missed_arrivals;
        self.invariant_violations += other.invariant_violations;
        if self.first_violation.is_none() {
            self.first_violation = other.first_violation.clone();
        }
    }
}

/// The one back-off policy after a concurrency-control abort, shared by every protocol:
/// wait a uniformly random time in `[0, min(max, base * 2^retries))` microseconds.
#[derive(Clone, Copy, Debug)]
pub struct Backoff {
    pub base_us: u64,
    pub max_us: u64,
}

impl Backoff {
    pub fn delay_us(&self, retries: u32, rng: &mut qstore_core::rng::Rng) -> u64 {
        use rand::Rng as _;
        let cap = self
            .base_us
            .saturating_mul(1u64 << retries.min(32))
            .min(self.max_us);
        if cap == 0 {
            0
        } else {
            rng.random_range(0..cap)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_exponentially_up_to_the_cap() {
        let b = Backoff {
            base_us: 10,
            max_us: 1000,
        };
        let mut rng = qstore_core::rng::stream(1, 1);
        for retries in 0..40 {
            let cap = (10u64 << retries.min(32)).min(1000);
            for _ in 0..50 {
                assert!(b.delay_us(retries, &mut rng) < cap);
            }
        }
        let zero = Backoff {
            base_us: 0,
            max_us: 0,
        };
        assert_eq!(zero.delay_us(3, &mut rng), 0);
    }

    #[test]
    fn the_longest_stall_is_between_commits() {
        let ms = std::time::Duration::from_millis;
        let mut a = ClientStats::default();
        assert_eq!(a.longest_stall_ms(), 0);
        a.record_commit_time(ms(25)); // bucket 2: the time before it is no stall
        a.record_commit_time(ms(31));
        let mut b = ClientStats::default();
        b.record_commit_time(ms(105)); // buckets 4..=9 empty: 60 ms
        b.record_commit_time(ms(117));
        a.merge(&b);
        assert_eq!(a.longest_stall_ms(), 60);
        a.commit_buckets.extend([0; 50]); // nothing at the end: the run stopped, no stall
        assert_eq!(a.longest_stall_ms(), 60);
    }

    #[test]
    fn merge_adds_everything() {
        let mut a = ClientStats::default();
        a.record_commit(4, 100);
        a.record_cc_abort(CcAbortCause::Conflict);
        let mut b = ClientStats::default();
        b.record_commit(4, 300);
        b.record_cc_abort(CcAbortCause::Conflict);
        b.logic_aborts = 2;
        a.merge(&b);
        assert_eq!(
            (a.commits, a.ops, a.logic_aborts, a.cc_abort_total()),
            (2, 8, 2, 2)
        );
        assert_eq!(a.latency_us.len(), 2);
    }
}
