//! Concurrency-control protocols, one folder each. A protocol is chosen at run time by name.

pub mod calvin;
pub(crate) mod checkpoint;
pub use checkpoint::load_into as load_checkpoint;
pub mod hstore;
pub(crate) mod interactive;
pub mod leap;
pub(crate) mod locks;
pub mod maat;
pub mod mvcc;
pub mod occ;
pub mod qstore;
pub mod serial;
mod shell;
pub mod sundial;
#[cfg(test)]
pub(crate) mod testing;
pub mod timestamp;
pub mod twopl;

use crate::cluster::EngineCtx;
use crate::history::{HistoryRecorder, TxnTrace};
use crossbeam_channel::{SendError, Sender, TrySendError};
use qstore_core::txn::{CcAbortCause, ProcCall, TxnKey, TxnOutcome, TxnResponse, Value};
use qstore_core::{ConfigError, NodeId, QError, TxnId};
use qstore_net::NetCounters;
use std::sync::Arc;
use std::time::Instant;

/// Where the answer to a request goes: a channel, and optionally a wake-up for a thread that
/// waits on something else as well (a server's I/O thread waits on its sockets).
#[derive(Clone)]
pub struct ReplyTo {
    tx: Sender<TxnResponse>,
    wake: Option<Arc<dyn Wake>>,
}

/// Wakes the reader of a [`ReplyTo`]'s channel after an answer was sent.
pub trait Wake: Send + Sync {
    fn wake(&self);
}

impl ReplyTo {
    /// Answers go to `tx`, and `wake` is called after each one.
    pub fn with_wake(tx: Sender<TxnResponse>, wake: Arc<dyn Wake>) -> Self {
        ReplyTo {
            tx,
            wake: Some(wake),
        }
    }

    /// Sends an answer; fails only when the receiver is gone.
    #[inline]
    pub fn send(&self, r: TxnResponse) -> Result<(), SendError<TxnResponse>> {
        self.tx.send(r)?;
        if let Some(w) = &self.wake {
            w.wake();
        }
        Ok(())
    }
}

impl From<Sender<TxnResponse>> for ReplyTo {
    fn from(tx: Sender<TxnResponse>) -> Self {
        ReplyTo { tx, wake: None }
    }
}

/// A request on a node's admission queue: the node it was submitted at, and when (if the
/// protocol times its stages and this request is in the sample).
pub(crate) struct Admitted {
    pub home: NodeId,
    pub req: TxnRequest,
    pub at: Option<Instant>,
}

/// A node's bounded admission queue.
pub(crate) type AdmissionQueue = Sender<Admitted>;

/// A transaction attempt submitted by a client at its home node.
pub struct TxnRequest {
    pub id: TxnId,
    /// Shared so a client can resubmit the same call after an abort without copying it.
    pub call: Arc<ProcCall>,
    pub reply: ReplyTo,
    /// When the transaction was first submitted, in microseconds since the UNIX epoch on the
    /// client's clock. Every retry carries the first attempt's value, so protocols that
    /// favour old transactions (WAIT_DIE) keep a retried transaction's age.
    pub birth_us: u64,
    /// The submitter has nothing else to do until the answer comes: a protocol may run the
    /// transaction on the submitting thread (an idle Q-Store node does). A submitter with
    /// more work waiting (more requests to send, answers to handle) leaves it false, so the
    /// node's threads take the transaction and it goes on.
    pub inline: bool,
    /// The client's name for this attempt (see [`TxnKey`]): a replicated cluster runs an
    /// attempt once however often it is resubmitted. Zeros: no name.
    pub key: TxnKey,
}

impl TxnRequest {
    /// Answers the request, letting go of the call first: a client that finds itself its
    /// only holder builds its next transaction in the same memory.
    pub fn answer(self, outcome: TxnOutcome) {
        let TxnRequest {
            id, call, reply, ..
        } = self;
        drop(call);
        let _ = reply.send(TxnResponse { id, outcome });
    }

