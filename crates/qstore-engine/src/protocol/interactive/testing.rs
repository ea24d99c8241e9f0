//! For protocol tests: a contended YCSB run on an embedded cluster of an engine the test
//! builds (e.g. a protocol with one of its checks switched off), with its history checked.
//! A protocol's check is known to bite when the run without it fails the history check and
//! the run with it passes.

use crate::cluster::{Cluster, EngineCtx, Hosting};
use crate::protocol::{Engine, TxnRequest};
use qstore_core::txn::{ProcCall, TxnOutcome};
use qstore_core::{NodeId, PartitionId, QError, RunConfig, TxnId};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Clients, each keeping one transaction in flight.
const CLIENTS: u32 = 8;

/// Runs `commits` YCSB transactions (2 nodes, 64 records per partition, θ 0.9, half of them
/// multi-partition, half the accesses writes) on the engine `start` makes, retrying
/// concurrency-control aborts, and returns the history checker's report; panics if a
/// transaction goes unanswered for 30 s.
pub(crate) fn contended_ycsb(
    start: &dyn Fn(Arc<EngineCtx>) -> Result<Box<dyn Engine>, QError>,
    commits: u64,
) -> qstore_check::Report {
    contended_ycsb_within(start, commits, Duration::from_secs(30)).unwrap_or_else(|e| panic!("{e}"))
}

/// The checks of a protocol bite: on contended YCSB, the engine `without` them makes leaves
/// a dependency cycle (G0, G1c or G2) in the history, and the engine `with` them a
/// serializable one. Returns the report of the run without, for further assertions.
pub(crate) fn assert_checks_bite(
    without: &dyn Fn(Arc<EngineCtx>) -> Result<Box<dyn Engine>, QError>,
    with: &dyn Fn(Arc<EngineCtx>) -> Result<Box<dyn Engine>, QError>,
) -> qstore_check::Report {
    use qstore_check::AnomalyClass;
    let unchecked = contended_ycsb(without, 3000);
    let cycles = [AnomalyClass::G0, AnomalyClass::G1c, AnomalyClass::G2];
    assert!(
        cycles.iter().any(|c| unchecked.count(*c) > 0),
        "no cycle without the checks:\n{unchecked}"
    );
    let checked = contended_ycsb(with, 3000);
    assert!(checked.is_serializable(), "{checked}");
    unchecked
}

/// [`contended_ycsb`], or how many clients were left waiting for an answer for `patience`.
pub(crate) fn contended_ycsb_within(
    start: &dyn Fn(Arc<EngineCtx>) -> Result<Box<dyn Engine>, QError>,
    commits: u64,
    patience: Duration,
) -> Result<qstore_check::Report, String> {
    let mut cfg = RunConfig::default();
    cfg.cluster.nodes = 2;
    cfg.cluster.workers = 2;
    let y = &mut cfg.workload.ycsb;
    (y.records_per_partition, y.ops_per_txn, y.theta) = (64, 4, 0.9);
    y.multi_partition_fraction = 0.5;
    let workload = qstore_workload::build(&cfg).expect("a valid workload");
    let cluster = Cluster::start_engine(
        cfg.clone(),
        workload.catalog(),
        workload.partition_map().clone(),
        &|p, loader| workload.load(p, loader),
        true,
        Hosting::Embedded,
        start,
    )
    .expect("the cluster starts");
    let ids = AtomicU64::new(1);
    let committed = AtomicU64::new(0);
    let stuck = AtomicU64::new(0);
    std::thread::scope(|s| {
        for c in 0..CLIENTS {
            let (cluster, workload) = (&cluster, &workload);
            let (ids, committed, stuck) = (&ids, &committed, &stuck);
            s.spawn(move || {
                let home = c % cfg.cluster.nodes;
                let mut gen = workload.generator(c, PartitionId(home));
                while committed.load(Ordering::Relaxed) < commits {
                    let call = Arc::new(gen.next_txn().call);
                    match run_to_end(cluster, NodeId(home), &call, ids, patience) {
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
    match stuck.into_inner() {
        0 => {
            let recorder = stopped.ctx().history.as_ref().expect("recorded");
            Ok(qstore_check::check(&recorder.history()))
        }
        n => Err(format!("{n} client(s) got no answer for {patience:?}")),
    }
}

/// Submits `call` at `home` until it commits (true) or ends otherwise (false), retrying
/// concurrency-control aborts; `None` if an attempt is not answered within `patience`.
fn run_to_end(
    cluster: &Cluster,
    home: NodeId,
    call: &Arc<ProcCall>,
    ids: &AtomicU64,
    patience: Duration,
) -> Option<bool> {
    loop {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let id = TxnId(ids.fetch_add(1, Ordering::Relaxed));
        cluster.submit(home, TxnRequest::new(id, call.clone(), tx));
        match rx.recv_timeout(patience).ok()?.outcome {
            TxnOutcome::Committed(_) => return Some(true),
            TxnOutcome::CcAbort(_) => std::thread::yield_now(),
            _ => return Some(false),
        }
    }
}
