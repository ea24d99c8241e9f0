//! Hand-built histories with planted anomalies.

mod common;

use common::*;
use qstore_check::{check, check_with, AnomalyClass::*, CheckOptions, EdgeKind, ObjKey};

#[test]
fn lost_update_is_g2() {
    let report = assert_classes(&lost_update(), &[G2]);
    assert_eq!(
        report.anomalies[0].to_string(),
        "G2: T2 -rw-> T1 -ww-> T2 (lost update on 0:42)"
    );
    assert_eq!(report.edges.ww, 1);
    assert_eq!(report.edges.rw, 1);
}

#[test]
fn write_skew_is_g2() {
    let report = assert_classes(&write_skew(), &[G2]);
    let cycle = &report.anomalies[0].cycle;
    assert_eq!(cycle.len(), 2);
    assert!(cycle.iter().all(|e| e.kind == EdgeKind::Rw));
    assert!(report.anomalies[0].description.starts_with("write skew"));
}

#[test]
fn intermediate_read_is_g1b() {
    let report = assert_classes(&dirty_read(), &[G1b]);
    assert_eq!(report.anomalies[0].txns, vec![2, 1]);
}

#[test]
fn fractured_read_is_g2() {
    let report = assert_classes(&fractured_read(), &[G2]);
    let kinds: Vec<_> = report.anomalies[0].cycle.iter().map(|e| e.kind).collect();
    assert_eq!(kinds, [EdgeKind::Rw, EdgeKind::Wr]);
    assert!(report.anomalies[0]
        .description
        .starts_with("fractured read"));
}

#[test]
fn read_of_aborted_write_is_g1a() {
    let report = assert_classes(&aborted_read(), &[G1a]);
    assert!(report.anomalies[0].description.contains("aborted T1"));
    assert_eq!((report.committed, report.aborted), (1, 1));
}

#[test]
fn long_rw_ring_is_g2_with_six_edges() {
    let report = assert_classes(&long_g2(), &[G2]);
    let anomaly = &report.anomalies[0];
    assert_eq!(anomaly.cycle.len(), 6);
    assert!(anomaly.cycle.iter().all(|e| e.kind == EdgeKind::Rw));
    // The cycle is closed and consecutive.
    for pair in anomaly.cycle.windows(2) {
        assert_eq!(pair[0].to, pair[1].from);
    }
    assert_eq!(anomaly.cycle[5].to, anomaly.cycle[0].from);
}

#[test]
fn opposite_write_orders_are_g0() {
    let h = history(
        vec![
            committed(1).writes(1, 1).writes(2, 1),
            committed(2).writes(1, 1).writes(2, 1),
        ],
        &[(1, &[1, 2]), (2, &[2, 1])],
    );
    let report = assert_classes(&h, &[G0]);
    assert!(report.anomalies[0]
        .cycle
        .iter()
        .all(|e| e.kind == EdgeKind::Ww));
}

#[test]
fn mutual_reads_are_g1c() {
    let h = history(
        vec![
            committed(1).writes(1, 1).reads(2, 2, 0),
            committed(2).writes(2, 1).reads(1, 1, 0),
        ],
        &[(1, &[1]), (2, &[2])],
    );
    let report = assert_classes(&h, &[G1c]);
    let kinds: Vec<_> = report.anomalies[0].cycle.iter().map(|e| e.kind).collect();
    assert_eq!(kinds, [EdgeKind::Wr, EdgeKind::Wr]);
}

#[test]
fn g0_and_g1c_in_one_component_are_both_reported() {
    // T1 and T2 form a write cycle; T3 reads T2's x and T1 reads T3's z.
    let h = history(
        vec![
            committed(1).writes(1, 1).writes(2, 1).reads(3, 3, 0),
            committed(2).writes(1, 1).writes(2, 1),
            committed(3).reads(1, 2, 0).writes(3, 1),
        ],
        &[(1, &[1, 2]), (2, &[2, 1]), (3, &[3])],
    );
    let report = check(&h);
    assert_eq!(report.count(G0), 1);
    assert_eq!(report.count(G1c), 1);
}

#[test]
fn versions_that_never_existed_are_phantom() {
    let cases = [
        committed(2).reads(1, 99, 0), // writer not in history
        committed(2).reads(3, 1, 0),  // writer never wrote record 3
        committed(2).reads(1, 1, 5),  // seq beyond the write count
        committed(2).reads(1, 0, 1),  // the initial version only has seq 0
    ];
    for reader in cases {
        let h = history(vec![committed(1).writes(1, 1), reader], &[(1, &[1])]);
        let report = assert_classes(&h, &[PhantomVersion]);
        assert!(report.anomalies[0].description.contains("but"), "{report}");
    }
}

#[test]
fn read_of_unordered_version_is_phantom_and_incomplete_order() {
    let h = history(
        vec![committed(1).writes(1, 1), committed(2).reads(1, 1, 0)],
        &[],
    );
    assert_classes(&h, &[PhantomVersion, IncompleteOrder]);
}

#[test]
fn bad_version_orders_are_incomplete_order() {
    let cases: [&[u64]; 4] = [&[1, 9], &[1, 3], &[1, 1], &[1, 0]];
    for order in cases {
        let h = history(
            vec![committed(1).writes(1, 1), aborted(3).writes(1, 1)],
            &[(1, order)],
        );
        let report = assert_classes(&h, &[IncompleteOrder]);
        assert!(report.anomalies[0]
            .description
            .starts_with("version order of 0:1 names"));
    }
}

#[test]
fn duplicate_and_zero_ids_are_invalid() {
    let h = history(
        vec![committed(1).writes(1, 1), committed(1), committed(0)],
        &[(1, &[1])],
    );
    let report = assert_classes(&h, &[InvalidHistory]);
    assert_eq!(report.count(InvalidHistory), 2);
}

#[test]
fn reading_own_writes_adds_no_edges() {
    let h = history(
        vec![committed(1).writes(1, 2).reads(1, 1, 0).reads(1, 1, 1)],
        &[(1, &[1])],
    );
    let report = assert_classes(&h, &[]);
    assert_eq!(report.edges.total(), 0);
}

#[test]
fn anomalies_are_capped_per_class_but_all_counted() {
    let mut txns = Vec::new();
    let mut orders = Vec::new();
    for k in 0..25u64 {
        let (a, b) = (2 * k + 1, 2 * k + 2);
        txns.push(committed(a).reads(k, 0, 0).writes(k, 1));
        txns.push(committed(b).reads(k, 0, 0).writes(k, 1));
        orders.push((key(k), vec![a, b]));
    }
    let h = qstore_check::History {
        txns,
        version_order: orders,
    };
    let report = check_with(
        &h,
        &CheckOptions {
            max_reported_per_class: 3,
            ..Default::default()
        },
    );
    assert_eq!(report.count(G2), 25);
    assert_eq!(report.anomalies.len(), 3);
    let text = report.to_string();
    assert!(
        text.starts_with("serializable: NO (50 transactions, 50 edges)\n"),
        "{text}"
    );
    assert!(text.contains("... and 22 more G2 (25 in total)"), "{text}");
}

#[test]
fn cycle_edges_name_their_records() {
    let report = check(&fractured_read());
    let keys: Vec<_> = report.anomalies[0].cycle.iter().map(|e| e.key).collect();
    assert_eq!(keys, [Some(ObjKey::new(0, 2)), Some(ObjKey::new(0, 1))]);
}