    /// A first attempt, born now.
    pub fn new(id: TxnId, call: Arc<ProcCall>, reply: impl Into<ReplyTo>) -> Self {
        TxnRequest {
            id,
            call,
            reply: reply.into(),
            birth_us: wall_clock_us(),
            inline: false,
            key: TxnKey::default(),
        }
    }
}

/// Microseconds since the UNIX epoch (0 if the clock is before it).
pub fn wall_clock_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// A running protocol instance serving a whole cluster.
pub trait Engine: Send + Sync {
    /// Submits `req` at node `home`. Never blocks: when the node's admission queue is full the
    /// request is answered at once with a concurrency-control abort of cause `Overload`.
    fn submit(&self, home: NodeId, req: TxnRequest);
    /// Submits several requests at node `home` at once; a protocol may then treat them as
    /// one arrival (Q-Store plans them into one batch on an idle node).
    fn submit_all(&self, home: NodeId, reqs: Vec<TxnRequest>) {
        for req in reqs {
            self.submit(home, req);
        }
    }
    /// Message counters, for protocols that exchange messages between nodes.
    fn net_counters(&self) -> Option<&NetCounters>;
    /// Stops every thread of the protocol; requests still queued are answered `Rejected`.
    fn shutdown(&self);
    /// Time per stage of a transaction's life so far, summed over this process's nodes, for
    /// protocols that measure it.
    fn stages(&self) -> Option<crate::stages::StageSnapshot> {
        None
    }
    /// Where the worker threads of each of this process's nodes spent their time so far, by
    /// activity (see [`crate::worker_time`]), for protocols that account it. Totals only
    /// grow, so a run reports what its measurement window added.
    fn worker_time(&self) -> Vec<(NodeId, crate::stages::StageTotals)> {
        Vec::new()
    }
    /// Whether what this process's nodes recovered from their data directories has been
    /// re-executed and decided: a restarted server waits for it before it serves clients,
    /// so that nothing of a recovered log is still running under their transactions (their
    /// results, the history and the state a client collects then agree).
    fn recovered(&self) -> bool {
        true
    }
    /// The protocol's own account of this process's nodes, for a check after the run that
    /// needs every node's ([`check_audits`]): LEAP's record ownership. Encoded, so that a
    /// server can hand it to the client that verifies the run.
    fn audit(&self) -> Option<Vec<u8>> {
        None
    }
    /// The protocol's own event counts so far, summed over this process's nodes, by
    /// name (e.g. LEAP's transfers by case). They only grow, so a run reports what its
    /// measurement window added.
    fn counters(&self) -> ProtocolCounters {
        ProtocolCounters::new()
    }
}

/// A protocol's event counts by name (see [`Engine::counters`]).
pub type ProtocolCounters = std::collections::BTreeMap<String, u64>;

/// Checks the accounts ([`Engine::audit`]) of every node of a cluster that ran `protocol`
/// with partition map `pmap`: `None` when the protocol keeps none.
pub fn check_audits(
    protocol: &str,
    pmap: &qstore_core::partition::PartitionMap,
    parts: &[Vec<u8>],
) -> Option<Result<String, String>> {
    match info(protocol) {
        Some(p) if p.moves_records => Some(leap::check_audit_parts(pmap, parts)),
        _ => None,
    }
}

type Constructor = fn(Arc<EngineCtx>) -> Result<Box<dyn Engine>, QError>;

/// A protocol as the command line and the checkers know it.
pub struct ProtocolInfo {
    /// The `--protocol` name.
    pub name: &'static str,
    /// Whether a serial replay of its serialization order must reproduce its final state
    /// (the serial oracle applies).
    pub deterministic: bool,
    /// Whether it moves records between nodes (LEAP): every node's tables then have room
    /// for every record of the cluster.
    pub moves_records: bool,
    pub summary: &'static str,
    start: Constructor,
}

