//! Durability of the deterministic protocols: a cluster whose servers keep data directories
//! logs its input, and a cluster started again on them replays it. Each start runs more
//! transactions; after each, the history holds every transaction of every start (replayed
//! ones included), is serializable, and replaying it serially gives every copy's hash.

mod common;

use common::{small, verified};
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
