//! A Q-Store node: its workers (planner + executor), its network thread, and the commit of
//! the batches its planners made.

use super::batch::{Batches, Claim};
use super::msg::{Eq, FateInfo, FateNote, FragRef, Op, Output, Outputs, QMsg, TxnPos};
use super::plan::{BatchPlan, QueueShape};
use super::replica::{LogGate, LoggedBatch, LoggedFate, LoggedPlan, TxnContext};
use super::spec::{Finalized, PlannerBatch, RecordKey, Speculation};
use super::writes::{self, Written};
use crate::cluster::EngineCtx;
use crate::exec::{run_access, Lookahead, TxnScratch, UndoLog};
use crate::history::{HistoryRecorder, TxnTrace};
use crate::net::NodeNet;
use crate::protocol::checkpoint::{self, Checkpointer, Recovers};
use crate::protocol::shell::{shut_down, LogPosition, NodeShell};
use crate::protocol::{
    admit, home_node, reply, settle, AdmissionQueue, Admitted, Ending, Engine, TxnRequest,
};
use crate::replication::rebuild::{self, CopyFor, Phase, RebuildMsg, Rebuilder, Seat};
use crate::replication::{self, Applier, Dedup, GroupMember, StallWatch};
use crate::runtime::{spawn_worker, Pace};
use crate::stages::{StageClock, StageSnapshot};
use crate::worker_time::{during, enter, piece, Activity, WorkerTimes};
use crossbeam_channel::{bounded, Receiver, RecvTimeoutError};
use crossbeam_utils::CachePadded;
use parking_lot::{Condvar, Mutex, MutexGuard, RwLock};
use qstore_core::config::{Isolation, QStoreMode, ReplicationMode};
use qstore_core::placement::Placement;
use qstore_core::txn::{
    AccessRef, CcAbortCause, ProcCall, Program, RowRef, TxnKey, TxnOutcome, Value, EMPTY_PROGRAM,
    KEY_NOT_FOUND,
};
use qstore_core::{NodeId, PartitionId, QError, TableId, TxnId};
use qstore_net::{Envelope, NetCounters, Transport};
use qstore_storage::RowVersion;
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The stages of a transaction's life at its home node, as the results report them.
const STAGES: &[&str] = &[
    // From its arrival at the node until its planner took it into a batch.
    "admission",
    // Planning its batch: placing every transaction's fragments in execution queues.
    "planning",
    // From the plan until the first of the batch's queues on its home node started.
    "queue wait",
    // From then until the last of those queues finished.
    "execution",
    // From then (or from the plan, with no queue at home) until every node acknowledged.
    "acknowledgement",
    // Replication: from then until its batch was committed in the group's log too.
    "replication",
    // From then until its answer was sent.
    "answer",
];
/// One transaction in this many has its admission timed, and one planner batch in this many
/// its other stages: a clock read is a visible cost next to a batch of one.
const STAGE_SAMPLE: u64 = 8;
const ADMISSION: usize = 0;
const PLANNING: usize = 1;
const QUEUE_WAIT: usize = 2;
const EXECUTION: usize = 3;
const ACKNOWLEDGEMENT: usize = 4;
const REPLICATION: usize = 5;
const ANSWER: usize = 6;

/// Longest pause of an instance copying its partitions for a stale one that its stall watch
/// lets pass (a copy of a million rows takes about half a second here).
const MAX_COPY_PAUSE: Duration = Duration::from_secs(60);

/// How long shutdown waits for batches in flight to be decided everywhere.
const QUIESCE_TIMEOUT: Duration = Duration::from_secs(2);

/// Longest sleep of an idle worker between checks (notifications usually come first).
const IDLE_WAIT: Duration = Duration::from_millis(5);

/// Most steps (plans or queue runs) a submitting thread takes on an idle node before it
/// leaves the rest to the workers.
const INLINE_STEPS: usize = 32;

