//! What a log is configured with.

use std::time::Duration;

use crate::LogError;

/// When the log calls `fdatasync`, and so what a successful [`sync_to`](crate::RecordLog::sync_to)
/// or [`append_durable`](crate::RecordLog::append_durable) promises.
///
/// Whatever the policy, records reach the files in LSN order and recovery keeps a prefix of
/// them: a crash never leaves record `n + 1` without record `n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsyncPolicy {
    /// `sync_to(n)` returns only once records up to `n` are on disk (`fdatasync` done): they
    /// survive a process crash and a power failure. Appends waiting at the same time share one
    /// sync (group commit). `truncate_after` and `compact_before` are on disk when they return.
    Always,
    /// `sync_to(n)` returns once records up to `n` are written to the operating system (they
    /// survive a process crash); the writer syncs in the background at most once per
    /// [`LogOptions::batch_interval`], so a power failure loses at most about the last
    /// `batch_interval` of records (plus the duration of one sync). `truncate_after` and
    /// `compact_before` are on disk when they return.
    Batch,
    /// `sync_to(n)` returns once records up to `n` are written to the operating system: they
    /// survive a process crash but not a power failure. The log never syncs on its own, not even
    /// for `truncate_after`, `compact_before` or when closed; only
    /// [`force_sync`](crate::RecordLog::force_sync) does.
    Never,
}

/// Settings of a log. [`LogOptions::default`] gives the documented defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogOptions {
    /// When the log syncs to disk (default [`FsyncPolicy::Always`]).
    pub fsync: FsyncPolicy,
    /// Under [`FsyncPolicy::Batch`], the longest a written record waits for its sync
    /// (default 10 ms). Ignored by the other policies.
    pub batch_interval: Duration,
    /// A new segment file is started once the current one has reached this many bytes
    /// (default 64 MiB). A single record larger than this gets a segment of its own.
    pub segment_bytes: u64,
    /// Largest payload accepted by `append`, in bytes (default 16 MiB, at most 1 GiB). Also the
    /// largest length recovery and readers believe before allocating.
    pub max_record_size: u32,
    /// Bytes of appended records waiting for the writer thread beyond which `append` blocks
    /// until the writer catches up (default 64 MiB): the queue to the writer is bounded.
    pub max_pending_bytes: u64,
}

/// Upper bound on [`LogOptions::max_record_size`].
pub const MAX_RECORD_SIZE_LIMIT: u32 = 1 << 30;

impl Default for LogOptions {
    fn default() -> Self {
        LogOptions {
            fsync: FsyncPolicy::Always,
            batch_interval: Duration::from_millis(10),
            segment_bytes: 64 << 20,
            max_record_size: 16 << 20,
            max_pending_bytes: 64 << 20,
        }
    }
}

impl LogOptions {
    /// Checks that the options are usable; the error says which one is not and why.
    pub fn validate(&self) -> Result<(), LogError> {
        let bad = |msg: String| Err(LogError::InvalidOptions(msg));
        if self.segment_bytes == 0 {
            return bad("segment_bytes must be at least 1".into());
        }
        if self.max_record_size == 0 || self.max_record_size > MAX_RECORD_SIZE_LIMIT {
            return bad(format!(
                "max_record_size is {}, it must be between 1 and {MAX_RECORD_SIZE_LIMIT} bytes",
                self.max_record_size
            ));
        }
        if self.max_pending_bytes == 0 {
            return bad("max_pending_bytes must be at least 1".into());
        }
        if self.fsync == FsyncPolicy::Batch && self.batch_interval.is_zero() {
            return bad("batch_interval must be above zero under FsyncPolicy::Batch (use FsyncPolicy::Always to sync every group of appends)".into());
        }
        Ok(())
    }
}
