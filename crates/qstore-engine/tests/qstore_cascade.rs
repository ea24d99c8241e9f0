//! Q-Store aborts across nodes: in speculative mode a transaction that touched an aborted
//! write aborts too (and so, transitively, does one that touched its writes), on every node,
//! even where it read nothing uncommitted; in conservative mode nothing cascades.
//!
//! Two nodes, keys 0..64 on node 0 and 64..128 on node 1; key k starts at k. One planner
//! batch holds, in this order:
//! - W = `pay(src 0, dst 64, 5)`: adds 5 to 64 (node 1), then fails its check on 0 (node 0);
//! - T = `copy(64, 1)`: reads 64 (node 1) and adds it to 1 (node 0);
//! - U = `copy(1, 2)`: reads 1 and adds it to 2 (both on node 0).

use crossbeam_channel::unbounded;
use qstore_core::config::{Partitioning, QStoreMode};
use qstore_core::partition::PartitionMap;
use qstore_core::txn::{
    Access, AccessKind, Catalog, CcAbortCause, ProcCall, Procedure, Program, StepId, TxnOutcome,
    Value,
};
use qstore_core::{NodeId, PartitionId, RunConfig, TxnId};
use qstore_engine::{Cluster, TxnRequest};
use std::sync::Arc;
use std::time::Duration;

mod common;

use common::{add, counter, counter_catalog, int, load_counters, read, take, KEYS};

fn rmw(key: i64, step: StepId, arg: Value, deps: Vec<u16>, may_abort: bool) -> Access {
    Access {
        table: 0,
        key: key as u64,
        kind: AccessKind::ReadModifyWrite,
        step,
        arg,
        deps,
        may_abort,
        key_dep: None,
    }
}

/// `pay(src, dst, amount)`: credits dst, then debits src if it has enough.
struct Pay {
    add: StepId,
    take: StepId,
}

impl Procedure for Pay {
    fn name(&self) -> &'static str {
        "pay"
    }
    fn program(&self, args: &[Value]) -> Result<Program, String> {
        let amount = Value::Int(int(args, 2)?);
        Ok(Program {
            accesses: vec![
                rmw(int(args, 1)?, self.add, amount.clone(), vec![], false),
                rmw(int(args, 0)?, self.take, amount, vec![], true),
            ],
        })
    }
}

/// `copy(from, to)`: adds from's value to to.
struct Copy {
    read: StepId,
    add: StepId,
}

impl Procedure for Copy {
    fn name(&self) -> &'static str {
        "copy"
    }
    fn program(&self, args: &[Value]) -> Result<Program, String> {
        let mut from = rmw(int(args, 0)?, self.read, Value::Null, vec![], false);
        from.kind = AccessKind::Read;
        Ok(Program {
            accesses: vec![
                from,
                rmw(int(args, 1)?, self.add, Value::Null, vec![0], false),
            ],
        })
    }
    fn may_abort(&self) -> bool {
        false
    }
}

fn catalog() -> Catalog {
    let mut c = counter_catalog();
    let read = c.steps.register("read", read);
    let add = c.steps.register("add", add);
    let take = c.steps.register("take", take);
    c.add_procedure(Arc::new(Pay { add, take }));
    c.add_procedure(Arc::new(Copy { read, add }));
    c
}

/// Runs W, T and U in one planner batch; returns their outcomes and keys 0, 1, 2, 64 after.
fn run(mode: QStoreMode) -> (Vec<TxnOutcome>, [i64; 4]) {
    let mut cfg = RunConfig::default();
    cfg.protocol.name = "qstore".into();
    cfg.protocol.qstore.mode = mode;
    cfg.protocol.qstore.batch_size = 3;
    // All three in one batch: it closes when full, not when a worker idles before all came.
    cfg.protocol.qstore.batch_timeout_us = 10_000_000;
    cfg.protocol.qstore.close_when_idle = false;
    cfg.protocol.qstore.planners = 1;
    cfg.cluster.nodes = 2;
    cfg.cluster.workers = 2;
    let cat = Arc::new(catalog());
    let pmap = PartitionMap::new(2, Partitioning::Range, &cat.tables);
    let cluster = Cluster::start(cfg, cat.clone(), pmap, &load_counters, false).unwrap();
    let (tx, rx) = unbounded();
    let call = |name: &str, args: &[i64]| ProcCall {
        proc: cat.procedure_id(name).unwrap(),
        args: args.iter().map(|&a| Value::Int(a)).collect(),
    };
    let calls = [
        call("pay", &[0, 64, 5]),
        call("copy", &[64, 1]),
        call("copy", &[1, 2]),
    ];
    for (i, c) in calls.into_iter().enumerate() {
        let req = TxnRequest::new(TxnId(i as u64 + 1), Arc::new(c), tx.clone());
        cluster.submit(NodeId(0), req);
    }
    let mut outcomes = vec![None, None, None];
    for _ in 0..3 {
        let r = rx.recv_timeout(Duration::from_secs(10)).expect("answered");
        outcomes[r.id.0 as usize - 1] = Some(r.outcome);
    }
    let stopped = cluster.stop();
    let value = |k: u64| {
        let t = stopped.ctx().store(PartitionId((k / KEYS) as u32)).table(0);
        let rid = t.lookup(k).unwrap();
        // SAFETY: `rid` is live (just looked up), and the cluster's threads have stopped:
        // nothing writes the table any more.
        counter(unsafe { t.row(rid) })
    };
    let outcomes = outcomes.into_iter().map(Option::unwrap).collect();
    (outcomes, [value(0), value(1), value(2), value(64)])
}

#[test]
fn speculative_aborts_cascade_to_readers_on_every_node() {
    let (outcomes, values) = run(QStoreMode::Speculative);
    assert!(
        matches!(outcomes[0], TxnOutcome::LogicAbort(_)),
        "{outcomes:?}"
    );
    // T read W's credit of 64 before W was known to abort; U read T's write of 1.
    let cascade = TxnOutcome::CcAbort(CcAbortCause::Cascade);
    assert_eq!(outcomes[1..], [cascade.clone(), cascade], "{outcomes:?}");
    // Every write is rolled back, including T's on node 0, which never saw W's write.
    assert_eq!(values, [0, 1, 2, 64]);
}

#[test]
fn conservative_readers_wait_for_the_verdict_and_nothing_cascades() {
    let (outcomes, values) = run(QStoreMode::Conservative);
    assert!(
        matches!(outcomes[0], TxnOutcome::LogicAbort(_)),
        "{outcomes:?}"
    );
    assert_eq!(
        outcomes[1..],
        [
            TxnOutcome::Committed(vec![Value::Int(64), Value::Int(65)]),
            TxnOutcome::Committed(vec![Value::Int(65), Value::Int(67)]),
        ]
    );
    assert_eq!(values, [0, 65, 67, 64]);
}
