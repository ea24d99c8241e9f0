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
    /// Tells the node's threads to stop, and wakes those that sleep.
    fn stop(&self);
    /// Answers `Rejected` every transaction still unanswered (after the threads stopped).
    fn reject_leftovers(&self);
}

/// Stops `nodes` (those this process hosts) and joins `threads`, giving the transactions in
/// flight, and the copies behind their group's log, up to `quiesce` to finish.
pub(crate) fn shut_down<N: NodeShell>(
    nodes: &[&N],
    threads: &Mutex<Vec<JoinHandle<()>>>,
    quiesce: Duration,
) {
    for n in nodes {
        n.close_admission();
    }
    let deadline = Instant::now() + quiesce;
    let quiescent = || nodes.iter().all(|n| n.quiescent());
    wait_until(deadline, quiescent);
    // What any member knew committed once nothing was in flight (leaders may go on
    // committing empty batches: a fixed target, not the moving last entry).
    let targets = commit_targets(nodes);
    let caught_up = || {
        nodes
            .iter()
            .filter_map(|n| n.log_position())
            .all(|p| p.applied >= targets.get(&p.group).copied().unwrap_or(0))
    };
    if !wait_until(deadline, || caught_up() && quiescent()) {
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

/// By group, the last entry any of `nodes`' members knows committed.
fn commit_targets<N: NodeShell>(nodes: &[&N]) -> HashMap<u32, u64> {
    let mut targets = HashMap::new();
    for p in nodes.iter().filter_map(|n| n.log_position()) {
        let t = targets.entry(p.group).or_insert(0);
        *t = p.committed.max(*t);
    }
    targets
}

/// Polls `done` until it holds (true) or `deadline` passes (false).
fn wait_until(deadline: Instant, done: impl Fn() -> bool) -> bool {
    while !done() {
        if Instant::now() >= deadline {
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

    /// A node of group 0 whose member applies one entry per poll until it reached `until`.
    struct Member {
        applied: AtomicU64,
        committed: u64,
        until: u64,
        stopped: Arc<AtomicBool>,
        applied_when_stopped: Arc<AtomicU64>,
    }

    impl NodeShell for Member {
        fn close_admission(&self) {}
        fn quiescent(&self) -> bool {
            true
        }
        fn log_position(&self) -> Option<LogPosition> {
            let a = self.applied.load(Ordering::SeqCst);
            if a < self.until {
                self.applied.store(a + 1, Ordering::SeqCst);
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
        let stopped = Arc::new(AtomicBool::new(false));
        let when = Arc::new(AtomicU64::new(0));
        let leader = Member {
            applied: AtomicU64::new(40),
            committed: 40,
            until: 40,
            stopped: stopped.clone(),
            applied_when_stopped: Arc::new(AtomicU64::new(0)),
        };
        let follower = Member {
            applied: AtomicU64::new(30),
            committed: 30,
            until: 45,
            stopped: stopped.clone(),
            applied_when_stopped: when.clone(),
        };
        let threads = Mutex::new(Vec::new());
        shut_down(&[&leader, &follower], &threads, Duration::from_secs(10));
        assert!(stopped.load(Ordering::SeqCst));
        assert!(
            when.load(Ordering::SeqCst) >= 40,
            "stopped at entry {} of 40",
            when.load(Ordering::SeqCst)
        );
    }
}
