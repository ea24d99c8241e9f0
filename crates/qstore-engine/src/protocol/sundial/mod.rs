//! Sundial (Yu et al., VLDB 2018, section 3): logical leases, on the interactive skeleton with
//! two-phase commit.
//!
//! Every row keeps a **logical lease** `[wts, rts]`: the version was written at logical time
//! `wts` and may be read at any time up to `rts`. A transaction commits at one logical
//! timestamp inside the lease of everything it accessed, computed from those leases alone:
//! - **Execution** (Algorithm 1): a read copies the row with its lease, and the commit
//!   timestamp must be at least its `wts`; a write first takes the row's lock (write-write
//!   conflicts are 2PL's, with WAIT_DIE: an older requester waits, a younger one aborts,
//!   `wait_die`), and the commit timestamp must be past the lease, at least `rts + 1`. A row
//!   read earlier at another version than the one it locks aborts (`conflict`). Reads never
//!   wait for a lock and never block a writer. Each participant reports its *floor* (the
//!   largest of these bounds) with its outputs; the coordinator's commit timestamp is the
//!   largest floor.
//! - **Prepare** (Algorithm 2, at every participant, even a transaction's only one): each row
//!   read but not written whose lease ends before the commit timestamp has its lease renewed
//!   to it, which fails, aborting, in the three cases of the paper's figure 6: the row was
//!   written since, at or after the commit timestamp (`lease_newer_version`, case a) or
//!   before it (`lease_overwritten`, case b), or another transaction holds its lock
//!   (`lease_locked`, case c). A participant that wrote nothing then votes read-only: it
//!   takes no part in the commit phase (the paper's optimisation).
//! - **Commit** (Algorithm 3): install the writes with the lease `[ts, ts]` and release the
//!   locks; an abort only releases them.
//!
//! **Caching** (section 4, `cache`): each node keeps the rows its transactions read at other
//! nodes, with their leases, and a read may use a cached copy instead of asking the row's
//! home (by the cache's policy). A copy whose lease ends before the commit timestamp is
//! renewed at prepare like any read (the home checks the version and extends the lease), so
//! a stale copy is serializable in logical time when its lease still covers the commit
//! timestamp, and aborts the transaction otherwise (dropping the copy).
//!
//! **Read-only tables** (section 4.3, `tables`): a table the workload declares read-mostly
//! has one lease for all its rows, extended speculatively, so that cached copies of it are
//! renewed once for many rows and rarely.
//!
//! With a data directory, a participant votes only once its log holds an upper bound of the
//! commit timestamp (forced rarely: the bound is set far above it), and a restarted node
//! starts every lease at the bound it recovered (the paper's section 3.5).
//!
//! Serializable in the order of commit timestamps: a transaction's reads and writes are all
//! valid at its timestamp (`wts <= ts <= rts` for every row read, renewed under the row's
//! latch; rows written are locked from before their lease was read until the install, and a
//! lease cannot be extended while its row is locked), and versions of a row are installed in
//! increasing timestamps, each past every lease handed out for the version before.

mod cache;
mod tables;

use self::cache::RemoteCache;
use self::tables::{TableLeases, MAX_DELTA};
use crate::cluster::EngineCtx;
use crate::exec::{RowCopy, RowInstall};
use crate::protocol::interactive::cached::{ReadLease, RowCache};
use crate::protocol::interactive::{
    self, Age, Attempt, Cc, Execution, Gate, RowAccess, TabLease, Vote,
};
use crate::protocol::Engine;
use parking_lot::Mutex;
use qstore_core::txn::{CcAbortCause, TableSchema};
use qstore_core::{QError, TableId, TxnId};
use qstore_storage::{MetaColumn, PartitionStore, RowId};
use std::sync::Arc;

/// A row's lease and its write lock (the paper's tuple: wts, rts, owner, waitlist).
#[derive(Default)]
struct RowLease {
    wts: u64,
    rts: u64,
    owner: Option<(TxnId, Age)>,
    /// Waiting for the lock, each older than everyone before it (WAIT_DIE).
    waiters: Vec<(TxnId, Age)>,
}

