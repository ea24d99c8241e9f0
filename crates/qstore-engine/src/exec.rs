//! Executing one access against storage: the part every protocol shares. Protocols decide
//! *when* an access may run (locks, queues, timestamps); this module does the run itself:
//! index lookup, the step function, insert/delete, undo images for rollback, and the
//! versions read and written (for histories).

use crate::history::TxnTrace;
use qstore_core::partition::PartitionMap;
use qstore_core::txn::{
    Access, AccessKind, AccessRef, LogicAbort, Program, RowRef, StepRegistry, Value, DUPLICATE_KEY,
    KEY_NOT_FOUND, TABLE_FULL,
};
use qstore_core::{PartitionId, TableId, TxnId};
use qstore_storage::{PartitionStore, RowId, RowVersion, Table};

/// How many accesses ahead an executor starts fetching rows (and twice as many ahead, their
/// index entries); see [`Lookahead`].
pub const PREFETCH_DISTANCE: usize = 4;

/// Starts the cache misses of upcoming accesses before they run, in two steps so that neither
/// waits: index entries `2 * PREFETCH_DISTANCE` accesses ahead, then rows (found through those
/// entries, cached by then) `PREFETCH_DISTANCE` ahead. The distance counts accesses, across
/// fragment and transaction boundaries: prefetching whole fragments or transactions ahead
/// either stalls on index entries just requested, or runs so far ahead that the prefetches
/// wait for free miss buffers and the lines are gone again before the rows are used.
pub struct Lookahead<'a, T, F> {
    items: &'a [T],
    /// Where an item's row lives: its table and key.
    locate: F,
}

impl<'a, T, F: Fn(&T) -> (&'a Table, u64)> Lookahead<'a, T, F> {
    pub fn new(items: &'a [T], locate: F) -> Self {
        Lookahead { items, locate }
    }

    /// Before running the items from `from` on.
    pub fn start(&self, from: usize) {
        (from..from + 2 * PREFETCH_DISTANCE).for_each(|j| self.index(j));
        (from..from + PREFETCH_DISTANCE).for_each(|j| self.row(j));
    }

    /// Before running item `at`.
    #[inline]
    pub fn step(&self, at: usize) {
        self.index(at + 2 * PREFETCH_DISTANCE);
        self.row(at + PREFETCH_DISTANCE);
    }

    #[inline]
    fn index(&self, j: usize) {
        if let Some(item) = self.items.get(j) {
            let (table, key) = (self.locate)(item);
            table.prefetch_index(key);
        }
    }

    #[inline]
    fn row(&self, j: usize) {
        if let Some(item) = self.items.get(j) {
            let (table, key) = (self.locate)(item);
            table.prefetch(key);
        }
    }
}

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
        version: RowVersion,
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
        version: RowVersion,
    },
}

impl UndoLog {
    /// Makes room for `bytes` of before-images, so a fragment that knows what it will write
    /// grows the log once rather than doubling it write by write.
    pub fn reserve(&mut self, bytes: usize) {
        self.arena.reserve(bytes);
    }

