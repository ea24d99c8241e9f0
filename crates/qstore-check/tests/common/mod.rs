//! Helpers for building small histories by hand.
#![allow(dead_code)]

use qstore_check::{check, AnomalyClass, History, ObjKey, Outcome, Report, TxnRecord, Version};

/// Record `0:k`.
pub fn key(k: u64) -> ObjKey {
    ObjKey::new(0, k)
}

/// A committed transaction with no operations yet.
pub fn committed(id: u64) -> TxnRecord {
    TxnRecord {
        id,
        node: 0,
        outcome: Outcome::Committed,
        reads: Vec::new(),
        writes: Vec::new(),
    }
}

/// An aborted transaction (concurrency-control abort) with no operations yet.
pub fn aborted(id: u64) -> TxnRecord {
    TxnRecord {
        outcome: Outcome::Aborted {
            cause: "conflict".to_string(),
            logic: false,
        },
        ..committed(id)
    }
}

/// Builder-style additions to a transaction record.
pub trait TxnExt {
    /// Adds a read of version `(writer, seq)` of record `0:k`.
    fn reads(self, k: u64, writer: u64, seq: u32) -> Self;
    /// Adds `count` writes of record `0:k`.
    fn writes(self, k: u64, count: u32) -> Self;
}

impl TxnExt for TxnRecord {
    fn reads(mut self, k: u64, writer: u64, seq: u32) -> Self {
        self.reads.push((key(k), Version::new(writer, seq)));
        self
    }

    fn writes(mut self, k: u64, count: u32) -> Self {
        self.writes.push((key(k), count));
        self
    }
}

/// A history from transactions and `(record 0:k, writers)` version orders.
pub fn history(txns: Vec<TxnRecord>, orders: &[(u64, &[u64])]) -> History {
    History {
        txns,
        version_order: orders.iter().map(|&(k, w)| (key(k), w.to_vec())).collect(),
    }
}

/// Checks `h` and asserts that exactly the classes `expected` were found.
pub fn assert_classes(h: &History, expected: &[AnomalyClass]) -> Report {
    let report = check(h);
    assert_eq!(
        report.classes(),
        expected,
        "unexpected classes in report:\n{report}"
    );
    assert_eq!(report.is_serializable(), expected.is_empty());
    report
}

// The six planted anomalies, shared by the unit tests and the fixture files.

/// Two transactions read the initial x and both write x.
pub fn lost_update() -> History {
    history(
        vec![
            committed(1).reads(42, 0, 0).writes(42, 1),
            committed(2).reads(42, 0, 0).writes(42, 1),
        ],
        &[(42, &[1, 2])],
    )
}

/// T1 reads x, y and writes x; T2 reads x, y and writes y.
pub fn write_skew() -> History {
    history(
        vec![
            committed(1).reads(1, 0, 0).reads(2, 0, 0).writes(1, 1),
            committed(2).reads(1, 0, 0).reads(2, 0, 0).writes(2, 1),
        ],
        &[(1, &[1]), (2, &[2])],
    )
}

/// T1 writes x twice; T2 reads T1's first write (G1b).
pub fn dirty_read() -> History {
    history(
        vec![committed(1).writes(1, 2), committed(2).reads(1, 1, 0)],
        &[(1, &[1])],
    )
}

/// T1 writes x and y; T2 reads T1's x and the initial y.
pub fn fractured_read() -> History {
    history(
        vec![
            committed(1).writes(1, 1).writes(2, 1),
            committed(2).reads(1, 1, 0).reads(2, 0, 0),
        ],
        &[(1, &[1]), (2, &[1])],
    )
}

/// T1 aborts after writing x; T2 reads it (G1a).
pub fn aborted_read() -> History {
    history(
        vec![
            aborted(1).writes(1, 1),
            committed(2).reads(1, 1, 0).writes(2, 1),
        ],
        &[(2, &[2])],
    )
}

/// Ti reads record i (initial) and writes record i+1 (mod 6): a ring of six rw edges.
pub fn long_g2() -> History {
    let n = 6;
    let txns = (1..=n)
        .map(|i| committed(i).reads(i, 0, 0).writes(i % n + 1, 1))
        .collect();
    let orders: Vec<(u64, Vec<u64>)> = (1..=n).map(|i| (i % n + 1, vec![i])).collect();
    let orders: Vec<(u64, &[u64])> = orders.iter().map(|(k, w)| (*k, w.as_slice())).collect();
    history(txns, &orders)
}