impl RowLease {
    /// Renews the lease of the version written at `read_wts` to cover commit timestamp `ts`
    /// (Algorithm 2, `renew_lease`), or names which of the paper's three cases prevents it.
    /// `tab_rts`: its table's lease (0 if none), which `extend_table` tries to extend before
    /// the row's own is.
    fn renew(
        &mut self,
        read_wts: u64,
        ts: u64,
        tab_rts: u64,
        extend_table: impl FnOnce() -> bool,
    ) -> Result<(), CcAbortCause> {
        if self.wts != read_wts {
            return Err(if self.wts >= ts {
                CcAbortCause::LeaseNewerVersion
            } else {
                CcAbortCause::LeaseOverwritten
            });
        }
        if ts > self.rts.max(tab_rts) {
            if self.owner.is_some() {
                return Err(CcAbortCause::LeaseLocked);
            }
            if !extend_table() {
                self.rts = ts;
            }
        }
        Ok(())
    }

    /// Hands the lock to the first waiter, if any; true if the row is free now.
    fn unlock(&mut self, woken: &mut Vec<TxnId>) -> bool {
        self.owner = None;
        if self.waiters.is_empty() {
            return true;
        }
        let next = self.waiters.remove(0);
        self.owner = Some(next);
        woken.push(next.0);
        false
    }
}

/// A row read, with the lease it had then.
#[derive(Clone, Copy, Debug)]
struct Read {
    table: TableId,
    rid: RowId,
    wts: u64,
    rts: u64,
}

/// A transaction at one partition: its read set (with leases), the rows it locked, and the
/// smallest commit timestamp they allow.
#[derive(Default)]
struct Held {
    floor: u64,
    reads: Vec<Read>,
    locked: Vec<(TableId, RowId)>,
    /// The row whose lock it waits for.
    waiting: Option<(TableId, RowId)>,
    /// The table lease of the last row read, if its table has one (for a fill).
    last_tab: Option<TabLease>,
}

impl Held {
    fn locks(&self, table: TableId, rid: RowId) -> bool {
        self.locked.contains(&(table, rid))
    }
}

struct Sundial {
    rows: MetaColumn<Mutex<RowLease>>,
    /// This node's cache of rows read at other nodes (section 4), unless turned off.
    cache: Option<RemoteCache>,
    /// The leases of this partition's read-mostly tables (section 4.3).
    tables: TableLeases,
    /// Check leases (renewal at prepare, and a locked row's version against the one read);
    /// off only in the test that shows the history checker catches what the check prevents.
    check_leases: bool,
}

impl Sundial {
    /// Renews the lease of `row` (of `table`, latched) as `RowLease::renew` does, through
    /// its table's lease where it has one.
    fn renew(
        &self,
        row: &mut RowLease,
        table: TableId,
        read_wts: u64,
        ts: u64,
    ) -> Result<(), CcAbortCause> {
        let tab_rts = self.tables.rts(table);
        row.renew(read_wts, ts, tab_rts, || self.tables.extend(table, ts))
    }
}

/// Takes the row's write lock for the access, WAIT_DIE; `None` once it holds it.
fn lock(row: &mut RowLease, a: &RowAccess, held: &mut Held) -> Option<Gate> {
    let (txn, age, at) = (a.txn, a.at.age, (a.table, a.rid));
    match row.owner {
        // Granted while it waited (or already its own).
        Some((owner, _)) if owner == txn => {
            if held.waiting == Some(at) {
                held.waiting = None;
                held.locked.push(at);
            }
            return None;
        }
        None => {
            row.owner = Some((txn, age));
            held.locked.push(at);
            return None;
        }
        Some(_) => {}
    }
    if held.waiting == Some(at) {
        return Some(Gate::Wait);
    }
    let older = row.owner.iter().chain(&row.waiters).all(|&(_, o)| age < o);
    if !older {
        return Some(Gate::Abort(CcAbortCause::WaitDie));
    }
    row.waiters.push((txn, age));
    held.waiting = Some(at);
    Some(Gate::Wait)
}

impl Cc for Sundial {
    type Held = Held;

    const EXECUTION: Execution = Execution::Buffered;

    const VALIDATES: bool = true;

