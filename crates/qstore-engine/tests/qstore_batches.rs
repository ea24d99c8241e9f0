//! Q-Store batch demarcation: by default a worker with nothing to execute closes its
//! planner's batch at once, so a lone transaction does not wait for a batch to fill or time
//! out, even when it spans nodes whose planners have nothing queued; with `close_when_idle`
//! off, batches close only when full or timed out.

use crossbeam_channel::{unbounded, Receiver, RecvTimeoutError};
use qstore_core::config::Partitioning;
use qstore_core::partition::PartitionMap;
use qstore_core::txn::{
    Access, AccessKind, ProcCall, Procedure, Program, StepId, TxnOutcome, TxnResponse, Value,
};
use qstore_core::{NodeId, RunConfig, TxnId};
use qstore_engine::{Cluster, TxnRequest};
use std::sync::Arc;
use std::time::Duration;

mod common;

use common::{access, counter_catalog, int, load_counters, read, KEYS};

/// `pair(x, y)`: reads x and y.
struct Pair {
    read: StepId,
}

impl Procedure for Pair {
    fn name(&self) -> &'static str {
        "pair"
    }

    fn may_abort(&self) -> bool {
        false
    }

    fn program(&self, args: &[Value]) -> Result<Program, String> {
        let read = |i| -> Result<Access, String> {
            Ok(access(
                int(args, i)?,
                AccessKind::Read,
                self.read,
                Value::Null,
                vec![],
            ))
        };
        Ok(Program {
            accesses: vec![read(0)?, read(1)?],
        })
    }
}

/// Batches that never fill (512 transactions) and time out after 2 s; 2 nodes of 2 planners.
const TIMEOUT: Duration = Duration::from_secs(2);

/// Submits one transaction reading a key on each node; returns the cluster (to stop) and
/// where its answer comes.
/// Starts an embedded cluster of `cfg` whose catalog has the counters and the `pair`
/// procedure.
fn start_with_pair(cfg: RunConfig) -> (Cluster, Arc<qstore_core::txn::Catalog>) {
    let mut cat = counter_catalog();
    let read = cat.steps.register("read", read);
    cat.add_procedure(Arc::new(Pair { read }));
    let cat = Arc::new(cat);
    let pmap = PartitionMap::new(cfg.cluster.nodes, Partitioning::Range, &cat.tables);
    let cluster = Cluster::start(cfg, cat.clone(), pmap, &load_counters, false).unwrap();
    (cluster, cat)
}

fn one_transaction(close_when_idle: bool) -> (Cluster, Receiver<TxnResponse>) {
    let mut cfg = RunConfig::default();
    cfg.protocol.name = "qstore".into();
    cfg.protocol.qstore.batch_size = 512;
    cfg.protocol.qstore.batch_timeout_us = TIMEOUT.as_micros() as u64;
    cfg.protocol.qstore.close_when_idle = close_when_idle;
    cfg.cluster.nodes = 2;
    cfg.cluster.workers = 2;
    let (cluster, cat) = start_with_pair(cfg);
    // Let every planner's first (empty, timed-out) batch pass, so the transaction lands in a
    // batch opened after start.
    std::thread::sleep(TIMEOUT + Duration::from_millis(200));
    let (tx, rx) = unbounded();
    let call = ProcCall {
        proc: cat.procedure_id("pair").unwrap(),
        args: vec![Value::Int(1), Value::Int(KEYS as i64 + 2)],
    };
    cluster.submit(NodeId(0), TxnRequest::new(TxnId(1), Arc::new(call), tx));
    (cluster, rx)
}

