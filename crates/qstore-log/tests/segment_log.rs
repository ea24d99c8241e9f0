//! Tests of the file log on real files: reopening, torn and corrupt tails, corruption in the
//! middle, group commit, truncation, compaction, foreign directories, policies, writer errors.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::{payload, read_all, segment_files, with_timeout, TempDir};
use qstore_log::{FsyncPolicy, LogError, LogOptions, Lsn, RecordLog, SegmentLog};

/// Bytes of the segment header and of a record header (see `qstore_log::format`).
const SEG_HEADER: u64 = 24;
const REC_HEADER: u64 = 12;

fn opts(fsync: FsyncPolicy, segment_bytes: u64) -> LogOptions {
    LogOptions {
        fsync,
        segment_bytes,
        ..LogOptions::default()
    }
}

/// Writes `payloads` to a new log in `dir` and closes it.
fn write_log(dir: &Path, o: &LogOptions, payloads: &[Vec<u8>]) {
    let log = SegmentLog::open(dir, o.clone()).expect("open new log");
    for p in payloads {
        log.append(p).expect("append");
    }
    log.close().expect("close");
}

/// Byte offsets of consecutive records `payloads` written from the start of a segment.
fn record_offsets(payloads: &[Vec<u8>]) -> Vec<u64> {
    let mut off = SEG_HEADER;
    payloads
        .iter()
        .map(|p| {
            let at = off;
            off += REC_HEADER + p.len() as u64;
            at
        })
        .collect()
}

/// Checks that `log` holds exactly `payloads`, numbered from `first`.
fn assert_holds(log: &dyn RecordLog, first: Lsn, payloads: &[Vec<u8>]) {
    let got = read_all(log);
    assert_eq!(log.first_lsn(), first);
    assert_eq!(got.len(), payloads.len(), "record count");
    for (i, ((lsn, p), want)) in got.iter().zip(payloads).enumerate() {
        assert_eq!(*lsn, first + i as u64, "LSNs are consecutive");
        assert_eq!(p, want, "payload of LSN {lsn}");
    }
}

/// The error of opening `dir`, which must fail.
fn open_err(dir: &Path, o: &LogOptions) -> LogError {
    match SegmentLog::open(dir, o.clone()) {
        Ok(_) => panic!("opening {} should fail", dir.display()),
        Err(e) => e,
    }
}

fn flip(path: &Path, offset: u64) {
    let mut bytes = fs::read(path).expect("read segment");
    bytes[offset as usize] ^= 0x5a;
    fs::write(path, bytes).expect("write segment");
}

#[test]
fn reopen_reads_back_everything_across_segments() {
    with_timeout(60, || {
        let dir = TempDir::new("reopen");
        let o = opts(FsyncPolicy::Always, 1024);
        let payloads: Vec<Vec<u8>> = (0..400).map(payload).collect();
        {
            let log = SegmentLog::open(dir.path(), o.clone()).expect("open");
            for (i, p) in payloads.iter().enumerate() {
                assert_eq!(log.append(p).expect("append"), i as u64);
            }
            log.sync_to(399).expect("sync_to");
            assert_holds(&log, 0, &payloads);
            assert_eq!(log.last_lsn(), Some(399));
        }
        let files = segment_files(dir.path());
        assert!(files.len() > 10, "small segments: {} files", files.len());
        let name = files[0].file_name().and_then(|n| n.to_str()).unwrap_or("");
        assert_eq!(name, "00000000000000000000.log");
        let log = SegmentLog::open(dir.path(), o).expect("reopen");
        let report = log.recovery_report().clone();
        assert_eq!(report.tail_cut, None);
        assert_eq!((report.records, report.next_lsn), (400, 400));
        assert_eq!(report.segments, files.len());
        assert_holds(&log, 0, &payloads);
        let got: Vec<Lsn> = log
            .read_from(123)
            .expect("read")
            .map(|r| r.expect("record").0)
            .collect();
        assert_eq!(got, (123..400).collect::<Vec<_>>());
        assert_eq!(log.append(b"more").expect("append"), 400);
    });
}

