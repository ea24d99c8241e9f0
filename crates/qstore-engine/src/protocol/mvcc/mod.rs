//! MVCC: multi-version timestamp ordering with a timestamp assigned statically when an attempt
//! starts (the baseline of the Sundial paper, section 6.6), on the interactive skeleton with
//! two-phase commit. It is TIMESTAMP (see [`crate::protocol::timestamp`]) with old versions
//! kept, so that reads of the past never abort:
//! - every row keeps its current version in the table, with its write timestamp `wts` and the
//!   largest timestamp that read it (`rts`), and up to `max_versions` older versions (bytes,
//!   `wts`, `rts`) beside it, in a [`MetaColumn`];
//! - a read at `ts` takes the newest version written before `ts`: the current one when
//!   `ts > wts` (waiting, as in TIMESTAMP, for an older pending write it must see), else an
//!   older one, which never waits (no pending write is older than `wts`). Either way it
//!   raises that version's `rts`. A read that needs a version already reclaimed aborts
//!   (`version_reclaimed`): this is how the chain stays bounded;
//! - a write at `ts` appends a version: it is refused when a later version exists (`ts <
//!   wts`) or a younger attempt read the current one (`ts < rts`), as in TIMESTAMP. Versions
//!   are never inserted into the middle of the chain, which keeps installs in timestamp order
//!   (at the price of refusing some writes Deneva's MVCC would slot in).
//!
//! A row's memory is bounded: at most `max_versions` older copies of its bytes, dropped
//! oldest first as new versions are installed.

use crate::cluster::EngineCtx;
use crate::exec::{RowCopy, RowInstall};
use crate::protocol::interactive::prewrites::{Held, PrewriteRow, Prewrites};
use crate::protocol::interactive::{self, Cc, Execution, Gate, RowAccess};
use crate::protocol::Engine;
use parking_lot::Mutex;
use qstore_core::txn::CcAbortCause;
use qstore_core::{QError, TxnId};
use qstore_storage::{MetaColumn, PartitionStore, RowVersion};
use std::sync::Arc;

/// A row's versions: the current one's timestamps, the older ones, the pending writes.
#[derive(Default)]
struct RowVersions {
    wts: u64,
    rts: u64,
    prewrites: Prewrites,
    /// Older versions, oldest first.
    older: Vec<OldVersion>,
}

impl PrewriteRow for RowVersions {
    fn prewrites(&mut self) -> &mut Prewrites {
        &mut self.prewrites
    }
}

struct OldVersion {
    wts: u64,
    rts: u64,
    version: RowVersion,
    bytes: Box<[u8]>,
}

impl RowVersions {
    /// The newest older version written before `ts`.
    fn older_before(&mut self, ts: u64) -> Option<&mut OldVersion> {
        self.older.iter_mut().rev().find(|v| v.wts < ts)
    }
}

struct Mvcc {
    rows: MetaColumn<Mutex<RowVersions>>,
    max_versions: usize,
    /// Refuse writes behind a later version or a younger read; off only in the test that
    /// shows the history checker catches what it prevents.
    order_checks: bool,
}

impl Mvcc {
    fn read_current(&self, ts: u64, row: &mut RowVersions, copy: &mut RowCopy<'_>) -> Gate {
        // SAFETY: under the row's latch (the caller holds it), which every install takes.
        unsafe { copy.current() };
        row.rts = row.rts.max(ts);
        Gate::Go
    }

    fn read_older(&self, ts: u64, row: &mut RowVersions, copy: &mut RowCopy<'_>) -> Gate {
        match row.older_before(ts) {
            Some(v) => {
                copy.older(&v.bytes, v.version);
                v.rts = v.rts.max(ts);
                Gate::Go
            }
            None => Gate::Abort(CcAbortCause::VersionReclaimed),
        }
    }
}

