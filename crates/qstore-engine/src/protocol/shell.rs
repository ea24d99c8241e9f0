//! The node shell every multi-threaded protocol shares: how a cluster's nodes stop. New
//! requests are refused, the transactions in flight are given a while to finish everywhere
//! (an abort on its way to a participant must still roll back there, or the data would keep
//! its writes), then the threads stop and whatever is left is answered `Rejected`.
//!
//! With replication, a member of a group learns that an entry committed a message after the
//! leader does: a copy whose member has not applied the group's last entries is still
//! behind when every transaction has been answered (from the leaders' instances). The shell
//! also waits for every member in service to apply what its group committed, so that all
//! copies stop in the same state.
//!
//! The waits end when nothing moves for a while, not at a fixed time: a follower that runs
//! a long tail of its log's entries on a slow machine is still waited for, and a node that
//! is stuck does not hold the shutdown for long.

use crate::replication::GroupLog;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Where a replicated node in service is in its group's log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LogPosition {
    /// Its partition (its group).
    pub group: u32,
    /// The index of the last entry it applied, and of the last it knows committed.
    pub applied: u64,
    pub committed: u64,
}

impl LogPosition {
    /// Where `member`, of group `group`, is in its log (`None` without a member, or with a
    /// log that does not number its entries alike everywhere).
    pub fn of(group: u32, member: Option<&impl GroupLog>) -> Option<Self> {
        let (applied, committed) = member?.position()?;
        Some(LogPosition {
            group,
            applied,
            committed,
        })
    }
}

/// A protocol's node, as the shell stops it.
pub(crate) trait NodeShell {
    /// Refuses new requests; those already admitted go on.
    fn close_admission(&self);
    /// Whether nothing is in flight: every admitted transaction is answered and its work
    /// done on this node.
    fn quiescent(&self) -> bool;
    /// Replicated and in service: where the node's member is in its group's log (`None`
    /// otherwise: a stale node holds what its log commits, and is rebuilt later).
    fn log_position(&self) -> Option<LogPosition> {
        None
    }
    /// How many transactions the node still works on (0 if it does not count them): the
    /// shutdown waits while this falls.
    fn in_flight(&self) -> usize {
        0
    }
    /// Tells the node's threads to stop, and wakes those that sleep.
    fn stop(&self);
    /// Answers `Rejected` every transaction still unanswered (after the threads stopped).
    fn reject_leftovers(&self);
}

/// Stops `nodes` (those this process hosts) and joins `threads`. The transactions in flight,
/// and the copies behind their group's log, get to finish as long as they keep moving: the
/// wait ends once nothing moved for `quiesce` (or after `MAX_QUIESCE_STEPS` of it).
pub(crate) fn shut_down<N: NodeShell>(
    nodes: &[&N],
    threads: &Mutex<Vec<JoinHandle<()>>>,
    quiesce: Duration,
) {
    for n in nodes {
        n.close_admission();
    }
    let end = Instant::now() + quiesce * MAX_QUIESCE_STEPS;
    let quiescent = || nodes.iter().all(|n| n.quiescent());
    let in_flight = || nodes.iter().map(|n| n.in_flight() as u64).sum::<u64>();
    wait_while_moving(quiesce, end, quiescent, in_flight);
    // What any member knew committed once nothing was in flight (leaders may go on
    // committing empty batches: a fixed target, not the moving last entry).
    let targets = commit_targets(nodes);
    let target = |p: &LogPosition| targets.get(&p.group).copied().unwrap_or(0);
    let positions = || nodes.iter().filter_map(|n| n.log_position());
    let caught_up = || positions().all(|p| p.applied >= target(&p));
    let applied = || positions().map(|p| p.applied.min(target(&p))).sum::<u64>();
    let done = || caught_up() && quiescent();
    if !wait_while_moving(quiesce, end, done, || applied() + in_flight()) {
        tracing::warn!("stopping with transactions still in flight");
    }
    for n in nodes {
        n.stop();
    }
    for h in threads.lock().drain(..) {
        let _ = h.join();
    }
    for n in nodes {
        n.reject_leftovers();
    }
}

/// The longest shutdown wait, in `quiesce` times: a cluster that keeps moving but never
/// settles (a node that keeps taking work) is stopped all the same.
const MAX_QUIESCE_STEPS: u32 = 15;

