//! Clean histories must not be flagged.

mod common;

use common::*;
use proptest::prelude::*;
use qstore_check::{check, generate_serial_history, History, ObjKey, Outcome, TxnRecord, Version};

/// xorshift64*: the test's own seeded PRNG, independent of the crate's generator.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Simulates a serial execution of `n` random read/write transactions over 50
/// records, some of which abort.
fn simulate_serial(n: u64, seed: u64) -> History {
    let mut rng = XorShift(seed | 1);
    let mut current = vec![Version::INITIAL; 50];
    let mut orders: Vec<Vec<u64>> = vec![Vec::new(); 50];
    let mut txns = Vec::new();
    for id in 1..=n {
        let mut txn = committed(id);
        let mut written: Vec<(u64, u32)> = Vec::new();
        for _ in 0..1 + rng.below(6) {
            let k = rng.below(50);
            if rng.below(2) == 0 {
                let seen = match written.iter().find(|w| w.0 == k) {
                    Some(&(_, count)) => Version::new(id, count - 1),
                    None => current[k as usize],
                };
                txn.reads.push((key(k), seen));
            } else if let Some(w) = written.iter_mut().find(|w| w.0 == k) {
                w.1 += 1;
            } else {
                written.push((k, 1));
            }
        }
        if rng.below(10) == 0 {
            txn.outcome = Outcome::Aborted {
                cause: "user".into(),
                logic: true,
            };
        } else {
            for &(k, count) in &written {
                current[k as usize] = Version::new(id, count - 1);
                orders[k as usize].push(id);
            }
        }
        txn.writes = written.iter().map(|&(k, c)| (key(k), c)).collect();
        txns.push(txn);
    }
    let version_order = (0..50u64)
        .map(|k| (key(k), orders[k as usize].clone()))
        .collect();
    History {
        txns,
        version_order,
    }
}

#[test]
fn serial_history_of_1000_txns_is_serializable() {
    for seed in [1, 2, 3, 0xDEAD_BEEF] {
        let h = simulate_serial(1000, seed);
        let report = check(&h);
        assert!(report.is_serializable(), "{report}");
        assert!(
            report.to_string().starts_with("serializable: yes ("),
            "{report}"
        );
        assert!(report.edges.rw > 0 && report.edges.wr > 0 && report.edges.ww > 0);
    }
}

#[test]
fn clean_display_first_line() {
    let h = history(
        vec![committed(1).writes(1, 1), committed(2).reads(1, 1, 0)],
        &[(1, &[1])],
    );
    let report = check(&h);
    let first = report.to_string().lines().next().unwrap().to_string();
    assert_eq!(first, "serializable: yes (2 transactions, 1 edges)");
}

#[test]
fn generated_serial_history_is_serializable() {
    let h = generate_serial_history(5000, 300, 4, 7);
    assert_eq!(h.txns.len(), 5000);
    let report = check(&h);
    assert!(report.is_serializable(), "{report}");
    assert!(report.aborted > 0);
}

#[test]
fn swapping_a_version_order_breaks_serializability() {
    let mut h = generate_serial_history(2000, 50, 4, 11);
    let order = h
        .version_order
        .iter_mut()
        .find(|(_, w)| w.len() >= 2)
        .unwrap();
    order.1.swap(0, 1);
    assert!(!check(&h).is_serializable());
}

/// Maps transaction ids far apart, as an engine might (node id in the high bits).
fn sparse(id: u64) -> u64 {
    if id == 0 {
        0
    } else {
        ((id % 4) << 48) | (id * 1_000_003)
    }
}

#[test]
fn sparse_ids_are_handled() {
    let mut h = generate_serial_history(3000, 100, 4, 5);
    for txn in &mut h.txns {
        txn.id = sparse(txn.id);
        txn.reads
            .iter_mut()
            .for_each(|(_, v)| v.writer = sparse(v.writer));
    }
    h.version_order
        .iter_mut()
        .for_each(|(_, w)| w.iter_mut().for_each(|id| *id = sparse(*id)));
    assert!(check(&h).is_serializable());

    let mut lost = lost_update();
    lost.txns[1].id = sparse(2);
    lost.version_order[0].1[1] = sparse(2);
    assert_eq!(check(&lost).classes(), [qstore_check::AnomalyClass::G2]);
}

#[test]
fn empty_history_is_serializable() {
    let report = check(&History::default());
    assert!(report.is_serializable());
    assert_eq!(
        report.to_string().lines().next(),
        Some("serializable: yes (0 transactions, 0 edges)")
    );
}

fn arbitrary_txn() -> impl Strategy<Value = TxnRecord> {
    let read =
        (0u64..6, 0u64..8, 0u32..3).prop_map(|(k, w, s)| (ObjKey::new(0, k), Version::new(w, s)));
    let write = (0u64..6, 0u32..3).prop_map(|(k, c)| (ObjKey::new(0, k), c));
    (
        0u64..8,
        any::<bool>(),
        prop::collection::vec(read, 0..4),
        prop::collection::vec(write, 0..4),
    )
        .prop_map(|(id, ok, reads, writes)| TxnRecord {
            id,
            node: 0,
            outcome: if ok {
                Outcome::Committed
            } else {
                Outcome::Aborted {
                    cause: String::new(),
                    logic: false,
                }
            },
            reads,
            writes,
        })
}

proptest! {
    #[test]
    fn serial_histories_are_always_clean(n in 0usize..300, keys in 1u64..40, ops in 0usize..6, seed in any::<u64>()) {
        let report = check(&generate_serial_history(n, keys, ops, seed));
        prop_assert!(report.is_serializable(), "{}", report);
    }

    /// Arbitrary garbage must be reported, never panic.
    #[test]
    fn arbitrary_histories_do_not_panic(
        txns in prop::collection::vec(arbitrary_txn(), 0..8),
        orders in prop::collection::vec((0u64..6, prop::collection::vec(0u64..8, 0..4)), 0..6),
    ) {
        let h = History {
            txns,
            version_order: orders.into_iter().map(|(k, w)| (ObjKey::new(0, k), w)).collect(),
        };
        let report = check(&h);
        let _ = report.to_string();
    }
}
