//! The workers' time breakdown (the determinism study's figure 2) from short embedded runs:
//! the shares cover the worker threads' wall time over the window, and the activities each
//! protocol has show up.

use qstore_bench::report::WorkerTime;
use qstore_bench::{run, RunOptions};
use qstore_core::RunConfig;

/// A short run of `protocol` on 2 nodes of 1 worker each, half the transactions distributed.
fn breakdown(protocol: &str) -> (WorkerTime, f64) {
    let mut c = RunConfig::default();
    c.protocol.name = protocol.into();
    c.cluster.nodes = 2;
    c.cluster.workers = 1;
    c.workload.name = "micro".into();
    c.workload.micro.records_per_partition = 10_000;
    c.workload.micro.multi_partition_fraction = 0.5;
    c.workload.micro.contention_index = 0.01;
    c.client.warmup_s = 0.2;
    c.client.duration_s = 0.8;
    let r = run(&c, RunOptions::default()).unwrap().report;
    assert!(r.committed > 0, "{protocol}: nothing committed");
    let w = r
        .worker_time
        .clone()
        .expect("the protocol accounts its workers' time");
    let total: f64 = w.all.pct.values().sum();
    assert!((total - 100.0).abs() < 1e-6, "{protocol}: {w:?}");
    assert_eq!(w.per_node.len(), 2, "{protocol}: {w:?}");
    for n in &w.per_node {
        let total: f64 = n.shares.pct.values().sum();
        assert!((total - 100.0).abs() < 1e-6, "{protocol}: {n:?}");
    }
    (w, r.window_s)
}

/// The time accounted is `threads` threads' wall time over the window, to within the
/// intervals left open at its ends (an idle wait is at most 20 ms).
fn covers(w: &WorkerTime, threads: f64, window_s: f64) {
    let ratio = w.all.worker_s / (threads * window_s);
    assert!((0.85..1.15).contains(&ratio), "{ratio:.3}: {w:?}");
}

#[test]
fn dl_detect_workers_spend_their_time_on_work_locks_deadlocks_and_2pc() {
    let (w, window_s) = breakdown("dl_detect");
    covers(&w, 2.0, window_s);
    let pct = |a| w.all.pct(a);
    assert!(pct("useful") > 1.0, "{w:?}");
    assert!(pct("lock") > 0.0 && pct("2pc") > 0.0, "{w:?}");
    assert!(pct("deadlock") > 0.0, "the detector asks every node: {w:?}");
    assert_eq!(pct("planning"), 0.0, "{w:?}");
}

#[test]
fn calvin_scheduler_and_executors_spend_theirs_on_work_and_locks_only() {
    let (w, window_s) = breakdown("calvin");
    // Per node: the lock manager thread and one executor.
    covers(&w, 4.0, window_s);
    let pct = |a| w.all.pct(a);
    assert!(pct("useful") > 1.0 && pct("lock") > 0.0, "{w:?}");
    assert_eq!((pct("deadlock"), pct("2pc")), (0.0, 0.0), "{w:?}");
}
