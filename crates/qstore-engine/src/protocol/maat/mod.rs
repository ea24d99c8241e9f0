//! MaaT (Mahmoud et al., VLDB 2014) as the Sundial paper runs it (sections 5.2 and 6): dynamic
//! timestamp allocation with timestamp ranges, on the interactive skeleton with two-phase
//! commit, with the improvements the Sundial authors made (many worker threads per node, no
//! extra messages, garbage collection of finished transactions).
//!
//! Every transaction has, at each node it reached, a range of commit timestamps
//! `[lower, upper)`, initially `[0, inf)`, kept in the node's **time table**. Every row keeps
//! the largest commit timestamps that read (`rts`) and wrote (`wts`) it, and the transactions
//! that read or wrote it and are not finished (*soft locks*, which never block):
//! - **Read phase**: reads copy the row, writes change private copies. An access records what
//!   the transaction's commit timestamp must respect: after the writer of the version read
//!   (`lower > wts`) and, for a write, after the committed readers (`lower > rts`); before
//!   the unfinished writers of a row it read (they will replace what it read); after the
//!   unfinished readers and writers of a row it writes.
//! - **Validation** (prepare, every participant, even a transaction's only one): under the
//!   time table's lock, the participant turns those orderings into bounds. Against a
//!   transaction already committed or validated (its range frozen), this one's own range
//!   shrinks; a transaction still running has *its* range shrunk instead. An empty range votes
//!   no: `frozen_range` when it had to follow a validated transaction with no upper bound (the
//!   paper's main cause of MaaT's aborts), `range_empty` otherwise. A non-empty range is frozen
//!   (the transaction is validated) and voted.
//! - **Decision**: the coordinator intersects the ranges voted and commits at the smallest
//!   timestamp of the intersection, or aborts (`range_empty`) if it is empty.
//! - **Commit**: each participant (also one that only read: it must clean up its ranges and
//!   soft locks, so MaaT has no read-only optimisation) raises `rts` of the rows read and
//!   installs the writes under the Thomas write rule (a write older than the row's `wts` is
//!   obsolete and skipped), then drops its soft locks.
//!
//! Every conflict between two transactions becomes an ordering of their commit timestamps,
//! enforced by whichever of the two validates second at the node where they met, so the
//! timestamp order is a serialization order.

use crate::cluster::EngineCtx;
use crate::exec::{RowCopy, RowInstall};
use crate::protocol::interactive::{self, Attempt, Cc, Execution, Gate, RowAccess, TsRange, Vote};
use crate::protocol::Engine;
use parking_lot::Mutex;
use qstore_core::txn::CcAbortCause;
use qstore_core::{QError, TableId, TxnId};
use qstore_storage::{MetaColumn, PartitionStore, RowId};
use rustc_hash::FxHashMap;
use std::sync::Arc;

/// No upper bound.
const INF: u64 = u64::MAX;

/// A row's timestamps and soft locks.
#[derive(Default)]
struct RowMaat {
    rts: u64,
    wts: u64,
    readers: Vec<TxnId>,
    writers: Vec<TxnId>,
}

/// A transaction at one partition: the orderings its accesses found, and the rows it holds
/// soft locks on.
#[derive(Default)]
struct Held {
    /// Whether it has an entry in the time table.
    registered: bool,
    /// Its commit timestamp must be at least this (after the committed versions it met).
    min_lower: u64,
    /// Transactions that must commit before it.
    before: Vec<TxnId>,
    /// Transactions that must commit after it.
    after: Vec<TxnId>,
    reads: Vec<(TableId, RowId)>,
    writes: Vec<(TableId, RowId)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Running,
    /// Its range is frozen: others adapt to it.
    Validated,
    Committed(u64),
    Aborted,
}

struct Entry {
    range: TsRange,
    state: State,
    /// When it registered (`TimeTable::seq`), and when it finished.
    registered: u64,
    finished: u64,
}

