//! For protocol tests: contended runs on an embedded cluster of an engine the test builds
//! (a protocol of the registry, or one with a check switched off), with the history checked.
//!
//! Two workloads: YCSB ([`contended_ycsb`]) and **claims** ([`contended_claims`]), which
//! reads keys that are absent and inserts and deletes them: the phantom case. A claim of
//! slot `y` given `x` reads `x` and inserts `y` only if `x` is absent, so two claims that
//! each read the slot the other inserts commit together only if the protocol does not protect
//! a read of an absent key (a phantom: the write skew of the absent-key reads, a G2 cycle in
//! the history, where a read of an absent key is a read of the version its delete left, or
//! of the initial one).

use crate::cluster::{Cluster, EngineCtx, Hosting, LoadFn};
use crate::protocol::{Engine, TxnRequest};
use qstore_core::config::Partitioning;
use qstore_core::partition::PartitionMap;
use qstore_core::rng::splitmix64;
use qstore_core::txn::{
    Access, AccessKind, Catalog, Inputs, LogicAbort, ProcCall, Procedure, Program, RowRef, StepId,
    TableSchema, TxnOutcome, Value,
};
use qstore_core::{NodeId, PartitionId, QError, RunConfig, TxnId};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How a test makes an engine.
pub(crate) type StartFn<'a> = &'a dyn Fn(Arc<EngineCtx>) -> Result<Box<dyn Engine>, QError>;

/// Clients, each keeping one transaction in flight.
const CLIENTS: u32 = 8;

/// A client's stream of calls: where to submit the next one, and the call.
pub(crate) type Calls<'a> = Box<dyn FnMut() -> (NodeId, Arc<ProcCall>) + Send + 'a>;

/// What a contended run runs: a cluster configuration, its tables and procedures, how its
/// partitions load, and each client's calls.
pub(crate) struct Contention<'a> {
    pub cfg: RunConfig,
    pub catalog: Arc<Catalog>,
    pub pmap: PartitionMap,
    pub load: &'a LoadFn<'a>,
    pub clients: &'a (dyn Fn(u32) -> Calls<'a> + Sync),
}

/// Runs calls until `commits` committed, on the engine `start` makes, retrying
/// concurrency-control aborts, and returns the history checker's report, or how many
/// clients were left waiting for an answer for `patience`.
pub(crate) fn run_contended(
    c: &Contention<'_>,
    start: StartFn<'_>,
    commits: u64,
    patience: Duration,
) -> Result<qstore_check::Report, String> {
    let cluster = Cluster::start_engine(
        c.cfg.clone(),
        c.catalog.clone(),
        c.pmap.clone(),
        c.load,
        true,
        Hosting::Embedded,
        start,
    )
    .expect("the cluster starts");
    let ids = AtomicU64::new(1);
    let committed = AtomicU64::new(0);
    let stuck = AtomicU64::new(0);
    std::thread::scope(|s| {
        for client in 0..CLIENTS {
            let (cluster, ids, committed, stuck) = (&cluster, &ids, &committed, &stuck);
            let mut calls = (c.clients)(client);
            s.spawn(move || {
                while committed.load(Ordering::Relaxed) < commits {
                    let (home, call) = calls();
                    match run_to_end(cluster, home, &call, ids, patience) {
                        Some(true) => {
                            committed.fetch_add(1, Ordering::Relaxed);
                        }
                        Some(false) => {}
                        None => {
                            stuck.fetch_add(1, Ordering::Relaxed);
                            return;
                        }
                    }
                }
            });
        }
    });
    let stopped = cluster.stop();
    if let Some(Err(e)) = stopped.protocol_check() {
        return Err(format!("the protocol's own check failed: {e}"));
    }
    match stuck.into_inner() {
        0 => {
            let recorder = stopped.ctx().history.as_ref().expect("recorded");
            Ok(qstore_check::check(&recorder.history()))
        }
        n => Err(format!("{n} client(s) got no answer for {patience:?}")),
    }
}

