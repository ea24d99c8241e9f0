//! Where the worker threads' time goes, activity by activity: the determinism study's time
//! breakdown (Ren, Thomson and Abadi, VLDB 2014, figure 2) of useful transaction work, lock
//! acquisition, deadlock detection and handling, two-phase commit and idle waiting (with
//! Q-Store's planning, and everything else a worker does, beside them).
//!
//! Cheap enough to stay on in every run: each worker thread keeps its own account (plain
//! nanosecond totals in a thread-local) and publishes a total it grew with a relaxed store to
//! an atomic that only it writes; a snapshot sums those. No lock, no shared cache line.
//!
//! Protocol code says what it is doing with [`enter`] (or [`during`]) wherever it is, without
//! a handle: the guard returns the thread to its previous activity when dropped, so nested
//! work (a message to this node handled inline, a lock taken while running a transaction's
//! accesses) is accounted to the innermost activity. Only threads attached to a node's
//! [`WorkerTimes`] account anything; on others (client threads running a transaction inline,
//! network threads, the deadlock detector) marking an activity costs a thread-local read.
//!
//! A worker's loop cuts its time into pieces of work ([`piece`]: a message, a transaction's
//! next step, a queue). Where a piece changes activity often, reading the clock at every
//! change would cost a short transaction a visible share of its time (2PL takes a lock per
//! access), so one piece in [`DETAIL`], drawn at random, is timed activity by activity; the
//! other pieces are timed as a whole, at no cost while they follow each other, and their
//! time is split in the proportions the detailed pieces measured on the same thread. Idle
//! time is always timed exactly. So the shares add up to the threads' wall time exactly, and
//! how it is split among the busy activities is an estimate from thousands of pieces a
//! second. Where pieces are long or change activity rarely (a Q-Store queue, a Calvin
//! transaction), every piece is detailed: a few clock reads per piece cost nothing there,
//! and a sample of few long pieces would vary.
//!
//! Totals are published as intervals close, so a snapshot leaves out the interval each thread
//! is in (at most one idle wait, 5-20 ms): over a window of a second or more, the time
//! accounted is the threads' wall time to within a few percent, and shares are taken of that.

use crate::stages::{StageTotal, StageTotals};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// What a worker thread is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activity {
    /// Transaction logic: step functions and the storage accesses they make.
    Useful,
    /// Acquiring and releasing locks: the lock table's code (a 2PL participant; the other
    /// interactive protocols' concurrency control at each access), or Calvin's lock manager
    /// thread.
    Lock,
    /// Finding and breaking deadlocks: answering the detector, aborting its victims.
    Deadlock,
    /// Two-phase commit: prepare, commit and abort messages, and their log records.
    TwoPhaseCommit,
    /// Q-Store's planning: placing a batch's fragments in execution queues.
    Planning,
    /// Everything else a worker does: messages and their routing, coordinator bookkeeping,
    /// admission, answering clients.
    Other,
    /// Waiting for work: every transaction it could run waits for a lock or a message.
    Idle,
}

/// The activities as results name them, in the order of [`Activity`].
pub const ACTIVITIES: [&str; 7] = [
    "useful", "lock", "deadlock", "2pc", "planning", "other", "idle",
];

const N: usize = ACTIVITIES.len();

/// Where pieces of work change activity often, one in this many is timed activity by
/// activity (see the module's notes).
pub const DETAIL: u64 = 16;

/// One thread's published totals (nanoseconds per activity). Aligned to keep two threads'
/// accounts off one cache line.
#[repr(align(128))]
#[derive(Default)]
struct Account {
    ns: [AtomicU64; N],
}

/// The accounts of one node's worker threads.
#[derive(Default)]
pub struct WorkerTimes {
    threads: Mutex<Vec<Arc<Account>>>,
}

impl WorkerTimes {
    /// Accounts the calling thread's time to this node from now on, until the returned
    /// guard drops: a worker holds it for its life, and marks each piece of work it starts
    /// ([`piece`]). One piece in `every` is timed activity by activity ([`DETAIL`], or 1).
    pub fn attach(&self, every: u64) -> Attached {
        let account = Arc::new(Account::default());
        self.threads.lock().push(account.clone());
        let clock = ThreadClock::new(account, every, Instant::now());
        CLOCK.with(|c| *c.borrow_mut() = Some(clock));
        Attached(PhantomData)
    }

    /// Nanoseconds per activity so far, summed over the node's worker threads (one stage
    /// per activity, named as [`ACTIVITIES`]).
    pub fn totals(&self) -> StageTotals {
        let mut ns = [0u64; N];
        for account in self.threads.lock().iter() {
            for (sum, a) in ns.iter_mut().zip(&account.ns) {
                *sum += a.load(Ordering::Relaxed);
            }
        }
        StageTotals {
            names: ACTIVITIES.iter().map(|a| a.to_string()).collect(),
            per_txn: false,
            stages: ns
                .iter()
                .map(|&ns| StageTotal {
                    ns,
                    ..StageTotal::default()
                })
                .collect(),
        }
    }
}

