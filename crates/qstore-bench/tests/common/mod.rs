//! What the end-to-end tests of replicated and unreplicated runs share.
// Each test file that includes this module uses part of it.
#![allow(dead_code)]

use qstore_bench::verify::{verify, Verification};
use qstore_bench::{run, RunOptions};
use qstore_core::RunConfig;

/// A small run of `protocol` on `workload`: 3 nodes, small tables, YCSB at theta 0.9 with
/// half the transactions multi-partition, 6 clients x 20 in flight, 1,500 transactions.
pub fn small(protocol: &str, workload: &str) -> RunConfig {
    let mut c = RunConfig::default();
    c.protocol.name = protocol.into();
    c.cluster.nodes = 3;
    c.workload.name = workload.into();
    c.workload.ycsb.records_per_partition = 2_000;
    c.workload.ycsb.ops_per_txn = 8;
    c.workload.ycsb.theta = 0.9;
    c.workload.ycsb.multi_partition_fraction = 0.5;
    c.workload.bank.accounts_per_partition = 64;
    c.workload.append.keys_per_partition = 1_000;
    c.client.clients = 6;
    c.client.inflight = 20;
    c.client.txns = 1_500;
    // Bounded by the count alone (a stall still ends it): on a loaded machine the default
    // 5 s window could end a run before its last commit.
    c.client.duration_s = 0.0;
    c
}

/// Runs `cfg` (a counted run) with its history recorded: every transaction is answered and
/// committed; returns the verification and the report.
pub fn verified(cfg: &RunConfig) -> (Verification, qstore_bench::report::RunReport) {
    let opts = RunOptions {
        record_history: true,
        ..Default::default()
    };
    let out = run(cfg, opts).unwrap();
    let r = &out.report;
    assert_eq!(
        (r.committed, r.rejected, r.unfinished),
        (cfg.client.txns, 0, 0)
    );
    let v = verify(cfg, out.workload.as_ref(), &out.cluster, r).unwrap();
    (v, out.report)
}

/// Runs a timed configuration with its history recorded: every transaction answered and
/// something committed; returns the verification (not asserted) and the outcome.
fn answered(cfg: &RunConfig) -> (Verification, qstore_bench::RunOutcome) {
    let opts = RunOptions {
        record_history: true,
        ..Default::default()
    };
    let out = run(cfg, opts).unwrap();
    let r = &out.report;
    assert_eq!((r.rejected, r.unfinished), (0, 0), "{r:?}");
    assert!(r.committed > 0, "{r:?}");
    let v = verify(cfg, out.workload.as_ref(), &out.cluster, r).unwrap();
    (v, out)
}

/// Runs a replicated configuration that cuts a server of instance 0 off, with its history
/// recorded: every transaction answered, something committed, and the verification passed
/// with instance 0 alone out of service.
pub fn failed_over(cfg: &RunConfig) -> (Verification, qstore_bench::RunOutcome) {
    let (v, out) = answered(cfg);
    assert!(v.passed(), "{v}");
    let fo = v.failover.as_ref().expect("a fail-over happened");
    assert_eq!(fo.stale, vec![0], "{v}");
    (v, out)
}

/// Runs a replicated configuration that cuts server `cut` off for a while, with its history
/// recorded: every transaction answered, something committed, the verification passed with
/// every instance in service at the end, and the cut-off server's instance rebuilt.
pub fn rebuilt(cfg: &RunConfig, cut: u32) -> (Verification, qstore_bench::RunOutcome) {
    let (v, out) = answered(cfg);
    every_copy_checked(&v, cfg, &format!("server {cut} cut off and back"));
    if let Some(fo) = &v.failover {
        assert!(fo.stale.is_empty(), "{v}");
    }
    let placement = &out.cluster.ctx().placement;
    let instance = placement.instance_of(qstore_core::NodeId(cut));
    assert!(placement.is_rebuilt(instance), "instance {instance}: {v}");
    (v, out)
}

/// Asserts that a replicated run passed its verification with every copy of every partition
/// replayed against the oracle, and (but on ycsb, which has none) the workload's invariants.
pub fn every_copy_checked(v: &Verification, cfg: &RunConfig, case: &str) {
    let factor = cfg.replication.factor;
    assert!(v.passed(), "{case}:\n{v}");
    let oracle = v.oracle.as_ref().unwrap();
    assert!(
        oracle.detail.contains(&format!("x {factor} copies")),
        "{case}: {}",
        oracle.detail
    );
    if cfg.workload.name != "ycsb" {
        assert!(matches!(v.invariants, Some(Ok(_))), "{case}");
    }
}