/// Every protocol.
pub const PROTOCOLS: &[ProtocolInfo] = &[
    ProtocolInfo {
        name: "serial",
        deterministic: true,
        moves_records: false,
        summary: "one thread runs every transaction of the cluster in turn, no concurrency control",
        start: serial::start,
    },
    ProtocolInfo {
        name: "qstore",
        deterministic: true,
        moves_records: false,
        summary: "Q-Store: planned batches of prioritised execution queues, no two-phase commit",
        start: qstore::start,
    },
    ProtocolInfo {
        name: "calvin",
        deterministic: true,
        moves_records: false,
        summary: "Calvin: sequenced epochs, deterministic locking (lock table or VLL), no two-phase commit",
        start: calvin::start,
    },
    ProtocolInfo {
        name: "hstore",
        deterministic: false,
        moves_records: false,
        summary: "H-Store: one transaction at a time per partition, partitions taken in order, 2PC",
        start: hstore::start,
    },
    ProtocolInfo {
        name: "no_wait",
        deterministic: false,
        moves_records: false,
        summary: "two-phase locking, abort on any lock conflict, two-phase commit",
        start: twopl::start_no_wait,
    },
    ProtocolInfo {
        name: "wait_die",
        deterministic: false,
        moves_records: false,
        summary: "two-phase locking, wait only for younger lock holders (else abort), 2PC",
        start: twopl::start_wait_die,
    },
    ProtocolInfo {
        name: "dl_detect",
        deterministic: false,
        moves_records: false,
        summary: "two-phase locking, wait on any conflict, cluster-wide deadlock detection (youngest of a cycle aborts), 2PC",
        start: twopl::start_dl_detect,
    },
    ProtocolInfo {
        name: "timestamp",
        deterministic: false,
        moves_records: false,
        summary: "basic timestamp ordering: reads and buffered writes checked against per-row timestamps, 2PC",
        start: timestamp::start,
    },
    ProtocolInfo {
        name: "mvcc",
        deterministic: false,
        moves_records: false,
        summary: "multi-version timestamp ordering: reads of the past take older versions and never abort, 2PC",
        start: mvcc::start,
    },
    ProtocolInfo {
        name: "occ",
        deterministic: false,
        moves_records: false,
        summary: "optimistic (Google F1): read phase on copies, then lock, validate and install at commit, 2PC",
        start: occ::start,
    },
    ProtocolInfo {
        name: "maat",
        deterministic: false,
        moves_records: false,
        summary: "MaaT: commit-timestamp ranges per transaction, shrunk at validation to order conflicts; commit at the smallest common timestamp, 2PC",
        start: maat::start,
    },
    ProtocolInfo {
        name: "sundial",
        deterministic: false,
        moves_records: false,
        summary: "Sundial: logical leases per row; commit at a timestamp inside every lease, renewed at prepare; write locks WAIT_DIE, 2PC",
        start: sundial::start,
    },
    ProtocolInfo {
        name: "lstore",
        deterministic: false,
        moves_records: true,
        summary: "LEAP (L-Store): records move to the node of the transaction that needs them, which then runs and commits locally; no 2PC",
        start: leap::start_lstore,
    },
    ProtocolInfo {
        name: "hlstore",
        deterministic: false,
        moves_records: true,
        summary: "LEAP on H-Store (H^L-Store): one transaction at a time per partition; records move to the transaction's node instead of 2PC",
        start: leap::start_hlstore,
    },
];

/// Names accepted by `--protocol`.
pub fn names() -> Vec<&'static str> {
    PROTOCOLS.iter().map(|p| p.name).collect()
}

/// The protocol called `name`.
pub fn info(name: &str) -> Option<&'static ProtocolInfo> {
    PROTOCOLS.iter().find(|p| p.name == name)
}

pub(crate) fn start(name: &str, ctx: Arc<EngineCtx>) -> Result<Box<dyn Engine>, QError> {
    match info(name) {
        Some(p) => (p.start)(ctx),
        None => Err(unknown_protocol(name).into()),
    }
}