    const BOUNDS_TIMESTAMPS: bool = true;

    const LEASE_REACH: u64 = MAX_DELTA;

    fn read_copy(&self, a: &RowAccess, held: &mut Held, copy: &mut RowCopy<'_>) -> Gate {
        let mut row = self.rows.get(a.table, a.rid).lock();
        if a.write {
            let free = row.owner.is_none();
            if let Some(gate) = lock(&mut row, a, held) {
                return gate;
            }
            if free {
                self.tables.locked(a.table);
            }
        }
        // SAFETY: under the row's latch, which every install takes.
        unsafe { copy.current() };
        // After the lock: a writer's lock keeps the table's lease from growing.
        let tab = self.tables.lease(a.table);
        let (wts, rts) = (row.wts, row.rts.max(tab.map_or(0, |t| t.rts)));
        if !a.write {
            held.last_tab = tab;
            held.reads.push(Read {
                table: a.table,
                rid: a.rid,
                wts,
                rts,
            });
            held.floor = held.floor.max(wts);
            return Gate::Go;
        }
        let read_before = held
            .reads
            .iter()
            .any(|r| (r.table, r.rid) == (a.table, a.rid) && r.wts != wts);
        if read_before && self.check_leases {
            // Algorithm 1, line 21: it read a version that is no longer the row's.
            return Gate::Abort(CcAbortCause::Conflict);
        }
        held.floor = held.floor.max(rts + 1);
        Gate::Go
    }

    fn commit_floor(&self, held: &Held) -> u64 {
        held.floor
    }

    fn row_cache(&self) -> Option<&dyn RowCache> {
        self.cache.as_ref().map(|c| c as &dyn RowCache)
    }

    fn last_read_lease(&self, held: &Held) -> Option<ReadLease> {
        held.reads.last().map(|r| ReadLease {
            wts: r.wts,
            rts: r.rts,
            tab: held.last_tab,
        })
    }

    fn tab_lease(&self, table: TableId) -> Option<TabLease> {
        self.tables.lease(table)
    }

    fn renew_cached(
        &self,
        txn: TxnId,
        table: TableId,
        rid: RowId,
        wts: u64,
        ts: u64,
    ) -> Result<(), CcAbortCause> {
        if !self.check_leases {
            return Ok(());
        }
        let mut row = self.rows.get(table, rid).lock();
        if row.owner.is_some_and(|(o, _)| o == txn) {
            // It locked the row to write it: the version it read must still be the row's
            // (Algorithm 1, line 21), and the lock keeps it so.
            return if row.wts == wts {
                Ok(())
            } else {
                Err(CcAbortCause::Conflict)
            };
        }
        self.renew(&mut row, table, wts, ts)
    }

    fn prepare(
        &self,
        _txn: TxnId,
        at: &Attempt,
        held: &mut Held,
        wrote: bool,
        _store: &PartitionStore,
    ) -> Vote {
        debug_assert!(at.ts >= held.floor, "the coordinator saw this floor");
        if self.check_leases {
            // Rows it also wrote are locked at the version it read: valid at any timestamp
            // past their lease, which the floor is.
            let to_renew = held
                .reads
                .iter()
                .filter(|r| at.ts > r.rts && !held.locks(r.table, r.rid));
            for r in to_renew {
                let mut row = self.rows.get(r.table, r.rid).lock();
                if let Err(cause) = self.renew(&mut row, r.table, r.wts, at.ts) {
                    return Vote::No(cause);
                }
            }
        }
        if wrote {
            Vote::Yes
        } else {
            Vote::ReadOnly
        }
    }

    fn install(
        &self,
        a: &RowAccess,
        _held: &mut Held,
        install: &mut RowInstall<'_>,
        _woken: &mut Vec<TxnId>,
    ) {
        let mut row = self.rows.get(a.table, a.rid).lock();
        debug_assert!(
            a.at.ts > row.rts.max(self.tables.rts(a.table))
                || !self.check_leases
                || !self.tables.guards_locks(),
            "a locked row's lease (and its table's) cannot grow past its writer's timestamp"
        );
        // SAFETY: under the row's latch, which every copy takes; Sundial owns the table.
        unsafe { install.install() };
        (row.wts, row.rts) = (a.at.ts, a.at.ts);
        self.tables.installed(a.table);
    }

