//! Short runs of an embedded cluster through the load generator.

use qstore_bench::{run, RunOptions};
use qstore_core::RunConfig;

fn small(nodes: u32) -> RunConfig {
    let mut c = RunConfig::default();
    c.cluster.nodes = nodes;
    c.workload.ycsb.records_per_partition = 2_000;
    c.workload.ycsb.ops_per_txn = 8;
    c.client.warmup_s = 0.0;
    c
}

/// Runs `cfg` recording the engine's history, and checks the run with `--verify`'s checks
/// (history, serial oracle where it applies, invariants); `what` names it in a failure.
fn run_verified(cfg: &RunConfig, what: &str) -> qstore_bench::RunOutcome {
    let opts = RunOptions {
        record_history: true,
        ..Default::default()
    };
    let out = run(cfg, opts).unwrap();
    let v = qstore_bench::verify::verify(cfg, out.workload.as_ref(), &out.cluster, &out.report)
        .unwrap();
    assert!(v.passed(), "{what}:\n{v}");
    out
}

fn hashes(cfg: &RunConfig) -> Vec<String> {
    let opts = RunOptions {
        state_hashes: true,
        ..Default::default()
    };
    run(cfg, opts).unwrap().report.state_hashes.unwrap()
}

#[test]
fn counted_run_commits_exactly_the_count() {
    let mut c = small(3);
    c.client.txns = 3_000;
    c.client.duration_s = 0.0;
    c.client.inflight = 4;
    c.workload.ycsb.multi_partition_fraction = 0.5;
    c.workload.ycsb.theta = 0.9;
    let r = run(&c, RunOptions::default()).unwrap().report;
    assert_eq!(r.committed, 3_000);
    assert_eq!(r.ops, 3_000 * 8);
    assert_eq!((r.rejected, r.unfinished, r.logic_aborts), (0, 0, 0));
    assert!(r.latency.p50_us > 0 && r.latency.p50_us <= r.latency.p99_us);
    assert!(r.throughput_tps > 0.0);
}

#[test]
fn same_seed_same_state_and_different_seed_different_state() {
    let mut c = small(2);
    c.client.txns = 2_000;
    // Bounded by the count alone: on a loaded machine a time limit could end one run
    // before its 2,000th commit, and its state would differ for that reason.
    c.client.duration_s = 0.0;
    c.client.clients = 1;
    c.client.inflight = 1;
    let a = hashes(&c);
    assert_eq!(a, hashes(&c));
    c.seed += 1;
    assert_ne!(a, hashes(&c));
}

#[test]
fn timed_run_measures_its_window() {
    let mut c = small(2);
    c.client.duration_s = 0.5;
    c.client.warmup_s = 0.2;
    let r = run(&c, RunOptions::default()).unwrap().report;
    assert!((0.45..1.0).contains(&r.window_s), "window {}", r.window_s);
    assert!(r.committed > 0);
    assert_eq!(r.unfinished, 0);
}

#[test]
fn open_loop_holds_its_rate() {
    let mut c = small(2);
    c.client.rate = 2_000.0;
    c.client.duration_s = 1.0;
    let r = run(&c, RunOptions::default()).unwrap().report;
    assert!((1_500..=2_100).contains(&r.committed), "{}", r.committed);
}

#[test]
fn progress_is_reported_each_second() {
    let mut c = small(1);
    c.client.duration_s = 2.2;
    let mut samples = Vec::new();
    let mut record = |p: &qstore_bench::Progress| samples.push(p.committed);
    let opts = RunOptions {
        progress: Some(&mut record),
        ..Default::default()
    };
    run(&c, opts).unwrap();
    assert_eq!(samples.len(), 2, "{samples:?}");
    assert!(samples[1] > samples[0]);
}

/// The phases' time and traffic of an interactive protocol: their messages add up to the
/// run's, and a protocol whose read-only participants skip phase two (2PL) sends fewer commit
/// messages than one that cannot (F1's OCC), as the Sundial paper's figure 7c shows.
#[test]
fn interactive_phases_account_for_the_traffic_and_show_the_read_only_optimisation() {
    let commit_msgs = |protocol: &str| {
        let mut c = small(3);
        c.protocol.name = protocol.into();
        c.client.duration_s = 0.5;
        c.workload.ycsb.write_fraction = 0.1;
        c.workload.ycsb.remote_access_fraction = 0.3;
        let r = run(&c, RunOptions::default()).unwrap().report;
        let names: Vec<&str> = r.stages.iter().map(|s| s.stage.as_str()).collect();
        assert_eq!(
            names,
            ["execution", "prepare", "commit", "aborted attempts"],
            "{protocol}"
        );
        let per_txn: Vec<_> = r.stages.iter().map(|s| s.per_txn.unwrap()).collect();
        // A sample of the transactions is measured, with every message of each.
        let msgs: f64 = per_txn.iter().map(|c| c.msgs).sum();
        assert!(
            (msgs - r.msgs_per_txn).abs() <= 0.1 * r.msgs_per_txn,
            "{protocol}: phases {msgs:.2} messages per txn, run {:.2}",
            r.msgs_per_txn
        );
        assert!(per_txn[2].us > 0.0);
        per_txn[2].msgs
    };
    let (locking, optimistic) = (commit_msgs("no_wait"), commit_msgs("occ"));
    assert!(
        locking < 0.6 * optimistic,
        "commit messages per txn: no_wait {locking:.2}, occ {optimistic:.2}"
    );
}

