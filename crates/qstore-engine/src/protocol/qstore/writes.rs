//! QR-Store's third replication point: write-only execution queues.
//!
//! At point 3 only the instance that leads a group runs its planner batches. Each node that
//! runs a fragment keeps the after-image of every record the fragment wrote ([`capture`]),
//! and sends them to the batch's home with its acknowledgement. Once the home knows every
//! transaction's fate, it keeps, for each record, the image its last committed writer left
//! ([`write_only_queues`]): the batch's effect, with no transaction logic and no data
//! dependencies left. Those queues go to the group's log; every other member delivers them
//! in its own instance, where they run through the execution stage like any queue, in the
//! same global order (batch, group, planner), each operation putting an image in place
//! ([`apply`]).
//!
//! An image is the state a batch left only if everything ordered before the batch is what
//! the logs hold: a leader proposes a batch's writes only once every planner batch before it
//! is committed (see `LogGate::follows_committed`), so a write-only queue never carries the
//! effect of a plan that a fail-over dropped.

use super::msg::{Eq, Frag, FragRef, Op, OpExtra};
use super::plan::sub_of;
use qstore_core::partition::PartitionMap;
use qstore_core::txn::{AccessKind, StepId, Value};
use qstore_core::{NodeId, TableId, TxnId};
use qstore_storage::PartitionStore;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The step of a write-only queue's operations: put the image the operation carries in
/// place (a blind write with the row's bytes as its argument), or remove the row (a
/// delete). No catalog registers it (none has 65,535 steps).
pub(super) const IMAGE: StepId = StepId(u16::MAX);

/// A record as a fragment left it: transaction `seq` of its planner batch wrote it last in
/// the fragment, leaving `image` (`None`: the record is gone).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct Written {
    pub seq: u32,
    pub table: TableId,
    pub key: u64,
    pub image: Option<Vec<u8>>,
}

/// Whether `frag` is part of a write-only queue (its operations put images).
pub(super) fn is_write_only(frag: &FragRef<'_>) -> bool {
    frag.accesses.first().is_some_and(|op| op.step == IMAGE)
}

/// The after-images of the records `frag` (of transaction `seq`) wrote, read once it ran.
///
/// # Safety
/// As for running the fragment: its queue owns these records until it finishes.
pub(super) unsafe fn capture(store: &PartitionStore, seq: u32, frag: &FragRef<'_>) -> Vec<Written> {
    let mut out: Vec<Written> = Vec::new();
    for op in frag.accesses.iter().filter(|op| op.kind.is_write()) {
        if out.iter().any(|w| w.table == op.table && w.key == op.key) {
            continue;
        }
        let table = store.table(op.table);
        // SAFETY: the caller's queue owns the record, so nobody writes it meanwhile.
        let image = table
            .lookup(op.key)
            .map(|rid| unsafe { table.row(rid) }.to_vec());
        out.push(Written {
            seq,
            table: op.table,
            key: op.key,
            image,
        });
    }
    out
}

/// The write-only queues of a planner batch, by node of the instance, and the nodes that
/// have any: for every record, the image of its last writer among the committed
/// transactions (`committed(seq)`). `ids` names the batch's transactions by `seq`.
pub(super) fn write_only_queues(
    written: Vec<Written>,
    committed: impl Fn(u32) -> bool,
    ids: &[TxnId],
    pmap: &PartitionMap,
    subs: u32,
    nodes: usize,
) -> (Vec<Vec<Eq>>, Vec<NodeId>) {
    // The last committed image of each record (with its writer).
    let mut last: BTreeMap<(TableId, u64), Written> = BTreeMap::new();
    for w in written.into_iter().filter(|w| committed(w.seq)) {
        match last.get(&(w.table, w.key)) {
            Some(kept) if kept.seq > w.seq => {}
            _ => {
                last.insert((w.table, w.key), w);
            }
        }
    }
    // By queue (node, sub); each queue's puts in planning order.
    let mut queues: BTreeMap<(usize, u32), Vec<Written>> = BTreeMap::new();
    for w in last.into_values() {
        let node = pmap.partition_of(w.table, w.key).0 as usize;
        let sub = sub_of(w.table, w.key, subs);
        queues.entry((node, sub)).or_default().push(w);
    }
    let mut eqs: Vec<Vec<Eq>> = (0..nodes).map(|_| Vec::new()).collect();
    for ((node, sub), mut puts) in queues {
        puts.sort_by_key(|w| (w.seq, w.table, w.key));
        eqs[node].push(queue_of(sub, puts, ids));
    }
    let involved = (0..nodes)
        .filter(|&n| !eqs[n].is_empty())
        .map(|n| NodeId(n as u32))
        .collect();
    (eqs, involved)
}

/// One write-only queue: a fragment per transaction, an operation per record.
fn queue_of(sub: u32, puts: Vec<Written>, ids: &[TxnId]) -> Eq {
    let mut eq = Eq {
        sub,
        ..Eq::default()
    };
    for Written {
        seq,
        table,
        key,
        image,
    } in puts
    {
        if eq.frags.last().is_none_or(|f: &Frag| f.seq != seq) {
            let id = ids.get(seq as usize).copied().unwrap_or(TxnId(0));
            eq.frags.push(Frag::empty(seq, id, eq.ops.len() as u32, 0));
        }
        let frag = eq.frags.last_mut().expect("pushed above");
        let (kind, extra) = match image {
            Some(bytes) => {
                eq.extras.push(OpExtra {
                    arg: Value::Bytes(bytes),
                    deps: Vec::new(),
                    key_dep: None,
                });
                (AccessKind::Write, eq.extras.len() as u32 - 1)
            }
            None => (AccessKind::Delete, Op::PLAIN),
        };
        eq.ops.push(Op {
            key,
            arg: 0,
            extra,
            table,
            idx: frag.len,
            step: IMAGE,
            kind,
            int_arg: false,
            may_abort: false,
        });
        frag.len += 1;
        frag.n_accesses += 1;
    }
    eq
}

