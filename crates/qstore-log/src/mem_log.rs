//! [`MemLog`]: the log's semantics in memory, for tests.

use parking_lot::Mutex;

use crate::format::{RECORD_HEADER_LEN, SEGMENT_HEADER_LEN};
use crate::{LogError, LogOptions, LogStats, Lsn, RecordLog, Records};

/// A [`RecordLog`] in memory: no files, nothing survives the process, every record is
/// "durable" as soon as it is appended.
///
/// It groups records into the segments a [`SegmentLog`](crate::SegmentLog) opened with the same
/// [`LogOptions`] would write (same header and record sizes, same rule for starting a segment),
/// so [`RecordLog::compact_before`] keeps exactly the records the file log keeps. The
/// `fsync` options are ignored; `max_record_size` is enforced.
pub struct MemLog {
    opts: LogOptions,
    inner: Mutex<Inner>,
}

/// The records, under the lock.
struct Inner {
    /// Never empty; the last segment takes the appends.
    segments: Vec<Segment>,
    next: Lsn,
    stats: LogStats,
}

/// The records a segment file would hold.
struct Segment {
    first: Lsn,
    /// The file size it would have.
    bytes: u64,
    records: Vec<Vec<u8>>,
}

impl Segment {
    /// An empty segment starting at `first`.
    fn new(first: Lsn) -> Self {
        Segment {
            first,
            bytes: SEGMENT_HEADER_LEN,
            records: Vec::new(),
        }
    }

    /// The LSN after its last record.
    fn end(&self) -> Lsn {
        self.first + self.records.len() as u64
    }
}

impl Default for MemLog {
    fn default() -> Self {
        MemLog::new()
    }
}

impl MemLog {
    /// An empty log with [`LogOptions::default`].
    pub fn new() -> Self {
        MemLog::make(LogOptions::default())
    }

    /// An empty log with `opts` (checked with [`LogOptions::validate`]).
    pub fn with_options(opts: LogOptions) -> Result<Self, LogError> {
        opts.validate()?;
        Ok(MemLog::make(opts))
    }

    /// An empty log with options already checked.
    fn make(opts: LogOptions) -> Self {
        MemLog {
            opts,
            inner: Mutex::new(Inner {
                segments: vec![Segment::new(0)],
                next: 0,
                stats: LogStats::default(),
            }),
        }
    }

    /// The record `lsn`, if the log holds it.
    fn get(&self, lsn: Lsn) -> Option<Vec<u8>> {
        let inner = self.inner.lock();
        let k = inner
            .segments
            .partition_point(|s| s.first <= lsn)
            .checked_sub(1)?;
        let seg = &inner.segments[k];
        seg.records.get((lsn - seg.first) as usize).cloned()
    }

    /// An [`LogError::OutOfRange`] for `op(lsn)`.
    fn out_of_range(op: &'static str, lsn: Lsn, inner: &Inner) -> LogError {
        LogError::OutOfRange {
            op,
            lsn,
            first: inner.first(),
            next: inner.next,
        }
    }
}

impl Inner {
    /// The first LSN held.
    fn first(&self) -> Lsn {
        self.segments.first().map_or(self.next, |s| s.first)
    }

    /// Checks (in debug builds) that the segments continue each other's numbering.
    fn debug_check(&self) {
        debug_assert!(self.segments.windows(2).all(|w| w[0].end() == w[1].first));
        debug_assert_eq!(self.segments.last().map(Segment::end), Some(self.next));
    }

    /// The segment taking the next append, starting a new one when the last is full (the
    /// writer of a `SegmentLog` applies the same rule).
    fn active(&mut self, segment_bytes: u64) -> &mut Segment {
        let next = self.next;
        let full = self
            .segments
            .last()
            .is_none_or(|s| !s.records.is_empty() && s.bytes >= segment_bytes);
        if full {
            self.segments.push(Segment::new(next));
        }
        let last = self.segments.len() - 1;
        &mut self.segments[last]
    }
}

impl RecordLog for MemLog {
    fn append(&self, payload: &[u8]) -> Result<Lsn, LogError> {
        let max = self.opts.max_record_size;
        if payload.len() as u64 > u64::from(max) {
            return Err(LogError::RecordTooLarge {
                size: payload.len() as u64,
                max: u64::from(max),
            });
        }
        let mut inner = self.inner.lock();
        let size = RECORD_HEADER_LEN + payload.len() as u64;
        let seg = inner.active(self.opts.segment_bytes);
        seg.bytes += size;
        seg.records.push(payload.to_vec());
        let lsn = inner.next;
        inner.next += 1;
        inner.stats.appends += 1;
        inner.stats.appended_bytes += payload.len() as u64;
        inner.stats.written_bytes += size;
        inner.debug_check();
        Ok(lsn)
    }

    fn sync_to(&self, lsn: Lsn) -> Result<(), LogError> {
        let inner = self.inner.lock();
        if lsn >= inner.next {
            return Err(Self::out_of_range("sync_to", lsn, &inner));
        }
        Ok(())
    }

    fn force_sync(&self) -> Result<(), LogError> {
        Ok(())
    }

    fn read_from(&self, lsn: Lsn) -> Result<Records<'_>, LogError> {
        let inner = self.inner.lock();
        if lsn < inner.first() || lsn > inner.next {
            return Err(Self::out_of_range("read_from", lsn, &inner));
        }
        let end = inner.next;
        drop(inner);
        Ok(Box::new((lsn..end).map(move |l| {
            self.get(l)
                .map(|payload| (l, payload))
                .ok_or_else(|| Self::out_of_range("read_from", l, &self.inner.lock()))
        })))
    }

    fn truncate_after(&self, lsn: Lsn) -> Result<(), LogError> {
        let mut inner = self.inner.lock();
        if lsn.saturating_add(1) >= inner.next {
            return Ok(());
        }
        if lsn + 1 < inner.first() {
            return Err(Self::out_of_range("truncate_after", lsn, &inner));
        }
        let k = inner
            .segments
            .partition_point(|s| s.first <= lsn)
            .saturating_sub(1);
        inner.segments.truncate(k + 1);
        let seg = &mut inner.segments[k];
        let kept = (lsn + 1)
            .saturating_sub(seg.first)
            .min(seg.records.len() as u64) as usize;
        let dropped: u64 = seg.records[kept..]
            .iter()
            .map(|r| RECORD_HEADER_LEN + r.len() as u64)
            .sum();
        seg.records.truncate(kept);
        seg.bytes -= dropped;
        inner.next = lsn + 1;
        inner.debug_check();
        Ok(())
    }

    fn compact_before(&self, lsn: Lsn) -> Result<(), LogError> {
        let mut inner = self.inner.lock();
        if lsn > inner.next {
            return Err(Self::out_of_range("compact_before", lsn, &inner));
        }
        let segs = &inner.segments;
        let mut n = 0;
        while n + 1 < segs.len() && segs[n + 1].first <= lsn {
            n += 1;
        }
        inner.segments.drain(..n);
        inner.debug_check();
        Ok(())
    }

    fn first_lsn(&self) -> Lsn {
        self.inner.lock().first()
    }

    fn next_lsn(&self) -> Lsn {
        self.inner.lock().next
    }

    fn last_lsn(&self) -> Option<Lsn> {
        let inner = self.inner.lock();
        (inner.next > inner.first()).then(|| inner.next - 1)
    }

    fn stats(&self) -> LogStats {
        self.inner.lock().stats
    }
}
