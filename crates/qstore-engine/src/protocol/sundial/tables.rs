//! Sundial's read-only table optimisations (its paper's section 4.3), at a row's home: a
//! table its workload declares read-mostly has one lease for all its rows, `tab_rts`, and
//! renewing a lease of one of its rows extends the table's instead, speculatively past the
//! commit timestamp that asked for it (by δ, which grows while the table is not written).
//! A copy of any of its rows then stays valid as long as the table's lease does, so a node
//! caching the table renews it once for many rows, and rarely.
//!
//! Every current version of a row of such a table is valid up to the larger of its own
//! `rts` and `tab_rts`. What keeps that true:
//! - `tab_rts` advances only while none of the table's rows is locked, and a writer that
//!   locks a row passes `tab_rts` as it passes the row's `rts` (the paper's
//!   `Max(rts + 1, tab_rts + 1, wts)`); so a write lands after every lease handed out for
//!   the version it replaces, and while it is in flight the table's lease stays put;
//! - the table counts its writes, and a cached copy carries the count it was read at: a
//!   table lease learnt at the same count covers the copy (no row of the table changed in
//!   between), one learnt later does not (the copy keeps its own lease).
//!
//! **Writes** to such a table are correct, only dearer: each resets δ, makes every cached
//! copy of the table fall back to its own lease, and, while it holds its lock, stops the
//! table's lease from growing (renewals then extend single rows, as for any table).

use crate::protocol::interactive::TabLease;
use parking_lot::Mutex;
use qstore_core::txn::TableSchema;
use qstore_core::TableId;
use std::sync::atomic::{AtomicU64, Ordering};

/// The largest speculative extension δ: far below the slack of the bound a log keeps on
/// timestamps (`LEASE_REACH` makes the log cover it), and at the rate commit timestamps of
/// hot rows grow (one per write) a lease of a few seconds.
pub(super) const MAX_DELTA: u64 = 1 << 20;

/// The lease of one read-mostly table at one partition.
#[derive(Default)]
struct TabState {
    /// `tab_rts`. Read without the latch; written under it.
    rts: AtomicU64,
    /// Writes installed into the table so far.
    writes: AtomicU64,
    latch: Mutex<Extension>,
}

#[derive(Default)]
struct Extension {
    /// Rows of the table locked by writers now.
    locked: u32,
    /// The speculative extension δ.
    delta: u64,
    /// `writes` when the lease was last extended.
    writes_then: u64,
}

/// The leases of a partition's read-mostly tables (none when the optimisation is off).
pub(super) struct TableLeases {
    tables: Box<[Option<TabState>]>,
    /// Refuse to extend a table's lease while a row of it is locked; off only in the test
    /// that shows the history checker catches what this prevents.
    guard_locks: bool,
}

impl TableLeases {
    pub(super) fn new(schemas: &[TableSchema], on: bool) -> TableLeases {
        let tables = schemas
            .iter()
            .map(|s| (on && s.read_mostly).then(TabState::default))
            .collect();
        TableLeases {
            tables,
            guard_locks: true,
        }
    }

    /// Leases for every table, read-mostly or not (to test them on any workload), guarding
    /// locked rows or not.
    #[cfg(test)]
    pub(super) fn every_table(schemas: &[TableSchema], guard_locks: bool) -> TableLeases {
        TableLeases {
            tables: schemas.iter().map(|_| Some(TabState::default())).collect(),
            guard_locks,
        }
    }

    /// Whether a locked row stops its table's lease (always, but in one test).
    pub(super) fn guards_locks(&self) -> bool {
        self.guard_locks
    }

    fn get(&self, table: TableId) -> Option<&TabState> {
        self.tables.get(table as usize)?.as_ref()
    }

    /// The table's lease as a reader sees it: `tab_rts` first, then the writes, so that a
    /// write landing in between makes the pair claim less, never more.
    pub(super) fn lease(&self, table: TableId) -> Option<TabLease> {
        let t = self.get(table)?;
        let rts = t.rts.load(Ordering::SeqCst);
        let writes = t.writes.load(Ordering::SeqCst);
        Some(TabLease { writes, rts })
    }

    /// `tab_rts` (0 for a table without a lease).
    pub(super) fn rts(&self, table: TableId) -> u64 {
        self.get(table).map_or(0, |t| t.rts.load(Ordering::SeqCst))
    }

