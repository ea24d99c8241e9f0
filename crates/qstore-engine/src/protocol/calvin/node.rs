//! A Calvin node: what its threads share, the network thread that routes the inbox, and the
//! home side of a transaction (collecting acknowledgements, answering the client).

use super::msg::{Ack, BatchTxn, CMsg, Pos, Reads, Verdict};
use super::replica::{GroupSeat, LoggedEpoch};
use super::txn::Txn;
use super::worker::Work;
use crate::cluster::EngineCtx;
use crate::history::{HistoryRecorder, TxnTrace};
use crate::protocol::checkpoint::{Checkpointer, Recovers};
use crate::protocol::shell::{LogPosition, NodeShell};
use crate::protocol::{admit, reply, settle, AdmissionQueue, Admitted, Ending, TxnRequest};
use crate::replication::rebuild::{self, CopyFor, Rebuilder, Seat};
use crate::replication::Dedup;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use parking_lot::{Mutex, RwLock};
use qstore_core::txn::{ProcCall, TxnKey, TxnOutcome, Value};
use qstore_core::{NodeId, PartitionId, TxnId};
use qstore_net::{Envelope, Transport};
use qstore_storage::PartitionStore;
use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

/// How long a blocked thread waits before it looks at the stop flag again.
pub(super) const POLL: Duration = Duration::from_millis(20);

/// A transaction this node is home to (it sequenced it, or, with replication, its group's
/// leader did), until every executing participant acknowledged it.
pub(super) struct HomeTxn {
    /// The client's request, where the transaction was sequenced (a member of the group
    /// that did not sequence it runs it for no client).
    pub client: Option<TxnRequest>,
    pub id: TxnId,
    pub call: Arc<ProcCall>,
    pub key: TxnKey,
    pub pending: u32,
    pub outputs: Vec<Value>,
    pub abort: Option<String>,
    pub commits: u32,
}

/// An executing participant's transaction that waits for remote reads, or reads that came
/// before their transaction got here.
pub(super) enum Waiting {
    Early(Vec<(u32, Reads)>),
    Parked(Box<Txn>),
}

/// An epoch batch of one sequencer, analysed, for the scheduler.
pub(super) struct Prepared {
    pub epoch: u64,
    pub sequencer: u32,
    /// Boxed here, on the network thread, once: each then moves on its own through the
    /// scheduler and the executors' queue, which keeps allocation off the scheduler thread.
    #[allow(clippy::vec_box)]
    pub txns: Vec<Box<Txn>>,
    /// Node 0 marked this epoch: every node checkpoints after it.
    pub checkpoint: bool,
    /// Node 0 marked this epoch: every node copies its partition after it for a stale
    /// instance (see `replication::rebuild`).
    pub copy: Option<CopyFor>,
}