    pub fn clear(&mut self) {
        self.entries.clear();
        self.arena.clear();
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The records the transaction changed, as (table, key), in the order of its changes (a
    /// record changed twice appears twice).
    pub fn changed(&self) -> impl Iterator<Item = (TableId, u64)> + '_ {
        self.entries.iter().map(|e| match *e {
            UndoEntry::Update { table, key, .. }
            | UndoEntry::Insert { table, key, .. }
            | UndoEntry::Delete { table, key, .. } => (table, key),
        })
    }

    fn save(&mut self, bytes: &[u8]) -> usize {
        let at = self.arena.len();
        self.arena.extend_from_slice(bytes);
        at
    }

    /// Undoes every recorded change, newest first, then forgets them.
    ///
    /// # Safety
    /// The caller must still hold exclusive access to every row (and, for inserts and
    /// deletes, every key) the transaction changed, and hold no reference to their bytes: the
    /// rollback writes them.
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
                    // SAFETY: `rid` is live (just looked up), and the caller holds the row
                    // exclusively with no reference to its bytes (this function's contract),
                    // so this `&mut` is the only reference to them.
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
                    t.unbury(key, version);
                    // Re-inserting into the slot the delete freed cannot fail for lack of room.
                    if let Ok(Some(rid)) = t.insert(key, version) {
                        // SAFETY: `insert` just created the row, and the caller holds the key
                        // exclusively (this function's contract), so no other thread looks it
                        // up: this `&mut` is the only reference to its bytes.
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
    pub trace: TxnTrace,
}

impl TxnScratch {
    pub fn begin(&mut self) {
        self.outputs.clear();
        self.undo.clear();
        self.trace.clear();
    }
}

/// Runs access `a` of transaction `txn` against partition `store`, with the outputs of the
/// transaction's earlier accesses in `outputs`. When `undo` is given, before-images are
/// recorded there; when `trace` is given, the versions read and the records written.
///
/// A failure (a missing record, an insert of an existing key, a step that refuses) is a
/// logic-induced abort only for an access declared abortable; any other access so failing
/// outputs `Null` ([`AccessRef::settle`], the rule every protocol follows). Either way the
/// failure is deterministic given the order of transactions. A failed access has no effect,
/// except a refusing step of a writing access, which may have changed the row before it
/// refused: the row keeps that (a new version) unless the transaction aborts and is rolled
/// back.
///
/// # Safety
/// The caller's concurrency control must give this transaction exclusive access to the row of
/// `a.key` for writing accesses, and guarantee no concurrent writer for reads. For an abortable
/// writing access, `undo` must be given (so that the caller can roll back its effect).
pub unsafe fn run_access(
    store: &PartitionStore,
    steps: &StepRegistry,
    txn: TxnId,
    a: AccessRef<'_>,
    outputs: &[Value],
    undo: Option<&mut UndoLog>,
    mut trace: Option<&mut TxnTrace>,
) -> Result<Value, LogicAbort> {
    debug_assert!(
        !a.may_abort || !a.kind.is_write() || undo.is_some(),
        "an abortable write must keep its before-image"
    );
    // Each failure is settled where it happens, so the common path (success) moves its
    // output once, straight into the result.
    let a = match a.resolve(outputs) {
        Ok(a) => a,
        Err(e) => return a.settle(Err(e)),
    };
    let table = store.table(a.table);
    if a.kind == AccessKind::Insert {
        // SAFETY: `run_insert` has the contract of this function, which the caller upholds.
        return a.settle(unsafe { run_insert(store, steps, txn, a, outputs, undo, trace) });
    }
    let Some((rid, version)) = table.lookup_versioned(a.key) else {
        if let Some(t) = trace {
            t.read(a.table, a.key, table.absent_version(a.key));
        }
        return a.settle(Err(KEY_NOT_FOUND));
    };
    if let Some(t) = trace.as_deref_mut() {
        if a.kind != AccessKind::Write {
            t.read(a.table, a.key, version);
        }
    }
    let before_image = |u: &mut UndoLog, row: &[u8], delete: bool| {
        let (part, table, key, at) = (store.id, a.table, a.key, u.save(row));
        u.entries.push(if delete {
            UndoEntry::Delete {
                part,
                table,
                key,
                at,
                version,
            }
        } else {
            UndoEntry::Update {
                part,
                table,
                key,
                at,
                version,
            }
        });
    };
    match a.kind {
        AccessKind::Read => {
            // SAFETY: `rid` is live (just looked up), and the contract guarantees that nobody
            // writes the row while the step reads it.
            let row = unsafe { table.row(rid) };
            a.settle(steps.run(a, RowRef::Read(row), outputs))
        }
        AccessKind::Delete => {
            // SAFETY: `rid` is live (just looked up), and the contract gives this transaction
            // the row exclusively (a delete writes), so nobody changes it while it is read.
            let row = unsafe { table.row(rid) };
            let out = match steps.run(a, RowRef::Read(row), outputs) {
                Ok(out) => out,
                Err(e) => return a.settle(Err(e)),
            };
            if let Some(u) = undo {
                before_image(u, row, true);
            }
            if let Some(t) = trace {
                table.remove_recorded(a.key, version, version.next_for(txn));
                t.write(a.table, a.key);
            } else {
                table.remove(a.key);
            }
            Ok(out)
        }
        _ => {
            // SAFETY: `rid` is live (just looked up), and the contract gives this transaction
            // the row exclusively (the access writes), so this `&mut` is the only reference
            // to its bytes while the step runs.
            let row = unsafe { table.row_mut(rid) };
            if let Some(u) = undo {
                before_image(u, row, false);
            }
            if let Some(t) = trace {
                t.write(a.table, a.key);
            }
            let out = steps.run(a, RowRef::Write(row), outputs);
            // Also when the step refused: it may have changed the row first. An abort rolls
            // the version back with the row.
            table.set_version(rid, version.next_for(txn));
            a.settle(out)
        }
    }
}

/// The Insert arm of [`run_access`]; an existing key (or a full table) is a failure.
///
/// # Safety
/// As for [`run_access`]: the caller's concurrency control gives this transaction the key
/// `a.key` exclusively, so no other thread inserts, reads or removes it meanwhile.
unsafe fn run_insert(
    store: &PartitionStore,
    steps: &StepRegistry,
    txn: TxnId,
    a: AccessRef<'_>,
    outputs: &[Value],
    undo: Option<&mut UndoLog>,
    trace: Option<&mut TxnTrace>,
) -> Result<Value, LogicAbort> {
    let table = store.table(a.table);
    let version = RowVersion::live(txn, 0);
    let rid = match table.insert(a.key, version) {
        Ok(Some(rid)) => rid,
        Ok(None) => return Err(DUPLICATE_KEY),
        Err(_) => return Err(TABLE_FULL),
    };
    if let Some(u) = undo {
        let (part, table, key) = (store.id, a.table, a.key);
        u.entries.push(UndoEntry::Insert { part, table, key });
    }
    if let Some(t) = trace {
        t.write(a.table, a.key);
    }
    // SAFETY: the row was created just now by this transaction, which holds its key
    // exclusively (the contract): no other reference to its bytes exists.
    steps.run(a, RowRef::Write(unsafe { table.row_mut(rid) }), outputs)
}

/// The rows a transaction of a buffered protocol wrote, as private copies to be installed at
/// commit (see [`run_on_copy`], [`RowCopy`] and [`RowInstall`]).
#[derive(Default)]
pub struct WriteBuffer {
    writes: Vec<BufferedWrite>,
}

/// One row written: where it goes, its new bytes, and whether it is still there.
pub struct BufferedWrite {
    pub table: TableId,
    pub key: u64,
    /// The row's slot, or `None` for a row the transaction inserts.
    pub rid: Option<RowId>,
    pub bytes: Vec<u8>,
    /// False once the transaction deleted the row: the install leaves a tombstone.
    pub present: bool,
}

impl WriteBuffer {
    /// The transaction's copy of record (`table`, `key`), if it wrote it.
    pub fn get_mut(&mut self, table: TableId, key: u64) -> Option<&mut BufferedWrite> {
        self.writes
            .iter_mut()
            .find(|w| w.table == table && w.key == key)
    }

    /// Buffers a write of record (`table`, `key`), whose slot is `rid` (`None`: inserted).
    pub fn push(&mut self, w: BufferedWrite) {
        debug_assert!(
            self.get_mut(w.table, w.key).is_none(),
            "one copy per record"
        );
        self.writes.push(w);
    }

    pub fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }

    /// The writes, in the order they were first made.
    pub fn iter(&self) -> impl Iterator<Item = &BufferedWrite> + '_ {
        self.writes.iter()
    }

