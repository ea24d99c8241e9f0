//! The sequencer: one thread per node. It takes the node's client requests, builds each
//! program, and cuts epochs; at the end of each epoch it sends every other node the epoch's
//! transactions that touch that node, possibly none, so that every node knows when it holds a
//! whole epoch, and hands those touching its own node to its scheduler, already analysed.
//!
//! Epochs end every `epoch_us` (time-based, as in Calvin). A node can schedule epoch `e` only
//! once every sequencer has ended it, so sequencers must not drift apart: the timers of
//! different threads (or processes, started at different times) do, and a node whose epochs
//! ran ahead would hold its transactions back by the difference. So a sequencer also ends its
//! epoch as soon as it learns that another sequencer ended the same one: all stay within one
//! epoch of the fastest. With `epoch_txns` > 0 an epoch also ends once it holds that many
//! transactions, but only when this node already holds the whole previous epoch (the others
//! then follow at once).
//!
//! With replication only the leader of each replica group sequences, and it proposes each
//! epoch to its group's log instead of sending it; every member dispatches the epoch when the
//! log commits it (see [`super::replica`]).

use super::msg::Pos;
use super::msg::{BatchTxn, CMsg};
use super::node::{CalvinNode, HomeTxn, Prepared, POLL};
use super::txn::{roles, unrunnable, Roles, Txn};
use crate::protocol::{reply, Admitted, TxnRequest};
use crossbeam_channel::{never, select, Receiver};
use qstore_core::txn::{ProcCall, Program, TxnKey, TxnOutcome};
use qstore_core::TxnId;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Requests taken from the admission queue per wake-up.
const DRAIN: usize = 256;

/// An epoch being filled (or, with replication, rebuilt from the log): what it sends every
/// other node of the instance, what it hands this node's scheduler, and the transactions this
/// node is home to.
pub(super) struct Epoch {
    /// Per other node, its transactions.
    batches: Vec<Vec<BatchTxn>>,
    /// Those touching this node, analysed: they go to its scheduler directly.
    #[allow(clippy::vec_box)] // see `Prepared::txns`
    local: Vec<Box<Txn>>,
    home: Vec<(u32, HomeTxn)>,
}

impl Epoch {
    pub fn new(nodes: u32) -> Self {
        Epoch {
            batches: (0..nodes).map(|_| Vec::new()).collect(),
            local: Vec::new(),
            home: Vec::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.home.len()
    }
}

/// A request the sequencer took: its program, built and analysed for its home.
pub(super) struct Accepted {
    pub req: TxnRequest,
    pub program: Program,
    pub roles: Roles,
}

/// A transaction of an epoch: where it sits in its sequencer's batch, and what it is.
pub(super) struct Sequenced {
    pub idx: u32,
    pub id: TxnId,
    pub call: Arc<ProcCall>,
    pub key: TxnKey,
    pub program: Program,
    pub roles: Roles,
    /// The client's request, at the node that sequenced it.
    pub client: Option<TxnRequest>,
}

impl Sequenced {
    pub fn accepted(idx: u32, a: Accepted) -> Self {
        Sequenced {
            idx,
            id: a.req.id,
            call: a.req.call.clone(),
            key: a.req.key,
            program: a.program,
            roles: a.roles,
            client: Some(a.req),
        }
    }
}

/// What the sequencer does with the requests it takes and the epochs it ends: without
/// replication, it fills and sends each epoch itself ([`Unreplicated`]); with it, the
/// group's leader proposes each epoch to the group's log (see [`super::replica`]).
pub(super) trait EpochSink {
    /// A request accepted into the open epoch `e`.
    fn add(&mut self, e: u64, a: Accepted);
    /// Epoch `e` ends.
    fn close(&mut self, e: u64);
    /// Requests in the open epoch.
    fn len(&self) -> usize;
}

/// A sequencer without replication: epochs go out as they end.
struct Unreplicated<'a> {
    node: &'a CalvinNode,
    current: Epoch,
}

impl EpochSink for Unreplicated<'_> {
    fn add(&mut self, e: u64, a: Accepted) {
        let idx = self.current.len() as u32;
        place(self.node, &mut self.current, e, Sequenced::accepted(idx, a));
    }

    fn close(&mut self, e: u64) {
        dispatch(self.node, &mut self.current, e);
    }

    fn len(&self) -> usize {
        self.current.len()
    }
}

pub(super) fn run(node: &CalvinNode, epoch_closed: Receiver<()>) {
    let mut queue = node.queue.clone();
    if node.group.member.get().is_some() {
        return super::replica::lead(node, &mut queue, &epoch_closed);
    }
    let mut sink = Unreplicated {
        node,
        current: Epoch::new(node.ctx.nodes()),
    };
    cut_epochs(node, &mut queue, &epoch_closed, 0, &mut sink, || true);
}

