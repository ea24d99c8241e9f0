//! When a group's leader gives up on its cluster instance: the instance had work and finished
//! nothing for `replication.stall_ms` while one of its servers is unreachable (it cannot go
//! on without that server), or for `HUNG_STALLS` times as long with every server reachable (a
//! hung server; a shorter wait could give up an instance that only waits for another group,
//! whose own leader is the one in trouble).

use qstore_core::NodeId;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How many times `replication.stall_ms` a leader waits for its instance, all of whose nodes
/// are reachable, before it takes the instance for broken.
pub const HUNG_STALLS: u32 = 5;

/// A member's watch over its cluster instance's progress.
pub struct StallWatch {
    start: Instant,
    /// When the instance last made progress, in nanoseconds after `start` (an atomic: the
    /// threads that see progress note it on every batch or transaction).
    progress: AtomicU64,
    stall: Duration,
}

impl StallWatch {
    pub fn new(stall: Duration) -> Self {
        StallWatch {
            start: Instant::now(),
            progress: AtomicU64::new(0),
            stall,
        }
    }

    /// The instance made progress (or the member just became leader: the stall clock starts
    /// now, not when the last leader left).
    pub fn progressed(&self) {
        self.progressed_at(self.start.elapsed());
    }

    /// [`StallWatch::progressed`] at `now` after the watch started.
    fn progressed_at(&self, now: Duration) {
        self.progress
            .fetch_max(now.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Why the instance is to be given up, if it is: asked at every tick of a leading member,
    /// with whether the instance has work (`busy`) and a server of it that is unreachable, if
    /// one is (`lost`, asked only once the instance stalled).
    pub fn verdict(&self, busy: bool, lost: impl FnOnce() -> Option<NodeId>) -> Option<String> {
        self.verdict_at(self.start.elapsed(), busy, lost)
    }

    /// [`StallWatch::verdict`] at `now` after the watch started.
    fn verdict_at(
        &self,
        now: Duration,
        busy: bool,
        lost: impl FnOnce() -> Option<NodeId>,
    ) -> Option<String> {
        if !busy {
            self.progressed_at(now);
            return None;
        }
        let since = Duration::from_nanos(self.progress.load(Ordering::Relaxed));
        let stalled = now.saturating_sub(since);
        if stalled < self.stall {
            return None;
        }
        let why = match lost() {
            Some(n) => format!("node {n} is unreachable"),
            None if stalled >= self.stall * HUNG_STALLS => "every node is reachable".into(),
            None => return None,
        };
        Some(format!(
            "its instance finished nothing in {} ms ({why})",
            stalled.as_millis()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instance_is_given_up_only_when_stalled_with_work() {
        let w = StallWatch::new(Duration::from_millis(20));
        let ms = Duration::from_millis;
        let lost = || Some(NodeId(3));
        assert_eq!(w.verdict_at(ms(10), true, lost), None, "not stalled yet");
        // Idle: nothing to finish, so no stall (and the clock restarts).
        assert_eq!(w.verdict_at(ms(30), false, lost), None);
        assert_eq!(w.verdict_at(ms(45), true, lost), None);
        assert_eq!(
            w.verdict_at(ms(60), true, || None),
            None,
            "every node reachable: wait longer"
        );
        let why = w
            .verdict_at(ms(60), true, lost)
            .expect("stalled, a node lost");
        assert!(
            why.contains("n3 is unreachable") && why.contains("30 ms"),
            "{why}"
        );
        w.progressed_at(ms(70));
        assert_eq!(w.verdict_at(ms(80), true, lost), None);
        let hung = ms(70) + ms(20) * HUNG_STALLS;
        assert_eq!(w.verdict_at(hung - ms(1), true, || None), None);
        let why = w.verdict_at(hung, true, || None).expect("hung");
        assert!(why.contains("every node is reachable"), "{why}");
        // The real clock drives the same.
        w.progressed();
        assert_eq!(w.verdict(true, lost), None);
    }
}
