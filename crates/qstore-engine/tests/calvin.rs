//! Calvin on an embedded 3-node cluster under a contended multi-partition workload, with
//! both lock managers: the history has no dependency cycle, a serial replay in Calvin's
//! global order reaches the same partition contents, and a transaction that fails its
//! integrity check leaves nothing behind on any node.
//!
//! Keys 0..64 live on node 0, 64..128 on node 1, 128..192 on node 2; key k starts at k. The
//! workload draws from the first 8 keys of each partition (heavy contention); the last key of
//! each partition is kept for the aborting transaction.

use crossbeam_channel::unbounded;
use qstore_core::config::{CalvinLocks, Partitioning};
use qstore_core::partition::PartitionMap;
use qstore_core::txn::{
    AccessKind, Catalog, Inputs, LogicAbort, ProcCall, Procedure, Program, RowRef, StepId,
    TxnOutcome, TxnResponse, Value,
};
use qstore_core::{NodeId, PartitionId, RunConfig, TxnId};
use qstore_engine::{oracle, Cluster, TxnRequest};
use qstore_storage::RowVersion;
use std::sync::Arc;
use std::time::Duration;

mod common;

use common::{access, counter, counter_catalog, load_counters, read, take, KEYS};

const NODES: u32 = 3;
const TXNS: u64 = 3_000;
const INFLIGHT: usize = 48;
const HOT: u64 = 8;

/// Adds the argument, or (when it is Null) the first input modulo 7.
fn add(row: RowRef<'_>, arg: &Value, inputs: Inputs<'_>) -> Result<Value, LogicAbort> {
    let RowRef::Write(bytes) = row else {
        unreachable!("add is a read-modify-write")
    };
    let delta = arg
        .as_int()
        .unwrap_or_else(|| inputs.get(0).as_int().unwrap_or(0).rem_euclid(7));
    let n = counter(bytes) + delta;
    bytes[..8].copy_from_slice(&n.to_le_bytes());
    Ok(Value::Int(n))
}

fn ints(args: &[Value]) -> Result<Vec<i64>, String> {
    args.iter()
        .map(|v| {
            v.as_int()
                .ok_or_else(|| "arguments are integers".to_string())
        })
        .collect()
}

struct Steps {
    read: StepId,
    add: StepId,
    take: StepId,
}

/// `pay(dst1, dst2, src, amount)`: credits both destinations, then debits the source twice
/// the amount if it has enough.
struct Pay(Arc<Steps>);

impl Procedure for Pay {
    fn name(&self) -> &'static str {
        "pay"
    }
    fn program(&self, args: &[Value]) -> Result<Program, String> {
        let [d1, d2, src, amount] = ints(args)?[..] else {
            return Err("four arguments".into());
        };
        let s = &self.0;
        let credit = |k| {
            access(
                k,
                AccessKind::ReadModifyWrite,
                s.add,
                Value::Int(amount),
                vec![],
            )
        };
        let mut debit = access(
            src,
            AccessKind::ReadModifyWrite,
            s.take,
            Value::Int(2 * amount),
            vec![],
        );
        debit.may_abort = true;
        Ok(Program {
            accesses: vec![credit(d1), credit(d2), debit],
        })
    }
}

/// `copy(from, to)`: reads `from` and adds its value (mod 7) to `to`: a value crossing nodes.
struct Copy(Arc<Steps>);

impl Procedure for Copy {
    fn name(&self) -> &'static str {
        "copy"
    }
    fn program(&self, args: &[Value]) -> Result<Program, String> {
        let [from, to] = ints(args)?[..] else {
            return Err("two arguments".into());
        };
        let s = &self.0;
        Ok(Program {
            accesses: vec![
                access(from, AccessKind::Read, s.read, Value::Null, vec![]),
                access(to, AccessKind::ReadModifyWrite, s.add, Value::Null, vec![0]),
            ],
        })
    }
    fn may_abort(&self) -> bool {
        false
    }
}

/// `sum(keys...)`: reads every key (read-only; the lowest participant executes it).
struct Sum(Arc<Steps>);

impl Procedure for Sum {
    fn name(&self) -> &'static str {
        "sum"
    }
    fn program(&self, args: &[Value]) -> Result<Program, String> {
        let read = |k| access(k, AccessKind::Read, self.0.read, Value::Null, vec![]);
        Ok(Program {
            accesses: ints(args)?.into_iter().map(read).collect(),
        })
    }
    fn may_abort(&self) -> bool {
        false
    }
}

fn catalog() -> Catalog {
    let mut c = counter_catalog();
    let steps = Arc::new(Steps {
        read: c.steps.register("read", read),
        add: c.steps.register("add", add),
        take: c.steps.register("take", take),
    });
    c.add_procedure(Arc::new(Pay(steps.clone())));
    c.add_procedure(Arc::new(Copy(steps.clone())));
    c.add_procedure(Arc::new(Sum(steps)));
    c
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) % n
    }

    /// A hot key of a random partition.
    fn key(&mut self) -> i64 {
        (self.below(NODES as u64) * KEYS + self.below(HOT)) as i64
    }
}