    /// The writes, in the order they were first made, taken out.
    pub fn drain(&mut self) -> impl Iterator<Item = BufferedWrite> + '_ {
        self.writes.drain(..)
    }
}

/// Runs access `a` on `row`, a private copy of its record (the transaction's own buffered
/// write, or a copy of the committed row) which holds the record if `present` (a tombstone or
/// a buffered delete does not). Inserts and deletes change `present` as they would the table.
/// Returns the access's outcome, settled as in [`run_access`], and whether it wrote the copy
/// (then the transaction installs it at commit): exactly when [`run_access`] would have made
/// a new version.
pub fn run_on_copy(
    steps: &StepRegistry,
    a: AccessRef<'_>,
    row: &mut [u8],
    present: &mut bool,
    outputs: &[Value],
) -> (Result<Value, LogicAbort>, bool) {
    let out = match (a.kind, *present) {
        (AccessKind::Insert, true) => return (a.settle(Err(DUPLICATE_KEY)), false),
        (AccessKind::Insert, false) => {
            // As in place: the row is created even if the step then refuses.
            row.fill(0);
            *present = true;
            steps.run(a, RowRef::Write(row), outputs)
        }
        (_, false) => return (a.settle(Err(KEY_NOT_FOUND)), false),
        (AccessKind::Delete, true) => {
            let out = steps.run(a, RowRef::Read(row), outputs);
            if out.is_err() {
                return (a.settle(out), false);
            }
            *present = false;
            out
        }
        (AccessKind::Read, true) => {
            return (a.settle(steps.run(a, RowRef::Read(row), outputs)), false)
        }
        (_, true) => steps.run(a, RowRef::Write(row), outputs),
    };
    (a.settle(out), true)
}