impl Cc for Mvcc {
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
        let mut guard = self.rows.get(table, rid).lock();
        let row = &mut *guard;
        held.resumed(txn, table, rid, &mut row.prewrites);
        if !write && ts < row.wts {
            return self.read_older(ts, row, copy);
        }
        if row.prewrites.older_than(txn, ts) {
            return held.wait(txn, table, rid, &mut row.prewrites);
        }
        if self.order_checks && write && (ts < row.wts || ts < row.rts) {
            return Gate::Abort(CcAbortCause::TimestampOrder);
        }
        let gate = self.read_current(ts, row, copy);
        if write {
            held.prewrite(txn, ts, table, rid, &mut row.prewrites);
        }
        gate
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
        // SAFETY: under the row's latch, which every copy takes.
        let (bytes, version) = unsafe { install.replaced() };
        let old = OldVersion {
            wts: row.wts,
            rts: row.rts,
            version,
            bytes: bytes.into(),
        };
        if row.older.len() == self.max_versions {
            row.older.remove(0);
        }
        row.older.push(old);
        // SAFETY: under the row's latch, which every copy takes; MVCC owns the table, and
        // the bytes `replaced` lent were copied above.
        unsafe { install.install() };
        row.wts = row.wts.max(at.ts);
        row.rts = row.rts.max(at.ts);
        row.prewrites.resolve(txn, woken);
    }

    fn created(&self, a: &RowAccess) {
        // No older version: an older attempt that reads the row is refused
        // (`version_reclaimed`), as it would be past a reclaimed version, where it should
        // have found no row at all.
        let mut row = self.rows.get(a.table, a.rid).lock();
        *row = RowVersions::default();
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
    let max_versions = ctx.cfg.protocol.mvcc.max_versions as usize;
    let make = |store: &PartitionStore| Mvcc {
        rows: MetaColumn::for_partition(store),
        max_versions,
        order_checks,
    };
    interactive::start(ctx, make, "mvcc")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::BufferedWrite;
    use crate::protocol::interactive::Attempt;
    use crate::protocol::testing::assert_checks_bite;

    #[test]
    fn the_history_checker_catches_what_version_order_prevents() {
        assert_checks_bite(&|ctx| start_checking(ctx, false), &start);
    }

    /// The partition-0 store of the exec fixture (keys 0..8 hold counter 5) and an MVCC over
    /// it keeping `max_versions`.
    fn fixture(max_versions: usize) -> (PartitionStore, Mvcc) {
        let (_, _, mut stores) = crate::exec::tests::fixture();
        let store = stores.swap_remove(0);
        let mvcc = Mvcc {
            rows: MetaColumn::for_partition(&store),
            max_versions,
            order_checks: true,
        };
        (store, mvcc)
    }

    fn attempt(ts: u64) -> Attempt {
        let age = crate::protocol::interactive::Age {
            birth_us: ts,
            id: TxnId(ts),
        };
        Attempt { age, ts }
    }

    /// Attempt `ts` reads key 0: the counter it sees (`None`: the row was deleted), or why
    /// it may not.
    fn read_row(store: &PartitionStore, cc: &Mvcc, ts: u64) -> Result<Option<i64>, Gate> {
        let table = store.table(0);
        let rid = table.slot(0).unwrap();
        let mut copy = RowCopy::new(table, rid);
        let mut held = Held::default();
        let access = RowAccess {
            txn: TxnId(ts),
            at: attempt(ts),
            table: 0,
            rid,
            write: false,
        };
        match cc.read_copy(&access, &mut held, &mut copy) {
            Gate::Go => {
                let (bytes, version) = copy.take().unwrap();
                let counter = i64::from_le_bytes(bytes[..8].try_into().unwrap());
                Ok((!version.dead).then_some(counter))
            }
            gate => Err(gate),
        }
    }

    /// [`read_row`] of a row that must be there.
    fn read(store: &PartitionStore, cc: &Mvcc, ts: u64) -> Result<i64, Gate> {
        read_row(store, cc, ts).map(|v| v.expect("the row is there"))
    }

    /// Attempt `ts` writes `value` to key 0 and commits at once.
    fn write(store: &PartitionStore, cc: &Mvcc, ts: u64, value: i64) -> Gate {
        write_row(store, cc, ts, Some(value))
    }

    /// Attempt `ts` writes `value` to key 0 (`None`: deletes it) and commits at once.
    fn write_row(store: &PartitionStore, cc: &Mvcc, ts: u64, value: Option<i64>) -> Gate {
        let (table, txn) = (store.table(0), TxnId(ts));
        let rid = table.slot(0).unwrap();
        let mut copy = RowCopy::new(table, rid);
        let mut held = Held::default();
        let access = RowAccess {
            txn,
            at: attempt(ts),
            table: 0,
            rid,
            write: true,
        };
        let gate = cc.read_copy(&access, &mut held, &mut copy);
        if gate != Gate::Go {
            return gate;
        }
        let write = BufferedWrite {
            table: 0,
            key: 0,
            rid: Some(rid),
            bytes: value.unwrap_or(0).to_le_bytes().to_vec(),
            present: value.is_some(),
        };
        let mut row = RowInstall::new(table, rid, &write, txn);
        let mut woken = Vec::new();
        cc.install(&access, &mut held, &mut row, &mut woken);
        cc.release(txn, &mut held, &mut woken);
        Gate::Go
    }

    #[test]
    fn a_read_of_the_past_takes_the_version_of_its_time_instead_of_aborting() {
        let (store, cc) = fixture(4);
        assert_eq!(write(&store, &cc, 100, 7), Gate::Go);
        assert_eq!(write(&store, &cc, 200, 9), Gate::Go);
        assert_eq!(read(&store, &cc, 300), Ok(9));
        assert_eq!(read(&store, &cc, 150), Ok(7));
        assert_eq!(read(&store, &cc, 50), Ok(5), "the loaded version");
        // The read at 150 forbids a write at 120 between versions 100 and 200, and a write
        // at 250 after the read at 300.
        assert_eq!(
            write(&store, &cc, 120, 1),
            Gate::Abort(CcAbortCause::TimestampOrder)
        );
        assert_eq!(
            write(&store, &cc, 250, 1),
            Gate::Abort(CcAbortCause::TimestampOrder)
        );
    }

    #[test]
    fn a_delete_leaves_the_row_to_reads_of_the_past_and_a_tombstone_to_later_ones() {
        let (store, cc) = fixture(4);
        assert_eq!(write_row(&store, &cc, 100, None), Gate::Go);
        assert_eq!(store.table(0).lookup(0), None, "deleted for lookups");
        assert_eq!(read_row(&store, &cc, 50), Ok(Some(5)), "before the delete");
        assert_eq!(read_row(&store, &cc, 150), Ok(None), "after it");
        // The read at 150 saw the key absent: an insert at 120 would change that past.
        assert_eq!(
            write_row(&store, &cc, 120, Some(1)),
            Gate::Abort(CcAbortCause::TimestampOrder)
        );
        assert_eq!(write_row(&store, &cc, 200, Some(8)), Gate::Go);
        assert_eq!(store.table(0).len(), 8, "inserted again");
        assert_eq!(read_row(&store, &cc, 170), Ok(None), "absent in between");
        assert_eq!(read_row(&store, &cc, 250), Ok(Some(8)));
    }

    #[test]
    fn versions_past_the_bound_are_reclaimed_and_their_readers_abort() {
        let (store, cc) = fixture(2);
        for (i, ts) in [100, 200, 300, 400].into_iter().enumerate() {
            assert_eq!(write(&store, &cc, ts, i as i64), Gate::Go);
        }
        let row = cc.rows.get(0, store.table(0).lookup(0).unwrap()).lock();
        assert_eq!(row.older.len(), 2, "the bound holds");
        drop(row);
        assert_eq!(read(&store, &cc, 250), Ok(1));
        assert_eq!(
            read(&store, &cc, 150),
            Err(Gate::Abort(CcAbortCause::VersionReclaimed))
        );
    }
}
