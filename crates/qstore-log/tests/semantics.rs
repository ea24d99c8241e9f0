//! The same semantic checks against both implementations of `RecordLog`: `MemLog` and
//! `SegmentLog`.

mod common;

use common::{payload, read_all, with_timeout, TempDir};
use qstore_log::{FsyncPolicy, LogError, LogOptions, MemLog, RecordLog, SegmentLog};

fn options() -> LogOptions {
    LogOptions {
        fsync: FsyncPolicy::Always,
        segment_bytes: 700,
        max_record_size: 1000,
        ..LogOptions::default()
    }
}

/// Runs `check` against a fresh `MemLog` and a fresh `SegmentLog` with the same options.
fn on_both(tag: &'static str, check: fn(&dyn RecordLog)) {
    with_timeout(60, move || {
        let mem = MemLog::with_options(options()).expect("MemLog");
        check(&mem);
        let dir = TempDir::new(tag);
        let seg = SegmentLog::open(dir.path(), options()).expect("SegmentLog");
        check(&seg);
    });
}

fn is_out_of_range<T>(r: Result<T, LogError>) -> bool {
    matches!(r, Err(LogError::OutOfRange { .. }))
}

fn append_read_and_sync(log: &dyn RecordLog) {
    assert_eq!(
        (log.first_lsn(), log.next_lsn(), log.last_lsn()),
        (0, 0, None)
    );
    assert_eq!(read_all(log), vec![]);
    assert!(is_out_of_range(log.sync_to(0)));
    for i in 0..50 {
        assert_eq!(log.append(&payload(i)).expect("append"), i);
    }
    assert_eq!(
        (log.first_lsn(), log.next_lsn(), log.last_lsn()),
        (0, 50, Some(49))
    );
    let got: Vec<_> = log
        .read_from(10)
        .expect("read")
        .collect::<Result<_, _>>()
        .expect("ok");
    assert_eq!(got, (10..50).map(|i| (i, payload(i))).collect::<Vec<_>>());
    assert_eq!(log.read_from(50).expect("read at the end").count(), 0);
    assert!(is_out_of_range(log.read_from(51)));
    log.sync_to(49).expect("sync_to");
    assert!(is_out_of_range(log.sync_to(50)));
    assert_eq!(log.append_durable(b"durable").expect("append_durable"), 50);
    log.force_sync().expect("force_sync");
    let stats = log.stats();
    assert_eq!(stats.appends, 51);
    assert_eq!(
        stats.appended_bytes,
        (0..50).map(|i| payload(i).len() as u64).sum::<u64>() + 7
    );
}

fn truncate(log: &dyn RecordLog) {
    for i in 0..40 {
        log.append(&payload(i)).expect("append");
    }
    log.truncate_after(39).expect("no-op at the last record");
    log.truncate_after(1000)
        .expect("no-op after the last record");
    assert_eq!(log.next_lsn(), 40);
    log.truncate_after(25).expect("truncate_after");
    assert_eq!((log.next_lsn(), log.last_lsn()), (26, Some(25)));
    assert_eq!(
        read_all(log),
        (0..26).map(|i| (i, payload(i))).collect::<Vec<_>>()
    );
    assert!(is_out_of_range(log.sync_to(30)));
    assert_eq!(log.append(b"replacement").expect("append"), 26);
    let got = read_all(log);
    assert_eq!(got.last(), Some(&(26, b"replacement".to_vec())));
    log.truncate_after(3).expect("truncate far back");
    assert_eq!(read_all(log).len(), 4);
}

fn compact(log: &dyn RecordLog) {
    for i in 0..100 {
        log.append(&payload(i)).expect("append");
    }
    log.compact_before(0).expect("no-op");
    assert_eq!(log.first_lsn(), 0);
    assert!(is_out_of_range(log.compact_before(101)));
    log.compact_before(50).expect("compact_before");
    let first = log.first_lsn();
    assert!(
        first > 0 && first <= 50,
        "whole segments before 50 go, first is {first}"
    );
    assert_eq!(
        read_all(log),
        (first..100).map(|i| (i, payload(i))).collect::<Vec<_>>()
    );
    assert!(is_out_of_range(log.read_from(first - 1)));
    assert!(is_out_of_range(log.truncate_after(first - 2)));
    log.compact_before(100)
        .expect("compact everything but the last segment");
    let first = log.first_lsn();
    assert!(first <= 99);
    log.truncate_after(first - 1).expect("drop every record");
    assert_eq!(
        (log.first_lsn(), log.next_lsn(), log.last_lsn()),
        (first, first, None)
    );
    assert_eq!(log.append(b"again").expect("append"), first);
    assert_eq!(read_all(log), vec![(first, b"again".to_vec())]);
}

fn size_limit(log: &dyn RecordLog) {
    assert!(log.append(&[0; 1000]).is_ok());
    let e = log.append(&[0; 1001]).expect_err("too large");
    assert!(
        matches!(
            e,
            LogError::RecordTooLarge {
                size: 1001,
                max: 1000
            }
        ),
        "{e}"
    );
    assert_eq!(log.next_lsn(), 1);
}

#[test]
fn append_read_and_sync_on_both() {
    on_both("sem-basic", append_read_and_sync);
}

#[test]
fn truncate_on_both() {
    on_both("sem-truncate", truncate);
}

#[test]
fn compact_on_both() {
    on_both("sem-compact", compact);
}

#[test]
fn size_limit_on_both() {
    on_both("sem-size", size_limit);
}

#[test]
fn both_keep_the_same_segments() {
    with_timeout(60, || {
        let mem = MemLog::with_options(options()).expect("MemLog");
        let dir = TempDir::new("sem-same");
        let seg = SegmentLog::open(dir.path(), options()).expect("SegmentLog");
        for i in 0..300 {
            mem.append(&payload(i)).expect("append");
            seg.append(&payload(i)).expect("append");
            if i % 37 == 36 {
                mem.compact_before(i - 20).expect("compact");
                seg.compact_before(i - 20).expect("compact");
                assert_eq!(
                    mem.first_lsn(),
                    seg.first_lsn(),
                    "after compact_before({})",
                    i - 20
                );
            }
        }
        assert_eq!(read_all(&mem), read_all(&seg));
    });
}
