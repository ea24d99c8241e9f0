//! Keys without a row, under buffered execution. A buffered protocol's metadata lives beside
//! rows (a deleted row keeps its slot as a tombstone, so it keeps its metadata too), so a key
//! that was never there has none: its guard lives here instead, while it is needed.
//!
//! - **Inserts**: until the inserting transaction ends, its key is held by it. A second
//!   insert of a held key is refused (`conflict`), as a lock on the key under NO_WAIT would
//!   be, so at most one transaction at a time may create a key and the install at commit finds
//!   it still free. Room in the table is held with the key, so that the install cannot find
//!   the table full after the decision to commit.
//! - **Reads of an absent key** (the phantom case: a read that found nothing must still find
//!   nothing when the transaction commits): the reader is registered on the key while it runs.
//!   An insert of a key that others read absent, or a read of a key another transaction is
//!   inserting, is refused (`conflict`). A committed read leaves a **mark**, its place in the
//!   protocol's order ([`Cc::absent_mark`](super::Cc::absent_mark): its timestamp for the
//!   timestamp protocols and MaaT, nothing for OCC), which a later insert of the key must
//!   follow ([`Cc::insert_after`](super::Cc::insert_after)).
//!
//! Marks are kept for at most [`MAX_GUARDS`] keys: beyond that, the older half of the idle
//! guards is dropped and their marks folded into one **floor** that every insert must then
//! follow, so memory stays bounded at the price of refusing some inserts older than the
//! reads forgotten.

use parking_lot::Mutex;
use qstore_core::{Key, TableId, TxnId};
use qstore_storage::Table;
use rustc_hash::FxHashMap;

/// Guards kept before the idle ones with the older marks are folded into the floor.
pub(super) const MAX_GUARDS: usize = 1 << 16;

/// The guards of one partition's absent keys.
#[derive(Default)]
pub(super) struct AbsentKeys {
    inner: Mutex<Guards>,
}

#[derive(Default)]
struct Guards {
    keys: FxHashMap<(TableId, Key), Guard>,
    /// Per table, how many keys are held for inserts (the rows they will take).
    rows: FxHashMap<TableId, usize>,
    /// The largest mark of the guards dropped to bound memory.
    floor: u64,
}

/// What guards one absent key.
#[derive(Default)]
struct Guard {
    inserter: Option<TxnId>,
    /// Running transactions that read it absent.
    readers: Vec<TxnId>,
    /// The largest mark a committed read of it left.
    mark: u64,
}

impl Guard {
    fn idle(&self) -> bool {
        self.inserter.is_none() && self.readers.is_empty()
    }
}

/// Why a key could not be held or read.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Refused {
    /// Another transaction is inserting it, or (for an insert) reading it absent.
    Taken,
    /// The table has no room for it besides the rows already held.
    Full,
    /// It exists (another transaction's insert committed since the caller looked).
    Exists,
}

impl AbsentKeys {
    /// Holds (`table_id`, `key`) for `txn` to insert, which found it absent in `table`;
    /// returns the mark the insert must follow.
    pub(super) fn hold(
        &self,
        txn: TxnId,
        table_id: TableId,
        table: &Table,
        key: Key,
    ) -> Result<u64, Refused> {
        let mut g = self.inner.lock();
        let floor = g.floor;
        let held = g.rows.get(&table_id).copied().unwrap_or(0);
        let guard = g.keys.get(&(table_id, key));
        if let Some(guard) = guard {
            if guard.inserter == Some(txn) {
                return Ok(guard.mark.max(floor));
            }
            if guard.inserter.is_some() || guard.readers.iter().any(|&r| r != txn) {
                return Err(Refused::Taken);
            }
        }
        // Looked up again under the lock: a committed insert creates its row before it lets
        // go of the key, so a key no longer held is found here if it was created. A tombstone
        // counts too: the caller then inserts through the deleted row's slot.
        if table.slot(key).is_some() {
            return Err(Refused::Exists);
        }
        if table.occupied() + held >= table.capacity() {
            return Err(Refused::Full);
        }
        let guard = g.keys.entry((table_id, key)).or_default();
        guard.inserter = Some(txn);
        let mark = guard.mark.max(floor);
        *g.rows.entry(table_id).or_default() += 1;
        Ok(mark)
    }