#[test]
fn torn_tail_of_every_length_is_cut() {
    with_timeout(120, || {
        let src = TempDir::new("torn-src");
        let o = opts(FsyncPolicy::Always, 64 << 20);
        let payloads: Vec<Vec<u8>> = (2..7).map(payload).collect();
        write_log(src.path(), &o, &payloads);
        let seg = segment_files(src.path())[0].clone();
        let bytes = fs::read(&seg).expect("read segment");
        let last_len = (REC_HEADER + payloads[4].len() as u64) as usize;
        let last_off = bytes.len() - last_len;
        assert_eq!(last_off as u64, record_offsets(&payloads)[4]);
        for kept in 0..last_len {
            let dir = TempDir::new("torn");
            let name = seg.file_name().expect("file name");
            fs::write(dir.path().join(name), &bytes[..last_off + kept]).expect("write torn copy");
            let log = SegmentLog::open(dir.path(), o.clone()).expect("open torn log");
            let cut = log.recovery_report().tail_cut.clone();
            if kept == 0 {
                assert_eq!(cut, None, "a file ending at a record boundary is not torn");
            } else {
                let cut = cut.expect("a torn tail is reported");
                assert_eq!(
                    (cut.offset, cut.bytes_cut, cut.lsn),
                    (last_off as u64, kept as u64, 4)
                );
            }
            assert_holds(&log, 0, &payloads[..4]);
            assert_eq!(log.append_durable(b"after").expect("append"), 4);
            drop(log);
            let log = SegmentLog::open(dir.path(), o.clone()).expect("reopen");
            assert_eq!(log.recovery_report().tail_cut, None);
            let mut want = payloads[..4].to_vec();
            want.push(b"after".to_vec());
            assert_holds(&log, 0, &want);
        }
    });
}

#[test]
fn corrupt_last_record_is_cut_at_the_previous_one() {
    with_timeout(60, || {
        let o = opts(FsyncPolicy::Always, 64 << 20);
        let payloads: Vec<Vec<u8>> = (2..7).map(payload).collect();
        let last_off = record_offsets(&payloads)[4];
        // A byte of the payload, then a byte of the payload checksum in the header.
        for at in [last_off + REC_HEADER + 3, last_off + 5] {
            let dir = TempDir::new("corrupt-tail");
            write_log(dir.path(), &o, &payloads);
            let seg = segment_files(dir.path())[0].clone();
            flip(&seg, at);
            let log = SegmentLog::open(dir.path(), o.clone()).expect("open");
            let cut = log
                .recovery_report()
                .tail_cut
                .clone()
                .expect("cut reported");
            assert_eq!(
                (cut.path.clone(), cut.offset, cut.lsn),
                (seg.clone(), last_off, 4)
            );
            assert!(cut.reason.contains("checksum"), "{}", cut.reason);
            assert_holds(&log, 0, &payloads[..4]);
            assert_eq!(
                fs::metadata(&seg).expect("stat").len(),
                last_off,
                "file truncated"
            );
            assert_eq!(log.append(b"x").expect("append"), 4);
        }
    });
}

#[test]
fn zero_filled_tail_is_cut() {
    with_timeout(60, || {
        let dir = TempDir::new("zero-tail");
        let o = opts(FsyncPolicy::Always, 64 << 20);
        let payloads: Vec<Vec<u8>> = (0..6).map(payload).collect();
        write_log(dir.path(), &o, &payloads);
        let seg = segment_files(dir.path())[0].clone();
        let len = fs::metadata(&seg).expect("stat").len();
        let mut bytes = fs::read(&seg).expect("read");
        bytes.extend_from_slice(&[0u8; 4096]);
        fs::write(&seg, bytes).expect("write");
        let log = SegmentLog::open(dir.path(), o).expect("open");
        let cut = log.recovery_report().tail_cut.clone().expect("cut");
        assert_eq!((cut.offset, cut.bytes_cut, cut.lsn), (len, 4096, 6));
        assert_holds(&log, 0, &payloads);
    });
}

/// Opens a log whose record `victim` (at byte `at` of `path`) was damaged: must fail naming the
/// file and the record's offset.
fn assert_middle_corruption(dir: &Path, o: &LogOptions, path: &Path, record_off: u64) {
    match open_err(dir, o) {
        LogError::Corrupt {
            path: p,
            offset,
            reason,
        } => {
            assert_eq!((p.as_path(), offset), (path, record_off), "{reason}");
        }
        other => panic!("expected a Corrupt error, got: {other}"),
    }
    let msg = open_err(dir, o).to_string();
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("?");
    assert!(msg.contains(name), "the message names the file: {msg}");
    assert!(
        msg.contains(&format!("offset {record_off}")),
        "and the offset: {msg}"
    );
}

