//! The participant side: running groups of accesses under the node's concurrency control,
//! parking and resuming those that wait, and the participant's half of (two-phase) commit.

use super::absent::Refused;
use super::msg::{Attempt, Body, Fill, GroupEnd, Renewal, Vote};
use super::{wal, Cc, Execution, Gate, Node, RowAccess};
use crate::exec::{
    run_access, run_on_copy, BufferedWrite, RowCopy, RowInstall, UndoLog, WriteBuffer,
};
use crate::history::TxnTrace;
use crate::worker_time::{during, enter, Activity};
use qstore_core::txn::{
    Access, AccessKind, AccessRef, CcAbortCause, LogicAbort, Program, Value, KEY_NOT_FOUND,
    NO_DERIVED_KEY, TABLE_FULL,
};
use qstore_core::{Key, NodeId, TableId, TxnId};
use qstore_storage::RowVersion;
use rustc_hash::{FxHashMap, FxHashSet};
use std::sync::Arc;

/// Accesses a participant is asked to run, in program order, with their program indices.
pub(super) enum Group {
    /// Sent by another node's coordinator, with the reads whose rows it caches (and the
    /// `wts` of the copy it holds, see `cached`).
    Remote(Vec<(u16, Access)>, Vec<(u16, Option<u64>)>),
    /// From this node's own coordinator: no copy of the accesses.
    Local {
        program: Arc<Program>,
        indices: Vec<u16>,
    },
}

impl Group {
    fn len(&self) -> usize {
        match self {
            Group::Remote(a, _) => a.len(),
            Group::Local { indices, .. } => indices.len(),
        }
    }

    fn get(&self, i: usize) -> (u16, &Access) {
        match self {
            Group::Remote(a, _) => (a[i].0, &a[i].1),
            Group::Local { program, indices } => {
                let idx = indices[i];
                (idx, &program.accesses[idx as usize])
            }
        }
    }

    /// Whether the coordinator caches the row access `idx` reads: `Some` with the `wts` of
    /// the copy it holds, if any.
    fn fill_wanted(&self, idx: u16) -> Option<Option<u64>> {
        match self {
            Group::Remote(_, fill) => fill.iter().find(|(i, _)| *i == idx).map(|(_, w)| *w),
            Group::Local { .. } => None,
        }
    }

    /// One past the largest program index of the group.
    fn span(&self) -> usize {
        (0..self.len())
            .map(|i| self.get(i).0 as usize + 1)
            .max()
            .unwrap_or(0)
    }
}

/// A group that ran up to `at` and waits there.
struct ParkedGroup {
    group: Group,
    at: usize,
    /// Outputs by program index: the inputs, then this group's outputs so far.
    outs: Vec<Value>,
    /// The rows the coordinator asked for, of the reads that ran.
    fills: Vec<Fill>,
}

impl ParkedGroup {
    /// The outputs of the accesses that ran, in group order (the answer to the coordinator).
    fn into_results(mut self) -> Vec<Value> {
        (0..self.at)
            .map(|i| std::mem::take(&mut self.outs[self.group.get(i).0 as usize]))
            .collect()
    }
}

enum Waiting {
    Reservation,
    Group(ParkedGroup),
}

/// What a participant keeps for a transaction between its coordinator's messages.
pub(super) struct PartTxn<H> {
    coord: NodeId,
    at: Attempt,
    held: H,
    undo: UndoLog,
    /// Buffered execution: the rows written, installed at commit, the keys it inserts and
    /// those it read absent (guarded in the node's `AbsentKeys` meanwhile).
    writes: WriteBuffer,
    inserting: Vec<(TableId, Key)>,
    read_absent: Vec<(TableId, Key)>,
    trace: TxnTrace,
    /// The row (and version) the last read copied, kept when the coordinator caches it.
    kept: Option<(Vec<u8>, RowVersion)>,
    wrote: bool,
    /// Voted yes with its prepare record logged: its outcome is logged too.
    prepared: bool,
    waiting: Option<Waiting>,
}

impl<H: Default> PartTxn<H> {
    fn new(coord: NodeId, at: Attempt) -> Self {
        PartTxn {
            coord,
            at,
            held: H::default(),
            undo: UndoLog::default(),
            writes: WriteBuffer::default(),
            inserting: Vec::new(),
            read_absent: Vec::new(),
            trace: TxnTrace::default(),
            kept: None,
            wrote: false,
            prepared: false,
            waiting: None,
        }
    }
}

