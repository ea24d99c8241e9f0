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
use std::collections::VecDeque;

pub type LockKey = (TableId, Key);

/// One lock a transaction needs on this node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockReq {
    pub key: LockKey,
    pub exclusive: bool,
}

/// Empty request queues kept for reuse, so that locking an uncontended record allocates
/// nothing in the steady state.
const SPARE_QUEUES: usize = 4096;

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

/// The requests of one record, oldest first; the first `granted` hold the lock.
struct Queue {
    reqs: VecDeque<(u32, bool)>,
    granted: usize,
}

impl Queue {
    /// Whether the granted prefix is one exclusive holder.
    fn held_exclusively(&self) -> bool {
        self.granted > 0 && self.reqs[0].1
    }
}

/// A hash table of per-record request queues.
#[derive(Default)]
pub struct LockTable {
    records: FxHashMap<LockKey, Queue>,
    /// Per transaction: requests not granted yet.
    waiting: Vec<u32>,
    blocked: usize,
    spare: Vec<VecDeque<(u32, bool)>>,
}

impl LockTable {
    pub fn request(&mut self, txn: u32, locks: &[LockReq]) -> bool {
        let mut waits = 0;
        for l in locks {
            let spare = &mut self.spare;
            let q = self.records.entry(l.key).or_insert_with(|| Queue {
                reqs: spare.pop().unwrap_or_default(),
                granted: 0,
            });
            // Granted only if every earlier request is granted and compatible with it.
            let grant = q.granted == q.reqs.len()
                && (q.reqs.is_empty() || (!l.exclusive && !q.held_exclusively()));
            q.reqs.push_back((txn, l.exclusive));
            if grant {
                q.granted += 1;
            } else {
                waits += 1;
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
            let Some(q) = self.records.get_mut(&l.key) else {
                debug_assert!(false, "release of a lock never requested");
                continue;
            };
            match q.reqs.iter().take(q.granted).position(|r| r.0 == txn) {
                Some(at) => {
                    q.reqs.remove(at);
                    q.granted -= 1;
                }
                None => {
                    debug_assert!(false, "release of a lock not held");
                    continue;
                }
            }
            // Grant the compatible prefix behind the holders that remain.
            while q.granted < q.reqs.len() {
                let (next, exclusive) = q.reqs[q.granted];
                if q.granted > 0 && (exclusive || q.held_exclusively()) {
                    break;
                }
                q.granted += 1;
                let w = &mut self.waiting[next as usize];
                *w -= 1;
                if *w == 0 {
                    self.blocked -= 1;
                    ready.push(next);
                }
            }
            if q.reqs.is_empty() {
                let q = self.records.remove(&l.key).expect("present");
                if self.spare.len() < SPARE_QUEUES {
                    self.spare.push(q.reqs);
                }
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
            let Some(c) = self.counts.get_mut(&l.key) else {
                debug_assert!(false, "release of a lock never requested");
                continue;
            };
            if l.exclusive {
                c.exclusive -= 1;
            } else {
                c.shared -= 1;
            }
            if c.exclusive == 0 && c.shared == 0 {
                self.counts.remove(&l.key);
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
}
