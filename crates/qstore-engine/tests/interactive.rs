//! The interactive protocols (NO_WAIT, WAIT_DIE, H-Store) on the shared coordinator and
//! two-phase commit: a failed check undoes the transaction's writes on every node, an
//! access gets the output of an access on another node, and contended transfers across
//! nodes, retried after concurrency-control aborts, leave every account with exactly what
//! the committed transfers moved (nothing of an aborted attempt survives, even one answered
//! just before the cluster stops) and never overdraw.
//!
//! Three nodes, keys 0..64 on node 0, 64..128 on node 1, 128..192 on node 2; key k starts
//! at k.

use qstore_core::txn::{
    AccessKind, Catalog, ProcCall, Procedure, Program, StepId, TxnOutcome, Value,
};
use qstore_core::{PartitionId, RunConfig, TxnId};
use qstore_engine::StoppedCluster;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

mod common;

use common::{
    access, add, counter, counter_catalog, int, load_counters, read, take, Pay, TestClient, KEYS,
};

const NODES: u32 = 3;
const PROTOCOLS: [&str; 3] = ["no_wait", "wait_die", "hstore"];

/// `copy(from, to)`: adds from's value to to (a data dependency).
struct Copy {
    read: StepId,
    add: StepId,
}

impl Procedure for Copy {
    fn name(&self) -> &'static str {
        "copy"
    }
    fn program(&self, args: &[Value]) -> Result<Program, String> {
        let (from, to) = (int(args, 0)?, int(args, 1)?);
        Ok(Program {
            accesses: vec![
                access(from, AccessKind::Read, self.read, Value::Null, vec![]),
                access(
                    to,
                    AccessKind::ReadModifyWrite,
                    self.add,
                    Value::Null,
                    vec![0],
                ),
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

/// How long a test waits for any answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(20);

/// Concurrency-control aborts a call may meet before the test gives up on it.
const MAX_RETRIES: usize = 10_000;

/// A client of a cluster running `protocol` over this file's procedures.
fn start(protocol: &str) -> TestClient {
    let mut cfg = RunConfig::default();
    cfg.protocol.name = protocol.into();
    cfg.cluster.nodes = NODES;
    cfg.cluster.workers = 2;
    TestClient::start(cfg, catalog(), &load_counters).unwrap()
}

/// Runs one call to its end, retrying concurrency-control aborts.
fn run(c: &mut TestClient, home: u32, name: &str, args: &[i64]) -> TxnOutcome {
    c.run((home, name, args), ANSWER_TIMEOUT, MAX_RETRIES)
        .expect("every transaction is answered")
}

fn value(stopped: &StoppedCluster, k: u64) -> i64 {
    let t = stopped.ctx().store(PartitionId((k / KEYS) as u32)).table(0);
    let rid = t.lookup(k).unwrap();
    // SAFETY: `rid` is live (just looked up), and the cluster's threads have stopped: nothing
    // writes the table any more.
    counter(unsafe { t.row(rid) })
}

#[test]
fn a_failed_check_undoes_the_writes_on_every_node() {
    for protocol in PROTOCOLS {
        let mut c = start(protocol);
        // Credits 64 (node 1), then fails to debit 0 (node 0 holds 0).
        let outcome = run(&mut c, 2, "pay", &[0, 64, 5]);
        assert!(
            matches!(outcome, TxnOutcome::LogicAbort(_)),
            "{protocol}: {outcome:?}"
        );
        let ok = run(&mut c, 2, "pay", &[130, 65, 5]);
        assert_eq!(
            ok,
            TxnOutcome::Committed(vec![Value::Int(70), Value::Int(125)]),
            "{protocol}"
        );
        let stopped = c.cluster.stop();
        assert_eq!(value(&stopped, 64), 64, "{protocol}");
        assert_eq!(value(&stopped, 0), 0, "{protocol}");
        assert_eq!((value(&stopped, 65), value(&stopped, 130)), (70, 125));
    }
}

#[test]
fn an_access_gets_the_output_of_an_access_on_another_node() {
    for protocol in PROTOCOLS {
        let mut c = start(protocol);
        let outcome = run(&mut c, 0, "copy", &[140, 1]);
        assert_eq!(
            outcome,
            TxnOutcome::Committed(vec![Value::Int(140), Value::Int(141)]),
            "{protocol}"
        );
        let stopped = c.cluster.stop();
        assert_eq!(value(&stopped, 1), 141, "{protocol}");
    }
}

#[test]
fn contended_transfers_keep_the_total_and_never_overdraw() {
    // Eight hot accounts over the three nodes; amounts large enough that some checks fail.
    let hot: Vec<i64> = vec![3, 4, 70, 71, 72, 150, 151, 5];
    let keys: Vec<u64> = (0..KEYS * NODES as u64).collect();
    for protocol in PROTOCOLS {
        let mut c = start(protocol);
        let mut live: HashMap<TxnId, (Arc<ProcCall>, u32, u64)> = HashMap::new();
        let (mut committed, mut failed, mut retried) = (0, 0, 0);
        // Per account, what committed transfers moved in and out.
        let mut moved: HashMap<u64, i64> = HashMap::new();
        let total = 600u64;
        let mut issued = 0u64;
        while committed + failed < total {
            while issued < total && live.len() < 24 {
                let i = issued as usize;
                let (src, dst) = (hot[i % 8], hot[(i * 5 + 3) % 8]);
                let call = c.call("pay", &[src, dst, 20 + (i as i64 % 50)]);
                let home = (issued % NODES as u64) as u32;
                let id = c.submit(home, &call, Some(issued));
                live.insert(id, (call, home, issued));
                issued += 1;
            }
            let r = c
                .answer(ANSWER_TIMEOUT)
                .expect("every transaction is answered");
            let (call, home, birth) = live.remove(&r.id).expect("an answer to a live attempt");
            match r.outcome {
                TxnOutcome::Committed(_) => {
                    committed += 1;
                    let a: Vec<i64> = call.args.iter().map(|v| v.as_int().unwrap()).collect();
                    *moved.entry(a[0] as u64).or_default() -= a[2];
                    *moved.entry(a[1] as u64).or_default() += a[2];
                }
                TxnOutcome::LogicAbort(_) => failed += 1,
                TxnOutcome::CcAbort(_) => {
                    // A randomised back-off, as clients do: without one, NO_WAIT's hot
                    // transactions can keep aborting each other for a long time.
                    retried += 1;
                    let jitter = (retried as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56;
                    std::thread::sleep(Duration::from_micros(jitter));
                    let id = c.submit(home, &call, Some(birth));
                    live.insert(id, (call, home, birth));
                }
                TxnOutcome::Rejected(why) | TxnOutcome::Unknown(why) => {
                    panic!("{protocol}: rejected: {why}")
                }
                TxnOutcome::NotLeader { .. } => panic!("{protocol}: unreplicated, yet not leader"),
            }
        }
        let stopped = c.cluster.stop();
        let values: Vec<i64> = keys.iter().map(|&k| value(&stopped, k)).collect();
        let expected: i64 = keys.iter().map(|&k| k as i64).sum();
        for &k in &keys {
            let want = k as i64 + moved.get(&k).copied().unwrap_or(0);
            assert_eq!(value(&stopped, k), want, "{protocol}: account {k}");
        }
        assert_eq!(
            values.iter().sum::<i64>(),
            expected,
            "{protocol}: money appeared or vanished"
        );
        assert!(
            values.iter().all(|&v| v >= 0),
            "{protocol}: an account is overdrawn"
        );
        assert!(
            failed > 0 && committed > 0,
            "{protocol}: {committed} committed, {failed} failed"
        );
        eprintln!("{protocol}: {committed} committed, {failed} failed checks, {retried} retries");
    }
}
