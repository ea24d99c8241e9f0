//! Calvin's deterministic lock managers, owned by a node's scheduler thread.
//!
//! The scheduler requests every lock a transaction needs on this node at once, transactions in
//! the global order; so conflicting transactions are granted in that order, and no deadlock
//! is possible (a transaction only ever waits for earlier ones). Transactions are named by a
//! small slot number the scheduler hands out and reuses.
//!
//! - [`LockTable`]: per record a FIFO queue of shared and exclusive requests; the compatible
//!   prefix of each queue is granted. A transaction runs once all its requests are granted.
//! - [`Vll`] (very lightweight locking, Ren, Thomson and Abadi, VLDB 2012): per record only
//!   two counters of requests (exclusive, shared) and one queue of the node's active
//!   transactions in order. A transaction whose records no earlier active transaction
//!   conflicts with when it arrives is free and runs at once; otherwise it is blocked until it
//!   reaches the front of the queue, or until selective contention analysis (SCA) finds that
//!   no earlier active transaction conflicts with it any more.

use qstore_core::config::CalvinLocks;
use qstore_core::{Key, TableId};
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::hash_map::Entry;
use std::collections::VecDeque;

pub type LockKey = (TableId, Key);

/// One lock a transaction needs on this node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockReq {
    pub key: LockKey,
    pub exclusive: bool,
}

/// The lock manager a node's scheduler uses.
pub enum LockManager {
    Table(LockTable),
    Vll(Vll),
}

impl LockManager {
    pub fn new(kind: CalvinLocks) -> Self {
        match kind {
            CalvinLocks::LockTable => LockManager::Table(LockTable::default()),
            CalvinLocks::Vll => LockManager::Vll(Vll::default()),
        }
    }

    /// Requests `locks` (distinct records) for `txn`, after every transaction requested so
    /// far. Returns whether the transaction may run now.
    pub fn request(&mut self, txn: u32, locks: &[LockReq]) -> bool {
        match self {
            LockManager::Table(t) => t.request(txn, locks),
            LockManager::Vll(v) => v.request(txn, locks),
        }
    }

    /// Releases the locks of `txn`, which ran; transactions that may run now are appended
    /// to `ready` in the global order.
    pub fn release(&mut self, txn: u32, locks: &[LockReq], ready: &mut Vec<u32>) {
        match self {
            LockManager::Table(t) => t.release(txn, locks, ready),
            LockManager::Vll(v) => v.release(txn, locks, ready),
        }
    }

    /// Transactions waiting for locks.
    pub fn blocked(&self) -> usize {
        match self {
            LockManager::Table(t) => t.blocked,
            LockManager::Vll(v) => v.blocked,
        }
    }

    /// VLL: entries of the transaction queue (what a contention analysis walks).
    pub fn queued(&self) -> usize {
        match self {
            LockManager::Table(_) => 0,
            LockManager::Vll(v) => v.queue.len(),
        }
    }

    /// VLL: selective contention analysis (see [`Vll::sca`]); a lock table always knows
    /// exactly which transactions may run, so it has nothing to find (and no queue).
    pub fn find_runnable<'a>(
        &mut self,
        locks_of: impl Fn(u32) -> &'a [LockReq],
        ready: &mut Vec<u32>,
    ) {
        if let LockManager::Vll(v) = self {
            v.sca(locks_of, ready);
        }
    }
}

/// Grows a per-transaction table to hold slot `txn`.
fn slot<T: Default + Clone>(v: &mut Vec<T>, txn: u32) -> &mut T {
    let i = txn as usize;
    if v.len() <= i {
        v.resize(i + 1, T::default());
    }
    &mut v[i]
}

/// End of a request list.
const NIL: u32 = u32::MAX;

/// One lock request, a link of its record's queue.
struct Req {
    txn: u32,
    exclusive: bool,
    next: u32,
}