/// A node's commit-timestamp ranges, by transaction.
#[derive(Default)]
struct TimeTable {
    entries: FxHashMap<TxnId, Entry>,
    /// Counts registrations and finishes, to date them.
    seq: u64,
    finished_since_sweep: u32,
}

/// Finished transactions are swept out of the time table every this many finishes.
const SWEEP_EVERY: u32 = 1024;

impl TimeTable {
    fn register(&mut self, txn: TxnId) {
        self.seq += 1;
        let e = Entry {
            range: TsRange::ALL,
            state: State::Running,
            registered: self.seq,
            finished: 0,
        };
        self.entries.entry(txn).or_insert(e);
    }

    fn finish(&mut self, txn: TxnId, state: State) {
        self.seq += 1;
        if let Some(e) = self.entries.get_mut(&txn) {
            e.state = state;
            e.finished = self.seq;
        }
        self.finished_since_sweep += 1;
        if self.finished_since_sweep >= SWEEP_EVERY {
            self.sweep();
        }
    }

    /// Drops the transactions that finished before every unfinished one registered: only a
    /// transaction that met another while it was unfinished refers to it (at validation).
    fn sweep(&mut self) {
        self.finished_since_sweep = 0;
        let unfinished = |e: &Entry| matches!(e.state, State::Running | State::Validated);
        let oldest = self
            .entries
            .values()
            .filter(|e| unfinished(e))
            .map(|e| e.registered)
            .min()
            .unwrap_or(u64::MAX);
        self.entries
            .retain(|_, e| unfinished(e) || e.finished >= oldest);
    }

    /// Validates `txn`: its range from its own entry, `held`'s orderings and the others'
    /// states; frozen if not empty, the running others' ranges then shrunk to follow it.
    fn validate(&mut self, txn: TxnId, held: &Held) -> Result<TsRange, CcAbortCause> {
        let Some(own) = self.entries.get(&txn) else {
            debug_assert!(false, "{txn:?} validates without having registered");
            return Err(CcAbortCause::RangeEmpty);
        };
        let mut r = TsRange {
            lower: own.range.lower.max(held.min_lower),
            upper: own.range.upper,
        };
        for other in &held.before {
            match self.entries.get(other).map(|e| (e.state, e.range)) {
                Some((State::Committed(ts), _)) => r.lower = r.lower.max(ts + 1),
                Some((State::Validated, o)) => r.lower = r.lower.max(o.upper),
                _ => {}
            }
        }
        for other in &held.after {
            match self.entries.get(other).map(|e| (e.state, e.range)) {
                Some((State::Committed(ts), _)) => r.upper = r.upper.min(ts),
                Some((State::Validated, o)) => r.upper = r.upper.min(o.lower),
                _ => {}
            }
        }
        if r.is_empty() {
            return Err(if r.lower == INF {
                CcAbortCause::FrozenRange
            } else {
                CcAbortCause::RangeEmpty
            });
        }
        let own = self.entries.get_mut(&txn).expect("looked up above");
        own.range = r;
        own.state = State::Validated;
        self.push_running(&held.before, |o| o.upper = o.upper.min(r.lower));
        self.push_running(&held.after, |o| o.lower = o.lower.max(r.upper));
        Ok(r)
    }

    fn push_running(&mut self, others: &[TxnId], shrink: impl Fn(&mut TsRange)) {
        for other in others {
            if let Some(e) = self.entries.get_mut(other) {
                if e.state == State::Running {
                    shrink(&mut e.range);
                }
            }
        }
    }
}

struct Maat {
    rows: MetaColumn<Mutex<RowMaat>>,
    times: Mutex<TimeTable>,
    /// Order conflicting transactions; off only in the test that shows the history checker
    /// catches what the ranges prevent.
    ordering: bool,
}

impl Maat {
    /// Gives `txn` its entry in the time table, at its first access here.
    fn register(&self, txn: TxnId, held: &mut Held) {
        if !held.registered {
            self.times.lock().register(txn);
            held.registered = true;
        }
    }
}