/// One shard of a node's participant state. A transaction's entry is taken out while a
/// worker runs it, so only one worker handles it at a time; a wake-up that finds no entry
/// (its waiter is still on the way to park) is remembered in `woken_early`.
pub(super) struct PartShard<H> {
    txns: FxHashMap<TxnId, PartTxn<H>>,
    woken_early: FxHashSet<TxnId>,
}

impl<H> Default for PartShard<H> {
    fn default() -> Self {
        PartShard {
            txns: FxHashMap::default(),
            woken_early: FxHashSet::default(),
        }
    }
}

impl<C: Cc> Node<C> {
    fn take_part(&self, txn: TxnId) -> Option<PartTxn<C::Held>> {
        self.parts.shard(txn).lock().txns.remove(&txn)
    }

    fn put_part(&self, txn: TxnId, t: PartTxn<C::Held>) {
        self.parts.shard(txn).lock().txns.insert(txn, t);
    }

    /// Parks `t`, waiting as `w`; if it was already woken, gives it back to go on at once.
    fn park(
        &self,
        txn: TxnId,
        mut t: PartTxn<C::Held>,
        w: Waiting,
    ) -> Option<(PartTxn<C::Held>, Waiting)> {
        let mut shard = self.parts.shard(txn).lock();
        if shard.woken_early.remove(&txn) {
            return Some((t, w));
        }
        t.waiting = Some(w);
        shard.txns.insert(txn, t);
        None
    }

    /// How many transactions coordinated at other nodes wait here (for a lock or the
    /// partition), for throttling.
    pub(super) fn remote_waiting(&self) -> usize {
        self.parts
            .all()
            .map(|s| {
                let s = s.lock();
                let id = self.id;
                s.txns
                    .values()
                    .filter(|t| t.waiting.is_some() && t.coord != id)
                    .count()
            })
            .sum()
    }

    /// A lock or reservation `txn` waited for was granted: carry on where it stopped.
    pub(super) fn resume(&self, txn: TxnId) {
        let parked = {
            let mut shard = self.parts.shard(txn).lock();
            match shard.txns.get(&txn).map(|t| t.waiting.is_some()) {
                Some(true) => shard.txns.remove(&txn),
                _ => {
                    shard.woken_early.insert(txn);
                    None
                }
            }
        };
        let Some(mut t) = parked else { return };
        match t.waiting.take().expect("checked above") {
            Waiting::Reservation => self.reserve(txn, t),
            Waiting::Group(g) => self.run_group(txn, t, g),
        }
    }

    pub(super) fn wake_all(&self, woken: Vec<TxnId>) {
        for w in woken {
            // Workers hold the receiver until they stop; after that nothing waits anyway.
            let _ = self.wake_tx.send(w);
        }
    }

    pub(super) fn on_reserve(&self, from: NodeId, txn: TxnId, at: Attempt) {
        let t = self
            .take_part(txn)
            .unwrap_or_else(|| PartTxn::new(from, at));
        self.reserve(txn, t);
    }

    fn reserve(&self, txn: TxnId, mut t: PartTxn<C::Held>) {
        loop {
            match during(Activity::Lock, || self.cc.reserve(txn, &t.at, &mut t.held)) {
                Gate::Go => break,
                Gate::Wait => match self.park(txn, t, Waiting::Reservation) {
                    Some((again, _)) => t = again,
                    None => return,
                },
                Gate::Abort(cause) => {
                    let coord = t.coord;
                    self.put_part(txn, t);
                    let end = GroupEnd::CcAbort(cause);
                    let ran = Ran {
                        end,
                        wrote: false,
                        floor: 0,
                        fills: Vec::new(),
                    };
                    return self.send(coord, txn, ran.with(Vec::new()));
                }
            }
        }
        let coord = t.coord;
        self.put_part(txn, t);
        self.send(coord, txn, Body::Reserved);
    }

    pub(super) fn on_exec(
        &self,
        from: NodeId,
        txn: TxnId,
        at: Attempt,
        group: Group,
        inputs: Vec<(u16, Value)>,
    ) {
        let t = self
            .take_part(txn)
            .unwrap_or_else(|| PartTxn::new(from, at));
        let mut outs = vec![Value::Null; group.span()];
        for (i, v) in inputs {
            if let Some(slot) = outs.get_mut(i as usize) {
                *slot = v;
            }
        }
        let g = ParkedGroup {
            group,
            at: 0,
            outs,
            fills: Vec::new(),
        };
        self.run_group(txn, t, g);
    }