/// The requests of one record, oldest first, as a list through [`LockTable::reqs`]; the first
/// `granted` hold the lock, `waiting` is the first that does not (or `NIL`).
#[derive(Clone, Copy)]
struct Queue {
    head: u32,
    tail: u32,
    waiting: u32,
    granted: u32,
}

/// A hash table of per-record request queues. Requests live in one slab of list nodes that
/// freed nodes go back to, so locking allocates nothing in the steady state and each request
/// or release costs one hash lookup.
#[derive(Default)]
pub struct LockTable {
    records: FxHashMap<LockKey, Queue>,
    reqs: Vec<Req>,
    free: Vec<u32>,
    /// Per transaction: requests not granted yet.
    waiting: Vec<u32>,
    blocked: usize,
}

impl LockTable {
    fn node(&mut self, txn: u32, exclusive: bool) -> u32 {
        let r = Req {
            txn,
            exclusive,
            next: NIL,
        };
        match self.free.pop() {
            Some(n) => {
                self.reqs[n as usize] = r;
                n
            }
            None => {
                self.reqs.push(r);
                self.reqs.len() as u32 - 1
            }
        }
    }

    pub fn request(&mut self, txn: u32, locks: &[LockReq]) -> bool {
        let mut waits = 0;
        for l in locks {
            let n = self.node(txn, l.exclusive);
            let q = self.records.entry(l.key).or_insert(Queue {
                head: NIL,
                tail: NIL,
                waiting: NIL,
                granted: 0,
            });
            // Granted only if every earlier request is granted and compatible with it.
            let grant = q.waiting == NIL
                && (q.head == NIL || (!l.exclusive && !self.reqs[q.head as usize].exclusive));
            if q.tail == NIL {
                q.head = n;
            } else {
                self.reqs[q.tail as usize].next = n;
            }
            q.tail = n;
            if grant {
                q.granted += 1;
            } else {
                waits += 1;
                if q.waiting == NIL {
                    q.waiting = n;
                }
            }
        }
        *slot(&mut self.waiting, txn) = waits;
        if waits > 0 {
            self.blocked += 1;
        }
        waits == 0
    }

    pub fn release(&mut self, txn: u32, locks: &[LockReq], ready: &mut Vec<u32>) {
        debug_assert_eq!(self.waiting.get(txn as usize).copied().unwrap_or(0), 0);
        for l in locks {
            let Entry::Occupied(mut e) = self.records.entry(l.key) else {
                debug_assert!(false, "release of a lock never requested");
                continue;
            };
            let q = e.get_mut();
            // Find the transaction among the holders and unlink it.
            let (mut prev, mut at) = (NIL, q.head);
            while at != q.waiting && self.reqs[at as usize].txn != txn {
                prev = at;
                at = self.reqs[at as usize].next;
            }
            if at == q.waiting {
                debug_assert!(false, "release of a lock not held");
                continue;
            }
            let next = self.reqs[at as usize].next;
            if prev == NIL {
                q.head = next;
            } else {
                self.reqs[prev as usize].next = next;
            }
            if q.tail == at {
                q.tail = prev;
            }
            self.free.push(at);
            q.granted -= 1;
            // Grant the compatible prefix behind the holders that remain.
            while q.waiting != NIL {
                let w = &self.reqs[q.waiting as usize];
                if q.granted > 0 && (w.exclusive || self.reqs[q.head as usize].exclusive) {
                    break;
                }
                let (t, next) = (w.txn, w.next);
                q.granted += 1;
                q.waiting = next;
                let left = &mut self.waiting[t as usize];
                *left -= 1;
                if *left == 0 {
                    self.blocked -= 1;
                    ready.push(t);
                }
            }
            if q.head == NIL {
                e.remove();
            }
        }
    }
}

/// Request counters of one record.
#[derive(Clone, Copy, Default)]
struct Counts {
    exclusive: u32,
    shared: u32,
}

#[derive(Clone, Copy)]
struct VllTxn {
    /// Its place in the queue; `INACTIVE` once released.
    seq: u64,
    blocked: bool,
}

