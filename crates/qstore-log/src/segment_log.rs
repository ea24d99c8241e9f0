//! [`SegmentLog`]: the log on disk, and the state its callers share with the writer thread.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex, MutexGuard};

use crate::format::{crc, RecordHeader, RECORD_HEADER_LEN};
use crate::reader::{ReadSegment, SegmentReader};
use crate::recovery::{recover, RecoveryReport, SegmentInfo};
use crate::writer::Writer;
use crate::{FsyncPolicy, LogError, LogOptions, LogStats, Lsn, RecordLog, Records};

/// Work queued for the writer thread, done in queue order.
pub(crate) enum Op {
    /// Write one encoded record (header and payload).
    Append { lsn: Lsn, record: Vec<u8> },
    /// Drop the records after `after`.
    TruncateAfter { after: Lsn, id: u64 },
    /// Delete the segments holding only records before `before`.
    CompactBefore { before: Lsn, id: u64 },
}

/// What callers and the writer share, under [`Shared::state`].
pub(crate) struct State {
    /// Work not yet taken by the writer.
    pub queue: Vec<Op>,
    /// Bytes of the records in `queue` (bounded by `max_pending_bytes`).
    pub pending_bytes: u64,
    /// The number the next append gets.
    pub next_lsn: Lsn,
    /// Every record below this is written to the files (in the operating system).
    pub written: Lsn,
    /// Every record below this is on disk (`fdatasync` done).
    pub synced: Lsn,
    /// `after + 1` of a truncation queued but not yet done. While it is set, the writer must not
    /// report records at or above it as written: they are the records the truncation drops, and
    /// the numbers now belong to newer appends. At most one is pending (truncations are
    /// serialised by [`Shared::control`]).
    pub pending_truncate: Option<Lsn>,
    /// Number of the last truncation or compaction queued.
    pub control_issued: u64,
    /// Number of the last truncation or compaction done.
    pub control_done: u64,
    /// Number of the last [`RecordLog::force_sync`] request.
    pub force_requested: u64,
    /// Number of the last [`RecordLog::force_sync`] request done.
    pub force_done: u64,
    /// The segment files, oldest first; the last one is the one being appended to. Changed only
    /// by the writer.
    pub segments: Vec<SegmentInfo>,
    /// The first error of the writer; once set, the log refuses all further work with it.
    pub error: Option<LogError>,
    /// Set when the log is closed: the writer finishes the queue and stops.
    pub shutdown: bool,
}

/// Counters updated without the lock.
#[derive(Default)]
pub(crate) struct Counters {
    pub appends: AtomicU64,
    pub appended_bytes: AtomicU64,
    pub written_bytes: AtomicU64,
    pub syncs: AtomicU64,
}

/// The part of a [`SegmentLog`] the writer thread holds too.
pub(crate) struct Shared {
    pub dir: PathBuf,
    pub opts: LogOptions,
    pub state: Mutex<State>,
    /// The writer waits here for work.
    pub work: Condvar,
    /// Callers wait here for the writer's progress (written, synced, control and force done).
    pub progress: Condvar,
    /// Appenders wait here for room in the queue.
    pub space: Condvar,
    /// Serialises truncations and compactions (each waits for its own completion).
    pub control: Mutex<()>,
    pub counters: Counters,
}