/// Runs one operation of a write-only queue for transaction `txn`: puts its image in place
/// as the record's next version, or removes the record.
///
/// # Safety
/// As for running any access: the queue owns the record while it runs.
pub(super) unsafe fn apply(
    store: &PartitionStore,
    txn: TxnId,
    op: &Op,
    arg: &Value,
) -> Result<(), String> {
    let table = store
        .tables()
        .get(op.table as usize)
        .ok_or_else(|| format!("a write to table {}, which does not exist", op.table))?;
    match (op.kind, arg) {
        (AccessKind::Delete, _) => {
            table.remove(op.key);
            Ok(())
        }
        (AccessKind::Write, Value::Bytes(bytes)) if bytes.len() == table.row_size() => {
            match table.lookup_versioned(op.key) {
                Some((rid, version)) => {
                    // SAFETY: `rid` is live, and the caller's queue owns the record.
                    unsafe { table.row_mut(rid) }.copy_from_slice(bytes);
                    table.set_version(rid, version.next_for(txn));
                }
                None => {
                    let version = table.absent_version(op.key).next_for(txn);
                    table
                        .insert_with(op.key, version, |_, row| row.copy_from_slice(bytes))
                        .map_err(|e| format!("cannot put key {} in place: {e}", op.key))?;
                }
            }
            Ok(())
        }
        _ => Err(format!(
            "a write-only operation on key {} with no row image of {} bytes",
            op.key,
            table.row_size()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qstore_core::config::Partitioning;
    use qstore_core::txn::TableSchema;
    use qstore_storage::RowVersion;

    fn schema() -> TableSchema {
        TableSchema {
            name: "t".into(),
            row_size: 8,
            capacity_per_partition: 16,
            keys_per_partition: 8,
            read_mostly: false,
        }
    }

    /// The version a record has.
    fn version_after(store: &PartitionStore, table: TableId, key: u64) -> Option<RowVersion> {
        store.table(table).lookup_versioned(key).map(|(_, v)| v)
    }

    fn written(seq: u32, key: u64, byte: Option<u8>) -> Written {
        Written {
            seq,
            table: 0,
            key,
            image: byte.map(|b| vec![b; 8]),
        }
    }

    #[test]
    fn the_last_committed_write_of_each_record_goes_to_its_node() {
        let schema = schema();
        let pmap = PartitionMap::new(2, Partitioning::Range, std::slice::from_ref(&schema));
        let keys = [0, 15];
        assert_ne!(pmap.partition_of(0, keys[0]), pmap.partition_of(0, keys[1]));
        let w = vec![
            written(0, keys[0], Some(1)),
            written(2, keys[0], Some(3)),
            written(1, keys[0], Some(2)),
            written(3, keys[0], Some(4)),
            written(1, keys[1], None),
        ];
        // Transaction 3 aborted: 2 wrote key 0 last among the committed.
        let ids: Vec<TxnId> = (10..14).map(TxnId).collect();
        let (eqs, involved) = write_only_queues(w, |s| s != 3, &ids, &pmap, 1, 2);
        assert_eq!(involved, vec![NodeId(0), NodeId(1)]);
        let put = &eqs[pmap.partition_of(0, keys[0]).0 as usize][0];
        assert!(put.is_well_formed());
        assert_eq!(put.frags.len(), 1);
        assert_eq!((put.frags[0].seq, put.frags[0].id), (2, TxnId(12)));
        assert!(matches!(&put.extras[0].arg, Value::Bytes(b) if b == &vec![3; 8]));
        let gone = &eqs[pmap.partition_of(0, keys[1]).0 as usize][0];
        assert_eq!(gone.ops[0].kind, AccessKind::Delete);
        assert!(is_write_only(&gone.frag(0).unwrap()));
    }

    #[test]
    fn images_are_put_in_place_and_removed() {
        let schema = schema();
        let store = PartitionStore::new(qstore_core::PartitionId(0), &[schema]);
        let op = |key, kind| Op {
            key,
            arg: 0,
            extra: 0,
            table: 0,
            idx: 0,
            step: IMAGE,
            kind,
            int_arg: false,
            may_abort: false,
        };
        let image = Value::Bytes(vec![7; 8]);
        // SAFETY: the store is this test's alone.
        unsafe {
            apply(&store, TxnId(5), &op(3, AccessKind::Write), &image).unwrap();
            assert_eq!(version_after(&store, 0, 3).unwrap().writer, TxnId(5));
            apply(&store, TxnId(6), &op(3, AccessKind::Write), &image).unwrap();
            assert_eq!(version_after(&store, 0, 3).unwrap().writer, TxnId(6));
            assert!(apply(&store, TxnId(6), &op(4, AccessKind::Write), &Value::Null).is_err());
            apply(&store, TxnId(7), &op(3, AccessKind::Delete), &Value::Null).unwrap();
        }
        assert!(version_after(&store, 0, 3).is_none());
    }
}