    /// Registers `txn` as reading (`table_id`, `key`) absent from `table`.
    pub(super) fn read(
        &self,
        txn: TxnId,
        table_id: TableId,
        table: &Table,
        key: Key,
    ) -> Result<(), Refused> {
        let mut g = self.inner.lock();
        if table.slot(key).is_some() {
            return Err(Refused::Exists);
        }
        let guard = g.keys.entry((table_id, key)).or_default();
        if guard.inserter.is_some_and(|other| other != txn) {
            return Err(Refused::Taken);
        }
        if !guard.readers.contains(&txn) {
            guard.readers.push(txn);
        }
        Ok(())
    }

    /// `txn` ended: lets go of the keys it held to insert (inserted at its commit, or given
    /// up at its abort) and of those it read absent, which keep `mark` if it committed.
    pub(super) fn end(
        &self,
        txn: TxnId,
        inserting: &mut Vec<(TableId, Key)>,
        read: &mut Vec<(TableId, Key)>,
        mark: Option<u64>,
    ) {
        if inserting.is_empty() && read.is_empty() {
            return;
        }
        let mut g = self.inner.lock();
        for k in inserting.drain(..) {
            let Some(guard) = g.keys.get_mut(&k) else {
                continue;
            };
            if guard.inserter == Some(txn) {
                guard.inserter = None;
                if let Some(n) = g.rows.get_mut(&k.0) {
                    *n -= 1;
                }
                g.drop_if_useless(k);
            }
        }
        for k in read.drain(..) {
            let Some(guard) = g.keys.get_mut(&k) else {
                continue;
            };
            guard.readers.retain(|&r| r != txn);
            if let Some(m) = mark {
                guard.mark = guard.mark.max(m);
            }
            g.drop_if_useless(k);
        }
        if g.keys.len() > MAX_GUARDS {
            g.fold_older_half();
        }
    }

    pub(super) fn clear(&self) {
        let mut g = self.inner.lock();
        g.keys.clear();
        g.rows.clear();
    }

    #[cfg(test)]
    fn guards(&self) -> (usize, u64) {
        let g = self.inner.lock();
        (g.keys.len(), g.floor)
    }
}

impl Guards {
    /// Drops the guard of `k` if nobody uses it and its mark says nothing the floor does not.
    fn drop_if_useless(&mut self, k: (TableId, Key)) {
        if self
            .keys
            .get(&k)
            .is_some_and(|g| g.idle() && g.mark <= self.floor)
        {
            self.keys.remove(&k);
        }
    }