impl Shared {
    /// Adds `n` to a counter.
    pub fn count(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// A log stored as segment files in a directory, written by one writer thread with group
/// commit. See the crate documentation and [`format`](mod@crate::format) for the format.
///
/// Opening reads and checks every record of every segment, so it takes time in proportion to
/// the size of the log (compact it); the log then keeps the byte offset of each record held
/// (8 bytes of memory per record) so that reads and truncations seek directly.
///
/// One process at a time may open a directory (nothing enforces it). Dropping the log finishes
/// the queued work (and syncs it unless the policy is [`FsyncPolicy::Never`]); use
/// [`SegmentLog::close`] to see an error from that.
pub struct SegmentLog {
    shared: Arc<Shared>,
    writer: Option<JoinHandle<()>>,
    report: RecoveryReport,
}

impl SegmentLog {
    /// Opens the log in `dir`, creating the directory and an empty log if needed. Every segment
    /// is checked; a torn or corrupt tail of the last segment is cut off (see
    /// [`SegmentLog::recovery_report`]); damage anywhere else, a file that is not a segment, or
    /// a missing segment is an error naming the file (and the byte offset).
    pub fn open(dir: impl AsRef<Path>, opts: LogOptions) -> Result<SegmentLog, LogError> {
        opts.validate()?;
        let dir = dir.as_ref().to_path_buf();
        let recovered = recover(&dir, &opts)?;
        let next = recovered.report.next_lsn;
        let shared = Arc::new(Shared {
            dir: dir.clone(),
            opts,
            state: Mutex::new(State {
                queue: Vec::new(),
                pending_bytes: 0,
                next_lsn: next,
                written: next,
                synced: next,
                pending_truncate: None,
                control_issued: 0,
                control_done: 0,
                force_requested: 0,
                force_done: 0,
                segments: recovered.segments,
                error: None,
                shutdown: false,
            }),
            work: Condvar::new(),
            progress: Condvar::new(),
            space: Condvar::new(),
            control: Mutex::new(()),
            counters: Counters::default(),
        });
        let writer = Writer::start(shared.clone())?;
        Ok(SegmentLog {
            shared,
            writer: Some(writer),
            report: recovered.report,
        })
    }

    /// A reader of the log's counters that can be kept apart from the log.
    pub fn stats_reader(&self) -> StatsReader {
        StatsReader(self.shared.clone())
    }

    /// What opening the log found and repaired.
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.report
    }

    /// The log's directory.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// The options the log was opened with.
    pub fn options(&self) -> &LogOptions {
        &self.shared.opts
    }

    /// Finishes the queued work (synced unless the policy is [`FsyncPolicy::Never`]), stops the
    /// writer thread, and reports the writer's error if it had one.
    pub fn close(mut self) -> Result<(), LogError> {
        self.stop_writer();
        match self.shared.state.lock().error.clone() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Tells the writer to finish and waits for it.
    fn stop_writer(&mut self) {
        if let Some(handle) = self.writer.take() {
            self.shared.state.lock().shutdown = true;
            self.shared.work.notify_one();
            // A panic of the writer has already been turned into `WriterStopped` by its guard.
            let _ = handle.join();
        }
    }

    /// Waits on `progress` until `done` holds; the writer's error ends the wait unless `done`
    /// already holds. `done` may itself fail the wait.
    fn wait_until<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        mut done: impl FnMut(&State) -> Result<bool, LogError>,
    ) -> Result<MutexGuard<'a, State>, LogError> {
        loop {
            if done(&st)? {
                return Ok(st);
            }
            if let Some(e) = &st.error {
                return Err(e.clone());
            }
            self.shared.progress.wait(&mut st);
        }
    }

    /// Fails with the writer's error, if there was one.
    fn check_error(st: &State) -> Result<(), LogError> {
        match &st.error {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// An [`LogError::OutOfRange`] for `op(lsn)` against the current state.
    fn out_of_range(op: &'static str, lsn: Lsn, st: &State) -> LogError {
        LogError::OutOfRange {
            op,
            lsn,
            first: first_of(st),
            next: st.next_lsn,
        }
    }

    /// The record `payload` encoded for the file, with its header still blank (the header
    /// needs the LSN, known only under the lock).
    fn encode_record(&self, payload: &[u8]) -> Result<(Vec<u8>, u32), LogError> {
        let max = self.shared.opts.max_record_size;
        let len = u32::try_from(payload.len())
            .ok()
            .filter(|&n| n <= max)
            .ok_or(LogError::RecordTooLarge {
                size: payload.len() as u64,
                max: u64::from(max),
            })?;
        let mut record = Vec::with_capacity(RECORD_HEADER_LEN as usize + payload.len());
        record.extend_from_slice(&[0; RECORD_HEADER_LEN as usize]);
        record.extend_from_slice(payload);
        Ok((record, len))
    }

    /// Waits for room in the writer's queue for `bytes` more.
    fn wait_for_space<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        bytes: u64,
    ) -> Result<MutexGuard<'a, State>, LogError> {
        // An empty queue always takes one record, however large, so nothing waits forever.
        while st.pending_bytes > 0 && st.pending_bytes + bytes > self.shared.opts.max_pending_bytes
        {
            Self::check_error(&st)?;
            self.shared.space.wait(&mut st);
        }
        Self::check_error(&st)?;
        Ok(st)
    }

    /// Queues a truncation or compaction and waits until the writer has done it.
    fn run_control(
        &self,
        st: MutexGuard<'_, State>,
        make: impl FnOnce(u64) -> Op,
    ) -> Result<(), LogError> {
        let mut st = st;
        st.control_issued += 1;
        let id = st.control_issued;
        st.queue.push(make(id));
        self.shared.work.notify_one();
        self.wait_until(st, |s| Ok(s.control_done >= id)).map(drop)
    }
}

/// The first LSN held, from the state.
fn first_of(st: &State) -> Lsn {
    st.segments.first().map_or(st.next_lsn, |s| s.first)
}

impl Drop for SegmentLog {
    fn drop(&mut self) {
        self.stop_writer();
    }
}

impl RecordLog for SegmentLog {
    fn append(&self, payload: &[u8]) -> Result<Lsn, LogError> {
        let (mut record, len) = self.encode_record(payload)?;
        let payload_crc = crc(payload);
        let st = self.shared.state.lock();
        let mut st = self.wait_for_space(st, record.len() as u64)?;
        let lsn = st.next_lsn;
        st.next_lsn += 1;
        let header = RecordHeader::new(lsn, len, payload_crc).encode();
        record[..RECORD_HEADER_LEN as usize].copy_from_slice(&header);
        st.pending_bytes += record.len() as u64;
        st.queue.push(Op::Append { lsn, record });
        drop(st);
        self.shared.work.notify_one();
        Shared::count(&self.shared.counters.appends, 1);
        Shared::count(&self.shared.counters.appended_bytes, u64::from(len));
        Ok(lsn)
    }

