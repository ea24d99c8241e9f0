//! Executing one access against storage: the part every protocol shares. Protocols decide
//! *when* an access may run (locks, queues, timestamps); this module does the run itself:
//! index lookup, the step function, insert/delete, undo images for rollback, and the
//! versions read and written (for histories).

use qstore_core::txn::{Access, AccessKind, LogicAbort, RowRef, StepRegistry, Value};
use qstore_core::{PartitionId, TableId, TxnId};
use qstore_storage::PartitionStore;

/// Before-images of one transaction's changes, so a logic-induced abort can be rolled back.
/// Row images live in one reused byte arena, so recording them allocates nothing in the
/// steady state.
#[derive(Default)]
pub struct UndoLog {
    entries: Vec<UndoEntry>,
    arena: Vec<u8>,
}

enum UndoEntry {
    /// Restore bytes `arena[at..at + len]` and the version of an updated row.
    Update {
        part: PartitionId,
        table: TableId,
        key: u64,
        at: usize,
        version: TxnId,
    },
    /// Remove a row the transaction inserted.
    Insert {
        part: PartitionId,
        table: TableId,
        key: u64,
    },
    /// Put back a row the transaction deleted.
    Delete {
        part: PartitionId,
        table: TableId,
        key: u64,
        at: usize,
        version: TxnId,
    },
}

impl UndoLog {
    pub fn clear(&mut self) {
        self.entries.clear();
        self.arena.clear();
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn save(&mut self, bytes: &[u8]) -> usize {
        let at = self.arena.len();
        self.arena.extend_from_slice(bytes);
        at
    }

    /// Undoes every recorded change, newest first, then forgets them.
    ///
    /// # Safety
    /// The caller must still hold exclusive access to every row the transaction changed.
    pub unsafe fn rollback<'a>(&mut self, store: impl Fn(PartitionId) -> &'a PartitionStore) {
        for e in self.entries.drain(..).rev() {
            match e {
                UndoEntry::Update {
                    part,
                    table,
                    key,
                    at,
                    version,
                } => {
                    let t = store(part).table(table);
                    let rid = t
                        .lookup(key)
                        .expect("an updated row stays while its writer runs");
                    let size = t.row_size();
                    // SAFETY: exclusive access per this function's contract.
                    unsafe { t.row_mut(rid) }.copy_from_slice(&self.arena[at..at + size]);
                    t.set_version(rid, version);
                }
                UndoEntry::Insert { part, table, key } => {
                    store(part).table(table).remove(key);
                }
                UndoEntry::Delete {
                    part,
                    table,
                    key,
                    at,
                    version,
                } => {
                    let t = store(part).table(table);
                    let size = t.row_size();
                    // Re-inserting into the slot the delete freed cannot fail for lack of room.
                    if let Ok(Some(rid)) = t.insert(key, version) {
                        // SAFETY: the row was just created by us and is not yet shared.
                        unsafe { t.row_mut(rid) }.copy_from_slice(&self.arena[at..at + size]);
                    }
                }
            }
        }
        self.arena.clear();
    }
}

/// Reusable per-worker state for executing transactions.
#[derive(Default)]
pub struct TxnScratch {
    /// Outputs of the accesses executed so far, indexed by access.
    pub outputs: Vec<Value>,
    pub undo: UndoLog,
}

impl TxnScratch {
    pub fn begin(&mut self) {
        self.outputs.clear();
        self.undo.clear();
    }
}

/// Runs access `a` of transaction `txn` against partition `store`, with the outputs of the
/// transaction's earlier accesses in `outputs`. When `undo` is given, before-images are
/// recorded there. Missing rows (and inserts of existing keys) are logic-induced aborts: they
/// are deterministic given the order of transactions.
///
/// # Safety
/// The caller's concurrency control must give this transaction exclusive access to the row of
/// `a.key` for writing accesses, and guarantee no concurrent writer for reads.
pub unsafe fn run_access(
    store: &PartitionStore,
    steps: &StepRegistry,
    txn: TxnId,
    a: &Access,
    outputs: &[Value],
    undo: Option<&mut UndoLog>,
) -> Result<Value, LogicAbort> {
    let table = store.table(a.table);
    let part = store.id;
    match a.kind {
        AccessKind::Read => {
            let rid = table.lookup(a.key).ok_or(LogicAbort("key not found"))?;
            // SAFETY: no concurrent writer, per the contract.
            steps.run(a, RowRef::Read(unsafe { table.row(rid) }), outputs)
        }
        AccessKind::Write | AccessKind::ReadModifyWrite => {
            let rid = table.lookup(a.key).ok_or(LogicAbort("key not found"))?;
            // SAFETY: exclusive access, per the contract.
            let row = unsafe { table.row_mut(rid) };
            if let Some(u) = undo {
                let at = u.save(row);
                let version = table.version(rid);
                u.entries.push(UndoEntry::Update {
                    part,
                    table: a.table,
                    key: a.key,
                    at,
                    version,
                });
            }
            let out = steps.run(a, RowRef::Write(row), outputs)?;
            table.set_version(rid, txn);
            Ok(out)
        }
        AccessKind::Insert => {
            let rid = match table.insert(a.key, txn) {
                Ok(Some(rid)) => rid,
                Ok(None) => return Err(LogicAbort("duplicate key")),
                Err(_) => return Err(LogicAbort("table full")),
            };
            if let Some(u) = undo {
                u.entries.push(UndoEntry::Insert {
                    part,
                    table: a.table,
                    key: a.key,
                });
            }
            // SAFETY: the row was just created by this transaction.
            steps.run(a, RowRef::Write(unsafe { table.row_mut(rid) }), outputs)
        }
        AccessKind::Delete => {
            let rid = table.lookup(a.key).ok_or(LogicAbort("key not found"))?;
            // SAFETY: exclusive access, per the contract.
            let row = unsafe { table.row(rid) };
            let out = steps.run(a, RowRef::Read(row), outputs)?;
            if let Some(u) = undo {
                let at = u.save(row);
                let version = table.version(rid);
                u.entries.push(UndoEntry::Delete {
                    part,
                    table: a.table,
                    key: a.key,
                    at,
                    version,
                });
            }
            table.remove(a.key);
            Ok(out)
        }
    }
}
