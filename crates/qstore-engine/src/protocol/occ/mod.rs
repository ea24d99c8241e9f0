//! OCC as Google F1 runs it (as the Sundial paper describes it, section 6.2), on the
//! interactive skeleton with two-phase commit:
//! - **Read phase**: reads copy the latest committed row and remember its version; writes
//!   change private copies. Nothing is locked and nothing waits.
//! - **Prepare** (every participant, even a transaction's only one): lock every record the
//!   transaction accessed here, exclusively if it wrote it, shared if it only read it; a lock
//!   held by another transaction aborts (`conflict`). Then validate: every record read must
//!   still be at the version seen (`validation`).
//! - **Commit**: install the writes and release the locks. A participant that only read
//!   still takes part in phase two: its shared locks must be held until every participant
//!   has validated, or two transactions validating at once at different participants could
//!   each miss the other's write (a write skew across partitions).
//!
//! Serializable: when the coordinator decides, every record the transaction read is locked
//! at its validated version and every record it writes is locked exclusively, so its reads
//! and writes take effect at one point; the commit order the history records (the
//! coordinator's Lamport clock) agrees with the order of installs, since a record's next
//! writer can lock it only after this commit has released it.

use crate::cluster::EngineCtx;
use crate::exec::{RowCopy, RowInstall};
use crate::protocol::interactive::{self, Attempt, Cc, Execution, Gate, RowAccess, Vote};
use crate::protocol::Engine;
use parking_lot::Mutex;
use qstore_core::txn::CcAbortCause;
use qstore_core::{QError, TableId, TxnId};
use qstore_storage::{MetaColumn, PartitionStore, RowId, RowVersion};
use std::sync::Arc;

/// A row's commit-time lock; its mutex is also the latch copies and installs take.
#[derive(Default)]
struct RowLock {
    writer: Option<TxnId>,
    readers: u32,
}

/// A transaction's accesses at one partition.
#[derive(Default)]
struct Held {
    /// Rows read, with the version seen (rows written were read first).
    reads: Vec<(TableId, RowId, RowVersion)>,
    /// Rows written (installed at commit).
    writes: Vec<(TableId, RowId)>,
    /// Locks taken at prepare: (table, row, exclusive).
    locked: Vec<(TableId, RowId, bool)>,
}

struct Occ {
    rows: MetaColumn<Mutex<RowLock>>,
    /// Check at prepare that every read is still current; off only in the test that shows
    /// the history checker catches what validation prevents.
    validate: bool,
    /// Guard reads of absent keys until the transaction ends (see the skeleton's
    /// `absent`); off only in the test that shows the history checker catches the phantoms
    /// this prevents.
    guard_absent: bool,
}

impl Occ {
    /// Locks every record `held` accessed, or names the conflict.
    fn lock_all(&self, txn: TxnId, held: &mut Held) -> Result<(), CcAbortCause> {
        let mut wanted: Vec<(TableId, RowId, bool)> = held
            .reads
            .iter()
            .map(|&(t, r, _)| (t, r, held.writes.contains(&(t, r))))
            .collect();
        wanted.sort_unstable();
        wanted.dedup();
        for (table, rid, exclusive) in wanted {
            let mut row = self.rows.get(table, rid).lock();
            let free = row.writer.is_none() && (!exclusive || row.readers == 0);
            if !free {
                return Err(CcAbortCause::Conflict);
            }
            if exclusive {
                row.writer = Some(txn);
            } else {
                row.readers += 1;
            }
            held.locked.push((table, rid, exclusive));
        }
        Ok(())
    }

    /// Whether every row read is still at the version the transaction saw.
    fn reads_current(&self, held: &Held, store: &PartitionStore) -> bool {
        held.reads.iter().all(|&(table, rid, seen)| {
            let _latch = self.rows.get(table, rid).lock();
            store.table(table).version(rid) == seen
        })
    }
}

impl Cc for Occ {
    type Held = Held;

    const EXECUTION: Execution = Execution::Buffered;

    const VALIDATES: bool = true;

    fn read_copy(&self, a: &RowAccess, held: &mut Held, copy: &mut RowCopy<'_>) -> Gate {
        let RowAccess {
            table, rid, write, ..
        } = *a;
        let version = {
            let _latch = self.rows.get(table, rid).lock();
            // SAFETY: under the row's latch, which every install takes.
            unsafe { copy.current() }
        };
        held.reads.push((table, rid, version));
        if write {
            held.writes.push((table, rid));
        }
        Gate::Go
    }

    fn guards_absent_reads(&self) -> bool {
        self.guard_absent
    }

    fn prepare(
        &self,
        txn: TxnId,
        _at: &Attempt,
        held: &mut Held,
        _wrote: bool,
        store: &PartitionStore,
    ) -> Vote {
        if let Err(cause) = self.lock_all(txn, held) {
            return Vote::No(cause);
        }
        if self.validate && !self.reads_current(held, store) {
            return Vote::No(CcAbortCause::Validation);
        }
        Vote::Yes
    }

    fn install(
        &self,
        a: &RowAccess,
        _held: &mut Held,
        install: &mut RowInstall<'_>,
        _woken: &mut Vec<TxnId>,
    ) {
        let RowAccess { table, rid, .. } = *a;
        let _latch = self.rows.get(table, rid).lock();
        // SAFETY: under the row's latch, which every copy takes; OCC owns the table.
        unsafe { install.install() };
    }

    fn release(&self, txn: TxnId, held: &mut Held, _woken: &mut Vec<TxnId>) {
        for (table, rid, exclusive) in held.locked.drain(..) {
            let mut row = self.rows.get(table, rid).lock();
            if exclusive {
                debug_assert_eq!(row.writer, Some(txn));
                row.writer = None;
            } else {
                row.readers -= 1;
            }
        }
        held.reads.clear();
        held.writes.clear();
    }
}

pub fn start(ctx: Arc<EngineCtx>) -> Result<Box<dyn Engine>, QError> {
    start_validating(ctx, true, true)
}

fn start_validating(
    ctx: Arc<EngineCtx>,
    validate: bool,
    guard_absent: bool,
) -> Result<Box<dyn Engine>, QError> {
    let make = |store: &PartitionStore| Occ {
        rows: MetaColumn::for_partition(store),
        validate,
        guard_absent,
    };
    interactive::start(ctx, make, "occ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::testing::{assert_absent_checks_bite, assert_checks_bite};
    use qstore_check::AnomalyClass;

    #[test]
    fn the_history_checker_catches_what_validation_prevents() {
        let unchecked = assert_checks_bite(&|ctx| start_validating(ctx, false, true), &start);
        assert!(unchecked.count(AnomalyClass::G2) > 0, "{unchecked}");
    }

    /// The planted phantom: OCC without its guard on reads of absent keys lets two
    /// transactions each read absent the key the other inserts, and both commit.
    #[test]
    fn the_history_checker_catches_the_phantoms_absent_key_guards_prevent() {
        let unguarded = |ctx| start_validating(ctx, true, false);
        let report = assert_absent_checks_bite(&unguarded, &start);
        assert!(report.count(AnomalyClass::G2) > 0, "{report}");
    }
}