impl Default for VllTxn {
    fn default() -> Self {
        VllTxn {
            seq: INACTIVE,
            blocked: false,
        }
    }
}

const INACTIVE: u64 = u64::MAX;

/// Very lightweight locking.
#[derive(Default)]
pub struct Vll {
    counts: FxHashMap<LockKey, Counts>,
    /// Active transactions in the global order, as (slot, seq); entries whose slot has moved
    /// on (released) are skipped and dropped when they reach the front.
    queue: VecDeque<(u32, u64)>,
    txns: Vec<VllTxn>,
    next_seq: u64,
    blocked: usize,
    /// SCA scratch: records written and read by earlier active transactions.
    dx: FxHashSet<LockKey>,
    ds: FxHashSet<LockKey>,
}

impl Vll {
    pub fn request(&mut self, txn: u32, locks: &[LockReq]) -> bool {
        let mut blocked = false;
        for l in locks {
            let c = self.counts.entry(l.key).or_default();
            if l.exclusive {
                c.exclusive += 1;
                blocked |= c.exclusive > 1 || c.shared > 0;
            } else {
                c.shared += 1;
                blocked |= c.exclusive > 0;
            }
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        *slot(&mut self.txns, txn) = VllTxn { seq, blocked };
        self.queue.push_back((txn, seq));
        if blocked {
            self.blocked += 1;
        }
        !blocked
    }

    pub fn release(&mut self, txn: u32, locks: &[LockReq], ready: &mut Vec<u32>) {
        for l in locks {
            let Entry::Occupied(mut e) = self.counts.entry(l.key) else {
                debug_assert!(false, "release of a lock never requested");
                continue;
            };
            let c = e.get_mut();
            if l.exclusive {
                c.exclusive -= 1;
            } else {
                c.shared -= 1;
            }
            if c.exclusive == 0 && c.shared == 0 {
                e.remove();
            }
        }
        let t = &mut self.txns[txn as usize];
        debug_assert!(!t.blocked, "a blocked transaction never runs");
        t.seq = INACTIVE;
        while let Some(&(t, seq)) = self.queue.front() {
            if self.txns[t as usize].seq == seq {
                break;
            }
            self.queue.pop_front();
        }
        // The oldest active transaction conflicts with no earlier one: it may run.
        if let Some(&(t, _)) = self.queue.front() {
            let front = &mut self.txns[t as usize];
            if front.blocked {
                front.blocked = false;
                self.blocked -= 1;
                ready.push(t);
            }
        }
    }

    /// Selective contention analysis: walks the active transactions in order, remembering
    /// the records earlier ones lock, and frees every blocked transaction that conflicts with
    /// none of them (the conflicts that blocked it have since been released).
    pub fn sca<'a>(&mut self, locks_of: impl Fn(u32) -> &'a [LockReq], ready: &mut Vec<u32>) {
        if self.blocked == 0 {
            return;
        }
        self.dx.clear();
        self.ds.clear();
        let mut left = self.blocked;
        for &(t, seq) in &self.queue {
            let state = &mut self.txns[t as usize];
            if state.seq != seq {
                continue;
            }
            let locks = locks_of(t);
            if state.blocked {
                let (dx, ds) = (&self.dx, &self.ds);
                let free = locks
                    .iter()
                    .all(|l| !dx.contains(&l.key) && (!l.exclusive || !ds.contains(&l.key)));
                if free {
                    state.blocked = false;
                    self.blocked -= 1;
                    ready.push(t);
                }
                left -= 1;
                if left == 0 {
                    break;
                }
            }
            for l in locks {
                if l.exclusive {
                    self.dx.insert(l.key);
                } else {
                    self.ds.insert(l.key);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn x(key: Key) -> LockReq {
        LockReq {
            key: (0, key),
            exclusive: true,
        }
    }

    fn s(key: Key) -> LockReq {
        LockReq {
            key: (0, key),
            exclusive: false,
        }
    }

    /// Drives a lock manager like the scheduler does: remembers each transaction's locks.
    struct Harness {
        m: LockManager,
        locks: Vec<Vec<LockReq>>,
    }

    impl Harness {
        fn new(kind: CalvinLocks) -> Self {
            Harness {
                m: LockManager::new(kind),
                locks: Vec::new(),
            }
        }

        /// Requests for the next transaction (slots 0, 1, 2, ... in the global order).
        fn request(&mut self, locks: &[LockReq]) -> bool {
            let txn = self.locks.len() as u32;
            self.locks.push(locks.to_vec());
            self.m.request(txn, locks)
        }

        fn release(&mut self, txn: u32) -> Vec<u32> {
            let mut ready = Vec::new();
            self.m.release(txn, &self.locks[txn as usize], &mut ready);
            ready
        }

        fn sca(&mut self) -> Vec<u32> {
            let mut ready = Vec::new();
            let locks = &self.locks;
            self.m
                .find_runnable(|t| locks[t as usize].as_slice(), &mut ready);
            ready
        }
    }

    const BOTH: [CalvinLocks; 2] = [CalvinLocks::LockTable, CalvinLocks::Vll];

    #[test]
    fn conflicting_transactions_are_granted_in_the_global_order() {
        for kind in BOTH {
            let mut h = Harness::new(kind);
            assert!(h.request(&[x(1)]));
            assert!(!h.request(&[x(1), x(2)]));
            assert!(!h.request(&[x(2)]));
            assert!(h.request(&[x(3)]), "{kind:?}: an unrelated record is free");
            assert_eq!(h.m.blocked(), 2);
            assert_eq!(h.release(0), vec![1], "{kind:?}");
            assert_eq!(h.release(3), Vec::<u32>::new(), "{kind:?}");
            assert_eq!(h.release(1), vec![2], "{kind:?}");
            assert_eq!(h.release(2), Vec::<u32>::new(), "{kind:?}");
            assert_eq!(h.m.blocked(), 0);
        }
    }

    #[test]
    fn shared_locks_share_and_a_writer_waits_for_all_readers() {
        for kind in BOTH {
            let mut h = Harness::new(kind);
            assert!(h.request(&[s(1)]));
            assert!(h.request(&[s(1)]), "{kind:?}: readers share");
            assert!(!h.request(&[x(1)]));
            assert!(
                !h.request(&[s(1)]),
                "{kind:?}: a reader queues behind a writer"
            );
            assert_eq!(h.release(1), Vec::<u32>::new(), "{kind:?}: one reader left");
            assert_eq!(h.release(0), vec![2], "{kind:?}");
            assert_eq!(h.release(2), vec![3], "{kind:?}");
        }
    }

    #[test]
    fn release_grants_every_reader_queued_behind_a_writer() {
        let mut h = Harness::new(CalvinLocks::LockTable);
        assert!(h.request(&[x(1)]));
        assert!(!h.request(&[s(1)]));
        assert!(!h.request(&[s(1), x(2)]));
        assert!(!h.request(&[x(1)]));
        assert_eq!(h.release(0), vec![1, 2]);
        assert_eq!(h.release(2), Vec::<u32>::new());
        assert_eq!(h.release(1), vec![3]);
    }

    #[test]
    fn vll_sca_frees_a_blocked_transaction_no_earlier_one_conflicts_with() {
        let mut h = Harness::new(CalvinLocks::Vll);
        assert!(h.request(&[x(1)])); // T0 runs
        assert!(h.request(&[x(2)])); // T1 runs
        assert!(!h.request(&[x(2), s(3)])); // T2 waits for T1
        assert!(!h.request(&[s(1)])); // T3 waits for T0
        assert!(!h.request(&[x(3)])); // T4 waits for T2's read of 3
                                      // T1 finishes, but T2 is not at the front of the queue (T0 is): still blocked.
        assert_eq!(h.release(1), Vec::<u32>::new());
        assert_eq!(h.m.blocked(), 3);
        // SCA sees that nothing before T2 touches 2 or 3 any more; T3 still conflicts with
        // T0, and T4 with T2.
        assert_eq!(h.sca(), vec![2]);
        assert_eq!(h.sca(), Vec::<u32>::new());
        assert_eq!(h.release(2), Vec::<u32>::new());
        assert_eq!(h.sca(), vec![4]);
        // T0 finishes: T3 is now the oldest active transaction and runs.
        assert_eq!(h.release(0), vec![3]);
        assert_eq!(h.m.blocked(), 0);
    }

    #[test]
    fn released_slots_are_reused_safely() {
        for kind in BOTH {
            let mut m = LockManager::new(kind);
            let mut ready = Vec::new();
            assert!(m.request(0, &[x(1)]));
            assert!(!m.request(1, &[x(1)]));
            m.release(0, &[x(1)], &mut ready);
            assert_eq!(ready, vec![1]);
            // Slot 0 comes back for a later transaction, which queues behind slot 1.
            assert!(!m.request(0, &[s(1)]));
            ready.clear();
            m.release(1, &[x(1)], &mut ready);
            assert_eq!(ready, vec![0], "{kind:?}");
            ready.clear();
            m.release(0, &[s(1)], &mut ready);
            assert!(ready.is_empty());
            assert_eq!(m.blocked(), 0);
        }
    }

    /// Whether `txn` (index into `active`, oldest first) may run: on each of its records every
    /// earlier request is compatible with its own (reads after reads only).
    fn model_runnable(active: &[(u32, Vec<LockReq>)], i: usize) -> bool {
        active[i].1.iter().all(|l| {
            active[..i].iter().all(|(_, earlier)| {
                earlier
                    .iter()
                    .all(|e| e.key != l.key || (!e.exclusive && !l.exclusive))
            })
        })
    }

    #[test]
    fn random_schedules_start_exactly_what_the_model_allows() {
        for kind in BOTH {
            for seed in 1..=40u64 {
                let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
                let mut next = |n: u64| {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng % n
                };
                let mut m = LockManager::new(kind);
                let mut active: Vec<(u32, Vec<LockReq>)> = Vec::new();
                let mut started: Vec<u32> = Vec::new();
                let mut free: Vec<u32> = Vec::new();
                let mut slots = 0u32;
                let mut locks_of: Vec<Vec<LockReq>> = Vec::new();
                for step in 0..400 {
                    let mut ready = Vec::new();
                    if active.len() < 3 || (next(2) == 0 && active.len() < 12) {
                        let txn = free.pop().unwrap_or_else(|| {
                            slots += 1;
                            locks_of.push(Vec::new());
                            slots - 1
                        });
                        let mut locks: Vec<LockReq> = Vec::new();
                        for _ in 0..1 + next(3) {
                            let key = (0, next(5));
                            if locks.iter().all(|l| l.key != key) {
                                locks.push(LockReq {
                                    key,
                                    exclusive: next(2) == 0,
                                });
                            }
                        }
                        if m.request(txn, &locks) {
                            ready.push(txn);
                        }
                        locks_of[txn as usize] = locks.clone();
                        active.push((txn, locks));
                    } else if let Some(&t) = started.get(next(started.len().max(1) as u64) as usize)
                    {
                        m.release(t, &locks_of[t as usize], &mut ready);
                        started.retain(|&s| s != t);
                        active.retain(|(a, _)| *a != t);
                        free.push(t);
                    }
                    m.find_runnable(|t| locks_of[t as usize].as_slice(), &mut ready);
                    started.extend(ready);
                    for (i, (t, _)) in active.iter().enumerate() {
                        assert_eq!(
                            started.contains(t),
                            model_runnable(&active, i),
                            "{kind:?} seed {seed} step {step}: transaction {t}"
                        );
                    }
                }
            }
        }
    }
}