/// The transaction that must abort: credits the spare keys of nodes 1 and 2 and fails to
/// debit the spare key of node 0.
fn doomed() -> [i64; 4] {
    let spare = |p: u64| (p * KEYS + KEYS - 1) as i64;
    [spare(1), spare(2), spare(0), 1_000_000]
}

fn call(cat: &Catalog, name: &str, args: &[i64]) -> ProcCall {
    ProcCall {
        proc: cat.procedure_id(name).unwrap(),
        args: args.iter().map(|&a| Value::Int(a)).collect(),
    }
}

fn workload_call(cat: &Catalog, rng: &mut Rng) -> ProcCall {
    match rng.below(10) {
        0..=4 => {
            let (a, b, c) = (rng.key(), rng.key(), rng.key());
            if a == b || b == c || a == c {
                call(cat, "copy", &[a, c.max(b)])
            } else {
                call(cat, "pay", &[a, b, c, 1 + rng.below(30) as i64])
            }
        }
        5..=7 => {
            let (from, to) = (rng.key(), rng.key());
            call(cat, "copy", &[from, to])
        }
        _ => {
            let keys: Vec<i64> = (0..NODES as u64)
                .map(|p| (p * KEYS + rng.below(HOT)) as i64)
                .collect();
            call(cat, "sum", &keys)
        }
    }
}

fn run(locks: CalvinLocks) {
    let mut cfg = RunConfig::default();
    cfg.protocol.name = "calvin".into();
    cfg.protocol.calvin.locks = locks;
    cfg.protocol.calvin.epoch_us = 300;
    cfg.cluster.nodes = NODES;
    cfg.cluster.workers = 4;
    let cat = Arc::new(catalog());
    let pmap = PartitionMap::new(NODES, Partitioning::Range, &cat.tables);
    let cluster = Cluster::start(cfg, cat.clone(), pmap.clone(), &load_counters, true).unwrap();
    let (tx, rx) = unbounded::<TxnResponse>();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let doomed_id = TXNS / 2;
    let mut outcomes = std::collections::HashMap::new();
    let mut answered = 0u64;
    for id in 1..=TXNS {
        if id as usize > INFLIGHT {
            let r = rx.recv_timeout(Duration::from_secs(10)).expect("answered");
            outcomes.insert(r.id, r.outcome);
            answered += 1;
        }
        let c = if id == doomed_id {
            call(&cat, "pay", &doomed())
        } else {
            workload_call(&cat, &mut rng)
        };
        let req = TxnRequest::new(TxnId(id), Arc::new(c), tx.clone());
        cluster.submit(NodeId(rng.below(NODES as u64) as u32), req);
    }
    while answered < TXNS {
        let r = rx.recv_timeout(Duration::from_secs(10)).expect("answered");
        outcomes.insert(r.id, r.outcome);
        answered += 1;
    }
    let stopped = cluster.stop();

    let commits = outcomes
        .values()
        .filter(|o| matches!(o, TxnOutcome::Committed(_)))
        .count();
    let aborts = outcomes
        .values()
        .filter(|o| matches!(o, TxnOutcome::LogicAbort(_)))
        .count();
    assert_eq!(commits + aborts, TXNS as usize, "{locks:?}: all decided");
    assert_eq!(
        outcomes[&TxnId(doomed_id)],
        TxnOutcome::LogicAbort("insufficient funds".into())
    );
    // Read-only sums answer with the values they read, one per key.
    assert!(outcomes.values().any(|o| matches!(o,
        TxnOutcome::Committed(v) if v.len() == NODES as usize)));

    // The doomed transaction's credits on nodes 1 and 2 were rolled back, versions included.
    for (i, k) in doomed()[..3].iter().enumerate() {
        let k = *k as u64;
        let t = stopped.ctx().store(PartitionId((k / KEYS) as u32)).table(0);
        let rid = t.lookup(k).unwrap();
        // SAFETY: `rid` is live (just looked up), and the cluster has stopped: nothing writes
        // the table any more.
        let row = unsafe { t.row(rid) };
        assert_eq!(counter(row), k as i64, "{locks:?}: key {i}");
        assert_eq!(t.version(rid), RowVersion::INITIAL, "{locks:?}: key {k}");
    }

    let rec = stopped.ctx().history.as_ref().unwrap();
    let report = qstore_check::check(&rec.history());
    assert!(report.is_serializable(), "{locks:?}:\n{report}");
    let order = rec.serialization_order();
    assert_eq!(order.len(), TXNS as usize);
    let replay = oracle::replay(&cat, &pmap, &load_counters, &order).unwrap();
    assert_eq!(replay.divergent, vec![], "{locks:?}");
    assert_eq!(replay.hashes, stopped.partition_hashes(), "{locks:?}");
    // Contention made some debits fail: the replay had aborts to agree with.
    assert!(aborts > 1, "{locks:?}: {aborts} aborts");
}

#[test]
fn lock_table_runs_are_serializable_and_match_the_serial_oracle() {
    run(CalvinLocks::LockTable);
}

#[test]
fn vll_runs_are_serializable_and_match_the_serial_oracle() {
    run(CalvinLocks::Vll);
}
