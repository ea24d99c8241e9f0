//! Executors: run Calvin's execution phases for transactions whose locks are granted.
//!
//! Every participant copies the rows of its records the program accesses (phase 2) and sends
//! them to every other executing participant (phase 3); a participant that does not execute
//! is then done. An executing participant collects the copies from the others (phase 4),
//! parking the transaction meanwhile and serving other work, then runs the whole program
//! (phase 5): its own accesses against its rows, the others' against the copies. All of them
//! so compute the same outputs and the same logic-abort decision; each keeps (or rolls back)
//! its own writes and acknowledges the transaction's home.
//!
//! Messages to a node are gathered per destination and sent when the executor runs out of
//! queued work (or has gathered many), so busy executors send one message per batch of
//! transactions, not one per transaction.

use super::msg::{Ack, CMsg, Reads, Verdict};
use super::node::{CalvinNode, POLL};
use super::txn::Txn;
use crate::exec::{run_access, TxnScratch};
use crate::runtime::Pace;
use crate::worker_time::{during, enter, piece, Activity};
use crossbeam_channel::{Receiver, RecvTimeoutError};
use qstore_core::txn::{
    Access, AccessKind, LogicAbort, RowRef, StepRegistry, Value, DUPLICATE_KEY, KEY_NOT_FOUND,
};
use std::sync::atomic::Ordering;

/// Messages an executor gathers for one node before it sends them anyway.
const OUTBOX_LIMIT: usize = 32;

/// Work for an executor.
pub(super) enum Work {
    /// Its locks here are granted.
    Start(Box<Txn>),
    /// Its remote reads are all in.
    Resume(Box<Txn>),
}

#[derive(Default)]
struct Outbox {
    reads: Vec<Reads>,
    acks: Vec<Ack>,
}

impl Outbox {
    fn len(&self) -> usize {
        self.reads.len() + self.acks.len()
    }
}

pub(super) struct Executor<'a> {
    node: &'a CalvinNode,
    scratch: TxnScratch,
    outbox: Vec<Outbox>,
    pending: usize,
    /// The node's run the outbox was gathered in (see `CalvinNode::run`).
    run: u64,
}

impl<'a> Executor<'a> {
    pub fn new(node: &'a CalvinNode) -> Self {
        Executor {
            node,
            scratch: TxnScratch::default(),
            outbox: (0..node.ctx.nodes()).map(|_| Outbox::default()).collect(),
            pending: 0,
            run: node.run.load(Ordering::Acquire),
        }
    }

    pub fn run(mut self, ready: Receiver<Work>) {
        // A piece is a transaction's phase, with a switch or two: every one is timed.
        let _accounted = self.node.worker_time.attach(1);
        while !self.node.stop.load(Ordering::Acquire) {
            // Gathered messages go out before this executor waits for work. (Deciding after a
            // transaction, from whether `ready` looked empty, could keep them forever: the
            // other executors share `ready` and may take what was queued.)
            let work = match ready.try_recv() {
                Ok(w) => w,
                Err(_) => {
                    self.flush_gated();
                    // Every transaction here waits for its locks or for remote reads.
                    match during(Activity::Idle, || ready.recv_timeout(POLL)) {
                        Ok(w) => w,
                        Err(RecvTimeoutError::Timeout) => continue,
                        Err(RecvTimeoutError::Disconnected) => break,
                    }
                }
            };
            piece(Activity::Other);
            let began = Pace::begin(&self.node.pace);
            {
                let _gate = self.node.run_gate.read();
                match work {
                    Work::Start(txn) | Work::Resume(txn) if !self.same_run(txn.run) => {}
                    Work::Start(txn) => self.start(txn),
                    Work::Resume(mut txn) => self.execute(&mut txn),
                }
                if self.pending >= OUTBOX_LIMIT {
                    self.flush();
                }
            }
            Pace::end(&self.node.pace, began);
        }
        self.flush_gated();
    }

    /// Whether a transaction scheduled in run `run` belongs to the node's run now (a copy
    /// installed since replaced everything of earlier runs): messages gathered in an earlier
    /// run are dropped here. Called with the run gate held.
    fn same_run(&mut self, run: u64) -> bool {
        let now = self.node.run.load(Ordering::Acquire);
        if self.run != now {
            self.outbox.iter_mut().for_each(|o| *o = Outbox::default());
            self.pending = 0;
            self.run = now;
        }
        run == now
    }

