//! Opening a log directory: listing and checking every segment, cutting a torn tail.
//!
//! Everything read here is untrusted: lengths are checked against the file size and the
//! configured maximum before anything is allocated, and no byte content can cause a panic.

use std::fs::{self, File, OpenOptions};
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};

use crate::format::{
    check_segment_header, crc, encode_segment_header, parse_segment_name, segment_path,
    RecordHeader, RECORD_HEADER_LEN, SEGMENT_HEADER_LEN,
};
use crate::{LogError, LogOptions, Lsn};

/// What opening a log found and repaired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Segment files found (after repair).
    pub segments: usize,
    /// Records found, all checksums verified.
    pub records: u64,
    /// The first LSN the log holds.
    pub first_lsn: Lsn,
    /// The LSN the next append gets.
    pub next_lsn: Lsn,
    /// The torn or corrupt tail that was cut off the last segment, if there was one.
    pub tail_cut: Option<TailCut>,
}

/// A damaged end of the last segment, removed by recovery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TailCut {
    /// The segment file that was truncated.
    pub path: PathBuf,
    /// Byte offset the file was truncated at: the end of the last valid record.
    pub offset: u64,
    /// How many bytes were removed.
    pub bytes_cut: u64,
    /// LSN of the first record lost (the one that was damaged); appends continue from it.
    pub lsn: Lsn,
    /// What the damage was.
    pub reason: String,
}

/// A segment file as the log tracks it: where it is and where each record starts.
#[derive(Debug, Clone)]
pub(crate) struct SegmentInfo {
    /// LSN of its first record.
    pub first: Lsn,
    /// Its file.
    pub path: PathBuf,
    /// Byte offset of each record it holds (record `first + i` at `offsets[i]`). Costs 8
    /// bytes of memory per record held; it makes reads and truncation seek directly.
    pub offsets: Vec<u64>,
    /// Bytes of the file in use (header and whole records).
    pub len: u64,
}

impl SegmentInfo {
    /// The LSN after its last record.
    pub fn end(&self) -> Lsn {
        self.first + self.offsets.len() as u64
    }
}

/// The segments of an opened log and the report of what recovery did.
pub(crate) struct Recovered {
    pub segments: Vec<SegmentInfo>,
    pub report: RecoveryReport,
}

/// Opens (creating it if needed) the log in `dir`: checks every segment, cuts a torn tail of
/// the last one, and creates the first segment of an empty directory.
pub(crate) fn recover(dir: &Path, opts: &LogOptions) -> Result<Recovered, LogError> {
    fs::create_dir_all(dir).map_err(|e| LogError::io("create directory", dir, e))?;
    let names = list_segments(dir)?;
    let mut segments = Vec::with_capacity(names.len().max(1));
    let mut tail_cut = None;
    for (i, (first, path)) in names.iter().enumerate() {
        let is_last = i + 1 == names.len();
        if let Some(prev) = segments.last().map(SegmentInfo::end) {
            if *first != prev {
                return Err(LogError::SegmentGap {
                    path: path.clone(),
                    expected: prev,
                    found: *first,
                });
            }
        }
        let (info, cut) = recover_segment(path, *first, is_last, opts.max_record_size)?;
        segments.push(info);
        tail_cut = cut.or(tail_cut);
    }
    if segments.is_empty() {
        segments.push(create_segment(dir, 0, true)?);
    }
    let report = RecoveryReport {
        segments: segments.len(),
        records: segments.iter().map(|s| s.offsets.len() as u64).sum(),
        first_lsn: segments[0].first,
        next_lsn: segments.last().map_or(0, SegmentInfo::end),
        tail_cut,
    };
    Ok(Recovered { segments, report })
}

/// The segment files of `dir`, sorted by first LSN; anything else in it is an error.
fn list_segments(dir: &Path) -> Result<Vec<(Lsn, PathBuf)>, LogError> {
    let entries = fs::read_dir(dir).map_err(|e| LogError::io("list", dir, e))?;
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| LogError::io("list", dir, e))?;
        let path = entry.path();
        let first = entry.file_name().to_str().and_then(parse_segment_name);
        let is_file = entry.file_type().map(|t| t.is_file()).unwrap_or(false);
        match first {
            Some(first) if is_file => found.push((first, path)),
            _ => {
                return Err(LogError::NotALog {
                    path,
                    reason: "its name is not that of a log segment (<20-digit LSN>.log)".into(),
                })
            }
        }
    }
    found.sort_unstable_by_key(|(first, _)| *first);
    Ok(found)
}