    /// Drops the idle guards whose marks are at most the median of the idle ones, raising the
    /// floor to it.
    fn fold_older_half(&mut self) {
        let mut marks: Vec<u64> = self
            .keys
            .values()
            .filter(|g| g.idle())
            .map(|g| g.mark)
            .collect();
        if marks.is_empty() {
            return;
        }
        let mid = marks.len() / 2;
        let cutoff = *marks.select_nth_unstable(mid).1;
        self.floor = self.floor.max(cutoff);
        let floor = self.floor;
        self.keys.retain(|_, g| !g.idle() || g.mark > floor);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qstore_core::txn::TableSchema;

    fn table(capacity: usize) -> Table {
        Table::new(TableSchema {
            name: "t".into(),
            row_size: 8,
            capacity_per_partition: capacity,
            keys_per_partition: 1 << 20,
            read_mostly: false,
        })
    }

    #[test]
    fn a_key_is_held_by_one_transaction_and_room_is_counted() {
        let table = table(2);
        let p = AbsentKeys::default();
        assert_eq!(p.hold(TxnId(1), 0, &table, 5), Ok(0));
        assert_eq!(p.hold(TxnId(1), 0, &table, 5), Ok(0), "its own key again");
        assert_eq!(p.hold(TxnId(2), 0, &table, 5), Err(Refused::Taken));
        assert_eq!(p.hold(TxnId(2), 0, &table, 6), Ok(0));
        assert_eq!(p.hold(TxnId(3), 0, &table, 7), Err(Refused::Full));
        p.end(TxnId(1), &mut vec![(0, 5)], &mut vec![], Some(9));
        assert_eq!(p.hold(TxnId(3), 0, &table, 7), Ok(0));
        assert_eq!(p.hold(TxnId(4), 0, &table, 5), Err(Refused::Full));
        // Created by a transaction that has let go of it: the key exists.
        p.end(TxnId(2), &mut vec![(0, 6)], &mut vec![], Some(9));
        table
            .insert(6, qstore_storage::RowVersion::INITIAL)
            .unwrap();
        assert_eq!(p.hold(TxnId(5), 0, &table, 6), Err(Refused::Exists));
        assert_eq!(p.read(TxnId(5), 0, &table, 6), Err(Refused::Exists));
    }

    #[test]
    fn readers_and_inserters_of_an_absent_key_exclude_each_other_and_reads_leave_marks() {
        let table = table(8);
        let p = AbsentKeys::default();
        assert_eq!(p.read(TxnId(1), 0, &table, 5), Ok(()));
        assert_eq!(p.read(TxnId(2), 0, &table, 5), Ok(()), "readers share");
        assert_eq!(p.hold(TxnId(3), 0, &table, 5), Err(Refused::Taken));
        p.end(TxnId(1), &mut vec![], &mut vec![(0, 5)], Some(40));
        // Aborted: leaves no mark.
        p.end(TxnId(2), &mut vec![], &mut vec![(0, 5)], None);
        assert_eq!(
            p.hold(TxnId(3), 0, &table, 5),
            Ok(40),
            "after the committed read"
        );
        assert_eq!(p.read(TxnId(4), 0, &table, 5), Err(Refused::Taken));
        // Its own insert's key: a transaction reads what it is inserting elsewhere.
        assert_eq!(p.read(TxnId(3), 0, &table, 5), Ok(()));
        p.end(TxnId(3), &mut vec![(0, 5)], &mut vec![(0, 5)], None);
        // A reader that is also the only other user may insert.
        assert_eq!(p.read(TxnId(6), 0, &table, 7), Ok(()));
        assert_eq!(p.hold(TxnId(6), 0, &table, 7), Ok(0));
        p.end(TxnId(6), &mut vec![(0, 7)], &mut vec![(0, 7)], Some(0));
        assert_eq!(p.guards(), (1, 0), "only key 5's mark is kept");
    }

    #[test]
    fn marks_past_the_bound_fold_into_the_floor() {
        let table = table(8);
        let p = AbsentKeys::default();
        for k in 0..=MAX_GUARDS as u64 {
            assert_eq!(p.read(TxnId(k + 1), 0, &table, k), Ok(()));
            p.end(TxnId(k + 1), &mut vec![], &mut vec![(0, k)], Some(k + 1));
        }
        let (kept, floor) = p.guards();
        assert!(kept <= MAX_GUARDS / 2 + 1, "{kept} guards kept");
        assert!(floor >= MAX_GUARDS as u64 / 2, "floor {floor}");
        // A forgotten read still orders the inserts: through the floor.
        assert_eq!(p.hold(TxnId(1 << 40), 0, &table, 0), Ok(floor));
        // A remembered one through its own mark.
        let last = MAX_GUARDS as u64;
        assert_eq!(p.hold(TxnId(1 << 41), 0, &table, last), Ok(last + 1));
    }
}