thread_local! {
    /// Scratch space of a thread that runs transactions inline, kept between its calls.
    static INLINE_SCRATCH: std::cell::RefCell<TxnScratch> = Default::default();
    /// Whether this thread is running transactions inline: it wakes the node's threads once
    /// at the end, if it leaves them anything, rather than at every step.
    static INLINE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Requests this thread submitted, for sampling their admission times.
    static SUBMITTED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

pub fn start(ctx: Arc<EngineCtx>) -> Result<Box<dyn Engine>, QError> {
    let NodeNet { transport, inboxes } = crate::net::open::<QMsg>(&ctx)?;
    let mut nodes: Vec<Option<Arc<QNode>>> = (0..ctx.servers()).map(|_| None).collect();
    let mut threads = Vec::new();
    let pin = ctx.cfg.cluster.pin_threads;
    for (local, (id, inbox)) in inboxes.into_iter().enumerate() {
        let ckpt = Checkpointer::open(&ctx, id, "qstore-checkpoints", "batch")?;
        let node = Arc::new(QNode::new(id, ctx.clone(), transport.clone(), ckpt));
        let _ = node.this.set(Arc::downgrade(&node));
        nodes[id.index()] = Some(node.clone());
        let n = node.clone();
        threads.push(spawn_worker(
            format!("q{}-net", node.id.0),
            false,
            0,
            move || n.serve_network(inbox),
        ));
        let q = &ctx.cfg.protocol.qstore;
        let workers = ctx.cfg.cluster.workers as usize;
        let planners = q.planners_per_node(workers as u32) as usize;
        // Thread roles: workers execute and, unless planners are dedicated, the first
        // `planners` of them also plan; dedicated planners only plan.
        let mut roles: Vec<(String, Option<usize>, bool)> = (0..workers)
            .map(|w| {
                let plans = (!q.dedicated_planners && w < planners).then_some(w);
                (format!("q{}-w{w}", node.id.0), plans, true)
            })
            .collect();
        if q.dedicated_planners {
            roles.extend((0..planners).map(|p| (format!("q{}-p{p}", node.id.0), Some(p), false)));
        }
        for (i, (name, plans, executes)) in roles.into_iter().enumerate() {
            let n = node.clone();
            let core = local * workers + i;
            threads.push(spawn_worker(name, pin, core, move || {
                n.work(i, plans, executes)
            }));
        }
    }
    let qstore = QStore {
        nodes,
        net: transport,
        threads: Mutex::new(threads),
        placement: ctx.placement.clone(),
    };
    qstore.recover()?;
    if ctx.logged() {
        qstore.join_groups(&ctx)?;
    }
    Ok(Box::new(qstore))
}

struct QStore {
    /// By node id; `None` for nodes other processes host.
    nodes: Vec<Option<Arc<QNode>>>,
    net: Arc<dyn Transport<QMsg>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    placement: Arc<Placement>,
}

impl QStore {
    /// The node that takes a request for partition `home`: its group's leader, if hosted
    /// here (else the request is answered).
    fn taker(&self, home: NodeId, req: &TxnRequest) -> Option<&Arc<QNode>> {
        let hosted = |n: NodeId| self.nodes[n.index()].is_some();
        let leader = replication::route(&self.placement, home, hosted, req)?;
        home_node(&self.nodes, leader, req)
    }

    fn local(&self) -> impl Iterator<Item = &Arc<QNode>> {
        self.nodes.iter().flatten()
    }

    /// Durability: every local node with a data directory restores the checkpoint every
    /// node holds (see `protocol::checkpoint`), and then lets queues run.
    fn recover(&self) -> Result<(), QError> {
        let nodes: Vec<&QNode> = self.local().map(|n| &**n).collect();
        checkpoint::recover(&nodes, &self.net)?;
        for n in nodes {
            let Some(c) = &n.ckpt else { continue };
            let mut state = n.state.lock();
            state.batches.hold_from(c.hold_from());
            state.batches.event();
            n.settle(state);
        }
        Ok(())
    }

    /// Replication: starts every local node's member of its replica group, and waits until
    /// every group has a leader.
    fn join_groups(&self, ctx: &EngineCtx) -> Result<(), QError> {
        let local = self.local().map(|n| {
            let applier: Arc<dyn Applier> = n.clone();
            (n.id, applier, &n.member)
        });
        replication::join_groups(ctx, local.collect(), |me| {
            let net = self.net.clone();
            Arc::new(move |to, msg| net.send(me, to, QMsg::Raft(msg)))
        })
    }

    fn stop_groups(&self) {
        for node in self.local() {
            if let Some(m) = node.member.get() {
                m.stop();
            }
        }
    }
}

impl Engine for QStore {
    /// `home` names a partition: its group's leader takes the transaction.
    fn submit(&self, home: NodeId, req: TxnRequest) {
        if let Some(node) = self.taker(home, &req) {
            node.submit([req]);
        }
    }

    /// Requests that go to the same node (normally all: one group's leader) are queued
    /// together, so that an idle node plans them as one batch.
    fn submit_all(&self, home: NodeId, reqs: Vec<TxnRequest>) {
        let mut run: Vec<TxnRequest> = Vec::with_capacity(reqs.len());
        let mut taker: Option<&Arc<QNode>> = None;
        for req in reqs {
            let Some(node) = self.taker(home, &req) else {
                continue;
            };
            if let Some(t) = taker.filter(|t| !Arc::ptr_eq(t, node)) {
                t.submit(run.drain(..));
            }
            taker = Some(node);
            run.push(req);
        }
        if let Some(t) = taker {
            t.submit(run);
        }
    }

    fn net_counters(&self) -> Option<&NetCounters> {
        Some(self.net.counters())
    }

    fn stages(&self) -> Option<StageSnapshot> {
        let mut nodes = self.local().map(|n| n.stages.snapshot());
        let mut all = nodes.next()?;
        for s in nodes {
            all.merge(&s);
        }
        Some(all)
    }

    fn worker_time(&self) -> Vec<(NodeId, crate::stages::StageTotals)> {
        self.local()
            .map(|n| (n.id, n.worker_time.totals()))
            .collect()
    }

    fn shutdown(&self) {
        let nodes: Vec<&QNode> = self.local().map(|n| &**n).collect();
        shut_down(&nodes, &self.threads, QUIESCE_TIMEOUT);
        self.stop_groups();
        for c in self.local().filter_map(|n| n.ckpt.as_ref()) {
            c.stop();
        }
    }
}

/// A planner: its client transaction queue and where it is in the batch sequence. One thread
/// at a time plans with it (holding `plan`); others read `next_batch`.
struct Planner {
    queue: Receiver<Admitted>,
    next_batch: AtomicU64,
    /// Batches below this one have their plans installed here (behind `next_batch` while a
    /// synchronously replicated plan waits for its log, and on followers, which deliver what
    /// their group's log commits).
    delivered: AtomicU64,
    /// When the batch being filled was opened.
    opened: Mutex<Instant>,
    /// Its execution queues and planning scratch, reused from batch to batch.
    plan: Mutex<BatchPlan>,
}

/// A transaction this node planned, waiting for its outputs.
struct HomeTxn {
    id: TxnId,
    /// The client's name for it (see `Dedup`).
    key: TxnKey,
    /// The client's request, at the member that planned it (other members commit the
    /// transaction in their instance and answer no one).
    req: Option<TxnRequest>,
    /// Accesses in its program: the length of its answer's outputs.
    n_accesses: u16,
    may_abort: bool,
    /// A transaction another member planned: its call, when the log carries it (replication
    /// point 1, or histories kept: every instance records what it runs).
    call: Option<Arc<ProcCall>>,
    /// Replication point 3, a transaction another member ran: how it ended there.
    fate: Option<LoggedFate>,
}

/// What a node knows of the fate of a transaction that may abort.
#[derive(Default)]
struct TxnFate {
    needed: u16,
    passed: u16,
    aborted: Option<String>,
    decided: bool,
    /// Before-images of its writes here, until decided.
    undo: Vec<UndoLog>,
    /// Records it wrote here (marked dirty until decided).
    written: Vec<(TableId, u64)>,
}

/// Whether a fragment can run now.
enum Ready {
    Run,
    /// Its transaction is already known to abort: skip it.
    Skip,
    /// It needs a value not here yet, or a record an undecided transaction wrote; the event
    /// count when that was seen.
    Wait(u64),
}

/// When a planner batch reached each stage, at its home.
#[derive(Clone, Copy)]
struct BatchClock {
    planning: Instant,
    planned: Instant,
    /// Its first and last queue at home: started, finished.
    first_claim: Option<Instant>,
    last_finish: Option<Instant>,
}

impl BatchClock {
    /// The stage times of a batch decided at `decided`, committed in its log (or not
    /// replicated) by `logged`, and answered by `answered`.
    fn stages(
        &self,
        decided: Instant,
        logged: Instant,
        answered: Instant,
    ) -> [(usize, Duration); 6] {
        let executed = self.last_finish.unwrap_or(self.planned);
        let started = self.first_claim.unwrap_or(executed);
        [
            (PLANNING, self.planned - self.planning),
            (QUEUE_WAIT, started.saturating_duration_since(self.planned)),
            (EXECUTION, executed.saturating_duration_since(started)),
            (ACKNOWLEDGEMENT, decided.saturating_duration_since(executed)),
            (REPLICATION, logged.saturating_duration_since(decided)),
            (ANSWER, answered.saturating_duration_since(logged)),
        ]
    }
}

/// A batch one of this node's planners made, until every queue it filled has run.
struct HomeBatch {
    txns: Vec<HomeTxn>,
    /// When it reached each stage, if it is in the sample.
    clock: Option<BatchClock>,
    acks_pending: u32,
    /// The nodes its queues went to.
    involved: Vec<NodeId>,
    /// Speculative mode: what those nodes reported about its transactions' fates.
    notes: Vec<FateNote>,
    /// The access outputs those nodes acknowledged with, gathered per transaction only when
    /// the batch is answered.
    outputs: Outputs,
    /// Replication point 3, at the leader: the records its fragments wrote, as they left
    /// them; once its fates are known, its writes go to the group's log.
    written: Option<Vec<Written>>,
}

/// Everything a node's threads share, under one lock: claims and commits are short.
struct NodeState {
    batches: Batches,
    home: BTreeMap<(u64, u32), HomeBatch>,
    /// Outputs forwarded to this node for fragments that depend on them.
    values: FxHashMap<TxnPos, Vec<Option<Value>>>,
    /// Every batch below this one has run here and been answered: the ring's low end.
    retired: u64,
    /// Fates of transactions that may abort, and the records their undecided writes hold.
    fates: FxHashMap<TxnPos, TxnFate>,
    dirty: FxHashMap<(TableId, u64), TxnPos>,
    /// Read-committed isolation: per record, its contents before each in-flight planner batch
    /// first wrote it, oldest first (the committed copies read-only queues read).
    images: FxHashMap<RecordKey, Vec<CommittedCopy>>,
    /// Speculative mode: undecided writes and who touched them.
    spec: Speculation,
    /// Speculative mode: this node's own fates of batches that aborted nothing, applied
    /// under the lock by `settle` (see `commit`).
    finals_here: Vec<PlannerBatch>,
    /// Batches decided but not answered yet: `settle` answers them after releasing the lock,
    /// so that sending a batch's answers does not hold up the other workers.
    decided: Vec<DecidedBatch>,
    /// Replication: which planner batches the logs have committed; and batches decided here
    /// that wait for it (see `LogGate`).
    gate: LogGate,
    unlogged: BTreeMap<PlannerBatch, DecidedBatch>,
    /// Replication point 3: records written by the planner batches that ran here, until
    /// acknowledged to their homes; at a leader, its planner batches' writes (encoded)
    /// waiting for every batch before them to be committed, and those proposed (in which
    /// term) until the log commits them.
    written: FxHashMap<PlannerBatch, Vec<Written>>,
    to_propose: BTreeMap<PlannerBatch, Vec<u8>>,
    proposed: BTreeMap<PlannerBatch, (u64, Vec<u8>)>,
    /// Replication: copies for stale instances to take after each batch (see `rebuild`),
    /// and the batch after which one is being taken (nothing after it runs meanwhile).
    copies: BTreeMap<u64, Vec<CopyFor>>,
    copying: Option<u64>,
    /// Replication: the last batch a copy was marked after, and when: the instance pauses
    /// there until every node of it has copied (its stall watch does not count the pause).
    copy_pause: Option<(u64, Instant)>,
}

impl NodeState {
    /// The state of a node whose next batch is `next`.
    fn new(batches: Batches, ranks: u32, next: u64) -> Self {
        let mut gate = LogGate::new(ranks);
        gate.skip_to(next);
        NodeState {
            batches,
            home: BTreeMap::new(),
            values: FxHashMap::default(),
            retired: next,
            fates: FxHashMap::default(),
            dirty: FxHashMap::default(),
            images: FxHashMap::default(),
            spec: Speculation::default(),
            finals_here: Vec::new(),
            decided: Vec::new(),
            gate,
            unlogged: BTreeMap::new(),
            written: FxHashMap::default(),
            to_propose: BTreeMap::new(),
            proposed: BTreeMap::new(),
            copies: BTreeMap::new(),
            copying: None,
            copy_pause: None,
        }
    }
}

/// A planner's batch whose transactions' fates are known, in planning order.
struct DecidedBatch {
    batch: u64,
    rank: u32,
    /// When it reached each stage, and when it was decided, if it is in the sample.
    /// (when it reached each stage, when it was decided, when its log committed it).
    clock: Option<(BatchClock, Instant, Instant)>,
    txns: Vec<HomeTxn>,
    fates: Vec<Option<Fate>>,
    outputs: Outputs,
}

/// A record's contents before planner batch `.0` (batch, rank) first wrote it: (position,
/// version, bytes).
type CommittedCopy = (PlannerBatch, RowVersion, Box<[u8]>);

/// Where clients' requests enter: the planners' queues, taken round-robin.
struct Admission {
    queues: RwLock<Option<Vec<AdmissionQueue>>>,
    next: AtomicUsize,
    /// Set by a planning worker going to sleep that a new request should wake (when batches
    /// close as soon as a worker is idle); taken by the first request that sees it, so a
    /// sleep costs the clients one wake-up, not one per request until the worker runs.
    request_wakes: AtomicBool,
}

struct QNode {
    id: NodeId,
    /// The node's place in its cluster instance (its partition): plans name the nodes of an
    /// instance this way, so every instance can run the same plans.
    part: NodeId,
    ctx: Arc<EngineCtx>,
    /// Replication: this node's member of its partition's replica group.
    member: OnceLock<GroupMember>,
    /// Durability: this node's checkpoints (with a data directory).
    ckpt: Option<Arc<Checkpointer>>,
    /// The slow node's pace, if it is the slow node.
    pace: Option<Pace>,
    /// Replication is synchronous: a leader's plans wait for the log.
    synchronous: bool,
    /// Replication point 1: the log holds a planner batch's transactions, not its queues;
    /// every member plans them (the leader delivers the queues it planned once they are
    /// committed, keeping them in `awaiting_log` meanwhile).
    replicate_inputs: bool,
    /// Replication point 3: the log holds a planner batch's writes, proposed once its fates
    /// are known (see `writes`).
    writes_to_log: bool,
    awaiting_log: Mutex<FxHashMap<PlannerBatch, Vec<Vec<Eq>>>>,
    /// Replication: what the group's log holds, by client key.
    dedup: Mutex<Dedup>,
    /// Replication: this node's instance may have run plans no log committed (see
    /// `replica`); it takes no part in the run any more.
    stale: AtomicBool,
    /// Replication: rebuilding this node's stale instance, or serving copies to another (see
    /// `rebuild`); at the leader of group 0, copies are marked on its first planner's plans.
    rebuild: Rebuilder<LoggedBatch>,
    /// Threads answering decided batches (outside the state lock): a copy's outcomes are
    /// taken once none is, so they hold every transaction the copy ran.
    answering: AtomicU32,
    /// The node itself, for threads of its own.
    this: OnceLock<std::sync::Weak<QNode>>,
    /// Replication: when this node last saw its instance retire a batch (or have nothing to
    /// do), and how long a leader lets it stall before it gives its group away.
    watch: StallWatch,
    net: Arc<dyn Transport<QMsg>>,
    /// What different threads write all the time lives on cache lines of its own, so that
    /// one thread's writes do not evict another's: each planner's (its worker), the admission
    /// queues' (the clients) and the node state's (everyone, under its lock).
    planners: Vec<CachePadded<Planner>>,
    admission: CachePadded<Admission>,
    state: CachePadded<Mutex<NodeState>>,
    wake: Condvar,
    stop: AtomicBool,
    stages: StageClock,
    /// Where its threads' time goes: planning, executing queues, idle (transactions run
    /// inline on a submitting thread are not a worker's).
    worker_time: WorkerTimes,
    /// Every planner of the node, in order (what a submitting thread plans for).
    all_planners: Vec<usize>,
    /// Whether no batch is in flight here, as of the last change to the node state: read on
    /// every submission without the lock.
    quiet: AtomicBool,
    /// Execution queues (sub-partitions) per node and planners per node.
    subs: u32,
    planners_per_node: u32,
    batch_size: usize,
    batch_timeout: Duration,
    close_when_idle: bool,
    depth: u64,
    read_committed: bool,
    /// Speculative mode with transactions that may abort: track undecided writes, so aborts
    /// can cascade.
    speculate: bool,
    /// Conservative mode with transactions that may abort: their undecided writes hold their
    /// records, so fragments check for held records before running.
    holds_writes: bool,
    /// Held by the executor running a writer queue of each sub-partition, and all at once by
    /// a rollback of speculative writes (which may touch any of them).
    sub_locks: Vec<Mutex<()>>,
}

impl QNode {
    fn new(
        id: NodeId,
        ctx: Arc<EngineCtx>,
        net: Arc<dyn Transport<QMsg>>,
        ckpt: Option<Arc<Checkpointer>>,
    ) -> Self {
        let q = &ctx.cfg.protocol.qstore;
        let workers = ctx.cfg.cluster.workers;
        let subs = if q.eqs_per_planner == 0 {
            workers
        } else {
            q.eqs_per_planner
        };
        let planners_per_node = q.planners_per_node(workers);
        let read_committed = q.isolation == Isolation::ReadCommitted;
        let per_planner_queue =
            (ctx.cfg.protocol.admission_queue / planners_per_node).max(1) as usize;
        let (senders, planners): (Vec<_>, Vec<_>) = (0..planners_per_node)
            .map(|_| {
                let (tx, rx) = bounded(per_planner_queue);
                let queues = if read_committed { 2 * subs } else { subs };
                let planner = Planner {
                    queue: rx,
                    next_batch: AtomicU64::new(0),
                    delivered: AtomicU64::new(0),
                    opened: Mutex::new(Instant::now()),
                    plan: Mutex::new(BatchPlan::new(ctx.nodes() as usize, queues)),
                };
                (tx, CachePadded::new(planner))
            })
            .unzip();
        let ranks = planners_per_node * ctx.nodes();
        // Which transactions a speculative abort cascades to depends on timing (whether a
        // reader ran before or after the abort rolled back what it read), so two instances
        // would decide differently (and a replay after a restart too): logged, transactions
        // that may abort run conservatively, whose fates depend on the data alone.
        let speculative = q.mode == QStoreMode::Speculative && !ctx.logged();
        let mut batches =
            Batches::with_read_only(subs, if read_committed { subs } else { 0 }, ranks);
        if ckpt.is_some() {
            // Nothing runs until recovery put the partition back (`QStore::recover`).
            batches.hold_from(0);
        }
        QNode {
            ckpt,
            pace: Pace::of(&ctx.cfg, id),
            id,
            part: NodeId(ctx.placement.partition_of(id).0),
            member: OnceLock::new(),
            dedup: Mutex::new(Dedup::default()),
            stale: AtomicBool::new(false),
            rebuild: Rebuilder::default(),
            answering: AtomicU32::new(0),
            this: OnceLock::new(),
            watch: StallWatch::new(Duration::from_millis(ctx.cfg.replication.stall_ms as u64)),
            synchronous: ctx.logged()
                && (ctx.cfg.replication.mode == ReplicationMode::Synchronous
                    || ctx.cfg.replication.point == Some(1)),
            replicate_inputs: ctx.logged() && ctx.cfg.replication.point == Some(1),
            writes_to_log: ctx.logged() && ctx.cfg.replication.point == Some(3),
            awaiting_log: Mutex::default(),
            net,
            planners,
            admission: CachePadded::new(Admission {
                queues: RwLock::new(Some(senders)),
                next: AtomicUsize::new(0),
                request_wakes: AtomicBool::new(false),
            }),
            state: CachePadded::new(Mutex::new(NodeState::new(batches, ranks, 0))),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            stages: StageClock::new(STAGES),
            worker_time: WorkerTimes::default(),
            all_planners: (0..planners_per_node as usize).collect(),
            quiet: AtomicBool::new(true),
            subs,
            planners_per_node,
            batch_size: q.batch_size as usize,
            batch_timeout: Duration::from_micros(q.batch_timeout_us),
            close_when_idle: q.close_when_idle,
            depth: q.pipeline_depth as u64,
            read_committed,
            speculate: speculative && ctx.catalog.may_abort(),
            holds_writes: !speculative && ctx.catalog.may_abort(),
            sub_locks: (0..subs).map(|_| Mutex::new(())).collect(),
            ctx,
        }
    }

    /// Client requests go round-robin to the planners' queues. Requests submitted together
    /// are all queued before any runs: an idle node then plans them as one batch on the
    /// submitting thread (if the first is `inline`), rather than one batch each.
    fn submit(&self, reqs: impl IntoIterator<Item = TxnRequest>) {
        let mut reqs = reqs.into_iter().peekable();
        let Some(first) = reqs.peek() else {
            return;
        };
        let idle = first.inline && self.close_when_idle && self.is_idle();
        let guard = self.admission.queues.read();
        for req in reqs {
            let queue = guard.as_ref().map(|qs| {
                let i = self.admission.next.fetch_add(1, Ordering::Relaxed) % qs.len();
                &qs[i]
            });
            let n = SUBMITTED.get();
            SUBMITTED.set(n.wrapping_add(1));
            let at = n.is_multiple_of(STAGE_SAMPLE).then(Instant::now);
            admit(queue, self.id, req, at, self.history());
        }
        drop(guard);
        if idle && self.run_inline() {
            return;
        }
        // Pairs with the sleeper's flag-then-look in `idle`: either it sees this request, or
        // this sees the flag and wakes it (under the lock, so the wake is not lost).
        std::sync::atomic::fence(Ordering::SeqCst);
        let wakes = &self.admission.request_wakes;
        if wakes.load(Ordering::Relaxed) && wakes.swap(false, Ordering::SeqCst) {
            let _state = self.state.lock();
            self.notify();
        }
    }

    /// Whether the node has nothing to do: no request queued, no batch in flight here. (A
    /// node whose threads all sleep is not idle if they wait for other nodes: under load,
    /// the submitting threads would then take the workers' place.)
    fn is_idle(&self) -> bool {
        self.quiet.load(Ordering::Acquire) && self.planners.iter().all(|p| p.queue.is_empty())
    }

    /// Runs a request on the submitting thread when the node is idle: a batch of one,
    /// planned and executed here, is as valid a batch of the global order as any, and waking
    /// a worker (and later the submitter) costs more than the work when the node is idle. Steps until nothing is left to do here (or `INLINE_STEPS`), including
    /// answering. Returns true if no request is left queued for the workers.
    fn run_inline(&self) -> bool {
        let ran = INLINE_SCRATCH.with(|scratch| {
            // A thread already running inline (it cannot be, but never borrow twice).
            let Ok(mut scratch) = scratch.try_borrow_mut() else {
                return false;
            };
            INLINE.set(true);
            for _ in 0..INLINE_STEPS {
                if self.stop.load(Ordering::Acquire) {
                    break;
                }
                let planners = &self.all_planners;
                if self.step(0, planners, true, true, &mut scratch).is_some() {
                    break;
                }
            }
            INLINE.set(false);
            true
        });
        let unplanned = self.planners.iter().any(|p| !p.queue.is_empty());
        if unplanned || !self.state.lock().batches.is_empty() {
            // Work left here (queues waiting for other nodes' plans or values, or more than
            // the steps allowed): the node's threads take it from here.
            self.notify();
        }
        ran && !unplanned
    }

    /// Planner ranks are the same in every instance: group, then planner.
    fn rank(&self, planner: usize) -> u32 {
        self.part.0 * self.planners_per_node + planner as u32
    }

    /// The node (of an instance, see `part`) whose planner has `rank`.
    fn node_of_rank(&self, rank: u32) -> NodeId {
        NodeId(rank / self.planners_per_node)
    }

    /// The server that is node `n` of this node's instance.
    #[inline]
    fn peer(&self, n: NodeId) -> NodeId {
        self.ctx.placement.peer_of(self.id, PartitionId(n.0))
    }

    fn part_id(&self) -> PartitionId {
        PartitionId(self.part.0)
    }

    /// Whether this node plans: it leads its group (always, without replication), has
    /// applied what earlier leaders committed, and its instance is not stale.
    fn leads(&self) -> bool {
        self.lead().is_some()
    }

    /// The term in which this node plans, if it does (see [`QNode::leads`]); 0 without
    /// replication. Its proposals are for that term only: a plan made as leader must not
    /// reach the log in a later term, after another leader's plan for the same slot.
    fn lead(&self) -> Option<u64> {
        match self.member.get() {
            // Not logged: every node plans for itself. Logged: its member is not started yet,
            // and may be replaying the log already; it leads once elected.
            None => (!self.ctx.logged()).then_some(0),
            Some(m) => m
                .leading_term()
                .filter(|_| !self.stale.load(Ordering::Acquire)),
        }
    }

    /// Whether this node was elected its group's leader but may not plan yet: it has not
    /// applied every entry of earlier terms.
    fn catching_up(&self) -> bool {
        self.ctx.placement.leader(self.part_id()) == Some(self.id)
            && !self.stale.load(Ordering::Acquire)
            && !self.leads()
    }

    /// The answer to a request this node cannot plan: who leads its group, if it knows.
    fn not_leader(&self) -> TxnOutcome {
        let leader = self.ctx.placement.leader(self.part_id());
        TxnOutcome::NotLeader {
            leader: leader.filter(|&l| l != self.id),
        }
    }

    /// Where this node records the run's history: its instance's recorder.
    fn history(&self) -> Option<&HistoryRecorder> {
        self.ctx.history_of(self.id)
    }

    fn store(&self) -> &qstore_storage::PartitionStore {
        self.ctx.server_store(self.id)
    }

    /// A thread of the node: plans batches that are due, executes queues otherwise (if
    /// `executes`), and sleeps when there is nothing to do. A worker plans for every planner
    /// of the node, its own (`plans`) first, so a due batch never waits for one busy worker
    /// (the next batch of every sub-partition waits for it); a dedicated planner plans for
    /// its own only.
    fn work(&self, t: usize, plans: Option<usize>, executes: bool) {
        let mut scratch = TxnScratch::default();
        let n = self.planners.len();
        let planners: Vec<usize> = match plans {
            Some(own) if executes => (0..n).map(|i| (own + i) % n).collect(),
            Some(own) => vec![own],
            None if executes => (0..n).collect(),
            None => Vec::new(),
        };
        // Nothing to execute: close batches now rather than idle until they fill.
        let early = self.close_when_idle && executes;
        // A piece (a plan, a queue) is long and switches activity once or twice: every one is
        // timed.
        let _accounted = self.worker_time.attach(1);
        while !self.stop.load(Ordering::Acquire) {
            piece(Activity::Other);
            let began = Pace::begin(&self.pace);
            match self.step(t, &planners, executes, early, &mut scratch) {
                Some(seen) => during(Activity::Idle, || self.idle(&planners, seen, early)),
                None => Pace::end(&self.pace, began),
            }
        }
    }

    /// Wakes the node's sleeping threads: something happened that may give them work.
    fn notify(&self) {
        if !INLINE.get() {
            self.wake.notify_all();
        }
    }

    /// Does one thing: plans a due batch of one of `planners`, or runs a queue (if
    /// `executes`), or (`early`) closes a batch that holds anything. Returns the event count
    /// seen when there was nothing to do.
    fn step(
        &self,
        t: usize,
        planners: &[usize],
        executes: bool,
        early: bool,
        scratch: &mut TxnScratch,
    ) -> Option<u64> {
        if planners.iter().any(|&p| self.plan_if_due(p, false)) {
            return None;
        }
        let (claim, seen) = {
            let mut state = self.state.lock();
            let claim = if executes {
                let readable = self.readable(&state);
                let claim = state.batches.claim(t as u32, readable);
                if let Some(c) = &claim {
                    if let Some(hb) = state.home.get_mut(&(c.batch, c.rank)) {
                        if let Some(clock) = &mut hb.clock {
                            clock.first_claim.get_or_insert_with(Instant::now);
                        }
                    }
                }
                claim.map(|c| (c, self.history().is_some()))
            } else {
                None
            };
            (claim, state.batches.events())
        };
        match claim {
            Some((c, records)) => self.execute(c, records, scratch),
            None if early && planners.iter().any(|&p| self.plan_if_due(p, true)) => {}
            None => return Some(seen),
        }
        None
    }

    /// Sleeps unless something happened since the worker last looked (event count `seen`).
    /// With `wake_on_request`, a request for one of its `planners` wakes it too.
    fn idle(&self, planners: &[usize], seen: u64, wake_on_request: bool) {
        let mut state = self.state.lock();
        if self.stop.load(Ordering::Acquire) || state.batches.events() != seen {
            return;
        }
        let planners = || planners.iter().map(|&p| &*self.planners[p]);
        // A request wakes the worker only for a planner it could plan for now: with the ring
        // full, the retiring of a batch wakes it; with another thread planning, that plan's
        // end does (`plan_if_due` settles after it). Requests waiting for either are no
        // reason to stay awake either: looking again at once would only spin.
        let plannable = |p: &Planner| {
            p.next_batch.load(Ordering::Acquire) < state.retired + self.depth && !p.plan.is_locked()
        };
        if wake_on_request && planners().any(plannable) {
            // Only requests clear the flag: a worker that wakes for another reason leaves it
            // for the others still asleep (at worst one wake-up too many).
            self.admission.request_wakes.store(true, Ordering::SeqCst);
            std::sync::atomic::fence(Ordering::SeqCst);
            if planners().any(|p| plannable(p) && !p.queue.is_empty()) {
                return;
            }
        }
        // Sleep until a plan, value, verdict or acknowledgement arrives, or a batch is due.
        // A due batch that the ring holds back waits for a notification too. Only a batch
        // that holds requests falls due: an idle node's threads stay asleep.
        let now = Instant::now();
        let until_due = planners()
            .filter(|p| !p.queue.is_empty())
            .map(|p| (*p.opened.lock() + self.batch_timeout).saturating_duration_since(now))
            .min()
            .unwrap_or(IDLE_WAIT);
        let wait = if until_due.is_zero() {
            IDLE_WAIT
        } else {
            until_due.min(IDLE_WAIT)
        };
        self.wake.wait_for(&mut state, wait);
    }

    /// Plans the next batch of planner `p` if it is full or its time is up, and the ring has
    /// room for it. An `early` (idle) worker also closes it if it holds any transaction, or if
    /// another planner has closed this batch already (every planner's plan of a batch is
    /// awaited before the next batch runs). Returns whether it planned; false as well if
    /// another thread is planning for `p` right now.
    fn plan_if_due(&self, p: usize, early: bool) -> bool {
        let planner = &*self.planners[p];
        let Some(term) = self.lead() else {
            if self.catching_up() {
                // Elected, and still applying what earlier leaders logged (after a restart,
                // the whole log): its requests wait for it.
                return false;
            }
            // A follower's plans come from its group's log; requests that reached it go to
            // the leader.
            for Admitted { req, .. } in planner.queue.try_iter() {
                reply(&req, self.not_leader());
            }
            return false;
        };
        let queued = planner.queue.len();
        // Read the clock only when the answer depends on it: a step asks every planner. An
        // empty batch need not time out when idle workers close batches (they close the ones
        // other planners wait for).
        let late = || {
            (queued > 0 || !self.close_when_idle)
                && planner.opened.lock().elapsed() >= self.batch_timeout
        };
        // The first planner marks a copy a stale instance waits for on its next batch, even
        // an empty one.
        let full = queued >= self.batch_size || (self.rank(p) == 0 && self.rebuild.copy_wanted());
        if !early && !full && !late() {
            return false;
        }
        // Held from reading the batch number to publishing the next one: one plan per batch.
        let Some(mut plan) = planner.plan.try_lock() else {
            return false;
        };
        let batch = planner.next_batch.load(Ordering::Acquire);
        {
            let state = self.state.lock();
            if batch >= state.retired + self.depth {
                return false;
            }
            let awaited = || state.batches.newest().is_some_and(|b| b >= batch);
            if early && !(full || queued > 0 || awaited() || late()) {
                return false;
            }
        }
        *planner.opened.lock() = Instant::now();
        let delivered = during(Activity::Planning, || {
            self.plan((batch, self.rank(p)), term, planner, &mut plan)
        });
        // Published after the plan is installed here, so `retire` never counts this batch as
        // done before its slot exists.
        if delivered {
            planner.delivered.store(batch + 1, Ordering::Release);
        }
        planner.next_batch.store(batch + 1, Ordering::Release);
        drop(plan);
        // The batch's queues may all have run before that store, and the `retire` their end
        // called then could not count the batch as planned. Nothing else may come to retire
        // it (with one batch in flight, every planner waits for it): retire now.
        self.settle(self.state.lock());
        true
    }

    /// Takes up to a batch of transactions and sends every node its execution queues (with
    /// replication, proposes them to the group's log too, in the `term` it leads). Returns
    /// whether it delivered them (not when synchronous replication waits for the log).
    fn plan(
        &self,
        (batch, rank): PlannerBatch,
        term: u64,
        planner: &Planner,
        plan: &mut BatchPlan,
    ) -> bool {
        let timed = batch.is_multiple_of(STAGE_SAMPLE);
        let mut planning = timed.then(Instant::now);
        let ctx = &*self.ctx;
        let nodes = ctx.nodes() as usize;
        let mut txns = Vec::with_capacity(planner.queue.len().min(self.batch_size));
        let mut involved = vec![false; nodes];
        let mut program = Program::default();
        let shape = self.shape();
        let mut admissions = Vec::new();
        for Admitted { req, at, .. } in planner.queue.try_iter().take(self.batch_size) {
            // Replicated: a resubmission of a transaction the group already has is answered
            // with its outcome, not run again.
            let req = match self.member.get() {
                Some(_) => match self.dedup.lock().admit(req) {
                    Some(req) => req,
                    None => continue,
                },
                None => req,
            };
            if let Some(at) = at {
                let planning = *planning.get_or_insert_with(Instant::now);
                admissions.push((ADMISSION, planning - at));
            }
            if let Err(e) = ctx.catalog.program_into(&req.call, &mut program) {
                reply(&req, TxnOutcome::Rejected(e.to_string()));
                continue;
            }
            // Validation refuses programs with no accesses. One would be placed in no queue,
            // so no node would acknowledge it: alone in its batch, the batch would never be
            // answered, and its place in the ring would stall every planner of the cluster.
            // Should one get here anyway, it is refused like the others.
            debug_assert!(!program.accesses.is_empty(), "{}", EMPTY_PROGRAM);
            if program.accesses.is_empty() {
                reply(&req, TxnOutcome::Rejected(EMPTY_PROGRAM.into()));
                continue;
            }
            let seq = txns.len() as u32;
            let placed = plan.place(seq, req.id, self.part, &program, &ctx.pmap, shape);
            for &n in placed.nodes {
                involved[n.index()] = true;
            }
            txns.push(HomeTxn {
                id: req.id,
                key: req.key,
                may_abort: placed.may_abort,
                n_accesses: program.accesses.len() as u16,
                req: Some(req),
                call: None,
                fate: None,
            });
        }
        if !admissions.is_empty() {
            self.stages.record(&admissions, 1);
        }
        let involved: Vec<NodeId> = (0..nodes as u32)
            .filter(|&n| involved[n as usize])
            .map(NodeId)
            .collect();
        // Every transaction planned has an access, so some node acknowledges the batch.
        debug_assert!(txns.is_empty() || !involved.is_empty());
        let mut eqs: Vec<Vec<Eq>> = (0..nodes as u32)
            .map(|d| plan.take_eqs(NodeId(d)))
            .collect();
        let contexts: Vec<TxnContext> = match self.member.get() {
            Some(_) => {
                // A durable log carries the calls too: a later start that records its
                // history records the replayed transactions with theirs.
                let with_call =
                    self.replicate_inputs || self.history().is_some() || self.ctx.cfg.is_durable();
                txns.iter().map(|t| t.context(with_call)).collect()
            }
            None => Vec::new(),
        };
        // Waiting for its answers before it is proposed: the log may commit it at once.
        if !txns.is_empty() {
            let home = HomeBatch {
                txns,
                clock: planning.filter(|_| timed).map(|planning| BatchClock {
                    planning,
                    // Placed: sending and installing the queues counts as queue wait.
                    planned: Instant::now(),
                    first_claim: None,
                    last_finish: None,
                }),
                acks_pending: involved.len() as u32,
                involved: involved.clone(),
                notes: Vec::new(),
                outputs: Vec::new(),
                written: self.writes_to_log.then(Vec::new),
            };
            self.state.lock().home.insert((batch, rank), home);
        }
        match self.member.get() {
            // Point 3: proposed once it ran (see `batch_ran`), or now if empty (the next
            // planner batch's writes wait for it).
            Some(member) if self.writes_to_log && contexts.is_empty() => {
                let writes = LoggedPlan::Writes {
                    eqs: vec![Vec::new(); nodes],
                    involved: Vec::new(),
                };
                let mut state = self.state.lock();
                self.queue_writes(member, &mut state, batch, rank, Vec::new(), writes);
            }
            Some(_) if self.writes_to_log => {}
            Some(member) => {
                let logged = LoggedBatch {
                    batch,
                    rank,
                    txns: contexts,
                    plan: LoggedPlan::Inputs,
                };
                eqs = self.propose(member, term, logged, eqs, involved)
            }
            None => {}
        }
        if self.synchronous {
            return false;
        }
        self.deliver(batch, rank, eqs);
        true
    }

    /// Proposes a planner batch (`logged`, its plan not filled in yet) to the group's log in
    /// `term`: its queues (replication point 2), or only its transactions (point 1, keeping
    /// the queues until the log commits them). Returns the queues to deliver now, if any.
    fn propose(
        &self,
        member: &GroupMember,
        term: u64,
        mut logged: LoggedBatch,
        eqs: Vec<Vec<Eq>>,
        involved: Vec<NodeId>,
    ) -> Vec<Vec<Eq>> {
        if self.replicate_inputs {
            self.awaiting_log
                .lock()
                .insert((logged.batch, logged.rank), eqs);
            logged.plan = LoggedPlan::Inputs;
            member.propose_in_term(term, logged.encode());
            return Vec::new();
        }
        logged.plan = LoggedPlan::Queues { eqs, involved };
        member.propose_in_term(term, logged.encode());
        match logged.plan {
            LoggedPlan::Queues { eqs, .. } => eqs,
            LoggedPlan::Inputs | LoggedPlan::Writes { .. } => Vec::new(),
        }
    }

    /// Replication point 3: queues a planner batch's writes for the log, and proposes what
    /// may go now.
    fn queue_writes(
        &self,
        member: &GroupMember,
        state: &mut NodeState,
        batch: u64,
        rank: u32,
        txns: Vec<TxnContext>,
        plan: LoggedPlan,
    ) {
        let logged = LoggedBatch {
            batch,
            rank,
            txns,
            plan,
        };
        state.to_propose.insert((batch, rank), logged.encode());
        self.propose_due(member, state);
    }

    /// Replication point 3: proposes, in order, the queued writes of every planner batch
    /// that follows only committed ones. (An image is the state a batch left only if what ran
    /// before it is what the logs hold.) Writes wait while the member does not lead; a
    /// leader of a new term proposes again those of an earlier term still not committed:
    /// having applied everything before its term, it knows they were lost with that term.
    fn propose_due(&self, member: &GroupMember, state: &mut NodeState) {
        if self.stale.load(Ordering::Acquire) {
            state.to_propose.clear();
            state.proposed.clear();
            return;
        }
        let Some(term) = member.leading_term() else {
            return;
        };
        while let Some(entry) = state.proposed.first_entry() {
            if entry.get().0 >= term {
                break;
            }
            let (slot, (_, bytes)) = entry.remove_entry();
            state.to_propose.insert(slot, bytes);
        }
        while let Some(entry) = state.to_propose.first_entry() {
            let (batch, rank) = *entry.key();
            if !state.gate.follows_committed(batch, rank) {
                break;
            }
            let bytes = entry.remove();
            member.propose_in_term(term, bytes.clone());
            state.proposed.insert((batch, rank), (term, bytes));
        }
    }

    /// Replication point 3: the writes of a planner batch whose fates are known, for the
    /// log: the last committed image of every record it wrote, and how each of its
    /// transactions ended.
    fn logged_writes(
        &self,
        txns: &[HomeTxn],
        fates: &[Option<Fate>],
        outputs: &Outputs,
        written: Vec<Written>,
    ) -> (Vec<TxnContext>, LoggedPlan) {
        let ids: Vec<TxnId> = txns.iter().map(|t| t.id).collect();
        let committed = |seq: u32| fates.get(seq as usize).is_some_and(|f| f.is_none());
        let nodes = self.ctx.nodes() as usize;
        let (eqs, involved) =
            writes::write_only_queues(written, committed, &ids, &self.ctx.pmap, self.subs, nodes);
        let mut gather = Gather::new(outputs.clone());
        let with_call = self.history().is_some() || self.ctx.cfg.is_durable();
        let contexts = txns
            .iter()
            .zip(fates)
            .enumerate()
            .map(|(seq, (t, fate))| {
                let mut c = t.context(with_call);
                c.fate = Some(match fate {
                    None => LoggedFate::Committed(gather.take(seq as u32, t.n_accesses)),
                    Some(Fate::Abort(why)) => LoggedFate::Aborted(why.clone()),
                    Some(Fate::Cascade) => LoggedFate::Cascade,
                });
                c
            })
            .collect();
        (contexts, LoggedPlan::Writes { eqs, involved })
    }

    /// Replication point 1: plans the transactions another member logged, as that member
    /// did (planning is deterministic): the batch's queues by node, and the nodes involved.
    fn plan_logged(
        &self,
        planner: &Planner,
        txns: &[TxnContext],
    ) -> Result<(Vec<Vec<Eq>>, Vec<NodeId>), String> {
        let ctx = &*self.ctx;
        let nodes = ctx.nodes();
        let mut plan = planner.plan.lock();
        let mut involved = vec![false; nodes as usize];
        let mut program = Program::default();
        for (seq, t) in txns.iter().enumerate() {
            let call = t
                .call
                .as_ref()
                .ok_or("a logged transaction without its call")?;
            ctx.catalog
                .program_into(call, &mut program)
                .map_err(|e| format!("cannot plan logged transaction {}: {e}", t.id.0))?;
            let placed = plan.place(
                seq as u32,
                t.id,
                self.part,
                &program,
                &ctx.pmap,
                self.shape(),
            );
            for &n in placed.nodes {
                involved[n.index()] = true;
            }
        }
        let eqs = (0..nodes).map(|d| plan.take_eqs(NodeId(d))).collect();
        let involved = (0..nodes).filter(|&n| involved[n as usize]).map(NodeId);
        Ok((eqs, involved.collect()))
    }

    /// How this node's plans lay out each node's queues.
    fn shape(&self) -> QueueShape {
        QueueShape {
            subs: self.subs,
            read_only_from: self.read_committed.then_some(self.subs),
        }
    }

    /// Sends every node of the instance its queues of planner batch (`batch`, `rank`), and
    /// installs this node's own. Node 0 of the instance, delivering its first planner's
    /// batches (planned here, or, with replication, committed by group 0's log), marks those
    /// after which every node of the instance checkpoints.
    fn deliver(&self, batch: u64, rank: u32, eqs: Vec<Vec<Eq>>) {
        let checkpoint = rank == 0 && self.ckpt.as_ref().is_some_and(|c| c.mark_due(batch));
        let copy = if rank == 0 {
            self.copy_due(batch)
        } else {
            None
        };
        for (d, eqs) in eqs.into_iter().enumerate() {
            let d = NodeId(d as u32);
            if d != self.part {
                let msg = QMsg::Plan {
                    batch,
                    rank,
                    eqs,
                    checkpoint,
                    copy,
                };
                self.net.send(self.id, self.peer(d), msg);
            } else {
                self.install(batch, rank, eqs, checkpoint, copy);
            }
        }
    }

    /// The copy a stale instance wants after `batch`, if it is due (see `rebuild`).
    fn copy_due(&self, batch: u64) -> Option<CopyFor> {
        self.rebuild.copy_due(self.id, batch)
    }

    fn install(
        &self,
        batch: u64,
        rank: u32,
        eqs: Vec<Eq>,
        checkpoint: bool,
        copy: Option<CopyFor>,
    ) {
        // A stale node installs nothing; one rebuilt installs what the nodes of its instance
        // that are rebuilt too send (`serve_network` drops the rest).
        if self.stale.load(Ordering::Acquire) && self.rebuild.state.lock().phase() == Phase::Stale {
            return;
        }
        let mut state = self.state.lock();
        if checkpoint {
            match &self.ckpt {
                // Installed under the lock with the hold: no queue of a later batch can be
                // claimed before it (they wait for this planner's later plans).
                Some(c) => {
                    c.schedule(batch);
                }
                None => tracing::warn!(
                    "node {}: a plan marks a checkpoint, but this node has no data directory",
                    self.id
                ),
            }
        }
        if let Some(copy) = copy {
            state.copies.entry(batch).or_default().push(copy);
            state.copy_pause = Some((batch, Instant::now()));
        }
        if checkpoint || copy.is_some() {
            self.hold(&mut state);
        }
        state.batches.install(batch, rank, eqs);
        state.batches.event();
        self.settle(state);
    }

    /// Runs a claimed queue from its cursor until it ends or stalls.
    /// `records`: the fragments' reads and writes go into the history.
    fn execute(&self, mut c: Claim, records: bool, scratch: &mut TxnScratch) {
        let _owner =
            (self.speculate && c.sub < self.subs).then(|| self.sub_locks[c.sub as usize].lock());
        // One output per access still to run (fewer if some are skipped).
        let done = c.eq.frags.get(c.cursor).map_or(0, |f| f.start as usize);
        let mut outputs = Vec::with_capacity(c.eq.ops.len().saturating_sub(done));
        let store = self.store();
        let ahead = Lookahead::new(&c.eq.ops, |op: &Op| (store.table(op.table), op.key));
        ahead.start(done);
        let ahead = |at| ahead.step(at);
        // The queue's fragments are the transactions' work (timed per claimed queue, not per
        // fragment: a clock read is a visible cost next to one fragment).
        let useful = enter(Activity::Useful);
        while let Some(frag) = c.eq.frag(c.cursor) {
            let pos = TxnPos {
                batch: c.batch,
                rank: c.rank,
                seq: frag.seq,
            };
            // Queues numbered from `subs` are read-only queues (read-committed isolation).
            let ran = if c.sub >= self.subs {
                self.read_committed_fragment(pos, frag, &ahead, records, scratch, &mut outputs)
            } else {
                self.run_fragment(pos, frag, &ahead, records, scratch, &mut outputs)
            };
            if let Some(seen) = ran {
                // Waiting for a value or a verdict: set the queue aside until something happens.
                let mut state = self.state.lock();
                let (b, r) = (c.batch, c.rank);
                state.batches.stall(c, seen);
                state.batches.add_outputs(b, r, outputs);
                return;
            }
            c.cursor += 1;
        }
        drop(useful);
        let mut state = self.state.lock();
        if let Some(hb) = state.home.get_mut(&(c.batch, c.rank)) {
            if let Some(clock) = &mut hb.clock {
                clock.last_finish = Some(Instant::now());
            }
        }
        let finished = state.batches.finish(c.batch, c.sub, c.rank, outputs);
        if let Some(outputs) = finished.ack {
            self.acknowledge(&mut state, c.batch, c.rank, outputs);
        }
        self.settle(state);
    }

    /// Runs one fragment if it can run now. Returns `Some(event count seen)` if it must wait.
    fn run_fragment(
        &self,
        pos: TxnPos,
        frag: FragRef<'_>,
        ahead: &dyn Fn(usize),
        trace: bool,
        s: &mut TxnScratch,
        outputs: &mut Vec<Output>,
    ) -> Option<u64> {
        s.begin();
        if writes::is_write_only(&frag) {
            return self.put_images(pos, frag, trace, s);
        }
        // The outputs this fragment's steps may read, indexed by access.
        let needs_values = !frag.needs().is_empty() || frag.has_deps();
        if needs_values {
            s.outputs.resize(frag.n_accesses as usize, Value::Null);
        }
        match self.ready(pos, frag, &mut s.outputs, self.holds_writes) {
            Ready::Wait(seen) => return Some(seen),
            Ready::Skip => return None,
            Ready::Run => {}
        }
        if self.read_committed {
            self.keep_images((pos.batch, pos.rank), frag);
        }
        if self.speculate {
            let keys = frag.accesses.iter().map(|op| (op.table, op.key));
            self.state.lock().spec.touch(pos, keys);
        }
        let ctx = &*self.ctx;
        let keeps_undo = frag.fate().is_some() || self.speculate;
        if keeps_undo {
            let tables = &ctx.catalog.tables;
            let writes = frag.accesses.iter().filter(|op| op.kind.is_write());
            s.undo
                .reserve(writes.map(|op| tables[op.table as usize].row_size).sum());
        }
        let mut votes: Vec<Option<String>> = Vec::new();
        for (at, op) in (frag.start as usize..).zip(frag.accesses) {
            ahead(at);
            let mut int_arg = Value::Null;
            let a = frag.access(op, &mut int_arg);
            let t = trace.then_some(&mut s.trace);
            let undo = keeps_undo.then_some(&mut s.undo);
            // SAFETY: this queue owns its sub-partition's records until it finishes: every
            // access to them is in this queue or in queues that run strictly before or after,
            // and records written by undecided transactions are not touched (see `ready`).
            let result = unsafe {
                run_access(
                    self.store(),
                    &ctx.catalog.steps,
                    frag.id,
                    a,
                    &s.outputs,
                    undo,
                    t,
                )
            };
            if op.may_abort {
                votes.push(result.as_ref().err().map(|e| e.0.to_string()));
            }
            // Only an access declared abortable fails here (`run_access` settles the others'
            // failures as Null outputs, as every protocol does). Its failure dooms the
            // transaction: conservative execution stops here (every node skips the rest once
            // the verdict is known), speculative execution goes on, so the fragments waiting
            // for its values do not wait forever, and the home aborts it with everything
            // built on it.
            debug_assert!(
                op.may_abort || result.is_ok(),
                "only abortable accesses fail"
            );
            let value = match result {
                Ok(v) => v,
                Err(_) if !self.speculate => break,
                Err(_) => Value::Null,
            };
            let values = needs_values.then_some(&mut s.outputs[..]);
            self.publish(pos, frag, op.idx, value, values, outputs);
        }
        if let Some(h) = self.history().filter(|_| trace) {
            h.add_part(frag.id, &s.trace);
        }
        if self.writes_to_log {
            // SAFETY: as for the accesses above: the queue still owns the records.
            let written = unsafe { writes::capture(self.store(), pos.seq, &frag) };
            if !written.is_empty() {
                let mut state = self.state.lock();
                let all = state.written.entry((pos.batch, pos.rank)).or_default();
                all.extend(written);
            }
        }
        if self.speculate {
            let writes = frag.accesses.iter().filter(|op| op.kind.is_write());
            let keys = writes.map(|op| (op.table, op.key));
            let own_abort = votes.into_iter().flatten().next();
            let undo = std::mem::take(&mut s.undo);
            self.state.lock().spec.ran(pos, undo, keys, own_abort);
        } else if let Some(fate) = frag.fate() {
            self.hold_writes(pos, frag, std::mem::take(&mut s.undo));
            for abort in votes {
                self.vote(pos, fate, abort);
            }
        }
        None
    }

    /// Replication point 3: runs a fragment of a write-only queue (another member's batch,
    /// committed in the log), once no undecided transaction holds its records: it puts each
    /// record's image in place. Returns `Some(event count seen)` if it must wait.
    fn put_images(
        &self,
        pos: TxnPos,
        frag: FragRef<'_>,
        trace: bool,
        s: &mut TxnScratch,
    ) -> Option<u64> {
        {
            // An earlier transaction that may still roll back would put its before-image
            // over this committed one.
            let state = self.state.lock();
            let mut keys = frag.accesses.iter().map(|op| (op.table, op.key));
            let held = |k: RecordKey| {
                state.spec.holds(k, pos) || state.dirty.get(&k).is_some_and(|&w| w != pos)
            };
            if keys.any(held) {
                return Some(state.batches.events());
            }
        }
        if self.read_committed {
            self.keep_images((pos.batch, pos.rank), frag);
        }
        for op in frag.accesses {
            let mut int_arg = Value::Null;
            let arg = frag.access(op, &mut int_arg).arg;
            // SAFETY: this queue owns its sub-partition's records until it finishes, and no
            // undecided transaction holds these (checked above).
            if let Err(why) = unsafe { writes::apply(self.store(), frag.id, op, arg) } {
                self.become_stale(&format!("a write-only queue of the log: {why}"));
                return None;
            }
            if trace {
                s.trace.write(op.table, op.key);
            }
        }
        if let Some(h) = self.history().filter(|_| trace) {
            h.add_part(frag.id, &s.trace);
        }
        None
    }

    /// Decides under the node lock whether `frag` can run: its transaction not known to
    /// abort, every value it needs here (copied into `values`), and none of its records held
    /// by an undecided transaction (conservative execution).
    fn ready(
        &self,
        pos: TxnPos,
        frag: FragRef<'_>,
        values: &mut [Value],
        check_held: bool,
    ) -> Ready {
        // The common case needs nothing the lock guards: a transaction that cannot abort,
        // whose fragment needs no outside value, on records no undecided writer can hold.
        if frag.fate().is_none() && frag.needs().is_empty() && !check_held {
            return Ready::Run;
        }
        let state = self.state.lock();
        if frag.fate().is_some() && state.fates.get(&pos).is_some_and(|f| f.aborted.is_some()) {
            return Ready::Skip;
        }
        let held = check_held
            && frag.accesses.iter().any(|a| {
                state
                    .dirty
                    .get(&(a.table, a.key))
                    .is_some_and(|&w| w != pos)
            });
        let wait = Ready::Wait(state.batches.events());
        if held {
            return wait;
        }
        if frag.needs().is_empty() {
            return Ready::Run;
        }
        let Some(known) = state.values.get(&pos) else {
            return wait;
        };
        for &i in frag.needs() {
            match known.get(i as usize) {
                Some(Some(v)) => values[i as usize] = v.clone(),
                _ => return wait,
            }
        }
        Ready::Run
    }

    /// Read-committed: before a fragment first writes a record in its planner batch `at`
    /// (batch, rank), keeps the record's contents as they were: the committed copy that
    /// readers at `at` and before see while later writers run.
    fn keep_images(&self, at: PlannerBatch, frag: FragRef<'_>) {
        let table = |a: &Op| self.store().table(a.table);
        let mut state = self.state.lock();
        for a in frag.accesses.iter().filter(|op| op.kind.is_write()) {
            let images = state.images.entry((a.table, a.key)).or_default();
            if images.last().is_some_and(|(p, _, _)| *p == at) {
                continue;
            }
            let t = table(a);
            if let Some(rid) = t.lookup(a.key) {
                // SAFETY: `rid` is live (just looked up). The fragment about to write the record
                // runs in this executor's queue, which owns the record's sub-partition: no
                // other queue writes it until this one finishes, and read-only queues read it
                // under the node lock, held here.
                let bytes: Box<[u8]> = unsafe { t.row(rid) }.into();
                images.push((at, t.version(rid), bytes));
            }
        }
    }

    /// Runs a read-only fragment against the committed state as of its position (see
    /// `readable`): for each record, the copy kept before the first in-flight planner batch
    /// at or after its own wrote it, else the record itself (no such batch has written it).
    fn read_committed_fragment(
        &self,
        pos: TxnPos,
        frag: FragRef<'_>,
        ahead: &dyn Fn(usize),
        trace: bool,
        s: &mut TxnScratch,
        outputs: &mut Vec<Output>,
    ) -> Option<u64> {
        s.begin();
        s.outputs.resize(frag.n_accesses as usize, Value::Null);
        if let Ready::Wait(seen) = self.ready(pos, frag, &mut s.outputs, false) {
            return Some(seen);
        }
        let ctx = &*self.ctx;
        // Values are computed under the node lock (it keeps writers off the records read) and
        // handed on after it is released: routing a value locally takes the lock again.
        let mut produced = Vec::with_capacity(frag.accesses.len());
        let state = self.state.lock();
        for (at, op) in (frag.start as usize..).zip(frag.accesses) {
            ahead(at);
            let mut int_arg = Value::Null;
            let unresolved = frag.access(op, &mut int_arg);
            // A derived key that cannot be resolved reads nothing: no key is `MAX_KEY + 1`.
            let a = unresolved.resolve(&s.outputs).unwrap_or(AccessRef {
                key: qstore_core::MAX_KEY + 1,
                derived: true,
                key_dep: None,
                output: false,
                ..unresolved
            });
            let t = self.store().table(a.table);
            let copy = state
                .images
                .get(&(a.table, a.key))
                .and_then(|v| v.iter().find(|(p, _, _)| *p >= (pos.batch, pos.rank)));
            let found: Option<(RowVersion, &[u8])> = match copy {
                Some((_, v, bytes)) => Some((*v, bytes)),
                // SAFETY: `rid` is live (just looked up). Every writer before this position is
                // done here, and a writer at or after it keeps a copy of the record under the
                // node lock (held here) before it writes: with no such copy, no such writer
                // has started on the record, and none can start while the lock is held.
                None => t
                    .lookup_versioned(a.key)
                    .map(|(rid, v)| (v, unsafe { t.row(rid) })),
            };
            let result = match found {
                Some((version, bytes)) => {
                    if trace {
                        s.trace.read(a.table, a.key, version);
                    }
                    ctx.catalog.steps.run(a, RowRef::Read(bytes), &s.outputs)
                }
                None => {
                    if trace {
                        s.trace.read(a.table, a.key, t.absent_version(a.key));
                    }
                    Err(KEY_NOT_FOUND)
                }
            };
            // Read-only queues hold no access that may abort (see `BatchPlan::place`), so a
            // failure is a Null output, as on every protocol; it is published like any
            // other, or a fragment waiting for it would wait forever.
            debug_assert!(!op.may_abort, "an abortable access in a read-only queue");
            let value = a.settle(result).unwrap_or(Value::Null);
            s.outputs[op.idx as usize] = value.clone();
            produced.push((op.idx, value));
        }
        drop(state);
        for (idx, value) in produced {
            self.publish(pos, frag, idx, value, None, outputs);
        }
        if let Some(h) = self.history().filter(|_| trace) {
            h.add_part(frag.id, &s.trace);
        }
        None
    }

    /// Keeps the before-images of a fragment of a transaction that may abort, and holds its
    /// written records until the transaction is decided (rolling back at once if it already
    /// was decided to abort while the fragment ran).
    fn hold_writes(&self, pos: TxnPos, frag: FragRef<'_>, mut undo: UndoLog) {
        let mut state = self.state.lock();
        let needed = frag.fate().map_or(0, |f| f.abortables);
        let fate = state
            .fates
            .entry(pos)
            .or_insert_with(|| TxnFate::new(needed));
        if fate.aborted.is_some() {
            // SAFETY: the fragment wrote these records from this executor's queue, which
            // still owns their sub-partition: no other queue has touched them since, and
            // `run_access` keeps no reference to their bytes.
            unsafe { undo.rollback(|_| self.store()) };
            return;
        }
        if fate.decided {
            return;
        }
        let written: Vec<(TableId, u64)> = frag
            .accesses
            .iter()
            .filter(|op| op.kind.is_write())
            .map(|op| (op.table, op.key))
            .collect();
        fate.undo.push(undo);
        fate.written.extend_from_slice(&written);
        for k in written {
            state.dirty.insert(k, pos);
        }
    }

    /// Sends an abortable access's verdict to every node that must know the fate.
    fn vote(&self, pos: TxnPos, fate: &FateInfo, abort: Option<String>) {
        for &n in &fate.notify {
            if n == self.part {
                self.on_vote(pos, fate.abortables, abort.clone());
            } else {
                let msg = QMsg::Vote {
                    pos,
                    abortables: fate.abortables,
                    abort: abort.clone(),
                };
                self.net.send(self.id, self.peer(n), msg);
            }
        }
    }

    /// Counts a verdict; the first abort, or the last pass, decides the transaction here:
    /// an abort rolls back its writes on this node, and either way its records are released.
    fn on_vote(&self, pos: TxnPos, needed: u16, abort: Option<String>) {
        let mut state = self.state.lock();
        if pos.batch < state.retired {
            // Its batch is done here, so the transaction was decided here (a batch holding an
            // undecided fate does not retire) and its fate forgotten: the first abort decides,
            // and the other verdicts may arrive after that. Counted as a new fate, this one
            // would never be decided, and would hold the ring (and every planner) forever.
            return;
        }
        let fate = state
            .fates
            .entry(pos)
            .or_insert_with(|| TxnFate::new(needed));
        if fate.decided {
            return;
        }
        match abort {
            Some(why) => fate.aborted = Some(why),
            None => fate.passed += 1,
        }
        if fate.aborted.is_none() && fate.passed < fate.needed {
            return;
        }
        fate.decided = true;
        let undo = std::mem::take(&mut fate.undo);
        let written = std::mem::take(&mut fate.written);
        if fate.aborted.is_some() {
            for mut u in undo.into_iter().rev() {
                // SAFETY: the records are held (dirty) by this transaction: nothing else has
                // touched them since it wrote them, and nothing will until they are released.
                unsafe { u.rollback(|_| self.store()) };
            }
        }
        for k in written {
            if state.dirty.get(&k) == Some(&pos) {
                state.dirty.remove(&k);
            }
        }
        state.batches.event();
        // An undecided transaction keeps its batch from retiring: this may complete it.
        self.settle(state);
    }

    /// Hands the output of access `idx` on: to the nodes and fragments the plan routes it to,
    /// to the fragment's own later steps (`values`, when they read outputs), and to the
    /// acknowledgement for the home node. Runs once per access: the common case (no routes,
    /// no values) is kept small enough to inline.
    #[inline]
    fn publish(
        &self,
        pos: TxnPos,
        frag: FragRef<'_>,
        idx: u16,
        value: Value,
        values: Option<&mut [Value]>,
        outputs: &mut Vec<Output>,
    ) {
        if !frag.routes().is_empty() {
            self.route(pos, frag, idx, &value);
        }
        if let Some(values) = values {
            values[idx as usize] = value.clone();
        }
        outputs.push(Output {
            seq: pos.seq,
            idx,
            value,
        });
    }

    /// Sends the output of access `idx` where the plan says it is needed.
    #[inline(never)]
    fn route(&self, pos: TxnPos, frag: FragRef<'_>, idx: u16, value: &Value) {
        for r in frag.routes().iter().filter(|r| r.idx == idx) {
            if r.local {
                let mut state = self.state.lock();
                state.store_value(pos, frag.n_accesses, idx, value.clone());
                drop(state);
                self.notify();
            }
            for &n in &r.nodes {
                let msg = QMsg::Dep {
                    pos,
                    idx,
                    value: value.clone(),
                };
                self.net.send(self.id, self.peer(n), msg);
            }
        }
    }

    /// A node ran every queue planner `rank` gave it in `batch`: record the outputs, and
    /// answer the planner's transactions once every node has.
    fn on_ack(
        &self,
        state: &mut NodeState,
        batch: u64,
        rank: u32,
        outputs: Outputs,
        notes: Vec<FateNote>,
        written: Vec<Written>,
    ) {
        let Some(hb) = state.home.get_mut(&(batch, rank)) else {
            tracing::error!(
                "node {}: acknowledgement for unknown batch {batch} rank {rank}",
                self.id
            );
            return;
        };
        hb.outputs.extend(outputs);
        hb.notes.extend(notes);
        if let Some(all) = &mut hb.written {
            all.extend(written);
        }
        hb.acks_pending -= 1;
        if hb.acks_pending == 0 {
            self.batch_ran(state, batch, rank);
        }
    }

    /// Every node a planner batch involved has acknowledged it: decide its transactions'
    /// fates, and answer them (with replication, once the logs allow).
    fn batch_ran(&self, state: &mut NodeState, batch: u64, rank: u32) {
        let hb = state.home.remove(&(batch, rank)).expect("present");
        let fates = self.commit(state, batch, rank, hb.involved, hb.notes, &hb.txns);
        if let (Some(written), Some(member)) = (hb.written, self.member.get()) {
            let (txns, plan) = self.logged_writes(&hb.txns, &fates, &hb.outputs, written);
            self.queue_writes(member, state, batch, rank, txns, plan);
        }
        let decided = DecidedBatch {
            batch,
            rank,
            clock: hb.clock.map(|c| {
                let now = Instant::now();
                (c, now, now)
            }),
            txns: hb.txns,
            fates,
            outputs: hb.outputs,
        };
        // With replication, answered once every log committed what it ran after.
        if self.member.get().is_none() || state.gate.allows(batch) {
            state.decided.push(decided);
        } else {
            state.unlogged.insert((batch, rank), decided);
        }
    }

    /// Commits a planner's batch: the fate of each of its transactions, in planning order
    /// (`answer` then tells the clients). No node can refuse a transaction (no
    /// concurrency-control aborts), so there is no two-phase commit. In speculative mode this
    /// is also where fates are decided; they go to every node the batch involved.
    fn commit(
        &self,
        state: &mut NodeState,
        batch: u64,
        rank: u32,
        involved: Vec<NodeId>,
        notes: Vec<FateNote>,
        txns: &[HomeTxn],
    ) -> Vec<Option<Fate>> {
        if self.speculate {
            let fates = speculative_fates(txns.len(), notes);
            let aborted: Vec<u32> = (0..fates.len() as u32)
                .filter(|&s| fates[s as usize].is_some())
                .collect();
            for &n in &involved {
                if n == self.part && aborted.is_empty() {
                    // Nothing to roll back here: applied before the lock is released, not sent
                    // through the inbox (which woke the network thread once per batch).
                    state.finals_here.push((batch, rank));
                    continue;
                }
                let aborted = aborted.clone();
                // To this node too through its inbox: a rollback must wait for the queues
                // running on the records, which this thread may be one of.
                self.net.send(
                    self.id,
                    self.peer(n),
                    QMsg::Final {
                        batch,
                        rank,
                        aborted,
                    },
                );
            }
            fates
        } else {
            self.conservative_fates(state, batch, rank, txns)
        }
    }

    /// Answers the clients of a decided batch, in planning order.
    fn answer(&self, d: DecidedBatch) {
        let DecidedBatch {
            batch,
            rank,
            clock,
            txns,
            fates,
            outputs,
        } = d;
        let n = txns.len() as u64;
        let mut outputs = Gather::new(outputs);
        let mut dedup = self.member.get().map(|_| self.dedup.lock());
        for ((seq, t), fate) in txns.into_iter().enumerate().zip(fates) {
            if t.req.is_none() && dedup.is_none() {
                continue;
            }
            let order = TxnPos {
                batch,
                rank,
                seq: seq as u32,
            }
            .order_key();
            let ending = match (fate, t.fate) {
                // Point 3: the member that ran it logged how it ended.
                (_, Some(LoggedFate::Committed(outputs))) => Ending::Committed { order, outputs },
                (_, Some(LoggedFate::Aborted(why))) => Ending::LogicAbort { order, why },
                (_, Some(LoggedFate::Cascade)) => Ending::CcAbort(CcAbortCause::Cascade),
                (Some(Fate::Abort(why)), None) => Ending::LogicAbort { order, why },
                (Some(Fate::Cascade), None) => Ending::CcAbort(CcAbortCause::Cascade),
                (None, None) => Ending::Committed {
                    order,
                    outputs: outputs.take(seq as u32, t.n_accesses),
                },
            };
            let trace = TxnTrace::default();
            let Some(req) = t.req else {
                // Another member of the group answers it; this one records it in its
                // instance's history (the log carries calls when histories are kept) and
                // remembers the outcome.
                let outcome = match &t.call {
                    Some(call) => settle(self.history(), self.id, t.id, call, &trace, ending),
                    None => ending.outcome(),
                };
                if let Some(d) = &mut dedup {
                    d.finished(t.key, &outcome);
                }
                continue;
            };
            let outcome = settle(self.history(), self.id, req.id, &req.call, &trace, ending);
            if let Some(d) = &mut dedup {
                d.finished(t.key, &outcome);
            }
            req.answer(outcome);
        }
        drop(dedup);
        if let Some((clock, decided, logged)) = clock {
            let stages = clock.stages(decided, logged, Instant::now());
            // Without replication the stage does not exist.
            let replicated = self.member.get().is_some();
            let stages: Vec<_> = stages
                .into_iter()
                .filter(|&(s, _)| replicated || s != REPLICATION)
                .collect();
            self.stages.record(&stages, n);
        }
    }

    /// Conservative mode: the fates the verdicts decided. Every verdict reached this node
    /// before the acknowledgement of the node that produced it (links are FIFO), so each
    /// transaction that may abort is decided by now.
    fn conservative_fates(
        &self,
        state: &NodeState,
        batch: u64,
        rank: u32,
        txns: &[HomeTxn],
    ) -> Vec<Option<Fate>> {
        let fate = |seq: usize, t: &HomeTxn| {
            let pos = TxnPos {
                batch,
                rank,
                seq: seq as u32,
            };
            let f = state.fates.get(&pos).filter(|_| t.may_abort)?;
            debug_assert!(f.decided, "fate of {pos:?} undecided at commit");
            f.aborted.clone().map(Fate::Abort)
        };
        txns.iter().enumerate().map(|(i, t)| fate(i, t)).collect()
    }

    /// A planner's batch has run here: acknowledge it to its home, unless (speculative mode)
    /// some of its transactions touched writes whose fate is not known yet.
    fn acknowledge(&self, state: &mut NodeState, batch: u64, rank: u32, outputs: Outputs) {
        let outputs = if self.speculate {
            match state.spec.ack_or_park((batch, rank), outputs) {
                Some(outputs) => outputs,
                None => return,
            }
        } else {
            outputs
        };
        self.send_ack(state, batch, rank, outputs);
    }

    fn send_ack(&self, state: &mut NodeState, batch: u64, rank: u32, outputs: Outputs) {
        let notes = if self.speculate {
            state.spec.notes((batch, rank))
        } else {
            Vec::new()
        };
        let written = state.written.remove(&(batch, rank)).unwrap_or_default();
        let home = self.node_of_rank(rank);
        if home == self.part {
            self.on_ack(state, batch, rank, outputs, notes, written);
        } else {
            let msg = QMsg::Ack {
                batch,
                rank,
                outputs,
                notes,
                written,
            };
            self.net.send(self.id, self.peer(home), msg);
        }
    }

    /// Speculative mode: applies the fates of a planner's batch here. Rolling back touches
    /// records of any sub-partition, so it first waits for the queues running on them.
    fn on_final(&self, batch: u64, rank: u32, aborted: Vec<u32>) {
        let _owners: Vec<_> = if aborted.is_empty() {
            Vec::new()
        } else {
            self.sub_locks.iter().map(|l| l.lock()).collect()
        };
        let mut state = self.state.lock();
        let store = self.store();
        // SAFETY: every writer queue is held (`_owners`), so no executor touches the records,
        // and a rolled-back transaction's records were written by it and by transactions
        // rolled back before it here (newest first).
        let done = state.spec.finalize((batch, rank), &aborted, |u| unsafe {
            u.rollback(|_| store)
        });
        if self.read_committed {
            refresh_committed_copies(&mut state.images, store, &done.restored);
        }
        self.finalized(&mut state, done);
        self.settle(state);
    }

    /// Speculative mode: what follows a batch's fates applied here: acknowledgements that
    /// waited for them go out.
    fn finalized(&self, state: &mut NodeState, done: Finalized) {
        for ((b, r), outputs) in done.released {
            self.send_ack(state, b, r, outputs);
        }
        state.batches.event();
    }

    /// Speculative mode: applies this node's fates of batches that aborted nothing (queued by
    /// `commit`, and again by the acknowledgements they release).
    fn apply_finals_here(&self, state: &mut NodeState) {
        while !state.finals_here.is_empty() {
            for pb in std::mem::take(&mut state.finals_here) {
                let done = state.spec.finalize(pb, &[], |_| {
                    unreachable!("a batch that aborted nothing rolls nothing back")
                });
                self.finalized(state, done);
            }
        }
    }

    /// Advances the ring past batches that have run and been answered here.
    /// Ends a change to the node state: retires what it completed, releases the lock and
    /// wakes the workers. Every event that can complete a batch goes through here, so none
    /// leaves a finished batch unretired (with one batch in flight, nothing else would).
    fn settle(&self, mut state: MutexGuard<'_, NodeState>) {
        self.apply_finals_here(&mut state);
        self.retire(&mut state);
        let decided = std::mem::take(&mut state.decided);
        let answering = !decided.is_empty();
        if answering {
            self.answering.fetch_add(1, Ordering::AcqRel);
        }
        drop(state);
        self.notify();
        for d in decided {
            self.answer(d);
        }
        if answering {
            self.answering.fetch_sub(1, Ordering::AcqRel);
        }
    }

    fn retire(&self, state: &mut NodeState) {
        // With nothing in flight, every batch this node's planners have planned is done; later
        // ones cannot be (they need these planners' plans).
        let planned = self
            .planners
            .iter()
            .map(|p| p.delivered.load(Ordering::Acquire))
            .min();
        let upto = state.retired.max(planned.unwrap_or(0));
        let executing = state.batches.retire_done(upto);
        let unanswered = state.home.keys().chain(state.unlogged.keys()).min();
        let answering = unanswered.map_or(upto, |&(b, _)| b);
        // A transaction still undecided here holds records and before-images: keep its batch.
        let deciding = state.oldest_undecided().map_or(u64::MAX, |(b, _)| b);
        let retired = executing.min(answering).min(deciding);
        if retired > state.retired {
            if self.member.get().is_some() {
                self.watch.progressed();
            }
            state.retired = retired;
            state.values.retain(|pos, _| pos.batch >= retired);
            state.fates.retain(|pos, _| pos.batch >= retired);
            state.images.retain(|_, v| {
                v.retain(|((b, _), _, _)| *b >= retired);
                !v.is_empty()
            });
            self.checkpoint_if_due(state);
            self.copy_if_due(state);
        }
        let quiet = state.home.is_empty() && state.unlogged.is_empty() && state.batches.is_empty();
        // Written only when it changes: every thread reads it on every submission.
        if self.quiet.load(Ordering::Relaxed) != quiet {
            self.quiet.store(quiet, Ordering::Release);
        }
    }

    /// Holds back the queues after the first checkpoint or copy to take (all of them on a
    /// node out of service).
    fn hold(&self, state: &mut NodeState) {
        let from = if self.stale.load(Ordering::Acquire) {
            0
        } else {
            let checkpoint = self.ckpt.as_ref().map_or(u64::MAX, |c| c.hold_from());
            let copy = state
                .copies
                .keys()
                .next()
                .into_iter()
                .chain(&state.copying)
                .min();
            checkpoint.min(copy.map_or(u64::MAX, |b| b + 1))
        };
        state.batches.hold_from(from);
    }

    /// Takes the checkpoint the ring waits for, once every batch up to it is retired here.
    fn checkpoint_if_due(&self, state: &mut NodeState) {
        let Some(c) = &self.ckpt else { return };
        let held = c.hold_from();
        if held == 0 || held > state.retired || state.batches.held_from() == 0 {
            return; // recovering, or batches before the checkpoint still in flight
        }
        // SAFETY: no queue runs: every batch before `retired` is done here, and none from
        // `held` on may be claimed (the checkpoint's batch is `held - 1 < retired`).
        unsafe { c.take_if_due(state.retired, self.store()) };
        self.hold(state);
        state.batches.event();
    }

    /// Starts taking the first copy for stale instances, once its batch is retired here (see
    /// `rebuild`). The copy is made on a thread of its own, outside the state lock: nothing
    /// after its batch runs meanwhile (the hold stays until it is made), and nothing up to it
    /// is left to run, so no one writes the partition; but the node's other threads (its
    /// group member's above all, whose heartbeats keep its group's leader) go on.
    fn copy_if_due(&self, state: &mut NodeState) {
        let Some(entry) = state.copies.first_entry() else {
            return;
        };
        let batch = *entry.key();
        let due = batch < state.retired && state.batches.held_from() != 0;
        if !due || state.copying.is_some() {
            return;
        }
        let wanted = entry.remove();
        state.copying = Some(batch);
        let Some(node) = self.this.get().and_then(std::sync::Weak::upgrade) else {
            return;
        };
        let copying = move || {
            let started = Instant::now();
            // SAFETY: no queue runs: every batch up to `batch` is done here, and none after
            // it may be claimed until `copying` is cleared below.
            let rows = unsafe { checkpoint::copy_rows(node.store()) };
            tracing::info!(
                "node {}: copied partition {} after batch {batch} in {:?} ({} records)",
                node.id,
                node.part.0,
                started.elapsed(),
                rows.len()
            );
            {
                let mut state = node.state.lock();
                state.copying = None;
                node.hold(&mut state);
                state.batches.event();
                node.settle(state);
            }
            node.send_copies(&wanted, batch, rows);
        };
        let spawned = std::thread::Builder::new()
            .name(format!("q{}-copy", self.id.0))
            .spawn(copying);
        if let Err(e) = spawned {
            tracing::error!("node {}: cannot copy its partition: {e}", self.id);
            state.copying = None;
            self.hold(state);
        }
    }

    /// Read-committed: read-only queues at positions (batch, planner rank) up to this one may
    /// run. A read-only transaction reads the committed state as of its position in the
    /// global order (every writer of earlier batches, and of lower ranks in its batch), so it
    /// waits until those writers have run here and been decided.
    ///
    /// That position is after every transaction answered before the read was sent: an
    /// answered transaction's queues ran, which needs every plan of lower priority than its
    /// own (all planners' plans of the batch before, lower ranks' of its batch) to have
    /// arrived, so a transaction planned later has a later position. A read therefore sees
    /// every write answered before it was sent, and never less than a read answered before
    /// it was sent.
    fn readable(&self, state: &NodeState) -> PlannerBatch {
        if !self.read_committed {
            return (0, 0);
        }
        let executed = state.batches.writers_done_before(state.retired);
        executed.min(state.oldest_undecided().unwrap_or((u64::MAX, u32::MAX)))
    }

    /// The network thread: installs plans, values and acknowledgements as they arrive.
    fn serve_network(&self, inbox: Receiver<Envelope<QMsg>>) {
        while !self.stop.load(Ordering::Acquire) {
            let env = match inbox.recv_timeout(Duration::from_millis(20)) {
                Ok(env) => env,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return,
            };
            if self.stale.load(Ordering::Acquire) && env.msg.is_of_a_run() {
                let part = self.instance_part(env.from);
                if !part.is_some_and(|p| self.rebuild.state.lock().accepts_from(p)) {
                    continue; // the instance's old run (see `rebuild`)
                }
            }
            match env.msg {
                QMsg::Plan {
                    batch,
                    rank,
                    eqs,
                    checkpoint,
                    copy,
                } => {
                    let check = self.state.lock().batches.check_plan(rank, &eqs);
                    // Only node 0's first planner marks checkpoints and copies.
                    let checkpoint = checkpoint && rank == 0;
                    let copy = copy.filter(|_| rank == 0);
                    match check {
                        Ok(()) => self.install(batch, rank, eqs, checkpoint, copy),
                        Err(why) => tracing::error!(
                            "node {}: refused a plan from node {}: {why}",
                            self.id,
                            env.from
                        ),
                    }
                }
                QMsg::Ack {
                    batch,
                    rank,
                    outputs,
                    notes,
                    written,
                } => {
                    let mut state = self.state.lock();
                    self.on_ack(&mut state, batch, rank, outputs, notes, written);
                    self.settle(state);
                }
                QMsg::Dep { pos, idx, value } => {
                    self.state.lock().store_value(pos, u16::MAX, idx, value);
                    self.notify();
                }
                QMsg::Vote {
                    pos,
                    abortables,
                    abort,
                } => self.on_vote(pos, abortables, abort),
                QMsg::Final {
                    batch,
                    rank,
                    aborted,
                } => self.on_final(batch, rank, aborted),
                QMsg::Logged { batch, rank } => self.on_logged(batch, rank),
                QMsg::Stale => {
                    if self.instance_part(env.from).is_some() {
                        self.become_stale("another node of its instance is stale");
                    }
                }
                QMsg::Rebuild(msg) => self.on_rebuild(env.from, msg),
                QMsg::Raft(msg) => replication::deliver(self.member.get(), self.id, env.from, msg),
                QMsg::Checkpoints { have, asking } => match &self.ckpt {
                    Some(c) => {
                        if let Some(answer) = c.heard_from(env.from, have, asking) {
                            self.net.send(self.id, env.from, answer);
                        }
                    }
                    None => tracing::warn!(
                        "node {}: node {} announced checkpoints, but this node keeps none",
                        self.id,
                        env.from
                    ),
                },
            }
        }
    }
}

impl Recovers for QNode {
    fn id(&self) -> NodeId {
        self.id
    }

    fn checkpointer(&self) -> Option<&Arc<Checkpointer>> {
        self.ckpt.as_ref()
    }

    fn store(&self) -> &qstore_storage::PartitionStore {
        QNode::store(self)
    }

    fn history(&self) -> Option<&HistoryRecorder> {
        QNode::history(self)
    }

    fn resume_at(&self, from: u64) {
        for p in self.planners.iter() {
            p.next_batch.fetch_max(from, Ordering::AcqRel);
            p.delivered.fetch_max(from, Ordering::AcqRel);
        }
        let mut state = self.state.lock();
        state.retired = state.retired.max(from);
        state.gate.skip_to(from);
    }
}

/// Replication: what a node does with its group's log.
impl Applier for QNode {
    fn committed(&self, proposer: NodeId, proposed_here: bool, data: &[u8]) {
        self.committed_at(0, proposer, proposed_here, data)
    }

    fn committed_at(&self, index: u64, proposer: NodeId, proposed_here: bool, data: &[u8]) {
        let logged = match LoggedBatch::decode(data, self.ctx.nodes() as usize) {
            Ok(b) => b,
            Err(why) => {
                tracing::error!("node {}: a log entry is not a batch: {why}", self.id);
                return;
            }
        };
        let (batch, rank) = (logged.batch, logged.rank);
        if let Some(c) = &self.ckpt {
            c.applied(index, batch);
            if batch < c.replay_from() {
                // The restored checkpoint holds it already.
                if let Some(planner) = self.planner_of(rank) {
                    planner.next_batch.fetch_max(batch + 1, Ordering::AcqRel);
                    planner.delivered.fetch_max(batch + 1, Ordering::AcqRel);
                }
                return;
            }
        }
        if self.planner_of(rank).is_none() {
            tracing::error!(
                "node {}: the log holds batch {batch} of planner rank {rank}, not of this group",
                self.id,
            );
            return;
        }
        self.serve_if_rebuilt();
        if self.stale.load(Ordering::Acquire) {
            // Still a voter of its group, but its instance runs nothing more until it is
            // rebuilt: the entry is held for then.
            let mut rebuild = self.rebuild.state.lock();
            match rebuild.hold(proposer, logged, data.len()) {
                None => return,
                // Back in service meanwhile.
                Some(back) => {
                    drop(rebuild);
                    return self.apply_logged(proposer, proposed_here, back);
                }
            }
        }
        self.apply_logged(proposer, proposed_here, logged)
    }

    fn checkpoints(&self) -> Option<&Checkpointer> {
        self.ckpt.as_deref()
    }

    fn leader_changed(&self, leader: Option<NodeId>) {
        if leader == Some(self.id) {
            self.watch.progressed();
        } else {
            self.redirect_home();
        }
        self.notify();
    }

    /// A node of an instance that lost a peer takes it out of service at once (a leader or
    /// not): messages to that peer were lost, so the instance cannot go on; a stale node
    /// works at rebuilding it.
    fn tick(&self) {
        // (Without copies, a group of one only logs: a lost peer is waited for.)
        let replicated = self.ctx.placement.replicas() > 1;
        if replicated && !self.stale.load(Ordering::Acquire) {
            let lost = (0..self.ctx.nodes())
                .map(|d| self.peer(NodeId(d)))
                .find(|&n| !self.net.reachable(self.id, n));
            if let Some(n) = lost {
                self.become_stale(&format!("node {n} of its instance is unreachable"));
            }
        }
        if self.stale.load(Ordering::Acquire) {
            self.rebuild_step();
        }
        // Point 3: a leader elected again proposes the writes its earlier term lost, whether
        // or not anything else happens here.
        if let Some(member) = self.member.get().filter(|_| self.writes_to_log) {
            let mut state = self.state.lock();
            if !state.proposed.is_empty() || !state.to_propose.is_empty() {
                self.propose_due(member, &mut state);
            }
        }
    }

    fn fell_behind(&self) {
        self.rebuild.state.lock().skipped();
        self.become_stale(
            "it fell behind its group's compacted log (it is rebuilt from a copy of the \
             partition)",
        );
    }

    /// A leader gives its group away when its instance is stale, or stalled (see
    /// [`StallWatch`]; the instance is stale then too).
    fn should_step_aside(&self) -> bool {
        if self.stale.load(Ordering::Acquire) {
            return true;
        }
        let busy = {
            let state = self.state.lock();
            if state
                .copy_pause
                .is_some_and(|pause| Self::pausing(&state, pause))
            {
                // A copy for a stale instance: nothing runs after its batch until every node
                // of the instance has copied its partition, which takes a while.
                self.watch.progressed();
            }
            !(state.home.is_empty() && state.unlogged.is_empty() && state.batches.is_empty())
        };
        let lost = || {
            (0..self.ctx.nodes())
                .map(|d| self.peer(NodeId(d)))
                .find(|&n| !self.net.reachable(self.id, n))
        };
        match self.watch.verdict(busy, lost) {
            Some(why) => {
                self.report_stall();
                self.become_stale(&why);
                true
            }
            None => false,
        }
    }
}

impl QNode {
    /// The batch each of this node's planners plans next (for diagnostics).
    fn planners_at(&self) -> Vec<u64> {
        let next = |p: &CachePadded<Planner>| p.next_batch.load(Ordering::Acquire);
        self.planners.iter().map(next).collect()
    }

    /// What a stalled node still holds, for diagnosing the stall.
    fn report_stall(&self) {
        let state = self.state.lock();
        let planned = self.planners_at();
        tracing::warn!(
            "node {} stalled: home batches {:?}, unlogged {:?}, retired {}, planners at \
             {planned:?}, replaying {}, log {:?}; {}",
            self.id,
            state.home.keys().take(4).collect::<Vec<_>>(),
            state.unlogged.keys().take(4).collect::<Vec<_>>(),
            state.retired,
            self.rebuild.replaying(),
            self.log_position(),
            state.batches.describe_oldest(),
        );
    }

    /// Whether the instance still pauses for the copy marked after `batch`: no batch after
    /// it has retired here (the next needs every node's copy made). A pause of more than
    /// `MAX_COPY_PAUSE` is a stall all the same.
    fn pausing(state: &NodeState, (batch, since): (u64, Instant)) -> bool {
        state.retired <= batch + 1 && since.elapsed() < MAX_COPY_PAUSE
    }

    /// Delivers a committed entry of the group's log in this node's instance.
    fn apply_logged(&self, proposer: NodeId, proposed_here: bool, logged: LoggedBatch) {
        let (batch, rank) = (logged.batch, logged.rank);
        let Some(planner) = self.planner_of(rank) else {
            return;
        };
        if proposed_here {
            // This member planned it and its instance has it (or, synchronous, gets it now).
            if self.synchronous {
                let eqs = match logged.plan {
                    LoggedPlan::Queues { eqs, .. } => Some(eqs),
                    LoggedPlan::Inputs => self.awaiting_log.lock().remove(&(batch, rank)),
                    // Refused by the configuration: a batch's writes exist once it ran.
                    LoggedPlan::Writes { .. } => None,
                };
                let Some(eqs) = eqs else {
                    return self.become_stale(&format!(
                        "the log committed its planner batch ({batch}, {rank}), whose queues \
                         it no longer has"
                    ));
                };
                self.deliver(batch, rank, eqs);
                planner.delivered.fetch_max(batch + 1, Ordering::AcqRel);
            }
            if self.writes_to_log {
                self.state.lock().proposed.remove(&(batch, rank));
            }
            // The `Logged` this node sends itself also retires what `delivered` now allows
            // (`on_logged` settles), as `plan_if_due` does after planning.
            return self.tell_instance(|| QMsg::Logged { batch, rank });
        }
        if batch < planner.delivered.load(Ordering::Acquire) {
            // This member led the group and delivered a plan of its own for this slot that
            // the log lost: its instance ran something no log holds.
            return self.become_stale(&format!(
                "the log committed planner batch ({batch}, {rank}) of node {proposer}, but \
                 this node had delivered its own"
            ));
        }
        // Another member planned it: this instance commits it too, answering no one. (A plan
        // of its own for this slot, waiting for the log, lost.)
        self.awaiting_log.lock().remove(&(batch, rank));
        let (eqs, involved) = match logged.plan {
            LoggedPlan::Queues { eqs, involved } | LoggedPlan::Writes { eqs, involved } => {
                (eqs, involved)
            }
            LoggedPlan::Inputs => match self.plan_logged(planner, &logged.txns) {
                Ok(planned) => planned,
                Err(why) => return self.become_stale(&why),
            },
        };
        {
            let mut dedup = self.dedup.lock();
            for t in &logged.txns {
                dedup.running(t.key);
            }
        }
        if !logged.txns.is_empty() {
            let home = HomeBatch {
                txns: logged.txns.iter().map(HomeTxn::replica).collect(),
                clock: None,
                acks_pending: involved.len() as u32,
                involved,
                notes: Vec::new(),
                outputs: Vec::new(),
                written: None,
            };
            let runs = home.acks_pending > 0;
            let mut state = self.state.lock();
            state.home.insert((batch, rank), home);
            if !runs {
                // Point 3, a batch that wrote nothing: no node has a queue to acknowledge.
                self.batch_ran(&mut state, batch, rank);
                self.settle(state);
            }
        }
        planner.next_batch.fetch_max(batch + 1, Ordering::AcqRel);
        self.deliver(batch, rank, eqs);
        planner.delivered.fetch_max(batch + 1, Ordering::AcqRel);
        self.tell_instance(|| QMsg::Logged { batch, rank });
    }
}

impl QNode {
    /// Tells every node of this node's instance (itself included).
    fn tell_instance(&self, msg: impl Fn() -> QMsg) {
        for d in 0..self.ctx.nodes() {
            self.net.send(self.id, self.peer(NodeId(d)), msg());
        }
    }

    /// A planner batch is committed in its group's log: batches it opens are answered.
    fn on_logged(&self, batch: u64, rank: u32) {
        let mut guard = self.state.lock();
        let state = &mut *guard;
        state.gate.committed(batch, rank);
        if let Some(member) = self.member.get().filter(|_| self.writes_to_log) {
            self.propose_due(member, state);
        }
        while let Some(entry) = state.unlogged.first_entry() {
            if !state.gate.allows(entry.key().0) {
                break;
            }
            let mut decided = entry.remove();
            if let Some((_, _, logged)) = &mut decided.clock {
                *logged = Instant::now();
            }
            state.decided.push(decided);
        }
        self.settle(guard);
    }

    /// Takes this node out of the run: its instance may have run plans no log committed (or
    /// lost a node). It stops installing plans and running queues, tells its instance, and
    /// sends its waiting clients to the leader; as a member of its group it goes on voting,
    /// and holds what its log commits until its instance is rebuilt (see `rebuild`).
    fn become_stale(&self, why: &str) {
        let mut rebuild = self.rebuild.state.lock();
        if self.stale.swap(true, Ordering::AcqRel) {
            return;
        }
        rebuild.go_stale();
        drop(rebuild);
        {
            let mut state = self.state.lock();
            self.hold(&mut state);
        }
        let placement = &self.ctx.placement;
        placement.mark_stale(placement.instance_of(self.id));
        tracing::error!(
            "node {} (instance {}): stale, out of the run until rebuilt: {why}",
            self.id,
            self.ctx.placement.instance_of(self.id)
        );
        self.tell_instance(|| QMsg::Stale);
        self.redirect_home();
        self.notify();
    }

    /// The partition (node of the instance) of server `n`, if it belongs to this node's
    /// instance.
    fn instance_part(&self, n: NodeId) -> Option<u32> {
        rebuild::instance_part(&self.ctx, self.id, n)
    }

    /// A stale node's periodic step of rebuilding (on its member's thread, every raft tick):
    /// the shared steps (see `Rebuilder::step`), installing a whole copy, and coming back in
    /// service once its whole instance installed one.
    fn rebuild_step(&self) {
        let ranks = self.rank(0)..self.rank(self.planners.len());
        if let Some(copy) = self.with_seat(|seat| self.rebuild.step(seat, ranks)) {
            // Not on the member's thread: installing a large partition takes a while.
            let node = self.this.get().and_then(std::sync::Weak::upgrade);
            let spawned = std::thread::Builder::new()
                .name(format!("q{}-install", self.id.0))
                .spawn(move || {
                    if let Some(n) = node {
                        n.install_copy(copy);
                        n.rebuild.install_done();
                    }
                });
            if let Err(e) = spawned {
                tracing::error!("node {}: cannot install a copy: {e}", self.id);
                self.rebuild.install_done();
            }
        }
        self.serve_if_rebuilt();
    }

    /// This node's seat in its instance, for the shared steps of a rebuild.
    fn with_seat<R>(&self, f: impl FnOnce(&Seat) -> R) -> R {
        let stale = || self.tell_instance(|| QMsg::Stale);
        rebuild::with_seat(&self.ctx, self.id, &*self.net, QMsg::Rebuild, &stale, f)
    }

    /// Installs a whole copy: the partition's rows, the outcomes, and a node state whose
    /// next batch follows the copy's. Waits (keeps the copy) while a queue still runs here.
    fn install_copy(&self, copy: rebuild::Copy) {
        let (gen, batch, holding) = (copy.gen, copy.batch, copy.holding);
        let mut state = self.state.lock();
        if state.batches.any_running() {
            drop(state);
            return self.rebuild.state.lock().keep_complete(copy);
        }
        let started = Instant::now();
        // SAFETY: no queue runs (the node is out of service: every queue is held back, and
        // none is claimed), and none can start while the state lock is held.
        let rows = match unsafe { checkpoint::install_rows(copy.records, self.store()) } {
            Ok(rows) => rows,
            Err(e) => {
                return tracing::error!("node {}: cannot install a copy: {e}", self.id);
            }
        };
        let next = batch + 1;
        let ranks = self.planners_per_node * self.ctx.nodes();
        let batches = Batches::with_read_only(
            self.subs,
            if self.read_committed { self.subs } else { 0 },
            ranks,
        );
        *state = NodeState::new(batches, ranks, next);
        self.hold(&mut state);
        for p in self.planners.iter() {
            p.next_batch.store(next, Ordering::Release);
            p.delivered.store(next, Ordering::Release);
        }
        self.awaiting_log.lock().clear();
        *self.dedup.lock() = Dedup::of_outcomes(copy.outcomes);
        drop(state);
        let fits = (self.rebuild.state.lock()).installed_copy(gen, batch, holding);
        if !fits {
            return tracing::warn!(
                "node {}: its log skipped entries while it installed a copy after batch \
                 {batch}: it waits for a later one",
                self.id
            );
        }
        tracing::warn!(
            "node {}: installed a copy of partition {} after batch {batch} ({rows} rows) in {:?}",
            self.id,
            self.part.0,
            started.elapsed()
        );
        self.tell_instance(|| QMsg::Rebuild(RebuildMsg::Rebuilt { gen }));
    }

    /// Back in service once every node of the instance installed the same copy: delivers
    /// the entries held after it, in log order (on the member's thread, before any later
    /// entry).
    fn serve_if_rebuilt(&self) {
        if !self.stale.load(Ordering::Acquire) {
            return;
        }
        let held = {
            let mut r = self.rebuild.state.lock();
            let Some(held) = r.serve_if_whole(self.ctx.nodes()) else {
                return;
            };
            self.rebuild.begin_replay();
            self.stale.store(false, Ordering::Release);
            held
        };
        let placement = &self.ctx.placement;
        placement.mark_rebuilt(placement.instance_of(self.id));
        {
            let mut state = self.state.lock();
            self.hold(&mut state);
            state.batches.event();
        }
        tracing::warn!(
            "node {}: rebuilt, back in service; replaying {} entries of its group's log",
            self.id,
            held.len()
        );
        self.watch.progressed();
        for (proposer, entry) in held {
            self.apply_logged(proposer, false, entry);
        }
        self.rebuild.end_replay();
        self.notify();
    }

    /// Sends the stale instances that want it the copy of this node's partition after
    /// `batch`, then the outcomes of the transactions its group's log held, once no thread
    /// is answering batches (those taken before the copy are answered then).
    fn send_copies(&self, wanted: &[CopyFor], batch: u64, rows: Vec<Vec<u8>>) {
        let send = |to, msg| self.net.send(self.id, to, QMsg::Rebuild(msg));
        let answered = || self.answering.load(Ordering::Acquire) == 0;
        let outcomes = || self.dedup.lock().finished_outcomes();
        let part = self.part_id();
        rebuild::send_copies(
            &self.ctx, part, &send, wanted, batch, rows, answered, outcomes,
        );
    }

    /// Handles a message of a rebuild (see `rebuild`).
    fn on_rebuild(&self, from: NodeId, msg: RebuildMsg) {
        // The leader of group 0 serves copies (catching up or not: it marks its next plan).
        let serves = self.ctx.placement.leader(self.part_id()) == Some(self.id)
            && !self.stale.load(Ordering::Acquire);
        self.with_seat(|seat| self.rebuild.on_msg(seat, from, msg, serves));
        // An idle source plans the batch that marks a wanted copy (`plan_if_due`).
        self.notify();
    }

    /// Answers `NotLeader` to every client waiting here: this node no longer leads its group
    /// (or its instance is stale). A transaction whose batch the log did commit is answered
    /// by the new leader when it is resubmitted.
    fn redirect_home(&self) {
        let outcome = self.not_leader();
        let mut waiting = self.dedup.lock().take_waiting();
        {
            let mut state = self.state.lock();
            // Each one may still commit (its batch may be in the log already): it keeps its
            // call, so that this instance records it in its history as the others do.
            let mut take = |t: &mut HomeTxn| {
                let req = t.req.take()?;
                t.call = Some(req.call.clone());
                Some(req)
            };
            let home = state.home.values_mut().flat_map(|hb| hb.txns.iter_mut());
            waiting.extend(home.filter_map(&mut take));
            let unlogged = state.unlogged.values_mut().flat_map(|d| d.txns.iter_mut());
            waiting.extend(unlogged.filter_map(&mut take));
        }
        for p in &self.planners {
            waiting.extend(p.queue.try_iter().map(|a| a.req));
        }
        for req in waiting {
            req.answer(outcome.clone());
        }
    }
    /// The planner of this node's group that has `rank`, if one does.
    fn planner_of(&self, rank: u32) -> Option<&Planner> {
        let p = rank.checked_sub(self.rank(0))?;
        self.planners.get(p as usize).map(|p| &**p)
    }
}

impl HomeTxn {
    /// What the log carries of it; its call too if `with_call` (for the history).
    fn context(&self, with_call: bool) -> TxnContext {
        TxnContext {
            id: self.id,
            key: self.key,
            n_accesses: self.n_accesses,
            may_abort: self.may_abort,
            call: self
                .req
                .as_ref()
                .filter(|_| with_call)
                .map(|r| r.call.clone()),
            fate: None,
        }
    }

    /// A transaction another member of the group planned.
    fn replica(c: &TxnContext) -> Self {
        HomeTxn {
            id: c.id,
            key: c.key,
            req: None,
            n_accesses: c.n_accesses,
            may_abort: c.may_abort,
            call: c.call.clone(),
            fate: c.fate.clone(),
        }
    }
}

impl NodeShell for QNode {
    fn close_admission(&self) {
        self.admission.queues.write().take();
    }

    fn log_position(&self) -> Option<LogPosition> {
        if self.stale.load(Ordering::Acquire) {
            return None;
        }
        LogPosition::of(self.part.0, self.member.get())
    }

    fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.notify();
    }

    /// Whether nothing this node knows of is in flight: no batch of its planners unanswered,
    /// no transaction undecided here.
    fn quiescent(&self) -> bool {
        let stale = self.stale.load(Ordering::Acquire);
        if let Some(answer) = self.rebuild.quiescence(stale, &self.ctx, self.id) {
            return answer;
        }
        let state = self.state.lock();
        state.home.is_empty()
            && state.unlogged.is_empty()
            && state.spec.is_idle()
            && state.fates.values().all(|f| f.decided)
            && self.member.get().is_none_or(GroupMember::settled)
    }

    /// Transactions this node is home to, answered or waiting for their batch's log entry.
    fn in_flight(&self) -> usize {
        let state = self.state.lock();
        state.home.len() + state.unlogged.len()
    }

    /// Answers requests still queued at shutdown.
    fn reject_leftovers(&self) {
        {
            let state = self.state.lock();
            let queued: usize = self.planners.iter().map(|p| p.queue.len()).sum();
            // A stale node's leftovers are expected (it stopped mid-run): it said why then.
            let stale = self.stale.load(Ordering::Acquire);
            if !stale && (!state.home.is_empty() || queued > 0) {
                let undecided: Vec<_> = state
                    .fates
                    .iter()
                    .filter(|(_, f)| !f.decided)
                    .map(|(p, f)| (p.batch, p.rank, p.seq, f.passed, f.needed))
                    .collect();
                let planned = self.planners_at();
                tracing::warn!(
                    "node {} stopped with {} planned batches unanswered and {queued} requests \
                     unplanned; planners at batches {planned:?}, retired {}, {}; {} held \
                     records, undecided fates (batch, rank, seq, passed, needed) {undecided:?}; {}",
                    self.id,
                    state.home.len(),
                    state.retired,
                    state.batches.describe_oldest(),
                    state.dirty.len(),
                    state.spec.describe()
                );
            }
        }
        for p in &self.planners {
            for Admitted { req, .. } in p.queue.try_iter() {
                reply(
                    &req,
                    TxnOutcome::Rejected("cluster is shutting down".into()),
                );
            }
        }
        let mut state = self.state.lock();
        let unlogged = std::mem::take(&mut state.unlogged)
            .into_values()
            .map(|d| d.txns);
        let home = std::mem::take(&mut state.home)
            .into_values()
            .map(|hb| hb.txns);
        for t in home.chain(unlogged).flatten() {
            if let Some(req) = &t.req {
                let why = "cluster is shutting down".into();
                reply(req, TxnOutcome::Rejected(why));
            }
        }
    }
}

