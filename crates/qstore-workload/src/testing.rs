//! A stand-in for storage in the workloads' unit tests: rows by table and key, loaded through
//! [`RowLoader`], with a serial executor for calls and the final-state check over all (or
//! some) of the rows.

use crate::{Tally, Workload};
use qstore_core::txn::{Catalog, ProcCall, RowLoader, RowRef, TableSchema, Value};
use qstore_core::{Key, PartitionId, QError, TableId};
use std::collections::BTreeMap;

/// Rows by table and key, in key order.
pub(crate) struct MemStore {
    sizes: Vec<usize>,
    tables: Vec<BTreeMap<Key, Vec<u8>>>,
}

impl MemStore {
    /// An empty store for `tables`.
    pub(crate) fn new(tables: &[TableSchema]) -> Self {
        MemStore {
            sizes: tables.iter().map(|s| s.row_size).collect(),
            tables: vec![BTreeMap::new(); tables.len()],
        }
    }

    /// `w`'s rows of `partitions` loaded.
    pub(crate) fn loaded(w: &dyn Workload, partitions: impl IntoIterator<Item = u32>) -> Self {
        let mut m = Self::new(&w.catalog().tables);
        for p in partitions {
            w.load(PartitionId(p), &mut m).unwrap();
        }
        m
    }

    pub(crate) fn len(&self, t: TableId) -> usize {
        self.tables[t as usize].len()
    }

    pub(crate) fn rows(&self, t: TableId) -> impl Iterator<Item = (Key, &[u8])> {
        self.tables[t as usize]
            .iter()
            .map(|(k, r)| (*k, r.as_slice()))
    }

    pub(crate) fn get(&self, t: TableId, key: Key) -> &[u8] {
        &self.tables[t as usize][&key]
    }

    pub(crate) fn get_mut(&mut self, t: TableId, key: Key) -> &mut [u8] {
        self.tables[t as usize]
            .get_mut(&key)
            .unwrap_or_else(|| panic!("table {t}: no key {key:#x}"))
    }

    /// Rows with keys in `lo..=hi`, in key order.
    pub(crate) fn range(&self, t: TableId, lo: Key, hi: Key) -> Vec<&[u8]> {
        self.tables[t as usize]
            .range(lo..=hi)
            .map(|(_, r)| r.as_slice())
            .collect()
    }

    /// `w`'s final-state check over every row.
    pub(crate) fn check_final(&self, w: &dyn Workload) -> Result<Option<String>, String> {
        w.check_final(&mut |t, f| self.rows(t).for_each(|(k, r)| f(k, r)))
    }

    /// `w`'s tally of the rows `keep` selects (e.g. one partition's).
    pub(crate) fn tally_where(
        &self,
        w: &dyn Workload,
        keep: impl Fn(TableId, Key) -> bool,
    ) -> Option<Tally> {
        w.tally(&mut |t, f| {
            self.rows(t)
                .filter(|(k, _)| keep(t, *k))
                .for_each(|(k, r)| f(k, r))
        })
    }

    /// Runs a call serially, undoing it on a logic abort; its outputs if it committed.
    pub(crate) fn execute(&mut self, cat: &Catalog, call: &ProcCall) -> Option<Vec<Value>> {
        let mut outputs = Vec::new();
        let mut undo = Vec::new();
        for a in cat.program(call).unwrap().accesses {
            let row = self.get_mut(a.table, a.key);
            undo.push((a.table, a.key, row.to_vec()));
            let view = if a.kind.is_write() {
                RowRef::Write(row)
            } else {
                RowRef::Read(row)
            };
            match cat.steps.run(a.as_ref(), view, &outputs) {
                Ok(v) => outputs.push(v),
                Err(_) => {
                    for (t, k, old) in undo.into_iter().rev() {
                        self.get_mut(t, k).copy_from_slice(&old);
                    }
                    return None;
                }
            }
        }
        Some(outputs)
    }
}

impl RowLoader for MemStore {
    /// Also checks that rows are functions of their keys: the first row of each call is
    /// filled twice, over different bytes, and must come out the same (a fill that leaves
    /// bytes unwritten does not).
    fn load_rows(
        &mut self,
        table: TableId,
        keys: &mut dyn Iterator<Item = Key>,
        fill: &mut dyn FnMut(Key, &mut [u8]),
    ) -> Result<(), QError> {
        let size = self.sizes[table as usize];
        for (n, key) in keys.enumerate() {
            let mut row = vec![0xAA; size];
            fill(key, &mut row);
            if n == 0 {
                let mut again = vec![0x55; size];
                fill(key, &mut again);
                assert_eq!(row, again, "table {table}: unwritten bytes");
            }
            let old = self.tables[table as usize].insert(key, row);
            assert!(old.is_none(), "table {table}: key {key:#x} twice");
        }
        Ok(())
    }
}
