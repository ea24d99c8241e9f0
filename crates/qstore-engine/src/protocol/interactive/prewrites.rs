//! The pending writes (prewrites) of the timestamp-ordering protocols (TIMESTAMP, MVCC): a
//! write is buffered until commit, and an attempt that must see it (a younger one reading
//! the row) waits for it to be installed or dropped.

use super::Gate;
use parking_lot::Mutex;
use qstore_core::{TableId, TxnId};
use qstore_storage::{MetaColumn, RowId};

/// A row's pending writes (prewrites) and the attempts waiting for them, in the timestamp
/// protocols (TIMESTAMP, MVCC). Empty, as most rows are, it is one null pointer.
#[derive(Default)]
pub(crate) struct Prewrites(Option<Box<Pending>>);

#[derive(Default)]
struct Pending {
    /// Prewrites not yet installed or dropped: (timestamp, attempt).
    prewrites: Vec<(u64, TxnId)>,
    /// Attempts waiting for an older prewrite to go.
    waiters: Vec<TxnId>,
}

impl Prewrites {
    /// Whether an attempt other than `txn`, older than `ts`, has a pending write here.
    pub(crate) fn older_than(&self, txn: TxnId, ts: u64) -> bool {
        self.0.as_ref().is_some_and(|p| {
            p.prewrites
                .iter()
                .any(|&(pts, owner)| pts < ts && owner != txn)
        })
    }

    fn pending(&mut self) -> &mut Pending {
        self.0.get_or_insert_with(Default::default)
    }

    pub(crate) fn add(&mut self, ts: u64, txn: TxnId) {
        self.pending().prewrites.push((ts, txn));
    }

    pub(crate) fn wait(&mut self, txn: TxnId) {
        self.pending().waiters.push(txn);
    }

    /// Drops `txn`'s prewrite and wakes every waiter (each checks again).
    pub(crate) fn resolve(&mut self, txn: TxnId, woken: &mut Vec<TxnId>) {
        if let Some(p) = &mut self.0 {
            p.prewrites.retain(|&(_, owner)| owner != txn);
            woken.append(&mut p.waiters);
            if p.prewrites.is_empty() {
                self.0 = None;
            }
        }
    }

    pub(crate) fn stop_waiting(&mut self, txn: TxnId) {
        if let Some(p) = &mut self.0 {
            p.waiters.retain(|&w| w != txn);
        }
    }
}

/// What an attempt has at a partition, in the timestamp protocols: the rows it prewrote, and
/// the row it waits on.
#[derive(Default)]
pub(crate) struct Held {
    pub(crate) prewrites: Vec<(TableId, RowId)>,
    pub(crate) waiting: Option<(TableId, RowId)>,
}

impl Held {
    /// The row `txn` waited on, if any, is (`table`, `rid`): it no longer waits there.
    pub(crate) fn resumed(&mut self, txn: TxnId, table: TableId, rid: RowId, p: &mut Prewrites) {
        if let Some(w) = self.waiting.take() {
            debug_assert_eq!(w, (table, rid), "an attempt waits on one row at a time");
            p.stop_waiting(txn);
        }
    }

    /// `txn` waits at row (`table`, `rid`) for an older prewrite.
    pub(crate) fn wait(
        &mut self,
        txn: TxnId,
        table: TableId,
        rid: RowId,
        p: &mut Prewrites,
    ) -> Gate {
        p.wait(txn);
        self.waiting = Some((table, rid));
        Gate::Wait
    }

    /// `txn` prewrites row (`table`, `rid`) at `ts`.
    pub(crate) fn prewrite(
        &mut self,
        txn: TxnId,
        ts: u64,
        table: TableId,
        rid: RowId,
        p: &mut Prewrites,
    ) {
        p.add(ts, txn);
        self.prewrites.push((table, rid));
    }

    /// Stops waiting and drops every prewrite, in the per-row metadata `rows`.
    pub(crate) fn release<R: PrewriteRow>(
        &mut self,
        txn: TxnId,
        rows: &MetaColumn<Mutex<R>>,
        woken: &mut Vec<TxnId>,
    ) {
        if let Some((table, rid)) = self.waiting.take() {
            rows.get(table, rid).lock().prewrites().stop_waiting(txn);
        }
        for (table, rid) in self.prewrites.drain(..) {
            rows.get(table, rid).lock().prewrites().resolve(txn, woken);
        }
    }
}

/// A row's metadata that holds its pending writes.
pub(crate) trait PrewriteRow {
    fn prewrites(&mut self) -> &mut Prewrites;
}