/// Read-committed with speculation: a committed copy of a record taken after a write that was
/// since rolled back holds that write. Every write of a restored record since planner batch
/// `since` began was undone, so copies kept for later ones become the record as it is now.
fn refresh_committed_copies(
    images: &mut FxHashMap<RecordKey, Vec<CommittedCopy>>,
    store: &qstore_storage::PartitionStore,
    restored: &[(RecordKey, PlannerBatch)],
) {
    for &((table, key), since) in restored {
        let Some(copies) = images.get_mut(&(table, key)) else {
            continue;
        };
        let t = store.table(table);
        let Some(rid) = t.lookup(key) else {
            continue;
        };
        for (_, version, bytes) in copies.iter_mut().filter(|(at, _, _)| *at > since) {
            *version = t.version(rid);
            // SAFETY: the caller holds every writer queue of the node, and the node lock
            // keeps read-only queues off the copies.
            bytes.copy_from_slice(unsafe { t.row(rid) });
        }
    }
}

/// Why a transaction aborts.
enum Fate {
    /// It failed an integrity check (logic-induced; final, not retried).
    Abort(String),
    /// Speculative mode: it touched a write that was rolled back (retried by the client).
    Cascade,
}

/// Speculative mode: decides the fates of a planner's batch of `n` transactions from what
/// the nodes reported, in planning order (a transaction that touched an aborted
/// transaction's write aborts too; that takes precedence over its own checks, which it ran
/// on data that did not stand).
fn speculative_fates(n: usize, mut notes: Vec<FateNote>) -> Vec<Option<Fate>> {
    notes.sort_by_key(|note| note.seq);
    let mut fates: Vec<Option<Fate>> = (0..n).map(|_| None).collect();
    for note in notes {
        let seq = note.seq as usize;
        if seq >= n {
            continue;
        }
        let cascade = note.cascade
            || note
                .after
                .iter()
                .any(|&a| (a as usize) < seq && fates[a as usize].is_some());
        if cascade {
            fates[seq] = Some(Fate::Cascade);
        } else if let (Some(why), None) = (note.abort, &fates[seq]) {
            fates[seq] = Some(Fate::Abort(why));
        }
    }
    fates
}

