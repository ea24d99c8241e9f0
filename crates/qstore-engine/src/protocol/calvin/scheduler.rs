//! The scheduler: one thread per node that owns its lock manager. Once it holds epoch `e`
//! from every sequencer, it requests the locks of each transaction on this node's records, in
//! the global order (sequencer by sequencer, each batch in order), all of a transaction's
//! locks at once; transactions granted everything go to the executors, which report back
//! when they are done so their locks are released.
//!
//! Durability: after an epoch node 0 marked for a checkpoint, the scheduler schedules nothing
//! of a later epoch until every transaction it scheduled is done; then, with nothing running
//! here, it takes the checkpoint (see `protocol::checkpoint`) and goes on. Replication: an
//! epoch marked for a stale instance's copy holds later ones back the same way until the
//! partition is copied; and on a stale node the scheduler installs the copy it was given
//! (see `replication::rebuild`).

use super::locks::{LockManager, LockReq};
use super::node::{CalvinNode, Prepared, POLL};
use super::txn::Txn;
use super::worker::Work;
use crate::protocol::checkpoint;
use crate::replication::rebuild::{CopyFor, RebuildMsg};
use crate::replication::Dedup;
use crate::runtime::Pace;
use crate::worker_time::{during, piece, Activity};
use crossbeam_channel::{select, Receiver};
use qstore_core::PartitionId;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// A transaction's locks here, and the transaction until they are granted.
#[derive(Default)]
struct Slot {
    locks: Vec<LockReq>,
    txn: Option<Box<Txn>>,
}

/// An epoch being assembled: each sequencer's batch, once it arrived.
struct EpochParts {
    #[allow(clippy::vec_box)] // see `Prepared::txns`
    batches: Vec<Option<Vec<Box<Txn>>>>,
    missing: usize,
}

pub(super) struct Scheduler<'a> {
    node: &'a CalvinNode,
    locks: LockManager,
    slots: Vec<Slot>,
    free: Vec<u32>,
    epochs: BTreeMap<u64, EpochParts>,
    next_epoch: u64,
    ready: Vec<u32>,
    /// VLL: whether anything happened since the last contention analysis, and how many
    /// transactions finished since.
    changed: bool,
    released: usize,
    /// Copies for stale instances to take after epochs (see `replication::rebuild`).
    copies: BTreeMap<u64, Vec<CopyFor>>,
}

/// Completions between two contention analyses while executors are busy: a quarter of the
/// transaction queue (each analysis walks it, so its cost per completion stays constant), at
/// least this many.
const SCA_EVERY: usize = 64;

impl<'a> Scheduler<'a> {
    pub fn new(node: &'a CalvinNode) -> Self {
        Scheduler {
            locks: LockManager::new(node.ctx.cfg.protocol.calvin.locks),
            node,
            slots: Vec::new(),
            free: Vec::new(),
            epochs: BTreeMap::new(),
            // Epochs up to a restored checkpoint are in it.
            next_epoch: node.ckpt.as_ref().map_or(0, |c| c.replay_from()),
            ready: Vec::new(),
            changed: false,
            released: 0,
            copies: BTreeMap::new(),
        }
    }

    pub fn run(mut self, prepared: Receiver<Prepared>, done: Receiver<u32>) {
        // The lock manager thread: all it does is lock acquisition (the determinism study
        // counts it so), but for the waits and the checkpoints.
        let _accounted = self.node.worker_time.attach(1);
        while !self.node.stop.load(Ordering::Acquire) {
            let (completed, batch) = during(Activity::Idle, || {
                select! {
                    recv(done) -> d => (d.ok(), None),
                    recv(prepared) -> p => (None, Some(p)),
                    default(POLL) => (None, None),
                }
            });
            piece(Activity::Lock);
            if let Some(slot) = completed {
                self.release(slot);
            }
            match batch {
                Some(Ok(p)) => self.add_batch(p),
                Some(Err(_)) => return,
                None => {}
            }
            // Completions first: they free locks for what is queued.
            let began = Pace::begin(&self.node.pace);
            while let Ok(slot) = done.try_recv() {
                self.release(slot);
            }
            during(Activity::Other, || {
                self.checkpoint_if_due();
                self.copy_if_due();
                self.install_if_given(&prepared, &done);
            });
            // VLL: look for blocked transactions that could run anyway (selective contention
            // analysis) when the executors run dry, and regularly while they are busy: a
            // blocked transaction otherwise waits until every earlier one finished here.
            let due = self.node.ready.is_empty()
                || self.released >= SCA_EVERY.max(self.locks.queued() / 4);
            if self.changed && due && self.locks.blocked() > 0 {
                self.changed = false;
                self.released = 0;
                let slots = &self.slots;
                self.locks
                    .find_runnable(|s| slots[s as usize].locks.as_slice(), &mut self.ready);
                self.dispatch_ready();
            }
            Pace::end(&self.node.pace, began);
        }
    }

