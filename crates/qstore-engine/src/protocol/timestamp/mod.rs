//! TIMESTAMP: basic timestamp ordering (Bernstein and Goodman), on the interactive skeleton
//! with two-phase commit. Each attempt of a transaction takes a fresh timestamp at its home
//! node (see [`crate::timestamp`]); transactions are serialized in timestamp order:
//! - every row keeps the largest timestamp that read it (`rts`) and that wrote it (`wts`);
//! - a read by an attempt older than the row's `wts` aborts (it would read the future);
//!   one that finds a pending write (a *prewrite*) of an older attempt waits for it to commit
//!   or abort; otherwise it copies the row and raises `rts`;
//! - a write is a read (the check above) that also registers a prewrite, refused when a
//!   younger attempt already read the row (`rts` above its timestamp). The new row is
//!   computed on a private copy and installed at commit, when `wts` rises to the attempt's
//!   timestamp.
//!
//! Waits only go from younger to older attempts, so there is no deadlock. Rows are installed
//! in timestamp order (a younger writer's read waits for an older prewrite, and an older
//! writer meeting a younger read is refused), so the history's version order is the
//! timestamp order, which is the attempts' place in the serialization order.

use crate::cluster::EngineCtx;
use crate::exec::{RowCopy, RowInstall};
use crate::protocol::interactive::prewrites::{Held, PrewriteRow, Prewrites};
use crate::protocol::interactive::{self, Cc, Execution, Gate, RowAccess};
use crate::protocol::Engine;
use parking_lot::Mutex;
use qstore_core::txn::CcAbortCause;
use qstore_core::{QError, TxnId};
use qstore_storage::{MetaColumn, PartitionStore};
use std::sync::Arc;

/// A row's timestamps: 16 bytes, plus the pending writes and waiting readers while there are
/// any.
#[derive(Default)]
struct RowTs {
    rts: u64,
    wts: u64,
    prewrites: Prewrites,
}

impl PrewriteRow for RowTs {
    fn prewrites(&mut self) -> &mut Prewrites {
        &mut self.prewrites
    }
}

/// Timestamp ordering's concurrency control for one partition: a latch and timestamps per row.
struct Timestamp {
    rows: MetaColumn<Mutex<RowTs>>,
    /// Refuse what timestamp order forbids (reading the future, writing over a younger read);
    /// off only in the test that shows the history checker catches what it prevents.
    order_checks: bool,
}

impl Cc for Timestamp {
    type Held = Held;

    const EXECUTION: Execution = Execution::Buffered;

    const USES_TIMESTAMPS: bool = true;

    fn read_copy(&self, a: &RowAccess, held: &mut Held, copy: &mut RowCopy<'_>) -> Gate {
        let RowAccess {
            txn,
            at,
            table,
            rid,
            write,
        } = *a;
        let ts = at.ts;
        let mut row = self.rows.get(table, rid).lock();
        held.resumed(txn, table, rid, &mut row.prewrites);
        if self.order_checks && ts < row.wts {
            return Gate::Abort(CcAbortCause::TimestampOrder);
        }
        if row.prewrites.older_than(txn, ts) {
            return held.wait(txn, table, rid, &mut row.prewrites);
        }
        if self.order_checks && write && ts < row.rts {
            return Gate::Abort(CcAbortCause::TimestampOrder);
        }
        // SAFETY: under the row's latch, which every install takes.
        unsafe { copy.current() };
        row.rts = row.rts.max(ts);
        if write {
            held.prewrite(txn, ts, table, rid, &mut row.prewrites);
        }
        Gate::Go
    }

    fn install(
        &self,
        a: &RowAccess,
        _held: &mut Held,
        install: &mut RowInstall<'_>,
        woken: &mut Vec<TxnId>,
    ) {
        let RowAccess {
            txn,
            at,
            table,
            rid,
            ..
        } = *a;
        let mut row = self.rows.get(table, rid).lock();
        // SAFETY: under the row's latch, which every copy takes; TIMESTAMP owns the table.
        unsafe { install.install() };
        row.wts = row.wts.max(at.ts);
        row.prewrites.resolve(txn, woken);
    }

    fn created(&self, a: &RowAccess) {
        // Older attempts must not read the row: they ran before it existed.
        let mut row = self.rows.get(a.table, a.rid).lock();
        *row = RowTs::default();
        (row.wts, row.rts) = (a.at.ts, a.at.ts);
    }

    fn release(&self, txn: TxnId, held: &mut Held, woken: &mut Vec<TxnId>) {
        held.release(txn, &self.rows, woken);
    }
}

pub fn start(ctx: Arc<EngineCtx>) -> Result<Box<dyn Engine>, QError> {
    start_checking(ctx, true)
}

fn start_checking(ctx: Arc<EngineCtx>, order_checks: bool) -> Result<Box<dyn Engine>, QError> {
    let make = |store: &PartitionStore| Timestamp {
        rows: MetaColumn::for_partition(store),
        order_checks,
    };
    interactive::start(ctx, make, "ts")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::testing::assert_checks_bite;

    #[test]
    fn the_history_checker_catches_what_timestamp_order_prevents() {
        assert_checks_bite(&|ctx| start_checking(ctx, false), &start);
    }
}