/// The error for a `--protocol` name that is not implemented.
pub fn unknown_protocol(name: &str) -> ConfigError {
    ConfigError::new(
        "protocol.name",
        name,
        format!("unknown protocol; choose one of: {}", names().join(", ")),
    )
}

/// How a transaction ended, as its home decided. `order` is its position in the protocol's
/// serialization order.
pub(crate) enum Ending {
    Committed { order: u128, outputs: Vec<Value> },
    LogicAbort { order: u128, why: String },
    CcAbort(CcAbortCause),
}

impl Ending {
    /// The answer, where no history records it (a replica's copy of a transaction).
    pub(crate) fn outcome(self) -> TxnOutcome {
        match self {
            Ending::Committed { outputs, .. } => TxnOutcome::Committed(outputs),
            Ending::LogicAbort { why, .. } => TxnOutcome::LogicAbort(why),
            Ending::CcAbort(cause) => TxnOutcome::CcAbort(cause),
        }
    }
}

/// The one place every protocol ends a transaction: records the end in the run's history
/// (when one is kept) with what the transaction read and wrote at home (`trace`; what it did
/// elsewhere was recorded there), and returns the answer its client gets.
pub(crate) fn settle(
    history: Option<&HistoryRecorder>,
    home: NodeId,
    id: TxnId,
    call: &Arc<ProcCall>,
    trace: &TxnTrace,
    ending: Ending,
) -> TxnOutcome {
    match ending {
        Ending::Committed { order, outputs } => {
            if let Some(h) = history {
                h.commit(home, id, call, trace, order);
            }
            TxnOutcome::Committed(outputs)
        }
        Ending::LogicAbort { order, why } => {
            if let Some(h) = history {
                h.logic_abort(home, id, call, &why, trace, order);
            }
            TxnOutcome::LogicAbort(why)
        }
        Ending::CcAbort(cause) => {
            if let Some(h) = history {
                h.cc_abort(home, id, cause, trace);
            }
            TxnOutcome::CcAbort(cause)
        }
    }
}

/// Answers a request. A client that went away no longer needs the answer, so a failed send
/// is ignored.
pub(crate) fn reply(req: &TxnRequest, outcome: TxnOutcome) {
    let _ = req.reply.send(TxnResponse {
        id: req.id,
        outcome,
    });
}

/// The node of `nodes` (indexed by node id; `None` where another process hosts it) that
/// `home` names, or `req` answered `Rejected` with the reason it has none here.
pub(crate) fn home_node<'a, N>(
    nodes: &'a [Option<N>],
    home: NodeId,
    req: &TxnRequest,
) -> Option<&'a N> {
    match nodes.get(home.index()) {
        Some(Some(node)) => Some(node),
        Some(None) => {
            let why = format!("node {home} is not hosted by this process");
            reply(req, TxnOutcome::Rejected(why));
            None
        }
        None => {
            reply(req, TxnOutcome::Rejected(format!("no node {home}")));
            None
        }
    }
}

/// Puts a request on a node's bounded admission queue without blocking: a full queue answers
/// a concurrency-control abort of cause `Overload` (the client backs off and retries), and a
/// closed one (`None`, or no receiver) answers `Rejected`.
pub(crate) fn admit(
    queue: Option<&AdmissionQueue>,
    home: NodeId,
    req: TxnRequest,
    at: Option<Instant>,
    history: Option<&HistoryRecorder>,
) {
    let closed =
        |req: &TxnRequest| reply(req, TxnOutcome::Rejected("cluster is shutting down".into()));
    let Some(queue) = queue else {
        return closed(&req);
    };
    match queue.try_send(Admitted { home, req, at }) {
        Ok(()) => {}
        Err(TrySendError::Full(Admitted { home, req, .. })) => {
            let overload = Ending::CcAbort(CcAbortCause::Overload);
            let trace = TxnTrace::default();
            reply(
                &req,
                settle(history, home, req.id, &req.call, &trace, overload),
            );
        }
        Err(TrySendError::Disconnected(Admitted { req, .. })) => closed(&req),
    }
}
