//! The interactive skeleton with two-phase commit, shared by every non-deterministic protocol
//! (NO_WAIT, WAIT_DIE, DL_DETECT, H-Store, TIMESTAMP, MVCC, OCC, MaaT): they differ only in
//! their [`Cc`], the participant's side of a transaction's lifecycle.
//!
//! - A **coordinator** at the client's home node walks the transaction program. It sends the
//!   accesses of each partition to that partition's node (an RPC; a local call for its own
//!   partition) in *waves*: a wave holds, per partition and in program order, every access
//!   whose inputs are known (outputs of earlier waves, or of earlier accesses of the same
//!   group); independent partitions are reached in parallel, and a wave waits for all its
//!   answers. It keeps the transaction's state meanwhile; workers serve other transactions.
//! - A **participant** runs a group under its concurrency control, either **in place**
//!   (locking protocols: the rows themselves, with before-images) or **buffered** (timestamp
//!   and optimistic protocols: copies read under the row's latch, writes installed at
//!   commit); see [`Execution`]. An access that must wait parks the group (whatever ends the
//!   wait resumes it on a worker), one that is refused ends it.
//! - **Commit**: one participant commits in one phase, unless the protocol validates; several
//!   go through two-phase commit. A vote is yes, yes within a range of commit timestamps
//!   (the coordinator then commits at the smallest timestamp every range allows), read-only
//!   (it wrote nothing: it releases at once and drops out of the second phase) or no. The
//!   client is answered when every committing participant has acknowledged.
//! - **Aborts**: a concurrency-control abort or a failed integrity check aborts the
//!   transaction everywhere it ran (once the wave's answers are in); the client retries
//!   concurrency-control aborts after a randomised back-off, with the same age.
//!
//! The commit order the history records is the protocol's when it has one (its timestamps:
//! [`Cc::commit_order`]); otherwise a Lamport clock every message carries orders the
//! decisions: a transaction that reaches a record after another committed there has a later
//! clock, so the order (clock, node) agrees with the order of versions.

mod absent;
pub(crate) mod cached;
mod checkpoint;
mod coord;
mod deadlock;
mod msg;
mod part;
mod phases;
pub(crate) mod prewrites;
mod throttle;
mod wal;

pub(crate) use deadlock::WaitEdge;
pub(crate) use msg::{Age, Attempt, Fill, TabLease, TsRange, Vote};
pub(crate) use wal::NoteMap;

use self::coord::CoordTxn;
use self::msg::{Body, GroupEnd, IMsg};
use self::part::PartShard;
use crate::cluster::EngineCtx;
use crate::data_dir::fsync_policy;
use crate::exec::{RowCopy, RowInstall};
use crate::net::NodeNet;
use crate::protocol::shell::shut_down;
use crate::protocol::{admit, home_node, AdmissionQueue, Admitted, Engine, TxnRequest};
use crate::runtime::{spawn_worker, Pace};
use crate::stages::{StageClock, StageSnapshot, StageTotals};
use crate::worker_time::{during, enter, piece, Activity, WorkerTimes};
use crossbeam_channel::{bounded, unbounded, Receiver, Select, Sender};
use parking_lot::{Mutex, RwLock};
use qstore_core::txn::{Access, CcAbortCause};
use qstore_core::{Key, NodeId, QError, TableId, TxnId};
use qstore_net::{encoded_len, Envelope, NetCounters, Transport};
use qstore_storage::{PartitionStore, RowId};
use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

/// What a participant's concurrency control says about an access (or a reservation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Gate {
    Go,
    /// Queued: the transaction is resumed (and asked again) when the holder releases.
    Wait,
    Abort(CcAbortCause),
}

/// A buffered access, as a participant's concurrency control is asked about it: the attempt,
/// the row (`table`, `rid`), and whether the attempt writes it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RowAccess {
    pub txn: TxnId,
    pub at: Attempt,
    pub table: TableId,
    pub rid: RowId,
    pub write: bool,
}

/// How a participant runs a transaction's accesses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Execution {
    /// On the rows themselves, once [`Cc::access`] grants them, keeping before-images to
    /// undo an abort (locking protocols).
    InPlace,
    /// On private copies: a read copies the row under its latch, once [`Cc::read_copy`]
    /// allows it; a write changes the copy, which [`Cc::install`] puts in place at commit
    /// (timestamp ordering, optimistic protocols). An insert holds its key until the
    /// transaction ends and creates the row at commit ([`Cc::created`]). A delete is a
    /// write that installs a tombstone: the row keeps its slot and index entry, so readers
    /// ordered before it still find (and validate) the row, and readers after it meet the
    /// tombstone and see the key absent at the deleter's version.
    Buffered,
}