    fn sync_to(&self, lsn: Lsn) -> Result<(), LogError> {
        let always = self.shared.opts.fsync == FsyncPolicy::Always;
        let st = self.shared.state.lock();
        self.wait_until(st, |s| {
            let mark = if always { s.synced } else { s.written };
            if mark > lsn {
                Ok(true)
            } else if lsn >= s.next_lsn {
                // Never appended, or dropped by a truncation while waiting.
                Err(Self::out_of_range("sync_to", lsn, s))
            } else {
                Ok(false)
            }
        })
        .map(drop)
    }

    fn force_sync(&self) -> Result<(), LogError> {
        let mut st = self.shared.state.lock();
        Self::check_error(&st)?;
        st.force_requested += 1;
        let id = st.force_requested;
        self.shared.work.notify_one();
        self.wait_until(st, |s| Ok(s.force_done >= id)).map(drop)
    }

    fn read_from(&self, lsn: Lsn) -> Result<Records<'_>, LogError> {
        let st = self.shared.state.lock();
        let target = st.next_lsn;
        // Read-your-writes: wait until what was appended before the call is in the files. (If a
        // truncation lowers `next_lsn` meanwhile, what is appended now is enough.)
        let st = self.wait_until(st, |s| Ok(s.written >= target.min(s.next_lsn)))?;
        if lsn < first_of(&st) || lsn > st.next_lsn {
            return Err(Self::out_of_range("read_from", lsn, &st));
        }
        let plan = read_plan(&st.segments, lsn, st.written);
        let max = self.shared.opts.max_record_size;
        Ok(Box::new(SegmentReader::new(plan, lsn, max)))
    }

    fn truncate_after(&self, lsn: Lsn) -> Result<(), LogError> {
        let _control = self.shared.control.lock();
        let mut st = self.shared.state.lock();
        Self::check_error(&st)?;
        if lsn.saturating_add(1) >= st.next_lsn {
            return Ok(());
        }
        if lsn + 1 < first_of(&st) {
            return Err(Self::out_of_range("truncate_after", lsn, &st));
        }
        let cut = lsn + 1;
        st.next_lsn = cut;
        st.written = st.written.min(cut);
        st.synced = st.synced.min(cut);
        st.pending_truncate = Some(cut);
        self.run_control(st, |id| Op::TruncateAfter { after: lsn, id })
    }

    fn compact_before(&self, lsn: Lsn) -> Result<(), LogError> {
        let _control = self.shared.control.lock();
        let st = self.shared.state.lock();
        Self::check_error(&st)?;
        if lsn > st.next_lsn {
            return Err(Self::out_of_range("compact_before", lsn, &st));
        }
        if lsn <= first_of(&st) {
            return Ok(());
        }
        self.run_control(st, |id| Op::CompactBefore { before: lsn, id })
    }

    fn first_lsn(&self) -> Lsn {
        first_of(&self.shared.state.lock())
    }

    fn next_lsn(&self) -> Lsn {
        self.shared.state.lock().next_lsn
    }

    fn last_lsn(&self) -> Option<Lsn> {
        let st = self.shared.state.lock();
        (st.next_lsn > first_of(&st)).then(|| st.next_lsn - 1)
    }

    fn stats(&self) -> LogStats {
        self.stats_reader().stats()
    }
}

/// Reads a [`SegmentLog`]'s counters from wherever the log itself went (e.g. into the
/// storage of a raft member); see [`SegmentLog::stats_reader`].
#[derive(Clone)]
pub struct StatsReader(Arc<Shared>);

impl std::fmt::Debug for StatsReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StatsReader({})", self.0.dir.display())
    }
}

impl StatsReader {
    /// The log's counters now ([`RecordLog::stats`]).
    pub fn stats(&self) -> LogStats {
        let c = &self.0.counters;
        LogStats {
            appends: c.appends.load(Ordering::Relaxed),
            appended_bytes: c.appended_bytes.load(Ordering::Relaxed),
            written_bytes: c.written_bytes.load(Ordering::Relaxed),
            syncs: c.syncs.load(Ordering::Relaxed),
        }
    }
}

/// Which files and byte ranges hold the records `from..end`.
fn read_plan(segments: &[SegmentInfo], from: Lsn, end: Lsn) -> Vec<ReadSegment> {
    segments
        .iter()
        .filter(|s| s.end() > from && s.first < end)
        .map(|s| {
            let start = from.max(s.first);
            ReadSegment {
                path: s.path.clone(),
                start,
                end: s.end().min(end),
                offset: s.offsets[(start - s.first) as usize],
            }
        })
        .collect()
}