/// Adds to `to` every transaction of `from` but `txn`, once.
fn add_others(to: &mut Vec<TxnId>, from: &[TxnId], txn: TxnId) {
    for &o in from {
        if o != txn && !to.contains(&o) {
            to.push(o);
        }
    }
}

/// Records what an access of `txn` to `row` means for its commit timestamp.
fn order(txn: TxnId, write: bool, row: &RowMaat, held: &mut Held) {
    held.min_lower = held.min_lower.max(row.wts + 1);
    // The unfinished writers replace what it read (a write reads the row too).
    add_others(&mut held.after, &row.writers, txn);
    if write {
        held.min_lower = held.min_lower.max(row.rts + 1);
        add_others(&mut held.before, &row.readers, txn);
        add_others(&mut held.before, &row.writers, txn);
    }
}

/// Removes `txn` from a soft-lock list.
fn unlock(list: &mut Vec<TxnId>, txn: TxnId) {
    if let Some(i) = list.iter().position(|&t| t == txn) {
        list.swap_remove(i);
    }
}

impl Cc for Maat {
    type Held = Held;

    const EXECUTION: Execution = Execution::Buffered;

    const VALIDATES: bool = true;

    fn read_copy(&self, a: &RowAccess, held: &mut Held, copy: &mut RowCopy<'_>) -> Gate {
        let RowAccess {
            txn,
            table,
            rid,
            write,
            ..
        } = *a;
        self.register(txn, held);
        let mut row = self.rows.get(table, rid).lock();
        // SAFETY: under the row's latch, which every install takes.
        unsafe { copy.current() };
        if self.ordering {
            order(txn, write, &row, held);
        }
        if write {
            row.writers.push(txn);
            held.writes.push((table, rid));
        } else {
            row.readers.push(txn);
            held.reads.push((table, rid));
        }
        Gate::Go
    }

    fn prepare(
        &self,
        txn: TxnId,
        _at: &Attempt,
        held: &mut Held,
        _wrote: bool,
        _store: &PartitionStore,
    ) -> Vote {
        if !held.registered {
            // Its accesses here found no record: nothing to order.
            return Vote::YesWithin(TsRange::ALL);
        }
        match self.times.lock().validate(txn, held) {
            Ok(range) => Vote::YesWithin(range),
            Err(cause) => Vote::No(cause),
        }
    }

    fn commit(&self, txn: TxnId, at: &Attempt, held: &mut Held) {
        self.times.lock().finish(txn, State::Committed(at.ts));
        for &(table, rid) in &held.reads {
            let mut row = self.rows.get(table, rid).lock();
            row.rts = row.rts.max(at.ts);
        }
    }

    fn install(
        &self,
        a: &RowAccess,
        _held: &mut Held,
        install: &mut RowInstall<'_>,
        _woken: &mut Vec<TxnId>,
    ) {
        let RowAccess { at, table, rid, .. } = *a;
        let mut row = self.rows.get(table, rid).lock();
        // Thomas write rule: a later version is already in place.
        if at.ts < row.wts && self.ordering {
            return;
        }
        // SAFETY: under the row's latch, which every copy takes; MaaT owns the table.
        unsafe { install.install() };
        row.wts = row.wts.max(at.ts);
    }

    fn absent_mark(&self, at: &Attempt) -> u64 {
        at.ts // the commit timestamp, by the time the reader ends
    }

    fn insert_after(
        &self,
        txn: TxnId,
        _at: &Attempt,
        held: &mut Held,
        mark: u64,
    ) -> Result<(), CcAbortCause> {
        // After the committed readers of the key, as a write is after a row's `rts`.
        self.register(txn, held);
        held.min_lower = held.min_lower.max(mark + 1);
        Ok(())
    }

    fn created(&self, a: &RowAccess) {
        let mut row = self.rows.get(a.table, a.rid).lock();
        *row = RowMaat::default();
        row.wts = a.at.ts;
    }

