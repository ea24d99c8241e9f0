//! Snapshot files: a whole state written at once (a checkpoint), as a sequence of records in
//! one file that is either complete or absent.
//!
//! A snapshot is written to `<name>.tmp`, synced, renamed to `<name>`, and the directory is
//! synced: a crash while it is written leaves the previous snapshot (or none) in place, and
//! the temporary file is deleted when the snapshot is next opened. Unlike a log, a snapshot
//! has no torn tail to forgive: any damage is an error naming the file and the offset.
//!
//! ```text
//! header (24 bytes, integers little-endian)
//!   0..8    magic "QSTORSNP"
//!   8..12   format version (u32) = 1
//!   12..20  reserved, 0
//!   20..24  CRC-32 of bytes 0..20
//! records, each as in a log segment (see `format`), numbered from 0
//! footer (20 bytes)
//!   0..8    magic "QSNAPEND"
//!   8..16   number of records (u64)
//!   16..20  CRC-32 of bytes 0..16
//! ```

use crate::format::{crc, RecordHeader, RECORD_HEADER_LEN};
use crate::LogError;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const MAGIC: [u8; 8] = *b"QSTORSNP";
const END_MAGIC: [u8; 8] = *b"QSNAPEND";
const VERSION: u32 = 1;
const HEADER_LEN: u64 = 24;
const FOOTER_LEN: u64 = 20;

fn damaged(path: &Path, offset: u64, reason: impl Into<String>) -> LogError {
    LogError::CorruptSnapshot {
        path: path.to_path_buf(),
        offset,
        reason: reason.into(),
    }
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> LogError + 'a {
    move |e| LogError::Io {
        op,
        path: path.to_path_buf(),
        source: Arc::new(e),
    }
}

/// Where a snapshot named `target` is written before it is renamed into place.
fn temp_of(target: &Path) -> PathBuf {
    let mut name = target.as_os_str().to_owned();
    name.push(".tmp");
    name.into()
}

fn header() -> [u8; HEADER_LEN as usize] {
    let mut h = [0u8; HEADER_LEN as usize];
    h[0..8].copy_from_slice(&MAGIC);
    h[8..12].copy_from_slice(&VERSION.to_le_bytes());
    let sum = crc(&h[0..20]);
    h[20..24].copy_from_slice(&sum.to_le_bytes());
    h
}

fn footer(count: u64) -> [u8; FOOTER_LEN as usize] {
    let mut f = [0u8; FOOTER_LEN as usize];
    f[0..8].copy_from_slice(&END_MAGIC);
    f[8..16].copy_from_slice(&count.to_le_bytes());
    let sum = crc(&f[0..16]);
    f[16..20].copy_from_slice(&sum.to_le_bytes());
    f
}

/// Writes a snapshot; nothing replaces the previous one until [`SnapshotWriter::finish`].
pub struct SnapshotWriter {
    out: BufWriter<File>,
    temp: PathBuf,
    target: PathBuf,
    count: u64,
    bytes: u64,
}

impl SnapshotWriter {
    /// Starts writing the snapshot that will be `target`.
    pub fn create(target: &Path) -> Result<SnapshotWriter, LogError> {
        let temp = temp_of(target);
        let file = File::create(&temp).map_err(io("create", &temp))?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        out.write_all(&header()).map_err(io("write", &temp))?;
        Ok(SnapshotWriter {
            out,
            temp,
            target: target.to_path_buf(),
            count: 0,
            bytes: HEADER_LEN,
        })
    }

    /// Appends a record.
    pub fn push(&mut self, payload: &[u8]) -> Result<(), LogError> {
        let len = u32::try_from(payload.len()).map_err(|_| LogError::RecordTooLarge {
            size: payload.len() as u64,
            max: u64::from(u32::MAX),
        })?;
        let h = RecordHeader::new(self.count, len, crc(payload));
        let write = io("write", &self.temp);
        (self.out.write_all(&h.encode()))
            .and_then(|()| self.out.write_all(payload))
            .map_err(write)?;
        self.count += 1;
        self.bytes += h.record_len();
        Ok(())
    }

    /// Ends the snapshot, syncs it and renames it into place (replacing the previous one);
    /// returns its size in bytes.
    pub fn finish(mut self) -> Result<u64, LogError> {
        let temp = self.temp.clone();
        self.out
            .write_all(&footer(self.count))
            .map_err(io("write", &temp))?;
        let file = self
            .out
            .into_inner()
            .map_err(|e| io("write", &temp)(e.into_error()))?;
        file.sync_all().map_err(io("sync", &temp))?;
        drop(file);
        std::fs::rename(&temp, &self.target).map_err(io("rename", &temp))?;
        let dir = match self.target.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io("sync", dir))?;
        Ok(self.bytes + FOOTER_LEN)
    }
}

/// Reads a snapshot back, checking every record.
pub struct SnapshotReader {
    input: BufReader<File>,
    path: PathBuf,
    /// Offset of the next record, and where the records end (the footer).
    at: u64,
    end: u64,
    next: u64,
    count: u64,
    failed: bool,
}

