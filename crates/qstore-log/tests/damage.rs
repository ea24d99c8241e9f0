//! Damaged files never panic the log: random byte flips, cuts and garbage tails either open (and
//! then hold a prefix of what was written) or fail with an error. Also: concurrent appends,
//! truncations and reads never hang.

mod common;

use std::fs;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::{payload, read_all, segment_files, with_timeout, TempDir};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use qstore_log::{FsyncPolicy, LogError, LogOptions, RecordLog, SegmentLog};

fn options() -> LogOptions {
    LogOptions {
        fsync: FsyncPolicy::Never,
        segment_bytes: 400,
        max_record_size: 1000,
        ..LogOptions::default()
    }
}

/// How a segment file is damaged.
#[derive(Debug, Clone)]
struct Damage {
    /// Which segment (modulo their number).
    segment: usize,
    /// Bytes to XOR in, at positions taken modulo the file length.
    flips: Vec<(usize, u8)>,
    /// Keep only this fraction (in 256ths) of the file, if set.
    cut: Option<u8>,
    /// Garbage appended to the file.
    tail: Vec<u8>,
}

fn damage() -> impl Strategy<Value = Damage> {
    (
        any::<usize>(),
        proptest::collection::vec((any::<usize>(), 1u8..), 0..4),
        proptest::option::of(any::<u8>()),
        proptest::collection::vec(any::<u8>(), 0..40),
    )
        .prop_map(|(segment, flips, cut, tail)| Damage {
            segment,
            flips,
            cut,
            tail,
        })
}

fn apply(path: &std::path::Path, d: &Damage) {
    let mut bytes = fs::read(path).expect("read segment");
    for &(at, x) in &d.flips {
        if !bytes.is_empty() {
            let n = bytes.len();
            bytes[at % n] ^= x;
        }
    }
    if let Some(frac) = d.cut {
        bytes.truncate(bytes.len() * usize::from(frac) / 256);
    }
    bytes.extend_from_slice(&d.tail);
    fs::write(path, bytes).expect("write segment");
}

fn check(d: &Damage) -> Result<(), TestCaseError> {
    let dir = TempDir::new("damage");
    let want: Vec<Vec<u8>> = (0..30).map(payload).collect();
    {
        let log = SegmentLog::open(dir.path(), options()).expect("open");
        for p in &want {
            log.append(p).expect("append");
        }
    }
    let files = segment_files(dir.path());
    apply(&files[d.segment % files.len()], d);
    match SegmentLog::open(dir.path(), options()) {
        Err(e) => {
            // Every error names what to look at.
            prop_assert!(!e.to_string().is_empty());
        }
        Ok(log) => {
            let got = log
                .read_from(0)
                .and_then(|r| r.collect::<Result<Vec<_>, _>>());
            let got = got.map_err(|e| TestCaseError::fail(format!("read after open: {e}")))?;
            prop_assert!(got.len() <= want.len());
            for (lsn, p) in &got {
                prop_assert_eq!(p, &want[*lsn as usize], "LSN {}", lsn);
            }
            let next = log.append(b"after").expect("append after recovery");
            prop_assert_eq!(next, got.len() as u64);
        }
    }
    Ok(())
}

#[test]
fn damaged_segments_never_panic_and_keep_a_prefix() {
    with_timeout(240, || {
        let config = Config {
            cases: 200,
            failure_persistence: None,
            ..Config::default()
        };
        let mut runner = TestRunner::new(config);
        if let Err(e) = runner.run(&damage(), |d| check(&d)) {
            panic!("{e}");
        }
    });
}

#[test]
fn concurrent_appends_truncations_and_reads_do_not_hang() {
    with_timeout(120, || {
        let dir = TempDir::new("concurrent");
        let o = LogOptions {
            fsync: FsyncPolicy::Always,
            segment_bytes: 2000,
            ..LogOptions::default()
        };
        let log = Arc::new(SegmentLog::open(dir.path(), o.clone()).expect("open"));
        let stop = Arc::new(AtomicBool::new(false));
        let appenders: Vec<_> = (0..3)
            .map(|t| {
                let (log, stop) = (log.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let lsn = log.append(&payload(n + t)).expect("append");
                        match log.sync_to(lsn) {
                            Ok(()) | Err(LogError::OutOfRange { .. }) => {}
                            Err(e) => panic!("sync_to: {e}"),
                        }
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        while log.next_lsn() < 50 {
            std::thread::yield_now();
        }
        for round in 0..200u64 {
            std::thread::sleep(std::time::Duration::from_micros(300));
            let next = log.next_lsn();
            if round % 3 == 0 && next > 10 {
                log.truncate_after(next - 5).expect("truncate_after");
            }
            if round % 7 == 0 {
                log.compact_before(log.next_lsn() / 2)
                    .expect("compact_before");
            }
            let first = log.first_lsn();
            let got = read_all(&*log);
            for (i, (lsn, _)) in got.iter().enumerate() {
                assert_eq!(*lsn, first + i as u64);
            }
        }
        stop.store(true, Ordering::Relaxed);
        let appended: u64 = appenders
            .into_iter()
            .map(|h| h.join().expect("appender"))
            .sum();
        assert!(appended > 0);
        let (first, next) = (log.first_lsn(), log.next_lsn());
        let before = read_all(&*log);
        drop(log);
        let log = SegmentLog::open(dir.path(), o).expect("reopen");
        assert_eq!((log.first_lsn(), log.next_lsn()), (first, next));
        assert_eq!(read_all(&log), before);
    });
}
