//! A record lock table: shared and exclusive locks, with the conflict rule of the 2PL
//! variant (abort at once, or wait if older). 2PL uses the whole table; LEAP keeps a
//! [`LockEntry`] in each record's state beside its ownership.

use crate::protocol::interactive::{Age, Gate};
use parking_lot::Mutex;
use qstore_core::txn::CcAbortCause;
use qstore_core::{Key, TableId, TxnId};
use rustc_hash::FxHashMap;
use std::collections::VecDeque;

/// What a transaction does when a lock it asks for is held in a conflicting mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Abort at once.
    NoWait,
    /// Wait if older than every holder and every waiter, otherwise abort ("die"). Waits only
    /// ever go from older to younger transactions, so there is no deadlock.
    WaitDie,
    /// Always wait; deadlocks are found by a detector and broken by aborting a victim
    /// ([`LockTable::abort_waiter`]).
    Wait,
}

pub(crate) type Record = (TableId, Key);

/// One record's lock: its holders and, in arrival order, its waiters.
#[derive(Default)]
pub(crate) struct LockEntry {
    exclusive: bool,
    owners: Vec<(TxnId, Age)>,
    waiters: VecDeque<Waiter>,
}

struct Waiter {
    txn: TxnId,
    age: Age,
    write: bool,
}

impl LockEntry {
    pub(crate) fn owns(&self, txn: TxnId) -> bool {
        self.owners.iter().any(|&(t, _)| t == txn)
    }

    /// Whether `txn` could hold the lock in mode `write` beside the current owners.
    fn compatible(&self, txn: TxnId, write: bool) -> bool {
        let others = self.owners.iter().filter(|&&(t, _)| t != txn).count();
        if write {
            others == 0
        } else {
            !self.exclusive || others == 0
        }
    }

    fn grant(&mut self, txn: TxnId, age: Age, write: bool) {
        if !self.owns(txn) {
            self.owners.push((txn, age));
        }
        self.exclusive |= write;
    }

    /// Whether `age` is older than everyone holding or waiting for the lock.
    fn oldest(&self, txn: TxnId, age: Age) -> bool {
        let holders = self.owners.iter().filter(|&&(t, _)| t != txn).map(|o| o.1);
        let waiters = self.waiters.iter().map(|w| w.age);
        holders.chain(waiters).all(|a| age < a)
    }

    /// Whether nobody holds or waits for the lock.
    pub(crate) fn is_free(&self) -> bool {
        self.owners.is_empty() && self.waiters.is_empty()
    }

    /// Asks for the lock in mode `write` for `txn`, under `policy`; also true when `txn`
    /// holds it from now on (granted, or queued: a waiter is released with the holders).
    /// Asking again for a lock held (or granted while waiting) answers `Go`.
    pub(crate) fn ask(
        &mut self,
        policy: Policy,
        txn: TxnId,
        age: Age,
        write: bool,
    ) -> (Gate, bool) {
        let holds = self.owns(txn);
        if holds && (!write || self.exclusive) {
            return (Gate::Go, false);
        }
        if self.compatible(txn, write) && (holds || self.waiters.is_empty()) {
            self.grant(txn, age, write);
            return (Gate::Go, !holds);
        }
        let queued = self.waiters.iter().any(|w| w.txn == txn);
        match policy {
            Policy::NoWait => (Gate::Abort(CcAbortCause::Conflict), false),
            _ if queued => (Gate::Wait, false),
            Policy::WaitDie if !self.oldest(txn, age) => {
                (Gate::Abort(CcAbortCause::WaitDie), false)
            }
            Policy::WaitDie | Policy::Wait => {
                self.waiters.push_back(Waiter { txn, age, write });
                (Gate::Wait, !holds)
            }
        }
    }

    /// `txn` lets go of the lock (held or waited for); waiters that now fit are granted and
    /// added to `woken`.
    pub(crate) fn release(&mut self, txn: TxnId, woken: &mut Vec<TxnId>) {
        self.owners.retain(|&(t, _)| t != txn);
        self.waiters.retain(|w| w.txn != txn);
        // An exclusive lock has a single owner, so it ends with that owner.
        if self.owners.is_empty() {
            self.exclusive = false;
        }
        self.grant_waiters(woken);
    }

    /// Grants waiters from the front for as long as they fit.
    fn grant_waiters(&mut self, woken: &mut Vec<TxnId>) {
        while let Some(w) = self.waiters.front() {
            if !self.compatible(w.txn, w.write) {
                break;
            }
            let w = self.waiters.pop_front().expect("peeked");
            self.grant(w.txn, w.age, w.write);
            woken.push(w.txn);
        }
    }
}

/// A partition's record locks, in shards so that workers rarely contend.
pub struct LockTable {
    policy: Policy,
    shards: Box<[Mutex<FxHashMap<Record, LockEntry>>]>,
    /// `Wait`: the record each waiting transaction waits for, and the deadlock victims that
    /// have not yet asked again.
    waiting: Mutex<Waiting>,
}