    /// Runs the group's accesses from `g.at` on, until it ends or must wait.
    fn run_group(&self, txn: TxnId, mut t: PartTxn<C::Held>, mut g: ParkedGroup) {
        // The accesses are the transaction's work; their locks are taken within.
        let useful = enter(Activity::Useful);
        let mut end = GroupEnd::Done;
        while g.at < g.group.len() {
            let (idx, a) = g.group.get(g.at);
            let step = match self.resolve(a, &g.outs) {
                Err(failed) => Step::Ran(failed),
                Ok(a) => match C::EXECUTION {
                    Execution::InPlace => self.step_in_place(txn, &mut t, a, &g.outs),
                    Execution::Buffered => {
                        let want = g.group.fill_wanted(idx);
                        let step = self.step_buffered(txn, &mut t, a, &g.outs, want.is_some());
                        if let Some(held) = want {
                            self.fill(&mut t, idx, held, &mut g.fills);
                        }
                        step
                    }
                },
            };
            match step {
                Step::Ran(Ok(v)) => g.outs[idx as usize] = v,
                Step::Ran(Err(abort)) => {
                    end = GroupEnd::LogicAbort(abort.0.to_string());
                    break;
                }
                Step::Wait => match self.park(txn, t, Waiting::Group(g)) {
                    Some((again, Waiting::Group(again_g))) => {
                        (t, g) = (again, again_g);
                        continue;
                    }
                    _ => return,
                },
                Step::Refused(cause) => {
                    end = GroupEnd::CcAbort(cause);
                    break;
                }
            }
            g.at += 1;
        }
        drop(useful);
        let ran = Ran {
            end,
            wrote: t.wrote,
            floor: self.cc.commit_floor(&t.held),
            fills: std::mem::take(&mut g.fills),
        };
        let coord = t.coord;
        self.put_part(txn, t);
        self.send(coord, txn, ran.with(g.into_results()));
    }

