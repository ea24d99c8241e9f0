//! Timing on a large history. Run with
//! `cargo test -p qstore-check --release -- --ignored --nocapture million`.

use std::time::Instant;

use qstore_check::{check, generate_serial_history, History};

#[test]
#[ignore = "slow in debug builds; run in release with --ignored"]
fn million_txn_history() {
    let start = Instant::now();
    let h = generate_serial_history(1_000_000, 100_000, 4, 42);
    let generated = start.elapsed();

    let start = Instant::now();
    let mut bytes = Vec::new();
    h.write_jsonl(&mut bytes).unwrap();
    let written = start.elapsed();

    let start = Instant::now();
    let parsed = History::read_jsonl(bytes.as_slice()).unwrap();
    let read = start.elapsed();
    assert_eq!(parsed.txns.len(), h.txns.len());
    drop(parsed);

    let start = Instant::now();
    let report = check(&h);
    let checked = start.elapsed();
    assert!(report.is_serializable(), "{report}");

    println!(
        "million_txn_history: generate {generated:.2?}, write {written:.2?} ({} MB), \
         parse {read:.2?}, check {checked:.2?}",
        bytes.len() >> 20
    );
    println!("{report}");

    // Corrupt one version order: the checker must find the cycle just as fast.
    let mut bad = h;
    let order = bad
        .version_order
        .iter_mut()
        .find(|(_, w)| w.len() >= 3)
        .unwrap();
    order.1.swap(1, 2);
    let start = Instant::now();
    let report = check(&bad);
    println!("corrupted copy: check {:.2?}", start.elapsed());
    println!("{report}");
    assert!(!report.is_serializable());
}