/// Creates the empty segment starting at `first` in `dir`: header written and, if `sync`, the
/// file and the directory entry on disk.
pub(crate) fn create_segment(dir: &Path, first: Lsn, sync: bool) -> Result<SegmentInfo, LogError> {
    let path = segment_path(dir, first);
    let mut file = OpenOptions::new()
        .append(true)
        .create_new(true)
        .open(&path)
        .map_err(|e| LogError::io("create segment", &path, e))?;
    file.write_all(&encode_segment_header(first))
        .map_err(|e| LogError::io("write", &path, e))?;
    if sync {
        file.sync_data()
            .map_err(|e| LogError::io("sync", &path, e))?;
        sync_dir(dir)?;
    }
    Ok(SegmentInfo {
        first,
        path,
        offsets: Vec::new(),
        len: SEGMENT_HEADER_LEN,
    })
}

/// Makes creations and deletions of files in `dir` durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), LogError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| LogError::io("sync directory", dir, e))
}

/// Checks one segment file; a damaged tail of the last segment is cut off the file.
fn recover_segment(
    path: &Path,
    first: Lsn,
    is_last: bool,
    max_record_size: u32,
) -> Result<(SegmentInfo, Option<TailCut>), LogError> {
    let file = File::open(path).map_err(|e| LogError::io("open", path, e))?;
    let file_len = file
        .metadata()
        .map_err(|e| LogError::io("stat", path, e))?
        .len();
    if file_len < SEGMENT_HEADER_LEN {
        return repair_short_header(path, file, file_len, first, is_last);
    }
    let mut scanner = Scanner {
        r: BufReader::with_capacity(256 << 10, file),
        path,
        file_len,
        off: 0,
        lsn: first,
        is_last,
        max_record_size,
        payload: Vec::new(),
    };
    scanner.check_header()?;
    let mut offsets = Vec::new();
    loop {
        match scanner.next_record()? {
            Scanned::Record(off) => offsets.push(off),
            Scanned::End => break,
            Scanned::Damaged(reason) => {
                let cut = cut_tail(path, &scanner, reason)?;
                let info = segment_info(path, first, offsets, scanner.off);
                return Ok((info, Some(cut)));
            }
        }
    }
    Ok((segment_info(path, first, offsets, file_len), None))
}

/// A [`SegmentInfo`] from its parts.
fn segment_info(path: &Path, first: Lsn, offsets: Vec<u64>, len: u64) -> SegmentInfo {
    SegmentInfo {
        first,
        path: path.to_path_buf(),
        offsets,
        len,
    }
}

/// Truncates the last segment at the damaged record the scanner stopped at.
fn cut_tail(path: &Path, scanner: &Scanner<'_>, reason: String) -> Result<TailCut, LogError> {
    let file = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| LogError::io("open for repair", path, e))?;
    file.set_len(scanner.off)
        .and_then(|()| file.sync_data())
        .map_err(|e| LogError::io("truncate torn tail of", path, e))?;
    Ok(TailCut {
        path: path.to_path_buf(),
        offset: scanner.off,
        bytes_cut: scanner.file_len - scanner.off,
        lsn: scanner.lsn,
        reason,
    })
}

/// A segment shorter than its header: the log stopped while starting it. That is a torn tail
/// (the header is rewritten) if it is the last segment and its bytes are a start of the header
/// it should have; otherwise an error.
fn repair_short_header(
    path: &Path,
    mut file: File,
    file_len: u64,
    first: Lsn,
    is_last: bool,
) -> Result<(SegmentInfo, Option<TailCut>), LogError> {
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)
        .map_err(|e| LogError::io("read", path, e))?;
    let expected = encode_segment_header(first);
    let is_prefix = expected.starts_with(&bytes) || bytes.iter().all(|&b| b == 0);
    if !is_prefix || bytes.len() as u64 != file_len {
        return Err(LogError::NotALog {
            path: path.to_path_buf(),
            reason: format!("{file_len} bytes that do not start like a log segment"),
        });
    }
    if !is_last {
        let reason = "incomplete segment header in a segment that is not the last";
        return Err(LogError::corrupt(path, 0, reason));
    }
    let mut file = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| LogError::io("open for repair", path, e))?;
    file.set_len(0)
        .and_then(|()| file.write_all(&expected))
        .and_then(|()| file.sync_data())
        .map_err(|e| LogError::io("rewrite the header of", path, e))?;
    let cut = TailCut {
        path: path.to_path_buf(),
        offset: 0,
        bytes_cut: file_len,
        lsn: first,
        reason: format!(
            "incomplete segment header ({file_len} of {SEGMENT_HEADER_LEN} bytes): the log \
             stopped while starting this segment; the header was rewritten"
        ),
    };
    Ok((
        segment_info(path, first, Vec::new(), SEGMENT_HEADER_LEN),
        Some(cut),
    ))
}

