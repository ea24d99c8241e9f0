//! The writer thread of a [`SegmentLog`](crate::SegmentLog): the only code that changes segment
//! files after recovery.
//!
//! It takes everything queued at once, writes it with as few `write` calls as possible, then
//! syncs once according to the policy. Appends queued while it syncs wait for the next round and
//! share its sync: that is the group commit. An I/O error is stored in the shared state (every
//! waiter and every later call gets it) and the thread stops; it never retries a failed
//! `fdatasync`, whose failure may have dropped the data it was to make durable.

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use parking_lot::MutexGuard;

use crate::recovery::{create_segment, sync_dir, SegmentInfo};
use crate::segment_log::{Op, Shared, State};
use crate::{FsyncPolicy, LogError, Lsn};

/// Encoded records are handed to the file once this many bytes are buffered (or at the end of a
/// round).
const WRITE_CHUNK: usize = 1 << 20;

/// One round of work taken from the queue.
struct Round {
    ops: Vec<Op>,
    /// The last `force_sync` request to satisfy this round (0: none).
    force: u64,
    shutdown: bool,
}

/// What one round did, to be published to the shared state.
#[derive(Default)]
struct Done {
    truncated: bool,
    control: u64,
}

/// The writer thread's own state.
pub(crate) struct Writer {
    shared: Arc<Shared>,
    policy: FsyncPolicy,
    /// The segment being appended to (always the last one).
    file: File,
    path: PathBuf,
    seg_first: Lsn,
    /// Bytes of the segment, including what is still in `buf`.
    seg_len: u64,
    seg_records: u64,
    /// Encoded records not yet written to `file`, and their offsets in it.
    buf: Vec<u8>,
    buf_offsets: Vec<u64>,
    /// Every record below this is written (or in `buf`, until the end of the round).
    written_to: Lsn,
    /// Every record below this is on disk.
    synced_to: Lsn,
    /// `file` has changes not yet synced.
    dirty: bool,
    /// The directory has entries created or removed and not yet synced (only under `Never`).
    dir_dirty: bool,
    /// Earlier segments with unsynced data (only under `Never`, for `force_sync`).
    dirty_paths: Vec<PathBuf>,
    last_sync: Instant,
    force_done: u64,
}

/// What the writer needs to know of the segment it appends to.
struct Active {
    path: PathBuf,
    first: Lsn,
    len: u64,
    records: u64,
}

impl Active {
    /// The writer's view of `seg`.
    fn of(seg: &SegmentInfo) -> Active {
        Active {
            path: seg.path.clone(),
            first: seg.first,
            len: seg.len,
            records: seg.offsets.len() as u64,
        }
    }
}

/// Marks the log failed if the writer thread ends without a clean shutdown (a panic), so that
/// no caller waits forever.
struct StopGuard {
    shared: Arc<Shared>,
    clean: bool,
}

impl Drop for StopGuard {
    fn drop(&mut self) {
        if !self.clean {
            let mut st = self.shared.state.lock();
            st.error.get_or_insert(LogError::WriterStopped);
            drop(st);
            self.shared.progress.notify_all();
            self.shared.space.notify_all();
        }
    }
}

impl Writer {
    /// Starts the writer thread on the recovered segments in `shared`.
    pub fn start(shared: Arc<Shared>) -> Result<JoinHandle<()>, LogError> {
        let writer = Writer::new(shared.clone())?;
        std::thread::Builder::new()
            .name("qstore-log-writer".into())
            .spawn(move || writer.run())
            .map_err(|e| LogError::io("start the writer thread for", &shared.dir, e))
    }

    /// The writer, appending to the last recovered segment.
    fn new(shared: Arc<Shared>) -> Result<Writer, LogError> {
        let st = shared.state.lock();
        let last = st
            .segments
            .last()
            .map(Active::of)
            .ok_or(LogError::WriterStopped)?;
        let next = st.next_lsn;
        drop(st);
        let file = open_append(&last.path)?;
        Ok(Writer {
            policy: shared.opts.fsync,
            shared,
            file,
            path: last.path,
            seg_first: last.first,
            seg_len: last.len,
            seg_records: last.records,
            buf: Vec::new(),
            buf_offsets: Vec::new(),
            written_to: next,
            synced_to: next,
            dirty: false,
            dir_dirty: false,
            dirty_paths: Vec::new(),
            last_sync: Instant::now(),
            force_done: 0,
        })
    }

    /// The thread's body: rounds until shutdown or the first error.
    fn run(mut self) {
        let mut guard = StopGuard {
            shared: self.shared.clone(),
            clean: false,
        };
        loop {
            let round = self.take_round();
            let shutdown = round.shutdown;
            if let Err(e) = self.do_round(round) {
                self.fail(e);
                break;
            }
            if shutdown {
                break;
            }
        }
        guard.clean = true;
    }

    /// Stores the error for every caller and wakes them all.
    fn fail(&self, e: LogError) {
        let mut st = self.shared.state.lock();
        st.error.get_or_insert(e);
        st.queue.clear();
        st.pending_bytes = 0;
        drop(st);
        self.shared.progress.notify_all();
        self.shared.space.notify_all();
    }