/// The outputs of a planner's batch, as the nodes that ran its queues reported them: one list
/// per queue run, each in planning order (a queue runs its fragments in that order). Taking
/// the transactions' outputs in planning order is then a merge, with no per-access lookups.
struct Gather {
    lists: Outputs,
    cursors: Vec<usize>,
}

impl Gather {
    fn new(lists: Outputs) -> Self {
        Gather {
            cursors: vec![0; lists.len()],
            lists,
        }
    }

    /// The outputs of transaction `seq` (Null where none was reported), for `seq`s asked in
    /// increasing order. Entries of earlier transactions not asked for (aborted ones) are
    /// passed over, as are any a faulty peer sent out of order or out of range.
    fn take(&mut self, seq: u32, n_accesses: u16) -> Vec<Value> {
        let mut values = vec![Value::Null; n_accesses as usize];
        for (list, at) in self.lists.iter_mut().zip(&mut self.cursors) {
            while let Some(o) = list.get_mut(*at).filter(|o| o.seq <= seq) {
                if o.seq == seq {
                    if let Some(slot) = values.get_mut(o.idx as usize) {
                        *slot = std::mem::take(&mut o.value);
                    }
                }
                *at += 1;
            }
        }
        values
    }
}

impl TxnFate {
    fn new(needed: u16) -> Self {
        TxnFate {
            needed,
            ..Default::default()
        }
    }
}