/// Takes requests and cuts epochs from epoch `first` on, for as long as `go_on` says (and the
/// node runs). Returns the epoch left open.
pub(super) fn cut_epochs(
    node: &CalvinNode,
    queue: &mut Receiver<Admitted>,
    epoch_closed: &Receiver<()>,
    first: u64,
    sink: &mut impl EpochSink,
    go_on: impl Fn() -> bool,
) -> u64 {
    let cfg = &node.ctx.cfg.protocol.calvin;
    let epoch_len = Duration::from_micros(cfg.epoch_us);
    let epoch_txns = cfg.epoch_txns as usize;
    let mut epoch = first;
    let mut deadline = Instant::now() + epoch_len;
    let add = |sink: &mut _, e, req| {
        if let Some(a) = accept(node, req) {
            EpochSink::add(sink, e, a);
        }
    };
    while !node.stop.load(Ordering::Acquire) && go_on() {
        // Another sequencer ended this epoch already: end it too, without waiting.
        let behind = |e| node.epochs_seen.load(Ordering::Acquire) > e;
        if behind(epoch) {
            for Admitted { req, .. } in queue.try_iter().take(DRAIN) {
                add(sink, epoch, req);
            }
        } else {
            let wait = deadline.saturating_duration_since(Instant::now()).min(POLL);
            select! {
                recv(queue) -> req => match req {
                    Ok(Admitted { req, .. }) => {
                        add(sink, epoch, req);
                        for Admitted { req, .. } in queue.try_iter().take(DRAIN - 1) {
                            add(sink, epoch, req);
                        }
                    }
                    // Shutting down: no new requests, but epochs go on so that every node
                    // can finish the epochs in flight.
                    Err(_) => *queue = never(),
                },
                recv(epoch_closed) -> _ => {},
                default(wait) => {},
            }
        }
        let now = Instant::now();
        let full = epoch_txns > 0
            && sink.len() >= epoch_txns
            && node.epochs_complete.load(Ordering::Acquire) >= epoch;
        if now >= deadline || full || behind(epoch) {
            sink.close(epoch);
            epoch += 1;
            deadline = now + epoch_len;
        }
    }
    epoch
}

/// Builds a request's program and checks that Calvin can run it; answers it `Rejected` if
/// not.
fn accept(node: &CalvinNode, req: TxnRequest) -> Option<Accepted> {
    let ctx = &*node.ctx;
    let program = match ctx.catalog.program(&req.call) {
        Ok(p) => p,
        Err(e) => {
            reply(&req, TxnOutcome::Rejected(e.to_string()));
            return None;
        }
    };
    let roles = roles(&program, &ctx.pmap, node.part);
    if let Some(why) = unrunnable(&program, &ctx.pmap, &roles) {
        reply(&req, TxnOutcome::Rejected(why));
        return None;
    }
    Some(Accepted {
        req,
        program,
        roles,
    })
}

/// Places a transaction in epoch `e`: in the batch of every other node it touches, in this
/// node's own, and among those this node is home to.
pub(super) fn place(node: &CalvinNode, current: &mut Epoch, e: u64, t: Sequenced) {
    let ctx = &*node.ctx;
    let me = node.part;
    let Sequenced {
        idx,
        id,
        call,
        key,
        program,
        roles,
        client,
    } = t;
    for &p in roles.participants.iter().filter(|&&p| p != me) {
        current.batches[p as usize].push(BatchTxn {
            idx,
            id,
            call: (*call).clone(),
        });
    }
    let pending = roles.executing.len() as u32;
    if roles.participants.contains(&me) {
        let pos = Pos {
            epoch: e,
            node: me,
            idx,
        };
        let txn = Txn::with_roles(pos, id, program, roles, &ctx.pmap, &node.row_sizes);
        current.local.push(Box::new(txn));
    }
    let t = HomeTxn {
        client,
        id,
        call,
        key,
        pending,
        outputs: Vec::new(),
        abort: None,
        commits: 0,
    };
    current.home.push((idx, t));
}

/// Ends epoch `e`: its transactions await their acknowledgements here, every other node of
/// the instance gets its batch, and this node's scheduler its own.
pub(super) fn dispatch(node: &CalvinNode, current: &mut Epoch, e: u64) {
    if !current.home.is_empty() {
        let mut home = node.home.lock();
        for (idx, t) in current.home.drain(..) {
            home.insert((e, idx), t);
        }
    }
    let me = node.part;
    // Node 0 marks the epochs after which every node checkpoints, or copies its partition
    // for a stale instance (only the leader of group 0 is asked to).
    let checkpoint = me == 0 && node.ckpt.as_ref().is_some_and(|c| c.mark_due(e));
    let copy = (me == 0)
        .then(|| node.rebuild.copy_due(node.id, e))
        .flatten();
    for (d, batch) in current.batches.iter_mut().enumerate() {
        if d as u32 != me {
            let txns = std::mem::take(batch);
            let msg = CMsg::Batch {
                epoch: e,
                txns,
                checkpoint,
                copy,
            };
            node.send_to(d as u32, msg);
        }
    }
    let local = Prepared {
        epoch: e,
        sequencer: me,
        txns: std::mem::take(&mut current.local),
        checkpoint,
        copy,
    };
    let _ = node.prepared.send(local);
    node.note_epoch(me, e);
}