/// What the scanner found at its position.
enum Scanned {
    /// A valid record starting at this offset.
    Record(u64),
    /// The clean end of the file.
    End,
    /// A torn or corrupt tail starting at the scanner's offset (last segment only).
    Damaged(String),
}

/// Reads the records of one segment file in order, checking each.
struct Scanner<'a> {
    r: BufReader<File>,
    path: &'a Path,
    file_len: u64,
    /// Offset of the next record to read (after a damaged record: of the damaged record).
    off: u64,
    /// LSN of the next record to read.
    lsn: Lsn,
    is_last: bool,
    max_record_size: u32,
    payload: Vec<u8>,
}

impl Scanner<'_> {
    /// Reads and checks the segment header.
    fn check_header(&mut self) -> Result<(), LogError> {
        let mut h = [0u8; SEGMENT_HEADER_LEN as usize];
        self.read(&mut h)?;
        check_segment_header(self.path, &h, self.lsn)?;
        self.off = SEGMENT_HEADER_LEN;
        Ok(())
    }

    /// Reads the next record; see [`Scanned`] for the outcomes, errors for middle corruption.
    fn next_record(&mut self) -> Result<Scanned, LogError> {
        let (off, lsn) = (self.off, self.lsn);
        let rem = self.file_len - off;
        if rem == 0 {
            return Ok(Scanned::End);
        }
        if rem < RECORD_HEADER_LEN {
            let reason = format!("incomplete record header ({rem} of 12 bytes) for LSN {lsn}");
            return self.torn(reason);
        }
        let mut hb = [0u8; RECORD_HEADER_LEN as usize];
        self.read(&mut hb)?;
        let h = RecordHeader::decode(&hb);
        if !h.is_valid_for(lsn) {
            // The length cannot be trusted: the damage is a tail only if the claimed record
            // would end exactly at the end of the file or nothing but zeros follows (blocks
            // the file system allocated but never wrote).
            let reaches_end = off.saturating_add(h.record_len()) == self.file_len
                || self.rest_is_zero(rem - RECORD_HEADER_LEN)?;
            let reason = format!("record header checksum mismatch for LSN {lsn}");
            return self.damaged(reaches_end, reason);
        }
        if h.len > self.max_record_size {
            return Err(LogError::RecordTooLargeOnDisk {
                path: self.path.to_path_buf(),
                offset: off,
                size: u64::from(h.len),
                max: u64::from(self.max_record_size),
            });
        }
        if h.record_len() > rem {
            let reason = format!(
                "record for LSN {lsn} is cut short: it takes {} bytes, {rem} remain in the file",
                h.record_len()
            );
            return self.torn(reason);
        }
        self.read_payload(h.len)?;
        if crc(&self.payload) != h.payload_crc {
            let end = off + h.record_len();
            let reaches_end = end == self.file_len || self.rest_is_zero(self.file_len - end)?;
            let reason = format!("payload checksum mismatch for LSN {lsn}");
            return self.damaged(reaches_end, reason);
        }
        self.off += h.record_len();
        self.lsn += 1;
        Ok(Scanned::Record(off))
    }

    /// A record cut short by the end of the file: a torn tail in the last segment.
    fn torn(&self, reason: String) -> Result<Scanned, LogError> {
        self.damaged(true, reason)
    }

    /// A damaged record: cut if it is the tail of the last segment, an error otherwise.
    fn damaged(&self, reaches_end: bool, reason: String) -> Result<Scanned, LogError> {
        if self.is_last && reaches_end {
            return Ok(Scanned::Damaged(reason));
        }
        let why = if self.is_last {
            "followed by more data"
        } else {
            "in a segment that is not the last"
        };
        Err(LogError::corrupt(
            self.path,
            self.off,
            format!("{reason}, {why}"),
        ))
    }

    /// Reads `len` payload bytes (the caller has checked `len` against the file and the
    /// maximum record size).
    fn read_payload(&mut self, len: u32) -> Result<(), LogError> {
        self.payload.clear();
        self.payload.resize(len as usize, 0);
        let mut buf = std::mem::take(&mut self.payload);
        let res = self.read(&mut buf);
        self.payload = buf;
        res
    }

    /// Whether the next `n` bytes are all zero (consumes them).
    fn rest_is_zero(&mut self, mut n: u64) -> Result<bool, LogError> {
        let mut chunk = [0u8; 8192];
        while n > 0 {
            let take = n.min(chunk.len() as u64) as usize;
            self.read(&mut chunk[..take])?;
            if chunk[..take].iter().any(|&b| b != 0) {
                return Ok(false);
            }
            n -= take as u64;
        }
        Ok(true)
    }

    /// Fills `buf` from the file.
    fn read(&mut self, buf: &mut [u8]) -> Result<(), LogError> {
        self.r
            .read_exact(buf)
            .map_err(|e| LogError::io("read", self.path, e))
    }
}