#[test]
fn corruption_in_the_middle_is_an_error_naming_file_and_offset() {
    with_timeout(60, || {
        let o = opts(FsyncPolicy::Always, 64 << 20);
        let payloads: Vec<Vec<u8>> = (2..9).map(payload).collect();
        let offs = record_offsets(&payloads);
        // Payload byte, length byte and header checksum byte of record 1, of 7.
        for at in [offs[1] + REC_HEADER, offs[1], offs[1] + 9] {
            let dir = TempDir::new("middle");
            write_log(dir.path(), &o, &payloads);
            let seg = segment_files(dir.path())[0].clone();
            flip(&seg, at);
            assert_middle_corruption(dir.path(), &o, &seg, offs[1]);
            assert!(
                fs::metadata(&seg).expect("stat").len() > offs[6],
                "nothing was cut"
            );
        }
    });
}

#[test]
fn damage_in_an_earlier_segment_is_an_error_even_at_its_end() {
    with_timeout(60, || {
        let o = opts(FsyncPolicy::Always, 600);
        let payloads: Vec<Vec<u8>> = (0..60).map(payload).collect();
        let dir = TempDir::new("early-seg");
        write_log(dir.path(), &o, &payloads);
        let files = segment_files(dir.path());
        assert!(files.len() >= 3);
        // The last record of the first segment: the damage reaches the end of that file.
        let first_len = fs::metadata(&files[0]).expect("stat").len();
        let offs = record_offsets(&payloads);
        let last_in_first = offs
            .iter()
            .copied()
            .filter(|&o| o < first_len)
            .max()
            .unwrap_or(0);
        flip(&files[0], first_len - 1);
        assert_middle_corruption(dir.path(), &o, &files[0], last_in_first);
        // A cut-short earlier segment is an error too.
        let dir = TempDir::new("early-seg-short");
        write_log(dir.path(), &o, &payloads);
        let files = segment_files(dir.path());
        let f = fs::OpenOptions::new()
            .write(true)
            .open(&files[1])
            .expect("open");
        f.set_len(fs::metadata(&files[1]).expect("stat").len() - 2)
            .expect("truncate");
        assert!(
            matches!(open_err(dir.path(), &o), LogError::Corrupt { ref path, .. } if *path == files[1])
        );
    });
}

