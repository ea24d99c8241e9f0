//! Throttling, the determinism study's answer to a slow node for nondeterministic systems
//! (its section 3.5, figure 5b): a node that notices it falls behind refuses a growing
//! random share of the single-partition transactions submitted to it, so that its reduced
//! resources go to the distributed transactions the other nodes wait for; the share settles
//! where the node keeps up.
//!
//! Falling behind shows as other nodes' distributed transactions waiting here: their
//! accesses parked behind locks that this node's own transactions hold longer than they
//! would on a node that keeps up. (Messages from other nodes do not pile up: a worker
//! serves them before new local transactions.) Every [`ADJUST_EVERY`], the share grows by
//! [`STEP`] while more than [`BEHIND`] of them wait, and shrinks by as much once fewer than
//! a quarter of that do. A refused transaction ends as a concurrency-control abort (`throttled`) and its
//! client retries it after a back-off, as after any other.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// How often the share is adjusted.
const ADJUST_EVERY: Duration = Duration::from_millis(10);

/// Other nodes' transactions waiting here from which a node is behind.
const BEHIND: usize = 8;

/// How much the share moves per adjustment, in thousandths.
const STEP: u32 = 20;

/// The largest share refused, in thousandths: some local transactions always run.
const MAX_SHARE: u32 = 950;

pub(super) struct Throttle {
    /// The share of single-partition transactions refused, in thousandths.
    share: AtomicU32,
    adjusted: Mutex<Instant>,
    /// A cheap random stream (xorshift), advanced by every decision.
    draw: AtomicU32,
}

impl Throttle {
    pub fn new(seed: u32) -> Self {
        Throttle {
            share: AtomicU32::new(0),
            adjusted: Mutex::new(Instant::now()),
            draw: AtomicU32::new(seed | 1),
        }
    }

    /// Whether to refuse a transaction submitted here, which stays on this node (`single`);
    /// `waiting` counts the other nodes' transactions waiting here (asked only when the
    /// share is due to be adjusted).
    pub fn refuses(&self, single: bool, waiting: impl FnOnce() -> usize) -> bool {
        self.refuses_at(Instant::now(), single, waiting)
    }

    /// [`Throttle::refuses`] at time `now`.
    fn refuses_at(&self, now: Instant, single: bool, waiting: impl FnOnce() -> usize) -> bool {
        self.adjust(now, waiting);
        let share = self.share.load(Ordering::Relaxed);
        single && share > 0 && self.next_draw() % 1000 < share
    }

    fn adjust(&self, now: Instant, waiting: impl FnOnce() -> usize) {
        let Some(mut adjusted) = self.adjusted.try_lock() else {
            return; // another worker is adjusting
        };
        if now.saturating_duration_since(*adjusted) < ADJUST_EVERY {
            return;
        }
        *adjusted = now;
        let share = self.share.load(Ordering::Relaxed);
        let waiting = waiting();
        let next = if waiting > BEHIND {
            (share + STEP).min(MAX_SHARE)
        } else if waiting < BEHIND / 4 {
            share.saturating_sub(STEP)
        } else {
            share
        };
        self.share.store(next, Ordering::Relaxed);
    }

    fn next_draw(&self) -> u32 {
        let mut x = self.draw.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        self.draw.store(x, Ordering::Relaxed);
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Asks `t` once per simulated millisecond for a simulated second from `clock` (which it
    /// advances), with `waiting` transactions waiting; the share of `single` transactions
    /// refused in the last half.
    fn refused_share(t: &Throttle, clock: &mut Instant, waiting: usize, single: bool) -> f64 {
        let (mut refused, mut asked) = (0, 0);
        for ms in 0..1000 {
            *clock += Duration::from_millis(1);
            let r = t.refuses_at(*clock, single, || waiting);
            if ms >= 500 {
                asked += 1;
                refused += u32::from(r);
            }
        }
        f64::from(refused) / f64::from(asked)
    }

    #[test]
    fn a_node_behind_refuses_more_and_more_local_transactions_and_lets_go_when_it_catches_up() {
        let t = Throttle::new(7);
        let mut clock = Instant::now();
        let keeping_up = refused_share(&t, &mut clock, 0, true);
        assert_eq!(keeping_up, 0.0, "keeping up: nothing refused");
        let behind = refused_share(&t, &mut clock, 1000, true);
        assert!(behind > 0.8, "behind: {behind}");
        let distributed = refused_share(&t, &mut clock, 1000, false);
        assert_eq!(distributed, 0.0, "distributed transactions always run");
        let caught_up = refused_share(&t, &mut clock, 0, true);
        assert_eq!(caught_up, 0.0, "caught up: {caught_up}");
    }
}