/// Submits `call` at `home` until it commits (true) or ends otherwise (false), retrying
/// concurrency-control aborts as clients do: with the first attempt's age, after a back-off
/// that grows with the retries (a retry at once, with a new age, can spin for as long as
/// what it met is held). `None` if an attempt is not answered within `patience`.
fn run_to_end(
    cluster: &Cluster,
    home: NodeId,
    call: &Arc<ProcCall>,
    ids: &AtomicU64,
    patience: Duration,
) -> Option<bool> {
    let birth_us = crate::protocol::wall_clock_us();
    for retries in 0u32.. {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let id = TxnId(ids.fetch_add(1, Ordering::Relaxed));
        let mut req = TxnRequest::new(id, call.clone(), tx);
        req.birth_us = birth_us;
        cluster.submit(home, req);
        match rx.recv_timeout(patience).ok()?.outcome {
            TxnOutcome::Committed(_) => return Some(true),
            TxnOutcome::CcAbort(_) if retries < 4 => std::thread::yield_now(),
            TxnOutcome::CcAbort(_) => {
                let us = 10u64 << retries.min(10);
                std::thread::sleep(Duration::from_micros(us.min(2_000)));
            }
            _ => return Some(false),
        }
    }
    unreachable!("retries until an answer ends the loop")
}

/// [`run_contended`] that panics when a transaction goes unanswered for 30 s.
fn run_patiently(c: &Contention<'_>, start: StartFn<'_>, commits: u64) -> qstore_check::Report {
    run_contended(c, start, commits, Duration::from_secs(30)).unwrap_or_else(|e| panic!("{e}"))
}

/// Runs `commits` YCSB transactions (2 nodes, 64 records per partition, θ 0.9, half of them
/// multi-partition, half the accesses writes) on the engine `start` makes (see
/// [`run_contended`]).
pub(crate) fn contended_ycsb_within(
    start: StartFn<'_>,
    commits: u64,
    patience: Duration,
) -> Result<qstore_check::Report, String> {
    contended_ycsb_tuned(start, commits, patience, &|_| {})
}

/// [`contended_ycsb_within`] with the configuration changed by `tune` (e.g. messages lost).
pub(crate) fn contended_ycsb_tuned(
    start: StartFn<'_>,
    commits: u64,
    patience: Duration,
    tune: &dyn Fn(&mut RunConfig),
) -> Result<qstore_check::Report, String> {
    let mut cfg = RunConfig::default();
    cfg.cluster.nodes = 2;
    cfg.cluster.workers = 2;
    let y = &mut cfg.workload.ycsb;
    (y.records_per_partition, y.ops_per_txn, y.theta) = (64, 4, 0.9);
    y.multi_partition_fraction = 0.5;
    tune(&mut cfg);
    let workload = qstore_workload::build(&cfg).expect("a valid workload");
    let nodes = cfg.cluster.nodes;
    let load = |p, loader: &mut dyn qstore_core::txn::RowLoader| workload.load(p, loader);
    let clients = |c: u32| -> Calls<'_> {
        let home = c % nodes;
        let mut gen = workload.generator(c, PartitionId(home));
        Box::new(move || (NodeId(home), Arc::new(gen.next_txn().call)))
    };
    let contention = Contention {
        catalog: workload.catalog(),
        pmap: workload.partition_map().clone(),
        cfg,
        load: &load,
        clients: &clients,
    };
    run_contended(&contention, start, commits, patience)
}

/// [`contended_ycsb_within`], panicking after 30 s without an answer.
pub(crate) fn contended_ycsb(start: StartFn<'_>, commits: u64) -> qstore_check::Report {
    contended_ycsb_within(start, commits, Duration::from_secs(30)).unwrap_or_else(|e| panic!("{e}"))
}

