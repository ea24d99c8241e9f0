//! LEAP (Lin et al., SIGMOD 2016): no two-phase commit, because no transaction is
//! distributed. A transaction runs entirely at its home node; a record it needs that another
//! node owns is first moved there, data and ownership together (see [`ownership`]). It then
//! commits locally, in one phase, and the record stays where it went until a transaction
//! elsewhere needs it: data follows the transactions that use it, so partitioning adapts to
//! the workload by itself.
//!
//! On the interactive skeleton LEAP is a concurrency control whose every access runs at home
//! ([`Cc::RUNS_AT_HOME`]): its access gate brings the record home before it takes the
//! record's data lock (strict 2PL with wait-die, the paper's section 4.1).
//!
//! - `lstore`: any worker of a node serves any of its transactions (L-Store).
//! - `hlstore`: H-Store's partitions, each serving one transaction at a time (`hstore`'s
//!   partition lock), with LEAP in place of two-phase commit (H^L-Store). A transfer out
//!   still takes the record's data lock, so a record the running transaction uses stays.
//!
//! With a data directory, every node logs its transactions' after-images (one-phase commits
//! of the interactive skeleton's write-ahead log) and its notes about the records it moves
//! (see [`ownership`]); a restarted node puts back the rows it owned and what it knew of
//! every transfer, and the transfers a crash interrupted go on where they stopped. The
//! paper coordinates recovery through ZooKeeper and a distributed storage, to which the
//! survivors flush the records of the failed node; here every step of a transfer is noted
//! before its message is sent and the old owner keeps its backup until the transfer ended,
//! so the restarted node's own log is enough, and the other nodes need not do anything.
//! A node down stalls the transfers that need it until it is back (as a partition's node
//! does under every other unreplicated protocol here). Not built: replication.

mod msg;
pub(crate) mod ownership;
#[cfg(test)]
mod tests;

use self::msg::Msg;
use self::ownership::{Effects, Held, Journal, NodeAudit, Ownership, Timers};
use crate::cluster::EngineCtx;
use crate::protocol::hstore::PartitionLock;
use crate::protocol::interactive::{self, Attempt, Cc, Gate, NoteMap, Port};
use crate::protocol::Engine;
use parking_lot::Mutex;
use qstore_core::partition::PartitionMap;
use qstore_core::{Key, NodeId, QError, TableId, TxnId};
use qstore_storage::PartitionStore;
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

/// LEAP's concurrency control at one node, with the partition reservation `R` of its
/// system (none for L-Store, H-Store's for H^L-Store).
struct Leap<R> {
    me: NodeId,
    ctx: Arc<EngineCtx>,
    own: Arc<Ownership>,
    port: OnceLock<Weak<dyn Port>>,
    partition: R,
}

/// How a LEAP system takes its partition before a transaction runs there.
trait Reservation: Default + Send + Sync + 'static {
    const RESERVES: bool;
    fn reserve(&self, txn: TxnId, held: &mut bool) -> Gate;
    fn release(&self, txn: TxnId, held: &mut bool, woken: &mut Vec<TxnId>);
}

/// L-Store: transactions share a node, record by record.
#[derive(Default)]
struct Shared;

impl Reservation for Shared {
    const RESERVES: bool = false;
    fn reserve(&self, _: TxnId, _: &mut bool) -> Gate {
        Gate::Go
    }
    fn release(&self, _: TxnId, _: &mut bool, _: &mut Vec<TxnId>) {}
}

impl Reservation for PartitionLock {
    const RESERVES: bool = true;
    fn reserve(&self, txn: TxnId, held: &mut bool) -> Gate {
        PartitionLock::reserve(self, txn, held)
    }
    fn release(&self, txn: TxnId, held: &mut bool, woken: &mut Vec<TxnId>) {
        PartitionLock::release(self, txn, held, woken)
    }
}

/// What a transaction holds at its node: the partition (H^L-Store), and its records.
#[derive(Default)]
struct LeapHeld {
    partition: bool,
    records: Held,
}

impl<R> Leap<R> {
    fn store(&self) -> &PartitionStore {
        self.ctx.server_store(self.me)
    }

