//! Where a transaction's time and traffic go, phase by phase, as the Sundial paper breaks them
//! down (its figures 7b/7c): execution (the accesses, with H-Store's reservations), prepare,
//! commit, and everything spent on attempts that then aborted. The coordinator keeps one
//! account per attempt: the time between its phase changes, and the node-to-node messages
//! (and their bytes) it sent and received in each phase.

use crate::stages::Traffic;
use std::time::{Duration, Instant};

/// The phases, as the results name them.
pub(super) const PHASES: &[&str] = &["execution", "prepare", "commit", "aborted attempts"];
pub(super) const EXECUTION: usize = 0;
pub(super) const PREPARE: usize = 1;
pub(super) const COMMIT: usize = 2;
const ABORTED: usize = 3;

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

    /// The account of a finished attempt, to record: per phase if it committed, all of it
    /// as aborted otherwise.
    pub(super) fn close(&mut self, committed: bool) -> Vec<(usize, Duration, Traffic)> {
        let now = Instant::now();
        self.time[self.phase] += now - self.since;
        if committed {
            (0..3).map(|p| (p, self.time[p], self.traffic[p])).collect()
        } else {
            let all = self
                .traffic
                .iter()
                .fold(Traffic::default(), |a, t| Traffic {
                    msgs: a.msgs + t.msgs,
                    bytes: a.bytes + t.bytes,
                });
            vec![(ABORTED, now - self.started, all)]
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
        let costs = c.close(true);
        assert_eq!(costs.len(), 3);
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
        let costs = c.close(false);
        assert_eq!(costs.len(), 1);
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
