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

/// `sum(k0, k1, ...)`: reads k0, then each next key adding the previous access's output (a
/// chain of data dependencies); the last output is the sum.
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
        let access = |i: usize, key: &Value| {
            let key = key.as_int().ok_or("keys are integers")? as u64;
            let step = if i == 0 { self.read } else { self.plus };
            let deps = if i == 0 { vec![] } else { vec![i as u16 - 1] };
            Ok(Access::plain(
                0,
                key,
                AccessKind::Read,
                step,
                Value::Null,
                deps,
            ))
        };
        let accesses: Result<Vec<Access>, String> =
            args.iter().enumerate().map(|(i, k)| access(i, k)).collect();
        Ok(Program {
            accesses: accesses?,
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
    run_chains(nodes, isolation, 2);
}

/// Chains of `len` keys, each summing the ones before it.
fn run_chains(nodes: u32, isolation: Isolation, len: u64) {
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
        let keys: Vec<u64> = (0..len)
            .map(|j| (i * (7 * j + 1) + 3 * j) % total)
            .collect();
        let distinct: std::collections::HashSet<_> = keys.iter().collect();
        if distinct.len() < keys.len() {
            continue;
        }
        let call = ProcCall {
            proc,
            args: keys.iter().map(|&k| Value::Int(k as i64)).collect(),
        };
        let id = TxnId(i + 1);
        expected.insert(id, keys.iter().sum::<u64>() as i64);
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
                assert_eq!(
                    out[len as usize - 1],
                    Value::Int(expected[&resp.id]),
                    "{:?}",
                    resp.id
                )
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

/// A chain whose first and last keys share an execution queue and whose middle key is in
/// another one: a fragment holding both ends would wait for the middle, which waits for its
/// first access. Planning splits such fragments, so every chain is answered.
#[test]
fn chains_that_leave_a_queue_and_come_back_are_answered() {
    run_chains(1, Isolation::Serializable, 3);
    run_chains(1, Isolation::Serializable, 5);
    run_chains(2, Isolation::Serializable, 5);
    run_chains(1, Isolation::ReadCommitted, 5);
}
