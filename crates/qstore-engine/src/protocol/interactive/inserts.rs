//! Inserts under buffered execution. A buffered protocol's metadata lives beside rows, so a
//! key that does not exist yet has none; until the inserting transaction ends, its key is
//! held here instead. A second insert of a held key is refused (`conflict`), as a lock on
//! the key under NO_WAIT would be, so at most one transaction at a time may create a key and
//! the install at commit finds it still free. Room in the table is held with the key, so
//! that the install cannot find the table full after the decision to commit.

use parking_lot::Mutex;
use qstore_core::{Key, TableId, TxnId};
use qstore_storage::Table;
use rustc_hash::FxHashMap;

/// The keys being inserted at one partition, by transaction.
#[derive(Default)]
pub(super) struct PendingInserts {
    inner: Mutex<Pending>,
}

#[derive(Default)]
struct Pending {
    keys: FxHashMap<(TableId, Key), TxnId>,
    /// Per table, how many keys are held (the rows they will take).
    rows: FxHashMap<TableId, usize>,
}

/// Why a key could not be held.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum NotHeld {
    /// Another transaction is inserting it.
    Taken,
    /// The table has no room for it besides the rows already held.
    Full,
    /// It exists (another transaction's insert committed since the caller looked).
    Exists,
}

impl PendingInserts {
    /// Holds (`table_id`, `key`) for `txn`, which found it absent in `table`.
    pub(super) fn hold(
        &self,
        txn: TxnId,
        table_id: TableId,
        table: &Table,
        key: Key,
    ) -> Result<(), NotHeld> {
        let mut p = self.inner.lock();
        let held = p.rows.get(&table_id).copied().unwrap_or(0);
        match p.keys.get(&(table_id, key)) {
            Some(&t) if t == txn => return Ok(()),
            Some(_) => return Err(NotHeld::Taken),
            // Looked up again under the lock: a committed insert creates its row before it
            // lets go of the key, so a key no longer held is found here if it was created.
            // A tombstone counts too: the caller then inserts through the deleted row's slot.
            None if table.slot(key).is_some() => return Err(NotHeld::Exists),
            None if table.occupied() + held >= table.capacity() => return Err(NotHeld::Full),
            None => {}
        }
        p.keys.insert((table_id, key), txn);
        *p.rows.entry(table_id).or_default() += 1;
        Ok(())
    }

    /// Lets go of the keys `txn` held (inserted at its commit, or given up at its abort).
    pub(super) fn release(&self, txn: TxnId, keys: &mut Vec<(TableId, Key)>) {
        if keys.is_empty() {
            return;
        }
        let mut p = self.inner.lock();
        for k in keys.drain(..) {
            if p.keys.get(&k) == Some(&txn) {
                p.keys.remove(&k);
                if let Some(n) = p.rows.get_mut(&k.0) {
                    *n -= 1;
                }
            }
        }
    }

    pub(super) fn clear(&self) {
        let mut p = self.inner.lock();
        p.keys.clear();
        p.rows.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qstore_core::txn::TableSchema;

    #[test]
    fn a_key_is_held_by_one_transaction_and_room_is_counted() {
        let table = Table::new(TableSchema {
            name: "t".into(),
            row_size: 8,
            capacity_per_partition: 2,
            keys_per_partition: 100,
        });
        let p = PendingInserts::default();
        assert_eq!(p.hold(TxnId(1), 0, &table, 5), Ok(()));
        assert_eq!(p.hold(TxnId(1), 0, &table, 5), Ok(()), "its own key again");
        assert_eq!(p.hold(TxnId(2), 0, &table, 5), Err(NotHeld::Taken));
        assert_eq!(p.hold(TxnId(2), 0, &table, 6), Ok(()));
        assert_eq!(p.hold(TxnId(3), 0, &table, 7), Err(NotHeld::Full));
        p.release(TxnId(1), &mut vec![(0, 5)]);
        assert_eq!(p.hold(TxnId(3), 0, &table, 7), Ok(()));
        assert_eq!(p.hold(TxnId(4), 0, &table, 5), Err(NotHeld::Full));
        // Created by a transaction that has let go of it: the key exists.
        p.release(TxnId(2), &mut vec![(0, 6)]);
        table
            .insert(6, qstore_storage::RowVersion::INITIAL)
            .unwrap();
        assert_eq!(p.hold(TxnId(5), 0, &table, 6), Err(NotHeld::Exists));
    }
}
