//! The JSON-lines fixtures under `fixtures/` parse and carry the right anomaly.

mod common;

use std::fs::File;
use std::io::BufReader;

use common::*;
use qstore_check::{check, AnomalyClass, AnomalyClass::*, History};

fn load(name: &str) -> History {
    let path = format!("{}/fixtures/{name}.jsonl", env!("CARGO_MANIFEST_DIR"));
    let file = File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    History::read_jsonl(BufReader::new(file)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn planted_fixtures_have_their_anomaly() {
    let cases: [(&str, History, AnomalyClass); 6] = [
        ("lost_update", lost_update(), G2),
        ("write_skew", write_skew(), G2),
        ("dirty_read", dirty_read(), G1b),
        ("fractured_read", fractured_read(), G2),
        ("aborted_read", aborted_read(), G1a),
        ("long_g2", long_g2(), G2),
    ];
    for (name, built, class) in cases {
        let loaded = load(name);
        assert_eq!(loaded, built, "{name}.jsonl differs from its builder");
        let report = check(&loaded);
        assert_eq!(report.classes(), [class], "{name}:\n{report}");
    }
}

#[test]
fn long_g2_fixture_reports_a_six_cycle() {
    let report = check(&load("long_g2"));
    assert_eq!(report.anomalies[0].cycle.len(), 6);
}

#[test]
fn clean_fixture_is_serializable() {
    let report = check(&load("clean"));
    assert!(report.is_serializable(), "{report}");
    assert_eq!((report.committed, report.aborted), (4, 2));
    assert!(report
        .to_string()
        .starts_with("serializable: yes (4 transactions, "));
}