    /// Sends what a call of [`Ownership`] decided and wakes whom it woke (`woken`: the
    /// skeleton's list, when it has one).
    fn act(&self, fx: Effects, woken: Option<&mut Vec<TxnId>>) {
        let Some(port) = self.port.get().and_then(Weak::upgrade) else {
            return; // the node is gone: nothing runs any more
        };
        let encoded = fx.send.into_iter().map(|(to, txn, msg)| {
            let bytes = postcard::to_stdvec(&msg).expect("transfer messages serialize");
            (to, txn, bytes)
        });
        match fx.after {
            // A note could not be written: nothing that follows from it may go.
            _ if fx.unlogged => {}
            Some(lsn) => port.send_peer_after(lsn, encoded.collect()),
            None => encoded.for_each(|(to, txn, bytes)| port.send_peer(to, txn, bytes)),
        }
        match woken {
            Some(w) => w.extend(fx.wake),
            None if fx.wake.is_empty() => {}
            None => port.wake(fx.wake),
        }
    }
}

impl<R: Reservation> Cc for Leap<R> {
    type Held = LeapHeld;

    const RUNS_AT_HOME: bool = true;
    const RESERVES_PARTITIONS: bool = R::RESERVES;
    const TICK: Option<Duration> = Some(Duration::from_millis(20));

    fn attach(&self, port: Weak<dyn Port>) {
        if self.ctx.data_dirs[self.me.index()].is_some() {
            self.own.keep_notes(Box::new(PortJournal(port.clone())));
        }
        let _ = self.port.set(port);
    }

    fn recovered(&self, notes: &NoteMap, starts: u64) -> Result<(), QError> {
        let notes = notes.iter().map(|(&r, kept)| (r, kept.as_slice()));
        self.own
            .restore(notes, starts)
            .map_err(|why| QError::Other(format!("node {}: the log holds {why}", self.me)))
    }

    fn access(
        &self,
        txn: TxnId,
        at: &Attempt,
        table: TableId,
        key: Key,
        write: bool,
        held: &mut LeapHeld,
    ) -> Gate {
        debug_assert!(held.partition || !R::RESERVES, "{txn:?} did not reserve");
        let mut fx = Effects::default();
        let r = (table, key);
        let gate = self
            .own
            .access(txn, at.age, r, write, &mut held.records, &mut fx);
        self.act(fx, None);
        gate
    }

    fn reserve(&self, txn: TxnId, _: &Attempt, held: &mut LeapHeld) -> Gate {
        self.partition.reserve(txn, &mut held.partition)
    }

    fn release(&self, txn: TxnId, held: &mut LeapHeld, woken: &mut Vec<TxnId>) {
        let mut fx = Effects::default();
        self.own
            .release(self.store(), txn, &mut held.records, &mut fx);
        self.act(fx, Some(woken));
        self.partition.release(txn, &mut held.partition, woken);
    }

    fn on_peer(&self, from: NodeId, txn: TxnId, msg: &[u8]) {
        let msg: Msg = match postcard::from_bytes(msg) {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!("node {from} sent an unreadable ownership message: {e}");
                return;
            }
        };
        if let Some(why) = self.misplaced(&msg) {
            tracing::warn!("node {from} sent an ownership message {why}; ignored");
            return;
        }
        let mut fx = Effects::default();
        self.own.on_message(self.store(), from, txn, msg, &mut fx);
        self.act(fx, None);
    }

    fn tick(&self) {
        let mut fx = Effects::default();
        self.own.tick(Instant::now(), &mut fx);
        self.act(fx, None);
    }

    fn settled(&self) -> bool {
        self.own.settled()
    }
}

impl<R> Leap<R> {
    /// Why a peer's message cannot be taken, if it cannot: an unknown table or node, or a
    /// row of the wrong size.
    fn misplaced(&self, msg: &Msg) -> Option<String> {
        let tables = &self.ctx.catalog.tables;
        let (table, row) = match msg {
            Msg::OwnerRequest { table, .. }
            | Msg::Refused { table, .. }
            | Msg::Inform { table, .. }
            | Msg::Ended { table, .. } => (*table, None),
            Msg::TransferRequest { table, to, .. } => {
                if to.0 >= self.ctx.nodes() {
                    return Some(format!("naming node {to}, which does not exist"));
                }
                (*table, None)
            }
            Msg::Granted { table, row, .. } => (*table, Some(row)),
        };
        let Some(schema) = tables.get(table as usize) else {
            return Some(format!("about table {table}, which does not exist"));
        };
        match row {
            Some(msg::Shipped::Row { bytes, .. }) if bytes.len() != schema.row_size => {
                Some(format!(
                    "with a row of {} bytes for table {}",
                    bytes.len(),
                    schema.name
                ))
            }
            _ => None,
        }
    }
}