pub(super) struct CalvinNode {
    /// The server.
    pub id: NodeId,
    /// The partition it holds: its place in its cluster instance. Calvin's nodes name each
    /// other by partition (epoch batches, reads, acknowledgements stay inside an instance).
    pub part: u32,
    pub ctx: Arc<EngineCtx>,
    pub net: Arc<dyn Transport<CMsg>>,
    /// `None` once shutting down.
    pub admission: RwLock<Option<AdmissionQueue>>,
    /// The other end of the admission queue: the sequencer's input.
    pub queue: Receiver<Admitted>,
    /// Transactions sequenced here, by (epoch, index), until answered.
    pub home: Mutex<FxHashMap<(u64, u32), HomeTxn>>,
    pub waiting: Mutex<FxHashMap<Pos, Waiting>>,
    /// Transactions whose locks are granted, and parked ones whose reads are all in.
    pub ready: Sender<Work>,
    /// Executors report transactions they are done with here (their scheduler slot).
    pub done: Sender<u32>,
    pub prepared: Sender<Prepared>,
    /// Tells the sequencer that another sequencer closed an epoch.
    pub epoch_closed: Sender<()>,
    /// Per sequencer, the next epoch expected from it (links are FIFO).
    pub epochs_from: Vec<AtomicU64>,
    /// Epochs every sequencer's batch has arrived here for (0..complete).
    pub epochs_complete: AtomicU64,
    /// One past the highest epoch some sequencer's batch has arrived here for.
    pub epochs_seen: AtomicU64,
    pub stop: AtomicBool,
    pub row_sizes: Vec<usize>,
    /// Replication: this server's seat in its partition's replica group.
    pub group: GroupSeat,
    /// Replication: rebuilding this server's stale instance, or serving copies to another.
    pub rebuild: Rebuilder<LoggedEpoch>,
    /// Replication: a whole copy for the scheduler to install (see `Scheduler::install`).
    pub to_install: Mutex<Option<rebuild::Copy>>,
    /// Held (shared) by an executor while it works on a transaction, and (exclusive) while a
    /// copy is installed: nothing of the old run runs then.
    pub run_gate: RwLock<()>,
    /// Which run the node is in: one more at every installed copy. An executor drops
    /// messages it gathered in an earlier run.
    pub run: AtomicU64,
    /// The executors' queue, for the scheduler to empty when it installs a copy.
    pub ready_rx: Receiver<Work>,
    /// The node itself, for threads of its own.
    pub this: OnceLock<Weak<CalvinNode>>,
    /// Durability: this node's checkpoints (with a data directory).
    pub ckpt: Option<Arc<Checkpointer>>,
    /// The slow node's pace, if it is the slow node.
    pub pace: Option<crate::runtime::Pace>,
    /// Where the scheduler's and the executors' time goes.
    pub worker_time: crate::worker_time::WorkerTimes,
}

impl CalvinNode {
    pub fn store(&self) -> &PartitionStore {
        self.ctx.server_store(self.id)
    }

    /// Where this server records the run's history: its cluster instance's recorder.
    pub fn history(&self) -> Option<&HistoryRecorder> {
        self.ctx.history_of(self.id)
    }

    /// Sends a message to the node of this server's instance that holds partition `part`.
    pub fn send_to(&self, part: u32, msg: CMsg) {
        let to = self.ctx.placement.peer_of(self.id, PartitionId(part));
        self.net.send(self.id, to, msg);
    }

    pub fn submit(&self, req: TxnRequest) {
        let guard = self.admission.read();
        admit(guard.as_ref(), self.id, req, None, self.history());
    }

    /// Builds and analyses a sequencer's batch for the scheduler. Programs are rebuilt from
    /// their calls; the sequencer already built each once, so a failure here means the nodes
    /// disagree on the catalog: the transaction cannot run here and its home never hears.
    fn prepare(
        &self,
        epoch: u64,
        sequencer: u32,
        txns: Vec<BatchTxn>,
        (checkpoint, copy): (bool, Option<CopyFor>),
    ) -> Prepared {
        let ctx = &*self.ctx;
        let txns = txns
            .into_iter()
            .filter_map(|t| {
                let pos = Pos {
                    epoch,
                    node: sequencer,
                    idx: t.idx,
                };
                match ctx.catalog.program(&t.call) {
                    Ok(p) => Some(Box::new(Txn::new(pos, t.id, p, &ctx.pmap, &self.row_sizes))),
                    Err(e) => {
                        tracing::error!(
                            "node {}: cannot build the program of {} sequenced by node {sequencer} \
                             (do all nodes run the same workload?): {e}",
                            self.id,
                            t.id
                        );
                        None
                    }
                }
            })
            .collect();
        Prepared {
            epoch,
            sequencer,
            txns,
            checkpoint,
            copy,
        }
    }

