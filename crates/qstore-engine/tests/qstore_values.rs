//! Q-Store data dependencies: an access that needs another access's output, in another
//! execution queue of the same node or on another node, gets it (forwarded locally or by
//! message), under both isolation levels.

use crossbeam_channel::unbounded;
use qstore_core::config::{Isolation, Partitioning};
use qstore_core::partition::PartitionMap;
use qstore_core::txn::{
    Access, AccessKind, Catalog, Inputs, LogicAbort, ProcCall, Procedure, Program, RowRef,
    TxnOutcome, Value,
};
use qstore_core::{NodeId, RunConfig, TxnId};
use qstore_engine::{Cluster, TxnRequest};
use std::sync::Arc;
use std::time::Duration;

mod common;

use common::{counter, counter_catalog, load_counters, read, KEYS};

/// Output: this row's counter plus the first input.
fn read_plus(row: RowRef<'_>, _: &Value, inputs: Inputs<'_>) -> Result<Value, LogicAbort> {
    Ok(Value::Int(
        counter(row.bytes()) + inputs.get(0).as_int().unwrap_or(-1_000_000),
    ))
}

/// `sum(x, y)`: reads x, then reads y and adds x's value (a data dependency).
struct Sum {
    read: qstore_core::txn::StepId,
    plus: qstore_core::txn::StepId,
}

impl Procedure for Sum {
    fn name(&self) -> &'static str {
        "sum"
    }

    fn may_abort(&self) -> bool {
        false
    }
    fn program(&self, args: &[Value]) -> Result<Program, String> {
        let key =
            |i: usize| args.get(i).and_then(Value::as_int).ok_or("two keys") as Result<i64, _>;
        let access = |key: i64, step, deps| Access {
            table: 0,
            key: key as u64,
            kind: AccessKind::Read,
            step,
            arg: Value::Null,
            deps,
            may_abort: false,
            key_dep: None,
        };
        Ok(Program {
            accesses: vec![
                access(key(0)?, self.read, vec![]),
                access(key(1)?, self.plus, vec![0]),
            ],
        })
    }
}

fn catalog() -> Catalog {
    let mut c = counter_catalog();
    let read = c.steps.register("read", read);
    let plus = c.steps.register("read_plus", read_plus);
    c.add_procedure(Arc::new(Sum { read, plus }));
    c
}

fn run(nodes: u32, isolation: Isolation) {
    let mut cfg = RunConfig::default();
    cfg.protocol.name = "qstore".into();
    cfg.protocol.qstore.isolation = isolation;
    cfg.protocol.qstore.batch_size = 16;
    cfg.cluster.nodes = nodes;
    cfg.cluster.workers = 2;
    let cat = Arc::new(catalog());
    let pmap = PartitionMap::new(nodes, Partitioning::Range, &cat.tables);
    // Key k holds k.
    let cluster = Cluster::start(cfg, cat.clone(), pmap, &load_counters, false).unwrap();
    let (tx, rx) = unbounded();
    let proc = cat.procedure_id("sum").unwrap();
    let total = KEYS * nodes as u64;
    let mut expected = std::collections::HashMap::new();
    for i in 0..200u64 {
        let (x, y) = (i % total, (i * 7 + 3) % total);
        if x == y {
            continue;
        }
        let call = ProcCall {
            proc,
            args: vec![Value::Int(x as i64), Value::Int(y as i64)],
        };
        let id = TxnId(i + 1);
        expected.insert(id, (x + y) as i64);
        cluster.submit(
            NodeId((i % nodes as u64) as u32),
            TxnRequest::new(id, Arc::new(call), tx.clone()),
        );
    }
    for _ in 0..expected.len() {
        let resp = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("every transaction is answered (no queue waits forever on a value)");
        match resp.outcome {
            TxnOutcome::Committed(out) => {
                assert_eq!(out[1], Value::Int(expected[&resp.id]), "{:?}", resp.id)
            }
            other => panic!("{:?}: {other:?}", resp.id),
        }
    }
    cluster.stop();
}

#[test]
fn values_reach_dependent_accesses_on_one_node() {
    run(1, Isolation::Serializable);
}

#[test]
fn values_reach_dependent_accesses_across_nodes() {
    run(2, Isolation::Serializable);
}

#[test]
fn read_committed_readers_forward_values_too() {
    run(1, Isolation::ReadCommitted);
    run(2, Isolation::ReadCommitted);
}
