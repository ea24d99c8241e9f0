//! Calvin: deterministic distributed transactions by sequencing and deterministic locking
//! (Thomson et al., SIGMOD 2012), as described in Ren, Thomson and Abadi's evaluation of
//! deterministic databases (VLDB 2014) and Qadah and Sadoghi (EDBT 2020, section 2.1).
//!
//! Node `n` of a cluster instance holds partition `n` (without replication, server `n`; with
//! it, every instance runs the same epochs, see [`replica`]). Per node:
//! - the **sequencer** ([`sequencer`]) takes the node's client requests and cuts epochs; each
//!   epoch it sends every node the transactions that touch it (its own node's scheduler gets
//!   them directly). The global order is (epoch,
//!   sequencer node, place in the batch); a transaction's home is the node that sequenced it;
//! - the **scheduler** ([`scheduler`]) requests, once it holds an epoch from every
//!   sequencer, the locks of each transaction on this node's records in the global order,
//!   with a lock table or VLL ([`locks`]); transactions granted everything go to
//! - the **executors** ([`worker`]), which run the execution phases: read/write-set analysis
//!   ([`txn`]), local reads, sending them to the active participants (the nodes the program
//!   writes on), collecting remote reads, and running the whole program at each active
//!   participant, which all reach the same outputs and the same logic-abort decision;
//! - a **network thread** ([`node`]) routes the inbox: epoch batches to the scheduler, reads
//!   to the transactions waiting for them, acknowledgements to their home, which answers the
//!   client once every executing participant has reported. No two-phase commit: no node can
//!   refuse a transaction another one commits.
//!
//! Thread roles: of a node's `workers`, one is the sequencer, one the scheduler and the rest
//! execute; with fewer than three workers the node still runs one executor (so one or two
//! workers give three threads), besides the network thread every protocol has.

mod locks;
mod msg;
mod node;
mod replica;
mod scheduler;
mod sequencer;
mod txn;
mod worker;

use crate::cluster::EngineCtx;
use crate::net::NodeNet;
use crate::protocol::checkpoint::{self, Checkpointer};
use crate::protocol::shell::shut_down;
use crate::protocol::{home_node, Engine, TxnRequest};
use crate::replication::zookeeper::ZkMember;
use crate::replication::{self, Applier};
use crate::runtime::spawn_worker;
use crossbeam_channel::{bounded, unbounded};
use msg::CMsg;
use node::CalvinNode;
use parking_lot::{Mutex, RwLock};
use qstore_core::config::ReplicationLayer;
use qstore_core::placement::Placement;
use qstore_core::{NodeId, QError};
use qstore_net::{NetCounters, Transport};
use replica::GroupSeat;
use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How long shutdown lets transactions already sequenced finish.
const QUIESCE_TIMEOUT: Duration = Duration::from_secs(2);

/// Executor threads of a node with `workers` workers (one sequencer and one scheduler
/// besides; at least one executor).
pub fn executors(workers: u32) -> u32 {
    workers.saturating_sub(2).max(1)
}

pub fn start(ctx: Arc<EngineCtx>) -> Result<Box<dyn Engine>, QError> {
    let NodeNet { transport, inboxes } = crate::net::open::<CMsg>(&ctx)?;
    let mut nodes: Vec<Option<Arc<CalvinNode>>> = (0..ctx.servers()).map(|_| None).collect();
    let mut threads = Vec::new();
    let row_sizes: Vec<usize> = ctx.catalog.tables.iter().map(|t| t.row_size).collect();
    // Each node and the ends of its queues its threads take, once its group has a leader.
    let mut roles = Vec::new();
    for (id, inbox) in inboxes {
        let (admission, queue) = bounded(ctx.cfg.protocol.admission_queue as usize);
        let (ready, ready_rx) = unbounded();
        let (done, done_rx) = unbounded();
        let (prepared, prepared_rx) = unbounded();
        let (epoch_closed, epoch_closed_rx) = bounded(1);
        let ckpt = Checkpointer::open(&ctx, id, "calvin-checkpoints", "epoch")?;
        let node = Arc::new(CalvinNode {
            id,
            part: ctx.placement.partition_of(id).0,
            ctx: ctx.clone(),
            net: transport.clone(),
            admission: RwLock::new(Some(admission)),
            queue,
            home: Mutex::new(FxHashMap::default()),
            waiting: Mutex::new(FxHashMap::default()),
            ready,
            done,
            prepared,
            epoch_closed,
            epochs_from: (0..ctx.nodes()).map(|_| AtomicU64::new(0)).collect(),
            epochs_complete: AtomicU64::new(0),
            epochs_seen: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            row_sizes: row_sizes.clone(),
            group: GroupSeat::new(Duration::from_millis(ctx.cfg.replication.stall_ms as u64)),
            pace: crate::runtime::Pace::of(&ctx.cfg, id),
            worker_time: Default::default(),
            ckpt,
            rebuild: Default::default(),
            to_install: Mutex::new(None),
            run_gate: RwLock::new(()),
            run: AtomicU64::new(0),
            ready_rx: ready_rx.clone(),
            this: std::sync::OnceLock::new(),
        });
        let _ = node.this.set(Arc::downgrade(&node));
        nodes[id.index()] = Some(node.clone());
        // The network thread first: with replication it carries the groups' elections.
        let n = node.clone();
        threads.push(spawn_worker(
            format!("c{}-net", id.0),
            false,
            0,
            move || n.serve_network(inbox),
        ));
        roles.push((node, epoch_closed_rx, prepared_rx, done_rx, ready_rx));
    }
    let calvin = Calvin {
        nodes,
        net: transport,
        threads: Mutex::new(threads),
        placement: ctx.placement.clone(),
    };
    if ctx.logged() {
        let local: Vec<&CalvinNode> = calvin.local().map(|n| &**n).collect();
        let joined = checkpoint::recover(&local, &calvin.net).and_then(|()| {
            match ctx.cfg.replication.layer {
                ReplicationLayer::Raft => calvin.join_groups(&ctx),
                ReplicationLayer::Zookeeper => calvin.join_zookeeper(&ctx),
            }
        });
        if let Err(e) = joined {
            calvin.shutdown();
            return Err(e);
        }
    }
    let pin = ctx.cfg.cluster.pin_threads;
    let workers = ctx.cfg.cluster.workers as usize;
    let mut threads = calvin.threads.lock();
    for (local, (node, epoch_closed_rx, prepared_rx, done_rx, ready_rx)) in
        roles.into_iter().enumerate()
    {
        let id = node.id;
        let core = |i: usize| local * workers.max(3) + i;
        let n = node.clone();
        threads.push(spawn_worker(
            format!("c{}-seq", id.0),
            pin,
            core(0),
            move || sequencer::run(&n, epoch_closed_rx),
        ));
        let n = node.clone();
        threads.push(spawn_worker(
            format!("c{}-sched", id.0),
            pin,
            core(1),
            move || scheduler::Scheduler::new(&n).run(prepared_rx, done_rx),
        ));
        for x in 0..executors(workers as u32) as usize {
            let (n, rx) = (node.clone(), ready_rx.clone());
            threads.push(spawn_worker(
                format!("c{}-x{x}", id.0),
                pin,
                core(2 + x),
                move || worker::Executor::new(&n).run(rx),
            ));
        }
    }
    drop(threads);
    Ok(Box::new(calvin))
}