    /// Notes that sequencer `from`'s batch of `epoch` has arrived here (its own sequencer's
    /// included), for the sequencer's epoch decisions.
    pub fn note_epoch(&self, from: u32, epoch: u64) {
        let Some(next) = self.epochs_from.get(from as usize) else {
            return;
        };
        let expected = next.fetch_max(epoch + 1, Ordering::SeqCst);
        if epoch != expected {
            tracing::error!(
                "node {}: epoch {epoch} from node {from} arrived, expected {expected}",
                self.id
            );
        }
        // Entries only grow, so a minimum taken while another thread updates one is never
        // above the true one; fetch_max keeps the largest seen.
        let all = self.epochs_from.iter().map(|e| e.load(Ordering::SeqCst));
        let (complete, seen) = all.fold((u64::MAX, 0), |(lo, hi), e| (lo.min(e), hi.max(e)));
        self.epochs_complete.fetch_max(complete, Ordering::SeqCst);
        self.epochs_seen.fetch_max(seen, Ordering::SeqCst);
        if from != self.part {
            let _ = self.epoch_closed.try_send(());
        }
    }

    /// The network thread: hands other sequencers' epoch batches to the scheduler, reads to
    /// the transactions waiting for them, acknowledgements to the home transactions.
    pub fn serve_network(&self, inbox: Receiver<Envelope<CMsg>>) {
        let nodes = self.ctx.nodes();
        while !self.stop.load(Ordering::Acquire) {
            let env = match inbox.recv_timeout(POLL) {
                Ok(env) => env,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return,
            };
            let placement = &self.ctx.placement;
            let msg = match env.msg {
                CMsg::Raft(msg) => {
                    crate::replication::deliver(self.group.member.get(), self.id, env.from, msg);
                    continue;
                }
                // From other instances too (copies, a coordinator's request).
                CMsg::Rebuild(msg) => {
                    self.on_rebuild(env.from, msg);
                    continue;
                }
                msg => msg,
            };
            if placement.instance_of(env.from) != placement.instance_of(self.id) {
                tracing::error!(
                    "node {}: a transaction message from node {} of another cluster instance",
                    self.id,
                    env.from
                );
                continue;
            }
            let from = placement.partition_of(env.from).0;
            if msg.is_of_a_run()
                && self.group.is_stale()
                && !self.rebuild.state.lock().accepts_from(from)
            {
                continue; // the instance's old run (see `replication::rebuild`)
            }
            match msg {
                CMsg::Raft(_) | CMsg::Rebuild(_) => unreachable!("handled above"),
                CMsg::Stale => self.become_stale("another node of its instance is stale"),
                CMsg::Batch {
                    epoch,
                    txns,
                    checkpoint,
                    copy,
                } => {
                    if from >= nodes || from == self.part {
                        tracing::error!("node {}: epoch batch from node {from}", self.id);
                        continue;
                    }
                    // Only node 0 marks checkpoints and copies.
                    let marks = (checkpoint && from == 0, copy.filter(|_| from == 0));
                    let prepared = self.prepare(epoch, from, txns, marks);
                    let _ = self.prepared.send(prepared);
                    self.note_epoch(from, epoch);
                }
                CMsg::Checkpoints { have, asking } => self.on_checkpoints(env.from, have, asking),
                CMsg::Exec { reads, acks } => {
                    for r in reads {
                        self.on_reads(from, r);
                    }
                    for a in acks {
                        self.on_ack(a);
                    }
                }
            }
        }
    }

    /// A node told which checkpoints it holds (and, at its start, asks for ours).
    fn on_checkpoints(&self, from: NodeId, have: Vec<u64>, asking: bool) {
        let Some(c) = &self.ckpt else {
            return tracing::warn!(
                "node {}: node {from} announced checkpoints, but this node keeps none",
                self.id
            );
        };
        if let Some(answer) = c.heard_from(from, have, asking) {
            self.net.send(self.id, from, answer);
        }
    }

    /// Handles a message of a rebuild (see `replication::rebuild`).
    fn on_rebuild(&self, from: NodeId, msg: rebuild::RebuildMsg) {
        // The leader of group 0 serves copies: its node marks the epochs it dispatches.
        let serves = self.ctx.placement.leader(PartitionId(self.part)) == Some(self.id)
            && !self.group.is_stale();
        self.with_seat(|seat| self.rebuild.on_msg(seat, from, msg, serves));
    }

    /// This server's seat in its instance, for the shared steps of a rebuild.
    pub fn with_seat<R>(&self, f: impl FnOnce(&Seat) -> R) -> R {
        let stale = || self.tell_stale();
        rebuild::with_seat(&self.ctx, self.id, &*self.net, CMsg::Rebuild, &stale, f)
    }