/// A buffered read of row `rid` of `table`: the concurrency control, holding the row's latch,
/// takes either the row's current contents ([`RowCopy::current`]) or an older version it kept
/// ([`RowCopy::older`], multi-version protocols).
pub struct RowCopy<'a> {
    table: &'a Table,
    rid: RowId,
    taken: Option<(Vec<u8>, RowVersion)>,
}

impl<'a> RowCopy<'a> {
    /// `rid` must be a row's slot, and stay so: buffered protocols never free slots (a
    /// delete leaves a tombstone, whose copy's version says so).
    pub fn new(table: &'a Table, rid: RowId) -> Self {
        RowCopy {
            table,
            rid,
            taken: None,
        }
    }

    /// Copies the row's current contents; returns their version.
    ///
    /// # Safety
    /// Nothing may write the row's bytes meanwhile: the caller holds the latch that every
    /// [`RowInstall::install`] of the row holds too.
    pub unsafe fn current(&mut self) -> RowVersion {
        // SAFETY: live (`new`'s contract) and not written meanwhile (this function's).
        let bytes = unsafe { self.table.row(self.rid) }.to_vec();
        let version = self.table.version(self.rid);
        self.taken = Some((bytes, version));
        version
    }

    /// Takes an older version of the row, which the concurrency control kept.
    pub fn older(&mut self, bytes: &[u8], version: RowVersion) {
        debug_assert_eq!(bytes.len(), self.table.row_size());
        self.taken = Some((bytes.to_vec(), version));
    }

    /// What was taken, if anything.
    pub fn take(self) -> Option<(Vec<u8>, RowVersion)> {
        self.taken
    }
}

/// A buffered write of row `rid` of `table` being installed at commit: the concurrency
/// control, holding the row's latch, may look at the version it replaces, then installs it.
pub struct RowInstall<'a> {
    table: &'a Table,
    rid: RowId,
    write: &'a BufferedWrite,
    txn: TxnId,
}

impl<'a> RowInstall<'a> {
    /// `rid` must be a slot (buffered protocols never free slots); `write` is `txn`'s copy.
    pub fn new(table: &'a Table, rid: RowId, write: &'a BufferedWrite, txn: TxnId) -> Self {
        debug_assert_eq!(write.bytes.len(), table.row_size());
        RowInstall {
            table,
            rid,
            write,
            txn,
        }
    }

    /// The row's contents and version before the install.
    ///
    /// # Safety
    /// As for [`RowCopy::current`]: the caller holds the row's latch.
    pub unsafe fn replaced(&self) -> (&[u8], RowVersion) {
        // SAFETY: a slot, not written meanwhile (`new`'s and this function's contracts).
        let bytes = unsafe { self.table.row(self.rid) };
        (bytes, self.table.version(self.rid))
    }

    /// Puts the copy in place, a new version written by the transaction; a copy the
    /// transaction deleted becomes a tombstone (the bytes stay, unreachable by lookups).
    ///
    /// # Safety
    /// Nothing else may read or write the row's bytes meanwhile: the caller holds the latch
    /// that every [`RowCopy::current`] of the row holds too, no reference from
    /// [`RowInstall::replaced`] is alive, and no protocol that reads rows in place runs on
    /// the same table.
    pub unsafe fn install(&mut self) {
        let before = self.table.version(self.rid);
        if !self.write.present {
            return self
                .table
                .install_version(self.rid, before.deleted_by(self.txn));
        }
        // SAFETY: a slot, referenced by nothing else meanwhile (`new`'s and this function's
        // contracts).
        unsafe { self.table.row_mut(self.rid) }.copy_from_slice(&self.write.bytes);
        self.table
            .install_version(self.rid, before.next_for(self.txn));
    }
}

