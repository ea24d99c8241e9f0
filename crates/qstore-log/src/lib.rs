//! The durable record log of qstore: what raft's log, Q-Store's batch log, Calvin's epoch log and
//! the two-phase-commit write-ahead log are stored in.
//!
//! A log is a sequence of records (opaque byte payloads) numbered by consecutive log sequence
//! numbers ([`Lsn`]) from the first record ever appended. The engine codes against the
//! [`RecordLog`] trait, which has two implementations:
//!
//! - [`SegmentLog`]: append-only segment files in a directory, checksummed records, one writer
//!   thread with group commit (one `fdatasync` covers every record appended while the previous
//!   one ran), recovery of torn tails on open, and errors naming file and offset for damage
//!   anywhere else. The [`format`](mod@crate::format) module documents the bytes on disk.
//! - [`MemLog`]: the same semantics in memory, for tests. It even groups records into the
//!   segments a [`SegmentLog`] with the same options would use, so compaction drops the same
//!   records.
//!
//! What a successful `sync_to`/`append_durable` promises depends on the [`FsyncPolicy`].

mod error;
pub mod format;
mod mem_log;
mod options;
mod reader;
mod recovery;
mod segment_log;
pub mod snapshot;
mod writer;

pub use error::LogError;
pub use mem_log::MemLog;
pub use options::{FsyncPolicy, LogOptions, MAX_RECORD_SIZE_LIMIT};
pub use recovery::{RecoveryReport, TailCut};
pub use segment_log::{SegmentLog, StatsReader};
pub use snapshot::{open_snapshot, SnapshotReader, SnapshotWriter};

/// Log sequence number: the number of a record, consecutive from 0 for the first record ever
/// appended to a log. Never reused, except that [`RecordLog::truncate_after`] gives the numbers
/// of dropped records to the next appends.
pub type Lsn = u64;

/// The records of a log from some LSN on, in order, as `(lsn, payload)`. An item is an error if a
/// record read from disk fails its checks; the iterator ends after an error.
pub type Records<'a> = Box<dyn Iterator<Item = Result<(Lsn, Vec<u8>), LogError>> + Send + 'a>;

/// Counters of a log's work since it was opened (servers report them to clients).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LogStats {
    /// Records appended.
    pub appends: u64,
    /// Payload bytes appended.
    pub appended_bytes: u64,
    /// Bytes written to segment files (record headers and payloads; segment headers excluded).
    pub written_bytes: u64,
    /// `fdatasync` calls on segment files. With group commit, `appends / syncs` is the average
    /// number of records one sync made durable. Always 0 for [`MemLog`].
    pub syncs: u64,
}

impl LogStats {
    /// The sum of two logs' counters.
    pub fn plus(self, o: LogStats) -> LogStats {
        LogStats {
            appends: self.appends + o.appends,
            appended_bytes: self.appended_bytes + o.appended_bytes,
            written_bytes: self.written_bytes + o.written_bytes,
            syncs: self.syncs + o.syncs,
        }
    }

    /// The work done since `before`, an earlier reading of the same logs.
    pub fn since(self, before: LogStats) -> LogStats {
        LogStats {
            appends: self.appends.saturating_sub(before.appends),
            appended_bytes: self.appended_bytes.saturating_sub(before.appended_bytes),
            written_bytes: self.written_bytes.saturating_sub(before.written_bytes),
            syncs: self.syncs.saturating_sub(before.syncs),
        }
    }
}

/// A durable, append-only sequence of records: what the engine's logs are written to.
///
/// All methods take `&self`; a log can be shared by many threads (appends from several threads
/// are numbered in the order they take the log's lock).
pub trait RecordLog: Send + Sync {
    /// Appends `payload` as the next record and returns its number. Does not wait for the disk
    /// (it blocks only while the queue to the writer is full); use [`RecordLog::sync_to`] or
    /// [`RecordLog::append_durable`] to wait. Fails with [`LogError::RecordTooLarge`] above
    /// [`LogOptions::max_record_size`], and with the writer's error once a write has failed.
    fn append(&self, payload: &[u8]) -> Result<Lsn, LogError>;

    /// Waits until every record up to and including `lsn` is as durable as the log's
    /// [`FsyncPolicy`] promises. Fails if `lsn` was never appended.
    fn sync_to(&self, lsn: Lsn) -> Result<(), LogError>;

    /// [`RecordLog::append`], then [`RecordLog::sync_to`] the new record.
    fn append_durable(&self, payload: &[u8]) -> Result<Lsn, LogError> {
        let lsn = self.append(payload)?;
        self.sync_to(lsn)?;
        Ok(lsn)
    }

    /// Waits until everything appended before the call is on disk, whatever the policy (also
    /// under [`FsyncPolicy::Never`]).
    fn force_sync(&self) -> Result<(), LogError>;

    /// The records from `lsn` to the last one appended before the call, in order. Every record
    /// appended before the call is included (reads see the caller's own appends). Fails if
    /// `lsn` is below [`RecordLog::first_lsn`] (compacted) or above [`RecordLog::next_lsn`].
    fn read_from(&self, lsn: Lsn) -> Result<Records<'_>, LogError>;

    /// Drops every record after `lsn`; the next append gets number `lsn + 1`. Nothing happens if
    /// `lsn` is at or after the last record. Under [`FsyncPolicy::Always`] and
    /// [`FsyncPolicy::Batch`] the truncation is on disk when this returns. Fails if records
    /// before `lsn + 1` were compacted away (`lsn + 1 < first_lsn()`).
    fn truncate_after(&self, lsn: Lsn) -> Result<(), LogError>;

    /// Forgets records before `lsn` by deleting whole segments that hold only such records; the
    /// segment holding `lsn`, and the last segment, stay. [`RecordLog::first_lsn`] tells what
    /// remains (at most `lsn`). Fails if `lsn` is above [`RecordLog::next_lsn`].
    fn compact_before(&self, lsn: Lsn) -> Result<(), LogError>;

    /// The number of the first record held; equals [`RecordLog::next_lsn`] when the log is
    /// empty.
    fn first_lsn(&self) -> Lsn;

    /// The number the next appended record gets.
    fn next_lsn(&self) -> Lsn;

    /// The number of the last record appended, or `None` if the log holds no record.
    fn last_lsn(&self) -> Option<Lsn>;

    /// Counters of the log's work.
    fn stats(&self) -> LogStats;
}