/// The checks of a protocol bite: on contended YCSB, the engine `without` them makes leaves
/// a dependency cycle (G0, G1c or G2) in the history, and the engine `with` them a
/// serializable one. Returns the report of the run without, for further assertions.
pub(crate) fn assert_checks_bite(without: StartFn<'_>, with: StartFn<'_>) -> qstore_check::Report {
    assert_bites(without, with, &|start| contended_ycsb(start, 3000))
}

/// [`assert_checks_bite`] on the claims workload: the checks that protect reads of absent
/// keys.
pub(crate) fn assert_absent_checks_bite(
    without: StartFn<'_>,
    with: StartFn<'_>,
) -> qstore_check::Report {
    // The write skew needs two claims to meet on a fresh key pair: give it time to happen.
    assert_bites(without, with, &|start| contended_claims(start, 8000))
}

fn assert_bites(
    without: StartFn<'_>,
    with: StartFn<'_>,
    run: &dyn Fn(StartFn<'_>) -> qstore_check::Report,
) -> qstore_check::Report {
    use qstore_check::AnomalyClass;
    let cycles = [AnomalyClass::G0, AnomalyClass::G1c, AnomalyClass::G2];
    let has_cycle = |r: &qstore_check::Report| cycles.iter().any(|c| r.count(*c) > 0);
    // An anomaly needs an unlucky interleaving, which a loaded machine (a build beside the
    // tests on 2 cores) can make rare: a few runs without the checks, one of which must
    // show it.
    let mut unchecked = run(without);
    for _ in 1..3 {
        if has_cycle(&unchecked) {
            break;
        }
        unchecked = run(without);
    }
    assert!(
        has_cycle(&unchecked),
        "no cycle without the checks in 3 runs:\n{unchecked}"
    );
    let checked = run(with);
    assert!(checked.is_serializable(), "{checked}");
    unchecked
}

/// Slots per partition in the claims workload, all free at the start.
const SLOTS: u64 = 1024;

/// Slots of a partition a client draws from at a time: a window that moves on every second
/// call of the client, so that clients contend on a few slots, and most of those have never
/// been claimed (a key no insert ever created, which a protocol cannot protect by
/// metadata kept beside the row).
const WINDOW: u64 = 4;

/// `claim(x, y, v)`: reads slot `x` (absent: Null) and inserts slot `y` holding `v`, unless
/// `x` is claimed (logic abort) or `y` already is (duplicate key).
struct Claim {
    peek: StepId,
    take: StepId,
}

/// `free(y, z)`: deletes slot `y` (if claimed) and reads slot `z`.
struct Free {
    peek: StepId,
}

fn slot(kind: AccessKind, key: i64, step: StepId, arg: Value, deps: Vec<u16>) -> Access {
    Access::plain(0, key as u64, kind, step, arg, deps)
}

fn int(args: &[Value], i: usize) -> Result<i64, String> {
    args.get(i)
        .and_then(Value::as_int)
        .ok_or_else(|| format!("argument {i} is not an integer"))
}

impl Procedure for Claim {
    fn name(&self) -> &'static str {
        "claim"
    }

    fn program(&self, args: &[Value]) -> Result<Program, String> {
        let (x, y, v) = (int(args, 0)?, int(args, 1)?, int(args, 2)?);
        let mut insert = slot(AccessKind::Insert, y, self.take, Value::Int(v), vec![0]);
        insert.may_abort = true;
        Ok(Program {
            accesses: vec![
                slot(AccessKind::Read, x, self.peek, Value::Null, vec![]),
                insert,
            ],
        })
    }
}

impl Procedure for Free {
    fn name(&self) -> &'static str {
        "free"
    }

    fn program(&self, args: &[Value]) -> Result<Program, String> {
        let (y, z) = (int(args, 0)?, int(args, 1)?);
        Ok(Program {
            accesses: vec![
                slot(AccessKind::Delete, y, self.peek, Value::Null, vec![]),
                slot(AccessKind::Read, z, self.peek, Value::Null, vec![]),
            ],
        })
    }

    fn may_abort(&self) -> bool {
        false
    }
}