    /// Waits for work (or for the batch sync deadline) and takes everything queued.
    fn take_round(&self) -> Round {
        let mut st = self.shared.state.lock();
        loop {
            if !st.queue.is_empty() || st.shutdown || st.force_requested > self.force_done {
                return self.take(&mut st);
            }
            match self.batch_deadline() {
                Some(deadline) if Instant::now() >= deadline => return self.take(&mut st),
                Some(deadline) => {
                    self.shared.work.wait_until(&mut st, deadline);
                }
                None => self.shared.work.wait(&mut st),
            }
        }
    }

    /// Takes the queue, freeing its room for appenders.
    fn take(&self, st: &mut MutexGuard<'_, State>) -> Round {
        let ops = std::mem::take(&mut st.queue);
        if st.pending_bytes > 0 {
            st.pending_bytes = 0;
            self.shared.space.notify_all();
        }
        Round {
            ops,
            force: st.force_requested,
            shutdown: st.shutdown,
        }
    }

    /// Under `Batch` with unsynced data, when the background sync is due.
    fn batch_deadline(&self) -> Option<Instant> {
        (self.policy == FsyncPolicy::Batch && self.dirty)
            .then(|| self.last_sync + self.shared.opts.batch_interval)
    }

    /// Does the round's work, syncs as the policy says, and publishes the progress.
    fn do_round(&mut self, round: Round) -> Result<(), LogError> {
        let mut done = Done::default();
        for op in round.ops {
            match op {
                Op::Append { lsn, record } => self.append(lsn, &record)?,
                Op::TruncateAfter { after, id } => {
                    self.flush()?;
                    self.truncate_after(after)?;
                    done.truncated = true;
                    done.control = id;
                }
                Op::CompactBefore { before, id } => {
                    self.flush()?;
                    self.compact_before(before)?;
                    done.control = id;
                }
            }
        }
        self.flush()?;
        let forced = round.force > self.force_done;
        if self.sync_due(forced, round.shutdown) {
            self.sync(forced)?;
        }
        self.force_done = round.force;
        self.publish(&done);
        Ok(())
    }

    /// Whether the policy wants a sync at the end of this round.
    fn sync_due(&self, forced: bool, shutdown: bool) -> bool {
        let unsynced = self.dirty || self.dir_dirty || !self.dirty_paths.is_empty();
        let due = match self.policy {
            FsyncPolicy::Always => true,
            FsyncPolicy::Batch => {
                shutdown || self.last_sync.elapsed() >= self.shared.opts.batch_interval
            }
            FsyncPolicy::Never => false,
        };
        unsynced && (due || forced)
    }

    /// Tells callers what is written, synced and done.
    fn publish(&self, done: &Done) {
        let mut st = self.shared.state.lock();
        let (w, s) = (self.written_to, self.synced_to);
        match st.pending_truncate {
            // The truncation queued after this round began drops the records from `cut` on:
            // only the records below it that this round wrote or synced are news.
            Some(cut) if !done.truncated => {
                st.written = st.written.max(w.min(cut));
                st.synced = st.synced.max(s.min(cut));
            }
            _ => {
                st.pending_truncate = None;
                st.written = w;
                st.synced = s;
            }
        }
        st.control_done = st.control_done.max(done.control);
        st.force_done = st.force_done.max(self.force_done);
        drop(st);
        self.shared.progress.notify_all();
    }

    /// Buffers one encoded record, starting a new segment first if the current one is full.
    fn append(&mut self, lsn: Lsn, record: &[u8]) -> Result<(), LogError> {
        debug_assert_eq!(
            lsn, self.written_to,
            "records reach the writer in LSN order"
        );
        if self.seg_records > 0 && self.seg_len >= self.shared.opts.segment_bytes {
            self.roll()?;
        }
        self.buf_offsets.push(self.seg_len);
        self.buf.extend_from_slice(record);
        self.seg_len += record.len() as u64;
        self.seg_records += 1;
        self.written_to = lsn + 1;
        if self.buf.len() >= WRITE_CHUNK {
            self.flush()?;
        }
        Ok(())
    }

    /// Writes the buffered records to the file and records their offsets in the shared state.
    fn flush(&mut self) -> Result<(), LogError> {
        if self.buf.is_empty() {
            return Ok(());
        }
        self.file
            .write_all(&self.buf)
            .map_err(|e| LogError::io("write", &self.path, e))?;
        self.dirty = true;
        Shared::count(&self.shared.counters.written_bytes, self.buf.len() as u64);
        let mut st = self.shared.state.lock();
        if let Some(seg) = st.segments.last_mut() {
            debug_assert_eq!(seg.first, self.seg_first);
            seg.offsets.append(&mut self.buf_offsets);
            seg.len = self.seg_len;
        }
        drop(st);
        self.buf.clear();
        self.buf_offsets.clear();
        Ok(())
    }