#[derive(Default)]
struct Waiting {
    on: FxHashMap<TxnId, Record>,
    victims: rustc_hash::FxHashSet<TxnId>,
}

const SHARDS: usize = 256;

impl LockTable {
    pub fn new(policy: Policy) -> Self {
        LockTable {
            policy,
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            waiting: Mutex::default(),
        }
    }

    fn shard(&self, r: Record) -> &Mutex<FxHashMap<Record, LockEntry>> {
        let h = (r.1 ^ ((r.0 as u64) << 56)).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56;
        &self.shards[h as usize % SHARDS]
    }

    /// Asks for record `r` in mode `write` for `txn`; on `Go` the record is in `held`.
    /// Asking again for a lock held (or granted while waiting) answers `Go`.
    pub fn lock(
        &self,
        txn: TxnId,
        age: Age,
        r: Record,
        write: bool,
        held: &mut Vec<Record>,
    ) -> Gate {
        if self.policy != Policy::Wait {
            return self.ask(txn, age, r, write, held);
        }
        if self.waiting.lock().victims.remove(&txn) {
            return Gate::Abort(CcAbortCause::Deadlock);
        }
        let gate = self.ask(txn, age, r, write, held);
        if gate == Gate::Go {
            self.waiting.lock().on.remove(&txn);
        }
        gate
    }

    fn ask(&self, txn: TxnId, age: Age, r: Record, write: bool, held: &mut Vec<Record>) -> Gate {
        let mut shard = self.shard(r).lock();
        let e = shard.entry(r).or_default();
        let (gate, newly) = e.ask(self.policy, txn, age, write);
        if newly {
            held.push(r);
        }
        if self.policy == Policy::Wait && gate == Gate::Wait {
            self.waiting.lock().on.insert(txn, r);
        }
        if e.is_free() {
            shard.remove(&r);
        }
        gate
    }

    /// Every waiting transaction with what it waits for: the record's owners, and the
    /// waiters ahead of it (granted first).
    pub fn waits_for(&self, out: &mut Vec<(TxnId, Age, TxnId)>) {
        let on: Vec<(TxnId, Record)> = self
            .waiting
            .lock()
            .on
            .iter()
            .map(|(t, r)| (*t, *r))
            .collect();
        for (txn, r) in on {
            let shard = self.shard(r).lock();
            let Some(e) = shard.get(&r) else { continue };
            let Some(at) = e.waiters.iter().position(|w| w.txn == txn) else {
                continue; // granted meanwhile
            };
            let age = e.waiters[at].age;
            let ahead = e.waiters.iter().take(at).map(|w| w.txn);
            let owners = e.owners.iter().map(|o| o.0).filter(|&o| o != txn);
            out.extend(owners.chain(ahead).map(|h| (txn, age, h)));
        }
    }

    /// A deadlock's victim stops waiting, and is refused (`Deadlock`) when it asks again;
    /// true if it was waiting.
    pub fn abort_waiter(&self, txn: TxnId, woken: &mut Vec<TxnId>) -> bool {
        let mut waiting = self.waiting.lock();
        let Some(r) = waiting.on.remove(&txn) else {
            return false;
        };
        waiting.victims.insert(txn);
        drop(waiting);
        let mut shard = self.shard(r).lock();
        if let Some(e) = shard.get_mut(&r) {
            e.waiters.retain(|w| w.txn != txn);
            // Those behind it may fit now.
            e.grant_waiters(woken);
        }
        true
    }