#[test]
fn group_commit_shares_syncs_between_waiting_appends() {
    const THREADS: u64 = 8;
    const PER_THREAD: u64 = 500;
    with_timeout(300, || {
        let dir = TempDir::new("group");
        let o = opts(FsyncPolicy::Always, 64 << 10);
        let log = Arc::new(SegmentLog::open(dir.path(), o.clone()).expect("open"));
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let log = log.clone();
                std::thread::spawn(move || {
                    for i in 0..PER_THREAD {
                        let p = format!("thread {t} record {i:04}");
                        let lsn = log.append_durable(p.as_bytes()).expect("append_durable");
                        assert!(lsn < THREADS * PER_THREAD);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().expect("appender thread");
        }
        let stats = log.stats();
        let appends = THREADS * PER_THREAD;
        println!(
            "group commit: {} appends, {} syncs, {:.2} appends per sync",
            stats.appends,
            stats.syncs,
            stats.appends as f64 / stats.syncs.max(1) as f64
        );
        assert_eq!(stats.appends, appends);
        assert!(stats.syncs > 0 && stats.syncs < stats.appends, "{stats:?}");
        drop(log);
        let log = SegmentLog::open(dir.path(), o).expect("reopen");
        let got = read_all(&log);
        assert_eq!(got.len() as u64, appends);
        let mut next = vec![0u64; THREADS as usize];
        for (lsn, p) in &got {
            let s = String::from_utf8(p.clone()).expect("utf8");
            let mut words = s.split(' ');
            let t: usize = words.nth(1).and_then(|w| w.parse().ok()).expect("thread");
            let i: u64 = words.nth(1).and_then(|w| w.parse().ok()).expect("index");
            assert_eq!(i, next[t], "thread {t}'s records in order, at LSN {lsn}");
            next[t] += 1;
        }
        assert!(next.iter().all(|&n| n == PER_THREAD));
    });
}

#[test]
fn truncate_and_compact_change_the_files_and_survive_reopen() {
    with_timeout(60, || {
        let dir = TempDir::new("trunc-compact");
        let o = opts(FsyncPolicy::Always, 500);
        let mut want: Vec<Vec<u8>> = (0..100).map(payload).collect();
        let log = SegmentLog::open(dir.path(), o.clone()).expect("open");
        for p in &want {
            log.append(p).expect("append");
        }
        log.sync_to(99).expect("sync_to");
        let before = segment_files(dir.path()).len();
        log.truncate_after(60).expect("truncate_after");
        want.truncate(61);
        assert_eq!((log.next_lsn(), log.last_lsn()), (61, Some(60)));
        let after = segment_files(dir.path());
        assert!(after.len() < before, "segments after LSN 60 deleted");
        let last_name = after
            .last()
            .and_then(|p| p.file_name())
            .and_then(|n| n.to_str());
        let last_first: Lsn = last_name.and_then(|n| n[..20].parse().ok()).expect("name");
        assert!(last_first <= 60);
        for i in 0..10 {
            let p = format!("new {i}").into_bytes();
            assert_eq!(log.append(&p).expect("append"), 61 + i);
            want.push(p);
        }
        assert_holds(&log, 0, &want);
        log.compact_before(40).expect("compact_before");
        let first = log.first_lsn();
        assert!(first > 0 && first <= 40, "first kept LSN {first}");
        let files = segment_files(dir.path());
        let first_name = files[0].file_name().and_then(|n| n.to_str()).expect("name");
        assert_eq!(first_name, format!("{first:020}.log"));
        assert_holds(&log, first, &want[first as usize..]);
        assert!(matches!(
            log.read_from(first - 1),
            Err(LogError::OutOfRange { .. })
        ));
        assert!(matches!(
            log.truncate_after(first - 2),
            Err(LogError::OutOfRange { .. })
        ));
        drop(log);
        let log = SegmentLog::open(dir.path(), o).expect("reopen");
        assert_eq!(log.recovery_report().tail_cut, None);
        assert_eq!((log.first_lsn(), log.next_lsn()), (first, 71));
        assert_holds(&log, first, &want[first as usize..]);
    });
}

#[test]
fn directory_with_something_else_is_refused() {
    with_timeout(60, || {
        let o = LogOptions::default();
        let dir = TempDir::new("foreign-file");
        fs::write(dir.join("notes.txt"), "not a log").expect("write");
        let e = open_err(dir.path(), &o);
        assert!(
            matches!(e, LogError::NotALog { ref path, .. } if path.ends_with("notes.txt")),
            "{e}"
        );
        assert!(e.to_string().contains("notes.txt"), "{e}");

        let dir = TempDir::new("wrong-magic");
        fs::write(dir.join("00000000000000000000.log"), vec![b'x'; 200]).expect("write");
        let e = open_err(dir.path(), &o);
        assert!(matches!(e, LogError::NotALog { .. }), "{e}");
        assert!(e.to_string().contains("magic"), "{e}");

        let dir = TempDir::new("short-garbage");
        fs::write(dir.join("00000000000000000000.log"), b"hello").expect("write");
        assert!(matches!(open_err(dir.path(), &o), LogError::NotALog { .. }));

        let dir = TempDir::new("subdir");
        fs::create_dir(dir.join("00000000000000000000.log")).expect("mkdir");
        assert!(matches!(open_err(dir.path(), &o), LogError::NotALog { .. }));
    });
}

#[test]
fn other_format_version_and_missing_segment_are_refused() {
    with_timeout(60, || {
        let o = opts(FsyncPolicy::Always, 300);
        let payloads: Vec<Vec<u8>> = (0..40).map(payload).collect();
        let dir = TempDir::new("version");
        write_log(dir.path(), &o, &payloads);
        let files = segment_files(dir.path());
        flip(&files[0], 8);
        let e = open_err(dir.path(), &o);
        assert!(
            matches!(e, LogError::UnsupportedVersion { supported: 1, .. }),
            "{e}"
        );

        let dir = TempDir::new("gap");
        write_log(dir.path(), &o, &payloads);
        let files = segment_files(dir.path());
        assert!(files.len() >= 3);
        fs::remove_file(&files[1]).expect("remove");
        let e = open_err(dir.path(), &o);
        assert!(
            matches!(e, LogError::SegmentGap { ref path, .. } if *path == files[2]),
            "{e}"
        );
    });
}

#[test]
fn torn_segment_header_of_the_last_segment_is_repaired() {
    with_timeout(60, || {
        let o = opts(FsyncPolicy::Always, 300);
        let payloads: Vec<Vec<u8>> = (0..40).map(payload).collect();
        let dir = TempDir::new("torn-header");
        write_log(dir.path(), &o, &payloads);
        let files = segment_files(dir.path());
        let last = files.last().expect("segments").clone();
        let first: Lsn = last
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n[..20].parse().ok())
            .expect("lsn");
        let f = fs::OpenOptions::new()
            .write(true)
            .open(&last)
            .expect("open");
        f.set_len(10).expect("truncate");
        drop(f);
        let log = SegmentLog::open(dir.path(), o).expect("open");
        let cut = log.recovery_report().tail_cut.clone().expect("cut");
        assert_eq!(
            (cut.path.clone(), cut.lsn, cut.bytes_cut),
            (last, first, 10)
        );
        assert_eq!(log.next_lsn(), first);
        assert_holds(&log, 0, &payloads[..first as usize]);
        assert_eq!(log.append(b"x").expect("append"), first);
    });
}

#[test]
fn record_size_limit_is_enforced() {
    with_timeout(60, || {
        let dir = TempDir::new("too-large");
        let o = LogOptions {
            max_record_size: 100,
            ..LogOptions::default()
        };
        let log = SegmentLog::open(dir.path(), o.clone()).expect("open");
        assert_eq!(log.append(&[7; 100]).expect("at the limit"), 0);
        let e = log.append(&[7; 101]).expect_err("above the limit");
        assert!(
            matches!(
                e,
                LogError::RecordTooLarge {
                    size: 101,
                    max: 100
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("max_record_size"), "{e}");
        log.close().expect("close");
        let smaller = LogOptions {
            max_record_size: 50,
            ..o
        };
        let e = open_err(dir.path(), &smaller);
        assert!(
            matches!(
                e,
                LogError::RecordTooLargeOnDisk {
                    size: 100,
                    max: 50,
                    ..
                }
            ),
            "{e}"
        );
    });
}

#[test]
fn batch_policy_syncs_in_the_background() {
    with_timeout(60, || {
        let dir = TempDir::new("batch");
        let o = LogOptions {
            fsync: FsyncPolicy::Batch,
            batch_interval: Duration::from_millis(20),
            ..LogOptions::default()
        };
        let log = SegmentLog::open(dir.path(), o.clone()).expect("open");
        for i in 0..200 {
            log.append_durable(&payload(i)).expect("append_durable");
        }
        std::thread::sleep(Duration::from_millis(200));
        let stats = log.stats();
        assert!(stats.syncs >= 1 && stats.syncs < 200, "{stats:?}");
        log.close().expect("close");
        let log = SegmentLog::open(dir.path(), o).expect("reopen");
        assert_eq!(log.next_lsn(), 200);
    });
}

#[test]
fn never_policy_syncs_only_when_forced() {
    with_timeout(60, || {
        let dir = TempDir::new("never");
        let o = opts(FsyncPolicy::Never, 400);
        let log = SegmentLog::open(dir.path(), o).expect("open");
        for i in 0..100 {
            log.append_durable(&payload(i)).expect("append_durable");
        }
        log.truncate_after(80).expect("truncate");
        log.compact_before(50).expect("compact");
        assert_eq!(log.stats().syncs, 0);
        log.force_sync().expect("force_sync");
        assert!(log.stats().syncs >= 1);
        assert_eq!(read_all(&log).len() as u64, 81 - log.first_lsn());
    });
}

#[test]
fn writer_error_reaches_waiters_and_refuses_later_appends() {
    with_timeout(60, || {
        let dir = TempDir::new("writer-error");
        let o = opts(FsyncPolicy::Always, 100);
        let log = SegmentLog::open(dir.path(), o).expect("open");
        // Two 50-byte records fill the first segment; the third starts segment 2, whose name we
        // take first with a directory, so that creating the segment fails.
        log.append_durable(&[1; 50]).expect("append 0");
        log.append_durable(&[1; 50]).expect("append 1");
        let blocker: PathBuf = dir.join("00000000000000000002.log");
        fs::create_dir(&blocker).expect("mkdir");
        let lsn = log.append(&[2; 50]).expect("enqueue");
        let e = log.sync_to(lsn).expect_err("the write fails");
        assert!(
            matches!(e, LogError::Io { ref path, .. } if *path == blocker),
            "{e}"
        );
        let again = log.append(b"more").expect_err("refused after the error");
        assert_eq!(again.to_string(), e.to_string());
        assert!(log.force_sync().is_err());
        assert!(log.close().is_err());
    });
}

#[test]
fn invalid_options_are_refused() {
    let dir = TempDir::new("bad-options");
    let o = LogOptions {
        max_record_size: 0,
        ..LogOptions::default()
    };
    assert!(matches!(
        open_err(dir.path(), &o),
        LogError::InvalidOptions(_)
    ));
    let o = LogOptions {
        fsync: FsyncPolicy::Batch,
        batch_interval: Duration::ZERO,
        ..LogOptions::default()
    };
    assert!(matches!(
        open_err(dir.path(), &o),
        LogError::InvalidOptions(_)
    ));
}