    /// A writer locked a row of the table: the lease stops growing until it unlocks, and
    /// the writer's commit timestamp must pass what this returns.
    pub(super) fn locked(&self, table: TableId) -> u64 {
        let Some(t) = self.get(table) else {
            return 0;
        };
        let mut e = t.latch.lock();
        e.locked += 1;
        t.rts.load(Ordering::SeqCst)
    }

    /// A row of the table is no longer locked.
    pub(super) fn unlocked(&self, table: TableId) {
        if let Some(t) = self.get(table) {
            let mut e = t.latch.lock();
            debug_assert!(e.locked > 0);
            e.locked -= 1;
        }
    }

    /// A write of one of the table's rows was installed (under the row's latch).
    pub(super) fn installed(&self, table: TableId) {
        if let Some(t) = self.get(table) {
            t.writes.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Extends the table's lease to cover commit timestamp `ts`, and δ beyond it; false
    /// if a row of the table is locked (or the table has no lease).
    pub(super) fn extend(&self, table: TableId, ts: u64) -> bool {
        let Some(t) = self.get(table) else {
            return false;
        };
        let mut e = t.latch.lock();
        if e.locked > 0 && self.guard_locks {
            return false;
        }
        // δ starts at 0 and doubles with every extension while the table goes unwritten.
        let writes = t.writes.load(Ordering::SeqCst);
        if writes != e.writes_then {
            e.delta = 0;
        }
        t.rts.fetch_max(ts + e.delta, Ordering::SeqCst);
        e.delta = (e.delta * 2).clamp(1, MAX_DELTA);
        e.writes_then = writes;
        true
    }

    /// After a restart: every lease starts at `bound`. The counts of writes start again
    /// from 0, which is sound because caches do not outlive a restart: the cluster restarts
    /// as a whole (a server alone is refused by its peers), so no copy was read at a count
    /// of the previous run.
    pub(super) fn restarted_below(&self, bound: u64) {
        for t in self.tables.iter().flatten() {
            t.rts.store(bound, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema(read_mostly: bool) -> TableSchema {
        TableSchema {
            name: "t".into(),
            row_size: 8,
            capacity_per_partition: 4,
            keys_per_partition: 4,
            read_mostly,
        }
    }

    fn leases() -> TableLeases {
        TableLeases::new(&[schema(false), schema(true)], true)
    }

    #[test]
    fn only_read_mostly_tables_have_a_lease() {
        let l = leases();
        assert_eq!(l.lease(0), None);
        assert!(!l.extend(0, 10));
        assert_eq!(l.lease(1), Some(TabLease { writes: 0, rts: 0 }));
        let off = TableLeases::new(&[schema(true)], false);
        assert_eq!(off.lease(0), None, "the optimisation turned off");
    }

    #[test]
    fn the_extension_grows_while_the_table_is_unwritten_and_resets_on_a_write() {
        let l = leases();
        let mut reached = Vec::new();
        for ts in [100, 200, 300, 400] {
            assert!(l.extend(1, ts));
            reached.push(l.rts(1) - ts);
        }
        assert_eq!(reached, [0, 1, 2, 4], "δ doubles");
        l.installed(1);
        assert!(l.extend(1, 1000));
        assert_eq!(l.rts(1), 1000, "δ back to 0 after a write");
        assert_eq!(
            l.lease(1),
            Some(TabLease {
                writes: 1,
                rts: 1000
            })
        );
        for ts in 0..40 {
            l.extend(1, 2000 + ts);
        }
        assert_eq!(l.rts(1), 2039 + MAX_DELTA, "δ is bounded");
    }

    #[test]
    fn a_locked_row_stops_the_table_lease_and_its_writer_passes_it() {
        let l = leases();
        assert!(l.extend(1, 50));
        let floor = l.locked(1);
        assert_eq!(floor, 50, "the writer commits past the table's lease");
        assert!(!l.extend(1, 80), "no extension while a row is locked");
        assert_eq!(l.rts(1), 50);
        l.installed(1);
        l.unlocked(1);
        assert!(l.extend(1, 80));
        assert_eq!(l.rts(1), 80);
        l.restarted_below(7);
        assert_eq!(l.rts(1), 7);
    }
}
