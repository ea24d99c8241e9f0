//! Durability: a cluster whose servers keep data directories logs what it commits, and a
//! cluster started again on them comes back with it.
//!
//! - The deterministic protocols log their input and replay it. Each start runs more
//!   transactions; after each, the history holds every transaction of every start (replayed
//!   ones included), is serializable, and replaying it serially gives every copy's hash.
//! - The interactive protocols log their effects (write-ahead logging with two-phase
//!   commit). A start comes back with exactly the partitions the last one ended with, and its
//!   own history (which begins from that state) is serializable. LEAP also logs the records
//!   it moves: a start comes back with the data as a whole, each record at one owner.

mod common;

use common::{small, verified};
use qstore_bench::run;
use qstore_bench::verify::verify;
use qstore_core::RunConfig;
use std::path::PathBuf;

fn data_dir(case: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("qstore-durable-{}-{case}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Runs `cfg` three times on the same data directories.
fn restarts(mut cfg: RunConfig, case: &str) {
    let dir = data_dir(case);
    cfg.durability.data_dir = dir.to_string_lossy().into_owned();
    cfg.client.txns = 400;
    for start in 1..=3u64 {
        let (v, _) = verified(&cfg);
        assert!(v.passed(), "{case}, start {start}:\n{v}");
        assert_eq!(
            v.history.committed as u64,
            start * cfg.client.txns,
            "{case}, start {start}: the history holds every start's transactions"
        );
        let oracle = v.oracle.as_ref().expect("deterministic");
        assert!(
            oracle.hashes_match,
            "{case}, start {start}: {}",
            oracle.detail
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn qstore_recovers_its_batches_from_its_data_directories() {
    restarts(small("qstore", "bank"), "qstore");
}

#[test]
fn calvin_recovers_its_epochs_from_its_data_directories() {
    restarts(small("calvin", "bank"), "calvin");
}

#[test]
fn replicated_copies_recover_together() {
    let mut cfg = small("qstore", "append");
    cfg.replication.factor = 2;
    restarts(cfg, "qstore-rf2");
}

/// Runs `cfg` on its data directories: verified, and every transaction committed; returns
/// the partitions' hashes when it stopped.
fn verified_hashes(cfg: &RunConfig, case: &str) -> Vec<u64> {
    let opts = qstore_bench::RunOptions {
        record_history: true,
        ..Default::default()
    };
    let out = run(cfg, opts).unwrap();
    assert_eq!(out.report.committed, cfg.client.txns, "{case}");
    let v = verify(cfg, out.workload.as_ref(), &out.cluster, &out.report).unwrap();
    assert!(v.passed(), "{case}:\n{v}");
    if cfg.protocol.name.ends_with("lstore") {
        // Even a read moves LEAP's records: what is where changes, not what there is.
        return vec![out.cluster.data_hash()];
    }
    out.cluster.partition_hashes()
}

#[test]
fn interactive_protocols_come_back_with_what_they_committed() {
    let protocols = [
        ("no_wait", "bank"),
        ("wait_die", "append"),
        ("dl_detect", "bank"),
        ("hstore", "append"),
        ("timestamp", "bank"),
        ("mvcc", "append"),
        ("occ", "bank"),
        ("maat", "append"),
        ("sundial", "bank"),
        ("sundial", "append"),
        ("lstore", "bank"),
        ("hlstore", "append"),
        ("lstore", "append"),
        ("hlstore", "bank"),
    ];
    for (i, (protocol, workload)) in protocols.into_iter().enumerate() {
        let case = format!("{protocol} {workload}");
        let dir = data_dir(protocol);
        let mut cfg = small(protocol, workload);
        cfg.durability.data_dir = dir.to_string_lossy().into_owned();
        cfg.client.txns = 300;
        // Half of them recover from their log alone, half from the checkpoint a server
        // takes when it stops, and the log after it.
        let checkpoints = i % 2 == 1;
        if !checkpoints {
            cfg.durability.checkpoint_interval_s = Some(0);
        }
        let first = verified_hashes(&cfg, &case);
        assert_eq!(
            dir.join("server-0/checkpoint").exists(),
            checkpoints,
            "{case}: a checkpoint when asked for"
        );
        let second = verified_hashes(&cfg, &case);
        assert_ne!(first, second, "{case}: the second start changed the data");
        // A start that only reads shows what recovery brought back.
        cfg.client.txns = 20;
        cfg.workload.bank.audit_fraction = 1.0;
        cfg.workload.append.read_fraction = 1.0;
        let third = verified_hashes(&cfg, &case);
        assert_eq!(
            third, second,
            "{case}: recovered exactly what was committed"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn a_data_directory_of_another_cluster_shape_is_refused() {
    let dir = data_dir("shape");
    let mut cfg = small("qstore", "bank");
    cfg.durability.data_dir = dir.to_string_lossy().into_owned();
    cfg.client.txns = 50;
    verified(&cfg);
    cfg.cluster.nodes = 2;
    let err = qstore_bench::run(&cfg, Default::default())
        .err()
        .expect("refused");
    assert!(
        err.to_string().contains("holds a cluster of 3 partitions"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_later_start_with_the_default_clients_appends_values_of_its_own() {
    // Clients left to their default number (one per node): a later start's clients are
    // still others than the earlier start's, so no value is appended to a list twice.
    let dir = data_dir("default-clients");
    let mut cfg = small("no_wait", "append");
    cfg.client.clients = 0;
    cfg.client.txns = 300;
    cfg.durability.data_dir = dir.to_string_lossy().into_owned();
    verified_hashes(&cfg, "first start");
    verified_hashes(&cfg, "second start");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A deterministic protocol checkpoints every node at one boundary (a Q-Store batch, a Calvin
/// epoch); the log before it is forgotten, and a later start restores the checkpoint and
/// replays only what came after: its history starts there, and the serial oracle replays it
/// onto the checkpoint.
/// With replication (`factor` copies), each cluster instance checkpoints on its own.
fn checkpoints_forget_the_log_and_a_restart_resumes_from_them(protocol: &str, factor: u32) {
    let sub = format!("{protocol}-checkpoints");
    let dir = data_dir(&format!("{sub}-rf{factor}"));
    let mut cfg = small(protocol, "bank");
    cfg.replication.factor = factor;
    let nodes = cfg.cluster.nodes;
    cfg.durability.data_dir = dir.to_string_lossy().into_owned();
    cfg.durability.checkpoint_interval_s = Some(1);
    // About 2.5 s of transactions: checkpoints after one and two seconds.
    cfg.client.txns = 5_000;
    cfg.client.rate = 2_000.0;
    let checkpoints = |server: u32| -> Vec<String> {
        let d = dir.join(format!("server-{server}/{sub}"));
        let mut names: Vec<String> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    let (v, _) = verified(&cfg);
    assert!(v.passed(), "first start:\n{v}");
    for instance in 0..factor {
        let taken = checkpoints(instance * nodes);
        assert!(
            !taken.is_empty(),
            "instance {instance}: no checkpoint taken"
        );
        for s in 1..nodes {
            assert_eq!(
                checkpoints(instance * nodes + s),
                taken,
                "every node of instance {instance} checkpoints at the same boundaries"
            );
        }
    }
    // A second start restores the newest one every node holds and replays the rest.
    cfg.client.txns = 400;
    cfg.client.rate = 0.0;
    let (v, _) = verified(&cfg);
    assert!(v.passed(), "restart:\n{v}");
    let oracle = v.oracle.as_ref().expect("deterministic");
    assert!(oracle.hashes_match, "restart: {}", oracle.detail);
    assert!(
        (v.history.committed as u64) < 5_000 + 400,
        "the history starts at the checkpoint, not at the first start ({} transactions)",
        v.history.committed
    );
    // Without its checkpoints, a node whose log was forgotten refuses to start.
    for name in checkpoints(1) {
        std::fs::remove_file(dir.join("server-1").join(&sub).join(name)).unwrap();
    }
    match qstore_bench::run(&cfg, Default::default()) {
        Err(err) => assert!(
            err.to_string().contains("entries before it are gone"),
            "{err}"
        ),
        // With replication a member compacts its copy of the group log only as far as every
        // active member's instance has checkpointed: on a loaded machine the other instance
        // may have lagged, and the log still holds everything, so the start is right to go
        // on (and must verify).
        Ok(_) if factor > 1 => {
            let (v, _) = verified(&cfg);
            assert!(v.passed(), "restart on an uncut log:\n{v}");
        }
        Ok(_) => panic!("a node whose log was cut started without its checkpoints"),
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn qstore_checkpoints_forget_the_log_and_a_restart_resumes_from_them() {
    checkpoints_forget_the_log_and_a_restart_resumes_from_them("qstore", 1);
}

#[test]
fn calvin_checkpoints_forget_the_log_and_a_restart_resumes_from_them() {
    checkpoints_forget_the_log_and_a_restart_resumes_from_them("calvin", 1);
}

#[test]
fn replicated_qstore_checkpoints_each_instance_and_recovers_from_them() {
    checkpoints_forget_the_log_and_a_restart_resumes_from_them("qstore", 2);
}

#[test]
fn replicated_calvin_checkpoints_each_instance_and_recovers_from_them() {
    checkpoints_forget_the_log_and_a_restart_resumes_from_them("calvin", 2);
}