    /// Sends what was gathered, unless a copy was installed since.
    fn flush_gated(&mut self) {
        let node = self.node;
        let _gate = node.run_gate.read();
        self.same_run(node.run.load(Ordering::Acquire));
        self.flush();
    }

    /// Phases 2 and 3, then phase 5 at once if no remote read is needed.
    fn start(&mut self, mut txn: Box<Txn>) {
        let node = self.node;
        let me = node.part;
        let executes = txn.executes(me);
        let store = node.store();
        for r in txn.records.iter().filter(|r| r.node == me) {
            store.table(r.table).prefetch(r.key);
        }
        let readers = txn.roles.executing.iter().filter(|&&n| n != me).count();
        if readers > 0 {
            let reads = during(Activity::Useful, || self.local_reads(&txn, !executes));
            if !executes {
                // What this node read must be recorded before anyone can act on it.
                if let Some(h) = node.history() {
                    h.add_part(txn.id, &self.scratch.trace);
                }
            }
            let mut reads = Some(reads);
            let mut left = readers;
            for &n in txn.roles.executing.iter().filter(|&&n| n != me) {
                left -= 1;
                let r = if left > 0 {
                    reads.clone()
                } else {
                    reads.take()
                };
                self.outbox[n as usize].reads.extend(r);
                self.pending += 1;
                if self.outbox[n as usize].len() >= OUTBOX_LIMIT {
                    self.flush_to(n);
                }
            }
        }
        if !executes {
            let _ = node.done.send(txn.slot);
            return;
        }
        txn.expect_reads(me);
        if let Some(mut txn) = node.park(txn) {
            self.execute(&mut txn);
        }
    }

    /// Phase 2: copies of this node's records, in analysis order. A participant that does
    /// not execute records the versions it read (its accesses here are all reads).
    fn local_reads(&mut self, txn: &Txn, trace: bool) -> Reads {
        let me = self.node.part;
        let store = self.node.store();
        let p = txn
            .roles
            .participants
            .binary_search(&me)
            .expect("a node only starts transactions it takes part in");
        let (count, bytes) = txn.blocks[p];
        let mut present = Vec::with_capacity(count as usize);
        let mut rows = Vec::with_capacity(bytes);
        for r in txn.records.iter().filter(|r| r.node == me) {
            let t = store.table(r.table);
            match t.lookup(r.key) {
                Some(rid) => {
                    // SAFETY: `rid` is live (just looked up), and this transaction holds a
                    // lock on the record here, granted by the scheduler and kept until this
                    // node is done with the transaction: nobody writes the row meanwhile.
                    rows.extend_from_slice(unsafe { t.row(rid) });
                    present.push(true);
                }
                None => {
                    rows.resize(rows.len() + t.row_size(), 0);
                    present.push(false);
                }
            }
        }
        self.scratch.begin();
        if trace && self.node.history().is_some() {
            for (a, &r) in txn.program.accesses.iter().zip(&txn.access_rec) {
                let r = &txn.records[r as usize];
                if r.node != me || a.kind != AccessKind::Read {
                    continue;
                }
                let t = store.table(a.table);
                let version = match t.lookup_versioned(a.key) {
                    Some((_, version)) => version,
                    None => t.absent_version(a.key),
                };
                self.scratch.trace.read(a.table, a.key, version);
            }
        }
        Reads {
            pos: txn.pos,
            present,
            rows,
        }
    }