/// How long an audit waits for the transfers under way to end.
const SETTLE_WAIT: Duration = Duration::from_secs(2);

/// How often a transfer step unanswered is sent again, and how long an owner keeps the copy
/// of a record it shipped.
const TIMERS: Timers = Timers {
    resend: Duration::from_millis(500),
    backup: Duration::from_secs(30),
};

/// A node's notes go to its write-ahead log.
struct PortJournal(Weak<dyn Port>);

impl Journal for PortJournal {
    fn note(&self, r: (TableId, Key), kept: &[u8], image: Option<Option<&[u8]>>) -> Option<u64> {
        self.0.upgrade()?.log_note(r, kept, image)
    }

    fn written(&self) -> Option<u64> {
        self.0.upgrade()?.log_written()
    }
}

/// LEAP's engine: the skeleton's, and each hosted node's ownership for the audit.
struct LeapEngine {
    inner: Box<dyn Engine>,
    nodes: Vec<(Arc<Ownership>, NodeId)>,
    ctx: Arc<EngineCtx>,
}

impl Engine for LeapEngine {
    fn submit(&self, home: NodeId, req: crate::protocol::TxnRequest) {
        self.inner.submit(home, req)
    }

    fn net_counters(&self) -> Option<&qstore_net::NetCounters> {
        self.inner.net_counters()
    }

    fn shutdown(&self) {
        self.inner.shutdown()
    }

    fn stages(&self) -> Option<crate::stages::StageSnapshot> {
        self.inner.stages()
    }

    fn counters(&self) -> crate::protocol::ProtocolCounters {
        let mut all = crate::protocol::ProtocolCounters::new();
        for (own, _) in &self.nodes {
            own.counters.add_to(&mut all);
        }
        all
    }

    fn audit(&self) -> Option<Vec<u8>> {
        // A server is audited while it runs, right after its clients' last answer: the
        // informs of the last transfers may still be on their way.
        let deadline = Instant::now() + SETTLE_WAIT;
        while !self.nodes.iter().all(|(own, _)| own.settled()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let audits: Vec<NodeAudit> = self
            .nodes
            .iter()
            .map(|(own, me)| own.audit(self.ctx.server_store(*me)))
            .collect();
        Some(postcard::to_stdvec(&audits).expect("audits serialize to memory"))
    }
}

/// Checks the ownership accounts of every node ([`Engine::audit`], one part per process)
/// of a cluster with partition map `pmap` (see [`ownership::check_audits`]).
pub(crate) fn check_audit_parts(pmap: &PartitionMap, parts: &[Vec<u8>]) -> Result<String, String> {
    let mut audits = Vec::new();
    for part in parts {
        let mut some: Vec<NodeAudit> =
            postcard::from_bytes(part).map_err(|e| format!("unreadable ownership account: {e}"))?;
        audits.append(&mut some);
    }
    // One copy of each partition: node p is partition p's partitioner.
    let partitioner = |(table, key): (TableId, Key)| NodeId(pmap.partition_of(table, key).0);
    ownership::check_audits(&audits, partitioner)
}

fn start_with<R: Reservation>(
    ctx: Arc<EngineCtx>,
    timers: Timers,
    label: &str,
) -> Result<Box<dyn Engine>, QError> {
    let nodes = Mutex::new(Vec::new());
    let make = |store: &PartitionStore| {
        let me = ctx.node_of(store.id);
        let placed = ctx.clone();
        let partitioner = move |(table, key): (TableId, Key)| {
            placed.node_of(placed.pmap.partition_of(table, key))
        };
        let own = Arc::new(Ownership::new(me, partitioner, timers));
        nodes.lock().push((own.clone(), me));
        Leap {
            me,
            ctx: ctx.clone(),
            own,
            port: OnceLock::new(),
            partition: R::default(),
        }
    };
    let inner = interactive::start(ctx.clone(), make, label)?;
    Ok(Box::new(LeapEngine {
        inner,
        nodes: nodes.into_inner(),
        ctx,
    }))
}

/// L-Store: LEAP on multi-threaded nodes.
pub fn start_lstore(ctx: Arc<EngineCtx>) -> Result<Box<dyn Engine>, QError> {
    start_with::<Shared>(ctx, TIMERS, "ls")
}

/// H^L-Store: LEAP on H-Store's one-transaction-at-a-time partitions.
pub fn start_hlstore(ctx: Arc<EngineCtx>) -> Result<Box<dyn Engine>, QError> {
    start_with::<PartitionLock>(ctx, TIMERS, "hl")
}