/// The concurrency control of one node's partition, as the skeleton sees it: the
/// participant's side of a transaction's lifecycle.
pub(crate) trait Cc: Send + Sync + 'static {
    /// What a transaction holds here (its locks, its reservation, its prewrites).
    type Held: Default + Send;

    /// How its participants run accesses.
    const EXECUTION: Execution = Execution::InPlace;

    /// Whether the protocol orders attempts by timestamp: only then does an attempt take one
    /// (otherwise its `Attempt::ts` is 0).
    const USES_TIMESTAMPS: bool = false;

    /// Whether the coordinator reserves every partition the transaction touches, one after
    /// the other in ascending order, before its first access (H-Store).
    const RESERVES_PARTITIONS: bool = false;

    /// Whether every access runs at the transaction's home node, whose concurrency control
    /// brings the records there first (LEAP moves their ownership): the transaction then
    /// has one participant and commits in one phase.
    const RUNS_AT_HOME: bool = false;

    /// How often [`Cc::tick`] runs, for protocols with timers of their own.
    const TICK: Option<Duration> = None;

    /// The node is up: `port` sends the protocol's own messages to peers and resumes
    /// waiting transactions (for protocols that exchange messages outside transactions).
    fn attach(&self, _port: Weak<dyn Port>) {}

    /// A message of the protocol's own ([`Port::send_peer`]) from node `from`, about `txn`.
    fn on_peer(&self, from: NodeId, _txn: TxnId, _msg: &[u8]) {
        tracing::warn!("node {from} sent a message this protocol does not use; ignored");
    }

    /// Every [`Cc::TICK`]: resends what went unanswered, expires what is stale.
    fn tick(&self) {}

    /// After a restart, before anything is served: the latest note of each record the log
    /// holds ([`Port::log_note`]), and how many times the node started before this start.
    fn recovered(&self, _notes: &NoteMap, _starts: u64) -> Result<(), QError> {
        Ok(())
    }

    /// Whether nothing of the protocol's own is under way here (LEAP: no transfer), so that
    /// the node may stop once its transactions are done too.
    fn settled(&self) -> bool {
        true
    }

    /// Whether a transaction with a single participant also goes through [`Cc::prepare`]
    /// (protocols that validate at commit); otherwise it commits in one phase.
    const VALIDATES: bool = false;

    /// Reserves the whole partition for `txn`. Asked again when a `Wait` is resumed.
    fn reserve(&self, _txn: TxnId, _at: &Attempt, _held: &mut Self::Held) -> Gate {
        Gate::Go
    }

    /// In place: may `txn` access record (`table`, `key`) (`write`: to change it)? Asked
    /// again when a `Wait` is resumed, so it must answer `Go` for what it granted.
    fn access(
        &self,
        _txn: TxnId,
        _at: &Attempt,
        _table: TableId,
        _key: Key,
        _write: bool,
        _held: &mut Self::Held,
    ) -> Gate {
        unreachable!("only protocols that execute in place are asked for access")
    }

    /// Buffered: may the attempt read the row (`a.write`: to change a copy of it, to be
    /// installed at commit)? On `Go`, the protocol has taken the copy to read from `copy`,
    /// under the row's latch. Asked again when a `Wait` is resumed.
    fn read_copy(&self, _a: &RowAccess, _held: &mut Self::Held, _copy: &mut RowCopy<'_>) -> Gate {
        unreachable!("only buffered protocols are asked for copies")
    }

    /// Buffered, at commit: puts the attempt's copy of the row in place through `row`, under
    /// the row's latch; transactions whose wait is over are added to `woken`.
    fn install(
        &self,
        _a: &RowAccess,
        _held: &mut Self::Held,
        _row: &mut RowInstall<'_>,
        _woken: &mut Vec<TxnId>,
    ) {
        unreachable!("only buffered protocols install copies")
    }

    /// Buffered, at commit: row `a.rid` was just created by the attempt's insert and is not
    /// yet visible to lookups; the protocol sets up its metadata as if the attempt had
    /// written it (at `a.at.ts`).
    fn created(&self, _a: &RowAccess) {}

    /// Buffered: what a committed read of a key found absent leaves for later inserts of the
    /// key to follow (see `absent`): its place in the protocol's order (by default its
    /// timestamp, for protocols that order attempts by timestamp), or 0 when the protocol
    /// needs none (its readers are protected while they run, OCC).
    fn absent_mark(&self, at: &Attempt) -> u64 {
        if Self::USES_TIMESTAMPS {
            at.ts
        } else {
            0
        }
    }

    /// Buffered: the attempt inserts a key that committed transactions read absent, the
    /// latest at `mark`: the protocol orders the attempt after them, or refuses the insert.
    /// By default, protocols that order attempts by timestamp refuse an insert older than
    /// the read (`timestamp_order`), as they refuse a write older than a row's reads.
    fn insert_after(
        &self,
        _txn: TxnId,
        at: &Attempt,
        _held: &mut Self::Held,
        mark: u64,
    ) -> Result<(), CcAbortCause> {
        if Self::USES_TIMESTAMPS && at.ts < mark {
            return Err(CcAbortCause::TimestampOrder);
        }
        Ok(())
    }

    /// Buffered: whether reads of absent keys are guarded; off only in the test that shows
    /// the history checker catches the phantoms the guards prevent.
    fn guards_absent_reads(&self) -> bool {
        true
    }

    /// The attempt's place in the serialization order, when the protocol fixes it: by
    /// default its timestamp, for protocols that order attempts by timestamp; otherwise the
    /// coordinator's Lamport clock places it at the decision.
    fn commit_order(&self, at: &Attempt) -> Option<u128> {
        Self::USES_TIMESTAMPS.then(|| u128::from(at.ts))
    }

    /// Buffered: the smallest commit timestamp the accesses `held` records allow (reported
    /// to the coordinator with each group's outputs, which commits at the largest floor of
    /// its participants unless the votes choose the timestamp); 0 when the protocol computes
    /// none during execution.
    fn commit_floor(&self, _held: &Self::Held) -> u64 {
        0
    }

    /// Phase one here, for a commit at `at.ts` as far as the coordinator knows it: `Yes`
    /// keeps what the transaction holds until the decision, `ReadOnly` (it wrote nothing
    /// here) releases it at once and skips phase two, `No` aborts it. By default a
    /// participant that wrote votes yes, one that did not read-only.
    fn prepare(
        &self,
        _txn: TxnId,
        _at: &Attempt,
        _held: &mut Self::Held,
        wrote: bool,
        _store: &PartitionStore,
    ) -> Vote {
        if wrote {
            Vote::Yes
        } else {
            Vote::ReadOnly
        }
    }

    /// Phase two reached this participant: `txn` commits at `at.ts` (for protocols that
    /// choose the commit timestamp at the decision, the one chosen). Called before its writes
    /// are installed and it is released.
    fn commit(&self, _txn: TxnId, _at: &Attempt, _held: &mut Self::Held) {}

    /// Coordinator side: this node's cache of rows read at other nodes, for protocols that
    /// keep one (Sundial; see [`cached`]).
    fn row_cache(&self) -> Option<&dyn cached::RowCache> {
        None
    }

    /// Buffered, for a fill the coordinator asked for: the lease of the row the last
    /// `read_copy` of `held` read.
    fn last_read_lease(&self, _held: &Self::Held) -> Option<cached::ReadLease> {
        None
    }

    /// The lease of read-mostly table `table` here, if it has one (see [`TabLease`]).
    fn tab_lease(&self, _table: TableId) -> Option<TabLease> {
        None
    }

    /// Renews, to reach commit timestamp `ts`, the lease of the version written at `wts` of
    /// row `rid`, which `txn` read from its coordinator's cache ([`cached`]).
    fn renew_cached(
        &self,
        _txn: TxnId,
        _table: TableId,
        _rid: RowId,
        _wts: u64,
        _ts: u64,
    ) -> Result<(), CcAbortCause> {
        Ok(())
    }

    /// Whether the timestamps this participant hands out must stay, across a restart, below
    /// what it hands out after it (Sundial's leases: its paper's section 3.5). With a log,
    /// a participant then votes only once its log bounds the commit timestamp (see
    /// `Node::keep_below_bound`).
    const BOUNDS_TIMESTAMPS: bool = false;

    /// How far past the commit timestamp that asked for it a lease may be extended here
    /// (Sundial's speculative extension): the bound a log keeps must cover that too.
    const LEASE_REACH: u64 = 0;

    /// After a restart, before anything is served: every timestamp handed out before it is
    /// below `bound` ([`Cc::BOUNDS_TIMESTAMPS`]).
    fn restarted_below(&self, _bound: u64) {}

    /// Whether the coordinator skips the commit protocol (measurement only: the upper bound
    /// on what two-phase commit costs, as the determinism study measures it): once every
    /// access ran, it tells every participant to commit, as it does a single participant,
    /// without a prepare round (no votes, no decision logged). It still answers the client
    /// once every participant installed (a commit acknowledgement is the message that says
    /// so, and the history learns each participant's writes from it). Atomicity across
    /// failures is gone; locks are still held until each participant's commit, so the
    /// history stays serializable when nothing fails. Refused with a data directory.
    fn skips_commit_protocol(&self) -> bool {
        false
    }

    /// Whether transactions wait on any conflict, so that a detector must find and break
    /// deadlocks (see [`deadlock`]).
    fn detects_deadlocks(&self) -> bool {
        false
    }

    /// Deadlock detection: every transaction waiting here, with what it waits for.
    fn waits_for(&self, _out: &mut Vec<WaitEdge>) {}

    /// Deadlock detection: if `txn` waits here, it stops waiting, and is refused
    /// (`Deadlock`) when it asks again; true if it was waiting. Transactions whose wait ended
    /// with it (queued behind it) are added to `woken`.
    fn abort_waiter(&self, _txn: TxnId, _woken: &mut Vec<TxnId>) -> bool {
        false
    }

    /// Releases everything `txn` holds here; the transactions whose wait is over are added
    /// to `woken`.
    fn release(&self, txn: TxnId, held: &mut Self::Held, woken: &mut Vec<TxnId>);
}