/// A worker thread's attachment to its node's [`WorkerTimes`]; dropping it accounts the
/// last interval and detaches the thread. Not `Send`: it belongs to the thread.
pub struct Attached(PhantomData<*const ()>);

impl Drop for Attached {
    fn drop(&mut self) {
        CLOCK.with(|c| {
            if let Some(mut clock) = c.borrow_mut().take() {
                clock.close(Instant::now());
            }
        });
    }
}

/// The account of the thread it lives in.
struct ThreadClock {
    account: Arc<Account>,
    /// The published totals.
    ns: [u64; N],
    /// What the open interval is: `now`, timed exactly when idle or within a detailed
    /// piece; otherwise pieces timed as a whole (since the first of them started in `now`).
    now: Activity,
    detailed: bool,
    since: Instant,
    /// Busy time per activity within detailed pieces: the proportions of the split.
    sampled: [u64; N],
    sampled_all: u64,
    /// One piece in `every` is detailed, drawn with this xorshift state.
    every: u64,
    rng: u64,
}

impl ThreadClock {
    fn new(account: Arc<Account>, every: u64, since: Instant) -> Self {
        // Any odd seed will do; threads differ by their accounts' addresses.
        let seed = (Arc::as_ptr(&account) as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        ThreadClock {
            account,
            ns: [0; N],
            now: Activity::Other,
            detailed: false,
            since,
            sampled: [0; N],
            sampled_all: 0,
            every: every.max(1),
            rng: seed,
        }
    }

    /// A new piece of work starts, in activity `base`; `clock` reads the time, if needed.
    fn piece(&mut self, base: Activity, clock: impl FnOnce() -> Instant) {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let detailed = self.rng.is_multiple_of(self.every);
        if !detailed && !self.detailed && self.now != Activity::Idle {
            // One more piece timed as a whole with the ones before it: no clock read.
            return;
        }
        self.close(clock());
        (self.now, self.detailed) = (base, detailed);
    }

    /// Accounts the thread's time to `to` from now, if that changes what is accounted
    /// (idle always does; other activities only within a detailed piece); returns the
    /// activity it left if so.
    #[inline]
    fn switch(&mut self, to: Activity, clock: impl FnOnce() -> Instant) -> Option<Activity> {
        let timed = self.detailed || to == Activity::Idle || self.now == Activity::Idle;
        if to == self.now || !timed {
            return None;
        }
        self.close(clock());
        Some(std::mem::replace(&mut self.now, to))
    }

    /// Accounts the open interval, up to `at`.
    fn close(&mut self, at: Instant) {
        let d = at.saturating_duration_since(self.since).as_nanos() as u64;
        self.since = at;
        let i = self.now as usize;
        if self.now == Activity::Idle {
            self.add(i, d);
        } else if self.detailed {
            self.add(i, d);
            self.sampled[i] += d;
            self.sampled_all += d;
        } else {
            self.split(d);
        }
    }

    /// Accounts `d` of pieces timed as a whole in the proportions of the detailed ones (to
    /// the activity they started in while there are none yet).
    fn split(&mut self, d: u64) {
        let mut left = d;
        if self.sampled_all > 0 {
            for i in 0..N {
                let part = (u128::from(d) * u128::from(self.sampled[i])
                    / u128::from(self.sampled_all)) as u64;
                if part > 0 {
                    self.add(i, part);
                    left -= part;
                }
            }
        }
        // What rounding left (or all of it): the shares still add up to the wall time.
        self.add(self.now as usize, left);
    }

    fn add(&mut self, i: usize, d: u64) {
        self.ns[i] += d;
        self.account.ns[i].store(self.ns[i], Ordering::Relaxed);
    }
}

thread_local! {
    static CLOCK: RefCell<Option<ThreadClock>> = const { RefCell::new(None) };
}

/// Runs `f` on the calling thread's clock, if it is attached.
#[inline]
fn with_clock<T>(f: impl FnOnce(&mut ThreadClock) -> Option<T>) -> Option<T> {
    CLOCK.with(|c| f(c.try_borrow_mut().ok()?.as_mut()?))
}

/// A worker starts a piece of work (a message, a transaction's next step, a queue), in
/// activity `base` until it says otherwise. Its loop calls this before each piece.
#[inline]
pub fn piece(base: Activity) {
    with_clock(|c| {
        c.piece(base, Instant::now);
        Some(())
    });
}

/// Accounts the thread's time to `a` until the guard drops, then to what it did before.
#[inline]
pub fn enter(a: Activity) -> Entered {
    Entered(with_clock(|c| c.switch(a, Instant::now)), PhantomData)
}

/// The guard of [`enter`].
#[must_use = "the activity ends when the guard drops"]
pub struct Entered(Option<Activity>, PhantomData<*const ()>);

impl Drop for Entered {
    #[inline]
    fn drop(&mut self) {
        if let Some(back) = self.0 {
            with_clock(|c| c.switch(back, Instant::now));
        }
    }
}

/// Runs `f` accounted to `a`.
#[inline]
pub fn during<T>(a: Activity, f: impl FnOnce() -> T) -> T {
    let _in = enter(a);
    f()
}

/// Shares of the workers' time over a window, from the totals of [`WorkerTimes`] (summed
/// over nodes or for one).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TimeShares {
    /// Worker time accounted, in seconds: the worker threads' wall time over the window
    /// (worker threads x window length, to within the intervals open at its ends).
    pub worker_s: f64,
    /// Percentage of that time per activity (by [`ACTIVITIES`] name); they add up to 100.
    pub pct: BTreeMap<String, f64>,
}

