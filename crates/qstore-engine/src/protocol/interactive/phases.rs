//! Where a transaction's time and traffic go, phase by phase, as the Sundial paper breaks them
//! down (its figures 7b/7c): execution (the accesses, with H-Store's reservations), prepare,
//! commit, and everything spent on attempts that then aborted. The coordinator keeps one
//! account per attempt: the time between its phase changes, and the node-to-node messages
//! (and their bytes) it sent and received in each phase.
//!
//! One attempt in [`SAMPLE`] is measured (by its id, so committed and aborted attempts alike):
//! sizing every message and reading the clock at every phase change cost the protocols a few
//! percent of their throughput. Figures per transaction divide by the committed transactions
//! measured, so the sample gives the same figures as measuring all.

use crate::stages::Traffic;
use qstore_core::TxnId;
use std::time::{Duration, Instant};

/// The phases, as the results name them.
pub(super) const PHASES: &[&str] = &["execution", "prepare", "commit", "aborted attempts"];
pub(super) const EXECUTION: usize = 0;
pub(super) const PREPARE: usize = 1;
pub(super) const COMMIT: usize = 2;
const ABORTED: usize = 3;

/// One attempt in this many has its phases measured.
const SAMPLE: u64 = 8;

/// Whether attempt `txn`'s phases are measured.
pub(super) fn measured(txn: TxnId) -> bool {
    // Hashed: ids may be handed out in strides.
    (txn.0.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32).is_multiple_of(SAMPLE)
}

/// One attempt's account.
pub(super) struct PhaseCosts {
    started: Instant,
    /// The phase being accounted, since when.
    phase: usize,
    since: Instant,
    time: [Duration; 3],
    traffic: [Traffic; 3],
}

impl PhaseCosts {
    pub(super) fn start() -> Self {
        let now = Instant::now();
        PhaseCosts {
            started: now,
            phase: EXECUTION,
            since: now,
            time: [Duration::ZERO; 3],
            traffic: [Traffic::default(); 3],
        }
    }

    /// The attempt is now in `phase`.
    pub(super) fn enter(&mut self, phase: usize) {
        if phase != self.phase {
            let now = Instant::now();
            self.time[self.phase] += now - self.since;
            (self.phase, self.since) = (phase, now);
        }
    }

    /// A message of `bytes` about the attempt crossed the network in the current phase.
    pub(super) fn message(&mut self, bytes: usize) {
        let t = &mut self.traffic[self.phase];
        t.msgs += 1;
        t.bytes += bytes as u64;
    }

    /// The account of a finished attempt, to record (its first `n` entries): per phase if it
    /// committed, all of it as aborted otherwise. No allocation: this runs for every attempt.
    pub(super) fn close(&mut self, committed: bool) -> ([(usize, Duration, Traffic); 3], usize) {
        let now = Instant::now();
        self.time[self.phase] += now - self.since;
        let per_phase = |p: usize| (p, self.time[p], self.traffic[p]);
        if committed {
            ([per_phase(0), per_phase(1), per_phase(2)], 3)
        } else {
            let all = self
                .traffic
                .iter()
                .fold(Traffic::default(), |a, t| Traffic {
                    msgs: a.msgs + t.msgs,
                    bytes: a.bytes + t.bytes,
                });
            let whole = (ABORTED, now - self.started, all);
            ([whole; 3], 1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_committed_attempt_is_split_by_phase_and_an_aborted_one_counted_whole() {
        let mut c = PhaseCosts::start();
        c.message(100);
        c.enter(PREPARE);
        c.message(10);
        c.message(20);
        c.enter(COMMIT);
        let (costs, n) = c.close(true);
        assert_eq!(n, 3);
        assert_eq!(
            costs[EXECUTION].2,
            Traffic {
                msgs: 1,
                bytes: 100
            }
        );
        assert_eq!(costs[PREPARE].2, Traffic { msgs: 2, bytes: 30 });
        assert_eq!(costs[COMMIT].2, Traffic::default());

        c = PhaseCosts::start();
        c.message(100);
        c.enter(PREPARE);
        c.message(10);
        std::thread::sleep(Duration::from_millis(2));
        let (costs, n) = c.close(false);
        assert_eq!(n, 1);
        let (phase, time, traffic) = costs[0];
        assert_eq!(
            (phase, traffic),
            (
                ABORTED,
                Traffic {
                    msgs: 2,
                    bytes: 110
                }
            )
        );
        assert!(time >= Duration::from_millis(2));
    }
}
