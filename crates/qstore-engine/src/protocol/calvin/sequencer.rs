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

use super::msg::Pos;
use super::msg::{BatchTxn, CMsg};
use super::node::{CalvinNode, HomeTxn, Prepared, POLL};
use super::txn::{roles, unrunnable, Txn};
use crate::protocol::{reply, Admitted, TxnRequest};
use crossbeam_channel::{never, select, Receiver};
use qstore_core::txn::TxnOutcome;
use qstore_core::NodeId;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Requests taken from the admission queue per wake-up.
const DRAIN: usize = 256;

struct Epoch {
    /// Per other node, its transactions.
    batches: Vec<Vec<BatchTxn>>,
    /// Those touching this node, analysed: they go to its scheduler directly.
    #[allow(clippy::vec_box)] // see `Prepared::txns`
    local: Vec<Box<Txn>>,
    home: Vec<(u32, HomeTxn)>,
}

impl Epoch {
    fn len(&self) -> usize {
        self.home.len()
    }
}

pub(super) fn run(node: &CalvinNode, epoch_closed: Receiver<()>) {
    let cfg = &node.ctx.cfg.protocol.calvin;
    let epoch_len = Duration::from_micros(cfg.epoch_us);
    let epoch_txns = cfg.epoch_txns as usize;
    let nodes = node.ctx.nodes() as usize;
    let mut queue = node.queue.clone();
    let mut current = Epoch {
        batches: (0..nodes).map(|_| Vec::new()).collect(),
        local: Vec::new(),
        home: Vec::new(),
    };
    let mut epoch = 0u64;
    let mut deadline = Instant::now() + epoch_len;
    while !node.stop.load(Ordering::Acquire) {
        // Another sequencer ended this epoch already: end it too, without waiting.
        let behind = |e| node.epochs_seen.load(Ordering::Acquire) > e;
        if behind(epoch) {
            for Admitted { req, .. } in queue.try_iter().take(DRAIN) {
                add(node, &mut current, epoch, req);
            }
        } else {
            let wait = deadline.saturating_duration_since(Instant::now()).min(POLL);
            select! {
                recv(queue) -> req => match req {
                    Ok(Admitted { req, .. }) => {
                        add(node, &mut current, epoch, req);
                        for Admitted { req, .. } in queue.try_iter().take(DRAIN - 1) {
                            add(node, &mut current, epoch, req);
                        }
                    }
                    // Shutting down: no new requests, but epochs go on so that every node
                    // can finish the epochs in flight.
                    Err(_) => queue = never(),
                },
                recv(epoch_closed) -> _ => {},
                default(wait) => {},
            }
        }
        let now = Instant::now();
        let full = epoch_txns > 0
            && current.len() >= epoch_txns
            && node.epochs_complete.load(Ordering::Acquire) >= epoch;
        if now >= deadline || full || behind(epoch) {
            close(node, &mut current, epoch);
            epoch += 1;
            deadline = now + epoch_len;
        }
    }
}

/// Sequences one request into the open epoch `e`.
fn add(node: &CalvinNode, current: &mut Epoch, e: u64, req: TxnRequest) {
    let ctx = &*node.ctx;
    let program = match ctx.catalog.program(&req.call) {
        Ok(p) => p,
        Err(e) => return reply(&req, TxnOutcome::Rejected(e.to_string())),
    };
    let me = node.id.0;
    let roles = roles(&program, &ctx.pmap, me);
    if let Some(why) = unrunnable(&program, &ctx.pmap, &roles) {
        return reply(&req, TxnOutcome::Rejected(why));
    }
    let idx = current.home.len() as u32;
    for &p in roles.participants.iter().filter(|&&p| p != me) {
        current.batches[p as usize].push(BatchTxn {
            idx,
            id: req.id,
            call: (*req.call).clone(),
        });
    }
    let pending = roles.executing.len() as u32;
    if roles.participants.contains(&me) {
        let pos = Pos {
            epoch: e,
            node: me,
            idx,
        };
        let txn = Txn::with_roles(pos, req.id, program, roles, &ctx.pmap, &node.row_sizes);
        current.local.push(Box::new(txn));
    }
    let t = HomeTxn {
        req,
        pending,
        outputs: Vec::new(),
        abort: None,
        commits: 0,
    };
    current.home.push((idx, t));
}

/// Ends epoch `e`: its transactions await their acknowledgements here, every other node gets
/// its batch, and this node's scheduler its own.
fn close(node: &CalvinNode, current: &mut Epoch, e: u64) {
    if !current.home.is_empty() {
        let mut home = node.home.lock();
        for (idx, t) in current.home.drain(..) {
            home.insert((e, idx), t);
        }
    }
    let me = node.id.0;
    for (d, batch) in current.batches.iter_mut().enumerate() {
        if d as u32 != me {
            let txns = std::mem::take(batch);
            node.net
                .send(node.id, NodeId(d as u32), CMsg::Batch { epoch: e, txns });
        }
    }
    let local = Prepared {
        epoch: e,
        sequencer: me,
        txns: std::mem::take(&mut current.local),
    };
    let _ = node.prepared.send(local);
    node.note_epoch(me, e);
}
