//! The one error type of the log.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::Lsn;

/// Everything that can go wrong with a log. Cloneable, so that one I/O failure of the writer
/// thread can be handed to every waiter and to every later call.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LogError {
    /// An operating-system call on a log file or directory failed.
    #[error("log I/O error while trying to {op} {path}: {source}")]
    Io {
        /// What the log was doing (`"open"`, `"write"`, `"sync"`, ...).
        op: &'static str,
        /// The file or directory concerned.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: Arc<io::Error>,
    },
    /// The directory holds something that is not a segment of a qstore log.
    #[error(
        "{path} is not part of a qstore log: {reason}; give the log a directory of its own \
         (empty, or holding only segment files named <20-digit LSN>.log)"
    )]
    NotALog {
        /// The offending file.
        path: PathBuf,
        /// What was found instead.
        reason: String,
    },
    /// A segment written by a different version of the log format.
    #[error(
        "{path} uses log format version {found}, but this build reads version {supported}; \
         open it with a qstore build of the matching version"
    )]
    UnsupportedVersion {
        /// The segment file.
        path: PathBuf,
        /// The version in its header.
        found: u32,
        /// The version this build reads and writes.
        supported: u32,
    },
    /// A damaged record (or segment header) that is not a torn tail, so recovery may not cut it.
    #[error(
        "corrupt log segment {path} at byte offset {offset}: {reason}. The log cannot be trusted \
         from this point on: restore the file from a replica or a backup, or, if everything from \
         this offset on may be discarded, truncate the file to {offset} bytes, delete the \
         segments after it, and reopen"
    )]
    Corrupt {
        /// The segment file.
        path: PathBuf,
        /// Byte offset of the damaged record (or header) in the file.
        offset: u64,
        /// What is wrong there.
        reason: String,
    },
    /// A damaged snapshot (a checkpoint): it was complete when renamed into place, so any
    /// damage is the disk's or someone's, never a crash's.
    #[error(
        "corrupt snapshot {path} at byte offset {offset}: {reason}. It cannot be used: restore \
         it from a replica or a backup"
    )]
    CorruptSnapshot {
        /// The snapshot file.
        path: PathBuf,
        /// Byte offset of the damage.
        offset: u64,
        /// What is wrong there.
        reason: String,
    },
    /// `append` was given a payload above [`LogOptions::max_record_size`](crate::LogOptions).
    #[error(
        "record of {size} bytes exceeds the maximum record size of {max} bytes; split the \
         payload or raise LogOptions::max_record_size"
    )]
    RecordTooLarge {
        /// The payload's size.
        size: u64,
        /// The configured maximum.
        max: u64,
    },
    /// A well-formed record on disk is larger than the configured maximum.
    #[error(
        "{path} holds a record of {size} bytes at byte offset {offset}, above the maximum record \
         size of {max} bytes; reopen the log with LogOptions::max_record_size of at least {size}"
    )]
    RecordTooLargeOnDisk {
        /// The segment file.
        path: PathBuf,
        /// Byte offset of the record.
        offset: u64,
        /// The record's payload size.
        size: u64,
        /// The configured maximum.
        max: u64,
    },
    /// Consecutive segment files do not continue each other's numbering.
    #[error(
        "segment {path} starts at LSN {found}, but the segment before it ends before LSN \
         {expected}; a segment file is missing or belongs to another log"
    )]
    SegmentGap {
        /// The segment whose start does not fit.
        path: PathBuf,
        /// The LSN it should start at.
        expected: Lsn,
        /// The LSN it starts at.
        found: Lsn,
    },
    /// An operation named a record number the log does not hold (or no longer holds).
    #[error(
        "{op}({lsn}) is out of range: the log holds LSNs from {first} up to (not including) {next}"
    )]
    OutOfRange {
        /// The operation (`"read_from"`, `"truncate_after"`, ...).
        op: &'static str,
        /// The LSN it was given.
        lsn: Lsn,
        /// The first LSN the log holds.
        first: Lsn,
        /// The LSN the next append will get.
        next: Lsn,
    },
    /// The options are unusable.
    #[error("invalid log options: {0}")]
    InvalidOptions(String),
    /// The writer thread is gone without having reported an I/O error (it panicked).
    #[error("the log's writer thread stopped unexpectedly; the log must be reopened")]
    WriterStopped,
}

impl LogError {
    /// Wraps an I/O error with what was being done and to which path.
    pub(crate) fn io(op: &'static str, path: &Path, source: io::Error) -> Self {
        LogError::Io {
            op,
            path: path.to_path_buf(),
            source: Arc::new(source),
        }
    }

    /// A [`LogError::Corrupt`] for `path` at `offset`.
    pub(crate) fn corrupt(path: &Path, offset: u64, reason: impl Into<String>) -> Self {
        LogError::Corrupt {
            path: path.to_path_buf(),
            offset,
            reason: reason.into(),
        }
    }
}