struct Calvin {
    /// By node id; `None` for nodes other processes host.
    nodes: Vec<Option<Arc<CalvinNode>>>,
    net: Arc<dyn Transport<CMsg>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    placement: Arc<Placement>,
}

impl Calvin {
    fn local(&self) -> impl Iterator<Item = &Arc<CalvinNode>> {
        self.nodes.iter().flatten()
    }

    /// Replication: starts every local node's member of its replica group, and waits until
    /// every group has a leader.
    fn join_groups(&self, ctx: &EngineCtx) -> Result<(), QError> {
        let local = self.local().map(|n| {
            let applier: Arc<dyn Applier> = n.clone();
            (n.id, applier, &n.group.member)
        });
        replication::join_groups(ctx, local.collect(), |me| {
            let net = self.net.clone();
            Arc::new(move |to, msg| net.send(me, to, CMsg::Raft(msg)))
        })
    }

    /// Replication through ZooKeeper (Calvin's own design): every local node becomes a
    /// client of the ZooKeeper service, each group's log a sequence of znodes under this
    /// run's root (see [`ZkMember`]).
    fn join_zookeeper(&self, ctx: &EngineCtx) -> Result<(), QError> {
        let cfg = &ctx.cfg.replication;
        let root = zookeeper_root(ctx);
        for node in self.local() {
            let applier: Arc<dyn Applier> = node.clone();
            let member = ZkMember::start(
                node.id,
                ctx.placement.clone(),
                &cfg.zookeeper,
                &root,
                cfg.compression,
                applier,
            )
            .map_err(|e| {
                QError::Other(format!(
                    "{e} (--replication-layer zookeeper needs a ZooKeeper server at {}: \
                     scripts/zookeeper.sh start starts one)",
                    cfg.zookeeper
                ))
            })?;
            let _ = node.group.member.set(Box::new(member));
        }
        Ok(())
    }
}

/// Where a run's group logs live in ZooKeeper: under the cluster's id for servers of a
/// cluster file (every server must find the same root), under a root of its own for an
/// embedded run (its members share the process).
fn zookeeper_root(ctx: &EngineCtx) -> String {
    if ctx.is_distributed() {
        return format!("/qstore/cluster-{:016x}", ctx.cfg.cluster.cluster_id);
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!("/qstore/run-{:x}-{nanos:x}", std::process::id())
}

impl Engine for Calvin {
    /// `home` names a partition: its group's leader sequences the transaction.
    fn submit(&self, home: NodeId, req: TxnRequest) {
        let hosted = |n: NodeId| self.nodes[n.index()].is_some();
        let Some(leader) = replication::route(&self.placement, home, hosted, &req) else {
            return;
        };
        if let Some(node) = home_node(&self.nodes, leader, &req) {
            node.submit(req);
        }
    }

    fn net_counters(&self) -> Option<&NetCounters> {
        Some(self.net.counters())
    }

    /// The scheduler (the lock manager thread) and the executors: the threads the
    /// determinism study counts as Calvin's workers (the sequencer and the network thread
    /// are shared components there).
    fn worker_time(&self) -> Vec<(NodeId, crate::stages::StageTotals)> {
        self.local()
            .map(|n| (n.id, n.worker_time.totals()))
            .collect()
    }

    /// Every local node applied what its group's log holds, and finished every transaction
    /// it is home to (before clients come, those are the recovered log's).
    fn recovered(&self) -> bool {
        self.local().all(|n| {
            let applied = n.group.member.get().is_none_or(|m| m.settled());
            applied && n.home.lock().is_empty()
        })
    }

    fn shutdown(&self) {
        // Epochs go on while the transactions in flight finish: every node needs every
        // sequencer's epochs.
        let nodes: Vec<&CalvinNode> = self.local().map(|n| &**n).collect();
        shut_down(&nodes, &self.threads, QUIESCE_TIMEOUT);
        for node in self.local() {
            if let Some(m) = node.group.member.get() {
                m.stop();
            }
            if let Some(c) = &node.ckpt {
                c.stop();
            }
        }
    }
}