impl TimeShares {
    /// The shares of `t`, or `None` if no time was accounted.
    pub fn of(t: &StageTotals) -> Option<TimeShares> {
        let all: u64 = t.stages.iter().map(|s| s.ns).sum();
        (all > 0).then(|| TimeShares {
            worker_s: all as f64 / 1e9,
            pct: t
                .names
                .iter()
                .zip(&t.stages)
                .map(|(name, s)| (name.clone(), 100.0 * s.ns as f64 / all as f64))
                .collect(),
        })
    }

    /// The share of activity `name` in percent (0 if it has none).
    pub fn pct(&self, name: &str) -> f64 {
        self.pct.get(name).copied().unwrap_or(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn spin(d: Duration) {
        let start = Instant::now();
        while start.elapsed() < d {
            std::hint::spin_loop();
        }
    }

    #[test]
    fn nested_activities_are_accounted_to_the_innermost_and_add_up_to_the_wall_time() {
        let times = WorkerTimes::default();
        let began = Instant::now();
        std::thread::scope(|s| {
            s.spawn(|| {
                // Every piece detailed.
                let _attached = times.attach(1);
                piece(Activity::Other);
                let _useful = enter(Activity::Useful);
                spin(Duration::from_millis(20));
                during(Activity::Lock, || {
                    spin(Duration::from_millis(10));
                    // Already locking: no change, nothing to restore.
                    during(Activity::Lock, || spin(Duration::from_millis(10)));
                });
                spin(Duration::from_millis(20));
                drop(_useful);
                during(Activity::Idle, || {
                    std::thread::sleep(Duration::from_millis(30))
                });
            });
            // A thread that is not attached accounts nothing.
            s.spawn(|| during(Activity::Useful, || spin(Duration::from_millis(5))));
        });
        let wall = began.elapsed().as_secs_f64();
        let shares = TimeShares::of(&times.totals()).unwrap();
        assert!(
            shares.worker_s <= wall && shares.worker_s >= 0.09,
            "{shares:?}, wall {wall}"
        );
        let total: f64 = shares.pct.values().sum();
        assert!((total - 100.0).abs() < 1e-6, "{shares:?}");
        let ms = |name| shares.pct(name) * shares.worker_s * 10.0;
        assert!((40.0..60.0).contains(&ms("useful")), "{shares:?}");
        assert!((20.0..35.0).contains(&ms("lock")), "{shares:?}");
        assert!(ms("idle") >= 30.0, "{shares:?}");
        assert_eq!(shares.pct("deadlock"), 0.0);
    }

    /// Pieces timed as a whole are split as the detailed ones were, idle time between them
    /// is timed exactly, and only detailed pieces read the clock inside. On a clock of its
    /// own: each piece spends 30 us in useful work, then 10 us taking locks.
    #[test]
    fn pieces_not_detailed_are_split_as_the_detailed_ones_and_idle_is_exact() {
        let start = Instant::now();
        let t = std::cell::Cell::new(start);
        let reads = std::cell::Cell::new(0u64);
        let clock = || {
            reads.set(reads.get() + 1);
            t.get()
        };
        let pass = |us| t.set(t.get() + Duration::from_micros(us));
        let mut c = ThreadClock::new(Arc::default(), 4, start);
        for i in 0..2_000 {
            c.piece(Activity::Other, clock);
            let was = c.switch(Activity::Useful, clock);
            pass(30);
            c.switch(Activity::Lock, clock);
            pass(10);
            if let Some(was) = was {
                c.switch(was, clock);
            }
            if i % 100 == 99 {
                let busy = c.switch(Activity::Idle, clock).unwrap();
                pass(400);
                c.switch(busy, clock);
            }
        }
        c.close(t.get());
        let ns = |a: Activity| c.ns[a as usize] as f64;
        assert_eq!(c.ns.iter().sum::<u64>(), 2_000 * 40_000 + 20 * 400_000);
        assert_eq!(ns(Activity::Idle), 20.0 * 400_000.0);
        // Exactly 3:1 while the proportions are known (the first pieces are accounted to
        // where they started).
        let (useful, lock) = (ns(Activity::Useful), ns(Activity::Lock));
        assert!((useful / lock - 3.0).abs() < 0.01, "{:?}", c.ns);
        assert!(ns(Activity::Other) < 0.01 * useful, "{:?}", c.ns);
        // About one piece in 4 read the clock inside it.
        assert!((1_500..3_000).contains(&reads.get()), "{}", reads.get());
    }

    #[test]
    fn no_time_no_shares() {
        assert!(TimeShares::of(&WorkerTimes::default().totals()).is_none());
    }
}
