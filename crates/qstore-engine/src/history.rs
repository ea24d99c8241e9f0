//! Recording transaction histories for the checkers: for every finished attempt, the
//! versions it read and the records it wrote; per partition, the order in which committed
//! versions were installed; and the order in which the protocol serialized transactions (the
//! input of the serial oracle).
//!
//! Protocols fill a reusable [`TxnTrace`] while a transaction runs (the shared
//! [`run_access`](crate::exec::run_access) does it) and hand it to the recorder when the
//! transaction ends.

use parking_lot::Mutex;
use qstore_check::{History, ObjKey, Outcome, TxnRecord, Version};
use qstore_core::partition::PartitionMap;
use qstore_core::txn::{CcAbortCause, ProcCall};
use qstore_core::{NodeId, PartitionId, TableId, TxnId};
use qstore_storage::RowVersion;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// What one transaction attempt read and wrote, in access order.
#[derive(Clone, Default, Serialize, Deserialize)]
pub struct TxnTrace {
    reads: Vec<(ObjKey, Version)>,
    writes: Vec<ObjKey>,
}

impl TxnTrace {
    pub fn clear(&mut self) {
        self.reads.clear();
        self.writes.clear();
    }

    #[inline]
    pub fn read(&mut self, table: TableId, key: u64, v: RowVersion) {
        let version = Version {
            writer: v.writer.0,
            seq: v.seq as u32,
        };
        self.reads.push((ObjKey { table, key }, version));
    }

    #[inline]
    pub fn write(&mut self, table: TableId, key: u64) {
        self.writes.push(ObjKey { table, key });
    }

    /// Written records with their write counts, in first-write order.
    fn write_counts(&self) -> Vec<(ObjKey, u32)> {
        let mut counts: Vec<(ObjKey, u32)> = Vec::with_capacity(self.writes.len());
        for &k in &self.writes {
            match counts.iter_mut().find(|(x, _)| *x == k) {
                Some((_, n)) => *n += 1,
                None => counts.push((k, 1)),
            }
        }
        counts
    }
}

/// One entry of the serialization order: a transaction whose outcome was decided by its
/// program (committed or logic-aborted), which a serial replay must reproduce.
#[derive(Clone)]
pub struct Serialized {
    /// Position in the protocol's serialization order (sortable).
    pub order: u128,
    pub id: TxnId,
    pub call: Arc<ProcCall>,
    pub committed: bool,
}

/// How a transaction attempt ended, as its home decided.
#[derive(Clone, Serialize, Deserialize)]
pub enum Decision {
    Commit { order: u128 },
    LogicAbort { order: u128, why: String },
    CcAbort(CcAbortCause),
}

/// One node's part of a distributed run's history: the traces of the fragments that ran
/// there, and the decisions of the transactions it was home to. Merging every node's part
/// ([`HistoryRecorder::merge`]) gives the history of the run.
#[derive(Clone, Default, Serialize, Deserialize)]
pub struct HistoryPart {
    pub traces: Vec<(TxnId, TxnTrace)>,
    pub decisions: Vec<(NodeId, TxnId, ProcCall, Decision)>,
    /// See [`HistoryRecorder::bases`].
    #[serde(default)]
    pub bases: Vec<Base>,
}

/// Where a partition's history starts when not from the workload's initial data: the
/// checkpoint a recovered server restored (after `batch`), whose file is `path`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Base {
    pub partition: PartitionId,
    pub batch: u64,
    pub path: std::path::PathBuf,
}

/// Collects a run's history. Shared by every worker of every node.
pub struct HistoryRecorder {
    /// Distributed mode: a transaction's trace is spread over processes, so decisions are
    /// kept as they are and merged after the run.
    deferred: Option<Mutex<HistoryPart>>,
    pmap: PartitionMap,
    txns: Mutex<Vec<TxnRecord>>,
    /// Per partition: (serialization position, record, writer) of committed writes.
    installs: Vec<Mutex<Vec<(u128, ObjKey, u64)>>>,
    order: Mutex<Vec<Serialized>>,
    /// Trace parts recorded where a transaction's accesses ran (other nodes' fragments),
    /// merged into its record when it ends.
    parts: Mutex<FxHashMap<TxnId, TxnTrace>>,
    bases: Mutex<Vec<Base>>,
}

