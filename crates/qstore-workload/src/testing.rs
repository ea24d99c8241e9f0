//! A stand-in for storage in the workloads' unit tests: rows by table and key, loaded through
//! [`RowLoader`], with a serial executor for calls and the final-state check over all (or
//! some) of the rows.

use crate::{Tally, Workload};
use qstore_core::txn::{
    AccessKind, Catalog, LogicAbort, ProcCall, RowLoader, RowRef, TableSchema, Value,
    DUPLICATE_KEY, KEY_NOT_FOUND,
};
use qstore_core::{Key, PartitionId, QError, TableId};
use std::collections::BTreeMap;

/// Rows by table and key, in key order.
#[derive(Clone)]
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

    pub(crate) fn try_get(&self, t: TableId, key: Key) -> Option<&[u8]> {
        self.tables[t as usize].get(&key).map(Vec::as_slice)
    }

    pub(crate) fn get_mut(&mut self, t: TableId, key: Key) -> &mut [u8] {
        self.tables[t as usize]
            .get_mut(&key)
            .unwrap_or_else(|| panic!("table {t}: no key {key:#x}"))
    }

    pub(crate) fn remove(&mut self, t: TableId, key: Key) {
        self.tables[t as usize]
            .remove(&key)
            .unwrap_or_else(|| panic!("table {t}: no key {key:#x}"));
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

    /// Runs a call serially, undoing it on a logic abort; its outputs if it committed. Runs
    /// accesses as the engines do: derived keys resolved, inserts and deletes, and failures
    /// settled by the same rule (`AccessRef::settle`).
    pub(crate) fn execute(&mut self, cat: &Catalog, call: &ProcCall) -> Option<Vec<Value>> {
        self.run(cat, call).ok()
    }

    /// [`MemStore::execute`], with the logic abort's reason.
    pub(crate) fn run(&mut self, cat: &Catalog, call: &ProcCall) -> Result<Vec<Value>, LogicAbort> {
        let mut outputs = Vec::new();
        // Each record's contents before the call's first change (None: it did not exist).
        let mut undo: Vec<(TableId, Key, Option<Vec<u8>>)> = Vec::new();
        for access in cat.program(call).unwrap().accesses {
            let unresolved = access.as_ref();
            let result = match unresolved.resolve(&outputs) {
                Err(e) => unresolved.settle(Err(e)),
                Ok(a) => {
                    let table = &mut self.tables[a.table as usize];
                    let before = table.get(&a.key).cloned();
                    let result = match (a.kind, table.get_mut(&a.key)) {
                        (AccessKind::Insert, Some(_)) => Err(DUPLICATE_KEY),
                        (AccessKind::Insert, None) => {
                            let row =
                                table
                                    .entry(a.key)
                                    .or_insert(vec![0; self.sizes[a.table as usize]]);
                            cat.steps.run(a, RowRef::Write(row), &outputs)
                        }
                        (_, None) => Err(KEY_NOT_FOUND),
                        (AccessKind::Delete, Some(row)) => {
                            let out = cat.steps.run(a, RowRef::Read(row), &outputs);
                            if out.is_ok() {
                                table.remove(&a.key);
                            }
                            out
                        }
                        (kind, Some(row)) if kind.is_write() => {
                            cat.steps.run(a, RowRef::Write(row), &outputs)
                        }
                        (_, Some(row)) => cat.steps.run(a, RowRef::Read(row), &outputs),
                    };
                    undo.push((a.table, a.key, before));
                    a.settle(result)
                }
            };
            match result {
                Ok(v) => outputs.push(v),
                Err(e) => {
                    for (t, k, old) in undo.into_iter().rev() {
                        let table = &mut self.tables[t as usize];
                        match old {
                            Some(old) => table.insert(k, old),
                            None => table.remove(&k),
                        };
                    }
                    return Err(e);
                }
            }
        }
        Ok(outputs)
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
