//! Reading records back from segment files, checking every one of them again.

use std::fs::File;
use std::io::{BufReader, ErrorKind, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crate::format::{crc, RecordHeader, RECORD_HEADER_LEN};
use crate::{LogError, Lsn};

/// The records `start..end` of one segment file, the first of them at byte `offset`.
#[derive(Debug, Clone)]
pub(crate) struct ReadSegment {
    pub path: PathBuf,
    pub start: Lsn,
    pub end: Lsn,
    pub offset: u64,
}

/// Iterator over records of a [`SegmentLog`](crate::SegmentLog), planned when
/// [`read_from`](crate::RecordLog::read_from) was called. Files are opened as they are
/// reached; a segment deleted by a compaction before that, or a file cut by a truncation while
/// it is read, ends the iteration with an error.
pub(crate) struct SegmentReader {
    plan: std::vec::IntoIter<ReadSegment>,
    current: Option<Open>,
    lsn: Lsn,
    max_record_size: u32,
    failed: bool,
}

/// The segment being read.
struct Open {
    r: BufReader<File>,
    path: PathBuf,
    /// Offset of the next record.
    off: u64,
    end: Lsn,
}

impl SegmentReader {
    /// A reader following `plan`, which starts at record `from`.
    pub fn new(plan: Vec<ReadSegment>, from: Lsn, max_record_size: u32) -> Self {
        SegmentReader {
            plan: plan.into_iter(),
            current: None,
            lsn: from,
            max_record_size,
            failed: false,
        }
    }

    /// The next record, or `None` at the end of the plan.
    fn next_record(&mut self) -> Result<Option<(Lsn, Vec<u8>)>, LogError> {
        loop {
            match &mut self.current {
                Some(open) if self.lsn < open.end => {
                    let payload = read_record(open, self.lsn, self.max_record_size)?;
                    self.lsn += 1;
                    return Ok(Some((self.lsn - 1, payload)));
                }
                _ => match self.plan.next() {
                    None => return Ok(None),
                    Some(seg) => {
                        debug_assert_eq!(seg.start, self.lsn);
                        self.current = Some(open_at(seg)?);
                    }
                },
            }
        }
    }
}

impl Iterator for SegmentReader {
    type Item = Result<(Lsn, Vec<u8>), LogError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let item = self.next_record().transpose();
        self.failed = matches!(item, Some(Err(_)));
        item
    }
}

/// Opens a planned segment positioned at its first record to read.
fn open_at(seg: ReadSegment) -> Result<Open, LogError> {
    let mut file = File::open(&seg.path).map_err(|e| {
        if e.kind() == ErrorKind::NotFound {
            LogError::corrupt(
                &seg.path,
                seg.offset,
                "the segment was deleted while it was being read (a concurrent compact_before \
                 or truncate_after); read again from first_lsn()",
            )
        } else {
            LogError::io("open", &seg.path, e)
        }
    })?;
    file.seek(SeekFrom::Start(seg.offset))
        .map_err(|e| LogError::io("seek in", &seg.path, e))?;
    Ok(Open {
        r: BufReader::with_capacity(64 << 10, file),
        path: seg.path,
        off: seg.offset,
        end: seg.end,
    })
}

/// Reads and checks the record `lsn` at the current position of `open`.
fn read_record(open: &mut Open, lsn: Lsn, max_record_size: u32) -> Result<Vec<u8>, LogError> {
    let mut hb = [0u8; RECORD_HEADER_LEN as usize];
    read_exact(open, &mut hb)?;
    let h = RecordHeader::decode(&hb);
    let bad = |open: &Open, what: &str| {
        LogError::corrupt(
            &open.path,
            open.off,
            format!("{what} for LSN {lsn} (the file changed after the log checked it on open)"),
        )
    };
    if !h.is_valid_for(lsn) {
        return Err(bad(open, "record header checksum mismatch"));
    }
    if h.len > max_record_size {
        return Err(bad(open, "record length above max_record_size"));
    }
    let mut payload = vec![0u8; h.len as usize];
    read_exact(open, &mut payload)?;
    if crc(&payload) != h.payload_crc {
        return Err(bad(open, "payload checksum mismatch"));
    }
    open.off += h.record_len();
    Ok(payload)
}

/// Fills `buf`; the end of the file here means the file was cut while being read.
fn read_exact(open: &mut Open, buf: &mut [u8]) -> Result<(), LogError> {
    open.r.read_exact(buf).map_err(|e| {
        if e.kind() == ErrorKind::UnexpectedEof {
            cut_short(&open.path, open.off)
        } else {
            LogError::io("read", &open.path, e)
        }
    })
}

/// The error for a record that ends past the end of its file.
fn cut_short(path: &Path, off: u64) -> LogError {
    LogError::corrupt(
        path,
        off,
        "record cut short by the end of the file (a concurrent truncate_after?)",
    )
}