    /// Sends the stale instances that want it the copy of this node's partition after
    /// `epoch`, with the outcomes of its group's transactions, once every transaction of
    /// the group up to the copy is answered here.
    pub fn send_copies(&self, wanted: &[CopyFor], epoch: u64, rows: Vec<Vec<u8>>) {
        let send = |to, msg| self.net.send(self.id, to, CMsg::Rebuild(msg));
        let answered = || self.home.lock().keys().all(|&(e, _)| e > epoch);
        let outcomes = || self.group.dedup.lock().finished_outcomes();
        let part = PartitionId(self.part);
        rebuild::send_copies(
            &self.ctx, part, &send, wanted, epoch, rows, answered, outcomes,
        );
    }

    /// A new run after an installed copy of epochs before `next`: the node's epoch
    /// bookkeeping starts there, and the group's outcomes are the copy's.
    pub fn start_run_at(&self, next: u64, dedup: Dedup) {
        for e in &self.epochs_from {
            e.store(next, Ordering::SeqCst);
        }
        self.epochs_complete.store(next, Ordering::SeqCst);
        self.epochs_seen.store(next, Ordering::SeqCst);
        self.group.restart_at(next, dedup);
    }

    /// Tells every other node of the instance that it is out of service.
    pub fn tell_stale(&self) {
        for p in (0..self.ctx.nodes()).filter(|&p| p != self.part) {
            self.send_to(p, CMsg::Stale);
        }
    }

    /// Reads for a transaction this node executes: completes a parked transaction (which
    /// goes back to the executors) or waits for it.
    fn on_reads(&self, from: u32, reads: Reads) {
        let pos = reads.pos;
        let mut waiting = self.waiting.lock();
        let w = waiting
            .entry(pos)
            .or_insert_with(|| Waiting::Early(Vec::new()));
        match w {
            Waiting::Early(early) => early.push((from, reads)),
            Waiting::Parked(txn) => {
                if let Err(e) = txn.accept(from, reads) {
                    tracing::error!(
                        "node {}: unusable reads from node {from} for {pos:?}: {e:?}",
                        self.id
                    );
                    return;
                }
                if txn.missing == 0 {
                    let Some(Waiting::Parked(txn)) = waiting.remove(&pos) else {
                        unreachable!("parked above")
                    };
                    drop(waiting);
                    let _ = self.ready.send(Work::Resume(txn));
                }
            }
        }
    }

    /// An executing participant waits for the reads still missing: returns the transaction
    /// if they are all here (early arrivals included), else parks it.
    pub fn park(&self, mut txn: Box<Txn>) -> Option<Box<Txn>> {
        let mut waiting = self.waiting.lock();
        if let Some(Waiting::Early(early)) = waiting.remove(&txn.pos) {
            for (from, reads) in early {
                if let Err(e) = txn.accept(from, reads) {
                    tracing::error!(
                        "node {}: unusable reads from node {from} for {:?}: {e:?}",
                        self.id,
                        txn.pos
                    );
                }
            }
        }
        if txn.missing == 0 {
            return Some(txn);
        }
        waiting.insert(txn.pos, Waiting::Parked(txn));
        None
    }

    /// An executing participant's verdict on a transaction this node is home to. The last
    /// one answers the client.
    pub fn on_ack(&self, ack: Ack) {
        let key = (ack.epoch, ack.idx);
        let mut home = self.home.lock();
        let Some(t) = home.get_mut(&key) else {
            tracing::error!(
                "node {}: acknowledgement for unknown transaction {key:?}",
                self.id
            );
            return;
        };
        match ack.verdict {
            Verdict::Commit(outputs) => {
                t.commits += 1;
                if let Some(o) = outputs {
                    t.outputs = o;
                }
            }
            Verdict::LogicAbort(why) => {
                t.abort.get_or_insert(why);
            }
        }
        t.pending -= 1;
        if t.pending > 0 {
            return;
        }
        let t = home.remove(&key).expect("present");
        drop(home);
        let pos = Pos {
            epoch: ack.epoch,
            node: self.part,
            idx: ack.idx,
        };
        self.answer(pos, t);
    }