    fn created(&self, a: &RowAccess) {
        let mut row = self.rows.get(a.table, a.rid).lock();
        *row = RowLease {
            wts: a.at.ts,
            rts: a.at.ts,
            ..RowLease::default()
        };
        self.tables.installed(a.table);
    }

    fn absent_mark(&self, at: &Attempt) -> u64 {
        at.ts // the commit timestamp, by the time the reader ends
    }

    fn insert_after(
        &self,
        _txn: TxnId,
        _at: &Attempt,
        held: &mut Held,
        mark: u64,
    ) -> Result<(), CcAbortCause> {
        // Past the committed readers of the key's absence, as a write is past a lease.
        held.floor = held.floor.max(mark + 1);
        Ok(())
    }

    fn commit_order(&self, at: &Attempt) -> Option<u128> {
        // Transactions that do not conflict may share a commit timestamp; the attempt's id
        // breaks the tie (writers of one row never share one).
        Some((u128::from(at.ts) << 64) | u128::from(at.age.id.0))
    }

    fn restarted_below(&self, bound: u64) {
        // Section 3.5: every lease handed out before the restart ended below `bound`, so
        // every lease starts at [bound, bound]; a transaction that read a row before the
        // restart cannot renew its lease into the time of writes made after it.
        for row in self.rows.iter() {
            let mut row = row.lock();
            (row.wts, row.rts) = (bound, bound);
        }
        self.tables.restarted_below(bound);
    }

    fn release(&self, txn: TxnId, held: &mut Held, woken: &mut Vec<TxnId>) {
        if let Some((table, rid)) = held.waiting.take() {
            let mut row = self.rows.get(table, rid).lock();
            row.waiters.retain(|&(t, _)| t != txn);
            // Granted on the way, but it never came back for it.
            if row.owner.is_some_and(|(o, _)| o == txn) && row.unlock(woken) {
                self.tables.unlocked(table);
            }
        }
        for (table, rid) in held.locked.drain(..) {
            let mut row = self.rows.get(table, rid).lock();
            debug_assert!(row.owner.is_some_and(|(o, _)| o == txn));
            if row.unlock(woken) {
                self.tables.unlocked(table);
            }
        }
        held.reads.clear();
        held.floor = 0;
        held.last_tab = None;
    }
}

pub fn start(ctx: Arc<EngineCtx>) -> Result<Box<dyn Engine>, QError> {
    start_checking(ctx, true, TableLeases::new)
}