    /// Phase 5: runs the whole program, then reports to the home and releases the locks.
    fn execute(&mut self, t: &mut Txn) {
        let node = self.node;
        let ctx = &*node.ctx;
        let me = node.part;
        let store = node.store();
        let steps = &ctx.catalog.steps;
        let keep_undo = t.program.may_abort();
        let history = node.history();
        // Running the program is the transaction's work; reporting it is not.
        let useful = enter(Activity::Useful);
        let s = &mut self.scratch;
        s.begin();
        let mut abort: Option<LogicAbort> = None;
        for (a, &r) in t.program.accesses.iter().zip(&t.access_rec) {
            let rec = &t.records[r as usize];
            let result = if a.key_dep.is_some() && rec.node != me {
                // A derived access runs where its range is; elsewhere it is a leaf whose
                // output is Null (see `KeyDep`).
                Ok(Value::Null)
            } else if rec.node == me {
                let undo = keep_undo.then_some(&mut s.undo);
                let trace = history.is_some().then_some(&mut s.trace);
                // SAFETY: the transaction holds this node's locks on its records until it
                // reports done: exclusive ones on those it writes (no other reference to
                // their bytes), shared ones on those it only reads (no writer); `undo` is kept
                // whenever the program has an abortable access.
                unsafe { run_access(store, steps, t.id, a.as_ref(), &s.outputs, undo, trace) }
            } else {
                let p = t
                    .roles
                    .participants
                    .binary_search(&rec.node)
                    .expect("a participant");
                let copy = t.remote[p].as_mut().expect("every read is in");
                let size = node.row_sizes[a.table as usize];
                let present = &mut copy.present[rec.nth as usize];
                let row = &mut copy.rows[rec.off..rec.off + size];
                run_on_copy(steps, a, row, present, &s.outputs)
            };
            match result {
                Ok(v) => s.outputs.push(v),
                Err(e) => {
                    // SAFETY: the exclusive locks on the records it changed here are held until
                    // `done` is sent below, and `run_access` keeps no reference to a row past
                    // its return: those rows and keys are this executor's alone.
                    unsafe { s.undo.rollback(|_| store) };
                    abort = Some(e);
                    break;
                }
            }
        }
        if let Some(h) = history {
            h.add_part(t.id, &s.trace);
        }
        let verdict = match abort {
            Some(e) => Verdict::LogicAbort(e.0.to_string()),
            // The lowest executing participant reports the outputs.
            None if t.roles.executing[0] == me => {
                Verdict::Commit(Some(std::mem::take(&mut s.outputs)))
            }
            None => Verdict::Commit(None),
        };
        drop(useful);
        let _ = node.done.send(t.slot);
        let ack = Ack {
            epoch: t.pos.epoch,
            idx: t.pos.idx,
            verdict,
        };
        let home = t.pos.node;
        if home == me {
            node.on_ack(ack);
        } else {
            self.outbox[home as usize].acks.push(ack);
            self.pending += 1;
            if self.outbox[home as usize].len() >= OUTBOX_LIMIT {
                self.flush_to(home);
            }
        }
    }

    fn flush(&mut self) {
        if self.pending == 0 {
            return;
        }
        for n in 0..self.outbox.len() as u32 {
            self.flush_to(n);
        }
    }

    fn flush_to(&mut self, n: u32) {
        let out = &mut self.outbox[n as usize];
        if out.len() == 0 {
            return;
        }
        self.pending -= out.len();
        let msg = CMsg::Exec {
            reads: std::mem::take(&mut out.reads),
            acks: std::mem::take(&mut out.acks),
        };
        self.node.send_to(n, msg);
    }
}

/// An access against a copy of a remote record, as [`run_access`] would run it against the
/// record itself: the same step, the same failures for a missing or (for an insert) existing
/// record, settled by the same rule (only an abortable access aborts). Inserts and deletes
/// change the copy, so later accesses of the program see them.
fn run_on_copy(
    steps: &StepRegistry,
    a: &Access,
    row: &mut [u8],
    present: &mut bool,
    outputs: &[Value],
) -> Result<Value, LogicAbort> {
    a.as_ref()
        .settle(apply_on_copy(steps, a, row, present, outputs))
}

/// [`run_on_copy`] before its failure is settled.
fn apply_on_copy(
    steps: &StepRegistry,
    a: &Access,
    row: &mut [u8],
    present: &mut bool,
    outputs: &[Value],
) -> Result<Value, LogicAbort> {
    match a.kind {
        AccessKind::Insert => {
            if *present {
                return Err(DUPLICATE_KEY);
            }
            row.fill(0);
            *present = true;
            steps.run(a.as_ref(), RowRef::Write(row), outputs)
        }
        _ if !*present => Err(KEY_NOT_FOUND),
        AccessKind::Read => steps.run(a.as_ref(), RowRef::Read(row), outputs),
        AccessKind::Delete => {
            let out = steps.run(a.as_ref(), RowRef::Read(row), outputs)?;
            *present = false;
            Ok(out)
        }
        AccessKind::Write | AccessKind::ReadModifyWrite => {
            steps.run(a.as_ref(), RowRef::Write(row), outputs)
        }
    }
}