    /// Records a decided transaction and answers its client (with replication: answers it
    /// where it was sequenced, and remembers its outcome for resubmissions).
    fn answer(&self, pos: Pos, t: HomeTxn) {
        let order = pos.order();
        let id = t.id;
        let ending = match t.abort {
            Some(why) => {
                if t.commits > 0 {
                    // Executing participants ran the same program on the same data: they
                    // cannot disagree unless storage differs (a full table on an insert).
                    tracing::error!(
                        "node {}: participants disagree on {id} ({pos:?}): {} committed, one \
                         aborted ({why})",
                        self.id,
                        t.commits
                    );
                }
                Ending::LogicAbort { order, why }
            }
            None => Ending::Committed {
                order,
                outputs: t.outputs,
            },
        };
        let trace = TxnTrace::default();
        let outcome = settle(self.history(), self.id, id, &t.call, &trace, ending);
        if self.group.member.get().is_some() {
            self.group.dedup.lock().finished(t.key, &outcome);
            self.group.progressed();
        }
        if let Some(req) = t.client {
            req.answer(outcome);
        }
    }
}

impl Recovers for CalvinNode {
    fn id(&self) -> NodeId {
        self.id
    }

    fn checkpointer(&self) -> Option<&Arc<Checkpointer>> {
        self.ckpt.as_ref()
    }

    fn store(&self) -> &PartitionStore {
        CalvinNode::store(self)
    }

    fn history(&self) -> Option<&HistoryRecorder> {
        CalvinNode::history(self)
    }

    /// Every sequencer's epochs before `from` are in the checkpoint: the log replays (and the
    /// sequencers go on) from there, and the scheduler starts there (see `Scheduler::new`).
    fn resume_at(&self, from: u64) {
        for e in &self.epochs_from {
            e.fetch_max(from, Ordering::SeqCst);
        }
        self.epochs_complete.fetch_max(from, Ordering::SeqCst);
        self.epochs_seen.fetch_max(from, Ordering::SeqCst);
        self.group.resume_at(from);
    }
}

impl NodeShell for CalvinNode {
    fn close_admission(&self) {
        self.admission.write().take();
    }

    fn log_position(&self) -> Option<LogPosition> {
        if self.group.is_stale() {
            return None;
        }
        LogPosition::of(self.part, self.group.member.get())
    }

    fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }

    /// Whether everything this node sequenced has been answered and nothing waits to be (a
    /// stale node's transactions never finish; their clients were answered), and, once its
    /// instance is back in service, it replayed what it held.
    fn quiescent(&self) -> bool {
        let stale = self.group.is_stale();
        let asked = self.queue.is_empty() && self.group.idle();
        match self.rebuild.quiescence(stale, &self.ctx, self.id) {
            Some(out) => out && asked,
            None => asked && self.home.lock().is_empty(),
        }
    }

    /// Requests queued, and transactions this node is home to (a member of a group that
    /// did not sequence them runs them for no client): a follower's tail of its log.
    fn in_flight(&self) -> usize {
        self.queue.len() + self.home.lock().len()
    }

    /// Answers requests still queued or unanswered at shutdown.
    fn reject_leftovers(&self) {
        let rejected = || TxnOutcome::Rejected("cluster is shutting down".into());
        for Admitted { req, .. } in self.queue.try_iter() {
            reply(&req, rejected());
        }
        let home = std::mem::take(&mut *self.home.lock());
        let mut clients: Vec<TxnRequest> = home.into_values().filter_map(|t| t.client).collect();
        clients.extend(self.group.take_proposed());
        clients.extend(self.group.dedup.lock().take_waiting());
        if !clients.is_empty() {
            tracing::warn!(
                "node {} stopped with {} transactions unanswered",
                self.id,
                clients.len()
            );
        }
        for req in clients {
            req.answer(rejected());
        }
    }
}