/// Opens the snapshot `target`: `None` if there is none. A temporary file left by a write a
/// crash interrupted is deleted (the snapshot before it, if any, is the one in place).
pub fn open_snapshot(target: &Path) -> Result<Option<SnapshotReader>, LogError> {
    let temp = temp_of(target);
    if temp.exists() {
        std::fs::remove_file(&temp).map_err(io("remove", &temp))?;
    }
    let mut file = match File::open(target) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io("open", target)(e)),
    };
    let len = file.metadata().map_err(io("open", target))?.len();
    let corrupt = |offset, why: &str| damaged(target, offset, why);
    if len < HEADER_LEN + FOOTER_LEN {
        return Err(corrupt(
            0,
            "the file is shorter than a snapshot's header and footer",
        ));
    }
    let mut h = [0u8; HEADER_LEN as usize];
    file.read_exact(&mut h).map_err(io("read", target))?;
    if h[0..8] != MAGIC {
        return Err(LogError::NotALog {
            path: target.to_path_buf(),
            reason: "the file does not start with a snapshot's magic bytes \"QSTORSNP\"".into(),
        });
    }
    if h != header() {
        return Err(corrupt(
            0,
            "the snapshot header is damaged or of another version",
        ));
    }
    let end = len - FOOTER_LEN;
    let mut f = [0u8; FOOTER_LEN as usize];
    file.seek(SeekFrom::Start(end))
        .map_err(io("read", target))?;
    file.read_exact(&mut f).map_err(io("read", target))?;
    let count = u64::from_le_bytes(f[8..16].try_into().unwrap_or_default());
    if f != footer(count) {
        return Err(corrupt(
            end,
            "the snapshot's footer is damaged (or the file was cut)",
        ));
    }
    file.seek(SeekFrom::Start(HEADER_LEN))
        .map_err(io("read", target))?;
    Ok(Some(SnapshotReader {
        input: BufReader::with_capacity(1 << 20, file),
        path: target.to_path_buf(),
        at: HEADER_LEN,
        end,
        next: 0,
        count,
        failed: false,
    }))
}

impl SnapshotReader {
    /// The number of records the snapshot holds.
    pub fn len(&self) -> u64 {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    fn read_record(&mut self) -> Result<Vec<u8>, LogError> {
        let corrupt = |at, why: String| damaged(&self.path, at, why);
        if self.at + RECORD_HEADER_LEN > self.end {
            return Err(corrupt(
                self.at,
                format!(
                    "the records end before the {} the footer counts",
                    self.count
                ),
            ));
        }
        let mut hb = [0u8; RECORD_HEADER_LEN as usize];
        self.input
            .read_exact(&mut hb)
            .map_err(io("read", &self.path))?;
        let h = RecordHeader::decode(&hb);
        if !h.is_valid_for(self.next) {
            return Err(corrupt(
                self.at,
                "a record header fails its checksum".into(),
            ));
        }
        if self.at + h.record_len() > self.end {
            return Err(corrupt(self.at, "a record runs past the footer".into()));
        }
        let mut payload = vec![0u8; h.len as usize];
        self.input
            .read_exact(&mut payload)
            .map_err(io("read", &self.path))?;
        if crc(&payload) != h.payload_crc {
            return Err(corrupt(self.at, "a record fails its checksum".into()));
        }
        self.at += h.record_len();
        self.next += 1;
        Ok(payload)
    }
}

impl Iterator for SnapshotReader {
    type Item = Result<Vec<u8>, LogError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        if self.next == self.count {
            if self.at != self.end {
                self.failed = true;
                let why = "bytes follow the last record the footer counts".to_string();
                return Some(Err(damaged(&self.path, self.at, why)));
            }
            return None;
        }
        let r = self.read_record();
        self.failed = r.is_err();
        Some(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("qstore-snap-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d.join("checkpoint")
    }

    fn write(t: &Path, records: &[&[u8]]) {
        let mut w = SnapshotWriter::create(t).unwrap();
        records.iter().for_each(|r| w.push(r).unwrap());
        w.finish().unwrap();
    }

    fn read(t: &Path) -> Result<Vec<Vec<u8>>, LogError> {
        open_snapshot(t)?.expect("a snapshot").collect()
    }

    #[test]
    fn a_snapshot_reads_back_what_was_written_and_replaces_the_one_before() {
        let t = target("round-trip");
        assert!(open_snapshot(&t).unwrap().is_none());
        write(&t, &[b"one", b"", b"three"]);
        assert_eq!(
            read(&t).unwrap(),
            vec![b"one".to_vec(), vec![], b"three".to_vec()]
        );
        write(&t, &[b"four"]);
        assert_eq!(read(&t).unwrap(), vec![b"four".to_vec()]);
    }

    #[test]
    fn an_interrupted_write_leaves_the_snapshot_before_it() {
        let t = target("interrupted");
        write(&t, &[b"kept"]);
        let mut w = SnapshotWriter::create(&t).unwrap();
        w.push(b"never finished").unwrap();
        drop(w); // a crash before `finish`
        assert!(temp_of(&t).exists());
        assert_eq!(read(&t).unwrap(), vec![b"kept".to_vec()]);
        assert!(!temp_of(&t).exists(), "the leftover is deleted");
    }

    #[test]
    fn any_damage_is_an_error_naming_the_file_and_offset() {
        let t = target("damage");
        write(&t, &[b"aaaa", b"bbbb", b"cccc"]);
        let good = std::fs::read(&t).unwrap();
        // A flipped byte in the second record's payload (header 24 + record 16 + header 12).
        let mut bad = good.clone();
        bad[24 + 16 + 12] ^= 1;
        std::fs::write(&t, &bad).unwrap();
        let e = read(&t).unwrap_err().to_string();
        assert!(
            e.contains("byte offset 40") && e.contains("checkpoint"),
            "{e}"
        );
        // A cut file.
        std::fs::write(&t, &good[..good.len() - 3]).unwrap();
        assert!(read(&t).unwrap_err().to_string().contains("footer"));
        // Not a snapshot at all.
        std::fs::write(&t, vec![7u8; 64]).unwrap();
        assert!(read(&t).unwrap_err().to_string().contains("QSTORSNP"));
    }
}
