//! Property test: random sequences of appends, truncations, compactions and reopens leave a
//! `SegmentLog` and a `MemLog` holding the same records.

mod common;

use common::{read_all, with_timeout, TempDir};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use qstore_log::{FsyncPolicy, LogOptions, MemLog, RecordLog, SegmentLog};

#[derive(Debug, Clone)]
enum Step {
    /// Append a payload of this length.
    Append(usize),
    /// `truncate_after` at this fraction (in 256ths) of the held range, from one before it.
    Truncate(u8),
    /// `compact_before` at this fraction of the held range.
    Compact(u8),
    /// Close and reopen the file log.
    Reopen,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0usize..120).prop_map(Step::Append),
        1 => any::<u8>().prop_map(Step::Truncate),
        1 => any::<u8>().prop_map(Step::Compact),
        1 => Just(Step::Reopen),
    ]
}

fn options() -> LogOptions {
    LogOptions {
        fsync: FsyncPolicy::Never,
        segment_bytes: 256,
        max_record_size: 200,
        ..LogOptions::default()
    }
}

/// The LSN `frac`/256 of the way from `lo` to `hi`.
fn pick(lo: u64, hi: u64, frac: u8) -> u64 {
    lo + (hi - lo) * u64::from(frac) / 256
}

fn run(steps: &[Step]) -> Result<(), TestCaseError> {
    let dir = TempDir::new("agree");
    let mem = MemLog::with_options(options()).expect("MemLog");
    let mut seg = SegmentLog::open(dir.path(), options()).expect("open");
    let mut counter = 0u8;
    for s in steps {
        match s {
            Step::Append(len) => {
                counter = counter.wrapping_add(1);
                let p = vec![counter; *len];
                prop_assert_eq!(mem.append(&p).expect("mem"), seg.append(&p).expect("seg"));
            }
            Step::Truncate(frac) => {
                let after = pick(mem.first_lsn(), mem.next_lsn() + 1, *frac).saturating_sub(1);
                let (a, b) = (mem.truncate_after(after), seg.truncate_after(after));
                prop_assert_eq!(a.is_ok(), b.is_ok(), "truncate_after({})", after);
            }
            Step::Compact(frac) => {
                let before = pick(mem.first_lsn(), mem.next_lsn() + 1, *frac);
                mem.compact_before(before).expect("mem compact");
                seg.compact_before(before).expect("seg compact");
            }
            Step::Reopen => {
                drop(seg);
                seg = SegmentLog::open(dir.path(), options()).expect("reopen");
                prop_assert_eq!(seg.recovery_report().tail_cut.clone(), None);
            }
        }
        prop_assert_eq!(mem.first_lsn(), seg.first_lsn(), "first_lsn after {:?}", s);
        prop_assert_eq!(mem.next_lsn(), seg.next_lsn(), "next_lsn after {:?}", s);
        prop_assert_eq!(mem.last_lsn(), seg.last_lsn());
    }
    prop_assert_eq!(read_all(&mem), read_all(&seg));
    drop(seg);
    let seg = SegmentLog::open(dir.path(), options()).expect("final reopen");
    prop_assert_eq!(read_all(&mem), read_all(&seg));
    Ok(())
}

#[test]
fn segment_log_agrees_with_mem_log() {
    with_timeout(240, || {
        let config = Config {
            cases: 64,
            failure_persistence: None,
            ..Config::default()
        };
        let mut runner = TestRunner::new(config);
        let steps = proptest::collection::vec(step(), 1..60);
        if let Err(e) = runner.run(&steps, |steps| run(&steps)) {
            panic!("{e}");
        }
    });
}