impl HistoryRecorder {
    pub fn new(pmap: PartitionMap) -> Self {
        let installs = (0..pmap.partitions())
            .map(|_| Mutex::new(Vec::new()))
            .collect();
        HistoryRecorder {
            deferred: None,
            pmap,
            txns: Mutex::new(Vec::new()),
            installs,
            order: Mutex::new(Vec::new()),
            parts: Mutex::new(FxHashMap::default()),
            bases: Mutex::new(Vec::new()),
        }
    }

    /// A recorder for one node of a distributed cluster: it keeps traces and decisions
    /// apart for [`HistoryRecorder::export`].
    pub fn deferred(pmap: PartitionMap) -> Self {
        HistoryRecorder {
            deferred: Some(Mutex::new(HistoryPart::default())),
            ..Self::new(pmap)
        }
    }

    /// This node's part of a distributed history (see [`HistoryRecorder::deferred`]): a
    /// copy of everything recorded since the node started. Exporting consumes nothing, so
    /// every client that collects sees the whole history.
    pub fn export(&self) -> HistoryPart {
        let mut part = self
            .deferred
            .as_ref()
            .map(|d| d.lock().clone())
            .unwrap_or_default();
        let parts = self.parts.lock();
        part.traces
            .extend(parts.iter().map(|(id, trace)| (*id, trace.clone())));
        part.bases = self.bases();
        part
    }

    /// Partition `partition`'s history starts from the checkpoint `path` (after `batch`),
    /// not from the initial data: the serial oracle replays onto it.
    pub fn set_base(&self, partition: PartitionId, batch: u64, path: std::path::PathBuf) {
        let mut bases = self.bases.lock();
        bases.retain(|b| b.partition != partition);
        bases.push(Base {
            partition,
            batch,
            path,
        });
    }

    /// The partitions whose history starts from a checkpoint (see [`Self::set_base`]).
    pub fn bases(&self) -> Vec<Base> {
        self.bases.lock().clone()
    }

    /// The history of a distributed run from every node's part.
    pub fn merge(pmap: PartitionMap, parts: Vec<HistoryPart>) -> Self {
        let rec = Self::new(pmap);
        let mut decisions = Vec::new();
        for p in parts {
            for (id, trace) in &p.traces {
                rec.add_part(*id, trace);
            }
            decisions.extend(p.decisions);
            for b in p.bases {
                rec.set_base(b.partition, b.batch, b.path);
            }
        }
        let none = TxnTrace::default();
        for (node, id, call, decision) in decisions {
            let call = Arc::new(call);
            match decision {
                Decision::Commit { order } => rec.commit(node, id, &call, &none, order),
                Decision::LogicAbort { order, why } => {
                    rec.logic_abort(node, id, &call, &why, &none, order)
                }
                Decision::CcAbort(cause) => rec.cc_abort(node, id, cause, &none),
            }
        }
        rec
    }

    /// Distributed mode: keeps the decision and the trace for the merge; false otherwise.
    fn defer(
        &self,
        node: NodeId,
        id: TxnId,
        call: Option<&Arc<ProcCall>>,
        trace: &TxnTrace,
        d: Decision,
    ) -> bool {
        let Some(part) = &self.deferred else {
            return false;
        };
        self.add_part(id, trace);
        let call = call.map(|c| (**c).clone()).unwrap_or_else(|| ProcCall {
            proc: qstore_core::txn::ProcId(0),
            args: Vec::new(),
        });
        part.lock().decisions.push((node, id, call, d));
        true
    }

    /// Adds what part of transaction `id` read and wrote (a fragment run away from the
    /// transaction's coordinator); merged into the record when the transaction ends.
    pub fn add_part(&self, id: TxnId, trace: &TxnTrace) {
        let mut parts = self.parts.lock();
        let t = parts.entry(id).or_default();
        t.reads.extend_from_slice(&trace.reads);
        t.writes.extend_from_slice(&trace.writes);
    }