    fn commit_order(&self, at: &Attempt) -> Option<u128> {
        // Transactions that do not conflict may share a commit timestamp; the attempt's id
        // breaks the tie.
        Some((u128::from(at.ts) << 64) | u128::from(at.age.id.0))
    }

    fn release(&self, txn: TxnId, held: &mut Held, _woken: &mut Vec<TxnId>) {
        for (table, rid) in held.reads.drain(..) {
            unlock(&mut self.rows.get(table, rid).lock().readers, txn);
        }
        for (table, rid) in held.writes.drain(..) {
            unlock(&mut self.rows.get(table, rid).lock().writers, txn);
        }
        if held.registered {
            let mut times = self.times.lock();
            let committed = times
                .entries
                .get(&txn)
                .is_some_and(|e| matches!(e.state, State::Committed(_)));
            if !committed {
                times.finish(txn, State::Aborted);
            }
        }
        *held = Held::default();
    }
}

pub fn start(ctx: Arc<EngineCtx>) -> Result<Box<dyn Engine>, QError> {
    start_ordering(ctx, true)
}

fn start_ordering(ctx: Arc<EngineCtx>, ordering: bool) -> Result<Box<dyn Engine>, QError> {
    let make = |store: &PartitionStore| Maat {
        rows: MetaColumn::for_partition(store),
        times: Mutex::new(TimeTable::default()),
        ordering,
    };
    interactive::start(ctx, make, "maat")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::testing::assert_checks_bite;

    #[test]
    fn the_history_checker_catches_what_the_ranges_prevent() {
        assert_checks_bite(&|ctx| start_ordering(ctx, false), &start);
    }

    fn running(t: &mut TimeTable, id: u64) -> TxnId {
        t.register(TxnId(id));
        TxnId(id)
    }

    #[test]
    fn a_transaction_that_must_follow_one_validated_without_upper_bound_aborts() {
        let mut t = TimeTable::default();
        let (reader, writer) = (running(&mut t, 1), running(&mut t, 2));
        // The reader read a row the writer writes: reader before writer.
        let reader_held = Held::default();
        let r = t.validate(reader, &reader_held).unwrap();
        assert_eq!(r, TsRange::ALL, "validated as [0, inf): frozen");
        let writer_held = Held {
            before: vec![reader],
            ..Held::default()
        };
        assert_eq!(
            t.validate(writer, &writer_held),
            Err(CcAbortCause::FrozenRange)
        );
    }

    #[test]
    fn a_running_transaction_is_pushed_after_one_validated_before_it() {
        let mut t = TimeTable::default();
        let (first, second, third) = (running(&mut t, 1), running(&mut t, 2), running(&mut t, 3));
        t.finish(third, State::Committed(20));
        // `first` met committed versions up to 9, and must precede `second` (running) and
        // `third` (committed at 20).
        let first_held = Held {
            min_lower: 10,
            after: vec![second, third],
            ..Held::default()
        };
        let r = t.validate(first, &first_held).unwrap();
        assert_eq!(
            r,
            TsRange {
                lower: 10,
                upper: 20
            }
        );
        let r2 = t.validate(second, &Held::default()).unwrap();
        assert!(r2.lower >= r.upper, "{r2:?} follows {r:?}");
    }

    #[test]
    fn finished_transactions_are_swept_once_nobody_unfinished_can_refer_to_them() {
        let mut t = TimeTable::default();
        let old = running(&mut t, 1);
        t.finish(old, State::Committed(5));
        let live = running(&mut t, 2);
        for id in 3..3 + u64::from(SWEEP_EVERY) {
            let x = running(&mut t, id);
            t.finish(x, State::Aborted);
        }
        assert!(
            !t.entries.contains_key(&old),
            "finished before `live` began"
        );
        assert!(t.entries.contains_key(&live));
        assert!(t.entries.contains_key(&TxnId(3)), "`live` may refer to it");
        t.finish(live, State::Aborted);
        t.sweep();
        assert!(t.entries.is_empty(), "{} left", t.entries.len());
    }
}