    /// Closes the full segment and starts the next one at `written_to`.
    fn roll(&mut self) -> Result<(), LogError> {
        self.flush()?;
        if self.dirty {
            if self.policy == FsyncPolicy::Never {
                self.dirty_paths.push(self.path.clone());
            } else {
                self.sync_file()?;
            }
        }
        let sync = self.policy != FsyncPolicy::Never;
        let info = create_segment(&self.shared.dir, self.written_to, sync)?;
        if sync {
            Shared::count(&self.shared.counters.syncs, 1);
        } else {
            self.dir_dirty = true;
        }
        self.file = open_append(&info.path)?;
        self.path = info.path.clone();
        self.seg_first = info.first;
        self.seg_len = info.len;
        self.seg_records = 0;
        self.dirty = false;
        self.shared.state.lock().segments.push(info);
        Ok(())
    }

    /// Drops the records after `after`: later segments are deleted, the one holding `after`
    /// (or the first, if everything goes) is cut after it and becomes the active segment.
    fn truncate_after(&mut self, after: Lsn) -> Result<(), LogError> {
        let (removed, keep) = {
            let mut st = self.shared.state.lock();
            let segs = &mut st.segments;
            let k = segs.partition_point(|s| s.first <= after).saturating_sub(1);
            let removed: Vec<SegmentInfo> = segs.drain(k + 1..).collect();
            let seg = &mut segs[k];
            let kept = (after + 1)
                .saturating_sub(seg.first)
                .min(seg.offsets.len() as u64);
            if let Some(&cut) = seg.offsets.get(kept as usize) {
                seg.len = cut;
            }
            seg.offsets.truncate(kept as usize);
            (removed, Active::of(seg))
        };
        // Later segments go first, newest first: a crash part-way leaves a prefix of the log.
        for seg in removed.iter().rev() {
            remove_segment(&seg.path)?;
        }
        if keep.path != self.path {
            self.file = open_append(&keep.path)?;
            self.path = keep.path.clone();
        }
        self.file
            .set_len(keep.len)
            .map_err(|e| LogError::io("truncate", &self.path, e))?;
        self.seg_first = keep.first;
        self.seg_len = keep.len;
        self.seg_records = keep.records;
        self.written_to = after + 1;
        self.synced_to = self.synced_to.min(after + 1);
        self.dirty = true;
        self.after_control(!removed.is_empty())
    }

    /// Deletes the leading segments that hold only records before `before` (never the last).
    fn compact_before(&mut self, before: Lsn) -> Result<(), LogError> {
        let removed: Vec<SegmentInfo> = {
            let mut st = self.shared.state.lock();
            let segs = &mut st.segments;
            let mut n = 0;
            while n + 1 < segs.len() && segs[n + 1].first <= before {
                n += 1;
            }
            segs.drain(..n).collect()
        };
        // Oldest first: a crash part-way leaves a suffix of the log.
        for seg in &removed {
            remove_segment(&seg.path)?;
        }
        self.after_control(!removed.is_empty())
    }

    /// Makes a truncation or compaction durable unless the policy is `Never`.
    fn after_control(&mut self, removed_files: bool) -> Result<(), LogError> {
        if self.policy == FsyncPolicy::Never {
            self.dir_dirty |= removed_files;
            return Ok(());
        }
        if removed_files {
            sync_dir(&self.shared.dir)?;
        }
        if self.dirty {
            self.sync_file()?;
        }
        Ok(())
    }

    /// Syncs everything not yet on disk: the active file, earlier segments left unsynced (under
    /// `Never`) and the directory.
    fn sync(&mut self, forced: bool) -> Result<(), LogError> {
        debug_assert!(forced || self.dirty_paths.is_empty());
        for path in std::mem::take(&mut self.dirty_paths) {
            match File::open(&path) {
                Ok(f) => f.sync_data().map_err(|e| LogError::io("sync", &path, e))?,
                // Deleted by a compaction or truncation since: nothing to sync.
                Err(e) if e.kind() == ErrorKind::NotFound => continue,
                Err(e) => return Err(LogError::io("open for sync", &path, e)),
            }
            Shared::count(&self.shared.counters.syncs, 1);
        }
        if self.dir_dirty {
            sync_dir(&self.shared.dir)?;
            self.dir_dirty = false;
        }
        if self.dirty {
            self.sync_file()?;
        }
        self.synced_to = self.written_to;
        self.last_sync = Instant::now();
        Ok(())
    }

    /// `fdatasync` of the active file: everything written so far is on disk.
    fn sync_file(&mut self) -> Result<(), LogError> {
        self.file
            .sync_data()
            .map_err(|e| LogError::io("sync", &self.path, e))?;
        Shared::count(&self.shared.counters.syncs, 1);
        self.dirty = false;
        self.synced_to = self.written_to;
        self.last_sync = Instant::now();
        Ok(())
    }
}

/// Opens a segment for appending.
fn open_append(path: &Path) -> Result<File, LogError> {
    OpenOptions::new()
        .append(true)
        .open(path)
        .map_err(|e| LogError::io("open for append", path, e))
}

/// Deletes a segment file.
fn remove_segment(path: &Path) -> Result<(), LogError> {
    fs::remove_file(path).map_err(|e| LogError::io("delete segment", path, e))
}
