//! The serial oracle: replays a run's serialization order one transaction at a time on freshly
//! loaded partitions. For a deterministic protocol the replay must end in the same partition
//! contents (equal content hashes) and decide every transaction the same way (commit or
//! logic-induced abort).

use crate::cluster::{load_partitions, LoadFn};
use crate::exec::{run_program_alone, AloneOptions, TxnScratch};
use crate::history::Serialized;
use qstore_core::partition::PartitionMap;
use qstore_core::placement::Placement;
use qstore_core::txn::Catalog;
use qstore_core::{NodeId, PartitionId, QError, TxnId};

/// What the replay found.
#[derive(Debug)]
pub struct OracleResult {
    /// Content hash of each partition after the replay.
    pub hashes: Vec<u64>,
    pub replayed: usize,
    /// Transactions the replay decided differently: (id, committed in the run).
    pub divergent: Vec<(TxnId, bool)>,
}

pub fn replay(
    catalog: &Catalog,
    pmap: &PartitionMap,
    load: &LoadFn<'_>,
    order: &[Serialized],
) -> Result<OracleResult, QError> {
    let placement = Placement::new(pmap.partitions(), 1);
    let all: Vec<NodeId> = (0..pmap.partitions()).map(NodeId).collect();
    let stores = load_partitions(&placement, &all, catalog, load, 1)?;
    let store = |p: PartitionId| stores[p.index()].as_deref().expect("all loaded");
    let mut scratch = TxnScratch::default();
    let mut divergent = Vec::new();
    for t in order {
        let program = catalog.program(&t.call)?;
        // SAFETY: this function loaded the stores and never shares them: only this thread
        // touches their rows.
        let result = unsafe {
            run_program_alone(
                store,
                pmap,
                &catalog.steps,
                t.id,
                &program,
                &mut scratch,
                AloneOptions::default(),
            )
        };
        if result.is_ok() != t.committed {
            divergent.push((t.id, t.committed));
        }
    }
    Ok(OracleResult {
        hashes: stores.iter().flatten().map(|s| s.content_hash()).collect(),
        replayed: order.len(),
        divergent,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::tests::{access, fixture};
    use crate::history::{HistoryRecorder, Serialized};
    use qstore_core::txn::{
        AccessKind, Catalog, Inputs, LogicAbort, ProcCall, Procedure, Program, RowRef, Value,
    };
    use qstore_core::{NodeId, PartitionId};
    use std::sync::Arc;

    /// `bump(key, delta)`: one read-modify-write.
    struct Bump(Access);
    use qstore_core::txn::Access;

    impl Procedure for Bump {
        fn name(&self) -> &'static str {
            "bump"
        }
        fn program(&self, args: &[Value]) -> Result<Program, String> {
            let mut a = self.0.clone();
            a.key = args[0].as_int().ok_or("key")? as u64;
            a.arg = args[1].clone();
            a.may_abort = true;
            Ok(Program { accesses: vec![a] })
        }
    }

    fn double(row: RowRef<'_>, _: &Value, _: Inputs<'_>) -> Result<Value, LogicAbort> {
        let RowRef::Write(b) = row else {
            unreachable!()
        };
        let v = i64::from_le_bytes(b[..8].try_into().unwrap()) * 2;
        b[..8].copy_from_slice(&v.to_le_bytes());
        Ok(Value::Int(v))
    }

    fn catalog() -> (Catalog, qstore_core::partition::PartitionMap) {
        let (mut cat, pmap, _) = fixture();
        let add = access(&cat, AccessKind::ReadModifyWrite, 0, 0);
        let mut dbl = add.clone();
        dbl.step = cat.steps.register("double", double);
        cat.add_procedure(Arc::new(Bump(add)));
        struct Double(Access);
        impl Procedure for Double {
            fn name(&self) -> &'static str {
                "double"
            }
            fn program(&self, args: &[Value]) -> Result<Program, String> {
                let mut a = self.0.clone();
                a.key = args[0].as_int().ok_or("key")? as u64;
                Ok(Program { accesses: vec![a] })
            }
        }
        cat.add_procedure(Arc::new(Double(dbl)));
        (cat, pmap)
    }

    fn load(p: PartitionId, l: &mut dyn qstore_core::txn::RowLoader) -> Result<(), QError> {
        let mut keys = (0..8).map(|i| p.0 as u64 * 10 + i);
        l.load_rows(0, &mut keys, &mut |_, r| {
            r.copy_from_slice(&5i64.to_le_bytes())
        })
    }

    fn call(cat: &Catalog, proc: &str, key: i64, arg: i64) -> Arc<ProcCall> {
        let proc = cat.procedure_id(proc).unwrap();
        Arc::new(ProcCall {
            proc,
            args: vec![Value::Int(key), Value::Int(arg)],
        })
    }

    #[test]
    fn replay_reproduces_order_outcomes_and_state() {
        let (cat, pmap) = catalog();
        let order = vec![
            Serialized {
                order: 1,
                id: TxnId(1),
                call: call(&cat, "bump", 3, 4),
                committed: true,
            },
            Serialized {
                order: 2,
                id: TxnId(2),
                call: call(&cat, "double", 3, 0),
                committed: true,
            },
            Serialized {
                order: 3,
                id: TxnId(3),
                call: call(&cat, "bump", 3, -100),
                committed: false,
            },
        ];
        let r = replay(&cat, &pmap, &load, &order).unwrap();
        assert!(r.divergent.is_empty());
        // (5 + 4) * 2 = 18 at key 3, nothing else changed; the reverse order gives 14.
        let mut reversed = order.clone();
        reversed.swap(0, 1);
        let r2 = replay(&cat, &pmap, &load, &reversed).unwrap();
        assert_ne!(r.hashes[0], r2.hashes[0]);
        assert_eq!(r.hashes[1], r2.hashes[1]);
        // A transaction the run says aborted but the replay commits is reported.
        let mut wrong = order.clone();
        wrong[0].committed = false;
        let r3 = replay(&cat, &pmap, &load, &wrong).unwrap();
        assert_eq!(r3.divergent, vec![(TxnId(1), false)]);
    }

    #[test]
    fn recorder_builds_a_checkable_history() {
        let (cat, pmap) = catalog();
        let rec = HistoryRecorder::new(pmap);
        let mut t1 = crate::history::TxnTrace::default();
        t1.read(0, 3, qstore_storage::RowVersion::INITIAL);
        t1.write(0, 3);
        rec.commit(NodeId(0), TxnId(1), &call(&cat, "bump", 3, 1), &t1, 1);
        let mut t2 = crate::history::TxnTrace::default();
        t2.read(0, 3, qstore_storage::RowVersion::live(TxnId(1), 0));
        t2.write(0, 3);
        rec.commit(NodeId(1), TxnId(2), &call(&cat, "bump", 3, 1), &t2, 2);
        let h = rec.history();
        assert_eq!(h.version_order.len(), 1);
        assert_eq!(h.version_order[0].1, vec![1, 2]);
        assert!(qstore_check::check(&h).is_serializable());
        assert_eq!(rec.serialization_order().len(), 2);
        // A lost update: T3 also read the initial version and wrote after T2.
        let mut t3 = crate::history::TxnTrace::default();
        t3.read(0, 3, qstore_storage::RowVersion::INITIAL);
        t3.write(0, 3);
        rec.commit(NodeId(1), TxnId(3), &call(&cat, "bump", 3, 1), &t3, 3);
        assert!(!qstore_check::check(&rec.history()).is_serializable());
    }
}