fn peek(row: RowRef<'_>, _: &Value, _: Inputs<'_>) -> Result<Value, LogicAbort> {
    Ok(Value::Int(i64::from_le_bytes(
        row.bytes()[..8].try_into().unwrap(),
    )))
}

fn take(row: RowRef<'_>, arg: &Value, inputs: Inputs<'_>) -> Result<Value, LogicAbort> {
    let RowRef::Write(bytes) = row else {
        unreachable!("an insert writes")
    };
    if inputs.get(0) != &Value::Null {
        return Err(LogicAbort("the slot read is claimed"));
    }
    bytes[..8].copy_from_slice(&arg.as_int().unwrap_or(0).to_le_bytes());
    Ok(arg.clone())
}

fn claims_catalog() -> Catalog {
    let mut c = Catalog::default();
    c.add_table(TableSchema {
        name: "slots".into(),
        row_size: 8,
        capacity_per_partition: SLOTS as usize,
        keys_per_partition: SLOTS,
        read_mostly: false,
    });
    let peek = c.steps.register("peek", peek);
    let take = c.steps.register("take", take);
    c.add_procedure(Arc::new(Claim { peek, take }));
    c.add_procedure(Arc::new(Free { peek }));
    c
}

/// Runs `commits` claims and frees (2 nodes of [`SLOTS`] slots, two slots of the clients'
/// current windows, three claims to a free) on the engine `start` makes, retrying concurrency-control
/// aborts, and returns the history checker's report.
pub(crate) fn contended_claims(start: StartFn<'_>, commits: u64) -> qstore_check::Report {
    contended_claims_as(&RunConfig::default().protocol.name, start, commits)
}

/// [`contended_claims`] of the registry's protocol `name` (the cluster sizes its tables for
/// it: a protocol that moves records gathers them on one node).
pub(crate) fn contended_claims_as(
    name: &str,
    start: StartFn<'_>,
    commits: u64,
) -> qstore_check::Report {
    let mut cfg = RunConfig::default();
    cfg.protocol.name = name.into();
    cfg.cluster.nodes = 2;
    cfg.cluster.workers = 2;
    let catalog = Arc::new(claims_catalog());
    let pmap = PartitionMap::new(cfg.cluster.nodes, Partitioning::Range, &catalog.tables);
    let load = |_: PartitionId, _: &mut dyn qstore_core::txn::RowLoader| Ok(());
    let (claim, free) = (
        catalog.procedure_id("claim").unwrap(),
        catalog.procedure_id("free").unwrap(),
    );
    let clients = |c: u32| -> Calls<'_> {
        let mut state = splitmix64(c as u64 + 1);
        let mut n = 0u64;
        Box::new(move || {
            n += 1;
            let base = (n / 2) % (SLOTS - WINDOW);
            let mut pick = || {
                state = splitmix64(state);
                let partition = state >> 63;
                (partition * SLOTS + base + (state >> 32) % WINDOW) as i64
            };
            let x = pick();
            let y = std::iter::repeat_with(pick).find(|&y| y != x).unwrap();
            let (proc, args) = match n % 4 {
                0 => (free, vec![Value::Int(y), Value::Int(x)]),
                _ => {
                    let v = ((c as u64) << 32 | n) as i64;
                    (claim, vec![Value::Int(x), Value::Int(y), Value::Int(v)])
                }
            };
            (NodeId(c % 2), Arc::new(ProcCall { proc, args }))
        })
    };
    let contention = Contention {
        cfg,
        catalog: catalog.clone(),
        pmap,
        load: &load,
        clients: &clients,
    };
    run_patiently(&contention, start, commits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_protocol_protects_reads_of_absent_keys() {
        let mut failed = Vec::new();
        for p in crate::protocol::PROTOCOLS {
            let report = contended_claims_as(p.name, &p.start, 2000);
            if !report.is_serializable() {
                failed.push(format!("{}: {report}", p.name));
            }
        }
        assert!(failed.is_empty(), "{}", failed.join("\n"));
    }
}