fn committed(resp: TxnResponse) -> Vec<Value> {
    match resp.outcome {
        TxnOutcome::Committed(out) => out,
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_idle_node_closes_its_batch_at_once() {
    let (cluster, rx) = one_transaction(true);
    // Well before the batch would time out: idle workers on both nodes closed their batches.
    let resp = rx
        .recv_timeout(TIMEOUT / 2)
        .expect("answered before the batch timeout");
    assert_eq!(
        committed(resp),
        vec![Value::Int(1), Value::Int(KEYS as i64 + 2)]
    );
    cluster.stop();
}

#[test]
fn full_batches_wait_for_the_batch_to_fill_or_time_out() {
    let (cluster, rx) = one_transaction(false);
    assert_eq!(
        rx.recv_timeout(TIMEOUT / 4).err(),
        Some(RecvTimeoutError::Timeout),
        "a batch of one transaction stays open until its timeout"
    );
    let resp = rx
        .recv_timeout(3 * TIMEOUT)
        .expect("answered once the batch times out");
    assert_eq!(committed(resp).len(), 2);
    cluster.stop();
}

#[test]
fn an_idle_single_node_runs_a_transaction_on_the_submitting_thread() {
    // One node with nothing in flight, and a submitter that would only wait: the submitting
    // thread plans the transaction as a batch of one, runs it and answers it before `submit`
    // returns, waking no worker. Its program
    // touches two keys of partition 0.
    let mut cfg = RunConfig::default();
    cfg.protocol.name = "qstore".into();
    cfg.cluster.nodes = 1;
    cfg.cluster.workers = 2;
    let (cluster, cat) = start_with_pair(cfg);
    let (tx, rx) = unbounded();
    let mut at_once = 0;
    for id in 1..=100u64 {
        let call = ProcCall {
            proc: cat.procedure_id("pair").unwrap(),
            args: vec![Value::Int(1), Value::Int(2)],
        };
        // The submitter waits for the answer: the node may run it here.
        let mut req = TxnRequest::new(TxnId(id), Arc::new(call), tx.clone());
        req.inline = true;
        cluster.submit(NodeId(0), req);
        // A worker waking for its periodic look may take the request first (then it answers
        // a moment later): rare, and no less correct.
        let resp = match rx.try_recv() {
            Ok(resp) => {
                at_once += 1;
                resp
            }
            Err(_) => rx.recv_timeout(TIMEOUT).expect("answered"),
        };
        assert_eq!(resp.id, TxnId(id));
        assert_eq!(committed(resp), vec![Value::Int(1), Value::Int(2)]);
    }
    assert!(
        at_once >= 90,
        "{at_once} of 100 answered before submit returned"
    );
    cluster.stop();
}

#[test]
fn requests_submitted_together_at_an_idle_node_run_on_the_submitting_thread() {
    // A client with ten answers to take makes ten requests and sends them together: the idle
    // node queues them all before any runs, and the submitting thread plans and runs them
    // in one batch (each planner plans its share) and answers them all before `submit_all`
    // returns. Sent one by one, each would be a batch of its own.
    let mut cfg = RunConfig::default();
    cfg.protocol.name = "qstore".into();
    cfg.cluster.nodes = 1;
    cfg.cluster.workers = 2;
    let mut cat = counter_catalog();
    let read = cat.steps.register("read", read);
    cat.add_procedure(Arc::new(Pair { read }));
    let cat = Arc::new(cat);
    let pmap = PartitionMap::new(1, Partitioning::Range, &cat.tables);
    let cluster = Cluster::start(cfg, cat.clone(), pmap, &load_counters, true).unwrap();
    let (tx, rx) = unbounded();
    let mut at_once = 0;
    for round in 0..20u64 {
        let reqs = (0..10u64)
            .map(|i| {
                let call = ProcCall {
                    proc: cat.procedure_id("pair").unwrap(),
                    args: vec![Value::Int(1 + i as i64), Value::Int(2 + i as i64)],
                };
                let mut req =
                    TxnRequest::new(TxnId(round * 10 + i + 1), Arc::new(call), tx.clone());
                req.inline = true;
                req
            })
            .collect();
        cluster.submit_all(NodeId(0), reqs);
        let answered_here = rx.len();
        if answered_here == 10 {
            at_once += 1;
        }
        let mut ids: Vec<u64> = (0..10)
            .map(|_| {
                let resp = rx.recv_timeout(TIMEOUT).expect("answered");
                let id = resp.id.0;
                let i = ((id - 1) % 10) as i64;
                assert_eq!(committed(resp), vec![Value::Int(1 + i), Value::Int(2 + i)]);
                id
            })
            .collect();
        ids.sort_unstable();
        assert_eq!(ids, (round * 10 + 1..=round * 10 + 10).collect::<Vec<_>>());
    }
    assert!(
        at_once >= 18,
        "{at_once} of 20 bursts answered before submit_all returned"
    );
    // The batch of each transaction (the high half of its place in the order), by burst.
    let order = cluster
        .ctx()
        .history
        .as_ref()
        .unwrap()
        .serialization_order();
    assert_eq!(order.len(), 200);
    let mut batches = vec![std::collections::BTreeSet::new(); 20];
    for s in &order {
        batches[((s.id.0 - 1) / 10) as usize].insert((s.order >> 64) as u64);
    }
    let in_one = batches.iter().filter(|b| b.len() == 1).count();
    assert!(
        in_one >= 18,
        "{in_one} of 20 bursts ran in one batch: {batches:?}"
    );
    cluster.stop();
}