impl NodeState {
    /// The position (batch, planner rank) of the oldest transaction undecided here (holding
    /// records and before-images), in either mode.
    fn oldest_undecided(&self) -> Option<PlannerBatch> {
        let conservative = self.fates.iter().filter(|(_, f)| !f.decided);
        conservative
            .map(|(p, _)| (p.batch, p.rank))
            .chain(self.spec.oldest_undecided())
            .min()
    }

    /// Keeps a forwarded value; `n` sizes the table when known (u16::MAX: grow as needed).
    fn store_value(&mut self, pos: TxnPos, n: u16, idx: u16, value: Value) {
        self.batches.event();
        let table = self.values.entry(pos).or_default();
        let want = if n == u16::MAX {
            idx as usize + 1
        } else {
            n as usize
        };
        if table.len() < want.max(idx as usize + 1) {
            table.resize(want.max(idx as usize + 1), None);
        }
        table[idx as usize] = Some(value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(seq: u32, idx: u16, v: i64) -> Output {
        Output {
            seq,
            idx,
            value: Value::Int(v),
        }
    }

    #[test]
    fn gather_merges_queue_lists_in_planning_order() {
        // Two queues' runs (the first one stalled once, so it came in two lists); transaction
        // 1 aborted and is not asked for.
        let lists = vec![
            vec![out(0, 0, 10), out(1, 0, 11)],
            vec![out(0, 1, 20), out(1, 2, 21), out(2, 1, 22)],
            vec![out(2, 0, 12)],
        ];
        let mut g = Gather::new(lists);
        assert_eq!(g.take(0, 2), vec![Value::Int(10), Value::Int(20)]);
        assert_eq!(
            g.take(2, 3),
            vec![Value::Int(12), Value::Int(22), Value::Null]
        );
    }

    #[test]
    fn gather_passes_over_faulty_entries() {
        // Out of planning order and out of the program's range: ignored, never a panic.
        let lists = vec![vec![out(1, 0, 1), out(0, 0, 2), out(1, 9, 3), out(2, 0, 4)]];
        let mut g = Gather::new(lists);
        assert_eq!(g.take(0, 1), vec![Value::Null]);
        assert_eq!(g.take(1, 1), vec![Value::Int(1)]);
        assert_eq!(g.take(2, 1), vec![Value::Int(4)]);
        assert_eq!(g.take(3, 1), vec![Value::Null]);
    }
}