/// What a node offers a concurrency control that talks to its peers (see [`Cc::attach`]).
pub(crate) trait Port: Send + Sync {
    /// Sends `msg`, in the protocol's own encoding, about `txn` to node `to` (to this node:
    /// handled at once, so call it holding none of the protocol's locks).
    fn send_peer(&self, to: NodeId, txn: TxnId, msg: Vec<u8>);
    /// Resumes transactions whose wait ended.
    fn wake(&self, txns: Vec<TxnId>);
    /// With a data directory: appends the protocol's note `state` about record `r` (the
    /// latest one of each record is handed back at recovery, [`Cc::recovered`]; empty: none
    /// is kept), with the record's new image here when it moved in (`Some(Some(row))`) or
    /// out (`Some(None)`), put back by recovery in the log's order with the commits'
    /// (protocols that order commits by timestamp cannot move rows). Where it is in the
    /// log; `None` without a log, or if the log failed.
    fn log_note(
        &self,
        r: (TableId, Key),
        state: &[u8],
        image: Option<Option<&[u8]>>,
    ) -> Option<u64>;
    /// Where the last record appended to the log is (`None`: none, or no log).
    fn log_written(&self) -> Option<u64>;
    /// Sends `msgs` ([`Port::send_peer`]) once the log is on disk up to record `lsn`.
    fn send_peer_after(&self, lsn: u64, msgs: Vec<(NodeId, TxnId, Vec<u8>)>);
}