    fn add_batch(&mut self, p: Prepared) {
        if p.epoch < self.next_epoch {
            tracing::error!(
                "node {}: epoch {} from node {} arrived after the epoch was scheduled",
                self.node.id,
                p.epoch,
                p.sequencer
            );
            return;
        }
        let nodes = self.node.ctx.nodes() as usize;
        let parts = self.epochs.entry(p.epoch).or_insert_with(|| EpochParts {
            batches: (0..nodes).map(|_| None).collect(),
            missing: nodes,
        });
        if p.checkpoint {
            if let Some(c) = &self.node.ckpt {
                c.schedule(p.epoch);
            }
        }
        if let Some(copy) = p.copy {
            self.copies.entry(p.epoch).or_default().push(copy);
        }
        match parts.batches.get_mut(p.sequencer as usize) {
            Some(b @ None) => {
                *b = Some(p.txns);
                parts.missing -= 1;
            }
            _ => {
                tracing::error!(
                    "node {}: unexpected batch of epoch {} from node {}",
                    self.node.id,
                    p.epoch,
                    p.sequencer
                );
                return;
            }
        }
        self.schedule_complete();
    }

    /// Schedules every epoch whose batches are all here, in order, up to a checkpoint or a
    /// copy that waits to be taken (nothing on a stale node).
    fn schedule_complete(&mut self) {
        let held = self.held_from();
        while let Some(parts) = self.epochs.get(&self.next_epoch) {
            if parts.missing > 0 || self.next_epoch >= held {
                break;
            }
            let parts = self.epochs.remove(&self.next_epoch).expect("present");
            self.next_epoch += 1;
            for batch in parts.batches.into_iter().flatten() {
                for txn in batch {
                    self.schedule(txn);
                }
            }
        }
    }

    /// Takes the checkpoint that holds the next epoch back, once nothing scheduled before it
    /// is running or waiting here.
    fn checkpoint_if_due(&mut self) {
        let Some(c) = &self.node.ckpt else { return };
        // Busy first: it is the common case, and it needs no lock.
        if self.free.len() < self.slots.len() || self.next_epoch < c.hold_from() {
            return;
        }
        // SAFETY: every transaction scheduled here is done (its slot is free), and no later
        // one is scheduled until this returns.
        unsafe { c.take_if_due(self.next_epoch, self.node.store()) };
        self.schedule_complete();
    }

    /// The first epoch not to schedule yet: after a checkpoint or a copy to take.
    fn held_from(&self) -> u64 {
        if self.node.group.is_stale() {
            return 0;
        }
        let checkpoint = self.node.ckpt.as_ref().map_or(u64::MAX, |c| c.hold_from());
        let copy = self.copies.keys().next().map_or(u64::MAX, |e| e + 1);
        checkpoint.min(copy)
    }

    /// Copies the partition for the stale instances that want it after the first marked
    /// epoch, once nothing scheduled up to it is running or waiting here; a thread of its
    /// own sends the copy.
    fn copy_if_due(&mut self) {
        let Some((&epoch, _)) = self.copies.first_key_value() else {
            return;
        };
        if self.free.len() < self.slots.len() || self.next_epoch <= epoch {
            return;
        }
        let wanted = self.copies.remove(&epoch).expect("present");
        let node = self.node;
        let started = Instant::now();
        // SAFETY: every transaction scheduled here is done (its slot is free), and no later
        // one is scheduled until this returns.
        let rows = unsafe { checkpoint::copy_rows(node.store()) };
        tracing::info!(
            "node {}: copied partition {} after epoch {epoch} in {:?} ({} records)",
            node.id,
            node.part,
            started.elapsed(),
            rows.len()
        );
        if let Some(n) = node.this.get().and_then(std::sync::Weak::upgrade) {
            let spawned = std::thread::Builder::new()
                .name(format!("c{}-copy", node.id.0))
                .spawn(move || n.send_copies(&wanted, epoch, rows));
            if let Err(e) = spawned {
                tracing::error!("node {}: cannot send a copy: {e}", node.id);
            }
        }
        self.schedule_complete();
    }