/// DL_DETECT without two-phase commit (the determinism study's upper bound on its cost):
/// distributed transactions send no prepare and no vote, and the history, with nothing
/// failing, stays serializable.
#[test]
fn dl_detect_without_two_phase_commit_prepares_nothing_and_stays_serializable() {
    let prepare_msgs = |skip: bool| {
        let mut c = small(3);
        c.protocol.name = "dl_detect".into();
        c.protocol.dl_detect.skip_commit_protocol = skip;
        c.client.duration_s = 0.5;
        c.workload.ycsb.multi_partition_fraction = 0.5;
        let out = run_verified(&c, &format!("skip {skip}"));
        let prepare = out.report.stages.iter().find(|s| s.stage == "prepare");
        prepare.and_then(|s| s.per_txn).unwrap().msgs
    };
    assert!(prepare_msgs(false) > 0.2);
    assert_eq!(prepare_msgs(true), 0.0);
    let mut c = small(3);
    c.protocol.dl_detect.skip_commit_protocol = true;
    let refused = c.validate().unwrap_err().to_string();
    assert!(refused.contains("--protocol dl_detect"), "{refused}");
    c.protocol.name = "dl_detect".into();
    c.durability.data_dir = "/tmp/qstore-never-created".into();
    let refused = c.validate().unwrap_err().to_string();
    assert!(
        refused.contains("leave the data directory out"),
        "{refused}"
    );
}

/// TPC-C Stock-Level runs as OLLP: each commit is a reconnaissance and then the transaction,
/// and a stale guess is restarted (counted as `ollp_restart`), never reported as a failure.
#[test]
fn ollp_transactions_restart_until_they_commit() {
    for protocol in ["qstore", "calvin", "no_wait", "occ"] {
        let mut c = RunConfig::default();
        c.protocol.name = protocol.into();
        c.cluster.nodes = 1;
        c.workload.name = "tpcc".into();
        c.cluster.partitioning = qstore_core::config::Partitioning::Range;
        let t = &mut c.workload.tpcc;
        t.mix = qstore_core::config::TpccMix::NeworderPayment;
        t.payment_fraction = 0.0;
        t.stock_level_fraction = 0.5;
        t.max_orders_per_district = 4_000;
        t.multi_partition_fraction = 0.0;
        c.client.warmup_s = 0.0;
        c.client.txns = 400;
        c.client.duration_s = 0.0;
        c.client.inflight = 16;
        let r = run(&c, RunOptions::default()).unwrap().report;
        assert_eq!(
            (r.committed, r.unfinished, r.rejected),
            (400, 0, 0),
            "{protocol}"
        );
        assert!(
            r.logic_aborts_by_reason
                .keys()
                .all(|why| !why.contains("ollp")),
            "{protocol}: {:?}",
            r.logic_aborts_by_reason
        );
    }
}

/// The microbenchmark's dependent transactions under an index that changes so often that
/// OLLP's guesses go stale: deterministic protocols restart them (counted as
/// `ollp_restart`), nondeterministic ones look the entry up inside the transaction and never
/// restart; every history stays serializable, the deterministic ones replay serially to the
/// same state, and the updater's transactions count apart.
#[test]
fn dependent_transactions_restart_under_a_volatile_index_and_stay_serializable() {
    for protocol in ["qstore", "calvin", "dl_detect", "no_wait"] {
        let mut c = RunConfig::default();
        c.protocol.name = protocol.into();
        c.cluster.nodes = 3;
        c.workload.name = "micro".into();
        let m = &mut c.workload.micro;
        m.records_per_partition = 5_000;
        m.contention_index = 0.01;
        m.multi_partition_fraction = 0.5;
        m.dependent_fraction = 0.8;
        m.lookup_position = 0.2;
        // Ten entries per partition, each moved 200 times a second: a guess a few
        // milliseconds old is often stale.
        m.index_entries_per_partition = 10;
        m.index_volatility = 200.0;
        c.client.warmup_s = 0.0;
        c.client.duration_s = 0.8;
        c.client.inflight = 8;
        let out = run_verified(&c, protocol);
        let r = &out.report;
        let restarts = r.cc_aborts.get("ollp_restart").copied().unwrap_or(0);
        let background = r.background.expect("the updater ran");
        assert!(background.committed > 100, "{protocol}: {background:?}");
        assert_eq!(
            (r.unfinished, r.rejected, r.logic_aborts),
            (0, 0, 0),
            "{protocol}"
        );
        match c.protocol.plans_up_front() {
            true => assert!(restarts > 10, "{protocol}: {restarts} OLLP restarts"),
            false => assert_eq!(restarts, 0, "{protocol} looks up in the transaction"),
        }
    }
}

/// A node decides the fates of its own speculative batches without a message to itself
/// when nothing aborted (before, every planner batch of transactions that may abort woke
/// the node's network thread once): one node sends nothing, and stays serializable.
#[test]
fn one_speculative_node_sends_itself_no_messages() {
    let mut c = RunConfig::default();
    c.cluster.nodes = 1;
    c.workload.name = "kv".into();
    c.workload.kv.buckets_per_partition = 1_024;
    c.workload.kv.keys = 200;
    c.client.warmup_s = 0.0;
    c.client.duration_s = 0.0;
    c.client.txns = 3_000;
    let r = run_verified(&c, "one speculative node").report;
    assert_eq!(r.committed, 3_000);
    assert_eq!(r.msgs_per_txn, 0.0, "a node sent messages to itself");
}