impl<C: Cc> Port for Node<C> {
    fn send_peer(&self, to: NodeId, txn: TxnId, msg: Vec<u8>) {
        self.send(to, txn, Body::Peer(msg));
    }

    fn log_note(
        &self,
        r: (TableId, Key),
        state: &[u8],
        image: Option<Option<&[u8]>>,
    ) -> Option<u64> {
        self.append_note(r, state, image)
    }

    fn log_written(&self) -> Option<u64> {
        qstore_log::RecordLog::next_lsn(&self.wal.as_ref()?.log).checked_sub(1)
    }

    fn send_peer_after(&self, lsn: u64, msgs: Vec<(NodeId, TxnId, Vec<u8>)>) {
        self.send_when_durable(lsn, msgs)
    }

    fn wake(&self, txns: Vec<TxnId>) {
        self.wake_all(txns);
    }
}

/// How far behind node `id`'s clock runs (the injected skew, `net.clock_skew_us`).
fn clock_behind_us(ctx: &EngineCtx, id: NodeId) -> u64 {
    let last = u64::from(ctx.nodes().saturating_sub(1).max(1));
    ctx.cfg.net.clock_skew_us * u64::from(id.0).min(last) / last
}

/// Idle workers wake this often to notice shutdown.
const IDLE_WAIT: Duration = Duration::from_millis(20);