    /// Releases every lock in `held`, granting waiters that now fit.
    pub fn release(&self, txn: TxnId, held: &mut Vec<Record>, woken: &mut Vec<TxnId>) {
        for r in held.drain(..) {
            let mut shard = self.shard(r).lock();
            let Some(e) = shard.get_mut(&r) else { continue };
            e.release(txn, woken);
            if self.policy == Policy::Wait {
                let mut waiting = self.waiting.lock();
                waiting.on.remove(&txn);
                waiting.victims.remove(&txn);
            }
            if e.is_free() {
                shard.remove(&r);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn age(birth: u64, id: u64) -> Age {
        Age {
            birth_us: birth,
            id: TxnId(id),
        }
    }

    #[test]
    fn shared_locks_share_and_exclusive_conflicts_abort_under_no_wait() {
        let t = LockTable::new(Policy::NoWait);
        let (mut h1, mut h2, mut h3) = (vec![], vec![], vec![]);
        let r = (0, 7);
        assert_eq!(t.lock(TxnId(1), age(1, 1), r, false, &mut h1), Gate::Go);
        assert_eq!(t.lock(TxnId(2), age(2, 2), r, false, &mut h2), Gate::Go);
        assert_eq!(
            t.lock(TxnId(3), age(3, 3), r, true, &mut h3),
            Gate::Abort(CcAbortCause::Conflict)
        );
        // An upgrade with another reader present conflicts too.
        assert_eq!(
            t.lock(TxnId(1), age(1, 1), r, true, &mut h1),
            Gate::Abort(CcAbortCause::Conflict)
        );
        let mut woken = vec![];
        t.release(TxnId(2), &mut h2, &mut woken);
        assert_eq!(t.lock(TxnId(1), age(1, 1), r, true, &mut h1), Gate::Go);
        assert_eq!(h1, vec![r]);
        t.release(TxnId(1), &mut h1, &mut woken);
        assert_eq!(t.lock(TxnId(3), age(3, 3), r, true, &mut h3), Gate::Go);
        assert!(woken.is_empty());
    }

    #[test]
    fn wait_die_lets_the_older_wait_and_the_younger_die() {
        let t = LockTable::new(Policy::WaitDie);
        let r = (0, 1);
        let (mut young, mut old, mut older) = (vec![], vec![], vec![]);
        assert_eq!(t.lock(TxnId(5), age(50, 5), r, true, &mut young), Gate::Go);
        // Older than the holder: waits.
        assert_eq!(t.lock(TxnId(2), age(20, 2), r, true, &mut old), Gate::Wait);
        assert_eq!(t.lock(TxnId(2), age(20, 2), r, true, &mut old), Gate::Wait);
        // Younger than the waiter: dies, even though it is older than the holder.
        assert_eq!(
            t.lock(TxnId(3), age(30, 3), r, false, &mut vec![]),
            Gate::Abort(CcAbortCause::WaitDie)
        );
        // Older than everyone: waits too, behind the first waiter.
        assert_eq!(
            t.lock(TxnId(1), age(10, 1), r, false, &mut older),
            Gate::Wait
        );
        let mut woken = vec![];
        t.release(TxnId(5), &mut young, &mut woken);
        assert_eq!(woken, vec![TxnId(2)]);
        assert_eq!(t.lock(TxnId(2), age(20, 2), r, true, &mut old), Gate::Go);
        woken.clear();
        t.release(TxnId(2), &mut old, &mut woken);
        assert_eq!(woken, vec![TxnId(1)]);
        assert_eq!(t.lock(TxnId(1), age(10, 1), r, false, &mut older), Gate::Go);
    }

    #[test]
    fn release_grants_every_compatible_reader_at_the_front() {
        let t = LockTable::new(Policy::WaitDie);
        let r = (2, 9);
        let mut w = vec![];
        assert_eq!(t.lock(TxnId(9), age(90, 9), r, true, &mut w), Gate::Go);
        let (mut a, mut b) = (vec![], vec![]);
        assert_eq!(t.lock(TxnId(4), age(40, 4), r, false, &mut a), Gate::Wait);
        assert_eq!(t.lock(TxnId(3), age(30, 3), r, false, &mut b), Gate::Wait);
        let mut woken = vec![];
        t.release(TxnId(9), &mut w, &mut woken);
        assert_eq!(woken, vec![TxnId(4), TxnId(3)]);
    }

    #[test]
    fn waiters_report_what_they_wait_for_and_a_victim_is_refused() {
        let t = LockTable::new(Policy::Wait);
        let (a, b) = ((0, 1), (0, 2));
        let (mut h1, mut h2) = (vec![], vec![]);
        assert_eq!(t.lock(TxnId(1), age(1, 1), a, true, &mut h1), Gate::Go);
        assert_eq!(t.lock(TxnId(2), age(2, 2), b, true, &mut h2), Gate::Go);
        // A cycle: 1 waits for b (held by 2), 2 waits for a (held by 1).
        assert_eq!(t.lock(TxnId(1), age(1, 1), b, true, &mut h1), Gate::Wait);
        assert_eq!(t.lock(TxnId(2), age(2, 2), a, false, &mut h2), Gate::Wait);
        let mut edges = vec![];
        t.waits_for(&mut edges);
        edges.sort_unstable_by_key(|e| e.0);
        assert_eq!(
            edges,
            vec![
                (TxnId(1), age(1, 1), TxnId(2)),
                (TxnId(2), age(2, 2), TxnId(1))
            ]
        );
        // 2 is the victim: it stops waiting, and is refused when it asks again.
        let mut woken = vec![];
        assert!(t.abort_waiter(TxnId(2), &mut woken));
        assert!(!t.abort_waiter(TxnId(2), &mut woken), "no longer waiting");
        assert_eq!(
            t.lock(TxnId(2), age(2, 2), a, false, &mut h2),
            Gate::Abort(CcAbortCause::Deadlock)
        );
        t.release(TxnId(2), &mut h2, &mut woken);
        assert_eq!(woken, vec![TxnId(1)]);
        assert_eq!(t.lock(TxnId(1), age(1, 1), b, true, &mut h1), Gate::Go);
        let mut edges = vec![];
        t.waits_for(&mut edges);
        assert!(edges.is_empty());
    }
}