    /// `trace` plus the parts recorded elsewhere.
    fn merged(&self, id: TxnId, trace: &TxnTrace) -> TxnTrace {
        let mut t = self.parts.lock().remove(&id).unwrap_or_default();
        t.reads.extend_from_slice(&trace.reads);
        t.writes.extend_from_slice(&trace.writes);
        t
    }

    /// Records a commit at position `order` of the protocol's serialization order (which
    /// orders the versions each record installs).
    pub fn commit(
        &self,
        node: NodeId,
        id: TxnId,
        call: &Arc<ProcCall>,
        trace: &TxnTrace,
        order: u128,
    ) {
        if self.defer(node, id, Some(call), trace, Decision::Commit { order }) {
            return;
        }
        let trace = self.merged(id, trace);
        let writes = trace.write_counts();
        for &(k, _) in &writes {
            let p = self.pmap.partition_of(k.table, k.key);
            self.installs[p.index()].lock().push((order, k, id.0));
        }
        self.push(node, id, Outcome::Committed, &trace, writes);
        self.order.lock().push(Serialized {
            order,
            id,
            call: call.clone(),
            committed: true,
        });
    }

    /// Records a logic-induced abort (part of the serialization order: replay must abort it
    /// too).
    pub fn logic_abort(
        &self,
        node: NodeId,
        id: TxnId,
        call: &Arc<ProcCall>,
        why: &str,
        trace: &TxnTrace,
        order: u128,
    ) {
        let d = Decision::LogicAbort {
            order,
            why: why.to_string(),
        };
        if self.defer(node, id, Some(call), trace, d) {
            return;
        }
        let outcome = Outcome::Aborted {
            cause: why.to_string(),
            logic: true,
        };
        let trace = self.merged(id, trace);
        self.push(node, id, outcome, &trace, trace.write_counts());
        self.order.lock().push(Serialized {
            order,
            id,
            call: call.clone(),
            committed: false,
        });
    }

    /// Records a concurrency-control abort.
    pub fn cc_abort(&self, node: NodeId, id: TxnId, cause: CcAbortCause, trace: &TxnTrace) {
        if self.defer(node, id, None, trace, Decision::CcAbort(cause)) {
            return;
        }
        let outcome = Outcome::Aborted {
            cause: cause.name().to_string(),
            logic: false,
        };
        let trace = self.merged(id, trace);
        self.push(node, id, outcome, &trace, trace.write_counts());
    }

    fn push(
        &self,
        node: NodeId,
        id: TxnId,
        outcome: Outcome,
        trace: &TxnTrace,
        writes: Vec<(ObjKey, u32)>,
    ) {
        let record = TxnRecord {
            id: id.0,
            node: node.0,
            outcome,
            reads: trace.reads.clone(),
            writes,
        };
        self.txns.lock().push(record);
    }

    /// The serialization order recorded so far.
    pub fn serialization_order(&self) -> Vec<Serialized> {
        let mut order = self.order.lock().clone();
        order.sort_by_key(|s| s.order);
        order
    }

    /// The history recorded so far, with each record's version order.
    pub fn history(&self) -> History {
        let txns = self.txns.lock().clone();
        let mut order: FxHashMap<ObjKey, Vec<u64>> = FxHashMap::default();
        let mut keys = Vec::new();
        for part in &self.installs {
            let mut installs = part.lock().clone();
            installs.sort_by_key(|&(order, _, _)| order);
            for (_, k, writer) in installs {
                order
                    .entry(k)
                    .or_insert_with(|| {
                        keys.push(k);
                        Vec::new()
                    })
                    .push(writer);
            }
        }
        let version_order = keys
            .into_iter()
            .map(|k| {
                let v = order.remove(&k).unwrap_or_default();
                (k, v)
            })
            .collect();
        History {
            txns,
            version_order,
        }
    }
}