/// How long shutdown waits for transactions in flight to finish everywhere.
const QUIESCE_TIMEOUT: Duration = Duration::from_secs(2);

/// Starts an interactive protocol whose concurrency control, per node, `make_cc` builds.
pub(crate) fn start<C: Cc>(
    ctx: Arc<EngineCtx>,
    make_cc: impl Fn(&PartitionStore) -> C,
    label: &str,
) -> Result<Box<dyn Engine>, QError> {
    let NodeNet { transport, inboxes } = crate::net::open::<IMsg>(&ctx)?;
    let mut nodes: Vec<Option<Arc<Node<C>>>> = (0..ctx.nodes()).map(|_| None).collect();
    let mut threads = Vec::new();
    let mut hosted = Vec::new();
    let mut recovered = Vec::new();
    for (id, inbox) in inboxes {
        let cc = make_cc(ctx.server_store(id));
        let (wal, to_sync) = match &ctx.data_dirs[id.index()] {
            Some(dir) => {
                let (wal, rx) =
                    wal::Wal::open(&dir.wal(), &dir.checkpoint(), fsync_policy(&ctx.cfg))?;
                dir.add_log(wal.stats_reader());
                (Some(wal), Some(rx))
            }
            None => (None, None),
        };
        let (admission, requests) = bounded(ctx.cfg.protocol.admission_queue as usize);
        let (wake_tx, wakeups) = unbounded();
        let (durable_tx, durable) = unbounded();
        // Node 0 runs the deadlock detector of protocols that need one.
        let (detector, answers) = if id.0 == 0 && cc.detects_deadlocks() {
            let (tx, rx) = unbounded();
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        let node = Arc::new(Node {
            id,
            ctx: ctx.clone(),
            net: transport.clone(),
            cc,
            clock: AtomicU64::new(0),
            timestamps: crate::timestamp::TsSource::behind(id, clock_behind_us(&ctx, id)),
            coords: Shards::new(),
            parts: Shards::new(),
            absent: Default::default(),
            wake_tx,
            admission: RwLock::new(Some(admission)),
            stop: AtomicBool::new(false),
            detector,
            phases: StageClock::per_transaction(phases::PHASES),
            worker_time: WorkerTimes::default(),
            wal,
            durable_tx,
            decided: Mutex::default(),
            bound: AtomicU64::new(0),
            raising_bound: Mutex::default(),
            pace: Pace::of(&ctx.cfg, id),
            throttle: ctx
                .cfg
                .protocol
                .throttle
                .then(|| throttle::Throttle::new(id.0.wrapping_mul(0x9e37_79b9) ^ 0x5bd1)),
        });
        let port: Weak<dyn Port> = Arc::downgrade(&node) as Weak<Node<C>>;
        node.cc.attach(port);
        let mut r = node.recover()?;
        if node.wal.is_some() {
            node.cc.recovered(&r.folded.notes, r.folded.starts)?;
        }
        *node.decided.lock() = std::mem::take(&mut r.folded.decided);
        node.bound.store(r.folded.bound, Ordering::Release);
        recovered.push(r);
        nodes[id.index()] = Some(node.clone());
        let queues = Queues {
            wakeups,
            durable,
            inbox,
            requests,
        };
        hosted.push((node, queues, answers, to_sync));
    }
    // Nothing is served before every transaction in doubt here is settled.
    let pairs: Vec<_> = hosted
        .iter()
        .map(|(n, q, ..)| (n.clone(), q.inbox.clone()))
        .collect();
    let stashed = wal::settle_in_doubt(&pairs, recovered)?;
    for (node, ..) in hosted.iter().filter(|(n, ..)| n.wal.is_some()) {
        // After the transactions in doubt installed their writes at their own timestamps.
        node.cc.restarted_below(node.bound.load(Ordering::Acquire));
    }
    let workers = ctx.cfg.cluster.workers as usize;
    for (local, ((node, queues, answers, syncer), stash)) in
        hosted.into_iter().zip(stashed).enumerate()
    {
        if let Some(answers) = answers {
            let n = node.clone();
            threads.push(spawn_named(format!("{label}-deadlocks"), move || {
                deadlock::detector(n, answers)
            })?);
        }
        if let Some(to_sync) = syncer {
            let n = node.clone();
            threads.push(spawn_named(format!("{label}{}-wal", n.id.0), move || {
                n.sync_loop(to_sync)
            })?);
            if let Some(every) = ctx.cfg.durability.checkpoint_interval() {
                let n = node.clone();
                threads.push(spawn_named(format!("{label}{}-ckpt", n.id.0), move || {
                    n.checkpoint_loop(every)
                })?);
            }
        }
        for env in stash {
            node.handle(env.from, env.msg);
        }
        if let Some(every) = C::TICK {
            let n = node.clone();
            threads.push(spawn_named(format!("{label}{}-tick", n.id.0), move || {
                while !n.stop.load(Ordering::Acquire) {
                    std::thread::sleep(every);
                    n.cc.tick();
                }
            })?);
        }
        for w in 0..workers {
            let (n, q) = (node.clone(), queues.clone());
            let pin = ctx.cfg.cluster.pin_threads;
            threads.push(spawn_worker(
                format!("{label}{}-w{w}", node.id.0),
                pin,
                local * workers + w,
                move || n.work(q),
            ));
        }
    }
    Ok(Box::new(Interactive {
        nodes,
        net: transport,
        threads: Mutex::new(threads),
    }))
}

struct Interactive<C: Cc> {
    /// By node id; `None` for nodes other processes host.
    nodes: Vec<Option<Arc<Node<C>>>>,
    net: Arc<dyn Transport<IMsg>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl<C: Cc> Engine for Interactive<C> {
    fn submit(&self, home: NodeId, req: TxnRequest) {
        if let Some(node) = home_node(&self.nodes, home, &req) {
            let history = node.ctx.history.as_deref();
            admit(node.admission.read().as_ref(), home, req, None, history);
        }
    }

    fn net_counters(&self) -> Option<&NetCounters> {
        Some(self.net.counters())
    }

    fn stages(&self) -> Option<StageSnapshot> {
        let mut nodes = self.nodes.iter().flatten().map(|n| n.phases.snapshot());
        let mut all = nodes.next()?;
        for s in nodes {
            all.merge(&s);
        }
        Some(all)
    }

    fn worker_time(&self) -> Vec<(NodeId, StageTotals)> {
        let nodes = self.nodes.iter().flatten();
        nodes.map(|n| (n.id, n.worker_time.totals())).collect()
    }

    fn shutdown(&self) {
        let nodes: Vec<&Node<C>> = self.nodes.iter().flatten().map(|n| &**n).collect();
        shut_down(&nodes, &self.threads, QUIESCE_TIMEOUT);
        for n in nodes {
            if let Some(wal) = &n.wal {
                if n.ctx.cfg.durability.checkpoint_interval().is_some() {
                    n.checkpoint_and_report();
                }
                wal.report(n.id);
            }
        }
    }
}

/// Starts a thread of the protocol's own (not a worker).
fn spawn_named(name: String, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>, QError> {
    std::thread::Builder::new()
        .name(name.clone())
        .spawn(f)
        .map_err(|e| QError::Other(format!("cannot start thread {name}: {e}")))
}

/// The queues a worker serves, most urgent first: resumed waits (they hold locks others
/// wait for), work whose log record is on disk (it holds them too), messages from other
/// nodes, then new client transactions.
#[derive(Clone)]
struct Queues {
    wakeups: Receiver<TxnId>,
    durable: Receiver<wal::Durable>,
    inbox: Receiver<Envelope<IMsg>>,
    requests: Receiver<Admitted>,
}

/// One node: coordinator of the transactions submitted here, participant for its partition.
pub(crate) struct Node<C: Cc> {
    id: NodeId,
    ctx: Arc<EngineCtx>,
    net: Arc<dyn Transport<IMsg>>,
    cc: C,
    /// Lamport clock: merged from every message received, ticked by every commit decision.
    clock: AtomicU64,
    /// Timestamps of the attempts coordinated here.
    timestamps: crate::timestamp::TsSource,
    coords: Shards<FxHashMap<TxnId, Arc<Mutex<CoordTxn>>>>,
    parts: Shards<PartShard<C::Held>>,
    /// Guards of keys without a row: held by inserts, read absent (buffered execution
    /// only).
    absent: absent::AbsentKeys,
    /// Transactions whose wait ended, to be resumed by a worker (never inline: resuming runs
    /// a transaction that may release and wake others, without bound).
    wake_tx: Sender<TxnId>,
    admission: RwLock<Option<AdmissionQueue>>,
    stop: AtomicBool,
    /// At node 0 of a protocol that detects deadlocks: where the nodes' edges go.
    detector: Option<Sender<deadlock::Answer>>,
    /// Time and traffic per phase of the transactions coordinated here.
    phases: StageClock,
    /// Where the workers' time goes (see `activity_of` and the participant's accesses).
    worker_time: WorkerTimes,
    /// With a data directory: the node's write-ahead log.
    wal: Option<wal::Wal>,
    /// Where the syncer hands back work whose record is on disk.
    durable_tx: Sender<wal::Durable>,
    /// After a restart: the commit decisions of transactions coordinated here before it
    /// that a participant may still ask about (see `wal`).
    decided: Mutex<FxHashMap<TxnId, u64>>,
    /// With a log, for protocols whose timestamps must outlive a restart: the bound on them
    /// the log holds (see `Node::keep_below_bound`), and who raises it.
    bound: AtomicU64,
    raising_bound: Mutex<()>,
    /// The slow node's pace, if it is the slow node.
    pace: Option<Pace>,
    /// With `protocol.throttle`: refuses local transactions while the node falls behind.
    throttle: Option<throttle::Throttle>,
}

impl<C: Cc> Node<C> {
    fn work(&self, q: Queues) {
        // A piece (a message, a step of a transaction) takes a lock per access: sampled.
        let _accounted = self.worker_time.attach(crate::worker_time::DETAIL);
        while !self.stop.load(Ordering::Acquire) {
            piece(Activity::Other);
            let began = Pace::begin(&self.pace);
            if let Ok(txn) = q.wakeups.try_recv() {
                self.resume(txn);
            } else if let Ok(d) = q.durable.try_recv() {
                // What waited for the log is a vote or a commit.
                during(Activity::TwoPhaseCommit, || self.on_durable(d));
            } else if let Ok(env) = q.inbox.try_recv() {
                self.handle(env.from, env.msg);
            } else if let Ok(Admitted { req, .. }) = q.requests.try_recv() {
                self.begin(req);
            } else {
                // Every transaction here waits for a lock or a message (or there is none).
                during(Activity::Idle, || self.wait_for_work(&q));
                continue;
            }
            Pace::end(&self.pace, began);
        }
    }

    /// Blocks until one of the queues has something (or a while has passed).
    fn wait_for_work(&self, q: &Queues) {
        let mut sel = Select::new();
        sel.recv(&q.wakeups);
        sel.recv(&q.durable);
        sel.recv(&q.inbox);
        sel.recv(&q.requests);
        let _ = sel.ready_timeout(IDLE_WAIT);
    }

    fn handle(&self, from: NodeId, msg: IMsg) {
        let _in = enter(activity_of(&msg.body));
        self.clock.fetch_max(msg.clock, Ordering::AcqRel);
        // The coordinator accounts the answers it receives from other nodes (for the
        // transactions whose phases it measures).
        let received = match msg.body {
            Body::Reserved
            | Body::Executed { .. }
            | Body::Vote(_)
            | Body::TabLeases(_)
            | Body::CommitAck
                if from != self.id && phases::measured(msg.txn) =>
            {
                encoded_len(&msg)
            }
            _ => 0,
        };
        let txn = msg.txn;
        match msg.body {
            Body::Reserve { at } => self.on_reserve(from, txn, at),
            Body::Exec {
                at,
                accesses,
                inputs,
                fill,
            } => match self.misplaced(&accesses) {
                None => {
                    let group = part::Group::Remote(accesses, fill);
                    self.on_exec(from, txn, at, group, inputs)
                }
                Some(why) => {
                    tracing::warn!("node {from} sent transaction {txn:?} an access {why}");
                    let end = GroupEnd::LogicAbort(format!("invalid access: {why}"));
                    let body = Body::Executed {
                        outputs: Vec::new(),
                        end,
                        wrote: false,
                        floor: 0,
                        fills: Vec::new(),
                    };
                    self.send(from, txn, body);
                }
            },
            Body::Prepare { ts, renew } => self.on_prepare(from, txn, ts, renew),
            Body::Commit { ts } => self.on_commit(txn, ts),
            Body::Abort => self.on_abort(txn),
            Body::Reserved => self.on_reserved(from, txn, received),
            Body::Executed {
                outputs,
                end,
                wrote,
                floor,
                fills,
            } => {
                let ran = part::Ran {
                    end,
                    wrote,
                    floor,
                    fills,
                };
                self.on_executed(from, txn, outputs, ran, received)
            }
            Body::Vote(v) => self.on_vote(from, txn, v, received),
            Body::TabLeases(leases) => self.take_tab_leases(from, &leases),
            Body::CommitAck => self.on_commit_ack(from, txn, received),
            Body::WaitsForRequest { round } => self.on_waits_for_request(from, round),
            Body::WaitsFor { round, edges } => self.on_waits_for(round, edges),
            Body::Victim { txn } => self.on_victim(txn),
            Body::Resolve => self.on_resolve(from, txn),
            Body::Peer(msg) => self.cc.on_peer(from, txn, &msg),
        }
    }

    /// Why an access a peer sent cannot run here, if it cannot: its table does not exist, or
    /// its record lives on another node.
    fn misplaced(&self, accesses: &[(u16, Access)]) -> Option<String> {
        let tables = self.ctx.catalog.tables.len();
        accesses.iter().find_map(|(_, a)| {
            if a.table as usize >= tables {
                Some(format!("to table {}, which does not exist", a.table))
            } else if self.node_of(a.table, a.key) != self.id {
                Some(format!("to key {}, which is not on this node", a.key))
            } else {
                None
            }
        })
    }

    /// Sends `body` about `txn` to node `to`; to this node it is handled at once.
    fn send(&self, to: NodeId, txn: TxnId, body: Body) {
        let _in = enter(activity_of(&body));
        let msg = IMsg {
            txn,
            clock: self.clock.load(Ordering::Acquire),
            body,
        };
        if to == self.id {
            self.handle(to, msg);
        } else {
            self.net.send(self.id, to, msg);
        }
    }

    /// The size on the wire of a message about `txn` saying `body`.
    fn wire_size(&self, txn: TxnId, body: &Body) -> usize {
        // Postcard encodes a struct as the tuple of its fields.
        encoded_len(&(txn, self.clock.load(Ordering::Relaxed), body))
    }

    /// A new position in the commit order.
    fn tick(&self) -> u128 {
        let t = self.clock.fetch_add(1, Ordering::AcqRel) + 1;
        ((t as u128) << 32) | self.id.0 as u128
    }

    fn store(&self) -> &PartitionStore {
        self.ctx.server_store(self.id)
    }

    /// The node that runs the accesses to record (`table`, `key`): its partition's, or this
    /// one for protocols that bring records home ([`Cc::RUNS_AT_HOME`]).
    fn node_of(&self, table: TableId, key: Key) -> NodeId {
        if C::RUNS_AT_HOME {
            return self.id;
        }
        self.ctx.node_of(self.ctx.pmap.partition_of(table, key))
    }
}

/// What sending or handling a message is, in the determinism study's breakdown of a worker's
/// time: the commit protocol's messages (an abort's too) are two-phase commit, the
/// detector's are deadlock handling; the rest (accesses sent and answered) is the
/// coordinator's and participant's bookkeeping, within which the accesses themselves are
/// useful work and their locks lock acquisition (see `part`).
fn activity_of(body: &Body) -> Activity {
    match body {
        Body::Prepare { .. }
        | Body::Vote(_)
        | Body::Commit { .. }
        | Body::CommitAck
        | Body::Abort
        | Body::Resolve => Activity::TwoPhaseCommit,
        Body::WaitsForRequest { .. } | Body::WaitsFor { .. } | Body::Victim { .. } => {
            Activity::Deadlock
        }
        Body::Reserve { .. }
        | Body::Reserved
        | Body::Exec { .. }
        | Body::Executed { .. }
        | Body::TabLeases(_)
        | Body::Peer(_) => Activity::Other,
    }
}

/// State keyed by transaction id, split over independently locked shards so that workers
/// handling different transactions rarely contend.
struct Shards<S> {
    shards: Box<[Mutex<S>]>,
}

const SHARDS: usize = 64;

impl<S: Default> Shards<S> {
    fn new() -> Self {
        Shards {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
        }
    }

    fn shard(&self, txn: TxnId) -> &Mutex<S> {
        // Fibonacci hashing: transaction ids differ mostly in their low bits.
        let h = txn.0.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 58;
        &self.shards[h as usize % SHARDS]
    }

    fn all(&self) -> impl Iterator<Item = &Mutex<S>> {
        self.shards.iter()
    }
}