    /// A stale node: installs the copy its rebuild handed over, with nothing of the old run
    /// left running, queued or waiting, and starts a new run after the copy's epoch.
    fn install_if_given(&mut self, prepared: &Receiver<Prepared>, done: &Receiver<u32>) {
        let node = self.node;
        let Some(copy) = node.to_install.lock().take() else {
            return;
        };
        let (gen, epoch, holding) = (copy.gen, copy.batch, copy.holding);
        let started = Instant::now();
        {
            // No executor works on a transaction meanwhile; what they pick up later was
            // scheduled in the old run, and they drop it (see `Txn::run`).
            let _gate = node.run_gate.write();
            node.run.fetch_add(1, Ordering::AcqRel);
            while node.ready_rx.try_recv().is_ok() || prepared.try_recv().is_ok() {}
            while done.try_recv().is_ok() {}
            node.waiting.lock().clear();
            node.home.lock().clear();
            // SAFETY: nothing runs: executors wait at the gate, and this thread schedules
            // nothing while it installs.
            let installed = unsafe { checkpoint::install_rows(copy.records, node.store()) };
            let rows = match installed {
                Ok(rows) => rows,
                Err(e) => {
                    node.rebuild.install_done();
                    return tracing::error!("node {}: cannot install a copy: {e}", node.id);
                }
            };
            *self = Scheduler {
                next_epoch: epoch + 1,
                ..Scheduler::new(node)
            };
            node.start_run_at(epoch + 1, Dedup::of_outcomes(copy.outcomes));
            tracing::warn!(
                "node {}: installed a copy of partition {} after epoch {epoch} ({rows} rows) in \
                 {:?}",
                node.id,
                node.part,
                started.elapsed()
            );
        }
        if !node
            .rebuild
            .state
            .lock()
            .installed_copy(gen, epoch, holding)
        {
            node.rebuild.install_done();
            return tracing::warn!(
                "node {}: its log skipped entries while it installed a copy after epoch \
                 {epoch}: it waits for a later one",
                node.id
            );
        }
        for p in 0..node.ctx.nodes() {
            let to = node.ctx.placement.peer_of(node.id, PartitionId(p));
            node.net.send(
                node.id,
                to,
                super::msg::CMsg::Rebuild(RebuildMsg::Rebuilt { gen }),
            );
        }
        node.rebuild.install_done();
    }

    /// Requests every lock `txn` needs here, after those of every earlier transaction.
    fn schedule(&mut self, mut txn: Box<Txn>) {
        let me = self.node.part;
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.slots.push(Slot::default());
                self.slots.len() as u32 - 1
            }
        };
        txn.slot = slot;
        txn.run = self.node.run.load(Ordering::Acquire);
        let s = &mut self.slots[slot as usize];
        s.locks.clear();
        s.locks.extend(
            txn.records
                .iter()
                .filter(|r| r.node == me)
                .map(|r| LockReq {
                    key: (r.table, r.key),
                    exclusive: r.write,
                }),
        );
        self.changed = true;
        if self.locks.request(slot, &s.locks) {
            let _ = self.node.ready.send(Work::Start(txn));
        } else {
            s.txn = Some(txn);
        }
    }

    fn release(&mut self, slot: u32) {
        let Some(s) = self.slots.get(slot as usize) else {
            tracing::error!("node {}: release of unknown slot {slot}", self.node.id);
            return;
        };
        self.locks.release(slot, &s.locks, &mut self.ready);
        self.free.push(slot);
        self.changed = true;
        self.released += 1;
        self.dispatch_ready();
    }

    fn dispatch_ready(&mut self) {
        for slot in self.ready.drain(..) {
            match self.slots[slot as usize].txn.take() {
                Some(txn) => {
                    let _ = self.node.ready.send(Work::Start(txn));
                }
                None => tracing::error!(
                    "node {}: slot {slot} granted without a waiting transaction",
                    self.node.id
                ),
            }
        }
    }
}