/// By group, the last entry any of `nodes`' members knows committed.
fn commit_targets<N: NodeShell>(nodes: &[&N]) -> HashMap<u32, u64> {
    let mut targets = HashMap::new();
    for p in nodes.iter().filter_map(|n| n.log_position()) {
        let t = targets.entry(p.group).or_insert(0);
        *t = p.committed.max(*t);
    }
    targets
}

/// Polls `done` until it holds (true), or until `progress` stayed the same for `stall`, or
/// `end` passes (false).
fn wait_while_moving(
    stall: Duration,
    end: Instant,
    done: impl Fn() -> bool,
    progress: impl Fn() -> u64,
) -> bool {
    let mut last = progress();
    let mut moved = Instant::now();
    while !done() {
        let now = Instant::now();
        let p = progress();
        if p != last {
            (last, moved) = (p, now);
        }
        if now >= end || now - moved >= stall {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;

    /// A node of group 0 whose member applies one entry per poll, at most one every `pace`,
    /// until it reached `until`.
    struct Member {
        applied: AtomicU64,
        committed: u64,
        until: u64,
        pace: Duration,
        last: parking_lot::Mutex<Instant>,
        stopped: Arc<AtomicBool>,
        applied_when_stopped: Arc<AtomicU64>,
    }

    impl Member {
        fn new(applied: u64, committed: u64, until: u64, pace: Duration) -> Self {
            Member {
                applied: AtomicU64::new(applied),
                committed,
                until,
                pace,
                last: parking_lot::Mutex::new(Instant::now()),
                stopped: Arc::default(),
                applied_when_stopped: Arc::default(),
            }
        }

        fn applied_when_stopped(&self) -> u64 {
            assert!(self.stopped.load(Ordering::SeqCst));
            self.applied_when_stopped.load(Ordering::SeqCst)
        }
    }

    impl NodeShell for Member {
        fn close_admission(&self) {}
        fn quiescent(&self) -> bool {
            true
        }
        fn log_position(&self) -> Option<LogPosition> {
            let a = self.applied.load(Ordering::SeqCst);
            let mut last = self.last.lock();
            if a < self.until && last.elapsed() >= self.pace {
                self.applied.store(a + 1, Ordering::SeqCst);
                *last = Instant::now();
            }
            Some(LogPosition {
                group: 0,
                applied: a,
                committed: self.committed,
            })
        }
        fn stop(&self) {
            self.stopped.store(true, Ordering::SeqCst);
            self.applied_when_stopped
                .store(self.applied.load(Ordering::SeqCst), Ordering::SeqCst);
        }
        fn reject_leftovers(&self) {}
    }

    /// Every transaction answered, but a follower has not yet applied the last entries the
    /// leader committed: its copy would stop behind the others.
    #[test]
    fn a_member_behind_its_group_is_waited_for() {
        let leader = Member::new(40, 40, 40, Duration::ZERO);
        let follower = Member::new(30, 30, 45, Duration::ZERO);
        let threads = Mutex::new(Vec::new());
        shut_down(&[&leader, &follower], &threads, Duration::from_secs(10));
        let when = follower.applied_when_stopped();
        assert!(when >= 40, "stopped at entry {when} of 40");
    }

    /// A follower that takes far longer than `quiesce` to apply its tail (a slow machine) is
    /// waited for as long as it keeps applying.
    #[test]
    fn a_slow_member_is_waited_for_while_it_moves() {
        let leader = Member::new(40, 40, 40, Duration::ZERO);
        let follower = Member::new(0, 0, 45, Duration::from_millis(5));
        let threads = Mutex::new(Vec::new());
        shut_down(&[&leader, &follower], &threads, Duration::from_millis(60));
        let when = follower.applied_when_stopped();
        assert!(when >= 40, "stopped at entry {when} of 40");
    }

    /// A follower that never applies the entries its group committed holds the shutdown for
    /// `quiesce`, not longer.
    #[test]
    fn a_stuck_member_is_given_up_on() {
        let leader = Member::new(40, 40, 40, Duration::ZERO);
        let follower = Member::new(30, 30, 30, Duration::ZERO);
        let threads = Mutex::new(Vec::new());
        let start = Instant::now();
        shut_down(&[&leader, &follower], &threads, Duration::from_millis(100));
        assert_eq!(follower.applied_when_stopped(), 30);
        assert!(
            start.elapsed() < Duration::from_millis(1000),
            "{:?}",
            start.elapsed()
        );
    }
}