/// Tests start Sundial with some checks off (`check_leases`), or with other table leases
/// than the configuration's.
fn start_checking(
    ctx: Arc<EngineCtx>,
    check_leases: bool,
    table_leases: fn(&[TableSchema], bool) -> TableLeases,
) -> Result<Box<dyn Engine>, QError> {
    let settings = ctx.cfg.protocol.sundial.clone();
    let schemas = ctx.catalog.tables.clone();
    let make = move |store: &PartitionStore| Sundial {
        rows: MetaColumn::for_partition(store),
        cache: RemoteCache::new(settings.cache_mb, settings.cache_policy),
        tables: table_leases(&schemas, settings.table_leases),
        check_leases,
    };
    interactive::start(ctx, make, "sundial")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::interactive::Age;
    use crate::protocol::testing::assert_checks_bite;

    #[test]
    fn the_history_checker_catches_what_the_lease_check_prevents() {
        assert_checks_bite(&|ctx| start_checking(ctx, false, TableLeases::new), &start);
    }

    #[test]
    fn the_history_checker_catches_a_table_lease_extended_past_a_locked_row() {
        let guarded = |ctx| start_checking(ctx, true, |s, _| TableLeases::every_table(s, true));
        let unguarded = |ctx| start_checking(ctx, true, |s, _| TableLeases::every_table(s, false));
        assert_checks_bite(&unguarded, &guarded);
    }

    fn access(txn: u64, birth_us: u64, write: bool) -> RowAccess {
        let age = Age {
            birth_us,
            id: TxnId(txn),
        };
        RowAccess {
            txn: TxnId(txn),
            at: Attempt { age, ts: 0 },
            table: 0,
            rid: 7,
            write,
        }
    }

    #[test]
    fn an_older_writer_waits_a_younger_one_dies_and_the_lock_passes_on() {
        let mut row = RowLease::default();
        let (young, old, older) = (
            access(1, 30, true),
            access(2, 20, true),
            access(3, 10, true),
        );
        let mut held = [Held::default(), Held::default(), Held::default()];
        assert_eq!(lock(&mut row, &young, &mut held[0]), None, "free: taken");
        assert_eq!(lock(&mut row, &old, &mut held[1]), Some(Gate::Wait));
        assert_eq!(
            lock(&mut row, &old, &mut held[1]),
            Some(Gate::Wait),
            "asked again"
        );
        assert_eq!(lock(&mut row, &older, &mut held[2]), Some(Gate::Wait));
        let youngest = access(4, 40, true);
        assert_eq!(
            lock(&mut row, &youngest, &mut Held::default()),
            Some(Gate::Abort(CcAbortCause::WaitDie))
        );
        let mut woken = Vec::new();
        row.unlock(&mut woken);
        assert_eq!(woken, vec![TxnId(2)], "the first waiter");
        assert_eq!(lock(&mut row, &old, &mut held[1]), None, "granted");
        assert_eq!(held[1].locked, vec![(0, 7)]);
        assert_eq!(held[1].waiting, None);
    }

    /// Renews a lease of a row whose table has none.
    fn renew(r: &mut RowLease, read_wts: u64, ts: u64) -> Result<(), CcAbortCause> {
        r.renew(read_wts, ts, 0, || false)
    }

    fn row(wts: u64, rts: u64) -> RowLease {
        RowLease {
            wts,
            rts,
            ..RowLease::default()
        }
    }

    #[test]
    fn a_lease_renews_unless_the_row_changed_or_is_locked() {
        // Within the lease: nothing to extend.
        let mut r = row(5, 9);
        assert_eq!(renew(&mut r, 5, 8), Ok(()));
        assert_eq!(r.rts, 9);
        // Past it: extended.
        assert_eq!(renew(&mut r, 5, 12), Ok(()));
        assert_eq!(r.rts, 12);
        // Figure 6: (a) rewritten at or after the commit timestamp, (b) before it, (c) locked.
        assert_eq!(
            renew(&mut row(14, 14), 5, 12),
            Err(CcAbortCause::LeaseNewerVersion)
        );
        assert_eq!(
            renew(&mut row(10, 10), 5, 12),
            Err(CcAbortCause::LeaseOverwritten)
        );
        let mut locked = row(5, 9);
        locked.owner = Some((TxnId(1), access(1, 1, true).at.age));
        assert_eq!(renew(&mut locked, 5, 12), Err(CcAbortCause::LeaseLocked));
        assert_eq!(
            renew(&mut locked, 5, 9),
            Ok(()),
            "no extension needed: a lock is no bar"
        );
    }

    #[test]
    fn a_table_lease_counts_as_the_rows_and_is_extended_in_its_place() {
        let never = || -> bool { panic!("within the table's lease: nothing to extend") };
        let mut r = row(5, 9);
        assert_eq!(r.renew(5, 20, 30, never), Ok(()));
        assert_eq!(r.rts, 9, "the row's own lease is untouched");
        assert_eq!(r.renew(5, 40, 30, || true), Ok(()));
        assert_eq!(r.rts, 9, "the table's lease was extended instead");
        assert_eq!(r.renew(5, 40, 30, || false), Ok(()));
        assert_eq!(r.rts, 40, "the table's lease could not grow: the row's did");
        assert_eq!(
            row(10, 10).renew(5, 20, 30, never),
            Err(CcAbortCause::LeaseOverwritten),
            "the table's lease covers current versions only"
        );
        let mut locked = row(5, 9);
        locked.owner = Some((TxnId(1), access(1, 1, true).at.age));
        assert_eq!(
            locked.renew(5, 40, 30, || true),
            Err(CcAbortCause::LeaseLocked)
        );
    }
}