/// How [`run_program_alone`] runs a program.
#[derive(Clone, Copy, Default)]
pub struct AloneOptions<'a> {
    /// Record the versions read and the records written (for histories).
    pub trace: bool,
    /// (step, position of the program's first access): `step` is called before each access
    /// (a [`Lookahead`] over this and the following programs). Without, a lookahead over the
    /// program's own accesses.
    pub ahead: Option<(&'a dyn Fn(usize), usize)>,
}

/// Runs a whole program on a thread that has every partition it touches to itself (the serial
/// protocol and the serial oracle): every access in order, rolled back on a logic-induced
/// abort. Returns the outputs, which are left in `s.outputs` too.
///
/// # Safety
/// No other thread may touch any row of the partitions `store` returns while this runs.
pub unsafe fn run_program_alone<'a>(
    store: impl Fn(PartitionId) -> &'a PartitionStore,
    pmap: &PartitionMap,
    steps: &StepRegistry,
    txn: TxnId,
    program: &Program,
    s: &mut TxnScratch,
    opts: AloneOptions<'_>,
) -> Result<(), LogicAbort> {
    let AloneOptions { trace, ahead } = opts;
    let keep_undo = program.may_abort();
    s.begin();
    // Without a lookahead over the following programs, one over this program alone.
    let locate = |a: &Access| {
        (
            store(pmap.partition_of(a.table, a.key)).table(a.table),
            a.key,
        )
    };
    let own = Lookahead::new(&program.accesses, locate);
    if ahead.is_none() {
        own.start(0);
    }
    for (i, a) in program.accesses.iter().enumerate() {
        match ahead {
            Some((step, first)) => step(first + i),
            None => own.step(i),
        }
        let part = store(pmap.partition_of(a.table, a.key));
        let undo = keep_undo.then_some(&mut s.undo);
        let t = trace.then_some(&mut s.trace);
        // SAFETY: no other thread touches these partitions while this runs (this function's
        // contract), so this transaction has every row exclusively, as `run_access` needs;
        // `undo` is kept whenever the program has an abortable access.
        match unsafe { run_access(part, steps, txn, a.as_ref(), &s.outputs, undo, t) } {
            Ok(v) => s.outputs.push(v),
            Err(abort) => {
                // SAFETY: still no other thread on these partitions, and `run_access` keeps
                // no reference to a row past its return: the rows and keys this transaction
                // changed are this thread's alone.
                unsafe { s.undo.rollback(&store) };
                return Err(abort);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use qstore_core::config::Partitioning;
    use qstore_core::txn::{Catalog, Inputs, TableSchema};

    /// Adds the argument to the row's counter; aborts when the argument is negative and the
    /// counter would drop below zero.
    fn add(row: RowRef<'_>, arg: &Value, _: Inputs<'_>) -> Result<Value, LogicAbort> {
        let RowRef::Write(b) = row else {
            return Err(LogicAbort("needs a writable row"));
        };
        let v = i64::from_le_bytes(b[..8].try_into().unwrap()) + arg.as_int().unwrap();
        if v < 0 {
            return Err(LogicAbort("below zero"));
        }
        b[..8].copy_from_slice(&v.to_le_bytes());
        Ok(Value::Int(v))
    }

    fn read(row: RowRef<'_>, _: &Value, _: Inputs<'_>) -> Result<Value, LogicAbort> {
        Ok(Value::Int(i64::from_le_bytes(
            row.bytes()[..8].try_into().unwrap(),
        )))
    }

    /// A one-table catalog over two partitions of 10 keys each; keys p*10 + 0..8 are loaded
    /// with counter 5, keys p*10 + 8 and 9 are free.
    pub(crate) fn fixture() -> (Catalog, PartitionMap, Vec<PartitionStore>) {
        let mut cat = Catalog::default();
        cat.add_table(TableSchema {
            name: "t".into(),
            row_size: 8,
            capacity_per_partition: 16,
            keys_per_partition: 10,
            read_mostly: false,
        });
        cat.steps.register("add", add);
        cat.steps.register("read", read);
        let pmap = PartitionMap::new(2, Partitioning::Range, &cat.tables);
        let stores: Vec<_> = (0..2)
            .map(|p| {
                let s = PartitionStore::new(PartitionId(p), &cat.tables);
                let keys = (0..8).map(|i| p as u64 * 10 + i);
                s.table(0)
                    .load(keys, |_, r| r.copy_from_slice(&5i64.to_le_bytes()))
                    .unwrap();
                s
            })
            .collect();
        (cat, pmap, stores)
    }

    pub(crate) fn access(cat: &Catalog, kind: AccessKind, key: u64, arg: i64) -> Access {
        let step = match kind {
            AccessKind::Read | AccessKind::Delete => "read",
            _ => "add",
        };
        Access {
            table: 0,
            key,
            kind,
            step: cat.steps.id(step).unwrap(),
            arg: Value::Int(arg),
            deps: vec![],
            may_abort: arg < 0,
            key_dep: None,
        }
    }

    fn run(
        cat: &Catalog,
        pmap: &PartitionMap,
        stores: &[PartitionStore],
        txn: u64,
        accesses: Vec<Access>,
        s: &mut TxnScratch,
    ) -> Result<(), LogicAbort> {
        let program = Program { accesses };
        let store = |p: PartitionId| &stores[p.index()];
        // SAFETY: the stores were made by this test and are used by its thread alone.
        unsafe {
            run_program_alone(
                store,
                pmap,
                &cat.steps,
                TxnId(txn),
                &program,
                s,
                AloneOptions {
                    trace: true,
                    ahead: None,
                },
            )
        }
    }

    #[test]
    fn logic_abort_rolls_back_updates_inserts_and_deletes_across_partitions() {
        let (cat, pmap, stores) = fixture();
        let before: Vec<u64> = stores.iter().map(|s| s.content_hash()).collect();
        let mut s = TxnScratch::default();
        let accesses = vec![
            access(&cat, AccessKind::ReadModifyWrite, 1, 3),
            access(&cat, AccessKind::Insert, 19, 1),
            access(&cat, AccessKind::ReadModifyWrite, 1, 2),
            access(&cat, AccessKind::Delete, 12, 0),
            access(&cat, AccessKind::ReadModifyWrite, 3, -9),
        ];
        let err = run(&cat, &pmap, &stores, 7, accesses, &mut s).unwrap_err();
        assert_eq!(err, LogicAbort("below zero"));
        let after: Vec<u64> = stores.iter().map(|s| s.content_hash()).collect();
        assert_eq!(before, after);
        let t = stores[1].table(0);
        assert!(t.lookup(19).is_none() && t.lookup(12).is_some());
        let rid = stores[0].table(0).lookup(1).unwrap();
        assert_eq!(stores[0].table(0).version(rid), RowVersion::INITIAL);
    }

    #[test]
    fn lookahead_touches_each_item_twice_and_stays_in_bounds() {
        let (_, _, stores) = fixture();
        let keys: Vec<u64> = (0..10).collect();
        let located = std::cell::Cell::new(0);
        let locate = |&k: &u64| {
            located.set(located.get() + 1);
            (stores[0].table(0), k)
        };
        let ahead = Lookahead::new(&keys, locate);
        ahead.start(0);
        (0..keys.len() + 3).for_each(|at| ahead.step(at));
        // Once for its index entry and once for its row, whatever the distance; positions
        // past the end are ignored.
        assert_eq!(located.get(), 2 * keys.len());
    }

    #[test]
    fn versions_count_writes_and_missing_keys_abort() {
        let (cat, pmap, stores) = fixture();
        let mut s = TxnScratch::default();
        let twice = vec![
            access(&cat, AccessKind::ReadModifyWrite, 4, 1),
            access(&cat, AccessKind::ReadModifyWrite, 4, 1),
        ];
        run(&cat, &pmap, &stores, 9, twice, &mut s).unwrap();
        assert_eq!(s.outputs, vec![Value::Int(6), Value::Int(7)]);
        let t = stores[0].table(0);
        assert_eq!(
            t.version(t.lookup(4).unwrap()),
            RowVersion::live(TxnId(9), 1)
        );
        // An access that cannot abort does nothing to a missing record, or to an existing
        // one it would insert, and outputs Null; one that may abort aborts.
        let may_abort = |mut a: Access| {
            a.may_abort = true;
            a
        };
        let missing = access(&cat, AccessKind::ReadModifyWrite, 9, 1);
        let dup = access(&cat, AccessKind::Insert, 2, 1);
        let both = vec![missing.clone(), dup.clone()];
        run(&cat, &pmap, &stores, 10, both, &mut s).unwrap();
        assert_eq!(s.outputs, vec![Value::Null, Value::Null]);
        assert!(stores[0].table(0).lookup(9).is_none());
        assert_eq!(
            run(&cat, &pmap, &stores, 11, vec![may_abort(missing)], &mut s),
            Err(LogicAbort("key not found"))
        );
        assert_eq!(
            run(&cat, &pmap, &stores, 12, vec![may_abort(dup)], &mut s),
            Err(LogicAbort("duplicate key"))
        );
        let t = stores[0].table(0);
        assert_eq!(
            counter_of(t, 2),
            5,
            "neither insert changed the existing row"
        );
    }

    /// A non-abortable access to a missing key in the middle of a program that cannot abort
    /// leaves the program's other writes in place: the program commits.
    #[test]
    fn a_missing_key_does_not_cut_a_program_that_cannot_abort_short() {
        let (cat, pmap, stores) = fixture();
        let mut s = TxnScratch::default();
        let accesses = vec![
            access(&cat, AccessKind::ReadModifyWrite, 1, 1),
            access(&cat, AccessKind::ReadModifyWrite, 18, 1),
            access(&cat, AccessKind::ReadModifyWrite, 11, 1),
        ];
        run(&cat, &pmap, &stores, 5, accesses, &mut s).unwrap();
        assert_eq!(s.outputs, vec![Value::Int(6), Value::Null, Value::Int(6)]);
        assert_eq!(counter_of(stores[0].table(0), 1), 6);
        assert_eq!(counter_of(stores[1].table(0), 11), 6);
    }

    /// A derived insert goes to the key its dependency's output gives, outputs Null, and does
    /// nothing when the output is out of its range.
    #[test]
    fn derived_keys_follow_the_output_they_depend_on() {
        let (cat, pmap, stores) = fixture();
        let mut s = TxnScratch::default();
        let derived = |limit| {
            let mut a = access(&cat, AccessKind::Insert, 10, 1);
            a.deps = vec![0];
            a.key_dep = Some(qstore_core::txn::KeyDep {
                dep: 0,
                scale: 1,
                limit,
                back: 0,
                output: false,
            });
            a
        };
        // Key 1 holds 5: the read-modify-write outputs 8, so the insert goes to 10 + 8.
        let accesses = vec![access(&cat, AccessKind::ReadModifyWrite, 1, 3), derived(9)];
        run(&cat, &pmap, &stores, 5, accesses, &mut s).unwrap();
        assert_eq!(s.outputs, vec![Value::Int(8), Value::Null]);
        assert_eq!(counter_of(stores[1].table(0), 18), 1);
        // 9 is out of a range of 8 keys: no insert anywhere.
        let before: Vec<u64> = stores.iter().map(|s| s.content_hash()).collect();
        let accesses = vec![access(&cat, AccessKind::ReadModifyWrite, 1, 1), derived(9)];
        run(&cat, &pmap, &stores, 6, accesses, &mut s).unwrap();
        assert_eq!(s.outputs, vec![Value::Int(9), Value::Null]);
        assert!(stores[1].table(0).lookup(19).is_none());
        let changed: Vec<u64> = stores.iter().map(|s| s.content_hash()).collect();
        assert_eq!(before[1], changed[1]);
    }

    fn counter_of(t: &Table, key: u64) -> i64 {
        let rid = t.lookup(key).expect("the key exists");
        // SAFETY: the test's partitions are private to its thread, and nothing runs on them
        // while it reads.
        let row = unsafe { t.row(rid) };
        i64::from_le_bytes(row[..8].try_into().unwrap())
    }
}