    /// The access with its key resolved ([`AccessRef::resolve`]), or its settled failure
    /// when the key cannot be derived or is not on this node (a derived range is on its
    /// base's node; a coordinator that says otherwise is refused here).
    fn resolve<'a>(
        &self,
        a: &'a Access,
        outs: &[Value],
    ) -> Result<AccessRef<'a>, Result<Value, LogicAbort>> {
        let unresolved = a.as_ref();
        let a = unresolved
            .resolve(outs)
            .map_err(|e| unresolved.settle(Err(e)))?;
        if a.derived && self.node_of(a.table, a.key) != self.id {
            return Err(unresolved.settle(Err(NO_DERIVED_KEY)));
        }
        Ok(a)
    }

    /// One access on the rows themselves, once the concurrency control grants it.
    fn step_in_place(
        &self,
        txn: TxnId,
        t: &mut PartTxn<C::Held>,
        a: AccessRef<'_>,
        outs: &[Value],
    ) -> Step {
        let write = a.kind.is_write();
        let gate = during(Activity::Lock, || {
            self.cc
                .access(txn, &t.at, a.table, a.key, write, &mut t.held)
        });
        if let Some(stop) = stopped_by(gate) {
            return stop;
        }
        t.wrote |= write;
        let undo = write.then_some(&mut t.undo);
        let trace = self.ctx.history.is_some().then_some(&mut t.trace);
        let (store, steps) = (self.store(), &self.ctx.catalog.steps);
        // SAFETY: the concurrency control granted this access (exclusively if it writes: no
        // other reference to the row's bytes; shared otherwise: no writer), and the
        // transaction keeps that grant until it commits or aborts. Every write keeps its
        // before-image in `undo`.
        Step::Ran(unsafe { run_access(store, steps, txn, a, outs, undo, trace) })
    }

    /// The row access `idx` just read, with its lease, for the coordinator's cache (without
    /// its bytes if the coordinator's copy, written at `held`, is current).
    fn fill(&self, t: &mut PartTxn<C::Held>, idx: u16, held: Option<u64>, fills: &mut Vec<Fill>) {
        let (Some((bytes, version)), Some(lease)) =
            (t.kept.take(), self.cc.last_read_lease(&t.held))
        else {
            return;
        };
        fills.push(Fill {
            idx,
            wts: lease.wts,
            rts: lease.rts,
            writer: version.writer.0,
            seq: version.seq,
            bytes: (held != Some(lease.wts)).then_some(bytes),
            tab: lease.tab,
        });
    }

    /// One access on a private copy: the transaction's own buffered write of the record, or
    /// a copy of the row (or of its tombstone) the concurrency control lets it read; `keep`:
    /// a read keeps what it copied (for the coordinator's cache).
    fn step_buffered(
        &self,
        txn: TxnId,
        t: &mut PartTxn<C::Held>,
        a: AccessRef<'_>,
        outs: &[Value],
        keep: bool,
    ) -> Step {
        let steps = &self.ctx.catalog.steps;
        if let Some(w) = t.writes.get_mut(a.table, a.key) {
            // Written once already: the one install at commit covers this write too.
            return Step::Ran(run_on_copy(steps, a, &mut w.bytes, &mut w.present, outs).0);
        }
        let table = self.store().table(a.table);
        let rid = loop {
            match (table.slot(a.key), a.kind) {
                (Some(rid), _) => break rid,
                (None, AccessKind::Insert) => match self.buffer_insert(txn, t, a, outs) {
                    Some(step) => return step,
                    // Inserted by another transaction since: go through its row.
                    None => continue,
                },
                (None, _) => match self.read_absent(txn, t, a) {
                    Some(step) => return step,
                    None => continue,
                },
            }
        };
        let write = a.kind.is_write();
        let mut copy = RowCopy::new(table, rid);
        let access = RowAccess {
            txn,
            at: t.at,
            table: a.table,
            rid,
            write,
        };
        let gate = during(Activity::Lock, || {
            self.cc.read_copy(&access, &mut t.held, &mut copy)
        });
        if let Some(stop) = stopped_by(gate) {
            return stop;
        }
        let (mut bytes, version) = copy.take().expect("a read that may go was copied");
        if keep && a.kind == AccessKind::Read && !version.dead {
            t.kept = Some((bytes.clone(), version));
        }
        let tracing = self.ctx.history.is_some();
        // A tombstone read is a read of the key's absence, at the deleter's version.
        if tracing && (a.kind != AccessKind::Write || version.dead) && a.kind != AccessKind::Insert
        {
            t.trace.read(a.table, a.key, version);
        }
        let mut present = !version.dead;
        let (out, wrote) = run_on_copy(steps, a, &mut bytes, &mut present, outs);
        if wrote {
            t.wrote = true;
            if tracing {
                t.trace.write(a.table, a.key);
            }
            t.writes.push(BufferedWrite {
                table: a.table,
                key: a.key,
                rid: Some(rid),
                bytes,
                present,
            });
        }
        Step::Ran(out)
    }

    /// A buffered read of a key found absent: guarded until the transaction ends (see
    /// `AbsentKeys`), it fails as a missing key does. `None` if the key was inserted
    /// meanwhile.
    fn read_absent(&self, txn: TxnId, t: &mut PartTxn<C::Held>, a: AccessRef<'_>) -> Option<Step> {
        let table = self.store().table(a.table);
        if self.cc.guards_absent_reads() {
            match self.absent.read(txn, a.table, table, a.key) {
                Ok(()) => t.read_absent.push((a.table, a.key)),
                Err(Refused::Exists) => return None,
                Err(_) => return Some(Step::Refused(CcAbortCause::Conflict)),
            }
        }
        if self.ctx.history.is_some() {
            t.trace.read(a.table, a.key, table.absent_version(a.key));
        }
        Some(Step::Ran(a.settle(Err(KEY_NOT_FOUND))))
    }

    /// A buffered insert of a key found absent: the key is held until the transaction ends
    /// (see `AbsentKeys`), and the step fills a zeroed private row, inserted at commit.
    /// `None` if the key was inserted meanwhile.
    fn buffer_insert(
        &self,
        txn: TxnId,
        t: &mut PartTxn<C::Held>,
        a: AccessRef<'_>,
        outs: &[Value],
    ) -> Option<Step> {
        let table = self.store().table(a.table);
        match self.absent.hold(txn, a.table, table, a.key) {
            Ok(mark) => {
                t.inserting.push((a.table, a.key));
                if let Err(cause) = self.cc.insert_after(txn, &t.at, &mut t.held, mark) {
                    return Some(Step::Refused(cause));
                }
            }
            Err(Refused::Taken) => return Some(Step::Refused(CcAbortCause::Conflict)),
            Err(Refused::Full) => return Some(Step::Ran(a.settle(Err(TABLE_FULL)))),
            Err(Refused::Exists) => return None,
        }
        let mut bytes = vec![0; table.row_size()];
        let mut present = false;
        let (out, _) = run_on_copy(&self.ctx.catalog.steps, a, &mut bytes, &mut present, outs);
        t.wrote = true;
        if self.ctx.history.is_some() {
            t.trace.write(a.table, a.key);
        }
        t.writes.push(BufferedWrite {
            table: a.table,
            key: a.key,
            rid: None,
            bytes,
            present,
        });
        Some(Step::Ran(out))
    }

    /// Phase one: a participant that wrote nothing is done and says so; with a log, a yes
    /// vote waits for its prepare record. Table leases extended for the coordinator's
    /// cache go back to it once the log bounds them.
    pub(super) fn on_prepare(&self, coord: NodeId, txn: TxnId, ts: u64, renew: Vec<Renewal>) {
        let tab_leases = match self.renew_cached(txn, ts, &renew) {
            Ok(leases) => leases,
            // What it holds here (if anything) stays until the abort that follows.
            Err(cause) => return self.send(coord, txn, Body::Vote(Vote::No(cause))),
        };
        let Some(mut t) = self.take_part(txn) else {
            if !renew.is_empty() && !self.keep_below_bound(ts) {
                return; // the log failed: this node acknowledges nothing more
            }
            self.send_tab_leases(coord, txn, tab_leases);
            return self.send(coord, txn, Body::Vote(Vote::ReadOnly));
        };
        if !C::USES_TIMESTAMPS {
            // The commit timestamp as the coordinator computed it so far (the attempt's own
            // for the protocols that order attempts by timestamp).
            t.at.ts = ts;
        }
        let vote = self
            .cc
            .prepare(txn, &t.at, &mut t.held, t.wrote, self.store());
        if !matches!(vote, Vote::No(_)) {
            if !self.keep_below_bound(t.at.ts) {
                // The log failed: this node acknowledges nothing more.
                return self.put_part(txn, t);
            }
            self.send_tab_leases(coord, txn, tab_leases);
        }
        if vote == Vote::ReadOnly {
            self.finish(txn, t);
        } else {
            if matches!(vote, Vote::Yes | Vote::YesWithin(_)) && self.wal.is_some() {
                // SAFETY: a transaction that votes yes holds its grants until the decision.
                let redo = unsafe { self.redo(&t) };
                if !redo.is_empty() {
                    t.prepared = true;
                    let at = t.at;
                    // Back in place before the vote can go (and the decision come back).
                    self.put_part(txn, t);
                    return self.log_prepare(coord, txn, at, redo, vote);
                }
            }
            // A no vote keeps the state too: the abort that follows releases it.
            self.put_part(txn, t);
        }
        self.send(coord, txn, Body::Vote(vote));
    }

    /// The redo of the transaction's changes here (see `wal::redo_of`).
    ///
    /// # Safety
    /// `txn` still holds its grants here.
    unsafe fn redo(&self, t: &PartTxn<C::Held>) -> Vec<wal::RowImage> {
        // SAFETY: passed on from the caller.
        unsafe { wal::redo_of(C::EXECUTION, self.store(), &t.undo, &t.writes) }
    }

    /// Phase two (or the one phase of a transaction with a single participant) reached this
    /// participant: its changes become permanent, after its commit record is on disk when
    /// nothing else logged them.
    pub(super) fn on_commit(&self, txn: TxnId, ts: u64) {
        let Some(mut t) = self.take_part(txn) else {
            return;
        };
        t.at.ts = ts;
        self.cc.commit(txn, &t.at, &mut t.held);
        if t.prepared {
            let outcome = self.log_outcome(txn, Some(ts));
            let coord = t.coord;
            // Installed before it is acknowledged: the client may go on at once.
            self.finish(txn, t);
            return self.ack_commit(coord, txn, outcome);
        } else if self.wal.is_some() {
            // SAFETY: the transaction holds its grants until `finish`.
            let redo = unsafe { self.redo(&t) };
            if !redo.is_empty() {
                let at = t.at;
                // Back in place before its record can be on disk (and the commit go on).
                self.put_part(txn, t);
                return self.log_commit(txn, at, redo);
            }
        }
        self.finish_and_ack(txn, t);
    }

    /// A one-phase commit whose record is on disk.
    pub(super) fn complete_commit(&self, txn: TxnId) {
        if let Some(t) = self.take_part(txn) {
            self.finish_and_ack(txn, t);
        }
    }

    fn finish_and_ack(&self, txn: TxnId, t: PartTxn<C::Held>) {
        let coord = t.coord;
        self.finish(txn, t);
        self.send(coord, txn, Body::CommitAck);
    }

    /// Keeps what `txn` did here (installing its buffered writes) and releases what it holds.
    fn finish(&self, txn: TxnId, mut t: PartTxn<C::Held>) {
        let mut woken = Vec::new();
        let store = self.store();
        for w in t.writes.drain() {
            let table = store.table(w.table);
            let mut access = RowAccess {
                txn,
                at: t.at,
                table: w.table,
                rid: w.rid.unwrap_or_default(),
                write: true,
            };
            let Some(rid) = w.rid else {
                if !w.present {
                    continue; // inserted, then deleted: nothing to install
                }
                let version = RowVersion::INITIAL.next_for(txn);
                let created = table.insert_with(w.key, version, |rid, row| {
                    row.copy_from_slice(&w.bytes);
                    access.rid = rid;
                    self.cc.created(&access);
                });
                debug_assert!(matches!(created, Ok(Some(_))), "a held key has room");
                continue;
            };
            let mut row = RowInstall::new(table, rid, &w, txn);
            self.cc.install(&access, &mut t.held, &mut row, &mut woken);
        }
        let mark = self.cc.absent_mark(&t.at);
        self.absent
            .end(txn, &mut t.inserting, &mut t.read_absent, Some(mark));
        if let Some(h) = &self.ctx.history {
            h.add_part(txn, &t.trace);
        }
        during(Activity::Lock, || {
            self.cc.release(txn, &mut t.held, &mut woken)
        });
        self.wake_all(woken);
    }

    pub(super) fn on_abort(&self, txn: TxnId) {
        let Some(mut t) = self.take_part(txn) else {
            return;
        };
        if t.prepared {
            self.log_outcome(txn, None);
        }
        let store = self.store();
        // SAFETY: the transaction's grants here, exclusive on every record it changed, are
        // released only below, after the rollback; none of its accesses is running (its
        // state was just taken out of the table), so nothing references those rows' bytes.
        unsafe { t.undo.rollback(|_| store) };
        self.absent
            .end(txn, &mut t.inserting, &mut t.read_absent, None);
        let mut woken = Vec::new();
        during(Activity::Lock, || {
            self.cc.release(txn, &mut t.held, &mut woken)
        });
        self.wake_all(woken);
    }

    pub(super) fn parts_idle(&self) -> bool {
        self.parts.all().all(|s| s.lock().txns.is_empty())
    }

    /// Participant state left when the node stops (transactions never finished).
    pub(super) fn drop_parts(&self) {
        for s in self.parts.all() {
            let mut s = s.lock();
            s.txns.clear();
            s.woken_early.clear();
        }
        self.absent.clear();
    }
}

/// How one access went.
enum Step {
    /// It ran: its output, or the failed check that aborts the transaction.
    Ran(Result<Value, LogicAbort>),
    /// It must wait: the group parks until the concurrency control wakes it.
    Wait,
    /// The concurrency control refused it.
    Refused(CcAbortCause),
}

/// What a gate that does not let the access go means for it.
fn stopped_by(gate: Gate) -> Option<Step> {
    match gate {
        Gate::Go => None,
        Gate::Wait => Some(Step::Wait),
        Gate::Abort(cause) => Some(Step::Refused(cause)),
    }
}

/// How a group of accesses went at a participant, besides its outputs.
pub(super) struct Ran {
    pub end: GroupEnd,
    /// It wrote here.
    pub wrote: bool,
    /// See [`Cc::commit_floor`].
    pub floor: u64,
    /// The rows the coordinator asked for (see `cached`).
    pub fills: Vec<Fill>,
}

impl Ran {
    fn with(self, outputs: Vec<Value>) -> Body {
        Body::Executed {
            outputs,
            end: self.end,
            wrote: self.wrote,
            floor: self.floor,
            fills: self.fills,
        }
    }
}
